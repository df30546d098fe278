-- A device's expert cache (mixture of experts, loip.h "the expert cache"), made from a slice
-- store's manifest for the layers whose MLP blocks the plan offloads: their routed experts are
-- read one by one into slots of a loader of their own (io_uring, O_DIRECT: an expert is one
-- block file), only the ones a step's router picks (or pre-gating predicts), and kept there as
-- the `experts` policy says (recipes/policies/experts/). Pre-gating needs those layers' ffn_norm
-- and router in memory while their block files are offloaded: a copy of those two tensors per
-- layer is kept, charged to the budget's "weights".
--
--   local cache = experts.open { model = m.handle, session = s, dir = dir, man = man, cfg = cfg,
--     layers = { [3] = true, ... }, slots = 24, policy = "lru", budget = budget }
--   cache:stats()   -- { routed, read, cache_hits, prefetched, prefetch_hits, bytes_read, ... }
local ffi = require "ffi"
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local files_rt = require "loip.runtime.files"
local memory = require "loip.runtime.memory"
local store = require "loip.model.store"
local space = require "loip.plan.space"
local loader = require "loip.runtime.loader"
local json = require "loip.text.json"
local plan_mod = require "loip.plan"
local policy_mod = require "loip.policy"
local K = core.constants

local M = {}

local Cache = {}
Cache.__index = Cache

local parts = { expert_gate = K.EXPERT_GATE, expert_up = K.EXPERT_UP, expert_down = K.EXPERT_DOWN }
-- The most experts a cache holds (loip.plan.space sizes caches).
M.MAX_SLOTS = space.MAX_EXPERT_SLOTS

local replacement = { lru = K.EXPERTS_LRU, lfu = K.EXPERTS_LFU, static = K.EXPERTS_STATIC, all = K.EXPERTS_ALL }
M.replacements = { "lru", "lfu", "static", "all" }

local function view_of(t, data)
  local v = ffi.new("loip_tensor")
  v.data, v.dtype, v.ndim = data, store.dtypes[t.dtype][1], #t.shape
  for i, d in ipairs(t.shape) do v.shape[i - 1] = d end
  return v
end

-- o: model (loip_model *), session (loip_session *: its unbound experts go through the cache),
-- dir, man, cfg (loip_model_config), layers (set of 0-based layers whose experts it serves),
-- slots (experts it holds), policy ("lru" | "lfu" | "static" | "all"), prefetch (layers predicted
-- ahead, default 1; 0: off), min_accuracy / probe_every (pre-gating that the router confirms
-- less often than this stops, but for a probe every probe_every runs; 0: never stops), pins
-- ({ { layer, expert } ... }: kept for good, "static"), budget (a
-- loip.memory budget or nil), mode / rate (the loader's: "auto", bytes/s), verify_reads (check
-- each read's CRC32C), trace (keep read events). Raises naming the file or the setting.
function M.open(o)
  local E = o.cfg.n_experts
  local biggest = 0
  for l in pairs(o.layers) do
    local files = store.expert_files(o.man, l) -- (in expert order: the first missing one named)
    for e = 0, E - 1 do
      local f = files[e + 1]
      if not f or f.expert ~= e then
        error(string.format("%s/manifest.json: no file for expert %d of layer %d (%s): %s", o.dir, e, l,
          store.expert_file(l, e), store.redo(o.man, o.dir)), 0)
      end
      biggest = math.max(biggest, f.size)
    end
  end
  local policy = replacement[o.policy or "lru"]
  if not policy then
    error(string.format("experts: replacement '%s' is not one of %s", tostring(o.policy), table.concat(M.replacements, ", ")), 0)
  end
  local self = setmetatable({ layers = o.layers, slots = o.slots, anchors = {} }, Cache)
  -- (experts are independent loads: their reads overlap, so that the queue stays full while a
  -- layer waits for several of them; o.overlap_loads = false reads them one after another)
  local lc = loader.config { slots = o.slots, slot_bytes = biggest, mode = o.mode or "auto",
    rate = o.rate or 0, budget = o.budget, overlap_loads = o.overlap_loads ~= false }
  local cfg = ffi.new("loip_experts_config")
  cfg.policy, cfg.prefetch, cfg.event_capacity = policy, o.prefetch or 1, o.trace and 65536 or 0
  cfg.prefetch_min_accuracy, cfg.prefetch_probe_every = o.min_accuracy or 0, o.probe_every or 0
  local x, xerr = exec.experts_new(o.model, lc, cfg)
  if not x then error(o.dir .. ": expert cache: " .. xerr, 0) end
  self.handle = x
  self.o = o
  local ok, why = pcall(function()
    for l in pairs(o.layers) do self:_sources(l, store.expert_files(o.man, l)) end
    if (o.prefetch or 1) > 0 then self:_gating(o) end
    for _, pin in ipairs(o.pins or {}) do core.must(exec.experts_pin(x, pin[1], pin[2], "experts: pin")) end
    core.must(exec.session_set_experts(o.session, x))
  end)
  if not ok then
    self:close()
    error(why, 0)
  end
  self.session = o.session
  return self
end

-- Serve layer l's experts too (its MLP block is offloaded now: loip.model.store's live restage):
-- their files as sources, and its router kept for pre-gating (charged as at open). A layer
-- served already is left as it is.
function Cache:serve(l)
  if self.layers[l] then return end
  self:_sources(l, store.expert_files(self.o.man, l))
  self.layers[l] = true
  if (self.o.prefetch or 1) > 0 then self:_gating(self.o, { [l] = true }) end
end

-- Layer l's expert files (manifest entries) as the cache's sources: where each expert lies.
function Cache:_sources(l, files)
  local o = self.o
  local ext, offs = ffi.new("loip_load_extent"), ffi.new("uint64_t[3]")
  for _, f in ipairs(files) do
    local path = o.dir .. "/" .. f.name
    self.anchors[#self.anchors + 1] = path
    ext.path, ext.fd, ext.file_offset, ext.length, ext.slot_offset = path, -1, 0, f.size, 0
    ext.check, ext.crc32c = 0, 0
    if o.verify_reads and f.crc32c then ext.check, ext.crc32c = 1, f.crc32c end
    local dtype
    for _, t in ipairs(f.tensors) do
      local p = parts[t.kind]
      if p then offs[p], dtype = t.offset, store.dtypes[t.dtype][1] end
    end
    core.must(exec.experts_set_source(self.handle, l, f.expert, ext, offs, dtype or K.F32, path))
  end
end

-- Copies of the served layers' ffn_norm and router (their MLP block files are read into the
-- slot only when their stage runs; pre-gating runs before that).
function Cache:_gating(o, layers)
  local want, total = {}, 0
  for _, f in ipairs(o.man.files) do
    local l = f.expert == nil and f.name:match("^layer%-(%d+)%-mlp%.bin$")
    if l and (layers or o.layers)[tonumber(l)] then
      local norm, router, bias
      for _, t in ipairs(f.tensors) do
        if t.kind == "ffn_norm" then norm = t elseif t.kind == "router" then router = t
        elseif t.kind == "router_bias" then bias = t end
      end
      if norm and router then
        want[#want + 1] = { layer = tonumber(l), file = f, norm = norm, router = router, bias = bias }
        total = total + store.align_up(norm.nbytes) + store.align_up(router.nbytes) + (bias and store.align_up(bias.nbytes) or 0)
      end
    end
  end
  if total == 0 then return end
  local buf, err
  if o.budget then buf, err = memory.buffer_charged(o.budget.handle, "weights", total)
  else buf, err = memory.buffer(total) end
  if not buf then error(o.dir .. ": the routers kept for pre-gating: " .. err, 0) end
  self.gating = self.gating or {}
  self.gating[#self.gating + 1] = buf
  local base, at = ffi.cast("uint8_t *", memory.buffer_data(buf)), 0
  for _, w in ipairs(want) do
    local path = o.dir .. "/" .. w.file.name
    local views = {}
    for i, t in ipairs({ w.norm, w.router, w.bias }) do -- (the router's bias: gpt-oss's)
      core.must(files_rt.read(path, t.offset, t.nbytes, base + at, false, path))
      views[i] = view_of(t, base + at)
      at = at + store.align_up(t.nbytes)
    end
    core.must(exec.experts_set_gating(self.handle, w.layer, views[1], views[2], path))
    if views[3] then core.must(exec.experts_set_gating_bias(self.handle, w.layer, views[3], path)) end
  end
end

-- What the cache did: routed (experts chosen, per layer run), bound (of those, resident),
-- cache_hits, read (on demand), prefetched, prefetch_hits, bytes_read, stall_ms.
function Cache:stats()
  local st = exec.experts_stats(self.handle, ffi.new("loip_experts_stats_t"))
  return { routed = tonumber(st.routed), bound = tonumber(st.bound), cache_hits = tonumber(st.cache_hits),
    read = tonumber(st.read), prefetched = tonumber(st.prefetched), prefetch_hits = tonumber(st.prefetch_hits),
    prefetch_skipped = tonumber(st.prefetch_skipped),
    bytes_read = tonumber(st.bytes_read), stall_ms = tonumber(st.stall_ns) / 1e6, slots = self.slots }
end

-- Recorded expert reads since the last call, as loip.model's m:events() lists the runner's: a
-- "load" on the disk lane of block 2l+1 (layer l's MLP), with expert and prefetch.
function Cache:events()
  local out = {}
  self.event_buf = self.event_buf or ffi.new("loip_runner_event[1024]")
  repeat
    local k = exec.experts_events(self.handle, self.event_buf, 1024)
    for i = 0, k - 1 do
      local e = self.event_buf[i]
      out[#out + 1] = { kind = "load", stage = 0, first_block = 2 * e.stage + 1, last_block = 2 * e.stage + 2,
        t0_ns = tonumber(e.t0_ns), t1_ns = tonumber(e.t1_ns), bytes = tonumber(e.bytes), offloaded = true, tokens = 0,
        expert = e.first_block, prefetch = e.offloaded ~= 0,
        name = string.format("%s expert %d of layer %d", e.offloaded ~= 0 and "prefetch" or "read", e.first_block, e.stage) }
    end
  until k < 1024
  return out
end

-- A routing profile (`loip profile --routing`): { format = "loip-routing", layers, experts, tokens,
-- frequencies[layer + 1][expert + 1] (the share of tokens that chose it) }; nil for no path.
-- Raises naming the file and the field.
function M.load_routing(path)
  if path == nil then return nil end
  local r, err = json.load(path)
  if not r then error(err, 0) end
  if type(r) ~= "table" or r.format ~= "loip-routing" then
    error(path .. ": not a routing profile (no \"format\": \"loip-routing\"; make one with loip profile --routing)", 0)
  end
  if type(r.frequencies) ~= "table" or #r.frequencies ~= r.layers then
    error(string.format("%s: field 'frequencies' must list %s layers", path, tostring(r.layers)), 0)
  end
  for l, f in ipairs(r.frequencies) do
    if type(f) ~= "table" or #f ~= r.experts then
      error(string.format("%s: frequencies[%d] must list %s experts", path, l, tostring(r.experts)), 0)
    end
    for e, v in ipairs(f) do
      if type(v) ~= "number" or v < 0 then error(string.format("%s: frequencies[%d][%d] is not a share >= 0", path, l, e), 0) end
    end
  end
  r.path = path
  return r
end

-- Record a routing profile: every prompt (text) of the list through loip.model m (its prefill,
-- then `generate` tokens greedily, default 0), counting the tokens each layer's router sends to
-- each expert. Returns the profile table (as M.load_routing reads it). on_prompt(i, n) reports
-- progress.
function M.profile_routing(m, prompts, opts)
  opts = opts or {}
  local c = m.cfg
  if c.n_experts == 0 then error(m.path .. ": not a mixture of experts (no routing to profile)", 0) end
  local n = c.n_layers * c.n_experts
  local counts = ffi.new("uint64_t[?]", n)
  local s = m:session()
  core.must(exec.session_take_routing(s, counts, n, "routing")) -- (what ran before is not counted)
  ffi.fill(counts, ffi.sizeof("uint64_t") * n)
  local tokens = 0
  for i, text in ipairs(prompts) do
    local ids = m.tokenizer:encode(text)
    if #ids > m.context then error(string.format("prompt %d: %d tokens, more than the context of %d", i, #ids, m.context), 0) end
    if (opts.generate or 0) > 0 then
      local it, st = m:generate(ids, { max_tokens = opts.generate, temperature = 0 })
      for _ in it do end
      tokens = tokens + #ids + st.stats.generated - 1 -- (the last token is never run through the layers)
    else
      m:logits(ids)
      tokens = tokens + #ids
    end
    core.must(exec.session_take_routing(s, counts, n, "routing"))
    if opts.on_prompt then opts.on_prompt(i, #prompts) end
  end
  local freq = {}
  for l = 0, c.n_layers - 1 do
    local row = {}
    for e = 0, c.n_experts - 1 do row[e + 1] = tokens > 0 and tonumber(counts[l * c.n_experts + e]) / tokens or 0 end
    freq[l + 1] = row
  end
  return { format = "loip-routing", model = m.path, layers = c.n_layers, experts = c.n_experts, used = c.n_experts_used,
    prompts = #prompts, tokens = tokens, frequencies = freq }
end

-- Routing profile r (M.load_routing's) checked against a model of n_layers layers and n_experts
-- experts per layer; raises naming `where` (the file) and what differs.
function M.check_routing(r, n_layers, n_experts, where)
  if r.layers ~= n_layers or r.experts ~= n_experts then
    error(string.format("%s: a routing profile of %s layers of %s experts, the model has %d of %d", where or "routing profile",
      tostring(r.layers), tostring(r.experts), n_layers, n_experts), 0)
  end
  return r
end

-- ---- for loip.model (one device under a plan) ---------------------------------------------

-- The 0-based layers whose MLP blocks device i of plan p offloads: a set and a sorted list.
function M.offloaded_layers(p, i)
  local set, list = {}, {}
  for _, st in ipairs(p.devices[i or 1].stages) do
    for b = st.blocks[1], st.blocks[1] + (st.offloaded or 0) - 1 do
      if b % 2 == 1 then set[(b - 1) / 2] = true list[#list + 1] = (b - 1) / 2 end
    end
  end
  table.sort(list)
  return set, list
end

M.size_cache = space.size_expert_cache -- (loip.plan.space)

-- The expert cache of device i of plan p (sizes: loip.plan.sizes), when its part offloads MLP
-- blocks of a mixture of experts; nil otherwise. o: model, session, dir, man, cfg, plan, device,
-- sizes, experts (a loip.policy "experts" name or path, default "lru"), routing (a routing
-- profile's table, for "static"), budget, mode, rate, verify_reads, trace.
function M.for_device(o)
  local sizes, p = o.sizes, o.plan
  if not (sizes and sizes.moe and p) then return nil end
  local set, list = M.offloaded_layers(p, o.device)
  if #list == 0 then return nil end
  local part = plan_mod.device_part(p, o.device, sizes)
  local pol = policy_mod.load("experts", o.experts or "lru")
  if o.routing then M.check_routing(o.routing, o.cfg.n_layers, o.cfg.n_experts, o.routing.path) end
  local conf = pol.configure { slots = part.expert_slots, layers = list, experts = sizes.moe.experts,
    used = sizes.moe.used, routing = o.routing and o.routing.frequencies or nil }
  return M.open { model = o.model, session = o.session, dir = o.dir, man = o.man, cfg = o.cfg, layers = set,
    slots = part.expert_slots, policy = conf.replacement, prefetch = conf.prefetch, pins = conf.pins, budget = o.budget,
    min_accuracy = conf.min_accuracy, probe_every = conf.probe_every,
    mode = o.mode, rate = o.rate, verify_reads = o.verify_reads, trace = o.trace }
end

-- loip.model.store.restage's move_experts for holder (a loip.model.part: its `experts` field is
-- the cache) whose cache options are xo (as M.for_device takes them) and loaded files keep; nil
-- for a dense model.
function M.mover(holder, xo, keep)
  if not (xo and xo.sizes and xo.sizes.moe) then return nil end -- (a dense model's blocks hold all they need)
  return function(p, p2)
    holder.experts = M.move(holder.experts, { model = xo.model, keep = keep, dir = xo.dir, man = xo.man,
      device = xo.device }, p, p2, function() return M.for_device(setmetatable({ plan = p2 }, { __index = xo })) end)
  end
end

-- A live restage from plan p to p2 on device i moved MLP blocks of a mixture of experts between
-- resident and offloaded (loip.model.store.restage's move_experts): their experts move with them.
-- o: model, keep (the loaded files), dir, man, device. Experts coming into memory are read back
-- (charged to "weights") and bound; those leaving are unbound and their memory given back; cache
-- (or, when there is none yet, new_cache()) serves the layers now offloaded. Returns the cache.
function M.move(cache, o, p, p2, new_cache)
  local before, after = M.offloaded_layers(p, o.device), M.offloaded_layers(p2, o.device)
  for l in pairs(before) do -- back in memory: read, then bound
    if not after[l] then
      for _, f in ipairs(store.expert_files(o.man, l)) do
        store.reload(o.keep, o.dir, o.man, f.name)
        store.bind_file(o.model, o.dir, o.man, o.keep, f.name)
      end
    end
  end
  local leaving = {}
  for l in pairs(after) do if not before[l] then leaving[#leaving + 1] = l end end
  if #leaving == 0 then return cache end
  table.sort(leaving)
  for _, l in ipairs(leaving) do -- read through the cache from now on: unbound, their memory back
    for _, f in ipairs(store.expert_files(o.man, l)) do
      for part = 0, K.EXPERT_PARTS - 1 do core.must(exec.model_bind_expert(o.model, l, f.expert, part, nil)) end
      store.evict(o.keep, o.man, f.name)
    end
  end
  cache = cache or new_cache()
  for _, l in ipairs(leaving) do cache:serve(l) end
  return cache
end

-- The report's figures (`--json`'s experts): the cache's counts, and bytes_read_per_token over
-- the `tokens` decoded since `since` (its stats after the prompt's step; nil: over all).
function M.report(stats, tokens, since)
  local r = {}
  for k, v in pairs(stats) do r[k] = v end
  r.bytes_read_per_token = tokens > 0 and (stats.bytes_read - (since and since.bytes_read or 0)) / tokens or 0
  r.hit_rate = stats.routed - stats.bound > 0 and stats.cache_hits / (stats.routed - stats.bound) or nil
  r.prefetch_hit_rate = stats.prefetched > 0 and stats.prefetch_hits / stats.prefetched or nil
  return r
end

function Cache:close()
  if self.session ~= nil then exec.session_set_experts(self.session, nil) self.session = nil end
  if self.handle ~= nil then exec.experts_free(self.handle) self.handle = nil end
  for _, buf in ipairs(self.gating or {}) do memory.buffer_free(buf) end
  self.gating = nil
end

return M
