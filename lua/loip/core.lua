-- The C runtime seen from Lua: FFI declarations (generated from loip.h), the library handle,
-- the ABI handshake, and the adapters that turn return codes into Lua errors.
local ffi = require "ffi"
local errors = require "loip.error"

local M = {}

local cdef = require "loip.cdef"
ffi.cdef(cdef)
local build = require "loip.build_config"
M.build = build
-- loip.h's enumerators as plain numbers (generated beside the cdef): message kinds, flags,
-- dtypes, the KV group, never retyped here.
M.constants = require "loip.constants"

-- Inside the loip command the runtime is linked in (and exported with -rdynamic); under a
-- plain luajit, load libloip from LOIP_LIB, the build tree, or the install prefix.
local function load_library()
  local ok = pcall(function() return ffi.C.loip_abi_version end)
  if ok then return ffi.C end
  local tried = {}
  local candidates = { os.getenv("LOIP_LIB") or "", build.library, build.install_library, "loip" }
  for _, path in ipairs(candidates) do
    if path ~= "" then
      local lok, lib = pcall(ffi.load, path)
      if lok then return lib end
      tried[#tried + 1] = path .. " (" .. tostring(lib) .. ")"
    end
  end
  error("cannot load the runtime library; tried " .. table.concat(tried, ", ")
        .. ". Build it with cmake, or set LOIP_LIB to libloip.so", 0)
end

local C = load_library()
M.C = C

-- Lua side of the ABI handshake: the declarations above and the library must agree.
local lua_abi = tonumber(C.LOIP_ABI_VERSION)
local lib_abi = C.loip_abi_version()
M.abi_version = lib_abi
if lib_abi ~= lua_abi then
  error(string.format("ABI mismatch: the Lua modules expect version %d but libloip is %d; "
    .. "rebuild, or point LOIP_LIB/LOIP_LUA_DIR at the same build", lua_abi, lib_abi), 0)
end

local env_kernels = os.getenv("LOIP_KERNELS")
if env_kernels and env_kernels ~= "" and C.loip_kernels_use(env_kernels) ~= 0 then
  error("LOIP_KERNELS: " .. ffi.string(C.loip_last_error()), 0)
end
local env_amx_rows = os.getenv("LOIP_AMX_ROWS")
if env_amx_rows and env_amx_rows ~= "" then
  local rows = tonumber(env_amx_rows)
  if not rows or rows < 1 or rows ~= math.floor(rows) then
    error("LOIP_AMX_ROWS: '" .. env_amx_rows .. "' is not a whole number of tokens >= 1", 0)
  end
  C.loip_kernels_amx_threshold(rows)
end
-- the quantized matvecs' prefetch distance, set for the process (no kernels policy chooses it
-- then: loip.model.kernels)
local env_prefetch = os.getenv("LOIP_KERNELS_PREFETCH")
if env_prefetch and env_prefetch ~= "" then
  local bytes = tonumber(env_prefetch)
  if not bytes or bytes < 0 or bytes ~= math.floor(bytes) or C.loip_kernels_set_prefetch(bytes) ~= 0 then
    error(string.format("LOIP_KERNELS_PREFETCH: '%s' is not a distance in bytes from 0 to %d", env_prefetch,
      tonumber(C.LOIP_KERNELS_PREFETCH_MAX)), 0)
  end
  M.kernels_prefetch_env = bytes
end

function M.last_error()
  return ffi.string(C.loip_last_error())
end

-- A failure's error: the last error's message (after context, when given), as an error value
-- of its kind where the code names one (LOIP_ENOMEM: out_of_memory; loip.error.from_code).
function M.failure(rc, context)
  local msg = M.last_error()
  if context then msg = context .. ": " .. msg end
  return errors.from_code(rc, msg)
end

-- Runtime failure: nil, the error, the code. Use as `local ok, err = core.ok(C.f(...))`.
function M.ok(rc, context)
  if rc == 0 then return true end
  return nil, M.failure(rc, context), rc
end

-- Raise on failure (for code paths that are errors rather than results).
function M.check(rc, context)
  if rc ~= 0 then error(M.failure(rc, context), 0) end
end

-- A wrapper's result raised as core.check raises (the message alone, no position; assert()
-- would prefix the caller's): `local h = core.must(exec.model_new(cfg))`. Returns its arguments.
function M.must(v, err, ...)
  if v == nil or v == false then error(err, 0) end
  return v, err, ...
end

M.dtype = M.constants.dtype
M.dtype_name = {}
for name, v in pairs(M.dtype) do M.dtype_name[v] = name end

-- Hold the CPUs' wake-up latency at us microseconds (Linux PM QoS, /dev/cpu_dma_latency) while
-- this process runs, or release it (us nil). Machine-wide: it covers every process here, e.g.
-- the workers of a local cluster. true, or nil and why (not root, no such file).
function M.wake_latency(us)
  if us ~= nil and (type(us) ~= "number" or us < 0 or us ~= math.floor(us) or us > 2 ^ 31 - 1) then
    error("wake_latency: " .. tostring(us) .. " is not a whole number of microseconds >= 0", 2)
  end
  return M.ok(C.loip_cpu_wake_latency(us or -1))
end

-- The wake-up latency this process holds (wake_latency), -1 when none.
function M.wake_latency_held() return tonumber(C.loip_cpu_wake_latency_held()) end

function M.now_ms()
  return tonumber(C.loip_now_ns()) / 1e6
end
-- The monotonic clock in nanoseconds (a number), and a sleep of ms milliseconds.
function M.now_ns() return tonumber(C.loip_now_ns()) end
function M.sleep_ms(ms) C.loip_sleep_ms(ms) end

-- An owning handle: h = core.new("loip_pool *", C.loip_pool_new, C.loip_pool_free, args...)
function M.new(ctype, ctor, dtor, ...)
  local out = ffi.new(ctype .. "[1]")
  local n = select("#", ...)
  local args = { ... }
  args[n + 1] = out -- by count, not #args: an argument may be nil (a NULL pointer)
  local rc = ctor(unpack(args, 1, n + 1))
  if rc ~= 0 then return nil, M.failure(rc), rc end
  return ffi.gc(out[0], dtor)
end

-- Explicit, idempotent close of a handle made by core.new.
function M.free(h, dtor)
  if h ~= nil then dtor(ffi.gc(h, nil)) end
end

return M
