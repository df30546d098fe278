-- Decoding ids back into text, as a stream: the decoders of Hugging Face's tokenizer.json
-- (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence), tiktoken's raw bytes
-- and SentencePiece's own rules, each written as a step that takes token strings one at a
-- time. decode(ids) is a stream fed every id, so a stream split anywhere gives exactly
-- decode's text.
--
-- A stream gives out only complete UTF-8: a multi-byte character cut between tokens, and a
-- run of byte-fallback pieces, are held back until they complete (or finish() is called).
-- Bytes that can never start or continue a character are passed on as they are.
--
-- Where the text is not valid UTF-8, these rules decide (per format, as the reference
-- libraries do):
--   - byte-level (HF ByteLevel, tiktoken): the raw bytes of the pieces, with no replacement
--     (HF would turn them into U+FFFD; keeping them makes decode(encode(s)) == s for any
--     bytes s, which is how byte-level encoding treats them);
--   - HF ByteFallback: a run of <0xXX> pieces that is not valid UTF-8 gives one U+FFFD per
--     piece (HF's rule);
--   - SentencePiece: each byte of a run of byte pieces that does not start a valid
--     character gives one U+FFFD (sentencepiece_processor.cc).
local M = {}

local REPLACEMENT = "\239\191\189" -- U+FFFD

-- Length of the valid UTF-8 sequence starting at byte i of s, 0 if none starts there, or
-- -n when s ends after n bytes of a sequence that could still complete.
local function seq_len(s, i)
  local c = s:byte(i)
  if c < 0x80 then return 1 end
  local n, lo, hi
  if c >= 0xC2 and c <= 0xDF then n = 2
  elseif c >= 0xE0 and c <= 0xEF then n = 3
  elseif c >= 0xF0 and c <= 0xF4 then n = 4
  else return 0 end
  lo, hi = 0x80, 0xBF
  if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F
  elseif c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
  local len = #s
  for k = 1, n - 1 do
    if i + k > len then return -k end
    local d = s:byte(i + k)
    if d < lo or d > hi then return 0 end
    lo, hi = 0x80, 0xBF
  end
  return n
end
M.seq_len = seq_len

-- Whether s is entirely valid UTF-8.
function M.valid(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    if c < 0x80 then
      i = i + 1
    else
      local k = seq_len(s, i)
      if k <= 0 then return false end
      i = i + k
    end
  end
  return true
end

-- s with every byte that is not part of a valid sequence replaced by U+FFFD (SentencePiece's
-- and Python's errors="replace" rule for malformed input: one U+FFFD per bad byte).
function M.sanitize(s)
  if M.valid(s) then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local k = seq_len(s, i)
    if k > 0 then
      out[#out + 1] = s:sub(i, i + k - 1)
      i = i + k
    else
      out[#out + 1] = REPLACEMENT
      i = i + 1
    end
  end
  return table.concat(out)
end

-- Bytes at the end of s that start a character not yet complete (0..3).
local function incomplete_tail(s)
  local n = #s
  for back = 1, math.min(3, n) do
    local i = n - back + 1
    local c = s:byte(i)
    if c < 0x80 then return 0 end
    if c >= 0xC0 then
      return seq_len(s, i) < 0 and back or 0
    end
  end
  return 0
end

local function byte_piece(s)
  if #s ~= 6 then return nil end
  local hex = s:match("^<0x(%x%x)>$")
  return hex and tonumber(hex, 16)
end
M.byte_piece = byte_piece

local function replace_plain(s, from, to)
  if from == "" or not s:find(from, 1, true) then return s end
  return (s:gsub(from:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"), (to:gsub("%%", "%%%%"))))
end
M.replace_plain = replace_plain

-- ---- steps ---------------------------------------------------------------------------------
-- A step is {push = function(self, s, out) ... end, finish = function(self, out) ... end}:
-- it appends the strings it gives out to the array out.

local steps = {}

-- Pieces already hold their bytes (stored raw): nothing to do.
function steps.bytes() return { push = function(_, s, out) out[#out + 1] = s end } end

function steps.replace(d)
  return { push = function(_, s, out) out[#out + 1] = replace_plain(s, d.from, d.to) end }
end

-- Metaspace: the replacement character becomes a space; in the first token, with a prepend
-- scheme, it is dropped (HF drops every one of them there, not only the leading one).
function steps.metaspace(d, fused, continued)
  local first = not continued
  return { push = function(_, s, out)
    if first and d.prepend then
      s = replace_plain(s, d.replacement, "")
    else
      s = replace_plain(s, d.replacement, " ")
    end
    if not fused then first = false end
    out[#out + 1] = s
  end }
end

function steps.byte_fallback()
  local run = {}
  local function flush(out)
    if #run == 0 then return end
    local s = table.concat(run)
    if M.valid(s) then out[#out + 1] = s
    else out[#out + 1] = string.rep(REPLACEMENT, #run) end
    run = {}
  end
  return {
    push = function(_, s, out)
      local b = byte_piece(s)
      if b then run[#run + 1] = string.char(b) return end
      flush(out)
      out[#out + 1] = s
    end,
    finish = function(_, out) flush(out) end,
  }
end

function steps.fuse() return { push = function(_, s, out) out[#out + 1] = s end } end

-- Strip removes up to `start` leading and `stop` trailing `content` characters of each token;
-- after a Fuse, of the whole text: the leading ones once at the start, and the trailing ones
-- held back until the end.
function steps.strip(d, fused, continued)
  local c, n = d.content, #d.content
  local function lead(s, k)
    while k > 0 and s:sub(1, n) == c do s = s:sub(n + 1) k = k - 1 end
    return s
  end
  local function trail(s, k)
    while k > 0 and #s >= n and s:sub(-n) == c do s = s:sub(1, -n - 1) k = k - 1 end
    return s
  end
  if not fused then
    return { push = function(_, s, out) out[#out + 1] = trail(lead(s, d.start), d.stop) end }
  end
  local at_start = not continued
  local left = d.start -- leading characters still to strip
  local held = ""      -- trailing content characters held back
  return {
    push = function(_, s, out)
      if at_start then
        while left > 0 and s:sub(1, n) == c do s = s:sub(n + 1) left = left - 1 end
        if s ~= "" then at_start = false end
      end
      s = held .. s
      held = ""
      if d.stop > 0 then
        local body = trail(s, d.stop)
        held = s:sub(#body + 1)
        s = body
      end
      out[#out + 1] = s
    end,
    finish = function() held = "" end,
  }
end

-- No decoder in tokenizer.json: HF joins the tokens with spaces.
function steps.join()
  local first = true
  return { push = function(_, s, out)
    out[#out + 1] = first and s or (" " .. s)
    first = false
  end }
end

-- ---- streams -------------------------------------------------------------------------------

local Stream = {}
Stream.__index = Stream
Stream.__call = function(self, id) return self:put(id) end

-- The final stage: hold back a character cut short.
local function settle(self, s)
  if self.pending ~= "" then s = self.pending .. s end
  local k = incomplete_tail(s)
  if k > 0 then
    self.pending = s:sub(-k)
    return s:sub(1, -k - 1)
  end
  self.pending = ""
  return s
end

local function run_chain(self, s)
  local cur = { s }
  for _, st in ipairs(self.chain) do
    local nxt = {}
    for _, x in ipairs(cur) do st:push(x, nxt) end
    cur = nxt
    if #cur == 0 then break end
  end
  return cur
end

-- Text of one more id ("" while it is held back).
function Stream:put(id)
  local tok = self.tok
  if self.skip_special and tok:is_special(id) then return "" end
  if self.spm then return settle(self, self.spm(id)) end
  local outs = run_chain(self, tok:decode_piece(id))
  return settle(self, table.concat(outs))
end

-- Whatever was held back.
function Stream:finish()
  local parts = {}
  if self.spm then
    parts[1] = self.spm(nil)
  else
    -- Each step's held text goes through the steps after it.
    for i, st in ipairs(self.chain) do
      if st.finish then
        local out = {}
        st:finish(out)
        for _, s in ipairs(out) do
          local cur = { s }
          for j = i + 1, #self.chain do
            local nxt = {}
            for _, x in ipairs(cur) do self.chain[j]:push(x, nxt) end
            cur = nxt
          end
          parts[#parts + 1] = table.concat(cur)
        end
      end
    end
  end
  local s = table.concat(parts)
  s = self.pending .. s
  self.pending = ""
  return s
end

-- SentencePiece's DecodeIds: control pieces are invisible, <unk> is " ⁇ ", runs of byte pieces
-- are decoded together, "▁" is a space, and the first piece that shows anything loses its
-- leading "▁" (with add_dummy_prefix or remove_extra_whitespaces).
local function spm_decoder(tok, continued)
  local info = tok.spm_info
  local strip_first = (info.add_dummy_prefix or info.remove_extra_whitespaces) and not continued
  local run = {}
  local function flush()
    if #run == 0 then return "" end
    local s = table.concat(run)
    run = {}
    if M.valid(s) then return s end
    return M.sanitize(s)
  end
  return function(id)
    if id == nil then
      local s = flush()
      if s ~= "" then strip_first = false end
      return s
    end
    local kind = tok.piece_type[id]
    if kind == "byte" then
      run[#run + 1] = string.char(byte_piece(tok:decode_piece(id)))
      return ""
    end
    local pre = flush()
    if pre ~= "" then strip_first = false end
    local s
    if kind == "control" then
      s = ""
    elseif kind == "unknown" then
      s = " \226\129\135 " -- " ⁇ "
    else
      s = tok:decode_piece(id)
      if strip_first and s:sub(1, 3) == "\226\150\129" then s = s:sub(4) strip_first = false end
      s = replace_plain(s, "\226\150\129", " ")
    end
    if s ~= "" then strip_first = false end
    return pre .. s
  end
end

-- A stream over tokenizer tok (which gives decode_piece(id), is_special(id), and its decoder
-- description). opts.skip_special: leave special tokens out. opts.continued: the stream goes
-- on from earlier text (no first-token rules).
function M.stream(tok, opts)
  opts = opts or {}
  local self = setmetatable({ tok = tok, pending = "", skip_special = opts.skip_special }, Stream)
  if tok.decoder == "spm" then
    self.spm = spm_decoder(tok, opts.continued)
    return self
  end
  self.chain = {}
  local fused = false
  for _, d in ipairs(tok.decoder) do
    local make = steps[d.type]
    if not make then error("unknown decoder step " .. tostring(d.type), 2) end
    self.chain[#self.chain + 1] = make(d, fused, opts.continued)
    if d.type == "fuse" then fused = true end
  end
  return self
end

return M
