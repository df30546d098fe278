-- A calibration's disk scratch file (loip.plan.calibration: 64 MiB in the cache directory for a
-- shape with no block files) is its process's own. Two processes calibrating at once, as
-- concurrent test runs and devices started together do, once shared one name: the first to
-- finish removed the file the other was still reading.
local T = require "spec.support"
teardown(function() T.cleanup() end)

local GGUF = T.root .. "/models/stories260K-gguf/stories260K.gguf"

describe("a calibration's scratch file", function()
  it("is its process's own: another's is left alone, its own is gone after", function()
    local dir = T.tmpdir()
    -- what other processes calibrating in this cache directory hold (by a pid's name and the old one)
    local others = { "calibration-disk-1.tmp", "calibration-disk.tmp" } -- (sorted)
    for _, f in ipairs(others) do T.write(dir .. "/" .. f, "another process's scratch " .. f) end
    local rc, out, err = T.run(string.format("LOIP_CACHE_DIR='%s' %s plan --model '%s' --json", dir, T.loip, GGUF))
    assert.are.equal(0, rc, err)
    assert.matches("calibrating this machine for the shape", err, 1, true) -- (a scratch file was written)
    assert.is_table(require("loip.text.json").decode(out))
    for _, f in ipairs(others) do
      assert.are.equal("another process's scratch " .. f, T.read(dir .. "/" .. f), f)
    end
    local left = {}
    for f in io.popen("ls -1 '" .. dir .. "'"):lines() do
      if not f:match("^calibration%-%x+%.json$") then left[#left + 1] = f end
    end
    table.sort(left)
    assert.are.same(others, left)
  end)
end)
