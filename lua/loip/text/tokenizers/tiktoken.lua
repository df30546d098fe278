-- tiktoken rank files ("base64(token bytes) rank" per line, rank = id): Llama 3's
-- original/tokenizer.model and OpenAI's o200k_base.tiktoken (gpt-oss's o200k_harmony). Byte-level
-- BPE where the pair whose concatenation has the lowest rank merges first, and a chunk that is a
-- whole token is that token (tiktoken's encode). The file holds neither the special tokens nor
-- the pre-tokenizer's regex: they are the encoding's (M.encodings), chosen by opts.encoding, by
-- the special_tokens.json beside the file ({"encoding": "o200k_harmony"} and/or
-- {"special_tokens": {"<|begin_of_text|>": 128000, ...}}), else by the number of ranks
-- (o200k_base has 199998; anything else is taken for Llama 3's). opts.special_tokens replaces
-- the encoding's special tokens.
local bit = require "bit"
local json = require "loip.text.json"
local core = require "loip.core"
local bpe = require "loip.text.tokenizers.bpe"
local tk = require "loip.runtime.tokenizer"
local K = core.constants

local M = {}

-- Whether the start of a file looks like tiktoken ranks.
function M.sniff(head)
  return head:match("^[A-Za-z0-9+/]+=*[ ]%d+\r?\n") ~= nil
end

-- Meta's Llama 3 special tokens, from id n_base on.
function M.llama3_special_tokens(n_base)
  local names = { "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>" }
  for i = 5, 256 - 5 - 1 do names[#names + 1] = string.format("<|reserved_special_token_%d|>", i) end
  local t = {}
  for i, name in ipairs(names) do t[name] = n_base + i - 1 end
  return t
end

-- gpt-oss's o200k_harmony special tokens (openai/gpt-oss gpt_oss/tokenizer.py; tiktoken's
-- o200k_harmony): o200k_base's two, the harmony tokens, and <|reserved_N|> for every other id
-- up to 201087 (200018 stays <|endofprompt|>, as gpt-oss's tokenizer keeps it).
M.HARMONY = { ["<|startoftext|>"] = 199998, ["<|endoftext|>"] = 199999, ["<|return|>"] = 200002,
  ["<|constrain|>"] = 200003, ["<|channel|>"] = 200005, ["<|start|>"] = 200006, ["<|end|>"] = 200007,
  ["<|message|>"] = 200008, ["<|call|>"] = 200012, ["<|endofprompt|>"] = 200018 }

function M.o200k_harmony_special_tokens()
  local t, used = {}, {}
  for name, id in pairs(M.HARMONY) do t[name] = id used[id] = true end
  for id = 200000, 201087 do
    if not used[id] then t[string.format("<|reserved_%d|>", id)] = id end
  end
  return t
end

-- What an encoding adds to its ranks: the pre-tokenizer (bpe.patterns), the special tokens, those
-- it cannot do without, BOS/EOS, whether BOS starts a text, and the ids that end a generation
-- (o200k_harmony: <|return|> ends an answer and <|call|> a tool call, as llama.cpp's end-of-
-- generation tokens and gpt-oss's generation_config.json have them; <|end|> only ends a message).
M.encodings = {
  llama3 = { pattern = "llama3", specials = M.llama3_special_tokens, n_base = 128000, what = "Llama 3",
    required = { "<|begin_of_text|>", "<|end_of_text|>" }, bos = "<|begin_of_text|>", eos = "<|end_of_text|>",
    add_bos = true, stops = { "<|eot_id|>", "<|eom_id|>" } },
  o200k_harmony = { pattern = "o200k", specials = M.o200k_harmony_special_tokens, n_base = 199998, what = "o200k_harmony",
    required = { "<|return|>", "<|call|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>" },
    bos = "<|startoftext|>", eos = "<|return|>", add_bos = false, stops = { "<|call|>", "<|endoftext|>" } },
}

-- The encoding (M.encodings' name) and the special tokens of the file at path with n_base ranks,
-- and where the special tokens come from (named in errors).
local function encoding_of(path, n_base, opts)
  local side = (path:match("^(.*)/[^/]*$") or ".") .. "/special_tokens.json"
  local j
  if json.exists(side) then
    local jerr
    j, jerr = json.load(side)
    if not j then error(jerr, 0) end
    if j.special_tokens ~= nil and type(j.special_tokens) ~= "table" then
      error(side .. ": \"special_tokens\" must be an object of token -> id", 0)
    end
    if j.special_tokens == nil and j.encoding == nil then
      error(side .. ": no \"special_tokens\" object of token -> id (nor an \"encoding\")", 0)
    end
  end
  local name, from = opts.encoding, "opts.encoding"
  if not name and j and j.encoding ~= nil then name, from = j.encoding, side .. ": \"encoding\"" end
  if not name then name = n_base == M.encodings.o200k_harmony.n_base and "o200k_harmony" or "llama3" end
  local enc = M.encodings[name]
  if not enc then
    error(string.format("%s is '%s', not an encoding loip knows (llama3, o200k_harmony)", from, tostring(name)), 0)
  end
  if opts.special_tokens ~= nil then return enc, opts.special_tokens, "opts.special_tokens" end
  if j and j.special_tokens then return enc, j.special_tokens, side end
  return enc, enc.specials(n_base), string.format("%s (%s special tokens)", path, enc.what)
end

function M.open(path, opts)
  opts = opts or {}
  local text, err = json.read_file(path)
  if not text then error(path .. ": " .. tostring(err), 0) end
  local h = bpe.bpe(bit.bor(K.BPE_BYTELEVEL, K.BPE_IGNORE_MERGES), path)
  assert(tk.bpe_add_tiktoken(h, text, path))
  assert(tk.bpe_derive_merges(h, K.BPE_MERGES_BY_ID, path))
  local n_base = tk.bpe_size(h)
  local enc, specials, where = encoding_of(path, n_base, opts)
  local added, by_id = {}, {}
  for content, id in pairs(specials) do
    if type(id) ~= "number" or id % 1 ~= 0 or id < 0 then
      error(string.format("%s: special token %q has id %s", where, content, tostring(id)), 0)
    end
    if id < n_base then
      error(string.format("%s: special token %q has id %d, a rank of %s (which has %d)", where,
        content, id, path, n_base), 0)
    end
    if by_id[id] then
      error(string.format("%s: special tokens %q and %q share id %d", where, by_id[id], content, id), 0)
    end
    by_id[id] = content
    added[#added + 1] = { content = content, id = id, special = true }
  end
  table.sort(added, function(a, b) return a.id < b.id end)
  local by_text = {}
  for _, t in ipairs(added) do by_text[t.content] = t.id end
  for _, name in ipairs(enc.required) do
    if not by_text[name] then
      error(string.format("%s: no special token %s, which %s needs", where, name, enc.what), 0)
    end
  end
  local stop = {}
  for _, name in ipairs(enc.stops) do
    if by_text[name] then stop[#stop + 1] = by_text[name] end
  end
  return bpe.new({
    path = path, kind = "tiktoken", bpe = h, added = added,
    pretok = bpe.pretok({ { pattern = bpe.patterns[enc.pattern] } }, path),
    byte_level = true, spelling = "raw", decoder = { { type = "bytes" } },
    bos_id = by_text[enc.bos], eos_id = by_text[enc.eos], stop_ids = stop,
    prefix_ids = enc.add_bos and { by_text[enc.bos] } or {}, pretokenizer = enc.pattern, encoding = enc.what,
  })
end

return M
