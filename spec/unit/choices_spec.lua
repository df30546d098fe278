-- n > 1 choices in the request loop (loip.engine.request.choices) over an engine that only records what it
-- is asked: the choices are admitted together with the prompt's full groups reserved once; the
-- first prefills all but the prompt's last token, then the others start sharing those positions
-- and all compute the last token in one step; the reservation comes back whole; a first choice
-- cancelled while queued takes the others with it; beside an online policy that may lend KV,
-- n > 1 is refused naming n and the prefix cache stays off.
local batcher = require "loip.engine.request.batcher"
local SAMPLE = require("loip.core").constants.tokf.SAMPLE

local function engine(o)
  local e = { max_seqs = 4, context = 256, kv_tokens = 512, kv_block = 16, step_tokens = 64, logits_tokens = 1, vocab = 10,
    started = {}, steps = {}, finished = 0 }
  function e.start(self, seq, r) self.started[#self.started + 1] = { seq = seq, id = r.id, share = r.share, seed = r.seed } end
  function e.step(self, toks)
    local rows, outs = {}, {}
    for _, t in ipairs(toks) do
      rows[#rows + 1] = { seq = t.seq, pos = t.pos }
      if t.flags == SAMPLE then outs[#outs + 1] = { seq = t.seq, request = t.request, id = 5 } end
    end
    self.steps[#self.steps + 1] = rows
    return outs
  end
  function e.finish(self) self.finished = self.finished + 1 end
  for k, v in pairs(o or {}) do e[k] = v end
  return e
end

local function prompt(n)
  local ids = {}
  for i = 1, n do ids[i] = i % 9 + 1 end
  return ids
end

describe("n > 1 choices in the request loop", function()
  it("reserves the shared groups once, prefills once, then every choice computes the last prompt token", function()
    local e = engine()
    local b = batcher.new(e)
    local r = b:submit { prompt = prompt(40), max_tokens = 8, n = 3, seed = 10 }
    -- 39 shared positions: 2 full groups once, and each choice's own 3 - 2
    assert.are.equal(2 + 3 * 1, b.kv_used)
    assert.are.equal(3, b:active())
    assert.are.equal(1, #e.started, "the others start once the prefix is there")
    b:step()
    assert.are.equal(39, #e.steps[1], "the prompt but its last token, once")
    assert.are.same({ { seq = r.seq, positions = 39 }, { seq = r.seq, positions = 39 } }, { e.started[2].share, e.started[3].share })
    assert.are.same({ 11, 12 }, { e.started[2].seed, e.started[3].seed })
    b:step()
    local last = e.steps[2]
    assert.are.equal(3, #last)
    for _, row in ipairs(last) do assert.are.equal(39, row.pos) end
    for _, c in ipairs(r.choices) do c:wait() end
    assert.are.equal(0, b.kv_used)
    assert.are.equal(3, e.finished)
  end)

  it("cancels the waiting choices with a first choice cancelled in the queue", function()
    local b = batcher.new(engine({ max_seqs = 4 }), { max_batch = 2 })
    local a = b:submit { prompt = prompt(20), max_tokens = 4, n = 2 }
    local r = b:submit { prompt = prompt(20), max_tokens = 4, n = 2 }
    assert.are.equal("queued", r.state)
    r:cancel()
    for _, c in ipairs(r.choices) do assert.are.equal("cancelled", c.finish_reason) end
    for _, c in ipairs(a.choices) do c:wait() end
    assert.are.equal(0, b.kv_used)
  end)

  it("refuses n > 1 and keeps the prefix cache off beside an online policy that may lend KV", function()
    local e = engine({ lend = function() end, cache_lookup = function() return 0 end, cache_identity = "x" })
    local b = batcher.new(e, { online = { name = "spec", on_step = function() end }, prefix_cache = true })
    assert.is_nil(b.prefix)
    local ok, err = pcall(b.submit, b, { prompt = prompt(20), max_tokens = 4, n = 2 })
    assert.is_false(ok)
    assert.are.equal("n", err.param)
    assert.matches("lend", tostring(err))
    assert.is_truthy(batcher.new(engine({ cache_lookup = function() return 0 end, cache_identity = "x" }),
      { prefix_cache = true }).prefix, "on without such a policy")
  end)
end)
