-- require "loip": the runtime and its Lua modules. Submodules load on first use, so that
-- `require "loip"` stays cheap in recipes that need only a part.
local core = require "loip.core"

local loip = {
  version = core.build.version,
  abi = core.C.loip_abi_version(),
  C = core.C,
}

local submodules = {
  model = "loip.model", tokenizer = "loip.tokenizer", sampler = "loip.sampler",
  synth = "loip.synth", cpu = "loip.cpu", safetensors = "loip.safetensors",
  progress = "loip.progress", json = "loip.json", shapes = "loip.shapes",
  template = "loip.template", chat = "loip.chat", plot = "loip.plot",
  loader = "loip.loader", slice = "loip.slice", bench = "loip.bench", memory = "loip.memory",
  plan = "loip.plan", trace = "loip.trace", transport = "loip.transport",
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
