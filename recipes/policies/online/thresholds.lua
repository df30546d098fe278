-- The paper's online planner without its KV transfer protocol (the ablation of Table III):
-- thresholds and live offloading as `loip`, no lending (the same as --online loip:lend=off). Its
-- settings are loip's, less `lend`.
local loip = require("loip.policy").load("online", "loip").module
local M = { name = "thresholds", settings = {} }
for _, s in ipairs(loip.settings) do
  if s[1] ~= "lend" then M.settings[#M.settings + 1] = s end
end

function M.on_step(state, control, o)
  local with = { lend = false }
  for k, v in pairs(o) do with[k] = v end
  return loip.on_step(state, control, with)
end

return M
