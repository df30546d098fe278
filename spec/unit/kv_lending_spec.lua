-- The session's KV primitives behind lending and evict-and-recompute (loip_session_kv_*): the
-- rows that leave come back bit for bit, a layer with KV away refuses to run, evicted positions
-- must be recomputed, and every misuse is refused naming what is wrong.
local ffi = require "ffi"
local loip = require "loip"
local core = require "loip.core"
local C = core.C
local T = require "spec.support"

local S260 = T.root .. "/models/stories260K"

-- A stories260K model with a growing KV pool and its session; forward(ids, pos0) runs a batch of
-- sequence 0 and returns the logits of its last row.
local function open()
  local m = loip.model.open(S260, { context = 128, threads = 1, kv_grows = true, mem = "64M" })
  local s = m:session()
  local V = m.vocab_size
  local logits = ffi.new("float[?]", V)
  local function forward(ids, pos0, toks)
    local n = #ids
    local idv, bt, rows = ffi.new("int32_t[?]", n), ffi.new("loip_batch_token[?]", n), ffi.new("int32_t[1]", n - 1)
    for i, id in ipairs(ids) do
      idv[i - 1] = id
      bt[i - 1].seq, bt[i - 1].pos = 0, toks and toks[i] or (pos0 + i - 1)
    end
    local rc = C.loip_session_forward_batch(s, idv, n, bt, rows, 1, logits)
    if rc ~= 0 then return nil, core.last_error() end
    local out = {}
    for v = 0, V - 1 do out[v + 1] = logits[v] end
    return out
  end
  return m, s, forward
end

local PROMPT = {}
for i = 1, 40 do PROMPT[i] = (i * 37) % 500 + 1 end

-- The logits of token 7 at position 40 after PROMPT, untouched (a session of its own); then a
-- fresh session with PROMPT forwarded, for a test to lend, evict or attach in.
local function reference_then_fresh()
  local m, _, forward = open()
  assert(forward(PROMPT, 0))
  local nxt = assert(forward({ 7 }, 40))
  m:close()
  local m2, s2, forward2 = open()
  assert(forward2(PROMPT, 0))
  return nxt, m2, s2, forward2
end

describe("session KV lending", function()
  it("lends a layer range out and back: refused while away, the same logits after, charges follow", function()
    local nxt, m, s, forward = reference_then_fresh()
    local chunk = tonumber(C.loip_session_kv_chunk_bytes(s))
    local before = tonumber(C.loip_session_kv_charged(s))
    local buf = ffi.new("uint8_t[?]", 2 * 2 * chunk)
    local got = ffi.new("uint64_t[1]")
    -- layers 1..2, the first two groups (positions 0..31) of sequence 0
    assert.are.equal(0, C.loip_session_kv_lend(s, 0, 1, 3, 0, 1, buf, 2 * 2 * chunk, got))
    assert.are.equal(2 * chunk, tonumber(got[0]))
    assert.are.equal(before - 2 * chunk, tonumber(C.loip_session_kv_charged(s)))
    local _, err = forward({ 7 }, 40)
    assert.matches("layer 1's KV cache of sequence 0 is lent out", err, 1, true)
    -- twice: refused; a group it does not hold: refused
    assert.are_not.equal(0, C.loip_session_kv_lend(s, 0, 1, 3, 0, 1, buf, 2 * 2 * chunk, got))
    assert.matches("lent already", core.last_error(), 1, true)
    assert.are_not.equal(0, C.loip_session_kv_lend(s, 0, 1, 2, 5, 1, buf, 2 * chunk, got))
    assert.matches("holds no group for positions 80..95", core.last_error(), 1, true)
    -- read in place (attached), then back for good
    assert.are.equal(0, C.loip_session_kv_attach(s, 0, 1, 3, 0, 1, buf, 2 * chunk))
    assert.are.equal(0, C.loip_session_kv_detach(s, 0, 1, 3, 0, 1))
    assert.are.equal(0, C.loip_session_kv_return(s, 0, 1, 3, 0, 1, buf, 2 * chunk))
    assert.are.equal(before, tonumber(C.loip_session_kv_charged(s)))
    assert.are.same(nxt, assert(forward({ 7 }, 40)))
    m:close()
  end)

  it("runs a layer while its lent rows are attached from another buffer", function()
    local nxt, m, s, forward = reference_then_fresh()
    local chunk = tonumber(C.loip_session_kv_chunk_bytes(s))
    local buf = ffi.new("uint8_t[?]", 5 * 2 * chunk)
    local got = ffi.new("uint64_t[1]")
    assert.are.equal(0, C.loip_session_kv_lend(s, 0, 0, 5, 0, 2, buf, 5 * 2 * chunk, got))
    assert.are.equal(0, C.loip_session_kv_attach(s, 0, 0, 5, 0, 2, buf, 5 * 2 * chunk))
    assert.are.same(nxt, assert(forward({ 7 }, 40)))
    m:close()
  end)
end)

describe("session evict and recompute", function()
  it("recomputes evicted positions in the batch: the same logits, and refuses a batch without them", function()
    local nxt, m, s, forward = reference_then_fresh()
    local before = tonumber(C.loip_session_kv_charged(s))
    assert.are_not.equal(0, C.loip_session_kv_evict(s, 0, 20))
    assert.matches("a multiple of 16", core.last_error(), 1, true)
    assert.are.equal(0, C.loip_session_kv_evict(s, 0, 32))
    assert.are.equal(32, C.loip_session_kv_evicted(s, 0))
    assert.are.equal(before - 2 * tonumber(C.loip_session_kv_group_bytes(s)), tonumber(C.loip_session_kv_charged(s)))
    local _, err = forward({ 7 }, 40)
    assert.matches("positions 0..31 are evicted and the batch does not recompute them", err, 1, true)
    -- positions 0..31 recomputed as the batch's first rows, then the new token
    local ids, toks = {}, {}
    for p = 0, 31 do ids[#ids + 1], toks[#toks + 1] = PROMPT[p + 1], p end
    ids[#ids + 1], toks[#toks + 1] = 7, 40
    local got = assert(forward(ids, 0, toks))
    for v = 1, #nxt do assert.is_true(math.abs(got[v] - nxt[v]) <= 1e-4 * math.max(1, math.abs(nxt[v])), "logit " .. v) end
    assert.are_not.equal(0, C.loip_session_kv_evict(s, 0, 16))
    assert.matches("has evicted 32 positions already", core.last_error(), 1, true)
    m:close()
  end)
end)
