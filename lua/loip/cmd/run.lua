-- `loip run`: run a Lua script (recipe) with the runtime available.
local common = require "loip.cli.inputs"

local M = {
  brief = "run a Lua script (recipe) with the runtime available",
  usage = "loip run FILE.lua [ARGS...]",
  positional = { "FILE.lua", "ARGS..." },
  summary = "Run a Lua script (a recipe) with the `loip` global the REPL has (require \"loip\" works too) and\n"
    .. "`arg` set as luajit sets it.",
  flags = {}, stop_at_positional = true,
}

function M.run(_, pos, argv, at)
  local file = pos[1]
  if not file then common.usage("run", "which script? (loip run FILE.lua)") end
  local chunk, err = loadfile(file)
  if not chunk then common.stderr("loip: %s\n", err) return 1 end
  -- arg as luajit sets it: arg[0] the script, arg[1..] its arguments, negatives before.
  local a = { [0] = file }
  for i = 2, #pos do a[i - 1] = pos[i] end
  a[-1], a[-2] = argv[at], argv[0]
  _G.arg = a
  _G.loip = require "loip" -- as in the REPL: one rule for both
  chunk(unpack(pos, 2))
  return 0
end

return M
