-- fuzz_gguf: the GGUF reader (loip.model.gguf.open) on a file of the input's bytes: the magic,
-- version and counts, every metadata value (arrays of arrays too), every tensor's name,
-- dimensions, type and offset against the file; then each tensor's bytes; then what loip
-- builds from a header it accepted: the tokenizer of its metadata (when it names one) and
-- the model's config and weights (loip.model.gguf_model).
local gguf = require "loip.model.gguf"
local gguf_model = require "loip.model.gguf_model"
local gguf_tokenizer = require "loip.text.tokenizers.gguf"
return function(data)
  local path = loip_fuzz_file(data)
  local g = gguf.open(path)
  for _, name in ipairs(g.order) do g:data(name) end
  local ok, err = pcall(function()
    if g.metadata["tokenizer.ggml.model"] ~= nil then gguf_tokenizer.open(path):close() end
    gguf_model.tensors(g, gguf_model.config(g))
  end)
  g:close()
  if not ok then error(err, 0) end
end
