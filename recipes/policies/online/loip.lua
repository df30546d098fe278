-- The paper's online memory-aware planner (Sec. III-E): when a device's KV cache, growing with
-- the context, would pass its budget within the next `lookahead` positions of every request
-- (a threshold TS_i^j), offload more of its blocks, chosen so that the memory freed covers the
-- shortfall at the least extra load: the stages' offloaded prefixes grow evenly (the same on
-- every stage of the device, the largest stage's reads, which the slot must hold, growing
-- least). When requests end and their KV goes back, blocks offloaded earlier are put back
-- (most read first) while twice the lookahead's room stays free. When even every block of a
-- device offloaded (and what lending takes) cannot hold the lookahead, the engine plans again
-- for the positions the running requests may reach (control.replan: a plan for the whole
-- context served them, so planning short never loses a request that planning long serves);
-- they resume on the new plan with the same tokens. Only when no plan holds them and this step
-- does not fit either does the step stop, with a message naming the device and the shortfall.
-- The KV transfer protocol (Alg. 2): a device at its threshold lends the oldest KV groups of
-- every running request (split evenly: the same count each) to the device with the most room,
-- as much as one stage's round trip carries within `window_share` of the idle window a stage
-- has between two of its runs at the link's rate, and as much as the holder holds beside its
-- own lookahead. Cut at once when the bandwidth drops; raised only when the lender is at a
-- threshold or has blocks offloaded that lending could put back, and then by at least
-- `min_change` groups (smaller changes are filtered). Lending is sized for the slowest rate of
-- the link within `rate_horizon` steps, so that KV lent at a high rate never has to come back at
-- a low one slower than the idle window (a cut takes effect as each stage runs next: what is
-- away comes back at the new rate).
-- Its settings (M.settings; docs/planning.md, "The policy API"): --online loip:lookahead=64,lend=off.
local M = { name = "loip" }

local function at_least(n) return function(v) return v >= n, "must be >= " .. n end end
M.settings = {
  { "lookahead", "int", "KV positions of headroom a change buys every running request (fewer changes, each larger)",
    default = 32, check = at_least(1) },
  { "lend", "bool", "lend KV groups to the device with the most room (the KV transfer protocol); off: thresholds only",
    default = true },
  { "window_share", "number", "share of a stage's idle window that lending's round trip may take", default = 0.7,
    check = function(v) return v > 0 and v <= 1, "must be in (0, 1]" end },
  { "min_change", "int", "KV groups a raise of lending changes at least (smaller changes are filtered)", default = 2,
    check = at_least(1) },
  { "rate_horizon", "int", "steps a link's rate is remembered: lending is sized for the slowest within them", default = 96,
    check = at_least(1) },
}

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

-- What offloading block b of device d gives back to memory (a mixture of experts' MLP block: its
-- experts too), and what putting it back takes.
local function freed_of(d, b) return d.freed_bytes and d.freed_bytes[b] or d.block_bytes[b] end

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
    freed = freed + freed_of(d, b) - grow
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
    if room - freed_of(d, b) < keep_free then break end
    room = room - freed_of(d, b)
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

-- Groups request r holds after the step (evicted ones not), and what lending takes of it; kb:
-- positions a KV group holds (state.kv_block).
local function held_groups(r, kb) return math.floor((r.positions - 1) / kb) + 1 - math.floor(r.evicted / kb) end

-- Bytes device d ships for stage s with g groups per request.
local function stage_lent(state, d, s, g)
  local n = 0
  for _, r in ipairs(state.requests) do n = n + math.max(0, math.min(g, held_groups(r, state.kv_block) - 1)) end
  return n * d.stages[s].kv_layers * d.chunk_bytes
end

-- What lending changes in device i's memory after the step, lends[j] = { holder, groups } for
-- every lender j: a lender keeps one stage's blob in its staging buffer (the largest so far)
-- instead of all its stages' ranges; a holder keeps every stage's.
local function lending_delta(state, i, lends)
  local delta, l = 0, lends[i]
  if l then
    local d, staging = state.devices[i], state.memo.staging and state.memo.staging[i] or 0
    for s in ipairs(d.stages) do
      local x = stage_lent(state, d, s, l.groups)
      delta, staging = delta - x, math.max(staging, x)
    end
    delta = delta + staging
  end
  for j, lj in pairs(lends) do
    if lj.holder == i then
      for s in ipairs(state.devices[j].stages) do delta = delta + stage_lent(state, state.devices[j], s, lj.groups) end
    end
  end
  return delta
end

-- The rate of the link into device k (bytes/s): emulated, else measured (a round trip).
local function rate_into(state, k)
  local n = #state.devices
  local link = (k - 2) % n + 1
  local r = state.link_rates and state.link_rates[link]
  if r then return r end
  local l = state.links and state.links[link]
  return l and l.measured_Bps
end

-- Each device's incoming rate now kept in memo.rates, and the slowest within the horizon.
local function slowest_rates(state, memo, o)
  memo.rates = memo.rates or {}
  local slowest = {}
  for i in ipairs(state.devices) do
    local hist = memo.rates[i] or {}
    memo.rates[i] = hist
    hist[#hist + 1] = { step = state.step, bw = rate_into(state, i) or 0 }
    while #hist > 1 and hist[1].step <= state.step - o.rate_horizon do table.remove(hist, 1) end
    slowest[i] = math.huge
    for _, x in ipairs(hist) do slowest[i] = math.min(slowest[i], x.bw) end
  end
  return slowest
end

-- The lenders: devices at a threshold, or with blocks offloaded that lending could put back
-- (grown), or lending already; the one with least room first (a device lends or holds, never
-- both).
local function lenders(state, memo, lends, room)
  local order = {}
  for i, d in ipairs(state.devices) do
    local grown = false
    for s, st in ipairs(d.stages) do grown = grown or st.offloaded > memo.planned[i][s] end
    local holding = false
    for _, l in pairs(lends) do holding = holding or l.holder == i end
    if d.limit > 0 and d.chunk_bytes > 0 and #d.stages >= 2 and not holding and (room(i) < 0 or grown or lends[i]) then
      order[#order + 1] = { i = i, grown = grown }
    end
  end
  table.sort(order, function(a, b) return room(a.i) < room(b.i) end)
  return order
end

-- The groups lender may lend holder now (the least of what the wire carries in an idle window
-- and what the holder has room for; cur: lent now), and the rate it was found at.
local function lend_target(state, memo, o, lends, lender, holder, slowest, room, cur)
  local L, H = state.devices[lender], state.devices[holder]
  -- bandwidth: each direction of a stage's round trip within the idle window between its runs
  -- the slowest rate into either within the horizon: raised lazily, cut at once
  local bw = math.min(slowest[lender], slowest[holder])
  local window_ms = memo.step_ms / #L.stages
  if L.idle_ms and L.idle_ms > 0 then window_ms = math.min(window_ms, L.idle_ms) end
  local all_layers, max_layers = 0, 0
  for _, st in ipairs(L.stages) do
    all_layers, max_layers = all_layers + st.kv_layers, math.max(max_layers, st.kv_layers)
  end
  local n_req = #state.requests
  -- the holder's incoming wire carries every lender's blobs: what the others ship into it
  -- a window comes off
  local others_wire = 0
  for j, lj in pairs(lends) do
    if j ~= lender and lj.holder == holder then
      local biggest = 0
      for s in ipairs(state.devices[j].stages) do biggest = math.max(biggest, stage_lent(state, state.devices[j], s, lj.groups)) end
      others_wire = others_wire + biggest
    end
  end
  local wire = bw * window_ms / 1e3 * o.window_share - others_wire
  local g_bw = math.max(0, math.floor(wire / (n_req * max_layers * L.chunk_bytes)))
  -- memory: what the holder holds beside its own growth, the others' blobs and two groups spare
  local held_now = 0
  if lends[lender] then
    for s in ipairs(L.stages) do held_now = held_now + stage_lent(state, L, s, cur) end
  end
  local others = lending_delta(state, holder, lends) - held_now
  local g_mem = math.floor((room(holder) - others - 2 * H.group_bytes) / (n_req * all_layers * L.chunk_bytes))
  return math.max(0, math.min(g_bw, g_mem)), bw
end

-- Lending for this step: the lender (least room), the holder (most), how many groups.
local function plan_lending(state, control, at_step, ahead_bytes, o)
  local memo = state.memo
  memo.staging = memo.staging or {}
  memo.planned = memo.planned or {}
  local lends = {}
  for i, d in ipairs(state.devices) do
    memo.planned[i] = memo.planned[i] or {}
    for s, st in ipairs(d.stages) do memo.planned[i][s] = memo.planned[i][s] or st.offloaded end
    if d.lend then lends[i] = { holder = d.lend.holder, groups = type(d.lend.groups) == "number" and d.lend.groups or 0 } end
  end
  if not o.lend or #state.devices < 2 or not state.last_step or #state.requests == 0 then return lends end
  local function room(i) return state.devices[i].limit - at_step[i] - ahead_bytes[i] end
  -- the step's time, smoothed (one slow step does not move the windows much)
  memo.step_ms = memo.step_ms and (0.9 * memo.step_ms + 0.1 * state.last_step.ms) or state.last_step.ms
  local slowest = slowest_rates(state, memo, o)
  local order = lenders(state, memo, lends, room)
  -- each lender paired with the device with the most room left
  for _, cand in ipairs(order) do
    local lender = cand.i
    local cur = lends[lender] and lends[lender].groups or 0
    local holder = lends[lender] and lends[lender].holder
    if not holder then
      for i, d in ipairs(state.devices) do
        if i ~= lender and d.limit > 0 and not lends[i] then
          local r = room(i) - lending_delta(state, i, lends)
          if r > 0 and (not holder or r > room(holder) - lending_delta(state, holder, lends)) then holder = i end
        end
      end
    end
    if holder and not lends[holder] then
      local L = state.devices[lender]
      local target, bw = lend_target(state, memo, o, lends, lender, holder, slowest, room, cur)
      local want = cur
      local dropped = memo.bw_at and memo.bw_at[lender] and bw < memo.bw_at[lender]
      if target < cur and (dropped or target <= cur - o.min_change) then
        want = target                                  -- cut at once when the rate drops
      elseif target >= cur + o.min_change and (room(lender) < 0 or cand.grown) then
        want = target                                  -- raised when it delays a threshold or puts blocks back
      end
      memo.bw_at = memo.bw_at or {}
      memo.bw_at[lender] = bw
      if want ~= cur then
        control.lend(lender, want > 0 and holder or nil, want)
        lends[lender] = want > 0 and { holder = holder, groups = want } or nil
        if want == 0 then memo.staging[lender] = 0 end -- the device lets its staging buffer go
      end
      if lends[lender] then
        for s in ipairs(L.stages) do
          memo.staging[lender] = math.max(memo.staging[lender] or 0, stage_lent(state, L, s, lends[lender].groups))
        end
      end
    end
  end
  return lends
end

function M.on_step(state, control, o)
  local ahead, kb = 0, state.kv_block
  for _, r in ipairs(state.requests) do
    -- the groups each request will take within the lookahead, or its prompt's if longer (a
    -- prompt is prefilled within a few steps), no further than it can go
    local now = r.positions
    local later = math.min(math.max(now + o.lookahead, r.prompt_positions or 0), math.max(now, r.max_positions))
    ahead = ahead + (math.floor((later - 1) / kb) - math.floor(math.max(now - 1, 0) / kb))
  end
  local base, ahead_bytes = {}, {}
  for i, d in ipairs(state.devices) do
    base[i], ahead_bytes[i] = d.nonkv + d.kv_base + d.group_bytes * state.groups, d.group_bytes * ahead
  end
  local lends = plan_lending(state, control, base, ahead_bytes, o)
  for i, d in ipairs(state.devices) do
    local at_step = base[i] + lending_delta(state, i, lends)
    if at_step > d.limit and d.limit > 0 or (d.limit > 0 and at_step + d.group_bytes * ahead > d.limit) then
      local need = at_step + d.group_bytes * ahead - d.limit
      local off = choose(d, need)
      local replan_why
      if not off then
        -- a plan for the positions the running requests may reach (each rounded to KV groups),
        -- once per reach (a scheduler that found none is not asked again every step)
        local reach = 0
        for _, r in ipairs(state.requests) do reach = reach + math.ceil(math.max(r.max_positions, r.positions) / kb) * kb end
        reach = math.min(reach, state.pool_positions or reach)
        if control.replan and state.plan_positions and reach > state.plan_positions and state.memo.replan_failed ~= reach then
          local ok, err = pcall(control.replan, reach)
          if ok then return end
          state.memo.replan_failed, state.memo.replan_why = reach, tostring(err)
        end
        replan_why = state.memo.replan_failed and state.memo.replan_why
        off = choose(d, at_step - d.limit) -- room for this step at least
        if not off then
          error(string.format("device %d cannot hold the KV cache of %d positions even with every block offloaded "
            .. "(budget %d bytes, %d needed, short by %d)%s", i, state.context, d.limit, at_step, at_step - d.limit,
            replan_why and ("; planning again: " .. replan_why) or ""), 0)
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
