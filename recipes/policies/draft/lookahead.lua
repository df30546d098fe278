-- Lookahead decoding (Fu et al., "Break the Sequential Dependency of LLM Inference Using
-- Lookahead Decoding", 2024), written from the paper's description for loip's tree steps: no
-- second model. Each verifying step carries, beside the request's last token,
--   - the verification branch: up to `candidates` n-grams from the request's pool whose first
--     tokens match the end of its sequence (their last n - 1 tokens proposed), and
--   - the lookahead branch: a chain of `window` guesses (Jacobi iteration: each step's guess at
--     position i + 1 is the model's output at the previous step's row of position i),
-- all of it one tree (tree=on; loip.engine.request.tree.from_paths) verified by the target in
-- one step, so the tokens are exactly the target's own. The step's rows are flagged PEEK: the
-- engine returns the target's argmax at every row off the accepted path (LOIP_TOKF_PEEK), and
-- each row's context (the sequence, then the row's ancestors) with that guess is a new n-gram
-- for the pool. The paper's lookahead branch is a 2-D window whose diagonals start ahead of the
-- sequence; loip's tree mask reads ancestors, so here the window is one chain from the root and
-- every row of the tree (the candidates' too) gives an n-gram. The pool also holds the
-- request's own n-grams (its prompt and tokens: prompt lookup), one per request, bounded by
-- `entries` (loip.engine.request.ngram_pool), freed when it ends.
--   loip generate ... --draft lookahead                     (trees of `size` nodes)
--   loip generate ... --draft lookahead:n=5,window=8,candidates=6,size=32
-- tree=off: a chain, the best candidate or else the guesses.
local pool_mod = require "loip.engine.request.ngram_pool"
local tree_mod = require "loip.engine.request.tree"

local M = { name = "lookahead", peek = true }

local function at_least(n) return function(v) return v >= n, "must be >= " .. n end end
local function between(a, b) return function(v) return v >= a and v <= b, string.format("must be in %d..%d", a, b) end end
M.settings = {
  { "n", "int", "the n-gram's length: a candidate proposes its last n - 1 tokens", default = 4, check = between(2, 16) },
  { "match", "int", "the most tokens at the sequence's end a candidate's first tokens match (longest first, down to 1)",
    default = 2, check = between(1, 8) },
  { "window", "int", "the lookahead branch: guesses (Jacobi iteration) verified and peeked each step", default = 6,
    check = between(0, 64) },
  { "candidates", "int", "the most pool candidates verified each step", default = 4, check = between(0, 64) },
  { "entries", "int", "the pool's bound: n-grams kept per request", default = 4096, check = at_least(16) },
  { "size", "string", "nodes of a step's tree: auto (as many as the step's price pays for, up to window + candidates x "
    .. "(n - 1)), a count 1..64, or 0 (the draft length rule decides); --draft-tokens wins", default = "auto",
    check = function(v)
      local k = tonumber(v)
      return v == "auto" or (k ~= nil and k == math.floor(k) and k >= 0 and k <= 64), "must be auto or a whole number in 0..64"
    end },
  { "tree", "bool", "propose a tree (candidates and the lookahead branch); off: a chain", default = true },
}

-- size=auto: the k in 0..full (window + candidates x (n - 1), at most 64) that maximises the
-- expected tokens per ms, E(k) / (price(rows + k) + own), with E(k) = 1 + (g - 1) k / full and g the
-- request's measured tokens per step scaled to a full tree (from trees of at least half of it,
-- or of the room a step had), never taken below 1.3 (what a step's guesses are worth to the
-- pool beyond the tokens they give now: a stretch without acceptance does not stop it);
-- price the draft's (the cost model's, scaled to the step times measured) and own the policy's
-- own time a drafting step (proposing and observing, measured). While k is 0 a full
-- tree is sent anyway once in `every` steps (the price ratio's: at most 5 % of the time) so that
-- g is measured again. Without a price: full.
local PRIOR = 1.3
local function full_of(o) return math.min(64, o.window + o.candidates * (o.n - 1)) end

-- The best k by the price, and how often a full tree goes out while it is 0 (nil: no price).
local function choose(req, ctx, o)
  local full, rows = full_of(o), req.rows or 1
  local base = ctx.price and ctx.price(rows)
  if not base or base <= 0 then return nil end
  local g = math.max(req.memo.gain or PRIOR, PRIOR)
  local best, best_rate = 0, 1 / base
  for k = 1, full do
    if k <= 4 or k % 4 == 0 or k == full then -- (1..4, then every 4th, and full)
      local rate = (1 + (g - 1) * k / full) / ((ctx.price(rows + k) or base) + (req.memo.own_ms or 0))
      if rate > best_rate * 1.0001 then best, best_rate = k, rate end
    end
  end
  return best, math.max(8, math.ceil(((ctx.price(rows + full) or base) / base - 1) / 0.05))
end

-- (chosen again every 8th step, or when the step's rows change: a step of a small model is
-- short beside the Lua of pricing the sizes)
local function auto(req, ctx, o)
  local s = req.memo
  if s.auto_k == nil or s.auto_rows ~= req.rows or s.auto_left <= 0 then
    local k, every = choose(req, ctx, o)
    s.auto_k, s.auto_every, s.auto_rows, s.auto_left = k or full_of(o), every, req.rows, 8
  end
  s.auto_left, s.room = s.auto_left - 1, req.k
  if s.auto_k > 0 then s.quiet = 0 return s.auto_k end
  s.quiet = (s.quiet or 0) + 1
  if s.quiet >= s.auto_every then s.quiet = 0 return full_of(o) end
  return 0
end

function M.length(req, ctx, o)
  if o.size == "auto" then return auto(req, ctx, o) end
  local k = tonumber(o.size)
  if k > 0 then return k end
  return nil -- (the draft's length rule)
end

-- The request's state: its pool of the model's guesses, its pool of its own n-grams (fed with
-- its sequence so far) and its guesses.
local function state(req, o)
  local s = req.memo
  if not s.pool then
    local shape = { n = o.match, min = 1, span = o.n - 1, entries = o.entries, per_key = math.max(1, o.candidates) }
    s.pool, s.seen, s.fed = pool_mod.new(shape), pool_mod.new(shape), 0
  end
  s.seen:feed(req.ids, s.fed + 1)
  s.fed = req.n
  return s
end

-- (the pool of the model's guesses; the sequence's own n-grams first)
local function candidates(s, req, o)
  local out, seen = {}, {}
  for _, p in ipairs({ s.seen, s.pool }) do
    for _, c in ipairs(p:lookup(req.ids, o.candidates)) do
      if #out < o.candidates and not seen[c.sig] then seen[c.sig] = true out[#out + 1] = c end
    end
  end
  return out
end

-- The lookahead branch for a sequence of n ids: the guesses made for it (the last step's
-- outputs), else a start: what the pool says follows, then a deterministic pick of its ids.
local function guesses(s, req, o)
  local g = s.guess_for == req.n and s.guess or {}
  local out = {}
  for i = 1, math.min(#g, o.window) do out[i] = g[i] end
  if #out == 0 then
    local c = candidates(s, req, o)[1]
    for i = 1, c and math.min(#c, o.window) or 0 do out[i] = c[i] end
  end
  local ids, n = req.ids, req.n
  local h = (n * 2654435761) % 4294967296 % n
  while #out < o.window do out[#out + 1] = ids[(h + #out) % n + 1] end
  return out
end

-- The time now in ms (the engine's clock, ctx.now; else the process's CPU time).
local function clock(ctx) return ctx.now and ctx.now() or os.clock() * 1000 end

-- The policy's own time a step (ms, a running average): the price of drafting at all.
local function timed(ctx, s, t0)
  local ms = clock(ctx) - t0
  s.own_ms = s.own_ms and 0.8 * s.own_ms + 0.2 * ms or ms
end

function M.propose_tree(req, ctx, o)
  local t0 = clock(ctx)
  local s = state(req, o)
  local paths = candidates(s, req, o)
  s.sent = guesses(s, req, o)
  if #s.sent > 0 then paths[#paths + 1] = s.sent end
  local t = tree_mod.from_paths(paths, req.k)
  timed(ctx, s, t0)
  return t
end

function M.propose(req, ctx, o)
  local t0 = clock(ctx)
  local s = state(req, o)
  s.sent = guesses(s, req, o)
  local c = candidates(s, req, o)[1] or s.sent
  local out = {}
  for i = 1, math.min(req.k, #c) do out[i] = c[i] end
  timed(ctx, s, t0)
  return out
end

-- Node j's path from the root (its ancestors' ids, then its own).
local function path_of(info, j)
  local ids, parents, p = info.ids, info.parents, {}
  while j > 0 do
    table.insert(p, 1, ids[j])
    j = parents and parents[j] or j - 1
  end
  return p
end

-- After a step: each row's context and the model's guess after it into the pool; the guesses
-- along the lookahead branch become the next step's (shifted by the tokens the step gave).
function M.observe(req, ctx, o, info)
  local s = req.memo
  if not s.pool then return end
  local t0 = clock(ctx)
  local seq, need = req.ids, o.match + o.n - 1
  for j = 1, #info.ids do
    local x = info.next[j]
    if x then
      local p = path_of(info, j)
      local t = {}
      for i = math.max(1, #seq - need + #p + 2), #seq do t[#t + 1] = seq[i] end
      for _, id in ipairs(p) do t[#t + 1] = id end
      t[#t + 1] = x
      s.pool:add_ending(t)
    end
  end
  -- the lookahead branch's rows (its guesses, from the root) and the outputs after them
  local sent, ids, parents = s.sent or {}, info.ids, info.parents
  local outs, node = { [0] = info.tokens[1] }, 0
  for d = 1, #sent do
    local c
    for j = node + 1, #ids do
      if (parents and parents[j] or j - 1) == node and ids[j] == sent[d] then c = j break end
    end
    if not c then break end
    outs[d], node = info.next[c], c
  end
  local got, g = #info.tokens, {}
  -- (size=auto: the tokens a step gives, scaled to a full tree)
  -- (from trees of at least half the full size, or of the room a step had: a small one's gain
  -- scaled up says little)
  local full = full_of(o)
  if 2 * #info.ids >= math.min(full, s.room or full) then
    local x = math.min(full + 1, 1 + (got - 1) * full / #info.ids)
    s.gain = 0.8 * (s.gain or PRIOR) + 0.2 * x
  end
  for i = 1, o.window do
    local x = outs[got + i - 1]
    if x == nil then break end
    g[i] = x
  end
  s.guess, s.guess_for, s.sent = g, req.n + got, nil
  -- (observing is part of the policy's time: added to the last proposal's)
  s.own_ms = (s.own_ms or 0) + (clock(ctx) - t0) * 0.2
end

return M
