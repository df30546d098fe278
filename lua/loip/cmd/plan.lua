-- `loip plan`: print the plan a scheduler chooses for N devices and its predicted time, running nothing.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local flags = require "loip.ui.flags"

local M = {
  brief = "print the plan a scheduler chooses for N devices and its predicted time, running nothing",
  usage = "loip plan (--model STORE|DIR | --like NAME [shape flags]) --devices N [--mem a,b,...] [flags]",
  summary = "Print the plan a scheduler chooses for a model on N devices, and its predicted time per token by\n"
    .. "device (compute, loading, uncovered loading, communication, memory), without running anything.\n"
    .. "--like plans a model's shape with no weights (loip synth --list names them).",
  flags = flags.rows({
    { "model", "string", "a slice store or a model directory", metavar = "STORE|DIR" },
    { "like", "string", "plan a named shape with no weights instead (e.g. llama-3.3-70b)", metavar = "NAME" },
    { "dtype", "string", "with --like: the weights' dtype (bf16, f16, f32)", default = "bf16" },
  }, flags.shape_flags("with --like: "), {
    { "devices", "int", "devices", default = 1, metavar = "N", check = function(v) return v >= 1 and v <= 64, "must be in 1..64" end },
    { "mem", "string", "each device's memory budget, e.g. 600M,400M,400M (one: the same for all; default unlimited)",
      metavar = "BYTES[,BYTES...]" },
    flags.shared.disk_rate, flags.shared.slowdown, flags.shared.link_rate, flags.shared.link_delay, flags.shared.profile,
    { "device-profile", "string", "devices one does not own, from published figures: recipes/policies/device names, one or one per "
      .. "device (e.g. jetson-agx-orin-64gb,jetson-xavier-nx-16gb); budgets default to their memory less what the OS keeps",
      metavar = "NAME[,NAME...]" },
    { "context", "int", "KV cache positions planned for (default: min(model max, 4096), as generate and serve run)", check = function(v) return v > 0, "must be > 0" end },
    { "batch", "int", "tokens per message: prefill chunks and decoding requests (activations are sized for it)", default = 64,
      check = function(v) return v > 0, "must be > 0" end },
    { "max-batch", "int", "requests decoding at once (loip serve's --max-batch): the KV cache of each, a micro-batch of them per step",
      default = 1, check = function(v) return v >= 1, "must be >= 1" end },
    { "kv-tokens", "int", "KV cache positions the requests share (default: context x max-batch)",
      check = function(v) return v > 0, "must be > 0" end },
    { "threads", "int", "compute threads per device (for a calibration; 0: this machine's CPUs split among --devices, "
      .. "as loip generate --devices N gives its local devices)", default = 0, check = function(v) return v >= 0, "must be >= 0" end },
    flags.shared.stages, flags.shared.ends, flags.shared.scheduler, flags.shared.cost_model, flags.shared.save_plan,
    { "json", "bool", "print one JSON object: plan, estimate_ms_per_token, devices, scheduler_ms" },
  }),
}

function M.run(o)
  local policy = require "loip.policy"
  local plan = require "loip.plan"
  local prob, sizes = common.problem_of("plan", o)
  local n = o.devices
  local p, est, info = policy.plan(prob, { scheduler = o.scheduler, cost = o.cost_model })
  if o.save_plan then plan.save(o.save_plan, p) end
  common.report(p, est, info, sizes, require("loip.plan.space").memory_opts(prob), o.json, { model = o.model or o.like, devices_count = n })
  return 0
end

return M
