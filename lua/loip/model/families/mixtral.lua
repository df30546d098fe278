-- Mixtral (MixtralForCausalLM): Mistral's attention, a mixture of experts in every layer (no shared
-- expert, the top-k always renormalised). Its GGUF is `llama` with expert tensors (families/llama.lua).
local M = { name = "mixtral" }

M.classes = {
  MixtralForCausalLM = { qkv_bias = false, dense = "MistralForCausalLM",
    experts = { router = "block_sparse_moe.gate.weight", expert = "block_sparse_moe.experts.%d.%s.weight",
      parts = { "w1", "w3", "w2" }, count = "num_local_experts", size = "intermediate_size", renormalise = true } },
}

M.shapes = {
  ["mixtral-8x7b"] = { architectures = { "MixtralForCausalLM" }, hidden_size = 4096, intermediate_size = 14336,
    num_local_experts = 8, num_experts_per_tok = 2, num_hidden_layers = 32, num_attention_heads = 32,
    num_key_value_heads = 8, vocab_size = 32000, max_position_embeddings = 32768, rms_norm_eps = 1e-5,
    rope_theta = 1000000.0, tie_word_embeddings = false },
}

return M
