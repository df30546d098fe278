-- The network testbed (#net, root): workers in network namespaces behind a bridge, every link
-- shaped by tbf, driven by the head over real (shaped) TCP; the output equals one device's, and
-- `down` leaves no namespace, link, process or log behind. Skipped, with the reason, where the
-- machine does not allow it (not root, no iproute2, namespaces refused) or a testbed is up.
local ffi = require "ffi"
local loip = require "loip"
local cluster = require "loip.cluster"
local json = require "loip.text.json"
local testbed = require "loip.cluster.testbed"
local T = require "spec.support"
teardown(function() T.cleanup() T.drop_stores() end) -- the temporary directories and the store made here

local S260 = T.root .. "/models/stories260K"
local greedy = assert(json.load(S260 .. "/reference/greedy.json"))

local function leftovers()
  local out = {}
  local p = io.popen("ip netns list 2>/dev/null; ip -o link show 2>/dev/null | grep -E 'loipbr0|veth-loip' ; pgrep -f '[l]oip worker --listen tcp://10[.]77' 2>/dev/null; ls /tmp/loip-testbed-*.log 2>/dev/null")
  for line in p:lines() do
    if line:match("loip") or line:match("^%d+$") then out[#out + 1] = line end
  end
  p:close()
  return out
end

describe("the network testbed #net", function()
  it("runs a cluster across shaped namespaces losslessly and leaves nothing behind", function()
    local why = testbed.skip_reason()
    if why then pending("testbed skipped: " .. why) return end
    testbed.state_file = T.tmpdir() .. "/state.json"
    local st = T.slice_store(S260, "s260")
    local ids = greedy.cases[1].sequence_ids
    local m = loip.model.open(S260, { threads = 1, context = 256, tokenizer = false })
    local ref = m:logits(ids)
    local ref_l = ffi.new("float[?]", #ids * 512)
    ffi.copy(ref_l, ref, ffi.sizeof(ref_l))
    local it, rs = m:generate(ids, { temperature = 0, max_tokens = 20, stop = {} })
    for _ in it do end
    m:close()
    local token = "testbed-spec"
    local ok, err = pcall(function()
      local state = testbed.up { n = 3, rate = "100mbit", store = st, threads = 1, token = token, exe = T.loip }
      assert.are.equal(3, #state.hosts)
      local c = cluster.connect(state.hosts, { store = st, token = token })
      local ok2, err2 = pcall(function()
        c:plan { context = 256, batch = 8, logits_tokens = 4 }
        assert.are.equal(0, T.bit_diffs(ref_l, c:logits(ids), #ids * 512))
        local it2, gs = c:generate(ids, { max_tokens = 20, sampler = { temperature = 0 } })
        for _ in it2 do end
        assert.are.same(rs.token_ids, gs.token_ids)
        -- the links are really shaped: tbf on every device's interface
        local qd = io.popen("ip netns exec loip-dev-2 tc qdisc show dev eth0"):read("*a")
        assert.matches("tbf", qd)
        -- re-shaped live: the same tokens across the change
        testbed.shape(2, "50mbit")
        assert.matches("rate 50Mbit", io.popen("ip netns exec loip-dev-2 tc qdisc show dev eth0"):read("*a"))
        local it3, gs3 = c:generate(ids, { max_tokens = 20, sampler = { temperature = 0 } })
        for _ in it3 do end
        assert.are.same(rs.token_ids, gs3.token_ids)
      end)
      c:close()
      assert(ok2, err2)
    end)
    testbed.down()
    assert(ok, err)
    assert.are.same({}, leftovers())
    assert.is_nil(testbed.state())
  end)
end)
