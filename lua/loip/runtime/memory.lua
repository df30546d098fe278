-- Memory budgets: a device's limit in bytes and the named accounts ("weights", "slots", "kv",
-- "activations", ...) that every allocation is charged to, before it is made. A charge that
-- does not fit raises the runtime's message naming the account and the shortfall.
--
--   local b = loip.memory.budget("1.5G")          -- or bytes; 0: unlimited
--   local m = loip.model.open(dir, { budget = b }) -- or { mem = "1.5G" }: a budget of its own
--   print(loip.memory.report(m))                   -- account, bytes, peak, with totals
local ffi = require "ffi"
local core = require "loip.core"
local flags = require "loip.ui.flags"
local C = core.C

local M = {}

local Budget = {}
Budget.__index = Budget
M.Budget = Budget

-- "1.50 GiB", "512.0 MiB", "300 bytes" (as the runtime writes sizes in its messages). With
-- beside, another figure of the same message (a need beside its budget): when the two differ
-- but would print the same, both print with more digits, as many as they take to differ (a
-- call for each, each given the other: `needs 3.017 MiB … its budget is 3.000 MiB`).
local UNITS = { "bytes", "KiB", "MiB", "GiB", "TiB" }
local function scaled(n)
  local u = 1
  while n >= 1024 and u < #UNITS do n, u = n / 1024, u + 1 end
  return n, u
end
local function with_digits(n, digits)
  local v, u = scaled(n)
  if u == 1 then return string.format("%d bytes", v) end
  return string.format("%." .. digits .. "f %s", v, UNITS[u])
end
function M.format_bytes(n, beside)
  local _, u = scaled(n)
  local digits = u >= 4 and 2 or 1
  if beside and beside ~= n then
    while digits < 9 and with_digits(n, digits) == with_digits(beside, digits) do digits = digits + 1 end
  end
  return with_digits(n, digits)
end

-- A budget of limit bytes: a number, or a string such as "1.5G" or "600M"; 0: unlimited.
function M.budget(limit)
  if type(limit) == "string" then
    local n = flags.parse_bytes(limit)
    if not n then error("loip.memory.budget: '" .. limit .. "' is not a size (e.g. 1.5G, 600M, 4096)", 2) end
    limit = n
  end
  if type(limit) ~= "number" or limit < 0 or limit ~= math.floor(limit) then
    error("loip.memory.budget: limit must be a whole number of bytes >= 0 (0: unlimited)", 2)
  end
  local h, err = core.new("loip_budget *", C.loip_budget_new, C.loip_budget_free, limit)
  if not h then error(err, 0) end
  return setmetatable({ handle = h }, Budget)
end

function M.is_budget(x) return getmetatable(x) == Budget end

function Budget:limit() return tonumber(C.loip_budget_limit(self.handle)) end
function Budget:used() return tonumber(C.loip_budget_used(self.handle)) end
function Budget:peak() return tonumber(C.loip_budget_peak(self.handle)) end

-- Charge bytes to account (for memory the runtime does not allocate itself); nil, err when it
-- does not fit. Give it back with :release.
function Budget:charge(account, bytes) return M.charge(self.handle, account, bytes) end
function Budget:release(account, bytes) M.release(self.handle, account, bytes) end
-- The same on a loip_budget * (a handle C code was given).
function M.charge(handle, account, bytes, context) return core.ok(C.loip_budget_charge(handle, account, bytes), context) end
function M.release(handle, account, bytes) C.loip_budget_release(handle, account, bytes) end

-- ---- charges: bytes charged to account of budget (a loip_budget *) with no memory behind them
-- (weights used in place from a file mapping), until charge_free; nil, err when they do not fit.
function M.charge_new(budget, account, bytes)
  return core.new("loip_charge *", C.loip_charge_new, C.loip_charge_free, budget, account, bytes)
end
function M.charge_free(c) core.free(c, C.loip_charge_free) end
-- The process's C heap in use (malloc), in bytes.
function M.heap_in_use() return tonumber(C.loip_heap_in_use()) end

-- ---- buffers (runtime/core/memory.c): aligned memory owned by the runtime, charged to a budget
-- account (budget: a loip_budget *) or not; *_free is the explicit, idempotent close.
function M.buffer(bytes) return core.new("loip_buffer *", C.loip_buffer_new, C.loip_buffer_free, bytes) end
-- Charged to account before it is allocated.
function M.buffer_charged(budget, account, bytes)
  return core.new("loip_buffer *", C.loip_buffer_new_charged, C.loip_buffer_free, budget, account, bytes)
end
-- Address space only: ranges are charged and backed as they are taken (buffer_take_range).
function M.buffer_reserved(budget, account, bytes)
  return core.new("loip_buffer *", C.loip_buffer_new_reserved, C.loip_buffer_free, budget, account, bytes)
end
function M.buffer_data(buf) return C.loip_buffer_data(buf) end
function M.buffer_take_range(buf, offset, bytes, context) return core.ok(C.loip_buffer_take_range(buf, offset, bytes), context) end
function M.buffer_drop_range(buf, offset, bytes, context) return core.ok(C.loip_buffer_drop_range(buf, offset, bytes), context) end
function M.buffer_free(buf) core.free(buf, C.loip_buffer_free) end

local Report = {}
Report.__index = Report

function Report:__tostring()
  local lines = { string.format("%-16s %14s %14s", "account", "bytes", "peak") }
  for _, a in ipairs(self) do
    lines[#lines + 1] = string.format("%-16s %14s %14s", a.account, M.format_bytes(a.bytes), M.format_bytes(a.peak))
  end
  lines[#lines + 1] = string.format("%-16s %14s %14s", "total", M.format_bytes(self.used), M.format_bytes(self.peak))
  lines[#lines + 1] = self.limit > 0
    and string.format("%-16s %14s %14s", "budget", M.format_bytes(self.limit), M.format_bytes(self.free) .. " free")
    or string.format("%-16s %14s", "budget", "unlimited")
  return table.concat(lines, "\n")
end

-- The accounts as an array of { account, bytes, peak } (first charged first) with totals:
-- used, peak, limit (0: unlimited), free (limit - used; nil when unlimited). Prints as a table.
function Budget:report()
  local cap = tonumber(C.LOIP_BUDGET_MAX_ACCOUNTS)
  local acc = ffi.new("loip_budget_account[?]", cap)
  local n = math.min(C.loip_budget_report(self.handle, acc, cap), cap)
  local r = setmetatable({}, Report)
  for i = 0, n - 1 do
    r[#r + 1] = { account = ffi.string(acc[i].name), bytes = tonumber(acc[i].bytes), peak = tonumber(acc[i].peak) }
  end
  r.used, r.peak, r.limit = self:used(), self:peak(), self:limit()
  r.free = r.limit > 0 and r.limit - r.used or nil
  return r
end

Budget.__tostring = function(self) return tostring(self:report()) end

-- The report of a budget, or of a model opened with one.
function M.report(x)
  if M.is_budget(x) then return x:report() end
  if type(x) == "table" and M.is_budget(x.budget) then return x.budget:report() end
  error("loip.memory.report: expected a budget or a model opened with { mem = ... } or { budget = ... }", 2)
end

return M
