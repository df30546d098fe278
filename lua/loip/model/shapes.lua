-- Shapes of real models, as their Hugging Face config.json files give them, for synthetic
-- benchmark models (`loip synth --like NAME`): each family's (lua/loip/model/families/).
local families = require "loip.model.families"

local M = {}

M.shapes = families.shapes

-- The config fields of a mixture of experts' shape that loip synth's --experts,
-- --experts-per-token and --ffn set (nil for a dense shape).
function M.expert_fields(cfg)
  local x = (families.classes[cfg.architectures[1]] or {}).experts
  if not x then return nil end
  return { experts = x.count, experts_per_token = "num_experts_per_tok", ffn = x.size }
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
  copy.model_type = copy.model_type or copy.architectures[1]:match("^(.-)ForCausalLM$"):lower()
  if not copy.hidden_activation then copy.hidden_act = "silu" end
  return copy
end

return M
