-- The AMX kernel variant (kernels/cpu/kernels_amx.c: BF16 products on AMX tiles, activations
-- split exactly into three bf16 parts) against the avx512 fp32 path on a whole model: a small
-- synthetic llama with BF16 weights whose every dimension leaves a tail on the tiles (hidden 80,
-- ffn 200, vocab 300, head_dim 20; prompts of 1, 37 and 70 tokens). Logits at every position
-- agree within 1e-5 of the largest logit (the fp32-vs-fp64 tolerance of architectures_spec), the
-- greedy tokens are identical for 1, 2 and 3 threads, and with AMX a batched prefill equals
-- token-by-token decoding bit for bit (the kernels' determinism contract). amx-auto (opt-in:
-- LOIP_KERNELS=amx-auto; never the default, its bits depend on a step's tokens) gives amx's bits from its threshold of tokens up and avx512's below it, the
-- threshold set at run time (LOIP_AMX_ROWS, exec.kernels_amx_rows). Pending where the
-- CPU, the OS or the compiler has no AMX-BF16.
local loip = require "loip"
local exec = require "loip.runtime.exec"
local T = require "spec.support"

local C = loip.C
local has_amx = C.loip_kernels_use("amx") == 0
C.loip_kernels_use("auto")

local function synth_model()
  local dir = T.tmpdir() .. "/m"
  local cmd = string.format("LOIP_QUIET=1 %s synth --like llama-3.2-1b --dtype bf16 --layers 2 --dim 80 "
    .. "--heads 4 --kv-heads 2 --ffn 200 --vocab 300 --seed 5 --std 0.3 %s", T.loip, dir)
  local rc, _, err = T.run(cmd)
  assert.are.equal(0, rc, err)
  return dir
end

local function with_kernels(name, fn)
  assert.are.equal(0, C.loip_kernels_use(name))
  assert.are.equal(name, exec.kernels_name())
  local ok, err = pcall(fn)
  C.loip_kernels_use("auto")
  if not ok then error(err, 0) end
end

local prompt = {}
for i = 1, 70 do prompt[i] = 3 + (i * 37) % 290 end

describe("AMX kernels on a synthetic BF16 llama", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  if not has_amx then
    pending("no AMX-BF16 on this CPU/OS/build")
    return
  end

  it("gives the avx512 path's logits at every position within 1e-5 of the largest", function()
    local dir = synth_model()
    for _, n in ipairs({ 1, 37, 70 }) do
      local ids = { unpack(prompt, 1, n) }
      local out = {}
      for _, k in ipairs({ "amx", "avx512", "amx-auto" }) do
        with_kernels(k, function()
          local m = loip.model.open(dir, { threads = 2 })
          out[k] = { m:logits(ids), m.vocab_size }
          out[k].m = m
        end)
      end
      local count = n * out.amx[2]
      local scale = 0
      for i = 0, count - 1 do scale = math.max(scale, math.abs(out.avx512[1][i])) end
      assert.is_true(scale > 1, string.format("logits too small to test anything (max %.3g)", scale))
      for _, k in ipairs({ "amx", "amx-auto" }) do
        local worst = T.max_abs_diff(out[k][1], out.avx512[1], count)
        assert.is_true(worst <= 1e-5 * scale, string.format("%s, %d tokens: max |diff| %.3g, max |logit| %.3g", k, n, worst, scale))
      end
      out.amx.m:close() out.avx512.m:close() out["amx-auto"].m:close()
    end
  end)

  it("generates the avx512 path's greedy tokens with 1, 2 and 3 threads", function()
    local dir = synth_model()
    local base
    for _, k in ipairs({ "avx512", "amx", "amx-auto" }) do
      with_kernels(k, function()
        for _, threads in ipairs({ 1, 2, 3 }) do
          local m = loip.model.open(dir, { threads = threads })
          local it, st = m:generate({ unpack(prompt, 1, 37) }, { temperature = 0, max_tokens = 40 })
          for _ in it do end
          assert.is_true(#st.token_ids >= 10, "too few tokens to compare: " .. #st.token_ids)
          base = base or st.token_ids
          assert.are.same(base, st.token_ids, k .. " with " .. threads .. " threads")
          m:close()
        end
      end)
    end
  end)

  it("gives bit-identical logits for batched prefill and token-by-token decoding", function()
    local dir = synth_model()
    with_kernels("amx", function()
      local ids = { unpack(prompt, 1, 37) }
      local a = loip.model.open(dir, { threads = 2 })
      local b = loip.model.open(dir, { threads = 2, batch = 1 })
      local la, lb = a:logits(ids), b:logits(ids)
      assert.are.equal(0, T.bit_diffs(la, lb, #ids * a.vocab_size))
      a:close() b:close()
    end)
  end)

  it("amx-auto prefills from its threshold of tokens on AMX and below it on avx512, bit for bit", function()
    local dir = synth_model()
    local function logits(k, n)
      local out
      with_kernels(k, function()
        local m = loip.model.open(dir, { threads = 2 })
        out = m:logits({ unpack(prompt, 1, n) })
        m:close()
      end)
      return out
    end
    local was = exec.kernels_amx_rows()
    assert.are.equal(32, was) -- LOIP_AMX_ROWS_DEFAULT (the spec runs without LOIP_AMX_ROWS)
    local V = 300
    local ok, err = pcall(function()
      assert.are.equal(0, T.bit_diffs(logits("amx-auto", 37), logits("amx", 37), 37 * V))
      assert.are.equal(0, T.bit_diffs(logits("amx-auto", 1), logits("avx512", 1), V))
      assert.are.equal(0, T.bit_diffs(logits("amx-auto", 31), logits("avx512", 31), 31 * V))
      assert.are.equal(64, exec.kernels_amx_rows(64))
      assert.are.equal(0, T.bit_diffs(logits("amx-auto", 37), logits("avx512", 37), 37 * V))
      assert.are.equal(64, exec.kernels_amx_rows(0))
    end)
    exec.kernels_amx_rows(was)
    if not ok then error(err, 0) end
  end)

  it("refuses a LOIP_AMX_ROWS that is not a whole number of tokens, naming it", function()
    local rc, _, err = T.run("LOIP_AMX_ROWS=0.5 " .. T.loip .. " version")
    assert.are_not.equal(0, rc)
    assert.matches("LOIP_AMX_ROWS: '0.5' is not a whole number", err, 1, true)
    local rc2, out2 = T.run("LOIP_KERNELS=amx-auto LOIP_AMX_ROWS=40 " .. T.loip .. " version")
    assert.are.equal(0, rc2)
    assert.matches("kernels amx-auto from 40 tokens", out2, 1, true)
  end)
end)
