-- Qwen2 (Qwen2ForCausalLM; GGUF qwen2): Llama's layer with biases on q, k and v, RoPE in
-- rotate-half order in both formats.
local M = { name = "qwen2" }

M.classes = { Qwen2ForCausalLM = { qkv_bias = true } }

M.gguf = { qwen2 = { class = "Qwen2ForCausalLM", model_type = "qwen2", attention_bias = false } }

M.shapes = {
  ["qwen2.5-0.5b"] = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 896, intermediate_size = 4864,
    num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2, vocab_size = 151936,
    max_position_embeddings = 32768, rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = true },
  ["qwen2.5-7b"] = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 3584, intermediate_size = 18944,
    num_hidden_layers = 28, num_attention_heads = 28, num_key_value_heads = 4, vocab_size = 152064,
    max_position_embeddings = 32768, rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = false },
}

return M
