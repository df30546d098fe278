-- The sizes a plan needs (loip.plan.sizes, re-exported by loip.plan): a store's blocks, files,
-- KV cache and activations by the run's settings; for a mixture of experts, its expert files and
-- what a device's expert cache is expected to read (docs/planning.md).
local ffi = require "ffi"
local exec = require "loip.runtime.exec"
local flags = require "loip.ui.flags"

local M = {}

local function block_name(b)
  return string.format("layer %d %s", math.floor(b / 2), b % 2 == 0 and "mha" or "mlp")
end

-- The sizes of a manifest's files into s: each block's file (block_bytes, files), the expert
-- files (expert_files by layer, expert_file_bytes: the largest), the others' bytes (global_bytes;
-- embed_file_bytes, head_file_bytes) and the tensor the head reads (head_bytes). Returns the
-- bytes of each layer's experts.
local function file_sizes(s, man)
  local expert_bytes = {} -- (mixture of experts) per layer: its experts' files, summed
  for _, f in ipairs(man.files) do
    local layer, kind = f.name:match("^layer%-(%d+)%-(%a+)%.bin$")
    local xl = f.name:match("^layer%-(%d+)%-exp%-%d+%.bin$")
    if xl then
      xl = tonumber(xl)
      expert_bytes[xl] = (expert_bytes[xl] or 0) + f.size
      s.expert_files[xl] = s.expert_files[xl] or {}
      table.insert(s.expert_files[xl], f.name)
      s.expert_file_bytes = math.max(s.expert_file_bytes or 0, f.size)
    elseif layer then
      local b = 2 * tonumber(layer) + (kind == "mlp" and 1 or 0)
      s.block_bytes[b], s.files[b] = f.size, f.name
    else
      s.global_bytes = s.global_bytes + f.size
      if f.name == "embed.bin" then s.embed_file_bytes = f.size end
      if f.name == "head.bin" then s.head_file_bytes = f.size end
    end
    for _, t in ipairs(f.tensors or {}) do
      if t.kind == "lm_head" or (t.kind == "embed" and not s.head_bytes) then s.head_bytes = t.nbytes end
    end
  end
  return expert_bytes
end

-- A mixture of experts' sizes (s.moe): experts per layer, those a token uses, an expert file's
-- bytes and gating_bytes: a layer's ffn_norm and router, kept in memory for pre-gating while
-- its MLP block is offloaded (loip.model.experts).
local function moe_sizes(s, man, cfg)
  if not s.expert_file_bytes then
    error(string.format("manifest: the model has %d experts per layer but no expert files (layer-000-exp-000.bin): "
      .. "re-run `loip slice`", cfg.n_experts), 0)
  end
  local gating = 0
  for _, f in ipairs(man.files) do
    if f.name == "layer-000-mlp.bin" then
      for _, t in ipairs(f.tensors or {}) do
        if t.kind == "ffn_norm" or t.kind == "router" or t.kind == "router_bias" then
          gating = gating + math.ceil(t.nbytes / 4096) * 4096
        end
      end
    end
  end
  return { experts = cfg.n_experts, used = cfg.n_experts_used, expert_bytes = s.expert_file_bytes, gating_bytes = gating }
end

-- Per-layer KV (sliding-window layers): s.ringed[l] (0-based) marks the layers whose KV is a ring
-- of s.kv_kinds.ring_tokens positions per request; s.kv_kinds = { full_layers, window_layers,
-- full_bytes, window_bytes (one layer's KV of each kind: the plan's positions, the ring) }; and
-- kv_bytes[k] the most any k consecutive layers keep (a part's layers are consecutive): a full
-- layer grows with the context, a window layer stops at its ring.
local function window_kv(s, cfg, opts, max_seqs)
  local ctx, batch = opts.context, math.min(opts.batch, opts.context)
  local none, ring = exec.kv_size(cfg, ctx, batch, {}, s.plan_positions, max_seqs)
  if ring == 0 then return end
  local k = { full_layers = 0, window_layers = 0, ring_tokens = ring, window = cfg.sliding_window }
  s.ringed = {}
  for l = 0, cfg.n_layers - 1 do
    local one = exec.kv_size(cfg, ctx, batch, { [l] = true }, s.plan_positions, max_seqs) - none
    if cfg.sliding_window > 0 and cfg.layer_window[l] ~= 0 then
      s.ringed[l], k.window_layers, k.window_bytes = true, k.window_layers + 1, one
    else
      k.full_layers, k.full_bytes = k.full_layers + 1, one
    end
  end
  s.kv_kinds = k
  -- full layers' attention blocks before each block (the DP counts a part's layers by kind)
  s.kv_full_before = { [0] = 0 }
  for b = 0, 2 * cfg.n_layers - 1 do
    s.kv_full_before[b + 1] = s.kv_full_before[b] + ((b % 2 == 0 and not s.ringed[b / 2]) and 1 or 0)
  end
  for n = 1, cfg.n_layers do
    local most = 0
    for a = 0, cfg.n_layers - n do
      local set = {}
      for l = a, a + n - 1 do set[l] = true end
      most = math.max(most, exec.kv_size(cfg, ctx, batch, set, s.plan_positions, max_seqs))
    end
    s.kv_bytes[n] = most
  end
end

-- Sizes a plan needs, from a store's manifest (or the same table made from a shape) and the
-- run's settings: { n_layers, n_blocks, block_bytes[b] (b from 0), files[b], mha_bytes,
-- mlp_bytes, global_bytes, embed_file_bytes, head_file_bytes, tied, head_bytes (the tensor the
-- head reads), weight_bytes, dim, vocab, hidden_bytes (a token's hidden state and table entry),
-- token_bytes and output_bytes (a token id in, a sampled id out), header_bytes (a message's header), kv_bytes[k] (the KV cache of k layers, k = 0..n_layers;
-- with sliding-window layers the most of any k consecutive ones, and ringed, kv_kinds: window_kv),
-- activation_bytes (a session's), device_bytes (a cluster device's buffers; device_bytes_mid
-- those of a device that returns no logits rows: loip.plan.device_bytes),
-- context, batch, logits_tokens, max_seqs, kv_tokens }.
-- opts: context, batch (tokens per step: a prefill chunk, or a micro-batch), threads,
-- logits_tokens (1), max_seqs (requests served at once, 1), kv_tokens (the KV pool's positions,
-- shared by those requests; default context x max_seqs), plan_positions (the KV positions the
-- plan's memory holds; default kv_tokens: with fewer, the KV pool grows inside the budget and
-- an online policy makes room as it does).
function M.sizes(man, cfg, opts)
  local max_seqs = opts.max_seqs or 1
  local s = { n_layers = cfg.n_layers, n_blocks = 2 * cfg.n_layers, block_bytes = {}, files = {}, expert_files = {},
    global_bytes = 0, context = opts.context, batch = opts.batch, logits_tokens = opts.logits_tokens or 1,
    max_seqs = max_seqs, kv_tokens = opts.kv_tokens or opts.context * max_seqs }
  s.plan_positions = math.min(flags.renamed(opts, "kv_plan_tokens", "plan_positions", "plan.sizes")
    or s.kv_tokens, s.kv_tokens)
  local expert_bytes = file_sizes(s, man)
  s.embed_file_bytes, s.head_file_bytes, s.head_bytes = s.embed_file_bytes or 0, s.head_file_bytes or 0, s.head_bytes or 0
  for b = 0, s.n_blocks - 1 do
    if not s.block_bytes[b] then
      error(string.format("manifest: no file for %s (expected layer-%03d-%s.bin)", block_name(b),
        math.floor(b / 2), b % 2 == 0 and "mha" or "mlp"), 0)
    end
  end
  -- every layer of a model has the same shapes: the schedulers count blocks by kind
  s.mha_bytes, s.mlp_bytes = s.block_bytes[0], s.block_bytes[1]
  for b = 0, s.n_blocks - 1 do
    if s.block_bytes[b] ~= (b % 2 == 0 and s.mha_bytes or s.mlp_bytes) then
      error(string.format("manifest: %s has %d bytes, %s has %d: the layers differ in size", block_name(b),
        s.block_bytes[b], block_name(b % 2), s.block_bytes[b % 2]), 0)
    end
  end
  -- A mixture of experts: an MLP block's file is its router, norm and shared expert, read into
  -- the slot when offloaded; its experts are resident with it, or read one by one into the
  -- device's expert cache (expert_slots of expert_file_bytes) as the router picks them.
  -- res_bytes[b]: what block b holds resident (its file, and an MLP block's experts).
  s.res_bytes = {}
  for b = 0, s.n_blocks - 1 do
    s.res_bytes[b] = s.block_bytes[b] + (b % 2 == 1 and expert_bytes[(b - 1) / 2] or 0)
  end
  s.mlp_res_bytes = s.res_bytes[1]
  if cfg.n_experts > 0 then s.moe = moe_sizes(s, man, cfg) end
  s.tied = cfg.tied_embeddings ~= 0
  s.dim, s.vocab = cfg.dim, cfg.vocab_size
  -- a token's hidden state and its entry in the micro-batch's table
  s.hidden_bytes = cfg.dim * ffi.sizeof("float") + ffi.sizeof("loip_step_token")
  s.header_bytes = ffi.sizeof("loip_msg_header")
  s.token_bytes = 4 + ffi.sizeof("loip_step_token") -- a token id into the ring, with its entry
  s.output_bytes = ffi.sizeof("loip_step_output")    -- a sampled id back to the head
  local _, act = assert(exec.session_size(cfg, opts.context, opts.batch, opts.threads or 1, -1, s.plan_positions, max_seqs))
  s.activation_bytes = act
  s.kv_bytes = {}
  for k = 0, cfg.n_layers do
    s.kv_bytes[k] = assert(exec.session_size(cfg, opts.context, opts.batch, opts.threads or 1, k, s.plan_positions, max_seqs))
  end
  window_kv(s, cfg, opts, max_seqs)
  s.device_bytes = assert(exec.device_size(cfg, opts.batch, s.logits_tokens, max_seqs))
  -- (a device before the last: no logits rows beyond one per request, loip.plan.device_bytes)
  s.device_bytes_mid = assert(exec.device_size(cfg, opts.batch, 1, max_seqs))
  -- (a cut head: a device's receive buffer grows from the hidden states' to the LOGITS message's)
  s.share_bytes = assert(exec.device_share_size(cfg, opts.batch, s.logits_tokens, max_seqs))
  s.payload_bytes = math.max(opts.batch * s.hidden_bytes, 64 * 1024)
  s.weight_bytes = s.global_bytes
  for b = 0, s.n_blocks - 1 do s.weight_bytes = s.weight_bytes + s.res_bytes[b] end
  return s
end

-- The positions an attention block attends to on average at position pos: a window layer's stop
-- at its window (sizes.kv_kinds), a full layer's are pos.
function M.attended(sizes, pos)
  local k = sizes.kv_kinds
  if not k then return pos end
  return (k.full_layers * pos + k.window_layers * math.min(pos, k.window)) / (k.full_layers + k.window_layers)
end

-- (mixture of experts) The experts a step of `rows` tokens routes one layer to, on average,
-- under uniform routing: each row picks `used` of `experts`.
function M.experts_per_layer(moe, rows)
  local E, k = moe.experts, moe.used
  return E * (1 - (1 - k / E) ^ math.max(1, rows or 1))
end

-- The expert cache a device needs at the least when it offloads MLP blocks of a mixture of
-- experts: one layer's chosen experts for one token.
function M.min_expert_slots(sizes) return sizes.moe and sizes.moe.used or 0 end

-- The share of a layer's routed tokens that land on the `slots` most chosen experts among
-- `layers` layers of a routing profile (frequencies[layer][expert], each layer's summing to
-- top-k): what a cache keeping the favoured experts serves.
local function favoured_share(routing, slots, layers, k)
  local all = {}
  for l = 1, #routing do for _, f in ipairs(routing[l]) do all[#all + 1] = f end end
  table.sort(all, function(a, b) return a > b end)
  local top = 0
  -- (the device's layers are not named here: its share of the profile's slots, spread as the profile is)
  local share = math.floor(slots * #routing / math.max(1, layers))
  for i = 1, math.min(share, #all) do top = top + all[i] end
  return math.min(1, top / (#routing * k))
end

-- Expected expert reads per step of part (its offloaded MoE MLP blocks) for `rows` tokens a
-- step, with its cache of part.expert_slots: a cache that keeps a random share of the experts
-- it serves under uniform routing (LRU), or, with a routing profile's frequencies, the experts
-- the profile favours. Returns bytes and reads.
function M.expert_reads(sizes, part, rows, routing)
  local moe = sizes.moe
  if not moe or (part.off_moe or 0) == 0 then return 0, 0 end
  local per_layer = M.experts_per_layer(moe, rows)
  local slots = part.expert_slots or 0
  local hit = routing and favoured_share(routing, slots, part.off_moe, moe.used)
    or math.min(1, slots / (part.off_moe * moe.experts))
  local reads = part.off_moe * per_layer * (1 - hit)
  return reads * moe.expert_bytes, reads
end

return M
