-- Speculative decoding on the paper's testbed, simulated (docs/planning.md, "Speculative decoding
-- on the simulator"; issue 26): Llama-3.3-70B in BF16 on 2 x AGX Orin 64GB + AGX Orin 32GB +
-- Xavier NX 16GB (Fig. 7's set), 100 Mbit/s links, two sporadic requests, with Llama-3.2-1B as the
-- draft on the fastest board, at acceptances ASSUMED (the chance a draft is accepted given the
-- ones before it were), the draft length chosen each step or fixed at 4; beside no draft.
--
--   loip run recipes/paper/speculative.lua [--out DIR]
local flags = require "loip.ui.flags"
local ex = require "loip.sim.experiments"
local json = require "loip.text.json"

local o = flags.parse({ name = "speculative.lua", usage = "loip run recipes/paper/speculative.lua [--out DIR]",
  summary = "Speculative decoding with a 1B draft on the paper's 70B testbed (simulated), by assumed acceptance.",
  flags = { { "out", "string", "where to write speculative.json, .md and .svg", default = "bench-out" },
    { "output-tokens", "int", "tokens each request generates", default = 128 } } }, arg, 1)

local base = { model = "llama-3.3-70b", devices = { "jetson-agx-orin-64gb", "jetson-agx-orin-64gb", "jetson-agx-orin-32gb",
  "jetson-xavier-nx-16gb" }, link_rate = "100mbit", link_delay_ms = 1, pattern = "sporadic", requests = 2, input_tokens = 32,
  output_tokens = o.output_tokens, context = 1024, method = "loip", online = "none", no_oot = true }
local function case(extra)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(extra) do c[k] = v end
  return c
end

local rows = {}
local none = ex.run(case {})
rows[1] = { acceptance = "none", k = "-", ms_per_token = none.ms_per_token, tokens_per_s = none.tokens_per_s, tokens_per_step = 1 }
for _, a in ipairs({ 0, 0.5, 0.7, 0.8, 0.9, 1 }) do
  for _, k in ipairs({ false, 4 }) do
    local r = ex.run(case { draft = "model", draft_like = "llama-3.2-1b", acceptance = a, draft_tokens = k or nil })
    rows[#rows + 1] = { acceptance = a, k = k or "chosen", ms_per_token = r.ms_per_token, tokens_per_s = r.tokens_per_s,
      tokens_per_step = r.draft.tokens_per_step, draft_ms_per_step = r.draft.draft_ms_per_step, drafted = r.draft.drafted,
      accepted = r.draft.accepted, speedup = r.tokens_per_s / none.tokens_per_s }
  end
end

local md = { "| acceptance (assumed) | k | ms/token | tokens/s | x no draft | tokens per verifying step | draft ms per step |",
  "|---|---|---|---|---|---|---|" }
for _, r in ipairs(rows) do
  md[#md + 1] = string.format("| %s | %s | %.0f | %.2f | %s | %.2f | %s |", tostring(r.acceptance), tostring(r.k), r.ms_per_token,
    r.tokens_per_s, r.speedup and string.format("%.2f", r.speedup) or "1", r.tokens_per_step,
    r.draft_ms_per_step and string.format("%.0f", r.draft_ms_per_step) or "-")
end
md[#md + 1] = ""
md[#md + 1] = "Llama-3.3-70B (BF16) on 2 x AGX Orin 64GB + AGX Orin 32GB + Xavier NX 16GB, 100 Mbit/s; draft Llama-3.2-1B on "
  .. "device 1; acceptance an assumption, not a measurement; two sporadic requests of 32 + " .. o.output_tokens .. " tokens. "
  .. "Draft ms per step: the draft's time over the steps that verified drafts (at acceptance 0 with k chosen, the unsent "
  .. "probes' time over the few steps that drafted)."
local text = table.concat(md, "\n") .. "\n"
os.execute("mkdir -p '" .. o.out .. "'")
local f = assert(io.open(o.out .. "/speculative.md", "w"))
f:write(text)
f:close()
local bars = {}
for _, r in ipairs(rows) do
  bars[#bars + 1] = { string.format("A %s, k %s", tostring(r.acceptance), tostring(r.k)), r.tokens_per_s,
    color = r.acceptance == "none" and "#7f8c8d" or "#27ae60" }
end
require("loip.measure.plot").bars(o.out .. "/speculative.svg", { title = "Speculative decoding, 70B on the Jetson testbed (simulated)",
  unit = "tokens/s", bars = bars })
json.write_file(o.out .. "/speculative.json", json.encode_sorted({ name = "speculative", rows = rows, plot = "speculative.svg" }, 2) .. "\n")
io.stdout:write(text)
