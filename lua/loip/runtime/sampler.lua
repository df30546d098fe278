-- The sampler (runtime/exec/sampler.c: temperature, top-k, top-p, min-p, repetition penalty over
-- a row of logits, with its own seeded stream) seen from Lua: one thin function per C call of
-- loip.h. loip.model.sampler holds the parameters and is what the rest of Lua uses.
local core = require "loip.core"
local C = core.C

local M = {}

-- A sampler over ids [0, vocab_size) drawing from seed's stream; nil, err.
function M.new(vocab_size, seed)
  return core.new("loip_sampler *", C.loip_sampler_new, C.loip_sampler_free, vocab_size, seed)
end
-- The next id from logits (float *) with params (a loip_sampler_params) and history (int32_t *
-- of n ids), into out[0] (an int32_t[1]); true, or nil, err.
function M.sample(s, logits, params, history, n, out, context)
  return core.ok(C.loip_sampler_sample(s, logits, params, history, n, out), context)
end
-- Verify k drafts (int32_t *) against k + 1 rows of logits from `logits` on: the accepted
-- drafts and the next token into out (int32_t *, room for k + 1), appended to history (int32_t
-- *, n_history an int32_t[1] that grows, up to max_history); n_out (int32_t[1]) their count.
-- true, or nil, err (loip_sampler_verify).
function M.verify(s, logits, k, drafts, params, history, n_history, max_history, out, n_out, context)
  return core.ok(C.loip_sampler_verify(s, logits, k, drafts, params, history, n_history, max_history, out, n_out), context)
end

-- Verify a tree of m drafts (int32_t *) with their parents (int32_t *: 0 the root, else a node
-- number before it) against m + 1 rows of logits: the accepted path's drafts and the next token
-- into out (room for m + 1), as M.verify (loip_sampler_verify_tree).
function M.verify_tree(s, logits, m, drafts, parents, params, history, n_history, max_history, out, n_out, context)
  return core.ok(C.loip_sampler_verify_tree(s, logits, m, drafts, parents, params, history, n_history, max_history, out, n_out),
    context)
end
function M.free(s) core.free(s, C.loip_sampler_free) end

return M
