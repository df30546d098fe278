-- Models: open a Hugging Face directory, a GGUF file, a llama2.c checkpoint or a slice store (`loip slice`),
-- run it on one device.
--
--   local m = loip.model.open("models/stories260K")
--   for id, text in m:generate("Once upon a time", { max_tokens = 50 }) do io.write(text) end
--   local logits = m:logits({ 1, 403, 407 })   -- logits[pos][id], 1-based pos, 0-based id
local core = require "loip.core"
local hf = require "loip.model.hf"
local llama2c = require "loip.model.llama2c"
local store = require "loip.model.store"
local tokenizer = require "loip.text.tokenizer"
local memory = require "loip.runtime.memory"
local exec = require "loip.runtime.exec"
local files = require "loip.runtime.files"
local planner = require "loip.plan"
local engine = require "loip.engine"
local where = require "loip.model.locate"
local gguf_model = require "loip.model.gguf_model"
local flags = require "loip.ui.flags"
local policy = require "loip.policy"
local profile = require "loip.plan.profile"
local problem = require "loip.plan.problem"
local trace = require "loip.engine.trace"
local safetensors = require "loip.model.safetensors"
local experts_mod = require "loip.model.experts"
local local_mod = require "loip.engine.local"
local part = require "loip.model.part"

local M = {}

-- One set of defaults for one device, a cluster, `loip plan` and `loip simulate`: the KV
-- positions (at most the model's maximum) and the tokens a forward step carries.
M.DEFAULT_CONTEXT, M.DEFAULT_BATCH = 4096, 64
function M.default_context(max_seq) return math.min(max_seq, M.DEFAULT_CONTEXT) end

local Model = {}
-- What the device holds, read through the model (m.runner, m.loader, m.experts, m.weights, ...)
-- and written there: its part (loip.model.part) owns them.
local of_part = { handle = true, pool = true, weights = true, loader = true, runner = true, experts = true, kv_base = true }
function Model.__index(m, k)
  local v = Model[k]
  if v == nil and of_part[k] then
    local p = rawget(m, "part")
    v = p and p[k]
  end
  return v
end
function Model.__newindex(m, k, v)
  if of_part[k] then
    local p = rawget(m, "part")
    if p then p[k] = v end
    return
  end
  rawset(m, k, v)
end

M.locate, M.gguf_files = where.locate, where.gguf_files -- (loip.model.locate)
local locate = M.locate

-- The model's format read (M.locate's kind of file): cfg, facts, and, as the format gives them,
-- the mapped weights (keep) and the function that binds them (bind).
local function read_format(self, kind, file, opts, bh)
  if kind == "hf" then
    return hf.read_config(file)
  elseif kind == "store" then
    -- (a mixture of experts: the experts of an offloaded MLP block stay on disk: the expert cache reads them)
    local cfg, facts, bind = store.open(file, { verify = opts.verify, load = opts.load, budget = bh, layers = opts.layers,
      experts = function(l) return not (self.plan and experts_mod.offloaded_layers(self.plan, 1)[l]) end })
    return cfg, facts, nil, bind
  elseif kind == "gguf" then
    return gguf_model.open(file)
  end
  return llama2c.open(file)
end

-- The context, batch, requests and KV positions of model self from opts, checked (errors at
-- level 3: M.open's caller).
local function size_requests(self, cfg, facts, opts, path)
  local ctx = opts.context or M.default_context(cfg.max_seq)
  self.context = ctx
  self.batch = math.min(opts.batch or M.DEFAULT_BATCH, ctx)
  self.max_seqs = opts.max_batch or 1
  if type(self.max_seqs) ~= "number" or self.max_seqs < 1 or self.max_seqs ~= math.floor(self.max_seqs) then
    error("loip.model.open: max_batch must be a whole number >= 1", 3)
  end
  self.kv_tokens = opts.kv_tokens or ctx * self.max_seqs
  if type(self.kv_tokens) ~= "number" or self.kv_tokens < 1 then error("loip.model.open: kv_tokens must be a number >= 1", 3) end
end

-- The model's tokenizer (from dir, or opts.tokenizer; a GGUF holds its own), checked against
-- the vocabulary.
local function open_tokenizer(kind, dir, file, cfg, opts)
  local tok = tokenizer.open(dir, { path = opts.tokenizer or (kind == "gguf" and file or nil), vocab_size = cfg.vocab_size })
  -- Embedding tables are often padded past the tokenizer (Qwen2: 151646 tokens, 151936
  -- rows); a tokenizer with more ids than the model has rows cannot work.
  if tok.vocab_size > cfg.vocab_size then
    error(string.format("%s: tokenizer has %d tokens but the model's vocabulary is only %d", tok.path, tok.vocab_size, cfg.vocab_size), 0)
  end
  return tok
end

-- opts: threads (default all CPUs), context (KV positions, default min(max_seq, 4096)),
-- batch (tokens per forward step: prompt chunks and the decoding requests together, default 64),
-- max_batch (requests served at once, each with its own KV cache; default 1), kv_tokens (the KV
-- pool the requests share, in positions; default context x max_batch), kv_grows (true: the
-- pool is charged to the budget's "kv" account as requests' contexts take it, not all at
-- once: see loip_session_set_kv_growth), prefix_cache (true: requests reuse the KV of prefixes
-- held from earlier ones, loip.engine.request.prefix_cache; prompt_cache_dir and prompt_cache_disk: its
-- disk tier and bound), tokenizer (path to a tokenizer file),
-- load ("memory", the default: weights copied into huge-page memory; "mmap": used in place
-- from the file mapping, which starts faster and shares the page cache; for a slice store,
-- "memory" reads the block files with O_DIRECT), verify (slice store: check every file's
-- sha256 against the manifest before loading; by default only their sizes are checked),
-- mem (bytes, or a size such as "1.5G": a budget of its own, see loip.memory) or budget (one
-- from loip.memory.budget, shared): the weights, KV cache and activations are charged to its
-- "weights", "kv" and "activations" accounts, and a model that does not fit is refused, naming
-- the account and the shortfall, before anything is loaded. The budget is m.budget.
-- A slice store runs through a plan (loip.plan): plan (a table, or the path of a Lua file
-- returning one; default: everything resident when the budget holds it, else the scheduler's
-- best: scheduler and cost (loip.policy names or paths, default "loip"), stages (a fixed stage
-- count), profile (a profile file or table; default: a calibration of this machine, kept in the
-- cache)), slots (loader slots, default 1), loader ("auto", "uring", "buffered": the
-- conventional path), disk_rate (bytes/s: emulate a slower disk), trace (record
-- load/compute/wait events into m.trace, a loip.trace: m.trace:write(path) saves them). m.plan
-- is the plan used, m.estimate the cost model's estimate of it (when a scheduler chose it).
-- Online adaptation (a slice store): plan_positions (KV positions the plan's memory holds,
-- default kv_tokens; fewer: the KV cache grows inside the budget) and online (a loip.policy
-- "online" name, path or table: before every step it may restage the plan live, as on a
-- cluster: loip.engine.request.online); m:batcher().adaptations lists its changes.
function M.open(path, opts)
  opts = opts or {}
  if type(path) ~= "string" then error("loip.model.open: path must be a string", 2) end
  local budget = opts.budget
  if budget ~= nil and not memory.is_budget(budget) then
    error("loip.model.open: budget must come from loip.memory.budget", 2)
  end
  if budget == nil and opts.mem ~= nil then
    if type(opts.mem) ~= "number" and type(opts.mem) ~= "string" then
      error("loip.model.open: mem must be a number of bytes or a size such as \"1.5G\"", 2)
    end
    budget = memory.budget(opts.mem)
  end
  local bh = budget and budget.handle
  local kind, file, tokdir = locate(path)
  if opts.layers and kind ~= "store" then
    error(string.format("%s: layers = %s (the first layers alone) needs a slice store (loip slice)", path, tostring(opts.layers)), 0)
  end
  local self = setmetatable({ path = path, opts = opts, dir = tokdir or file, budget = budget }, Model)
  local cfg, facts, keep, bind = read_format(self, kind, file, opts, bh)
  self.cfg, self.facts = cfg, facts
  size_requests(self, cfg, facts, opts, path)
  -- The device (loip.model.part): under a budget the session (KV cache, activations) is charged
  -- first, then the weights before they are read: a model that does not fit is refused before
  -- anything loads, and what it had charged is given back at once (a shared budget must not wait
  -- for the GC).
  local mapped = kind == "llama2c" or kind == "gguf" or opts.load == "mmap"
  -- weights(part) reads and binds them into the part's model, which frees them from then on (a
  -- mapped file, opened above, is the model's to free until it is bound)
  local weights, free_weights
  if kind == "hf" then
    weights = function(p)
      return hf.bind_weights(file, cfg, p.handle, { load = opts.load or "memory", budget = bh, architecture = facts.architecture })
    end
    free_weights = safetensors.close
  elseif kind == "store" then
    self.bind_store = bind -- (a plan made again binds its resident blocks: Model:replan_kv)
    weights = function(p) return bind(p.handle, p.plan) end
  else
    weights = function(p) bind(p.handle) local w = keep keep = nil return w end
    free_weights = kind == "gguf" and function(w) w:close() end or files.map_free
  end
  local ok, e = pcall(function()
    local planned = kind == "store" and (opts.load or "memory") == "memory" and not opts.layers
    if kind == "store" and not planned and opts.plan ~= nil then
      if opts.layers then error("loip.model.open: layers (a model's first layers alone) runs without a plan", 0) end
      error("loip.model.open: a plan needs load = \"memory\" (offloaded blocks are read into slots, not mapped)", 0)
    end
    if planned then self.facts_manifest = facts.manifest end
    self:_open_part(file, weights, free_weights, planned, kind == "hf" and file .. "/config.json" or file)
    core.must(exec.model_check(self.handle, 0, cfg.n_layers, path))
    self.weight_bytes = exec.model_weight_bytes(self.handle)
    -- Weights used in place from a file mapping become resident as they are read: charged too.
    if budget and mapped then
      local ch, cerr = memory.charge_new(bh, "weights", self.weight_bytes)
      if not ch then error(path .. ": " .. cerr, 0) end
      self.weight_charge = ch
    end
  end)
  if not ok then
    if keep then free_weights(keep) end -- (a mapped file never bound)
    self:close()
    error(e, 0)
  end
  self.architecture = facts.architecture
  self.vocab_size, self.n_layers, self.dim = cfg.vocab_size, cfg.n_layers, cfg.dim
  if opts.tokenizer ~= false then self.tokenizer = open_tokenizer(kind, tokdir or file, file, cfg, opts) end
  self.stop_ids = M.stop_ids(facts, self.tokenizer)
  return self
end

-- The ids that end a generation (loip.engine.stop_ids).
M.stop_ids = engine.stop_ids

-- The plan for a slice store: the one given (table or file), else everything resident when the
-- budget holds it (and the plan is for all of the KV pool), else the scheduler's
-- (opts.scheduler, opts.cost: loip.policy names or paths; figures from opts.profile or a
-- calibration of this machine). Refused before anything is allocated when it cannot fit.
function Model:_choose_plan(cfg, facts, budget)
  local opts = self.opts
  local sizes = self:_sizes(cfg, facts, flags.renamed(opts, "kv_plan_tokens", "plan_positions", "loip.model.open"))
  local p, where = opts.plan, "plan"
  if type(p) == "string" then p, where = planner.load(p), p end
  local mopts = { loader = opts.loader }
  local limit = budget and budget:limit() or 0
  local avail = limit > 0 and limit - budget:used() or 0
  if limit > 0 and avail <= 0 then
    error(string.format("memory budget: nothing left of %s for %s", memory.format_bytes(limit), self.path), 0)
  end
  self.plan_avail = avail -- (what a plan made again may take: Model:replan_kv)
  if p == nil and opts.plan_chosen then
    local c = opts.plan_chosen -- (chosen already, for this budget: Model:replan_kv)
    p, self.estimate, self.problem_table = c.plan, c.estimate, c.problem
  elseif p == nil then
    p = { slots = 1, devices = { { stages = { { blocks = { 0, sizes.n_blocks - 1 }, offloaded = 0 } } } } }
    -- (a plan for fewer KV positions than the pool adapts online as it grows: the scheduler's
    -- stages, as a cluster's, whether or not everything would fit now)
    local adapts = sizes.plan_positions < sizes.kv_tokens
    if avail > 0 and (adapts or planner.memory(p, 1, sizes, mopts).total > avail) then
      local prob = self:problem(sizes, avail)
      local est
      p, est = policy.plan(prob, { scheduler = opts.scheduler, cost = opts.cost })
      self.estimate, self.problem_table = est, prob
    end
  else
    if opts.slots and type(p) == "table" then p.slots = opts.slots end
    if type(p) == "table" and type(p.devices) == "table" and #p.devices > 1 then
      error(string.format("%s: %d devices: this runs on one device (several devices: loip generate --devices)", where, #p.devices), 0)
    end
    -- (its memory is checked below, against what is left of the budget)
    engine.check_plan(p, { model = sizes, devices = { {} }, loader = opts.loader }, where)
  end
  experts_mod.size_cache(p, 1, sizes, avail, mopts)
  local need = planner.memory(p, 1, sizes, mopts)
  if limit > 0 and need.total > avail then
    error(string.format("%s: the plan needs %s (weights %s, slots %s, kv %s, activations %s%s) but the memory budget has %s: short by %s; "
      .. "pass a larger --mem, or a plan that offloads more (or none, and let loip pick one)", where,
      memory.format_bytes(need.total, avail), memory.format_bytes(need.weights), memory.format_bytes(need.slots),
      memory.format_bytes(need.kv), memory.format_bytes(need.activations),
      need.scratch > 0 and (", scratch " .. memory.format_bytes(need.scratch)) or "",
      memory.format_bytes(avail, need.total), memory.format_bytes(need.total - avail)), 0)
  end
  self.plan, self.plan_sizes, self.plan_opts = p, sizes, mopts
end

-- The sizes of the plan's parts (loip.plan.sizes) for this model, with plan_positions KV
-- positions in the plan's memory (nil: all of the pool).
function Model:_sizes(cfg, facts, plan_positions)
  return planner.sizes(facts.manifest, cfg, { context = self.context, batch = self.batch, threads = self.threads,
    max_seqs = self.max_seqs, kv_tokens = self.kv_tokens, plan_positions = plan_positions })
end

-- The planning problem of this model on this machine alone (loip.plan.problem), for a budget of
-- avail bytes: figures from opts.profile (a file or table) or a calibration.
function Model:problem(sizes, avail)
  local opts = self.opts
  local pr = opts.profile
  if type(pr) == "string" then pr = profile.load(pr) end
  if type(pr) == "table" and pr.devices then pr = pr.devices[1] end
  local man = self.facts_manifest
  if not pr then pr = profile.calibrate { store = self.path, threads = self.threads, context = self.context } end
  return problem.new { model = sizes, shape = problem.shape_of(man.config, store.layer_dtype(man)), n = 1,
    routing = opts.routing and opts.routing.frequencies,
    budgets = { avail }, profiles = { pr }, disk_rate = opts.disk_rate and opts.disk_rate > 0 and opts.disk_rate or nil,
    in_process = true, stages = opts.stages, context = self.context, batch = self.batch, loader = opts.loader, ends = opts.ends,
    micro_batch = self.max_seqs }
end

-- The device (loip.model.part) for this model's weights (weights(part) reads and binds them,
-- free_weights(w) frees them; dir: the slice store) and, when planned, a slice store's plan,
-- chosen once the pool's threads are known (Model:_choose_plan). cfg_where names the file a
-- configuration C refuses came from.
function Model:_open_part(dir, weights, free_weights, planned, cfg_where)
  local opts = self.opts
  local layout = planned and function(p)
    self.threads = p.threads
    self:_choose_plan(self.cfg, self.facts, self.budget)
    return { plan = self.plan, index = 1, sizes = self.plan_sizes, memory_opts = self.plan_opts,
      overlap_loads = self.problem_table and self.problem_table.devices[1].overlap_loads or false }
  end or nil
  self.part = part.open { cfg = self.cfg, cfg_where = cfg_where, where = self.path, threads = opts.threads, budget = self.budget,
    dir = dir, man = self.facts.manifest, loader = opts.loader, disk_rate = opts.disk_rate, verify_reads = opts.verify_reads,
    trace = opts.trace, experts = opts.experts, routing = opts.routing, layout = layout,
    session = function() return { context = self.context, batch = self.batch, kv_tokens = self.kv_tokens,
      max_seqs = self.max_seqs, grows = self:kv_grows() } end,
    weights = weights, free_weights = free_weights,
    -- (the kernels' settings from this device's profile: the plan's, else --profile's)
    kernels = function()
      local pr = self.problem_table and self.problem_table.devices[1].profile or opts.profile
      if type(pr) == "string" then pr = profile.load(pr) end
      return { profile = pr, policy = opts.kernels_policy }
    end }
  self.threads = self.part.threads
  -- every forward's events, for m.trace:write(path) (a plan made again adds to the same)
  if opts.trace and self.part.runner then self.trace = self.trace or trace.new() end
end

-- A live plan change between steps: stage k (1-based) of the plan now reads its first
-- `offloaded` blocks every step. Blocks that become resident are read back into memory (charged
-- to "weights" first) and bound; blocks that become offloaded give their memory back and are
-- read into the slot from the next step. No KV is touched and no token changes. The slot must
-- hold the new stage. Returns the new plan (m.plan).
function Model:restage(k, offloaded)
  if self.broken then error(self.path .. ": " .. self.broken, 0) end
  if not self.runner then error("restage: this model runs no plan (open a slice store)", 2) end
  self.plan = self.part:restage(k, offloaded)
  return self.plan
end

-- Plan again for `positions` KV positions (an online policy's last resort, as a cluster's:
-- loip.engine.request.online's control.replan), between steps: the scheduler chooses a plan for the
-- budget the model had at open; then every request's KV goes (the batcher prefills them again
-- on the new plan, so no token changes), and the device (loip.model.part: runner, loader,
-- session, resident blocks) is closed and opened again for the new plan. A plan that was given is not replaced.
-- When no plan holds that many positions this raises, naming the shortfall, and the model
-- goes on with its plan and its KV. When the new plan cannot be made once the old one is let go
-- (a budget shared with something that charged it since the model opened) the model is broken:
-- this raises, and every later use of it raises naming why.
function Model:replan_kv(positions)
  if not self.bind_store or not self.plan_avail or self.plan_avail <= 0 then
    error("replan: this model runs no plan under a budget (open a slice store with mem)", 2)
  end
  if self.opts.plan ~= nil then
    error(string.format("the plan given cannot hold %d KV positions, and a given plan is not replaced (leave out --plan, "
      .. "or give one for a longer --plan-positions)", positions), 0)
  end
  -- the scheduler decides first: a failure there leaves the model on its plan
  local opts = setmetatable({ plan_positions = positions }, { __index = self.opts })
  local chosen = {}
  local ok, err = pcall(function()
    chosen.problem = self:problem(self:_sizes(self.cfg, self.facts, positions), self.plan_avail)
    chosen.plan, chosen.estimate = policy.plan(chosen.problem, { scheduler = opts.scheduler, cost = opts.cost })
  end)
  if not ok then error(string.format("no plan holds %d KV positions: %s", positions, tostring(err)), 0) end
  opts.plan_chosen = chosen
  local dir = self.part.dir
  self.part:close()
  self.part = nil
  self.opts = opts
  local made, why = pcall(self._open_part, self, dir, function(p) return self.bind_store(p.handle, p.plan) end, nil, true,
    self.path)
  opts.plan_chosen = nil
  if not made then
    self.broken = string.format("the plan for %d KV positions could not be made after the old one was let go: %s; "
      .. "open the model again", positions, tostring(why))
    error(self.broken, 0)
  end
  return self.plan
end

-- Recorded events since the last call (m.opts.trace): a list of { kind = "load" | "compute" |
-- "wait", stage (1-based; 0: embedding or head), first_block, last_block, t0_ns, t1_ns,
-- bytes, offloaded, tokens } (loip.model.part's Part:events).
M.event_kinds = part.event_kinds
function Model:events() return self.part and self.part:events() or {} end

-- Runner statistics in ms and bytes (nil without a runner).
function Model:runner_stats() return self.part and self.part:runner_stats() end

function Model:__tostring()
  local c = self.cfg
  local ffn = c.n_experts > 0 and string.format("%d experts of %d (top %d%s)", c.n_experts, c.expert_dim, c.n_experts_used,
    c.shared_expert ~= 0 and string.format(", a shared one of %d", c.hidden_dim) or "") or string.format("ffn %d", c.hidden_dim)
  return string.format("loip model %s (%s): %d layers, dim %d, %d heads (%d kv, head_dim %d), %s, vocab %d, %.1f MB of weights, %d threads, kernels %s",
    self.path, self.architecture, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim,
    ffn, c.vocab_size, self.weight_bytes / 1e6, self.threads, exec.kernels_name())
end

-- Whether the KV pool is charged as requests' contexts take it: asked (opts.kv_grows), or the
-- plan holds fewer positions than the pool (opts.plan_positions).
function Model:kv_grows()
  return self.opts.kv_grows or (self.plan_sizes ~= nil and self.plan_sizes.plan_positions < self.plan_sizes.kv_tokens)
end

-- The session (KV cache), made once and reused.
function Model:session()
  if self.broken then error(self.path .. ": " .. self.broken, 0) end
  return self.part:open_session()
end

-- The request loop every generation and logits call goes through (loip.engine.request.batcher over
-- loip.engine.local), made once, with opts.online (the online policy); opts (first call only):
-- max_queue, prefill_chunk, prefill, prefix_cache (default the model's opts.prefix_cache).
function Model:batcher(opts)
  if not self._batcher then
    local so = self.opts
    local o = setmetatable({ online = so.online, draft = so.draft, draft_tokens = so.draft_tokens, prefix_cache = so.prompt_cache_dir and { dir = so.prompt_cache_dir, bytes = so.prompt_cache_disk } or so.prefix_cache,
      draft_target = { path = self.path, tokenizer = self.tokenizer, context = self.context, vocab = self.vocab_size,
        max_seqs = self.max_seqs } }, { __index = opts or {} })
    self._batcher = engine.batcher(local_mod.new(self), o)
  end
  return self._batcher
end

-- What loip.engine's generate and logits need of this model.
function Model:front()
  return { batcher = function() return self:batcher() end, tokenizer = self.tokenizer,
    tokenizer_error = not self.tokenizer and "this model was opened without one" or nil, context = self.context,
    vocab = self.vocab_size, stop_ids = self.stop_ids }
end

-- Forward ids at positions 0.. and return the logits of every position as a float array
-- [#ids * vocab] (cdata) plus an accessor: row(pos) -> float* of position pos (1-based).
function Model:logits(ids) return engine.logits(self:front(), ids) end

-- Generate from a prompt (text, or an array of token ids): loip.engine.generate (its options,
-- its iterator of (id, text) and its state with .stats).
function Model:generate(prompt, opts) return engine.generate(self:front(), prompt, opts) end

function Model:close()
  if self._batcher and self._batcher.draft then self._batcher.draft:close() end
  if self._batcher then
    for _, r in ipairs(self._batcher.running) do r.state, r.finish_reason, r.error = "done", "error", "the model was closed" end
    self._batcher = nil
  end
  if self.part then self.part:close() self.part = nil end
  if self.weight_charge then memory.charge_free(self.weight_charge) self.weight_charge = nil end
  if self.tokenizer then self.tokenizer:close() self.tokenizer = nil end
end

return M
