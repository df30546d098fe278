-- The logprobs of a request's tokens (loip.engine.request.head_sample's r.token_logprobs) in the OpenAI
-- API's shapes: chat's { content = [{ token, logprob, bytes, top_logprobs }] } and the legacy
-- completions' { tokens, token_logprobs, top_logprobs = [{ token: logprob }], text_offset }.
-- A token's text is its piece after the token before it (tok:piece_text); one that is not whole
-- UTF-8 (a byte of a character split over tokens) is written "bytes:\xNN..." as OpenAI does, and
-- its bytes are given in `bytes`.
local openai = require "loip.serve.openai"
local json = require "loip.text.json"

local M = {}

local function token_text(tok, prev, id)
  local ok, t = pcall(tok.piece_text, tok, prev, id)
  if not ok then t = "" end
  local bytes = {}
  for i = 1, #t do bytes[i] = t:byte(i) end
  if not openai.utf8_valid(t) then t = "bytes:" .. t:gsub(".", function(c) return string.format("\\x%02x", c:byte()) end) end
  return t, #bytes > 0 and bytes or openai.EMPTY_ARRAY
end

-- Chat's entries of tokens first..last of list (1-based); prev: the id before list[first].
function M.chat(tok, prev, list, first, last)
  local content = {}
  for j = first, last do
    local lp = list[j]
    local text, bytes = token_text(tok, prev, lp.id)
    local top = {}
    for k, t in ipairs(lp.top or {}) do
      local tt, tb = token_text(tok, prev, t[1])
      top[k] = { token = tt, logprob = t[2], bytes = tb }
    end
    content[#content + 1] = { token = text, logprob = lp.logprob, bytes = bytes, top_logprobs = #top > 0 and top or openai.EMPTY_ARRAY }
    prev = lp.id
  end
  return { content = #content > 0 and content or openai.EMPTY_ARRAY, refusal = json.null }
end

-- The completions' object of tokens first..last; offset: the text offset of list[first].
function M.completion(tok, prev, list, first, last, offset)
  local o = { tokens = {}, token_logprobs = {}, top_logprobs = {}, text_offset = {} }
  for j = first, last do
    local lp = list[j]
    local text = token_text(tok, prev, lp.id)
    local top = {}
    for _, t in ipairs(lp.top or {}) do top[(token_text(tok, prev, t[1]))] = t[2] end
    local i = #o.tokens + 1
    o.tokens[i], o.token_logprobs[i], o.text_offset[i] = text, lp.logprob, offset
    o.top_logprobs[i] = next(top) and top or json.null
    offset = offset + #text
    prev = lp.id
  end
  for k, v in pairs(o) do if #v == 0 then o[k] = openai.EMPTY_ARRAY end end
  return o, offset
end

return M
