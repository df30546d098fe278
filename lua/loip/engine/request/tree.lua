-- Speculative decoding's tree mode (docs/serving.md, "Tree mode"): a draft policy with the
-- setting tree=on proposes a tree of drafts (propose_tree: { ids, parents }), verified in one
-- step with a per-row ancestor mask in attention (loip_batch_token.parent) and
-- loip_sampler_verify_tree on the last device. Node i of a tree rooted at the request's last
-- token (position n) is written at KV position n + i, rotated as n + its depth. After the step
-- the accepted path's nodes 1..a that sit at n + 1..n + a (the first children, which every
-- proposal here puts first) keep their KV; the rest of the path has none at the positions it
-- needs and is fed again in the request's next step, before its last token ("refeed" rows,
-- flags 0: exact, no KV moved on any device, paid in rows, not reads).
local core = require "loip.core"

local M = {}

local tokf = core.constants.tokf
local SAMPLE, DRAFT, TREE = tokf.SAMPLE, tokf.DRAFT, tokf.TREE

-- The most nodes a tree holds (the attention mask's reach past the root: LOIP_TREE_MAX; a step
-- holds a tree of at most its rows less one, a session's reach is its batch rounded up to 64).
M.MAX = core.constants.TREE_MAX

-- Whether the draft policy (loaded) proposes trees: its setting tree=on, and a propose_tree (or a
-- propose_scored: scored nodes grown best-first, sized by loip.engine.request.draft).
function M.wanted(policy)
  local p = policy.params or {}
  if p.tree ~= "on" and p.tree ~= true then return false end
  local m = policy.module
  if not (m and (m.propose_tree or m.propose_scored)) then
    error(string.format("draft policy %s: tree=on, but it has no propose_tree (or propose_scored)", policy.name or "?"), 0)
  end
  return true
end

-- A tree from candidate paths (lists of ids, best first), merged where they share a prefix, at
-- most k nodes, taken level by level (every path's first token, then every path's second...),
-- numbered in depth-first order with the first path's nodes first: node i of the first path is
-- node i. { ids, parents } (parents 0-based: 0 the root).
function M.from_paths(paths, k)
  local root = { kids = {} }
  local at, n, depth = {}, 0, 0
  for i in ipairs(paths) do at[i] = root end
  local grew = true
  while grew and n < k do
    grew, depth = false, depth + 1
    for i, path in ipairs(paths) do
      local id = path[depth]
      if id ~= nil and at[i] and n <= k then
        local c
        for _, x in ipairs(at[i].kids) do if x.id == id then c = x break end end
        if not c and n < k then
          c = { id = id, kids = {} }
          at[i].kids[#at[i].kids + 1] = c
          n = n + 1
        end
        at[i], grew = c, grew or c ~= nil
      end
    end
  end
  local ids, parents = {}, {}
  local function walk(node, num)
    for _, c in ipairs(node.kids) do
      ids[#ids + 1], parents[#parents + 1] = c.id, num
      walk(c, #ids)
    end
  end
  walk(root, 0)
  return { ids = ids, parents = parents }
end

-- Best-first growth (SpecExec's construction): nodes { id, parent (0: the root, else the node's
-- number in the returned list), p (the draft's cumulative probability: the product of its
-- probabilities along the path), depth }, at most B of them. expand(list) gives, for each node of
-- the list (the root: { index = 0, p = 1, depth = 0 }), its children { { id, p }... } (p the draft's
-- probability of the child given the path, best first). Each round takes the `chunk` best
-- frontier nodes (highest p; equal p: the earlier made), so that the list is in order of p
-- (chunk = 1: never rising) with every parent before its children; their children join the
-- frontier. expand gets the nodes so far as its second argument (a draft forwards them as a tree).
-- depth (optional): the deepest a node may be.
function M.best_first(B, expand, chunk, depth)
  chunk, depth = math.max(1, chunk or 1), depth or math.huge
  local nodes, frontier, made = {}, {}, 0
  local function grow(all)
    local list = {}
    for _, node in ipairs(all) do if node.depth < depth then list[#list + 1] = node end end
    if #nodes >= B or #list == 0 then return end
    local kids = expand(list, nodes)
    for j, node in ipairs(list) do
      for _, c in ipairs(kids[j] or {}) do
        made = made + 1
        frontier[#frontier + 1] = { id = c.id, parent = node.index, p = node.p * c.p, depth = node.depth + 1, made = made }
      end
    end
  end
  grow { { index = 0, p = 1, depth = 0 } }
  while #nodes < B and #frontier > 0 do
    table.sort(frontier, function(a, b) if a.p ~= b.p then return a.p > b.p end return a.made < b.made end)
    local take, rest = {}, {}
    for i, x in ipairs(frontier) do
      if #take < chunk and #nodes < B then
        nodes[#nodes + 1] = x
        x.index = #nodes
        take[#take + 1] = x
      else rest[#rest + 1] = x end
    end
    frontier = rest
    grow(take)
  end
  for _, x in ipairs(nodes) do x.made = nil end
  return nodes
end

-- Scored nodes (M.best_first's: parents before children) as the first `B` of them by p (equal p:
-- the earlier), numbered for a step: depth-first, each node's children by p (the likeliest first:
-- the chain of first children, whose KV stays, is the draft's likeliest path). { ids, parents,
-- probs, depths } (parents 0-based: 0 the root).
function M.from_scored(nodes, B)
  local order = {}
  for i in ipairs(nodes) do order[i] = i end
  table.sort(order, function(a, b) if nodes[a].p ~= nodes[b].p then return nodes[a].p > nodes[b].p end return a < b end)
  local keep, kids = {}, { [0] = {} }
  for i = 1, math.min(B, #order) do keep[order[i]] = true end
  for i, x in ipairs(nodes) do
    if keep[i] and (x.parent == 0 or keep[x.parent]) then
      kids[i] = {}
      table.insert(kids[x.parent], i)
    else keep[i] = nil end
  end
  local out = { ids = {}, parents = {}, probs = {}, depths = {} }
  local function walk(i, num)
    table.sort(kids[i], function(a, b) if nodes[a].p ~= nodes[b].p then return nodes[a].p > nodes[b].p end return a < b end)
    for _, c in ipairs(kids[i]) do
      local n = #out.ids + 1
      out.ids[n], out.parents[n], out.probs[n], out.depths[n] = nodes[c].id, num, nodes[c].p, nodes[c].depth
      walk(c, n)
    end
  end
  walk(0, 0)
  return out
end

-- Scored nodes in order of p (equal p: the earlier made): a prefix of it is a tree.
function M.ranked(nodes)
  local r = {}
  for i, x in ipairs(nodes) do r[i] = x end
  table.sort(r, function(a, b) if a.p ~= b.p then return a.p > b.p end return a.index < b.index end)
  return r
end

-- A draft's edge (a node given its parent: q, the draft's probability of the node's token after
-- its parent's path) by its calibration class: q in tenths (0: below 0.1, ..., 9: 0.9 and up). A
-- draft is not equally sure of its top guesses and its runners-up: a model truncated to its first
-- layers is overconfident in the first and underconfident in the others, so one scale per depth,
-- learned from the small trees that sent mostly top guesses, misprices the nodes a larger tree
-- would add. Calibrated per edge, a path's chance is the product of its edges'.
M.CLASSES = 10
function M.class(q)
  return math.max(0, math.min(M.CLASSES - 1, math.floor(q * M.CLASSES)))
end

-- A node's q (x.p over its parent's p; by: nodes by index, the parent among them).
local function edge_q(x, by)
  local up = x.parent ~= 0 and by[x.parent]
  local pp = up and up.p or 1
  return pp > 0 and math.min(1, x.p / pp) or 0
end
M.edge_q = edge_q

-- The tokens a tree is expected to give beyond the step's own: per depth d, the sum of its
-- nodes' chance to be on the target's path (the product along its path of each edge's q scaled
-- by calib[class(q)], measured over predicted: Draft's calibration; the draft's p when calib is
-- nil), at most 1 a depth. nodes: in order of p (parents first), the expectation of each prefix of
-- them returned as a list (E[b]: of the first b).
function M.expected(nodes, calib)
  local at, E, total, by, chance = {}, {}, 0, {}, {}
  for b, x in ipairs(nodes) do
    by[x.index or b] = x
    local h = x.p
    if calib then
      local q = edge_q(x, by)
      h = math.min(1, (calib[M.class(q)] or 1) * q) * (x.parent ~= 0 and chance[x.parent] or 1)
    end
    chance[x.index or b] = h
    local d = x.depth
    local before = math.min(1, at[d] or 0)
    at[d] = (at[d] or 0) + h
    total = total + math.min(1, at[d]) - before
    E[b] = total
  end
  return E
end

-- What a step tells of the nodes built for it (ranked: in order of p, a prefix of them sent),
-- given the tokens it gave (`said`: the accepted drafts, then the target's own next token;
-- `accepted` drafts of them): per node of ranked, true when its path is the target's (the nodes
-- sent on the accepted path, and a node not sent that the target's next token would have
-- accepted), false when its path leaves the target's, nil when it cannot be told (a node deeper
-- than the target's tokens, on their path so far); and the same by node index. A step's outcome
-- for the nodes it did not send is what lets a small tree learn how sure the nodes a larger one
-- would add are.
function M.outcomes(ranked, said, accepted)
  local on, out = {}, {}
  local known = math.min(#said, accepted + 1)
  for i, x in ipairs(ranked) do
    -- (parents come before their children in ranked: a child's p is at most its parent's)
    local up = x.parent == 0 or on[x.parent]
    if up == false then on[x.index] = false
    elseif up == true and x.depth <= known then on[x.index] = x.id == said[x.depth] end
    out[i] = on[x.index]
  end
  return out, on
end

-- The policy's tree for the request view `req` (k nodes at most), checked: a list of ids with
-- .parents, as Draft:propose returns them.
function M.propose(policy, req, ctx, vocab)
  local t = policy.module.propose_tree(req, ctx, policy.params) or { ids = {}, parents = {} }
  local ids, parents = t.ids or {}, t.parents or {}
  local who = "draft policy " .. (policy.name or "?") .. ": propose_tree"
  if #parents ~= #ids then error(string.format("%s: %d ids and %d parents", who, #ids, #parents), 0) end
  local k = math.min(req.k, M.MAX)
  local out = { parents = {} }
  for i = 1, math.min(#ids, k) do
    local id, p = ids[i], parents[i]
    if type(id) ~= "number" or id < 0 or id >= vocab or id ~= math.floor(id) then
      error(string.format("%s: node %d is %s, not a token id in [0, %d)", who, i, tostring(id), vocab), 0)
    end
    if type(p) ~= "number" or p < 0 or p >= i or p ~= math.floor(p) then
      error(string.format("%s: node %d's parent is %s (0: the root, or a node before it)", who, i, tostring(p)), 0)
    end
    out[i], out.parents[i] = id, p
  end
  return out
end

-- The rows r brings before its last token: the tokens of its last accepted path that have no
-- KV yet (flags 0, from r.pos on). Returns the position of its last token.
function M.refeed_rows(r, toks, owners)
  local n = r.refeed or 0
  r.refeed, r.refeed_sent = nil, n
  for q = 1, n do
    toks[#toks + 1] = { seq = r.seq, pos = r.pos + q - 1, request = r.id, id = r.token_ids[#r.token_ids - n - 1 + q], flags = 0 }
    owners[#toks] = r
  end
  return r.pos + n
end

-- Draft j of ids (a chain's, or a tree's node j) as a row after r's last token at position at.
function M.draft_row(r, at, j, ids)
  local p = ids.parents
  return { seq = r.seq, pos = at + j, request = r.id, id = ids[j], flags = p and SAMPLE + DRAFT + TREE or SAMPLE + DRAFT,
    parent = p and j - p[j] or nil }
end

-- After a step in which r sent drafts ids and got `got` tokens (outs: the step's outputs): the
-- positions whose KV r keeps (its refeed rows, its last token, then the accepted drafts at
-- their own positions), r.refeed set to the accepted tokens fed again next step.
function M.kept(r, ids, got, outs)
  local sent = r.refeed_sent or 0
  if not ids.parents then return sent + got end
  local path, node = {}, 0
  for _, o in ipairs(outs) do
    if o.seq == r.seq and o.request == r.id and #path < got - 1 then
      for c = node + 1, #ids do
        if ids.parents[c] == node and ids[c] == o.id then node = c break end
      end
      path[#path + 1] = node
    end
  end
  local a = 0
  while a < #path and path[a + 1] == a + 1 do a = a + 1 end
  r.refeed = #path - a > 0 and #path - a or nil
  r.refed = (r.refed or 0) + #path - a -- (accepted tokens fed again, over the request's life)
  return sent + 1 + a
end

return M
