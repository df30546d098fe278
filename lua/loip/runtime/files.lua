-- Files (runtime/files; mappings: runtime/core/memory.c) seen from Lua: read-only mappings, atomic
-- writers, direct reads, the page cache, free space and checksums. One thin function per C
-- call of loip.h, the rest of the Lua side calls these rather than C. Owning handles are cdata
-- under ffi.gc from birth; *_free is the explicit, idempotent close. A runtime failure returns
-- nil, err (context, when given, first, as core.ok).
--
--   local files = require "loip.runtime.files"
--   local map = assert(files.map(path))                  -- files.map_data(map), files.map_size(map)
--   local w = assert(files.writer(path)); assert(files.write(w, text)); assert(files.commit(w))
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}

-- ---- mappings
function M.map(path) return core.new("loip_mapping *", C.loip_mapping_open, C.loip_mapping_free, path) end
function M.map_data(map) return C.loip_mapping_data(map) end
function M.map_size(map) return tonumber(C.loip_mapping_size(map)) end
function M.map_prefetch(map, offset, len, context) return core.ok(C.loip_mapping_prefetch(map, offset, len), context) end
function M.map_free(map) core.free(map, C.loip_mapping_free) end
-- path mapped for a reader that checks it: map, its size, its bytes, and fail(msg), which frees
-- the mapping and raises "path: msg" (a reader's checks fail through it); raises when path
-- cannot be mapped.
function M.map_checked(path)
  local map, err = M.map(path)
  if not map then error(err, 0) end
  local function fail(msg)
    M.map_free(map)
    error(path .. ": " .. msg, 0)
  end
  return map, M.map_size(map), M.map_data(map), fail
end

-- ---- writers: a file written beside its name and renamed into place by commit
function M.writer(path) return core.new("loip_writer *", C.loip_writer_open, C.loip_writer_free, path) end
-- data: a string, or a pointer with n bytes.
function M.write(w, data, n, context)
  return core.ok(C.loip_writer_write(w, data, n or #data), context)
end
function M.commit(w, context) return core.ok(C.loip_writer_commit(w), context) end
function M.writer_free(w) core.free(w, C.loip_writer_free) end

-- ---- reads, the page cache, free space
-- len bytes of path from offset into dst; direct: with O_DIRECT where the file system allows.
-- true and 1 when O_DIRECT was used (0: buffered), or nil, err.
function M.read(path, offset, len, dst, direct, context)
  local used = ffi.new("int32_t[1]")
  local ok, err = core.ok(C.loip_file_read(path, offset, len, dst, direct and C.LOIP_READ_DIRECT or 0, used), context)
  if not ok then return nil, err end
  return true, used[0]
end
-- path's pages out of the page cache (best effort: its result is not a failure of the caller).
function M.drop_cache(path) return core.ok(C.loip_file_drop_cache(path)) end
-- Bytes available to this (unprivileged) user on the file system of path.
function M.disk_available(path, context)
  local out = ffi.new("uint64_t[1]")
  local ok, err = core.ok(C.loip_disk_available(path, out), context)
  if not ok then return nil, err end
  return tonumber(out[0])
end

-- ---- checksums
-- SHA-256 as hex: of a file (and its size in bytes), or incrementally (sha256, update, hex).
function M.sha256_file(path, context)
  local hex, bytes = ffi.new("char[65]"), ffi.new("uint64_t[1]")
  local ok, err = core.ok(C.loip_sha256_file(path, hex, bytes), context)
  if not ok then return nil, err end
  return ffi.string(hex), tonumber(bytes[0])
end
function M.sha256() return core.new("loip_sha256 *", C.loip_sha256_new, C.loip_sha256_free) end
-- data: a string, or a pointer with n bytes.
function M.sha256_update(h, data, n) C.loip_sha256_update(h, data, n or #data) end
-- The digest as hex (64 characters); the raw 32 bytes too when raw is true.
function M.sha256_hex(h, raw)
  local hex = ffi.new("char[65]")
  local digest = raw and ffi.new("uint8_t[32]") or nil
  C.loip_sha256_final(h, digest, hex)
  return ffi.string(hex), digest and ffi.string(digest, 32) or nil
end
function M.sha256_free(h) core.free(h, C.loip_sha256_free) end
-- CRC-32C of n bytes at data (a string: all of it), continuing crc (0 to start).
function M.crc32c(crc, data, n) return tonumber(C.loip_crc32c(crc or 0, data, n or #data)) end

return M
