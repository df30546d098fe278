-- The LOIP paper's Table III on the simulator: the ablations of LOIP on Llama-3.3-70B (BF16), 2 x
-- AGX Orin 64GB + AGX Orin 32GB + Xavier NX 16GB, with memory reserved (14, 14, 6 and 3 GB) so that
-- blocks are read from disk, the plan made for 64 KV positions (the KV cache grows inside the
-- budgets and the online policy makes room), 100 Mbit/s links, sporadic and bursty (4) requests of
-- 256 tokens: LOIP; without the KV cache transfer protocol (online policy `thresholds`: offload
-- more, lend nothing); without the fine-grained allocation scheduler (`uniform`: consecutive whole
-- layers, the same count on every device); without the UMA-aware loading (reads take the
-- conventional path: into a buffer, parsed, copied where the kernels read).
--
--   loip run recipes/paper/table3.lua [--out DIR]
local flags = require "loip.ui.flags"
local ex = require "loip.sim.experiments"

local o = flags.parse({ name = "table3.lua", usage = "loip run recipes/paper/table3.lua [--out DIR]",
  summary = "The paper's Table III (LOIP's ablations) on the simulator.",
  flags = { { "out", "string", "where to write table3.json, .md and .svg", default = "bench-out" },
    { "output-tokens", "int", "tokens each request generates", default = 256 } } }, arg, 1)

local devices = { "jetson-agx-orin-64gb", "jetson-agx-orin-64gb", "jetson-agx-orin-32gb", "jetson-xavier-nx-16gb" }
local variants = {
  { "loip", "LOIP" },
  { "loip-no-kv-transfer", "LOIP w/o KV cache transfer", online = "thresholds" },
  { "loip-no-scheduler", "LOIP w/o fine-grained scheduler", scheduler = "uniform" },
  { "loip-no-uma-loading", "LOIP w/o UMA-aware loading", conventional_loads = true },
}
for _, v in ipairs(variants) do ex.LABEL[v[1]] = v[2] end
local cases = {}
for _, pattern in ipairs({ "sporadic", "bursty" }) do
  for _, v in ipairs(variants) do
    cases[#cases + 1] = { config = "100 Mbit/s, " .. pattern, model = "llama-3.3-70b", devices = devices, reserve_gib = { 14, 14, 6, 3 },
      link_rate = "100mbit", link_delay_ms = 1, pattern = pattern, burst = 4, input_tokens = 32, output_tokens = o.output_tokens,
      context = 1024, plan_positions = 64, method = v[1], scheduler = v.scheduler or "loip", online = v.online or "loip",
      conventional_loads = v.conventional_loads, no_oot = true }
  end
end
ex.report("table3", o.out, cases, { title = "Table III: LOIP's ablations, Llama-3.3-70B (simulated), ms/token",
  ablation = "removing any component degrades latency (the paper's Table III)" })
