-- Tensor-parallel systems as simulator models (the LOIP paper's TP baselines; we do not build
-- them as runtimes): every device holds a slice of every layer and computes its part of each
-- layer at once; after each layer's attention and after its MLP the partial results are summed
-- across the devices (an all-reduce over the links). A baseline file (recipes/policies/baseline/<name>.lua,
-- loip.policy kind "baseline") gives its choices to M.model: how layers are split (by speed or
-- evenly), how it all-reduces (a ring or a star through the first device), and whether it reads the
-- slices that do not fit from disk (a sliding window of layers, prefetched while the others compute).
-- They run on the same problem as loip's plans (loip.plan.problem: profiles, budgets, disks, links).
local profile = require "loip.plan.profile"
local memory = require "loip.runtime.memory"

local M = {}

local function fmt(b) return memory.format_bytes(b) end

-- Activations cross the links as FP16 (dim x 2 bytes a token), as these systems send them.
M.ACT_BYTES = 2

-- spec: name, split ("speed" | "even"), allreduce ("ring" | "star"), offload (bool: the sliding
-- window), window (layers the window holds, default 2). Returns the baseline: run(problem, opts)
-- with opts.batch (tokens a step carries: the requests decoding together), opts.context (the
-- positions attended). run gives { ms_per_token, comp_ms, comm_ms, load_ms, devices = {...} } or
-- nil and "OOM: ..." naming the device that cannot hold its part.
function M.model(spec)
  local b = {}
  for k, v in pairs(spec) do b[k] = v end
  function b.run(problem, opts)
    opts = opts or {}
    local m, sh = problem.model, problem.shape
    local N, L = #problem.devices, m.n_layers
    local batch, ctx = opts.batch or 1, opts.context or problem.position or 256
    -- the shares: by speed (a device's weight throughput over its slowdown) or even
    local share, total = {}, 0
    for i, d in ipairs(problem.devices) do
      share[i] = spec.split == "speed" and (1 / (profile.block_ms(d.profile, "mlp", 1, ctx, sh) * (d.slowdown or 1))) or 1
      total = total + share[i]
    end
    for i = 1, N do share[i] = share[i] / total end
    -- memory: the slice of every layer, its share of the KV cache, the activations; the first
    -- device (the master) holds the embedding and the head
    local layer_bytes = m.block_bytes[0] + m.block_bytes[1]
    local kv_all = m.kv_bytes[L] or 0
    local devs, comp, load = {}, 0, 0
    for i, d in ipairs(problem.devices) do
      local slice = share[i] * layer_bytes * L
      local fixed = share[i] * kv_all + m.activation_bytes + (i == 1 and (m.embed_file_bytes + m.head_file_bytes) or 0)
      local need = slice + fixed
      local budget = d.budget or 0
      local read_bytes = 0
      if budget > 0 and need > budget then
        if not spec.offload then
          return nil, string.format("OOM: device %d cannot hold its %.0f%% slice of every layer: it needs %s but its budget is %s",
            i, 100 * share[i], fmt(need, budget), fmt(budget, need))
        end
        -- the sliding window: what does not fit is read from disk every step, a window of layers
        -- in memory at least
        local window = (spec.window or 2) * share[i] * layer_bytes
        if fixed + window > budget then
          return nil, string.format("OOM: device %d cannot hold even its window of %d layers' slices: it needs %s but its budget is %s",
            i, spec.window or 2, fmt(fixed + window, budget), fmt(budget, fixed + window))
        end
        read_bytes = math.min(slice, need - budget + window)
      end
      -- a layer's part: its share of an MHA and an MLP block at the step's tokens and context
      local per_layer = share[i] * (profile.block_ms(d.profile, "mha", batch, ctx, sh) + profile.block_ms(d.profile, "mlp", batch, ctx, sh))
        * (d.slowdown or 1) * (read_bytes > 0 and (d.compute.under_load or 1) or 1)
      local read_ms = read_bytes > 0 and (read_bytes / d.disk_bps * 1e3 + L * (d.load_ms or 0)) or 0
      devs[i] = { share = share[i], memory_bytes = math.min(need, budget > 0 and budget or need), layer_ms = per_layer,
        load_ms = read_ms, read_bytes = read_bytes }
      load = math.max(load, read_ms)
    end
    -- every layer waits for its slowest device
    local slowest = 0
    for _, x in ipairs(devs) do slowest = math.max(slowest, x.layer_ms) end
    comp = slowest * L + profile.block_ms(problem.devices[1].profile, "head", batch, ctx, sh)
    -- the all-reduces: two a layer, of batch x dim activations, over the slowest link
    local rate, lat = math.huge, 0
    for _, l in ipairs(problem.links) do
      if (l.rate_bps or 0) > 0 then rate = math.min(rate, l.rate_bps) end
      lat = math.max(lat, (l.delay_ms or 0) + (l.transport_ms or 0))
    end
    if opts.rate_bps then rate = opts.rate_bps end
    local bytes = batch * sh.dim * M.ACT_BYTES
    local wire = rate < math.huge and 1e3 / rate or 0
    local one
    if N == 1 then
      one = 0
    elseif spec.allreduce == "ring" then
      -- reduce-scatter then all-gather: 2(N-1) steps of bytes/N each, one hop's latency each
      one = 2 * (N - 1) * (bytes / N * wire + lat)
    else
      -- a star through the master: N-1 partial sums in over its link, the sum out to N-1
      one = 2 * (N - 1) * bytes * wire + 2 * lat
    end
    local comm = 2 * L * one
    -- the window reads ahead while the layers before compute: the step takes the longer
    local T = math.max(comp + comm, load)
    return { ms_per_token = T, comp_ms = comp, comm_ms = comm, load_ms = load, devices = devs }
  end
  return b
end

return M
