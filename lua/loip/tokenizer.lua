-- Tokenizers: find the one a model directory ships and open it with the module for its format.
-- Every tokenizer object offers encode(text, opts) -> ids, decode(ids) -> text,
-- piece_text(prev, id) -> text of one token, vocab_size, bos_id, eos_id, path, kind, close().
local json = require "loip.json"

local M = {}

M.formats = {
  llama2c = "loip.tokenizers.llama2c", -- tokenizer.bin (llama2.c)
}

-- Open the tokenizer file at path, choosing the format by its name.
function M.open_file(path, opts)
  local mod = require(M.formats.llama2c)
  local t, err = mod.open(path, opts)
  if not t then error(err, 0) end
  return t
end

-- Find the tokenizer of a model directory (or use opts.path). Raises naming what was looked for.
function M.open(dir, opts)
  opts = opts or {}
  if opts.path then return M.open_file(opts.path, opts) end
  local candidates = { dir .. "/tokenizer.bin" }
  if opts.vocab_size then candidates[#candidates + 1] = string.format("%s/tok%d.bin", dir, opts.vocab_size) end
  for _, p in ipairs(candidates) do
    if json.exists(p) then return M.open_file(p, opts) end
  end
  error(string.format("%s: no tokenizer found (looked for %s)", dir, table.concat(candidates, ", ")), 0)
end

return M
