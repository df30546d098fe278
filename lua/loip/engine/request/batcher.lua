-- Requests and continuous batching: the one path by which tokens are generated, on one device
-- in-process (loip.engine.local), on a cluster (loip.engine.ring) or simulated (loip.sim).
-- Every request is an object of its own (its id, its sequence slot with its own KV cache on
-- every device, its sampler, its stop conditions); one loop admits requests into the running micro-batch at step
-- boundaries and retires them when done, so that each step runs every stage once for the
-- whole batch: an offloaded block read once serves every request in it.
--
--   local b = batcher.new(engine, { max_batch = 8, max_queue = 64 })
--   local r = b:submit{ prompt = ids, max_tokens = 50, sampler = { temperature = 0 }, stop = { [2] = true } }
--   for id in r:tokens() do ... end          -- interleave several requests' iterators freely
--   r:cancel()                                 -- frees its slot and KV at the next step boundary
--
-- A step: every decoding request contributes its last token; prefilling requests contribute
-- chunks of their prompts in what is left of the step's token budget (engine.step_tokens), so a
-- newcomer's prompt is prefilled alongside the others' decoding rather than stalling them for
-- a whole prompt. KV is reserved at admission for the request's whole context (prompt and
-- max_tokens) out of engine.kv_tokens, so that a running request never runs out of cache; a
-- request that does not fit yet waits in a bounded queue, one that never can is refused.
--
-- The engine (loip.engine's interface): { max_seqs, context, kv_tokens, kv_block, step_tokens, logits_tokens, vocab,
--   start(self, seq, request), step(self, toks) -> outs, finish(self, seq, request),
--   idle(self) (optional: nothing runs), clock (optional: a function giving the time in ms;
--   default loip.core.now_ms; loip.sim's is simulated) }, toks a list of { seq, pos, request, id, flags },
--   outs a list of { seq, request, id, logits (a float* row, valid until the next step) }.
local ffi = require "ffi"
local bit = require "bit"
local core = require "loip.core"
local errors = require "loip.error"
local tree = require "loip.engine.request.tree"
local request_draft = require "loip.engine.request.draft"
local head_sample = require "loip.engine.request.head_sample"
local choices = require "loip.engine.request.choices"
local prefix_cache = require "loip.engine.request.prefix_cache"
local sampler_mod = require "loip.model.sampler"
local online_mod = require "loip.engine.request.online"
local handle = require "loip.engine.request.handle"

local M = {}

local tokf = core.constants.tokf
local SAMPLE, LOGITS, RECOMPUTE, DRAFT, PEEK = tokf.SAMPLE, tokf.LOGITS, tokf.RECOMPUTE, tokf.DRAFT, tokf.PEEK

-- A request refused (loip.error): kind "overloaded" (a server answers 429), "too_long" (400),
-- "invalid" (400); param: the request's field to blame ("prompt" for a prompt too long, whatever
-- field holds it; "max_tokens", "n").
local function refusal(kind, msg, param)
  return errors.new(kind, msg, { param = param })
end
M.refusal = refusal

local Batcher = {}
local Request = handle.Request -- (what a caller holds: r:next(), r:tokens(), r:wait(), r:cancel(), r:timings())

-- r's sampling temperature (its sampler's, else the default): > 0 draws from the sampler's stream.
local function temperature(r)
  local t = r.sampler and r.sampler.temperature
  if t == nil then t = sampler_mod.defaults.temperature end
  return t
end
Batcher.__index = Batcher

-- opts: max_batch (requests decoding at once; default the engine's slots), max_queue (requests
-- waiting; default 64), prefill_chunk (most prompt tokens of one request per step; default the
-- step's budget), prefill ("chunked", the default: newcomers' prompts ride in the steps beside
-- the others' decoding; "own": a step with prompts carries nothing else, the others wait for it
-- — recipes/bench/serve.lua --prefill measures both), online (a loip.policy "online" table: its
-- on_step runs before every step; loip.engine.request.online), links (a loip.policy "links" schedule:
-- the emulated links change between steps), prefix_cache (true, or { dir, bytes } with a disk
-- tier: requests reuse the KV of prefixes the devices hold, loip.engine.request.prefix_cache, when the
-- engine has cache_lookup).
function M.new(engine, opts)
  opts = opts or {}
  local max_batch = math.min(opts.max_batch or engine.max_seqs, engine.max_seqs)
  if max_batch < 1 then error("batcher: max_batch must be at least 1", 2) end
  if opts.prefill and opts.prefill ~= "chunked" and opts.prefill ~= "own" then
    error("batcher: prefill must be \"chunked\" or \"own\", not " .. tostring(opts.prefill), 2)
  end
  local b = setmetatable({ engine = engine, max_batch = max_batch, max_queue = opts.max_queue or 64,
    prefill_chunk = opts.prefill_chunk, prefill = opts.prefill or "chunked", queue = {}, running = {}, free_seqs = {}, next_id = 0,
    kv_groups = math.ceil(engine.kv_tokens / engine.kv_block), kv_used = 0, now = engine.clock or core.now_ms,
    stats = { steps = 0, tokens = 0, requests = 0, finished = 0, batch_sum = 0, step_ms = 0 }, adaptations = {},
    link_changes = {} }, Batcher)
  if opts.online or opts.links then b.online = online_mod.new(b, opts.online, opts.links) end
  b.draft = opts.draft -- (loip.engine.request.draft: speculative decoding's drafts, verified in the step)
  -- (not beside an online policy that may lend KV: lending moves no shared group)
  b.shares_kv = not (b.online and b.online.policy and engine.lend)
  -- (sliding-window layers' rings too: a kept run's last group carries them, loip.engine.request.prefix_cache)
  if opts.prefix_cache and engine.cache_lookup and b.shares_kv then b.prefix = prefix_cache.new(engine, opts.prefix_cache) end
  for s = max_batch - 1, 0, -1 do b.free_seqs[#b.free_seqs + 1] = s end
  return b
end

local function groups_for(b, tokens) return math.ceil(tokens / b.engine.kv_block) end

-- Queue a request. spec: prompt (ids, non-empty), max_tokens (default: to the end of the
-- context; clamped there), sampler (loip.model.sampler fields), seed, n_sample (ids sampled
-- over; default the vocabulary), stop (set of ids ending it, not returned), logits (true: return
-- the logits of every prompt position in r.logits and generate nothing), strict (true: a prompt
-- plus max_tokens past the context is refused rather than clamped), logprobs (the number of
-- top alternatives to report per token, 0 for the chosen one's: r.token_logprobs), constraint (a
-- grammar's matcher: loip.engine.request.head_sample; each choice gets a clone); with either, r's tokens
-- are sampled at the head; n (choices of the prompt, default 1: loip.engine.request.choices; the request
-- returned is the first, its .choices all n), draft (its own drafts: a Draft:variant of the
-- batcher's, loip.engine.request.draft; false: none; nil: the batcher's). Raises a refusal (kind "too_long", "overloaded" or
-- "invalid") when it cannot be served.
function Batcher:submit(spec)
  local e = self.engine
  local prompt = spec.prompt
  if type(prompt) ~= "table" or #prompt == 0 then error("batcher: a request needs a non-empty prompt (token ids)", 2) end
  local n = #prompt
  if n >= e.context and not spec.logits then
    error(refusal("too_long", string.format("the prompt has %d tokens; the context holds %d, with room for at least one more",
      n, e.context), "prompt"), 0)
  end
  if n > e.context then
    error(refusal("too_long", string.format("%d tokens exceed the context of %d", n, e.context), "prompt"), 0)
  end
  local room = e.context - n
  local max_tokens = spec.logits and 0 or spec.max_tokens or room
  if spec.strict and max_tokens > room then
    error(refusal("too_long", string.format("the context holds %d tokens: %d in the prompt leave room for %d, and %d were asked for",
      e.context, n, room, max_tokens), "max_tokens"), 0)
  end
  max_tokens = math.max(0, math.min(max_tokens, room))
  local need = groups_for(self, n + max_tokens)
  if need > self.kv_groups then
    error(refusal("too_long", string.format("%d tokens of KV cache (prompt %d, max_tokens %d) exceed the %d the devices hold",
      n + max_tokens, n, max_tokens, self.kv_groups * e.kv_block), groups_for(self, n) > self.kv_groups and "prompt" or "max_tokens"), 0)
  end
  if #self.queue >= self.max_queue then
    error(refusal("overloaded", string.format("%d requests are waiting already (max_queue %d)", #self.queue, self.max_queue)), 0)
  end
  local r = setmetatable({ batcher = self, id = self:new_id(), prompt = prompt, n_prompt = n, max_tokens = max_tokens,
    sampler = spec.sampler or {}, seed = spec.seed or 0, n_sample = spec.n_sample or e.vocab, stop = spec.stop or {},
    want_logits = spec.logits, logprobs = spec.logprobs, constraint = spec.constraint,
    draft_policy = spec.draft, groups = need, state = "queued", pos = 0, token_ids = {}, pending = {}, head = 1, tail = 0,
    t_submit = self.now() }, Request)
  r.at_head = head_sample.wants(r) and not spec.logits or nil
  choices.attach(self, r, spec, Request, refusal)
  self.queue[#self.queue + 1] = r
  self.stats.requests = self.stats.requests + 1
  if not self.stepping then self:admit() end
  return r
end

function Batcher:new_id()
  self.next_id = self.next_id % 4294967295 + 1
  return self.next_id
end

-- Admit queued requests in order while there is a slot and KV for them.
function Batcher:admit()
  while #self.queue > 0 and #self.free_seqs > 0 do
    local r = self.queue[1]
    if r.state ~= "queued" then table.remove(self.queue, 1) -- cancelled while waiting
    elseif self.kv_used + choices.reserve(r) > self.kv_groups or #self.free_seqs < choices.slots(r) then break
    else
      table.remove(self.queue, 1)
      r.seq = table.remove(self.free_seqs)
      self.kv_used = self.kv_used + choices.reserve(r)
      if #self.running == 0 and self.engine.idle then self.engine:idle() end
      local ok, err = pcall(prefix_cache.admit, self, r)
      if ok then ok, err = pcall(self.engine.start, self.engine, r.seq, r) end
      if not ok then
        -- a device found lost meanwhile (its START or LOOKUP unanswered): the others plan again,
        -- the running requests resume, and r waits first in the queue to be admitted on the new
        -- plan; any other error is r's
        self.free_seqs[#self.free_seqs + 1], r.seq = r.seq, nil
        self.kv_used = self.kv_used - choices.reserve(r)
        r.attach, r.cached_tokens = nil, nil
        table.insert(self.queue, 1, r)
        local resumed, rerr = self:resumed(err)
        if not resumed then
          table.remove(self.queue, 1)
          self:retire(r, "error", rerr)
          error(rerr, 0)
        end
        goto next
      end
      prefix_cache.started(r)
      r.state, r.t_admit = "prefill", self.now()
      self.running[#self.running + 1] = r
      choices.admit(self, r)
    end
    ::next::
  end
end

-- err, met by a call to the engine while requests run: when the engine lost a device and
-- planned again over the others (a step finds it so; engine.recover: so did a control round, a
-- START, a LOOKUP, an online policy's STATS), every running request resumes from its tokens and
-- true is returned. Else false and the error (err, or why the resuming or the re-plan failed).
function Batcher:resumed(err)
  if not errors.is(err, "replanned") and self.engine.recover then err = self.engine:recover(err) end
  if not errors.is(err, "replanned") then return false, err end
  local ok, rerr = pcall(self.resume_all, self)
  if not ok then return false, rerr end
  return true
end

-- r leaves the batch: its slot and KV go back (the engine is told, unless it failed).
function Batcher:retire(r, reason, err)
  if r.state == "done" then return end
  local was = r.state
  r.state, r.finish_reason, r.error, r.t_done = "done", reason, err, self.now()
  if r.seq then
    for i, x in ipairs(self.running) do
      if x == r then table.remove(self.running, i) break end
    end
    if was ~= "queued" and was ~= "waiting" and not self.failed then
      prefix_cache.retire(self, r, reason)
      pcall(self.engine.finish, self.engine, r.seq, r)
    end
    self.free_seqs[#self.free_seqs + 1] = r.seq
    r.seq = nil
    choices.release(self, r, reason, err)
  elseif r.choices then
    choices.release(self, r, reason, err, true)
  end
  self.stats.finished = self.stats.finished + 1
  local d = self:draft_of(r)
  if d then d:finish(r) end
  if r.on_done then r.on_done(r) end
end

-- The requests that decode in this step, one token each (prefill "own": none while a prompt
-- waits), with the step's token budget and rows of logits left after them (the rows the engine
-- returns in a step: logits requests' and those sampled at the head).
function Batcher:decoding()
  local e = self.engine
  local budget, logit_rows = e.step_tokens, e.logits_tokens
  local prompts_wait = false
  if self.prefill == "own" then
    for _, r in ipairs(self.running) do if r.state == "prefill" then prompts_wait = true break end end
  end
  local decoding = {}
  for _, r in ipairs(self.running) do
    local room = not r.at_head or logit_rows > 0
    if r.state == "decode" and budget > (r.refeed or 0) and not prompts_wait and room then
      if r.at_head then logit_rows = logit_rows - 1 end
      decoding[#decoding + 1] = r
      budget = budget - 1 - (r.refeed or 0) -- (and the rows of its last tree's path fed again)
    end
  end
  return decoding, budget, logit_rows
end

-- The drafts request r uses: its own (r.draft_policy, a Draft:variant: an API request's `draft`),
-- none (r.draft_policy == false: it asked for none), else the batcher's.
function Batcher:draft_of(r)
  if r.draft_policy == false then return nil end
  return r.draft_policy or self.draft
end

-- The rows request r's drafts may take in a step (within the step's budget, the rows sampled at
-- once and the context), and the depth of its tokens still to come.
local function draft_room(b, r, budget, sample_left)
  local rows_room = math.min(budget, sample_left, b.engine.context - 1 - r.pos - (r.refeed or 0))
  if (r.evicted or 0) > 0 or r.at_head then rows_room = 0 end
  return math.max(0, rows_room), r.max_tokens - #r.token_ids - 1
end

-- Speculative decoding: each decoding request's drafts ride after its last token, verified in
-- this step (within the step's budget, the rows the engine samples at once, the request's
-- max_tokens and the context: the KV reserved for it holds every drafted position). Returns the
-- drafts by request and the budget left.
function Batcher:drafts_for(decoding, budget)
  local e, drafts = self.engine, {}
  if not self.draft then return drafts, budget end
  local sample_left = (e.sample_rows or e.step_tokens) - #decoding
  for _, r in ipairs(self.running) do if r.state == "prefill" then sample_left = sample_left - 1 end end
  local rows = #decoding
  -- (best-first trees built together, a draft forward for them all a round, each with its room alone)
  request_draft.trees_together(decoding, function(r) return self:draft_of(r) end,
    function(r) return draft_room(self, r, budget, sample_left) end)
  for _, r in ipairs(decoding) do
    -- (a tree's rows are bounded by the step's and the context's room, its depth by max_tokens)
    local rows_room, depth = draft_room(self, r, budget, sample_left)
    local room = math.min(rows_room, depth)
    local d = self:draft_of(r)
    local ids = d and d:for_step(r, rows, math.max(0, room), { rows = rows_room, depth = depth }) or {}
    if #ids > 0 and d:peeking() then ids.peek = true end -- (its rows' own guesses come back: PEEK)
    drafts[r] = ids
    budget, sample_left, rows = budget - #ids, sample_left - #ids, rows + #ids
  end
  return drafts, budget
end

-- The prompt chunks of the step, oldest request first, in what is left of its budget and rows of
-- logits: rows added to toks and owners.
function Batcher:prompt_rows(toks, owners, budget, logit_rows)
  for _, r in ipairs(self.running) do
    if r.state == "prefill" and budget > 0 then
      local k = math.min(budget, (r.share_at or r.n_prompt) - r.pos, self.prefill_chunk or budget)
      if r.want_logits then k = math.min(k, logit_rows) logit_rows = logit_rows - k end
      if r.at_head and r.pos + k == r.n_prompt and r.max_tokens > 0 then
        -- its last row comes back as logits: within the step's rows of them, else the next step
        if logit_rows > 0 then logit_rows = logit_rows - 1 else k = k - 1 end
      end
      for j = 1, k do
        local p = r.pos + j - 1
        local last = p == r.n_prompt - 1
        local flags = r.want_logits and LOGITS or ((last and r.max_tokens > 0) and (r.at_head and LOGITS or SAMPLE) or 0)
        toks[#toks + 1] = { seq = r.seq, pos = p, request = r.id, id = r.prompt[p + 1], flags = flags }
        owners[#toks] = r
      end
      budget = budget - k
    end
  end
end

-- The step's rows (toks, and the request owning each) and the decoding requests' drafts.
function Batcher:rows()
  local decoding, budget, logit_rows = self:decoding()
  local drafts
  drafts, budget = self:drafts_for(decoding, budget)
  local toks, owners = {}, {}
  for _, r in ipairs(decoding) do
    local at = tree.refeed_rows(r, toks, owners)
    toks[#toks + 1] = { seq = r.seq, pos = at, request = r.id, id = r.token_ids[#r.token_ids], flags = r.at_head and LOGITS or SAMPLE }
    owners[#toks] = r
    for j in ipairs(drafts[r] or {}) do
      toks[#toks + 1] = tree.draft_row(r, at, j, drafts[r])
      if drafts[r].peek then toks[#toks].flags = toks[#toks].flags + PEEK end
      owners[#toks] = r
    end
  end
  self:prompt_rows(toks, owners, budget, logit_rows)
  return toks, owners, decoding, drafts
end

-- Run the step's rows through the online policy and the engine: the outputs, or nil when the
-- engine lost a device and every request resumed on a new plan. A failure retires every
-- running request with its error and raises it.
function Batcher:run_rows(toks, owners)
  local e = self.engine
  self.stepping = true
  local ok, outs, engine_failed = true, nil, false
  if self.online then ok, outs = pcall(self.online.before_step, self.online, toks) end
  if ok then ok, outs = pcall(self.with_recomputed, self, toks, owners) end
  if ok then
    ok, outs = pcall(e.step, e, toks)
    engine_failed = not ok
  end
  self.stepping = nil
  if ok then return outs end
  -- the engine lost a device and planned again over the others (in the step, or in the online
  -- policy's STATS or CHANGE), or the online policy had it plan again for a longer context:
  -- every request's KV is gone; each is started again with its tokens so far as its prompt
  -- (its sampler resumed where it was) and prefilled on the new plan, so that it goes on with
  -- the tokens it would have had
  local resumed, err = self:resumed(outs)
  if resumed then return nil end
  if err ~= outs then engine_failed, outs = true, err end
  if engine_failed and self.online and self.online.policy and errors.is(outs, "out_of_memory") then
    -- a device's budget broke in a step the online policy let run: say which policy that was
    outs = outs .. string.format(" (the online policy %s did not make room before this step)", self.online:name())
  end
  self:fail_step(outs, engine_failed)
end

-- A step failed with err, which no re-plan mends: every request in it fails with err (its
-- caller gets the error, a server's client a 500) and err is raised. A request left running
-- would fail the same way at every step after, and its client wait forever. After the engine's
-- own failure (engine_failed) its state is unknown: it is not told of each request (its slots
-- are reset when next started); else (an online policy that could not make room, a draft
-- policy's error) it is told as usual.
function Batcher:fail_step(err, engine_failed)
  local failed = {}
  for _, r in ipairs(self.running) do failed[#failed + 1] = r end
  self.failed = engine_failed
  for _, r in ipairs(failed) do self:retire(r, "error", err) end
  self.failed = nil
  error(err, 0)
end

-- How many positions each request's rows in the step advance it (its recomputed rows aside;
-- a request that drafted: its last token and its accepted drafts, tree.kept).
function Batcher:advanced(toks, owners, outs, drafts, by_seq)
  local seen = {}
  for i, t in ipairs(toks) do
    local r = owners[i]
    if r and t.flags ~= RECOMPUTE then seen[r] = (seen[r] or 0) + 1 end
  end
  if self.draft then
    -- a request that drafted keeps the KV of its last token and of its accepted drafts: its
    -- position moves by the tokens it got (the rejected rows are written over from there)
    -- (outputs flagged PEEK: the guesses of a request's draft rows off its accepted path, for
    -- its draft policy; they are not tokens)
    local got, said, peeks = {}, {}, {}
    for _, o in ipairs(outs) do
      local r = by_seq[o.seq]
      if r and r.id == o.request and drafts[r] then
        local peek = bit.band(o.flags or 0, PEEK) ~= 0
        local t = peek and peeks or said
        t[r] = t[r] or {}
        t[r][#t[r] + 1] = o.id
        if not peek then got[r] = (got[r] or 0) + 1 end
      end
    end
    for r, ids in pairs(drafts) do
      if #ids > 0 then seen[r] = tree.kept(r, ids, got[r] or 0, outs) end
      local d = self:draft_of(r)
      if d then d:observe(r, #ids, got[r] or 0, said[r]) end
      if d and ids.peek then d:peeked(r, ids, said[r] or {}, peeks[r] or {}) end
    end
  end
  return seen
end

-- The step's outputs to their requests: logits rows kept, ids sampled at the head or by the
-- engine delivered.
function Batcher:deliver_outputs(outs, by_seq, now)
  local e = self.engine
  for _, o in ipairs(outs) do
    local r = by_seq[o.seq]
    if r and r.id == o.request and bit.band(o.flags or 0, PEEK) == 0 then
      if r.want_logits then
        local V = e.vocab
        r.logits = r.logits or ffi.new("float[?]", r.n_prompt * V)
        r.logit_rows = (r.logit_rows or 0)
        ffi.copy(r.logits + r.logit_rows * V, o.logits, 4 * V)
        r.logit_rows = r.logit_rows + 1
      elseif r.at_head then
        if o.logits == nil then error(string.format("request %d: the engine returned no logits to sample at the head", r.id), 0) end
        self:deliver(r, head_sample.sample(r, o.logits), now)
      else
        self:deliver(r, o.id, now)
      end
    end
  end
end

-- One step of the running batch (admitting first). false when nothing runs.
function Batcher:step()
  self:admit()
  if #self.running == 0 then return false end
  -- (a draft on a device that is lost: the others plan again, every request resumes on them)
  local okr, toks, owners, decoding, drafts = pcall(self.rows, self)
  if not okr then
    local resumed, err = self:resumed(toks)
    if resumed then return true end
    self:fail_step(err)
  end
  if #toks == 0 then return true end
  local t0 = self.now()
  local outs = self:run_rows(toks, owners)
  if not outs then return true end
  local ok, err = pcall(self.took, self, toks, owners, decoding, drafts, outs, t0)
  if not ok then self:fail_step(err) end
  return true
end

-- After the engine ran a step's rows (toks, owners; decoding and drafts as Batcher:rows gave
-- them; outs the engine's; t0 when it began): positions advance, the drafts are judged and
-- the outputs go to their requests.
function Batcher:took(toks, owners, decoding, drafts, outs, t0)
  local now = self.now()
  local st = self.stats
  st.steps, st.tokens, st.step_ms = st.steps + 1, st.tokens + #toks, st.step_ms + (now - t0)
  self.last_step = { ms = now - t0, tokens = #toks }
  -- positions advance; outputs go to their requests
  local by_seq = {}
  for _, r in ipairs(self.running) do by_seq[r.seq] = r end
  local seen = self:advanced(toks, owners, outs, drafts, by_seq)
  if self.draft and (not next(drafts) or #decoding == #toks - self:drafted_rows(drafts)) then self.draft:measured(#toks, now - t0) end
  if self.draft then self.draft:stepped(now - t0) end
  local n_decoding = 0
  for r, k in pairs(seen) do
    r.pos = r.pos + k
    if r.state == "decode" then n_decoding = n_decoding + 1 end
  end
  st.batch_sum = st.batch_sum + n_decoding
  self:deliver_outputs(outs, by_seq, now)
  choices.after_step(self)
  for r in pairs(seen) do
    if r.state == "prefill" and r.pos >= r.n_prompt then
      if r.want_logits or r.max_tokens == 0 then self:retire(r, "length") else r.state = "decode" end
    end
  end
end

-- The rows of a step's drafts.
function Batcher:drafted_rows(drafts)
  local n = 0
  for _, ids in pairs(drafts) do n = n + #ids end
  return n
end

-- Evict-and-recompute (the baselines' KV handling; an online policy's control.evict): a
-- request whose first r.evicted positions keep no KV brings them along in every step, as rows
-- before its own (flagged RECOMPUTE: the devices evict them then, and recompute their K/V one
-- layer at a time). toks and owners grow in place.
function Batcher:with_recomputed(toks, owners)
  local any = false
  for _, r in ipairs(self.running) do any = any or (r.evicted or 0) > 0 end
  if not any then return end
  local out, own, done = {}, {}, {}
  for i, t in ipairs(toks) do
    local r = owners[i]
    if r and (r.evicted or 0) > 0 and not done[r] then
      done[r] = true
      for p = 0, r.evicted - 1 do
        out[#out + 1] = { seq = r.seq, pos = p, request = r.id, flags = RECOMPUTE,
          id = p < r.n_prompt and r.prompt[p + 1] or r.token_ids[p - r.n_prompt + 1] }
        own[#out] = r
      end
    end
    out[#out + 1] = t
    own[#out] = r
  end
  local limit = self.engine.max_step_tokens or self.engine.step_tokens
  if #out > limit then
    error(string.format("evict-and-recompute: the step needs %d rows (%d recomputed) and the plan's batch holds %d: "
      .. "plan with a larger batch", #out, #out - #toks, limit), 0)
  end
  for i = 1, #out do toks[i], owners[i] = out[i], own[i] end
end

-- After a re-plan (see Batcher:step): every running request from position 0 again, its prompt
-- and the tokens it has so far prefilled.
function Batcher:resume_all()
  self.resumes = (self.resumes or 0) + 1
  if self.online then self.online.memo = {} end
  local ok, err = pcall(self.start_again, self)
  -- (a device lost as they start again: the others plan again, and they start again once more;
  -- each loss leaves one device fewer, and a cluster with none left fails)
  while not ok do
    if self.engine.recover then err = self.engine:recover(err) end
    if not errors.is(err, "replanned") then error(err, 0) end
    self.resumes = self.resumes + 1
    ok, err = pcall(self.start_again, self)
  end
end

function Batcher:start_again()
  for _, r in ipairs(self.running) do
    r.prompt0 = r.prompt0 or r.prompt
    local full = {}
    for i, id in ipairs(r.prompt0) do full[i] = id end
    for _, id in ipairs(r.token_ids) do full[#full + 1] = id end
    r.prompt, r.n_prompt, r.pos, r.evicted, r.refeed = full, #full, 0, nil, nil
    r.logit_rows = r.want_logits and 0 or r.logit_rows
    -- (its sampler drew once a token, drafts or not: loip_sampler_verify)
    r.draws = temperature(r) > 0 and #r.token_ids or 0
    r.state = "prefill"
    choices.resume(self, r)
    prefix_cache.resume(r)
    self.engine:start(r.seq, r)
  end
end

-- A sampled id for r: stop, or keep it.
function Batcher:deliver(r, id, now)
  if r.state == "done" then return end
  if not r.t_first then r.t_first = now end
  r.state = "decode"
  if r.stop[id] then r.stop_id = id return self:retire(r, "stop") end
  r.token_ids[#r.token_ids + 1] = id
  r.tail = r.tail + 1
  r.pending[r.tail] = id
  r.t_last = now
  if r.on_token then r.on_token(r, id) end
  if r.at_head and head_sample.must_end(r) then return self:retire(r, "stop") end
  if #r.token_ids >= r.max_tokens or r.pos + (r.refeed or 0) + 1 >= self.engine.context then
    return self:retire(r, "length")
  end
end

-- Step until nothing runs or waits.
function Batcher:drain()
  while self:step() do end
end

function Batcher:busy() return #self.running > 0 or #self.queue > 0 end
function Batcher:queued() return #self.queue end
function Batcher:active() return #self.running end

return M
