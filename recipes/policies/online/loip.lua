-- The paper's online memory-aware planner (Sec. III-E): when a device's KV cache, growing with
-- the context, would pass its budget within the next `lookahead` positions of every request
-- (a threshold TS_i^j), offload more of its blocks, chosen so that the memory freed covers the
-- shortfall at the least extra load: the stages' offloaded prefixes grow evenly (the same on
-- every stage of the device, the largest stage's reads, which the slot must hold, growing
-- least). When requests end and their KV goes back, blocks offloaded earlier are put back
-- (most read first) while twice the lookahead's room stays free. No token changes; a device
-- that cannot hold the KV cache even with every block offloaded stops the step with a message
-- naming it.
local M = { name = "loip" }

-- Positions of headroom a change buys for every running request (fewer changes, each larger).
M.lookahead = 32

-- The stages' offloaded prefixes of device d grown until `need` bytes are freed (net of the
-- slot's growth): the new offloaded count per stage, or nil when every block is offloaded.
-- Device d's stages: their offloaded counts and the bytes each reads a step.
local function prefixes(d)
  local off, bytes = {}, {}
  for s, st in ipairs(d.stages) do
    off[s], bytes[s] = st.offloaded, 0
    for b = st.first, st.first + st.offloaded - 1 do bytes[s] = bytes[s] + d.block_bytes[b] end
  end
  return off, bytes
end

local function choose(d, need)
  local off, bytes = prefixes(d)
  local slot = d.slot_bytes
  local freed = 0
  while freed < need do
    -- the stage whose reads stay smallest with its next block: the slot grows least
    local best, best_bytes
    for s, st in ipairs(d.stages) do
      local b = st.first + off[s]
      if b <= st.last then
        local nb = bytes[s] + d.block_bytes[b]
        if not best or nb < best_bytes then best, best_bytes = s, nb end
      end
    end
    if not best then return nil end
    local b = d.stages[best].first + off[best]
    local grow = math.max(0, best_bytes - slot)
    freed = freed + d.block_bytes[b] - grow
    slot = slot + grow
    off[best], bytes[best] = off[best] + 1, best_bytes
  end
  return off
end

-- Blocks of device d to put back while `room` bytes stay free after them: the new offloaded
-- count per stage (the stage reading most first), or nil when none fits.
local function put_back(d, room, keep_free)
  local off, bytes = prefixes(d)
  local changed = false
  while true do
    local best
    for s, st in ipairs(d.stages) do
      if off[s] > 0 and (not best or bytes[s] > bytes[best]) then best = s end
    end
    if not best then break end
    local b = d.stages[best].first + off[best] - 1
    -- the slot stays as large as it is: bringing a block back costs its bytes
    if room - d.block_bytes[b] < keep_free then break end
    room = room - d.block_bytes[b]
    off[best], bytes[best], changed = off[best] - 1, bytes[best] - d.block_bytes[b], true
  end
  return changed and off or nil
end

-- The stages of device i whose count changed, restaged.
local function apply(control, i, d, off)
  for s, n in ipairs(off) do
    if n ~= d.stages[s].offloaded then control.restage(i, s, n) end
  end
end

function M.on_step(state, control)
  local ahead = 0
  for _, r in ipairs(state.requests) do
    -- the groups each request will take within the lookahead (no further than it can go)
    local now = r.positions
    local later = math.min(now + M.lookahead, math.max(now, r.max_positions))
    ahead = ahead + (math.floor((later - 1) / 16) - math.floor(math.max(now - 1, 0) / 16))
  end
  for i, d in ipairs(state.devices) do
    local at_step = d.nonkv + d.kv_base + d.group_bytes * state.groups
    if at_step > d.limit and d.limit > 0 or (d.limit > 0 and at_step + d.group_bytes * ahead > d.limit) then
      local need = at_step + d.group_bytes * ahead - d.limit
      local off = choose(d, need)
      if not off then
        off = choose(d, at_step - d.limit) -- room for this step at least
        if not off then
          error(string.format("device %d cannot hold the KV cache of %d positions even with every block offloaded "
            .. "(budget %d bytes, %d needed)", i, state.context, d.limit, at_step), 0)
        end
      end
      apply(control, i, d, off)
    elseif d.limit > 0 then
      local room = d.limit - at_step - d.group_bytes * ahead
      local back = put_back(d, room, 2 * d.group_bytes * math.max(ahead, 1))
      if back then apply(control, i, d, back) end
    end
  end
end

return M
