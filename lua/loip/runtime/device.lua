-- The device loop (runtime/worker: loip_device_*) seen from Lua: a device runs its stages every
-- step in C and hands Lua only control messages; KV lending ships a stage's oldest KV groups to
-- a holder and back. One thin function per C call of loip.h; loip.cluster.device_server is the Lua
-- side over them. The device is cdata under ffi.gc from birth; device_free is the explicit,
-- idempotent close. A runtime failure returns nil, err (context, when given, first, as core.ok).
--
--   local rw = require "loip.runtime.device"
--   local dev = assert(rw.device_new(cfg, budget.handle))   -- cfg: a loip_device_config
--   local got = rw.device_serve(dev, 200, header, buf, cap, from)  -- true: a control message
local core = require "loip.core"
local C = core.C

local M = {}

-- A device over cfg's runner, session and sockets, its buffers charged to budget's "activations"
-- (budget: a loip_budget *); nil, err.
function M.device_new(cfg, budget) return core.new("loip_device *", C.loip_device_new, C.loip_device_free, cfg, budget) end
function M.device_free(d) core.free(d, C.loip_device_free) end

-- ---- requests
-- Request number request starts in slot seq: the last device samples with p (a
-- loip_sampler_params) and seed over ids [0, n_sample), prompt (int32_t[n_prompt]) its first
-- history (max_history ids kept).
function M.device_start(d, seq, request, p, seed, n_sample, prompt, n_prompt, max_history, context)
  return core.ok(C.loip_device_start(d, seq, request, p, seed, n_sample, prompt, n_prompt, max_history), context)
end
-- Slot seq's request is done (request 0: whatever it runs); its KV goes back to the pool.
function M.device_end(d, seq, request, context) return core.ok(C.loip_device_end(d, seq, request), context) end
-- Slot seq's sampler as if it had drawn n times (a request resumed on a new plan).
function M.device_skip_draws(d, seq, n, context) return core.ok(C.loip_device_skip_draws(d, seq, n), context) end

-- ---- KV lending
-- Lend the KV of stage_layers (int32_t[2 x stages]: each stage's layers [first, last)) of each
-- sequence's oldest groups[seq] groups to the holder over peer (a loip_sock *; nil: detach).
function M.device_lend(d, peer, stage_layers, groups, context)
  return core.ok(C.loip_device_lend(d, peer, stage_layers, groups), context)
end
-- Everything lent comes back now (blocking) and lending stops.
function M.device_recall(d, context) return core.ok(C.loip_device_recall(d), context) end
-- The head cut across devices: this device's vocabulary rows [first, last) (loip_device_head_share).
function M.device_head_share(d, first, last, context) return core.ok(C.loip_device_head_share(d, first, last), context) end

-- ---- the loop
-- Serve data messages for up to timeout_ms: true when a control message arrived (in header,
-- payload[cap], from[64]), false on a timeout, nil, err when a message was refused or a step
-- failed (the head has been sent an ERROR).
function M.device_serve(d, timeout_ms, header, payload, cap, from)
  local rc = C.loip_device_serve(d, timeout_ms, header, payload, cap, from)
  if rc == 0 then return false end
  if rc < 0 then return nil, core.failure(rc), rc end
  return true
end
-- The device's statistics into st (a loip_device_stats_t).
function M.device_stats(d, st) C.loip_device_stats(d, st) return st end

return M
