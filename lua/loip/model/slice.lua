-- `loip slice`: a model directory (Hugging Face), GGUF file or llama2.c checkpoint -> a slice store
-- (the layout is described in formats/store.lua), and `loip slice --verify`.
--
--   local slice = require "loip.model.slice"
--   slice.write("models/stories260K", "/tmp/s260k")      -- the store's manifest
--   slice.verify("/tmp/s260k")                            -- raises naming the first bad file
--
-- The manifest (manifest.json, keys sorted, so the same model always gives the same bytes):
--   format, version, alignment    "loip-slice-store", 1, 4096
--   config                        the source's config.json (llama2.c: its header translated,
--                                 with loip_rope_layout = "interleaved"; GGUF: its metadata
--                                 translated, see gguf_model.lua)
--   source                        format ("hf"/"gguf"/"llama2c"), path (as given; for messages only),
--                                 files [{name, size, sha256}] (the weight files, whole: the
--                                 sha256 Hugging Face lists for them), sha256 (of the lines
--                                 "<name> <size> <sha256>\n" of those files in name order)
--   files                         per block file, in load order: name, block, layer, size,
--                                 sha256, crc32c (checked on every offloaded read with
--                                 --verify-reads), tensors [{name (Hugging Face's), kind, layer, dtype,
--                                 shape, offset, nbytes}]; a routed expert's file (mixture of
--                                 experts: layer-LLL-exp-EEE.bin, block "mlp") also has expert (its
--                                 index), as do its tensors (kinds expert_gate, expert_up,
--                                 expert_down)
--   model_files                   copied tokenizer and generation files: name, size, sha256
--                                 (GGUF: tokenizer.gguf, the source's metadata as a GGUF of
--                                 its own: vocabulary, chat template)
--   total_bytes                   of all files but the manifest
--
-- A run is safe to interrupt: an existing manifest is removed before anything is written,
-- every file goes to a temporary name and is renamed when whole, and the manifest is written
-- last. The checks that can refuse (bad model, another model's store, disk space) come first.
local ffi = require "ffi"
local json = require "loip.text.json"
local hf = require "loip.model.hf"
local llama2c = require "loip.model.llama2c"
local store = require "loip.model.store"
local locate = require("loip.model.locate").locate
local progress = require "loip.ui.progress"
local fs = require "loip.runtime.shell"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local memory = require "loip.runtime.memory"
local safetensors = require "loip.model.safetensors"
local gguf_model = require "loip.model.gguf_model"

local M = {}

local CHUNK = 64 * 1024 * 1024 -- bytes per write and hash call: progress updates, no big copies
local SLACK = 1024 * 1024      -- disk room kept for the manifest and the filesystem's own needs

local function basename(p) return (p:gsub("/+$", ""):match("([^/]+)$")) end
local quote, list_dir, is_dir, real_dir, existing_dir = fs.quote, fs.list, fs.is_dir, fs.real_dir, fs.existing_dir

local function hex_of(h) return (files_rt.sha256_hex(h)) end

local new_hash = files_rt.sha256

local function sha256_string(s)
  local h = new_hash()
  files_rt.sha256_update(h, s)
  return hex_of(h)
end

-- The llama2.c header as a Hugging Face LlamaForCausalLM config. The q/k rows stay in
-- llama2.c's order, which pairs RoPE dimensions (2i, 2i+1): loip_rope_layout says so.
local function llama2c_config(c)
  return {
    architectures = { "LlamaForCausalLM" }, model_type = "llama", hidden_act = "silu",
    hidden_size = c.dim, intermediate_size = c.hidden_dim, num_hidden_layers = c.n_layers,
    num_attention_heads = c.n_heads, num_key_value_heads = c.n_kv_heads, head_dim = c.head_dim,
    vocab_size = c.vocab_size, max_position_embeddings = c.max_seq, rms_norm_eps = llama2c.NORM_EPS,
    rope_theta = llama2c.ROPE_THETA, tie_word_embeddings = c.tied_embeddings ~= 0,
    bos_token_id = llama2c.BOS, eos_token_id = llama2c.EOS, torch_dtype = "float32",
    loip_rope_layout = "interleaved", loip_source_format = "llama2.c",
  }
end

-- The source model: config (a Hugging Face config table), the tensors in the order layers run
-- ({ layer, kind, name, view, dtype, shape, nbytes [, pack] }: pack, an FP8 weight's, packs it
-- when called (view, bytes, buffer to free), its view then only for checks), the weight files ({ name, path, map })
-- and the directory holding its tokenizer. Every tensor is bound to a model of that config
-- first, so a model loip cannot run is refused before anything is written.
function M.open_source(path)
  local kind, file, tokdir = locate(path)
  if kind == "store" then error(path .. ": is a slice store already (slice its source model instead)", 0) end
  local src = { path = path:gsub("/+$", ""), format = kind, dir = tokdir or file, tensors = {}, weight_files = {} }
  local c, by_kind = nil, {}
  if kind == "hf" then
    local cfg, err = json.load(file .. "/config.json")
    if not cfg then error(err, 0) end
    c = hf.read_config(file)
    local set, serr = safetensors.open_dir(file)
    if not set then error(serr, 0) end
    src.close = function() safetensors.close(set) end
    src.config = cfg
    for _, f in ipairs(set.files) do
      src.weight_files[#src.weight_files + 1] = { name = basename(f.path), path = f.path, map = f.map }
    end
    for _, w in ipairs(hf.weight_list(c, cfg.architectures[1])) do
      -- (an FP8 weight packed only as its block is written: never the whole checkpoint in memory)
      local view, bytes, pack = hf.weight_view(set, w, file, nil, cfg.architectures[1], true)
      if not view then src.close() error(bytes, 0) end
      by_kind[hf.weight_key(w[1], w[2], w.expert)] = { view = view, nbytes = bytes, pack = pack }
    end
  elseif kind == "gguf" then
    local facts, g, by
    c, facts, g, _, by = gguf_model.open(file)
    src.close = function() g:close() end
    src.config = facts.config
    src.weight_files[1] = { name = basename(file), path = file, map = g.map }
    -- the vocabulary and chat template travel as the GGUF's metadata, byte for byte
    src.extra_files = { { name = "tokenizer.gguf", text = g:metadata_file() } }
    for k, t in pairs(by) do by_kind[k] = t end
  else
    local map, tensors
    c, _, map, _, tensors = llama2c.open(file)
    src.close = function() files_rt.map_free(map) end
    src.config = llama2c_config(c)
    src.weight_files[1] = { name = basename(file), path = file, map = map }
    for _, t in ipairs(tensors) do by_kind[hf.weight_key(t.layer, t.kind)] = t end
  end
  src.c = c
  local m, err = exec.model_new(c)
  if not m then src.close() error(path .. ": " .. err, 0) end
  for _, w in ipairs(hf.weight_list(c, src.config.architectures[1])) do
    local layer, k, name = w[1], w[2], w[3]
    local t = by_kind[hf.weight_key(layer, k, w.expert)]
    if not t then src.close() error(string.format("%s: tensor '%s' is missing", path, name), 0) end
    local v = t.view
    local ok, berr = hf.bind(m, layer, k, v, w.expert)
    if not ok then src.close() error(string.format("%s: tensor '%s': %s", path, name, berr), 0) end
    local shape = {}
    for i = 0, v.ndim - 1 do shape[i + 1] = tonumber(v.shape[i]) end
    src.tensors[#src.tensors + 1] = { layer = layer, kind = k, name = name, view = v, nbytes = t.nbytes,
      dtype = store.dtype_name[tonumber(v.dtype)], shape = shape, expert = w.expert, pack = t.pack }
  end
  local ok, cerr = exec.model_check(m, 0, c.n_layers)
  exec.model_free(m)
  if not ok then src.close() error(path .. ": " .. cerr, 0) end
  return src
end

-- The block files: tensors ({ layer, kind, name, dtype, shape, nbytes [, view] [, expert] }, in
-- the order layers run) grouped by block, each at the next 4 KiB boundary; a routed expert's in a
-- file of its own (store.expert_file), which carries its layer and expert.
local function layout(tensors)
  local files, by_name = {}, {}
  for _, t in ipairs(tensors) do
    local block = store.block_of[tonumber(t.kind)]
    local name = t.expert and store.expert_file(t.layer, t.expert) or store.file_name(block, t.layer)
    local f = by_name[name]
    if not f then
      f = { name = name, block = block, layer = (block == "mha" or block == "mlp") and t.layer or -1, size = 0, tensors = {},
        expert = t.expert }
      by_name[name] = f
      files[#files + 1] = f
    end
    local off = store.align_up(f.size)
    f.tensors[#f.tensors + 1] = { name = t.name, kind = store.kind_name[tonumber(t.kind)], layer = t.layer,
      dtype = t.dtype, shape = t.shape, offset = off, nbytes = t.nbytes, data = t.view and t.view.data, expert = t.expert,
      pack = t.pack }
    f.size = off + t.nbytes
  end
  for _, f in ipairs(files) do f.size = store.align_up(f.size) end
  return files
end

function M.plan(src) return layout(src.tensors) end

-- The block files (as a manifest lists them, without hashes) of a model of config c (a
-- loip_model_config) whose weights are all of dtype ("BF16", ...), its routed experts of
-- experts_dtype when given ("MXFP4": gpt-oss as released): what its store would hold.
function M.layout_of(c, dtype, experts_dtype)
  local tensors = {}
  for _, w in ipairs(hf.weight_list(c)) do
    local shape = hf.shape_of(c, w[2])
    local dt = experts_dtype and hf.expert_part(w[2]) and experts_dtype or dtype
    local nbytes = assert(store.tensor_bytes(dt, shape))
    tensors[#tensors + 1] = { layer = w[1], kind = w[2], name = w[3], dtype = dt, shape = shape, nbytes = nbytes,
      expert = w.expert }
  end
  return layout(tensors)
end

-- The tokenizer and generation files of the source that a store carries along.
local function model_files(src)
  if src.extra_files then
    local out = {}
    for i, f in ipairs(src.extra_files) do out[i] = { name = f.name, text = f.text, size = #f.text } end
    return out
  end
  local names, seen = {}, {}
  local own = src.format == "llama2c" and basename(src.weight_files[1].path) or nil
  for _, n in ipairs(store.model_files) do
    if json.exists(src.dir .. "/" .. n) then names[#names + 1] = n seen[n] = true end
  end
  for _, n in ipairs(list_dir(src.dir) or {}) do
    if n:match(store.model_file_pattern) and not seen[n] and n ~= own then names[#names + 1] = n end
  end
  table.sort(names)
  local out = {}
  for _, n in ipairs(names) do
    local text, err = json.read_file(src.dir .. "/" .. n)
    if not text then error(src.dir .. "/" .. n .. ": " .. tostring(err), 0) end
    out[#out + 1] = { name = n, text = text, size = #text }
  end
  return out
end

-- sha256 of every weight file of the source, read through its mapping. Returns the files'
-- { name, size, sha256 } in name order and the source's hash over them.
function M.hash_source(src, quiet)
  local total = 0
  for _, f in ipairs(src.weight_files) do total = total + files_rt.map_size(f.map) end
  local bar = progress.new(total, "hashing " .. src.path, { quiet = quiet })
  local h, done, list = new_hash(), 0, {}
  for _, f in ipairs(src.weight_files) do
    local size = files_rt.map_size(f.map)
    local base = files_rt.map_data(f.map)
    for off = 0, size - 1, CHUNK do
      local k = math.min(CHUNK, size - off)
      if off + k < size then files_rt.map_prefetch(f.map, off + k, math.min(CHUNK, size - off - k)) end
      files_rt.sha256_update(h, base + off, k)
      done = done + k
      bar:update(done)
    end
    list[#list + 1] = { name = f.name, size = size, sha256 = hex_of(h) }
  end
  bar:finish()
  table.sort(list, function(a, b) return a.name < b.name end)
  local lines = {}
  for i, f in ipairs(list) do lines[i] = string.format("%s %d %s\n", f.name, f.size, f.sha256) end
  return list, sha256_string(table.concat(lines))
end

-- Write path through a loip_writer (temporary name, renamed on commit); put(ptr, n) appends
-- and hashes. Returns the sha256 of what was written and its CRC32C. On any failure the
-- temporary is removed.
local function write_file(path, fill)
  local w, err = files_rt.writer(path)
  if not w then error(err, 0) end
  local h = new_hash()
  local crc = 0
  local function put(p, n)
    assert(files_rt.write(w, p, n))
    files_rt.sha256_update(h, p, n)
    crc = files_rt.crc32c(crc, p, n)
  end
  local ok, ferr = pcall(function()
    fill(put)
    assert(files_rt.commit(w))
  end)
  files_rt.writer_free(w)
  if not ok then error(ferr, 0) end
  return hex_of(h), tonumber(crc)
end

local zeros = ffi.new("uint8_t[?]", store.ALIGN)

local function write_block(out, f, bar, done)
  f.sha256, f.crc32c = write_file(out .. "/" .. f.name, function(put)
    local pos = 0
    local function pad(to)
      while pos < to do
        local k = math.min(store.ALIGN, to - pos)
        put(zeros, k)
        pos = pos + k
      end
    end
    for _, t in ipairs(f.tensors) do
      pad(t.offset)
      local p, buf = ffi.cast("const uint8_t *", t.data), nil
      if t.pack then -- (an FP8 weight: packed now, freed once written)
        local v, nb
        v, nb, buf = t.pack()
        if not v then error(nb, 0) end
        p = ffi.cast("const uint8_t *", v.data)
      end
      for off = 0, t.nbytes - 1, CHUNK do
        local k = math.min(CHUNK, t.nbytes - off)
        put(p + off, k)
        pos, done = pos + k, done + k
        bar:update(done)
      end
      if buf then memory.buffer_free(buf) end
    end
    pad(f.size)
  end)
  return done
end

local function canon(config) return json.encode_sorted(config) end

-- The store in dir already (a table), false when there is none, or raises when dir holds
-- something that is not one.
local function existing_store(out, src, force)
  local here = real_dir(out)
  if json.exists(out .. "/config.json") or (here and here == real_dir(src.dir)) then
    error(out .. ": holds a model (" .. (json.exists(out .. "/config.json") and "config.json" or src.path)
      .. "); slice into a directory of its own", 0)
  end
  if not json.exists(out .. "/manifest.json") then return false end
  local ok, man = pcall(store.read_manifest, out)
  if ok then return man end
  if force then return false end
  error(out .. ": holds a manifest.json that is not a readable slice store (" .. man .. "); pass --force to replace it", 0)
end

-- The bytes of a store of block files and extra (model) files; refused when the disk at out
-- has not room for them: everything, less what replacing files of an earlier run gives back (a
-- file is replaced only once its successor is whole, so the largest counts twice then).
local function check_room(out, files, extra)
  local total, largest = 0, 0
  for _, f in ipairs(files) do total, largest = total + f.size, math.max(largest, f.size) end
  for _, f in ipairs(extra) do total = total + f.size end
  local reclaim = 0
  for _, f in ipairs(files) do reclaim = reclaim + (fs.size(out .. "/" .. f.name) or 0) end
  local need = total + SLACK - reclaim + (reclaim > 0 and largest or 0)
  local free = assert(files_rt.disk_available(existing_dir(out), out))
  if free < need then
    error(string.format("%s: not enough disk space: the store needs %s, %s are free; free some space or slice elsewhere",
      out, progress.human(need), progress.human(free)), 0)
  end
  return total
end

-- The files of out that the store written now does not hold: the old store's (old) not planned
-- again, and temporaries of a killed run.
local function clear_old(out, files, extra, old)
  local planned = {}
  for _, f in ipairs(files) do planned[f.name] = true end
  for _, f in ipairs(extra) do planned[f.name] = true end
  for _, list in ipairs(old and { old.files, old.model_files } or {}) do
    for _, f in ipairs(list) do
      if not planned[f.name] then os.remove(out .. "/" .. f.name) end
    end
  end
  for _, n in ipairs(list_dir(out) or {}) do -- temporaries of a killed run
    local base = n:match("^(.+)%.tmp%.%d+$")
    if base and (planned[base] or base == "manifest.json") then os.remove(out .. "/" .. n) end
  end
end

-- The manifest of the store written: its block files (with their tensors) and model files
-- (mfiles), the source's files and hash.
local function manifest_of(src, files, mfiles, total, source_files, source_hash)
  local man = {
    format = store.FORMAT, version = store.VERSION, alignment = store.ALIGN,
    config = src.config, total_bytes = total, model_files = mfiles,
    source = { format = src.format, path = src.path, files = source_files, sha256 = source_hash },
    files = {},
  }
  for _, f in ipairs(files) do
    local ts = {}
    for i, t in ipairs(f.tensors) do
      ts[i] = { name = t.name, kind = t.kind, layer = t.layer, dtype = t.dtype, shape = t.shape,
        offset = t.offset, nbytes = t.nbytes, expert = t.expert }
    end
    man.files[#man.files + 1] = { name = f.name, block = f.block, layer = f.layer, size = f.size,
      sha256 = f.sha256, crc32c = f.crc32c, tensors = ts, expert = f.expert }
  end
  return man
end

-- Slice the model at src_path into directory out. opts: force (replace a store of another
-- model), quiet (no progress bars). Returns the manifest.
function M.write(src_path, out, opts)
  opts = opts or {}
  local src = M.open_source(src_path)
  local ok, res = pcall(function()
    local old = existing_store(out, src, opts.force)
    local another = "%s: holds the slice store of another model (%s); slice into another directory, or pass --force to replace it"
    if old and not opts.force and canon(old.config) ~= canon(src.config) then
      error(string.format(another, out, "its config differs from " .. src.path .. "'s"), 0)
    end
    local files = M.plan(src)
    local extra = model_files(src)
    local total = check_room(out, files, extra)
    local source_files, source_hash = M.hash_source(src, opts.quiet)
    if old and not opts.force and old.source.sha256 ~= source_hash then
      error(string.format(another, out, "same config, other weights: source sha256 " .. old.source.sha256
        .. ", " .. src.path .. " has " .. source_hash), 0)
    end
    if os.execute("mkdir -p " .. quote(out)) ~= 0 or not is_dir(out) then
      error(out .. ": cannot create the directory", 0)
    end
    -- From here on the directory is not a store until the new manifest lands.
    os.remove(out .. "/manifest.json")
    clear_old(out, files, extra, old)
    local bar = progress.new(total, string.format("slicing %s -> %s", src.path, out), { quiet = opts.quiet })
    local done = 0
    for _, f in ipairs(files) do done = write_block(out, f, bar, done) end
    local mfiles = {}
    for _, f in ipairs(extra) do
      local sha = write_file(out .. "/" .. f.name, function(put) put(f.text, f.size) end)
      mfiles[#mfiles + 1] = { name = f.name, size = f.size, sha256 = sha }
      done = done + f.size
      bar:update(done)
    end
    local man = manifest_of(src, files, mfiles, total, source_files, source_hash)
    local text = json.encode_sorted(man, 1) .. "\n"
    write_file(out .. "/manifest.json", function(put) put(text, #text) end)
    bar:finish(string.format("%s: %d block file%s, %d other file%s", out, #files, #files == 1 and "" or "s",
      #mfiles, #mfiles == 1 and "" or "s"))
    return man
  end)
  src.close()
  if not ok then error(res, 0) end
  return res
end

-- The slice store of the model at src_path kept in the cache (loip.runtime.shell.cache_dir(),
-- stores/<key>): sliced there the first time, with a progress bar, and reused while the source
-- is the same. The key is the source's real path and its weight files' names, sizes and
-- modification times (no hashing of gigabytes to find it); a store found there must hold the
-- source's config and whole files; a changed source's old store goes once the new one is made.
-- Returns the store's directory and whether it was sliced now.
function M.cached(src_path, opts)
  opts = opts or {}
  local src = M.open_source(src_path)
  local paths = {}
  for _, f in ipairs(src.weight_files) do paths[#paths + 1] = quote(f.path) end
  local config = src.config
  src.close()
  local files = table.concat(paths, " ")
  local function run(cmd)
    local p = io.popen(cmd .. " 2>/dev/null")
    local out = p and p:read("*a") or ""
    if p then p:close() end
    return out
  end
  local where = run("realpath -- " .. files)
  local facts = run("stat -L -c '%s %Y' -- " .. files)
  -- <the source's place>-<its files' sizes and times>: a source that changed gets a new store,
  -- and the old one of the same place is removed once the new one is whole
  local place = sha256_string(where):sub(1, 16)
  local name = place .. "-" .. sha256_string(where .. facts):sub(1, 16)
  local stores = fs.cache_dir() .. "/stores"
  local dir = stores .. "/" .. name
  if store.is_store(dir) then
    local ok, man = pcall(store.read_manifest, dir)
    if ok and canon(man.config) == canon(config) and pcall(store.check_files, dir, man, false) then return dir, false end
  end
  M.write(src_path, dir, { force = true, quiet = opts.quiet })
  for _, old in ipairs(list_dir(stores) or {}) do
    if old ~= name and old:sub(1, #place + 1) == place .. "-" then os.execute("rm -rf " .. quote(stores .. "/" .. old)) end
  end
  return dir, true
end

-- Re-hash every file of store dir against its manifest; with source (a model directory or
-- checkpoint), also check that the store was sliced from it (config and source sha256).
-- Returns { files, bytes, manifest }; raises naming the first file at fault.
function M.verify(dir, opts)
  opts = opts or {}
  dir = dir:gsub("/+$", "")
  if not store.is_store(dir) then
    locate(dir) -- names an interrupted store as such
    error(dir .. ": not a slice store (no manifest.json)", 0)
  end
  local man = store.read_manifest(dir)
  local n, bytes = store.check_files(dir, man, false)
  local bar = progress.new(bytes, "verifying " .. dir, { quiet = opts.quiet })
  store.check_files(dir, man, true, bar)
  bar:finish()
  if opts.source then
    local src = M.open_source(opts.source)
    local ok, err = pcall(function()
      if canon(man.config) ~= canon(src.config) then
        error(string.format("%s: was not sliced from %s (the configs differ); %s", dir, src.path,
          store.redo(nil, dir, src.path, true)), 0)
      end
      local _, hash = M.hash_source(src, opts.quiet)
      if hash ~= man.source.sha256 then
        error(string.format("%s: was not sliced from %s (source sha256 %s, the store's is %s); %s", dir,
          src.path, hash, man.source.sha256, store.redo(nil, dir, src.path, true)), 0)
      end
    end)
    src.close()
    if not ok then error(err, 0) end
  end
  return { files = n, bytes = bytes, manifest = man }
end

return M
