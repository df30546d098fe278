-- The quantized matvecs' software prefetch distance, from the profile to the kernels: a profile's
-- `kernels` section is checked naming its field; a kernels policy chooses the distance from the
-- device's own profile when the device opens (one device in this process, and each worker of
-- a cluster from its own profile); LOIP_KERNELS_PREFETCH overrides it; without the figures the
-- kernels' default stays. (`loip profile` measuring it: spec/integration/planning_spec.lua.)
local cluster = require "loip.cluster"
local exec = require "loip.runtime.exec"
local json = require "loip.text.json"
local policy = require "loip.policy"
local profile = require "loip.plan.profile"
local kernels = require "loip.model.kernels"
local T = require "spec.support"

local S260 = T.root .. "/models/stories260K"
teardown(T.drop_stores)

-- A usable profile of this machine (a calibration) with kernel figures whose fastest distance
-- is `best` (of 0, 512, best and 4096: the others slower).
local function profile_with(st, best)
  local pr = json.decode(json.encode(profile.calibrate { store = st, threads = 1, context = 64, quiet = true }))
  pr.kernels = { prefetch_bytes = best, variant = exec.kernels_name(),
    prefetch_bps = { ["0"] = 1e9, ["512"] = 2e9, [tostring(best)] = 3e9, ["4096"] = 2.5e9 } }
  return pr
end

describe("the kernels' prefetch distance", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  it("is a profile field checked by name: a bad value is refused naming it", function()
    local st = T.slice_store(S260, "s260")
    local pr = profile_with(st, 2048)
    assert.is_nil(profile.check(pr, "p.json"))
    local function bad(field, value)
      local q = json.decode(json.encode(pr))
      q.kernels[field] = value
      return profile.check(q, "p.json")
    end
    assert.matches("p.json: kernels.prefetch_bytes must be a whole number of bytes from 0 to 1048576, not %-1", bad("prefetch_bytes", -1))
    assert.matches("kernels.prefetch_bytes must be a whole number", bad("prefetch_bytes", 100.5))
    assert.matches("kernels.prefetch_bytes must be a whole number", bad("prefetch_bytes", 4 * 1048576))
    assert.matches("kernels.prefetch_bytes must be a whole number", bad("prefetch_bytes", "1024"))
    assert.matches("p.json: kernels.prefetch_bps%[512%] must be a positive number", bad("prefetch_bps", { ["512"] = -3 }))
    assert.matches("kernels.prefetch_bps%[far%]: the distance must be a whole number", bad("prefetch_bps", { far = 3 }))
    -- a cluster's profile names the device
    local c = { loip_profile = 1, devices = { pr, json.decode(json.encode(pr)) } }
    c.devices[2].kernels.prefetch_bytes = -5
    assert.matches("devices%[2%]: kernels.prefetch_bytes", profile.check(c, "c.json"))
    -- and from the command line, naming the file
    local dir = T.tmpdir()
    local q = json.decode(json.encode(pr))
    q.kernels.prefetch_bytes = "far"
    T.write(dir .. "/bad.json", json.encode(q))
    local rc, _, err = T.run(string.format("%s plan --model %s --devices 2 --profile %s/bad.json", T.loip, st, dir))
    assert.are.equal(1, rc)
    assert.matches("bad.json: kernels.prefetch_bytes must be a whole number", err)
  end)

  it("is chosen by the kernels policy from the profile's rates; the kernels' default without them", function()
    local pol = policy.load("kernels", "loip")
    local v = exec.kernels_name()
    local k = { variant = v, prefetch_bytes = 2048, prefetch_bps = { ["0"] = 1e9, ["512"] = 2.9e9, ["2048"] = 3e9 } }
    assert.are.same({ prefetch = 2048 }, pol.configure { profile = k, variant = v })
    -- within 5% of the fastest, the shortest
    assert.are.same({ prefetch = 512 }, policy.load("kernels", "loip:within=0.05").configure { profile = k, variant = v })
    -- figures of other kernels than those in force, or none: the default
    assert.are.same({}, pol.configure { profile = k, variant = v .. "-other" })
    assert.are.same({}, pol.configure { variant = v })
    -- a profile with the best alone
    assert.are.same({ prefetch = 256 }, pol.configure { profile = { prefetch_bytes = 256 }, variant = v })
    -- applied: in force in the kernels, and back to the default without a profile
    local was = exec.kernels_prefetch()
    local ok, err = pcall(function()
      assert.are.same({ prefetch = 2048, from = "policy loip" }, kernels.apply { profile = { kernels = k } })
      assert.are.equal(2048, exec.kernels_prefetch())
      assert.are.same({ prefetch = 1024, from = "default" }, kernels.apply {})
      assert.are.equal(1024, exec.kernels_prefetch())
      -- a policy answering what is not a distance is refused, naming it
      local dir = T.tmpdir()
      T.write(dir .. "/far.lua", 'local M = { name = "far" } function M.configure() return { prefetch = -5 } end return M')
      local aok, aerr = pcall(kernels.apply, { policy = dir .. "/far.lua" })
      assert.is_false(aok)
      assert.matches("kernels policy far: prefetch %-5 is not a distance in bytes", aerr)
    end)
    exec.kernels_set_prefetch(was)
    assert(ok, err)
  end)

  it("reaches the kernels when a device opens in this process, and LOIP_KERNELS_PREFETCH overrides it", function()
    if exec.kernels_name() == "ref" then return pending("the reference kernels do not prefetch") end
    local st = T.slice_store(S260, "s260")
    local dir = T.tmpdir()
    json.write_file(dir .. "/p.json", json.encode(profile_with(st, 2048)))
    T.write(dir .. "/open.lua", [[
local loip = require "loip"
local m = loip.model.open(arg[1], { threads = 1, context = 64, tokenizer = false, profile = arg[2] ~= "-" and arg[2] or nil })
local d = m:batcher().engine:device_stats()[1].kernels
io.write(d.prefetch, " ", d.from, "\n")
m:close()
]])
    local function opened(env, pr)
      local rc, out, err = T.run(string.format("%s %s run %s/open.lua %s %s", env, T.loip, dir, st, pr))
      assert.are.equal(0, rc, err)
      return out:match("^(.-)\n")
    end
    assert.are.equal("2048 policy loip", opened("", dir .. "/p.json"))
    assert.are.equal("1024 default", opened("", "-"))
    assert.are.equal("256 LOIP_KERNELS_PREFETCH", opened("LOIP_KERNELS_PREFETCH=256", dir .. "/p.json"))
    local rc, _, err = T.run(string.format("LOIP_KERNELS_PREFETCH=1k %s version", T.loip))
    assert.are.equal(1, rc)
    assert.matches("LOIP_KERNELS_PREFETCH: '1k' is not a distance in bytes", err)
  end)

  it("reaches each worker from its own profile", function()
    if exec.kernels_name() == "ref" then return pending("the reference kernels do not prefetch") end
    local st = T.slice_store(S260, "s260")
    local pr = { loip_profile = 1, devices = { profile_with(st, 2048), profile_with(st, 256) } }
    local c = cluster.start_local { store = st, devices = 2, threads = 1 }
    local ok, err = pcall(function()
      c:plan { profile = pr, context = 64 }
      local s = c:stats()
      assert.are.same({ 2048, "policy loip" }, { s[1].kernels.prefetch, s[1].kernels.from })
      assert.are.same({ 256, "policy loip" }, { s[2].kernels.prefetch, s[2].kernels.from })
      -- without the figures (a calibration): the default
      c:plan { context = 64 }
      s = c:stats()
      assert.are.same({ 1024, 1024 }, { s[1].kernels.prefetch, s[2].kernels.prefetch })
    end)
    c:close()
    assert(ok, err)
  end)
end)
