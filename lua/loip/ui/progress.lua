-- Progress bars on stderr for long work (synthesis, slicing, loading): a redrawn bar on a
-- terminal, a line every few seconds otherwise (logs, CI).
local ffi = require "ffi"
local core = require "loip.core"
pcall(ffi.cdef, "int isatty(int fd);")

local M = {}

local Bar = {}
Bar.__index = Bar

local function now() return core.now_ns() / 1e9 end

local function human(n)
  if n >= 1e9 then return string.format("%.2f GB", n / 1e9) end
  if n >= 1e6 then return string.format("%.1f MB", n / 1e6) end
  if n >= 1e3 then return string.format("%.1f kB", n / 1e3) end
  return string.format("%d B", n)
end
M.human = human

-- total: units of work (bytes when opts.bytes); label: what is being done.
function M.new(total, label, opts)
  opts = opts or {}
  local tty = ffi.C.isatty(2) == 1
  local quiet = opts.quiet or os.getenv("LOIP_QUIET") == "1"
  return setmetatable({ total = math.max(total, 1), label = label, bytes = opts.bytes ~= false,
    tty = tty, quiet = quiet, t0 = now(), last = tty and 0 or now(), done = 0 }, Bar)
end

function Bar:line()
  local el = now() - self.t0
  local frac = math.min(self.done / self.total, 1)
  local rate = el > 0 and self.done / el or 0
  local eta = rate > 0 and (self.total - self.done) / rate or 0
  local width = 30
  local fill = math.floor(frac * width + 0.5)
  local what = self.bytes and string.format("%s / %s, %s/s", human(self.done), human(self.total), human(rate))
    or string.format("%d / %d", self.done, self.total)
  return string.format("%s [%s%s] %3d%% %s, %ds left", self.label, string.rep("#", fill),
    string.rep(".", width - fill), math.floor(frac * 100), what, math.floor(eta + 0.5))
end

function Bar:update(done)
  self.done = done
  if self.quiet then return end
  local t = now()
  if self.tty then
    if t - self.last >= 0.1 then
      io.stderr:write("\r", self:line(), "\027[K")
      self.last = t
    end
  elseif t - self.last >= 5 then
    io.stderr:write(self:line(), "\n")
    self.last = t
  end
end

function Bar:finish(msg)
  self.done = self.total
  if self.quiet then return end
  local el = now() - self.t0
  local text = string.format("%s: %s in %.1f s%s", self.label, self.bytes and human(self.total) or tostring(self.total),
    el, msg and (" — " .. msg) or "")
  io.stderr:write(self.tty and ("\r" .. text .. "\027[K\n") or (text .. "\n"))
end

return M
