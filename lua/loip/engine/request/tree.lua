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

-- The most nodes a tree holds (the attention mask's reach past the root).
M.MAX = 64

-- Whether the draft policy (loaded) proposes trees: its setting tree=on, and a propose_tree.
function M.wanted(policy)
  local p = policy.params or {}
  if p.tree ~= "on" and p.tree ~= true then return false end
  if not (policy.module and policy.module.propose_tree) then
    error(string.format("draft policy %s: tree=on, but it has no propose_tree", policy.name or "?"), 0)
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
