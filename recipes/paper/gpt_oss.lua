-- gpt-oss-120b on the paper's testbed, simulated (issue 38 item 5; not in the paper): the model as
-- released (its experts MXFP4: 17 bytes per 32 values; attention, router, embedding and head BF16;
-- 60.8 GiB in all) on 2 x AGX Orin 64GB + AGX Orin 32GB + Xavier NX 16GB (Fig. 7's set), 100
-- Mbit/s links with 1 ms of delay, two sporadic requests or a burst of four, beside Llama-3.3-70B in
-- BF16 (131 GiB) on the same boards, under three sets of memory reservations: none (everything of
-- gpt-oss stays resident), Table III's (14, 14, 6 and 3 GB), a tight set (40, 40, 20 and 8 GB,
-- leaving 22, 22, 10 and 6 GiB: both models re-read blocks from disk every step) and a tighter one
-- (50, 50, 24 and 11 GB: 12, 12, 6 and 3 GiB, which only gpt-oss fits). Each row: ms/token,
-- tokens/s, and the weights the plan re-reads per step (a mixture of experts: only the routed
-- experts of its offloaded layers, 4 of 128 a token). The assumptions: docs/paper/README.md.
--
--   loip run recipes/paper/gpt_oss.lua [--out DIR]
local flags = require "loip.ui.flags"
local ex = require "loip.sim.experiments"
local json = require "loip.text.json"

local o = flags.parse({ name = "gpt_oss.lua", usage = "loip run recipes/paper/gpt_oss.lua [--out DIR]",
  summary = "gpt-oss-120b (MXFP4 experts) beside Llama-3.3-70B (BF16) on the paper's four Jetsons (simulated), with and without re-reads.",
  flags = { { "out", "string", "where to write gpt_oss.json, .md and .svg", default = "bench-out" },
    { "output-tokens", "int", "tokens each request generates", default = 64 } } }, arg, 1)

local GiB = 1024 ^ 3
local devices = { "jetson-agx-orin-64gb", "jetson-agx-orin-64gb", "jetson-agx-orin-32gb", "jetson-xavier-nx-16gb" }
local models = { { "gpt-oss-120b", "gpt-oss-120b (MXFP4 experts)" }, { "llama-3.3-70b", "Llama-3.3-70B (BF16)" } }
local reservations = { { "no reservation", nil }, { "Table III's reservations (14, 14, 6, 3 GB)", { 14, 14, 6, 3 } },
  { "tight (40, 40, 20, 8 GB reserved)", { 40, 40, 20, 8 } }, { "tighter (50, 50, 24, 11 GB reserved)", { 50, 50, 24, 11 } } }

local rows = {}
for _, res in ipairs(reservations) do
  for _, pattern in ipairs({ "sporadic", "bursty" }) do
    for _, m in ipairs(models) do
      local r = ex.run { model = m[1], devices = devices, reserve_gib = res[2], link_rate = "100mbit", link_delay_ms = 1,
        pattern = pattern, burst = 4, requests = 2, input_tokens = 32, output_tokens = o.output_tokens, context = 1024,
        method = "loip", no_oot = true }
      local budgets = ex.budgets(devices, res[2])
      for i, b in ipairs(budgets) do budgets[i] = b / GiB end
      rows[#rows + 1] = { config = res[1] .. ", " .. pattern, model = m[1], label = m[2], budgets_gib = budgets,
        result = r.outcome == "ms" and r.ms_per_token or r.outcome, ms_per_token = r.ms_per_token, tokens_per_s = r.tokens_per_s,
        read_gib_per_step = r.read_bytes_per_step and r.read_bytes_per_step / GiB, weight_gib = r.weight_bytes and r.weight_bytes / GiB,
        why = r.why }
    end
  end
end

local md = { "| configuration | model | budgets (GiB) | ms/token | tokens/s | weights (GiB) | re-read per step (GiB) |",
  "|---|---|---|---|---|---|---|" }
for _, r in ipairs(rows) do
  local b = {}
  for i, x in ipairs(r.budgets_gib) do b[i] = string.format("%.0f", x) end
  md[#md + 1] = string.format("| %s | %s | %s | %s | %s | %s | %s |", r.config, r.label, table.concat(b, "+"),
    type(r.result) == "number" and string.format("%.0f", r.result)
      or (r.ms_per_token and string.format("%.0f (%s)", r.ms_per_token, r.result) or r.result),
    r.tokens_per_s and string.format("%.2f", r.tokens_per_s) or "-", r.weight_gib and string.format("%.1f", r.weight_gib) or "-",
    r.read_gib_per_step and string.format("%.2f", r.read_gib_per_step) or "-")
end
md[#md + 1] = ""
md[#md + 1] = "2 x AGX Orin 64GB + AGX Orin 32GB + Xavier NX 16GB (budgets: memory less 2 GiB each for the OS, less the "
  .. "reservation), 100 Mbit/s links, 1 ms delay; sporadic: two requests one after the other, bursty: four at once; "
  .. "32 + " .. o.output_tokens .. " tokens a request; embedding and head kept in memory (the paper's system). tokens/s: all "
  .. "requests' tokens over the time to the last; OOT: slower than 5 s/token (sporadic) or 2 s/token (bursty), time shown."
local text = table.concat(md, "\n") .. "\n"
os.execute("mkdir -p '" .. o.out .. "'")
local f = assert(io.open(o.out .. "/gpt_oss.md", "w"))
f:write(text)
f:close()
local bars = {}
for _, r in ipairs(rows) do
  bars[#bars + 1] = { string.format("%s: %s", r.config, r.model), r.tokens_per_s or 0,
    r.tokens_per_s == nil and tostring(r.result) or nil, color = r.model == "gpt-oss-120b" and "#27ae60" or "#7f8c8d" }
end
require("loip.measure.plot").bars(o.out .. "/gpt_oss.svg", { title = "gpt-oss-120b vs Llama-3.3-70B on the Jetson testbed (simulated)",
  unit = "tokens/s", bars = bars })
json.write_file(o.out .. "/gpt_oss.json", json.encode_sorted({ name = "gpt_oss", rows = rows, plot = "gpt_oss.svg" }, 2) .. "\n")
io.stdout:write(text)
