-- Weights derived in memory from the tensors a file holds, for the families whose files keep
-- them otherwise than loip binds them (gpt-oss's fused, transposed and interleaved experts; its
-- MXFP4 blocks and scales in OpenAI's layout): a new tensor in a buffer the caller frees
-- (memory.buffer_free), returned as (view, bytes, buffer).
local ffi = require "ffi"
local core = require "loip.core"
local memory = require "loip.runtime.memory"
local exec = require "loip.runtime.exec"
local K = core.constants

local M = {}

M.ELEM = { F32 = { 4, "uint32_t", K.F32 }, BF16 = { 2, "uint16_t", K.BF16 }, F16 = { 2, "uint16_t", K.F16 } }

-- A new [R, C] tensor whose element (r, c) is element base + r*rs + c*cs of source tensor s (of
-- elements of dtype s.dtype): a transposition, a de-interleaving. Returns view, bytes, buffer.
function M.gather(s, base, R, rs, C, cs)
  local e = M.ELEM[s.dtype]
  local buf = memory.buffer(R * C * e[1])
  core.must(exec.gather_elements(memory.buffer_data(buf), s.data, e[1], base, R, rs, C, cs, "gather"))
  local v = ffi.new("loip_tensor")
  v.data, v.dtype, v.ndim = memory.buffer_data(buf), e[3], 2
  v.shape[0], v.shape[1] = R, C
  return v, R * C * e[1], buf
end

-- Rows r of expert x's [R, C] MXFP4 matrix from OpenAI's layout (blocks [E, rows, C/32, 16]:
-- element 2j in the low nibble of byte j, 2j+1 in its high; scales [E, rows, C/32] E8M0),
-- source row first + r*step, into GGUF's block_mxfp4 (the scale byte, then element j in the low
-- nibble of byte j and j+16 in its high: what llama.cpp's converter repacks it to). Returns view,
-- bytes, buffer.
function M.mxfp4_rows(blocks, scales, x, rows_in, first, step, R, C)
  local nb = C / 32
  local bytes = R * nb * 17
  local buf = memory.buffer(bytes)
  local out = memory.buffer_data(buf)
  core.must(exec.mxfp4_from_openai(out, blocks.data, scales.data, x * rows_in + first, step, R, nb, "mxfp4"))
  local v = ffi.new("loip_tensor")
  v.data, v.dtype, v.ndim = out, K.MXFP4, 2
  v.shape[0], v.shape[1] = R, C
  return v, bytes, buf
end

return M
