-- What the pure-Lua references (spec/support/*_reference.lua) share: double-precision RMSNorm,
-- matrix-vector product and SiLU over 0-based tables or float views, and the F32 weights of a
-- Hugging Face directory's safetensors by name. Written from the definitions, never from loip's
-- kernels (the references check those).
--
--   local rm = require "spec.support.reference_math"
--   local w = rm.f32_weights(set)          -- w(name[, optional]): a const float * view
--   local y = rm.matvec(w("q.weight"), x, rows, cols, w("q.bias", true))
local ffi = require "ffi"
local core = require "loip.core"

local M = {}

-- RMSNorm of x (n values) by w; plus_one: by (1 + w), as Gemma's.
function M.rmsnorm(x, w, n, eps, plus_one)
  local ss = 0
  for i = 0, n - 1 do ss = ss + x[i] * x[i] end
  local s = 1 / math.sqrt(ss / n + eps)
  local out = {}
  for i = 0, n - 1 do out[i] = x[i] * s * (plus_one and 1 + w[i] or w[i]) end
  return out
end

-- W (rows x cols, row-major) . x (+ bias)
function M.matvec(W, x, rows, cols, bias)
  local out = {}
  for r = 0, rows - 1 do
    local acc, row = bias and bias[r] or 0, r * cols
    for c = 0, cols - 1 do acc = acc + W[row + c] * x[c] end
    out[r] = acc
  end
  return out
end

function M.silu(v) return v / (1 + math.exp(-v)) end

-- w(name, optional): tensor `name` of the open safetensors set as a const float * (kept), an
-- error unless it is F32; a missing tensor is nil when optional, else an error naming it.
function M.f32_weights(set)
  local views = {}
  return function(name, optional)
    if views[name] == nil then
      local f = set.index[name]
      if not f and optional then return nil end
      local v = assert(assert(f, name):view(name))
      assert(v.dtype == core.constants.F32, name .. ": the reference reads F32 weights")
      views[name] = ffi.cast("const float *", v.data)
    end
    return views[name]
  end
end

return M
