-- The F32 model an FP8 checkpoint stands for (spec helper): a Hugging Face directory out with
-- every tensor of dir's model as float32, each F8_E4M3 weight its E4M3 values times their block's
-- weight_scale_inv (loip_dequantize of the packed form), the scales gone, and config.json
-- without its quantization_config. For the comparisons of issue 38 (loip's FP8 model against
-- the dequantized one, and that one against llama.cpp).
local ffi = require "ffi"
local json = require "loip.text.json"
local safetensors = require "loip.model.safetensors"
local fp8 = require "loip.model.fp8"
local exec = require "loip.runtime.exec"
local memory = require "loip.runtime.memory"
local K = require("loip.core").constants
local T = require "spec.support"

local M = {}

local float_dtype = { F32 = K.F32, BF16 = K.BF16, F16 = K.F16 }

function M.write(dir, out)
  local cfg = assert(json.load(dir .. "/config.json"))
  local set = assert(safetensors.open_dir(dir))
  local tensors = {}
  for _, f in ipairs(set.files) do
    for name, t in pairs(f.tensors) do
      if not name:match("_scale_inv$") then
        local n = 1
        for _, d in ipairs(t.shape) do n = n * d end
        local vals = ffi.new("float[?]", n)
        if t.dtype == "F8_E4M3" then
          local v, bytes, buf = fp8.pack(set, f, name, cfg)
          assert(v, bytes)
          assert(exec.dequantize(vals, v.data, K.F8_E4M3, t.shape[1], t.shape[2], name))
          memory.buffer_free(buf)
        else
          assert(float_dtype[t.dtype], name .. ": " .. t.dtype)
          assert(exec.dequantize(vals, f.data + t.offset, float_dtype[t.dtype], 1, n, name))
        end
        tensors[name] = { dtype = "F32", shape = t.shape, data = ffi.string(vals, n * 4) }
      end
    end
  end
  safetensors.close(set)
  os.execute("mkdir -p '" .. out .. "'")
  T.safetensors(out .. "/model.safetensors", tensors)
  cfg.quantization_config, cfg.torch_dtype = nil, "float32"
  T.write(out .. "/config.json", json.encode_sorted(cfg, 2))
  for _, f in ipairs({ "tokenizer.bin", "generation_config.json" }) do
    if T.exists(dir .. "/" .. f) then T.write(out .. "/" .. f, T.read(dir .. "/" .. f)) end
  end
  return out
end

return M
