-- The command line's shape: one module of lua/loip/cmd/ per command `loip help` lists, each
-- module's flags in its help, renamed flags and options kept as aliases that say so once, and
-- one rule for the online policy a run gets.
local cli = require "loip.cli"
local errors = require "loip.error"
local flags = require "loip.ui.flags"
local T = require "spec.support"

teardown(T.drop_stores)

-- The commands `loip help` lists (not the REPL, help and version lines).
local function listed()
  local out, body = {}, cli.usage():match("\ncommands:\n(.*)$")
  for line in body:gmatch("[^\n]+") do
    local name = line:match("^  (%S+)")
    if name ~= "(none)" and name ~= "help" and name ~= "version" then out[#out + 1] = name end
  end
  return out
end

-- The modules in lua/loip/cmd/ (one per command).
local function modules()
  local out = {}
  local p = io.popen("ls " .. T.root .. "/lua/loip/cmd")
  for f in p:lines() do
    local name = f:match("^(.+)%.lua$")
    if name then out[#out + 1] = name end
  end
  p:close()
  return out
end

-- Runs f with io.stderr replaced by a writer that keeps the text; returns f's results and the text.
local function stderr_of(f)
  local text, real = {}, io.stderr
  io.stderr = { write = function(self, ...) for _, s in ipairs({ ... }) do text[#text + 1] = s end return self end }
  local ok, a, b = pcall(f)
  io.stderr = real
  if not ok then error(a, 0) end
  return a, b, table.concat(text)
end

describe("loip's commands", function()
  it("are one module each in lua/loip/cmd/, as loip help lists them", function()
    local names, files, inside = listed(), modules(), {}
    table.sort(files)
    assert.is_true(#names >= 15, #names .. " commands listed")
    for _, name in ipairs(names) do
      -- (one plugged in from elsewhere, cli.add's, is a module of its own too)
      assert.is_string(cli.modules[name], name .. ": no module")
      if cli.modules[name]:match("^loip%.cmd%.") then inside[#inside + 1] = name end
    end
    table.sort(inside)
    assert.are.same(files, inside)
    local seen = {}
    for _, name in ipairs(names) do
      local m = require(cli.modules[name])
      assert.are.equal(m, cli.commands[name], name)
      assert.is_nil(seen[m], name .. " and " .. tostring(seen[m]) .. " share a module")
      seen[m] = name
      assert.is_string(m.brief, name)
      assert.is_function(m.run, name)
    end
  end)

  it("show every flag of theirs in their help, each name once", function()
    for name, m in pairs(cli.commands) do
      local help, once = flags.help(m), {}
      for _, f in ipairs(m.flags) do
        assert.is_nil(once[f[1]], name .. ": --" .. f[1] .. " twice")
        once[f[1]] = true
        assert.matches("\n  %-%-" .. f[1]:gsub("%-", "%%-") .. "[ \n]", help, nil, false, name .. ": --" .. f[1])
      end
    end
  end)

  it("take a command plugged in from elsewhere, listed in help", function()
    local before = #cli.order
    local cmd = { brief = "a test's command", usage = "loip spec-cmd", summary = "s", flags = {},
      run = function() return 7 end }
    cli.add("spec-cmd", cmd)
    local ok, err = pcall(function()
      assert.matches("\n  spec-cmd    a test's command\n", cli.usage(), 1, true)
      assert.is_nil(cli.modules["spec-cmd"])
      assert.are.equal(7, cli.main({ [0] = "loip", "spec-cmd" }))
      assert.has_error(function() cli.add("spec-cmd", cmd) end, "loip: command spec-cmd is defined twice")
    end)
    cli.commands["spec-cmd"], cli.order[before + 1] = nil, nil
    assert(ok, err)
  end)
end)

describe("renamed flags and options", function()
  it("plan for N KV positions is --plan-positions; the old names set it and say so once", function()
    for _, case in ipairs({ { "generate", "--plan-context" }, { "serve", "--plan-tokens" },
      { "simulate", "--plan-tokens" }, { "simulate", "--plan-context" } }) do
      local spec = setmetatable({ name = case[1] .. "-alias-" .. case[2] }, { __index = cli.commands[case[1]] })
      local o, _, err = stderr_of(function()
        return flags.parse(spec, { "--model", "m", case[2], "16", case[2] .. "=32" }, 1)
      end)
      assert.are.equal(32, o.plan_positions, case[1] .. " " .. case[2])
      assert.is_nil(o[case[2]:sub(3):gsub("%-", "_")])
      assert.are.equal(spec.name .. ": " .. case[2] .. " is deprecated (it goes in a later release): use --plan-positions\n", err)
      assert.matches(case[2]:gsub("%-", "%%-") .. " N%s+deprecated: use %-%-plan%-positions", flags.help(spec))
    end
    -- (checked as the new name is: the value's type and range; the message names the flag typed)
    local spec = setmetatable({ name = "generate" }, { __index = cli.commands.generate })
    local ok, e = pcall(stderr_of, function() return flags.parse(spec, { "--model", "m", "--plan-context", "0" }, 1) end)
    assert.is_false(ok)
    assert.matches("generate: --plan-context: must be >= 1", e.msg or tostring(e), 1, true)
    ok, e = pcall(stderr_of, function() return flags.parse(spec, { "--model", "m", "--plan-context", "x" }, 1) end)
    assert.is_false(ok)
    assert.matches("generate: --plan-context: 'x' is not a valid int", e.msg or tostring(e), 1, true)
  end)

  it("the Lua option kv_plan_tokens is plan_positions, said once", function()
    local v, _, err = stderr_of(function()
      flags.renamed({ kv_plan_tokens = 8 }, "kv_plan_tokens", "plan_positions", "spec.renamed")
      return flags.renamed({ kv_plan_tokens = 16 }, "kv_plan_tokens", "plan_positions", "spec.renamed")
    end)
    assert.are.equal(16, v)
    assert.are.equal("spec.renamed: kv_plan_tokens is deprecated (it goes in a later release): use plan_positions\n", err)
    assert.are.equal(4, flags.renamed({ plan_positions = 4, kv_plan_tokens = 16 }, "kv_plan_tokens", "plan_positions", "x"))
    assert.is_nil(flags.renamed({}, "kv_plan_tokens", "plan_positions", "x"))
    -- plan.sizes takes both names
    local plan = require "loip.plan"
    local store = require "loip.model.store"
    local dir = T.slice_store(T.root .. "/models/stories260K", "s260")
    local man = store.read_manifest(dir)
    local cfg = store.config(dir, man)
    local a = plan.sizes(man, cfg, { context = 256, batch = 16, plan_positions = 32 })
    local b = stderr_of(function() return plan.sizes(man, cfg, { context = 256, batch = 16, kv_plan_tokens = 32 }) end)
    assert.are.equal(32, a.plan_positions)
    assert.are.same(a, b)
  end)
end)

describe("the online policy a run gets", function()
  it("is the one named, none for none, else loip when planned for fewer positions", function()
    local choose = require("loip.engine.request.online").choose
    assert.is_nil(choose(nil, nil))
    assert.are.equal("loip", choose(nil, 32))
    assert.is_nil(choose("none", 32))
    assert.are.equal("recompute", choose("recompute", nil))
    assert.are.equal("loip", choose("loip", nil))
    assert.are.equal("x.lua", choose("x.lua", 32))
  end)
end)

-- (the usage error flags.parse raises for argv, as its message; nil when it parses)
local function refusal(name, argv)
  local spec = setmetatable({ name = name }, { __index = cli.commands[name] })
  local ok, e = pcall(stderr_of, function() return flags.parse(spec, argv, 1) end)
  if ok then return nil end
  assert.is_table(e, tostring(e))
  assert.is_true(errors.is(e, "usage"), tostring(e))
  return e.message
end

describe("the command line's words", function()
  it("past those a command takes are refused, naming them (no command drops one silently)", function()
    local msg = refusal("generate", { "--model", "m", "--prompt", "Once", "upon", "a", "time" })
    assert.are.equal("generate: unexpected words 'upon' 'a' 'time': it takes no words besides its flags (if they belong to "
      .. "--prompt's value, quote it: --prompt \"Once upon a time\")", msg)
    for name, m in pairs(cli.commands) do
      local names = m.positional or {}
      local many = names[#names] and names[#names]:sub(-3) == "..."
      if not (m.passthrough or many) then
        local argv = {}
        for k = 1, #names do argv[k] = "w" .. k end
        argv[#argv + 1] = "extra-word"
        local e = refusal(name, argv)
        assert.is_string(e, name .. " took " .. #argv .. " words, more than it names")
        assert.matches("unexpected word 'extra-word': it takes ", e, 1, true)
      end
    end
    assert.is_nil(refusal("synth", { "--like", "llama-3.2-1b", "out" }))
    assert.are.equal("synth: unexpected word 'b': it takes 1 besides its flags (OUT_DIR)", refusal("synth", { "a", "b" }))
    assert.is_nil(refusal("tokenize", { "--model", "m", "Once", "upon", "a", "time" }))
    assert.is_nil(refusal("run", { "x.lua", "a", "b", "--c" }))
  end)

  it("a flag one edit from a command's flag (a letter left out, added, changed, or two swapped) gets a 'did you mean'", function()
    local distance = require("loip.ui.suggest").distance
    assert.are.equal(1, distance("modle", "model"))
    assert.are.equal(1, distance("prot", "port"))
    for name, m in pairs(cli.commands) do
      for _, f in ipairs(m.flags) do
        local flag = f[1]
        if #flag >= 4 and not f.alias_of then
          local typos = { flag:sub(2), flag .. "x" }
          for k = 1, #flag - 1 do
            if flag:sub(k, k) ~= flag:sub(k + 1, k + 1) then
              typos[#typos + 1] = flag:sub(1, k - 1) .. flag:sub(k + 1, k + 1) .. flag:sub(k, k) .. flag:sub(k + 2)
            end
          end
          for _, typo in ipairs(typos) do
            local e = refusal(name, { "--" .. typo })
            if not (e and e:find("unknown flag", 1, true)) then break end -- (the typo is another flag)
            local meant = e:match("did you mean %-%-(%S+)%?$")
            assert.is_string(meant, name .. " --" .. typo .. ": " .. e)
            assert.is_true(distance(typo, meant) <= 1, name .. " --" .. typo .. ": " .. e)
          end
        end
      end
    end
  end)
end)

describe("byte figures in a message", function()
  it("print with the digits it takes for two figures that differ to print differently", function()
    local fmt = require("loip.runtime.memory").format_bytes
    local need, budget = 3 * 2 ^ 20 + 18227, 3 * 2 ^ 20
    assert.are.equal("3.0 MiB", fmt(need))
    assert.are.equal("3.02 MiB", fmt(need, budget))
    assert.are.equal("3.00 MiB", fmt(budget, need))
    assert.are.equal("1.000001 MiB", fmt(2 ^ 20 + 1, 2 ^ 20))
    assert.are.equal("1.5 MiB", fmt(1.5 * 2 ^ 20, 3 * 2 ^ 20))
    assert.are.equal("2.0 MiB", fmt(2 ^ 21, 2 ^ 21))
    assert.are.equal("300 bytes", fmt(300, 301))
    assert.are.equal("1.50 GiB", fmt(1.5 * 2 ^ 30))
  end)
end)
