-- Processes (runtime/process: spawn, reap, signals) seen from Lua: one thin function per C call of
-- loip.h, the rest of the Lua side calls these rather than C. A runtime failure returns nil, err
-- (context, when given, first, as core.ok). The clock and sleep are core.now_ns, core.sleep_ms.
--
--   local process = require "loip.runtime.process"
--   local pid = core.must(process.spawn({ exe, "worker" }, { "NAME=value" }, out_path, err_path))
--   process.signal_watch() ; while process.signal_received() == 0 do ... end
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}

-- Start args[1] (a path) with args, the environment plus env (a list of "NAME=value" strings
-- replacing inherited ones), stdout truncated into out_path and stderr appended to err_path
-- (nil: inherited). The child gets SIGTERM when the calling thread exits. Its pid, or nil, err.
function M.spawn(args, env, out_path, err_path, context)
  local argv = ffi.new("const char *[?]", #args + 1) -- (NULL-ended; the strings anchored by args)
  for k, a in ipairs(args) do argv[k - 1] = a end
  local envp = ffi.new("const char *[?]", #env + 1)
  for k, e in ipairs(env) do envp[k - 1] = e end
  local pid = ffi.new("int32_t[1]")
  local ok, err = core.ok(C.loip_spawn(argv, envp, out_path, err_path, pid), context)
  local _ = { args, env }
  if not ok then return nil, err end
  return pid[0]
end
-- Collect a child that exited: 1 when it did, 0 while it runs, -1 not a child.
function M.reap(pid) return tonumber(C.loip_reap(pid)) end

-- Catch SIGINT and SIGTERM from now on; signal_received: the signal's number once one came, 0
-- before (blocking receives and sleeps return early).
function M.signal_watch() C.loip_signal_watch() end
function M.signal_received() return tonumber(C.loip_signal_received()) end

-- This process's pid (its /proc/self/stat's first field).
function M.pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = tonumber(f:read("*l"):match("^(%d+)"))
  f:close()
  return pid
end

-- This process's peak resident memory (VmHWM, bytes), or nil where /proc does not say.
function M.peak_rss_bytes()
  local f = io.open("/proc/self/status")
  local status = f and f:read("*a") or ""
  if f then f:close() end
  local hwm = status:match("VmHWM:%s*(%d+) kB")
  return hwm and tonumber(hwm) * 1024 or nil
end

return M
