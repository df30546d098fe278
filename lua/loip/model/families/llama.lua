-- Llama (LlamaForCausalLM) and Mistral (MistralForCausalLM): the common layer every family
-- starts from (RMSNorm, q/k/v/o attention with RoPE, a SwiGLU MLP). GGUF `llama` holds both, with
-- q/k rows in Meta's pairs, and Mixtral when the file has experts (families/mixtral.lua).
local M = { name = "llama" }

M.classes = {
  LlamaForCausalLM = { qkv_bias = "attention_bias" },
  MistralForCausalLM = { qkv_bias = false },
}

M.gguf = {
  llama = { class = "LlamaForCausalLM", model_type = "llama", interleaved = true, keys = { vocab_size = "vocab_size" },
    moe = { class = "MixtralForCausalLM", model_type = "mixtral" } },
}

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
}

return M
