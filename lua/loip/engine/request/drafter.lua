-- A draft model run in this process (the head's, or a worker's: loip.cluster.draft) for
-- speculative decoding: the `model` and
-- `self` draft policies (recipes/policies/draft/) propose with it. It is a loip.model (a small
-- sibling of the target, or the target's own first layers and head: opts.layers) with a
-- sequence slot per request of the target's batch; each proposal feeds the request's tokens the
-- draft has not seen yet (one batch), then drafts greedily one token a forward. Its KV keeps
-- the positions whose tokens the target accepted; the others are written over next time. Its
-- memory (weights, KV cache) is charged to its own budget (opts.mem), as a device's is.
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local local_mod = require "loip.engine.local"
local tree_mod = require "loip.engine.request.tree"
local model_mod = require "loip.model"
local store_mod = require "loip.model.store"
local bit = require "bit"
local LOGITS = core.constants.tokf.LOGITS

local M = {}

local Drafter = {}
Drafter.__index = Drafter

-- path: a model (a slice store for layers); opts: layers (the first L layers and the head;
-- nil: all), context, max_seqs (slots: the target's), mem (a budget for its memory, a size) or
-- budget (a loip.memory budget it is charged to: a device's), threads, tokenizer (false: none
-- opened).
function M.open(path, opts)
  opts = opts or {}
  local model = model_mod
  local m = model.open(path, { layers = opts.layers, context = opts.context, max_batch = opts.max_seqs or 1,
    mem = opts.mem, budget = opts.budget, threads = opts.threads, tokenizer = opts.tokenizer, batch = opts.batch })
  local e = local_mod.new(m)
  return setmetatable({ model = m, engine = e, slots = {}, vocab = m.vocab_size, forwards = 0, fed = 0 }, Drafter)
end

-- The id of the largest logit (the lowest among equal ones), as the greedy sampler picks.
local function argmax(row, n)
  local best, bv = 0, row[0]
  for i = 1, n - 1 do
    if row[i] > bv then best, bv = i, row[i] end
  end
  return best
end

-- The w ids of the largest logits, largest first (ties: the lower id first).
local function top(row, n, w)
  local ids = {}
  for i = 0, n - 1 do
    local v = row[i]
    if #ids < w or v > row[ids[#ids]] then
      local j = math.min(#ids + 1, w)
      while j > 1 and v > row[ids[j - 1]] do ids[j] = ids[j - 1] j = j - 1 end
      ids[j] = i
    end
  end
  return ids
end

-- Slot req.seq for request req.id: started afresh when another request had it.
function Drafter:slot(req)
  local s = self.slots[req.seq]
  if not s or s.request ~= req.id then
    self.engine:start(req.seq, { id = req.id, n_prompt = 0, prompt = {}, max_tokens = 0, sampler = {}, want_logits = true })
    s = { request = req.id, valid = 0, ids = {} }
    self.slots[req.seq] = s
  end
  return s
end

-- One forward of the draft over toks (its outputs: the LOGITS rows', in order): a step of its own,
-- or inside Drafter:together a share of a step with other requests' rows.
function Drafter:forward(toks)
  if self.joint then return coroutine.yield(toks) end
  local outs = self.engine:step(toks)
  self.forwards, self.fed = self.forwards + 1, self.fed + #toks
  return outs
end

-- Runs fns (functions of no arguments that forward through self:forward, each for its own
-- request) together: at each turn their forwards waiting are one step of the draft (as many as
-- the step's rows hold, each function's rows together and in order: a tree's parents are rows
-- back). Their results, in order.
function Drafter:together(fns)
  local T, LOG = self.engine.step_tokens, LOGITS
  local cos, res, wait = {}, {}, {}
  local function resume(i, arg)
    self.joint = true
    local ok, v = coroutine.resume(cos[i], arg)
    self.joint = false
    if not ok then error(v, 0) end
    if coroutine.status(cos[i]) == "dead" then res[i] = v else wait[i] = v end
  end
  for i, f in ipairs(fns) do
    cos[i] = coroutine.create(f)
    resume(i)
  end
  while next(wait) do
    local toks, parts = {}, {}
    for i = 1, #fns do
      local w = wait[i]
      if w and (#toks == 0 or #toks + #w <= T) then
        local outs = 0
        for _, t in ipairs(w) do
          toks[#toks + 1] = t
          if bit.band(t.flags, LOG) ~= 0 then outs = outs + 1 end
        end
        parts[#parts + 1] = { i = i, outs = outs }
        wait[i] = nil
      end
    end
    local outs = self.engine:step(toks)
    self.forwards, self.fed = self.forwards + 1, self.fed + #toks
    local j = 0
    for _, part in ipairs(parts) do
      local mine = {}
      for q = 1, part.outs do mine[q] = outs[j + q] end
      j = j + part.outs
      resume(part.i, mine)
    end
  end
  return res
end

-- Feeds the tokens of req the draft has not seen (positions whose tokens changed since it saw
-- them are fed again); the logits row of its last token (valid until the next forward).
function Drafter:catch_up(req, s)
  local ids, n = req.ids, req.n
  local v = math.min(s.valid, n - 1)
  for i = 1, v do
    if s.ids[i] ~= ids[i] then v = i - 1 break end
  end
  local T, row = self.engine.step_tokens, nil
  local pos = v
  while pos < n do
    local toks, last = {}, math.min(n, pos + T)
    for p = pos, last - 1 do
      toks[#toks + 1] = { seq = req.seq, pos = p, request = req.id, id = ids[p + 1], flags = p == n - 1 and LOGITS or 0 }
    end
    local outs = self:forward(toks)
    if last == n then row = outs[1].logits end
    pos = last
  end
  for p = v + 1, n do s.ids[p] = ids[p] end -- (1..v are the same)
  s.valid = n
  return row
end

-- k greedy drafts after req.ids (req: ids, n, k, id, seq as a draft policy gets them). The
-- draft's own vocabulary may be larger (padded) or smaller: drafts outside vocab are cut.
-- alts (optional, a table): alts[j] gets the next `width` best ids after draft j - 1 (draft
-- j's runners-up) for j = 1..levels, { width, levels } read from it.
function Drafter:propose(req, k, vocab, alts)
  if k <= 0 then return {} end
  local s = self:slot(req)
  local ids, n = req.ids, req.n
  local ctx = self.model.context
  if n + k > ctx then k = ctx - n end
  if k <= 0 then return {} end
  local out = {}
  local V = math.min(self.vocab, vocab or self.vocab)
  local row = self:catch_up(req, s)
  out[1] = argmax(row, V)
  if alts and alts.levels >= 1 then alts[1] = top(row, V, alts.width + 1) end
  while #out < k do
    local d = out[#out]
    local outs = self.engine:step { { seq = req.seq, pos = n + #out - 1, request = req.id, id = d, flags = LOGITS } }
    self.forwards = self.forwards + 1
    s.ids[n + #out] = d
    s.valid = n + #out
    out[#out + 1] = argmax(outs[1].logits, V)
    if alts and #out <= alts.levels then alts[#out] = top(outs[1].logits, V, alts.width + 1) end
  end
  return out
end

-- The w likeliest ids of a logits row with their probabilities (softmax over the n ids):
-- { { id, p }... }, likeliest first.
local function top_probs(row, n, w)
  local ids = top(row, n, w)
  local m, sum = row[ids[1]], 0
  for i = 0, n - 1 do sum = sum + math.exp(row[i] - m) end
  local out = {}
  for j, id in ipairs(ids) do out[j] = { id = id, p = math.exp(row[id] - m) / sum } end
  return out
end

-- A tree of at most B drafts grown best-first (loip.engine.request.tree.best_first): the scored
-- nodes { id, parent, p, depth, index }, every node's `children` likeliest tokens by the draft's
-- probabilities. Each round forwards the nodes to expand and their ancestors through the draft in
-- one step (its root, the request's last token, then those nodes as tree rows, node i at n - 1 + i:
-- the draft's KV past its last token is written over next time), their logits asked for; a round
-- takes the best 1/rounds of the budget (at least 1) from the frontier; no node deeper than `depth`.
function Drafter:propose_scored(req, B, vocab, children, depth, rounds)
  local s = self:slot(req)
  local n = req.n
  B = math.min(B, self.model.context - n, self.engine.step_tokens - 1, tree_mod.MAX)
  if B <= 0 then return {} end
  local V = math.min(self.vocab, vocab or self.vocab)
  local root = top_probs(self:catch_up(req, s), V, children)
  local function expand(list, nodes)
    if list[1].index == 0 then return { root } end
    -- the nodes to expand and their ancestors (the others' KV is not read), in node order
    local want, need = {}, {}
    for _, x in ipairs(list) do
      want[x.index] = true
      local a = x.index
      while a > 0 and not need[a] do need[a] = true a = nodes[a].parent end
    end
    local toks, row = { { seq = req.seq, pos = n - 1, request = req.id, id = req.ids[n], flags = 0 } }, { [0] = 0 }
    for i, x in ipairs(nodes) do
      if need[i] then
        row[i] = #toks
        toks[#toks + 1] = { seq = req.seq, pos = n - 1 + i, request = req.id, id = x.id, flags = want[i] and LOGITS or 0,
          parent = row[i] - row[x.parent] }
      end
    end
    local outs = self:forward(toks)
    local kids, j = {}, 0
    for i = 1, #nodes do -- (outputs in row order: the list's nodes in the order they were numbered)
      if want[i] then j = j + 1 kids[j] = top_probs(outs[j].logits, V, children) end
    end
    return kids
  end
  return tree_mod.best_first(B, expand, math.ceil(B / rounds), depth)
end

-- Several requests' best-first trees built together: list[i] = { req, B, vocab, children, depth,
-- rounds } as propose_scored's arguments; each one's catch-up, then each round's expansions,
-- are one step of the draft for them all (Drafter:together). Their nodes, in order.
function Drafter:propose_scored_many(list)
  local fns = {}
  for i, a in ipairs(list) do
    fns[i] = function() return self:propose_scored(a.req, a.B, a.vocab, a.children, a.depth, a.rounds) end
  end
  return self:together(fns)
end

-- A tree of at most k drafts (tree mode: { ids, parents }): the greedy chain, and at each of its
-- first `levels` levels the draft's next `width - 1` best tokens as leaves beside it.
function Drafter:propose_tree(req, k, vocab, width, levels)
  levels = math.min(levels, k)
  local extra = (width - 1) * levels
  local chain = math.max(levels, k - extra)
  local alts = { width = width - 1, levels = levels }
  local out = self:propose(req, chain, vocab, alts)
  local paths = { out }
  for j = 1, math.min(levels, #out) do
    for _, id in ipairs(alts[j] or {}) do
      if id ~= out[j] and #paths <= (width - 1) * j then
        local p = {}
        for i = 1, j - 1 do p[i] = out[i] end
        p[j] = id
        paths[#paths + 1] = p
      end
    end
  end
  return tree_mod.from_paths(paths, k)
end

-- Request req ended: its slot's KV goes back.
function Drafter:release(req)
  local s = self.slots[req.seq]
  if s and s.request == req.id then
    self.engine:finish(req.seq)
    self.slots[req.seq] = nil
  end
end

-- The draft's memory by account (its budget's report), and its forwards so far.
function Drafter:report()
  local b = self.model.budget
  return { forwards = self.forwards, fed = self.fed, memory = b and b:used() or nil, limit = b and b:limit() or nil,
    layers = self.model.n_layers, weight_bytes = self.model.weight_bytes }
end

function Drafter:close()
  if self.model then self.model:close() self.model = nil end
end

-- The bytes a draft of path takes (opts as M.open's: layers, context, max_seqs, batch): its
-- weights (a slice store's files of its layers and globals; else the model's files) and its
-- session (KV cache for max_seqs x context positions, scratch), what a device's budget must
-- hold for it.
function M.bytes(path, opts)
  opts = opts or {}
  local model, store = model_mod, store_mod
  local kind, file = model.locate(path)
  local cfg, weights = nil, 0
  if kind == "store" then
    local man = store.read_manifest(file)
    cfg = store.config(file, man)
    local L = opts.layers or cfg.n_layers
    for _, f in ipairs(man.files) do
      local inside = true
      for _, t in ipairs(f.tensors) do inside = inside and (t.layer or -1) < L end
      if inside then weights = weights + f.size end
    end
    cfg.n_layers = L
  else
    -- (another format: open it to read its shape; its weights are its files)
    local m = model.open(path, { tokenizer = false, load = "mmap", context = opts.context })
    cfg, weights = m.cfg, m.weight_bytes
    m:close()
  end
  local ctx = opts.context or model.default_context(cfg.max_seq)
  local batch = math.min(opts.batch or model.DEFAULT_BATCH, ctx)
  local seqs = opts.max_seqs or 1
  local kv, scratch = exec.session_size(cfg, ctx, batch, 1, -1, ctx * seqs, seqs, path)
  if not kv then error(scratch, 0) end
  return weights + kv + scratch, weights
end

-- The rows of the draft's steps for a policy's settings o: with tree=on, build=best, a tree's
-- most nodes and its root (each round forwards them in one step); else nil (the default batch).
function M.batch_for(o)
  if o and (o.tree == true or o.tree == "on") and (o.build or "best") == "best" then return tree_mod.MAX + 1 end
  return nil
end

-- What a draft policy running a drafter (ctx.drafter: recipes/policies/draft/self.lua and
-- model.lua) shares: its settings device (--draft-device), tree, width, levels, added to the
-- policy's settings rows; and its functions propose, propose_tree, propose_scored,
-- propose_scored_many (several requests' trees built together), finish, close, set in the
-- policy's table P.
function M.settings(rows)
  rows[#rows + 1] = { "device", "string", "where the draft runs: head (the head's process), a device number, or auto (the "
    .. "fastest device whose budget holds it twice over): its memory is charged to that device's budget, which the scheduler "
    .. "plans with (--draft-device)", default = "head" }
  rows[#rows + 1] = { "tree", "bool", "propose a tree: the greedy chain and, at its first levels, the draft's runners-up beside it",
    default = false }
  rows[#rows + 1] = { "build", "string", "with tree=on: best (grown best-first by the draft's cumulative probabilities, its "
    .. "size chosen each step by the cost model; --draft-tokens fixes it) or paths (the chain and runners-up: width, levels)",
    default = "best", check = function(v) return v == "best" or v == "paths", "must be best or paths" end }
  rows[#rows + 1] = { "children", "int", "with tree=on, build=best: the likeliest tokens after each node expanded", default = 16,
    check = function(v) return v >= 1, "must be >= 1" end }
  rows[#rows + 1] = { "rounds", "int", "with tree=on, build=best: the draft forwards that grow the tree, each taking the likeliest "
    .. "1/rounds of its nodes from the frontier (more: nearer one node at a time, a forward each)", default = 2,
    check = function(v) return v >= 1, "must be >= 1" end }
  rows[#rows + 1] = { "width", "int", "with tree=on: the children of a branching level (the chain's token and width - 1 others)",
    default = 2, check = function(v) return v >= 1, "must be >= 1" end }
  rows[#rows + 1] = { "levels", "int", "with tree=on: how many of the chain's first levels branch", default = 2,
    check = function(v) return v >= 0, "must be >= 0" end }
  return rows
end

-- The settings of such a policy that a request may choose for itself (they change how the loaded
-- draft proposes, not what is loaded): loip.serve.request_draft.
M.PER_REQUEST = { tree = true, width = true, levels = true, build = true, children = true, rounds = true }

function M.policy(P)
  function P.propose(req, ctx) return ctx.drafter:propose(req, req.k, ctx.target.vocab) end
  function P.propose_tree(req, ctx, o)
    return ctx.drafter:propose_tree(req, req.k, ctx.target.vocab, o.width, o.levels)
  end
  function P.propose_scored(req, ctx, o)
    return ctx.drafter:propose_scored(req, req.k, ctx.target.vocab, o.children, req.depth, o.rounds)
  end
  function P.propose_scored_many(reqs, ctx, o)
    local list = {}
    for i, req in ipairs(reqs) do
      list[i] = { req = req, B = req.k, vocab = ctx.target.vocab, children = o.children, depth = req.depth, rounds = o.rounds }
    end
    return ctx.drafter:propose_scored_many(list)
  end
  function P.finish(req, ctx) if ctx.drafter then ctx.drafter:release(req) end end
  function P.close(ctx) if ctx.drafter then ctx.drafter:close() ctx.drafter = nil end end
  return P
end

M.argmax = argmax
return M
