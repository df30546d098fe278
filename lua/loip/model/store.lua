-- Slice stores, as `loip slice` (lua/loip/slice.lua) writes them: one file per block that the
-- runtime loads or offloads as a unit, so that a block is read with O_DIRECT in one large
-- request and nothing is parsed on the hot path.
--
--   manifest.json             written last: a directory without it is not a store
--   embed.bin                 the token embedding
--   layer-000-mha.bin         attention norm, q/k/v/o projections, q/k/v biases, q/k norms
--   layer-000-mlp.bin         ffn norm, gate, up, down (a mixture of experts: ffn norm, router,
--                             the shared expert's gate, up, down and its gate, when it has one)
--   layer-000-exp-000.bin     a mixture of experts: routed expert 0 of layer 0 (its gate, up,
--   layer-000-exp-001.bin     down), one file per expert, read alone when the router picks it
--   ...
--   head.bin                  final norm and (when not tied to the embedding) lm_head
--   tokenizer files, generation_config.json ...   copied from the source, unchanged
--
-- Every tensor starts at a multiple of 4096 bytes and every block file's size is one, so
-- that the loader can read whole files into page-aligned memory with O_DIRECT. Tensors keep
-- the source's dtype and bytes; the padding is zeros. The manifest (see slice.lua) records
-- the model's config, the source's hash, and per file its size, sha256 and tensors.
local ffi = require "ffi"
local core = require "loip.core"
local json = require "loip.text.json"
local hf = require "loip.model.hf"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local memory = require "loip.runtime.memory"
local progress = require "loip.ui.progress"
local plan = require "loip.plan"
local K = core.constants

local M = {}

M.FORMAT, M.VERSION, M.ALIGN = "loip-slice-store", 1, 4096

-- Weight kinds as the manifest names them (names, not the C enum's numbers, so that a store
-- outlives a renumbering), and the block each belongs to.
local kind_list = {
  { "embed", K.W_EMBED, "embed" }, { "output_norm", K.W_OUTPUT_NORM, "head" },
  { "lm_head", K.W_LM_HEAD, "head" }, { "attn_norm", K.W_ATTN_NORM, "mha" },
  { "wq", K.W_WQ, "mha" }, { "wk", K.W_WK, "mha" }, { "wv", K.W_WV, "mha" },
  { "wo", K.W_WO, "mha" }, { "bq", K.W_BQ, "mha" }, { "bk", K.W_BK, "mha" },
  { "bv", K.W_BV, "mha" }, { "q_norm", K.W_Q_NORM, "mha" }, { "k_norm", K.W_K_NORM, "mha" },
  { "ffn_norm", K.W_FFN_NORM, "mlp" }, { "gate", K.W_GATE, "mlp" }, { "up", K.W_UP, "mlp" },
  { "down", K.W_DOWN, "mlp" }, { "router", K.W_ROUTER, "mlp" }, { "shared_gate", K.W_SHARED_GATE, "mlp" },
  { "post_attn_norm", K.W_POST_ATTN_NORM, "mha" }, { "post_ffn_norm", K.W_POST_FFN_NORM, "mlp" },
  -- gpt-oss's: the output projection's bias and the sinks with the attention, the router's and
  -- the experts' biases (a row per expert, all of a layer's together) with the MLP
  { "bo", K.W_BO, "mha" }, { "sinks", K.W_SINKS, "mha" }, { "router_bias", K.W_ROUTER_BIAS, "mlp" },
  { "expert_gate_bias", K.W_EXPERT_GATE_BIAS, "mlp" }, { "expert_up_bias", K.W_EXPERT_UP_BIAS, "mlp" },
  { "expert_down_bias", K.W_EXPERT_DOWN_BIAS, "mlp" },
  -- a routed expert's parts (hf.W_EXPERT + K.EXPERT_*): of its layer's MLP block, in a file of
  -- their own (M.expert_file), their tensors and file with an integer "expert" field
  { "expert_gate", hf.W_EXPERT + K.EXPERT_GATE, "mlp" }, { "expert_up", hf.W_EXPERT + K.EXPERT_UP, "mlp" },
  { "expert_down", hf.W_EXPERT + K.EXPERT_DOWN, "mlp" },
}
M.kinds, M.kind_name, M.block_of = {}, {}, {}
for _, k in ipairs(kind_list) do
  M.kinds[k[1]], M.kind_name[tonumber(k[2])], M.block_of[tonumber(k[2])] = k[2], k[1], k[3]
end
-- The expert kinds' names -> part (K.EXPERT_*), and the names in part order.
M.expert_kinds, M.expert_kind_names = {}, { "expert_gate", "expert_up", "expert_down" }
for _, name in ipairs(M.expert_kind_names) do M.expert_kinds[name] = hf.expert_part(M.kinds[name]) end
local per_layer = { mha = true, mlp = true }

M.dtypes = { F32 = { K.F32, 4 }, BF16 = { K.BF16, 2 }, F16 = { K.F16, 2 } }
M.dtype_name = { [K.F32] = "F32", [K.BF16] = "BF16", [K.F16] = "F16" }
-- The block-quantized dtypes (loip.h's LOIP_MXFP4, LOIP_F8_E4M3): their second field is bytes
-- per element on average (F8's scales left out); a tensor's exact bytes are M.tensor_bytes'.
M.dtypes.MXFP4, M.dtype_name[K.MXFP4] = { K.MXFP4, 17 / 32 }, "MXFP4"
M.dtypes.F8_E4M3, M.dtype_name[K.F8_E4M3] = { K.F8_E4M3, 1 }, "F8_E4M3"

-- Bytes of a tensor of dtype (a M.dtypes name) and shape ({ rows, cols }, or { n }: one row),
-- as loip_dtype_bytes counts them: MXFP4 in blocks of 32 values in 17 bytes, F8 with a float32
-- scale per 128x128 block. nil and why when the shape does not fit the dtype.
function M.tensor_bytes(dtype, shape)
  local dt = M.dtypes[dtype]
  if not dt then return nil, "unknown dtype '" .. tostring(dtype) .. "'" end
  local rows, cols = 1, shape[#shape] or 1
  for i = 1, #shape - 1 do rows = rows * shape[i] end
  if dtype == "MXFP4" then
    if cols % 32 ~= 0 then return nil, "MXFP4 row length " .. cols .. " is not a multiple of the block size 32" end
    return rows * cols / 32 * 17
  elseif dtype == "F8_E4M3" then
    return rows * cols + 4 * math.ceil(cols / 128) * math.ceil(rows / 128)
  end
  return rows * cols * dt[2]
end

-- The file of a block: "embed.bin", "head.bin", "layer-003-mha.bin".
function M.file_name(block, layer)
  if per_layer[block] then return string.format("layer-%03d-%s.bin", layer, block) end
  return block .. ".bin"
end

-- The file of block b (2l: layer l's attention, 2l+1: its MLP).
function M.block_file(b) return M.file_name(b % 2 == 0 and "mha" or "mlp", math.floor(b / 2)) end

-- The file of routed expert e (0-based) of layer l: "layer-003-exp-017.bin".
function M.expert_file(l, e) return string.format("layer-%03d-exp-%03d.bin", l, e) end

-- The manifest's files of layer l's routed experts, by expert (their "expert" field): a list
-- of file entries ({ name, layer, expert, size, tensors, ... }) in expert order.
function M.expert_files(man, l)
  local out = {}
  for _, f in ipairs(man.files) do if f.expert ~= nil and f.layer == l then out[#out + 1] = f end end
  table.sort(out, function(a, b) return a.expert < b.expert end)
  return out
end

-- Files of a model directory, besides its weights and config.json, that running the model
-- reads (tokenizer, generation settings, chat template): a store keeps copies, so that it
-- runs without the source. tok<N>.bin is llama2.c's tokenizer naming.
M.model_files = { "tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "tokenizer.bin",
  "tokenizer_config.json", "generation_config.json", "special_tokens_map.json", "added_tokens.json",
  "chat_template.jinja" }
M.model_file_pattern = "^tok[%w_.-]*%.bin$"

function M.align_up(n) return math.ceil(n / M.ALIGN) * M.ALIGN end

-- Size of the file at path, nil when it cannot be opened.
M.file_size = require("loip.runtime.shell").size

function M.is_store(dir) return json.exists(dir .. "/manifest.json") end

-- The dtype of a manifest's (or a slicing plan's files') layer weights: "BF16", ...; "F32" when
-- it has none.
function M.layer_dtype(man)
  for _, f in ipairs(man.files) do
    if f.name:match("^layer%-") then for _, t in ipairs(f.tensors) do if #t.shape == 2 then return t.dtype end end end
  end
  return "F32"
end

-- What to tell the user when a store is damaged: slice its source again (src: that source's
-- path, else the one the manifest names).
function M.redo(man, dir, src, force)
  src = src or type(man) == "table" and type(man.source) == "table" and man.source.path
  return string.format("re-run `loip slice %s%s %s`", force and "--force " or "",
    type(src) == "string" and src or "MODEL_DIR", dir)
end

-- The manifest, read and checked (loip.model.manifest).
local manifest = require("loip.model.manifest").for_store(M)
M.read_manifest, M.check_manifest, M.check_files = manifest.read, manifest.check, manifest.check_files

-- (loip_model_config, facts) of a store's manifest: the config is Hugging Face's, plus
-- loip_rope_layout = "interleaved" for a store made from a llama2.c checkpoint.
function M.config(dir, man)
  local c, facts = hf.parse_config(man.config, dir .. "/manifest.json (config)")
  if man.config.loip_rope_layout == "interleaved" then c.rope_layout = K.ROPE_INTERLEAVED end
  facts.format, facts.source_format = "store", man.source.format
  -- as hf.read_config: the generation settings' end tokens win over config.json's
  local gpath = dir .. "/generation_config.json"
  local gen = json.exists(gpath) and json.load(gpath)
  if type(gen) == "table" and gen.eos_token_id ~= nil then facts.eos_token_id = gen.eos_token_id end
  return c, facts
end

-- The bytes of the files named in `names` (default: every block file): one page-aligned buffer
-- for all of them, read with O_DIRECT ("memory"), or one read-only mapping per file ("mmap").
-- Returns { base = name -> pointer }.
function M.load_files(dir, man, how, budget, names, spare)
  local keep = { base = {}, offset = {}, direct = 0, files = 0, evicted = {} }
  local files = {}
  for _, f in ipairs(man.files) do
    if not names or names[f.name] or (spare and spare[f.name]) then files[#files + 1] = f end
  end
  keep.files = #files
  if how == "mmap" then
    keep.maps = {}
    for _, f in ipairs(files) do
      if not names or names[f.name] then
        local map, err = files_rt.map(dir .. "/" .. f.name)
        if not map then M.close(keep) error(err, 0) end
        keep.maps[#keep.maps + 1] = map
        keep.base[f.name] = files_rt.map_data(map)
      end
    end
    return keep
  elseif how ~= "memory" then
    error("load must be \"memory\" or \"mmap\", not " .. tostring(how), 3)
  end
  -- one reserved buffer: the files loaded are charged and read into their ranges, the spare ones
  -- (offloaded now, resident after a live change perhaps) only have room kept for them
  local total, loading = 0, 0
  for _, f in ipairs(files) do
    total = total + f.size
    if not names or names[f.name] then loading = loading + f.size end
  end
  local buf, err = memory.buffer_reserved(budget, "weights", math.max(total, 1))
  if not buf then error(dir .. ": " .. err, 0) end
  keep.buffer = buf
  local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
  local bar = loading >= 256 * 1024 * 1024 and progress.new(loading, "loading " .. dir) or nil
  local off, done = 0, 0
  for _, f in ipairs(files) do
    keep.base[f.name], keep.offset[f.name] = base + off, off
    if not names or names[f.name] then
      local tok, terr = memory.buffer_take_range(buf, off, f.size)
      if not tok then M.close(keep) error(dir .. ": " .. terr, 0) end
      local ok, direct = files_rt.read(dir .. "/" .. f.name, 0, f.size, base + off, true)
      if not ok then M.close(keep) error(direct .. "; " .. M.redo(man, dir), 0) end
      keep.direct = keep.direct + direct
      done = done + f.size
      if bar then bar:update(done) end
    else
      keep.evicted[f.name] = true
    end
    off = off + f.size
  end
  if bar then bar:finish() end
  return keep
end

-- The block files of device's offloaded blocks under plan p (name -> true).
function M.offloaded_files(p, device, man)
  local out = {}
  for _, st in ipairs(p.devices[device or 1].stages) do
    for b = st.blocks[1], st.blocks[1] + (st.offloaded or 0) - 1 do
      out[M.block_file(b)] = true
      -- (with man, a mixture of experts: an offloaded MLP block's experts, read through the expert cache)
      for _, f in ipairs(man and b % 2 == 1 and M.expert_files(man, (b - 1) / 2) or {}) do out[f.name] = true end
    end
  end
  return out
end

local function fill_view(v, t)
  v.dtype, v.ndim = M.dtypes[t.dtype][1], #t.shape
  for i, d in ipairs(t.shape) do v.shape[i - 1] = d end
end

-- The runner's stage descriptors (loip_stage_desc[S], with their extents and views, kept
-- alive in the returned table) for a one-device plan: each stage's offloaded block files are
-- read whole, one after another, into the slot; the views say where each tensor lands.
-- verify_reads: every read is checked against its file's CRC32C in the manifest (a store
-- sliced before checksums were kept is refused, naming it).
function M.stage_descs(dir, man, p, device, verify_reads)
  local by_name = {}
  for _, f in ipairs(man.files) do by_name[f.name] = f end
  local stages = p.devices[device or 1].stages
  local out = { n = #stages, descs = ffi.new("loip_stage_desc[?]", #stages), anchors = {} }
  for k, st in ipairs(stages) do
    local d = out.descs[k - 1]
    local a, off = st.blocks[1], st.offloaded or 0
    d.first_block, d.last_block, d.n_offloaded = a, st.blocks[2] + 1, off
    if p.per_block then d.flags = K.STAGE_PER_BLOCK end
    if off > 0 then
      local files, n_views = {}, 0
      for b = a, a + off - 1 do
        local f = by_name[M.block_file(b)]
        files[#files + 1] = f
        n_views = n_views + #f.tensors
      end
      local ext, views = ffi.new("loip_load_extent[?]", #files), ffi.new("loip_stage_view[?]", n_views)
      local paths, slot_off, vi = {}, 0, 0
      for i, f in ipairs(files) do
        local path = dir .. "/" .. f.name
        paths[i] = path
        local e = ext[i - 1]
        e.path, e.fd, e.file_offset, e.length, e.slot_offset = path, -1, 0, f.size, slot_off
        if verify_reads then
          if not f.crc32c then
            error(string.format("%s/manifest.json: %s has no CRC32C (sliced by an older loip): --verify-reads needs a store "
              .. "sliced again (loip slice --force MODEL_DIR %s)", dir, f.name, dir), 0)
          end
          e.check, e.crc32c = 1, f.crc32c
        end
        for _, t in ipairs(f.tensors) do
          local v = views[vi]
          v.layer, v.which, v.slot_offset = t.layer, M.kinds[t.kind], slot_off + t.offset
          fill_view(v, t)
          vi = vi + 1
        end
        slot_off = slot_off + f.size
      end
      d.n_extents, d.extents, d.n_views, d.views = #files, ext, n_views, views
      out.anchors[#out.anchors + 1] = { ext, views, paths }
    end
  end
  return out
end

-- Bind the tensors of manifest file f, loaded at base, to model m (a routed expert's with
-- loip_model_bind_expert).
local function bind_tensors(m, dir, f, base)
  for _, t in ipairs(f.tensors) do
    local v = ffi.new("loip_tensor")
    v.data = base + t.offset
    fill_view(v, t)
    local ok, err = hf.bind(m, t.layer, M.kinds[t.kind], v, t.expert)
    if not ok then error(string.format("%s/%s: tensor '%s': %s", dir, f.name, t.name, err), 0) end
  end
end

-- Bind every tensor of the files loaded in keep (M.load_files) to model m.
function M.bind_loaded(m, dir, man, keep)
  for _, f in ipairs(man.files) do
    if keep.base[f.name] and not keep.evicted[f.name] then bind_tensors(m, dir, f, keep.base[f.name]) end
  end
end

-- Open store dir for loip.model.open: (config, facts, bind) where bind(model, plan) loads the
-- blocks (the resident ones only, under a plan), binds their tensors and returns what must stay
-- alive with the model; the offloaded blocks are bound later by the runner (M.stage_descs).
-- opts.load: "memory" (default) or "mmap"; opts.verify: check every file's sha256 first;
-- opts.budget (loip_budget *): charged for the "memory" buffer before it is allocated;
-- opts.experts(layer, e) -> bool (a mixture of experts; default: every one): which routed
-- experts' files are loaded and bound now (the others are left unbound: an expert cache reads
-- them, loip_session_set_experts).
function M.open(dir, opts)
  opts = opts or {}
  if opts.experts ~= nil and type(opts.experts) ~= "function" then
    error("store.open: experts must be a function(layer, expert) -> boolean", 2)
  end
  local man = M.read_manifest(dir)
  local c, facts = M.config(dir, man)
  M.check_files(dir, man, opts.verify)
  facts.manifest = man
  -- opts.layers: the model's first L layers and its head, nothing of the others loaded (a
  -- draft of the model made of itself: recipes/policies/draft/self.lua)
  local L = opts.layers
  if L then
    if type(L) ~= "number" or L < 1 or L > c.n_layers or L ~= math.floor(L) then
      error(string.format("%s: layers %s: the model has %d layers (1..%d)", dir, tostring(L), c.n_layers, c.n_layers), 0)
    end
    c.n_layers = L
  end
  local function bind(m, p)
    -- under a plan: the resident blocks loaded, room kept for the offloaded ones
    local names, spare
    if p then
      names, spare = {}, M.offloaded_files(p, 1, man)
      local on_disk = M.ends_files(p, 1, c.tied_embeddings ~= 0)
      -- (a tied head read from disk keeps head.bin: its final norm)
      if c.tied_embeddings ~= 0 then on_disk["head.bin"] = nil end
      for _, f in ipairs(man.files) do if not spare[f.name] and not on_disk[f.name] then names[f.name] = true end end
    end
    if L then
      names = names or {}
      for _, f in ipairs(man.files) do
        local inside = names[f.name] or not p
        for _, t in ipairs(f.tensors) do inside = inside and (t.layer or -1) < L end
        names[f.name] = inside or nil
      end
    end
    if opts.experts then
      if not names then
        names = {}
        for _, f in ipairs(man.files) do names[f.name] = true end
      end
      for _, f in ipairs(man.files) do
        if f.expert ~= nil and names[f.name] and not opts.experts(f.layer, f.expert) then names[f.name] = nil end
      end
    end
    local keep = M.load_files(dir, man, opts.load or "memory", opts.budget, names, spare)
    local ok, err = pcall(function()
      M.bind_loaded(m, dir, man, keep)
      if p then keep.ends = M.bind_ends(m, dir, man, p, 1, c.tied_embeddings ~= 0, opts.budget) end
    end)
    if not ok then
      M.close(keep)
      error(err, 0)
    end
    return keep
  end
  return c, facts, bind
end

-- Live plan changes (a block moving between resident and offloaded): drop a loaded file's
-- resident copy (its memory and its "weights" bytes go back), or take it back and read it again
-- (charged first: the budget may refuse). Only for files loaded into memory (M.load_files).
local function loaded_file(keep, man, name)
  if not keep.buffer or not keep.offset[name] then
    error(string.format("%s: not loaded into memory (a live change needs load = \"memory\")", name), 0)
  end
  for _, f in ipairs(man.files) do if f.name == name then return f end end
  error("manifest: no file " .. name, 0)
end

function M.evict(keep, man, name)
  local f = loaded_file(keep, man, name)
  if keep.evicted[name] then return end
  assert(memory.buffer_drop_range(keep.buffer, keep.offset[name], f.size, name))
  keep.evicted[name] = true
end

function M.reload(keep, dir, man, name)
  local f = loaded_file(keep, man, name)
  if not keep.evicted[name] then return end
  assert(memory.buffer_take_range(keep.buffer, keep.offset[name], f.size, dir .. "/" .. name))
  local ok, err = files_rt.read(dir .. "/" .. name, 0, f.size, keep.base[name], true)
  if not ok then
    memory.buffer_drop_range(keep.buffer, keep.offset[name], f.size)
    error(err .. "; " .. M.redo(man, dir), 0)
  end
  keep.evicted[name] = nil
end

-- Bind the tensors of one loaded file to model m.
function M.bind_file(m, dir, man, keep, name)
  bind_tensors(m, dir, loaded_file(keep, man, name), keep.base[name])
end

-- A live plan change on one device, between steps: stage `stage` (1-based) of the device's
-- part of the plan now reads its first `offloaded` blocks every step. Blocks that become
-- resident are read back into memory (charged to "weights" first) and bound; blocks that become
-- offloaded give their memory back and are read into the slot from the next step. No KV is
-- touched and no token changes. o: runner, model (loip_model *), keep (M.load_files'), dir,
-- man, plan, device, stage, offloaded; loader (the runner's, or nil) and new_loader(slot_bytes)
-- (a loader like it with larger slots, charged to the device's budget): when the new stage
-- does not fit the slots, the blocks leaving memory go first, then the old loader
-- (o.on_loader(nil): the caller closes it), then the runner takes the new one (o.on_loader(new)). Returns the new plan (a
-- copy) and the stage descriptors (kept alive by the caller), or the plan unchanged.
function M.restage(o)
  local p, k, offloaded = o.plan, o.stage, o.offloaded
  local p2 = plan.restaged(p, o.device, k, offloaded) -- (checks the stage and the count)
  if p2 == p then return p end
  local st = p.devices[o.device].stages[k]
  local old = st.offloaded or 0
  local file = M.block_file
  local descs = M.stage_descs(o.dir, o.man, p2, o.device, o.verify_reads)
  local a = st.blocks[1]
  -- the slots must hold the largest stage's reads
  local size = {}
  for _, f in ipairs(o.man.files) do size[f.name] = f.size end
  local need = 0
  for _, s2 in ipairs(p2.devices[o.device].stages) do
    local bytes = 0
    for b = s2.blocks[1], s2.blocks[1] + (s2.offloaded or 0) - 1 do bytes = bytes + size[file(b)] end
    need = math.max(need, bytes)
  end
  local grow = need > 0 and (not o.loader or need > o.loader:slot_bytes())
  if grow and not o.new_loader then
    error(string.format("restage: stage %d to %d offloaded blocks reads %d bytes a step, more than the slot holds", k, offloaded, need), 0)
  end
  local back, gone = {}, {}
  for b = a + offloaded, a + old - 1 do -- resident again: in memory first, bound after the change
    M.reload(o.keep, o.dir, o.man, file(b))
    back[#back + 1] = file(b)
  end
  local function undo(err)
    for _, name in ipairs(back) do M.evict(o.keep, o.man, name) end
    for _, name in ipairs(gone) do M.reload(o.keep, o.dir, o.man, name) M.bind_file(o.model, o.dir, o.man, o.keep, name) end
    error(string.format("restage: stage %d to %d offloaded blocks: %s", k, offloaded, err), 0)
  end
  if grow then
    -- the blocks leaving memory make room for the larger slot (they are read from the slot
    -- once the runner has the new stage: nothing computes in between)
    for b = a + old, a + offloaded - 1 do M.evict(o.keep, o.man, file(b)) gone[#gone + 1] = file(b) end
    -- the old slot goes before the new one is made: both at once could pass the budget
    local old_bytes = o.loader and o.loader:slot_bytes() or 0
    exec.runner_set_loader(o.runner, nil)
    if o.on_loader then o.on_loader(nil) end
    local ok, l = pcall(o.new_loader, need)
    if not ok then
      local back_ok, old_l = pcall(o.new_loader, old_bytes) -- (the room it had is free again)
      if back_ok then exec.runner_set_loader(o.runner, old_l.handle) if o.on_loader then o.on_loader(old_l) end end
      undo(tostring(l))
    end
    local set, err = exec.runner_set_loader(o.runner, l.handle)
    if not set then
      l:close()
      undo(err)
    end
    if o.on_loader then o.on_loader(l) end
  end
  local restaged, rerr = exec.runner_restage(o.runner, k - 1, descs.descs + (k - 1))
  if not restaged then undo(rerr) end
  for _, name in ipairs(back) do M.bind_file(o.model, o.dir, o.man, o.keep, name) end
  if not grow then
    for b = a + old, a + offloaded - 1 do M.evict(o.keep, o.man, file(b)) end -- read every step now
  end
  if o.move_experts then o.move_experts(p, p2) end -- (a mixture of experts: an MLP block's experts move with it)
  return p2, descs
end

-- ---- the embedding and head kept on disk (a plan's embed_rows, head_rows: loip.plan.ends)

-- How device i (of plan p's #p.devices) keeps the ends, for a model tied or not.
local function ends_how(p, i, tied)
  return plan.ends.how(plan.ends.of(p), i == 1, i == #p.devices, tied, p.head_shares and p.head_shares[i])
end

-- The files device i reads from disk for the ends it keeps there (name -> true): shipped to a
-- worker with its blocks, not loaded.
function M.ends_files(p, i, tied)
  local how, out = ends_how(p, i, tied), {}
  if how.cut then
    -- (a cut head: its share's rows read from the table's file, into memory or by chunks; an
    -- untied head's final norm read alone from head.bin)
    if how.embed == "rows" or (how.head and tied and not how.table) then out["embed.bin"] = true end
    if not tied and (how.head or how.norm) then out["head.bin"] = true end
    return out
  end
  if how.embed == "rows" or (how.head == "rows" and tied) then out["embed.bin"] = true end
  if how.head == "rows" and not tied then out["head.bin"] = true end
  return out
end

local function tensor_of(man, file, kind)
  for _, f in ipairs(man.files) do
    if f.name == file then
      for _, t in ipairs(f.tensors) do if t.kind == kind then return t end end
    end
  end
  error(string.format("manifest: %s has no tensor of kind %s", file, kind), 0)
end

-- Bind device i's ends kept on disk under plan p into model m: the embedding's table and an
-- untied head's as loip_rows (row cache and head chunk charged to budget's "slots"), an untied
-- head's final norm alone read into memory ("weights"). Returns what must live as long as the
-- model (M.close frees it with the rest), or nil when both ends are in memory.
function M.bind_ends(m, dir, man, p, i, tied, budget)
  local ends, how = plan.ends.of(p), ends_how(p, i, tied)
  if how.embed ~= "rows" and how.head ~= "rows" and not how.cut then return nil end
  local keep = { rows = {} }
  local function rows(file, kind, which, cache, chunk)
    local t = tensor_of(man, file, kind)
    local r, err = exec.rows_new(dir .. "/" .. file, t.offset, M.dtypes[t.dtype][1], t.shape[1], t.shape[2], cache, chunk, budget)
    if not r then M.close(keep) error(string.format("%s/%s: %s", dir, file, err), 0) end
    keep.rows[#keep.rows + 1] = r
    -- (LOIP_HEAD_AHEAD=0: the head's chunks each read when needed, to compare; LOIP_HEAD_DIRECT=1:
    -- read past the page cache; docs/planning.md)
    if chunk > 0 and os.getenv("LOIP_HEAD_AHEAD") == "0" then exec.rows_set_ahead(r, false) end
    if chunk > 0 and os.getenv("LOIP_HEAD_DIRECT") == "1" then
      local ok, derr = exec.rows_set_direct(r, true)
      if not ok then io.stderr:write("loip: LOIP_HEAD_DIRECT: ", tostring(derr), "\n") end
    end
    local ok, berr = exec.model_bind_rows(m, which, r)
    if not ok then M.close(keep) error(string.format("%s/%s: %s", dir, file, berr), 0) end
  end
  -- bytes [at, at + n) of file read into a buffer charged to "weights" (kept), t bound as if
  -- the file were there (only those bytes of it are)
  local function part_of(file, t, at, n)
    local buf, err = memory.buffer_charged(budget, "weights", M.align_up(math.max(n, 1)))
    if not buf then M.close(keep) error(dir .. "/" .. file .. ": " .. err, 0) end
    keep.parts = keep.parts or {}
    keep.parts[#keep.parts + 1] = buf
    local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
    if n > 0 then
      local ok, rerr = files_rt.read(dir .. "/" .. file, at, n, base, false)
      if not ok then M.close(keep) error(rerr .. "; " .. M.redo(man, dir), 0) end
    end
    bind_tensors(m, dir, { name = file, tensors = { t } }, base - at)
  end
  if how.cut then
    local first, count = plan.ends.share_of(p.head_shares, i)
    local tfile, tkind = tied and "embed.bin" or "head.bin", tied and "embed" or "lm_head"
    local which = tied and K.W_EMBED or K.W_LM_HEAD
    local cache = how.embed == "rows" and ends.embed_rows or 0
    if how.head == "rows" then
      -- (chunks of head_rows rows, at most the share's rows rounded up to 16)
      local t = tensor_of(man, tfile, tkind)
      rows(tfile, tkind, which, tied and cache or 0, plan.ends.share_chunk(t.nbytes / t.shape[1], ends.head_rows, count))
    elseif how.head == "memory" and not (tied and how.table) then
      -- the share's rows alone in memory: the table bound at its place, rows [first, first + count) there
      local t = tensor_of(man, tfile, tkind)
      local row = t.nbytes / t.shape[1]
      part_of(tfile, t, t.offset + first * row, count * row)
    end
    if how.embed == "rows" and not (tied and how.head == "rows") then rows("embed.bin", "embed", K.W_EMBED, cache, 0) end
    if how.norm and not tied then
      local t = tensor_of(man, "head.bin", "output_norm")
      part_of("head.bin", t, t.offset, t.nbytes)
    end
    return keep
  end
  local head_chunk = how.head == "rows" and ends.head_rows or 0
  if tied then
    rows("embed.bin", "embed", K.W_EMBED, how.embed == "rows" and ends.embed_rows or 0, head_chunk)
  else
    if how.embed == "rows" then rows("embed.bin", "embed", K.W_EMBED, ends.embed_rows, 0) end
    if how.head == "rows" then
      rows("head.bin", "lm_head", K.W_LM_HEAD, 0, head_chunk)
      local t = tensor_of(man, "head.bin", "output_norm")
      local buf, err = memory.buffer_charged(budget, "weights", M.align_up(t.nbytes))
      if not buf then M.close(keep) error(dir .. "/head.bin: " .. err, 0) end
      keep.norm = buf
      local base = ffi.cast("uint8_t *", memory.buffer_data(buf))
      local ok, rerr = files_rt.read(dir .. "/head.bin", t.offset, M.align_up(t.nbytes), base, true)
      if not ok then M.close(keep) error(rerr .. "; " .. M.redo(man, dir), 0) end
      bind_tensors(m, dir, { name = "head.bin", tensors = { t } }, base - t.offset)
    end
  end
  return keep
end

function M.close(keep)
  if keep.ends then M.close(keep.ends) keep.ends = nil end
  for _, r in ipairs(keep.rows or {}) do exec.rows_free(r) end
  keep.rows = nil
  if keep.norm then memory.buffer_free(keep.norm) keep.norm = nil end
  for _, b in ipairs(keep.parts or {}) do memory.buffer_free(b) end
  keep.parts = nil
  memory.buffer_free(keep.buffer)
  for _, map in ipairs(keep.maps or {}) do files_rt.map_free(map) end
  keep.buffer, keep.maps = nil, nil
end

return M
