-- The loip command. runtime/cli/main.c calls main(argv) and exits with its return value: 0
-- success, 1 runtime failure, 2 usage error.
--
-- Each command is one module, lua/loip/cmd/<name>.lua (luarocks' src/luarocks/cmd/*.lua): a table
-- { brief (its line in `loip help`), usage, summary, flags (loip.ui.flags rows; the rows several
-- commands share are flags.shared's), run(opts, positional, argv, at) -> exit code }, the work done
-- by the library modules it calls. This file only dispatches: the REPL with no command, help,
-- version, and a usage error naming the nearest command.
local errors = require "loip.error"
local flags = require "loip.ui.flags"
local suggest = require "loip.ui.suggest"

local M = {}

-- The commands, in the order `loip help` lists them, each the module loip.cmd.<name>.
local ORDER = { "generate", "serve", "chat", "tokenize", "run", "synth", "slice", "pull", "plan", "profile",
  "simulate", "worker", "cluster", "testbed", "trace", "test", "policy" }

M.commands, M.order, M.modules = {}, {}, {}

-- Where a command defined elsewhere plugs in (a line at the end of this file): M.add(name,
-- module) lists it in `loip help` (after the others) and runs it as `loip NAME`; module is the
-- name to require (kept in M.modules) or a table as above. M.topics[name] = function() -> text
-- adds a help topic, `loip help NAME` (e.g. M.topics.policies).
function M.add(name, module)
  if M.commands[name] then error("loip: command " .. name .. " is defined twice", 2) end
  M.commands[name] = type(module) == "string" and require(module) or module
  M.modules[name] = type(module) == "string" and module or nil
  M.order[#M.order + 1] = name
end
M.topics = {}
-- `loip help policies`: every kind's policies and their settings
M.topics.policies = function() return M.commands.policy.list_text() end

for _, name in ipairs(ORDER) do M.add(name, "loip.cmd." .. name) end
M.add("discover", "loip.cmd.discover") -- (discovery on a LAN: the workers loip worker --announce)

function M.version()
  local core = require "loip.core" -- (for `loip version`: `loip help` loads no FFI)
  local exec = require "loip.runtime.exec" -- (the same)
  local kernels = exec.kernels_name()
  if kernels == "amx-auto" then kernels = kernels .. " from " .. exec.kernels_amx_rows() .. " tokens" end
  return string.format("loip %s (abi %d, kernels %s, cuda %s)", core.build.version,
    core.abi_version, kernels, core.build.cuda and (exec.cuda_device_count() .. " device(s)") or "not built")
end

-- `loip help`: every command, one line each (a spec checks that it lists every command).
function M.usage()
  local out = { "usage: loip [COMMAND] [FLAGS]", "", "commands:",
    string.format("  %-11s %s", "(none)", "interactive Lua REPL with the loip module loaded") }
  for _, name in ipairs(M.order) do out[#out + 1] = string.format("  %-11s %s", name, M.commands[name].brief) end
  out[#out + 1] = string.format("  %-11s %s", "help CMD", "flags of a command (also: loip CMD --help); help policies: every policy and its settings")
  out[#out + 1] = string.format("  %-11s %s", "version", "versions of the runtime and its kernels")
  return table.concat(out, "\n") .. "\n"
end

function M.main(argv)
  local cmd = argv[1]
  local ok, rc = xpcall(function()
    if cmd == nil then return require("loip.cli.repl").run(M.version()) end -- (loaded when it runs: `loip` with no command)
    if cmd == "--help" or cmd == "-h" then io.stdout:write(M.usage()) return 0 end
    if cmd == "help" then
      local c, topic = M.commands[argv[2] or ""], M.topics[argv[2] or ""]
      io.stdout:write(c and flags.help(c) or topic and topic() or M.usage())
      return 0
    end
    if cmd == "version" or cmd == "--version" then print(M.version()) return 0 end
    local c = M.commands[cmd]
    if not c then
      local near = suggest.closest(cmd, M.order)
      io.stderr:write(string.format("loip: unknown command '%s'%s\n%s", cmd, near and ("; did you mean " .. near .. "?") or "",
        M.usage()))
      return 2
    end
    c.name = cmd
    if (argv[2] == "--help" or argv[2] == "-h") then io.stdout:write(flags.help(c)) return 0 end
    local opts, pos = flags.parse(c, argv, 2)
    return c.run(opts, pos, argv, 1)
  end, function(e)
    if errors.is(e, "usage") then return { msg = e.message, usage = true } end
    if (type(e) == "string" or errors.is(e)) and not os.getenv("LOIP_DEBUG") then return { msg = tostring(e) } end
    return { msg = debug.traceback(tostring(e), 2) }
  end)
  if ok then return rc or 0 end
  -- (after text that left its line unfinished, e.g. generate's tokens: the error on a line of its own)
  local common = package.loaded["loip.cli.inputs"]
  if common and common.mid_line then io.stdout:write("\n") io.stdout:flush() common.mid_line = false end
  io.stderr:write(string.format("loip: %s\n", rc.msg))
  return rc.usage and 2 or 1
end

return M
