-- Chat-template renderer: a Jinja2 interpreter in Lua that renders Hugging Face chat
-- templates exactly as transformers' apply_chat_template(tokenize=False) does, i.e. with
-- jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
-- extensions=[loopcontrols, generation]), transformers' `tojson`, `raise_exception` and
-- `strftime_now` (transformers' chat template environment).
--
--   local template = require "loip.text.template"
--   local out, err = template.render(text, { messages = msgs, add_generation_prompt = true })
--   local t = assert(template.compile(text)); t:render(vars, { now = os.time() })
--
-- Pieces, under template/: lexer.lua (source -> tokens, whitespace control), expr.lua and
-- parser.lua (tokens -> tree: expressions, statements), runtime.lua (the interpreter),
-- values.lua (Python semantics of values), text.lua (str in code points), methods.lua
-- (attribute access, str/dict/list methods), format.lua (% and str.format), filters.lua,
-- builtins.lua (tests, globals), json.lua (ordered decoding, Python's json.dumps).
--
-- Value model (what a template sees, and what callers may pass in `vars`):
--   None        template.null (the cjson.null sentinel). Lua nil never appears inside a
--               value; a nil entry of `vars` means "not passed", i.e. undefined.
--   bool, str   Lua booleans and strings (UTF-8; lengths and indices count code points).
--   int, float  Lua numbers: integral values are ints, others floats. A float with an
--               integral value (JSON 1.0, 4/2) is boxed as { v = 2.0 } with the Float
--               metatable so that it prints as "2.0"; arithmetic handles both.
--   list, tuple Arrays with the List / Tuple metatables (values.lua).
--   dict        Ordered: { keys = {k1, k2, …}, vals = {[k] = v} } with the Dict metatable;
--               `tojson`, `items()` and iteration follow insertion order.
--   Plain Lua tables passed in are converted: a table whose keys are 1..n is a list (an
--   empty table a dict, unless it carries cjson's array metatable), any other table a dict
--   with its keys sorted (Lua tables have no order: build ordered input with
--   template.ordered_decode or template.dict). Lua functions become callables that get
--   their positional arguments as plain Lua values, and keyword arguments as a trailing
--   table when there are any.
--   Undefined   The value of a missing name, attribute or key: prints as "", is false,
--               iterates as empty; any other use raises UndefinedError, as Jinja's default
--               Undefined does (so `foo.bar` raises when foo itself is undefined).
--
-- Errors: render/compile return nil, message, info. For raise_exception(msg) the message is
-- exactly msg (transformers' TemplateError). Otherwise it is "<Type> at line L[, column C]:
-- <Jinja's message>", e.g. "TemplateSyntaxError at line 3, column 9: unexpected '}'" or
-- "UndefinedError at line 5: 'foo' is undefined". info = { type =, message =, line =,
-- column = } (plus traceback for an internal error).
--
--   Markup      What |safe and |escape return ({ s = text }, Markup metatable). Autoescape
--               is off as in transformers, but Jinja still escapes the plain operand of
--               `Markup + str` and `Markup % args`, and some templates show it.
--
-- Left out on purpose: template inheritance and loading ({% extends %}, {% block %},
-- {% include %}, {% import %}: nothing to load from), autoescaping, line statements, the
-- `do` extension, async, the lipsum/urlize/wordwrap/xmlattr/filesizeformat/urlencode
-- filters. Python ints are doubles here (exact to 2^53). Case mapping covers ASCII,
-- Latin-1, Greek and Cyrillic. Macro calls nest at most 200 deep (Jinja: Python's
-- recursion limit).
local V = require "loip.text.template.values"
local convert = require "loip.text.template.convert"
local lexer = require "loip.text.template.lexer"
local parser = require "loip.text.template.parser"
local runtime = require "loip.text.template.runtime"
local filters = require "loip.text.template.filters"
local builtins = require "loip.text.template.builtins"
local json = require "loip.text.template.json"

local M = {}

M.null = V.null

-- JSON text -> template value with key order and int/float kept; nil, message on bad JSON.
M.ordered_decode = json.decode

-- An ordered dict from { {key, value}, ... } (values are imported like `vars`).
function M.dict(pairs_)
  local d = V.dict()
  for _, p in ipairs(pairs_) do V.dict_set(d, p[1], convert.import(p[2])) end
  return d
end

-- A list, even when empty (a plain empty table would be taken for a dict).
function M.list(items)
  local l = V.list()
  for i, v in ipairs(items or {}) do l[i] = convert.import(v) end
  return l
end

-- Python's json.dumps of a template value (the `tojson` filter): opts as its keywords.
M.tojson = json.dumps

local function describe(e)
  if getmetatable(e) ~= V.Err then
    local msg = tostring(e)
    return "internal error: " .. msg, { type = "InternalError", message = msg }
  end
  local info = { type = e.type, message = e.message, line = e.line, column = e.column }
  if e.type == "TemplateError" then return e.message, info end
  local where = ""
  if e.line then
    where = " at line " .. e.line
    if e.column then where = where .. ", column " .. e.column end
  end
  return e.type .. where .. ": " .. e.message, info
end

local Template = {}
Template.__index = Template

-- Template text -> compiled template, or nil, message, info on a syntax error.
function M.compile(source)
  if type(source) ~= "string" then error("template.compile: template text must be a string", 2) end
  local ok, body = pcall(function()
    return parser.parse(lexer.tokenize(source), filters, builtins.tests)
  end)
  if not ok then return nil, describe(body) end
  return setmetatable({ body = body }, Template)
end

-- vars: name -> value (see the value model above). opts.now: the clock for strftime_now, an
-- os.time() value or a function returning one (default: the current time).
function Template:render(vars, opts)
  if vars ~= nil and type(vars) ~= "table" then error("template:render: vars must be a table", 2) end
  opts = opts or {}
  local now = opts.now
  local rt = { filters = filters, tests = builtins.tests, line = nil,
    now = type(now) == "function" and now or function() return now or os.time() end }
  local ok, res = xpcall(function()
    local scope = { vars = {}, parent = { vars = builtins.globals(rt) } }
    for name, v in pairs(vars or {}) do scope.vars[name] = convert.import(v, name) end
    return runtime.render(rt, self.body, scope)
  end, function(e)
    if getmetatable(e) == V.Err then
      e.line = e.line or rt.line
      return e
    end
    return { internal = tostring(e), traceback = debug.traceback(tostring(e), 2) }
  end)
  if ok then return res end
  if res.internal then
    return nil, "internal error: " .. res.internal,
      { type = "InternalError", message = res.internal, traceback = res.traceback }
  end
  return nil, describe(res)
end

-- Compile and render in one go: string, or nil, message, info.
function M.render(source, vars, opts)
  local t, err, info = M.compile(source)
  if not t then return nil, err, info end
  return t:render(vars, opts)
end

return M
