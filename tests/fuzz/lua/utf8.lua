-- fuzz_utf8: random token streams through the text the server streams and the JSON it writes
-- (loip.text.tokenizer's text_stream, loip.text.utf8's holder, loip.text.json's encoder). The
-- first byte picks the source: raw byte pieces (their lengths from the input), or the ids of one
-- of the repository's tokenizers (llama2.c's byte pieces, byte-level BPE, tiktoken,
-- SentencePiece with byte fallback), two bytes an id. Every piece given out, and every JSON
-- encoded, must be well-formed UTF-8 by a reference decoder written from Unicode's table of
-- well-formed byte sequences (Table 3-7), independently of loip.text.utf8; the pieces together
-- must be the decoded text with each ill-formed part (a maximal subpart) replaced by one U+FFFD;
-- the holder holds back no more than the start of one character. spec/unit/utf8_spec.lua runs
-- this function over seeded random inputs too.
local utf8 = require "loip.text.utf8"
local json = require "loip.text.json"
local cjson = require "cjson"
local tokenizer = require "loip.text.tokenizer"

local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/fuzz/lua/[^/]*$")) or "."
local MODELS = { "stories260K", "qwen2-tokenizer", "llama3-tokenizer", "llama2-tokenizer" }
local toks = {}

local function check(ok, what, s)
  if not ok then
    error("assertion failed: " .. what .. (s and (" (" .. (s:gsub("[^\32-\126]", function(c) return string.format("\\x%02x", c:byte()) end)) .. ")") or ""), 0)
  end
end

-- Unicode 15, Table 3-7: the well-formed byte sequences, each a list of byte ranges.
local WELL_FORMED = {
  { { 0x00, 0x7F } },
  { { 0xC2, 0xDF }, { 0x80, 0xBF } },
  { { 0xE0, 0xE0 }, { 0xA0, 0xBF }, { 0x80, 0xBF } },
  { { 0xE1, 0xEC }, { 0x80, 0xBF }, { 0x80, 0xBF } },
  { { 0xED, 0xED }, { 0x80, 0x9F }, { 0x80, 0xBF } },
  { { 0xEE, 0xEF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
  { { 0xF0, 0xF0 }, { 0x90, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
  { { 0xF1, 0xF3 }, { 0x80, 0xBF }, { 0x80, 0xBF }, { 0x80, 0xBF } },
  { { 0xF4, 0xF4 }, { 0x80, 0x8F }, { 0x80, 0xBF }, { 0x80, 0xBF } },
}

-- At byte i of s: the row starting there, and how many of its bytes s holds from i.
local function match(s, i)
  local b = s:byte(i)
  for _, row in ipairs(WELL_FORMED) do
    if b >= row[1][1] and b <= row[1][2] then
      local k = 1
      while k < #row do
        local c = s:byte(i + k)
        if not c or c < row[k + 1][1] or c > row[k + 1][2] then break end
        k = k + 1
      end
      return row, k
    end
  end
end

-- The reference: s with each maximal subpart of an ill-formed sequence replaced by U+FFFD.
local function ref_sanitize(s)
  local out, i = {}, 1
  while i <= #s do
    local row, k = match(s, i)
    if row and k == #row then out[#out + 1] = s:sub(i, i + k - 1) i = i + k
    else out[#out + 1] = "\239\191\189" i = i + (k or 1) end
  end
  return table.concat(out)
end

local function ref_valid(s) return ref_sanitize(s) == s end

-- Whether s (1..3 bytes) begins a character that more bytes could complete.
local function ref_incomplete(s)
  local row, k = match(s, 1)
  return row ~= nil and k == #s and k < #row
end

-- A JSON of text must be well-formed, and decode to text made well-formed.
local function check_json(s)
  local enc = json.encode({ text = s })
  check(ref_valid(enc), "json.encode wrote ill-formed UTF-8", enc)
  local ok, v = pcall(cjson.decode, enc)
  check(ok and type(v) == "table", "json.encode wrote what cjson cannot decode", enc)
  check(v.text == ref_sanitize(s), "json.encode changed more than the ill-formed parts", enc)
end

-- Raw pieces: a length byte (0..7), then that many bytes; the holder alone.
local function raw(data)
  local h = utf8.holder()
  local pieces, out, i = {}, {}, 2
  while i <= #data do
    local n = data:byte(i) % 8
    local p = data:sub(i + 1, i + n)
    i = i + 1 + n
    pieces[#pieces + 1] = p
    local o = h:put(p)
    check(ref_valid(o), "the holder gave out ill-formed UTF-8", o)
    local held = h.held()
    check(held == "" or (#held <= 3 and ref_incomplete(held)), "the holder held more than a character's start", held)
    out[#out + 1] = o
    check_json(p)
  end
  local rest = h:finish()
  check(rest == "" or rest == utf8.REPLACEMENT, "finish gave more than U+FFFD", rest)
  out[#out + 1] = rest
  local all = table.concat(pieces)
  check(table.concat(out) == ref_sanitize(all), "the pieces given out are not the text made well-formed", all)
  check(utf8.valid(all) == ref_valid(all), "utf8.valid disagrees with the reference", all)
  check(utf8.sanitize(all) == ref_sanitize(all), "utf8.sanitize disagrees with the reference", all)
end

-- Token ids through text_stream, against the tokenizer's own decoded bytes.
local function tokens(data, name)
  local tok = toks[name]
  if not tok then
    tok = tokenizer.open(root .. "/models/" .. name)
    toks[name] = tok
  end
  local ids = {}
  for i = 2, #data - 1, 2 do ids[#ids + 1] = (data:byte(i) * 256 + data:byte(i + 1)) % tok.vocab_size end
  local prompt = tok.decode_stream and {} or { tok.bos_id }
  local st = tokenizer.text_stream(tok, prompt)
  local out, decoded, prev = {}, {}, prompt[#prompt]
  for _, id in ipairs(ids) do
    local o = st:put(id)
    check(ref_valid(o), name .. ": the stream gave out ill-formed UTF-8", o)
    out[#out + 1] = o
    if not tok.decode_stream then decoded[#decoded + 1] = tok:piece_text(prev, id) prev = id end
  end
  out[#out + 1] = st:finish()
  check(ref_valid(out[#out]), name .. ": the stream's finish gave ill-formed UTF-8", out[#out])
  local text = tok.decode_stream and tok:decode(ids) or table.concat(decoded)
  check(table.concat(out) == ref_sanitize(text), name .. ": the stream is not the decoded text made well-formed", text)
  check_json(text)
  for _, o in ipairs(out) do check_json(o) end
end

return function(data)
  if #data == 0 then return end
  local pick = data:byte(1) % (#MODELS + 1)
  if pick == 0 then return raw(data) end
  return tokens(data, MODELS[pick])
end
