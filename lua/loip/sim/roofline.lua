-- Profiles of devices one does not own, from their published figures: a device file
-- (recipes/policies/device/<name>.lua, loip.policy kind "device") gives its memory, memory bandwidth,
-- dense FP16 matrix throughput, disk and per-message figures, each with its source or its stated
-- assumption; profile(shape) turns them into the profile `loip profile` would have measured for
-- that model shape (loip.plan.profile's format), by a roofline: a block takes the longer of its
-- weights' read at the bandwidth a matrix-vector product reaches and its arithmetic at the
-- throughput a matrix product reaches.
--
--   local dev = require("loip.policy").load("device", "jetson-agx-orin-64gb")
--   local pr = dev.profile(require("loip.plan.problem").shape_of(cfg, "BF16"))
local M = {}

M.BATCHES = { 1, 2, 4, 8, 16, 32, 64 }
M.KV_BYTES = 4 -- loip's KV cache holds F32

local REQUIRED = { "name", "memory_bytes", "memory_bps", "matvec_efficiency", "fp16_flops", "matmul_efficiency", "disk_bps",
  "load_ms", "transport_ms", "block_overhead_ms", "reserve_bytes", "sources", "assumptions" }

-- spec: name, memory_bytes, memory_bps (peak), matvec_efficiency (the share of memory_bps a
-- matrix-vector product reaches), fp16_flops (dense FP16/BF16 matrix peak, FLOP/s),
-- matmul_efficiency, disk_bps (the loader's O_DIRECT read rate), load_ms (a read's fixed cost),
-- transport_ms (one message's own time), block_overhead_ms (a block's fixed cost: its kernel
-- launches), reserve_bytes (memory the OS and the runtime keep: the default budget is
-- memory_bytes less it), sources, assumptions. Returns the device: the spec's fields and profile().
function M.device(spec)
  for _, k in ipairs(REQUIRED) do
    if spec[k] == nil then error(string.format("device %s: field '%s' is missing", tostring(spec.name), k), 2) end
  end
  local d = {}
  for k, v in pairs(spec) do d[k] = v end
  -- The profile for a model shape (loip.plan.problem.shape_of: dim, n_heads, n_kv_heads,
  -- head_dim, mha_bytes, mlp_bytes, dtype).
  function d.profile(shape)
    local per_param = (shape.dtype == "F32") and 4 or 2
    local bw = spec.memory_bps * spec.matvec_efficiency
    local flops = spec.fp16_flops * spec.matmul_efficiency * (per_param == 4 and 0.25 or 1)
    local weight_bps, attention, fixed = {}, {}, {}
    -- each token of a step attends its own request's keys and values: per position it reads
    -- them (2 x kv heads x head_dim values) and does 4 x heads x head_dim FLOPs with them
    local kv_pos = 2 * shape.n_kv_heads * shape.head_dim * M.KV_BYTES
    local kv_flops = 4 * shape.n_heads * shape.head_dim
    for _, b in ipairs(M.BATCHES) do
      -- weight bytes a step of b tokens gets through per second: read once, 2 FLOPs per weight per token
      weight_bps[tostring(b)] = 1 / math.max(1 / bw, 2 * b / (per_param * flops))
      attention[tostring(b)] = b * math.max(kv_pos / bw, kv_flops / flops) * 1e3
      fixed[tostring(b)] = spec.block_overhead_ms
    end
    return {
      loip_profile = 1,
      device = { host = spec.name, mem_total_bytes = spec.memory_bytes, mem_available_bytes = spec.memory_bytes - spec.reserve_bytes,
        derived_from = "recipes/policies/device/" .. spec.name .. ".lua (a roofline of published figures)" },
      shape = { dim = shape.dim, hidden_dim = shape.hidden_dim, n_heads = shape.n_heads, n_kv_heads = shape.n_kv_heads,
        head_dim = shape.head_dim, dtype = shape.dtype, mha_bytes = shape.mha_bytes, mlp_bytes = shape.mlp_bytes },
      -- while the disk streams, its DMA takes its share of the memory bandwidth
      compute = { weight_bps = weight_bps, attention_ms_per_token = attention, mha_fixed_ms = fixed,
        under_load = 1 + spec.disk_bps / spec.memory_bps, blocks = {} },
      disk = { read_bps = spec.disk_bps, load_ms = spec.load_ms },
      link = { transport_ms = spec.transport_ms },
    }
  end
  return d
end

return M
