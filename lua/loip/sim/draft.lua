-- Speculative decoding on the simulator (docs/planning.md, "Speculative decoding on the
-- simulator"): a draft that proposes no text but takes the time its model would take on a
-- device, and whose drafts are accepted at an assumed rate.
--
-- The simulated target samples one filler id (loip.engine.sim: FILLER) every row; a draft is
-- accepted when it is that id. So the acceptance is decided where the draft is made: each draft
-- is the filler with probability A (the per-draft acceptance: the chance a draft is accepted given
-- the ones before it were), drawn from a seeded generator, else another id. The step verifies as a
-- greedy sampler does (the accepted drafts, then one token of the target's own), and the batcher's
-- unsent probes compare drafts with the tokens that follow exactly as on devices.
--
-- Its time: a draft model (--draft model with a shape) or the target's first L layers and head
-- (--draft self) run on one device of the plan (by default the fastest for the draft, by the
-- profiles), priced by that device's profile: each proposal is one forward of the rows the
-- draft has not seen yet (its prompt the first time, then the last token, and the last accepted
-- draft when every draft was accepted), then k - 1 forwards of one row. The draft runs before the
-- step, serially: the clock moves by its time and the ring waits (the disks go on reading ahead
-- meanwhile). ngram (and a policy file) costs nothing. The draft's weights and KV cache are
-- charged to its device's budget.
local policy = require "loip.policy"
local profile = require "loip.plan.profile"
local json = require "loip.text.json"
local pb = require "loip.plan.problem"
local memory = require "loip.runtime.memory"
local request_draft = require "loip.engine.request.draft"
local tree_mod = require "loip.engine.request.tree"

local M = {}

M.FILLER = require("loip.engine.sim").FILLER -- the id the simulated target samples
M.OTHER = M.FILLER + 1 -- a rejected draft's

local fmt = function(b) return memory.format_bytes(b) end

-- The per-draft acceptance of --acceptance: a number in [0, 1], or a measured run's JSON (loip
-- generate --json with --draft: its draft.acceptance). Returns a, source (nil: the number given),
-- or nil, why (naming the flag).
function M.acceptance(v)
  if v == nil then return nil, "--draft needs --acceptance A: the per-draft acceptance assumed (0..1), or a measured run's JSON" end
  local a = tonumber(v)
  if a then
    if a ~= a or a < 0 or a > 1 then return nil, string.format("--acceptance %s: must be in [0, 1]", v) end
    return a
  end
  local f = io.open(v, "r")
  if not f then return nil, string.format("--acceptance %s: neither a number in [0, 1] nor a readable JSON file", v) end
  local text = f:read("*a")
  f:close()
  local ok, j = pcall(json.decode, text)
  if not ok or type(j) ~= "table" then return nil, string.format("--acceptance %s: not JSON (%s)", v, tostring(j)) end
  -- (per_draft: the conditional acceptance, when the run reports it; else acceptance, accepted /
  -- drafted, which counts the drafts after a rejection as rejected too: it understates A)
  local x = type(j.draft) == "table" and (j.draft.per_draft or j.draft.acceptance)
  if type(x) ~= "number" or x < 0 or x > 1 then
    return nil, string.format("--acceptance %s: no draft.acceptance in [0, 1] (the JSON of loip generate --json --draft ...)", v)
  end
  if (j.draft.drafted or 0) == 0 then return nil, string.format("--acceptance %s: its run drafted nothing (draft.drafted is 0)", v) end
  return x, v
end

-- A tree's tokens per verifying step as a function of its nodes B (tree=on, build=best): --tree-curve
-- "B:T,B:T,..." (a stated curve), or a measured run's JSON (loip generate --json with a tree
-- draft: its draft.tree_curve, tokens per step by tree size, and draft.per_depth, its depth
-- shape: M.depths). Returns the points { { B, T } }, by B, the source and the depth shape (a
-- JSON's, else nil); or nil, why (naming the flag).
function M.curve(v)
  if v == nil then return nil end
  local pts, depths = {}, nil
  if not v:find("%.json$") then
    for item in v:gmatch("[^,]+") do
      local b, t = item:match("^%s*(%d+)%s*:%s*([%d.]+)%s*$")
      b, t = tonumber(b), tonumber(t)
      if not b or not t or b < 1 or t < 1 then
        return nil, string.format("--tree-curve %s: %q is not B:T (nodes >= 1, tokens per step >= 1)", v, item)
      end
      pts[#pts + 1] = { b, t }
    end
  else
    local f = io.open(v, "r")
    if not f then return nil, string.format("--tree-curve %s: not a readable file", v) end
    local ok, j = pcall(json.decode, f:read("*a"))
    f:close()
    local c = ok and type(j) == "table" and type(j.draft) == "table" and j.draft.tree_curve
    if type(c) ~= "table" or #c == 0 then
      return nil, string.format("--tree-curve %s: no draft.tree_curve (the JSON of loip generate --json --draft ...,tree=on)", v)
    end
    for _, x in ipairs(c) do pts[#pts + 1] = { x.size, x.tokens_per_step } end
    local q = j.draft.per_depth
    if type(q) == "table" and #q > 0 then
      local why
      depths, why = M.depths(q, "--tree-curve " .. v .. ": its draft.per_depth")
      if not depths then return nil, why end
    end
  end
  if #pts == 0 then return nil, "--tree-curve: no points" end
  table.sort(pts, function(a, b) return a[1] < b[1] end)
  return pts, v, depths
end

-- A tree's depth shape: q[d], the share of tree steps whose accepted path reached depth d (a
-- measured run's draft.per_depth), from a list or "q1,q2,..." (--tree-depths); what names it in
-- errors. Returns the list, or nil, why.
function M.depths(v, what)
  what = what or ("--tree-depths " .. tostring(v))
  local q = {}
  if type(v) == "string" then
    for item in v:gmatch("[^,]+") do q[#q + 1] = tonumber(item) or item end
  elseif type(v) == "table" then
    for i, x in ipairs(v) do q[i] = x end
  end
  if #q == 0 then return nil, what .. ": no depths (the share of tree steps reaching depth 1, 2, ...)" end
  for d, x in ipairs(q) do
    if type(x) ~= "number" or x < 0 or x > 1 or (d > 1 and x > q[d - 1]) then
      return nil, string.format("%s: depth %d's share %s is not in [0, 1] and at most the depth before's", what, d, tostring(x))
    end
  end
  return q
end

-- T(B) of curve pts: 1 at B = 0, linear in log2(B + 1) between the points, flat past the last.
local function curve_at(pts, b)
  if b <= 0 then return 1 end
  local x = math.log(b + 1)
  local lo = { 0, 1 }
  for _, p in ipairs(pts) do
    if p[1] >= b then
      local x0, x1 = math.log(lo[1] + 1), math.log(p[1] + 1)
      return lo[2] + (p[2] - lo[2]) * (x - x0) / (x1 - x0)
    end
    lo = p
  end
  return lo[2]
end
M.curve_at = curve_at

local Draft = {}
Draft.__index = Draft

-- The draft of opts on problem: opts.draft (a draft policy: ngram, self[:layers=L], model, a
-- file), acceptance (a number in [0, 1]), like (model: the draft's shape), dtype, device (a
-- device number, "head", "auto" or nil: the fastest), seed, max_seqs; a tree's curve, curve_source
-- and depths (M.curve, M.depths). Raises naming the flag.
function M.new(problem, opts)
  local inst = policy.load("draft", opts.draft) -- (checks the name and its settings)
  local d = setmetatable({ name = inst.name or tostring(opts.draft), a = opts.acceptance, seed = opts.seed or 1,
    bytes = 0, layers = 0, total_ms = 0, proposals = 0, params = inst.params }, Draft)
  -- a tree grown best-first and sized by the cost model: its tokens per step by its size, from
  -- the curve given, else a chain's at the acceptance assumed, (1 - a^(B+1)) / (1 - a); another
  -- tree policy (not build=paths: lookahead, ngram's) priced by a curve given as one sized so; its
  -- depth shape (opts.depths: the share of steps whose path reached each depth), else a chain's
  local scored = request_draft.grows({ params = inst.params, module = inst.module })
    or (opts.curve ~= nil and tree_mod.wanted(inst) and (inst.params.build or "best") == "best")
  if opts.depths and not scored then
    error("--tree-depths is a tree's (--draft ...:tree=on, build=best): --draft " .. tostring(opts.draft), 0)
  end
  d.depths, d.depths_source = opts.depths, opts.depths and (opts.depths_source or "stated")
  if scored then
    d.curve, d.curve_source = opts.curve, opts.curve_source
    if not d.curve then
      local a = math.min(opts.acceptance or 0, 0.999)
      d.curve, d.curve_source = {}, "a chain's at acceptance " .. tostring(opts.acceptance)
      for b = 1, 64 do d.curve[b] = { b, (1 - a ^ (b + 1)) / (1 - a) } end
    end
  elseif opts.curve then
    error("--tree-curve is a tree's (--draft ...:tree=on, build=best): --draft " .. tostring(opts.draft), 0)
  end
  local context = problem.context
  if d.name == "model" then
    if not opts.like then error("--draft model: which draft? the simulator prices a shape: give --draft-like NAME (loip synth's shapes)", 0) end
    local ok, sizes, cfg, _, dtype = pcall(pb.model_of_shape, opts.like, nil, { dtype = opts.dtype, context = context,
      batch = math.min(64, context), threads = 1, logits_tokens = 1, max_seqs = opts.max_seqs or 1 })
    if not ok then error("--draft-like " .. tostring(opts.like) .. ": " .. tostring(sizes), 0) end
    if (cfg.vocab_size or 0) ~= (problem.model.vocab or cfg.vocab_size) then
      error(string.format("--draft-like %s: its vocabulary (%d tokens) is not the target's (%d): a draft must share the target's tokenizer",
        opts.like, cfg.vocab_size, problem.model.vocab), 0)
    end
    d.shape, d.layers, d.what = pb.shape_of(cfg, dtype), sizes.n_layers, opts.like
    d.weight_bytes, d.kv_bytes = sizes.weight_bytes, sizes.kv_bytes[sizes.n_layers]
  elseif d.name == "self" then
    local m = problem.model
    local L = inst.params.layers ~= "all" and tonumber(inst.params.layers) or m.n_layers
    if L > m.n_layers then error(string.format("--draft self:layers=%d: the target has %d layers", L, m.n_layers), 0) end
    d.shape, d.layers, d.what = problem.shape, L, string.format("the target's first %d layers and head", L)
    d.weight_bytes = m.global_bytes
    for b = 0, 2 * L - 1 do d.weight_bytes = d.weight_bytes + m.block_bytes[b] end
    d.kv_bytes = m.kv_bytes[L]
  else
    d.what = d.name == "ngram" and "n-grams of the sequence" or "a policy file, priced as free"
  end
  if opts.like and d.name ~= "model" then error("--draft-like is the shape of --draft model (not --draft " .. d.name .. ")", 0) end
  d.bytes = d.shape and (d.weight_bytes + d.kv_bytes) or 0
  -- its device: given, or the one whose profile runs a one-row forward of it fastest
  if d.shape then
    local dev = opts.device
    if dev == nil or dev == "auto" then
      local best
      for i, x in ipairs(problem.devices) do
        local ms = d:forward_ms(1, context, x.profile, x.slowdown)
        if not best or ms < best then best, dev = ms, i end
      end
    elseif dev ~= "head" then
      dev = tonumber(dev)
      if not dev or dev ~= math.floor(dev) or dev < 1 or dev > #problem.devices then
        error(string.format("--draft-device %s: a device number from 1 to %d, auto or head", tostring(opts.device), #problem.devices), 0)
      end
    end
    d.device, d.explicit = dev, opts.device ~= nil
    -- the head process is priced as device 1's machine; its memory is its own (no device's budget)
    local x = problem.devices[dev == "head" and 1 or dev]
    d.profile, d.slowdown = x.profile, x.slowdown or 1
  elseif opts.device ~= nil then
    error("--draft-device places a draft model or self (--draft " .. d.name .. " runs nothing to place)", 0)
  end
  -- (a small seed's first draws are small: the seed is spread, and a few draws dropped)
  d.rng = (d.seed * 48271 + 1013904223) % 2147483646 + 1
  for _ = 1, 8 do d:draw() end
  return d
end

-- ms of one forward of `rows` rows at context ctx of the draft (its layers and its head) on a
-- device of profile pr.
function Draft:forward_ms(rows, ctx, pr, slowdown)
  pr = pr or self.profile
  local ms = self.layers * (profile.block_ms(pr, "mha", rows, ctx, self.shape) + profile.block_ms(pr, "mlp", rows, ctx, self.shape))
  return (ms + profile.block_ms(pr, "head", 1, ctx, self.shape)) * (slowdown or self.slowdown or 1)
end

-- A uniform draw in [0, 1) (Park and Miller's generator: the same draws for the same seed).
function Draft:draw()
  self.rng = (self.rng * 16807) % 2147483647
  return (self.rng - 1) / 2147483646
end

-- The memory the draft takes on device i (0 when it runs elsewhere or holds nothing).
function Draft:bytes_on(i) return self.device == i and self.bytes or 0 end

-- The budget of the draft's device is lowered by what the draft takes while fn() plans (so the
-- plan leaves it room); raises naming the device when the draft alone does not fit.
function Draft:reserve(problem, fn)
  local i = self.device
  local x = type(i) == "number" and problem.devices[i]
  if not x or self.bytes == 0 or (x.budget or 0) == 0 then return fn() end
  if self.bytes >= x.budget then
    error(string.format("--draft %s: the draft (%s: %s of weights, %s of KV cache and activations) does not fit device %d's budget of %s",
      self.name, self.what, fmt(self.weight_bytes), fmt(self.kv_bytes), i, fmt(x.budget)), 0)
  end
  local b = x.budget
  x.budget = b - self.bytes
  local r = { pcall(fn) }
  x.budget = b
  if not r[1] then
    error(string.format("%s (device %d's budget less the draft's %s: --draft %s%s)", tostring(r[2]), i, fmt(self.bytes), self.name,
      self.explicit and "" or "; --draft-device places it elsewhere"), 0)
  end
  return unpack(r, 2)
end

-- The gains of a tree's nodes in the order of their p (the B likeliest are expected to give T(B) -
-- 1 tokens past the step's own): g_j = H(j) - H(j - 1), never rising, H the least concave
-- majorant of T at 0..tree.MAX nodes. (Where T is concave H is T; a measured curve, bucketed by
-- the sizes the run chose, need not be: its steps chose large trees where the draft was sure, and
-- a node's gain cannot exceed the one before it in a tree ranked by p.)
local function gains(curve, k)
  local n = tree_mod.MAX
  local hull = { { 0, curve_at(curve, 0) } }
  for x = 1, n do
    local y = curve_at(curve, x)
    while #hull >= 2 do
      local a, b = hull[#hull - 1], hull[#hull]
      -- (b lies on or under the line from a to (x, y): not a vertex of the majorant)
      if (b[2] - a[2]) * (x - a[1]) <= (y - a[2]) * (b[1] - a[1]) then hull[#hull] = nil else break end
    end
    hull[#hull + 1] = { x, y }
  end
  local g = {}
  for i = 2, #hull do
    local a, b = hull[i - 1], hull[i]
    for j = a[1] + 1, math.min(b[1], k) do g[j] = math.max(0, (b[2] - a[2]) / (b[1] - a[1])) end
  end
  for j = n + 1, k do g[j] = 0 end
  return g
end
M.gains = gains

-- A depth-shaped tree of nodes of gains g (in their order), at most `depth` deep: node j goes to
-- the depth d whose sum of p (the chance the path reaches d), with it, is the least share of
-- q[d] (the measured shape: the share of steps whose path reached d), never more than the sum
-- at d - 1 (a path reaches d through d - 1). Each depth's nodes hold consecutive intervals of
-- [0, 1), the likeliest first, each under the parent at d - 1 whose interval holds its start:
-- one draw u a step, and the node whose interval holds it is the target's token at its depth.
-- So the B likeliest nodes reach depth d with chance their sum of p there, and give T(B) - 1
-- tokens on average, spread over depths as the measured run's were. Returns nodes { p, depth,
-- parent, lo, hi }.
local function shaped(g, q, depth)
  local nodes, mass, at = {}, {}, {}
  for _, p in ipairs(g) do
    local best, bv
    for d = 1, math.min(depth, #q) do
      local room = (d == 1 and 1 or mass[d - 1]) - (mass[d] or 0)
      if q[d] > 0 and p <= room + 1e-12 then
        local v = ((mass[d] or 0) + p) / q[d]
        if not bv or v < bv - 1e-12 then best, bv = d, v end
      end
      if not mass[d] then break end -- (no node at d yet: none deeper has a parent)
    end
    if not best then break end
    local lo, parent = mass[best] or 0, 0
    if best > 1 then
      local up = at[best - 1]
      parent = up[#up].index
      for _, x in ipairs(up) do if lo < x.hi then parent = x.index break end end
    end
    local x = { p = p, depth = best, parent = parent, lo = lo, hi = lo + p, index = #nodes + 1 }
    nodes[#nodes + 1], mass[best] = x, lo + p
    at[best] = at[best] or {}
    table.insert(at[best], x)
  end
  return nodes
end
M.shaped = shaped

-- The draft policy the batcher runs (loip.policy kind "draft") for engine (its clock moves by
-- each proposal's time).
-- A tree's scored nodes for the batcher's sizing (loip.engine.request.draft): with a depth shape
-- (--tree-depths, a measured run's per_depth) the nodes of `shaped`, one draw u a step making
-- the node whose interval holds it the filler at each depth (accepted when its parent is); else
-- a chain of k whose node j has p_j = g_j, the filler when u < p_j (a path reaches depth j with
-- chance p_j: the same mean, spread deeper than a real tree's). Either way the B likeliest are
-- expected to give T(B) - 1 tokens. Its time: the rows the draft has not seen, then a forward per
-- round (the best-first construction's `rounds`: k/rounds nodes and their ancestors each).
function Draft:propose_scored(engine, req)
  local k, m = math.min(req.k, req.depth or req.k), req.memo
  local ms = 0
  if self.shape then
    local rounds = math.min(k, self.params.rounds or 2)
    ms = self:forward_ms(math.max(1, req.n - (m.valid or 0)), req.n) + rounds * self:forward_ms(math.ceil(k / rounds) * 2, req.n + k)
  end
  m.valid = req.n
  local u, nodes = self:draw(), {}
  local g = gains(self.curve, self.depths and req.k or k)
  if self.depths then
    for j, x in ipairs(shaped(g, self.depths, req.depth or req.k)) do
      nodes[j] = { id = (u >= x.lo and u < x.hi) and M.FILLER or M.OTHER, parent = x.parent, p = x.p, depth = x.depth }
    end
  else
    for j = 1, k do nodes[j] = { id = u < g[j] and M.FILLER or M.OTHER, parent = j - 1, p = g[j], depth = j } end
  end
  engine.now_ms = engine.now_ms + ms
  self.total_ms, self.proposals = self.total_ms + ms, self.proposals + 1
  return nodes
end

function Draft:policy(engine)
  local d = self
  local t = { name = d.name, propose = function(req)
    local m = req.memo
    local k = req.k
    local ms = 0
    if d.shape then
      -- the rows it has not seen, then a row for each draft after the first
      ms = d:forward_ms(math.max(1, req.n - (m.valid or 0)), req.n) + (k - 1) * d:forward_ms(1, req.n + k)
    end
    local ids, ok, j = {}, true, 0
    for i = 1, k do
      ok = ok and d:draw() < d.a
      ids[i] = ok and M.FILLER or M.OTHER
      if ok then j = i end
    end
    -- what the draft's KV cache holds that the sequence keeps: the sequence, and the drafts it ran
    -- (all but the last) that are accepted
    m.valid = req.n + math.min(j, k - 1)
    if engine.trace and ms > 0 and type(d.device) == "number" then
      -- (on its device's compute lane: loip trace plot draws it)
      local ev = engine.devices[d.device].events
      ev[#ev + 1] = { kind = "draft", stage = 0, first_block = 0, last_block = 0, t0_ns = math.floor(engine.now_ms * 1e6),
        t1_ns = math.floor((engine.now_ms + ms) * 1e6) }
    end
    engine.now_ms = engine.now_ms + ms
    d.total_ms, d.proposals = d.total_ms + ms, d.proposals + 1
    return ids
  end }
  if d.curve then -- (a tree: the batcher grows and sizes it, loip.engine.request.draft)
    t.params, t.module = d.params, { propose_scored = function(req) return d:propose_scored(engine, req) end }
  end
  return t
end

-- The run's figures beside the batcher's (loip.engine.request.draft's report): the assumption and the
-- draft's time per verifying step; plan_rows, the draft rows the plan reserved a request.
function Draft:report(r, fixed, plan_rows)
  r = r or {}
  return { policy = self.name, acceptance = self.a, acceptance_assumed = true, accepted_of_drafted = r.acceptance,
    per_draft_measured = r.per_draft, k = fixed or "chosen",
    drafted = r.drafted or 0, accepted = r.accepted or 0, steps = r.steps or 0, tokens = r.tokens or 0,
    tokens_per_step = r.tokens_per_step or 0, probes = r.probes,
    draft_ms_per_step = (r.steps or 0) > 0 and self.total_ms / r.steps or 0, draft_ms = self.total_ms,
    device = self.device, what = self.what, bytes = self.bytes,
    tree_size = self.curve and r.tree_size or nil, tree_size_max = self.curve and r.tree_size_max or nil,
    tree_curve_source = self.curve and self.curve_source or nil,
    tree_depths = self.curve and self.depths or nil, tree_depths_source = self.curve and self.depths_source or nil,
    per_depth = self.curve and r.per_depth or nil, plan_rows = plan_rows }
end

-- The report's lines (Draft:report's table r) on out: the assumption said plainly.
function M.describe(r, out)
  local where = r.device == "head" and " in the head's process" or (r.device and (" on device " .. r.device) or "")
  if r.tree_curve_source then
    out:write(string.format("  draft %s (%s)%s: a tree grown best-first, its tokens per step by its size ASSUMED (%s%s), %s\n",
      r.policy, r.what, where, r.tree_curve_source,
      r.tree_depths_source and (", its depths shaped as " .. r.tree_depths_source .. "'s") or ", a chain's depths", r.k == "chosen"
        and string.format("its size chosen each step from it and the cost model's step price (%.1f nodes a step)", r.tree_size or 0)
        or ("its size " .. r.k)))
  else
    out:write(string.format("  draft %s (%s)%s: acceptance %.2f ASSUMED (the chance a draft is accepted given the ones before it "
      .. "were; --acceptance), %s\n", r.policy, r.what, where, r.acceptance,
      r.k == "chosen" and "draft length chosen each step from it and the cost model's step price" or ("draft length " .. r.k)))
  end
  out:write(string.format("  %d of %d drafts accepted, %.2f tokens per verifying step (%d steps), draft %.2f ms per step "
    .. "(before the step, the ring waiting)%s\n", r.accepted, r.drafted, r.tokens_per_step, r.steps, r.draft_ms_per_step,
    r.bytes > 0 and r.device ~= "head" and string.format(", %s on its device", memory.format_bytes(r.bytes)) or ""))
end

return M
