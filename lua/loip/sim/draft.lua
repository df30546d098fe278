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
-- draft: its draft.tree_curve, tokens per step by tree size). Returns the points { { B, T } },
-- by B, and the source; or nil, why (naming the flag).
function M.curve(v)
  if v == nil then return nil end
  local pts = {}
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
  end
  if #pts == 0 then return nil, "--tree-curve: no points" end
  table.sort(pts, function(a, b) return a[1] < b[1] end)
  return pts, v
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
-- device number, "head", "auto" or nil: the fastest), seed, max_seqs. Raises naming the flag.
function M.new(problem, opts)
  local inst = policy.load("draft", opts.draft) -- (checks the name and its settings)
  local d = setmetatable({ name = inst.name or tostring(opts.draft), a = opts.acceptance, seed = opts.seed or 1,
    bytes = 0, layers = 0, total_ms = 0, proposals = 0, params = inst.params }, Draft)
  -- a tree grown best-first and sized by the cost model: its tokens per step by its size, from
  -- the curve given, else a chain's at the acceptance assumed, (1 - a^(B+1)) / (1 - a)
  if request_draft.grows({ params = inst.params, module = inst.module }) then
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

-- The draft policy the batcher runs (loip.policy kind "draft") for engine (its clock moves by
-- each proposal's time).
-- A tree's scored nodes for the batcher's sizing (loip.engine.request.draft): a chain of k whose
-- node j has p_j = T(j) - T(j - 1) (the curve's gain, never rising), so that the B likeliest are
-- expected to give T(B) - 1 tokens; node j is the filler (accepted) when u < p_j for one draw u
-- (a path reaches depth j with chance p_j). Its time: the rows the draft has not seen, then a
-- forward per round (the best-first construction's `rounds`: k/rounds nodes and their ancestors each).
function Draft:propose_scored(engine, req)
  local k, m = math.min(req.k, req.depth or req.k), req.memo
  local ms = 0
  if self.shape then
    local rounds = math.min(k, self.params.rounds or 2)
    ms = self:forward_ms(math.max(1, req.n - (m.valid or 0)), req.n) + rounds * self:forward_ms(math.ceil(k / rounds) * 2, req.n + k)
  end
  m.valid = req.n
  local u, nodes, last = self:draw(), {}, 1
  for j = 1, k do
    local p = math.max(0, math.min(last, curve_at(self.curve, j) - curve_at(self.curve, j - 1)))
    last = p
    nodes[j] = { id = u < p and M.FILLER or M.OTHER, parent = j - 1, p = p, depth = j }
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
-- draft's time per verifying step.
function Draft:report(r, fixed)
  r = r or {}
  return { policy = self.name, acceptance = self.a, acceptance_assumed = true, accepted_of_drafted = r.acceptance,
    per_draft_measured = r.per_draft, k = fixed or "chosen",
    drafted = r.drafted or 0, accepted = r.accepted or 0, steps = r.steps or 0, tokens = r.tokens or 0,
    tokens_per_step = r.tokens_per_step or 0, probes = r.probes,
    draft_ms_per_step = (r.steps or 0) > 0 and self.total_ms / r.steps or 0, draft_ms = self.total_ms,
    device = self.device, what = self.what, bytes = self.bytes,
    tree_size = self.curve and r.tree_size or nil, tree_curve_source = self.curve and self.curve_source or nil }
end

-- The report's lines (Draft:report's table r) on out: the assumption said plainly.
function M.describe(r, out)
  local where = r.device == "head" and " in the head's process" or (r.device and (" on device " .. r.device) or "")
  if r.tree_curve_source then
    out:write(string.format("  draft %s (%s)%s: a tree grown best-first, its tokens per step by its size ASSUMED (%s), %s\n",
      r.policy, r.what, where, r.tree_curve_source, r.k == "chosen"
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
