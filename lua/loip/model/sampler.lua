-- Sampling parameters (Lua) over the C sampler. A policy can replace `choose` in a recipe.
local ffi = require "ffi"
local csampler = require "loip.runtime.sampler"

local M = {}

M.defaults = { temperature = 0.8, top_k = 0, top_p = 0.95, min_p = 0, repetition_penalty = 1,
  penalty_last_n = 64 }

local Sampler = {}
Sampler.__index = Sampler

-- The C parameters of opts (a loip_sampler_params: opts' fields over M.defaults) and the seed
-- (opts.seed, else one from the clock).
function M.params(opts)
  opts = opts or {}
  local seed = opts.seed or (os.time() * 1000 + math.floor(os.clock() * 1e6))
  local p = ffi.new("loip_sampler_params")
  for k, v in pairs(M.defaults) do p[k] = opts[k] == nil and v or opts[k] end
  return p, seed
end

function M.new(vocab_size, opts)
  local p, seed = M.params(opts)
  local h, err = csampler.new(vocab_size, seed)
  if not h then error(err, 2) end
  return setmetatable({ handle = h, params = p, seed = seed, out = ffi.new("int32_t[1]") }, Sampler)
end

-- Next token from logits (float*), given the history (int32_t* of n ids).
function Sampler:sample(logits, history, n_history)
  assert(csampler.sample(self.handle, logits, self.params, history, n_history or 0, self.out, "sampler"))
  return self.out[0]
end

-- Verify drafts (a Lua list of ids) against #drafts + 1 rows of logits from `logits` on, the
-- history (int32_t * of n ids, room for cap): the tokens (the accepted drafts, then the next one:
-- loip_sampler_verify) as a list, and the history's new length.
-- parents (tree mode): each draft's parent (0 the root, else a draft's number before it): the
-- drafts are a tree's nodes, verified by loip_sampler_verify_tree.
function Sampler:verify(logits, drafts, history, n_history, cap, parents)
  local k = #drafts
  if not self.vbuf or self.vcap < k + 1 then
    self.vcap = math.max(k + 1, 16)
    self.vbuf, self.vout, self.vpar = ffi.new("int32_t[?]", self.vcap), ffi.new("int32_t[?]", self.vcap), ffi.new("int32_t[?]", self.vcap)
    self.vn, self.vnh = ffi.new("int32_t[1]"), ffi.new("int32_t[1]")
  end
  for j = 1, k do self.vbuf[j - 1] = drafts[j] end
  self.vnh[0] = n_history
  if parents then
    for j = 1, k do self.vpar[j - 1] = parents[j] end
    assert(csampler.verify_tree(self.handle, logits, k, self.vbuf, self.vpar, self.params, history, self.vnh, cap, self.vout,
      self.vn, "sampler"))
  else
    assert(csampler.verify(self.handle, logits, k, self.vbuf, self.params, history, self.vnh, cap, self.vout, self.vn, "sampler"))
  end
  local out = {}
  for j = 0, self.vn[0] - 1 do out[j + 1] = self.vout[j] end
  return out, self.vnh[0]
end

return M
