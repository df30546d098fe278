-- Online memory adaptation (the paper's Sec. III-E): a plan made for a short context, the KV
-- cache growing inside each device's budget, and the online policy offloading blocks live as
-- the context passes each device's threshold: a generation whose final KV cache the budgets
-- could not hold beside the resident plan completes, with the tokens of a run without
-- adaptation, every device's accounted peak within its budget, each change in --json.
local loip = require "loip"
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"
local store_of = T.slice_store
teardown(T.drop_stores)

-- One device's greedy tokens of prompt (default "Once upon a time"), n at most.
local function reference(st, n, prompt)
  local m = loip.model.open(st, { context = 512, threads = 1 })
  -- (with the model's stop ids, as loip generate has them: this story ends after 341 tokens)
  local it, s = m:generate(prompt or "Once upon a time", { temperature = 0, max_tokens = n })
  for _ in it do end
  m:close()
  return s.token_ids
end

local function generate(st, extra)
  -- (the budgets are sized with the embedding and head in memory: --ends memory keeps them there)
  return T.generate_json(st, "--devices 2 --mem 960K,960K --ends memory --context 512 --stages 3 --max-tokens 400 " .. extra)
end

describe("online adaptation", function()
  it("offloads blocks live as the KV cache grows past each threshold: the same tokens, every peak in its budget", function()
    local st = store_of(S260, "s260")
    local ref = reference(st, 400)
    -- planned for all 512 positions, 960K per device is too little: refused before anything runs
    local rc0, _, err0 = generate(st, "")
    assert.are.equal(1, rc0)
    assert.matches("no plan fits", err0, 1, true)
    -- planned for 32 positions, adapted as the context grows
    local dir = T.tmpdir()
    local rc, j, err = generate(st, "--plan-positions 32 --trace " .. dir .. "/t.json")
    assert.are.equal(0, rc, err)
    assert.are.same(ref, j.token_ids)
    assert.is_true(#j.adaptations >= 3, #j.adaptations .. " changes")
    local last = 0
    for _, a in ipairs(j.adaptations) do
      -- restages (blocks offloaded); the policy may also lend KV between the devices
      assert.is_true(a.context >= last and (a.lend_groups ~= nil or a.to > a.from))
      last = a.context
    end
    for i, d in ipairs(j.devices) do
      assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i .. ": peak " .. d.peak_bytes .. " of " .. d.budget_bytes)
      -- resident memory: the budget plus the process's own (LuaJIT, libraries, ZeroMQ's threads:
      -- about 18 MB here) and huge-page rounding: a fixed overhead of at most 32 MB
      -- (a sanitizer build's shadow memory and quarantine are its own: not checked there)
      if require("loip.core").build.sanitize == "" then
        assert.is_true(d.peak_rss_bytes <= d.budget_bytes + 32 * 1024 * 1024,
          "device " .. i .. ": peak RSS " .. d.peak_rss_bytes .. " for a budget of " .. d.budget_bytes)
      end
    end
    -- each change is an event on its device's plan lane of the trace
    local n = 0
    for _, e in ipairs(json.load(dir .. "/t.json").traceEvents) do
      if e.cat == "adapt" then
        n = n + 1
        assert.is_true(e.name:match("^stage %d: %d %-> %d blocks offloaded %(at %d+ positions%)$") ~= nil
          or e.name:match("^at %d+ positions: device %d ") ~= nil, e.name)
      end
    end
    assert.are.equal(#j.adaptations, n)
  end)

  it("runs a policy of one's own, and names the device that cannot hold the KV cache at all", function()
    local st = store_of(S260, "s260")
    local rc, j, err = generate(st, "--plan-positions 32 --online " .. T.root .. "/recipes/policies/examples/offload-all.lua")
    assert.are.equal(0, rc, err)
    assert.are.same(reference(st, 400), j.token_ids)
    local per_device = {}
    for _, a in ipairs(j.adaptations) do per_device[a.device] = (per_device[a.device] or 0) + 1 end
    for _, n in pairs(per_device) do assert.is_true(n <= 3, "one change per stage, once") end
    assert.matches("passes its budget at %d+ positions: offloading all its blocks", err)
    -- 800K: even with every block offloaded the KV cache of 400 positions does not fit
    local rc2, _, err2 = T.run(string.format("%s generate --model %s --devices 2 --mem 800K,800K --ends memory --threads 1 --context 512 "
      .. "--stages 3 --temperature 0 --max-tokens 400 --prompt 'Once upon a time' --plan-positions 32", T.loip, st))
    assert.are.equal(1, rc2)
    assert.matches("online policy loip: device %d cannot hold the KV cache of %d+ positions even with every block offloaded", err2)
    -- after asking for a plan for the positions the request may reach, which none holds
    assert.matches("short by %d+%); planning again: no plan holds 416 KV positions: scheduler loip: ", err2)
    -- a model that is not a slice store has no plan to adapt: a usage error
    local rc3, _, err3 = T.run(string.format("%s generate --model %s --plan-positions 32 --prompt hi", T.loip, S260))
    assert.are.equal(2, rc3)
    assert.matches("--plan-positions needs a slice store", err3, 1, true)
  end)

  it("adapts one device online as well: the unplanned run's tokens, every change in --json, a new plan when offloading cannot make room", function()
    local st = store_of(S260, "s260")
    local ref = reference(st, 400)
    -- 1200K holds the blocks and 32 positions of KV, not the 341 this story takes beside them
    local dir = T.tmpdir()
    local rc, j, err = T.generate_json(st, "--mem 1200K --context 512 --max-tokens 400 --plan-positions 32 --trace " .. dir .. "/t.json")
    assert.are.equal(0, rc, err)
    assert.are.same(ref, j.token_ids)
    assert.is_true(#j.adaptations >= 2, #j.adaptations .. " changes")
    -- each change on the plan lane of the trace, as a cluster's
    local n = 0
    for _, e in ipairs(json.load(dir .. "/t.json").traceEvents) do if e.cat == "adapt" then n = n + 1 end end
    assert.are.equal(#j.adaptations, n)
    for _, a in ipairs(j.adaptations) do
      assert.are.equal(1, a.device)
      assert.is_true(a.to > a.from, "blocks offloaded as the context grows")
    end
    assert.are.same(j.adaptations[#j.adaptations].to, j.plan.devices[1].stages[j.adaptations[#j.adaptations].stage].offloaded)
    -- 1300K: everything resident holds 32 positions and nothing to offload makes room for more:
    -- the device plans again for the positions the request may reach, as a cluster does
    local rc2, j2, err2 = T.generate_json(st, "--mem 1300K --context 512 --max-tokens 400 --plan-positions 32")
    assert.are.equal(0, rc2, err2)
    assert.are.same(ref, j2.token_ids)
    assert.are.equal(416, j2.adaptations[1].replan)
    assert.are.equal(1, j2.adaptations[1].resumed)
    -- the API: loip.model.open's plan_positions and online; the budget's peak within its limit
    local m = loip.model.open(st, { context = 512, threads = 1, mem = "1200K", plan_positions = 32, online = "loip" })
    local it, s = m:generate("Once upon a time", { temperature = 0, max_tokens = 400 })
    for _ in it do end
    local b, peak, limit = m:batcher(), m.budget:peak(), m.budget:limit()
    m:close()
    assert.are.same(ref, s.token_ids)
    assert.are.equal(#j.adaptations, #b.adaptations)
    assert.is_true(peak <= limit, "peak " .. peak .. " of " .. limit)
  end)

  it("keeps one device's trace across a new plan, and a plan that cannot be made once the old one is let go breaks the model cleanly", function()
    local memory = require "loip.runtime.memory"
    local st = store_of(S260, "s260")
    -- 1100K restages as the context grows, then plans again: the trace keeps the steps before
    local m = loip.model.open(st, { context = 512, threads = 1, mem = "1100K", plan_positions = 32, online = "loip", trace = true })
    for _ in m:generate("Once upon a time", { temperature = 0, max_tokens = 400 }) do end
    local replan
    for _, a in ipairs(m:batcher().adaptations) do if a.replan then replan = replan or a end end
    assert.is_not_nil(replan, "a new plan")
    assert.is_true(replan.step > 1)
    local first = math.huge
    for _, x in ipairs(m.trace.events) do first = math.min(first, x.e.t0_ns) end
    m:close()
    assert.is_true(first < replan.t0_ns, "events from before the new plan are kept")
    -- a budget shared with something that charges it after open: the new plan no longer fits once
    -- the old one is let go; the request fails naming why, and so does every later use
    local b = memory.budget("1100K")
    m = loip.model.open(st, { context = 512, threads = 1, budget = b, plan_positions = 32, online = "loip" })
    local other = memory.charge_new(b.handle, "other", 100 * 1024)
    local ok, err = pcall(function() for _ in m:generate("Once upon a time", { temperature = 0, max_tokens = 400 }) do end end)
    assert.is_false(ok)
    assert.matches("could not be made after the old one was let go", tostring(err), 1, true)
    ok, err = pcall(function() for _ in m:generate("Again", { temperature = 0, max_tokens = 5 }) do end end)
    assert.is_false(ok)
    assert.matches("open the model again", tostring(err), 1, true)
    m:close()
    memory.charge_free(other)
  end)

  it("plans again for a longer context when offloading and lending cannot make room: the static plan's tokens", function()
    -- 3 devices whose budgets hold 480 positions only in a plan made for them: planned for 64,
    -- device 2 runs out at about 240 with every block offloaded; planned for 256, device 1 at 401
    local st = store_of(S260, "s260")
    local s0_ids = reference(st, 480, "A big red ball")
    for _, pc in ipairs({ 64, 256 }) do
      local rc, out, err = T.run(string.format("%s generate --model %s --threads 1 --temperature 0 --prompt 'A big red ball' "
        .. "--json --devices 3 --mem 790K,770K,800K --ends memory --context 512 --link-rate 100mbit --max-tokens 480 --plan-positions %d",
        T.loip, st, pc))
      assert.are.equal(0, rc, err)
      local j = json.decode(out)
      assert.are.same(s0_ids, j.token_ids)
      local replans = 0
      for _, a in ipairs(j.adaptations) do
        if a.replan then
          replans = replans + 1
          assert.is_true(a.replan > pc and a.replan <= 512 and a.replan_from == pc, "planned again for " .. a.replan)
          assert.are.equal(1, a.resumed)
        end
      end
      -- planned for 64 the three single-stage parts cannot lend: a new plan it must be; planned
      -- for 256 (three stages each) lending may make room first
      if pc == 64 then assert.are.equal(1, replans) else assert.is_true(replans <= 1) end
      for i, d in ipairs(j.devices) do
        assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i .. ": peak " .. d.peak_bytes .. " of " .. d.budget_bytes)
      end
    end
  end)

  it("gives the draft's rows way before a re-plan fails (a draft of automatic length): the no-draft tokens", function()
    -- planned for 64 positions, the re-plan for 496 holds the 9 rows an automatic draft length
    -- may verify (8 drafts and the request's token) on no device; with fewer it does (the rows
    -- are the last device's: loip.plan.device_bytes; the others lend it KV room)
    local st = store_of(S260, "s260")
    local s0_ids = reference(st, 480, "A big red ball")
    for _, draft in ipairs({ "ngram", "self:layers=all" }) do
      local rc, out, err = T.run(string.format("%s generate --model %s --threads 1 --temperature 0 --prompt 'A big red ball' "
        .. "--json --devices 3 --mem 770K,750K,800K --ends memory --context 512 --max-tokens 480 --plan-positions 64 --online loip --draft %s",
        T.loip, st, draft))
      assert.are.equal(0, rc, draft .. ": " .. err)
      local j = json.decode(out)
      assert.are.same(s0_ids, j.token_ids, draft)
      assert.is_true(j.draft.drafted > 0, draft)
      local gave_way = 0
      for _, a in ipairs(j.adaptations) do
        if a.replan and a.draft_rows then
          assert.is_true(a.draft_rows < a.draft_rows_from, draft .. ": draft rows " .. a.draft_rows .. " from " .. a.draft_rows_from)
          gave_way = gave_way + 1
        end
      end
      assert.are.equal(1, gave_way, draft)
      for i, d in ipairs(j.devices) do
        assert.is_true(d.peak_bytes <= d.budget_bytes, draft .. ": device " .. i .. ": peak " .. d.peak_bytes .. " of " .. d.budget_bytes)
      end
    end
    -- the first plan alike: 985K each holds the full context's plan with fewer draft rows only
    -- (a best-first tree's: up to 512 asked; a chain's 9 rows, the last device's alone, fit
    -- wherever the plan does)
    local s1_ids = reference(st, 40, "Once upon a time")
    local rc, j, err = T.generate_json(st, "--devices 2 --mem 985K,985K --ends memory --context 512 --max-tokens 40 "
      .. "--draft self:layers=3,tree=on")
    assert.are.equal(0, rc, err)
    assert.are.same(s1_ids, j.token_ids)
    local asked = require("loip.engine.request.draft").plan_rows(loip.policy.load("draft", "self:layers=3,tree=on"))
    assert.is_true(j.draft.plan_rows > 0 and j.draft.plan_rows < asked, "draft rows " .. tostring(j.draft.plan_rows) .. " of " .. asked)
    for i, d in ipairs(j.devices) do assert.is_true(d.peak_bytes <= d.budget_bytes, "device " .. i) end
  end)

  it("prints --json's object of a run that failed after it started: the tokens so far and the error", function()
    -- budgets the re-plan for 496 positions cannot meet: the run stops past the plan's 64 positions,
    -- where the online policy runs out of room (how far past is the plan's: the scheduler's
    -- choice on this machine's figures: 65 positions on one machine, about 200 on another)
    local st = store_of(S260, "s260")
    local s0_ids = reference(st, 480, "A big red ball")
    for _, where in ipairs({ "--devices 3 --mem 700K,700K,700K --ends memory", "--mem 900K --ends memory" }) do
      local rc, out, err = T.run(string.format("%s generate --model %s --threads 1 --temperature 0 --prompt 'A big red ball' "
        .. "--json %s --context 512 --max-tokens 480 --plan-positions 64", T.loip, st, where))
      assert.are.equal(1, rc, where)
      assert.matches("no plan holds 496 KV positions", err, 1, true)
      local j = json.decode(out)
      assert.is_table(j, where .. ": no --json object")
      assert.matches("no plan holds 496 KV positions", j.error, 1, true)
      assert.are.equal("error", j.stop_reason)
      assert.is_true(j.prompt_tokens + #j.token_ids >= 64 and #j.token_ids < 480,
        string.format("%s: %d tokens after a prompt of %d", where, #j.token_ids, j.prompt_tokens))
      assert.are.equal(#j.token_ids, j.generated_tokens)
      for k, id in ipairs(j.token_ids) do assert.are.equal(s0_ids[k], id, where .. ": token " .. k) end
      assert.is_true(#j.text > 0)
    end
  end)

  it("says which online policy let a device run past its budget, numbering devices once", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    T.write(dir .. "/idle.lua", "local M = { name = 'idle' }\nfunction M.on_step() end\nreturn M\n")
    local rc, _, err = T.run(string.format("%s generate --model %s --devices 3 --mem 790K,770K,800K --threads 1 --context 512 "
      .. "--temperature 0 --max-tokens 480 --prompt 'A big red ball' --plan-positions 64 --online %s/idle.lua", T.loip, st, dir))
    assert.are.equal(1, rc)
    assert.matches("loip: device %d: KV cache: sequence 0 at position %d+: memory budget: ", err)
    assert.matches("(the online policy idle did not make room before this step)", err, 1, true)
    assert.is_nil(err:find("device %d+: device %d+"), err)
    -- a policy's own error names it
    T.write(dir .. "/broken.lua", "local M = { name = 'broken' }\nfunction M.on_step() error('no idea', 0) end\nreturn M\n")
    local rc2, _, err2 = T.run(string.format("%s generate --model %s --devices 2 --threads 1 --context 128 --max-tokens 4 "
      .. "--prompt hi --plan-positions 32 --online %s/broken.lua", T.loip, st, dir))
    assert.are.equal(1, rc2)
    assert.matches("online policy broken: no idea", err2, 1, true)
  end)

  it("changes the emulated links while the request runs (a link schedule), which a policy sees, the same tokens", function()
    local st = store_of(S260, "s260")
    local dir = T.tmpdir()
    T.write(dir .. "/watch.lua", [[
local M = {}
function M.on_step(state, control)
  if state.step == 10 or state.step == 40 then
    control.log("step %d: link 1 at %d bytes/s", state.step, state.links[1].rate_Bps or -1)
  end
end
return M
]])
    local rc, out, err = T.run(string.format("%s generate --model %s --devices 2 --threads 1 --context 256 --temperature 0 "
      .. "--max-tokens 70 --prompt 'Once upon a time' --link-delay 1ms --link-schedule switch --online %s/watch.lua --json",
      T.loip, st, dir))
    assert.are.equal(0, rc, err)
    local j = json.decode(out)
    assert.are.same(reference(st, 70), j.token_ids)
    assert.are.equal(6, #j.link_changes) -- steps 1, 33 and 65, both links
    assert.are.same({ step = 33, link = 1, rate = "250mbit" }, j.link_changes[3])
    assert.matches("step 10: link 1 at 6250000 bytes/s", err, 1, true)
    assert.matches("step 40: link 1 at 31250000 bytes/s", err, 1, true)
  end)

  it("puts offloaded blocks back when a request's KV goes, for the next one", function()
    local cluster = require "loip.cluster"
    local st = store_of(S260, "s260")
    local c = cluster.start_local { store = st, devices = 2, threads = 1, mem = { "960K", "960K" } }
    local ok, err = pcall(function()
      c:plan { context = 512, stages = 3, plan_positions = 32, online = "loip" }
      local it = c:generate({ 1, 403, 407 }, { max_tokens = 400, sampler = { temperature = 0 }, stop = {} })
      for _ in it do end
      local b = c:batcher()
      local grown = #b.adaptations
      assert.is_true(grown >= 3)
      local it2, s2 = c:generate({ 1, 403, 407 }, { max_tokens = 10, sampler = { temperature = 0 }, stop = {} })
      for _ in it2 do end
      local back = 0
      for k = grown + 1, #b.adaptations do
        local a = b.adaptations[k]
        assert.is_true(a.to < a.from, "blocks come back")
        back = back + 1
      end
      assert.is_true(back >= 1)
      -- the same tokens as one device with everything resident
      local m = loip.model.open(st, { context = 512, threads = 1 })
      local it3, s3 = m:generate({ 1, 403, 407 }, { temperature = 0, max_tokens = 10, stop = {} })
      for _ in it3 do end
      m:close()
      assert.are.same(s3.token_ids, s2.token_ids)
    end)
    c:close()
    assert(ok, err)
  end)
end)
