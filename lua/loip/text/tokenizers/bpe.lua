-- The BPE tokenizer object behind tokenizer.json, vocab.json + merges.txt, tiktoken and
-- SentencePiece files. The format modules (hf.lua, tiktoken.lua, sentencepiece.lua) read their
-- files into a description; M.new(desc) makes the object:
--
--   encode(text, opts) -> ids     decode(ids, opts) -> text     decode_stream(opts) -> stream
--   piece_text(prev, id)          token_to_id(str) / id_to_token(id)      is_special(id)
--   vocab_size, bos_id, eos_id, bos_token, eos_token, stop_ids, path, kind, close()
--
-- Encoding: added tokens (special tokens...) are found first in the raw text; each text
-- segment between them is normalized, given its prefix (ByteLevel add_prefix_space, Metaspace)
-- and then split and merged in C. The post-processor's tokens go around the whole.
--
-- desc fields: path, kind, bpe (loip_bpe handle, filled), pretok (loip_pretok handle or nil),
-- added ({content, id, special, lstrip, rstrip, single_word}...), normalizers ({type = "nfc"
-- | "prepend" | "replace" | "spm", ...}...), prefix_space (bool), metaspace ({replacement,
-- scheme = "always" | "first" | "never"}), sanitize (replace malformed UTF-8 with U+FFFD
-- first), byte_level (pieces are raw bytes), spelling ("gpt2" | "raw"), decoder (steps, or
-- "spm"), prefix_ids, suffix_ids, bos_token / bos_id, eos_token / eos_id, stop_ids,
-- stop_tokens, config_path (named in errors about those), user_defined (SentencePiece
-- user-defined pieces), piece_type (id -> "control" | "unknown" | "byte"), spm_info.
local bit = require "bit"
local ffi = require "ffi"
local core = require "loip.core"
local decoder = require "loip.text.tokenizers.decoder"
local tk = require "loip.runtime.tokenizer"
local K = core.constants

local M = {}

-- The models' own pre-tokenizer regexes (run by PCRE2).
M.patterns = {
  gpt2 = [['s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+]],
  llama3 = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]],
  qwen2 = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]],
  -- tiktoken's o200k_base (GPT-4o; gpt-oss's o200k_harmony): words split at case changes,
  -- contractions kept with the word, "/" kept after punctuation (tiktoken_ext/openai_public.py)
  o200k = [=[[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?]=]
    .. [=[|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?]=]
    .. [=[|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+]=],
}

-- A loip_pretok with one Split step per {pattern, behavior, flags} in steps; what names the
-- file in errors.
function M.pretok(steps, what)
  if #steps == 0 then return nil end
  local h, err = tk.pretok_new()
  if not h then error(what .. ": " .. err, 0) end
  for _, st in ipairs(steps) do
    local ok, msg = tk.pretok_add_split(h, st.pattern, st.behavior or K.SPLIT_ISOLATED, st.flags or 0)
    if not ok then
      tk.pretok_free(h)
      error(what .. ": " .. msg, 0)
    end
  end
  return h
end

-- A loip_bpe with flags; what names the file in errors.
function M.bpe(flags, what)
  local h, err = tk.bpe_new(flags)
  if not h then error(what .. ": " .. err, 0) end
  return h
end

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

-- o200k_harmony's (gpt-oss's) message markers, and the ids that end a generation in a vocabulary
-- that has its tokens: <|return|>, <|call|> and <|endoftext|> where <|return|> and <|call|> are
-- both tokens, as llama.cpp's end-of-generation tokens and gpt-oss's generation_config.json have
-- them (<|end|> ends a message, not the answer); {} otherwise. token_to_id: text -> id or nil.
M.HARMONY_MARKERS = { "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>" }

function M.harmony_stops(token_to_id)
  if not token_to_id("<|return|>") or not token_to_id("<|call|>") then return {} end
  local out = {}
  for _, name in ipairs({ "<|return|>", "<|call|>", "<|endoftext|>" }) do
    local id = token_to_id(name)
    if id then out[#out + 1] = id end
  end
  return out
end

-- ---- GPT-2 bytes_to_unicode ------------------------------------------------------------------

local gpt2_char, gpt2_byte = {}, {}
do
  local n = 0
  for b = 0, 255 do
    local cp
    if (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255) then
      cp = b
    else
      cp = 256 + n
      n = n + 1
    end
    local ch = cp < 0x80 and string.char(cp) or string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
    gpt2_char[b] = ch
    gpt2_byte[ch] = string.char(b)
  end
end

-- GPT-2 spelling of raw bytes, and back (nil when s has a character outside the alphabet).
function M.gpt2_encode(s)
  return (s:gsub(".", function(c) return gpt2_char[c:byte()] end))
end

function M.gpt2_decode(s)
  if not decoder.valid(s) then return nil end
  local ok = true
  local out = s:gsub("[%z\1-\127\192-\255][\128-\191]*", function(ch)
    local b = gpt2_byte[ch]
    if not b then ok = false return "" end
    return b
  end)
  return ok and out or nil
end

-- ---- construction --------------------------------------------------------------------------

local flag_bits = {
  special = K.ADDED_SPECIAL, lstrip = K.ADDED_LSTRIP,
  rstrip = K.ADDED_RSTRIP, single_word = K.ADDED_SINGLE_WORD,
}

local function added_matcher(list, what)
  if #list == 0 then return nil end
  local h, err = tk.added_new()
  if not h then error(what .. ": " .. err, 0) end
  for _, t in ipairs(list) do
    local flags = 0
    for k, b in pairs(flag_bits) do if t[k] then flags = bit.bor(flags, b) end end
    assert(tk.added_add(h, t.content, t.id, flags, what))
  end
  return h
end

function M.new(desc)
  local self = setmetatable({}, Tokenizer)
  for k, v in pairs(desc) do self[k] = v end
  self.added = desc.added or {}
  self.normalizers = desc.normalizers or {}
  self.prefix_ids = desc.prefix_ids or {}
  self.suffix_ids = desc.suffix_ids or {}
  self.added_by_id, self.added_by_text, self.special = {}, {}, {}
  local size = tk.bpe_size(self.bpe)
  for _, t in ipairs(self.added) do
    self.added_by_id[t.id] = t.content
    self.added_by_text[t.content] = t.id
    if t.special then self.special[t.id] = true end
    if t.id + 1 > size then size = t.id + 1 end
  end
  self.vocab_size = size
  -- o200k_harmony (gpt-oss; known by <|return|> and <|call|>): its message markers are text the
  -- model writes and a grammar may ask for, not specials (llama.cpp makes them user-defined);
  -- written in a text they are still those tokens only when special tokens are parsed
  local harmony_stops = M.harmony_stops(function(t) return self.added_by_text[t] end)
  if #harmony_stops > 0 then
    for _, name in ipairs(M.HARMONY_MARKERS) do
      local id = self.added_by_text[name]
      if id then self.special[id] = nil end
    end
  end
  self.matcher = added_matcher(self.added, self.path)
  if desc.user_defined and #desc.user_defined > 0 then
    self.user_matcher = added_matcher(desc.user_defined, self.path)
  end
  self.pieces = {}
  self.scratch_cap = 0
  -- Special tokens named by text must exist.
  local function id_of(name, what)
    if name == nil then return nil end
    local id = self:token_to_id(name)
    if id == nil then
      error(string.format("%s: %s %q is not a token of the vocabulary", desc.config_path or self.path,
        what, name), 0)
    end
    return id
  end
  self.bos_id = desc.bos_id or id_of(desc.bos_token, "bos_token")
  self.eos_id = desc.eos_id or id_of(desc.eos_token, "eos_token")
  self.bos_token = self.bos_id and self:id_to_token(self.bos_id) or nil
  self.eos_token = self.eos_id and self:id_to_token(self.eos_id) or nil
  local stop, seen = {}, {}
  local function add_stop(id) if id and not seen[id] then seen[id] = true stop[#stop + 1] = id end end
  add_stop(self.eos_id)
  for _, s in ipairs(desc.stop_ids or {}) do add_stop(s) end
  for _, s in ipairs(desc.stop_tokens or {}) do add_stop(id_of(s, "stop token")) end
  for _, id in ipairs(harmony_stops) do add_stop(id) end
  self.stop_ids = stop
  return self
end

-- ---- encode --------------------------------------------------------------------------------

local nfc_len, nfc_same = ffi.new("size_t[1]"), ffi.new("int32_t[1]")

local function nfc(s, what)
  local ok, err, rc = tk.nfc(s, nil, 0, nfc_len, nfc_same, what)
  if ok and nfc_same[0] == 1 then return s end
  if not ok and rc ~= K.ERANGE then error(err, 0) end
  local n = tonumber(nfc_len[0])
  local buf = ffi.new("char[?]", n)
  assert(tk.nfc(s, buf, n, nfc_len, nfc_same, what))
  return ffi.string(buf, nfc_len[0])
end
M.nfc = nfc

local function spm_normalize(s, d)
  if d.remove_extra_whitespaces then
    s = s:gsub(" +", " "):gsub("^ ", ""):gsub(" $", "")
  end
  if s == "" then return s end
  if d.add_dummy_prefix then
    if d.treat_whitespace_as_suffix then s = s .. " " else s = " " .. s end
  end
  if d.escape_whitespaces then s = s:gsub(" ", "\226\150\129") end
  return s
end

-- Normalized text of one segment; first: the segment starts the input.
function Tokenizer:normalize(s, first)
  if self.sanitize then s = decoder.sanitize(s) end
  for _, n in ipairs(self.normalizers) do
    if n.type == "nfc" then
      s = nfc(s, self.path)
    elseif n.type == "prepend" then
      if s ~= "" then s = n.text .. s end
    elseif n.type == "replace" then
      s = decoder.replace_plain(s, n.from, n.to)
    elseif n.type == "spm" then
      s = spm_normalize(s, n)
    end
  end
  if self.prefix_space and s ~= "" and s:byte(1) ~= 32 then s = " " .. s end
  local ms = self.metaspace
  if ms and s ~= "" then
    s = decoder.replace_plain(s, " ", ms.replacement)
    if (ms.scheme == "always" or (ms.scheme == "first" and first))
        and s:sub(1, #ms.replacement) ~= ms.replacement then
      s = ms.replacement .. s
    end
  end
  return s
end

local n_out = ffi.new("int32_t[1]")

function Tokenizer:_scratch(n)
  if n > self.scratch_cap then
    self.scratch_cap = math.max(n, 2 * self.scratch_cap, 256)
    self.scratch = ffi.new("int32_t[?]", self.scratch_cap)
  end
  return self.scratch
end

-- Appends the ids of normalized text s (no added tokens in it) to out.
function Tokenizer:_encode_text(s, out)
  if s == "" then return end
  local cap = #s + 1
  local ids = self:_scratch(cap)
  local ok, err, rc = tk.bpe_encode(self.bpe, self.pretok, s, ids, cap, n_out, self.path)
  if rc == K.ERANGE then
    cap = n_out[0]
    ids = self:_scratch(cap)
    ok, err = tk.bpe_encode(self.bpe, self.pretok, s, ids, cap, n_out, self.path)
  end
  if not ok then error(err, 0) end
  local k = #out
  for i = 0, n_out[0] - 1 do out[k + i + 1] = ids[i] end
end

-- Segments of s as {start, end, id} (0-based byte offsets; id -1 for text).
local function segments(h, s, skip_special)
  local cap = 16
  while true do
    local seg = ffi.new("int32_t[?]", 3 * cap)
    local ok, err, rc = tk.added_split(h, s, skip_special, seg, cap, n_out)
    if ok then return seg, n_out[0] end
    if rc ~= K.ERANGE then error(err, 0) end
    cap = n_out[0]
  end
end

function Tokenizer:_encode_segment(s, first, out)
  s = self:normalize(s, first)
  if self.user_matcher and s ~= "" then
    local seg, n = segments(self.user_matcher, s, false)
    for i = 0, n - 1 do
      local id = seg[3 * i + 2]
      if id >= 0 then out[#out + 1] = id
      else self:_encode_text(s:sub(seg[3 * i] + 1, seg[3 * i + 1]), out) end
    end
    return
  end
  self:_encode_text(s, out)
end

-- ids of text (a Lua array). opts:
--   add_special (default true): the tokens the post-processor puts around the text (BOS for
--     Llama; nothing for Qwen2). opts.bos = false also turns them off (the llama2c option);
--   eos (default false): append eos_id when the post-processor did not;
--   parse_special (default true): special-token text in the input is that special token (HF
--     and transformers do this; SentencePiece and tiktoken, by default, do not).
function Tokenizer:encode(text, opts)
  opts = opts or {}
  if type(text) ~= "string" then error("encode: text must be a string", 2) end
  local add = opts.add_special
  if add == nil then add = opts.bos ~= false end
  local out = {}
  if add then for _, id in ipairs(self.prefix_ids) do out[#out + 1] = id end end
  if self.matcher then
    local seg, n = segments(self.matcher, text, opts.parse_special == false)
    for i = 0, n - 1 do
      local a, b, id = seg[3 * i], seg[3 * i + 1], seg[3 * i + 2]
      if id >= 0 then out[#out + 1] = id
      else self:_encode_segment(text:sub(a + 1, b), a == 0, out) end
    end
  else
    self:_encode_segment(text, true, out)
  end
  if add then for _, id in ipairs(self.suffix_ids) do out[#out + 1] = id end end
  if opts.eos and self.eos_id and out[#out] ~= self.eos_id then out[#out + 1] = self.eos_id end
  return out
end

-- ---- tokens --------------------------------------------------------------------------------

local piece_ptr, piece_len = ffi.new("const char *[1]"), ffi.new("int32_t[1]")

-- The stored piece of id: raw bytes for byte-level vocabularies, the added token's text for
-- added tokens. nil for ids without one.
function Tokenizer:piece(id)
  local p = self.pieces[id]
  if p then return p end
  p = self.added_by_id[id]
  if p == nil then
    if not tk.bpe_piece(self.bpe, id, piece_ptr, piece_len) then return nil end
    p = ffi.string(piece_ptr[0], piece_len[0])
  end
  self.pieces[id] = p
  return p
end

function Tokenizer:decode_piece(id)
  local p = self:piece(id)
  if p == nil then
    error(string.format("%s: token id %s is not in the vocabulary (size %d)", self.path,
      tostring(id), self.vocab_size), 3)
  end
  return p
end

-- The token's string as the vocabulary spells it ("Ġhello" in byte-level tokenizer.json and
-- vocab.json; raw bytes for tiktoken; "▁hello" for SentencePiece), or nil.
function Tokenizer:id_to_token(id)
  local added = self.added_by_id[id]
  if added then return added end
  local p = self:piece(id)
  if p and self.spelling == "gpt2" then return M.gpt2_encode(p) end
  return p
end

-- Id of a token string spelled as id_to_token gives it, or nil.
function Tokenizer:token_to_id(s)
  local id = self.added_by_text[s]
  if id then return id end
  if self.spelling == "gpt2" then s = M.gpt2_decode(s) or s end
  id = tk.bpe_lookup(self.bpe, s)
  return id >= 0 and id or nil
end

function Tokenizer:is_special(id)
  return self.special[id] == true
end

-- ---- decode --------------------------------------------------------------------------------

-- A stream fed one id at a time: s:put(id) (or s(id)) returns the text that is complete, and
-- s:finish() what was held back. opts.skip_special leaves special tokens out.
function Tokenizer:decode_stream(opts)
  return decoder.stream(self, opts)
end

-- Text of ids. opts.skip_special: leave special tokens out (else they show as their text).
function Tokenizer:decode(ids, opts)
  local st = decoder.stream(self, opts)
  local parts = {}
  for i, id in ipairs(ids) do parts[i] = st:put(id) end
  parts[#parts + 1] = st:finish()
  return table.concat(parts)
end

-- Text of token id after token prev (nil or BOS: at the start, where a leading space is
-- dropped as decode would). Byte-level tokens may be part of a character and byte-fallback
-- pieces give their raw byte: the caller's output assembles them (decode_stream holds them
-- back instead).
function Tokenizer:piece_text(prev, id)
  local p = self:decode_piece(id)
  if self.byte_level then return p end
  local b = decoder.byte_piece(p)
  if b and (self.piece_type == nil or self.piece_type[id] == "byte") then return string.char(b) end
  local st = decoder.stream(self, { continued = not (prev == nil or prev == self.bos_id) })
  return st:put(id) .. st:finish()
end

function Tokenizer:close()
  if self.bpe then tk.bpe_free(self.bpe) self.bpe = nil end
  if self.pretok then tk.pretok_free(self.pretok) self.pretok = nil end
  if self.matcher then tk.added_free(self.matcher) self.matcher = nil end
  if self.user_matcher then tk.added_free(self.user_matcher) self.user_matcher = nil end
end

return M
