-- The ring engine (loip.engine's interface) over a cluster (docs/serving.md): a request starts in
-- a sequence slot on every device, a step is one micro-batch around the ring (token ids into
-- device 1, hidden states hop to hop in C on the workers, sampled ids back from device N), a
-- request's end frees its slot's KV. It holds a cluster (loip.cluster's Cluster) and calls into
-- its parts: the transport (c.rpc) for every message, the member registry (c.registry) for
-- losses (a device lost mid-step makes the cluster plan again over the others) and the planner
-- (c.planner) for the plan and its live changes. Its front-end (batcher, generate, logits) is
-- loip.engine's; the Cluster's methods of those names call these.
--
--   local r = ring.new(c)                      -- c: loip.cluster's Cluster
--   engine: r:start, r:step, r:finish, r:idle, r:recover, r:cache_lookup, r:cache_configure,
--           r:cache_stats, r:step_price, r:restage, r:lend, r:replan_kv, r:set_link,
--           r:online_devices, r:link_rates, r:link_state; fields max_seqs, kv_block, kv_tokens,
--           step_tokens, logits_tokens, sample_rows, cache_identity (set with the request loop),
--           and the plan's context, vocab, sizes, draft_rows and devices (read from the parts)
--   front:  r:batcher(opts), r:generate(prompt, gen), r:logits(ids), r:tokenizer(), r:close()
--   for the planner: r:replacing_plan(keep_requests), r:planned();  r.step_no: the last step
local ffi = require "ffi"
local core = require "loip.core"
local errors = require "loip.error"
local json = require "loip.text.json"
local engine = require "loip.engine"
local prefix_cache = require "loip.engine.request.prefix_cache"
local tokenizer = require "loip.text.tokenizer"
local K = core.constants

local M = {}

local Ring = {}

-- The engine's fields that are the plan's, read where they live now: the planner's (set by each
-- plan) and the registry's device list.
local LIVE = { context = "planner", vocab = "planner", sizes = "planner", draft_rows = "planner", devices = "registry" }
function Ring.__index(r, k)
  local f = Ring[k]
  if f ~= nil then return f end
  local part = LIVE[k]
  if part then return r.c[part][k] end
end

function M.new(c) return setmetatable({ c = c }, Ring) end

-- Start request r (loip.engine.request.batcher) in slot seq on every device (sampler state on the last).
function Ring:start(seq, r)
  local c = self.c
  if not c.planner.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  -- (after a loss the others could not take over there is no plan to run: said at once, until a
  -- device is taken back or joins)
  if c.registry.degraded then error("the cluster cannot serve now: " .. c.registry.degraded, 0) end
  local body = json.encode({ seq = seq, request = r.id, sampler = r.sampler or {}, seed = r.seed or 0,
    n_sample = r.n_sample or c.planner.vocab, prompt = r.prompt, max_tokens = r.max_tokens or 0, draws = r.draws, share = r.share,
    attach = r.attach, window_at = r.window_at })
  c.rpc:round({ kind = "START", payload = body }, 10000)
end

-- Request r in slot seq is done: every device frees the slot (no reply).
function Ring:finish(seq, r)
  local body = json.encode({ seq = seq, request = r.id, keep = r.keep, disk = r.keep and self.cache_disk })
  for i = 1, #self.c.registry.devices do self.c.rpc:tell(i, { kind = "END", payload = body }) end
end

-- The prefix cache (loip.engine.request.prefix_cache): how many of keys, from the first, every device
-- holds for its layers and may start from (a LOOKUP round: what their answers agree on).
function Ring:cache_lookup(keys)
  local body, answers = json.encode({ keys = keys, disk = self.cache_disk }), {}
  for i, r in ipairs(self.c.rpc:round({ kind = "LOOKUP", payload = body }, 10000)) do
    answers[i] = r and r.payload and json.decode(r.payload) or { held = 0 }
  end
  return prefix_cache.agree(answers, #keys)
end

-- The prefix cache's disk tier on every device: o = { dir, bytes, identity } (sent with each
-- LOOKUP and END: a device makes its tier from the first; loip.engine.request.prefix_disk).
function Ring:cache_configure(o) self.cache_disk = o end

-- Each device's cache now (a STATS round): { groups, shared_groups, bytes, evictions } by device.
function Ring:cache_stats()
  local out = {}
  for i, st in ipairs(self.c:stats()) do out[i] = st.prompt_cache or {} end
  return out
end

-- Each device's figures (loip.engine's device_stats; a STATS round): a device that measured
-- nothing yet counts 0 ms.
function Ring:device_stats()
  local out = self.c:stats()
  for _, d in ipairs(out) do d.compute_ms, d.load_ms, d.stall_ms = d.compute_ms or 0, d.load_ms or 0, d.stall_ms or 0 end
  return out
end

-- /metrics: the cluster's own figures (the engine interface's metrics hook, loip.engine).
function Ring:metrics(m) return self.c:metrics(m) end

-- Nothing runs and a request is about to start: a device that died meanwhile is a loss (the
-- others planned again: the registry's check_alive), devices lost before are taken back (a new
-- plan over all of them, the next plan boundary), devices that failed are restarted (their KV is
-- gone, and nothing needs it now).
function Ring:idle()
  local reg = self.c.registry
  local ok, err = pcall(reg.check_alive, reg)
  if not ok then io.stderr:write(os.date("%H:%M:%S "), "cluster: ", tostring(err), "\n") end
  if reg:take_back() == 0 then reg:revive() end
end

-- err, met by a request's call to the cluster (a START, a LOOKUP round, an online policy's STATS
-- or CHANGE): a device found lost is a loss (the registry's recover).
function Ring:recover(err) return self.c.registry:recover(err) end

-- One micro-batch around the ring: toks (see loip.engine.request.batcher) into device 1, the outputs
-- back from device N.
function Ring:step(toks)
  local c = self.c
  local devices, plan_id = c.registry.devices, c.planner.plan_id
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
  local ok, err = devices[1].ctl:send({ kind = "TOKENS", plan_id = plan_id, hop = 0, step = step, n_tokens = n,
    dtype = K.I32, dim = 1, payload = payload, bytes = ffi.sizeof(payload) }, 5000)
  if not ok then error("device 1 (" .. devices[1].endpoint .. "): " .. err, 0) end
  local ok_wait, r = pcall(c.rpc.await, c.rpc, step, plan_id)
  if not ok_wait then
    -- a device died, hangs or cannot be reached: plan again over the others (the batcher
    -- resumes every request from its tokens), unless told to fail
    local lost = false
    for _, d in ipairs(devices) do lost = lost or d.failed end
    local po = c.planner.plan_opts
    if lost and (po and po.on_device_loss or "replan") == "replan" then
      c.registry:replan_after_loss(r)
      errors.raise("replanned", tostring(r))
    end
    error(r, 0)
  end
  local k, V = r.n_tokens, c.planner.vocab
  local OUT = ffi.sizeof("loip_step_output")
  if #r.payload < k * OUT then error(string.format("device %d: a result of %d outputs in %d bytes", #devices, k, #r.payload), 0) end
  local o = ffi.cast("const loip_step_output *", r.payload)
  local outs, n_logits = {}, 0
  for j = 0, k - 1 do
    local x = { seq = o[j].seq, request = o[j].request, id = o[j].id, flags = o[j].flags }
    if bit.band(x.flags, K.tokf.LOGITS) ~= 0 then n_logits = n_logits + 1 end
    outs[j + 1] = x
  end
  if #r.payload ~= k * OUT + n_logits * V * 4 then
    error(string.format("device %d: a result of %d bytes, %d outputs and %d logits rows of %d need %d", #devices,
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
function Ring:step_price(rows)
  local pl = self.c.planner
  if self.price_plan ~= pl.plan_id then self.price_cache, self.price_plan = {}, pl.plan_id end
  return engine.step_price(pl.plan_table, pl.problem_table, pl.plan_opts and pl.plan_opts.cost, rows, self.price_cache)
end

-- The plan's live changes between steps (loip.cluster.planner's).
function Ring:restage(i, stage, offloaded) return self.c.planner:restage(i, stage, offloaded) end
function Ring:lend(i, holder, groups) return self.c.planner:lend(i, holder, groups) end
function Ring:replan_kv(positions) return self.c.planner:replan_kv(positions) end
function Ring:set_link(i, rate, delay_ms) return self.c.planner:set_link(i, rate, delay_ms) end

-- What loip.engine.request.online sees of each device and link (the planner's figures).
function Ring:online_devices() return self.c.planner:online_devices() end
function Ring:link_rates() return self.c.planner:link_rates() end

-- Each link's figures for an online policy: the rate it is emulated at (bytes/s; nil: not
-- emulated), and what its receiver measured (bandwidth of recent large messages, latency of
-- small ones). A STATS round trip to every device.
function Ring:link_state()
  local N, out = #self.c.registry.devices, {}
  local stats, rates = self.c:stats(), self:link_rates()
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

-- Before a new plan (loip.cluster.planner's plan): requests running or waiting would lose their
-- KV caches, so a plan that does not keep them (keep_requests) is refused while any do; the
-- request loop is made again after it.
function Ring:replacing_plan(keep_requests)
  local b = self._batcher
  if b and b:busy() and not keep_requests then
    error(string.format("cluster: %d requests are running or waiting; a new plan would drop their KV caches",
      b:active() + b:queued()), 0)
  end
  if not keep_requests then self._batcher = nil end
end

-- The rows the request loop may give a step on this plan: step_tokens (the plan's batch: the
-- most a device takes in one message), logits_tokens (rows whose logits come back) and
-- sample_rows (rows the last device samples in one step: loip_device_new's out_cap).
local function plan_rows(self)
  local pl = self.c.planner
  self.step_tokens = pl.batch
  self.logits_tokens = pl.sizes.logits_tokens
  self.sample_rows = math.min(pl.batch, math.max(pl.sizes.logits_tokens or 1, pl.sizes.max_seqs or 1))
end

-- After a new plan: a request loop kept across it gives its steps the rows this plan holds.
function Ring:planned()
  if self._batcher then plan_rows(self) end
end

-- The request loop of this cluster (loip.engine.batcher), made after the plan; opts (first
-- call only): max_queue, prefill_chunk, prefill; the plan's opts.online (a policy name, path
-- or table) is its online policy, opts.link_schedule its link schedule.
function Ring:batcher(opts)
  local c, pl = self.c, self.c.planner
  if not pl.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
  if not self._batcher then
    self.max_seqs, self.kv_block = pl.sizes.max_seqs, K.KV_BLOCK_TOKENS
    self.kv_tokens = pl.sizes.kv_tokens
    self.kv_windows = pl.sizes.ringed ~= nil -- (sliding-window layers' rings)
    self.cache_identity = "store:" .. c.store_id -- (the prefix cache's h_0, as loip.engine.request.prefix_cache.identity)
    plan_rows(self) -- (step_tokens, logits_tokens, sample_rows: the rows of a step the plan holds)
    local po = pl.plan_opts or {}
    self._batcher = engine.batcher(self, setmetatable({ online = po.online, links = po.link_schedule, draft = po.draft,
      draft_tokens = po.draft_tokens, draft_target = { path = c.store, tokenizer = self:tokenizer(), context = pl.context,
        vocab = pl.vocab, max_seqs = self.max_seqs, cluster = c, draft_device = pl.draft_device } },
      { __index = opts or {} }))
  end
  return self._batcher
end

-- What loip.engine's generate and logits need of this cluster (gen.tokenizer: a tokenizer to
-- use instead of the store's).
function Ring:front(gen)
  local pl = self.c.planner
  if not pl.plan_table then error("cluster: no plan yet (call c:plan first)", 3) end
  local tok = gen and gen.tokenizer or self:tokenizer()
  return { batcher = function() return self:batcher() end, tokenizer = tok, context = pl.context, vocab = pl.vocab,
    tokenizer_error = self._tokenizer_error, stop_ids = engine.stop_ids(pl.facts, tok), who = "cluster: " }
end

-- Logits of ids at positions 0.. (float array [#ids * vocab]), computed around the ring.
function Ring:logits(ids) return (engine.logits(self:front(), ids)) end

-- The tokenizer of the cluster's store (the one `loip.model.open(store)` would run), opened
-- once; nil when the store has none.
function Ring:tokenizer()
  if self._tokenizer == nil then
    local ok, t = pcall(tokenizer.open, self.c.store, { vocab_size = self.c.planner.vocab })
    self._tokenizer = ok and t or false
    self._tokenizer_error = not ok and t or nil
  end
  return self._tokenizer or nil
end

-- Generate from a prompt (text, or an array of token ids): loip.engine.generate, as one device
-- generates (gen: its options, and tokenizer: a tokenizer object to use instead of the store's).
function Ring:generate(prompt, gen) return engine.generate(self:front(gen), prompt, gen) end

-- The tokenizer closed (the cluster closes).
function Ring:close()
  if self._tokenizer then self._tokenizer:close() end
  self._tokenizer = nil
end

return M
