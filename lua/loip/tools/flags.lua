-- Command-line flags: a command declares its flags once; parsing, validation and --help text
-- all come from that declaration.
--   spec = { usage = "loip generate [flags]", summary = "...",
--            flags = { { "max-tokens", "int", "tokens to generate", default = 256 }, ... },
--            positional = { "FILE" } (names, for the usage text) }
local M = {}

local function fail(cmd, msg) error({ usage_error = true, msg = cmd .. ": " .. msg }, 0) end

-- Parses "1.5G", "600M", "4096" into bytes.
function M.parse_bytes(s)
  local num, unit = tostring(s):match("^(%d+%.?%d*)%s*([KkMmGgTt]?)[iI]?[bB]?$")
  if not num then return nil end
  local mult = ({ [""] = 1, k = 1024, m = 1024 ^ 2, g = 1024 ^ 3, t = 1024 ^ 4 })[unit:lower()]
  return math.floor(tonumber(num) * mult)
end

local convert = {
  int = function(v) local n = tonumber(v) if n and n == math.floor(n) then return n end end,
  number = function(v) return tonumber(v) end,
  string = function(v) return v end,
  bytes = M.parse_bytes,
}

-- Returns options table (flag names with '-' turned into '_') and positional array.
function M.parse(spec, argv, first)
  local opts, pos = {}, {}
  local byname = {}
  for _, f in ipairs(spec.flags) do
    byname[f[1]] = f
    if f.default ~= nil then opts[f[1]:gsub("-", "_")] = f.default end
  end
  local i = first or 1
  if spec.passthrough then -- every argument belongs to what the command runs
    for j = i, #argv do pos[#pos + 1] = argv[j] end
    return opts, pos
  end
  while i <= #argv do
    local a = argv[i]
    if (a == "--help" or a == "-h") and spec.usage then -- recipes get --help for free
      io.stdout:write(M.help(spec))
      os.exit(0)
    elseif a == "--" then
      for j = i + 1, #argv do pos[#pos + 1] = argv[j] end
      break
    elseif a:sub(1, 2) == "--" then
      local name, value = a:match("^%-%-([^=]+)=(.*)$")
      name = name or a:sub(3)
      local f = byname[name]
      if not f then
        local names = {}
        for _, x in ipairs(spec.flags) do names[#names + 1] = x[1] end
        local near = require("loip.tools.suggest").closest(name, names)
        fail(spec.name, "unknown flag --" .. name .. (near and ("; did you mean --" .. near .. "?") or " (see --help)"))
      end
      local key = name:gsub("-", "_")
      if f[2] == "bool" then
        if value ~= nil then fail(spec.name, "--" .. name .. " takes no value") end
        opts[key] = true
      else
        if value == nil then
          i = i + 1
          value = argv[i]
          if value == nil then fail(spec.name, "--" .. name .. " needs a value") end
        end
        local v = convert[f[2]](value)
        if v == nil then fail(spec.name, string.format("--%s: '%s' is not a valid %s", name, value, f[2])) end
        if f.check then
          local ok, why = f.check(v)
          if not ok then fail(spec.name, string.format("--%s: %s", name, why)) end
        end
        opts[key] = v
      end
    elseif spec.stop_at_positional then
      for j = i, #argv do pos[#pos + 1] = argv[j] end
      break
    else
      pos[#pos + 1] = a
    end
    i = i + 1
  end
  for _, f in ipairs(spec.flags) do
    if f.required and opts[f[1]:gsub("-", "_")] == nil then fail(spec.name, "--" .. f[1] .. " is required") end
  end
  return opts, pos
end

function M.help(spec)
  local out = { "usage: " .. spec.usage, "", spec.summary, "" }
  if #spec.flags > 0 then out[#out + 1] = "flags:" end
  for _, f in ipairs(spec.flags) do
    local left = "  --" .. f[1] .. (f[2] ~= "bool" and (" " .. (f.metavar or f[2]:upper())) or "")
    local right = f[3]
    if f.default ~= nil and f.default ~= "" and f[2] ~= "bool" then right = right .. " (default " .. tostring(f.default) .. ")" end
    if f.required then right = right .. " (required)" end
    out[#out + 1] = string.format("%-30s %s", left, right)
  end
  if spec.epilog then out[#out + 1] = "" out[#out + 1] = spec.epilog end
  return table.concat(out, "\n") .. "\n"
end

return M
