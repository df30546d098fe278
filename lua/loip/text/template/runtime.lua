-- The interpreter: walks the syntax tree from parser.lua and writes the output.
--
-- Scopes follow Jinja's compiled code. A frame is { vars = {}, parent = frame }; lookups walk
-- up the chain. `if` shares its frame; each loop iteration, macro call, `with`, block `set`,
-- filter block and {% generation %} gets a child frame, so a `set` inside a loop body is
-- gone at the next iteration and after the loop (use a namespace to carry state out).
local V = require "loip.text.template.values"
local methods = require "loip.text.template.methods"

local R = {}

local kind, truthy, str, raise = V.kind, V.truthy, V.str, V.raise
local getattr, getitem, iterate = methods.getattr, methods.getitem, methods.iterate
local concat = table.concat

-- Signals returned by statement lists to the enclosing loop.
local BREAK, CONTINUE = "break", "continue"

local function lookup(f, name)
  repeat
    local v = f.vars[name]
    if v ~= nil then return v end
    f = f.parent
  until not f
  return nil
end

local function child(f) return { vars = {}, parent = f } end

-- Nesting limit for macro calls and recursive loops. Jinja stops at Python's recursion
-- limit (1000 frames, a few per call); without a limit a runaway template would overflow
-- the Lua stack instead of failing with a message.
local MAX_DEPTH = 200

local function enter(rt)
  local d = rt.depth + 1
  if d > MAX_DEPTH then raise("RecursionError", "maximum recursion depth exceeded") end
  rt.depth = d
end

local E, S = {}, {}

local function eval(rt, n, f) return E[n.k](rt, n, f) end

local function exec(rt, body, f, out)
  for i = 1, #body do
    local st = body[i]
    local sig = S[st.k](rt, st, f, out)
    if sig then return sig end
  end
end

-- Assignment targets: a name, a namespace attribute, or a tuple to unpack into.
local function assign(target, value, f)
  local k = target.k
  if k == "Name" then
    f.vars[target.name] = value
  elseif k == "NSRef" then
    local ns = lookup(f, target.name)
    if kind(ns) ~= "namespace" then
      raise("TemplateRuntimeError", "cannot assign attribute on non-namespace object")
    end
    V.dict_set(ns.attrs, target.attr, value)
  else
    local vk = kind(value)
    if vk ~= "list" and vk ~= "tuple" and vk ~= "str" and vk ~= "dict" and vk ~= "undefined" then
      raise("TypeError", ("cannot unpack non-iterable %s object"):format(V.typename(value)))
    end
    local items, want = iterate(value), #target.items
    if #items < want then
      raise("ValueError", ("not enough values to unpack (expected %d, got %d)"):format(want, #items))
    elseif #items > want then
      raise("ValueError", ("too many values to unpack (expected %d)"):format(want))
    end
    for i, t in ipairs(target.items) do assign(t, items[i], f) end
  end
end

-- Calls ----------------------------------------------------------------------------------

local function eval_args(rt, n, f)
  local args, kwargs = {}, nil
  for i, a in ipairs(n.args) do args[i] = eval(rt, a, f) end
  if n.dyn_args then
    for _, v in ipairs(iterate(eval(rt, n.dyn_args, f))) do args[#args + 1] = v end
  end
  if #n.kwargs > 0 or n.dyn_kwargs then
    kwargs = V.dict()
    for _, kw in ipairs(n.kwargs) do V.dict_set(kwargs, kw.name, eval(rt, kw.value, f)) end
    if n.dyn_kwargs then
      local d = eval(rt, n.dyn_kwargs, f)
      if kind(d) ~= "dict" then
        raise("TypeError", ("argument after ** must be a mapping, not %s"):format(V.typename(d)))
      end
      for _, k in ipairs(d.keys) do V.dict_set(kwargs, k, d.vals[V.dkey(k)]) end
    end
  end
  return args, kwargs
end

function R.call(rt, fn, args, kwargs)
  local k = kind(fn)
  if k == "callable" then return fn.fn(rt, args, kwargs) end
  if k == "undefined" then V.fail_undefined(fn) end
  if k == "object" and fn.call then return fn:call(rt, args, kwargs) end
  raise("TypeError", ("'%s' object is not callable"):format(V.typename(fn)))
end
local call = R.call

-- Expressions ----------------------------------------------------------------------------

function E.Const(_, n) return n.value end

function E.Name(_, n, f)
  local v = lookup(f, n.name)
  if v == nil then return V.undefined(n.name) end
  return v
end

function E.Tuple(rt, n, f)
  local t = {}
  for i, x in ipairs(n.items) do t[i] = eval(rt, x, f) end
  return V.tuple(t)
end

function E.List(rt, n, f)
  local t = {}
  for i, x in ipairs(n.items) do t[i] = eval(rt, x, f) end
  return V.list(t)
end

function E.Dict(rt, n, f)
  local d = V.dict()
  for i, kn in ipairs(n.keys) do V.dict_set(d, eval(rt, kn, f), eval(rt, n.values[i], f)) end
  return d
end

function E.CondExpr(rt, n, f)
  if truthy(eval(rt, n.test, f)) then return eval(rt, n.expr1, f) end
  if n.expr2 then return eval(rt, n.expr2, f) end
  return V.undefined(nil, nil, ("the inline if-expression on line %d evaluated to false and no else section was defined."):format(n.line))
end

function E.Or(rt, n, f)
  local l = eval(rt, n.left, f)
  if truthy(l) then return l end
  return eval(rt, n.right, f)
end

function E.And(rt, n, f)
  local l = eval(rt, n.left, f)
  if not truthy(l) then return l end
  return eval(rt, n.right, f)
end

function E.Not(rt, n, f) return not truthy(eval(rt, n.node, f)) end

-- Chained comparisons stop at the first false link, as in Python.
function E.Compare(rt, n, f)
  local left = eval(rt, n.expr, f)
  for _, o in ipairs(n.ops) do
    local right = eval(rt, o.expr, f)
    local ok
    if o.op == "in" then ok = methods.contains(right, left)
    elseif o.op == "notin" then ok = not methods.contains(right, left)
    else ok = V.compare(o.op, left, right) end
    if not ok then return false end
    left = right
  end
  return true
end

function E.BinOp(rt, n, f) return V.arith(n.op, eval(rt, n.left, f), eval(rt, n.right, f)) end

function E.Concat(rt, n, f)
  local parts = {}
  for i, x in ipairs(n.items) do parts[i] = str(eval(rt, x, f)) end
  return concat(parts)
end

function E.Neg(rt, n, f) return V.neg(eval(rt, n.node, f)) end

function E.Pos(rt, n, f)
  local v = eval(rt, n.node, f)
  if V.is_undefined(v) then V.fail_undefined(v) end
  if not V.NUMERIC[kind(v)] then raise("TypeError", "bad operand type for unary +: '" .. V.typename(v) .. "'") end
  if type(v) == "boolean" then return V.num(v) end
  return v
end

function E.Getattr(rt, n, f) return getattr(eval(rt, n.node, f), n.attr) end

function E.Getitem(rt, n, f)
  local obj = eval(rt, n.node, f)
  local a = n.arg
  if a.k == "Slice" then
    return methods.slice(obj, a.start and eval(rt, a.start, f), a.stop and eval(rt, a.stop, f),
      a.step and eval(rt, a.step, f))
  end
  return getitem(obj, eval(rt, a, f))
end

-- A slice anywhere but the whole subscript (x[1, :], x[a:b, c]): Python makes a tuple holding a
-- slice object, which no list, string or dict takes as a key.
function E.Slice()
  raise("TypeError", "indices must be integers or slices, not tuple")
end

function E.Call(rt, n, f)
  local callee = n.node
  if callee.k == "Getattr" then
    -- obj.method(...) on a str/list/dict: call the method without making a bound object.
    local obj = eval(rt, callee.node, f)
    local m = methods.method(obj, callee.attr)
    if m then return m(obj, eval_args(rt, n, f)) end
    return call(rt, getattr(obj, callee.attr), eval_args(rt, n, f))
  end
  return call(rt, eval(rt, callee, f), eval_args(rt, n, f))
end

-- Filters that see Markup as such; the others get its plain string, and those in
-- KEEPS_MARKUP wrap a string result back into Markup, as their Jinja versions do.
local MARKUP_AWARE = { safe = true, escape = true, e = true, forceescape = true, string = true }
local KEEPS_MARKUP = { trim = true, upper = true, lower = true, capitalize = true,
  center = true, indent = true, format = true }

-- A filter node's input is its `node`, or `input` for the innermost filter of a
-- {% filter %} block or a block `set`, whose `node` is empty.
function E.Filter(rt, n, f, input)
  local value
  if n.node == nil then value = input
  elseif n.node.k == "Filter" then value = E.Filter(rt, n.node, f, input)
  else value = eval(rt, n.node, f) end
  local name = n.name
  if kind(value) == "markup" and not MARKUP_AWARE[name] then
    local res = rt.filters[name](rt, value.s, eval_args(rt, n, f))
    if KEEPS_MARKUP[name] and type(res) == "string" then return V.markup(res) end
    return res
  end
  return rt.filters[name](rt, value, eval_args(rt, n, f))
end

function E.Test(rt, n, f)
  local value = eval(rt, n.node, f)
  if n.name ~= "escaped" then value = V.plain(value) end
  return rt.tests[n.name](rt, value, eval_args(rt, n, f))
end

-- Loops ----------------------------------------------------------------------------------

local LOOP_ATTR = {
  index = function(l) return l.i end,
  index0 = function(l) return l.i - 1 end,
  revindex = function(l) return #l.items - l.i + 1 end,
  revindex0 = function(l) return #l.items - l.i end,
  first = function(l) return l.i == 1 end,
  last = function(l) return l.i == #l.items end,
  length = function(l) return #l.items end,
  depth = function(l) return l.depth0 + 1 end,
  depth0 = function(l) return l.depth0 end,
  previtem = function(l)
    if l.i > 1 then return l.items[l.i - 1] end
    return V.undefined(nil, nil, "there is no previous item")
  end,
  nextitem = function(l)
    if l.i < #l.items then return l.items[l.i + 1] end
    return V.undefined(nil, nil, "there is no next item")
  end,
  cycle = function(l)
    return setmetatable({ name = "cycle", fn = function(_, args)
      if #args == 0 then raise("TypeError", "no items for cycling given") end
      return args[(l.i - 1) % #args + 1]
    end }, V.Callable)
  end,
  changed = function(l)
    return setmetatable({ name = "changed", fn = function(_, args)
      local v = V.tuple({ unpack(args) })
      if l.last_changed == nil or not V.eq(v, l.last_changed) then
        l.last_changed = v
        return true
      end
      return false
    end }, V.Callable)
  end,
}

local Loop = {}
function Loop:attr(name)
  local a = LOOP_ATTR[name]
  return a and a(self)
end
function Loop:str() return ("<LoopContext %d/%d>"):format(self.i, #self.items) end
-- `loop(children)` in a recursive loop renders the loop body over `children`.
function Loop:call(rt, args)
  return self.recurse(rt, args[1])
end

local function run_for(rt, n, f, out, iterable, depth0)
  local items = iterate(iterable)
  if n.test then
    local kept = {}
    for _, it in ipairs(items) do
      local tf = child(f)
      assign(n.target, it, tf)
      if truthy(eval(rt, n.test, tf)) then kept[#kept + 1] = it end
    end
    items = kept
  end
  if #items == 0 then
    if n.else_ then return exec(rt, n.else_, child(f), out) end
    return
  end
  local loop = setmetatable({ type_name = "LoopContext", items = items, i = 0, depth0 = depth0,
    attr = Loop.attr, str = Loop.str }, V.Object)
  if n.recursive then
    loop.call = Loop.call
    loop.recurse = function(rt2, sub)
      local buf = {}
      enter(rt2)
      run_for(rt2, n, f, buf, sub, depth0 + 1)
      rt2.depth = rt2.depth - 1
      return concat(buf)
    end
  end
  for i = 1, #items do
    loop.i = i
    local lf = { vars = { loop = loop }, parent = f }
    assign(n.target, items[i], lf)
    if exec(rt, n.body, lf, out) == BREAK then break end
  end
end

-- Macros ---------------------------------------------------------------------------------

-- A callable for a Macro or CallBlock node, closing over the frame it was defined in.
local function make_macro(n, defframe, name)
  local nargs = #n.args
  local is_param = {}
  for _, p in ipairs(n.args) do is_param[p] = true end
  return setmetatable({ name = name, fn = function(rt, args, kwargs)
    if #args > nargs and not n.uses_varargs then
      raise("TypeError", ("macro %s takes not more than %d argument(s)"):format(V.repr(name), nargs))
    end
    local mf = child(defframe)
    for i, p in ipairs(n.args) do
      local v, kv = args[i], kwargs and kwargs.vals[p]
      if v ~= nil and kv ~= nil then
        raise("TypeError", ("macro %s got multiple values for argument %s"):format(V.repr(name), V.repr(p)))
      end
      if v == nil then v = kv end
      if v == nil then
        if n.defaults[i] then v = eval(rt, n.defaults[i], mf)
        else v = V.undefined(p, nil, ("parameter %s was not provided"):format(V.repr(p))) end
      end
      mf.vars[p] = v
    end
    local extra = V.dict()
    if kwargs then
      for _, k in ipairs(kwargs.keys) do
        if not is_param[k] and not (k == "caller" and n.uses_caller) then
          V.dict_set(extra, k, kwargs.vals[k])
        end
      end
    end
    if n.uses_caller then
      mf.vars.caller = kwargs and kwargs.vals.caller or V.undefined(nil, nil, "No caller defined")
    end
    if n.uses_kwargs then
      mf.vars.kwargs = extra
    elseif extra.keys[1] ~= nil then
      raise("TypeError", ("macro %s takes no keyword argument %s"):format(V.repr(name), V.repr(extra.keys[1])))
    end
    if n.uses_varargs then mf.vars.varargs = V.tuple({ unpack(args, nargs + 1) }) end
    local buf = {}
    enter(rt)
    exec(rt, n.body, mf, buf)
    rt.depth = rt.depth - 1
    return concat(buf)
  end }, V.Callable)
end

-- Statements -----------------------------------------------------------------------------

function S.Data(_, n, _, out) out[#out + 1] = n.text end

function S.Print(rt, n, f, out)
  rt.line = n.line
  if n.exprs then
    for _, e in ipairs(n.exprs) do out[#out + 1] = str(eval(rt, e, f)) end
  else
    out[#out + 1] = str(eval(rt, n.expr, f))
  end
end

function S.If(rt, n, f, out)
  rt.line = n.line
  if truthy(eval(rt, n.test, f)) then return exec(rt, n.body, f, out) end
  if n.else_ then return exec(rt, n.else_, f, out) end
end

function S.For(rt, n, f, out)
  rt.line = n.line
  return run_for(rt, n, f, out, eval(rt, n.iter, f), 0)
end

function S.Assign(rt, n, f)
  rt.line = n.line
  assign(n.target, eval(rt, n.expr, f), f)
end

function S.AssignBlock(rt, n, f)
  rt.line = n.line
  local buf = {}
  exec(rt, n.body, child(f), buf)
  local value = concat(buf)
  if n.filter then value = E.Filter(rt, n.filter, f, value) end
  assign(n.target, value, f)
end

function S.FilterBlock(rt, n, f, out)
  rt.line = n.line
  local buf = {}
  exec(rt, n.body, child(f), buf)
  out[#out + 1] = str(E.Filter(rt, n.filter, f, concat(buf)))
end

function S.With(rt, n, f, out)
  rt.line = n.line
  local wf = child(f)
  local values = {}
  for i, v in ipairs(n.values) do values[i] = eval(rt, v, f) end
  for i, t in ipairs(n.targets) do assign(t, values[i], wf) end
  return exec(rt, n.body, wf, out)
end

function S.Scope(rt, n, f, out) return exec(rt, n.body, child(f), out) end

function S.Macro(_, n, f) f.vars[n.name] = make_macro(n, f, n.name) end

function S.CallBlock(rt, n, f, out)
  rt.line = n.line
  local c = n.call
  local fn = eval(rt, c.node, f)
  local args, kwargs = eval_args(rt, c, f)
  kwargs = kwargs or V.dict()
  V.dict_set(kwargs, "caller", make_macro(n, f, "caller"))
  out[#out + 1] = str(call(rt, fn, args, kwargs))
end

function S.Break() return BREAK end
function S.Continue() return CONTINUE end

-- Renders a parsed template. rt: { filters, tests, now, line }; scope: the frame holding
-- the caller's variables (its parent holds the globals).
function R.render(rt, body, scope)
  rt.depth = 0
  local out = {}
  exec(rt, body, child(scope), out)
  return concat(out)
end

return R
