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
-- Bind routed expert e's part (loip.constants.EXPERT_GATE/UP/DOWN) of layer to view t (nil:
-- unbind: the expert is read through the session's expert cache).
function M.model_bind_expert(m, layer, e, part, t, context)
  return core.ok(C.loip_model_bind_expert(m, layer, e, part, t), context)
end
-- A [rows, cols] table of dtype at offset of path that stays there (the embedding or head of a
-- large vocabulary): cache_rows rows kept after their read, chunk_rows (a multiple of 16) read
-- at once by the head, both charged to budget's "slots" (nil: none); nil, err.
function M.rows_new(path, offset, dtype, rows, cols, cache_rows, chunk_rows, budget)
  return core.new("loip_rows *", C.loip_rows_new, C.loip_rows_free, path, offset, dtype, rows, cols, cache_rows,
    chunk_rows, budget)
end
function M.rows_free(r) core.free(r, C.loip_rows_free) end
-- What a table's reads have read: { bytes, reads, hits, ahead } (hits: rows found in its cache;
-- ahead: the head's chunks whose read was under way before they were needed).
function M.rows_stats(r)
  return { bytes = tonumber(C.loip_rows_bytes_read(r)), reads = tonumber(C.loip_rows_reads(r)),
    hits = tonumber(C.loip_rows_hits(r)), ahead = tonumber(C.loip_rows_ahead(r)) }
end
-- The head's chunks of table r read ahead (on, the default) or each when it is needed.
function M.rows_set_ahead(r, on, context) return core.ok(C.loip_rows_set_ahead(r, on and 1 or 0), context) end
-- The head's aligned reads of table r past the page cache (on: O_DIRECT) or through it.
function M.rows_set_direct(r, on, context) return core.ok(C.loip_rows_set_direct(r, on and 1 or 0), context) end
-- The embedding (K.W_EMBED) or head (K.W_LM_HEAD) read from rows r (nil: unbind) instead of memory.
function M.model_bind_rows(m, which, r, context) return core.ok(C.loip_model_bind_rows(m, which, r), context) end
-- Every required tensor of layers [first, last) bound (LOIP_ESTATE naming the first missing).
function M.model_check(m, first, last, context) return core.ok(C.loip_model_check(m, first, last), context) end
-- Bytes of the weights bound.
function M.model_weight_bytes(m) return tonumber(C.loip_model_weight_bytes(m)) end

-- ---- sessions
-- A session keeping the KV cache of the layers with mask[l] ~= 0 (a uint8_t array; nil: all).
function M.session_new_layers(m, pool, max_ctx, max_batch, budget, mask)
  return core.new("loip_session *", C.loip_session_new_layers, C.loip_session_free, m, pool, max_ctx, max_batch, budget, mask)
end
function M.session_free(s) core.free(s, C.loip_session_free) end
-- A session of max_seqs sequences sharing a KV pool of kv_tokens positions (loip_session_new_seqs:
-- budget a loip_budget * or nil, kv_layers a uint8_t mask or nil, flags LOIP_SESSION_*).
function M.session_new_seqs(m, pool, max_ctx, max_batch, kv_tokens, max_seqs, budget, kv_layers, flags)
  return core.new("loip_session *", C.loip_session_new_seqs, C.loip_session_free, m, pool, max_ctx, max_batch,
    kv_tokens, max_seqs, budget, kv_layers, flags or 0)
end
function M.session_max_seqs(s) return tonumber(C.loip_session_max_seqs(s)) end
function M.session_kv_block_tokens(s) return tonumber(C.loip_session_kv_block_tokens(s)) end
function M.session_kv_group_bytes(s) return tonumber(C.loip_session_kv_group_bytes(s)) end
function M.session_kv_free_tokens(s) return tonumber(C.loip_session_kv_free_tokens(s)) end
-- Sequence seq's KV groups back to the pool.
function M.session_seq_free(s, seq, context) return core.ok(C.loip_session_seq_free(s, seq), context) end
-- Sharing KV (loip_session_seq_share and the prompt cache's holds; docs/prefix-cache.md).
-- Sequence dst (holding nothing) takes src's groups of positions [0, n) (copy-on-write).
function M.session_seq_share(s, dst, src, n, context) return core.ok(C.loip_session_seq_share(s, dst, src, n), context) end
-- seq's groups [first, first + n) held by the cache: their ids (a Lua list) and gens, or nil, err.
function M.session_kv_hold(s, seq, first, n, context)
  local ids = ffi.new("int32_t[?]", math.max(n, 1))
  local ok, err = core.ok(C.loip_session_kv_hold(s, seq, first, n, ids), context)
  if not ok then return nil, err end
  local out, gens = {}, {}
  for i = 1, n do out[i] = ids[i - 1] gens[i] = tonumber(C.loip_session_kv_gen(s, ids[i - 1])) end
  return out, gens
end
-- Sequence seq (holding nothing) starts with the held groups ids (a Lua list).
function M.session_kv_adopt(s, seq, ids, context)
  local a = ffi.new("int32_t[?]", math.max(#ids, 1))
  for i, id in ipairs(ids) do a[i - 1] = id end
  return core.ok(C.loip_session_kv_adopt(s, seq, a, #ids), context)
end
function M.session_kv_drop(s, id, context) return core.ok(C.loip_session_kv_drop(s, id), context) end
-- Where layers keep their KV in rings: seq's held group i (0-based) given a snapshot of seq's
-- rings at its end; the positions held group id's snapshot ends at (0: none).
function M.session_kv_hold_window(s, seq, i, context) return core.ok(C.loip_session_kv_hold_window(s, seq, i), context) end
function M.session_kv_window_end(s, id) return tonumber(C.loip_session_kv_window_end(s, id)) end
-- Held group id (ending at position e) to get seq's rings at e once seq has written them.
function M.session_kv_window_at(s, seq, id, e, context) return core.ok(C.loip_session_kv_window_at(s, seq, id, e), context) end
-- The disk tier's copies of a snapshot: its bytes; held group id's into buf (cap bytes): true and
-- where it ends; one at buf (bytes) given to held group id, ending at end.
function M.session_kv_window_snapshot_bytes(s) return tonumber(C.loip_session_kv_window_snapshot_bytes(s)) end
function M.session_kv_read_window(s, id, buf, cap, context)
  local e = ffi.new("int32_t[1]")
  local ok, err = core.ok(C.loip_session_kv_read_window(s, id, buf, cap, e), context)
  if not ok then return nil, err end
  return true, e[0]
end
function M.session_kv_load_window(s, id, e, buf, bytes, context)
  return core.ok(C.loip_session_kv_load_window(s, id, e, buf, bytes), context)
end
-- The disk tier: held group id's rows into buf (cap bytes); rows at buf loaded into a group the
-- cache holds (its id into id, an int32_t[1]); a held group made the most recently used.
function M.session_kv_read_group(s, id, buf, cap, context) return core.ok(C.loip_session_kv_read_group(s, id, buf, cap), context) end
function M.session_kv_load_group(s, buf, bytes, id, context) return core.ok(C.loip_session_kv_load_group(s, buf, bytes, id), context) end
function M.session_kv_touch(s, id, context) return core.ok(C.loip_session_kv_touch(s, id), context) end
function M.session_kv_refs(s, id) return tonumber(C.loip_session_kv_refs(s, id)) end
function M.session_kv_gen(s, id) return tonumber(C.loip_session_kv_gen(s, id)) end
-- { n_groups, free_groups, cache_groups, cache_shared_groups, shared_groups, window_snapshots,
-- cache_bytes, cache_charged, evictions, cow_copies } of session s now.
function M.session_kv_share_stats(s)
  local st = ffi.new("loip_kv_share_stats")
  C.loip_session_kv_share_stats(s, st)
  local out = {}
  for _, k in ipairs({ "n_groups", "free_groups", "cache_groups", "cache_shared_groups", "shared_groups", "window_snapshots", "cache_bytes",
    "cache_charged", "evictions", "cow_copies" }) do out[k] = tonumber(st[k]) end
  return out
end
-- tokens[0..n) of several sequences (toks: loip_batch_token[n]) through the whole model, the
-- logits of rows[0..n_rows) into logits.
function M.session_forward_batch(s, tokens, n, toks, rows, n_rows, logits, context)
  return core.ok(C.loip_session_forward_batch(s, tokens, n, toks, rows, n_rows, logits), context)
end
-- tokens[0..n) of one sequence at positions pos.. through the whole model, logits as mode says
-- (loip.constants.LOGITS_*).
function M.session_forward(s, tokens, n, pos, logits, mode, context)
  return core.ok(C.loip_session_forward(s, tokens, n, pos, logits, mode), context)
end
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

-- The KV cache a session keeping the layers of mask (a Lua set of 0-based layers, or nil: all)
-- would charge (loip_session_kv_size), and the positions each windowed layer's ring holds (0: none).
function M.kv_size(cfg, max_ctx, max_batch, mask, kv_tokens, max_seqs)
  local m = nil
  if mask then
    m = ffi.new("uint8_t[?]", math.max(1, cfg.n_layers))
    for l in pairs(mask) do m[l] = 1 end
  end
  return tonumber(C.loip_session_kv_size(cfg, max_ctx, max_batch, m, kv_tokens, max_seqs)),
    tonumber(C.loip_session_kv_ring_tokens(cfg, max_ctx, max_batch))
end
function M.session_kv_window_bytes(s) return tonumber(C.loip_session_kv_window_bytes(s)) end
function M.session_kv_window_layers(s) return tonumber(C.loip_session_kv_window_layers(s)) end

-- ---- runners and devices
-- A runner of n stages (descs: loip_stage_desc[n]) over session s of model m; loader a
-- loip_loader * or nil; event_capacity events kept for runner_events. keep (optional): what the
-- finalizer holds (the session, model and loader must outlive the runner).
function M.runner_new(s, m, loader, descs, n, event_capacity, keep)
  local dtor = C.loip_runner_free
  if keep ~= nil then dtor = function(r) C.loip_runner_free(r) local _ = keep end end
  return core.new("loip_runner *", C.loip_runner_new, dtor, s, m, loader, descs, n, event_capacity or 0)
end
function M.runner_free(r) core.free(r, C.loip_runner_free) end
-- As session_forward_batch, through the runner's stages (offloaded blocks read once a step).
function M.runner_forward_batch(r, tokens, n, toks, rows, n_rows, logits, context)
  return core.ok(C.loip_runner_forward_batch(r, tokens, n, toks, rows, n_rows, logits), context)
end
-- on false: a stage's reads start only when the stage runs (a baseline without prefetching).
function M.runner_set_prefetch(r, on, context) return core.ok(C.loip_runner_set_prefetch(r, on and 1 or 0), context) end
-- Up to cap recorded events into out (loip_runner_event[cap]), oldest first; how many.
function M.runner_events(r, out, cap) return tonumber(C.loip_runner_events(r, out, cap)) end
-- The runner's statistics into st (a loip_runner_stats_t).
function M.runner_stats(r, st) C.loip_runner_stats(r, st) return st end
function M.runner_restage(r, k, desc, context) return core.ok(C.loip_runner_restage(r, k, desc), context) end
-- loader: a loip_loader * (nil: none).
function M.runner_set_loader(r, loader, context) return core.ok(C.loip_runner_set_loader(r, loader), context) end
-- ---- the expert cache (mixture of experts: loip_experts_*)
-- lc: a loip_loader_config (the cache's own loader: its slots), cfg: a loip_experts_config.
function M.experts_new(m, lc, cfg)
  return core.new("loip_experts *", C.loip_experts_new, C.loip_experts_free, m, lc, cfg)
end
-- The cache's loader (owned by the cache).
function M.experts_loader(x) return C.loip_experts_loader(x) end
function M.experts_free(x) core.free(x, C.loip_experts_free) end
-- Expert e of layer: ext (a loip_load_extent), offsets (uint64_t[3]) of its parts in it, dtype.
function M.experts_set_source(x, layer, e, ext, offsets, dtype, context)
  return core.ok(C.loip_experts_set_source(x, layer, e, ext, offsets, dtype), context)
end
-- Layer's ffn_norm and router views for pre-gating (nil, nil: none).
function M.experts_set_gating(x, layer, norm, router, context)
  return core.ok(C.loip_experts_set_gating(x, layer, norm, router), context)
end
function M.experts_set_gating_bias(x, layer, bias, context)
  return core.ok(C.loip_experts_set_gating_bias(x, layer, bias), context)
end
function M.experts_pin(x, layer, e, context) return core.ok(C.loip_experts_pin(x, layer, e), context) end
function M.experts_clear(x, context) return core.ok(C.loip_experts_clear(x), context) end
-- The cache's statistics into st (a loip_experts_stats_t).
function M.experts_stats(x, st) C.loip_experts_stats(x, st) return st end
function M.experts_events(x, out, cap) return tonumber(C.loip_experts_events(x, out, cap)) end
-- Add the routing counted since the last call to out (uint64_t[n_layers * n_experts]).
function M.session_take_routing(s, out, n, context) return core.ok(C.loip_session_take_routing(s, out, n), context) end
-- Route session s's unbound experts through cache x (nil: none).
function M.session_set_experts(s, x, context) return core.ok(C.loip_session_set_experts(s, x), context) end

-- fn(cfg, max_tokens, logits_tokens, max_seqs, out) of a device's sizes, its bytes.
local function device_bytes(fn, cfg, max_tokens, logits_tokens, max_seqs, context)
  local out = ffi.new("uint64_t[1]")
  local ok, err = core.ok(fn(cfg, max_tokens, logits_tokens, max_seqs, out), context)
  if not ok then return nil, err end
  return tonumber(out[0])
end

-- What a device charges to "activations" (loip_device_size), in bytes.
function M.device_size(cfg, max_tokens, logits_tokens, max_seqs, context)
  return device_bytes(C.loip_device_size, cfg, max_tokens, logits_tokens, max_seqs, context)
end

-- The bytes of the largest LOGITS message a device receives when the head is cut (loip_device_share_size).
function M.device_share_size(cfg, max_tokens, logits_tokens, max_seqs, context)
  return device_bytes(C.loip_device_share_size, cfg, max_tokens, logits_tokens, max_seqs, context)
end

-- ---- kernels
-- The CPU kernels chosen for this machine (e.g. "avx2").
function M.kernels_name() return ffi.string(C.loip_kernels_name()) end
-- Use the CPU kernels called name from now on.
function M.kernels_use(name, context) return core.ok(C.loip_kernels_use(name), context) end
-- The MXFP4/F8 matvec kernels' software prefetch distance in bytes (0: none; < 0: the default).
function M.kernels_set_prefetch(bytes, context) return core.ok(C.loip_kernels_set_prefetch(bytes), context) end
function M.kernels_prefetch() return tonumber(C.loip_kernels_prefetch()) end
-- amx-auto's many-row threshold (tokens from which BF16 matmuls run on AMX): rows > 0 sets it;
-- returns the value in force.
function M.kernels_amx_rows(rows) return tonumber(C.loip_kernels_amx_threshold(rows or 0)) end
-- Seconds this process has spent in the forward passes' linear layers and attention so far.
function M.phase_seconds()
  local out = ffi.new("uint64_t[2]")
  C.loip_phase_ns(out)
  return { linear = tonumber(out[0]) / 1e9, attention = tonumber(out[1]) / 1e9 }
end
-- CUDA devices visible (an error code < 0 when CUDA is not built in).
function M.cuda_device_count() return tonumber(C.loip_cuda_device_count()) end
-- This machine's CPU as the kernels see it: { cpus (online), avx2, avx512, avx512_bf16, neon,
-- cuda (built with CUDA and a device present) }.
function M.cpu_info()
  local info = ffi.new("loip_cpu_info")
  C.loip_cpu_info_get(info)
  return { cpus = info.n_cpus, avx2 = info.has_avx2 == 1, avx512 = info.has_avx512 == 1,
    avx512_bf16 = info.has_avx512_bf16 == 1, neon = info.has_neon == 1, cuda = info.has_cuda == 1 }
end
-- y[rows] = W[rows, cols] (dtype) x[cols] on pool's threads (a benchmark's unit of work).
function M.op_matvec(pool, dtype, w, x, y, rows, cols, context)
  return core.ok(C.loip_op_matvec(pool, dtype, w, x, y, rows, cols), context)
end
-- bytes of buf read reps times on pool's threads, as fast as memory gives them; their sum into
-- sum[0] (so that the reads are not optimised away).
function M.op_read_probe(pool, buf, bytes, reps, sum, context)
  return core.ok(C.loip_op_read_probe(pool, buf, bytes, reps, sum), context)
end
-- Y[n, rows] = X[n, cols] W[rows, cols]^T (dtype) on pool's threads: the many-row product.
function M.op_matmul(pool, dtype, w, x, y, n, rows, cols, context)
  return core.ok(C.loip_op_matmul(pool, dtype, w, x, y, n, rows, cols), context)
end
-- The FMA roof: iters rounds of independent fp32 FMAs on every thread of pool; returns the
-- floating-point operations done (divide by the measured time for FLOP/s).
function M.op_fma_probe(pool, iters, context)
  local out = ffi.new("double[1]")
  local ok, err = core.ok(C.loip_op_fma_probe(pool, iters, out), context)
  if not ok then return nil, err end
  return out[0]
end
-- n seeded random elements of dtype into dst: normal(mean, std) from stream `first` of seed.
function M.fill_random(dst, n, dtype, seed, first, mean, std, context)
  return core.ok(C.loip_fill_random(dst, n, dtype, seed, first, mean, std), context)
end
-- dst[r * cols + c] = src[base + r * rs + c * cs] (elements of elem_bytes): loip_gather_elements.
function M.gather_elements(dst, src, elem_bytes, base, rows, rs, cols, cs, context)
  return core.ok(C.loip_gather_elements(dst, src, elem_bytes, base, rows, rs, cols, cs), context)
end
-- rows of an MXFP4 matrix from OpenAI's layout (source rows first + r * step, nb blocks a row).
function M.mxfp4_from_openai(dst, blocks, scales, first, step, rows, nb, context)
  return core.ok(C.loip_mxfp4_from_openai(dst, blocks, scales, first, step, rows, nb), context)
end

-- Bytes of a rows x cols tensor of a loip dtype (K.F32 .. K.F8_E4M3) as the runtime lays it out:
-- loip_dtype_bytes (MXFP4 in blocks of 32 values, F8 with its float32 block scales).
function M.dtype_bytes(dtype, rows, cols) return tonumber(C.loip_dtype_bytes(dtype, rows, cols)) end

-- dst = the LOIP_F8_E4M3 layout of a Hugging Face FP8 weight (E4M3 bytes w, float32 scale_inv
-- [scale_rows, scale_cols]): loip_f8_pack; its message names the tensor (name) and its scales.
function M.f8_pack(dst, w, scale_inv, rows, cols, scale_rows, scale_cols, name)
  return core.ok(C.loip_f8_pack(dst, w, scale_inv, rows, cols, scale_rows, scale_cols, name))
end

-- dst[rows * cols] = the f32 values of a [rows, cols] matrix of dtype: loip_dequantize.
function M.dequantize(dst, src, dtype, rows, cols, context)
  return core.ok(C.loip_dequantize(dst, src, dtype, rows, cols), context)
end

return M
