-- The soak's leak judgement (loip.measure.leak, recipes/bench/soak.lua): a count that goes down
-- is no leak, nor one sample caught high; growth that stays beyond the stated bound is, and the
-- sentence says the bound.
local leak = require "loip.measure.leak"

describe("the soak's leak judgement", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("calls no descriptor count that goes down a leak (39 then 37, as a user's clone saw)", function()
    local s = {}
    for i = 1, 6 do s[i] = { socket = i <= 3 and 25 or 23, anon_inode = 8, pipe = 4, file = 2 } end
    assert.are.same({}, leak.fds(s, "worker 9479 (device 1)"))
    assert.is_nil(leak.judge({ 39, 37 }, leak.fd_bound))
  end)

  it("calls neither a sample caught high nor growth within the bound a leak", function()
    -- a connection or two open at one late sample (the last burst's, closing)
    assert.are.same({}, leak.fds({ { socket = 20 }, { socket = 20 }, { socket = 20 }, { socket = 29 }, { socket = 20 } }, "the head"))
    -- +4 in every late sample: the bound is the larger of 4 and 25% of 12
    assert.are.same({}, leak.fds({ { socket = 12 }, { socket = 12 }, { socket = 16 }, { socket = 16 } }, "the head"))
    assert.is_nil(leak.rss({ 10000, 12000, 11000, 15000, 14500 }, "the head")) -- +3000 KiB < 4096
  end)

  it("calls growth that stays beyond the bound a leak, per kind, and states the bound", function()
    local s = {}
    for i = 1, 10 do s[i] = { socket = 20 + i, pipe = 4, file = 3 } end -- one socket a sample: +3 from the median, within +6
    assert.are.same({}, leak.fds(s, "worker 42 (device 2)"))
    for i = 1, 10 do s[i] = { socket = 20 + 3 * i, pipe = 4, file = 3 } end -- three a sample, never given back
    local p = leak.fds(s, "worker 42 (device 2)")
    assert.are.equal(1, #p)
    assert.are.equal("worker 42 (device 2): its socket descriptors grew from 29 (the first half's median) to at least 38 in "
      .. "every later sample, +9 where a leak is more than +8 (the larger of 4 and 25% of 29)", p[1])
    -- a kind that appears only late counts from 0
    p = leak.fds({ { socket = 3 }, { socket = 3 }, { socket = 3, pipe = 6 }, { socket = 3, pipe = 7 } }, "x")
    assert.are.equal(1, #p)
    assert.matches("its pipe descriptors grew from 0", p[1])
    assert.matches("more than %+4 %(the larger of 4 and 25%% of 0%)", p[1])
    local r = leak.rss({ 20000, 21000, 30000, 31000 }, "worker 7 (device 1)")
    assert.matches("worker 7 %(device 1%): the RSS grew from 21000 KiB %(the first half's median%) to at least 30000 KiB", r)
    assert.matches("more than %+4096 KiB %(the larger of 4096 KiB and 10%% of the median%)", r)
  end)

  it("judges nothing from fewer than two samples", function()
    assert.is_nil(leak.judge({ 5 }, leak.fd_bound))
    assert.are.same({}, leak.fds({ { socket = 90 } }, "x"))
  end)
end)
