-- The paper's online planner without its KV transfer protocol (the ablation of Table III):
-- thresholds and live offloading as `loip`, no lending.
local loip = require("loip.policy").load("online", "loip")
local M = setmetatable({ name = "thresholds", lending = false }, { __index = loip })
function M.on_step(state, control) return loip.on_step(state, control, M) end
return M
