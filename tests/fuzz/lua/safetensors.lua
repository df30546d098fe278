-- fuzz_safetensors: the safetensors reader (loip.model.safetensors.open) on a file of the
-- input's bytes: the 8-byte header length, the JSON header, every tensor's dtype, shape and
-- data_offsets against the file; then each tensor's view.
local safetensors = require "loip.model.safetensors"
return function(data)
  local f = safetensors.open(loip_fuzz_file(data))
  if not f then return end
  for name in pairs(f.tensors) do pcall(f.view, f, name) end
  f:close()
end
