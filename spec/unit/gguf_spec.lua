-- GGUF files (loip.model.gguf): models/stories260K-gguf read as llama.cpp wrote it, and a
-- strict header: a truncated file, a wrong magic or version, absurd counts, lengths and offsets
-- past the end, unknown value and tensor types, quantized tensors, bad dimensions, alignment and
-- overlaps each refused with an error naming the file and the key or tensor.
local gguf = require "loip.model.gguf"
local T = require "spec.support"
teardown(function() T.cleanup() end)

local function u32(v) return string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536) % 256, math.floor(v / 16777216) % 256) end
local u64 = T.u64le
local function str(s) return u64(#s) .. s end
local function kv_u32(k, v) return str(k) .. u32(4) .. u32(v) end
local function kv_str(k, v) return str(k) .. u32(8) .. str(v) end
local function tensor(name, dims, ty, off)
  local d = {}
  for i, x in ipairs(dims) do d[i] = u64(x) end
  return str(name) .. u32(#dims) .. table.concat(d) .. u32(ty) .. u64(off)
end
-- A GGUF v3 file: metadata pairs, tensor infos, data (after padding to align).
local function file(kvs, tensors, data, o)
  o = o or {}
  local head = (o.magic or "GGUF") .. u32(o.version or 3) .. u64(o.n_tensors or #tensors) .. u64(o.n_kv or #kvs)
    .. table.concat(kvs) .. table.concat(tensors)
  local pad = (-#head) % (o.align or 32)
  return head .. string.rep("\0", pad) .. (data or "")
end

local function open_error(bytes)
  local path = T.tmpdir() .. "/m.gguf"
  T.write(path, bytes)
  local ok, err = pcall(gguf.open, path)
  assert.is_false(ok, "expected an error")
  assert.matches("m.gguf: ", err, 1, true)
  return err
end

describe("GGUF", function()
  it("reads stories260K.gguf as llama.cpp wrote it: metadata, vocabulary, 48 F32 tensors", function()
    local p, why = T.fixture_path("models/stories260K-gguf/stories260K.gguf")
    if not p then pending(why) return end
    local g = gguf.open(p)
    assert.are.equal(3, g.version)
    assert.are.equal(32, g.alignment)
    assert.are.equal(14176, g.data_offset)
    assert.are.equal(48, #g.order)
    local n = 0
    for _ in pairs(g.metadata) do n = n + 1 end
    assert.are.equal(19, n)
    assert.are.equal("llama", g.metadata["general.architecture"])
    assert.are.equal(5, g.metadata["llama.block_count"])
    assert.are.equal(512, #g.metadata["tokenizer.ggml.tokens"])
    assert.are.equal("ARRAY[STRING]", g.types["tokenizer.ggml.tokens"])
    assert.are.equal("\u{2581}", g.metadata["tokenizer.ggml.tokens"][411]) -- id 410
    assert.are.equal(4294967295, g.metadata["tokenizer.ggml.seperator_token_id"])
    local e = g.tensors["token_embd.weight"]
    assert.are.same({ 64, 512 }, e.dims)
    assert.are.equal("F32", e.type)
    assert.are.equal(64 * 512 * 4, e.nbytes)
    for _, name in ipairs(g.order) do assert.are.equal("F32", g.tensors[name].type) end
    -- the bytes are llama2.c's: the first of the embedding
    local ptr = g:data("token_embd.weight")
    local bin = T.read(T.root .. "/models/stories260K/stories260K.bin")
    assert.are.equal(bin:sub(29, 28 + 16), require("ffi").string(ptr, 16))
    g:close()
  end)

  it("reads the seeds of its fuzz target: arrays of arrays, F16 and BF16, another alignment", function()
    local g = gguf.open(T.root .. "/tests/fuzz/corpus/gguf/small.gguf")
    assert.are.same({ "token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight" }, g.order)
    assert.are.equal("F16", g.tensors["output_norm.weight"].type)
    assert.are.equal("BF16", g.tensors["blk.0.attn_norm.weight"].type)
    assert.are.same({ { 7, 8 } }, g.metadata.nested)
    assert.is_true(g.metadata["general.flag"])
    g:close()
    local a = gguf.open(T.root .. "/tests/fuzz/corpus/gguf/aligned64.gguf")
    assert.are.equal(64, a.alignment)
    assert.are.equal(128, a.data_offset)
    a:close()
  end)

  it("takes a NaN of any bit pattern in metadata for a NaN (found by fuzz_gguf: some crashed LuaJIT)", function()
    local path = T.tmpdir() .. "/nan.gguf"
    local kvs = { str("f32") .. u32(6) .. "\255\255\255\255", str("f64") .. u32(12) .. "\1\0\0\0\0\0\248\255",
      str("list") .. u32(9) .. u32(6) .. u64(2) .. "\1\0\192\255" .. "\0\0\128\63" }
    T.write(path, file(kvs, { tensor("w", { 2, 2 }, 0, 0) }, string.rep("\0", 16)))
    local g = gguf.open(path)
    assert.is_true(g.metadata.f32 ~= g.metadata.f32)
    assert.is_true(g.metadata.f64 ~= g.metadata.f64)
    assert.is_true(g.metadata.list[1] ~= g.metadata.list[1])
    assert.are.equal(1, g.metadata.list[2])
    g:close()
  end)

  it("refuses malformed files, naming the key or the tensor", function()
    local ok_kvs = { kv_str("general.architecture", "llama") }
    local ok_t = { tensor("w", { 2, 2 }, 0, 0) }
    local data = string.rep("\0", 16)
    assert.are.equal(1, #gguf.open((function()
      local p = T.tmpdir() .. "/ok.gguf"
      T.write(p, file(ok_kvs, ok_t, data))
      return p
    end)()).order)
    local cases = {
      { file(ok_kvs, ok_t, data):sub(1, 10), "truncated: the tensor count needs 8 bytes at offset 8" },
      { file(ok_kvs, ok_t, data, { magic = "GGML" }), "not a GGUF file" },
      { file(ok_kvs, ok_t, data, { version = 1 }), "GGUF version 1; loip reads versions 2 and 3 (re-convert the model)" },
      { file(ok_kvs, ok_t, data, { n_tensors = 2 ^ 40 }), "1099511627776 tensors cannot fit in a file of" },
      { file(ok_kvs, ok_t, data, { n_kv = 2 ^ 60 }), "the metadata count is 1152921504606846976: absurd" },
      { file({ str("k") .. u32(8) .. u64(1000) .. "ab" }, ok_t, data), "truncated: metadata 'k' needs 1000 bytes" },
      { file({ str("k") .. u32(13) .. u32(0) }, ok_t, data), "metadata 'k': unknown value type 13" },
      { file({ str("k") .. u32(9) .. u32(4) .. u64(2 ^ 40) }, ok_t, data), "metadata 'k': 1099511627776 elements cannot fit" },
      { file({ kv_u32("k", 1), kv_u32("k", 2) }, ok_t, data), "metadata key 'k' appears twice" },
      { file({ str("b") .. u32(7) .. "\2" }, ok_t, data), "metadata 'b': a BOOL of 2 (0 or 1)" },
      { file({ kv_u32("general.alignment", 12) }, ok_t, data), "general.alignment 12 is not a UINT32 multiple of 8" },
      { file(ok_kvs, { tensor("w", { 2, 2 }, 2, 0) }, data), "tensor 'w' has type Q4_0: quantized and integer tensors are refused" },
      { file(ok_kvs, { tensor("w", { 2, 2 }, 99, 0) }, data), "tensor 'w': unknown ggml type 99" },
      { file(ok_kvs, { tensor("w", { 1, 1, 1, 1, 1 }, 0, 0) }, data), "tensor 'w': 5 dimensions (1 to 4)" },
      { file(ok_kvs, { tensor("w", { 2 ^ 30, 2 ^ 30 }, 0, 0) }, data), "tensor 'w': its dimensions multiply past 2^53 elements" },
      { file(ok_kvs, { tensor("w", { 2, 2 }, 0, 8) }, data), "tensor 'w': offset 8 is not a multiple of the alignment 32" },
      { file(ok_kvs, { tensor("w", { 2, 2 }, 0, 64) }, data), "tensor 'w': its 16 bytes at offset" },
      { file(ok_kvs, { tensor("w", { 2, 2 }, 0, 0), tensor("w", { 2 }, 0, 0) }, data), "tensor 'w' appears twice" },
      { file(ok_kvs, { tensor("a", { 16 }, 0, 0), tensor("b", { 4 }, 0, 32) }, string.rep("\0", 64)), "tensors 'a' and 'b' overlap" },
    }
    for _, c in ipairs(cases) do assert.matches(c[2], open_error(c[1]), 1, true) end
  end)
end)
