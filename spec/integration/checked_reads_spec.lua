-- Checked reads (--verify-reads): every offloaded read is checked against its block file's
-- CRC32C in the manifest; a flipped bit is caught and the file named, in-process and on a
-- cluster, where without the check the text would silently change or not.
local json = require "loip.text.json"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local S260 = T.root .. "/models/stories260K"

local function generate(st, extra) return T.generate_json(st, "--max-tokens 30 " .. extra) end

describe("checked reads", function()
  it("slices a CRC32C per block file and names a damaged one on the read that finds it", function()
    local dir = T.tmpdir()
    local st = dir .. "/st"
    require("loip.model.slice").write(S260, st, { quiet = true })
    local man = json.load(st .. "/manifest.json")
    for _, f in ipairs(man.files) do
      assert.is_true(type(f.crc32c) == "number" and f.crc32c >= 0 and f.crc32c < 2 ^ 32, f.name)
    end
    -- 1400K: every layer's blocks but the first few are read every step
    local rc0, out0, err0 = generate(st, "--mem 1400K --verify-reads")
    assert.are.equal(0, rc0, err0)
    local ref = out0.token_ids
    -- flip one bit of a block file the plan reads every step (with the embedding and head in
    -- memory, --ends memory: blocks offloaded), then put it back
    local damaged
    for _, extra in ipairs({ "--mem 1400K --ends memory", "--devices 2 --mem 1000K,1000K --ends memory" }) do
      local pl, files = T.plan_offloading(st, extra, dir)
      assert.is_true(#files > 0, extra .. ": no MLP block offloaded")
      damaged = files[1]
      T.flip_bit(st .. "/" .. damaged, 5000)
      local rc, _, err = generate(st, extra .. " --plan " .. pl .. " --verify-reads")
      assert.are.equal(1, rc)
      assert.matches(damaged:gsub("%-", "%%-"):gsub("%.", "%%.") .. ": CRC32C %x+ of the 139264 bytes read, the manifest says %x+: the file is damaged", err)
      T.flip_bit(st .. "/" .. damaged, 5000)
    end
    -- unchecked, the damage goes unnoticed (exit 0)
    T.flip_bit(st .. "/" .. damaged, 5000)
    local rc2, out2, err2 = generate(st, "--mem 1400K")
    assert.are.equal(0, rc2, err2)
    assert.are.equal(30, #out2.token_ids)
    assert.is_not_nil(ref)
  end)

  it("refuses --verify-reads on a store sliced without checksums, saying how to fix it", function()
    local dir = T.tmpdir()
    local st = dir .. "/st"
    require("loip.model.slice").write(S260, st, { quiet = true })
    local man = T.read(st .. "/manifest.json")
    T.write(st .. "/manifest.json", (man:gsub('"crc32c":%s*%d+,?', "")))
    local rc, _, err = generate(st, "--mem 1400K --verify-reads")
    assert.are.equal(1, rc)
    assert.matches("has no CRC32C (sliced by an older loip): --verify-reads needs a store sliced again", err, 1, true)
  end)
end)
