-- The LOIP paper's Fig. 7 on the simulator: end-to-end inference with memory enough to place
-- each method's slices (no reservation), three device sets matched to model scales:
-- Llama-2-13B on AGX Orin 32GB + Xavier NX 16GB; Qwen3-32B on AGX Orin 64GB + AGX Orin 32GB +
-- Xavier NX 16GB; Llama-3.3-70B on 2 x AGX Orin 64GB + AGX Orin 32GB + Xavier NX 16GB (all
-- BF16); links of 100 and 200 Mbit/s; sporadic and bursty (4) requests; LOIP against the PP- and
-- TP-based baselines.
--
--   loip run recipes/paper/fig7.lua [--out DIR]
local flags = require "loip.ui.flags"
local ex = require "loip.sim.experiments"

local o = flags.parse({ name = "fig7.lua", usage = "loip run recipes/paper/fig7.lua [--out DIR]",
  summary = "The paper's Fig. 7 (end-to-end, 13B/32B/70B on matched device sets) on the simulator.",
  flags = { { "out", "string", "where to write fig7.json, .md and .svg", default = "bench-out" },
    { "output-tokens", "int", "tokens each request generates", default = 32 } } }, arg, 1)

local sets = {
  { "Llama-2-13B", "llama-2-13b", { "jetson-agx-orin-32gb", "jetson-xavier-nx-16gb" } },
  { "Qwen3-32B", "qwen3-32b", { "jetson-agx-orin-64gb", "jetson-agx-orin-32gb", "jetson-xavier-nx-16gb" } },
  { "Llama-3.3-70B", "llama-3.3-70b", { "jetson-agx-orin-64gb", "jetson-agx-orin-64gb", "jetson-agx-orin-32gb", "jetson-xavier-nx-16gb" } },
}
local cases = {}
for _, set in ipairs(sets) do
  for _, rate in ipairs({ 100, 200 }) do
    for _, pattern in ipairs({ "sporadic", "bursty" }) do
      for _, method in ipairs(ex.METHODS) do
        cases[#cases + 1] = { config = string.format("%s, %d Mbit/s, %s", set[1], rate, pattern), model = set[2], devices = set[3],
          link_rate = rate .. "mbit", link_delay_ms = 1, pattern = pattern, burst = 4, input_tokens = 32,
          output_tokens = o.output_tokens, context = 1024, method = method }
      end
    end
  end
end
ex.report("fig7", o.out, cases, { title = "Fig. 7: end-to-end, 13B / 32B / 70B on matched Jetson sets (simulated), ms/token",
  over_pp = "1.4-8.7x bursty / 1.4-5.5x sporadic at 100 Mbit/s; 1.5-9.6x / 1.4-6.2x at 200",
  over_tp = "2.5-20.9x bursty / 2.2-11.6x sporadic at 100 Mbit/s; 2.7-13.4x / 2.5-8.1x at 200" })
