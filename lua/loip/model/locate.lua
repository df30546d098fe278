-- What a path holds, for opening it: a slice store, a Hugging Face directory, a GGUF file (or the
-- one in a directory) or a llama2.c checkpoint; read from its files' names, without loading it.
local json = require "loip.text.json"
local shell = require "loip.runtime.shell"

local M = {}

local function basename(p) return (p:gsub("/+$", ""):match("([^/]+)$")) end
local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end
local function is_file(p) return json.exists(p) end

-- What to open: ("store", dir), ("hf", dir), ("gguf", file: a .gguf, or the one in dir) or
-- ("llama2c", checkpoint path, tokenizer dir).
function M.locate(path)
  path = path:gsub("/+$", "")
  if is_file(path .. "/manifest.json") then return "store", path end
  if is_file(path .. "/config.json") then return "hf", path end
  if path:match("%.bin$") and is_file(path) then return "llama2c", path, dirname(path) end
  if path:match("%.gguf$") and is_file(path) then return "gguf", path end
  for _, name in ipairs({ "model.bin", basename(path) .. ".bin" }) do
    if is_file(path .. "/" .. name) then return "llama2c", path .. "/" .. name, path end
  end
  local ggufs = M.gguf_files(path)
  if #ggufs == 1 then return "gguf", path .. "/" .. ggufs[1] end
  if #ggufs > 1 then
    error(string.format("%s: holds %d GGUF files (%s): name the one to run", path, #ggufs, table.concat(ggufs, ", ")), 0)
  end
  -- loip slice writes the manifest last: block files without it are an unfinished store.
  if is_file(path .. "/embed.bin") or is_file(path .. "/layer-000-mha.bin") then
    error(string.format("%s: an incomplete slice store (no manifest.json: loip slice was interrupted or failed); re-run `loip slice MODEL_DIR %s`",
      path, path), 0)
  end
  error(string.format("%s: not a model (no manifest.json, config.json, model.bin, %s.bin or .gguf file)", path, basename(path)), 0)
end
local locate = M.locate

-- The model .gguf files in directory dir, sorted (a store's tokenizer.gguf is not one).
function M.gguf_files(dir)
  local out = {}
  for _, name in ipairs(shell.list(dir) or {}) do
    if name:match("%.gguf$") and name ~= "tokenizer.gguf" then out[#out + 1] = name end
  end
  table.sort(out)
  return out
end

return M
