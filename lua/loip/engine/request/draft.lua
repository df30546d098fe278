-- Speculative decoding's side of the request loop (docs/serving.md, "Speculative decoding"):
-- a draft policy (loip.policy kind "draft", recipes/policies/draft/) proposes tokens for a
-- decoding request; the batcher sends them as rows after the request's last token (flags
-- SAMPLE|DRAFT) and the engine verifies them all in that one step (loip_sampler_verify on the
-- last device: the accepted drafts, then one token of the model's own). This module chooses how
-- many to draft (the policy's `length`, else the rule below), keeps each request's acceptance
-- and the run's figures, and gives the policy its context.
--
-- The draft length, each step and each request, unless fixed (--draft-tokens K): the k in
-- 0..max that maximises the expected tokens per millisecond,
--   E(k) / (step(rows + k) + k * draft_ms),  E(k) = (1 - a^(k+1)) / (1 - a),
-- a the request's measured acceptance (the chance a draft is accepted given the ones before it
-- were; a running average, a prior until measured), step(r) the price of a step of r rows (the
-- cost model's, engine:step_price, scaled to the measured step times; without one the step
-- times measured by row count, interpolated), draft_ms the measured time to propose one draft. With a near 0,
-- E(k) is 1 whatever k is and any extra row costs: drafting turns itself down (k = 0). While a
-- request drafts nothing, every `probe` steps its draft is asked anyway and compared with the
-- tokens that follow, unsent (no step pays for it), so that it turns back up when drafts would
-- be accepted again.
--
-- A tree grown best-first (tree=on, build=best: a policy's propose_scored, the nodes with the
-- draft's cumulative probabilities p) is sized the same way, each step: of the nodes built, the
-- B likeliest (a tree at every B) for the B in 0..built that maximises
--   (1 + E(B)) / (step(rows + B) + build(max(4, 1.5B))),
-- E(B) the tokens the tree is expected to give, the mean over the last steps (M.EXPECT_DECAY) of
-- each step's estimate for its own tree (per depth, the sum of its nodes' chances to be on
-- the target's path: the product along a node's path of its edges' probabilities, each scaled by
-- what was measured of edges that sure: loip.engine.request.tree.expected; the calibration learns
-- from the nodes built but not sent too, whose outcome the step's tokens tell: a small tree learns
-- what the nodes a larger one would add are worth),
-- build(B) the time to build B nodes (a line fitted to the builds measured), step(r) the cost
-- model's price times a line fitted to the measured over the modelled (Draft:tree_price). The next
-- step builds at most max(4, 1.5B) (B = 0: none, for Draft:rest_steps). Where a step's price is
-- flat in its rows (read-bound: every step reads its weights again) B grows to what the draft's
-- probabilities support; where it rises (compute) it shrinks to a few or none.
local core = require "loip.core"
local tree = require "loip.engine.request.tree"

local M = {}

-- A decayed least-squares line (Draft's build times by nodes, its measured over modelled step
-- prices by rows): each point (x, y) joins with weight 1, the earlier ones' weights times decay.
local function line_new() return { w = 0, x = 0, y = 0, xx = 0, xy = 0 } end
local function line_add(f, x, y, decay)
  f.w, f.x, f.y = decay * f.w + 1, decay * f.x + x, decay * f.y + y
  f.xx, f.xy = decay * f.xx + x * x, decay * f.xy + x * y
end
-- Its means of x and y, the variance of x and their covariance (f.w > 0).
local function line_moments(f)
  local mx, my = f.x / f.w, f.y / f.w
  return mx, my, math.max(0, f.xx / f.w - mx * mx), f.xy / f.w - mx * my
end

-- The most tokens drafted in a step when not fixed (a plan sizes the rows it verifies for it).
M.MAX = 8

local Draft = {}
Draft.__index = Draft

-- policy: a loaded "draft" policy (loip.policy.load); target: what the policy may know of the
-- model it drafts for { path (its store or file), context, vocab, max_seqs, tokenizer, who };
-- opts: tokens (a fixed k; nil: chosen), max (the most drafts a step; default 8), probe (steps
-- between unsent probes while k = 0; default 8), prior (the acceptance assumed before any is
-- measured; default 0.5), engine (for its step price and clock).
function M.new(policy, target, opts)
  opts = opts or {}
  local d = setmetatable({ policy = policy, target = target, fixed = opts.tokens, max = opts.tokens or opts.max or M.MAX,
    probe = opts.probe or 8, prior = opts.prior or 0.5, engine = opts.engine, now = (opts.engine and opts.engine.clock) or core.now_ms,
    memo = {}, reqs = {}, cost = {}, ratio = line_new(), expect = {}, draft_ms = nil, calib = { pred = {}, acc = {}, c = {} },
    stats = { drafted = 0, accepted = 0, examined = 0, steps = 0, tokens = 0, probes = 0, largest = 0, last = 0,
      curve = {}, reach = {}, tree_steps = 0, chosen = 0, chosen_sum = 0,
      propose_ms = 0, step_ms = 0 } }, Draft)
  d.ctx = { target = target, memo = d.memo }
  d.ctx.price = function(rows) return d:price(rows) end -- (a step's price for a policy's `length`: lookahead)
  d.ctx.now = d.now -- (the engine's clock, ms)
  d.tree = tree.wanted(policy) -- (tree=on: trees of drafts, loip.engine.request.tree)
  d.best = M.grows(policy) -- (and grown best-first, sized here)
  M.check_tokens(d)
  if policy.module and policy.module.open then policy.module.open(d.ctx, policy.params) end
  return d
end

function Draft:name() return self.policy.name or "draft" end

-- A plan's prior for a best-first tree's rows (loip.cluster.planner's fit_draft_rows): its tokens
-- per step grow by this share of a chain's per doubling of its nodes (stories260K, self:layers=3,
-- greedy: 1.56, 1.84, 1.99, 2.21 tokens per step at 8, 16, 32, 63 nodes, a chain 1.27).
M.TREE_GAIN = 0.1

-- The calibration's prior and memory: the expected hits of a class of edges (tree.class) before
-- any is measured, at the draft's own probability, and the decay of its sums a step (a window of
-- about 100 steps). Measured on stories260K with self:layers=3, fixed trees of 8 nodes (1.74
-- tokens per step): a prior of 1 in a window of 20 steps expected 1.84-1.86, a prior of 0.1 1.76,
-- these 1.82; but a prior of 0.1 in a window of 20 threw a class of rare hits (nodes of a few
-- percent) to 0.15 of its worth after a few steps without one, and a tree whose nodes are all of
-- that kind (the simulator's lookahead, recipes/paper/speculative.lua) to no drafts at all.
M.CALIB_PRIOR = 0.5
M.CALIB_DECAY = 0.99

-- How strongly Draft:tree_price's line keeps the cost model's slope: a variance of the rows
-- measured (rows squared) that the line's own spread must outweigh before its slope is believed.
M.RATIO_PRIOR_ROWS2 = 1

-- The most of a run's time the builds of a request resting at B = 0 may take (Draft:rest_steps;
-- lookahead's full trees while it drafts nothing keep to the same share).
M.PROBE_SHARE = 0.05

-- The nodes a request's first best-first tree builds, before any is sized; after it, M.builds of
-- the size chosen (a tree the cost model takes whole grows by half a step, up to tree.MAX: one
-- first build of 512 nodes would cost a compute-bound step many times its price).
M.FIRST_BUILD = 64

-- The nodes a step builds after a tree of B was chosen: max(4, ceil(BUILD_OVER * B)), room to
-- grow and unsent nodes for the calibration to learn from (tree.outcomes). Measured on the issue 39
-- ring (stories260K, self:layers=3, the mean curve below, five runs each): 2B built 1.33 ms of a
-- 16.8 ms step at B 12 and gave 1.82-1.89 tokens per step, 104-109 tokens/s; 1.5B 1.90-1.95,
-- 110-115. Compute-bound its smaller builds make small trees cheaper: B 3.7-4.1 there against
-- 2.0-2.3 with 2B (docs/serving.md).
M.BUILD_OVER = 1.5
function M.builds(b) return math.max(4, math.ceil(M.BUILD_OVER * b)) end

-- The memory of the expected-tokens curve a tree's size is chosen on (Draft:tree_budget): each
-- step's E(b) joins a mean per b decayed this much a step (about 10 steps). Each step's own curve
-- is a noisy estimate, flat near its best: its argmax, step by step, chose B 9.3 on average where
-- the best fixed tree was 12 (1.78 tokens per step against 1.95, 107 tokens/s against 115: the
-- issue 39 ring); the mean curve's argmax chose 11-14 (1.90-1.95, 110-115). 0.8 and 0.95 measured
-- alike.
M.EXPECT_DECAY = 0.9

-- Whether policy (loaded) grows its trees best-first (tree=on, build=best, a propose_scored).
function M.grows(policy)
  local p, pm = policy.params or {}, policy.module
  return tree.wanted(policy) and (p.build or "best") == "best" and pm ~= nil and pm.propose_scored ~= nil
end

-- A fixed size (--draft-tokens, a request's draft_tokens) of a tree within what a tree holds.
function M.check_tokens(d)
  if d.tree and d.fixed and d.fixed > tree.MAX then
    error(string.format("--draft-tokens (draft_tokens): %d nodes, more than a tree of drafts holds (%d: LOIP_TREE_MAX)", d.fixed, tree.MAX), 0)
  end
end

-- The draft rows a request's step may carry that a plan reserves (logits rows, sampled at once):
-- fixed (--draft-tokens), else a best-first tree's most (tree.MAX), else a chain's (M.MAX).
function M.plan_rows(policy, fixed)
  if fixed then return fixed end
  return M.grows(policy) and tree.MAX or M.MAX
end

-- A request's own drafts (an API request's `draft`, loip.serve.request_draft): policy (loaded),
-- opts.tokens (a fixed k; nil: the server's). A policy of the same module as this one shares its
-- context (a self or model draft's drafter: no second model is loaded); another opens its own
-- (ngram: nothing). The run's figures (stats), the measured step prices and the watchers
-- (on_observe, spans) are this Draft's: the report and /metrics count every request's drafts.
function Draft:variant(policy, opts)
  opts = opts or {}
  local same = policy.module == self.policy.module
  local fixed = opts.tokens or self.fixed
  local d = setmetatable({ policy = policy, target = self.target, fixed = fixed, max = fixed or self.max, probe = self.probe,
    prior = self.prior, engine = self.engine, now = self.now, memo = same and self.memo or {}, reqs = {}, cost = self.cost, ratio = self.ratio,
    stats = self.stats, parent = self, calib = self.calib, expect = self.expect }, Draft)
  d.ctx = same and self.ctx or { target = self.target, memo = d.memo, price = self.ctx.price, now = self.ctx.now }
  d.tree = tree.wanted(policy)
  d.best = M.grows(policy)
  M.check_tokens(d)
  if not same and policy.module and policy.module.open then policy.module.open(d.ctx, policy.params) end
  d.shared = same
  return d
end

-- The sequence of request r so far: its prompt, then its tokens (after a re-plan r.prompt holds
-- both; r.prompt0 is the first prompt).
local function ids_of(r)
  local p = r.prompt0 or r.prompt
  local out = {}
  for i = 1, #p do out[i] = p[i] end
  for _, id in ipairs(r.token_ids) do out[#out + 1] = id end
  return out
end

local function state_of(self, r)
  local s = self.reqs[r]
  if not s then
    s = { memo = {}, a = nil, quiet = 0 }
    self.reqs[r] = s
  end
  return s
end

-- The request as the policy sees it: ids (its sequence so far), n, k (how many are wanted), id
-- (the request's), seq (its slot), memo (its own table, kept until it ends).
local function view(r, s, k)
  local ids = ids_of(r)
  return { ids = ids, n = #ids, k = k, id = r.id, seq = r.seq, memo = s.memo }
end

-- The price of a step of `rows` rows (ms): the cost model's (the engine's step_price) scaled to
-- the step times measured at the nearest row count; without a cost model the measured times
-- (nearest row counts, linear between them, flat beyond); nil when nothing is known.
function Draft:price(rows)
  local e = self.engine
  local model = e and e.step_price and e:step_price(rows)
  if model then
    local near
    for n in pairs(self.cost) do
      if not near or math.abs(n - rows) < math.abs(near - rows) then near = n end
    end
    local at = near and e:step_price(near)
    if at and at > 0 then return self.cost[near] * model / at end
    return model
  end
  local lo, hi
  for n, ms in pairs(self.cost) do
    if n <= rows and (not lo or n > lo) then lo = n end
    if n >= rows and (not hi or n < hi) then hi = n end
  end
  if lo and hi then
    if lo == hi then return self.cost[lo] end
    return self.cost[lo] + (self.cost[hi] - self.cost[lo]) * (rows - lo) / (hi - lo)
  end
  return (lo and self.cost[lo]) or (hi and self.cost[hi])
end

-- How many tokens to draft for r in a step of `rows` rows so far, at most `room`.
function Draft:length(r, rows, room)
  local s = state_of(self, r)
  if room <= 0 then return 0 end
  if self.fixed then return math.min(self.fixed, room) end
  local pm = self.policy.module
  if pm and pm.length then
    local v = view(r, s, room)
    v.rows = rows -- (the step's rows so far, r's last token among them)
    local k = pm.length(v, self.ctx, self.policy.params)
    -- (nil: the policy leaves it to the rule below)
    if k ~= nil then return math.max(0, math.min(math.floor(k), room)) end
  end
  local a = s.a or self.prior
  a = math.min(a, 0.999)
  -- (rows: the step's so far, r's own last token among them)
  local base = self:price(rows)
  if not base then return math.min(self.max, room) end -- (nothing measured yet: try)
  local best, best_rate = 0, 1 / base
  local dm = self.draft_ms or 0
  for k = 1, math.min(self.max, room) do
    local e = (1 - a ^ (k + 1)) / (1 - a)
    local rate = e / ((self:price(rows + k) or base) + k * dm)
    if rate > best_rate * 1.0001 then best, best_rate = k, rate end
  end
  return best
end

-- Drafts for r (a list of ids, at most k; fewer or none when the policy has none).
function Draft:propose(r, k)
  local s = state_of(self, r)
  local t0 = self.now()
  local ids
  if self.tree then ids = tree.propose(self.policy, view(r, s, k), self.ctx, self.target.vocab)
  else ids = self.policy.propose(view(r, s, k), self.ctx) or {} end
  local dt = self.now() - t0
  self.stats.propose_ms = self.stats.propose_ms + dt
  if #ids > k then
    local cut = {}
    for i = 1, k do cut[i] = ids[i] end
    ids = cut
  end
  for i, id in ipairs(ids) do
    if type(id) ~= "number" or id < 0 or id >= self.target.vocab or id ~= math.floor(id) then
      error(string.format("draft policy %s: draft %d is %s, not a token id in [0, %d)", self:name(), i, tostring(id), self.target.vocab), 0)
    end
  end
  local w = self.parent or self
  if w.spans then w:span_draft(r, k, #ids, t0, dt) end
  if #ids > 0 then
    local per = dt / #ids
    self.draft_ms = self.draft_ms and (0.8 * self.draft_ms + 0.2 * per) or per
  end
  return ids
end

-- Before a step: the drafts of r (k chosen, then proposed), or an unsent probe while r drafts
-- nothing. rows: the step's rows so far; room: the most r may add; tree_room (optional): for a
-- best-first tree, { rows (the most rows), depth (the deepest node: the tokens r may still give) }.
function Draft:for_step(r, rows, room, tree_room)
  if self.best then
    -- (tree_room: a tree's rows and depth apart, the batcher's; room bounds both otherwise)
    return self:grow(r, rows, tree_room and tree_room.rows or room, tree_room and tree_room.depth or room)
  end
  local s = state_of(self, r)
  local k = self:length(r, rows, room)
  if k > 0 then
    s.quiet = 0
    return self:propose(r, k)
  end
  s.quiet = s.quiet + 1
  -- (not while one waits for its tokens: the batcher observes a step before it delivers the
  -- step's token, so a probe of `probe` drafts is judged only after the next probe's turn)
  if not self.fixed and room > 0 and s.quiet % self.probe == 0 and not s.probe then
    -- unsent: compared with the tokens r has after the step(s) that follow
    s.probe = { at = #r.token_ids, ids = self:propose(r, math.min(self.max, room, 4)) }
    self.stats.probes = self.stats.probes + 1
  end
  return {}
end

-- Of ranked nodes (in order of p), how many to send in a step of `rows` rows so far (see the top).
-- A tree's step price: the cost model's times the measured over the modelled, that ratio a line
-- in the rows fitted to the steps measured (decayed least squares; its slope drawn toward 0 by
-- M.RATIO_PRIOR_ROWS2 while the rows measured barely vary: the model's own slope until the steps
-- show another). One scale for every row count (the nearest count's alone, Draft:price's, would
-- swing a size chosen over many row counts with each step's noise) hides what the model does
-- not know: a calibration times compute at one row, so where compute binds its price is flat in
-- the rows while a step of 3 rows costs nearly twice one of 1 (stories260K on 3 local devices),
-- and one scale priced the step without drafts above its cost and those with them below.
-- Draft:price without a cost model.
function Draft:tree_price(rows)
  local e = self.engine
  local model = e and e.step_price and e:step_price(rows)
  if not model then return self:price(rows) end
  if self.ratio.w <= 0 then return model end
  local mx, my, vx, cxy = line_moments(self.ratio)
  local slope = cxy / (vx + M.RATIO_PRIOR_ROWS2)
  return model * math.max(0.1 * my, my + slope * (rows - mx))
end

-- How many steps a request whose tree was sized 0 rests before it builds one again: `probe`, or
-- as many as keep that build (its draft forwards: the catch-up and a small tree's rounds) under
-- M.PROBE_SHARE of the steps' time. Where compute binds, a weak draft's build costs more than a
-- step (stories260K, self:layers=3: about 1 ms against 0.5), and a build every 8 steps cost the
-- run a fifth of its time while drafting paid nothing.
function Draft:rest_steps(rows)
  local base = self:tree_price(rows)
  local build = self:build_ms(4)
  if not base or base <= 0 or build <= 0 then return self.probe end
  return math.max(self.probe, math.ceil(build / (M.PROBE_SHARE * base)))
end

-- The time to build a tree of b nodes (ms): a line fitted to the builds measured (decayed least
-- squares: a draft whose forwards re-read its weights costs about the same for 4 nodes as for 60,
-- one that computes costs per node); through 0 while one size was measured; 0 before any.
function Draft:build_ms(b)
  if not self.fit then return 0 end
  local mx, my, vx, cxy = line_moments(self.fit)
  local slope = vx > 1e-6 * math.max(1, mx * mx) and cxy / vx or (mx > 0 and my / mx or 0)
  slope = math.max(0, slope)
  return math.max(0, my - slope * mx) + slope * b
end

local function fit_build(self, n, ms)
  self.fit = self.fit or line_new()
  line_add(self.fit, n, ms, 0.9)
end

function Draft:tree_budget(ranked, rows)
  local base = self:tree_price(rows)
  if not base then return #ranked end -- (nothing measured yet: try)
  local E = tree.expected(ranked, self.calib.c)
  local best, best_rate, price = 0, 1 / base, base
  for b = 1, #ranked do
    -- (chosen on the mean curve of the last steps, this one's joined: M.EXPECT_DECAY)
    local x = self.expect[b] or { w = 0, s = 0 }
    self.expect[b] = x
    x.w, x.s = M.EXPECT_DECAY * x.w + 1, M.EXPECT_DECAY * x.s + E[b]
    -- (a step of more rows costs no less: the fitted line may slope down while few are measured)
    price = math.max(price, self:tree_price(rows + b) or base)
    -- (choosing b, a step builds M.builds(b) nodes: what it costs a step, held there)
    local rate = (1 + x.s / x.w) / (price + self:build_ms(M.builds(b)))
    if rate > best_rate * 1.0001 then best, best_rate = b, rate end
  end
  return best
end

-- A best-first tree for r (tree=on, build=best): built up to what the last steps chose, sized
-- (Draft:tree_budget, or the fixed --draft-tokens), numbered for the step (tree.from_scored); its
-- nodes at most `depth` deep (the tokens r may still give).
function Draft:grow(r, rows, room, depth)
  local s = state_of(self, r)
  local nodes, dt = s.built, s.built_ms -- (built beside other requests' by build_together)
  s.built, s.built_ms = nil, nil
  if (s.rest or 0) > 0 then s.rest = s.rest - 1 return {} end
  local k = math.min(self.fixed or s.build or M.FIRST_BUILD, room, tree.MAX)
  if k <= 0 or depth <= 0 then return {} end
  local t0 = self.now()
  if not nodes then
    local req = view(r, s, k)
    req.depth = depth -- (the deepest node the policy may grow)
    nodes = self.policy.module.propose_scored(req, self.ctx, self.policy.params) or {}
  end
  local who = "draft policy " .. self:name() .. ": propose_scored"
  if #nodes > tree.MAX then error(string.format("%s: %d nodes, more than a tree holds (%d)", who, #nodes, tree.MAX), 0) end
  for i, x in ipairs(nodes) do
    if type(x.id) ~= "number" or x.id < 0 or x.id >= self.target.vocab or x.id ~= math.floor(x.id) then
      error(string.format("%s: node %d is %s, not a token id in [0, %d)", who, i, tostring(x.id), self.target.vocab), 0)
    end
    if type(x.parent) ~= "number" or x.parent < 0 or x.parent >= i or type(x.p) ~= "number" then
      error(string.format("%s: node %d's parent is %s (0: the root, or a node before it), p %s", who, i, tostring(x.parent), tostring(x.p)), 0)
    end
    x.depth = x.parent == 0 and 1 or nodes[x.parent].depth + 1
    if x.depth > depth then error(string.format("%s: node %d at depth %d (at most %d)", who, i, x.depth, depth), 0) end
    x.index = i
  end
  dt = dt or self.now() - t0
  self.stats.propose_ms = self.stats.propose_ms + dt
  if #nodes > 0 then fit_build(self, #nodes, dt) end
  local ranked = tree.ranked(nodes)
  -- (built beside other requests' trees for more room than the step left it: its k likeliest, a tree)
  for i = #ranked, k + 1, -1 do ranked[i] = nil end
  local B = self.fixed and math.min(#ranked, k) or self:tree_budget(ranked, rows)
  s.build = M.builds(B)
  local st = self.stats
  st.chosen, st.chosen_sum, st.chosen_last = st.chosen + 1, st.chosen_sum + B, B -- (0 too: Draft:report's tree_chosen)
  local w = self.parent or self -- (its watchers: on_chosen(r, B) of each choice, serve's /metrics; spans)
  if w.on_chosen then w.on_chosen(r, B) end
  st.built = (st.built or 0) + #nodes
  if B == 0 then s.rest = self:rest_steps(rows) - 1 end
  local t = tree.from_scored(nodes, B)
  local ids = { parents = t.parents }
  for i, id in ipairs(t.ids) do ids[i] = id end
  s.sent = ranked -- (the nodes built, B of them sent: calibrate, after the step)
  if w.spans then w:span_draft(r, k, #ids, t0, dt) end
  return ids
end

-- Before a step's drafts: the best-first trees of several requests built together (the policy's
-- propose_scored_many: a draft forward for them all each round), each kept for its grow. items:
-- { r, room (the most rows r may add, as if it were the step's only one), depth }. Each tree's
-- time is the batch's shared by nodes; a request grow would not build now (resting, no room) is left out.
function Draft:build_together(items)
  local pm = self.policy.module
  if not (self.best and pm.propose_scored_many) then return end
  local reqs, states = {}, {}
  for _, it in ipairs(items) do
    local s = state_of(self, it.r)
    local k = math.min(self.fixed or s.build or tree.MAX, it.room, tree.MAX)
    if (s.rest or 0) == 0 and k > 0 and it.depth > 0 then
      local req = view(it.r, s, k)
      req.depth = it.depth
      reqs[#reqs + 1], states[#reqs + 1] = req, s
    end
  end
  if #reqs < 2 then return end -- (one alone: its grow builds it)
  local t0 = self.now()
  local built = pm.propose_scored_many(reqs, self.ctx, self.policy.params) or {}
  local dt, total = self.now() - t0, 0
  for i = 1, #reqs do total = total + #(built[i] or {}) end
  for i, s in ipairs(states) do
    s.built = built[i] or {}
    s.built_ms = total > 0 and dt * #s.built / total or 0
  end
end

-- Before a step's drafts: the decoding requests' best-first trees built together, a group for each
-- Draft (draft_of(r): the requests that share it), room_of(r): the rows r's drafts may take and its
-- depth, as if r were the step's only request.
function M.trees_together(decoding, draft_of, room_of)
  local groups, order = {}, {}
  for _, r in ipairs(decoding) do
    local d = draft_of(r)
    if d and d.best then
      local rows_room, depth = room_of(r)
      if not groups[d] then groups[d], order[#order + 1] = {}, d end
      table.insert(groups[d], { r = r, room = rows_room, depth = depth }) -- (a tree's rows and depth apart, as for_step's)
    end
  end
  for _, d in ipairs(order) do d:build_together(groups[d]) end
end

-- After a tree step: per class of edges (tree.class: how sure the draft was of a node given its
-- parent), the nodes found on the target's path (tree.outcomes: those sent, and those built but
-- not sent whose outcome the step's tokens tell) of those whose parent was, against the draft's
-- prediction (the sum of their q), decayed (M.CALIB_DECAY), and their ratio (M.CALIB_PRIOR: the
-- draft's own probabilities until measured). ranked: the nodes built; said, accepted: the step's tokens.
local function calibrate(calib, ranked, said, accepted)
  local hit, on = tree.outcomes(ranked, said, accepted)
  local P, H, by = {}, {}, {}
  for i, x in ipairs(ranked) do
    by[x.index] = x
    if hit[i] ~= nil and (x.parent == 0 or on[x.parent]) then
      local q = tree.edge_q(x, by)
      local c = tree.class(q)
      P[c], H[c] = (P[c] or 0) + q, (H[c] or 0) + (hit[i] and 1 or 0)
    end
  end
  for c, pc in pairs(P) do
    calib.pred[c] = M.CALIB_DECAY * (calib.pred[c] or 0) + pc
    calib.acc[c] = M.CALIB_DECAY * (calib.acc[c] or 0) + H[c]
    calib.c[c] = (calib.acc[c] + M.CALIB_PRIOR) / (calib.pred[c] + M.CALIB_PRIOR)
  end
end

local function learn(s, examined, accepted, prior)
  if examined > 0 then
    -- a running average of the per-draft acceptance from the prior, each step's weighted by its
    -- drafts (a first rejected draft does not settle it: one step is little evidence)
    local x = accepted / examined
    local w = examined / (examined + 1)
    s.a = (1 - w) * (s.a or prior) + w * x
  end
end

-- After a step: r drafted k and got `got` tokens from it (the accepted drafts and one more, the
-- tokens `said`, in order: a tree's calibration finds its accepted nodes by them).
function Draft:observe(r, k, got, said)
  local s = state_of(self, r)
  local st = self.stats
  if k > 0 then
    local acc = got - 1
    st.drafted, st.accepted, st.steps, st.tokens = st.drafted + k, st.accepted + acc, st.steps + 1, st.tokens + got
    st.largest, st.last = math.max(st.largest, k), k -- (the tree's nodes, or the chain's length, chosen)
    -- drafts examined: the accepted ones and the first rejected (those after it tell nothing)
    local examined = acc < k and acc + 1 or acc
    st.examined = st.examined + examined -- (per_draft's denominator)
    learn(s, examined, acc, self.prior)
    if s.sent then
      if said then calibrate(self.calib, s.sent, said, acc) end
      -- (the measured curve: tokens per step by tree size, sizes bucketed by powers of two; and
      -- the share of tree steps whose accepted path reached each depth)
      local b = 2 ^ math.floor(math.log(k, 2))
      local c = st.curve[b] or { steps = 0, size = 0, tokens = 0 }
      c.steps, c.size, c.tokens = c.steps + 1, c.size + k, c.tokens + got
      st.curve[b], st.tree_steps = c, st.tree_steps + 1
      for d = 1, acc do st.reach[d] = (st.reach[d] or 0) + 1 end
    end
  end
  s.sent = nil
  local p = s.probe
  if p and #r.token_ids >= p.at + #p.ids then
    local hits = 0
    for i, id in ipairs(p.ids) do
      if r.token_ids[p.at + i] ~= id then break end
      hits = hits + 1
    end
    learn(s, hits < #p.ids and hits + 1 or hits, hits, self.prior)
    s.probe = nil
  end
  -- (watchers: loip.engine.request.draft_trace's spans; on_observe(r, k, accepted), e.g. serve's /metrics)
  local w = self.parent or self -- (a request's own drafts: the server's watchers)
  if w.spans then w:span_verified(r, k, k > 0 and got - 1 or 0) end
  if w.on_observe then w.on_observe(r, k, k > 0 and got - 1 or 0) end
  local pm = self.policy.module
  if pm and pm.on_step then pm.on_step({ request = r.id, drafted = k, accepted = k > 0 and got - 1 or 0, acceptance = s.a }, self.ctx, self.policy.params) end
end

-- A step (any, drafts or not) took ms: the time the draft's share is of.
function Draft:stepped(ms)
  self.stats.step_ms = self.stats.step_ms + ms
end

-- A step of `rows` rows took ms (the measured price of a step of that many rows; and, against
-- the cost model's, a point of Draft:tree_price's line).
function Draft:measured(rows, ms)
  local c = self.cost[rows]
  self.cost[rows] = c and (0.7 * c + 0.3 * ms) or ms
  local e = self.engine
  local model = e and e.step_price and e:step_price(rows)
  if model and model > 0 then line_add(self.ratio, rows, ms / model, 0.95) end
end

-- r ended: its state goes, and the policy's (a model draft frees its slot).
function Draft:finish(r)
  local s = self.reqs[r]
  self.reqs[r] = nil
  local pm = self.policy.module
  if s and pm and pm.finish then pm.finish(view(r, s, 0), self.ctx, self.policy.params) end
  -- a request's own policy of another module: closed with the request (ngram: nothing held)
  if self.parent and not self.shared and not next(self.reqs) and pm and pm.close then pm.close(self.ctx, self.policy.params) end
end

-- The run's figures: { policy, drafted, accepted, steps (steps that verified drafts), tokens
-- (tokens those steps gave), tokens_per_step, acceptance, probes, tree (whether trees are
-- proposed), tree_size (the drafts, a tree's nodes, a verifying step verified on average),
-- tree_size_max and tree_size_last (the largest and the last chosen), propose_ms (time proposing),
-- step_ms (time in steps), draft_share (propose_ms over propose_ms + step_ms); best-first trees:
-- tree_built (nodes built a verifying step), tree_chosen and tree_chosen_last (the mean of the
-- sizes chosen, 0 included, and the last), tree_curve ({ size, tokens_per_step, steps } by size,
-- sizes bucketed by powers of two), per_depth (the share of tree steps whose path reached depth d) }.
function Draft:report()
  local st = self.stats
  local busy = st.propose_ms + st.step_ms
  local curve, depth = nil, nil
  if st.tree_steps > 0 then
    curve, depth = {}, {}
    for _, c in pairs(st.curve) do curve[#curve + 1] = { size = c.size / c.steps, tokens_per_step = c.tokens / c.steps, steps = c.steps } end
    table.sort(curve, function(a, b) return a.size < b.size end)
    for d = 1, #st.reach do depth[d] = st.reach[d] / st.tree_steps end
  end
  return { policy = self:name(), drafted = st.drafted, accepted = st.accepted, steps = st.steps, tokens = st.tokens,
    tokens_per_step = st.steps > 0 and st.tokens / st.steps or 0, acceptance = st.drafted > 0 and st.accepted / st.drafted or 0,
    probes = st.probes, fixed = self.fixed, tree = self.tree,
    tree_size = st.steps > 0 and st.drafted / st.steps or 0, tree_size_max = st.largest, tree_size_last = st.last,
    -- (best-first trees: the mean of the sizes chosen, each choice once, 0 included, which
    -- tree_size leaves out: a request that chose 0 rests, sending nothing; and the last choice)
    tree_chosen = st.chosen > 0 and st.chosen_sum / st.chosen or nil, tree_chosen_last = st.chosen_last,
    tree_curve = curve, per_depth = depth, -- (best-first trees: loip simulate --tree-curve reads tree_curve)
    tree_built = st.steps > 0 and st.built and st.built / st.steps or nil, -- (best-first: the nodes built a step, of which tree_size sent)
    propose_ms = st.propose_ms, step_ms = st.step_ms, draft_share = busy > 0 and st.propose_ms / busy or 0,
    -- the chance a draft is accepted given the ones before it were (the acceptance the length rule and
    -- loip simulate --acceptance assume; `acceptance` is accepted / drafted)
    per_draft = st.examined > 0 and st.accepted / st.examined or nil }
end

-- Whether the policy wants its draft rows' own guesses back (its module's `peek`: the engine
-- returns the argmax of each draft row off the accepted path, LOIP_TOKF_PEEK; lookahead).
function Draft:peeking()
  local pm = self.policy.module
  return pm and pm.peek and pm.observe ~= nil or false
end

-- After a step in which r's drafts ids (a chain, or a tree with .parents) were verified into
-- `tokens` (what r got: the accepted drafts, then the model's next token) and `peeks` (the
-- argmax of each draft row off the accepted path, in row order): the policy's observe(view,
-- ctx, params, { ids, parents (nil for a chain), next, tokens }) with next[j] the model's token after
-- draft j (its own for a node on the path, else its guess; nil where not known). view.ids is r's
-- sequence before the step (its last id the root).
function Draft:peeked(r, ids, tokens, peeks)
  local pm = self.policy.module
  if not (pm and pm.observe) then return end
  local parents, nxt, node, depth, p = ids.parents, {}, 0, 0, 0
  for j = 1, #ids do
    local up = parents and parents[j] or j - 1
    if depth < #tokens - 1 and up == node and ids[j] == tokens[depth + 1] then
      node, depth = j, depth + 1
      nxt[j] = tokens[depth + 1]
    else
      p = p + 1
      nxt[j] = peeks[p]
    end
  end
  pm.observe(view(r, state_of(self, r), 0), self.ctx, self.policy.params,
    { ids = ids, parents = parents, next = nxt, tokens = tokens })
end

-- Close what the policy opened (a draft model).
function Draft:close()
  local pm = self.policy.module
  if pm and pm.close then pm.close(self.ctx, self.policy.params) end
end

return M
