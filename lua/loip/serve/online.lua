-- Online adaptation between steps (the paper's Sec. III-E; docs/design.md, "Online"): before each
-- step of the request loop, an online policy (loip.policy kind "online": on_step(state,
-- control)) sees what the step will hold and may change the plan live. The memory side is
-- known at the head without asking the devices: each device's memory outside its KV cache, its
-- KV tables, and the bytes of one KV group (16 positions of its layers); the groups the running
-- requests will hold after the step follow from their positions.
--
-- state = { step, last_step = { ms, tokens } (the step before), context (the longest request's
--   positions after the step), requests = { { id,
--   positions } }, groups (KV groups every device holds after the step: the same count on each,
--   of its own layers), devices = { { limit, nonkv, kv_base, group_bytes, slot_bytes, disk_bps,
--   stages = { { first, last, offloaded } }, block_bytes = { [b] = bytes } } } }
-- control = { restage(device, stage, offloaded), log(fmt, ...) }
--
-- Every change is kept in batcher.adaptations: { step, context, device, stage, from, to, ms,
-- t0_ns, t1_ns } (loip.trace draws them as "adapt" events on the device's plan lane).
-- A link schedule (loip.policy kind "links": at(step)) changes the emulated links first; its
-- changes are kept in batcher.link_changes. state.links (read lazily, a round trip to every
-- device): per link { rate_Bps (emulated), measured_Bps, latency_ms }.
local core = require "loip.core"

local M = {}

local Online = {}
Online.__index = Online

-- policy: a loip.policy "online" table (or nil); links: a "links" schedule (or nil); engine: the
-- batcher's (online_devices(), restage(i, s, n), set_link(i, rate), link_state()).
function M.new(batcher, policy, links)
  return setmetatable({ batcher = batcher, policy = policy, links = links, engine = batcher.engine, steps = 0 }, Online)
end

-- What the step of toks (the batcher's list) leaves each request holding.
function Online:state(toks)
  local last = {}
  for _, t in ipairs(toks) do
    if not last[t.seq] or t.pos > last[t.seq] then last[t.seq] = t.pos end
  end
  local kb = self.engine.kv_block
  local st = { step = self.steps, context = 0, requests = {}, groups = 0, last_step = self.batcher.last_step }
  for _, r in ipairs(self.batcher.running) do
    local p = last[r.seq] or (r.pos - 1)
    if p >= 0 then
      st.groups = st.groups + math.floor(p / kb) + 1
      st.context = math.max(st.context, p + 1)
    end
    st.requests[#st.requests + 1] = { id = r.id, positions = p + 1, max_positions = r.n_prompt + r.max_tokens }
  end
  st.devices = self.engine:online_devices()
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

-- Before a step: the policy's turn. Raises when it cannot make room (the step would break a
-- budget): the requests of the step end with its message.
function Online:before_step(toks)
  self.steps = self.steps + 1
  if self.links then self:apply_links() end
  if not self.policy then return end
  local st = self:state(toks)
  local b = self.batcher
  local control = {
    restage = function(i, stage, offloaded)
      local d = st.devices[i]
      local from = d and d.stages[stage] and d.stages[stage].offloaded
      local t0 = tonumber(core.C.loip_now_ns())
      self.engine:restage(i, stage, offloaded)
      local t1 = tonumber(core.C.loip_now_ns())
      b.adaptations[#b.adaptations + 1] = { step = st.step, context = st.context, device = i, stage = stage, from = from,
        to = offloaded, ms = (t1 - t0) / 1e6, t0_ns = t0, t1_ns = t1 }
    end,
    log = function(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end,
  }
  self.policy.on_step(st, control)
end

return M
