-- UTF-8 strings with Python `str` semantics. Templates index, slice and measure strings in
-- code points (len("é") == 1 in Python), and Python's idea of whitespace and case is wider
-- than ASCII; everything here works on valid UTF-8 and degrades byte-wise on invalid input.
local M = {}

local byte, char, sub, find = string.byte, string.char, string.sub, string.find
local floor = math.floor

-- One character: a lead byte and its continuation bytes. A stray continuation byte at the
-- start of a string would be skipped by this pattern, so M.chars falls back to bytes then.
local CHAR = "[^\128-\191][\128-\191]*"

function M.is_ascii(s) return not find(s, "[\128-\255]") end

function M.len(s)
  if not find(s, "[\128-\255]") then return #s end
  local n = 0
  for i = 1, #s do
    local b = byte(s, i)
    if b < 0x80 or b >= 0xC0 then n = n + 1 end
  end
  return n
end

-- Array of one-character strings.
function M.chars(s)
  local t = {}
  if not find(s, "[\128-\255]") then
    for i = 1, #s do t[i] = sub(s, i, i) end
    return t
  end
  local n = 0
  for c in s:gmatch(CHAR) do n = n + 1 t[n] = c end
  return t
end

-- Code point of a one-character string (the byte value for invalid sequences).
function M.cp(c)
  local b1, b2, b3, b4 = byte(c, 1, 4)
  if not b1 then return nil end
  -- ASCII, a stray continuation byte, or a lead byte without all its continuation bytes
  if b1 < 0xC0 or not b2 then return b1 end
  if b1 < 0xE0 then return (b1 - 0xC0) * 64 + (b2 - 0x80) end
  if not b3 then return b1 end
  if b1 < 0xF0 then return ((b1 - 0xE0) * 64 + (b2 - 0x80)) * 64 + (b3 - 0x80) end
  if not b4 then return b1 end
  return (((b1 - 0xF0) * 64 + (b2 - 0x80)) * 64 + (b3 - 0x80)) * 64 + (b4 - 0x80)
end

function M.from_cp(cp)
  if cp < 0x80 then return char(cp) end
  if cp < 0x800 then return char(0xC0 + floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return char(0xF0 + floor(cp / 262144), 0x80 + floor(cp / 4096) % 64,
    0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- str.isspace(): ASCII whitespace plus the file/group/record/unit separators and the Unicode
-- Zs/Zl/Zp characters. Jinja's `\s` and str.strip() use the same set.
local SPACE = { [0x85] = true, [0xA0] = true, [0x1680] = true, [0x2028] = true,
  [0x2029] = true, [0x202F] = true, [0x205F] = true, [0x3000] = true }
for c = 0x09, 0x0D do SPACE[c] = true end
for c = 0x1C, 0x20 do SPACE[c] = true end
for c = 0x2000, 0x200A do SPACE[c] = true end
M.SPACE = SPACE

function M.is_space(cp) return SPACE[cp] == true end

-- str.isprintable(), approximated: control characters, separators other than the space,
-- format characters (ZWJ, BOM, bidi marks…) and private-use code points are not printable.
-- Unassigned code points (category Cn) are treated as printable.
local NONPRINT_RANGES = {
  { 0x0, 0x1F }, { 0x7F, 0xA0 }, { 0xAD, 0xAD }, { 0x600, 0x605 }, { 0x61C, 0x61C },
  { 0x6DD, 0x6DD }, { 0x70F, 0x70F }, { 0x1680, 0x1680 }, { 0x180E, 0x180E },
  { 0x2000, 0x200F }, { 0x2028, 0x202F }, { 0x205F, 0x2064 }, { 0x2066, 0x206F },
  { 0x3000, 0x3000 }, { 0xD800, 0xF8FF }, { 0xFEFF, 0xFEFF }, { 0xFFF9, 0xFFFB },
  { 0x110BD, 0x110BD }, { 0x1BCA0, 0x1BCA3 }, { 0x1D173, 0x1D17A }, { 0xE0001, 0xE0001 },
  { 0xE0020, 0xE007F }, { 0xF0000, 0x10FFFF },
}
function M.is_printable(cp)
  if cp >= 0x20 and cp < 0x7F then return true end
  for _, r in ipairs(NONPRINT_RANGES) do
    if cp < r[1] then return true end
    if cp <= r[2] then return false end
  end
  return true
end

-- Case mapping: ASCII, Latin-1, Greek and Cyrillic (the common scripts where a fixed offset
-- works). Other scripts are left unchanged; that is a known limit, see loip/template.lua.
local function upper_cp(cp)
  if cp >= 0x61 and cp <= 0x7A then return cp - 32 end
  if cp < 0xE0 then return cp == 0xB5 and 0x39C or cp end
  if cp <= 0xFE and cp ~= 0xF7 then return cp - 32 end
  if cp == 0xFF then return 0x178 end
  if cp >= 0x3B1 and cp <= 0x3C9 and cp ~= 0x3C2 then return cp - 32 end
  if cp == 0x3C2 then return 0x3A3 end
  if cp >= 0x430 and cp <= 0x44F then return cp - 32 end
  if cp >= 0x450 and cp <= 0x45F then return cp - 80 end
  return cp
end

local function lower_cp(cp)
  if cp >= 0x41 and cp <= 0x5A then return cp + 32 end
  if cp < 0xC0 then return cp end
  if cp <= 0xDE and cp ~= 0xD7 then return cp + 32 end
  if cp >= 0x391 and cp <= 0x3A9 and cp ~= 0x3A2 then return cp + 32 end
  if cp >= 0x410 and cp <= 0x42F then return cp + 32 end
  if cp >= 0x400 and cp <= 0x40F then return cp + 80 end
  if cp == 0x178 then return 0xFF end
  return cp
end

function M.is_upper_cp(cp) return lower_cp(cp) ~= cp end
function M.is_lower_cp(cp) return upper_cp(cp) ~= cp or cp == 0xDF end
function M.is_alpha_cp(cp)
  if cp < 0x80 then return (cp >= 65 and cp <= 90) or (cp >= 97 and cp <= 122) end
  -- Outside ASCII, anything that is not space, punctuation-like Latin-1 or a symbol is
  -- taken for a letter: good enough for title-casing words in other scripts.
  if cp < 0xC0 then return cp == 0xAA or cp == 0xB5 or cp == 0xBA end
  return cp ~= 0xD7 and cp ~= 0xF7 and not SPACE[cp] and M.is_printable(cp)
end

local function map_case(s, f)
  if not find(s, "[\128-\255]") then
    return f == upper_cp and s:upper() or s:lower()
  end
  return (s:gsub(CHAR, function(c) local cp = M.cp(c) local m = f(cp) return m == cp and c or M.from_cp(m) end))
end
function M.upper(s) return map_case(s, upper_cp) end
function M.lower(s) return map_case(s, lower_cp) end
function M.upper_char(c) return M.from_cp(upper_cp(M.cp(c))) end
function M.lower_char(c) return M.from_cp(lower_cp(M.cp(c))) end

-- str.title(): a cased character after an uncased one starts a word.
function M.title(s)
  local out, prev_cased = {}, false
  for i, c in ipairs(M.chars(s)) do
    local cp = M.cp(c)
    local alpha = M.is_alpha_cp(cp)
    if alpha then
      out[i] = prev_cased and M.from_cp(lower_cp(cp)) or M.from_cp(upper_cp(cp))
    else
      out[i] = c
    end
    prev_cased = alpha
  end
  return table.concat(out)
end

function M.capitalize(s)
  local cs = M.chars(s)
  if #cs == 0 then return s end
  return M.upper_char(cs[1]) .. M.lower(table.concat(cs, "", 2))
end

-- Byte range [i, j] of s without leading/trailing characters in `set` (a code point set), or
-- Python whitespace when set is nil.
local function strip_range(s, set, left, right)
  set = set or SPACE
  local i, j = 1, #s
  if left then
    while i <= j do
      local b = byte(s, i)
      local w = b < 0x80 and 1 or b >= 0xF0 and 4 or b >= 0xE0 and 3 or 2
      if not set[M.cp(sub(s, i, i + w - 1))] then break end
      i = i + w
    end
  end
  if right then
    while j >= i do
      local k = j
      while k > i and byte(s, k) >= 0x80 and byte(s, k) < 0xC0 do k = k - 1 end
      if not set[M.cp(sub(s, k, j))] then break end
      j = k - 1
    end
  end
  return i, j
end

local function char_set(chars)
  local set = {}
  for _, c in ipairs(M.chars(chars)) do set[M.cp(c)] = true end
  return set
end

-- str.strip / lstrip / rstrip; chars nil strips whitespace, left and right both nil strip
-- both ends.
function M.strip(s, chars, left, right)
  if left == nil and right == nil then left, right = true, true end
  local i, j = strip_range(s, chars and char_set(chars), left, right)
  return sub(s, i, j)
end

-- str.split() without a separator: runs of whitespace separate, ends are ignored.
function M.split_ws(s, maxsplit)
  local out = {}
  local cs = M.chars(s)
  local i, n = 1, #cs
  while i <= n do
    while i <= n and SPACE[M.cp(cs[i])] do i = i + 1 end
    if i > n then break end
    if maxsplit and maxsplit >= 0 and #out >= maxsplit then
      -- The remainder keeps its trailing whitespace, as in Python.
      out[#out + 1] = table.concat(cs, "", i, n)
      break
    end
    local j = i
    while j <= n and not SPACE[M.cp(cs[j])] do j = j + 1 end
    out[#out + 1] = table.concat(cs, "", i, j - 1)
    i = j
  end
  return out
end

-- str.split(sep, maxsplit) with a literal separator.
function M.split(s, sep, maxsplit)
  local out, pos = {}, 1
  while not maxsplit or maxsplit < 0 or #out < maxsplit do
    local a, b = find(s, sep, pos, true)
    if not a then break end
    out[#out + 1] = sub(s, pos, a - 1)
    pos = b + 1
  end
  out[#out + 1] = sub(s, pos)
  return out
end

-- str.rsplit(sep, maxsplit): splits from the right, result in left-to-right order.
function M.rsplit(s, sep, maxsplit)
  if not maxsplit or maxsplit < 0 then return M.split(s, sep) end
  local cuts, stop = {}, #s
  while #cuts < maxsplit do
    -- Last occurrence of sep that ends at or before `stop`.
    local last, pos = nil, 1
    while true do
      local a, b = find(s, sep, pos, true)
      if not a or b > stop then break end
      last, pos = a, a + 1
    end
    if not last then break end
    table.insert(cuts, 1, last)
    stop = last - 1
  end
  local out, pos = {}, 1
  for _, a in ipairs(cuts) do
    out[#out + 1] = sub(s, pos, a - 1)
    pos = a + #sep
  end
  out[#out + 1] = sub(s, pos)
  return out
end

-- Number of non-overlapping occurrences of `needle` (Python str.count).
function M.count(s, needle)
  if needle == "" then return M.len(s) + 1 end
  local n, pos = 0, 1
  while true do
    local a, b = find(s, needle, pos, true)
    if not a then return n end
    n, pos = n + 1, b + 1
  end
end

-- Code-point index (0-based) of byte position p.
function M.cp_index(s, p)
  if not find(s, "[\128-\255]") then return p - 1 end
  return M.len(sub(s, 1, p - 1))
end

return M
