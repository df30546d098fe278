-- fuzz_config: a Hugging Face config.json (loip.model.hf.parse_config): architectures, sizes,
-- rope scaling, tied embeddings, token ids.
local json = require "loip.text.json"
local hf = require "loip.model.hf"
return function(data)
  local cfg = json.decode(data, "config.json")
  if cfg == nil then return end
  hf.parse_config(cfg, "config.json")
end
