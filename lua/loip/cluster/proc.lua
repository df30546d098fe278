-- Processes of a local cluster: the head's own executable, whether a worker lives (and
-- collecting it when it exited: workers are the head's children), the end of its log.
local process = require "loip.runtime.process"

local M = {}

function M.sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
function M.exe()
  local p = io.popen("readlink -f /proc/" .. process.pid() .. "/exe")
  local path = p:read("*l")
  p:close()
  return path
end
-- A process that exists and is not a zombie (a killed worker may linger as one).
function M.alive(pid)
  if not pid then return false end
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return false end
  local st = f:read("*l") or ""
  f:close()
  local state = st:match("^%d+ %b() (%a)")
  if state == "Z" then process.reap(pid) end -- our child (a local worker) that exited
  return state ~= nil and state ~= "Z" and state ~= "X"
end
function M.tail(path, n)
  local f = io.open(path)
  if not f then return "" end
  local lines = {}
  for l in f:lines() do lines[#lines + 1] = l end
  f:close()
  return table.concat(lines, "\n", math.max(1, #lines - (n or 5) + 1))
end

return M
