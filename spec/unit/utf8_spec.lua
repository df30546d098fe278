-- Well-formed UTF-8 out of any token stream (loip.text.utf8, loip.text.tokenizer's text_stream,
-- loip.text.json's encoder): a character split over tokens is held back until whole, a part
-- that can never be one becomes U+FFFD (one per maximal subpart), and the JSON loip writes is
-- well-formed whatever bytes its strings hold. Random token streams: the fuzz target's own
-- checks (tests/fuzz/lua/utf8.lua) over seeded random inputs.
local utf8 = require "loip.text.utf8"
local json = require "loip.text.json"
local tokenizer = require "loip.text.tokenizer"
local T = require "spec.support"

local R = utf8.REPLACEMENT
after_each(function() collectgarbage() collectgarbage() end)

-- What a holder gives for each of pieces, then its finish.
local function hold(pieces)
  local h, out = utf8.holder(), {}
  for i, p in ipairs(pieces) do out[i] = h:put(p) end
  out[#out + 1] = h:finish()
  return out
end

describe("loip.text.utf8", function()
  it("holds a character split over pieces back until it is whole", function()
    assert.are.same({ "", "", "世", "", "", "界", "" }, hold({ "\xe4", "\xb8", "\x96", "\xe7", "\x95", "\x8c" }))
    assert.are.same({ "a", "", "😀b", "" }, hold({ "a\xf0\x9f", "\x98", "\x80b" }))
    assert.are.same({ "héllo", "" }, hold({ "héllo" }))
  end)

  it("turns a character left incomplete at the end into one U+FFFD", function()
    assert.are.same({ "", R }, hold({ "\xe4" }))
    assert.are.same({ "", "", R }, hold({ "\xe4", "\xb8" }))
    assert.are.same({ "x", R }, hold({ "x\xf0\x9f\x98" }))
  end)

  it("replaces at once each part that can never be a character: one U+FFFD per maximal subpart", function()
    assert.are.same({ R, "" }, hold({ "\xab" }))                       -- a lone continuation byte
    assert.are.same({ R .. "A", "" }, hold({ "\xe4\xb8A" }))           -- cut short by an ASCII byte
    assert.are.same({ R .. R, "" }, hold({ "\xc0\x80" }))              -- an overlong NUL
    assert.are.same({ R .. R .. R, "" }, hold({ "\xed\xa0\x80" }))     -- a surrogate, U+D800
    assert.are.same({ R .. R .. R .. R, "" }, hold({ "\xf4\x90\x80\x80" })) -- past U+10FFFF
    assert.are.same({ R .. R, "" }, hold({ "\xff\xfe" }))
    assert.are.same({ "", R .. "é", "" }, hold({ "\xe4", "\xc3\xa9" }))
  end)

  it("valid and sanitize", function()
    assert.is_true(utf8.valid("世界 and ascii"))
    assert.is_false(utf8.valid("\xe4\xb8"))
    assert.are.equal("a" .. R .. "b", utf8.sanitize("a\xe4\xb8b"))
    assert.are.equal("世界", utf8.sanitize("世界"))
  end)
end)

describe("loip.text.json.encode", function()
  it("never writes ill-formed UTF-8: each ill-formed part of a string becomes U+FFFD", function()
    assert.are.equal('{"text":"' .. R .. '"}', json.encode({ text = "\xe4" }))
    assert.are.equal('["' .. R .. 'V' .. R .. '","世界"]', json.encode({ "\xfdV\xab", "世界" }))
    assert.are.equal('{"a/b":"' .. R .. '"}', json.encode_sorted({ ["a/b"] = "\xe4\xb8" }))
  end)
end)

describe("text_stream", function()
  it("streams whole characters from llama2.c's byte pieces, the ids exact", function()
    local tok = tokenizer.open(T.root .. "/models/stories260K")
    local byte_id = {}
    for id = 0, tok.vocab_size - 1 do
      local ok, p = pcall(tok.piece_text, tok, 1, id)
      if ok and #p == 1 and p:byte() >= 0x80 then byte_id[p:byte()] = id end
    end
    local ids = {}
    for b in ("世界"):gmatch(".") do ids[#ids + 1] = assert(byte_id[b:byte()], "a byte piece") end
    local st, out = tokenizer.text_stream(tok, { 1 }), {}
    for i, id in ipairs(ids) do out[i] = st:put(id) end
    out[#out + 1] = st:finish()
    assert.are.same({ "", "", "世", "", "", "界", "" }, out)
    st = tokenizer.text_stream(tok, { 1 })
    assert.are.same({ "", "" }, { st:put(ids[1]), st:put(ids[2]) })
    assert.are.equal(R, st:finish())
  end)
end)

describe("random token streams (the fuzz target's checks)", function()
  local run = dofile(T.root .. "/tests/fuzz/lua/utf8.lua")
  -- bytes weighted toward those that start, continue or break multi-byte characters
  local BYTES = { 0x41, 0x20, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE4, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF }
  local function input(pick, n)
    local b = { string.char(pick) }
    for i = 2, n do
      b[i] = string.char(math.random(3) == 1 and math.random(0, 255) or BYTES[math.random(#BYTES)])
    end
    return table.concat(b)
  end
  for pick, name in ipairs({ "raw byte pieces", "stories260K (llama2.c)", "Qwen2 (byte-level BPE)", "Llama 3 (tiktoken)",
    "Llama 2 (SentencePiece, byte fallback)" }) do
    it(name, function()
      math.randomseed(36 + pick)
      for _ = 1, 150 do run(input(pick - 1, math.random(1, 80))) end
    end)
  end
end)
