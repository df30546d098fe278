-- Sampling at the head, for requests that need the model's distribution itself rather than a
-- sampled id: those asking for logprobs (the log-probabilities of the chosen tokens and of the
-- most likely ones), and those under a grammar (constrained decoding: a mask over the
-- vocabulary applied where the token is sampled). Such a request's sampling rows come back from
-- the engine as logits (LOIP_TOKF_LOGITS: the local engine's buffer, or the ring's last device's
-- result) and are sampled here with the request's own sampler — the same C sampler, seed and
-- history as the engine's, so asking for logprobs does not change a request's tokens.
--
--   r.logprobs    nil, or the number of top alternatives to report per token (0: the chosen one's)
--   r.constraint  nil, or a matcher: apply(logits, n) (-inf on what is not allowed),
--                 accept(id) -> true | nil, err, must_end() (loip.text.grammar's Matcher)
--   r.token_logprobs  filled: per generated token { id, logprob, top = { {id, logprob}... } }
--
-- The log-probabilities are the model's: a log-softmax of the raw logits over the ids a request
-- samples from (n_sample), before any mask, penalty or temperature.
local ffi = require "ffi"
local sampler = require "loip.model.sampler"

local M = {}

-- Whether r is sampled here.
function M.wants(r) return r.logprobs ~= nil or r.constraint ~= nil end

local function state(r)
  local h = r.head_state
  if h then return h end
  local o = {}
  for k, v in pairs(r.sampler or {}) do o[k] = v end
  o.seed = r.seed
  local prompt = r.prompt0 or r.prompt
  local cap = #prompt + r.max_tokens + 1
  h = { sampler = sampler.new(r.n_sample, o), history = ffi.new("int32_t[?]", cap), n = #prompt, cap = cap,
    scratch = r.constraint and ffi.new("float[?]", r.n_sample) or nil }
  for i, id in ipairs(prompt) do h.history[i - 1] = id end
  r.head_state = h
  return h
end

-- The log-probabilities of row[0..n): the log of the softmax's normaliser (lse) and the top k
-- ids by logit (ties: lower id first), as { id, logprob } in descending order.
local function log_softmax_top(row, n, k)
  local mx = -math.huge
  for i = 0, n - 1 do if row[i] > mx then mx = row[i] end end
  local sum = 0
  for i = 0, n - 1 do sum = sum + math.exp(row[i] - mx) end
  local lse = mx + math.log(sum)
  local top = {}
  if k > 0 then
    -- a sorted list of at most k: insertion when a logit beats the smallest kept
    for i = 0, n - 1 do
      local v = row[i]
      if #top < k or v > top[#top][2] then
        local at = #top + 1
        while at > 1 and top[at - 1][2] < v do at = at - 1 end
        table.insert(top, at, { i, v })
        if #top > k then top[#top] = nil end
      end
    end
    for _, t in ipairs(top) do t[2] = t[2] - lse end
  end
  return lse, top
end
M.log_softmax_top = log_softmax_top

-- The id r samples from its row of logits (a float* of at least r.n_sample), its logprobs kept.
function M.sample(r, row)
  local h = state(r)
  local n = r.n_sample
  local lse, top
  if r.logprobs then lse, top = log_softmax_top(row, n, r.logprobs) end
  local from = row
  if r.constraint then
    ffi.copy(h.scratch, row, 4 * n)
    r.constraint:apply(h.scratch, n)
    from = h.scratch
  end
  local id = h.sampler:sample(from, h.history, h.n)
  if h.n < h.cap then h.history[h.n] = id h.n = h.n + 1 end
  if r.logprobs then
    r.token_logprobs = r.token_logprobs or {}
    r.token_logprobs[#r.token_logprobs + 1] = { id = id, logprob = row[id] - lse, top = top }
  end
  if r.constraint and not r.stop[id] then
    local ok, err = r.constraint:accept(id)
    if not ok then error(string.format("request %d: the grammar refused token %d it allowed: %s", r.id, id, tostring(err)), 0) end
  end
  return id
end

-- Whether r's grammar is complete and allows nothing more: r ends there (finish reason "stop").
function M.must_end(r) return r.constraint ~= nil and r.constraint:must_end() end

return M
