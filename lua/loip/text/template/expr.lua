-- The expression half of the template parser (a port of jinja2.parser.Parser): the token
-- stream helpers and the expression grammar, with Jinja's precedence (filters and tests
-- bind tighter than any operator: `'a' + x | trim` trims x) and its error messages.
-- parser.lua adds the statements on top of this class.
--
-- Expression nodes are tables { k = "<Kind>", line = , col = , ... }: Const, Name, NSRef,
-- Tuple, List, Dict, CondExpr, Or, And, Not, Compare, BinOp, Concat, Neg, Pos, Getattr,
-- Getitem, Slice, Call, Filter, Test.
local V = require "loip.text.template.values"

local DESCRIBE = { add = "+", sub = "-", div = "/", floordiv = "//", mul = "*", mod = "%",
  pow = "**", tilde = "~", lbracket = "[", rbracket = "]", lparen = "(", rparen = ")",
  lbrace = "{", rbrace = "}", eq = "==", ne = "!=", gt = ">", gteq = ">=", lt = "<",
  lteq = "<=", assign = "=", dot = ".", colon = ":", pipe = "|", comma = ",",
  semicolon = ";", block_begin = "begin of statement block",
  block_end = "end of statement block", variable_begin = "begin of print statement",
  variable_end = "end of print statement", data = "template data / text",
  eof = "end of template" }

local function describe(tok)
  if tok.type == "name" then return tok.value end
  return DESCRIBE[tok.type] or tok.type
end

-- "name:endfor" -> "endfor", "block_end" -> "end of statement block"
local function describe_expr(expr)
  local ty, val = expr:match("^([^:]+):(.*)$")
  if ty == "name" then return val end
  return DESCRIBE[expr] or expr
end

local COMPARE = { eq = true, ne = true, lt = true, lteq = true, gt = true, gteq = true }

local P = {}
P.__index = P

function P:fail(msg, tok, etype)
  tok = tok or self.tok
  V.raise(etype or "TemplateSyntaxError", msg, tok.line, tok.col)
end

function P:advance()
  local t = self.tok
  self.i = self.i + 1
  self.tok = self.toks[self.i] or self.toks[#self.toks]
  return t
end

function P:look() return self.toks[self.i + 1] or self.toks[#self.toks] end

-- Token test against "type" or "type:value".
local function test(tok, expr)
  if tok.type == expr then return true end
  local ty, val = expr:match("^([^:]+):(.*)$")
  return ty ~= nil and tok.type == ty and tok.value == val
end

local function test_any(tok, exprs)
  for _, e in ipairs(exprs) do if test(tok, e) then return true end end
  return false
end

function P:skip_if(expr)
  if test(self.tok, expr) then self:advance() return true end
  return false
end

function P:expect(expr)
  if not test(self.tok, expr) then
    if self.tok.type == "eof" then
      self:fail(("unexpected end of template, expected %s."):format(V.str_repr(describe_expr(expr))))
    end
    self:fail(("expected token %s, got %s"):format(V.str_repr(describe_expr(expr)),
      V.str_repr(describe(self.tok))))
  end
  return self:advance()
end

local function node(k, tok, fields)
  fields = fields or {}
  fields.k, fields.line, fields.col = k, tok.line, tok.col
  return fields
end


function P:parse_assign_target(o)
  o = o or {}
  local target
  if o.name_only then
    local tok = self:expect("name")
    target = node("Name", tok, { name = tok.value })
  else
    target = self:parse_tuple({ simplified = true, with_namespace = o.with_namespace })
  end
  local function assignable(t)
    if t.k == "Name" then
      return t.name ~= "true" and t.name ~= "false" and t.name ~= "none" and t.name ~= "True"
        and t.name ~= "False" and t.name ~= "None"
    end
    if t.k == "NSRef" then return true end
    if t.k == "Tuple" then
      for _, it in ipairs(t.items) do if not assignable(it) then return false end end
      return true
    end
    return false
  end
  if not assignable(target) then
    self:fail(("can't assign to %s"):format(V.str_repr(target.k:lower())), target)
  end
  return target
end

function P:parse_expression(with_condexpr)
  if with_condexpr == false then return self:parse_or() end
  return self:parse_condexpr()
end

function P:parse_condexpr()
  local tok = self.tok
  local expr1 = self:parse_or()
  while self:skip_if("name:if") do
    local expr2 = self:parse_or()
    local expr3
    if self:skip_if("name:else") then expr3 = self:parse_condexpr() end
    expr1 = node("CondExpr", tok, { test = expr2, expr1 = expr1, expr2 = expr3 })
    tok = self.tok
  end
  return expr1
end

function P:parse_or()
  local tok = self.tok
  local left = self:parse_and()
  while self:skip_if("name:or") do
    left = node("Or", tok, { left = left, right = self:parse_and() })
    tok = self.tok
  end
  return left
end

function P:parse_and()
  local tok = self.tok
  local left = self:parse_not()
  while self:skip_if("name:and") do
    left = node("And", tok, { left = left, right = self:parse_not() })
    tok = self.tok
  end
  return left
end

function P:parse_not()
  if test(self.tok, "name:not") then
    local tok = self:advance()
    return node("Not", tok, { node = self:parse_not() })
  end
  return self:parse_compare()
end

function P:parse_compare()
  local tok = self.tok
  local expr = self:parse_math1()
  local ops = {}
  while true do
    local ty = self.tok.type
    if COMPARE[ty] then
      self:advance()
      ops[#ops + 1] = { op = ty, expr = self:parse_math1() }
    elseif self:skip_if("name:in") then
      ops[#ops + 1] = { op = "in", expr = self:parse_math1() }
    elseif test(self.tok, "name:not") and test(self:look(), "name:in") then
      self:advance() self:advance()
      ops[#ops + 1] = { op = "notin", expr = self:parse_math1() }
    else
      break
    end
  end
  if #ops == 0 then return expr end
  return node("Compare", tok, { expr = expr, ops = ops })
end

local function binary(self, next_level, types)
  local tok = self.tok
  local left = next_level(self)
  while types[self.tok.type] do
    local op = self:advance().type
    left = node("BinOp", tok, { op = op, left = left, right = next_level(self) })
    tok = self.tok
  end
  return left
end

local MATH1 = { add = true, sub = true }
local MATH2 = { mul = true, div = true, floordiv = true, mod = true }
local POW = { pow = true }

function P:parse_math1() return binary(self, P.parse_concat, MATH1) end

function P:parse_concat()
  local tok = self.tok
  local args = { self:parse_math2() }
  while self.tok.type == "tilde" do
    self:advance()
    args[#args + 1] = self:parse_math2()
  end
  if #args == 1 then return args[1] end
  return node("Concat", tok, { items = args })
end

function P:parse_math2() return binary(self, P.parse_pow, MATH2) end
function P:parse_pow() return binary(self, P.parse_unary, POW) end

function P:parse_unary(with_filter)
  local tok = self.tok
  local n
  if tok.type == "sub" then
    self:advance()
    n = node("Neg", tok, { node = self:parse_unary(false) })
  elseif tok.type == "add" then
    self:advance()
    n = node("Pos", tok, { node = self:parse_unary(false) })
  else
    n = self:parse_primary()
  end
  n = self:parse_postfix(n)
  if with_filter ~= false then n = self:parse_filter_expr(n) end
  return n
end

function P:parse_primary(with_namespace)
  local tok = self.tok
  if tok.type == "name" then
    self:advance()
    local v = tok.value
    if v == "true" or v == "True" then return node("Const", tok, { value = true }) end
    if v == "false" or v == "False" then return node("Const", tok, { value = false }) end
    if v == "none" or v == "None" then return node("Const", tok, { value = V.null }) end
    if with_namespace and self.tok.type == "dot" then
      self:advance()
      local attr = self:expect("name")
      return node("NSRef", tok, { name = v, attr = attr.value })
    end
    return node("Name", tok, { name = v })
  elseif tok.type == "string" then
    self:advance()
    local buf = { tok.value }
    while self.tok.type == "string" do buf[#buf + 1] = self:advance().value end
    return node("Const", tok, { value = table.concat(buf) })
  elseif tok.type == "integer" or tok.type == "float" then
    self:advance()
    return node("Const", tok, { value = tok.value })
  elseif tok.type == "lparen" then
    self:advance()
    local n = self:parse_tuple({ explicit_parentheses = true })
    self:expect("rparen")
    return n
  elseif tok.type == "lbracket" then
    return self:parse_list()
  elseif tok.type == "lbrace" then
    return self:parse_dict()
  end
  self:fail(("unexpected %s"):format(V.str_repr(describe(tok))), tok)
end

-- Jinja 3.1 passes its extra end rules ("name:in" after a for target) to test_any as one
-- tuple, so they never match; only these three tokens end a tuple. `{% for x, in l %}`
-- is therefore an error there, and here.
function P:is_tuple_end()
  local ty = self.tok.type
  return ty == "variable_end" or ty == "block_end" or ty == "rparen"
end

-- o: simplified, with_condexpr, explicit_parentheses, with_namespace
function P:parse_tuple(o)
  o = o or {}
  local tok = self.tok
  local parse
  if o.simplified then
    parse = function() return self:parse_primary(o.with_namespace) end
  else
    parse = function() return self:parse_expression(o.with_condexpr) end
  end
  local args, is_tuple = {}, false
  while true do
    if #args > 0 then self:expect("comma") end
    if self:is_tuple_end() then break end
    args[#args + 1] = parse()
    if self.tok.type == "comma" then is_tuple = true else break end
  end
  if not is_tuple then
    if #args > 0 then return args[1] end
    if not o.explicit_parentheses then
      self:fail(("Expected an expression, got %s"):format(V.str_repr(describe(self.tok))))
    end
  end
  return node("Tuple", tok, { items = args })
end

function P:parse_list()
  local tok = self:expect("lbracket")
  local items = {}
  while self.tok.type ~= "rbracket" do
    if #items > 0 then self:expect("comma") end
    if self.tok.type == "rbracket" then break end
    items[#items + 1] = self:parse_expression()
  end
  self:expect("rbracket")
  return node("List", tok, { items = items })
end

function P:parse_dict()
  local tok = self:expect("lbrace")
  local keys, values = {}, {}
  while self.tok.type ~= "rbrace" do
    if #keys > 0 then self:expect("comma") end
    if self.tok.type == "rbrace" then break end
    keys[#keys + 1] = self:parse_expression()
    self:expect("colon")
    values[#values + 1] = self:parse_expression()
  end
  self:expect("rbrace")
  return node("Dict", tok, { keys = keys, values = values })
end

function P:parse_postfix(n)
  while true do
    local ty = self.tok.type
    if ty == "dot" or ty == "lbracket" then n = self:parse_subscript(n)
    elseif ty == "lparen" then n = self:parse_call(n)
    else break end
  end
  return n
end

function P:parse_filter_expr(n)
  while true do
    local ty = self.tok.type
    if ty == "pipe" then n = self:parse_filter(n)
    elseif ty == "name" and self.tok.value == "is" then n = self:parse_test(n)
    elseif ty == "lparen" then n = self:parse_call(n)
    else break end
  end
  return n
end

function P:parse_subscript(n)
  local tok = self:advance()
  if tok.type == "dot" then
    local attr = self:advance()
    if attr.type == "name" then return node("Getattr", tok, { node = n, attr = attr.value }) end
    if attr.type ~= "integer" then self:fail("expected name or number", attr) end
    return node("Getitem", tok, { node = n, arg = node("Const", attr, { value = attr.value }) })
  end
  local args = {}
  while self.tok.type ~= "rbracket" do
    if #args > 0 then self:expect("comma") end
    args[#args + 1] = self:parse_subscribed()
  end
  self:expect("rbracket")
  local arg = #args == 1 and args[1] or node("Tuple", tok, { items = args })
  return node("Getitem", tok, { node = n, arg = arg })
end

function P:parse_subscribed()
  local tok = self.tok
  local start
  if self.tok.type == "colon" then
    self:advance()
  else
    local e = self:parse_expression()
    if self.tok.type ~= "colon" then return e end
    self:advance()
    start = e
  end
  local stop, step
  if self.tok.type ~= "colon" and self.tok.type ~= "rbracket" and self.tok.type ~= "comma" then
    stop = self:parse_expression()
  end
  if self.tok.type == "colon" then
    self:advance()
    if self.tok.type ~= "rbracket" and self.tok.type ~= "comma" then step = self:parse_expression() end
  end
  return node("Slice", tok, { start = start, stop = stop, step = step })
end

-- ( args, name=value, *dyn_args, **dyn_kwargs )
function P:parse_call_args()
  local tok = self:expect("lparen")
  local args, kwargs = {}, {}
  local dyn_args, dyn_kwargs
  local require_comma = false
  local function ensure(ok) if not ok then self:fail("invalid syntax for function call expression", tok) end end
  while self.tok.type ~= "rparen" do
    if require_comma then
      self:expect("comma")
      if self.tok.type == "rparen" then break end
    end
    if self.tok.type == "mul" then
      ensure(dyn_args == nil and dyn_kwargs == nil)
      self:advance()
      dyn_args = self:parse_expression()
    elseif self.tok.type == "pow" then
      ensure(dyn_kwargs == nil)
      self:advance()
      dyn_kwargs = self:parse_expression()
    elseif self.tok.type == "name" and self:look().type == "assign" then
      ensure(dyn_kwargs == nil)
      local key = self:advance().value
      self:advance()
      kwargs[#kwargs + 1] = { name = key, value = self:parse_expression() }
    else
      ensure(dyn_args == nil and dyn_kwargs == nil and #kwargs == 0)
      args[#args + 1] = self:parse_expression()
    end
    require_comma = true
  end
  self:expect("rparen")
  return { args = args, kwargs = kwargs, dyn_args = dyn_args, dyn_kwargs = dyn_kwargs }
end

function P:parse_call(n)
  local tok = self.tok
  local c = self:parse_call_args()
  c.node = n
  return node("Call", tok, c)
end

local function no_args() return { args = {}, kwargs = {} } end

function P:parse_filter(n, start_inline)
  while self.tok.type == "pipe" or start_inline do
    if not start_inline then self:advance() end
    local tok = self:expect("name")
    local name = tok.value
    while self.tok.type == "dot" do
      self:advance()
      name = name .. "." .. self:expect("name").value
    end
    if not self.filters[name] then
      self:fail(("No filter named %s."):format(V.str_repr(name)), tok, "TemplateAssertionError")
    end
    local c = self.tok.type == "lparen" and self:parse_call_args() or no_args()
    c.node, c.name = n, name
    n = node("Filter", tok, c)
    start_inline = false
  end
  return n
end

local TEST_ARG_START = { name = true, string = true, integer = true, float = true,
  lparen = true, lbracket = true, lbrace = true }

function P:parse_test(n)
  local tok = self:advance()
  local negated = self:skip_if("name:not")
  local name_tok = self:expect("name")
  local name = name_tok.value
  while self.tok.type == "dot" do
    self:advance()
    name = name .. "." .. self:expect("name").value
  end
  if not self.tests[name] then
    self:fail(("No test named %s."):format(V.str_repr(name)), name_tok, "TemplateAssertionError")
  end
  local c
  if self.tok.type == "lparen" then
    c = self:parse_call_args()
  elseif TEST_ARG_START[self.tok.type] and not test_any(self.tok, { "name:else", "name:or", "name:and" }) then
    if test(self.tok, "name:is") then self:fail("You cannot chain multiple tests with is") end
    local arg = self:parse_postfix(self:parse_primary())
    c = { args = { arg }, kwargs = {} }
  else
    c = no_args()
  end
  c.node, c.name = n, name
  local t = node("Test", tok, c)
  if negated then t = node("Not", tok, { node = t }) end
  return t
end


return { Parser = P, node = node, test = test, test_any = test_any, describe_expr = describe_expr }
