-- GBNF (llama.cpp's grammar format) parsed into the grammar IR that runtime/grammar runs:
--
--   root  ::= object                   # a comment
--   value ::= "lit\n" | [a-z_] [^"\\]* | ( x | y )? z+ w{2,4} | . | name
--
-- Rules `name ::= alternatives` (names of letters, digits, '-' and '_'; a rule may span lines,
-- it ends where the next `name ::=` starts), alternatives `|`, groups `( )`, repetition `*`,
-- `+`, `?`, `{m}`, `{m,}`, `{m,n}`, literals "..." and classes [...] with escapes (\n \r \t
-- \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH), ranges and negation [^...], `.` (any character), and
-- `#` comments. The start is the rule `root`.
--
-- The IR is over bytes: a class is its code points' UTF-8 sequences (one byte set when the
-- class is ASCII, else a rule of byte-range sequences), a literal a byte set per byte, and
-- repetition rules (x* is r ::= x r | empty; x{0,3} three nested optionals), as llama.cpp
-- rewrites them. M.parse(text, where) -> rules; M.ir(rules, where) -> the C arrays.
local ffi = require "ffi"
local from_cp = require("loip.text.template.text").from_cp

local M = {}

-- ---- parsing ---------------------------------------------------------------------------

local Parser = {}
Parser.__index = Parser

function Parser:fail(msg, at)
  at = at or self.i
  local line, col = 1, 1
  for k = 1, at - 1 do
    if self.s:byte(k) == 10 then line, col = line + 1, 1 else col = col + 1 end
  end
  error(string.format("%s: line %d, column %d: %s", self.where, line, col, msg), 0)
end

function Parser:skip()
  local s = self.s
  while true do
    local a, b = s:find("^[ \t\r\n]+", self.i)
    if a then self.i = b + 1 end
    if s:sub(self.i, self.i) == "#" then
      local e = s:find("\n", self.i, true)
      self.i = e and e + 1 or #s + 1
    elseif not a then
      return
    end
  end
end

-- At `name ::=`? Returns the name and the position after `::=`.
function Parser:rule_head()
  local a, b, name = self.s:find("^([%w_%-]+)", self.i)
  if not a then return nil end
  local save = self.i
  self.i = b + 1
  self:skip()
  local found = self.s:sub(self.i, self.i + 2) == "::="
  local after = self.i + 3
  self.i = save
  if found then return name, after end
end

local simple_escapes = { n = 10, r = 13, t = 9, ["\\"] = 92, ['"'] = 34, ["["] = 91, ["]"] = 93,
  ["-"] = 45, ["^"] = 94, ["'"] = 39, ["/"] = 47, ["0"] = 0 }

-- One character (its code point) of a literal or class at self.i.
function Parser:char()
  local s, i = self.s, self.i
  local c = s:byte(i)
  if c == nil then self:fail("unexpected end of the grammar") end
  if c == 92 then -- backslash
    local e = s:sub(i + 1, i + 1)
    local hex = ({ x = 2, u = 4, U = 8 })[e]
    if hex then
      local h = s:sub(i + 2, i + 1 + hex)
      if #h ~= hex or not h:match("^%x+$") then self:fail("\\" .. e .. " needs " .. hex .. " hex digits") end
      self.i = i + 2 + hex
      return tonumber(h, 16)
    end
    local v = simple_escapes[e]
    if not v then self:fail("unknown escape \\" .. e) end
    self.i = i + 2
    return v
  end
  -- a UTF-8 character
  local n = c < 0x80 and 1 or c >= 0xF0 and 4 or c >= 0xE0 and 3 or c >= 0xC0 and 2 or 0
  if n == 0 then self:fail("malformed UTF-8") end
  local cp = n == 1 and c or c % (2 ^ (7 - n))
  for k = 1, n - 1 do
    local d = s:byte(i + k)
    if not d or d < 0x80 or d > 0xBF then self:fail("malformed UTF-8") end
    cp = cp * 64 + d % 64
  end
  self.i = i + n
  return cp
end

function Parser:literal()
  local start = self.i
  self.i = self.i + 1
  local cps = {}
  while self.s:sub(self.i, self.i) ~= '"' do
    if self.i > #self.s or self.s:sub(self.i, self.i) == "\n" then self:fail("unterminated literal", start) end
    cps[#cps + 1] = self:char()
  end
  self.i = self.i + 1
  return { t = "lit", cps = cps }
end

function Parser:class()
  local start = self.i
  self.i = self.i + 1
  local neg = false
  if self.s:sub(self.i, self.i) == "^" then neg, self.i = true, self.i + 1 end
  local ranges = {}
  while self.s:sub(self.i, self.i) ~= "]" do
    if self.i > #self.s or self.s:sub(self.i, self.i) == "\n" then self:fail("unterminated character class", start) end
    local lo = self:char()
    local hi = lo
    if self.s:sub(self.i, self.i) == "-" and self.i < #self.s and self.s:sub(self.i + 1, self.i + 1) ~= "]" then
      self.i = self.i + 1
      hi = self:char()
      if hi < lo then self:fail("range end before its start", self.i - 1) end
    end
    ranges[#ranges + 1] = { lo, hi }
  end
  self.i = self.i + 1
  return { t = "class", ranges = ranges, neg = neg }
end

function Parser:number()
  local a, b = self.s:find("^%d+", self.i)
  if not a then self:fail("expected a number") end
  self.i = b + 1
  return tonumber(self.s:sub(a, b))
end

function Parser:repetition(item)
  local s = self.s
  while true do
    local c = s:sub(self.i, self.i)
    local at = self.i
    local min, max
    if c == "*" then min, max, self.i = 0, nil, self.i + 1
    elseif c == "+" then min, max, self.i = 1, nil, self.i + 1
    elseif c == "?" then min, max, self.i = 0, 1, self.i + 1
    elseif c == "{" then
      self.i = self.i + 1
      self:skip()
      min = self:number()
      self:skip()
      max = min
      if s:sub(self.i, self.i) == "," then
        self.i = self.i + 1
        self:skip()
        if s:sub(self.i, self.i) == "}" then max = nil else max = self:number() self:skip() end
      end
      if s:sub(self.i, self.i) ~= "}" then self:fail("expected '}' closing the repetition") end
      self.i = self.i + 1
      if max and max < min then self:fail("repetition {" .. min .. "," .. max .. "}: the maximum is below the minimum", at) end
      if (max or min) > 10000 then self:fail("repetition bound over 10000", at) end
    else
      return item
    end
    item = { t = "rep", item = item, min = min, max = max }
  end
end

function Parser:alternatives(nested)
  local alts = { self:sequence(nested) }
  while self.s:sub(self.i, self.i) == "|" do
    self.i = self.i + 1
    alts[#alts + 1] = self:sequence(nested)
  end
  return alts
end

function Parser:sequence(nested)
  local seq = {}
  while true do
    self:skip()
    local c = self.s:sub(self.i, self.i)
    local at = self.i
    local item
    if c == "" or c == "|" or c == ")" then return seq end
    if c == '"' then item = self:literal()
    elseif c == "[" then item = self:class()
    elseif c == "." then item, self.i = { t = "class", ranges = {}, neg = true }, self.i + 1
    elseif c == "(" then
      self.i = self.i + 1
      local alts = self:alternatives(true)
      self:skip()
      if self.s:sub(self.i, self.i) ~= ")" then self:fail("expected ')' closing the group opened here", at) end
      self.i = self.i + 1
      item = { t = "group", alts = alts }
    elseif c:match("[%w_%-]") then
      if not nested and self:rule_head() then return seq end
      local name = self.s:match("^[%w_%-]+", self.i)
      self.i = self.i + #name
      item = { t = "ref", name = name, at = at }
    else
      self:fail("unexpected '" .. c .. "'")
    end
    seq[#seq + 1] = self:repetition(item)
  end
end

-- Rules of text: { order = {names...}, [name] = {alts = ..., at = offset} }.
function M.parse(text, where)
  if type(text) ~= "string" then error(where .. ": a grammar must be a string", 0) end
  local p = setmetatable({ s = text, i = 1, where = where }, Parser)
  local rules = { order = {} }
  p:skip()
  while p.i <= #text do
    local name, after = p:rule_head()
    if not name then p:fail("expected a rule (name ::= ...)") end
    if rules[name] then p:fail("rule " .. name .. " is defined twice") end
    local at = p.i
    p.i = after
    local alts = p:alternatives(false)
    p:skip()
    if p.s:sub(p.i, p.i) == ")" then p:fail("')' without its '('") end
    rules[name] = { alts = alts, at = at }
    rules.order[#rules.order + 1] = name
  end
  if not rules.root then error(where .. ": no rule named root (the grammar's start)", 0) end
  for _, name in ipairs(rules.order) do
    local function check(alts)
      for _, seq in ipairs(alts) do
        for _, it in ipairs(seq) do
          while it.t == "rep" do it = it.item end
          if it.t == "ref" and not rules[it.name] then p:fail("rule " .. it.name .. " is not defined", it.at) end
          if it.t == "group" then check(it.alts) end
        end
      end
    end
    check(rules[name].alts)
  end
  rules.parser = p
  return rules
end

-- ---- code points to UTF-8 byte ranges ----------------------------------------------------

local function utf8_bytes(cp) return { from_cp(cp):byte(1, -1) } end

-- Sequences of byte ranges ({ {lo, hi}, ... }) matching exactly the UTF-8 of [lo, hi]
-- (same encoded length): split until each continuation position spans whole blocks.
local function split_same_len(lo, hi, n, out)
  for i = 1, n - 1 do
    local m = 2 ^ (6 * i) - 1
    local base_lo, base_hi = lo - lo % (m + 1), hi - hi % (m + 1)
    if base_lo ~= base_hi then
      if lo % (m + 1) ~= 0 then
        split_same_len(lo, base_lo + m, n, out)
        return split_same_len(base_lo + m + 1, hi, n, out)
      end
      if hi % (m + 1) ~= m then
        split_same_len(lo, base_hi - 1, n, out)
        return split_same_len(base_hi, hi, n, out)
      end
    end
  end
  local a, b = utf8_bytes(lo), utf8_bytes(hi)
  local seq = {}
  for k = 1, n do seq[k] = { a[k], b[k] } end
  out[#out + 1] = seq
end

local bounds = { { 0, 0x7F, 1 }, { 0x80, 0x7FF, 2 }, { 0x800, 0xD7FF, 3 }, { 0xE000, 0xFFFF, 3 },
  { 0x10000, 0x10FFFF, 4 } }

-- Byte-range sequences of a set of code-point ranges (merged, complemented when neg).
function M.utf8_sequences(ranges, neg)
  local rs = {}
  for _, r in ipairs(ranges) do rs[#rs + 1] = { r[1], r[2] } end
  table.sort(rs, function(x, y) return x[1] < y[1] end)
  local merged = {}
  for _, r in ipairs(rs) do
    local last = merged[#merged]
    if last and r[1] <= last[2] + 1 then last[2] = math.max(last[2], r[2]) else merged[#merged + 1] = r end
  end
  if neg then
    local comp, nxt = {}, 0
    for _, r in ipairs(merged) do
      if r[1] > nxt then comp[#comp + 1] = { nxt, r[1] - 1 } end
      nxt = r[2] + 1
    end
    if nxt <= 0x10FFFF then comp[#comp + 1] = { nxt, 0x10FFFF } end
    merged = comp
  end
  local out = {}
  for _, r in ipairs(merged) do
    for _, b in ipairs(bounds) do
      local lo, hi = math.max(r[1], b[1]), math.min(r[2], b[2])
      if lo <= hi then split_same_len(lo, hi, b[3], out) end
    end
  end
  return out
end

M.utf8_bytes = utf8_bytes

-- ---- the IR --------------------------------------------------------------------------------

local K = require("loip.core").constants
local SET, REF = K.GRAMMAR_SET * 2 ^ 28, K.GRAMMAR_REF * 2 ^ 28 -- an element: (kind << 28) | arg

-- The IR being built (M.ir): the rules (R: { name, alts }, 0-based ids by name in index) and
-- the byte sets (32-byte bitmaps, each once).
local Builder = {}
Builder.__index = Builder

-- The element of a byte set (a list of { lo, hi } byte ranges).
function Builder:set_elem(lo_hi_list)
  local bytes = {}
  for b = 0, 31 do bytes[b] = 0 end
  for _, r in ipairs(lo_hi_list) do
    for b = r[1], r[2] do bytes[math.floor(b / 8)] = bytes[math.floor(b / 8)] + 2 ^ (b % 8) end
  end
  local parts = {}
  for b = 0, 31 do parts[b + 1] = string.char(bytes[b]) end
  local key = table.concat(parts)
  local k = self.set_index[key]
  if not k then
    self.sets[#self.sets + 1] = key
    k = #self.sets - 1
    self.set_index[key] = k
  end
  return SET + k
end

function Builder:new_rule(name, alts)
  local R = self.R
  R[#R + 1] = { name = name, alts = alts }
  return #R - 1
end

-- The elements of alternatives alts as one element: inline when there is one alternative of
-- one element, else a new rule.
function Builder:as_one(alts, name)
  if #alts == 1 and #alts[1] == 1 then return alts[1][1] end
  return REF + self:new_rule(name, alts)
end

function Builder:seq_elems(seq, name)
  local out = {}
  for _, it in ipairs(seq) do self:emit(it, out, name) end
  return out
end

-- A character class: its UTF-8 byte sequences, the one-byte ones in one set.
function Builder:class_elem(it, name)
  local single, alts = {}, {}
  for _, sq in ipairs(M.utf8_sequences(it.ranges, it.neg)) do
    if #sq == 1 then single[#single + 1] = sq[1]
    else
      local e = {}
      for k, r in ipairs(sq) do e[k] = self:set_elem({ r }) end
      alts[#alts + 1] = e
    end
  end
  if #single > 0 or #alts == 0 then table.insert(alts, 1, { self:set_elem(single) }) end
  return self:as_one(alts, name .. "-char")
end

-- A repetition's elements into out: min copies of its item, then a rule for the rest (any
-- number more, or up to max).
function Builder:emit_rep(it, out, name)
  local x = self:seq_elems({ it.item }, name)
  local unit = self:as_one({ x }, name .. "-item")
  for _ = 1, it.min do out[#out + 1] = unit end
  if it.max == nil then
    local r = self:new_rule(name .. "-star", {})
    self.R[r + 1].alts = { { unit, REF + r }, {} }
    out[#out + 1] = REF + r
  elseif it.max > it.min then
    local r = self:new_rule(name .. "-opt", { { unit }, {} })
    for _ = 2, it.max - it.min do r = self:new_rule(name .. "-opt", { { unit, REF + r }, {} }) end
    out[#out + 1] = REF + r
  end
end

function Builder:emit(it, out, name)
  if it.t == "lit" then
    for _, cp in ipairs(it.cps) do
      for _, b in ipairs(utf8_bytes(cp)) do out[#out + 1] = self:set_elem({ { b, b } }) end
    end
  elseif it.t == "ref" then
    out[#out + 1] = REF + self.index[it.name]
  elseif it.t == "class" then
    out[#out + 1] = self:class_elem(it, name)
  elseif it.t == "group" then
    local alts = {}
    for k, seq in ipairs(it.alts) do alts[k] = self:seq_elems(seq, name) end
    if #alts == 1 then
      for _, e in ipairs(alts[1]) do out[#out + 1] = e end
    else
      out[#out + 1] = REF + self:new_rule(name .. "-group", alts)
    end
  else -- rep
    self:emit_rep(it, out, name)
  end
end

-- The rules and sets as the C arrays M.ir returns.
function Builder:pack()
  local R = self.R
  local words = { #R }
  local names = {}
  for i, r in ipairs(R) do
    names[i] = r.name
    words[#words + 1] = #r.alts
    for _, a in ipairs(r.alts) do
      words[#words + 1] = #a
      for _, e in ipairs(a) do words[#words + 1] = e end
    end
  end
  local ir = ffi.new("int32_t[?]", #words)
  for k, w in ipairs(words) do ir[k - 1] = w end
  local blob = table.concat(self.sets)
  local setbuf = ffi.new("uint8_t[?]", math.max(#blob, 1))
  ffi.copy(setbuf, blob, #blob)
  return { ir = ir, n_ir = #words, sets = setbuf, n_sets = #self.sets, root = self.index.root,
    names = table.concat(names, "\n"), n_rules = #R }
end

-- The C arrays of parsed rules: { ir = int32_t[], n_ir, sets = uint8_t[], n_sets, root,
-- names ('\n'-joined), n_rules }.
function M.ir(rules)
  local b = setmetatable({ R = {}, index = {}, sets = {}, set_index = {} }, Builder)
  for i, name in ipairs(rules.order) do b.index[name], b.R[i] = i - 1, { name = name } end
  for i, name in ipairs(rules.order) do
    local alts = {}
    for k, seq in ipairs(rules[name].alts) do alts[k] = b:seq_elems(seq, name) end
    b.R[i].alts = alts
  end
  return b:pack()
end
return M
