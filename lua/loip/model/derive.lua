-- Weights derived in memory from the tensors a file holds, for the families whose files keep
-- them otherwise than loip binds them (gpt-oss's fused, transposed and interleaved experts; its
-- MXFP4 blocks and scales in OpenAI's layout): a new tensor in a buffer the caller frees
-- (memory.buffer_free), returned as (view, bytes, buffer).
local ffi = require "ffi"
local bit = require "bit"
local core = require "loip.core"
local memory = require "loip.runtime.memory"
local K = core.constants

local M = {}

M.ELEM = { F32 = { 4, "uint32_t", K.F32 }, BF16 = { 2, "uint16_t", K.BF16 }, F16 = { 2, "uint16_t", K.F16 } }

-- A new [R, C] tensor whose element (r, c) is element base + r*rs + c*cs of source tensor s (of
-- elements of dtype s.dtype): a transposition, a de-interleaving. Returns view, bytes, buffer.
function M.gather(s, base, R, rs, C, cs)
  local e = M.ELEM[s.dtype]
  local buf = memory.buffer(R * C * e[1])
  local out = ffi.cast(e[2] .. " *", memory.buffer_data(buf))
  local src = ffi.cast("const " .. e[2] .. " *", s.data)
  for r = 0, R - 1 do
    local o, i = r * C, base + r * rs
    for c = 0, C - 1 do out[o + c] = src[i + c * cs] end
  end
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
  local out = ffi.cast("uint8_t *", memory.buffer_data(buf))
  local bsrc, ssrc = ffi.cast("const uint8_t *", blocks.data), ffi.cast("const uint8_t *", scales.data)
  for r = 0, R - 1 do
    local row = x * rows_in + first + r * step
    for b = 0, nb - 1 do
      local o, i = (r * nb + b) * 17, (row * nb + b) * 16
      out[o] = ssrc[row * nb + b]
      for j = 0, 15 do
        local lo = bit.band(bit.rshift(bsrc[i + bit.rshift(j, 1)], 4 * bit.band(j, 1)), 15)
        local hi = bit.band(bit.rshift(bsrc[i + 8 + bit.rshift(j, 1)], 4 * bit.band(j, 1)), 15)
        out[o + 1 + j] = bit.bor(lo, bit.lshift(hi, 4))
      end
    end
  end
  local v = ffi.new("loip_tensor")
  v.data, v.dtype, v.ndim = out, K.MXFP4, 2
  v.shape[0], v.shape[1] = R, C
  return v, bytes, buf
end

return M
