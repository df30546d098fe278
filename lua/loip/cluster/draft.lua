-- Speculative decoding's draft run on a device of the cluster (--draft-device N|auto) rather than
-- in the head's process: the `self` and `model` drafts' loip.engine.request.drafter, opened in the worker
-- and charged to its budget (the scheduler planned the device's part with that much less). The
-- head keeps, per slot, the tokens the device's draft has; each proposal sends only what it
-- lacks (DRAFT messages: open, propose, propose_tree, propose_scored, release, close;
-- docs/serving.md, "Speculative decoding"). Trees (tree=on) are built there and verified by the
-- ring as a draft's in the head's process.
local json = require "loip.text.json"
local drafter = require "loip.engine.request.drafter"

local M = {}

-- ---- the head's side -------------------------------------------------------------------------

local Remote = {}
Remote.__index = Remote

-- The device the draft runs on: "head" (nil), a device number, or "auto": of the devices whose
-- budget holds twice the draft (or is unlimited), the fastest (ms: each device's time for a
-- block, its profile's), the largest budget of equals; none: the largest budget. budgets: each
-- device's bytes (0: unlimited); bytes: the draft's; ms: per device (nil: all alike).
function M.device_of(spec, budgets, bytes, ms)
  if spec == nil or spec == "" or spec == "head" then return nil end
  if spec == "auto" then
    local function room(i) return budgets[i] == 0 and math.huge or budgets[i] end
    local best
    for i in ipairs(budgets) do
      if room(i) >= 2 * (bytes or 0) then
        local t, bt = ms and ms[i] or 0, best and ms and ms[best] or 0
        if not best or t < bt * 0.98 or (t <= bt * 1.02 and room(i) > room(best)) then best = i end
      end
    end
    if not best then
      for i in ipairs(budgets) do if not best or room(i) > room(best) then best = i end end
    end
    return best
  end
  local i = tonumber(spec)
  if not i or i ~= math.floor(i) or i < 1 or i > #budgets then
    error(string.format("--draft-device: %s is not head, auto or a device in 1..%d", tostring(spec), #budgets), 0)
  end
  return i
end

-- Open the draft on device i of cluster c: o = { path (nil: the cluster's store), layers,
-- context, max_seqs, batch (its steps' rows: a tree's, drafter.batch_for; nil: the default) }. Returns an object with the drafter's propose/release/close.
function M.open(c, i, o)
  local r = setmetatable({ c = c, i = i, o = o }, Remote)
  r:reopen(i)
  return r
end

-- Open the draft on device i (again: a new plan dropped the old one with the device's part).
function Remote:reopen(i)
  if not i then error("draft: no device of the new plan runs the draft", 0) end
  if self.plan_id then -- (the event of a draft that goes on after a re-plan: a loss, a join, a restage)
    self.reopens = (self.reopens or 0) + 1
    io.stderr:write(os.date("%H:%M:%S "), string.format("cluster: the draft opened again on device %d (%s) of plan %d (it was on device %d of plan %d)\n",
      i, tostring(self.c.registry.devices[i].endpoint), self.c.planner.plan_id, self.i, self.plan_id))
  end
  self.i, self.sent, self.plan_id = i, {}, self.c.planner.plan_id
  self.forwards = self.forwards or 0
  self.forwards_before = self.forwards
  local o = self.o
  self.bytes = self:ask({ op = "open", path = o.path, layers = o.layers, context = o.context, max_seqs = o.max_seqs,
    batch = o.batch }).bytes
end

function Remote:ask(body)
  local c, i = self.c, self.i
  body.plan_id = c.planner.plan_id
  local ok, r = pcall(function()
    c.rpc:tell(i, { kind = "DRAFT", payload = json.encode(body) })
    return c.rpc:answer(i, "DRAFT", 30000)
  end)
  -- (a lost device stays a loss, device_lost: the ring re-plans and the draft opens again on the
  -- new plan's device, Remote:delta)
  if not ok then error(string.format("draft on device %d: ", i) .. r, 0) end
  local a = json.decode(r.payload)
  -- (its forwards on every device it ran on, as a draft in the head's process counts them)
  if a.forwards then self.forwards = self.forwards_before + a.forwards end
  return a
end

-- The request's tokens the device's draft lacks: { seq, request, from (the tokens it keeps), ids
-- (those after them) }, noted as sent.
function Remote:delta(req)
  if self.plan_id ~= self.c.planner.plan_id then self:reopen(self.c.planner.draft_device) end
  local s = self.sent[req.seq]
  if not s or s.request ~= req.id then
    s = { request = req.id, ids = {} }
    self.sent[req.seq] = s
  end
  local from = 0
  while from < #s.ids and from < req.n and s.ids[from + 1] == req.ids[from + 1] do from = from + 1 end
  local new = {}
  for p = from + 1, req.n do new[#new + 1] = req.ids[p] end
  for p = from + 1, req.n do s.ids[p] = req.ids[p] end
  for p = req.n + 1, #s.ids do s.ids[p] = nil end
  return { seq = req.seq, request = req.id, from = from, ids = new }
end

-- As loip.engine.request.drafter's: k drafts after req.ids, the device sent what it lacks of them.
function Remote:propose(req, k, vocab)
  if k <= 0 then return {} end
  local body = self:delta(req)
  body.op, body.k, body.vocab = "propose", k, vocab
  return self:ask(body).ids or {}
end

-- As the drafter's: a tree of at most k drafts { ids, parents }, the chain and its runners-up.
function Remote:propose_tree(req, k, vocab, width, levels)
  if k <= 0 then return { ids = {}, parents = {} } end
  local body = self:delta(req)
  body.op, body.k, body.vocab, body.width, body.levels = "propose_tree", k, vocab, width, levels
  local ans = self:ask(body)
  return { ids = ans.ids or {}, parents = ans.parents or {} }
end

-- As the drafter's: a tree of at most B scored nodes { id, parent, p, depth } grown best-first on
-- the device (its draft forwards there, a round each); p travels as text, every bit kept (the
-- head sizes and numbers the tree from it as from a draft in its own process).
function Remote:propose_scored(req, B, vocab, children, depth, rounds)
  if B <= 0 then return {} end
  local body = self:delta(req)
  body.op, body.k, body.vocab, body.children, body.rounds = "propose_scored", B, vocab, children, rounds
  if depth and depth < math.huge then body.depth = depth end -- (none: any depth)
  local nodes = self:ask(body).nodes or {}
  for _, x in ipairs(nodes) do x.p = tonumber(x.p) end
  return nodes
end

-- As the drafter's: several requests' best-first trees built together on the device, each
-- round one step of its draft for them all (list: as loip.engine.request.drafter's).
function Remote:propose_scored_many(list)
  local items = {}
  for i, a in ipairs(list) do
    local it = self:delta(a.req)
    it.k, it.children, it.rounds = a.B, a.children, a.rounds
    if a.depth and a.depth < math.huge then it.depth = a.depth end
    items[i] = it
  end
  local vocab = list[1] and list[1].vocab
  local ans = self:ask { op = "propose_scored_many", items = items, vocab = vocab }
  local out = {}
  for i in ipairs(list) do
    out[i] = (ans.nodes or {})[i] or {}
    for _, x in ipairs(out[i]) do x.p = tonumber(x.p) end
  end
  return out
end

function Remote:release(req)
  if self.plan_id ~= self.c.planner.plan_id then return end -- (the device's draft went with its old plan)
  local s = self.sent[req.seq]
  if s and s.request == req.id then
    self.sent[req.seq] = nil
    pcall(self.ask, self, { op = "release", seq = req.seq, request = req.id })
  end
end

function Remote:close()
  if self.closed then return end
  self.closed = true
  if self.plan_id == self.c.planner.plan_id then pcall(self.ask, self, { op = "close" }) end
end

-- ---- the worker's side -----------------------------------------------------------------------

-- The request of a proposal (body: seq, request, from, ids, k), its tokens brought up to date.
local function synced(d, body)
  local s = d.draft_ids[body.seq]
  if not s or s.request ~= body.request then
    s = { request = body.request, ids = {} }
    d.draft_ids[body.seq] = s
  end
  local ids = s.ids
  for p = #ids, body.from + 1, -1 do ids[p] = nil end
  for _, id in ipairs(body.ids) do ids[#ids + 1] = id end
  return { ids = ids, n = #ids, k = body.k, id = body.request, seq = body.seq }
end

-- Scored nodes as sent: p as text, every bit kept.
local function scored(nodes)
  local out = {}
  for i, x in ipairs(nodes) do out[i] = { id = x.id, parent = x.parent, p = string.format("%.17g", x.p), depth = x.depth } end
  return out
end

-- The DRAFT message on a worker (its device d, built by a PLAN; store: its slice store).
local function answer(d, store, body)
  local op = body.op
  if op == "open" then
    if d.drafter then d.drafter:close() d.drafter = nil end
    local before = d.part.budget:used()
    d.drafter = drafter.open(body.path or store, { layers = body.layers, context = body.context,
      max_seqs = body.max_seqs, budget = d.part.budget, threads = 1, tokenizer = false, batch = body.batch })
    d.draft_ids = {}
    return { bytes = d.part.budget:used() - before }
  end
  if not d.drafter then error("DRAFT " .. tostring(op) .. " before open", 0) end
  if op == "propose" then return { ids = d.drafter:propose(synced(d, body), body.k, body.vocab) } end
  if op == "propose_tree" then
    local t = d.drafter:propose_tree(synced(d, body), body.k, body.vocab, body.width, body.levels)
    return { ids = t.ids, parents = t.parents }
  end
  if op == "propose_scored" then
    return { nodes = scored(d.drafter:propose_scored(synced(d, body), body.k, body.vocab, body.children, body.depth, body.rounds)) }
  end
  if op == "propose_scored_many" then
    local list = {}
    for i, it in ipairs(body.items) do
      list[i] = { req = synced(d, it), B = it.k, vocab = body.vocab, children = it.children, depth = it.depth, rounds = it.rounds }
    end
    local out = {}
    for i, nodes in ipairs(d.drafter:propose_scored_many(list)) do out[i] = scored(nodes) end
    return { nodes = out }
  elseif op == "release" then
    d.draft_ids[body.seq] = nil
    d.drafter:release { seq = body.seq, id = body.request }
    return {}
  elseif op == "close" then
    d.drafter:close()
    d.drafter, d.draft_ids = nil, nil
    return {}
  end
  error("DRAFT: unknown op " .. tostring(op), 0)
end

-- The answer, with the draft's forwards so far (the head counts them: Remote.forwards).
function M.handle(d, store, body)
  local a = answer(d, store, body)
  if d.drafter then a.forwards = d.drafter.forwards end
  return a
end

return M
