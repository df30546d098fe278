-- How recipes/deploy reaches a host: a shell command run there, over ssh (BatchMode, the
-- description's key and port; a host key not seen before is accepted and kept, in the
-- description's known_hosts file or ssh's own, and a changed one refused) or in a testbed
-- network namespace (ip netns exec); stdin may be fed from a file or a string.
local M = {}

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
M.q = q

-- The local command line that runs `cmd` (a shell command) on host h.
function M.wrap(h, cmd)
  if h.netns then return "ip netns exec " .. q(h.netns) .. " sh -c " .. q(cmd) end
  local opts = { "-o BatchMode=yes", "-o StrictHostKeyChecking=accept-new", "-o LogLevel=ERROR", "-o ConnectTimeout=10" }
  if h.known_hosts then opts[#opts + 1] = "-o UserKnownHostsFile=" .. q(h.known_hosts) end
  if h.port then opts[#opts + 1] = "-p " .. h.port end
  if h.key then opts[#opts + 1] = "-i " .. q(h.key) .. " -o IdentitiesOnly=yes" end
  return "ssh " .. table.concat(opts, " ") .. " " .. q(h.ssh) .. " " .. q(cmd)
end

-- Run cmd on h; opts.input: a string fed on stdin; opts.from: a file fed on stdin. Returns
-- ok, output (stdout and stderr together, trailing space removed).
function M.run(h, cmd, opts)
  opts = opts or {}
  local line = M.wrap(h, cmd)
  if opts.from then line = line .. " < " .. q(opts.from) end
  local input
  if opts.input then
    input = os.tmpname()
    local f = assert(io.open(input, "w"))
    f:write(opts.input)
    f:close()
    line = line .. " < " .. q(input)
  elseif not opts.from then
    line = line .. " < /dev/null"
  end
  local out, rc = M.capture(line)
  if input then os.remove(input) end
  return rc == 0, out
end

-- A local shell command's output (stdout and stderr, trailing space removed) and exit status
-- (popen's close does not give it under LuaJIT).
function M.capture(line)
  local p = io.popen("{ " .. line .. "\n} 2>&1; echo \"loip-rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("loip%-rc=(%d+)%s*$"))
  return (out:gsub("loip%-rc=%d+%s*$", ""):gsub("%s+$", "")), rc
end

-- As run, raising "deploy: host I (where): what failed: output" when it fails.
function M.must(h, cmd, what, opts)
  local ok, out = M.run(h, cmd, opts)
  if not ok then error(string.format("deploy: host %d (%s): %s: %s", h.i, M.name(h), what, out), 0) end
  return out
end

function M.name(h) return h.ssh and ("ssh " .. h.ssh .. (h.port and (" port " .. h.port) or "")) or ("netns " .. h.netns) end

return M
