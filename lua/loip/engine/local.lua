-- The local engine (loip.engine's interface): one device in this process, the model's session
-- (several sequences sharing its KV pool) or its runner (offloaded blocks read once per step for
-- the whole batch); sampling here, with each request's own sampler and history. Its plan changes
-- live (restage, Model:restage) and an online policy sees its memory from its budget.
local ffi = require "ffi"
local core = require "loip.core"
local sampler = require "loip.model.sampler"
local exec = require "loip.runtime.exec"
local rhead = require "loip.runtime.head"
local prefix_cache = require "loip.engine.request.prefix_cache"
local prefix_disk = require "loip.engine.request.prefix_disk"
local engine_mod = require "loip.engine"
local kernels = require "loip.model.kernels"

local M = {}

local Engine = {}
Engine.__index = Engine

-- m: a loip.model (its session sized for m.max_seqs sequences and m.kv_tokens positions).
function M.new(m)
  local s = m:session()
  local T = m.batch
  local e = setmetatable({ model = m, session = s, max_seqs = exec.session_max_seqs(s), context = m.context,
    kv_tokens = m.kv_tokens, plan_positions = m.plan_sizes and m.plan_sizes.plan_positions or m.kv_tokens,
    kv_block = exec.session_kv_block_tokens(s), kv_windows = exec.session_kv_window_layers(s) > 0, step_tokens = T, cache_identity = prefix_cache.identity(m.path),
    logits_tokens = T, vocab = m.vocab_size,
    ids = ffi.new("int32_t[?]", T), bt = ffi.new("loip_batch_token[?]", T), toks = ffi.new("loip_step_token[?]", T),
    rows = ffi.new("int32_t[?]", T), outs = ffi.new("loip_step_output[?]", T), out_rows = ffi.new("int32_t[?]", T),
    counts = ffi.new("int32_t[3]") }, Engine)
  e:new_head()
  e:logits_room(math.max(1, e.max_seqs))
  return e
end

-- Each slot's sampler and history, and a step's outputs (loip.runtime.head), empty.
function Engine:new_head()
  self.head = core.must(rhead.head_new(math.max(1, self.max_seqs), self.step_tokens))
end

-- Room for n rows of logits (C packs one per token asked for): the rows a decoding step samples
-- (one a request), grown when a step asks for more (every position's logits, m:logits). Not a
-- row for every token a step may carry: no budget holds that (64 rows of a 128K vocabulary are
-- 33 MB), and the process's own memory beside its budget stays small.
function Engine:logits_room(n)
  if n > (self.logits_rows or 0) then self.logits, self.logits_rows = ffi.new("float[?]", n * self.vocab), n end
end

function Engine:start(seq, r)
  if self.broken then error(self.model.path .. ": " .. self.broken, 0) end
  local n = r.n_prompt
  rhead.head_end(self.head, seq)
  if not r.want_logits then
    local prompt = ffi.new("int32_t[?]", n + 1)
    for i = 1, n do prompt[i - 1] = r.prompt[i] end
    local o = {}
    for k, v in pairs(r.sampler) do o[k] = v end
    o.seed = r.seed
    local p, seed = sampler.params(o)
    core.must(rhead.head_start(self.head, seq, p, seed, r.n_sample, prompt, n, n + r.max_tokens + 1))
  end
  core.must(exec.session_seq_free(self.session, seq))
  if r.attach then self:cache():adopt(seq, r.attach) end -- (the prefix cache's groups)
  if r.window_at then self:cache():window_at(seq, r.window_at) end -- (the rings a held run's end wants)
  -- another choice's prompt (loip.engine.request.choices): its first positions shared, copy-on-write
  if r.share then core.must(exec.session_seq_share(self.session, seq, r.share.seq, r.share.positions, self.model.path)) end
end

function Engine:finish(seq, r)
  rhead.head_end(self.head, seq)
  if self.broken then return end -- (the session is gone with the plan)
  if r and r.keep then self:cache():keep(seq, r.keep) end
  core.must(exec.session_seq_free(self.session, seq))
end

-- The prefix cache of this device's session (loip.engine.request.prefix_cache), made anew with it.
function Engine:cache()
  if not self.store or self.store.s ~= self.session then
    local o, disk = self.cache_disk, nil
    if o then
      if self.store and self.store.disk then self.store.disk:close() end
      local s = self.session
      local layers = {}
      for l = 0, self.model.cfg.n_layers - 1 do layers[#layers + 1] = l end
      disk = prefix_disk.new { dir = o.dir, bytes = o.bytes, identity = o.identity, device = 1,
        layers = layers, kv_block = self.kv_block, group_bytes = exec.session_kv_group_bytes(s),
        window_bytes = exec.session_kv_window_snapshot_bytes(s), budget = self.model.budget }
    end
    self.store = prefix_cache.store(self.session, disk)
  end
  return self.store
end
-- The prefix cache's disk tier: o = { dir, bytes, identity } (loip.engine.request.prefix_disk).
function Engine:cache_configure(o) self.cache_disk, self.store = o, nil end
function Engine:cache_lookup(keys)
  local held, at = self:cache():lookup(keys)
  return prefix_cache.agree({ { held = held, at = at } }, #keys)
end
function Engine:cache_stats() return { self:cache():stats() } end

function Engine:step(toks)
  if self.broken then error(self.model.path .. ": " .. self.broken, 0) end
  local n = #toks
  for i, t in ipairs(toks) do
    local x, b = self.toks[i - 1], self.bt[i - 1]
    x.seq, x.pos, x.request, x.flags, x.id, x.parent = t.seq, t.pos, t.request, t.flags, t.id, t.parent or 0
    self.ids[i - 1], b.seq, b.pos, b.parent = t.id, t.seq, t.pos, t.parent or 0
  end
  -- the rows that give an output, in token order (the head: runtime/exec/head.c)
  local c = self.counts
  core.must(rhead.head_rows(self.toks, n, 0, self.rows, c, c + 1, "step"))
  local rows = c[0]
  self:logits_room(rows)
  local m = self.model
  local ok, err
  if m.runner then
    ok, err = exec.runner_forward_batch(m.runner, self.ids, n, self.bt, self.rows, rows, self.logits, m.path)
    if m.trace then m.trace:add(m:events()) end
  else
    ok, err = exec.session_forward_batch(self.session, self.ids, n, self.bt, self.rows, rows, self.logits, m.path)
  end
  core.must(ok, err)
  -- each row's output: its logits, its sequence's next token, or a run of drafts verified
  core.must(rhead.head_outputs(self.head, self.toks, self.rows, rows, self.logits, self.vocab, self.outs, self.out_rows,
    c + 2, nil, nil, "sampler"))
  local outs, V = {}, self.vocab
  for j = 0, c[2] - 1 do
    local o = self.outs[j]
    if o.id < 0 then
      outs[j + 1] = { seq = o.seq, request = o.request, id = -1, logits = self.logits + self.out_rows[j] * V }
    else
      outs[j + 1] = { seq = o.seq, request = o.request, id = o.id, flags = o.flags }
    end
  end
  return outs
end

-- What an online policy sees of the device (loip.engine.device_state): its memory read from
-- its budget now (outside the KV cache: what is used less the kv account), its plan's stages.
function Engine:online_devices()
  local m = self.model
  if not m.plan then error("online: this model runs no plan (open a slice store under a budget or with a plan)", 0) end
  local kv, used = 0, 0
  if m.budget then
    local r = m.budget:report()
    -- (the prefix cache's held groups are KV too: evicted before any request's KV would fail)
    for _, a in ipairs(r) do if a.account == "kv" or a.account == "prompt_cache" then kv = kv + a.bytes end end
    used = r.used
  end
  local est = m.estimate
  return { engine_mod.device_state { stages = m.plan.devices[1].stages, limit = m.budget and m.budget:limit() or 0,
    nonkv = used - kv, kv_base = m.kv_base, group_bytes = exec.session_kv_group_bytes(self.session),
    slot_bytes = m.loader and m.loader:slot_bytes() or 0, block_bytes = m.plan_sizes.block_bytes, sizes = m.plan_sizes,
    idle_ms = est and est.devices and est.devices[1] and est.devices[1].idle_ms } }
end

function Engine:link_rates() return {} end

-- The device's figures (loip.engine's device_stats): its plan's runner's times (none without a
-- plan), its KV pool's free positions, its budget's accounts and its prefix cache.
function Engine:device_stats()
  local m = self.model
  local st = m:runner_stats() or {}
  local d = { compute_ms = st.compute_ms, load_ms = st.load_ms, stall_ms = st.stall_ms,
    kv_free_tokens = exec.session_kv_free_tokens(m:session()), prompt_cache = self:cache():stats(),
    kernels = kernels.state(m.part) }
  if m.budget then
    d.accounts = {}
    for _, acc in ipairs(m.budget:report()) do d.accounts[acc.account] = acc.bytes end
  end
  return { d }
end

-- The cost model's price (ms) of a step of `rows` rows on the plan the scheduler chose (nil:
-- no such plan; loip.engine.request.draft measures instead).
function Engine:step_price(rows)
  local m = self.model
  if self.price_plan ~= m.plan then self.price_cache, self.price_plan = {}, m.plan end
  return engine_mod.step_price(m.estimate and m.plan, m.problem_table, m.opts.cost, rows, self.price_cache)
end

-- Plan again for `positions` KV positions (Model:replan_kv): every request's KV is gone (the
-- batcher starts each again), and the session is the new plan's.
function Engine:replan_kv(positions)
  local ok, err = pcall(self.model.replan_kv, self.model, positions)
  if not ok and not self.model.broken then error(err, 0) end -- (no plan: nothing changed)
  if not ok then
    -- the old plan was let go and the new one could not be made: no step runs on this model
    self.broken, self.session = self.model.broken, nil
    self:new_head()
    error(err, 0)
  end
  self.session = self.model:session()
  self:new_head()
  self.plan_positions = self.model.plan_sizes.plan_positions
end

-- Stage k of the plan reads its first n blocks from the next step on (Model:restage).
function Engine:restage(i, k, n)
  if i ~= 1 then error(string.format("restage: device %s is not one of 1", tostring(i)), 0) end
  local m = self.model
  local st = m.plan and m.plan.devices[1].stages[k]
  local old = st and st.offloaded or 0
  if n < old and self.store and self.store.n > 0 and m.budget then
    -- blocks taken back into memory: the prefix cache's held groups, which an online policy
    -- counts as KV it may reclaim (online_devices), go first where the budget lacks the room
    local back = 0
    local res = m.plan_sizes.res_bytes or m.plan_sizes.block_bytes -- (a mixture of experts: with its experts)
    for b = st.blocks[1] + n, st.blocks[1] + old - 1 do back = back + (res[b] or 0) end
    if back > m.budget:limit() - m.budget:used() then self.store:clear() end
  end
  m:restage(k, n)
end

return M
