-- Plans over several devices: the ring of stages (DESIGN sections 3 and 4). A plan has, per
-- device, the same number S of stages; the hops go around the ring stage by stage (stage 1 of
-- device 1, stage 1 of device 2, ..., stage 1 of device N, stage 2 of device 1, ...) and cover
-- the model's blocks in order. Device 1 also holds the embedding, device N the head. Each
-- stage's first `offloaded` blocks are re-read from the device's own disk every step, while
-- the other devices compute. One device is the N = 1 case of the same tables (loip.plan).
--
--   local p = ring.search(sizes, { 600e6, 400e6, 400e6 }, { stages = nil, link_bps = 12.5e6 })
--   ring.check(p, sizes.n_blocks)         -- nil, or a message naming the field
--   ring.memory(p, 2, sizes)              -- device 2's accounts
local plan = require "loip.plan"
local memory = require "loip.runtime.memory"

local M = {}

local fmt = memory.format_bytes

-- The hops of p in ring order: { device, stage, blocks = {a, b}, offloaded, hop (0-based) }.
function M.hops(p)
  local out = {}
  local S = #p.devices[1].stages
  for s = 1, S do
    for i, d in ipairs(p.devices) do
      local st = d.stages[s]
      out[#out + 1] = { device = i, stage = s, blocks = st.blocks, offloaded = st.offloaded or 0, hop = #out }
    end
  end
  return out
end

-- A plan's problems as a message naming the field (nil when well formed): devices, each with
-- the same number of stages, whose hops in ring order cover blocks 0..n_blocks-1 in order.
function M.check(p, n_blocks, where)
  where = where or "plan"
  local function bad(f, ...) return where .. ": " .. string.format(f, ...) end
  if type(p) ~= "table" then return bad("not a table") end
  if p.slots ~= nil and (type(p.slots) ~= "number" or p.slots < 1 or p.slots ~= math.floor(p.slots)) then
    return bad("slots must be a positive integer")
  end
  if p.slot_bytes ~= nil and (type(p.slot_bytes) ~= "number" or p.slot_bytes < 0 or p.slot_bytes ~= math.floor(p.slot_bytes)) then
    return bad("slot_bytes must be a byte count")
  end
  if type(p.devices) ~= "table" or #p.devices == 0 then return bad("devices must be a non-empty list") end
  local S
  for i, d in ipairs(p.devices) do
    if type(d) ~= "table" or type(d.stages) ~= "table" or #d.stages == 0 then
      return bad("devices[%d].stages must be a non-empty list", i)
    end
    S = S or #d.stages
    if #d.stages ~= S then
      return bad("devices[%d] has %d stages, devices[1] has %d: every device holds the same number", i, #d.stages, S)
    end
    if d.slot_bytes ~= nil and (type(d.slot_bytes) ~= "number" or d.slot_bytes < 0) then
      return bad("devices[%d].slot_bytes must be a byte count", i)
    end
    for s, st in ipairs(d.stages) do
      local sw = string.format("devices[%d].stages[%d]", i, s)
      if type(st) ~= "table" or type(st.blocks) ~= "table" or #st.blocks ~= 2 then
        return bad("%s.blocks must be { first, last }", sw)
      end
      local a, b = st.blocks[1], st.blocks[2]
      if type(a) ~= "number" or type(b) ~= "number" or a ~= math.floor(a) or b ~= math.floor(b) or b < a then
        return bad("%s.blocks must be two block numbers, first <= last", sw)
      end
      local off = st.offloaded or 0
      if type(off) ~= "number" or off < 0 or off ~= math.floor(off) or off > b - a + 1 then
        return bad("%s.offloaded must be an integer in 0..%d", sw, b - a + 1)
      end
    end
  end
  local next_block = 0
  for _, h in ipairs(M.hops(p)) do
    local sw = string.format("devices[%d].stages[%d]", h.device, h.stage)
    if h.blocks[1] ~= next_block then
      return bad("%s starts at block %d (%s) but block %d comes next around the ring (stage by stage, device by device)",
        sw, h.blocks[1], plan.block_name(h.blocks[1]), next_block)
    end
    if h.blocks[2] >= n_blocks then return bad("%s.blocks: block %d past the model's last (%d)", sw, h.blocks[2], n_blocks - 1) end
    next_block = h.blocks[2] + 1
  end
  if next_block ~= n_blocks then
    return bad("the stages end at block %d; the model has %d blocks (0..%d)", next_block - 1, n_blocks, n_blocks - 1)
  end
  return nil
end

-- The files device i reads at start (resident) and per stage (offloaded), by name.
function M.device_files(p, i, sizes)
  local resident, N = {}, #p.devices
  if i == 1 then resident["embed.bin"] = true end
  if i == N then
    resident["head.bin"] = true
    if sizes.tied then resident["embed.bin"] = true end
  end
  for _, st in ipairs(p.devices[i].stages) do
    for b = st.blocks[1] + (st.offloaded or 0), st.blocks[2] do resident[sizes.files[b]] = true end
  end
  return resident
end

-- Layers whose attention device i computes (it keeps their KV cache): a set and a count.
function M.device_layers(p, i)
  local set, n = {}, 0
  for _, st in ipairs(p.devices[i].stages) do
    for b = st.blocks[1], st.blocks[2] do
      if b % 2 == 0 and not set[b / 2] then set[b / 2], n = true, n + 1 end
    end
  end
  return set, n
end

-- Device i's memory by account: { weights, slots, kv, activations, scratch, total, slot_bytes,
-- offloaded_bytes }. The device loop's buffers count as activations (hidden states in and
-- out, one token's logits, the message buffer).
function M.memory(p, i, sizes, opts)
  opts = opts or {}
  local d = p.devices[i]
  local resident, slot, offloaded = plan.stage_bytes(d.stages, sizes, p.per_block)
  local slot_bytes = d.slot_bytes or (#p.devices == 1 and p.slot_bytes) or nil
  if slot > 0 and slot_bytes then slot = math.max(slot, slot_bytes) end
  local weights = resident
  local files = M.device_files(p, i, sizes)
  if files["embed.bin"] then weights = weights + (sizes.embed_file_bytes or 0) end
  if files["head.bin"] then weights = weights + (sizes.head_file_bytes or 0) end
  local _, n_layers = M.device_layers(p, i)
  local hidden = (opts.batch or 128) * sizes.dim * 4
  local device_buffers = hidden + math.max(hidden, 64 * 1024) + sizes.vocab * 4 * (opts.logits_tokens or 1)
    + (opts.batch or 128) * 4
  local n_slots = slot > 0 and (p.slots or 1) or 0
  local m = { weights = weights, slots = n_slots * slot, kv = sizes.kv_for(n_layers),
    activations = sizes.activation_bytes + (#p.devices > 1 and device_buffers or 0),
    scratch = (slot > 0 and opts.loader == "buffered") and math.min(sizes.bounce_bytes, slot) or 0,
    slot_bytes = slot, offloaded_bytes = offloaded }
  m.total = m.weights + m.slots + m.kv + m.activations + m.scratch
  return m
end

-- Estimated ms per decoding step (DESIGN section 4): compute of every hop, the hidden state
-- crossing S*N links, and per device the loading its stages cannot hide: a stage's reads overlap
-- with its own resident blocks and everything the other devices compute meanwhile.
function M.estimate(p, sizes, rates)
  local N, S = #p.devices, #p.devices[1].stages
  local function rate(v, i) return type(v) == "table" and v[i] or v end
  local comp, load, res = {}, {}, {}
  local total_comp = 0
  for i, d in ipairs(p.devices) do
    local r, _, off = plan.stage_bytes(d.stages, sizes)
    local cbps = rate(rates.compute_bps, i) * (off > 0 and (rates.contention or 0.5) or 1)
    comp[i] = (r + off) / cbps * 1e3
    res[i] = r / cbps * 1e3
    load[i] = off / rate(rates.read_bps, i) * 1e3
    total_comp = total_comp + comp[i]
  end
  total_comp = total_comp + sizes.head_bytes / rate(rates.compute_bps, N) * 1e3
  local h = sizes.dim * 4 + 64
  local hop_ms = N > 1 and (h / (rates.link_bps or 125e6) * 1e3 + (rates.link_delay_ms or 0)) or 0
  local comm = S * N * hop_ms
  local uncover = 0
  for i = 1, N do
    local others = 0
    for j = 1, N do if j ~= i then others = others + comp[j] end end
    local idle = res[i] / S + others / S + N * hop_ms
    uncover = math.max(uncover, load[i] - S * idle)
  end
  uncover = math.max(0, uncover)
  return total_comp + comm + uncover, uncover
end

-- Blocks 0..n-1 split into h contiguous ranges, sized in proportion to weights (sum 1).
local function split(n, shares)
  local out, at, acc = {}, 0, 0
  for k, w in ipairs(shares) do
    acc = acc + w
    local to = k == #shares and n or math.max(at + 1, math.floor(acc * n + 0.5))
    to = math.min(to, n - (#shares - k)) -- leave a block for every later hop
    out[k] = { at, to - 1 }
    at = to
  end
  return out
end

-- A plan for N devices with budgets (bytes each; 0: unlimited): for each stage count S (or
-- opts.stages), blocks split over the N*S hops in proportion to the devices' compute shares
-- (opts.compute_bps per device, default equal), each device offloading the fewest blocks per
-- stage that fit its budget, then filled with resident blocks; the S with the least estimated
-- time wins. Raises, naming the device and shortfall, when no S fits.
function M.search(sizes, budgets, opts)
  opts = opts or {}
  local N = #budgets
  local rates = { read_bps = opts.read_bps or 1.5e9, compute_bps = opts.compute_bps or 10e9,
    link_bps = opts.link_bps, link_delay_ms = opts.link_delay_ms }
  local share, total_share = {}, 0
  for i = 1, N do
    share[i] = type(rates.compute_bps) == "table" and rates.compute_bps[i] or 1
    total_share = total_share + share[i]
  end
  local best, best_ms, why, why_short
  local max_s = math.floor(sizes.n_blocks / N)
  local s_from, s_to = opts.stages or 1, opts.stages or max_s
  if s_to > max_s then error(string.format("%d stages on %d devices: the model has only %d blocks", s_to, N, sizes.n_blocks), 0) end
  for S = s_from, s_to do
    local shares = {}
    for _ = 1, S do for i = 1, N do shares[#shares + 1] = share[i] / total_share / S end end
    local ranges = split(sizes.n_blocks, shares)
    local p = { slots = opts.slots or 1, devices = {}, per_block = opts.per_block or nil }
    for i = 1, N do p.devices[i] = { stages = {} } end
    for k, r in ipairs(ranges) do
      local i, s = (k - 1) % N + 1, math.floor((k - 1) / N) + 1
      p.devices[i].stages[s] = { blocks = r, offloaded = 0 }
    end
    local fits = true
    for i = 1, N do
      local d, budget = p.devices[i], budgets[i]
      local shortest = math.huge
      for _, st in ipairs(d.stages) do shortest = math.min(shortest, st.blocks[2] - st.blocks[1] + 1) end
      local ok = budget == 0
      for k = 0, shortest do
        if ok then break end
        for _, st in ipairs(d.stages) do st.offloaded = math.min(k, st.blocks[2] - st.blocks[1] + 1) end
        local m = M.memory(p, i, sizes, opts)
        if m.total <= budget then
          ok = true
          -- fill the rest with resident blocks (largest first), the slot keeping its size
          d.slot_bytes = m.slot_bytes > 0 and m.slot_bytes or nil
          plan.fill(d.stages, sizes, budget - m.total)
        end
      end
      if not ok then
        fits = false
        for _, st in ipairs(d.stages) do st.offloaded = st.blocks[2] - st.blocks[1] + 1 end
        local m = M.memory(p, i, sizes, opts)
        if not why or m.total - budget < why_short then
          why_short = m.total - budget
          why = string.format("device %d: its budget %s is short of the %s its part needs with every block offloaded (with %d stage%s, the least; short by %s)",
            i, fmt(budget), fmt(m.total), S, S == 1 and "" or "s", fmt(m.total - budget))
        end
        break
      end
    end
    if fits then
      local ms, exposed = M.estimate(p, sizes, rates)
      if not best or ms < best_ms * 0.999 then
        best, best_ms = p, ms
        p.estimate = { ms = ms, exposed_ms = exposed }
      end
    end
  end
  if not best then error("no plan fits: " .. (why or "?") .. "; raise --mem or lower --context", 0) end
  return best
end

-- A readable description of a plan over devices.
function M.describe(p, sizes, opts)
  local N, S = #p.devices, #p.devices[1].stages
  local lines = { string.format("plan: %d device%s x %d stage%s (%d hops around the ring)", N, N == 1 and "" or "s", S,
    S == 1 and "" or "s", N * S) }
  for i, d in ipairs(p.devices) do
    local m = M.memory(p, i, sizes, opts)
    lines[#lines + 1] = string.format("  device %d: weights %s + slot %s + kv %s + activations %s = %s; %s re-read per step",
      i, fmt(m.weights), fmt(m.slots), fmt(m.kv), fmt(m.activations), fmt(m.total), fmt(m.offloaded_bytes))
    for s, st in ipairs(d.stages) do
      local a, b, off = st.blocks[1], st.blocks[2], st.offloaded or 0
      lines[#lines + 1] = string.format("    stage %d: %s%s", s, plan.range_name(a, b),
        off == 0 and "" or string.format(" (offloaded: %s)", plan.range_name(a, a + off - 1)))
    end
  end
  if p.estimate then lines[#lines + 1] = string.format("  estimate: %.1f ms/token (%.1f ms exposed loading)", p.estimate.ms, p.estimate.exposed_ms) end
  return table.concat(lines, "\n")
end

-- Lua source for a plan, one device or several (what --plan reads).
function M.to_lua(p)
  local out = { "return {", string.format("  slots = %d,", p.slots or 1) }
  if p.slot_bytes then out[#out + 1] = string.format("  slot_bytes = %d, -- one slot used as a ring of this size", p.slot_bytes) end
  if p.per_block then out[#out + 1] = "  per_block = true, -- conventional: each offloaded block read when its turn comes" end
  out[#out + 1] = "  devices = {"
  for _, d in ipairs(p.devices) do
    out[#out + 1] = "    { " .. (d.slot_bytes and string.format("slot_bytes = %d, ", d.slot_bytes) or "") .. "stages = {"
    for _, st in ipairs(d.stages) do
      out[#out + 1] = string.format("      { blocks = { %d, %d }, offloaded = %d },", st.blocks[1], st.blocks[2], st.offloaded or 0)
    end
    out[#out + 1] = "    } },"
  end
  out[#out + 1] = "  },"
  out[#out + 1] = "}"
  return table.concat(out, "\n") .. "\n"
end

return M
