-- `loip test`: run busted specs under the runtime.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local M = {
  brief = "run busted specs under the runtime",
  usage = "loip test [BUSTED ARGS...] [SPEC DIRS...]",
  summary = "Run busted specs under this LuaJIT with the runtime loaded (ctest calls this).",
  flags = {}, passthrough = true,
}

function M.run(_, pos)
  _G.arg = { [0] = "busted" }
  for i, v in ipairs(pos) do _G.arg[i] = v end
  -- busted calls os.exit itself on success; on failure (under Lua 5.1 rules) it raises a nil
  -- error to make the interpreter exit non-zero.
  local ok, err = pcall(require("busted.runner"), { standalone = false })
  if ok then return 0 end
  if err ~= nil then error(err, 0) end
  return 1
end

return M
