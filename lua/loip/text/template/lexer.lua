-- Template source -> tokens, following jinja2.lexer.Lexer.tokeniter with the settings that
-- transformers uses: trim_blocks (drop the first newline after a block or comment tag),
-- lstrip_blocks (drop spaces and tabs between a line start and a block or comment tag),
-- keep_trailing_newline=False, default delimiters. The rules below are Jinja's regexes
-- written out by hand; their order matters and mirrors the original.
local V = require "loip.text.template.values"
local text = require "loip.text.template.text"

local M = {}

local byte, sub, find = string.byte, string.sub, string.find

local TWO_CHAR_OPS = { ["**"] = "pow", ["//"] = "floordiv", ["=="] = "eq", ["!="] = "ne",
  [">="] = "gteq", ["<="] = "lteq" }
local ONE_CHAR_OPS = { ["+"] = "add", ["-"] = "sub", ["/"] = "div", ["*"] = "mul",
  ["%"] = "mod", ["~"] = "tilde", ["["] = "lbracket", ["]"] = "rbracket", ["("] = "lparen",
  [")"] = "rparen", ["{"] = "lbrace", ["}"] = "rbrace", [">"] = "gt", ["<"] = "lt",
  ["="] = "assign", ["."] = "dot", [":"] = "colon", ["|"] = "pipe", [","] = "comma",
  [";"] = "semicolon" }
local CLOSER = { ["{"] = "}", ["("] = ")", ["["] = "]" }
local OPENS = { lbrace = true, lparen = true, lbracket = true }
local CLOSES = { rbrace = true, rparen = true, rbracket = true }

-- Python's str.rstrip() / `\s`: Unicode whitespace, not just ASCII.
local function rstrip(s) return text.strip(s, nil, false, true) end
local function is_all_space(s)
  return s ~= "" and text.strip(s, nil, true, false) == ""
end

-- Python "unicode-escape" decoding of a string literal's body. Unknown escapes keep their
-- backslash, as Python does.
local SIMPLE_ESC = { n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ["'"] = "'", ['"'] = '"',
  a = "\a", b = "\b", f = "\f", v = "\v", ["\n"] = "" }

local function unescape(s, fail)
  if not find(s, "\\", 1, true) then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local j = find(s, "\\", i, true)
    if not j then out[#out + 1] = sub(s, i) break end
    out[#out + 1] = sub(s, i, j - 1)
    local c = sub(s, j + 1, j + 1)
    if SIMPLE_ESC[c] then
      out[#out + 1] = SIMPLE_ESC[c]
      i = j + 2
    elseif find(c, "^[0-7]$") then
      local oct = s:match("^[0-7][0-7]?[0-7]?", j + 1)
      out[#out + 1] = text.from_cp(tonumber(oct, 8))
      i = j + 1 + #oct
    elseif c == "x" or c == "u" or c == "U" then
      local width = c == "x" and 2 or c == "u" and 4 or 8
      local hex = sub(s, j + 2, j + 1 + width)
      if #hex < width or not find(hex, "^%x+$") then
        fail(c == "x" and "truncated \\xXX escape" or
          c == "u" and "truncated \\uXXXX escape" or "truncated \\UXXXXXXXX escape")
      end
      local cp = tonumber(hex, 16)
      if cp > 0x10FFFF then fail("illegal Unicode character") end
      out[#out + 1] = text.from_cp(cp)
      i = j + 2 + width
    elseif c == "N" then
      fail("\\N{...} escapes are not supported")
    elseif c == "" then
      fail("\\ at end of string")
    else
      out[#out + 1] = "\\"
      i = j + 1
    end
  end
  return table.concat(out)
end

-- `(\d+_)*\d+` starting at p: end position or nil.
local function digits(src, p)
  local _, b = find(src, "^%d+", p)
  if not b then return nil end
  while byte(src, b + 1) == 95 and find(src, "^%d", b + 2) do
    _, b = find(src, "^%d+", b + 2)
  end
  return b
end

-- Integer literal at p (binary, octal, hex, decimal): end position and value, or nil.
local function integer_at(src, p)
  local prefix = sub(src, p, p + 1):lower()
  local base, class = nil, nil
  if prefix == "0b" then base, class = 2, "[01]"
  elseif prefix == "0o" then base, class = 8, "[0-7]"
  elseif prefix == "0x" then base, class = 16, "%x" end
  if base then
    local q, body = p + 2, {}
    while true do
      local u = byte(src, q) == 95 and 1 or 0
      local d = sub(src, q + u, q + u)
      if d == "" or not find(d, "^" .. class) then break end
      body[#body + 1] = d
      q = q + u + 1
    end
    if #body > 0 then return q - 1, tonumber(table.concat(body), base) end
  end
  local c = byte(src, p)
  if not c or c < 48 or c > 57 then return nil end
  local q = p + 1
  -- [1-9](_?\d)*  or  0(_?0)*
  local class1 = c == 48 and "0" or "%d"
  while true do
    local u = byte(src, q) == 95 and 1 or 0
    if not find(sub(src, q + u, q + u), "^" .. class1) then break end
    q = q + u + 1
  end
  return q - 1, tonumber((sub(src, p, q - 1):gsub("_", "")))
end

-- Float literal at p (Jinja's float_re, including "not after a dot"): end and value, or nil.
local function float_at(src, p)
  if p > 1 and byte(src, p - 1) == 46 then return nil end
  local e = digits(src, p)
  if not e then return nil end
  local frac_end
  if byte(src, e + 1) == 46 then frac_end = digits(src, e + 2) end
  local after = frac_end or e
  local exp_end
  local x = byte(src, after + 1)
  if x == 101 or x == 69 then
    local q = after + 2
    local sgn = byte(src, q)
    if sgn == 43 or sgn == 45 then q = q + 1 end
    exp_end = digits(src, q)
  end
  local stop = exp_end or frac_end
  if not stop then return nil end
  return stop, V.float(V.decimal((sub(src, p, stop):gsub("_", ""))))
end

-- The token inside a tag at p (not whitespace, not the tag's end): type, value, and the
-- position of its last byte. Rules in Jinja's order: float, integer, name, string, operator.
local function scan_token(src, p, fail)
  local e, v = float_at(src, p)
  if e then return "float", v, e end
  e, v = integer_at(src, p)
  if e then return "integer", v, e end
  local _, ne = find(src, "^[%a_\128-\255][%w_\128-\255]*", p)
  if ne then return "name", sub(src, p, ne), ne end
  local c = sub(src, p, p)
  if c == "'" or c == '"' then
    local class = c == "'" and "['\\]" or '["\\]'
    local q = p + 1
    while true do
      local close = find(src, class, q)
      if not close then break end -- no closing quote: Jinja's string rule does not match
      if sub(src, close, close) ~= "\\" then
        return "string", unescape(sub(src, p + 1, close - 1), function(msg) fail(msg, p) end), close
      end
      q = close + 2
    end
  else
    local two = sub(src, p, p + 1)
    if TWO_CHAR_OPS[two] then return TWO_CHAR_OPS[two], two, p + 1 end
    if ONE_CHAR_OPS[c] then return ONE_CHAR_OPS[c], c, p end
  end
  fail(("unexpected char %s at %d"):format(V.str_repr(text.chars(sub(src, p, p + 3))[1]), p - 1), p)
end

-- A template being tokenized: its source (n bytes), the tokens so far, the line and column of
-- byte positions (advanced incrementally: positions only grow) and `line_starting`: the previous
-- match ended with a newline (Jinja's flag of the same name).
local Lexer = {}
Lexer.__index = Lexer

function Lexer:where(p)
  local source = self.source
  while true do
    local nl = find(source, "\n", self.cur_pos, true)
    if not nl or nl >= p then break end
    self.cur_line, self.line_start, self.cur_pos = self.cur_line + 1, nl + 1, nl + 1
  end
  if p > self.cur_pos then self.cur_pos = p end
  return self.cur_line, p - self.line_start + 1
end

function Lexer:fail(msg, p)
  local line, col = self:where(p)
  V.raise("TemplateSyntaxError", msg, line, col)
end

function Lexer:emit(ttype, value, p)
  local line, col = self:where(p)
  self.toks[#self.toks + 1] = { type = ttype, value = value, line = line, col = col }
end

-- Data before a tag, with `-` stripping or lstrip_blocks applied.
function Lexer:data_before(p, stop, sign, is_variable)
  local s = sub(self.source, p, stop)
  if sign == "-" then
    s = rstrip(s)
  elseif sign ~= "+" and not is_variable then
    local l_pos = 1
    local nl = s:match(".*()\n")
    if nl then l_pos = nl + 1 end
    if (nl or self.line_starting) and is_all_space(sub(s, l_pos)) then s = sub(s, 1, l_pos - 1) end
  end
  if s ~= "" then self:emit("data", s, p) end
end

-- `\s*` after a `-%}` style end: returns the position after the whitespace.
local SPACE = text.SPACE
function Lexer:skip_space(p)
  local source, n = self.source, self.n
  while p <= n do
    local b = byte(source, p)
    local w = b < 0x80 and 1 or b >= 0xF0 and 4 or b >= 0xE0 and 3 or 2
    if not SPACE[w == 1 and b or text.cp(sub(source, p, p + w - 1))] then break end
    p = p + w
  end
  return p
end

-- {% raw %} opening at s, its tag's words from after: the position its body starts at, or nil
-- when the tag is another (trim_blocks does not apply to the opening tag).
function Lexer:raw_body(after)
  local source = self.source
  local _, b = find(source, "^%s*raw%s*", after)
  if b then
    if sub(source, b + 1, b + 3) == "-%}" then return self:skip_space(b + 4)
    elseif sub(source, b + 1, b + 2) == "%}" then return b + 3 end
  end
end

-- A raw block's body from raw_body (its tag at s) to its {% endraw %}, as data: the position
-- after it.
function Lexer:raw(s, raw_body)
  local source = self.source
  local q, stop, body_end, esign = raw_body, nil, nil, nil
  while true do
    local a = find(source, "{%", q, true)
    if not a then self:fail("Missing end of raw directive", s) end
    local sg = sub(source, a + 2, a + 2)
    if sg ~= "-" and sg ~= "+" then sg = "" end
    local _, b = find(source, "^%s*endraw%s*", a + 2 + #sg)
    if b then
      if sub(source, b + 1, b + 3) == "+%}" then stop = b + 4
      elseif sub(source, b + 1, b + 3) == "-%}" then stop = self:skip_space(b + 4)
      elseif sub(source, b + 1, b + 2) == "%}" then
        stop = b + 3
        if byte(source, stop) == 10 then stop = stop + 1 end
      end
      if stop then body_end, esign = a - 1, sg break end
    end
    q = a + 1
  end
  self.line_starting = byte(source, raw_body - 1) == 10
  self:data_before(raw_body, body_end, esign, false)
  self.line_starting = byte(source, stop - 1) == 10
  return stop
end

-- A comment tag at s (its words from after): the position after it.
function Lexer:comment(s, after)
  local source = self.source
  local j = find(source, "#}", after, true)
  if not j then self:fail("Missing end of comment tag", s) end
  local stop = j + 2
  local before = j > after and sub(source, j - 1, j - 1) or ""
  if before == "-" then stop = self:skip_space(stop)
  elseif before ~= "+" and byte(source, stop) == 10 then stop = stop + 1 end
  self.line_starting = byte(source, stop - 1) == 10
  return stop
end

-- The end of a block (is_block) or variable tag at pos: the position after it (and the
-- whitespace its sign strips), or nil when none is there.
function Lexer:tag_end(pos, is_block)
  local source = self.source
  if is_block then
    if sub(source, pos, pos + 2) == "+%}" then return pos + 3
    elseif sub(source, pos, pos + 2) == "-%}" then return self:skip_space(pos + 3)
    elseif sub(source, pos, pos + 1) == "%}" then
      local stop = pos + 2
      if byte(source, stop) == 10 then stop = stop + 1 end
      return stop
    end
  else
    if sub(source, pos, pos + 2) == "-}}" then return self:skip_space(pos + 3)
    elseif sub(source, pos, pos + 1) == "}}" then return pos + 2 end
  end
end

-- A block or variable tag at s (its words from after): its tokens, then the position after it.
function Lexer:tag(s, kind, after)
  local source, n = self.source, self.n
  local is_block = kind == "%"
  self:emit(is_block and "block_begin" or "variable_begin", sub(source, s, after - 1), s)
  local pos = after
  local balance = {}
  local function fail(msg, p) self:fail(msg, p) end
  while pos <= n do
    -- The end of the tag counts only when brackets are balanced.
    local stop = #balance == 0 and self:tag_end(pos, is_block) or nil
    if stop then
      self:emit(is_block and "block_end" or "variable_end", sub(source, pos, stop - 1), pos)
      self.line_starting = byte(source, stop - 1) == 10
      return stop
    end
    local ws_end = select(2, find(source, "^%s+", pos))
    if ws_end then
      pos = ws_end + 1
    else
      local ty, v, e = scan_token(source, pos, fail)
      if OPENS[ty] then
        balance[#balance + 1] = CLOSER[v]
      elseif CLOSES[ty] then
        if #balance == 0 then self:fail("unexpected '" .. v .. "'", pos) end
        local want = table.remove(balance)
        if want ~= v then self:fail(("unexpected '%s', expected '%s'"):format(v, want), pos) end
      end
      self:emit(ty, v, pos)
      pos = e + 1
    end
  end
  return pos
end

-- Tokens: { type = , value = , line = , col = }; the last one has type "eof".
function M.tokenize(source)
  source = source:gsub("\r\n", "\n"):gsub("\r", "\n")
  if sub(source, -1) == "\n" then source = sub(source, 1, -2) end
  local lx = setmetatable({ source = source, n = #source, toks = {}, cur_pos = 1, cur_line = 1, line_start = 1,
    line_starting = true }, Lexer)
  local toks, n = lx.toks, lx.n
  local pos = 1
  while pos <= n do
    local s = find(source, "{[%%{#]", pos)
    if not s then
      lx:emit("data", sub(source, pos), pos)
      break
    end
    local kind = sub(source, s + 1, s + 1)
    local sign = sub(source, s + 2, s + 2)
    if sign ~= "-" and sign ~= "+" then sign = "" end
    local after = s + 2 + #sign
    local raw_body = kind == "%" and lx:raw_body(after) or nil
    lx:data_before(pos, s - 1, sign, kind == "{")
    if raw_body then pos = lx:raw(s, raw_body)
    elseif kind == "#" then pos = lx:comment(s, after)
    else pos = lx:tag(s, kind, after) end
  end
  -- Jinja gives the end of the template the position of the last token.
  local last = toks[#toks]
  local line, col = 1, 1
  if last then line, col = last.line, last.col end
  toks[#toks + 1] = { type = "eof", value = "", line = line, col = col }
  return toks
end

M.unescape = unescape
return M
