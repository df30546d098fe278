-- A model's part on this device: the model's handle and thread pool, its session (KV cache and
-- activations), its weights and, under a plan (a slice store whose offloaded blocks are read
-- from disk every step), the loader, the runner of the plan's stages and the expert cache, all
-- charged to one budget. loip.model (one device in this process) and loip.cluster.device_server
-- (one device of a cluster) both assemble a device here, change its plan live and free it.
--
--   local p = part.open { cfg = cfg, budget = b, layout = ..., session = ..., weights = ... }
--   p:restage(stage, offloaded)   -- a live plan change between steps
--   p:close()                     -- everything, in one order; again: nothing
local ffi = require "ffi"
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local loader = require "loip.runtime.loader"
local plan = require "loip.plan"
local store = require "loip.model.store"
local experts = require "loip.model.experts"
local kernels = require "loip.model.kernels"

local M = {}

local Part = {}
Part.__index = Part

-- A runner's recorded event kinds, by their C number.
M.event_kinds = { [0] = "load", "compute", "wait", "send", "recv" }

local function fail(where, err) error(where and (where .. ": " .. err) or err, 0) end

-- Assemble a device, in this order: the model's handle, the thread pool, the plan's layout, the
-- session, the weights, and under a plan the loader, the runner and the expert cache. Whatever
-- fails, what was made is freed (its charges given back at once: a shared budget must not wait
-- for the GC) and the error raised. o:
--   cfg          the model's configuration (loip.runtime.exec.model_new's)
--   cfg_where    the name a configuration C refuses is reported with (nil: the error alone)
--   where        the name the other failures are reported with (nil: the error alone)
--   threads      the pool's (0 or nil: every CPU); part.threads is the count
--   budget       a loip.memory budget (nil: none) charged for all of it
--   layout       function(part) -> { plan, index (1-based device), sizes (loip.plan.sizes),
--                memory_opts (loip.plan.memory's), overlap_loads, prefetch (false: a stage's
--                reads start only when it runs) }: a plan's part of a slice store, asked once
--                the pool is made (the sizes count its threads); nil: no plan
--   session      function(part) -> { context, batch, kv_tokens, max_seqs, grows, layers (a
--                uint8_t mask of the layers held; nil: all) }: the session is made at open
--                under a budget or a plan (before the weights, so that a part that does not fit
--                is refused before they load), else at its first use (Part:open_session)
--   weights      function(part) -> w: the weights read and bound into part.handle (under a plan
--                loip.model.store's loaded files: its resident blocks, room kept for the others)
--   free_weights function(w) (default loip.model.store.close)
--   dir, man     the slice store (a plan's stage reads, the expert cache's files)
--   loader, disk_rate, verify_reads, trace, experts, routing   the plan's reads and the expert
--                cache's (loip.model.open's options of those names)
--   kernels      function(part) -> { profile (this device's profile, or nil), policy (a kernels
--                policy, default "loip") }, asked once the layout is known: the kernels' settings
--                the device runs with (loip.model.kernels; part.kernels says what is in force);
--                nil: the default policy without a profile
function M.open(o)
  local self = setmetatable({ o = o, cfg = o.cfg, where = o.where, budget = o.budget, dir = o.dir, man = o.man,
    free_weights = o.free_weights or store.close, tracing = o.trace and true or false }, Part)
  local ok, err = pcall(Part._assemble, self)
  if not ok then
    self:close()
    error(err, 0)
  end
  return self
end

function Part:_assemble()
  local o = self.o
  local m, merr = exec.model_new(self.cfg)
  if not m then fail(o.cfg_where, merr) end
  self.handle = m
  local pool, perr = exec.pool_new(o.threads or 0)
  if not pool then error(perr, 0) end
  self.pool, self.threads = pool, exec.pool_size(pool)
  if o.layout then
    local l = o.layout(self)
    self.plan, self.index, self.sizes, self.memory_opts = l.plan, l.index, l.sizes, l.memory_opts
    self.overlap_loads, self.prefetch = l.overlap_loads or false, l.prefetch ~= false
  end
  self.kernels = kernels.apply(o.kernels and o.kernels(self) or nil)
  if self.budget or self.plan then self:open_session() end
  self.weights = o.weights(self)
  if self.plan then self:_start_runner() end
end

-- The session (KV cache, activations), made once.
function Part:open_session()
  if not self.session then
    local so = self.o.session(self)
    local s, err = exec.session_new_seqs(self.handle, self.pool, so.context, so.batch, so.kv_tokens, so.max_seqs,
      self.budget and self.budget.handle, so.layers, so.grows and core.constants.SESSION_KV_GROWS or 0)
    if not s then fail(self.where, err) end
    self.session = s
    -- (the KV tables alone, before any request: what an online policy counts the groups from)
    self.kv_base = 0
    for _, a in ipairs(self.budget and self.budget:report() or {}) do if a.account == "kv" then self.kv_base = a.bytes end end
  end
  return self.session
end

-- A loader with slots of slot_bytes: the plan's slot count, the part's read settings.
function Part:_new_loader(slot_bytes)
  local o = self.o
  local l, err = loader.new { slots = self.plan.slots or 1, slot_bytes = slot_bytes, overlap_loads = self.overlap_loads,
    mode = o.loader or "auto", rate = o.disk_rate or 0, budget = self.budget }
  if not l then fail(self.where, err) end
  return l
end

-- The loader (when the plan offloads), the runner of the plan's stages and the expert cache (a
-- mixture of experts whose MLP blocks are offloaded).
function Part:_start_runner()
  local o = self.o
  self.descs = store.stage_descs(self.dir, self.man, self.plan, self.index, o.verify_reads)
  local slot = plan.memory(self.plan, self.index, self.sizes, self.memory_opts).slot_bytes
  if slot > 0 then self.loader = self:_new_loader(slot) end
  local s, m, lh = self.session, self.handle, self.loader and self.loader.handle or nil
  -- (the runner's finalizer holds the loader, session and model: should the part be collected
  -- unclosed, none of them goes before the runner)
  local r, err = exec.runner_new(s, m, lh, self.descs.descs, self.descs.n, o.trace and 65536 or 0, { lh, s, m })
  if not r then fail(self.where, err) end
  self.runner = r
  self.experts_opts = { model = m, session = s, dir = self.dir, man = self.man, cfg = self.cfg, plan = self.plan,
    device = self.index, sizes = self.sizes, experts = o.experts, routing = o.routing, budget = self.budget,
    mode = o.loader, rate = o.disk_rate, verify_reads = o.verify_reads, trace = o.trace }
  self.experts = experts.for_device(self.experts_opts)
  if not self.prefetch then exec.runner_set_prefetch(r, false) end
end

-- A live plan change between steps: stage k (1-based) of the plan now reads its first
-- `offloaded` blocks every step (loip.model.store.restage: blocks coming back are read and
-- bound, blocks leaving give their memory back, a larger slot when the stage needs one; an
-- MLP block's experts move with it). Returns the new plan (part.plan).
function Part:restage(k, offloaded)
  local p2, descs = store.restage { verify_reads = self.o.verify_reads, runner = self.runner, model = self.handle,
    keep = self.weights, dir = self.dir, man = self.man, plan = self.plan, device = self.index, stage = k,
    offloaded = offloaded, loader = self.loader,
    new_loader = function(bytes) return self:_new_loader(bytes) end,
    move_experts = experts.mover(self, self.experts_opts, self.weights),
    on_loader = function(l) if self.loader and self.loader ~= l then self.loader:close() end self.loader = l end }
  self.plan, self.descs = p2, descs or self.descs
  return p2
end

-- The events recorded since the last call (the part's trace on; else none): a list of { kind =
-- "load" | "compute" | "wait" | ..., stage (1-based; 0: embedding or head), first_block,
-- last_block, t0_ns, t1_ns, bytes, offloaded, tokens }, then the expert cache's reads.
function Part:events()
  local out = {}
  if not (self.runner and self.tracing) then return out end
  self.event_buf = self.event_buf or ffi.new("loip_runner_event[4096]")
  local buf, kinds = self.event_buf, M.event_kinds
  repeat
    local k = exec.runner_events(self.runner, buf, 4096)
    for i = 0, k - 1 do
      local e = buf[i]
      out[#out + 1] = { kind = kinds[e.kind], stage = e.stage + 1, first_block = e.first_block,
        last_block = e.last_block, t0_ns = tonumber(e.t0_ns), t1_ns = tonumber(e.t1_ns), bytes = tonumber(e.bytes),
        offloaded = e.offloaded ~= 0, tokens = e.n_tokens }
    end
  until k < 4096
  for _, e in ipairs(self.experts and self.experts:events() or {}) do out[#out + 1] = e end
  return out
end

-- The runner's statistics in ms and bytes (nil without a runner).
function Part:runner_stats()
  if not self.runner then return nil end
  local st = exec.runner_stats(self.runner, ffi.new("loip_runner_stats_t"))
  return { stage_runs = tonumber(st.stage_runs), compute_ms = tonumber(st.compute_ns) / 1e6,
    stall_ms = tonumber(st.stall_ns) / 1e6, load_ms = tonumber(st.load_ns) / 1e6,
    bytes_loaded = tonumber(st.bytes_loaded), loads = tonumber(st.loads),
    events_dropped = tonumber(st.events_dropped) }
end

-- Free everything, each before what it uses: the expert cache and the runner (their loads
-- drained) before the loader, the session, the weights they read and the pool and model they
-- run on. Every charge goes back to the budget here, not at the GC. Again: nothing.
function Part:close()
  if self.experts then self.experts:close() self.experts = nil end
  if self.runner then exec.runner_free(self.runner) self.runner = nil end
  if self.loader then self.loader:close() self.loader = nil end
  if self.session then exec.session_free(self.session) self.session = nil end
  if self.weights then self.free_weights(self.weights) self.weights = nil end
  if self.pool then exec.pool_free(self.pool) self.pool = nil end
  if self.handle then exec.model_free(self.handle) self.handle = nil end
end

return M
