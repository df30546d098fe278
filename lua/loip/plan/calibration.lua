-- Calibrations: a short profile of this machine for the model a run plans, measured once (a few
-- seconds) and kept in the cache, under a key naming the machine, the shape, the context and the
-- disk (docs/planning.md, "Profiles and calibrations"). A run without --profile plans from one;
-- loip.plan.profile measures it and re-exports calibrate and cache_dir.
--
--   local profile = require "loip.plan.profile"
--   local pr, path = profile.calibrate { store = "models/x.loip", threads = 4, context = 256 }
local ffi = require "ffi"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local process = require "loip.runtime.process"
local json = require "loip.text.json"
local shell = require "loip.runtime.shell"
local plan_shape = require "loip.plan.shape"
local hf = require "loip.model.hf"
local store_mod = require "loip.model.store"

local M = {}

-- Where calibrations are kept (loip's cache: loip.runtime.shell.cache_dir).
M.cache_dir = shell.cache_dir

local function sha_hex(s)
  local h = files_rt.sha256()
  files_rt.sha256_update(h, s)
  return (files_rt.sha256_hex(h))
end

-- What a calibration is kept under: the machine (host, kernels, threads), the shape (c, a
-- loip_model_config, and dtype) and context it was measured at, the disk the store lies on
-- ("scratch": none, the cache's own), and how many read that disk at once (readers).
local function key_of(c, threads, dtype, context, store, readers)
  return table.concat({ "v1", io.popen("hostname"):read("*l") or "?", exec.kernels_name(), threads,
    c.dim, c.hidden_dim, c.n_heads, c.n_kv_heads, c.head_dim, tostring(dtype), context,
    store and (io.popen("df -P '" .. store:gsub("'", "") .. "' 2>/dev/null | tail -1 | cut -d' ' -f1"):read("*l") or "?") or "scratch" }, "|")
    .. (readers > 1 and ("|readers " .. readers) or "")
end

-- A calibration: a short profile of this machine for the model a run plans (compute at batch 1
-- and the planned context, the disk through the loader, the transport), measured once and kept
-- in the cache (a few seconds the first time). opts: store (a slice store: its shape, and its
-- block files for the disk) or cfg + dtype (a shape with no weights: the disk is measured on a
-- scratch file in the cache directory), threads, context, fresh (measure again), quiet,
-- readers (1: how many devices of this machine read its disk at once, a local cluster's count:
-- the disk and the compute under load are measured with as many readers, see loip.plan.disk).
-- profile: the module that measures, checks and saves it and says where the cache is
-- (loip.plan.profile, whose calibrate passes itself: call that one).
function M.calibrate(opts, profile)
  local cfg, dtype, files, experts, top_k = opts.cfg, opts.dtype, nil, nil, nil
  if opts.store then
    local store = store_mod
    local man = store.read_manifest(opts.store)
    cfg, dtype = man.config, dtype or store.layer_dtype(man)
    local sized = {}
    for _, f in ipairs(man.files) do
      if f.name:match("^layer%-") and f.expert == nil then sized[#sized + 1] = f end
    end
    experts = select(2, profile.store_files(opts.store, man)) -- (a mixture of experts': read top-k at once)
    if #experts == 0 then experts = nil end
    top_k = man.config.num_experts_per_tok
    table.sort(sized, function(a, b) return a.size > b.size end)
    files = {}
    for j = 1, math.min(#sized, 8) do files[j] = opts.store .. "/" .. sized[j].name end
  end
  cfg = plan_shape.dense_equivalent(cfg) -- (a mixture of experts: a token's work)
  local c = hf.parse_config(cfg, "calibration shape")
  local threads = tonumber(opts.threads) or 0
  local pool = exec.pool_new(threads)
  threads = exec.pool_size(pool)
  exec.pool_free(pool)
  local context = math.min(opts.context or 256, c.max_seq)
  -- blocks larger than this are timed on a narrower layer of the same model (rates carry over)
  local cap = 256 * 1024 * 1024
  local shape = plan_shape.shape_of(cfg, dtype)
  local measured_cfg = cfg
  if shape.mlp_bytes > cap then
    local f = math.sqrt(shape.mlp_bytes / cap)
    measured_cfg = {}
    for k, v in pairs(cfg) do measured_cfg[k] = v end
    measured_cfg.hidden_size = math.floor(c.dim / f / 64) * 64
    measured_cfg.intermediate_size = math.floor(c.hidden_dim / f / 64) * 64
    measured_cfg.head_dim = c.head_dim
    measured_cfg.num_attention_heads = math.max(1, math.floor(c.n_heads / f))
    measured_cfg.num_key_value_heads = math.max(1, math.min(measured_cfg.num_attention_heads, c.n_kv_heads))
    while measured_cfg.num_attention_heads % measured_cfg.num_key_value_heads ~= 0 do
      measured_cfg.num_key_value_heads = measured_cfg.num_key_value_heads - 1
    end
  end
  local readers = math.max(1, math.floor(tonumber(opts.readers) or 1))
  -- (a mixture of experts' store: its experts' reads measured too)
  local key = key_of(c, threads, dtype, context, opts.store, readers) .. (experts and ("|experts " .. tostring(top_k)) or "")
  local dir = profile.cache_dir()
  local path = string.format("%s/calibration-%s.json", dir, sha_hex(key):sub(1, 16))
  if not opts.fresh then
    local old = json.exists(path) and json.load(path)
    if old and not profile.check(old) then return old, path end
  end
  os.execute("mkdir -p '" .. dir:gsub("'", "") .. "'")
  if not opts.quiet then
    io.stderr:write(string.format("calibrating this machine for %s (a few seconds, once; kept in %s; `loip profile` measures more)\n",
      opts.store or "the shape", path))
  end
  local scratch
  if not files then
    -- a scratch file of 64 MiB for the disk, removed after; this process's own (two processes
    -- calibrating at once, as concurrent test runs do, would read and remove each other's)
    scratch = string.format("%s/calibration-disk-%d.tmp", dir, process.pid())
    local w = files_rt.writer(scratch)
    if w then
      local chunk = ffi.new("uint8_t[?]", 1024 * 1024)
      for _ = 1, 64 do files_rt.write(w, chunk, 1024 * 1024) end
      files_rt.commit(w)
      files_rt.writer_free(w)
      files = { scratch }
    end
  end
  local ok, pr = pcall(profile.measure, { cfg = measured_cfg, dtype = dtype, threads = threads, quick = true, context = context,
    disk = files and { files = files, bytes = 64 * 1024 * 1024, readers = readers, experts = experts, parallel = top_k } or nil })
  if scratch then os.remove(scratch) end
  if not ok then error(pr, 0) end
  pr.calibration = { key = key, context = context }
  profile.save(path, pr)
  -- the figures as the cache holds them (JSON keeps 14 significant digits), not as measured: a
  -- plan made now and one made later from the cache, by another process, start from the same
  -- numbers (plans nearly tied went apart on the last digits)
  return json.decode(json.encode_sorted(pr), path) or pr, path
end

return M
