-- Online adaptation between steps (the paper's Sec. III-E; docs/design.md, "Online"): before each
-- step of the request loop, an online policy (loip.policy kind "online": on_step(state,
-- control)) sees what the step will hold and may change the plan live. The memory side is
-- known at the head without asking the devices: each device's memory outside its KV cache, its
-- KV tables, and the bytes of one KV group (16 positions of its layers); the groups the running
-- requests will hold after the step follow from their positions.
--
-- state = { step, last_step = { ms, tokens } (the step before), kv_block (positions a KV group
--   holds: LOIP_KV_BLOCK_TOKENS), context (the longest request's
--   positions after the step), requests = { { id, positions, max_positions, evicted,
--   prompt_positions (its prompt's: reached within a few steps while it is prefilled) } }, groups
--   (KV groups every device holds after the step: the same count on each, of its own layers;
--   evicted ones not counted), devices = { { limit, nonkv, kv_base, group_bytes, slot_bytes,
--   stages = { { first, last, offloaded, kv_layers } }, block_bytes = { [b] = bytes },
--   chunk_bytes (one layer's group), lend = { holder, groups } or nil, idle_ms (the cost
--   model's idle window per stage) } }, link_rates (emulated rate of each link, bytes/s; nil:
--   not emulated), links (measured, lazily: a round trip), memo (a table the policy keeps
--   between steps of this request loop) }
-- control = { restage(device, stage, offloaded), lend(device, holder, groups), evict(request,
--   positions), replan(positions), log(fmt, ...) }
-- state.plan_positions is what the plan's memory holds (KV positions of all requests together)
-- and state.pool_positions what the requests may take at most (the KV pool). control.replan
-- is the last resort, when restaging and lending cannot make room: the engine plans again (the
-- same scheduler and options) for `positions` KV positions, and every running request resumes
-- on the new plan from its tokens (its KV prefilled again, its sampler where it was), so no
-- token changes; the step is taken again on the new plan, and the policy's turn ends there
-- (control's other functions refuse after it). It raises, naming the shortfall, when no plan
-- holds that many positions.
--
-- A policy's error stops the step; its message is prefixed "online policy NAME: ". A device
-- past its budget in the step the policy let run says which policy was running.
--
-- Every change is kept in batcher.adaptations: { step, context, device, stage, from, to, ms,
-- t0_ns, t1_ns } (a re-plan: replan, replan_from, resumed, and draft_rows, draft_rows_from when
-- the draft's rows a request gave way to the KV) (loip.trace draws them as "adapt" events on the device's plan lane).
-- A link schedule (loip.policy kind "links": at(step)) changes the emulated links first; its
-- changes are kept in batcher.link_changes. state.links (read lazily, a round trip to every
-- device): per link { rate_Bps (emulated), measured_Bps, latency_ms }.
local core = require "loip.core"
local errors = require "loip.error"
local policy_mod = require "loip.policy"

local M = {}

-- The online policy a run gets, one rule for every command and engine: the one named (a name, a
-- file or a table; "none": off), else loip when the plan was made for fewer KV positions than
-- the run takes (planned: the plan_positions given, --plan-positions), else none. Returns the
-- policy (as given) or nil.
function M.choose(name, planned)
  if name == "none" then return nil end
  if name ~= nil then return name end
  return planned and "loip" or nil
end

local Online = {}
Online.__index = Online

-- policy: a loip.policy "online" policy (or nil); links: a "links" schedule (or nil); each a
-- name, a path or a table, loaded (its settings resolved) by loip.policy; engine: the batcher's
-- (online_devices(), restage(i, s, n), set_link(i, rate), link_state()).
function M.new(batcher, policy, links)
  local load = policy_mod.load
  return setmetatable({ batcher = batcher, policy = policy and load("online", policy), links = links and load("links", links),
    engine = batcher.engine, steps = 0, memo = {} }, Online)
end

-- The policy's name in messages.
function Online:name()
  return self.policy and tostring(self.policy.name or "(unnamed)") or "none"
end

-- Where each of the running requests stands after the step of toks (the batcher's list): its
-- newest position (-1: none yet) and the KV groups of kb positions it holds then (the evicted
-- ones not counted). One count for an online policy's state and the simulator's memory.
function M.held(running, toks, kb)
  local last = {}
  for _, t in ipairs(toks or {}) do
    if not last[t.seq] or t.pos > last[t.seq] then last[t.seq] = t.pos end
  end
  local out = {}
  for k, r in ipairs(running) do
    local p = last[r.seq] or (r.pos - 1)
    out[k] = { pos = p, groups = p >= 0 and (math.floor(p / kb) + 1 - (r.evicted or 0) / kb) or 0 }
  end
  return out
end

-- What the step of toks (the batcher's list) leaves each request holding.
function Online:state(toks)
  local st = { step = self.steps, context = 0, requests = {}, groups = 0, last_step = self.batcher.last_step,
    memo = self.memo, kv_block = self.engine.kv_block }
  for k, h in ipairs(M.held(self.batcher.running, toks, self.engine.kv_block)) do
    local r, p = self.batcher.running[k], h.pos
    st.groups = st.groups + h.groups
    if p >= 0 then st.context = math.max(st.context, p + 1) end
    local ev = r.evicted or 0
    -- (a request resumed after a re-plan has its tokens so far in its prompt)
    local reach = math.min(#(r.prompt0 or r.prompt) + r.max_tokens, self.engine.context or math.huge)
    st.requests[#st.requests + 1] = { id = r.id, positions = p + 1, max_positions = reach, evicted = ev,
      prompt_positions = r.n_prompt }
  end
  st.plan_positions = self.engine.sizes and self.engine.sizes.plan_positions or self.engine.plan_positions
  st.pool_positions = self.engine.kv_tokens
  st.devices = self.engine:online_devices()
  st.link_rates = self.engine.link_rates and self.engine:link_rates() or {}
  -- the links' figures (a round trip to every device): only when a policy reads them
  local engine = self.engine
  return setmetatable(st, { __index = function(t, k)
    if k == "links" and engine.link_state then
      local l = engine:link_state()
      rawset(t, "links", l)
      return l
    end
  end })
end

-- An adaptation (an entry of batcher.adaptations) in words.
function M.describe(a)
  if a.replan then
    return string.format("at %d positions: re-planned for %d KV positions (was %d): %d request%s resumed on the new plan%s",
      a.context, a.replan, a.replan_from or 0, a.resumed or 0, a.resumed == 1 and "" or "s",
      a.draft_rows and string.format("; it holds %d draft rows a request (was %d)", a.draft_rows, a.draft_rows_from) or "")
  elseif a.evicted then
    return string.format("at %d positions: request %d evicts positions 0..%d (recomputed every step)", a.context, a.request,
      a.evicted - 1)
  elseif a.lend_groups then
    return a.lend_to and string.format("at %d positions: device %d lends %d groups of each request's KV to device %d (was %d)",
      a.context, a.device, a.lend_groups, a.lend_to, a.lend_from or 0)
      or string.format("at %d positions: device %d stops lending (was %d groups)", a.context, a.device, a.lend_from or 0)
  end
  return string.format("at %d positions: device %d, stage %d now reads %d blocks every step (was %d)", a.context, a.device,
    a.stage, a.to, a.from or 0)
end

-- The adaptations (batcher.adaptations) as "adapt" events on each device's plan lane of tr (a
-- loip.trace); one device's or a cluster's alike. Returns tr.
function M.add_to_trace(tr, adaptations)
  for _, a in ipairs(adaptations) do
    if a.device and a.t0_ns then
      tr:add({ { kind = "adapt", stage = a.stage or 0, from = a.from, to = a.to, context = a.context, t0_ns = a.t0_ns,
        t1_ns = a.t1_ns, text = not a.stage and M.describe(a) or nil } }, a.device)
    end
  end
  return tr
end

-- The link schedule's change for this step, if any, to every link (or each its own).
function Online:apply_links()
  local r = self.links.at(self.steps)
  if r == nil or not self.engine.set_link then return end
  local n = self.engine.devices and #self.engine.devices or 0
  local b = self.batcher
  for i = 1, n do
    local rate = type(r) == "table" and r[i] or (type(r) ~= "table" and r or nil)
    if rate then
      self.engine:set_link(i, rate)
      b.link_changes[#b.link_changes + 1] = { step = self.steps, link = i, rate = rate }
    end
  end
end

-- Request id's first `positions` positions (a multiple of the KV block, never fewer) keep no KV
-- from this step on: recomputed in every step (the baselines' KV handling). st: the step's state.
function Online:evict(st, id, positions)
  local b = self.batcher
  for _, r in ipairs(b.running) do
    if r.id == id then
      if positions % self.engine.kv_block ~= 0 or positions < (r.evicted or 0) or positions > r.pos then
        error(string.format("evict: request %d: %d positions (a multiple of %d, at least %d, at most %d)", id, positions,
          self.engine.kv_block, r.evicted or 0, r.pos), 0)
      end
      if positions > (r.evicted or 0) then
        b.adaptations[#b.adaptations + 1] = { step = st.step, context = st.context, request = id, evicted_from = r.evicted or 0,
          evicted = positions, ms = 0 }
      end
      r.evicted = positions
    end
  end
end

-- The control an online policy's on_step is given with state st: what it may change before this
-- step. turn.replanned: control.replan ran (the policy's turn ends there).
function Online:control(st, turn)
  local b = self.batcher
  -- run change() and keep the adaptation a (with the step, the context and its time)
  local function adapt(a, change)
    local t0 = core.now_ns()
    change()
    local t1 = core.now_ns()
    a.step, a.context, a.ms, a.t0_ns, a.t1_ns = st.step, st.context, (t1 - t0) / 1e6, t0, t1
    b.adaptations[#b.adaptations + 1] = a
  end
  local function live(what)
    if turn.replanned then error(what .. ": the plan was replaced this step (control.replan ends the policy's turn)", 0) end
  end
  return {
    restage = function(i, stage, offloaded)
      live("restage")
      local d = st.devices[i]
      local from = d and d.stages[stage] and d.stages[stage].offloaded
      adapt({ device = i, stage = stage, from = from, to = offloaded }, function() self.engine:restage(i, stage, offloaded) end)
    end,
    log = function(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end,
    evict = function(id, positions)
      live("evict")
      self:evict(st, id, positions)
    end,
    -- device i lends the oldest `groups` groups of every running request's KV to device holder
    -- (nil: lending stops); loip.cluster's Cluster:lend
    lend = function(i, holder, groups)
      live("lend")
      if not self.engine.lend then error("lend: this engine has one device", 0) end
      local from = st.devices[i] and st.devices[i].lend
      adapt({ device = i, lend_to = holder, lend_groups = holder and groups or 0, lend_from = from and from.groups or 0 },
        function() self.engine:lend(i, holder, groups) end)
    end,
    -- plan again for `positions` KV positions (more than the plan holds, at most the pool's);
    -- the running requests resume on the new plan
    replan = function(positions)
      live("replan")
      if not self.engine.replan_kv then error("replan: this engine cannot plan again", 0) end
      local now, pool = st.plan_positions or 0, st.pool_positions or math.huge
      if type(positions) ~= "number" or positions ~= math.floor(positions) or positions <= now then
        error(string.format("replan: %s positions (a whole number above the %d the plan holds)", tostring(positions), now), 0)
      end
      positions = math.min(positions, pool)
      -- (speculative decoding's rows give way to the KV: draft_rows, the most a request drafts)
      local a, rows0 = { replan = positions, replan_from = now, resumed = #b.running }, self.engine.draft_rows
      adapt(a, function() self.engine:replan_kv(positions) end)
      if rows0 and self.engine.draft_rows ~= rows0 then a.draft_rows, a.draft_rows_from = self.engine.draft_rows, rows0 end
      turn.replanned = true
    end,
  }
end

-- Before a step: the policy's turn. Raises when it cannot make room (the step would break a
-- budget): the requests of the step end with its message.
function Online:before_step(toks)
  self.steps = self.steps + 1
  if self.links then self:apply_links() end
  if not self.policy then return end
  local st = self:state(toks)
  local turn = { replanned = false }
  local ok, err = pcall(self.policy.on_step, st, self:control(st, turn))
  if not ok then
    -- (a device lost or a plan made again goes up as it is: the batcher resumes on it; an
    -- allocation that failed keeps its kind under the policy's name)
    if errors.is(err) and not errors.is(err, "out_of_memory") then error(err, 0) end
    local named = string.format("online policy %s: ", self:name())
    error(errors.is(err) and named .. err or named .. tostring(err), 0)
  end
  -- the step is not taken on the old plan: the batcher resumes every request on the new one
  if turn.replanned then
    errors.raise("replanned", "re-planned by the online policy " .. self:name())
  end
end

return M
