-- fuzz_llama2c: the llama2.c checkpoint reader (loip.model.llama2c.open) on a file of the
-- input's bytes: the 28-byte header's sizes, then every array against the file's length.
local llama2c = require "loip.model.llama2c"
return function(data)
  local cfg, facts, map = llama2c.open(loip_fuzz_file(data))
  if map then require("loip.core").free(map, require("loip.core").C.loip_mapping_free) end
end
