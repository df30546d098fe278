-- Sampling parameters (Lua) over the C sampler. A policy can replace `choose` in a recipe.
local ffi = require "ffi"
local csampler = require "loip.runtime.sampler"

local M = {}

M.defaults = { temperature = 0.8, top_k = 0, top_p = 0.95, min_p = 0, repetition_penalty = 1,
  penalty_last_n = 64 }

local Sampler = {}
Sampler.__index = Sampler

function M.new(vocab_size, opts)
  opts = opts or {}
  local seed = opts.seed or (os.time() * 1000 + math.floor(os.clock() * 1e6))
  local h, err = csampler.new(vocab_size, seed)
  if not h then error(err, 2) end
  local p = ffi.new("loip_sampler_params")
  for k, v in pairs(M.defaults) do p[k] = opts[k] == nil and v or opts[k] end
  return setmetatable({ handle = h, params = p, seed = seed, out = ffi.new("int32_t[1]") }, Sampler)
end

-- Next token from logits (float*), given the history (int32_t* of n ids).
function Sampler:sample(logits, history, n_history)
  assert(csampler.sample(self.handle, logits, self.params, history, n_history or 0, self.out, "sampler"))
  return self.out[0]
end

return M
