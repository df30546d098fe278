-- A local cluster's devices are priced as what they are: workers sharing this machine's disk and
-- cores. Its problem carries a calibration with as many readers of the disk at once as devices
-- (each device's read rate is its share) and its workers' threads are the cores split among them,
-- the same calibration `loip plan --devices N` plans from.
local cluster = require "loip.cluster"
local profile = require "loip.plan.profile"
local T = require "spec.support"
teardown(function() T.cleanup() end)
teardown(T.drop_stores)

local S260 = T.root .. "/models/stories260K"

describe("a local cluster's pricing", function()
  local cache_dir = profile.cache_dir
  local dir
  before_each(function()
    dir = T.tmpdir()
    profile.cache_dir = function() return dir end -- a calibration of its own, measured here
  end)
  after_each(function()
    profile.cache_dir = cache_dir
    collectgarbage()
    collectgarbage()
  end)

  it("splits the cores among the workers and reads the disk with every device at once", function()
    local st = T.slice_store(S260, "s260")
    local c = cluster.start_local { store = st, devices = 3 }
    local ok, err = pcall(function()
      for i, d in ipairs(c.devices) do assert.are.equal(profile.split_threads(3), d.threads, "device " .. i) end
      c:plan { context = 64 }
      local prob = c.problem_table
      for i, d in ipairs(prob.devices) do
        local pr = d.profile
        assert.are.equal(3, pr.disk.readers, "device " .. i)
        assert.are.equal(profile.split_threads(3), pr.device.threads, "device " .. i)
        -- priced at its share of the disk, not at what one reader alone gets
        assert.are.equal(pr.disk.read_bps, d.disk_bps, "device " .. i)
        assert.is_true(pr.disk.read_bps_alone > 0, "device " .. i)
        assert.are.equal("number", type(pr.compute.spread), "device " .. i)
        -- each reader's rate with 1, 2 and 3 reading: what the estimate prices a read at
        local by = pr.disk.read_bps_by_readers
        assert.are.equal(3, #by, "device " .. i)
        assert.are.equal(pr.disk.read_bps_alone, by[1])
        assert.are.equal(pr.disk.read_bps, by[3])
        assert.is_true(by[1] >= by[2] and by[2] >= by[3], "device " .. i)
        assert.are.same(by, d.disk_shared_bps, "device " .. i)
      end
    end)
    c:close()
    assert(ok, err)
  end)
end)
