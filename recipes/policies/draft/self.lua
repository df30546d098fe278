-- The target's own first layers and its output head as the draft (LayerSkip's early exit,
-- SpecExec's and Draft&Verify's self-speculation): useful where no small sibling exists. It is
-- read from the same store and run in the head's process, its weights and KV cache charged to
-- a budget of its own (mem). layers=all makes the draft the whole target: every draft is
-- accepted, the check that verifying k + 1 rows costs about one step. A speculative decoding
-- draft (loip.policy kind "draft"):
--   loip generate --model s260k --devices 3 ... --draft self:layers=all --draft-tokens 4
-- tree=on (width, levels): a tree of drafts verified in one step (loip.engine.request.tree).
local draft_mod = require "loip.cluster.draft"

local M = { name = "self" }
local drafter = require "loip.engine.request.drafter"

M.settings = {
  { "layers", "string", "the target's first layers the draft runs: a count, or all", default = "all",
    check = function(v) return v == "all" or (tonumber(v) ~= nil and tonumber(v) >= 1 and tonumber(v) == math.floor(tonumber(v))),
      "must be a whole number >= 1, or all" end },
  { "mem", "string", "a memory budget for the draft's weights and KV cache (a size such as 64M; empty: none)", default = "" },
}
drafter.settings(M.settings) -- (device, tree, width, levels)
M.per_request = drafter.PER_REQUEST -- (a request may change these: they load nothing; loip.serve.request_draft)

local function layers_of(o) return o.layers ~= "all" and tonumber(o.layers) or nil end

-- The bytes the draft takes where it runs (weights of its layers, its KV cache and scratch).
function M.memory(t, o)
  return drafter.bytes(t.path, { layers = layers_of(o), context = t.context, max_seqs = t.max_seqs, batch = drafter.batch_for(o) })
end

function M.open(ctx, o)
  local t = ctx.target
  if not t.path then error("draft self: the target's store is not known here", 0) end
  if t.draft_device then -- on a device of the cluster, from its own copy of the store
    ctx.drafter = draft_mod.open(t.cluster, t.draft_device, { layers = layers_of(o), context = t.context,
      max_seqs = t.max_seqs, batch = drafter.batch_for(o) })
    return
  end
  if o.device ~= "head" and not t.cluster then error("--draft-device: one device runs its draft in its own process (head)", 0) end
  ctx.drafter = drafter.open(t.path, { layers = layers_of(o), context = t.context, max_seqs = t.max_seqs,
    mem = o.mem ~= "" and o.mem or nil, tokenizer = false, threads = 1, batch = drafter.batch_for(o) })
end

-- propose, propose_tree, finish, close: a drafter's (ctx.drafter), as every model draft's
drafter.policy(M)

return M
