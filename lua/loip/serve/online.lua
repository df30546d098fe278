-- Online adaptation between steps (the paper's Sec. III-E; docs/design.md, "Online"): before each
-- step of the request loop, an online policy (loip.policy kind "online": on_step(state,
-- control)) sees what the step will hold and may change the plan live. The memory side is
-- known at the head without asking the devices: each device's memory outside its KV cache, its
-- KV tables, and the bytes of one KV group (16 positions of its layers); the groups the running
-- requests will hold after the step follow from their positions.
--
-- state = { step, context (the longest request's positions after the step), requests = { { id,
--   positions } }, groups (KV groups every device holds after the step: the same count on each,
--   of its own layers), devices = { { limit, nonkv, kv_base, group_bytes, slot_bytes, disk_bps,
--   stages = { { first, last, offloaded } }, block_bytes = { [b] = bytes } } } }
-- control = { restage(device, stage, offloaded), log(fmt, ...) }
--
-- Every change is kept in batcher.adaptations: { step, context, device, stage, from, to, ms }.
local core = require "loip.core"

local M = {}

local Online = {}
Online.__index = Online

-- policy: a loip.policy "online" table; engine: the batcher's (online_devices(), restage(i, s, n)).
function M.new(batcher, policy)
  return setmetatable({ batcher = batcher, policy = policy, engine = batcher.engine, steps = 0 }, Online)
end

-- What the step of toks (the batcher's list) leaves each request holding.
function Online:state(toks)
  local last = {}
  for _, t in ipairs(toks) do
    if not last[t.seq] or t.pos > last[t.seq] then last[t.seq] = t.pos end
  end
  local kb = self.engine.kv_block
  local st = { step = self.steps, context = 0, requests = {}, groups = 0 }
  for _, r in ipairs(self.batcher.running) do
    local p = last[r.seq] or (r.pos - 1)
    if p >= 0 then
      st.groups = st.groups + math.floor(p / kb) + 1
      st.context = math.max(st.context, p + 1)
    end
    st.requests[#st.requests + 1] = { id = r.id, positions = p + 1, max_positions = r.n_prompt + r.max_tokens }
  end
  st.devices = self.engine:online_devices()
  return st
end

-- Before a step: the policy's turn. Raises when it cannot make room (the step would break a
-- budget): the requests of the step end with its message.
function Online:before_step(toks)
  self.steps = self.steps + 1
  local st = self:state(toks)
  local b = self.batcher
  local control = {
    restage = function(i, stage, offloaded)
      local d = st.devices[i]
      local from = d and d.stages[stage] and d.stages[stage].offloaded
      local t0 = core.now_ms()
      self.engine:restage(i, stage, offloaded)
      b.adaptations[#b.adaptations + 1] = { step = st.step, context = st.context, device = i, stage = stage, from = from,
        to = offloaded, ms = core.now_ms() - t0 }
    end,
    log = function(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end,
  }
  self.policy.on_step(st, control)
end

return M
