-- The policy loader (docs/planning.md, "The policy API"): cost models, schedulers, online
-- policies, link schedules, request patterns, baselines, device profiles, expert caches, the
-- kernels' settings and tool parsers are Lua files a researcher copies and swaps. A name
-- resolves to recipes/policies/<kind>/<name>.lua; anything with a slash or ending in .lua is a
-- path, loaded as given. Shipped and user policies go through the same loader and the same
-- checks. A name may carry settings (M.parse):
--
--   local policy = require "loip.policy"
--   local cost = policy.load("cost", "loip")                      -- recipes/policies/cost/loip.lua
--   local sched = policy.load("scheduler", "my/greedy.lua")       -- a file of one's own
--   local on = policy.load("online", "loip:lookahead=64,lend=off") -- as --online takes it
--   local on2 = policy.load("online", "loip", { lookahead = 64 }) -- the same
--   local p, est = policy.plan(problem, { scheduler = "loip:refine=off", cost = "loip" })
--   policy.list("scheduler")                                      -- the shipped names
--   policy.describe("online", "loip")                             -- what it decides, its settings
--
-- A policy file returns a table of functions over plain tables (no FFI, no globals). It is run
-- in an environment of its own: the standard library and `require`, less what M.withheld names
-- (the FFI, and what reaches around the environment); assigning a global is refused. This keeps
-- a policy to the convention against mistakes; it is not a security boundary (a policy runs in
-- the process, and the loip modules it requires are the process's own).
--
-- Settings (Torch7 optim's config beside its state): a policy declares what can be set in
-- M.settings, in the shape a command declares its flags (loip.ui.flags):
--
--   M.settings = {
--     { "lookahead", "int", "KV positions of headroom a change buys", default = 32,
--       check = function(v) return v >= 1, "must be >= 1" end },
--   }
--
-- types: int, number, bool (on/off, true/false, yes/no, 1/0), string, list (strings; "a/b/c" in
-- a name). load() resolves them (each default, overridden by what is given) and returns an
-- instance of the policy: a table over the file's (its functions and fields read through), whose
-- entry function (M.kinds[kind].needs) gets the resolved settings as its last argument, e.g.
-- on_step(state, control, params); a pattern's requests(opts) gets them in opts (a setting given
-- by name wins over the caller's opts, which win over the default). instance.params holds them,
-- instance.given what was given, instance.module the file's table. A policy reads its settings
-- from params, never from constants of its own table, and keeps what it learns between calls in
-- the state/memo its caller hands it.
-- Requires inside functions: the command line loads this module before a command runs (`loip
-- help`), and loads no FFI then.
local M = {}

-- What a policy's environment does not give it, and why (docs/planning.md, "The policy API").
M.withheld = {
  debug = "it reaches any function's locals and the registry",
  package = "package.loaded holds every module, the FFI among them",
  getfenv = "it returns the process's globals", setfenv = "it changes another function's globals",
  load = "code it loads runs in the process's globals", loadstring = "code it loads runs in the process's globals",
  loadfile = "code it loads runs in the process's globals", dofile = "code it runs has the process's globals",
  module = "it makes globals",
}
-- Modules a policy may not require: the FFI, and loip.core (its C namespace).
M.withheld_modules = { ffi = true, ["loip.core"] = true }

-- The environment a policy file runs in (see M.withheld). Its errors name the file and line.
local function policy_env()
  local env
  local function req(name)
    if M.withheld_modules[name] then
      error(string.format("requires '%s': a policy is given no FFI (it decides from the plain tables it is passed; "
        .. "the runtime's wrappers make the C calls)", tostring(name)), 2)
    end
    return require(name)
  end
  -- the globals it sees: a copy of the process's at load (a lookup stays a table's, as fast
  -- as _G's: schedulers run interpreted), less the withheld names, which raise when read
  local seen = {}
  for k, v in pairs(_G) do if not M.withheld[k] then seen[k] = v end end
  seen.require = req
  setmetatable(seen, { __index = function(_, k)
    if M.withheld[k] then error(string.format("uses '%s', which a policy is not given (%s)", k, M.withheld[k]), 2) end
    return _G[k]
  end })
  env = setmetatable({}, {
    __index = seen,
    __newindex = function(_, k)
      error(string.format("assigns the global '%s' (a policy keeps its state in locals or its table)", tostring(k)), 2)
    end })
  rawset(env, "_G", env)
  return env
end

-- What each kind must provide: its entry function (needs), the arguments it takes before the
-- settings (args; merge: the settings go into its one opts table instead). Every kind lives in
-- recipes/policies/<kind>/. New kinds (a later issue's) are added here.
M.kinds = {
  cost = { needs = { "estimate" }, args = 2,
    about = "a cost model: estimate(plan, problem, params) -> { ms_per_token, devices = {...} }" },
  scheduler = { needs = { "schedule" }, args = 2,
    about = "a scheduler: schedule(problem, cost, params) -> plan, or nil and why" },
  online = { needs = { "on_step" }, args = 2,
    about = "an online policy: on_step(state, control, params) between decoding steps" },
  links = { needs = { "at" }, args = 1,
    about = "a link schedule: at(step, params) -> nil, a rate for every link, or one per link (emulated links change between steps)" },
  baseline = { needs = { "run" }, args = 2,
    about = "a system compared against but not built (loip.sim.tp): run(problem, { batch, context }, params) -> { ms_per_token, ... } or nil, \"OOM: ...\"" },
  device = { needs = { "profile" }, args = 1,
    about = "a device one does not own: its published figures (loip.sim.roofline.device); profile(shape, params) -> a loip profile" },
  draft = { needs = { "propose" }, args = 2,
    about = "a speculative decoding draft: propose(request, ctx, params) -> draft token ids (request: ids, n, k wanted, id, seq, memo); optional open, length, on_step, finish, close, propose_tree (the setting tree=on: { ids, parents }, a tree of drafts, loip.engine.request.tree)" },
  experts = { needs = { "configure" }, args = 1,
    about = "an expert cache policy (mixture of experts): configure(ctx, params) -> { replacement = \"lru\" | \"lfu\" | \"static\" | \"all\", prefetch = layers predicted ahead, min_accuracy, probe_every, pins = { { layer, expert } } } (ctx: slots, layers, experts, used, routing)" },
  kernels = { needs = { "configure" }, args = 1,
    about = "the kernels' settings a device runs with, chosen when it opens (loip.model.kernels): configure(ctx, params) -> { prefetch = bytes ahead in the quantized matvecs' weight streams, or nil: the kernels' default } (ctx: profile (the device profile's kernels section, or nil), variant (the kernels in force))" },
  tools = { needs = { "serves", "parse", "stream", "grammar" }, args = 1,
    about = "a tool-call parser (a model family's syntax): serves(template text) -> whether it is the family's; parse(text) -> content, tool_calls[, reasoning]; stream(opts) -> { put(piece) -> text, deltas, parts[, reasoning]; finish() -> the same; calls }; grammar(req) -> GBNF text of its calls; channels = true: its stream reads every chat reply, tools or not (loip.serve.tool_calls; docs/serving.md \"Tools\")" },
  pattern = { needs = { "requests" }, merge = true,
    about = "a request pattern: requests(opts) -> arrivals { at_ms | after, prompt_tokens, max_tokens } (loip.serve.load plays them); its settings arrive in opts" },
}

-- Folders the kinds had before they all moved under recipes/policies/ (issue 25): a path into one
-- still loads, with a notice, for one release.
M.moved = { ["recipes/patterns/"] = "pattern", ["recipes/links/"] = "links", ["recipes/baselines/"] = "baseline",
  ["recipes/devices/"] = "device" }

local function kind_of(kind, level)
  local k = M.kinds[kind]
  if not k then error(string.format("loip.policy: unknown kind '%s' (%s)", tostring(kind), table.concat(M.kind_names(), ", ")), level + 1) end
  return k
end

-- The recipes/ directory: $LOIP_RECIPES_DIR, else beside the Lua modules' tree (lua/ and
-- recipes/ sit side by side in a checkout and under the install prefix's share/loip).
function M.recipes_dir()
  local env = os.getenv("LOIP_RECIPES_DIR")
  if env and env ~= "" then return env end
  local lua_dir = rawget(_G, "LOIP_LUA_DIR") or (require("loip.core").build.source_dir .. "/lua")
  return (lua_dir:gsub("/+$", ""):match("^(.*)/[^/]+$") or ".") .. "/recipes"
end

-- The folder of a kind's shipped policies.
function M.dir(kind)
  kind_of(kind, 2)
  return M.recipes_dir() .. "/policies/" .. kind
end

-- The file a name or path stands for (settings after the name are not part of it: M.parse).
function M.path(kind, name)
  kind_of(kind, 2)
  if type(name) ~= "string" or name == "" then error("loip.policy: a " .. kind .. " name or path is needed", 2) end
  if name:find("/", 1, true) or name:match("%.lua$") then return name end
  return string.format("%s/%s.lua", M.dir(kind), name)
end

function M.kind_names()
  local out = {}
  for k in pairs(M.kinds) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- The shipped policies of a kind, by name; with no kind, every kind's: { [kind] = names }.
function M.list(kind)
  if kind == nil then
    local all = {}
    for _, k in ipairs(M.kind_names()) do all[k] = M.list(k) end
    return all
  end
  local out = {}
  local p = io.popen("ls '" .. M.dir(kind) .. "' 2>/dev/null")
  for f in p:lines() do
    local n = f:match("^(.+)%.lua$")
    if n then out[#out + 1] = n end
  end
  p:close()
  table.sort(out)
  return out
end

-- ---- settings --------------------------------------------------------------------------------

-- A policy named with settings, as a command line gives it: "NAME:KEY=VALUE,KEY=VALUE" (NAME a
-- shipped name or a path; e.g. "loip:lookahead=64,lend=off", "my/greedy.lua:spread=2"). Returns
-- the name and { key = "value" } (nil when none are given). The one place this is parsed: every
-- flag that names a policy (--scheduler, --cost-model, --online, --link-schedule, --pattern,
-- --baseline, --device-profile) passes its string to M.load, which calls this.
function M.parse(spec)
  if type(spec) ~= "string" then return spec, nil end
  -- the first ':' that a KEY= follows (a path may hold ':' elsewhere)
  local name, rest = spec:match("^(.-):([%a_][%w_]*=.*)$")
  if not name or name == "" then return spec, nil end
  local given = {}
  for item in (rest .. ","):gmatch("([^,]*),") do
    local k, v = item:match("^([%a_][%w_]*)=(.*)$")
    if not k then error(string.format("%s: '%s' is not KEY=VALUE (settings are NAME:KEY=VALUE,KEY=VALUE)", spec, item), 0) end
    if given[k] ~= nil then error(string.format("%s: the setting '%s' is given twice", spec, k), 0) end
    given[k] = v
  end
  return name, given
end

local truth = { on = true, ["true"] = true, yes = true, ["1"] = true, off = false, ["false"] = false, no = false, ["0"] = false }
-- Each type: what it is called in messages, and its value from a string (nil: not one) or from a
-- Lua value (nil: not one).
M.types = {
  int = { "a whole number", function(v)
    local n = tonumber(v)
    if n and n == math.floor(n) and n > -math.huge and n < math.huge then return n end
  end },
  number = { "a number", function(v) local n = tonumber(v) if n and n == n then return n end end },
  bool = { "on or off (true/false, yes/no, 1/0)", function(v)
    if type(v) == "boolean" then return v end
    return truth[tostring(v):lower()]
  end },
  string = { "a string", function(v) if type(v) == "string" then return v end end },
  list = { "a list of strings (a/b/c)", function(v)
    if type(v) == "string" then
      local out = {}
      for x in v:gmatch("[^/]+") do out[#out + 1] = x end
      return out
    end
    if type(v) ~= "table" then return nil end
    for _, x in ipairs(v) do if type(x) ~= "string" and type(x) ~= "number" then return nil end end
    return v
  end },
}

-- A value of the setting s (a declaration) as given (a string from a name, or a Lua value), or
-- raises naming the setting, the policy (who) and the type expected.
local function convert(who, s, v)
  local t = M.types[s[2]]
  local x = t[2](v)
  if x == nil then
    error(string.format("%s: setting '%s' must be %s (%s), not %s", who, s[1], t[1], s[2],
      type(v) == "string" and ("'" .. v .. "'") or tostring(v)), 0)
  end
  if s.check then
    local ok, why = s.check(x)
    if not ok then error(string.format("%s: setting '%s' = %s: %s", who, s[1], tostring(v), why or "refused"), 0) end
  end
  return x
end

-- The declarations of a policy table (its M.settings), checked: raises naming the file when one
-- is not { NAME, TYPE, HELP, default = ... } with a known type.
function M.settings_of(mod, who)
  local decl = mod.settings or {}
  if type(decl) ~= "table" then error(string.format("%s: M.settings is a %s, not a list of settings", who, type(decl)), 0) end
  for i, s in ipairs(decl) do
    if type(s) ~= "table" or type(s[1]) ~= "string" or not M.types[s[2]] or type(s[3]) ~= "string" then
      local types = {}
      for t in pairs(M.types) do types[#types + 1] = t end
      table.sort(types)
      error(string.format("%s: settings[%d] is not { NAME, TYPE, HELP, default = ... } with TYPE one of %s", who, i,
        table.concat(types, ", ")), 0)
    end
  end
  return decl
end

-- The settings a policy table runs with: each default, overridden by given ({ name = value }).
-- Raises naming an unknown setting, the policy (who) and the ones it has, or a bad value.
function M.resolve(mod, given, who)
  local decl = M.settings_of(mod, who)
  local by, names, params = {}, {}, {}
  for _, s in ipairs(decl) do
    by[s[1]], names[#names + 1] = s, s[1]
    if s.default ~= nil then params[s[1]] = s.default end
  end
  local keys = {}
  for k in pairs(given or {}) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if not by[k] then
      local hint = #names > 0 and require("loip.ui.suggest").hint(k, names) or ""
      error(string.format("%s: no setting '%s'%s (%s)", who, k, hint,
        #names > 0 and ("its settings: " .. table.concat(names, ", ")) or "it has no settings"), 0)
    end
    params[k] = convert(who, by[k], given[k])
  end
  return params
end

-- The instance of policy table mod with settings given: its entry functions get the resolved
-- settings (M.kinds[kind]: args, merge); everything else reads through to mod.
local instances = setmetatable({}, { __mode = "k" })
local function instance(kind, mod, given)
  local k = M.kinds[kind]
  local who = M.label(kind, mod)
  local params = M.resolve(mod, given, who)
  local inst = setmetatable({ name = mod.name, path = mod.path, module = mod, params = params, given = given },
    { __index = mod })
  for _, fn in ipairs(k.needs) do
    local f = mod[fn]
    if k.merge then
      inst[fn] = function(opts, ...)
        local o = {}
        for n, v in pairs(params) do o[n] = v end
        for n, v in pairs(opts or {}) do o[n] = v end
        for n in pairs(given) do o[n] = params[n] end
        return f(o, ...)
      end
    elseif k.args == 1 then
      inst[fn] = function(a) return f(a, params) end
    else
      inst[fn] = function(a, b) return f(a, b, params) end
    end
  end
  instances[inst] = true
  return inst
end

-- ---- loading ---------------------------------------------------------------------------------

-- Shipped policies are loaded once; a file of one's own is read again each time (it is being
-- edited).
local cache = {}

-- The policy table of a file (name: a shipped name or a path). Raises naming the file and what
-- is wrong.
local function load_file(kind, name)
  local path = M.path(kind, name)
  if cache[path] then return cache[path] end
  local asked = path -- (a moved path is cached under the path asked for too: one notice)
  local f = io.open(path, "rb")
  if not f then
    for old, to in pairs(M.moved) do
      local at = path:find(old, 1, true)
      if at and to == kind then
        local new = path:sub(1, at - 1) .. "recipes/policies/" .. to .. "/" .. path:sub(at + #old)
        f = io.open(new, "rb")
        if f then
          io.stderr:write(string.format("loip: %s moved to recipes/policies/%s/ (%s); the old path works until the next release\n",
            old, to, new))
          path = new
          break
        end
      end
    end
  end
  if not f then
    local known = M.list(kind)
    error(string.format("%s '%s': no such policy (%s not found; shipped: %s)%s", kind, name, path,
      #known > 0 and table.concat(known, ", ") or "none",
      name:find(":", 1, true) and "; settings are given as NAME:KEY=VALUE,KEY=VALUE" or ""), 0)
  end
  local src = f:read("*a")
  f:close()
  local chunk, err = loadstring(src, "@" .. path)
  if not chunk then error(string.format("%s '%s': %s", kind, name, err), 0) end
  -- its own globals: a policy cannot leak state into the process, nor see another's
  setfenv(chunk, policy_env())
  local ok, mod = pcall(chunk)
  if not ok then error(string.format("%s '%s': %s", kind, name, tostring(mod)), 0) end
  if type(mod) ~= "table" then error(string.format("%s: a %s policy returns a table of functions", path, kind), 0) end
  for _, fn in ipairs(M.kinds[kind].needs) do
    if type(mod[fn]) ~= "function" then
      error(string.format("%s: a %s policy needs a function %s (%s)", path, kind, fn, M.kinds[kind].about), 0)
    end
  end
  mod.name = mod.name or name
  mod.path = path
  M.settings_of(mod, path)
  if path ~= name then cache[path], cache[asked] = mod, mod end
  return mod
end

-- Load a policy of kind by name or path, with settings: in the name (M.parse) and/or params
-- ({ name = value }: strings as a name gives them, or Lua values; these win). A table is taken
-- as the policy (after the same checks); one with no settings declared and none given is
-- returned as it is, and an instance loaded again with more settings keeps those it had.
-- Returns the instance (see the top of this file). Raises naming the file, the setting and what
-- is wrong.
function M.load(kind, name, params)
  local k = kind_of(kind, 2)
  local given
  name, given = M.parse(name)
  if params ~= nil then
    if type(params) ~= "table" then error("loip.policy.load: params must be a table of settings", 2) end
    given = given or {}
    for n, v in pairs(params) do given[n] = v end
  end
  local mod
  if type(name) == "table" then
    if instances[name] then
      if not given then return name end
      local all = {}
      for n, v in pairs(name.given) do all[n] = v end
      for n, v in pairs(given) do all[n] = v end
      return instance(kind, name.module, all)
    end
    for _, f in ipairs(k.needs) do
      if type(name[f]) ~= "function" then error(string.format("%s policy: it has no %s function (%s)", kind, f, k.about), 2) end
    end
    if not given and name.settings == nil then return name end
    mod = name
  else
    mod = load_file(kind, name)
  end
  return instance(kind, mod, given or {})
end

-- What a policy is, for help: { kind, name, path, about (its file's opening comment, a line
-- each), settings = { { name, type, default, help } } }. name: a shipped name or a path.
function M.describe(kind, name)
  local p = M.load(kind, name)
  local about = {}
  local f = p.path and io.open(p.path, "rb")
  if f then
    for line in f:lines() do
      local c = line:match("^%-%-%s?(.*)$")
      if not c then break end
      about[#about + 1] = c
    end
    f:close()
  end
  local settings = {}
  for _, s in ipairs(M.settings_of(p.module, p.path or kind)) do
    settings[#settings + 1] = { name = s[1], type = s[2], default = s.default, help = s[3] }
  end
  return { kind = kind, name = p.name, path = p.path, about = about, settings = settings }
end

-- "scheduler greedy (my/greedy.lua)": a loaded policy of a kind as messages name it, its file
-- too when it is not the shipped one of its name. noun: what to call the kind (default: kind).
function M.label(kind, mod, noun)
  local name = tostring(mod.name or "?")
  noun = noun or kind
  local ok, shipped = pcall(M.path, kind, name)
  if mod.path and not (ok and shipped == mod.path) then return string.format("%s %s (%s)", noun, name, mod.path) end
  return noun .. " " .. name
end

-- What a scheduler's plan p breaks of what the problem fixes, as a message (nil: nothing): a
-- well-formed plan (no unknown keys) of the model's blocks, on the problem's devices, with its
-- stage count (problem.stages, --stages), within every budget. who: the scheduler, as
-- M.label names it (or the plan file); over: how a broken budget is introduced (default
-- "WHO: its plan breaks a budget"). The one check of a plan: loip.engine.check_plan.
function M.check_plan(p, problem, who, over)
  local plan = require "loip.plan"
  local bad = plan.check(p, problem.model.n_blocks, who)
  if bad then return bad end
  if #p.devices ~= #problem.devices then
    return string.format("%s: a plan for %d device%s, the problem has %d", who, #p.devices, #p.devices == 1 and "" or "s",
      #problem.devices)
  end
  local odd = plan.ends.check_vocab(p, problem.model.vocab, function(f, ...) return who .. ": " .. string.format(f, ...) end)
  if odd then return odd end
  local S = #p.devices[1].stages
  if problem.stages and S ~= problem.stages then
    return string.format("%s: a plan of %d stage%s per device, but %d %s asked for (--stages %d)", who, S, S == 1 and "" or "s",
      problem.stages, problem.stages == 1 and "was" or "were", problem.stages)
  end
  local budgets = {}
  for i, d in ipairs(problem.devices) do budgets[i] = d.budget or 0 end
  return (plan.over_budget(p, problem.model, budgets, require("loip.plan.space").memory_opts(problem),
    over or (who .. ": its plan breaks a budget")))
end

-- What a cost model's estimate est breaks of its contract (a table whose ms_per_token is a
-- finite number >= 0), as a message; nil when it keeps it.
function M.check_estimate(est, who)
  if type(est) ~= "table" then return string.format("%s: estimate returned %s, not a table", who, type(est)) end
  local t = est.ms_per_token
  if type(t) ~= "number" or t ~= t or t < 0 or t == math.huge then
    return string.format("%s: estimate's ms_per_token is %s, not a finite number >= 0", who, tostring(t))
  end
end

-- Plan p's head_shares (loip.plan.ends) with rows moved from each device whose budget p breaks
-- to those it leaves room on (most room first): a new list, the same when nothing moves.
function M.rebalanced_shares(p, problem)
  local plan, space = require "loip.plan", require "loip.plan.space"
  local sizes, N = problem.model, #p.devices
  local row = plan.ends.row_bytes(sizes)
  local shares = {}
  for k, v in ipairs(p.head_shares) do shares[k] = v end
  if row <= 0 then return shares end
  local opts = space.memory_opts(problem)
  local room = {}
  for i = 1, N do
    local b = space.budget(problem, i)
    room[i] = b < math.huge and b - plan.memory(p, i, sizes, opts).total or math.huge
  end
  for i = 1, N do
    -- (16 rows more than the shortfall: the rows' memory is rounded to pages)
    local need = room[i] < 0 and math.min(shares[i], math.ceil(-room[i] / row) + 16) or 0
    while need > 0 do
      local j
      for k = 1, N do if k ~= i and (not j or room[k] > room[j]) then j = k end end
      local can = j and (room[j] == math.huge and need or math.floor(room[j] / row) - 16) or 0
      if can <= 0 then break end
      local m = math.min(can, need)
      shares[i], shares[j], need = shares[i] - m, shares[j] + m, need - m
      room[i], room[j] = room[i] + m * row, room[j] - m * row
    end
  end
  return shares
end

-- One scheduler run on problem, checked and estimated (M.plan).
local function plan_once(problem, cost, sched)
  local t0 = require("loip.core").now_ms()
  -- A scheduler is a short, branchy search: LuaJIT's trace compiler spends more recording and
  -- aborting traces in it than the traces save (llama-3.3-70b on 8 devices, when measured: 70 ms
  -- with it, 20 ms without), so it runs interpreted.
  local was_on = jit.status()
  jit.off()
  local ok, p, why = pcall(sched.schedule, problem, cost)
  if was_on then jit.on() end
  local ms = require("loip.core").now_ms() - t0
  local who = M.label("scheduler", sched)
  if not ok then error(string.format("%s: %s", who, tostring(p)), 0) end
  if p == nil then error(string.format("%s: %s", who, why or "found no plan (and gave no reason)"), 0) end
  -- (where the embedding and head stay is the problem's: loip.plan.ends)
  if problem.ends then
    p.embed_rows, p.head_rows, p.head_shares = problem.ends.embed_rows, problem.ends.head_rows, problem.ends.head_shares
  end
  local bad = M.check_plan(p, problem, who)
  if bad and p.head_shares then
    -- (a head cut: its rows moved off the devices its plan overfills onto those with room)
    p.head_shares = M.rebalanced_shares(p, problem)
    bad = M.check_plan(p, problem, who)
  end
  if bad then error(bad, 0) end
  -- (a mixture of experts: each device's expert cache takes the memory its part leaves)
  local space = require "loip.plan.space"
  for i = 1, problem.model.moe and #p.devices or 0 do
    local b = space.budget(problem, i)
    space.size_expert_cache(p, i, problem.model, b < math.huge and b or 0, space.memory_opts(problem))
  end
  local est = cost.estimate(p, problem)
  bad = M.check_estimate(est, M.label("cost", cost, "cost model"))
  if bad then error(bad, 0) end
  return p, est, { scheduler_ms = ms, scheduler = sched.name, cost = cost.name }
end

-- The problem with the ends (loip.plan.ends) kept as `ends` says: a copy.
local function with_ends(problem, ends)
  local q = {}
  for k, v in pairs(problem) do q[k] = v end
  q.ends = ends
  return q
end

-- Run a scheduler on a problem with a cost model; check what it returns (M.check_plan: a
-- well-formed plan for the problem's devices, blocks and stage count that fits every budget)
-- and estimate it. opts: scheduler, cost (names, paths or tables; default "loip" for both).
-- Returns plan, estimate, { scheduler_ms, scheduler, cost }; raises with the scheduler's reason
-- when it finds no plan, and naming the scheduler (its file) and what its plan breaks.
-- Under budgets the embedding and head may stay on disk (loip.plan.ends.fallbacks): each way is
-- scheduled and the fastest by the cost model kept; the plan says so (embed_rows, head_rows), and
-- so may the head cut across the devices (head_shares, loip.plan.ends.cuts).
function M.plan(problem, opts)
  opts = opts or {}
  local cost = M.load("cost", opts.cost or "loip")
  local sched = M.load("scheduler", opts.scheduler or "loip")
  -- under budgets: the ends in memory, the embedding on disk, the head too (loip.plan.ends), each
  -- scheduled and priced; the fastest by the cost model (the first of equals) is the plan
  local budgeted = false
  for _, d in ipairs(problem.devices) do budgeted = budgeted or (d.budget or 0) > 0 end
  local options = { false }
  if budgeted and not problem.ends then
    local ends_mod = require "loip.plan.ends"
    for _, e in ipairs(ends_mod.fallbacks(problem.model)) do options[#options + 1] = e end
    -- (the head cut across the devices: loip.plan.ends.cuts)
    for _, e in ipairs(ends_mod.cuts(problem.model, problem.devices)) do options[#options + 1] = e end
  end
  local best, err, ms = nil, nil, 0
  for _, ends in ipairs(options) do
    local ok, p, est, info = pcall(plan_once, ends and with_ends(problem, ends) or problem, cost, sched)
    if ok then
      ms = ms + info.scheduler_ms
      if not best or est.ms_per_token < best[2].ms_per_token then best = { p, est, info } end
    end
    if not ok and (not (ends and ends.head_shares) or not err) then
      err = p -- (the last uncut: with the most on disk, the least a device needs)
    end
  end
  if not best then error(err, 0) end
  best[3].scheduler_ms = ms
  return best[1], best[2], best[3]
end

return M
