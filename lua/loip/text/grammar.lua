-- Constrained decoding: a grammar (GBNF, or a JSON schema turned into GBNF) whose allowed next
-- tokens form a mask over a tokenizer's vocabulary. The recogniser and the masks run in C
-- (runtime/grammar, through loip.runtime.grammar); see docs/structured-outputs.md.
--
--   local grammar = require "loip.text.grammar"
--   local g = grammar.compile(grammar.from_schema(schema, "response_format.json_schema.schema"),
--                             "response_format.json_schema.schema")
--   local m = g:matcher(grammar.vocab(tok))       -- stop ids: the tokenizer's (or opts.stop_ids)
--   m:apply(logits_ptr, n)                        -- disallowed logits = -inf; then sample id
--   assert(m:accept(id))                          -- true | nil, err
--   m:can_end(), m:must_end(), m:clone(), m:mask(bits), m:allowed()
local bit = require "bit"
local ffi = require "ffi"
local rt = require "loip.runtime.grammar"
local gbnf = require "loip.text.gbnf"
local schema = require "loip.text.schema"
local decoder = require "loip.text.tokenizers.decoder"

local M = {}

-- ---- vocabularies --------------------------------------------------------------------------

local METASPACE = "\226\150\129" -- U+2581, SentencePiece's space

-- Token id's bytes as the model writes them, or nil for tokens a grammar never allows
-- (special, control, unknown).
local function token_bytes(tok, id)
  if tok.kind == "llama2c" then -- tokenizer.bin: 0 <unk>, 1 <s>, 2 </s>; <0xXX> pieces are bytes
    if id == 0 or id == tok.bos_id or id == tok.eos_id then return nil end
    local p = tok.pieces[id]
    local b = p and decoder.byte_piece(p)
    return b and string.char(b) or p
  end
  if tok:is_special(id) then return nil end
  local ty = tok.piece_type and tok.piece_type[id]
  if ty == "control" or ty == "unknown" then return nil end
  local added = tok.added_by_id and tok.added_by_id[id]
  if added then return added end
  local p = tok:piece(id)
  if p == nil or tok.byte_level then return p end
  local b = decoder.byte_piece(p)
  if b and (ty == nil or ty == "byte") then return string.char(b) end
  return (p:gsub(METASPACE, " "))
end
M.token_bytes = token_bytes

local Vocab = {}
Vocab.__index = Vocab
local vocabs = setmetatable({}, { __mode = "k" })

-- The C vocabulary of a loip.text.tokenizer object, built once per tokenizer: every token's
-- bytes (SentencePiece's U+2581 is a space, <0xXX> pieces are that byte, byte-level pieces
-- their raw bytes; special and control tokens excluded). Fields: handle, size, stop_ids (the
-- tokenizer's), build_ms.
function M.vocab(tok)
  local v = vocabs[tok]
  if v then return v end
  local t0 = os.clock()
  local n = tok.vocab_size
  local parts = {}
  local offsets = ffi.new("int64_t[?]", n + 1)
  local excluded = ffi.new("uint8_t[?]", n)
  local off = 0
  for id = 0, n - 1 do
    local b = token_bytes(tok, id)
    if b == nil then excluded[id] = 1 b = "" end
    parts[#parts + 1] = b
    off = off + #b
    offsets[id + 1] = off
  end
  local blob = table.concat(parts)
  local h, err = rt.vocab_new(blob, offsets, excluded, n)
  if not h then error("grammar vocabulary of " .. tostring(tok.path) .. ": " .. err, 0) end
  local stop = tok.stop_ids or { tok.eos_id }
  v = setmetatable({ handle = h, size = n, stop_ids = stop, nodes = rt.vocab_nodes(h),
    build_ms = (os.clock() - t0) * 1000 }, Vocab)
  vocabs[tok] = v
  return v
end

-- A vocabulary from a Lua array of byte strings (index 1 is id 0; false: excluded).
function M.vocab_of(list, stop_ids)
  local n = #list
  local offsets, excluded = ffi.new("int64_t[?]", n + 1), ffi.new("uint8_t[?]", n)
  local parts, off = {}, 0
  for i = 1, n do
    local b = list[i]
    if not b then excluded[i - 1] = 1 b = "" end
    parts[i] = b
    off = off + #b
    offsets[i] = off
  end
  local h, err = rt.vocab_new(table.concat(parts), offsets, excluded, n)
  if not h then error(err, 2) end
  return setmetatable({ handle = h, size = n, stop_ids = stop_ids or {}, nodes = rt.vocab_nodes(h) }, Vocab)
end

function Vocab:close() rt.vocab_free(self.handle) self.handle = nil end

-- ---- grammars ------------------------------------------------------------------------------

local Grammar = {}
Grammar.__index = Grammar
local Matcher = {}
Matcher.__index = Matcher

-- A Grammar of GBNF text; bad text raises naming where, the line and the column.
function M.compile(text, where)
  where = where or "grammar"
  local rules = gbnf.parse(text, where)
  local ir = gbnf.ir(rules)
  local h, err = rt.new(ir.ir, ir.n_ir, ir.sets, ir.n_sets, ir.root, ir.names)
  if not h then error(where .. ": " .. err, 0) end
  return setmetatable({ handle = h, where = where, text = text, n_rules = ir.n_rules }, Grammar)
end

-- GBNF of a JSON schema (see loip.text.schema); errors name where, the JSON pointer and the
-- keyword.
function M.from_schema(s, where) return schema.gbnf(s, where or "schema") end

-- For grammars made of several schemas (one per tool...): the rules of schema with names
-- starting with prefix, and the name of its document's rule; they call the JSON rules of
-- grammar.json_rules_gbnf(), to be added once. E.g.
--   local a, ra = grammar.schema_rules(s1, "tools[0]", "t0-")
--   local b, rb = grammar.schema_rules(s2, "tools[1]", "t1-")
--   grammar.compile("root ::= " .. a .. " | " .. b .. "\n" .. ra .. rb .. grammar.json_rules_gbnf(), "tools")
function M.schema_rules(s, where, prefix) return schema.rules(s, where or "schema", prefix) end
function M.json_rules_gbnf() return schema.base end

-- GBNF of any JSON object (response_format json_object).
function M.json_object_gbnf() return "root ::= object\n" .. schema.base end

-- A Matcher at the grammar's start over vocab. opts.stop_ids: the ids that end the document
-- (default: the tokenizer's stop ids).
function Grammar:matcher(vocab, opts)
  opts = opts or {}
  local stop = opts.stop_ids or vocab.stop_ids or {}
  local arr = ffi.new("int32_t[?]", math.max(#stop, 1))
  for i, id in ipairs(stop) do arr[i - 1] = id end
  local h, err = rt.matcher_new(self.handle, vocab.handle, arr, #stop)
  if not h then error(self.where .. ": " .. err, 2) end
  return setmetatable({ handle = h, grammar = self, vocab = vocab, n_words = math.floor((vocab.size + 31) / 32) }, Matcher)
end

function Grammar:close() rt.free(self.handle) self.handle = nil end

-- ---- matchers ------------------------------------------------------------------------------

-- The allowed ids as bits into bits (uint32_t *, at least m.n_words words).
function Matcher:mask(bits)
  if bits == nil then error("mask: bits must be a uint32_t array of " .. self.n_words .. " words", 2) end
  local ok, err = rt.mask(self.handle, bits, self.n_words, self.grammar.where)
  if not ok then error(err, 2) end
  return bits
end

-- logits (float *, n of them): every id not allowed set to -inf.
function Matcher:apply(logits, n)
  local ok, err = rt.apply(self.handle, logits, n, self.grammar.where)
  if not ok then error(err, 2) end
end

-- Advance by token id: true, or nil and why (the state unchanged).
function Matcher:accept(id) return rt.accept(self.handle, id, self.grammar.where) end

-- Advance by raw bytes (a document checked without a tokenizer): true, or nil and why.
function Matcher:accept_bytes(s) return rt.accept_bytes(self.handle, s, self.grammar.where) end

function Matcher:can_end() return rt.can_end(self.handle) end
function Matcher:must_end() return rt.must_end(self.handle) end

-- An independent copy of the state (n > 1 choices, or trying a token without committing).
function Matcher:clone()
  local h, err = rt.matcher_clone(self.handle)
  if not h then error(err, 2) end
  return setmetatable({ handle = h, grammar = self.grammar, vocab = self.vocab, n_words = self.n_words }, Matcher)
end

-- The allowed ids as a sorted Lua array (tests, tools; the hot path uses mask/apply).
function Matcher:allowed()
  self.bits = self.bits or ffi.new("uint32_t[?]", self.n_words)
  self:mask(self.bits)
  local out = {}
  for w = 0, self.n_words - 1 do
    local x = self.bits[w]
    if x ~= 0 then
      for b = 0, 31 do
        if bit.band(x, bit.lshift(1, b)) ~= 0 then out[#out + 1] = w * 32 + b end
      end
    end
  end
  return out
end

-- The mask cache of this grammar and vocabulary: entries, bytes.
function Matcher:cache_stats() return rt.cache_stats(self.handle) end

function Matcher:close() rt.matcher_free(self.handle) self.handle = nil end

return M
