-- Qwen3 (Qwen3ForCausalLM; GGUF qwen3): Llama's layer with a per-head RMSNorm of q and k before
-- RoPE.
local M = { name = "qwen3" }

M.classes = { Qwen3ForCausalLM = { qkv_bias = "attention_bias", qk_norm = true } }

M.gguf = { qwen3 = { class = "Qwen3ForCausalLM", model_type = "qwen3" } }

M.shapes = {
  ["qwen3-0.6b"] = { architectures = { "Qwen3ForCausalLM" }, hidden_size = 1024, intermediate_size = 3072,
    num_hidden_layers = 28, num_attention_heads = 16, num_key_value_heads = 8, head_dim = 128,
    vocab_size = 151936, max_position_embeddings = 40960, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    attention_bias = false, tie_word_embeddings = true },
  ["qwen3-32b"] = { architectures = { "Qwen3ForCausalLM" }, hidden_size = 5120, intermediate_size = 25600,
    num_hidden_layers = 64, num_attention_heads = 64, num_key_value_heads = 8, head_dim = 128,
    vocab_size = 151936, max_position_embeddings = 40960, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    attention_bias = false, tie_word_embeddings = false },
}

return M
