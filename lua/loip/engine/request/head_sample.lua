-- Sampling at the head, for requests that need the model's distribution itself rather than a
-- sampled id: those asking for logprobs (the log-probabilities of the chosen tokens and of the
-- most likely ones), and those under a grammar (constrained decoding: a mask over the
-- vocabulary applied where the token is sampled). Such a request's sampling rows come back from
-- the engine as logits (LOIP_TOKF_LOGITS: the local engine's buffer, or the ring's last device's
-- result) and are sampled here by the request's own head (runtime/exec/head.c, the engines'
-- C head) — the same C sampler, seed and history as the engine's, so asking for logprobs does
-- not change a request's tokens.
--
--   r.logprobs    nil, or the number of top alternatives to report per token (0: the chosen one's)
--   r.constraint  nil, or a grammar's matcher (loip.text.grammar's Matcher): its handle masks the
--                 row in C (-inf on what is not allowed); accept(id) -> true | nil, err, must_end()
--   r.token_logprobs  filled: per generated token { id, logprob, top = { {id, logprob}... } }
--
-- The log-probabilities are the model's: a log-softmax of the raw logits over the ids a request
-- samples from (n_sample), before any mask, penalty or temperature.
local ffi = require "ffi"
local core = require "loip.core"
local sampler = require "loip.model.sampler"
local rhead = require "loip.runtime.head"

local M = {}

-- Whether r is sampled here.
function M.wants(r) return r.logprobs ~= nil or r.constraint ~= nil end

-- r's own head (loip.runtime.head, one slot): its sampler, of r's seed, with r's prompt as the
-- history, and room for what a sample gives back.
local function state(r)
  local h = r.head_state
  if h then return h end
  local o = {}
  for k, v in pairs(r.sampler or {}) do o[k] = v end
  o.seed = r.seed
  local prompt = r.prompt0 or r.prompt
  local ids = ffi.new("int32_t[?]", #prompt + 1)
  for i, id in ipairs(prompt) do ids[i - 1] = id end
  local k = r.logprobs or 0
  h = { head = core.must(rhead.head_new(1, 1)), token = ffi.new("int32_t[1]"), logprob = ffi.new("double[1]"),
    n_top = ffi.new("int32_t[1]"), top_ids = ffi.new("int32_t[?]", k + 1), top_logprobs = ffi.new("double[?]", k + 1) }
  local p, seed = sampler.params(o)
  core.must(rhead.head_start(h.head, 0, p, seed, r.n_sample, ids, #prompt, #prompt + r.max_tokens + 1))
  r.head_state = h
  return h
end

-- The id r samples from its row of logits (a float* of at least r.n_sample), its logprobs kept.
function M.sample(r, row)
  local h = state(r)
  core.must(rhead.head_sample(h.head, 0, row, r.constraint and r.constraint.handle or nil, r.logprobs or -1, h.token,
    h.logprob, h.top_ids, h.top_logprobs, h.n_top, "sampler"))
  local id = h.token[0]
  if r.logprobs then
    local top = {}
    for j = 0, h.n_top[0] - 1 do top[j + 1] = { h.top_ids[j], h.top_logprobs[j] } end
    r.token_logprobs = r.token_logprobs or {}
    r.token_logprobs[#r.token_logprobs + 1] = { id = id, logprob = h.logprob[0], top = top }
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
