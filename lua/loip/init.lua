-- require "loip": the runtime and its Lua modules. Submodules load on first use, so that
-- `require "loip"` stays cheap in recipes that need only a part.
local core = require "loip.core"

local loip = {
  version = core.build.version,
  abi = core.C.loip_abi_version(),
  C = core.C,
}

local submodules = {
  model = "loip.model", tokenizer = "loip.text.tokenizer", sampler = "loip.model.sampler",
  synth = "loip.model.synth", safetensors = "loip.model.safetensors",
  progress = "loip.tools.progress", json = "loip.tools.json", shapes = "loip.model.shapes",
  template = "loip.text.template", chat = "loip.text.chat", plot = "loip.tools.plot",
  loader = "loip.runtime.loader", slice = "loip.model.slice", bench = "loip.tools.bench", memory = "loip.runtime.memory",
  plan = "loip.plan", trace = "loip.tools.trace", transport = "loip.runtime.transport",
  policy = "loip.policy", problem = "loip.plan.problem", profile = "loip.plan.profile",
  cluster = "loip.cluster", worker = "loip.cluster.worker", testbed = "loip.cluster.testbed",
}

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
