-- UTF-8 as loip writes it: every JSON it encodes (loip.text.json) and every text it streams
-- (loip.text.tokenizer's text_stream) is well-formed UTF-8, whatever bytes the tokens give.
--
--   valid(s)      -> whether s is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates,
--                    nothing past U+10FFFF)
--   sanitize(s)   -> s with each ill-formed part replaced by U+FFFD
--   split(s)      -> text, tail: s's longest prefix that ends between characters, sanitized,
--                    and the bytes after it that begin a character not yet complete
--   holder()      -> h: h:put(bytes) -> whole characters so far, h:finish() -> the rest
--
-- An ill-formed part is a "maximal subpart" (Unicode §3.9, U+FFFD substitution of maximal
-- subparts; Python's errors="replace" and the WHATWG decoder do the same): the longest run of
-- bytes that begins a valid sequence and is then cut short, or else one byte that can begin
-- none. Each becomes one U+FFFD, so "\xe4\xb8" gives one and "\xab\xab" two.
local M = {}

local byte, sub, find = string.byte, string.sub, string.find

M.REPLACEMENT = "\239\191\189" -- U+FFFD

-- At byte i of s (length n): n_bytes of a whole character; or -k: s ends k bytes into a
-- character that may still complete; or 0, m: m bytes (1..3) that cannot be completed.
local function scan(s, i, n)
  local c = byte(s, i)
  if c < 0x80 then return 1 end
  local need
  if c >= 0xC2 and c <= 0xDF then need = 1
  elseif c >= 0xE0 and c <= 0xEF then need = 2
  elseif c >= 0xF0 and c <= 0xF4 then need = 3
  else return 0, 1 end -- a continuation byte, C0, C1 or F5..FF: never a character's first
  local lo, hi = 0x80, 0xBF -- the second byte's range excludes overlongs, surrogates, > U+10FFFF
  if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
  elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
  for k = 1, need do
    if i + k > n then return -k end
    local d = byte(s, i + k)
    if d < lo or d > hi then return 0, k end
    lo, hi = 0x80, 0xBF
  end
  return need + 1
end
M.scan = scan

function M.valid(s)
  if not find(s, "[\128-\255]") then return true end
  local i, n = 1, #s
  while i <= n do
    local k = scan(s, i, n)
    if k <= 0 then return false end
    i = i + k
  end
  return true
end

function M.split(s)
  if not find(s, "[\128-\255]") then return s, "" end
  local out, i, n, from = nil, 1, #s, 1
  while i <= n do
    local k, bad = scan(s, i, n)
    if k > 0 then
      i = i + k
    elseif k < 0 then -- the end, inside a character
      if not out then return sub(s, 1, i - 1), sub(s, i) end
      out[#out + 1] = sub(s, from, i - 1)
      return table.concat(out), sub(s, i)
    else
      out = out or {}
      out[#out + 1] = sub(s, from, i - 1)
      out[#out + 1] = M.REPLACEMENT
      i = i + bad
      from = i
    end
  end
  if not out then return s, "" end
  out[#out + 1] = sub(s, from)
  return table.concat(out), ""
end

function M.sanitize(s)
  local text, tail = M.split(s)
  if tail ~= "" then return text .. M.REPLACEMENT end
  return text
end

-- Bytes as they come (a token's piece may end inside a character): put gives out whole
-- characters only, holding back the start of one not yet complete; finish gives what is held
-- (a character never completed: U+FFFD).
function M.holder()
  local held = ""
  local h = {}
  function h.put(_, s)
    if held ~= "" then s = held .. s end
    local text
    text, held = M.split(s)
    return text
  end
  function h.finish()
    local rest = held ~= "" and M.REPLACEMENT or ""
    held = ""
    return rest
  end
  function h.held() return held end
  return h
end

return M
