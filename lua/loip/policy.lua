-- The policy loader (docs/planning.md, "Policies"): cost models, schedulers, online policies and
-- request patterns are Lua files a researcher copies and swaps. A name resolves to
-- recipes/policies/<kind>/<name>.lua (request patterns: recipes/patterns/<name>.lua); anything
-- with a slash or ending in .lua is a path, loaded as given. Shipped and user policies go
-- through the same loader and the same checks.
--
--   local policy = require "loip.policy"
--   local cost = policy.load("cost", "loip")                      -- recipes/policies/cost/loip.lua
--   local sched = policy.load("scheduler", "my/greedy.lua")       -- a file of one's own
--   local p, est = policy.plan(problem, { scheduler = "loip", cost = "loip" })
--   policy.list("scheduler")                                      -- the shipped names
--
-- A policy file returns a table of functions over plain tables (no FFI, no globals). It is run
-- in an environment of its own: the standard library and `require`, less what M.withheld names
-- (the FFI, and what reaches around the environment); assigning a global is refused. This keeps
-- a policy to the convention against mistakes; it is not a security boundary (a policy runs in
-- the process, and the loip modules it requires are the process's own).
local M = {}

-- What a policy's environment does not give it, and why (docs/planning.md, "Policies").
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

-- What each kind must provide. New kinds (a later issue's) are added here.
M.kinds = {
  cost = { dir = "policies/cost", needs = { "estimate" },
    about = "a cost model: estimate(plan, problem) -> { ms_per_token, devices = {...} }" },
  scheduler = { dir = "policies/scheduler", needs = { "schedule" },
    about = "a scheduler: schedule(problem, cost) -> plan, or nil and why" },
  online = { dir = "policies/online", needs = { "on_step" },
    about = "an online policy: on_step(state, control) between decoding steps" },
  links = { dir = "links", needs = { "at" },
    about = "a link schedule: at(step) -> nil, a rate for every link, or one per link (emulated links change between steps)" },
  baseline = { dir = "baselines", needs = { "run" },
    about = "a system compared against but not built (loip.sim.tp): run(problem, { batch, context }) -> { ms_per_token, ... } or nil, \"OOM: ...\"" },
  device = { dir = "devices", needs = { "profile" },
    about = "a device one does not own: its published figures (loip.sim.roofline.device); profile(shape) -> a loip profile" },
  pattern = { dir = "patterns", needs = { "requests" },
    about = "a request pattern: requests(opts) -> arrivals { at_ms | after, prompt_tokens, max_tokens } (loip.serve.load plays them)" },
}

-- The recipes/ directory: $LOIP_RECIPES_DIR, else beside the Lua modules' tree (lua/ and
-- recipes/ sit side by side in a checkout and under the install prefix's share/loip).
function M.recipes_dir()
  local env = os.getenv("LOIP_RECIPES_DIR")
  if env and env ~= "" then return env end
  local lua_dir = rawget(_G, "LOIP_LUA_DIR") or (require("loip.core").build.source_dir .. "/lua")
  return (lua_dir:gsub("/+$", ""):match("^(.*)/[^/]+$") or ".") .. "/recipes"
end

-- The file a name or path stands for.
function M.path(kind, name)
  local k = M.kinds[kind]
  if not k then error(string.format("loip.policy: unknown kind '%s' (%s)", tostring(kind), table.concat(M.kind_names(), ", ")), 2) end
  if type(name) ~= "string" or name == "" then error("loip.policy: a " .. kind .. " name or path is needed", 2) end
  if name:find("/", 1, true) or name:match("%.lua$") then return name end
  return string.format("%s/%s/%s.lua", M.recipes_dir(), k.dir, name)
end

function M.kind_names()
  local out = {}
  for k in pairs(M.kinds) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- The shipped policies of a kind, by name.
function M.list(kind)
  local k = M.kinds[kind]
  if not k then error("loip.policy: unknown kind '" .. tostring(kind) .. "'", 2) end
  local out = {}
  local p = io.popen("ls '" .. M.recipes_dir() .. "/" .. k.dir .. "' 2>/dev/null")
  for f in p:lines() do
    local n = f:match("^(.+)%.lua$")
    if n then out[#out + 1] = n end
  end
  p:close()
  table.sort(out)
  return out
end

-- Shipped policies are loaded once; a file of one's own is read again each time (it is being
-- edited).
local cache = {}

-- Load a policy of kind by name or path (a table is returned as it is, after the same checks).
-- Raises naming the file and what is wrong.
function M.load(kind, name)
  if type(name) == "table" then
    for _, f in ipairs(M.kinds[kind].needs) do
      if type(name[f]) ~= "function" then error(string.format("%s policy: it has no %s function (%s)", kind, f, M.kinds[kind].about), 2) end
    end
    return name
  end
  local path = M.path(kind, name)
  if cache[path] then return cache[path] end
  local f = io.open(path, "rb")
  if not f then
    local known = M.list(kind)
    error(string.format("%s '%s': no such policy (%s not found; shipped: %s)", kind, name, path,
      #known > 0 and table.concat(known, ", ") or "none"), 0)
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
  if path ~= name then cache[path] = mod end
  return mod
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

-- Run a scheduler on a problem with a cost model; check what it returns (M.check_plan: a
-- well-formed plan for the problem's devices, blocks and stage count that fits every budget)
-- and estimate it. opts: scheduler, cost (names, paths or tables; default "loip" for both).
-- Returns plan, estimate, { scheduler_ms, scheduler, cost }; raises with the scheduler's reason
-- when it finds no plan, and naming the scheduler (its file) and what its plan breaks.
function M.plan(problem, opts)
  opts = opts or {}
  local cost = M.load("cost", opts.cost or "loip")
  local sched = M.load("scheduler", opts.scheduler or "loip")
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
  local bad = M.check_plan(p, problem, who)
  if bad then error(bad, 0) end
  local est = cost.estimate(p, problem)
  bad = M.check_estimate(est, M.label("cost", cost, "cost model"))
  if bad then error(bad, 0) end
  return p, est, { scheduler_ms = ms, scheduler = sched.name, cost = cost.name }
end

return M
