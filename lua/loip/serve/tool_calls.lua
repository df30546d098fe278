-- What the tool-call parsers (recipes/policies/tools/*.lua, policy kind "tools") share: a stream
-- machine that splits a model's output into content and call regions by the family's markers,
-- a JSON value scanner that keeps the model's own text of the arguments, call ids, and the GBNF
-- of a family's call syntax. A parser declares its markers and how a region becomes calls; the
-- machine makes both its whole-text parse and its incremental stream from that one declaration,
-- so streamed and whole-text results are the same however the text is split.
--
--   markers: { { open = "<tool_call>", close = "</tool_call>" },  -- a call region between two strings
--              { open = "[TOOL_CALLS]", json = true },             -- one JSON value after the marker
--              { open = "<|python_tag|>" },                        -- to the end of the output
--              { open = "{", keep = true, at_start = true },       -- only first (after spaces); open is the region's
--              { open = "<think>", close = "</think>", text = true } } -- content, where no call is looked for
--   calls(body, marker) -> { { name, arguments (JSON text) }, ... }, or nil: not a call (the region stays content)
local cjson = require "cjson"

local M = {}

-- A call id: "call_" and 24 random hex digits.
function M.call_id(prefix)
  local f = io.open("/dev/urandom", "rb")
  local b = f:read(12)
  f:close()
  return (prefix or "call_") .. (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function skip_ws(s, i)
  return (s:find("[^ \t\r\n]", i)) or #s + 1
end
M.skip_ws = skip_ws

-- The end of the JSON value starting at s[i] (spaces skipped): its last index; nil when s ends
-- first (it may still come), false when it cannot be JSON. Only the brackets and strings are
-- followed here; the value is checked by decoding it.
function M.scan_value(s, i)
  i = skip_ws(s, i)
  local c = s:sub(i, i)
  if c == "" then return nil end
  if c == '"' then
    local j = i + 1
    while true do
      local k = s:find('[\\"]', j)
      if not k then return nil end
      if s:sub(k, k) == '"' then return k end
      j = k + 2
    end
  elseif c == "{" or c == "[" then
    local depth, j = 0, i
    while true do
      local k = s:find('[][{}"]', j)
      if not k then return nil end
      local ch = s:sub(k, k)
      if ch == '"' then
        local e = M.scan_value(s, k)
        if not e then return e end
        j = e + 1
      else
        depth = depth + ((ch == "{" or ch == "[") and 1 or -1)
        if depth == 0 then return k end
        j = k + 1
      end
    end
  end
  if not c:match("[-%dtfn]") then return false end
  local lit = s:match("^[-+%w%.]+", i)
  if i + #lit > #s then return nil end -- a number or word may go on
  return i + #lit - 1
end

-- The same, resumable over a text that grows (a stream's region): st = {} at first, then the
-- same table each time s has grown; the work done is kept, so a value of n bytes costs O(n) however
-- it comes. A value that is not an object or array is scanned whole each time (it is short).
function M.scan_more(s, st)
  local i = st.pos or 1
  if not st.depth then
    i = skip_ws(s, i)
    local c = s:sub(i, i)
    if c ~= "{" and c ~= "[" then st.pos = i return M.scan_value(s, i) end
    st.depth, i = 1, i + 1
  end
  while true do
    if st.instr then
      local k = s:find('[\\"]', i)
      if not k then st.pos = #s + 1 return nil end
      if s:sub(k, k) == '"' then st.instr, i = false, k + 1
      elseif k == #s then st.pos = k return nil -- (the escaped character is still to come)
      else i = k + 2 end
    else
      local k = s:find('[][{}"]', i)
      if not k then st.pos = #s + 1 return nil end
      local ch = s:sub(k, k)
      if ch == '"' then st.instr = true
      elseif ch == "{" or ch == "[" then st.depth = st.depth + 1
      else
        st.depth = st.depth - 1
        if st.depth == 0 then return k end
      end
      i = k + 1
    end
  end
end

-- A JSON object's members in their order: { { key, raw value text } }, or nil when s[i..] is not
-- one complete object (then also the index after it on success).
function M.members(s, i)
  i = skip_ws(s, i or 1)
  if s:sub(i, i) ~= "{" then return nil end
  local out = {}
  i = skip_ws(s, i + 1)
  if s:sub(i, i) == "}" then return out, i + 1 end
  while true do
    local ke = M.scan_value(s, i)
    if not ke or s:sub(i, i) ~= '"' then return nil end
    local ok, key = pcall(cjson.decode, s:sub(i, ke))
    if not ok then return nil end
    i = skip_ws(s, ke + 1)
    if s:sub(i, i) ~= ":" then return nil end
    local vs = skip_ws(s, i + 1)
    local ve = M.scan_value(s, vs)
    if not ve then return nil end
    local raw = s:sub(vs, ve)
    if not pcall(cjson.decode, raw) then return nil end
    out[#out + 1] = { key, raw }
    i = skip_ws(s, ve + 1)
    local c = s:sub(i, i)
    if c == "}" then return out, i + 1 end
    if c ~= "," then return nil end
    i = skip_ws(s, i + 1)
  end
end

-- One call object's name and arguments' text ({"name": ..., "<args_key>": {...}}; arguments
-- given as a JSON string holding an object are taken too), or nil.
function M.call_of(raw, args_keys)
  local mem = M.members(raw)
  if not mem then return nil end
  local name, args
  for _, kv in ipairs(mem) do
    if kv[1] == "name" then name = cjson.decode(kv[2])
    else
      for _, k in ipairs(args_keys) do if kv[1] == k then args = kv[2] end end
    end
  end
  if type(name) ~= "string" or name == "" then return nil end
  if args and args:sub(1, 1) == '"' then
    args = cjson.decode(args)
    if not M.members(args) then return nil end
  end
  if args and args:sub(1, 1) ~= "{" then return nil end
  return { name = name, arguments = args or "{}" }
end

-- JSON values one after another in s, with spaces and at most one `sep` (a string, e.g. ";")
-- between two: their raw texts, or nil when s is anything else.
function M.values(s, sep)
  local out, i = {}, skip_ws(s, 1)
  while i <= #s do
    local e = M.scan_value(s, i)
    if not e then return nil end
    out[#out + 1] = s:sub(i, e)
    i = skip_ws(s, e + 1)
    if sep and s:sub(i, i + #sep - 1) == sep then i = skip_ws(s, i + #sep) end
  end
  return out
end

-- The calls of a region holding call objects one after another (with spaces and at most one
-- `sep` between two; a JSON array of them when array is true), or nil when it holds anything
-- else (the region then stays content). args_keys: the names the arguments may go by.
function M.call_list(body, args_keys, sep, array)
  if array then
    local s = body:match("^%s*%[(.*)%]%s*$")
    if s then body, sep = s, "," end
  end
  local raws = M.values(body, sep)
  if not raws or #raws == 0 then return nil end
  local out = {}
  for i, raw in ipairs(raws) do
    out[i] = M.call_of(raw, args_keys)
    if not out[i] then return nil end
  end
  return out
end

-- The stream machine's state (M.stream): the parser p and opts, text not yet placed (buf), the
-- marker of the region being read (mode) and the region so far, the region's JSON scan and
-- where its closing string is looked for next, whether content was shown and the spaces held
-- back, the calls so far; and what the current put or finish gives (text_out, deltas, parts).
local Stream = {}
Stream.__index = Stream

function Stream:show(t)
  if t == "" then return end
  local body, tail = t:match("^(.-)(%s*)$")
  if body ~= "" then
    self.text_out[#self.text_out + 1] = self.spaces .. body
    self.parts[#self.parts + 1] = self.spaces .. body
    self.spaces, self.shown = "", true
  end
  self.spaces = self.spaces .. tail
end

function Stream:add_calls(list)
  local calls, deltas = self.st.calls, self.deltas
  for _, c in ipairs(list) do
    if self.opts.parallel == false and #calls >= 1 then break end
    local idx = #calls
    local call = { id = M.call_id(self.opts.id_prefix), name = c.name, arguments = c.arguments }
    calls[idx + 1] = call
    deltas[#deltas + 1] = { index = idx, id = call.id, type = "function", ["function"] = { name = c.name, arguments = "" } }
    deltas[#deltas + 1] = { index = idx, ["function"] = { arguments = c.arguments } }
    self.parts[#self.parts + 1] = idx
  end
end

-- a finished region (body without its markers): calls, or back to content as it was written
function Stream:close_region(m, body, closing)
  local list = self.p.calls(body, m)
  if list and #list > 0 then self:add_calls(list)
  else self:show((m.keep and "" or m.open) .. body .. (closing or "")) end
end

-- The first marker opening in buf: its position and the marker.
function Stream:earliest()
  local at, which
  local buf = self.buf
  for _, m in ipairs(self.p.markers) do
    local i = buf:find(m.open, 1, true)
    if i and m.at_start and (self.shown or not buf:sub(1, i - 1):match("^%s*$")) then i = nil end
    if i and (not at or i < at) then at, which = i, m end
  end
  return at, which
end

-- the longest tail of s that a string of list begins with (and is not all of it): what a stream
-- holds back, since it may be the start of a marker (harmony's parser uses it too)
local function tail_len(s, opens)
  for k = math.min(#s, 64), 1, -1 do
    local tail = s:sub(-k)
    for _, o in ipairs(opens) do
      if #o > k and o:sub(1, k) == tail then return k end
    end
  end
  return 0
end

-- Content: up to the next marker (a region starts there: true), else all that cannot begin
-- one shown (false: wait for more).
function Stream:content()
  local at, m = self:earliest()
  if at then
    self:show(self.buf:sub(1, at - 1))
    self.mode, self.region = m, m.keep and m.open or ""
    self.scan, self.searched = {}, 1
    self.buf = self.buf:sub(at + #m.open)
    if m.text then self:show(m.open) end
    return true
  end
  local opens = {}
  for _, mk in ipairs(self.p.markers) do
    if not mk.at_start or not self.shown then opens[#opens + 1] = mk.open end
  end
  local cut = #self.buf - tail_len(self.buf, opens)
  self:show(self.buf:sub(1, cut))
  self.buf = self.buf:sub(cut + 1)
  return false
end

-- Inside a region: to its end when it is here (true: content follows), else false (wait).
function Stream:in_region()
  self.region, self.buf = self.region .. self.buf, ""
  local m, region = self.mode, self.region
  if m.close then
    local i = region:find(m.close, self.searched, true)
    if i then
      local body, rest = region:sub(1, i - 1), region:sub(i + #m.close)
      if m.text then self:show(body .. m.close) else self:close_region(m, body, m.close) end
      self.mode, self.region, self.buf = nil, "", rest
      return true
    elseif m.text then -- shown as it comes, less what may begin the closing string
      local cut = #region - tail_len(region, { m.close })
      self:show(region:sub(1, cut))
      self.region = region:sub(cut + 1)
      return false
    end
    self.searched = math.max(1, #region - #m.close + 2)
    return false
  elseif m.json then
    local e = M.scan_more(region, self.scan)
    if e == false then -- not JSON: the marker was content
      self:show(m.open)
      self.mode, self.buf, self.region = nil, region, ""
      return true
    elseif e then
      local body, rest = region:sub(1, e), region:sub(e + 1)
      self:close_region(m, body)
      self.mode, self.region, self.buf = nil, "", rest
      return true
    end
    return false
  end
  return false -- to the end of the output
end

function Stream:run()
  while true do
    local more
    if not self.mode then more = self:content() else more = self:in_region() end
    if not more then return end
  end
end

function Stream:put(piece)
  self.text_out, self.deltas, self.parts = {}, {}, {}
  self.buf = self.buf .. piece
  self:run()
  return table.concat(self.text_out), self.deltas, self.parts
end

function Stream:finish()
  self.text_out, self.deltas, self.parts = {}, {}, {}
  self:run()
  if self.mode then
    if self.mode.text then self:show(self.region .. self.buf) else self:close_region(self.mode, self.region .. self.buf) end
    self.mode, self.region, self.buf = nil, "", ""
  else self:show(self.buf) self.buf = "" end
  if #self.st.calls == 0 and self.spaces ~= "" then
    self.text_out[#self.text_out + 1], self.parts[#self.parts + 1] = self.spaces, self.spaces
  end
  self.spaces = ""
  return table.concat(self.text_out), self.deltas, self.parts
end

-- The stream machine over a parser p (p.markers, p.calls). Returns { put(piece) -> text, deltas,
-- parts; finish() -> the same; calls (all so far: { id, name, arguments }) }, deltas in OpenAI's
-- streamed shape (a call's first delta carries its id, type and name, then its arguments), parts
-- the text and calls in the order they came (strings, and calls' 0-based indices).
-- Text that may begin a marker is held back; spaces are held until more content follows them,
-- and dropped at the end when calls were made (content null, as OpenAI gives it).
-- calls ({ id, name, arguments } each) in OpenAI's message.tool_calls shape; nil when none.
function M.openai_calls(calls)
  if #calls == 0 then return nil end
  local out = {}
  for i, c in ipairs(calls) do out[i] = { id = c.id, type = "function", ["function"] = { name = c.name, arguments = c.arguments } } end
  return out
end

function M.stream(p, opts)
  local st = { calls = {} }
  local sm = setmetatable({ p = p, opts = opts or {}, st = st, buf = "", mode = nil, region = "", scan = {}, searched = 1,
    shown = false, spaces = "" }, Stream)
  -- the calls so far in OpenAI's message.tool_calls shape, nil when none
  function st.tool_calls() return M.openai_calls(st.calls) end
  function st.put(piece) return sm:put(piece) end
  function st.finish() return sm:finish() end
  return st
end

-- A whole text: content (nil when there is none beside calls) and calls ({ id, type, function =
-- { name, arguments } }, OpenAI's message.tool_calls), through the same machine.
function M.parse(p, text, opts)
  local st = M.stream(p, opts)
  local content = st.put(text) .. st.finish()
  local calls = st.tool_calls() or {}
  if #calls > 0 and content:match("^%s*$") then content = nil end
  return content, calls
end

-- ---- GBNF (llama.cpp's grammar format) of a family's call syntax -----------------------------

-- A GBNF string literal of s.
function M.gbnf_literal(s)
  return '"' .. s:gsub('[\\"\n\r\t]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }) .. '"'
end

-- GBNF text with every rule it defines renamed prefix .. name (its references too; literals,
-- character classes and comments untouched), so that several grammars live in one.
function M.gbnf_rename(text, prefix)
  local defined = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local name = line:match("^%s*([%w_%-]+)%s*::=")
    if name then defined[name] = true end
  end
  local out, i, n = {}, 1, #text
  while i <= n do
    local c = text:sub(i, i)
    local j
    if c == '"' or c == "[" then -- a literal or a class: to its unescaped end
      local close = c == '"' and '"' or "]"
      j = i + 1
      while j <= n do
        local d = text:sub(j, j)
        if d == "\\" then j = j + 1 elseif d == close then break end
        j = j + 1
      end
      out[#out + 1] = text:sub(i, j)
    elseif c == "#" then
      j = (text:find("\n", i, true) or n + 1) - 1
      out[#out + 1] = text:sub(i, j)
    else
      local word = text:match("^[%w_%-]+", i)
      if word then
        j = i + #word - 1
        out[#out + 1] = defined[word] and prefix .. word or word
      else
        j = i
        out[#out + 1] = c
      end
    end
    i = j + 1
  end
  return table.concat(out)
end

-- A parser's parse, stream and grammar made from its markers, calls and call syntax (M.syntax,
-- as gbnf_calls takes it), where the file does not write its own. Returns M.
function M.family(p)
  p.parse = p.parse or function(text) return M.parse(p, text) end
  p.stream = p.stream or function(opts) return M.stream(p, opts) end
  p.grammar = p.grammar or function(req) return M.gbnf_calls(req, p.syntax) end
  return p
end

-- The GBNF of calls in a family's syntax: root ::= open call (sep call)* close, each call
-- {"<name_key>": "NAME", "<args_key>": ARGS} with ARGS the function's parameters' schema as
-- schema_gbnf(schema, where) gives it (GBNF text of one JSON value, its start rule `root`).
-- req: { tools (OpenAI's, checked), choice ("required", "auto" or { name }), parallel,
-- schema_gbnf }; syntax: { open, sep, close, name_key, args_key }.
function M.gbnf_calls(req, syntax)
  local rules, alts = {}, {}
  for i, t in ipairs(req.tools) do
    local f = t["function"]
    if type(req.choice) ~= "table" or req.choice.name == f.name then
      local prefix = "tool" .. (i - 1) .. "-"
      local where = string.format("tools[%d].function.parameters", i - 1)
      local args = req.schema_gbnf(f.parameters or { type = "object" }, where)
      local head = string.format('{"%s": %s, "%s": ', syntax.name_key or "name", cjson.encode(f.name), syntax.args_key or "arguments")
      alts[#alts + 1] = prefix .. "call"
      rules[#rules + 1] = string.format("%scall ::= %s %sroot %s", prefix, M.gbnf_literal(head), prefix, M.gbnf_literal("}"))
      rules[#rules + 1] = M.gbnf_rename(args, prefix)
    end
  end
  if #alts == 0 then error("tool_choice names no tool of tools", 2) end
  local open, sep, close = M.gbnf_literal(syntax.open or ""), M.gbnf_literal(syntax.sep or ""), M.gbnf_literal(syntax.close or "")
  local root = req.parallel ~= false and string.format("root ::= %s call (%s call)* %s", open, sep, close)
    or string.format("root ::= %s call %s", open, close)
  return table.concat({ root, "call ::= " .. table.concat(alts, " | "), table.concat(rules, "\n") }, "\n") .. "\n"
end

M.tail_len = tail_len
return M
