-- Shapes of real models, as their Hugging Face config.json files give them, for synthetic
-- benchmark models (`loip synth --like NAME`).
local M = {}

local llama3_rope = function(factor)
  return { rope_type = "llama3", factor = factor, low_freq_factor = 1.0, high_freq_factor = 4.0,
    original_max_position_embeddings = 8192 }
end

M.shapes = {
  ["llama-2-7b"] = { architectures = { "LlamaForCausalLM" }, hidden_size = 4096, intermediate_size = 11008,
    num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32, vocab_size = 32000,
    max_position_embeddings = 4096, rms_norm_eps = 1e-5, rope_theta = 10000.0, tie_word_embeddings = false },
  ["llama-2-13b"] = { architectures = { "LlamaForCausalLM" }, hidden_size = 5120, intermediate_size = 13824,
    num_hidden_layers = 40, num_attention_heads = 40, num_key_value_heads = 40, vocab_size = 32000,
    max_position_embeddings = 4096, rms_norm_eps = 1e-5, rope_theta = 10000.0, tie_word_embeddings = false },
  ["llama-3.2-1b"] = { architectures = { "LlamaForCausalLM" }, hidden_size = 2048, intermediate_size = 8192,
    num_hidden_layers = 16, num_attention_heads = 32, num_key_value_heads = 8, head_dim = 64,
    vocab_size = 128256, max_position_embeddings = 131072, rms_norm_eps = 1e-5, rope_theta = 500000.0,
    rope_scaling = llama3_rope(32.0), tie_word_embeddings = true },
  ["llama-3.2-3b"] = { architectures = { "LlamaForCausalLM" }, hidden_size = 3072, intermediate_size = 8192,
    num_hidden_layers = 28, num_attention_heads = 24, num_key_value_heads = 8, head_dim = 128,
    vocab_size = 128256, max_position_embeddings = 131072, rms_norm_eps = 1e-5, rope_theta = 500000.0,
    rope_scaling = llama3_rope(32.0), tie_word_embeddings = true },
  ["llama-3.1-8b"] = { architectures = { "LlamaForCausalLM" }, hidden_size = 4096, intermediate_size = 14336,
    num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8, vocab_size = 128256,
    max_position_embeddings = 131072, rms_norm_eps = 1e-5, rope_theta = 500000.0,
    rope_scaling = llama3_rope(8.0), tie_word_embeddings = false },
  ["llama-3.3-70b"] = { architectures = { "LlamaForCausalLM" }, hidden_size = 8192, intermediate_size = 28672,
    num_hidden_layers = 80, num_attention_heads = 64, num_key_value_heads = 8, vocab_size = 128256,
    max_position_embeddings = 131072, rms_norm_eps = 1e-5, rope_theta = 500000.0,
    rope_scaling = llama3_rope(8.0), tie_word_embeddings = false },
  ["mistral-7b"] = { architectures = { "MistralForCausalLM" }, hidden_size = 4096, intermediate_size = 14336,
    num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8, vocab_size = 32768,
    max_position_embeddings = 32768, rms_norm_eps = 1e-5, rope_theta = 1000000.0, tie_word_embeddings = false },
  ["qwen2.5-0.5b"] = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 896, intermediate_size = 4864,
    num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2, vocab_size = 151936,
    max_position_embeddings = 32768, rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = true },
  ["qwen2.5-7b"] = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 3584, intermediate_size = 18944,
    num_hidden_layers = 28, num_attention_heads = 28, num_key_value_heads = 4, vocab_size = 152064,
    max_position_embeddings = 32768, rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = false },
  ["qwen3-0.6b"] = { architectures = { "Qwen3ForCausalLM" }, hidden_size = 1024, intermediate_size = 3072,
    num_hidden_layers = 28, num_attention_heads = 16, num_key_value_heads = 8, head_dim = 128,
    vocab_size = 151936, max_position_embeddings = 40960, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    attention_bias = false, tie_word_embeddings = true },
  ["qwen3-32b"] = { architectures = { "Qwen3ForCausalLM" }, hidden_size = 5120, intermediate_size = 25600,
    num_hidden_layers = 64, num_attention_heads = 64, num_key_value_heads = 8, head_dim = 128,
    vocab_size = 151936, max_position_embeddings = 40960, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    attention_bias = false, tie_word_embeddings = false },
  -- mixtures of experts (loip synth --experts N --experts-per-token K; --ffn: an expert's size)
  ["qwen3-30b-a3b"] = { architectures = { "Qwen3MoeForCausalLM" }, hidden_size = 2048, intermediate_size = 6144,
    moe_intermediate_size = 768, num_experts = 128, num_experts_per_tok = 8, norm_topk_prob = true,
    num_hidden_layers = 48, num_attention_heads = 32, num_key_value_heads = 4, head_dim = 128,
    vocab_size = 151936, max_position_embeddings = 40960, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    attention_bias = false, tie_word_embeddings = false },
  ["mixtral-8x7b"] = { architectures = { "MixtralForCausalLM" }, hidden_size = 4096, intermediate_size = 14336,
    num_local_experts = 8, num_experts_per_tok = 2, num_hidden_layers = 32, num_attention_heads = 32,
    num_key_value_heads = 8, vocab_size = 32000, max_position_embeddings = 32768, rms_norm_eps = 1e-5,
    rope_theta = 1000000.0, tie_word_embeddings = false },
  -- OLMoE-1B-7B's dimensions (64 experts of 1024, top-8, not renormalised) carried by the Qwen3-MoE
  -- architecture: OLMoE's own q/k norms span all heads at once, which loip does not run, so this
  -- shape is its sizes and costs, not a model OLMoE's weights would load into
  ["olmoe-1b-7b"] = { architectures = { "Qwen3MoeForCausalLM" }, hidden_size = 2048, intermediate_size = 1024,
    moe_intermediate_size = 1024, num_experts = 64, num_experts_per_tok = 8, norm_topk_prob = false,
    num_hidden_layers = 16, num_attention_heads = 16, num_key_value_heads = 16, head_dim = 128, vocab_size = 50304,
    max_position_embeddings = 4096, rms_norm_eps = 1e-5, rope_theta = 10000.0, attention_bias = false,
    tie_word_embeddings = false },
  -- Qwen1.5-MoE-A2.7B: a shared expert of 4 experts' size beside 60 routed ones, top-4
  ["qwen1.5-moe-a2.7b"] = { architectures = { "Qwen2MoeForCausalLM" }, hidden_size = 2048, intermediate_size = 5632,
    moe_intermediate_size = 1408, shared_expert_intermediate_size = 5632, num_experts = 60, num_experts_per_tok = 4,
    norm_topk_prob = false, num_hidden_layers = 24, num_attention_heads = 16, num_key_value_heads = 16,
    vocab_size = 151936, max_position_embeddings = 8192, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    tie_word_embeddings = false },
}

-- The config fields of a mixture of experts' shape that loip synth's --experts,
-- --experts-per-token and --ffn set (nil for a dense shape).
function M.expert_fields(cfg)
  local arch = cfg.architectures[1]
  if arch == "MixtralForCausalLM" then
    return { experts = "num_local_experts", experts_per_token = "num_experts_per_tok", ffn = "intermediate_size" }
  elseif cfg.num_experts then
    return { experts = "num_experts", experts_per_token = "num_experts_per_tok", ffn = "moe_intermediate_size" }
  end
  return nil
end

function M.names()
  local n = {}
  for k in pairs(M.shapes) do n[#n + 1] = k end
  table.sort(n)
  return n
end

-- A copy of the named config (nil, message when unknown).
function M.get(name)
  local s = M.shapes[name]
  if not s then
    return nil, string.format("unknown shape '%s' (known: %s)", tostring(name), table.concat(M.names(), ", "))
  end
  local copy = {}
  for k, v in pairs(s) do copy[k] = v end
  copy.model_type = copy.architectures[1]:match("^(.-)ForCausalLM$"):lower()
  copy.hidden_act = "silu"
  return copy
end

return M
