-- Constrained decoding (loip.text.grammar over runtime/grammar): GBNF's features accept and
-- refuse texts byte for byte, its errors name the line and column; every JSON-schema keyword
-- supported compiles and accepts or refuses documents walked through accept with a
-- tokenization, every keyword not supported is refused naming it and its place
-- (grammar_masks_spec.lua: token masks and random walks).
local grammar = require "loip.text.grammar"
local json = require "loip.text.json"

after_each(function() collectgarbage() collectgarbage() end)

-- A vocabulary of the 256 single bytes (id b) and a stop id 256.
local bytes_vocab
local function byte_vocab()
  if not bytes_vocab then
    local list = {}
    for b = 0, 255 do list[b + 1] = string.char(b) end
    list[257] = false
    bytes_vocab = grammar.vocab_of(list, { 256 })
  end
  return bytes_vocab
end

-- Whether the grammar g accepts text whole (and may end there).
local function accepts(g, text)
  local m = g:matcher(byte_vocab())
  local ok = m:accept_bytes(text)
  return ok == true and m:can_end()
end

local function gbnf(text) return grammar.compile(text, "spec.grammar") end

describe("GBNF", function()
  it("literals, escapes, classes, ranges, negation, '.', groups, repetition and comments", function()
    local g = gbnf([[
# a comment line
root ::= "x\n\t\"\\" [a-c0-9_]+ ws  # trailing comment
         ( "|" | "()" )? rest
ws   ::= [ ]{2}
rest ::= [^a-z\x00]{1,3} "\u00e9" . "\U0001F600"? end
end  ::= ( "a" | "bb" ){2,} "!"{0,1} ]])
    assert.is_true(accepts(g, 'x\n\t"\\ab_9  |ZZé€aa!'))
    assert.is_true(accepts(g, 'x\n\t"\\c  ()Q\xc3\xa9z\xf0\x9f\x98\x80bbabb'))
    assert.is_false(accepts(g, 'x\n\t"\\  ZéZaa'))          -- [..]+ needs one
    assert.is_false(accepts(g, 'x\n\t"\\a ZéZaa'))          -- {2} spaces
    assert.is_false(accepts(g, 'x\n\t"\\a  zéZaa'))         -- [^a-z...] refuses z
    assert.is_false(accepts(g, 'x\n\t"\\a  ZZZZéZaa'))      -- {1,3}
    assert.is_false(accepts(g, 'x\n\t"\\a  Zéa'))           -- . then {2,}: needs two
    assert.is_false(accepts(g, 'x\n\t"\\a  ZéZa!!'))        -- "!"{0,1}
    assert.is_false(accepts(g, 'x\n\t"\\a  Zé\xffaa'))      -- '.' is a whole UTF-8 character
    assert.is_true(accepts(g, 'x\n\t"\\a  Z\xc3\xa9\xe2\x82\xacaa'))
  end)

  it("a class matches exactly the UTF-8 of its code points (random ranges, negated or not)", function()
    local gbnf_mod = require "loip.text.gbnf"
    local seed = 7
    local function rand(n)
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % n
    end
    local edges = { 0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF }
    for _ = 1, 40 do
      local lo = ({ rand(0x80), rand(0x800), rand(0x10000), rand(0x110000) })[rand(4) + 1]
      local hi = math.min(0x10FFFF, lo + ({ 0, rand(64), rand(5000), rand(0x110000) })[rand(4) + 1])
      local neg = rand(2) == 1
      local function hex(cp) return string.format("\\U%08X", cp) end
      local g = gbnf("root ::= [" .. (neg and "^" or "") .. hex(lo) .. "-" .. hex(hi) .. "]")
      local probes = { lo, hi, lo - 1, hi + 1 }
      for _, e in ipairs(edges) do probes[#probes + 1] = e end
      for _ = 1, 30 do probes[#probes + 1] = rand(0x110000) end
      for _, cp in ipairs(probes) do
        if cp >= 0 and cp <= 0x10FFFF and not (cp >= 0xD800 and cp <= 0xDFFF) then
          local bytes = {}
          for k, b in ipairs(gbnf_mod.utf8_bytes(cp)) do bytes[k] = string.char(b) end
          local want = (cp >= lo and cp <= hi) ~= neg
          assert.are.equal(want, accepts(g, table.concat(bytes)), string.format("[%s%X-%X] U+%X", neg and "^" or "", lo, hi, cp))
        end
      end
      assert.is_false(accepts(g, "\xed\xa0\x80")) -- a surrogate's encoding: never a character
      assert.is_false(accepts(g, "\xc0\x80"))      -- an overlong encoding
    end
  end)

  it("rules may span lines, call each other and recurse", function()
    local g = gbnf([[
root ::= list
list ::= "[" ( item
           ( "," item )* )?
         "]"
item ::= list | [0-9]+]])
    assert.is_true(accepts(g, "[]"))
    assert.is_true(accepts(g, "[1,[2,[]],[[3]]]"))
    assert.is_false(accepts(g, "[1,]"))
    assert.is_false(accepts(g, "[[1]"))
  end)

  it("errors name where, the line and the column", function()
    local cases = {
      { 'root ::= "a" (b', "line 1, column 14: expected ')'" },
      { 'root ::= "a\n"', "line 1, column 10: unterminated literal" },
      { 'root ::= [a-', "line 1, column 10: unterminated character class" },
      { 'root ::= "a"\nx ::= [z-a]', "line 2, column 10: range end before its start" },
      { 'root ::= "a"\n\nx ::= "\\q"', "line 3, column 8: unknown escape \\q" },
      { 'root ::= "a"{3,1}', "line 1, column 13: repetition {3,1}" },
      { 'root ::= y', "line 1, column 10: rule y is not defined" },
      { 'root ::= "a"\nroot ::= "b"', "line 2, column 1: rule root is defined twice" },
      { 'root ::= "a" @', "line 1, column 14: unexpected '@'" },
      { 'root ::= "a" )', "line 1, column 14: ')' without its '('" },
      { '"a"', "line 1, column 1: expected a rule" },
      { 'x ::= "a"', "no rule named root" },
      { 'root ::= x\nx ::= x "a" | "b"', "rule x is left-recursive" },
      { 'root ::= ( "a"? )*', "left-recursive" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(grammar.compile, c[1], "body.grammar")
      assert.is_false(ok, c[1])
      assert.matches("^body%.grammar: ", err)
      assert.truthy(err:find(c[2], 1, true), c[1] .. " -> " .. err)
    end
  end)
end)

-- ---- JSON schemas ---------------------------------------------------------------------------

local function schema_grammar(s) return grammar.compile(grammar.from_schema(s, "response_format.json_schema.schema"), "s") end

local cases = {
  { { type = "string" }, { '"a b"', '""', '"\\u00e9\\n\\"x\\\\"', '"é"' }, { "a", '"a', '"\1"', '"\\q"', "1" } },
  { { type = "string", minLength = 2, maxLength = 3 }, { '"ab"', '"abc"', '"éé"' }, { '"a"', '"abcd"' } },
  { { type = "integer" }, { "0", "-12", "1234567890123456" }, { "01", "1.5", "-", "12345678901234567", "1e3" } },
  { { type = "number" }, { "0", "-1.25", "3e10", "2.5E-3" }, { ".5", "1.", "+1", "1e", "NaN" } },
  { { type = "boolean" }, { "true", "false" }, { "True", "1" } },
  { { type = "null" }, { "null" }, { "nil", '"null"' } },
  { { type = { "string", "null" } }, { '"x"', "null" }, { "1" } },
  { { enum = { "a", 1, json.null, true } }, { '"a"', "1", "null", "true" }, { '"b"', "2", "false" } },
  { { const = "fixed" }, { '"fixed"' }, { '"other"' } },
  { { anyOf = { { type = "integer" }, { type = "string", maxLength = 1 } } }, { "5", '"x"' }, { '"xy"', "true" } },
  { { oneOf = { { type = "boolean" }, { type = "null" } } }, { "true", "null" }, { "0" } },
  { { allOf = { { type = "boolean" } } }, { "false" }, { "0" } },
  { { type = "array", items = { type = "integer" }, minItems = 1, maxItems = 3 },
    { "[1]", "[1, 2,3]", "[\n  1,\n  2\n]" }, { "[]", "[1,2,3,4]", '["a"]', "[1,]" } },
  { { type = "array" }, { "[]", '[1, "a", {"b": [null]}]' }, { "[" } },
  { { type = "object", properties = { a = { type = "integer" }, b = { type = "string" } }, required = { "a" } },
    { '{"a": 1}', '{"a":1,"b":"x"}', '{\n  "a": 1,\n  "b": "x"\n}' },
    { '{}', '{"b":"x","a":1}', '{"a":1,"c":2}', '{"a": 1,}', '{ "a":1}x' } },
  { { type = "object", properties = { b = { type = "boolean" }, a = { type = "null" } }, required = { "b", "a" },
      additionalProperties = false },
    { '{"b":true,"a":null}' }, { '{"a":null,"b":true}', '{"b":true}' } },
  { { type = "object" }, { "{}", '{"any": [1, {"x": "y"}]}' }, { "[]", "{1:2}" } },
  { { type = "object", properties = { next = { anyOf = { { ["$ref"] = "#" }, { type = "null" } } } }, required = { "next" } },
    { '{"next": null}', '{"next": {"next": {"next": null}}}' }, { '{"next": {}}' } },
  { { ["$defs"] = { p = { type = "object", properties = { x = { type = "number" } }, required = { "x" } } },
      type = "array", items = { ["$ref"] = "#/$defs/p" } },
    { '[{"x": 1}, {"x": 2.5}]' }, { '[{"y": 1}]' } },
  { { definitions = { e = { enum = { "r", "g" } } }, properties = { c = { ["$ref"] = "#/definitions/e" } }, required = { "c" } },
    { '{"c": "g"}' }, { '{"c": "b"}' } },
  { { type = "object", properties = { a = { enum = { 1, 2 } }, b = { ["$ref"] = "#/properties/a" },
      c = { anyOf = { { const = 0 }, { const = "x" } } }, d = { ["$ref"] = "#/properties/c/anyOf/1" } },
      required = { "a", "b", "d" } },
    { '{"a": 1, "b": 2, "d": "x"}', '{"a": 1, "b": 2, "d": "x", "c": 0}' }, { '{"a": 1, "b": 3, "d": "x"}', '{"a": 1, "b": 2, "d": 0}' } },
  { { type = "number", nullable = true }, { "1.5", "null" }, { '"x"' } },
  { { type = "string", title = "t", description = "d", default = "x", examples = { "e" }, ["$schema"] = "x" },
    { '"ok"' }, { "1" } },
}

describe("JSON schema", function()
  it("every supported keyword compiles and accepts or refuses documents byte for byte", function()
    for i, c in ipairs(cases) do
      local g = schema_grammar(c[1])
      for _, doc in ipairs(c[2]) do assert.is_true(accepts(g, doc), "case " .. i .. " refused " .. doc) end
      for _, doc in ipairs(c[3]) do assert.is_false(accepts(g, doc), "case " .. i .. " accepted " .. doc) end
    end
  end)

  it("bounds whitespace: one space, or a newline and up to 24 spaces; none around the document", function()
    local g = schema_grammar({ type = "array" })
    assert.is_true(accepts(g, "[\n" .. (" "):rep(24) .. "1]"))
    assert.is_false(accepts(g, "[\n" .. (" "):rep(25) .. "1]"))
    assert.is_false(accepts(g, "[  1]"))
    assert.is_false(accepts(g, "[\t1]"))
    assert.is_false(accepts(g, " [1]"))
    assert.is_false(accepts(g, "[1] "))
  end)

  it("refuses what is not supported, naming the keyword and its JSON pointer", function()
    local W = "response_format.json_schema.schema: "
    local refused = {
      { { type = "object", patternProperties = {} }, "/: 'patternProperties' is not supported" },
      { { type = "object", properties = { x = { type = "string", pattern = "a+" } } }, "/properties/x: 'pattern' is not supported" },
      { { type = "string", format = "email" }, "/: 'format' is not supported" },
      { { ["not"] = { type = "null" } }, "/: 'not' is not supported" },
      { { ["if"] = { type = "null" }, ["then"] = {} }, "/: 'if' is not supported" },
      { { type = "integer", minimum = 0 }, "/: 'minimum' is not supported" },
      { { type = "array", uniqueItems = true }, "/: 'uniqueItems' is not supported" },
      { { type = "array", items = { { type = "integer" } } }, "/items: 'items' as an array" },
      { { type = "array", prefixItems = {} }, "/: 'prefixItems' is not supported" },
      { { type = "object", properties = { a = { type = "integer" } }, additionalProperties = { type = "string" } },
        "/additionalProperties: 'additionalProperties' as a schema is not supported" },
      { { ["$ref"] = "http://example.com/s.json" }, "/$ref: '$ref' http://example.com/s.json is not supported" },
      { { ["$ref"] = "#/$defs/none" }, "/$ref: '$ref' #/$defs/none names nothing in the schema" },
      { { allOf = { { type = "string" }, { maxLength = 2 } } }, "/allOf: 'allOf' of more than one schema" },
      { { anyOf = { { type = "string" } }, type = "string" }, "/: 'anyOf' together with 'type'" },
      { { type = "object", properties = { a = { type = "date" } } }, "/properties/a/type: type 'date'" },
      { { type = "object", properties = { a = {} }, required = { "b" } }, "/required/0: 'b' is not in 'properties'" },
      { { properties = { a = { anyOf = { { type = "string" }, { minProperties = 1 } } } } },
        "/properties/a/anyOf/1: 'minProperties' is not supported" },
    }
    for _, c in ipairs(refused) do
      local ok, err = pcall(grammar.from_schema, c[1], "response_format.json_schema.schema")
      assert.is_false(ok, c[2])
      assert.are.equal(W, err:sub(1, #W), err)
      assert.truthy(err:find(c[2], 1, true), c[2] .. " -> " .. err)
    end
  end)

  it("lists properties in the order of 'required', then the others by name", function()
    local g = schema_grammar({ type = "object", properties = { z = { type = "null" }, a = { type = "null" },
      m = { type = "null" } }, required = { "z", "m" } })
    assert.is_true(accepts(g, '{"z":null,"m":null,"a":null}'))
    assert.is_true(accepts(g, '{"z":null,"m":null}'))
    assert.is_false(accepts(g, '{"m":null,"z":null}'))
  end)

  it("given as JSON text (or decoded by json_ordered), lists properties in the text's order", function()
    local text = '{"type": "object", "properties": {"z": {"type": "null"}, "a": {"type": "null"}, '
      .. '"m": {"type": "null"}}, "required": ["m"]}'
    local g = grammar.compile(grammar.from_schema(text, "s"), "s")
    assert.is_true(accepts(g, '{"z":null,"a":null,"m":null}'))
    assert.is_true(accepts(g, '{"m":null}'))
    assert.is_false(accepts(g, '{"m":null,"z":null}'))
    local ok, err = pcall(grammar.from_schema, '{"type": "object",}', "tools[0].function.parameters")
    assert.is_false(ok)
    assert.are.equal("tools[0].function.parameters: invalid JSON: expected a key at offset 18", err)
  end)

  it("json_ordered decodes as cjson does, keeping each object's key order", function()
    local ordered = require "loip.text.json_ordered"
    local cases = { '{"b": [1, 2.5e3, -0.5, {"x": null}], "a": "\\u00e9\\ud83d\\ude00\\n\\"", "c": true, "d": false}',
      "[]", "{}", '"s"', "12", '[[[]], {"k": []}]' }
    for _, text in ipairs(cases) do
      assert.are.same(json.decode(text), ordered.decode(text), text)
      assert.are.equal(json.encode(json.decode(text)), json.encode(ordered.decode(text)), text)
    end
    local v = ordered.decode('{"z": 1, "a": {"y": 2, "b": 3}, "m": 4, "z": 5}')
    assert.are.same({ "z", "a", "m" }, ordered.keys(v))
    assert.are.same({ "y", "b" }, ordered.keys(v.a))
    assert.are.equal(5, v.z)
    for _, bad in ipairs({ "[1,]", '{"a" 1}', '"abc', "nul", "[1] x", '"\\q"' }) do
      local r, err = ordered.decode(bad, "body")
      assert.is_nil(r, bad)
      assert.matches("^body: invalid JSON: .* at offset %d+$", err)
    end
  end)

  it("compose: several schemas' rules, prefixed, in one grammar", function()
    local a, ra = grammar.schema_rules({ type = "object", properties = { x = { type = "integer" } }, required = { "x" } }, "tools[0]", "t0-")
    local b, rb = grammar.schema_rules({ type = "array", items = { ["$ref"] = "#" }, maxItems = 1 }, "tools[1]", "t1-")
    assert.are.equal("t0-schema-root", a)
    local g = gbnf('root ::= "A" ' .. a .. ' | "B" ' .. b .. "\n" .. ra .. rb .. grammar.json_rules_gbnf())
    assert.is_true(accepts(g, 'A{"x": 1}'))
    assert.is_true(accepts(g, "B[[[]]]"))
    assert.is_false(accepts(g, "A[]"))
    assert.is_false(accepts(g, 'B{"x": 1}'))
  end)

  it("json_object: any JSON object", function()
    local g = grammar.compile(grammar.json_object_gbnf(), "response_format")
    assert.is_true(accepts(g, '{"a": [1, 2.5, "x", true, null, {}]}'))
    assert.is_false(accepts(g, '[1]'))
    assert.is_false(accepts(g, '"x"'))
  end)
end)

-- ---- real vocabularies ------------------------------------------------------------------------
