-- A GGUF whose vocabulary has o200k_harmony's <|return|> and <|call|> (gpt-oss's, as llama.cpp's
-- converter writes it) stops a generation at either, not at <|end|> (which only ends a message),
-- as llama.cpp's end-of-generation tokens do: the model's stop ids and its tokenizer's alike.
-- stories260K.gguf with three of its tokens renamed stands in for the vocabulary; then gpt-oss's
-- whole vocabulary (OpenAI's o200k_base as o200k_harmony) in the GGUF of a random-weight
-- gpt-oss-20b shape, converted as llama.cpp's converter writes gpt-oss's.
local ffi = require "ffi"
local gguf = require "loip.model.gguf"
local loip = require "loip"
local T = require "spec.support"
teardown(function() T.cleanup() end)

describe("a GGUF with o200k_harmony's end tokens", function()
  it("stops at <|return|> and <|call|>, not at <|end|>", function()
    local src, why = T.fixture_path("models/stories260K-gguf/stories260K.gguf")
    if not src then pending(why) return end
    local g = gguf.open(src)
    local keys, md = {}, {}
    for k in pairs(g.metadata) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local v, ty = g.metadata[k], g.types[k]
      if k == "tokenizer.ggml.tokens" or k == "tokenizer.ggml.token_type" then
        local copy = {}
        for i, x in ipairs(v) do copy[i] = x end
        v = copy
        local names = { [509] = "<|return|>", [510] = "<|call|>", [511] = "<|end|>" }
        for id, name in pairs(names) do
          if k == "tokenizer.ggml.tokens" then v[id + 1] = name else v[id + 1] = 3 end
        end
      end
      md[#md + 1] = { k, ty, v }
    end
    local tensors = {}
    for _, name in ipairs(g.order) do
      local x = g.tensors[name]
      local p, n = g:data(name)
      tensors[#tensors + 1] = { name = name, type = x.type, dims = x.dims, data = ffi.string(p, n) }
    end
    g:close()
    local path = T.tmpdir() .. "/harmony-stops.gguf"
    T.write(path, gguf.encode(md, tensors))
    local m = loip.model.open(path)
    local eos = m.tokenizer.eos_id
    assert.are.same({ eos, 509, 510 }, m.stop_ids)
    assert.are.same({ eos, 509, 510 }, m.tokenizer.stop_ids)
    m:close()
  end)

  it("stops at <|return|>, <|call|> and <|endoftext|> with gpt-oss's whole vocabulary, and cuts text as o200k_harmony", function()
    local dir, why = require("spec.support.o200k").synth_gpt_oss()
    if not dir then pending(why) return end
    local path = dir .. "/gpt-oss.gguf"
    require("spec.support.to_gguf").convert(dir .. "/hf", path)
    local m = loip.model.open(path, { threads = 1, context = 64 })
    assert.are.same({ "gguf", "o200k", 201088 }, { m.tokenizer.kind, m.tokenizer.pretokenizer, m.vocab_size })
    assert.are.same({ 200002, 200012, 199999 }, m.stop_ids) -- not <|end|> (200007)
    assert.are.same({ 200002, 200012, 199999 }, m.tokenizer.stop_ids)
    -- openai/harmony's test_simple_tool_call, as the GGUF's vocabulary cuts its text
    local v = require("cjson").decode(T.read(assert(T.fixture_path("models/o200k-harmony/vectors.json"))))
    local call
    for _, c in ipairs(v.vectors) do if c.name == "tool_call" then call = c end end
    assert.are.same(call.ids, m.tokenizer:encode(call.text))
    -- the directory it was converted from stops at the same ids (from its generation_config.json)
    local h = loip.model.open(dir .. "/hf", { threads = 1, context = 64, tokenizer = false })
    assert.are.same(m.stop_ids, h.stop_ids)
    h:close()
    m:close()
  end)
end)
