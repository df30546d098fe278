-- Qwen2-MoE (Qwen2MoeForCausalLM; GGUF qwen2moe): Qwen2's attention, a mixture of experts in
-- every layer beside a shared expert scaled by its sigmoid gate; llama.cpp never renormalises
-- the top-k.
local experts = require "loip.model.families.qwen_experts"

local M = { name = "qwen2moe" }

M.classes = {
  Qwen2MoeForCausalLM = { qkv_bias = true, experts = experts, shared = true, dense = "Qwen2ForCausalLM" },
}

M.gguf = {
  qwen2moe = { class = "Qwen2MoeForCausalLM", model_type = "qwen2_moe", experts = true, norm_topk_prob = false,
    shared = true },
}

M.shapes = {
  -- Qwen1.5-MoE-A2.7B: a shared expert of 4 experts' size beside 60 routed ones, top-4
  ["qwen1.5-moe-a2.7b"] = { architectures = { "Qwen2MoeForCausalLM" }, hidden_size = 2048, intermediate_size = 5632,
    moe_intermediate_size = 1408, shared_expert_intermediate_size = 5632, num_experts = 60, num_experts_per_tok = 4,
    norm_topk_prob = false, num_hidden_layers = 24, num_attention_heads = 16, num_key_value_heads = 16,
    vocab_size = 151936, max_position_embeddings = 8192, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    tie_word_embeddings = false },
}

return M
