-- Speculative trees with the draft on a worker (--draft-device, loip.cluster.draft): the device's
-- draft builds the tree (propose_tree, or propose_scored: best-first, sized on the head by the cost
-- model) and the ring verifies it as a tree from a draft in the head's process. Greedy: run.c's
-- tokens on 3 local devices, two requests in the batch, for fixed sizes and sized by the cost
-- model; with a fixed size the very trees a draft in the head's process builds, and built
-- together (several requests' in one forward of the draft a round) those built one by one.
-- Sampled: a seeded request gives the tokens it gives with no draft. A device lost (the draft's or
-- another): the ring re-plans over the others as with no draft (loip.cluster.registry's
-- replan_after_loss), the draft opened again on a device of the new plan (the one it was on gone:
-- where the new plan puts it), and every request in flight goes on with run.c's greedy tokens;
-- the loss waited for by its event (the worker's exit, the ring's re-plan), never a time.
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local policy = require "loip.policy"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)
after_each(T.stop_servers)

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))

local function expected(c, n)
  local out = {}
  for i = 1, math.min(n, #c.generated_ids) do out[i] = c.generated_ids[i] end
  return out
end

-- Two greedy requests through cluster c planned with draft (k: fixed nodes, nil: the cost model's);
-- checked against run.c. Returns the draft's report and the drafter the policy ran.
-- one_by_one: the policy without propose_scored_many (each request's tree built in its own
-- forwards of the draft, not together with the other's).
local function two(c, draft, k, one_by_one)
  local p = policy.load("draft", draft)
  if one_by_one then p.module = setmetatable({ propose_scored_many = false }, { __index = p.module }) end
  c:plan { context = 256, batch = 64, max_batch = 2, draft = p, draft_tokens = k }
  local b = c:batcher()
  local cases = { greedy.cases[3], greedy.cases[5] }
  local reqs = {}
  for j, cs in ipairs(cases) do
    reqs[j] = b:submit { prompt = cs.prompt_ids, max_tokens = 40, sampler = { temperature = 0 }, stop = { [1] = true } }
  end
  b:drain()
  for j, r in ipairs(reqs) do assert.are.same(expected(cases[j], 40), r.token_ids, draft .. " " .. tostring(k)) end
  local d, drafter = b.draft:report(), b.draft.ctx.drafter
  b.draft:close()
  return d, drafter
end

describe("speculative trees with the draft on a worker", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("gives run.c's greedy tokens, the trees a draft in the head's process builds, and sized by the cost model", function()
    local c = cluster.start_local { store = T.slice_store(S260, "s260"), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      for _, case in ipairs({ { "self:layers=3,tree=on", 63 }, { "self:layers=3,tree=on", 7 },
          { "self:layers=3,tree=on,build=paths,width=3,levels=2", 6 } }) do
        local draft, k = case[1], case[2]
        local here, local_drafter = two(c, draft, k)
        local there, drafter = two(c, draft .. ",device=2", k)
        assert.are.equal(2, c.draft_device)
        assert.are.equal(2, drafter.i, "the draft ran on device 2") -- (loip.cluster.draft's Remote)
        assert.is_true(there.steps > 0 and there.accepted > 0 and there.tree_size_max > 1, draft .. ": trees verified")
        -- the same trees: the worker's draft is the head's, its probabilities sent bit for bit
        -- and built together, the trees each request's draft builds on its own (each with the rows it has)
        local apart = two(c, draft .. ",device=2", k, true)
        -- the same forwards of the draft (counted on the device): its steps as many rows as the
        -- head's draft's (a tree's, drafter.batch_for), not the default batch's
        assert.are.equal(local_drafter.forwards, drafter.forwards, draft .. " " .. k .. ": forwards")
        for _, f in ipairs({ "drafted", "accepted", "steps", "tokens", "tree_size_max" }) do
          assert.are.equal(here[f], there[f], string.format("%s %d: %s", draft, k, f))
          assert.are.equal(apart[f], there[f], string.format("%s %d, one by one: %s", draft, k, f))
        end
      end
      -- sized by the cost model (its size follows the measured times: only its tokens are checked)
      local d = two(c, "self:layers=3,tree=on,device=2", nil)
      assert.is_true(d.tree == true)
    end)
    c:close()
    assert(ok, err)
  end)

  it("builds several requests' trees together, a draft forward for them all a round, each the tree it gets alone", function()
    local drafter = require "loip.engine.request.drafter"
    local st = T.slice_store(S260, "s260")
    local function open() return drafter.open(st, { layers = 3, context = 256, max_seqs = 3, threads = 1, tokenizer = false }) end
    local function reqs(extra)
      local out = {}
      for i, c in ipairs({ greedy.cases[2], greedy.cases[4], greedy.cases[6] }) do
        local ids = {}
        for j, id in ipairs(c.prompt_ids) do ids[j] = id end
        for j = 1, extra do ids[#ids + 1] = c.generated_ids[j] end
        out[i] = { ids = ids, n = #ids, k = 24, id = i, seq = i - 1 }
      end
      return out
    end
    local alone, joint = open(), open()
    local got = {}
    for round = 0, 1 do -- (the second: one token to catch up, then the tree's rounds)
      local rs, f0, g0 = reqs(round), alone.forwards, joint.forwards
      local one = {}
      for i, r in ipairs(rs) do one[i] = alone:propose_scored(r, 24, nil, 16, nil, 2) end
      local list = {}
      for i, r in ipairs(reqs(round)) do list[i] = { req = r, B = 24, children = 16, rounds = 2 } end
      local many = joint:propose_scored_many(list)
      for i = 1, 3 do
        assert.are.equal(24, #many[i])
        for j, x in ipairs(one[i]) do
          local y = many[i][j]
          assert.are.same({ x.id, x.parent, x.depth }, { y.id, y.parent, y.depth }, string.format("request %d node %d", i, j))
          assert.is_true(math.abs(x.p - y.p) <= 1e-5 * x.p, string.format("request %d node %d: p %g, %g", i, j, x.p, y.p))
        end
      end
      got[round] = { alone.forwards - f0, joint.forwards - g0 }
    end
    -- after the prompts: a forward to catch up and one to expand, each request alone; for all three together
    assert.are.same({ 6, 2 }, got[1])
    alone:close()
    joint:close()
  end)

  it("gives a seeded sampled request the tokens it gives with no draft", function()
    local c = cluster.start_local { store = T.slice_store(S260, "s260"), devices = 3, threads = 1 }
    local ok, err = pcall(function()
      local function sampled(draft, seed)
        c:plan { context = 256, batch = 64, max_batch = 2, draft = draft, draft_tokens = draft and 15 or nil }
        local b = c:batcher()
        local r = b:submit { prompt = greedy.cases[2].prompt_ids, max_tokens = 40, sampler = { temperature = 0.9 }, seed = seed }
        b:drain()
        local rep = b.draft and b.draft:report()
        if b.draft then b.draft:close() end
        return r.token_ids, rep
      end
      local accepted = 0
      for seed = 1, 3 do
        local plain = sampled(nil, seed)
        local got, rep = sampled("self:layers=3,tree=on,device=2", seed)
        assert.are.same(plain, got, "seed " .. seed)
        accepted = accepted + rep.accepted
      end
      assert.is_true(accepted > 0, "sampled trees accepted drafts")
    end)
    c:close()
    assert(ok, err)
  end)

  it("serves a request's own tree (--draft-per-request) from a server whose draft runs on a device", function()
    local client = require "loip.runtime.http_client"
    local st = T.slice_store(S260, "s260tw")
    local name = st:match("([^/]+)$")
    local function ask(url, bodies)
      local cl, out = client.new(), {}
      for i, b in ipairs(bodies) do
        local t = cl:post(url .. "/completions", json.encode(b), { ["x-api-key"] = "k" })
        cl:wait(120000)
        out[i] = { status = t.status, body = json.decode(t.body) or t.body }
      end
      cl:close()
      return out
    end
    local function body(draft)
      return { model = name, prompt = "Lily went to the park. Lily went to the park. Lily went", max_tokens = 40, temperature = 0,
        draft = draft }
    end
    local url, stop = T.serve(string.format("--model %s --devices 3 --threads 1 --max-batch 2 --draft self:layers=3 "
      .. "--draft-device 2 --draft-per-request none,self", st))
    local got = ask(url, { body("none"), body("self:tree=on"), body("self:tree=on,build=paths,width=2,levels=2") })
    stop()
    for i = 1, 3 do assert.are.equal(200, got[i].status, json.encode(got[i].body)) end
    -- greedy: the tokens of no draft, the trees built on device 2
    for i = 2, 3 do assert.are.equal(got[1].body.choices[1].text, got[i].body.choices[1].text, i) end
  end)
end)

-- Two requests through cluster c (draft: a policy's text, k its nodes: nil, the cost model's; at
-- temperature temp, seeded), device `victim` sent signal sig (KILL, or STOP: it hangs) once the
-- first has `at` tokens. Checked against run.c's greedy tokens, or sampled against the same
-- requests on the same cluster with no draft. Returns the draft's report and the drafter that ran
-- after the loss.
local function two_with_loss(c, draft, k, victim, at, sig, temp)
  local cases = { greedy.cases[3], greedy.cases[5] }
  local function gen(d)
    c:plan { context = 256, batch = 64, max_batch = 2, stages = 2, draft = d and policy.load("draft", d) or nil, draft_tokens = d and k }
    local its, sts = {}, {}
    for j, cs in ipairs(cases) do
      its[j], sts[j] = c:generate(cs.prompt_ids, { max_tokens = 60, sampler = { temperature = temp }, seed = j, stop = { [1] = true } })
    end
    local pid, sent = d and c.devices[victim].pid, false
    local more = true
    while more do
      more = false
      for j = 1, 2 do
        if its[j] and its[j]() ~= nil then more = true else its[j] = nil end
      end
      if pid and not sent and #sts[1].token_ids >= at then
        os.execute("kill -" .. sig .. " " .. pid)
        sent = true
      end
    end
    if pid then
      if sig == "STOP" then os.execute("kill -CONT " .. pid .. " 2>/dev/null") end
      assert.is_true(sent, "the device was sent SIG" .. sig .. " mid-generation")
      assert.is_false(require("loip.cluster.proc").alive(pid))
    end
    return { sts[1].token_ids, sts[2].token_ids }
  end
  local want = temp == 0 and { expected(cases[1], 60), expected(cases[2], 60) } or gen(nil)
  local got = gen(draft)
  for j = 1, 2 do assert.are.same(want[j], got[j], string.format("%s, device %d lost (SIG%s): request %d", draft, victim, sig, j)) end
  local b = c:batcher()
  local rep, drafter = b.draft:report(), b.draft.ctx.drafter
  b.draft:close()
  return rep, drafter
end

describe("speculative trees with the draft on a worker, a device lost", function()
  for _, case in ipairs({
    { "self:layers=3,tree=on,device=2", 15, 2, "the draft's device", "KILL", 0 },
    { "self:layers=3,tree=on,device=2", nil, 3, "another device", "KILL", 0 },
    { "self:layers=3,tree=on,device=3", 15, 3, "the draft's device, the last of the ring", "KILL", 0 },
    { "self:layers=3,tree=on,device=2", 15, 2, "the draft's device", "STOP", 0 },
    { "self:layers=3,tree=on,device=2", 15, 2, "the draft's device", "KILL", 0.9 },
  }) do
    local draft, k, victim, what, sig, temp = unpack(case)
    it(string.format("re-plans when %s (%d) %s mid-generation (%s, %s nodes, temperature %g): %s, the draft on a device left",
      what, victim, sig == "KILL" and "dies" or "hangs (SIGSTOP)", draft, tostring(k or "the cost model's"), temp,
      temp == 0 and "run.c's tokens" or "no draft's seeded tokens"), function()
      local c = cluster.start_local { store = T.slice_store(S260, "s260"), devices = 3, threads = 1 }
      local ok, err = pcall(function()
        local rep, drafter = two_with_loss(c, draft, k, victim, 12, sig, temp)
        assert.are.equal(1, #c.losses)
        assert.are.same({ victim }, c.losses[1].devices)
        assert.is_true(c.losses[1].replanned)
        assert.are.equal(2, #c.devices)
        -- the draft went on, on a device of the new plan (the planner's, the drafter's)
        assert.is_not_nil(c.draft_device)
        assert.is_true(c.draft_device >= 1 and c.draft_device <= 2)
        assert.are.equal(c.draft_device, drafter.i)
        assert.is_true((drafter.reopens or 0) >= 1, "the draft opened again on the new plan")
        assert.is_true(rep.accepted > 0 and rep.tree_size_max > 1, "trees verified")
      end)
      c:close()
      assert(ok, err)
    end)
  end
end)
