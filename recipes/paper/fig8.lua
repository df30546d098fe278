-- The LOIP paper's Fig. 8 on the simulator: Llama-3.3-70B (BF16) on 2 x AGX Orin 64GB + AGX Orin
-- 32GB + Xavier NX 16GB while the links' bandwidth changes: every 32 tokens each link takes a
-- rate drawn uniformly in 50-250 Mbit/s (recipes/policies/links/random, seeded); sporadic and bursty (4)
-- requests; LOIP against the PP- and TP-based baselines.
--
--   loip run recipes/paper/fig8.lua [--out DIR]
local flags = require "loip.ui.flags"
local ex = require "loip.sim.experiments"

local o = flags.parse({ name = "fig8.lua", usage = "loip run recipes/paper/fig8.lua [--out DIR]",
  summary = "The paper's Fig. 8 (Llama-3.3-70B under changing bandwidth) on the simulator.",
  flags = { { "out", "string", "where to write fig8.json, .md and .svg", default = "bench-out" },
    { "output-tokens", "int", "tokens each request generates", default = 128 } } }, arg, 1)

local devices = { "jetson-agx-orin-64gb", "jetson-agx-orin-64gb", "jetson-agx-orin-32gb", "jetson-xavier-nx-16gb" }
local cases = {}
for _, pattern in ipairs({ "sporadic", "bursty" }) do
  for _, method in ipairs(ex.METHODS) do
    cases[#cases + 1] = { config = "50-250 Mbit/s every 32 tokens, " .. pattern, model = "llama-3.3-70b", devices = devices,
      link_rate = "150mbit", link_delay_ms = 1, link_schedule = "random", pattern = pattern, burst = 4, input_tokens = 32,
      output_tokens = o.output_tokens, context = 1024, method = method }
  end
end
ex.report("fig8", o.out, cases, { title = "Fig. 8: Llama-3.3-70B under changing bandwidth (simulated), ms/token",
  over_pp = "3.9-21.2x bursty, 1.7-8.8x sporadic (over all baselines)", over_tp = "3.9-21.2x bursty, 1.7-8.8x sporadic (over all baselines)" })
