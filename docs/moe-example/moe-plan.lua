return {
  slots = 1,
  devices = {
    { expert_slots = 35, stages = {
      { blocks = { 0, 0 }, offloaded = 0 },
      { blocks = { 1, 4 }, offloaded = 1 },
      { blocks = { 5, 6 }, offloaded = 1 },
      { blocks = { 7, 8 }, offloaded = 1 },
      { blocks = { 9, 10 }, offloaded = 1 },
      { blocks = { 11, 14 }, offloaded = 1 },
      { blocks = { 15, 16 }, offloaded = 1 },
      { blocks = { 17, 18 }, offloaded = 1 },
      { blocks = { 19, 20 }, offloaded = 1 },
      { blocks = { 21, 24 }, offloaded = 1 },
      { blocks = { 25, 26 }, offloaded = 1 },
      { blocks = { 27, 28 }, offloaded = 1 },
      { blocks = { 29, 31 }, offloaded = 1 },
    } },
  },
}
