-- fuzz_gguf: the GGUF reader (loip.model.gguf.open) on a file of the input's bytes: the magic,
-- version and counts, every metadata value (arrays of arrays too), every tensor's name,
-- dimensions, type and offset against the file; then each tensor's bytes.
local gguf = require "loip.model.gguf"
return function(data)
  local g = gguf.open(loip_fuzz_file(data))
  for _, name in ipairs(g.order) do g:data(name) end
  g:close()
end
