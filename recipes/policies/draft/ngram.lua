-- Prompt and history lookup (prompt lookup decoding): the longest recent n-gram of the
-- request's own tokens that ends its sequence and occurred before proposes what followed it
-- then. No model and no memory; it pays where text repeats (code, quoting, summaries, agents).
-- A speculative decoding draft (loip.policy kind "draft"):
--   loip generate ... --draft ngram:n=4,min=2
-- tree=on: the continuations of up to `branches` earlier occurrences (the most recent, longest
-- n-grams first, distinct continuations) as the branches of a tree verified in one step.
-- shared=on: also a pool of n-grams shared by every request of the process (one per model,
-- at most `entries` continuations: loip.engine.request.ngram_pool), fed with the sequence
-- each request leaves (its prompt and tokens, what the prefix cache keeps): a request whose own
-- tokens hold no match drafts from what earlier requests said (agents repeat tool outputs and
-- code).
local pool_mod = require "loip.engine.request.ngram_pool"
local tree_mod = require "loip.engine.request.tree"

local M = { name = "ngram" }

local function at_least(n) return function(v) return v >= n, "must be >= " .. n end end
M.settings = {
  { "n", "int", "the longest n-gram matched (tried from n down to min)", default = 3, check = at_least(1) },
  { "min", "int", "the shortest n-gram matched", default = 1, check = at_least(1) },
  { "window", "int", "how far back a match is looked for, in tokens (0: the whole sequence)", default = 0, check = at_least(0) },
  { "tree", "bool", "propose a tree: several earlier matches' continuations, verified at once", default = false },
  { "branches", "int", "with tree=on: the most earlier matches whose continuations branch", default = 3, check = at_least(1) },
  { "shared", "bool", "also draft from a pool shared by every request (fed with the sequences requests leave)", default = false },
  { "entries", "int", "with shared=on: the pool's bound, continuations kept in all", default = 65536, check = at_least(16) },
  { "span", "int", "with shared=on: tokens kept per continuation in the pool", default = 8, check = at_least(1) },
}

-- The shared pool (shared=on; nil: off): one per model and shape in the process, found at the
-- first use (no `open`: ngram loads nothing, so a server lets a request choose it).
local function pool_of(ctx, o)
  if not o.shared or o.min > o.n then return nil end
  local t = ctx.target or {}
  local name = string.format("%s|%d|%d|%d|%d|%d|%d", tostring(t.path or t.who or "?"), t.vocab or 0, o.n, o.min, o.span,
    o.entries, o.branches)
  return pool_mod.shared(name, { n = o.n, min = o.min, span = o.span, entries = o.entries, per_key = o.branches })
end

-- A request ends: its sequence feeds the shared pool.
function M.finish(req, ctx, o)
  local pool = pool_of(ctx, o)
  if pool then pool:feed(req.ids) end
end

-- The continuation after the most recent earlier occurrence of the sequence's last m tokens
-- (ending before `before`, default n).
local function continuation(ids, n, m, k, window, before)
  local first = window > 0 and math.max(1, n - window) or 1
  -- an occurrence ending at e (< n): ids[e - m + 1 .. e] == ids[n - m + 1 .. n]
  for e = (before or n) - 1, first + m - 1, -1 do
    local same = true
    for j = 0, m - 1 do
      if ids[e - j] ~= ids[n - j] then same = false break end
    end
    if same then
      local out = {}
      for j = 1, k do
        local id = ids[e + j]
        if id == nil then break end
        out[j] = id
      end
      if #out > 0 then return out, e end
    end
  end
end

function M.propose(req, ctx, o)
  local ids, n, pool = req.ids, req.n, pool_of(ctx, o)
  for m = math.min(o.n, n - 1), o.min, -1 do
    local out = continuation(ids, n, m, req.k, o.window)
    if out then return out end
    -- (shared=on: the pool's match of m tokens, before a shorter one of the request's own)
    local c = pool and pool:lookup(ids, 1, m)[1]
    if c then
      out = {}
      for i = 1, math.min(req.k, #c) do out[i] = c[i] end
      return out
    end
  end
  return {}
end

-- tree=on: up to `branches` continuations (longest n-gram first, then the most recent), those
-- that differ merged into a tree of at most req.k nodes (loip.engine.request.tree.from_paths).
function M.propose_tree(req, ctx, o)
  local ids, n, pool = req.ids, req.n, pool_of(ctx, o)
  local paths, seen = {}, {}
  for m = math.min(o.n, n - 1), o.min, -1 do
    local before = n
    while #paths < o.branches do
      local out, e = continuation(ids, n, m, req.k, o.window, before)
      if not out then break end
      local key = table.concat(out, ",")
      if not seen[key] then seen[key] = true paths[#paths + 1] = out end
      before = e
    end
    -- (shared=on: the pool's matches of m tokens after the request's own)
    for _, c in ipairs(pool and #paths < o.branches and pool:lookup(ids, o.branches, m) or {}) do
      local key = table.concat(c, ",")
      if #paths < o.branches and not seen[key] then seen[key] = true paths[#paths + 1] = c end
    end
  end
  return tree_mod.from_paths(paths, req.k)
end

return M
