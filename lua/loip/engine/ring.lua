-- The ring engine (loip.engine's interface) of a cluster (docs/serving.md): a request starts in
-- a sequence slot on every device, a step is one micro-batch around the ring (token ids into
-- device 1, hidden states hop to hop in C on the workers, sampled ids back from device N), a
-- request's end frees its slot's KV. A device lost mid-step makes the cluster plan again over
-- the others (Cluster:replan_after_loss). Its front-end (batcher, generate, logits) is
-- loip.engine's. Methods of loip.cluster's Cluster.
local ffi = require "ffi"
local core = require "loip.core"
local errors = require "loip.error"
local json = require "loip.text.json"
local transport = require "loip.runtime.transport"
local engine = require "loip.engine"
local tokenizer_mod = require "loip.text.tokenizer"
local K = core.constants

local Cluster = {}

-- Start request r (loip.engine.request.batcher) in slot seq on every device (sampler state on the last).
function Cluster:start(seq, r)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  -- (after a loss the others could not take over there is no plan to run: said at once, until a
  -- device is taken back or joins)
  if self.degraded then error("the cluster cannot serve now: " .. self.degraded, 0) end
  local body = json.encode({ seq = seq, request = r.id, sampler = r.sampler or {}, seed = r.seed or 0,
    n_sample = r.n_sample or self.vocab, prompt = r.prompt, max_tokens = r.max_tokens or 0, draws = r.draws, share = r.share,
    attach = r.attach })
  self:round({ kind = "START", payload = body }, 10000)
  self.active = (self.active or 0) + 1
end

-- Request r in slot seq is done: every device frees the slot (no reply).
function Cluster:finish(seq, r)
  self.active = math.max(0, (self.active or 1) - 1)
  local body = json.encode({ seq = seq, request = r.id, keep = r.keep, disk = r.keep and self.cache_disk })
  for i = 1, #self.devices do self:tell(i, { kind = "END", payload = body }) end
end

-- The prefix cache (loip.engine.request.prefix_cache): how many of keys, from the first, every device
-- holds for its layers (a LOOKUP round: the least of their answers).
function Cluster:cache_lookup(keys)
  local body, k = json.encode({ keys = keys, disk = self.cache_disk }), #keys
  for _, r in ipairs(self:round({ kind = "LOOKUP", payload = body }, 10000)) do
    local held = r and r.payload and json.decode(r.payload).held or 0
    k = math.min(k, held)
  end
  return k
end

-- The prefix cache's disk tier on every device: o = { dir, bytes, identity } (sent with each
-- LOOKUP and END: a device makes its tier from the first; loip.engine.request.prefix_disk).
function Cluster:cache_configure(o) self.cache_disk = o end

-- Each device's cache now (a STATS round): { groups, shared_groups, bytes, evictions } by device.
function Cluster:cache_stats()
  local out = {}
  for i, st in ipairs(self:stats()) do out[i] = st.prompt_cache or {} end
  return out
end

-- Each device's figures (loip.engine's device_stats; a STATS round): a device that measured
-- nothing yet counts 0 ms.
function Cluster:device_stats()
  local out = self:stats()
  for _, d in ipairs(out) do d.compute_ms, d.load_ms, d.stall_ms = d.compute_ms or 0, d.load_ms or 0, d.stall_ms or 0 end
  return out
end

-- Nothing runs and a request is about to start: a device that died meanwhile is a loss (the
-- others planned again: Cluster:check_alive), devices lost before are taken back (a new plan over
-- all of them, the next plan boundary), devices that failed are restarted (their KV is gone, and
-- nothing needs it now).
function Cluster:idle()
  local ok, err = pcall(self.check_alive, self)
  if not ok then io.stderr:write(os.date("%H:%M:%S "), "cluster: ", tostring(err), "\n") end
  if self:take_back() == 0 then self:revive() end
end

-- One micro-batch around the ring: toks (see loip.engine.request.batcher) into device 1, the outputs
-- back from device N.
function Cluster:step(toks)
  local n = #toks
  local payload = ffi.new("uint8_t[?]", n * (4 + ffi.sizeof("loip_step_token")))
  local ids = ffi.cast("int32_t *", payload)
  local tab = ffi.cast("loip_step_token *", payload + 4 * n)
  for i, t in ipairs(toks) do
    ids[i - 1] = t.id
    tab[i - 1].seq, tab[i - 1].pos, tab[i - 1].request, tab[i - 1].flags, tab[i - 1].id = t.seq, t.pos, t.request, t.flags, t.id
    tab[i - 1].parent = t.parent or 0 -- (a tree node's, rows back)
  end
  self.step_no = (self.step_no or 0) + 1
  local step = self.step_no
  local ok, err = self.devices[1].ctl:send({ kind = "TOKENS", plan_id = self.plan_id, hop = 0, step = step, n_tokens = n,
    dtype = K.I32, dim = 1, payload = payload, bytes = ffi.sizeof(payload) }, 5000)
  if not ok then error("device 1 (" .. self.devices[1].endpoint .. "): " .. err, 0) end
  local ok_wait, r = pcall(self.await, self, step)
  if not ok_wait then
    -- a device died, hangs or cannot be reached: plan again over the others (the batcher
    -- resumes every request from its tokens), unless told to fail
    local lost = false
    for _, d in ipairs(self.devices) do lost = lost or d.failed end
    if lost and (self.plan_opts and self.plan_opts.on_device_loss or "replan") == "replan" then
      self:replan_after_loss(r)
      errors.raise("replanned", tostring(r))
    end
    error(r, 0)
  end
  local k, V = r.n_tokens, self.vocab
  local OUT = ffi.sizeof("loip_step_output")
  if #r.payload < k * OUT then error(string.format("device %d: a result of %d outputs in %d bytes", #self.devices, k, #r.payload), 0) end
  local o = ffi.cast("const loip_step_output *", r.payload)
  local outs, n_logits = {}, 0
  for j = 0, k - 1 do
    local x = { seq = o[j].seq, request = o[j].request, id = o[j].id, flags = o[j].flags }
    if bit.band(x.flags, K.tokf.LOGITS) ~= 0 then n_logits = n_logits + 1 end
    outs[j + 1] = x
  end
  if #r.payload ~= k * OUT + n_logits * V * 4 then
    error(string.format("device %d: a result of %d bytes, %d outputs and %d logits rows of %d need %d", #self.devices,
      #r.payload, k, n_logits, V, k * OUT + n_logits * V * 4), 0)
  end
  if n_logits > 0 then
    -- (the payload string lives as long as r; the rows are copied into a buffer of their own)
    self.logits_buf = self.logits_buf and self.logits_rows >= n_logits and self.logits_buf or ffi.new("float[?]", n_logits * V)
    self.logits_rows = math.max(self.logits_rows or 0, n_logits)
    ffi.copy(self.logits_buf, ffi.cast("const uint8_t *", r.payload) + k * OUT, n_logits * V * 4)
    local row = 0
    for _, x in ipairs(outs) do
      if bit.band(x.flags, K.tokf.LOGITS) ~= 0 then x.logits = self.logits_buf + row * V row = row + 1 end
    end
  end
  return outs
end

-- The cost model's price (ms) of a step of `rows` rows on the plan (speculative decoding's draft
-- length weighs it: loip.engine.request.draft).
function Cluster:step_price(rows)
  if self.price_plan ~= self.plan_id then self.price_cache, self.price_plan = {}, self.plan_id end
  return engine.step_price(self.plan_table, self.problem_table, self.plan_opts and self.plan_opts.cost, rows, self.price_cache)
end

-- What loip.engine.request.online needs of each device (loip.engine.device_state): its memory outside
-- the KV cache, from the last PLAN or CHANGE reply; its stages and block sizes.
function Cluster:online_devices()
  local out = {}
  for i, d in ipairs(self.devices) do
    local m = d.mem_state or {}
    local e = self.estimate and self.estimate.devices and self.estimate.devices[i]
    out[i] = engine.device_state { stages = self.plan_table.devices[i].stages, limit = m.limit or d.mem or 0, nonkv = m.nonkv,
      kv_base = m.kv_base, group_bytes = m.group_bytes, slot_bytes = m.slot_bytes, block_bytes = self.sizes.block_bytes, sizes = self.sizes,
      -- KV lending: what device i lends (holder, groups per request) and the staging buffer it
      -- keeps (the largest stage blob so far)
      lend = self.lending and self.lending[i], staging_bytes = d.lend_staging, idle_ms = e and e.idle_ms }
  end
  return out
end

-- The rate each link is emulated at now (bytes/s; nil: not emulated), known at the head
-- without asking (state.link_rates).
function Cluster:link_rates()
  local out = {}
  local planned = self.plan_opts and self.plan_opts.link and self.plan_opts.link.rate
  for i = 1, #self.devices do
    local now = (self.link_now or {})[i]
    local rate = now and now.rate or (type(planned) == "table" and planned[i] or planned)
    out[i] = rate and transport.parse_rate(rate) or nil
  end
  return out
end

-- Each link's figures for an online policy: the rate it is emulated at (bytes/s; nil: not
-- emulated), and what its receiver measured (bandwidth of recent large messages, latency of
-- small ones). A STATS round trip to every device.
function Cluster:link_state()
  local N, out = #self.devices, {}
  local stats, rates = self:stats(), self:link_rates()
  for i = 1, N do
    local recv = stats[i % N + 1] or {}
    local l = { rate_Bps = rates[i] }
    for _, x in ipairs(recv.links or {}) do
      if x.peer == "d" .. i then l.measured_Bps, l.latency_ms = x.bandwidth_Bps, x.latency_ms end
    end
    out[i] = l
  end
  return out
end

-- The request loop of this cluster (loip.engine.batcher), made after the plan; opts (first
-- call only): max_queue, prefill_chunk, prefill; the plan's opts.online (a policy name, path
-- or table) is its online policy, opts.link_schedule its link schedule.
function Cluster:batcher(opts)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  if not self._batcher then
    self.max_seqs, self.kv_block = self.sizes.max_seqs, K.KV_BLOCK_TOKENS
    self.kv_tokens, self.context = self.sizes.kv_tokens, self.context
    self.cache_identity = "store:" .. self.store_id -- (the prefix cache's h_0, as loip.engine.request.prefix_cache.identity)
    self.step_tokens = self.batch
    self:plan_rows() -- (logits_tokens, sample_rows: the rows of a step the plan holds)
    local po = self.plan_opts or {}
    self._batcher = engine.batcher(self, setmetatable({ online = po.online, links = po.link_schedule, draft = po.draft,
      draft_tokens = po.draft_tokens, draft_target = { path = self.store, tokenizer = self:tokenizer(), context = self.context,
        vocab = self.vocab, max_seqs = self.max_seqs, cluster = self, draft_device = self.draft_device } },
      { __index = opts or {} }))
  end
  return self._batcher
end

-- What loip.engine's generate and logits need of this cluster (gen.tokenizer: a tokenizer to
-- use instead of the store's).
function Cluster:front(gen)
  if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 3) end
  local tok = gen and gen.tokenizer or self:tokenizer()
  return { batcher = function() return self:batcher() end, tokenizer = tok, context = self.context, vocab = self.vocab,
    tokenizer_error = self._tokenizer_error, stop_ids = engine.stop_ids(self.facts, tok), who = "cluster: " }
end

-- Logits of ids at positions 0.. (float array [#ids * vocab]), computed around the ring.
function Cluster:logits(ids) return (engine.logits(self:front(), ids)) end

-- The tokenizer of the cluster's store (the one `loip.model.open(store)` would run), opened
-- once; nil when the store has none.
function Cluster:tokenizer()
  if self._tokenizer == nil then
    local ok, t = pcall(tokenizer_mod.open, self.store, { vocab_size = self.vocab })
    self._tokenizer = ok and t or false
    self._tokenizer_error = not ok and t or nil
  end
  return self._tokenizer or nil
end

-- Generate from a prompt (text, or an array of token ids): loip.engine.generate, as one device
-- generates (gen: its options, and tokenizer: a tokenizer object to use instead of the store's).
function Cluster:generate(prompt, gen) return engine.generate(self:front(gen), prompt, gen) end

return Cluster
