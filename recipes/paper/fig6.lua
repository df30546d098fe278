-- The LOIP paper's Fig. 6 on the simulator: Llama-3.3-70B (BF16) under extreme memory pressure
-- on 1 x Jetson AGX Orin 64GB, 3 x AGX Orin 32GB and 1 x Xavier NX 16GB (recipes/policies/device), with
-- three memory reservations: (i) none, (ii) 3 GB on each of two Orin 32GB, (iii) as (ii) and 5 GB
-- more on the Orin 64GB and 1 GB on the NX; links of 100 and 200 Mbit/s; sporadic and bursty
-- (4) requests; LOIP against the PP-based baselines (pipeline, EdgeShard, pipeline+offloading)
-- and the TP-based ones (Galaxy, TPI-LLM, TPI-LLM+offloading). OOM: a method cannot place the
-- model; OOT: slower than 5 s/token sporadic, 2 s/token bursty.
--
--   loip run recipes/paper/fig6.lua [--out DIR]
local flags = require "loip.ui.flags"
local ex = require "loip.sim.experiments"

local o = flags.parse({ name = "fig6.lua", usage = "loip run recipes/paper/fig6.lua [--out DIR]",
  summary = "The paper's Fig. 6 (Llama-3.3-70B, extreme memory pressure) on the simulator.",
  flags = { { "out", "string", "where to write fig6.json, .md and .svg", default = "bench-out" },
    { "output-tokens", "int", "tokens each request generates", default = 32 } } }, arg, 1)

local devices = { "jetson-agx-orin-64gb", "jetson-agx-orin-32gb", "jetson-agx-orin-32gb", "jetson-agx-orin-32gb", "jetson-xavier-nx-16gb" }
local reservations = {
  { "(i) no reservation", { 0, 0, 0, 0, 0 } },
  { "(ii) 3 GB on two Orin 32GB", { 0, 3, 3, 0, 0 } },
  { "(iii) and 5 GB Orin 64GB, 1 GB NX", { 5, 3, 3, 0, 1 } },
}
local cases = {}
for _, res in ipairs(reservations) do
  for _, rate in ipairs({ 100, 200 }) do
    for _, pattern in ipairs({ "sporadic", "bursty" }) do
      for _, method in ipairs(ex.METHODS) do
        cases[#cases + 1] = { config = string.format("%s, %d Mbit/s, %s", res[1], rate, pattern), model = "llama-3.3-70b",
          devices = devices, reserve_gib = res[2], link_rate = rate .. "mbit", link_delay_ms = 1, pattern = pattern, burst = 4,
          input_tokens = 32, output_tokens = o.output_tokens, context = 1024, method = method }
      end
    end
  end
end
ex.report("fig6", o.out, cases, { title = "Fig. 6: Llama-3.3-70B under extreme memory pressure (simulated), ms/token",
  over_pp = "1.4-9.6x (Sec. IV, over all experiments)", over_tp = "2.2-20.9x (Sec. IV, over all experiments)" })
