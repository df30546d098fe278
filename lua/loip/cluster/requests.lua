-- Requests through the ring (docs/serving.md): the engine side of loip.serve.batcher for a
-- cluster. A request starts in a sequence slot on every device, a step is one micro-batch
-- around the ring, a request's end frees its slot's KV. Installed into loip.cluster's class.
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.tools.json"
local transport = require "loip.runtime.transport"
local C = core.C

local M = {}

function M.install(Cluster)
  -- Start request r (loip.serve.batcher) in slot seq on every device (sampler state on the last).
  function Cluster:start(seq, r)
    if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
    local body = json.encode({ seq = seq, request = r.id, sampler = r.sampler or {}, seed = r.seed or 0,
      n_sample = r.n_sample or self.vocab, prompt = r.prompt, max_tokens = r.max_tokens or 0, draws = r.draws })
    -- every device at once, then their answers
    for i = 1, #self.devices do self:tell(i, { kind = "START", payload = body }) end
    for i = 1, #self.devices do self:answer(i, "START", 10000) end
    self.active = (self.active or 0) + 1
  end

  -- Request r in slot seq is done: every device frees the slot (no reply).
  function Cluster:finish(seq, r)
    self.active = math.max(0, (self.active or 1) - 1)
    local body = json.encode({ seq = seq, request = r.id })
    for i = 1, #self.devices do self:tell(i, { kind = "END", payload = body }) end
  end

  -- Nothing runs: take back local devices lost mid-request (a new plan over all of them, the
  -- next plan boundary), restart devices that died (their KV is gone, and nothing needs it now).
  function Cluster:idle()
    if self:take_back() == 0 then self:revive() end
  end

  -- One micro-batch around the ring: toks (see loip.serve.batcher) into device 1, the outputs
  -- back from device N.
  function Cluster:step(toks)
    local n = #toks
    local payload = ffi.new("uint8_t[?]", n * (4 + ffi.sizeof("loip_step_token")))
    local ids = ffi.cast("int32_t *", payload)
    local tab = ffi.cast("loip_step_token *", payload + 4 * n)
    for i, t in ipairs(toks) do
      ids[i - 1] = t.id
      tab[i - 1].seq, tab[i - 1].pos, tab[i - 1].request, tab[i - 1].flags = t.seq, t.pos, t.request, t.flags
    end
    self.step_no = (self.step_no or 0) + 1
    local step = self.step_no
    local ok, err = self.devices[1].ctl:send({ kind = "TOKENS", plan_id = self.plan_id, hop = 0, step = step, n_tokens = n,
      dtype = C.LOIP_I32, dim = 1, payload = payload, bytes = ffi.sizeof(payload) }, 5000)
    if not ok then error("device 1 (" .. self.devices[1].endpoint .. "): " .. err, 0) end
    local ok_wait, r = pcall(self.await, self, step)
    if not ok_wait then
      -- a device died, hangs or cannot be reached: plan again over the others (the batcher
      -- resumes every request from its tokens), unless told to fail
      local lost = false
      for _, d in ipairs(self.devices) do lost = lost or d.failed end
      if lost and (self.plan_opts and self.plan_opts.on_device_loss or "replan") == "replan" then
        self:replan_after_loss(r)
        error(setmetatable({ replanned = true, msg = tostring(r) }, { __tostring = function(e) return e.msg end }), 0)
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
      if bit.band(x.flags, C.LOIP_TOKF_LOGITS) ~= 0 then n_logits = n_logits + 1 end
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
        if bit.band(x.flags, C.LOIP_TOKF_LOGITS) ~= 0 then x.logits = self.logits_buf + row * V row = row + 1 end
      end
    end
    return outs
  end

  -- What loip.serve.online needs of each device (its memory outside the KV cache, from the
  -- last PLAN or CHANGE reply; its stages and block sizes).
  function Cluster:online_devices()
    local out = {}
    for i, d in ipairs(self.devices) do
      local m = d.mem_state or {}
      local stages, kv_layers = {}, 0
      for s, st in ipairs(self.plan_table.devices[i].stages) do
        local kl = require("loip.plan").stage_kv_layers(st)
        stages[s] = { first = st.blocks[1], last = st.blocks[2], offloaded = st.offloaded or 0, kv_layers = kl }
        kv_layers = kv_layers + kl
      end
      local lend = self.lending and self.lending[i]
      out[i] = { limit = m.limit or d.mem or 0, nonkv = m.nonkv or 0, kv_base = m.kv_base or 0, group_bytes = m.group_bytes or 0,
        slot_bytes = m.slot_bytes or 0, stages = stages, block_bytes = self.sizes.block_bytes,
        -- KV lending: one layer's group (K and V), what device i lends (holder, groups per
        -- request) and the staging buffer it keeps (the largest stage blob so far)
        chunk_bytes = kv_layers > 0 and (m.group_bytes or 0) / kv_layers or 0,
        lend = lend and { holder = lend.holder, groups = lend.groups } or nil, staging_bytes = d.lend_staging or 0,
        idle_ms = self.estimate and self.estimate.devices and self.estimate.devices[i] and self.estimate.devices[i].idle_ms }
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

  -- The request loop of this cluster (loip.serve.batcher), made after the plan; opts (first
  -- call only): max_queue, prefill_chunk, prefill; the plan's opts.online (a policy name, path
  -- or table) is its online policy.
  function Cluster:batcher(opts)
    if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
    if not self._batcher then
      self.max_seqs, self.kv_block = self.sizes.max_seqs, C.LOIP_KV_BLOCK_TOKENS
      self.kv_tokens, self.context = self.sizes.kv_tokens, self.context
      self.step_tokens, self.logits_tokens = self.batch, self.sizes.logits_tokens
      local o = setmetatable({}, { __index = opts or {} })
      local online = require("loip.serve.online").choose(self.plan_opts and self.plan_opts.online)
      if online then o.online = require("loip.policy").load("online", online) end
      local links = self.plan_opts and self.plan_opts.link_schedule
      if links then o.links = require("loip.policy").load("links", links) end
      self._batcher = require("loip.serve.batcher").new(self, o)
    end
    return self._batcher
  end

  -- Logits of ids at positions 0.. (float array [#ids * vocab]), computed around the ring.
  function Cluster:logits(ids)
    local r = self:batcher():submit { prompt = ids, logits = true }
    r:wait()
    return r.logits
  end

  -- The tokenizer of the cluster's store (the one `loip.model.open(store)` would run), opened
  -- once; nil when the store has none.
  function Cluster:tokenizer()
    if self._tokenizer == nil then
      local ok, t = pcall(require("loip.text.tokenizer").open, self.store, { vocab_size = self.vocab })
      self._tokenizer = ok and t or false
      self._tokenizer_error = not ok and t or nil
    end
    return self._tokenizer or nil
  end

  -- Generate from a prompt (text, or an array of token ids), as loip.model's generate: an
  -- iterator of (id, text) (whole UTF-8 characters; a last pair (false, text) carries what was
  -- held back) and a state with .token_ids, .stats, .seed, .stop_reason and .request (the
  -- batcher's). Iterators of several calls may be interleaved: each is its own request, run in
  -- one micro-batch. gen: max_tokens (default: to the end of the context), temperature, top_k,
  -- top_p, min_p, repetition_penalty (or all of them in gen.sampler), seed, stop (ids, as a list
  -- or a set; default the model's end tokens, as one device stops), ignore_eos (true: the model's
  -- end tokens do not stop it, a stop given still does), bos (text: add BOS, default true),
  -- n_sample, tokenizer (a tokenizer object to use instead of the store's).
  function Cluster:generate(prompt, gen)
    gen = gen or {}
    if not self.plan_table then error("cluster: no plan yet (call c:plan first)", 2) end
    local tok = gen.tokenizer or self:tokenizer()
    local ids = prompt
    if type(prompt) == "string" then
      if not tok then error("cluster: the store has no tokenizer (" .. tostring(self._tokenizer_error) .. "): pass token ids", 2) end
      ids = tok:encode(prompt, { bos = gen.bos ~= false })
    end
    if type(ids) ~= "table" or #ids == 0 then error("cluster: generate needs a prompt (text or a non-empty array of ids)", 2) end
    if #ids >= self.context then
      error(string.format("cluster: %d prompt tokens leave no room in the context of %d", #ids, self.context), 2)
    end
    local stop = {}
    if gen.stop then
      for k, v in pairs(gen.stop) do
        if v == true then stop[k] = true else stop[v] = true end
      end
    elseif not gen.ignore_eos then
      for _, id in ipairs(require("loip.model").stop_ids(self.facts, tok)) do stop[id] = true end
    end
    local sampler = gen.sampler
    if not sampler then
      sampler = {}
      for _, k in ipairs({ "temperature", "top_k", "top_p", "min_p", "repetition_penalty" }) do sampler[k] = gen[k] end
    end
    local room = self.context - #ids
    local max_tokens = math.min(gen.max_tokens or room, room)
    local seed = gen.seed or (os.time() * 1000 + math.floor(os.clock() * 1e6))
    local req = self:batcher():submit { prompt = ids, max_tokens = max_tokens, sampler = sampler, seed = seed,
      n_sample = gen.n_sample or (tok and math.min(tok.vocab_size, self.vocab)) or nil, stop = stop }
    local state = { prompt_ids = ids, token_ids = req.token_ids, request = req, seed = seed,
      stats = { prefill_ms = 0, decode_ms = 0, decode_steps = 0, prompt_tokens = #ids } }
    local stream = tok and require("loip.text.tokenizer").text_stream(tok, ids)
    local done = false
    return function()
      if done then return nil end
      local id = req:next()
      local st = state.stats
      if req.t_first then st.prefill_ms = req.t_first - req.t_submit end
      if req.t_first and req.t_last then st.decode_ms = req.t_last - req.t_first end
      st.generated = #req.token_ids
      st.decode_steps = math.max(0, st.generated - 1)
      if id == nil then
        done = true
        state.stop_id = req.stop_id
        local why = req.finish_reason
        if why == "length" then why = max_tokens < room and "max_tokens" or "context" end
        state.stop_reason = why
        local rest = stream and stream:finish() or ""
        if rest ~= "" then return false, rest end
        return nil
      end
      return id, stream and stream:put(id) or ""
    end, state
  end
end

return M
