-- fuzz_manifest: a slice store's manifest.json (loip.model.store.check_manifest, as
-- read_manifest checks it: files, tensors, offsets, checksums), then the model config it
-- carries (loip.model.store.config: Hugging Face's config.json rules).
local json = require "loip.text.json"
local store = require "loip.model.store"
return function(data)
  local man = json.decode(data, "manifest.json")
  if man == nil then return end
  store.check_manifest(man, "fuzz-store")
  store.config("fuzz-store", man)
end
