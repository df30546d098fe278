-- require "loip": the runtime and its Lua modules. Submodules load on first use, so that
-- `require "loip"` stays cheap in recipes that need only a part.
local core = require "loip.core"

local loip = {
  version = core.build.version,
  abi = core.abi_version,
  C = core.C,
}

local submodules = {
  model = "loip.model", tokenizer = "loip.text.tokenizer", sampler = "loip.model.sampler",
  synth = "loip.model.synth", safetensors = "loip.model.safetensors",
  progress = "loip.ui.progress", json = "loip.text.json", shapes = "loip.model.shapes",
  template = "loip.text.template", chat = "loip.text.chat", plot = "loip.measure.plot",
  loader = "loip.runtime.loader", slice = "loip.model.slice", bench = "loip.measure.bench", memory = "loip.runtime.memory",
  plan = "loip.plan", trace = "loip.engine.trace", transport = "loip.runtime.transport",
  policy = "loip.policy", problem = "loip.plan.problem", profile = "loip.plan.profile", steady = "loip.plan.steady",
  disk = "loip.plan.disk", calibration = "loip.plan.calibration", hub = "loip.model.hub",
  cluster = "loip.cluster", worker = "loip.cluster.device_server", testbed = "loip.cluster.testbed",
  gguf = "loip.model.gguf", pull = "loip.model.pull", sim = "loip.sim", server = "loip.serve.server",
  batcher = "loip.engine.request.batcher", client = "loip.runtime.http_client", online = "loip.engine.request.online",
  load = "loip.serve.load", openai = "loip.serve.openai", store = "loip.model.store", roofline = "loip.sim.roofline",
  tp = "loip.sim.tp", experiments = "loip.sim.experiments", space = "loip.plan.space", files = "loip.runtime.shell",
  suggest = "loip.ui.suggest", refine = "loip.plan.refine", engine = "loip.engine",
  simdraft = "loip.sim.draft", -- (speculative decoding on the simulator)
  error = "loip.error", -- (the error value code decides by: its kind, message and fields)
}
-- Not here, by design: the parts behind these (loip.core, the model formats' readers
-- loip.model.hf/llama2c/gguf_model, the tokenizer formats loip.text.tokenizers.*, the template
-- engine's parts loip.text.template.*, a cluster's parts loip.cluster.proc/rpc/members/control,
-- the engines loip.engine.local/ring/sim, loip.serve.http/metrics) and the command line
-- (loip.cli and its commands, loip.cmd.*; flags, repl).
-- (for a REPL's or a spec's listing: every name loip.<name> loads)
loip.modules = function()
  local names = {}
  for k in pairs(submodules) do names[#names + 1] = k end
  table.sort(names)
  return names
end

setmetatable(loip, {
  __index = function(t, k)
    local name = submodules[k]
    if not name then return nil end
    local mod = require(name)
    rawset(t, k, mod)
    return mod
  end,
})

return loip
