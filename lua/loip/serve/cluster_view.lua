-- What the dashboard shows of a server's engine (docs/dashboard.md): the ring (devices, their
-- stages, the links between them with their measured rates), each device's memory by account
-- against its budget, the last intervals' per-device timeline (compute, load, stall, send: the
-- categories of the Perfetto trace, as differences of the devices' STATS counters), the
-- adaptations, the losses and the requests in flight with their tokens/s. On one device (no
-- cluster) the same shape with one device.
--
--   local view = cluster_view.new(srv)     -- srv: a loip.serve.server
--   local s = view:sample()                -- the devices' counters now (a STATS round on a cluster)
--   view:snapshot()                        -- GET /v1/cluster's table (samples when none is recent)
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local online = require "loip.engine.request.online"

local M = {}

local View = {}
View.__index = View

M.KEEP = 60          -- intervals the timeline keeps
M.FRESH_MS = 250     -- a snapshot samples again when the last sample is older than this

function M.new(srv)
  return setmetatable({ srv = srv, timeline = {}, last = nil, t_start = core.now_ms() }, View)
end

-- The stages of a plan's device i as { stage, blocks = { first, last }, offloaded }.
local function stages_of(p, i)
  local out = {}
  local d = p and p.devices and p.devices[i]
  for s, st in ipairs(d and d.stages or {}) do
    out[s] = { stage = s, blocks = { st.blocks[1], st.blocks[2] }, offloaded = st.offloaded or 0 }
  end
  return out
end

-- accounts: { name = bytes } or a budget's report ({ { account, bytes } }) as { name = bytes }.
local function account_map(a)
  local out = {}
  for k, v in pairs(a or {}) do
    if type(v) == "table" then out[v.account] = v.bytes else out[k] = v end
  end
  return out
end

-- A device's figures from a worker's STATS (or the same fields of one in-process device).
local function figures(st)
  return { compute_ms = st.compute_ms or 0, load_ms = st.load_ms or 0, stall_ms = st.stall_ms or 0,
    send_ms = st.send_ms or 0, recv_wait_ms = st.recv_wait_ms or 0, budget_bytes = st.budget_bytes or 0,
    memory_bytes = st.memory or 0, peak_bytes = st.peak_bytes or 0, accounts = account_map(st.accounts),
    kv_free_tokens = st.kv_free_tokens, links = st.links or {} }
end

-- Per device its raw counters now: { compute_ms, load_ms, stall_ms, send_ms, recv_wait_ms,
-- budget_bytes, memory_bytes, peak_bytes, accounts, kv_free_tokens, links }.
function View:devices_now()
  local srv = self.srv
  local c = srv.opts.cluster
  if c then
    local out = {}
    for i, st in ipairs(c:stats()) do out[i] = figures(st) end
    return out
  end
  local m = srv.opts.model
  -- (a model held whole has no runner: its steps are all compute)
  local st = m:runner_stats() or { compute_ms = srv.batcher.stats.step_ms }
  st.kv_free_tokens = exec.session_kv_free_tokens(m:session())
  if m.budget then
    st.budget_bytes, st.memory, st.peak_bytes, st.accounts = m.budget:limit(), m.budget:used(), m.budget:peak(), m.budget:report()
  end
  return { figures(st) }
end

-- The devices of the ring in order: { device, endpoint, pid, stages }.
function View:ring()
  local srv = self.srv
  local c = srv.opts.cluster
  if c then
    local out = {}
    for i, d in ipairs(c.devices) do
      out[i] = { device = i, endpoint = d.endpoint, pid = d.pid, stages = stages_of(c.plan_table, i) }
    end
    return out
  end
  local m = srv.opts.model
  local st = stages_of(m.plan, 1)
  if #st == 0 then st = { { stage = 1, blocks = { 0, 2 * m.n_layers - 1 }, offloaded = 0 } } end
  return { { device = 1, endpoint = "in-process", stages = st } }
end

-- The link from device i to the next one j in the ring, as j's socket measured what came from
-- i (a worker names the previous device d<i>): the moving averages of bandwidth (0 until large
-- messages were timed) and latency, bytes and messages so far, and bytes_per_s: the bytes of
-- the last interval over its time (prev: the previous sample's links, dt_ms its age).
local function ring_links(devs, ring, prev, dt_ms)
  local out = {}
  local n = #ring
  if n < 2 then return out end
  for i = 1, n do
    local j = i % n + 1
    local got
    for _, l in ipairs(devs[j] and devs[j].links or {}) do
      if l.peer == "d" .. i then got = l end
    end
    local l = { from = i, to = j, bytes = got and got.bytes or 0, messages = got and got.messages or 0,
      bandwidth_Bps = got and got.bandwidth_Bps > 0 and got.bandwidth_Bps or nil, latency_ms = got and got.latency_ms or nil }
    local p = prev and prev[i]
    if p and dt_ms and dt_ms > 0 then l.bytes_per_s = math.max(0, l.bytes - p.bytes) * 1000 / dt_ms end
    out[i] = l
  end
  return out
end

-- Take a sample of the counters: the interval since the previous one joins the timeline.
-- Returns the sample: { t_ms, step, tokens, devices (as devices_now, with the interval's
-- differences in d.interval: { compute_ms, load_ms, stall_ms, send_ms }), links }.
function View:sample()
  local b = self.srv.batcher
  local now = core.now_ms()
  local devs = self:devices_now()
  local s = { t_ms = now, step = b.stats.steps, tokens = b.stats.tokens, step_ms = b.stats.step_ms, devices = devs }
  local prev = self.last
  local row = { step = s.step, ms = prev and now - prev.t_ms or 0, steps = prev and s.step - prev.step or 0,
    tokens = prev and s.tokens - prev.tokens or 0, devices = {} }
  for i, d in ipairs(devs) do
    local p = prev and prev.devices[i]
    local iv = {}
    for _, k in ipairs({ "compute_ms", "load_ms", "stall_ms", "send_ms", "recv_wait_ms" }) do
      iv[k] = math.max(0, d[k] - (p and p[k] or d[k]))
    end
    d.interval = iv
    row.devices[i] = iv
  end
  s.row = row
  s.links = ring_links(devs, self:ring(), prev and prev.links, prev and now - prev.t_ms)
  if prev then
    table.insert(self.timeline, row)
    while #self.timeline > M.KEEP do table.remove(self.timeline, 1) end
  end
  self.last = s
  return s
end

-- The requests in flight: { id (the reply's), choice, state, prompt_tokens, tokens, tokens_per_s }.
function View:requests()
  local out = {}
  local now = core.now_ms()
  for r, c in pairs(self.srv.active) do
    local n = #r.token_ids
    local tps
    if r.t_first and n > 1 then tps = (n - 1) / math.max(1e-3, ((r.t_last or now) - r.t_first) / 1000) end
    out[#out + 1] = { id = c.reply.id, choice = c.index, state = r.state, prompt_tokens = c.reply.n_prompt, tokens = n,
      tokens_per_s = tps }
  end
  table.sort(out, function(a, b) return a.id < b.id or a.id == b.id and a.choice < b.choice end)
  return out
end

-- The adaptations (batcher.adaptations) from index `from` on, each with its words.
function View:adaptations(from)
  local out = {}
  local all = self.srv.batcher.adaptations
  for k = from or 1, #all do
    local a = all[k]
    out[#out + 1] = { step = a.step, device = a.device, stage = a.stage, from = a.from, to = a.to, ms = a.ms,
      text = online.describe(a) }
  end
  return out
end

-- The entries of the cluster's list `name` (none on one device) from index `from` on.
local function cluster_list(self, name, from)
  local c = self.srv.opts.cluster
  local all = c and c[name] or {}
  local out = {}
  for k = from or 1, #all do out[#out + 1] = all[k] end
  return out
end

-- The losses of the cluster (c.losses, as /health reports them) from index `from` on.
function View:losses(from) return cluster_list(self, "losses", from) end

-- The cluster's membership events (joins, leaves and losses: c.membership, as /health reports
-- them) from index `from` on.
function View:membership(from) return cluster_list(self, "membership", from) end

-- The whole picture (GET /v1/cluster).
function View:snapshot()
  local s = self.last
  if not s or core.now_ms() - s.t_ms > M.FRESH_MS then s = self:sample() end
  local srv, b = self.srv, self.srv.batcher
  local h = srv:health()
  local ring = self:ring()
  for i, d in ipairs(ring) do
    local x = s.devices[i] or {}
    d.budget_bytes, d.memory_bytes, d.peak_bytes = x.budget_bytes, x.memory_bytes, x.peak_bytes
    d.accounts, d.kv_free_tokens = x.accounts or {}, x.kv_free_tokens
    d.compute_ms, d.load_ms, d.stall_ms, d.send_ms = x.compute_ms, x.load_ms, x.stall_ms, x.send_ms
  end
  return { object = "cluster", model = srv.name, status = h.status, error = h.error, cluster = srv.opts.cluster ~= nil,
    uptime_s = (core.now_ms() - self.t_start) / 1000, steps = b.stats.steps, tokens = b.stats.tokens, step_ms = b.stats.step_ms,
    running = b:active(), queued = b:queued(), devices = ring, links = s.links, timeline = self.timeline,
    adaptations = self:adaptations(), losses = self:losses(), membership = self:membership(), requests = self:requests() }
end

return M
