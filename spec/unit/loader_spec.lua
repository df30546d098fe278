-- loip.loader: extents of temp files land byte-exact in the slots, on both paths; failures
-- come back as nil, err naming the file; the struct layouts agree with the C compiler's.
local ffi = require "ffi"
local T = require "spec.support"
local loader = require "loip.runtime.loader"

-- A file whose byte i is a function of i and seed.
local function byte_at(i, seed) return (i * 7 + math.floor(i / 4096) * 13 + seed) % 256 end

local function make_file(dir, name, size, seed)
  local buf = ffi.new("uint8_t[?]", size)
  for i = 0, size - 1 do buf[i] = byte_at(i, seed) end
  local path = dir .. "/" .. name
  T.write(path, ffi.string(buf, size))
  return path
end

local function same(ptr, slot_offset, file_offset, len, seed)
  for i = 0, len - 1 do
    if ptr[slot_offset + i] ~= byte_at(file_offset + i, seed) then
      return false, string.format("byte %d (file offset %d) differs", i, file_offset + i)
    end
  end
  return true
end

describe("loip.runtime.loader", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

  for _, mode in ipairs { "uring", "buffered" } do
    it("loads extents byte-exact (" .. mode .. ")", function()
      local l, err = loader.new { slots = 2, slot_bytes = 1048576, mode = mode, request_bytes = 64 * 1024 }
      if not l and mode == "uring" then pending("io_uring unavailable: " .. err) return end
      assert.is_truthy(l, err)
      assert.are.equal(mode, l:mode())
      assert.matches(mode == "uring" and "io_uring" or "buffered", l:describe())
      local dir = T.tmpdir()
      local a = make_file(dir, "a.bin", 512 * 1024, 1)
      local b = make_file(dir, "b.bin", 300 * 1024 + 77, 2)
      local ext1 = { { path = a, offset = 4096, length = 256 * 1024, slot_offset = 0 },
        { path = b, offset = 12345, length = 100000, slot_offset = 300000 },
        { b, 300 * 1024, 77, 500000 } } -- the unaligned tail, positional
      local ext2 = { { path = a, offset = 0, length = 512 * 1024, slot_offset = 4096 } }
      assert.is_true(l:submit(1, ext1, 11))
      assert.is_true(l:submit(2, ext2, 12))
      local got = {}
      while #got < 2 do
        local ds = l:poll(2000)
        assert.is_true(#ds > 0, "timed out")
        for _, d in ipairs(ds) do got[#got + 1] = d end
      end
      for _, d in ipairs(got) do
        assert.is_true(d.ok, d.error)
        assert.are.equal(d.tag == 11 and 1 or 2, d.slot)
      end
      local s1, size = l:slot(1)
      assert.are.equal(1048576, size)
      assert.is_true(same(s1, 0, 4096, 256 * 1024, 1))
      assert.is_true(same(s1, 300000, 12345, 100000, 2))
      assert.is_true(same(s1, 500000, 300 * 1024, 77, 2))
      assert.is_true(same((l:slot(2)), 4096, 0, 512 * 1024, 1))
      -- wait on one tag
      assert.is_true(l:submit(1, { { path = b, offset = 0, length = 8192, slot_offset = 0 } }, 13))
      local ok, rec = l:wait(13, 2000)
      assert.is_true(ok)
      assert.are.equal(8192, rec.bytes)
      assert.is_true(same(s1, 0, 0, 8192, 2))
      local st = l:stats()
      assert.are.equal(3, st.loads_done)
      assert.is_true(st.bytes_read >= 256 * 1024 + 100000 + 77 + 512 * 1024 + 8192)
      assert.are.equal(0, l:pending())
      l:close()
      l:close() -- idempotent
    end)

    it("reports failures as nil, err naming the file (" .. mode .. ")", function()
      local l = loader.new { slot_bytes = 256 * 1024, mode = mode }
      if not l then pending("io_uring unavailable") return end
      local dir = T.tmpdir()
      local ok, err = l:submit(1, { { path = dir .. "/missing.bin", offset = 0, length = 4096 } }, 1)
      assert.is_nil(ok)
      assert.matches("missing.bin", err)
      local short = make_file(dir, "short.bin", 10000, 3)
      assert.is_true(l:submit(1, { { path = short, offset = 0, length = 16384 } }, 2))
      local ok2, err2, rec = l:wait(2, 2000)
      assert.is_nil(ok2)
      assert.matches("short.bin: file ends at byte 10000", err2, 1, true)
      assert.is_false(rec.ok)
      assert.has_error(function() l:slot(2) end)
      assert.has_error(function() l:submit(1, "x", 1) end)
      l:close()
      assert.has_error(function() l:mode() end)
    end)
  end

  it("refuses a bad mode", function()
    assert.has_error(function() loader.new { slot_bytes = 4096, mode = "fast" } end)
    assert.has_error(function() loader.new { mode = "auto" } end)
    assert.has_error(function() loader.new { slot_bytes = 4096, overlap_loads = 1 } end)
    assert.has_error(function() loader.size { slot_bytes = 4096, mode = "fast" } end)
  end)

  for _, overlap in ipairs { false, true } do
    it("reads back-to-back loads byte-exact with overlap_loads = " .. tostring(overlap), function()
      local dir = T.tmpdir()
      local a = make_file(dir, "a.bin", 160 * 1024, 5)
      local LEN = 64 * 1024
      for _, mode in ipairs { "auto", "buffered" } do
        local l = assert(loader.new { slots = 2, slot_bytes = 4 * LEN, mode = mode, request_bytes = 16 * 1024,
          queue_depth = 4, overlap_loads = overlap })
        local function where(tag) return (tag - 1) % 2 + 1, math.floor((tag - 1) / 2) * LEN, (tag - 1) * 12288 end
        for tag = 1, 6 do
          local slot, at, off = where(tag)
          assert.is_true(l:submit(slot, { { path = a, offset = off, length = LEN, slot_offset = at } }, tag))
        end
        for tag = 1, 6 do assert.is_true((l:wait(tag, 3000))) end
        for tag = 1, 6 do
          local slot, at, off = where(tag)
          assert.is_true(same((l:slot(slot)), at, off, LEN, 5))
        end
        l:close()
      end
    end)
  end

  it("says from C what a loader will charge to its budget (loader.size)", function()
    local memory = require "loip.runtime.memory"
    for _, o in ipairs { { slots = 2, slot_bytes = 100000, mode = "auto" },
                         { slots = 3, slot_bytes = 1048576, mode = "buffered", request_bytes = 12345 },
                         { slots = 1, slot_bytes = 5000, mode = "uring" } } do
      local b = memory.budget(0)
      o.budget = b
      local slots, scratch = assert(loader.size(o))
      local l, err = loader.new(o)
      if not l and o.mode == "uring" then
        assert.matches("io_uring", err)
      else
        assert.is_truthy(l, err)
        local held = {}
        for _, acc in ipairs(b:report()) do held[acc.account] = acc.bytes end
        assert.are.equal(slots, held.slots, o.mode)
        assert.are.equal(scratch, held.scratch or 0, o.mode)
        assert.are.equal(l:mode() == "buffered", scratch > 0, o.mode)
        l:close()
      end
    end
  end)
end)
