-- Speculative decoding on the paper's testbed, simulated (docs/planning.md, "Speculative decoding
-- on the simulator"; issue 26): Llama-3.3-70B in BF16 on 2 x AGX Orin 64GB + AGX Orin 32GB +
-- Xavier NX 16GB (Fig. 7's set), 100 Mbit/s links, two sporadic requests, with Llama-3.2-1B as the
-- draft on the fastest board, at acceptances ASSUMED (the chance a draft is accepted given the
-- ones before it were), the draft length chosen each step or fixed at 4; beside no draft. Then
-- (issue 39) the best chain, the cost-model tree and lookahead from stated acceptance curves.
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

-- Trees and lookahead (issue 39): the same testbed and requests, each draft from a STATED
-- acceptance curve (docs/planning.md, "The paper's testbed: trees and lookahead"): the best fixed
-- chain (k = 1..8 at the curve's per-draft acceptance), the cost-model tree (tree=on, its size B
-- chosen each step from the curve and the step's price; the plan reserving its rows) and
-- lookahead (no draft model: its tree of guesses and n-grams, free to propose, priced by its own
-- curve). Every figure is the simulator's.
local CURVES = {
  { name = "stories260K self:layers=3 (measured)", acceptance = 0.27,
    curve = "1:1.25,2:1.31,4:1.375,8:1.56,16:1.84,32:1.99,63:2.21", depths = "0.685,0.157",
    source = "stories260K, draft self:layers=3 (a weak draft): per-draft acceptance 0.27 of the read-bound ring's chains; "
      .. "tokens per step of fixed best-first trees of 1..63 nodes in-process; depth shape the ring's tree run's per_depth "
      .. "(docs/serving.md, docs/planning.md)" },
  { name = "assumed A = 0.7", acceptance = 0.7,
    source = "per-draft acceptance 0.7 ASSUMED for a 1B draft of the 70B; the tree's curve a chain's at it, (1 - A^(B+1)) / "
      .. "(1 - A): a lower bound for a tree (its siblings add to it)" },
}
local LOOKAHEAD = { curve = "16:1.47", source = "lookahead on stories260K: 1.47 tokens per step with trees of 16 nodes "
  .. "(1 device, the 7 reference prompts; docs/serving.md)" }
local trees = {}
for _, cv in ipairs(CURVES) do
  local best
  for k = 1, 8 do
    local r = ex.run(case { draft = "model", draft_like = "llama-3.2-1b", acceptance = cv.acceptance, draft_tokens = k })
    if r.tokens_per_s and (not best or r.tokens_per_s > best.r.tokens_per_s) then best = { k = k, r = r } end
  end
  local t = ex.run(case { draft = "model:tree=on", draft_like = "llama-3.2-1b", acceptance = cv.acceptance,
    tree_curve = cv.curve, tree_depths = cv.depths, tree_depths_source = cv.depths and cv.name or nil })
  for _, x in ipairs({ { "best chain", "k " .. best.k, best.r }, { "cost-model tree", nil, t } }) do
    local r = x[3]
    trees[#trees + 1] = { curve = cv.name, variant = x[1], size = x[2] or string.format("B %.1f", r.draft.tree_size or 0),
      tokens_per_s = r.tokens_per_s, speedup = r.tokens_per_s / none.tokens_per_s, tokens_per_step = r.draft.tokens_per_step,
      draft_ms_per_step = r.draft.draft_ms_per_step, plan_rows = r.draft.plan_rows, source = cv.source }
  end
end
local la = ex.run(case { draft = "lookahead", tree_curve = LOOKAHEAD.curve, acceptance = 0 })
trees[#trees + 1] = { curve = "lookahead (measured)", variant = "lookahead", size = string.format("B %.1f", la.draft.tree_size or 0),
  tokens_per_s = la.tokens_per_s, speedup = la.tokens_per_s / none.tokens_per_s, tokens_per_step = la.draft.tokens_per_step,
  draft_ms_per_step = la.draft.draft_ms_per_step, plan_rows = la.draft.plan_rows, source = LOOKAHEAD.source }

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
md[#md + 1] = ""
md[#md + 1] = "| curve (stated) | draft | k or B | tokens/s | x no draft | tokens per verifying step | draft ms per step | rows planned |"
md[#md + 1] = "|---|---|---|---|---|---|---|---|"
md[#md + 1] = string.format("| - | none | - | %.2f | 1 | 1 | - | - |", none.tokens_per_s)
for _, r in ipairs(trees) do
  md[#md + 1] = string.format("| %s | %s | %s | %.2f | %.2f | %.2f | %.0f | %s |", r.curve, r.variant, r.size, r.tokens_per_s,
    r.speedup, r.tokens_per_step, r.draft_ms_per_step or 0, tostring(r.plan_rows or "-"))
end
md[#md + 1] = ""
local seen = {}
for _, r in ipairs(trees) do
  if not seen[r.curve] then md[#md + 1] = "- " .. r.curve .. ": " .. r.source seen[r.curve] = true end
end
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
json.write_file(o.out .. "/speculative.json", json.encode_sorted({ name = "speculative", rows = rows, trees = trees, plot = "speculative.svg" }, 2) .. "\n")
io.stdout:write(text)
