-- Tokens -> syntax tree: the statements of jinja2.parser.Parser on top of the expression
-- parser in expr.lua, with the tags that transformers enables: the core statements,
-- {% break %}/{% continue %} (loopcontrols) and {% generation %}.
--
-- Statement nodes: Data, Print, If, For, Assign, AssignBlock, Macro, CallBlock,
-- FilterBlock, With, Scope, Break, Continue (fields as built below).
local V = require "loip.text.template.values"
local expr = require "loip.text.template.expr"

local M = {}

local P, node, test_any, describe_expr = expr.Parser, expr.node, expr.test_any, expr.describe_expr

local UNSUPPORTED_TAGS = { block = true, extends = true, include = true, import = true,
  from = true, autoescape = true }

-- Jinja's message for a tag that is unknown or closes the wrong block.
function P:fail_ut_eof(name, stack, tok)
  local expected = {}
  for _, exprs in ipairs(stack) do
    for _, e in ipairs(exprs) do expected[describe_expr(e)] = true end
  end
  local looking
  if #stack > 0 then
    local parts = {}
    for i, e in ipairs(stack[#stack]) do parts[i] = V.str_repr(describe_expr(e)) end
    looking = table.concat(parts, " or ")
  end
  local msg = { name and ("Encountered unknown tag " .. V.str_repr(name) .. ".") or "Unexpected end of template." }
  if looking then
    if name and expected[name] then
      msg[#msg + 1] = "You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " .. looking .. "."
    else
      msg[#msg + 1] = "Jinja was looking for the following tags: " .. looking .. "."
    end
  end
  if #self.tag_stack > 0 then
    msg[#msg + 1] = "The innermost block that needs to be closed is " .. V.str_repr(self.tag_stack[#self.tag_stack]) .. "."
  end
  self:fail(table.concat(msg, " "), tok)
end

function P:subparse(end_tokens)
  local body = {}
  if end_tokens then self.end_stack[#self.end_stack + 1] = end_tokens end
  while self.tok.type ~= "eof" do
    local tok = self.tok
    if tok.type == "data" then
      body[#body + 1] = node("Data", tok, { text = tok.value })
      self:advance()
    elseif tok.type == "variable_begin" then
      self:advance()
      body[#body + 1] = node("Print", tok, { expr = self:parse_tuple({ with_condexpr = true }) })
      self:expect("variable_end")
    elseif tok.type == "block_begin" then
      self:advance()
      if end_tokens and test_any(self.tok, end_tokens) then
        self.end_stack[#self.end_stack] = nil
        return body
      end
      local st = self:parse_statement()
      if st then body[#body + 1] = st end
      self:expect("block_end")
    else
      self:fail("internal parsing error")
    end
  end
  if end_tokens then self.end_stack[#self.end_stack] = nil end
  return body
end

-- Body up to one of end_tokens; the end tag's name is left current unless drop_needle.
function P:parse_statements(end_tokens, drop_needle)
  self:skip_if("colon")
  self:expect("block_end")
  local body = self:subparse(end_tokens)
  if self.tok.type == "eof" then
    local stack = { unpack(self.end_stack) }
    stack[#stack + 1] = end_tokens
    self:fail_ut_eof(nil, stack)
  end
  if drop_needle then self:advance() end
  return body
end

function P:parse_statement()
  local tok = self.tok
  if tok.type ~= "name" then self:fail("tag name expected", tok) end
  local name = tok.value
  local f = self["stmt_" .. name]
  if not f then
    if UNSUPPORTED_TAGS[name] then
      self:fail(("tag %s is not supported by this renderer (no template loader)"):format(V.str_repr(name)), tok)
    end
    self:fail_ut_eof(name, self.end_stack, tok)
  end
  self.tag_stack[#self.tag_stack + 1] = name
  local st = f(self)
  self.tag_stack[#self.tag_stack] = nil
  return st
end

function P:stmt_set()
  local tok = self:advance()
  local target = self:parse_assign_target({ with_namespace = true })
  if self:skip_if("assign") then
    return node("Assign", tok, { target = target, expr = self:parse_tuple() })
  end
  local filter = self:parse_filter(nil)
  local body = self:parse_statements({ "name:endset" }, true)
  return node("AssignBlock", tok, { target = target, filter = filter, body = body })
end

function P:stmt_for()
  local tok = self:expect("name:for")
  local target = self:parse_assign_target()
  self:expect("name:in")
  local iter = self:parse_tuple({ with_condexpr = false })
  local cond
  if self:skip_if("name:if") then cond = self:parse_expression() end
  local recursive = self:skip_if("name:recursive")
  self.loop_depth = self.loop_depth + 1
  local body = self:parse_statements({ "name:endfor", "name:else" })
  self.loop_depth = self.loop_depth - 1
  local else_
  if self:advance().value ~= "endfor" then
    else_ = self:parse_statements({ "name:endfor" }, true)
  end
  return node("For", tok, { target = target, iter = iter, body = body, else_ = else_,
    test = cond, recursive = recursive })
end

function P:stmt_if()
  local tok = self:expect("name:if")
  local result = node("If", tok, {})
  local cur = result
  while true do
    cur.test = self:parse_tuple({ with_condexpr = false })
    cur.body = self:parse_statements({ "name:elif", "name:else", "name:endif" })
    local t = self:advance()
    if t.value == "elif" then
      local nxt = node("If", self.tok, {})
      cur.else_ = { nxt }
      cur = nxt
    else
      if t.value == "else" then cur.else_ = self:parse_statements({ "name:endif" }, true) end
      break
    end
  end
  return result
end

function P:stmt_with()
  local tok = self:advance()
  local targets, values = {}, {}
  while self.tok.type ~= "block_end" do
    if #targets > 0 then self:expect("comma") end
    targets[#targets + 1] = self:parse_assign_target()
    self:expect("assign")
    values[#values + 1] = self:parse_expression()
  end
  local body = self:parse_statements({ "name:endwith" }, true)
  return node("With", tok, { targets = targets, values = values, body = body })
end

-- Does the subtree reference variable `name`? Decides whether a macro takes varargs,
-- kwargs or caller, as Jinja does.
local function references(n, name)
  if type(n) ~= "table" then return false end
  if n.k == "Name" and n.name == name then return true end
  for key, v in pairs(n) do
    if key ~= "k" and type(v) == "table" and references(v, name) then return true end
  end
  return false
end

function P:parse_signature()
  local args, defaults = {}, {}
  self:expect("lparen")
  while self.tok.type ~= "rparen" do
    if #args > 0 then self:expect("comma") end
    local arg = self:parse_assign_target({ name_only = true })
    if self:skip_if("assign") then
      defaults[#args + 1] = self:parse_expression()
    elseif next(defaults) then
      self:fail("non-default argument follows default argument")
    end
    args[#args + 1] = arg.name
  end
  self:expect("rparen")
  return args, defaults
end

local function macro_body(self, n, end_tag)
  local depth = self.loop_depth
  self.loop_depth = 0 -- break/continue do not cross a macro boundary
  n.body = self:parse_statements({ end_tag }, true)
  self.loop_depth = depth
  n.uses_varargs = references(n.body, "varargs")
  n.uses_kwargs = references(n.body, "kwargs")
  n.uses_caller = references(n.body, "caller")
  return n
end

function P:stmt_macro()
  local tok = self:advance()
  local n = node("Macro", tok, { name = self:parse_assign_target({ name_only = true }).name })
  n.args, n.defaults = self:parse_signature()
  return macro_body(self, n, "name:endmacro")
end

function P:stmt_call()
  local tok = self:advance()
  local n = node("CallBlock", tok, { name = "caller", args = {}, defaults = {} })
  if self.tok.type == "lparen" then n.args, n.defaults = self:parse_signature() end
  n.call = self:parse_expression()
  if n.call.k ~= "Call" then self:fail("expected call", tok) end
  return macro_body(self, n, "name:endcall")
end

function P:stmt_filter()
  local tok = self:advance()
  local filter = self:parse_filter(nil, true)
  return node("FilterBlock", tok, { filter = filter,
    body = self:parse_statements({ "name:endfilter" }, true) })
end

function P:stmt_print()
  local tok = self:advance()
  local items = {}
  while self.tok.type ~= "block_end" do
    if #items > 0 then self:expect("comma") end
    items[#items + 1] = self:parse_expression()
  end
  return node("Print", tok, { exprs = items })
end

-- {% generation %}: transformers' AssistantTracker; renders its body in its own scope.
function P:stmt_generation()
  local tok = self:advance()
  return node("Scope", tok, { body = self:parse_statements({ "name:endgeneration" }, true) })
end

local function loop_control(kind)
  return function(self)
    local tok = self:advance()
    if self.loop_depth == 0 then self:fail(("'%s' outside of a loop"):format(kind:lower()), tok) end
    return node(kind, tok)
  end
end
P.stmt_break = loop_control("Break")
P.stmt_continue = loop_control("Continue")

-- tokens, known filters and tests (name -> truthy) -> list of statements
function M.parse(toks, filters, tests)
  local self = setmetatable({ toks = toks, i = 1, tok = toks[1], tag_stack = {},
    end_stack = {}, loop_depth = 0, filters = filters, tests = tests }, P)
  return self:subparse(nil)
end

return M
