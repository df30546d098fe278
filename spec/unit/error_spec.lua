-- loip.error: one error value (a kind, a message, the fields its kind names) that code decides
-- by; "context: " .. e keeps its kind; the C wrappers raise the runtime's LOIP_ENOMEM as kind
-- out_of_memory from the code, and any other failure as its message.
local errors = require "loip.error"
local core = require "loip.core"
local memory = require "loip.runtime.memory"

describe("loip.error", function()
  after_each(function() collectgarbage() collectgarbage() end)

  it("is a kind, a message and fields; tostring gives the message", function()
    local e = errors.new("too_long", "the prompt has 9 tokens", { param = "prompt" })
    assert.are.equal("too_long", e.kind)
    assert.are.equal("the prompt has 9 tokens", e.message)
    assert.are.equal("prompt", e.param)
    assert.are.equal("the prompt has 9 tokens", tostring(e))
    assert.are.equal("x: the prompt has 9 tokens", string.format("x: %s", e))
    assert.is_true(errors.is(e))
    assert.is_true(errors.is(e, "too_long"))
    assert.is_false(errors.is(e, "invalid"))
    assert.is_false(errors.is("the prompt has 9 tokens", "too_long"))
    assert.is_false(errors.is({ kind = "too_long" }, "too_long"))
    assert.has_error(function() errors.new(nil, "m") end, "loip.error.new: kind must be a string")
  end)

  it("keeps its kind and fields under a context, on either side", function()
    local e = errors.new("out_of_memory", "memory budget: kv needs 1 KiB more", { code = -12 })
    local wrapped = "model.bin: " .. e .. " (the online policy x did not make room)"
    assert.is_true(errors.is(wrapped, "out_of_memory"))
    assert.are.equal(-12, wrapped.code)
    assert.are.equal("model.bin: memory budget: kv needs 1 KiB more (the online policy x did not make room)", tostring(wrapped))
    assert.are.equal("memory budget: kv needs 1 KiB more", e.message) -- (the original is unchanged)
  end)

  it("is raised and caught as it is; message() reads an error value or a string alike", function()
    local ok, e = pcall(errors.raise, "usage", "generate: --x: unknown flag")
    assert.is_false(ok)
    assert.is_true(errors.is(e, "usage"))
    assert.are.equal("generate: --x: unknown flag", errors.message(e))
    assert.are.equal("plain", errors.message("plain"))
  end)

  it("names the runtime's LOIP_ENOMEM out_of_memory; other codes stay their message", function()
    local e = errors.from_code(core.constants.ENOMEM, "session: out of memory")
    assert.is_true(errors.is(e, "out_of_memory"))
    assert.are.equal(core.constants.ENOMEM, e.code)
    assert.are.equal("session: out of memory", errors.from_code(core.constants.EINVAL, "session: out of memory"))
  end)

  it("comes from the C wrappers by the failure's code, not its text", function()
    local b = memory.budget("4K")
    -- a charge past the limit: LOIP_ENOMEM
    local ok, e, rc = memory.charge(b.handle, "kv", 1024 * 1024, "ctx")
    assert.is_nil(ok)
    assert.are.equal(core.constants.ENOMEM, rc)
    assert.is_true(errors.is(e, "out_of_memory"))
    assert.matches("^ctx: memory budget: kv needs", tostring(e))
    local raised, re = pcall(core.check, rc)
    assert.is_false(raised)
    assert.is_true(errors.is(re, "out_of_memory"))
    -- a misuse whose message names the budget too (LOIP_EINVAL): its message, no kind
    local ok2, e2, rc2 = memory.charge(b.handle, "", 1)
    assert.is_nil(ok2)
    assert.are.equal(core.constants.EINVAL, rc2)
    assert.is_string(e2)
    assert.matches("memory budget: account name", e2, 1, true)
  end)
end)
