-- A cluster description for recipes/deploy (up.lua, down.lua): a Lua file returning a table, read
-- and checked field by field; an error names the file and the field (hosts[2].listen). The
-- description's fields are documented in docs/deploy.md.
local flags = require "loip.ui.flags"
local serve_mod = require "loip.cmd.serve"

local M = {}

-- Flags of `loip serve` the description may not set under serve = {...}: up sets them itself.
local OWN = { model = true, hosts = true, devices = true, token = true, ["curve-keys"] = true }

local function fail(file, field, fmt, ...)
  error(string.format("%s: %s: " .. fmt, file, field, ...), 0)
end

local function exists(p)
  local f = io.open(p)
  if f then f:close() end
  return f ~= nil
end
local function is_dir(p) return os.execute("test -d '" .. tostring(p):gsub("'", "'\\''") .. "'") == 0 end

local function port(file, field, v, required)
  if v == nil and not required then return nil end
  if type(v) ~= "number" or v ~= math.floor(v) or v < 1 or v > 65535 then
    fail(file, field, "a TCP port 1..65535 is needed, got %s", tostring(v))
  end
  return v
end

local function bytes(file, field, v)
  if v == nil then return nil end
  local n = type(v) == "number" and v or (type(v) == "string" and flags.parse_bytes(v))
  if not n or n < 0 then fail(file, field, "a size in bytes (a number or e.g. \"600M\") is needed, got %s", tostring(v)) end
  return math.floor(n)
end

local function str(file, field, v, required)
  if v == nil and not required then return nil end
  if type(v) ~= "string" or v == "" then fail(file, field, "a string is needed, got %s", type(v)) end
  return v
end

local HOST_FIELDS = { ssh = 1, netns = 1, port = 1, key = 1, address = 1, listen = 1, mem = 1, disk_quota = 1, cache = 1,
  store = 1, prefix = 1, threads = 1, known_hosts = 1 }

local function host(file, i, h)
  local f = string.format("hosts[%d]", i)
  if type(h) ~= "table" then fail(file, f, "a table is needed, got %s", type(h)) end
  for k in pairs(h) do
    if not HOST_FIELDS[k] then fail(file, f .. "." .. tostring(k), "not a host field (ssh, netns, port, key, known_hosts, address, listen, mem, disk_quota, cache, store, prefix, threads)") end
  end
  if (h.ssh == nil) == (h.netns == nil) then fail(file, f, "say how to reach it: ssh = \"user@host\" or netns = \"name\" (one of them)") end
  local out = { i = i }
  if h.ssh then
    out.ssh = str(file, f .. ".ssh", h.ssh)
    if not out.ssh:match("^[%w._-]+@[%w._:-]+$") and not out.ssh:match("^[%w._:-]+$") then
      fail(file, f .. ".ssh", "\"user@host\" or \"host\" is needed, got %q", out.ssh)
    end
    out.port = port(file, f .. ".port", h.port)
    out.key = str(file, f .. ".key", h.key)
    if out.key then out.key = out.key:gsub("^~/", (os.getenv("HOME") or "") .. "/") end
    if out.key and not exists(out.key) then fail(file, f .. ".key", "no identity file %s", out.key) end
    out.known_hosts = str(file, f .. ".known_hosts", h.known_hosts)
    out.address = str(file, f .. ".address", h.address) or out.ssh:match("@(.+)$") or out.ssh
  else
    for _, k in ipairs({ "port", "key", "known_hosts" }) do
      if h[k] ~= nil then fail(file, f .. "." .. k, "an ssh setting on a netns host") end
    end
    out.netns = str(file, f .. ".netns", h.netns)
    out.address = str(file, f .. ".address", h.address, true)
  end
  out.listen = port(file, f .. ".listen", h.listen, true)
  out.mem = bytes(file, f .. ".mem", h.mem)
  out.disk_quota = bytes(file, f .. ".disk_quota", h.disk_quota)
  if (h.cache == nil) == (h.store == nil) then fail(file, f, "give the worker cache = DIR (blocks shipped to it) or store = DIR (a slice store there), one of them") end
  out.cache = str(file, f .. ".cache", h.cache)
  out.store = str(file, f .. ".store", h.store)
  if out.disk_quota and not out.cache then fail(file, f .. ".disk_quota", "only with cache = DIR") end
  out.prefix = str(file, f .. ".prefix", h.prefix, true)
  if not out.prefix:match("^/") then fail(file, f .. ".prefix", "an absolute path is needed, got %q", out.prefix) end
  if h.threads ~= nil and (type(h.threads) ~= "number" or h.threads < 0) then fail(file, f .. ".threads", "a count >= 0 is needed") end
  out.threads = h.threads or 0
  return out
end

-- serve = { port = 8080, max_batch = 4, ... }: `loip serve` flags (max_batch or ["max-batch"]),
-- as an argument list.
local function serve(file, s)
  if s == nil then s = {} end
  if type(s) ~= "table" then fail(file, "serve", "a table of `loip serve` flags is needed, got %s", type(s)) end
  local known = {}
  for _, row in ipairs(serve_mod.flags) do known[row[1]] = row end
  local args, keys = {}, {}
  for k in pairs(s) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local name, v = k:gsub("_", "-"), s[k]
    local row = known[name]
    if not row then fail(file, "serve." .. k, "not a flag of `loip serve` (loip serve --help)") end
    if OWN[name] then fail(file, "serve." .. k, "set by the description itself (model, hosts, token, curve_keys)") end
    if type(v) == "boolean" then
      if row[2] ~= "bool" then fail(file, "serve." .. k, "a value is needed, not a boolean") end
      if v then args[#args + 1] = "--" .. name end
    elseif type(v) == "number" or type(v) == "string" then
      if row[2] == "bool" then fail(file, "serve." .. k, "true or false is needed") end
      args[#args + 1] = "--" .. name
      args[#args + 1] = tostring(v)
    else
      fail(file, "serve." .. k, "a string, number or boolean is needed, got %s", type(v))
    end
  end
  return { args = args, port = s.port or 8080, host = s.host or "127.0.0.1" }
end

-- The description in file, checked: { file, name, model, token | curve_keys, hosts = {...},
-- serve = { args, port, host }, state_dir }.
function M.load(file)
  local chunk, err = loadfile(file)
  if not chunk then error(string.format("%s: %s", file, err), 0) end
  local ok, d = pcall(chunk)
  if not ok then error(string.format("%s: %s", file, tostring(d)), 0) end
  if type(d) ~= "table" then fail(file, "(the file)", "it must return a table, returned %s", type(d)) end
  local out = { file = file }
  for k in pairs(d) do
    if not ({ name = 1, model = 1, token = 1, token_file = 1, curve_keys = 1, hosts = 1, serve = 1, state_dir = 1 })[k] then
      fail(file, tostring(k), "not a field of a description (name, model, token, token_file, curve_keys, hosts, serve, state_dir)")
    end
  end
  out.name = str(file, "name", d.name, true)
  if not out.name:match("^[%w_.-]+$") then fail(file, "name", "letters, digits, '.', '_' and '-' only, got %q", out.name) end
  out.model = str(file, "model", d.model, true)
  if not exists(out.model .. "/manifest.json") then fail(file, "model", "%s is not a slice store (no manifest.json; loip slice makes one)", out.model) end
  local n = (d.token and 1 or 0) + (d.token_file and 1 or 0) + (d.curve_keys and 1 or 0)
  if n ~= 1 then fail(file, "token", "give one of token, token_file or curve_keys (%d given)", n) end
  out.token = str(file, "token", d.token)
  if d.token_file then
    local f = io.open(str(file, "token_file", d.token_file))
    if not f then fail(file, "token_file", "cannot read %s", d.token_file) end
    out.token = (f:read("*a") or ""):gsub("%s+$", "")
    f:close()
    if out.token == "" then fail(file, "token_file", "%s is empty", d.token_file) end
  end
  out.curve_keys = str(file, "curve_keys", d.curve_keys)
  if out.curve_keys and not is_dir(out.curve_keys) then fail(file, "curve_keys", "no directory %s", out.curve_keys) end
  if type(d.hosts) ~= "table" or #d.hosts == 0 then fail(file, "hosts", "a list of one or more hosts is needed") end
  out.hosts = {}
  local seen = {}
  for i, h in ipairs(d.hosts) do
    out.hosts[i] = host(file, i, h)
    local at = out.hosts[i].address .. ":" .. out.hosts[i].listen
    if seen[at] then fail(file, string.format("hosts[%d].listen", i), "%s is hosts[%d]'s too", at, seen[at]) end
    seen[at] = i
  end
  out.serve = serve(file, d.serve)
  out.state_dir = str(file, "state_dir", d.state_dir)
    or (os.getenv("HOME") or "/root") .. "/.local/state/loip/deploy/" .. out.name
  return out
end

return M
