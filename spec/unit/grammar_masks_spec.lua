-- Constrained decoding's token masks (loip.text.grammar over runtime/grammar): masks equal a
-- brute force (every token tried on a clone) on three real vocabularies, special tokens and stop
-- ids are refused until the document may end, apply sets -inf outside the mask; random walks over
-- allowed tokens end in documents that parse and are valid against their schema (grammar_spec.lua:
-- GBNF and JSON schemas themselves).
local bit = require "bit"
local ffi = require "ffi"
local T = require "spec.support"
local grammar = require "loip.text.grammar"
local schema_check = require "loip.text.schema_check"
local json = require "loip.text.json"
local tokenizer = require "loip.text.tokenizer"

after_each(function() collectgarbage() collectgarbage() end)

local function schema_grammar(s) return grammar.compile(grammar.from_schema(s, "response_format.json_schema.schema"), "s") end

local toks = {}
local function tok_of(name)
  if not toks[name] then toks[name] = tokenizer.open(T.root .. "/models/" .. name) end
  return toks[name]
end

-- A tokenization of text over vocab: greedy longest match on the tokens' bytes.
local function greedy(tok, text)
  local by = {}
  local maxlen = 0
  for id = 0, tok.vocab_size - 1 do
    local b = grammar.token_bytes(tok, id)
    if b and b ~= "" and not by[b] then by[b] = id maxlen = math.max(maxlen, #b) end
  end
  local ids, i = {}, 1
  while i <= #text do
    local found
    for len = math.min(maxlen, #text - i + 1), 1, -1 do
      local id = by[text:sub(i, i + len - 1)]
      if id then found = id i = i + len break end
    end
    assert(found, "no token for byte " .. i)
    ids[#ids + 1] = found
  end
  return ids
end

local nested = {
  type = "object",
  properties = {
    name = { type = "string", maxLength = 12 },
    kind = { enum = { "alpha", "beta", "gamma" } },
    score = { type = "number" },
    items = { type = "array", minItems = 1, maxItems = 3, items = { ["$ref"] = "#/$defs/item" } },
    note = { anyOf = { { type = "string", maxLength = 8 }, { type = "null" } } },
    ok = { type = "boolean" },
    v = { const = 2 },
  },
  required = { "name", "kind", "score", "items", "ok" },
  additionalProperties = false,
  ["$defs"] = { item = { type = "object", properties = { id = { type = "integer" }, tags = { type = "array",
    maxItems = 2, items = { type = "string", maxLength = 6 } } }, required = { "id", "tags" } } },
}
local doc = '{"name": "Ada \\"L\\"", "kind": "beta", "score": -1.5e2, "items": [{"id": 7, "tags": ["x", "éy"]},'
  .. ' {"id": 0, "tags": []}], "ok": true, "note": null, "v": 2}'

-- The bits of m against accepting every id on a clone.
local function brute(m, n)
  local bits = ffi.new("uint32_t[?]", m.n_words)
  m:mask(bits)
  local bad = {}
  for id = 0, n - 1 do
    local k = m:clone()
    local ok = k:accept(id) == true
    k:close()
    local bit_set = bit.band(bits[math.floor(id / 32)], bit.lshift(1, id % 32)) ~= 0
    if ok ~= bit_set then bad[#bad + 1] = id .. (ok and " accepted, not in the mask" or " in the mask, refused") end
    if #bad > 5 then break end
  end
  return bad
end

describe("token masks", function()
  for _, name in ipairs({ "stories260K", "llama3-tokenizer", "qwen2-tokenizer" }) do
    it("equal a brute force over " .. name .. "'s vocabulary, along a nested document", function()
      local tok = tok_of(name)
      local v = grammar.vocab(tok)
      assert.are.equal(v, grammar.vocab(tok)) -- built once
      local g = schema_grammar(nested)
      local m = g:matcher(v)
      local ids = name == "stories260K" and greedy(tok, doc) or tok:encode(doc, { add_special = false })
      local probe = { [1] = true, [2] = true, [math.floor(#ids / 2)] = true, [#ids] = true }
      for i = 1, math.floor(#ids / 3) do probe[i * 3] = name == "stories260K" end
      for i, id in ipairs(ids) do
        if probe[i] then assert.are.same({}, brute(m, tok.vocab_size), name .. " before token " .. i) end
        local ok, err = m:accept(id)
        assert.is_true(ok, err)
      end
      assert.is_true(m:must_end())
      assert.are.same({}, brute(m, tok.vocab_size))
      local allowed = m:allowed()
      table.sort(allowed)
      local stops = {}
      for _, s in ipairs(v.stop_ids) do stops[#stops + 1] = s end
      table.sort(stops)
      assert.are.same(stops, allowed)
      assert.is_true(m:accept(v.stop_ids[1]))
      assert.are.same({}, m:allowed())
    end)
  end

  it("equal a brute force at every step of a deeply nested document (stacks deeper than the cache's key)", function()
    local g = schema_grammar({ type = "object", properties = { n = { anyOf = { { ["$ref"] = "#" }, { type = "array",
      items = { type = { "string", "number" } } } } } }, required = { "n" } })
    local text = ('{"n": '):rep(7) .. '["a", 12, "b c", 3]' .. ("}"):rep(7)
    for _, name in ipairs({ "stories260K", "llama3-tokenizer" }) do
      local tok = tok_of(name)
      local m = g:matcher(grammar.vocab(tok))
      local ids = name == "stories260K" and greedy(tok, text) or tok:encode(text, { add_special = false })
      local inside = false
      for i, id in ipairs(ids) do
        local b = grammar.token_bytes(tok, id)
        if name == "stories260K" or (inside and b:find("[%d\"]")) then
          assert.are.same({}, brute(m, tok.vocab_size), name .. " before token " .. i)
        end
        inside = inside or b:find("[", 1, true) ~= nil
        assert.is_true(m:accept(id))
      end
      assert.is_true(m:must_end())
    end
  end)

  it("refuse special tokens and a stop id before the document is complete", function()
    local tok = tok_of("llama3-tokenizer")
    local m = schema_grammar({ type = "object" }):matcher(grammar.vocab(tok))
    local ok, err = m:accept(tok.eos_id)
    assert.is_nil(ok)
    assert.matches("not complete", err)
    ok, err = m:accept(tok:token_to_id("<|start_header_id|>"))
    assert.is_nil(ok)
    assert.matches("special token", err)
    ok, err = m:accept(tok:encode("hello", { add_special = false })[1])
    assert.is_nil(ok)
    assert.matches('%("hello"%) is not allowed here', err)
    assert.is_true(m:accept(tok:encode("{", { add_special = false })[1])) -- the state was kept
  end)

  it("apply sets every logit outside the mask to -inf", function()
    local tok = tok_of("stories260K")
    local m = schema_grammar({ type = "boolean" }):matcher(grammar.vocab(tok))
    local n = tok.vocab_size
    local logits = ffi.new("float[?]", n)
    for i = 0, n - 1 do logits[i] = 0.5 end
    m:apply(logits, n)
    local allowed = {}
    for _, id in ipairs(m:allowed()) do allowed[id] = true end
    for i = 0, n - 1 do
      if allowed[i] then assert.are.equal(0.5, logits[i]) else assert.is_true(logits[i] == -math.huge, i) end
    end
    assert.is_true(next(allowed) ~= nil)
  end)
end)

describe("random walks over allowed tokens", function()
  -- Draws from the mask (seeded); half the time from the allowed tokens that close something
  -- (a quote, a bracket, a comma, a digit), so that walks end.
  local function walk(g, tok, seed)
    local v = grammar.vocab(tok)
    local m = g:matcher(v)
    local state = seed
    local function rand(n)
      state = (state * 1103515245 + 12345) % 2147483648
      return state % n + 1
    end
    local out = {}
    for _ = 1, 3000 do
      if m:can_end() then return table.concat(out), m end
      local allowed = m:allowed()
      assert.is_true(#allowed > 0, "a dead end after " .. table.concat(out))
      local pick = allowed
      if rand(2) == 1 then
        local closing = {}
        for _, id in ipairs(allowed) do
          if (grammar.token_bytes(tok, id) or ""):find('["%]},0-9]') then closing[#closing + 1] = id end
        end
        if #closing > 0 then pick = closing end
      end
      local id = pick[rand(#pick)]
      assert.is_true(m:accept(id))
      out[#out + 1] = grammar.token_bytes(tok, id)
    end
    error("the walk did not end: " .. table.concat(out))
  end

  -- what the OpenAI client's zod helper (zodResponseFormat, openai 4.x's zod-to-json-schema)
  -- writes for z.object({title: z.string().max(16), mood: z.enum([...]), hero: Hero, friends:
  -- z.array(z.string().max(8)).max(3), ending: z.union([z.literal("good"), z.literal("bad"),
  -- z.null()])}) and z.object({a: Hero, b: Hero, n: z.number().nullable()}) (Hero used twice:
  -- a $ref into its definitions; .nullable() as OpenAPI's nullable)
  local zod = {
    [[{"type": "object","properties": {"title": {"type": "string","maxLength": 16},
"mood": {"type": "string","enum": ["happy","sad","scared"]},"hero": {"type": "object",
"properties": {"name": {"type": "string","maxLength": 12},"age": {"type": "integer"},
"brave": {"type": "boolean"}},"required": ["name","age","brave"],"additionalProperties": false},
"friends": {"type": "array","items": {"type": "string","maxLength": 8},"maxItems": 3},
"ending": {"anyOf": [{"type": "string","const": "good"},{"type": "string",
"const": "bad"},{"type": "null"}]}},"required": ["title","mood","hero","friends","ending"],
"additionalProperties": false,"$schema": "http://json-schema.org/draft-07/schema#"}]],
    [[{"type": "object","properties": {"a": {"type": "object","properties": {"name": {"type": "string",
"maxLength": 12},"age": {"type": "integer"},"brave": {"type": "boolean"}},"required": ["name","age",
"brave"],"additionalProperties": false},"b": {"$ref": "#/definitions/twice_properties_a"},
"n": {"type": "number","nullable": true}},"required": ["a","b","n"],"additionalProperties": false,
"definitions": {"twice_properties_a": {"type": "object",
"properties": {"name": {"$ref": "#/definitions/twice_properties_a_properties_name"},
"age": {"$ref": "#/definitions/twice_properties_a_properties_age"},
"brave": {"$ref": "#/definitions/twice_properties_a_properties_brave"}},"required": ["name","age",
"brave"],"additionalProperties": false},"twice_properties_a_properties_name": {"type": "string",
"maxLength": 12},"twice_properties_a_properties_age": {"type": "integer"},
"twice_properties_a_properties_brave": {"type": "boolean"},"twice": {"type": "object",
"properties": {"a": {"type": "object","properties": {"name": {"type": "string","maxLength": 12},
"age": {"type": "integer"},"brave": {"type": "boolean"}},"required": ["name","age","brave"],
"additionalProperties": false},"b": {"$ref": "#/definitions/twice_properties_a"},
"n": {"type": "number","nullable": true}},"required": ["a","b","n"],"additionalProperties": false}},
"$schema": "http://json-schema.org/draft-07/schema#"}]],
  }

  it("end in documents valid against the schemas the OpenAI client's zod helper writes", function()
    local ordered = require "loip.text.json_ordered"
    for i, text in ipairs(zod) do
      local g = grammar.compile(grammar.from_schema(text, "response_format.json_schema.schema"), "s")
      local s = ordered.decode(text)
      for seed = 1, 6 do
        local doc = walk(g, tok_of("stories260K"), 100 * i + seed)
        local ok, why = schema_check.check(s, json.decode(doc))
        assert.is_true(ok, (why or "") .. ": " .. doc)
      end
    end
  end)

  it("end in documents that parse as JSON and are valid against the schema", function()
    local g = schema_grammar(nested)
    for seed = 1, 24 do
      local tok = tok_of(seed % 4 == 0 and "llama3-tokenizer" or "stories260K")
      local text = walk(g, tok, seed)
      local value, err = json.decode(text)
      assert.is_truthy(value, err)
      local ok, why = schema_check.check(nested, value)
      assert.is_true(ok, (why or "") .. ": " .. text)
      assert.is_nil(value.extra)
      -- in the schema's order
      assert.is_true(text:find('"name"', 1, true) < text:find('"kind"', 1, true))
    end
  end)
end)
