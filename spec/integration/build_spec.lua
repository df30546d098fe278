-- The build's options as the README gives them, configured (not built) in a scratch directory:
-- the fuzzing build (-DLOIP_FUZZ=ON) where nvcc is installed leaves the CUDA kernels out, saying
-- so (issue 24: the fuzz flags reached nvcc's host compiler and the build failed).
local T = require "spec.support"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

describe("the build", function()
  after_each(function() T.cleanup() end)

  it("fuzzing (-DLOIP_FUZZ=ON) leaves the CUDA kernels out where nvcc is installed, and says so", function()
    if os.execute("command -v clang >/dev/null 2>&1") ~= 0 then
      return pending("needs clang (the fuzzing build's compiler)")
    end
    local dir = T.tmpdir()
    local rc, out, err = T.run(string.format("CC=clang cmake -S %s -B %s/b -DLOIP_FUZZ=ON", q(T.root), q(dir)))
    assert.are.equal(0, rc, out .. err)
    local cache = T.read(dir .. "/b/CMakeCache.txt")
    local nvcc = cache:match("\nCMAKE_CUDA_COMPILER:[%w]+=([^\n]*)")
    if not nvcc or nvcc == "" or nvcc:match("NOTFOUND") then
      return pending("needs nvcc installed (CMake found no CUDA compiler: nothing to leave out)")
    end
    assert.truthy(out:find("loip: LOIP_FUZZ=ON builds without the CUDA kernels", 1, true), out)
    assert.truthy(out:find("loip: CUDA kernels OFF", 1, true), out)
    -- no CUDA source in the library, so nvcc never sees the fuzz flags
    local rules = T.read(dir .. "/b/CMakeFiles/loip.dir/build.make")
    assert.is_nil(rules:find("%.cu%.o"), "a CUDA object in the fuzzing build")
    assert.is_nil(T.read(dir .. "/b/lua/loip/build_config.lua"):find("cuda = (\"ON\"", 1, true))
  end)
end)
