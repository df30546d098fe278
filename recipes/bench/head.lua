-- The output head read from disk every step, a chunk of vocabulary rows at a time (a plan's
-- head_rows, loip.plan.ends): its chunks read ahead (the next chunk's read in flight while this
-- one's logits are computed; runtime/exec/rows.c) or each when it is needed, through the page
-- cache or past it (O_DIRECT), on one device with every block in memory, so that the head is
-- the step's only read.
--
--   loip run recipes/bench/head.lua [--store DIR] [--model DIR] [--head-rows 512] [--tokens 32]
--                                   [--repeats 3] [--threads 2] [--out DIR] [--quick]
--
-- Each round runs `loip generate` once per variant (LOIP_HEAD_AHEAD and LOIP_HEAD_DIRECT set
-- for it: docs/planning.md), greedy, --tokens tokens, under a plan of every block resident, the
-- embedding read by rows and the head by chunks; --repeats rounds alternated, medians of the
-- decoding ms/token, the ratios to the same reads not ahead, and whether every variant gave the
-- same tokens. Prints one JSON object (also head.json) and draws head.svg.
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local proc = require "loip.cluster.proc"
local store_mod = require "loip.model.store"

local spec = {
  name = "head.lua", usage = "loip run recipes/bench/head.lua [flags]",
  summary = "The head read from disk by chunks: read ahead or when needed, through the page cache or past it.",
  flags = bench.store_flags("of the model (the shared synthetic llama-3.2-1b BF16)", {
    { "head-rows", "int", "vocabulary rows a chunk of the head holds (a multiple of 16)", default = 512 },
    { "tokens", "int", "tokens generated per run", default = 32 },
    { "repeats", "int", "rounds of the variants (medians reported)", default = 3 },
    { "threads", "int", "compute threads", default = 2 },
    { "out", "string", "where to write head.json, head.svg and the plan", default = "bench-out" },
    { "quick", "bool", "few tokens and one round, to check the recipe works" },
  }),
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.tokens, o.repeats = 4, 1 end
if o.head_rows < 16 or o.head_rows % 16 ~= 0 then error("--head-rows: " .. o.head_rows .. " is not a positive multiple of 16", 0) end
local log, median = bench.log, bench.median
local st = bench.ensure_store(o.store, o.model)
local man = store_mod.read_manifest(st)
local n_blocks = 2 * man.config.num_hidden_layers

os.execute("mkdir -p '" .. o.out:gsub("'", "") .. "'")
local plan_path = o.out .. "/head-plan.lua"
local f = assert(io.open(plan_path, "w"))
f:write(string.format("return { slots = 1, devices = { { stages = { { blocks = { 0, %d }, offloaded = 0 } } } }, "
  .. "embed_rows = 64, head_rows = %d }\n", n_blocks - 1, o.head_rows))
f:close()

local VARIANTS = {
  { name = "page cache, when needed", ahead = 0, direct = 0 },
  { name = "page cache, ahead", ahead = 1, direct = 0 },
  { name = "O_DIRECT, when needed", ahead = 0, direct = 1 },
  { name = "O_DIRECT, ahead", ahead = 1, direct = 1 },
}

-- One generation of variant v: its decoding ms/token and tokens.
local function run(v)
  local cmd = string.format("LOIP_HEAD_AHEAD=%d LOIP_HEAD_DIRECT=%d '%s' generate --model '%s' --plan '%s' --threads %d "
    .. "--prompt 'The head is read' --max-tokens %d --temperature 0 --ignore-eos --json 2>&1", v.ahead, v.direct, proc.exe(), st,
    plan_path, o.threads, o.tokens)
  local p = assert(io.popen(cmd))
  local text = p:read("*a")
  p:close()
  local j = json.decode(text:match("(%b{})%s*$") or "")
  if not j or not j.decode_ms_per_token then error("head.lua: " .. v.name .. ": loip generate said:\n" .. text, 0) end
  return j.decode_ms_per_token, table.concat(j.ids or j.token_ids or {}, ",")
end

local ms, tokens, same = {}, nil, true
for i in ipairs(VARIANTS) do ms[i] = {} end
for round = 1, o.repeats do
  for i, v in ipairs(VARIANTS) do
    local t, ids = run(v)
    ms[i][round] = t
    tokens = tokens or ids
    same = same and ids == tokens
    log("round %d: %s: %.1f ms/token", round, v.name, t)
  end
end

local res = { store = st, head_rows = o.head_rows, tokens = o.tokens, repeats = o.repeats, threads = o.threads,
  same_tokens = same, variants = {} }
for i, v in ipairs(VARIANTS) do
  res.variants[i] = { name = v.name, ahead = v.ahead == 1, direct = v.direct == 1, ms_per_token = median(ms[i]), runs = ms[i] }
end
-- reading ahead against the same reads each when needed
res.ahead_page_cache = res.variants[1].ms_per_token / res.variants[2].ms_per_token
res.ahead_direct = res.variants[3].ms_per_token / res.variants[4].ms_per_token
log("read ahead: %.2fx through the page cache, %.2fx past it (O_DIRECT); same tokens: %s", res.ahead_page_cache,
  res.ahead_direct, tostring(same))
local bars = {}
for i, v in ipairs(res.variants) do bars[i] = { v.name, v.ms_per_token } end
res.plot = plot.bars(o.out .. "/head.svg", { title = "The head read by chunks of " .. o.head_rows .. " rows", unit = "ms/token", bars = bars })
local out = assert(io.open(o.out .. "/head.json", "w"))
out:write(json.encode_sorted(res, 2), "\n")
out:close()
print(json.encode_sorted(res))
