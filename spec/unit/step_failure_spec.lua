-- A step that fails with an error no re-plan mends (a draft policy's, an online policy's, the
-- engine's) fails the requests in it, over an engine that only records what it is asked: each
-- ends with the error (its caller sees it, a server's client gets a 500), its slot and KV come
-- back, and the batch goes on with none left running. Before, an error while the step's drafts
-- were made left them running: every step after failed the same way, and a server logged "step
-- failed" in a loop while its clients waited forever.
local batcher = require "loip.engine.request.batcher"
local draft = require "loip.engine.request.draft"
local SAMPLE = require("loip.core").constants.tokf.SAMPLE

local function engine()
  local e = { max_seqs = 4, context = 256, kv_tokens = 512, kv_block = 16, step_tokens = 64, logits_tokens = 9, vocab = 10,
    steps = 0, finished = 0 }
  function e.start() end
  function e.step(self, toks)
    self.steps = self.steps + 1
    local outs = {}
    for _, t in ipairs(toks) do
      if t.flags == SAMPLE then outs[#outs + 1] = { seq = t.seq, request = t.request, id = 5 } end
    end
    return outs
  end
  function e.finish(self) self.finished = self.finished + 1 end
  return e
end

describe("a step that fails", function()
  it("fails its requests with the error when their drafts cannot be made, and the batch goes on", function()
    local e = engine()
    local broken = { name = "broken", propose = function() error("the draft broke", 0) end }
    local b = batcher.new(e, { draft = draft.new(broken, { vocab = 10 }, { tokens = 2 }) })
    local r = b:submit { prompt = { 1, 2, 3, 4, 5 }, max_tokens = 4 }
    local other = b:submit { prompt = { 6, 7, 8 }, max_tokens = 4, draft = false }
    local ok, err = pcall(r.wait, r)
    assert.is_false(ok)
    assert.matches("the draft broke", tostring(err), 1, true)
    assert.are.same({ "done", "error" }, { r.state, r.finish_reason })
    assert.are.same({ "done", "error" }, { other.state, other.finish_reason }, "every request in the step")
    assert.are.equal(0, b.kv_used)
    assert.are.equal(2, e.finished, "the engine is told: it did not fail")
    local steps = e.steps
    assert.is_false(b:step(), "nothing left to run")
    assert.are.equal(steps, e.steps)
    -- the batch serves the next request
    local next_one = b:submit { prompt = { 1, 2 }, max_tokens = 3, draft = false }
    next_one:wait()
    assert.are.same({ 5, 5, 5 }, next_one.token_ids)
  end)
end)
