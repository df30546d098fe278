-- Models, sessions, runners, thread pools and kernels (runtime/exec, runtime/core/pool.c,
-- kernels/) seen from Lua: one thin function per C call of loip.h, the rest of the Lua side
-- calls these rather than C. Owning handles are cdata under ffi.gc from birth; *_free is the
-- explicit, idempotent close. A runtime failure returns nil, err (context, when given, first,
-- as core.ok); wrap the call in assert() where a failure is an error.
--
--   local exec = require "loip.runtime.exec"
--   local m = assert(exec.model_new(cfg))                   -- cfg: a loip_model_config
--   assert(exec.model_bind(m, layer, which, view, "bind"))
--   local kv, scratch = assert(exec.session_size(cfg, ctx, batch, threads, -1, 0, 1))
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}

-- ---- thread pools
function M.pool_new(threads) return core.new("loip_pool *", C.loip_pool_new, C.loip_pool_free, threads or 0) end
function M.pool_size(pool) return tonumber(C.loip_pool_size(pool)) end
function M.pool_free(pool) core.free(pool, C.loip_pool_free) end

-- ---- models
function M.model_new(cfg) return core.new("loip_model *", C.loip_model_new, C.loip_model_free, cfg) end
function M.model_free(m) core.free(m, C.loip_model_free) end
-- Bind weight view t (a loip_tensor) as (layer, which); the shape and dtype are checked.
function M.model_bind(m, layer, which, t, context) return core.ok(C.loip_model_bind(m, layer, which, t), context) end
-- Every required tensor of layers [first, last) bound (LOIP_ESTATE naming the first missing).
function M.model_check(m, first, last, context) return core.ok(C.loip_model_check(m, first, last), context) end

-- ---- sessions
-- A session keeping the KV cache of the layers with mask[l] ~= 0 (a uint8_t array; nil: all).
function M.session_new_layers(m, pool, max_ctx, max_batch, budget, mask)
  return core.new("loip_session *", C.loip_session_new_layers, C.loip_session_free, m, pool, max_ctx, max_batch, budget, mask)
end
function M.session_free(s) core.free(s, C.loip_session_free) end
-- Blocks [first, last) over hidden [n, dim] at positions pos..pos+n-1.
function M.session_blocks(s, first, last, hidden, n, pos, context)
  return core.ok(C.loip_session_blocks(s, first, last, hidden, n, pos), context)
end
-- What a session would charge: kv_bytes, scratch_bytes (loip_session_size's arguments).
function M.session_size(cfg, max_ctx, max_batch, threads, kv_layers, kv_tokens, max_seqs, context)
  local kv, scratch = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")
  local ok, err = core.ok(C.loip_session_size(cfg, max_ctx, max_batch, threads, kv_layers, kv_tokens, max_seqs, kv, scratch), context)
  if not ok then return nil, err end
  return tonumber(kv[0]), tonumber(scratch[0])
end

-- ---- runners and devices
function M.runner_restage(r, k, desc, context) return core.ok(C.loip_runner_restage(r, k, desc), context) end
-- loader: a loip_loader * (nil: none).
function M.runner_set_loader(r, loader, context) return core.ok(C.loip_runner_set_loader(r, loader), context) end
-- What a device charges to "activations" (loip_device_size), in bytes.
function M.device_size(cfg, max_tokens, logits_tokens, max_seqs, context)
  local out = ffi.new("uint64_t[1]")
  local ok, err = core.ok(C.loip_device_size(cfg, max_tokens, logits_tokens, max_seqs, out), context)
  if not ok then return nil, err end
  return tonumber(out[0])
end

-- ---- kernels
-- The CPU kernels chosen for this machine (e.g. "avx2").
function M.kernels_name() return ffi.string(C.loip_kernels_name()) end
-- n seeded random elements of dtype into dst: normal(mean, std) from stream `first` of seed.
function M.fill_random(dst, n, dtype, seed, first, mean, std, context)
  return core.ok(C.loip_fill_random(dst, n, dtype, seed, first, mean, std), context)
end

return M
