-- `loip synth`: write a random-weight model with a real model's shapes.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local flags = require "loip.ui.flags"

local M = {
  brief = "write a random-weight model with a real model's shapes",
  usage = "loip synth --like NAME [--dtype bf16] [flags] OUT_DIR",
  positional = { "OUT_DIR" },
  summary = "Write a random-weight (seeded) Hugging Face model directory with the exact shapes of a named\n"
    .. "model, plus a tokenizer.bin it can be run with (or --tokenizer's file). Shapes can be overridden.",
  flags = flags.rows({
    { "like", "string", "shape to copy (see --list)", metavar = "NAME" },
    { "dtype", "string", "weight dtype: bf16, f16, f32", default = "bf16" },
    { "experts-dtype", "string", "a mixture of experts released so (gpt-oss): mxfp4 writes its experts as MXFP4 blocks and scales" },
    { "weights-dtype", "string", "fp8: the layers' Linear weights as an FP8 checkpoint's (E4M3, float32 scales per 128x128 block)" },
    { "seed", "int", "random seed", default = 1 },
    { "std", "number", "standard deviation of the random weights", default = 0.02,
      check = function(v) return v >= 0, "must be >= 0" end },
  }, flags.shape_flags(""), {
    { "tokenizer", "string", "a tokenizer file to copy in instead of the made-up tokenizer.bin (tiktoken ranks, "
      .. "SentencePiece, tokenizer.json, tokenizer.bin), e.g. models/o200k-harmony/o200k_base.tiktoken for gpt-oss", metavar = "FILE" },
    { "shard-size", "bytes", "largest safetensors shard", default = 5 * 1024 ^ 3 },
    { "force", "bool", "replace OUT_DIR's model files if they exist" },
    { "list", "bool", "list the known shapes" },
  }),
}

function M.run(o, pos)
  local synth = require "loip.model.synth"
  if o.list then
    for _, name in ipairs(require("loip.model.shapes").names()) do print(name) end
    return 0
  end
  if not o.like then common.usage("synth", "--like NAME is required (see --list)") end
  if not pos[1] then common.usage("synth", "OUT_DIR is required") end
  synth.write(pos[1], o)
  return 0
end

return M
