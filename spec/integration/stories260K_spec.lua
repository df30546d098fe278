-- stories260K against llama2.c run.c's own outputs (models/stories260K/reference, copied from
-- the project's shared test data): logits at every position within 1e-4, and greedy
-- generations identical, for the llama2.c checkpoint and the Hugging Face (rotate-half) copy.
local loip = require "loip"
local json = require "loip.text.json"
local T = require "spec.support"

local REF = T.root .. "/models/stories260K/reference"
local TOL = 1e-4
local formats = {
  { "llama2.c checkpoint", T.root .. "/models/stories260K", {} },
  { "Hugging Face copy", T.root .. "/models/stories260K-hf",
    { tokenizer = T.root .. "/models/stories260K/tok512.bin" } },
}

local greedy = assert(json.load(REF .. "/greedy.json"))

after_each(function() collectgarbage() collectgarbage() end)

for _, f in ipairs(formats) do
  local label, path, opts = f[1], f[2], f[3]
  describe("stories260K, " .. label, function()
    local m
    setup(function() m = loip.model.open(path, opts) end)
    teardown(function() m:close() end)

    local function check_logits(ids, file)
      local ref, n = T.read_f32(REF .. "/" .. file)
      assert.are.equal(#ids * 512, n)
      local out = m:logits(ids)
      local d = T.max_abs_diff(out, ref, n)
      assert.is_true(d < TOL, string.format("%s: max |diff| %.3g >= %g", file, d, TOL))
    end

    it("matches run.c's logits for seqA at every position", function()
      check_logits({ 1, 403, 407, 261, 378, 432, 383, 286 }, "logits_seqA.f32")
    end)

    it("matches run.c's logits for seqB (byte tokens, last id)", function()
      check_logits({ 1, 100, 500, 42, 7, 300, 511, 3 }, "logits_seqB.f32")
    end)

    it("matches run.c's logits over the 201-position greedy sequence", function()
      check_logits(greedy.cases[1].sequence_ids, "logits_greedy_full.f32")
    end)

    it("encodes the prompts as run.c does", function()
      for _, c in ipairs(greedy.cases) do
        assert.are.same(c.prompt_ids, m.tokenizer:encode(c.prompt))
      end
    end)

    for _, c in ipairs(greedy.cases) do
      it("generates run.c's greedy text for " .. string.format("%q", c.prompt), function()
        -- run.c's -n counts positions including the prompt and stops when it samples BOS.
        local it, st = m:generate(c.prompt, { temperature = 0, stop = { 1 },
          max_tokens = greedy.steps - #c.prompt_ids + 1 })
        local text = {}
        for _, piece in it do text[#text + 1] = piece end
        assert.are.same(c.generated_ids, st.token_ids)
        assert.are.equal(c.output_text, m.tokenizer:decode(c.prompt_ids):gsub("^ ", "") .. table.concat(text))
      end)
    end
  end)
end

describe("tok512.bin", function()
  it("encodes the 18 strings of run.c's encode.json exactly", function()
    local cases = assert(json.load(REF .. "/encode.json")).cases
    assert.are.equal(18, #cases)
    local tok = loip.tokenizer.open_file(T.root .. "/models/stories260K/tok512.bin")
    for _, c in ipairs(cases) do
      assert.are.same(c.ids, tok:encode(c.text), string.format("%q", c.text))
    end
    tok:close()
  end)
end)

describe("stories260K execution paths", function()
  it("gives bit-identical logits for batched prefill and token-by-token decoding", function()
    local ids = greedy.cases[2].sequence_ids
    local a = loip.model.open(T.root .. "/models/stories260K", { tokenizer = false })
    local b = loip.model.open(T.root .. "/models/stories260K", { tokenizer = false, batch = 1 })
    local la, lb = a:logits(ids), b:logits(ids)
    assert.are.equal(0, T.bit_diffs(la, lb, #ids * 512))
    a:close() b:close()
  end)

  it("gives the same greedy tokens with every kernel variant and thread count", function()
    local C = loip.C
    local base
    for _, k in ipairs({ "ref", "avx2", "avx512", "amx", "amx-auto" }) do
      if C.loip_kernels_use(k) == 0 then
        for _, threads in ipairs({ 1, 2, 3 }) do
          local m = loip.model.open(T.root .. "/models/stories260K", { threads = threads })
          local it, st = m:generate("One day", { temperature = 0, max_tokens = 60, stop = { 1 } })
          for _ in it do end
          base = base or st.token_ids
          assert.are.same(base, st.token_ids, k .. " with " .. threads .. " threads")
          m:close()
        end
      end
    end
    C.loip_kernels_use("auto")
  end)
end)
