-- Hugging Face tokenizers: tokenizer.json with a BPE model (byte-level: GPT-2, Llama 3,
-- Qwen2/2.5/3; SentencePiece-style with "▁" and byte fallback: Llama 2, Mistral), and the
-- older split form vocab.json + merges.txt (byte-level BPE), each with the
-- tokenizer_config.json beside it when there is one.
--
-- tokenizer.json's model.vocab and model.merges, nearly all of the file, are read in C from
-- its bytes (runtime/tokenizer/bpe_json.c, which also checks the whole file's JSON and gives
-- byte offsets in its errors); cjson decodes the rest. vocab.json goes through the same reader.
--
-- Supported parts of tokenizer.json (anything else is an error naming the file):
--   model       BPE (vocab, merges as "a b" strings or [a, b] pairs, unk_token, byte_fallback,
--               fuse_unk, ignore_merges; no dropout, continuing_subword_prefix or suffix)
--   normalizer  NFC, Prepend, Replace (String pattern), Sequence
--   pre_tokenizer  Split (Regex or String), ByteLevel, Metaspace, Digits, Whitespace,
--               WhitespaceSplit, Punctuation, Sequence. A step that changes the text
--               (ByteLevel add_prefix_space, Metaspace) must come before any split.
--   post_processor  TemplateProcessing (single), ByteLevel, BertProcessing,
--               RobertaProcessing, Sequence
--   decoder     ByteLevel, Metaspace, Replace (String), ByteFallback, Fuse, Strip, Sequence
--
-- The split form's pre-tokenizer is chosen as follows (opts.pretokenizer overrides it: a name
-- of bpe.patterns, "qwen2" | "llama3" | "gpt2", or a regex):
--   - "qwen2" (Qwen2's regex, single digits, after NFC, as Qwen2Tokenizer does) when
--     tokenizer_config.json's tokenizer_class starts with "Qwen2", or the added tokens
--     include <|im_start|>, or <|endoftext|> with id 151643;
--   - "llama3" (Llama 3's regex, digits by three; a chunk that is a whole token is that
--     token) when the added tokens include <|begin_of_text|>;
--   - "gpt2" (GPT-2's ByteLevel regex) otherwise.
-- Special tokens and BOS/EOS come from tokenizer_config.json (bos_token, eos_token,
-- add_bos_token, add_eos_token, added_tokens_decoder) and added_tokens.json; stop ids also
-- from generation_config.json's eos_token_id.
local bit = require "bit"
local ffi = require "ffi"
local json = require "loip.text.json"
local core = require "loip.core"
local bpe = require "loip.text.tokenizers.bpe"
local tk = require "loip.runtime.tokenizer"
local K = core.constants

local M = {}

local null = json.null

local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end

local function fail(path, fmt, ...)
  error(path .. ": " .. string.format(fmt, ...), 0)
end

local function load_json(path)
  local v, err = json.load(path)
  if v == nil then error(err:find(path, 1, true) and err or (path .. ": " .. err), 0) end
  return v
end

local function read_text(path)
  local text, err = json.read_file(path)
  if text == nil then error(err:find(path, 1, true) and err or (path .. ": " .. err), 0) end
  return text
end

local function optional_json(path)
  if not json.exists(path) then return nil end
  return load_json(path)
end

local function is_null(v) return v == nil or v == null end

-- A token named in a config: a string or {content = ...}; nil for null.
local function token_text(v)
  if is_null(v) then return nil end
  if type(v) == "table" then return v.content end
  return v
end

-- ---- the parts of tokenizer.json -----------------------------------------------------------

local behaviors = {
  Removed = K.SPLIT_REMOVED, Isolated = K.SPLIT_ISOLATED,
  MergedWithPrevious = K.SPLIT_MERGED_WITH_PREVIOUS, MergedWithNext = K.SPLIT_MERGED_WITH_NEXT,
  Contiguous = K.SPLIT_CONTIGUOUS,
}

local function behavior(v, path)
  local b = behaviors[v]
  if b == nil then fail(path, "pre_tokenizer: unknown split behavior %q", tostring(v)) end
  return b
end

local function normalizers(n, path, out)
  if is_null(n) then return out end
  local t = n.type
  if t == "Sequence" then
    for _, x in ipairs(n.normalizers or {}) do normalizers(x, path, out) end
  elseif t == "NFC" then
    out[#out + 1] = { type = "nfc" }
  elseif t == "Prepend" then
    out[#out + 1] = { type = "prepend", text = n.prepend }
  elseif t == "Replace" then
    local pat = n.pattern or {}
    if type(pat.String) ~= "string" then
      fail(path, "normalizer Replace with a %s pattern is not supported (only String)", next(pat) or "missing")
    end
    out[#out + 1] = { type = "replace", from = pat.String, to = n.content or "" }
  else
    fail(path, "normalizer %q is not supported (NFC, Prepend, Replace, Sequence are)", tostring(t))
  end
  return out
end

local function pretokenizers(p, path, st)
  if is_null(p) then return end
  local t = p.type
  local function split(pattern, beh, flags)
    st.steps[#st.steps + 1] = { pattern = pattern, behavior = beh, flags = flags or 0 }
  end
  local function no_split_before(what)
    if #st.steps > 0 then
      fail(path, "pre_tokenizer: %s after a split step is not supported", what)
    end
  end
  if t == "Sequence" then
    for _, x in ipairs(p.pretokenizers or {}) do pretokenizers(x, path, st) end
  elseif t == "Split" then
    local pat, flags = p.pattern or {}, 0
    local s = pat.Regex
    if s == nil then
      s = pat.String
      flags = K.SPLIT_LITERAL
    end
    if type(s) ~= "string" then fail(path, "pre_tokenizer: Split without a pattern") end
    if p.invert then flags = bit.bor(flags, K.SPLIT_INVERT) end
    split(s, behavior(p.behavior, path), flags)
  elseif t == "ByteLevel" then
    st.byte_level = true
    if p.add_prefix_space then
      no_split_before("ByteLevel with add_prefix_space")
      st.prefix_space = true
    end
    if p.use_regex ~= false then split(bpe.patterns.gpt2, K.SPLIT_ISOLATED) end
  elseif t == "Metaspace" then
    no_split_before("Metaspace")
    local rep = p.replacement or "\226\150\129"
    local scheme = p.prepend_scheme
    if scheme == nil then scheme = p.add_prefix_space == false and "never" or "always" end
    if scheme ~= "always" and scheme ~= "first" and scheme ~= "never" then
      fail(path, "pre_tokenizer: Metaspace prepend_scheme %q is unknown", tostring(scheme))
    end
    st.metaspace = { replacement = rep, scheme = scheme }
    if p.split ~= false then split(rep, K.SPLIT_MERGED_WITH_NEXT, K.SPLIT_LITERAL) end
  elseif t == "Digits" then
    split(p.individual_digits and [[\p{N}]] or [[\p{N}+]], K.SPLIT_ISOLATED)
  elseif t == "Whitespace" then
    split([[\w+|[^\w\s]+]], K.SPLIT_REMOVED, K.SPLIT_INVERT)
  elseif t == "WhitespaceSplit" then
    split([[\s+]], K.SPLIT_REMOVED)
  elseif t == "Punctuation" then
    split("[\\p{P}$+<=>^`|~]", behavior(p.behavior or "Isolated", path))
  else
    fail(path, "pre_tokenizer %q is not supported", tostring(t))
  end
end

local function post_processor(p, path, st)
  if is_null(p) then return end
  local t = p.type
  if t == "Sequence" then
    for _, x in ipairs(p.processors or {}) do post_processor(x, path, st) end
  elseif t == "ByteLevel" then
    return
  elseif t == "TemplateProcessing" then
    local prefix, suffix, seen = {}, {}, false
    for _, item in ipairs(p.single or {}) do
      if item.Sequence then
        seen = true
      elseif item.SpecialToken then
        local name = item.SpecialToken.id
        local sp = p.special_tokens and p.special_tokens[name]
        if sp == nil or type(sp.ids) ~= "table" then
          fail(path, "post_processor: special token %q is not in its special_tokens", tostring(name))
        end
        for _, id in ipairs(sp.ids) do
          local list = seen and suffix or prefix
          list[#list + 1] = id
        end
      end
    end
    st.prefix_ids, st.suffix_ids = prefix, suffix
  elseif t == "BertProcessing" or t == "RobertaProcessing" then
    st.prefix_ids, st.suffix_ids = { p.cls[2] }, { p.sep[2] }
  else
    fail(path, "post_processor %q is not supported", tostring(t))
  end
end

local function decoders(d, path, out)
  if is_null(d) then return out end
  local t = d.type
  if t == "Sequence" then
    for _, x in ipairs(d.decoders or {}) do decoders(x, path, out) end
  elseif t == "ByteLevel" then
    out[#out + 1] = { type = "bytes" }
  elseif t == "Metaspace" then
    local scheme = d.prepend_scheme
    if scheme == nil then scheme = d.add_prefix_space == false and "never" or "always" end
    out[#out + 1] = { type = "metaspace", replacement = d.replacement or "\226\150\129",
      prepend = scheme ~= "never" }
  elseif t == "Replace" then
    local pat = d.pattern or {}
    if type(pat.String) ~= "string" then
      fail(path, "decoder Replace with a %s pattern is not supported (only String)", next(pat) or "missing")
    end
    out[#out + 1] = { type = "replace", from = pat.String, to = d.content or "" }
  elseif t == "ByteFallback" then
    out[#out + 1] = { type = "byte_fallback" }
  elseif t == "Fuse" then
    out[#out + 1] = { type = "fuse" }
  elseif t == "Strip" then
    out[#out + 1] = { type = "strip", content = d.content or " ", start = d.start or 0, stop = d.stop or 0 }
  else
    fail(path, "decoder %q is not supported", tostring(t))
  end
  return out
end

-- BOS/EOS, stop ids and add_bos/add_eos from the configs beside path.
local function apply_configs(desc, dir)
  local cfg_path = dir .. "/tokenizer_config.json"
  local cfg = optional_json(cfg_path) or {}
  desc.config_path = cfg_path
  desc.bos_token = token_text(cfg.bos_token)
  desc.eos_token = token_text(cfg.eos_token)
  if desc.bos_token == nil and #(desc.prefix_ids or {}) > 0 then desc.bos_id = desc.prefix_ids[1] end
  local gen = optional_json(dir .. "/generation_config.json") or {}
  local eos = gen.eos_token_id
  if type(eos) == "number" then eos = { eos } end
  if type(eos) == "table" then desc.stop_ids = eos end
  if desc.eos_token == nil and desc.stop_ids and desc.stop_ids[1] then desc.eos_id = desc.stop_ids[1] end
  if desc.eos_token == nil and desc.eos_id == nil then
    -- No config says: the usual end-of-text tokens, when the file has one.
    local by_text = {}
    for _, t in ipairs(desc.added or {}) do by_text[t.content] = t.id end
    for _, name in ipairs({ "<|end_of_text|>", "</s>", "<|endoftext|>", "<|im_end|>", "<eos>" }) do
      if by_text[name] then desc.eos_id = by_text[name] break end
    end
  end
  return cfg
end

-- add_bos_token / add_eos_token, when tokenizer_config.json has them, decide what encode adds.
local function apply_add_flags(tok, cfg)
  if type(cfg.add_bos_token) == "boolean" then
    tok.prefix_ids = (cfg.add_bos_token and tok.bos_id) and { tok.bos_id } or {}
  end
  if type(cfg.add_eos_token) == "boolean" then
    tok.suffix_ids = (cfg.add_eos_token and tok.eos_id) and { tok.eos_id } or {}
  end
  return tok
end

-- ---- tokenizer.json ------------------------------------------------------------------------

local spans = ffi.new("int64_t[4]")

-- tokenizer.json's text, the rest of it decoded, and the byte ranges {start, end} (from 0) of
-- model.vocab's and model.merges' values, which are nearly all of the file: C reads those two
-- from the text (loip_bpe_add_vocab_json / _merges_json), and cjson decodes the rest with them
-- replaced by {} and [] (C has checked the whole text first, so errors give file offsets).
local function read_tokenizer_json(path)
  local text = read_text(path)
  assert(tk.bpe_json_spans(text, spans, path))
  local vocab = spans[0] >= 0 and { tonumber(spans[0]), tonumber(spans[1]) } or nil
  local merges = spans[2] >= 0 and { tonumber(spans[2]), tonumber(spans[3]) } or nil
  local cuts = {}
  if vocab then cuts[#cuts + 1] = { vocab[1], vocab[2], "{}" } end
  if merges then cuts[#cuts + 1] = { merges[1], merges[2], "[]" } end
  table.sort(cuts, function(a, b) return a[1] < b[1] end)
  local parts, at = {}, 1
  for _, c in ipairs(cuts) do
    parts[#parts + 1] = text:sub(at, c[1])
    parts[#parts + 1] = c[3]
    at = c[2] + 1
  end
  parts[#parts + 1] = text:sub(at)
  local j, err = json.decode(table.concat(parts), path)
  if j == nil then error(err, 0) end
  return text, j, vocab, merges
end

function M.open_json(path, opts)
  opts = opts or {}
  local text, j, vocab, merges = read_tokenizer_json(path)
  if type(j) ~= "table" then fail(path, "not a JSON object") end
  local m = j.model
  if type(m) ~= "table" then fail(path, "no \"model\" in the file") end
  if m.type ~= "BPE" and not (m.type == nil and m.merges ~= nil) then
    fail(path, "model type %q is not supported (only BPE)", tostring(m.type))
  end
  if vocab == nil or merges == nil then fail(path, "the BPE model has no vocab or merges") end
  if not is_null(m.dropout) and m.dropout ~= 0 and m.dropout ~= 1 then
    fail(path, "BPE dropout is not supported")
  end
  for _, k in ipairs({ "continuing_subword_prefix", "end_of_word_suffix" }) do
    if not is_null(m[k]) and m[k] ~= "" then fail(path, "BPE %s is not supported", k) end
  end

  local st = { steps = {} }
  pretokenizers(j.pre_tokenizer, path, st)
  local dec = decoders(j.decoder, path, {})
  for _, d in ipairs(dec) do if d.type == "bytes" then st.byte_level = true end end
  if #dec == 0 then dec = st.byte_level and { { type = "bytes" } } or { { type = "join" } } end

  local flags = 0
  if st.byte_level then flags = bit.bor(flags, K.BPE_BYTELEVEL, K.BPE_GPT2_SPELLING) end
  if m.byte_fallback == true then flags = bit.bor(flags, K.BPE_BYTE_FALLBACK) end
  if m.ignore_merges == true then flags = bit.bor(flags, K.BPE_IGNORE_MERGES) end
  if m.fuse_unk == true then flags = bit.bor(flags, K.BPE_FUSE_UNK) end
  local h = bpe.bpe(flags, path)
  assert(tk.bpe_add_vocab_json(h, text, vocab[1], vocab[2], path))
  -- Merges are pairs [a, b] (tokenizers >= 0.20) or strings "a b" split at their one space
  -- (pieces may hold any other character, "\r" included).
  assert(tk.bpe_add_merges_json(h, text, merges[1], merges[2], path))
  if not is_null(m.unk_token) then
    local unk = m.unk_token
    local id = -1
    if type(unk) == "string" then
      local stored = st.byte_level and bpe.gpt2_decode(unk) or unk
      id = tk.bpe_lookup(h, stored)
    end
    if id < 0 then fail(path, "unk_token %q is not in the vocab", tostring(unk)) end
    assert(tk.bpe_set_unk(h, id, path))
  end

  local added = {}
  for i, t in ipairs(j.added_tokens or {}) do
    if type(t.content) ~= "string" or type(t.id) ~= "number" then
      fail(path, "added_tokens[%d] has no content or id", i)
    end
    added[#added + 1] = { content = t.content, id = t.id, special = t.special == true,
      lstrip = t.lstrip == true, rstrip = t.rstrip == true, single_word = t.single_word == true }
  end

  local desc = {
    path = path, kind = "hf", bpe = h, added = added,
    normalizers = normalizers(j.normalizer, path, {}),
    prefix_space = st.prefix_space, metaspace = st.metaspace,
    byte_level = st.byte_level, spelling = st.byte_level and "gpt2" or "raw",
    sanitize = not st.byte_level, decoder = dec,
  }
  post_processor(j.post_processor, path, desc)
  desc.pretok = bpe.pretok(st.steps, path)
  local cfg = apply_configs(desc, dirname(path))
  return apply_add_flags(bpe.new(desc), cfg)
end

-- ---- vocab.json + merges.txt ---------------------------------------------------------------

local function choose_pretokenizer(cfg, added)
  local by_text = {}
  for _, t in ipairs(added) do by_text[t.content] = t.id end
  if type(cfg.tokenizer_class) == "string" and cfg.tokenizer_class:find("^Qwen2") then return "qwen2" end
  if by_text["<|im_start|>"] or by_text["<|endoftext|>"] == 151643 then return "qwen2" end
  if by_text["<|begin_of_text|>"] then return "llama3" end
  return "gpt2"
end

function M.open_split(dir, opts)
  opts = opts or {}
  local vocab_path, merges_path = dir .. "/vocab.json", dir .. "/merges.txt"
  local vocab = read_text(vocab_path)
  local merges = read_text(merges_path)
  local cfg = optional_json(dir .. "/tokenizer_config.json") or {}

  -- Added tokens: tokenizer_config.json's added_tokens_decoder, then added_tokens.json.
  local added, have = {}, {}
  local specials = {}
  for _, k in ipairs({ "bos_token", "eos_token", "unk_token", "pad_token" }) do
    local t = token_text(cfg[k])
    if t then specials[t] = true end
  end
  for _, t in ipairs(type(cfg.additional_special_tokens) == "table" and cfg.additional_special_tokens or {}) do
    specials[token_text(t) or ""] = true
  end
  if type(cfg.added_tokens_decoder) == "table" then
    local ids = {}
    for id in pairs(cfg.added_tokens_decoder) do ids[#ids + 1] = tonumber(id) end
    table.sort(ids)
    for _, id in ipairs(ids) do
      local t = cfg.added_tokens_decoder[tostring(id)]
      added[#added + 1] = { content = t.content, id = id, special = t.special == true,
        lstrip = t.lstrip == true, rstrip = t.rstrip == true, single_word = t.single_word == true }
      have[t.content] = true
    end
  end
  local extra = optional_json(dir .. "/added_tokens.json") or {}
  local names = {}
  for content in pairs(extra) do names[#names + 1] = content end
  table.sort(names, function(a, b) return extra[a] < extra[b] end)
  for _, content in ipairs(names) do
    if not have[content] then
      added[#added + 1] = { content = content, id = extra[content], special = specials[content] == true }
    end
  end

  local name = opts.pretokenizer or choose_pretokenizer(cfg, added)
  local pattern = bpe.patterns[name] or name
  local flags = bit.bor(K.BPE_BYTELEVEL, K.BPE_GPT2_SPELLING)
  if name == "llama3" then flags = bit.bor(flags, K.BPE_IGNORE_MERGES) end
  local h = bpe.bpe(flags, vocab_path)
  assert(tk.bpe_add_vocab_json(h, vocab, 0, #vocab, vocab_path))
  assert(tk.bpe_add_merges(h, merges, 1, merges_path))

  local desc = {
    path = vocab_path, kind = "hf-split", bpe = h, added = added,
    normalizers = name == "qwen2" and { { type = "nfc" } } or {},
    prefix_space = cfg.add_prefix_space == true, byte_level = true, spelling = "gpt2",
    decoder = { { type = "bytes" } }, pretokenizer = name,
  }
  desc.pretok = bpe.pretok({ { pattern = pattern } }, vocab_path)
  apply_configs(desc, dir)
  return apply_add_flags(bpe.new(desc), cfg)
end

return M
