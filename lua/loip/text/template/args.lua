-- How a method, builtin or filter binds its arguments the Python way (loip.text.template.str
-- re-exports these: M.bind, M.want_str, M.opt_int).
local V = require "loip.text.template.values"

local M = {}

local kind, raise, null, plain = V.kind, V.raise, V.null, V.plain

-- Arguments bound the Python way: positional first, then keywords by name. Returns the
-- values in `names` order, nil where not given; Markup arguments arrive as plain strings.
function M.bind(fname, names, args, kwargs)
  local out = {}
  local n = #names
  if #args > n then
    raise("TypeError", ("%s() takes at most %d argument%s (%d given)"):format(fname, n, n == 1 and "" or "s", #args))
  end
  for i = 1, #args do out[i] = plain(args[i]) end
  if kwargs then
    for _, k in ipairs(kwargs.keys) do
      local idx
      for i, nm in ipairs(names) do if nm == k then idx = i break end end
      if not idx then
        raise("TypeError", ("%s() got an unexpected keyword argument %s"):format(fname, V.repr(k)))
      end
      if out[idx] ~= nil then
        raise("TypeError", ("%s() got multiple values for argument %s"):format(fname, V.repr(k)))
      end
      out[idx] = plain(kwargs.vals[k])
    end
  end
  return unpack(out, 1, n)
end

function M.want_str(fname, v, what)
  if type(v) ~= "string" then
    raise("TypeError", ("%s() argument %s must be str, not %s"):format(fname, what or "1", V.typename(v)))
  end
  return v
end

-- Optional integer argument (None counts as absent).
function M.opt_int(v, default)
  if v == nil or v == null then return default end
  local i = V.to_int(v)
  if not i or kind(v) == "float" then
    raise("TypeError", ("'%s' object cannot be interpreted as an integer"):format(V.typename(v)))
  end
  return i
end

return M
