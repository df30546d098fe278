-- `loip slice`: convert a model into a slice store (per-block files), or --verify one.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"

local M = {
  brief = "convert a model into a slice store (per-block files), or --verify one",
  usage = "loip slice [--force] MODEL_DIR OUT_DIR\n       loip slice --verify STORE [MODEL_DIR]",
  positional = { "MODEL_DIR|STORE", "OUT_DIR|MODEL_DIR" },
  summary = "Convert a Hugging Face model directory (or a GGUF file, or a llama2.c checkpoint) into a slice store: one\n"
    .. "4 KiB-aligned file per layer block (MHA, MLP), embedding and head, the tokenizer files, and a\n"
    .. "manifest with shapes, offsets and sha256s, written last. Weights keep their dtype and bytes.\n"
    .. "--verify re-hashes every file of a store (and, given MODEL_DIR, checks it was sliced from it).",
  flags = {
    { "verify", "bool", "check every file of STORE against its manifest's sha256" },
    { "force", "bool", "replace OUT_DIR's store even when it holds another model" },
  },
}

function M.run(o, pos)
  local slice = require "loip.model.slice"
  local human = require("loip.ui.progress").human
  if o.verify then
    if not pos[1] or pos[3] then common.usage("slice", "--verify STORE [MODEL_DIR]") end
    local r = slice.verify(pos[1], { source = pos[2] })
    print(string.format("%s: %d files verified (%s)%s", pos[1], r.files, human(r.bytes),
      pos[2] and (", sliced from " .. pos[2]) or ""))
    return 0
  end
  if not pos[2] or pos[3] then common.usage("slice", "MODEL_DIR OUT_DIR (see --help)") end
  local man = slice.write(pos[1], pos[2], { force = o.force })
  local function count(n, what) return string.format("%d %s%s", n, what, n == 1 and "" or "s") end
  print(string.format("%s: %s, %s, %s; source sha256 %s", pos[2], count(#man.files, "block file"),
    count(#man.model_files, "other file"), human(man.total_bytes), man.source.sha256))
  return 0
end

return M
