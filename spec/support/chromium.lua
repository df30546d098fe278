-- Headless Chromium driven over the DevTools protocol through --remote-debugging-pipe (the
-- browser reads commands from its fd 3 and writes answers to its fd 4, each a JSON text ended
-- by a NUL byte), here two FIFOs in a directory of the caller's. The browser's profile lives in
-- that directory too; close() ends the browser (it is also started under `timeout`, so nothing
-- outlives a spec that failed before closing it).
--
--   local chromium = require "spec.support.chromium"
--   local b = chromium.open(dir)              -- nil, why when there is no chromium
--   b:navigate("http://127.0.0.1:8080/")
--   local html = b:eval("document.documentElement.outerHTML")
--   b:close()
local json = require "loip.text.json"
local C = require("loip.core").C

local M = {}
local B = {}
B.__index = B

function M.exe()
  for _, name in ipairs({ "chromium", "chromium-browser" }) do
    if os.execute("command -v " .. name .. " > /dev/null 2>&1") == 0 then return name end
  end
end

-- dir: a fresh directory (profile, FIFOs, log); opts.width, opts.height (the window),
-- opts.limit_s (the browser is killed after this; 300).
function M.open(dir, opts)
  opts = opts or {}
  local exe = M.exe()
  if not exe then return nil, "no chromium (Debian's package chromium: recipes/setup-debian.sh installs it)" end
  assert(os.execute(string.format("mkfifo '%s/in' '%s/out'", dir, dir)) == 0)
  -- (HOME and XDG's folders there too: its crash reports' database goes to ~/.config otherwise)
  local p = io.popen(string.format("HOME='%s' XDG_CONFIG_HOME='%s/config' XDG_CACHE_HOME='%s/cache' timeout %d %s --headless --no-sandbox --disable-gpu --no-first-run "
    .. "--no-default-browser-check --disable-extensions --disable-background-networking --window-size=%d,%d "
    .. "--user-data-dir='%s/profile' --remote-debugging-pipe about:blank 3<'%s/in' 4>'%s/out' 2>'%s/log' & echo $!",
    dir, dir, dir, opts.limit_s or 300, exe, opts.width or 1280, opts.height or 900, dir, dir, dir, dir))
  local pid = tonumber(p:read("*l"))
  p:close()
  local b = setmetatable({ pid = pid, dir = dir, id = 0 }, B)
  -- (the shell opens fd 3 first: our writer unblocks it, then our reader its fd 4)
  b.w = assert(io.open(dir .. "/in", "w"))
  b.r = assert(io.open(dir .. "/out", "r"))
  b.w:setvbuf("no")
  return b
end

-- One message from the browser, or nil when it closed the pipe.
function B:read()
  local parts = {}
  while true do
    local ch = self.r:read(1)
    if not ch then return nil end
    if ch == "\0" then break end
    parts[#parts + 1] = ch
  end
  return json.decode(table.concat(parts))
end

-- Send method(params) (to the page's session unless browser is true); its result, or raises
-- with the protocol's error.
function B:call(method, params, browser)
  self.id = self.id + 1
  local msg = { id = self.id, method = method, params = params or {} } -- ({} encodes as an object)
  if not browser and self.session then msg.sessionId = self.session end
  self.w:write(json.encode(msg), "\0")
  while true do
    local m = self:read()
    if not m then error("chromium closed its pipe: " .. (io.open(self.dir .. "/log"):read("*a") or ""), 2) end
    if m.id == self.id then
      if m.error then error(method .. ": " .. json.encode(m.error), 2) end
      return m.result
    end
  end
end

-- A page of its own, at url.
function B:navigate(url)
  if not self.session then
    local t = self:call("Target.createTarget", { url = "about:blank" }, true)
    self.session = self:call("Target.attachToTarget", { targetId = t.targetId, flatten = true }, true).sessionId
  end
  self:call("Page.navigate", { url = url })
end

-- The value of a JavaScript expression in the page (returned by value).
function B:eval(expr)
  local r = self:call("Runtime.evaluate", { expression = expr, returnByValue = true })
  if r.exceptionDetails then error("in the page: " .. json.encode(r.exceptionDetails), 2) end
  return r.result.value
end

-- Wait (polling every 100 ms, up to limit_ms) until expr is true in the page; its last value.
function B:wait_for(expr, limit_ms)
  local v
  for _ = 1, (limit_ms or 30000) / 100 do
    v = self:eval(expr)
    if v then return v end
    C.loip_sleep_ms(100)
  end
  return v
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function unbase64(s)
  local val = {}
  for i = 1, 64 do val[B64:byte(i)] = i - 1 end
  local out, bits, n = {}, 0, 0
  for i = 1, #s do
    local v = val[s:byte(i)]
    if v then
      bits, n = bits * 64 + v, n + 6
      if n >= 8 then
        n = n - 8
        local byte = math.floor(bits / 2 ^ n)
        out[#out + 1] = string.char(byte)
        bits = bits - byte * 2 ^ n
      end
    end
  end
  return table.concat(out)
end

-- A PNG of the page (bytes).
function B:screenshot()
  return unbase64(self:call("Page.captureScreenshot", { format = "png" }).data)
end

function B:close()
  if self.w then
    pcall(self.call, self, "Browser.close", nil, true)
    self.w:close() self.w = nil
    self.r:close() self.r = nil
  end
  -- the browser ends on Browser.close; else `timeout` passes TERM on to it
  local alive = require("loip.cluster.proc").alive
  local function gone(ms)
    for _ = 1, ms / 20 do
      if not alive(self.pid) then return true end
      C.loip_sleep_ms(20)
    end
    return not alive(self.pid)
  end
  if not gone(5000) then
    os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
    if not gone(5000) then os.execute("kill -KILL " .. self.pid .. " 2>/dev/null") end
  end
end

return M
