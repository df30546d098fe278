-- What planning prices a token's MLP at (loip.plan.shape): a mixture of experts works like the
-- dense model of its top-k experts side by side; experts released as MXFP4 (gpt-oss) are read
-- in 17 bytes per 32 values, not in the dtype of the rest (issue 38: gpt-oss's compute was priced
-- as if its experts were BF16, 3.8x the bytes a token reads).
local shape = require "loip.plan.shape"
local synth = require "loip.model.synth"

describe("loip.plan.shape", function()
  local function cfg_of(like) return synth.config { like = like, dtype = "bf16" } end

  it("prices gpt-oss's routed experts at MXFP4's bytes, the attention at BF16's", function()
    local cfg = cfg_of("gpt-oss-120b")
    assert.are.equal("mxfp4", cfg.quantization_config.quant_method)
    local mx = shape.shape_of(cfg, "BF16")
    local plain = {}
    for k, v in pairs(cfg) do plain[k] = v end
    plain.quantization_config = nil
    local bf = shape.shape_of(plain, "BF16")
    -- 4 experts of 2880 x 2880, gate, up and down: the difference is theirs alone
    local weights = 3 * 2880 * 4 * 2880
    assert.are.equal(weights * (2 - 17 / 32), bf.mlp_bytes - mx.mlp_bytes)
    assert.are.equal(bf.mha_bytes, mx.mha_bytes)
    assert.are.equal(bf.head_bytes, mx.head_bytes)
    assert.is_true(mx.mlp_bytes >= weights * 17 / 32 and mx.mlp_bytes < weights * 17 / 32 + 1e6)
  end)

  it("leaves dense shapes and BF16 experts as they were", function()
    local cfg = cfg_of("llama-3.2-1b")
    local s = shape.shape_of(cfg, "BF16")
    assert.are.equal(3 * 2048 * 8192 * 2 + 2048 * 2, s.mlp_bytes)
    local q = cfg_of("qwen3-30b-a3b")
    assert.is_nil(q.quantization_config)
    assert.are.equal(3 * 2048 * 8 * 768 * 2 + 2048 * 2, shape.shape_of(q, "BF16").mlp_bytes)
  end)
end)
