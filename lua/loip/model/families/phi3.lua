-- Phi-3 and Phi-4 (Phi3ForCausalLM; GGUF phi3): Llama's layer with q, k and v in one tensor
-- fused by rows (qkv_proj, GGUF attn_qkv) and the MLP's gate and up in another (gate_up_proj,
-- GGUF ffn_up: gate rows first), RoPE in rotate-half order. Phi-3-mini-4k attends within a
-- sliding window of 2047 tokens (every layer's: loip.model.hf.windows_of); Phi-4 has none. Not run: the
-- 128k models' longrope scaling (refused by rope_scaling), Phi-4-mini's partial rotary factor.
local core = require "loip.core"
local K = core.constants

local M = { name = "phi3" }

M.classes = {
  Phi3ForCausalLM = { qkv_bias = false,
    layer = { ["self_attn.qkv_proj.weight"] = { K.W_WQ, K.W_WK, K.W_WV },
      ["mlp.gate_up_proj.weight"] = { K.W_GATE, K.W_UP } },
    config = function(cfg, path, field)
      local f = field(cfg, path, "partial_rotary_factor", "number", 1)
      if f ~= 1 then
        error(string.format("%s: field 'partial_rotary_factor' is %s: partial rotary embeddings are not supported", path, f), 0)
      end
    end },
}

M.gguf = {
  phi3 = { class = "Phi3ForCausalLM", model_type = "phi3", keys = { ["attention.sliding_window"] = "sliding_window" },
    layer = { ["attn_qkv.weight"] = { K.W_WQ, K.W_WK, K.W_WV }, ["ffn_up.weight"] = { K.W_GATE, K.W_UP } },
    -- (llama.cpp's converter writes sliding_window 0 for a model without one: Phi-4)
    config = function(md, cfg)
      local w = md["phi3.attention.sliding_window"]
      if type(w) == "number" and w > 0 then cfg.sliding_window = w end
    end },
}

M.shapes = {
  ["phi-3-mini-4k"] = { architectures = { "Phi3ForCausalLM" }, hidden_size = 3072, intermediate_size = 8192,
    num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32, vocab_size = 32064,
    max_position_embeddings = 4096, original_max_position_embeddings = 4096, rms_norm_eps = 1e-5,
    rope_theta = 10000.0, sliding_window = 2047, tie_word_embeddings = false },
  ["phi-4"] = { architectures = { "Phi3ForCausalLM" }, hidden_size = 5120, intermediate_size = 17920,
    num_hidden_layers = 40, num_attention_heads = 40, num_key_value_heads = 10, vocab_size = 100352,
    max_position_embeddings = 16384, original_max_position_embeddings = 16384, rms_norm_eps = 1e-5,
    rope_theta = 250000.0, tie_word_embeddings = false },
}

return M
