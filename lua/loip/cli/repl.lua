-- The interactive REPL: Lua with `loip` loaded; expressions print their values, plans and
-- tables print readably. An error prints its message; `:trace` prints the last one's stack
-- traceback. History in ~/.loip_history. Ctrl-C cancels the line being typed, or interrupts the
-- running chunk (what it and earlier lines set is kept); Ctrl-D (or :quit) leaves. The binary
-- gives the line editing and the Ctrl-C handling (runtime/cli/main.c: loip_readline,
-- loip_repl_signals, loip_repl_call). What is typed here runs interpreted (jit.off), so that
-- Ctrl-C reaches a loop written here; loip's modules it calls run compiled.
local loip = require "loip"

local M = {}

local function show(v, depth, seen)
  depth = depth or 0
  seen = seen or {}
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) ~= "table" or seen[v] or depth > 3 then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  seen[v] = true
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    if type(a) == type(b) and (type(a) == "number" or type(a) == "string") then return a < b end
    return type(a) < type(b)
  end)
  local parts = {}
  for i, k in ipairs(keys) do
    if i > 50 then parts[#parts + 1] = "..." break end
    local key = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or "[" .. show(k, depth + 1, seen) .. "]"
    parts[#parts + 1] = key .. " = " .. show(v[k], depth + 1, seen)
  end
  return "{ " .. table.concat(parts, ", ") .. " }"
end
M.show = show

-- banner: the first line printed (loip.cli's version line).
function M.run(banner)
  _G.loip = loip
  local home = os.getenv("HOME")
  local hist = home and (home .. "/.loip_history")
  if hist then loip_history("load", hist) end
  print(banner)
  print('loip REPL — `loip` is loaded; try: m = loip.model.open("models/stories260K")  (:help for commands)')
  local buffer = ""
  local last_trace
  local function on_error(e)
    last_trace = debug.traceback(tostring(e), 2)
    return e
  end
  local commands = {
    [":trace"] = function() print(last_trace or "no error yet") end,
    [":help"] = function()
      print(":trace   the stack traceback of the last error\n:quit    leave (also Ctrl-D)\n"
        .. "Ctrl-C   cancel the line being typed, or interrupt the running chunk (variables are kept)\n"
        .. "loip.<module>: model, tokenizer, cluster, plan, policy, sim, serve, ... (see README, \"Using it\")")
    end,
  }
  local signals = rawget(_G, "loip_repl_signals")
  local call = rawget(_G, "loip_repl_call") or function(handler, f) return xpcall(f, handler) end
  while true do
    if signals then signals(true) end -- (again: a chunk may have taken Ctrl-C over)
    local line = loip_readline(buffer == "" and "loip> " or "  ... ")
    if line == false then
      -- Ctrl-C: the line, and a statement left unfinished on the lines before, are dropped
      buffer = ""
      io.write("\n")
      goto continue
    end
    if not line then break end
    if line:match("%S") and hist then loip_history("add", line) end
    local cmd = buffer == "" and line:match("^%s*(:%a+)%s*$")
    if cmd == ":quit" then break end
    if cmd then
      if commands[cmd] then commands[cmd]() else print(cmd .. ": not a command (:help lists them)") end
      goto continue
    end
    buffer = buffer == "" and line or (buffer .. "\n" .. line)
    local chunk, err = loadstring("return " .. buffer, "=repl")
    if not chunk then chunk, err = loadstring(buffer, "=repl") end
    if not chunk and err:match("<eof>") then
      -- incomplete statement: read more
    else
      buffer = ""
      if not chunk then
        print(err)
      else
        -- (interpreted, with the functions it defines: a loop LuaJIT compiled would not see
        -- Ctrl-C until it ended; loip's own modules stay compiled)
        jit.off(chunk, true)
        local res = { call(on_error, chunk) }
        if not res[1] then
          -- (after the "^C" the terminal echoed)
          if res[2] == "interrupted (Ctrl-C)" then io.write("\n") end
          print(tostring(res[2]))
        elseif #res > 1 then
          local out = {}
          for i = 2, table.maxn(res) do out[#out + 1] = show(res[i]) end
          print(table.concat(out, "\t"))
        end
      end
    end
    ::continue::
  end
  if signals then signals(false) end
  if hist then loip_history("save", hist) end
  io.write("\n")
  return 0
end

return M
