-- The grammar matcher (runtime/grammar: rules over bytes, a tokenizer's vocabulary as a trie,
-- token masks) seen from Lua: one thin function per C call of loip.h; loip.text.grammar calls
-- these rather than C. Owning handles are cdata under ffi.gc from birth; *_free is the
-- explicit, idempotent close. A runtime failure returns nil, err, rc (context, when given,
-- first, as core.ok).
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}
local ok = core.ok

M.SET = core.constants.GRAMMAR_SET
M.REF = core.constants.GRAMMAR_REF

-- ir: int32_t[n_ir] (loip.h's layout), sets: uint8_t[32 n_sets], names: '\n'-joined or nil.
function M.new(ir, n_ir, sets, n_sets, root, names)
  return core.new("loip_grammar *", C.loip_grammar_new, C.loip_grammar_free, ir, n_ir, sets, n_sets, root, names)
end
function M.free(g) core.free(g, C.loip_grammar_free) end

-- bytes: every token's bytes, offsets: int64_t[n + 1], excluded: uint8_t[n].
function M.vocab_new(bytes, offsets, excluded, n)
  return core.new("loip_grammar_vocab *", C.loip_grammar_vocab_new, C.loip_grammar_vocab_free, bytes,
    offsets, excluded, n)
end
function M.vocab_free(v) core.free(v, C.loip_grammar_vocab_free) end
function M.vocab_size(v) return tonumber(C.loip_grammar_vocab_size(v)) end
function M.vocab_nodes(v) return tonumber(C.loip_grammar_vocab_nodes(v)) end

-- stop: int32_t[n_stop].
function M.matcher_new(g, v, stop, n_stop)
  return core.new("loip_grammar_matcher *", C.loip_grammar_matcher_new, C.loip_grammar_matcher_free, g, v,
    stop, n_stop)
end
function M.matcher_clone(m)
  return core.new("loip_grammar_matcher *", C.loip_grammar_matcher_clone, C.loip_grammar_matcher_free, m)
end
function M.matcher_free(m) core.free(m, C.loip_grammar_matcher_free) end
function M.mask(m, bits, n_words, context) return ok(C.loip_grammar_matcher_mask(m, bits, n_words), context) end
function M.apply(m, logits, n, context) return ok(C.loip_grammar_matcher_apply(m, logits, n), context) end
function M.accept(m, id, context) return ok(C.loip_grammar_matcher_accept(m, id), context) end
function M.accept_bytes(m, s, context) return ok(C.loip_grammar_matcher_accept_bytes(m, s, #s), context) end
function M.can_end(m) return C.loip_grammar_matcher_can_end(m) == 1 end
function M.must_end(m) return C.loip_grammar_matcher_must_end(m) == 1 end
function M.cache_stats(m)
  local e, b = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  C.loip_grammar_matcher_cache_stats(m, e, b)
  return tonumber(e[0]), tonumber(b[0])
end

return M
