-- `loip policy` and `loip help policies`: the shipped policies of each kind and their settings,
-- as loip.policy describes them (each file's opening comment and its M.settings). The flags that
-- choose a policy take NAME or NAME:KEY=VALUE,KEY=VALUE (docs/planning.md, "The policy API").
local policy = require "loip.policy"
local errors = require "loip.error"

local M = {
  brief = "the policies of each kind and their settings (list, show KIND NAME)",
  usage = "loip policy [list [KIND] | show KIND NAME]",
  positional = { "list|show", "KIND", "NAME" },
  summary = "The policies loip decides with (cost models, schedulers, online policies, link schedules, request\n"
    .. "patterns, baselines, device profiles): `list` names each kind's shipped ones with their settings\n"
    .. "(as `loip help policies`), `show KIND NAME` one in full (NAME may be a path).",
  flags = {},
}

local function usage(fmt, ...) errors.raise("usage", "policy: " .. string.format(fmt, ...)) end

-- The flag that chooses a policy of each kind, and what to call the kind.
M.flag = { cost = "--cost-model", scheduler = "--scheduler", online = "--online", links = "--link-schedule",
  pattern = "--pattern", baseline = "--baseline", device = "--device-profile" }

-- A setting's value as a name gives it.
local function show(v, ty)
  if v == nil then return "(none)" end
  if ty == "bool" then return v and "on" or "off" end
  if ty == "list" then
    local out = {}
    for i, x in ipairs(v) do out[i] = tostring(x) end
    return table.concat(out, "/")
  end
  return tostring(v)
end

-- The first sentence of a policy's opening comment, less a `kind "name": ` prefix.
local function summary(about)
  local text = table.concat(about, " "):gsub("^%a+ model \"[^\"]+\":%s*", ""):gsub("^%a+ \"[^\"]+\":%s*", "")
  -- the first sentence: up to a full stop outside parentheses ("(Sec. IV)" is not one)
  local first, depth = text, 0
  for i = 1, #text do
    local c = text:sub(i, i)
    depth = depth + (c == "(" and 1 or c == ")" and -1 or 0)
    if c == "." and depth <= 0 and text:sub(i + 1, i + 1):match("^%s?$") then first = text:sub(1, i) break end
  end
  if #first > 100 then first = first:sub(1, 97) .. "..." end
  return first
end

-- The lines of a policy's settings, each "KEY=DEFAULT  TYPE  help", indented.
local function settings_lines(d, indent)
  local out = {}
  for _, s in ipairs(d.settings) do
    out[#out + 1] = string.format("%s%-22s %-7s %s", indent, s.name .. "=" .. show(s.default, s.type), s.type, s.help)
  end
  return out
end

-- Every kind's shipped policies with their settings (`loip help policies`).
function M.list_text()
  local out = {
    "Policies: the decisions, as Lua files in recipes/policies/KIND/ (a file of one's own by its path works",
    "alike). A flag names one, with settings after a colon: --online loip:lookahead=64,lend=off.",
    "`loip policy show KIND NAME` says more; docs/planning.md, \"The policy API\", how to write one.", "" }
  for _, kind in ipairs(policy.kind_names()) do
    out[#out + 1] = string.format("%s (%s): %s", kind, M.flag[kind] or "Lua", policy.kinds[kind].about)
    for _, name in ipairs(policy.list(kind)) do
      local d = policy.describe(kind, name)
      out[#out + 1] = string.format("  %-22s %s", name, summary(d.about))
      for _, l in ipairs(settings_lines(d, "      ")) do out[#out + 1] = l end
    end
    out[#out + 1] = ""
  end
  return table.concat(out, "\n")
end

-- One policy in full (`loip policy show KIND NAME`).
function M.show_text(kind, name)
  if not policy.kinds[kind] then usage("no kind '%s' (%s)", tostring(kind), table.concat(policy.kind_names(), ", ")) end
  local d = policy.describe(kind, name)
  local out = { string.format("%s %s (%s)", kind, d.name, d.path or "a table"), "" }
  for _, l in ipairs(d.about) do out[#out + 1] = "  " .. l end
  out[#out + 1] = ""
  out[#out + 1] = "what it provides: " .. policy.kinds[kind].about
  if #d.settings == 0 then
    out[#out + 1] = "settings: none"
  else
    out[#out + 1] = "settings (KEY=DEFAULT, type, what):"
    for _, l in ipairs(settings_lines(d, "  ")) do out[#out + 1] = l end
    local s = d.settings[1]
    out[#out + 1] = string.format("e.g. %s %s:%s=%s", M.flag[kind] or "", name, s.name, show(s.default, s.type))
  end
  return table.concat(out, "\n") .. "\n"
end

function M.run(_, pos)
  local what = pos[1] or "list"
  if what == "list" then
    if pos[2] then
      if not policy.kinds[pos[2]] then usage("no kind '%s' (%s)", pos[2], table.concat(policy.kind_names(), ", ")) end
      for _, name in ipairs(policy.list(pos[2])) do io.stdout:write(M.show_text(pos[2], name), "\n") end
    else
      io.stdout:write(M.list_text())
    end
    return 0
  elseif what == "show" then
    if not pos[2] or not pos[3] or pos[4] then usage("show KIND NAME (see --help)") end
    io.stdout:write(M.show_text(pos[2], pos[3]))
    return 0
  end
  usage("'%s' is not list or show (see --help)", what)
end

return M
