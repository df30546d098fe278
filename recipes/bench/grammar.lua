-- Token mask speed for constrained decoding: Llama 3's tokenizer (128k tokens, models/
-- llama3-tokenizer), a nested JSON schema (objects in arrays in objects, enums, numbers,
-- strings, an optional field, a $ref), documents drawn token by token from the masks (seeded;
-- half the draws from the allowed tokens that close something, a quote, bracket, comma or
-- digit, so that documents end). Each step's mask (loip_grammar_matcher_mask) is timed.
--
--   loip run recipes/bench/grammar.lua [--docs 20] [--seed 1] [--out DIR] [--quick] [--data DIR]
--
-- The mask cache (runtime/grammar/matcher.c) is per grammar and vocabulary: the first
-- document fills it (cold), the later ones find it (warm); both are reported, and all the
-- steps together, and apart the steps whose mask allows over half the vocabulary (inside a
-- string: the widest masks, whose figures the draws' mix of steps does not change). Target (issue 28): median mask time per token < 1 ms. Prints one JSON
-- object and draws an SVG bar chart.
local bit = require "bit"
local ffi = require "ffi"
local core = require "loip.core"
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local grammar = require "loip.text.grammar"
local schema_check = require "loip.text.schema_check"
local tokenizer = require "loip.text.tokenizer"

local spec = {
  name = "grammar.lua", usage = "loip run recipes/bench/grammar.lua [flags]",
  summary = "Token mask time per step for a nested JSON schema over Llama 3's vocabulary.",
  flags = {
    { "docs", "int", "documents to draw", default = 20 },
    { "seed", "int", "the draws' seed", default = 1 },
    { "out", "string", "where to write grammar.json and the SVG chart", default = "bench-out" },
    { "data", "string", "the folder whose models/ holds llama3-tokenizer (default: this repository)",
      default = core.build.source_dir },
    { "quick", "bool", "three documents, to check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.docs = 3 end
local log = bench.log

local schema = {
  type = "object",
  properties = {
    title = { type = "string" },
    status = { enum = { "draft", "review", "published" } },
    version = { type = "integer" },
    sections = { type = "array", minItems = 1, maxItems = 4, items = {
      type = "object",
      properties = {
        heading = { type = "string" },
        weight = { type = "number" },
        refs = { type = "array", maxItems = 3, items = { ["$ref"] = "#/$defs/ref" } },
      },
      required = { "heading", "weight", "refs" },
    } },
    owner = { type = "object", properties = { name = { type = "string" }, admin = { type = "boolean" } },
      required = { "name", "admin" } },
    note = { anyOf = { { type = "string" }, { type = "null" } } },
  },
  required = { "title", "status", "version", "sections", "owner" },
  ["$defs"] = { ref = { type = "object", properties = { kind = { enum = { "doi", "url", "isbn" } },
    id = { type = "string" } }, required = { "kind", "id" } } },
}

local path = o.data .. "/models/llama3-tokenizer"
if not json.exists(path .. "/tokenizer.model") then
  log("no Llama 3 tokenizer under %s: nothing to measure (pass --data DIR)", path)
  print(json.encode({ skipped = "no tokenizer at " .. path }))
  os.exit(0)
end
local tok = tokenizer.open(path)
local t0 = core.now_ms()
local vocab = grammar.vocab(tok)
local vocab_ms = core.now_ms() - t0
t0 = core.now_ms()
local g = grammar.compile(grammar.from_schema(schema, "bench schema"), "bench schema")
local compile_ms = core.now_ms() - t0
log("vocabulary: %d tokens, %d trie nodes, built in %.0f ms; grammar: %d rules, compiled in %.1f ms",
  vocab.size, vocab.nodes, vocab_ms, g.n_rules, compile_ms)

-- tokens whose bytes close something: drawn half the time
local closing = {}
for id = 0, vocab.size - 1 do
  local b = grammar.token_bytes(tok, id)
  closing[id] = b ~= nil and b:find('["%]},0-9]') ~= nil
end

local state = o.seed
local function rand(n)
  state = (state * 1103515245 + 12345) % 2147483648
  return state % n + 1
end

local n_words = math.floor((vocab.size + 31) / 32)
local bits = ffi.new("uint32_t[?]", n_words)
local function allowed_of(b)
  local all, close = {}, {}
  for w = 0, n_words - 1 do
    local x = b[w]
    if x ~= 0 then
      for k = 0, 31 do
        if bit.band(x, bit.lshift(1, k)) ~= 0 then
          local id = w * 32 + k
          all[#all + 1] = id
          if closing[id] then close[#close + 1] = id end
        end
      end
    end
  end
  return all, close
end

local cold, warm, all, wide, tokens, valid = {}, {}, {}, {}, {}, 0
for d = 1, o.docs do
  local m = g:matcher(vocab)
  local out, steps = {}, 0
  while true do
    local s = core.now_ns()
    m:mask(bits)
    local ms = (core.now_ns() - s) / 1e6
    all[#all + 1] = ms
    if d == 1 then cold[#cold + 1] = ms else warm[#warm + 1] = ms end
    if m:can_end() then break end
    local allowed, close = allowed_of(bits)
    if #allowed > vocab.size / 2 then wide[#wide + 1] = ms end
    local pick = (rand(2) == 1 and #close > 0) and close or allowed
    local id = pick[rand(#pick)]
    assert(m:accept(id))
    out[#out + 1] = grammar.token_bytes(tok, id)
    steps = steps + 1
    if steps > 20000 then error("document " .. d .. " did not end") end
  end
  tokens[d] = steps
  local text = table.concat(out)
  local value = json.decode(text)
  if value and schema_check.check(schema, value) then valid = valid + 1 end
  log("document %d: %d tokens, %d bytes", d, steps, #text)
end
local entries, bytes = g:matcher(vocab):cache_stats()

local function figures(xs)
  if #xs == 0 then return nil end
  local total = 0
  for _, x in ipairs(xs) do total = total + x end
  return { steps = #xs, median_ms = bench.median(xs), p99_ms = bench.quantile(xs, 0.99), max_ms = math.max(unpack(xs)),
    total_ms = total }
end
local result = {
  tokenizer = "llama3", vocab_size = vocab.size, trie_nodes = vocab.nodes, vocab_build_ms = vocab_ms,
  compile_ms = compile_ms, rules = g.n_rules, docs = o.docs, valid_docs = valid,
  tokens_per_doc = bench.median(tokens), tokens_per_doc_mean = bench.mean(tokens),
  mask = figures(all), mask_cold = figures(cold), mask_warm = figures(warm), mask_wide = figures(wide),
  cache_entries = entries, cache_mb = bytes / 2 ^ 20, target_median_ms = 1,
}
result.met = result.mask.median_ms < 1 and valid == o.docs
log("mask per token: median %.3f ms, p99 %.3f ms (steps allowing over half the vocabulary: median %s, p99 %s; "
  .. "first document: median %.3f, p99 %.3f; later: median %s, p99 %s); "
  .. "%g tokens per document; %d/%d documents valid; cache %d entries, %.1f MB; masks of the first document %.0f ms in all",
  result.mask.median_ms, result.mask.p99_ms,
  result.mask_wide and string.format("%.3f", result.mask_wide.median_ms) or "-",
  result.mask_wide and string.format("%.3f", result.mask_wide.p99_ms) or "-",
  result.mask_cold.median_ms, result.mask_cold.p99_ms,
  result.mask_warm and string.format("%.3f", result.mask_warm.median_ms) or "-",
  result.mask_warm and string.format("%.3f", result.mask_warm.p99_ms) or "-", result.tokens_per_doc, valid, o.docs,
  entries, result.cache_mb, result.mask_cold.total_ms)

os.execute("mkdir -p '" .. o.out .. "'")
local bars = {}
for _, k in ipairs({ "mask", "mask_cold", "mask_warm", "mask_wide" }) do
  local f = result[k]
  if f then
    bars[#bars + 1] = { k .. " median", f.median_ms }
    bars[#bars + 1] = { k .. " p99", f.p99_ms }
  end
end
result.plot = plot.bars(o.out .. "/grammar_mask.svg", { title = "token mask time per step: nested JSON schema, Llama 3 (128k)",
  unit = "ms", bars = bars, refs = { { "target (median)", 1 } } })
local text = json.encode(result)
local f = assert(io.open(o.out .. "/grammar.json", "w"))
f:write(text, "\n")
f:close()
print(text)
