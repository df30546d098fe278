-- A Hugging Face model directory end to end: real tokenizer (Qwen2's vocab.json + merges.txt
-- and its chat template: models/qwen2-tokenizer), random weights with a real model's layout,
-- and the generated text streamed as whole UTF-8 characters.
local json = require "loip.text.json"
local loip = require "loip"
local T = require "spec.support"

local function valid_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or c >= 0xF0 and 4 or c >= 0xE0 and 3 or c >= 0xC2 and 2 or nil
    if not len or i + len - 1 > n then return false end
    for k = i + 1, i + len - 1 do
      local b = s:byte(k)
      if b < 0x80 or b > 0xBF then return false end
    end
    i = i + len
  end
  return true
end

describe("a Hugging Face model with its own tokenizer", function()
  local dir
  setup(function()
    local src = T.fixture_path("models/qwen2-tokenizer/vocab.json")
    if not src then return end
    local q = src:gsub("vocab%.json$", "")
    dir = T.tmpdir() .. "/q"
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like qwen2.5-0.5b --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --std 0.5 %s",
      T.loip, dir))
    assert(rc == 0, err)
    os.remove(dir .. "/tokenizer.bin")
    for _, f in ipairs({ "vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json" }) do
      T.write(dir .. "/" .. f, T.read(q .. f))
    end
  end)
  teardown(function() T.cleanup() end)

  it("streams only whole characters, which join to the full decode", function()
    if not dir then return pending(select(2, T.fixture_path("models/qwen2-tokenizer/vocab.json"))) end
    local m = loip.model.open(dir, { threads = 2, load = "mmap" })
    assert.are.equal("hf", m.tokenizer.kind:sub(1, 2))
    local it, st = m:generate("你好，世界。Hello", { temperature = 1.0, top_p = 1, seed = 5, max_tokens = 60 })
    local parts = {}
    for id, text in it do
      -- The last chunk (id false) is what was held back when generation stopped: it may end
      -- in an unfinished character, exactly as the full decode does.
      if id then assert.is_true(valid_utf8(text), string.format("chunk %q is not whole UTF-8", text)) end
      parts[#parts + 1] = text
    end
    assert.are.equal(60, #st.token_ids)
    assert.are.equal(m.tokenizer:decode(st.token_ids), table.concat(parts))
    m:close()
  end)

  it("generates from the model's chat template on the command line", function()
    if not dir then return pending(select(2, T.fixture_path("models/qwen2-tokenizer/vocab.json"))) end
    local rc, out, err = T.run(string.format("%s generate --model %s --chat --prompt 'Hi!' --temperature 0 --max-tokens 4 --json", T.loip, dir))
    assert.are.equal(0, rc, err)
    local r = json.decode(out)
    local tok = loip.tokenizer.open(dir)
    local want = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert.are.same(tok:encode(want, { add_special = false }), r.prompt_ids)
    assert.are.equal(4, #r.token_ids)
  end)

  it("shows ids, pieces and text with loip tokenize", function()
    if not dir then return pending(select(2, T.fixture_path("models/qwen2-tokenizer/vocab.json"))) end
    local rc, out, err = T.run(string.format("%s tokenize --model %s --json '你好 world<|im_end|>'", T.loip, dir))
    assert.are.equal(0, rc, err)
    local r = json.decode(out)
    assert.are.same({ "你好", " world", "<|im_end|>" }, r.texts)
    assert.are.equal(151645, r.ids[#r.ids])
  end)
end)
