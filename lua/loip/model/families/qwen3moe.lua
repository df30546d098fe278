-- Qwen3-MoE (Qwen3MoeForCausalLM; GGUF qwen3moe): Qwen3's attention, a mixture of experts in every
-- layer; llama.cpp always renormalises the top-k.
local experts = require "loip.model.families.qwen_experts"

local M = { name = "qwen3moe" }

M.classes = {
  Qwen3MoeForCausalLM = { qkv_bias = "attention_bias", qk_norm = true, experts = experts, dense = "Qwen3ForCausalLM" },
}

M.gguf = {
  qwen3moe = { class = "Qwen3MoeForCausalLM", model_type = "qwen3_moe", experts = true, norm_topk_prob = true },
}

M.shapes = {
  ["qwen3-30b-a3b"] = { architectures = { "Qwen3MoeForCausalLM" }, hidden_size = 2048, intermediate_size = 6144,
    moe_intermediate_size = 768, num_experts = 128, num_experts_per_tok = 8, norm_topk_prob = true,
    num_hidden_layers = 48, num_attention_heads = 32, num_key_value_heads = 4, head_dim = 128,
    vocab_size = 151936, max_position_embeddings = 40960, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
    attention_bias = false, tie_word_embeddings = false },
  -- OLMoE-1B-7B's dimensions (64 experts of 1024, top-8, not renormalised) carried by the Qwen3-MoE
  -- architecture: OLMoE's own q/k norms span all heads at once, which loip does not run, so this
  -- shape is its sizes and costs, not a model OLMoE's weights would load into
  ["olmoe-1b-7b"] = { architectures = { "Qwen3MoeForCausalLM" }, hidden_size = 2048, intermediate_size = 1024,
    moe_intermediate_size = 1024, num_experts = 64, num_experts_per_tok = 8, norm_topk_prob = false,
    num_hidden_layers = 16, num_attention_heads = 16, num_key_value_heads = 16, head_dim = 128, vocab_size = 50304,
    max_position_embeddings = 4096, rms_norm_eps = 1e-5, rope_theta = 10000.0, attention_bias = false,
    tie_word_embeddings = false },
}

return M
