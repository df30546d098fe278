-- Tokenizer speed: encode throughput on one core, and loading time, for the Qwen2 (151k
-- tokens; vocab.json + merges.txt, and a tokenizer.json made from them here) and Llama 3
-- (128k; tiktoken, and a tokenizer.json made from it here) and gpt-oss's o200k_harmony (200k;
-- tiktoken) vocabularies the repository ships in models/ (models/README.md), with Llama 2's
-- SentencePiece model as a point of comparison.
--
--   loip run recipes/bench/tokenizer.lua [--mb 4] [--out DIR] [--repeats 3] [--quick] [--data DIR]
--
-- The text is made in the run (seeded): English-like prose from a Zipf-distributed lexicon
-- of made-up words, source code, and CJK text, in about equal parts. Each encode runs on the
-- whole text at once; the chunk cache starts empty for each tokenizer, and the first pass is
-- reported apart from the median of the later ones. Targets (issue): >= 10 MB/s for
-- byte-level BPE, < 300 ms to load a 150k vocabulary. Prints one JSON object and draws two
-- SVG bar charts.
local cjson = require "cjson"
local loip = require "loip"
local core = require "loip.core"
local bench = require "loip.measure.bench"
local flags = require "loip.ui.flags"
local json = require "loip.text.json"
local plot = require "loip.measure.plot"
local tokenizer = require "loip.text.tokenizer"
local bpe = require "loip.text.tokenizers.bpe"
local tiktoken_mod = require "loip.text.tokenizers.tiktoken"
local tokenizer_mod = require "loip.runtime.tokenizer"

local spec = {
  name = "tokenizer.lua", usage = "loip run recipes/bench/tokenizer.lua [flags]",
  summary = "Encode throughput and load time of the BPE tokenizers on generated text.",
  flags = {
    { "mb", "number", "megabytes of text to encode", default = 4 },
    { "out", "string", "where to write tokenizer.json and the SVG charts", default = "bench-out" },
    { "repeats", "int", "encode passes per tokenizer after the first (median reported)", default = 3 },
    { "data", "string", "the folder whose models/ holds qwen2-tokenizer, llama3-tokenizer and llama2-tokenizer (default: this repository)",
      default = core.build.source_dir },
    { "quick", "bool", "0.5 MB and one repeat, to check the recipe works" },
  },
}
local o = flags.parse(spec, arg, 1)
if o.quick then o.mb, o.repeats = 0.5, 1 end

local log = bench.log

local median = bench.median

local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- ---- the text ----------------------------------------------------------------------------------

math.randomseed(20240601)
local function zipf_pick(list)
  -- rank r with probability ~ 1/r: floor(n^u) for uniform u
  local r = math.floor((#list) ^ math.random())
  return list[math.max(1, math.min(#list, r))]
end

local lexicon = {}
do
  local onset = { "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "th", "ch", "pr", "gr" }
  local vowel = { "a", "e", "i", "o", "u", "ea", "ou", "io" }
  local coda = { "", "", "n", "r", "s", "t", "nd", "ng", "ll", "ck" }
  for i = 1, 6000 do
    local w = {}
    for _ = 1, 1 + math.floor(math.random() ^ 2 * 4) do
      w[#w + 1] = onset[math.random(#onset)] .. vowel[math.random(#vowel)] .. coda[math.random(#coda)]
    end
    lexicon[i] = table.concat(w)
  end
end

local function english(n)
  local out, size, words = {}, 0, 0
  while size < n do
    local w = zipf_pick(lexicon)
    if words == 0 then w = w:sub(1, 1):upper() .. w:sub(2) end
    local sep = " "
    words = words + 1
    if math.random() < 0.08 then sep = ", " elseif words > 8 + math.random(12) then
      sep = ({ ". ", ". ", "? ", "! ", ".\n\n" })[math.random(5)]
      words = 0
    end
    if math.random() < 0.02 then w = tostring(math.random(1, 99999)) end
    out[#out + 1] = w .. sep
    size = size + #w + #sep
  end
  return table.concat(out)
end

local function code(n)
  local kw = { "local", "function", "return", "if", "then", "end", "for", "while", "int", "const", "static", "void" }
  local out, size, depth = {}, 0, 0
  while size < n do
    local a, b = zipf_pick(lexicon), zipf_pick(lexicon)
    local line
    local r = math.random(6)
    if r == 1 then line = string.format("%s %s_%s(%s, %d) {", kw[math.random(#kw)], a, b, zipf_pick(lexicon), math.random(0, 4096)) depth = depth + 1
    elseif r == 2 and depth > 0 then line = "}" depth = depth - 1
    elseif r == 3 then line = string.format("%s.%s = %s[%d] + 0x%x; // %s %s", a, b, zipf_pick(lexicon), math.random(0, 63), math.random(0, 65535), zipf_pick(lexicon), zipf_pick(lexicon))
    elseif r == 4 then line = string.format("if (%s_%s != NULL && %s >= %d) return -%d;", a, b, a, math.random(1, 100), math.random(1, 40))
    else line = string.format("%s = \"%s %s\"", a, b, zipf_pick(lexicon)) end
    line = string.rep("    ", depth) .. line .. "\n"
    out[#out + 1] = line
    size = size + #line
  end
  return table.concat(out)
end

local function cjk(n)
  local out, size = {}, 0
  while size < n do
    local k = math.random(4, 30)
    local s = {}
    for i = 1, k do s[i] = utf8(0x4E00 + math.floor(math.random() ^ 3 * 20000)) end
    s[#s + 1] = ({ "，", "。", "、", "：", "！" })[math.random(5)]
    if math.random() < 0.1 then s[#s + 1] = "\n" end
    local t = table.concat(s)
    out[#out + 1] = t
    size = size + #t
  end
  return table.concat(out)
end

local part = math.floor(o.mb * 1e6 / 3)
local kinds = { english = english(part), code = code(part), cjk = cjk(part) }
-- The whole text interleaves 64 KB pieces of each kind.
local mixed = {}
do
  local pos = { english = 1, code = 1, cjk = 1 }
  local order = { "english", "code", "cjk" }
  local more = true
  while more do
    more = false
    for _, k in ipairs(order) do
      local s = kinds[k]
      if pos[k] <= #s then
        local e = math.min(#s, pos[k] + 65535)
        while e < #s and s:byte(e + 1) >= 0x80 and s:byte(e + 1) < 0xC0 do e = e + 1 end
        mixed[#mixed + 1] = s:sub(pos[k], e)
        pos[k] = e + 1
        more = true
      end
    end
  end
end
local text = table.concat(mixed)
log("text: %.2f MB (english %.2f, code %.2f, cjk %.2f)", #text / 1e6, #kinds.english / 1e6,
  #kinds.code / 1e6, #kinds.cjk / 1e6)

-- ---- the tokenizers ------------------------------------------------------------------------------

local models = o.data .. "/models"
local cases = {}
local function add(name, open)
  cases[#cases + 1] = { name = name, open = open }
end
if json.exists(models .. "/qwen2-tokenizer/vocab.json") then
  add("Qwen2 vocab.json+merges.txt", function() return tokenizer.open(models .. "/qwen2-tokenizer") end)
  -- Qwen2's tokenizer.json, as HF writes it, from the same files.
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p '" .. dir .. "'")
  local vocab = cjson.decode(assert(json.read_file(models .. "/qwen2-tokenizer/vocab.json")))
  local merges = {}
  for line in assert(json.read_file(models .. "/qwen2-tokenizer/merges.txt")):gmatch("([^\n]+)") do
    if not line:find("^#version") then merges[#merges + 1] = line end
  end
  local bl = { type = "ByteLevel", add_prefix_space = false, trim_offsets = false, use_regex = false }
  local added = {}
  for i, c in ipairs({ "<|endoftext|>", "<|im_start|>", "<|im_end|>" }) do
    added[i] = { id = 151642 + i, content = c, special = true, normalized = false, lstrip = false,
      rstrip = false, single_word = false }
  end
  local f = assert(io.open(dir .. "/tokenizer.json", "w"))
  f:write(cjson.encode({ version = "1.0", added_tokens = added, normalizer = { type = "NFC" },
    pre_tokenizer = { type = "Sequence", pretokenizers = {
      { type = "Split", pattern = { Regex = bpe.patterns.qwen2 }, behavior = "Isolated", invert = false }, bl } },
    post_processor = bl, decoder = bl,
    model = { type = "BPE", vocab = vocab, merges = merges, ignore_merges = false, byte_fallback = false } }))
  f:close()
  add("Qwen2 tokenizer.json", function() return tokenizer.open(dir) end)
  cases.cleanup = dir
else
  log("skipping Qwen2: %s/qwen2-tokenizer not found", models)
end
if json.exists(models .. "/llama3-tokenizer/tokenizer.model") then
  add("Llama 3 tiktoken", function() return tokenizer.open(models .. "/llama3-tokenizer") end)
  -- Llama 3's tokenizer.json as transformers' converter writes it: the vocabulary in GPT-2
  -- spelling, and a merge for every split of a token into two tokens, by the token's rank.
  local tik = tokenizer.open(models .. "/llama3-tokenizer")
  local raw, rank, spelled, vocab = {}, {}, {}, {}
  for id = 0, 127999 do
    raw[id] = tik:id_to_token(id)
    rank[raw[id]] = id
    spelled[id] = bpe.gpt2_encode(raw[id])
    vocab[spelled[id]] = id
  end
  local merges = {}
  for id = 0, 127999 do
    local p, loc = raw[id], {}
    for k = 1, #p - 1 do
      local a, b = rank[p:sub(1, k)], rank[p:sub(k + 1)]
      if a and b then loc[#loc + 1] = { a, b } end
    end
    table.sort(loc, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
    for _, m in ipairs(loc) do merges[#merges + 1] = { spelled[m[1]], spelled[m[2]] } end
  end
  local added = {}
  for content, id in pairs(tiktoken_mod.llama3_special_tokens(128000)) do
    added[#added + 1] = { id = id, content = content, special = true, normalized = false, lstrip = false,
      rstrip = false, single_word = false }
  end
  tik:close()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p '" .. dir .. "'")
  local bl = { type = "ByteLevel", add_prefix_space = false, trim_offsets = true, use_regex = false }
  local f = assert(io.open(dir .. "/tokenizer.json", "w"))
  f:write(cjson.encode({ version = "1.0", added_tokens = added, normalizer = cjson.null,
    pre_tokenizer = { type = "Sequence", pretokenizers = {
      { type = "Split", pattern = { Regex = bpe.patterns.llama3 }, behavior = "Isolated", invert = false }, bl } },
    post_processor = { type = "TemplateProcessing",
      single = { { SpecialToken = { id = "<|begin_of_text|>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } } },
      special_tokens = { ["<|begin_of_text|>"] = { id = "<|begin_of_text|>", ids = { 128000 }, tokens = { "<|begin_of_text|>" } } } },
    decoder = bl,
    model = { type = "BPE", vocab = vocab, merges = merges, ignore_merges = true, byte_fallback = false } }))
  f:close()
  add("Llama 3 tokenizer.json", function() return tokenizer.open(dir) end)
  cases.cleanup2 = dir
else
  log("skipping Llama 3: %s/llama3-tokenizer not found", models)
end
if json.exists(models .. "/o200k-harmony/o200k_base.tiktoken") then
  add("gpt-oss o200k_harmony tiktoken", function() return tokenizer.open_file(models .. "/o200k-harmony/o200k_base.tiktoken") end)
end
if json.exists(models .. "/llama2-tokenizer/tokenizer.model") then
  add("Llama 2 SentencePiece", function() return tokenizer.open_file(models .. "/llama2-tokenizer/tokenizer.model") end)
end
if #cases == 0 then
  log("no tokenizer found under %s: nothing to measure (pass --data DIR)", models)
  print(cjson.encode({ skipped = "no tokenizers under " .. models }))
  os.exit(0)
end

-- ---- measurements --------------------------------------------------------------------------------

local result = { text_mb = #text / 1e6, parts_mb = { english = #kinds.english / 1e6, code = #kinds.code / 1e6,
  cjk = #kinds.cjk / 1e6 }, targets = { encode_mb_s = 10, load_ms_150k = 300 }, tokenizers = {} }
for _, c in ipairs(cases) do
  local loads, tok = {}, nil
  for r = 1, 3 do
    if tok then tok:close() end
    collectgarbage()
    local t0 = core.now_ms()
    tok = c.open()
    loads[r] = core.now_ms() - t0
  end
  -- First pass: empty cache.
  local t0 = core.now_ms()
  local ids = tok:encode(text, { add_special = false })
  local first = (core.now_ms() - t0) / 1000
  local secs = {}
  for r = 1, o.repeats do
    t0 = core.now_ms()
    tok:encode(text, { add_special = false })
    secs[r] = (core.now_ms() - t0) / 1000
  end
  local by_kind = {}
  for k, s in pairs(kinds) do
    local kt = {}
    for r = 1, math.max(1, o.repeats) do
      t0 = core.now_ms()
      tok:encode(s, { add_special = false })
      kt[r] = (core.now_ms() - t0) / 1000
    end
    by_kind[k] = #s / 1e6 / median(kt)
  end
  local entry = { name = c.name, kind = tok.kind, vocab_size = tok.vocab_size, load_ms = median(loads),
    encode_mb_s = #text / 1e6 / median(secs), first_pass_mb_s = #text / 1e6 / first, tokens = #ids,
    bytes_per_token = #text / #ids, by_kind_mb_s = by_kind }
  if tok.bpe then
    entry.cache_entries = tokenizer_mod.bpe_cache_stats(tok.bpe)
  end
  result.tokenizers[#result.tokenizers + 1] = entry
  log("%-28s load %6.1f ms  encode %6.2f MB/s (first pass %.2f; english %.1f, code %.1f, cjk %.1f)  %.2f bytes/token",
    c.name, entry.load_ms, entry.encode_mb_s, entry.first_pass_mb_s, by_kind.english, by_kind.code, by_kind.cjk,
    entry.bytes_per_token)
  tok:close()
end
for _, d in ipairs({ cases.cleanup, cases.cleanup2 }) do os.execute("rm -rf '" .. d .. "'") end

os.execute("mkdir -p '" .. o.out .. "'")
local enc_bars, load_bars = {}, {}
for _, t in ipairs(result.tokenizers) do
  enc_bars[#enc_bars + 1] = { t.name .. " (mixed)", t.encode_mb_s }
  for _, k in ipairs({ "english", "code", "cjk" }) do enc_bars[#enc_bars + 1] = { t.name .. " " .. k, t.by_kind_mb_s[k] } end
  load_bars[#load_bars + 1] = { t.name .. string.format(" (%dk)", math.floor(t.vocab_size / 1000)), t.load_ms }
end
plot.bars(o.out .. "/tokenizer_encode.svg", { title = "loip tokenizers: encode throughput, one core",
  unit = "MB/s", bars = enc_bars, refs = { { "target (byte-level)", 10 } } })
plot.bars(o.out .. "/tokenizer_load.svg", { title = "loip tokenizers: loading time (median of 3)",
  unit = "ms", bars = load_bars, refs = { { "target (150k vocabulary)", 300 } } })
result.plots = { o.out .. "/tokenizer_encode.svg", o.out .. "/tokenizer_load.svg" }
local out = json.encode(result)
local f = assert(io.open(o.out .. "/tokenizer.json", "w"))
f:write(out, "\n")
f:close()
print(out)
