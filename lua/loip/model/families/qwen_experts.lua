-- The tensor names of Qwen's mixtures of experts (Qwen2-MoE, Qwen3-MoE): the router, a routed
-- expert's parts, and (Qwen2-MoE) the shared expert and its gate.
local core = require "loip.core"
local K = core.constants

return {
  router = "mlp.gate.weight", expert = "mlp.experts.%d.%s.weight", parts = { "gate_proj", "up_proj", "down_proj" },
  count = "num_experts", size = "moe_intermediate_size",
  shared = { { K.W_GATE, "mlp.shared_expert.gate_proj.weight" }, { K.W_UP, "mlp.shared_expert.up_proj.weight" },
    { K.W_DOWN, "mlp.shared_expert.down_proj.weight" } },
  shared_gate = "mlp.shared_expert_gate.weight",
}
