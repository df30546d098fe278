-- The specs' own plumbing: they run the loip binary of the build that runs them, whatever its
-- directory (a sanitizer build in build-asan used to run ./build/loip instead).
local proc = require "loip.cluster.proc"
local T = require "spec.support"

describe("spec support", function()
  it("runs the loip binary that runs the specs", function()
    local p = io.popen("readlink -f '" .. T.loip .. "'")
    local resolved = p:read("*l")
    p:close()
    assert.are.equal(proc.exe(), resolved)
  end)
end)
