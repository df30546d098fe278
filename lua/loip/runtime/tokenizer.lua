-- The tokenizer core (runtime/tokenizer: BPE, added tokens, pre-tokenizer splits, Unicode NFC,
-- llama2.c's scored BPE, SentencePiece model files) seen from Lua: one thin function per C call
-- of loip.h, the rest of the Lua side (loip.text.tokenizers.*) calls these rather than C.
-- Owning handles are cdata under ffi.gc from birth; *_free is the explicit, idempotent close.
-- A runtime failure returns nil, err, rc (context, when given, first, as core.ok): callers that
-- grow a buffer on LOIP_ERANGE compare rc with core.constants.ERANGE. Strings are passed with
-- their length; out-parameters are the caller's (they are reused in the hot paths).
local ffi = require "ffi"
local core = require "loip.core"
local C = core.C

local M = {}
local ok = core.ok

-- ---- Unicode
-- NFC of s into out[cap] (out nil, cap 0: measure); n_out[0] its length, same[0] 1 when s is
-- already NFC.
function M.nfc(s, out, cap, n_out, same, context) return ok(C.loip_utf8_nfc(s, #s, out, cap, n_out, same), context) end

-- ---- pre-tokenizer: regex splits
function M.pretok_new() return core.new("loip_pretok *", C.loip_pretok_new, C.loip_pretok_free) end
function M.pretok_add_split(p, pattern, behavior, flags, context)
  return ok(C.loip_pretok_add_split(p, pattern, #pattern, behavior, flags), context)
end
function M.pretok_free(p) core.free(p, C.loip_pretok_free) end

-- ---- added tokens
function M.added_new() return core.new("loip_added *", C.loip_added_new, C.loip_added_free) end
function M.added_add(a, text, id, flags, context) return ok(C.loip_added_add(a, text, #text, id, flags), context) end
-- Segments of s into seg[3 cap] (start, end, id), their count in n_out[0].
function M.added_split(a, s, skip_special, seg, cap, n_out, context)
  return ok(C.loip_added_split(a, s, #s, skip_special and 1 or 0, seg, cap, n_out), context)
end
function M.added_free(a) core.free(a, C.loip_added_free) end

-- ---- BPE
function M.bpe_new(flags) return core.new("loip_bpe *", C.loip_bpe_new, C.loip_bpe_free, flags) end
function M.bpe_free(b) core.free(b, C.loip_bpe_free) end
function M.bpe_size(b) return tonumber(C.loip_bpe_size(b)) end
-- The encode cache of b: its entries, and the bytes of text it answered and was asked for.
function M.bpe_cache_stats(b)
  local e, hit, total = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  C.loip_bpe_cache_stats(b, e, hit, total)
  return tonumber(e[0]), tonumber(hit[0]), tonumber(total[0])
end
function M.bpe_add_token(b, piece, id, score, flags, context)
  return ok(C.loip_bpe_add_token(b, piece, #piece, id, score, flags), context)
end
-- Merges as text lines ("left right"), from line first_line on.
function M.bpe_add_merges(b, text, first_line, context) return ok(C.loip_bpe_add_merges(b, text, #text, first_line), context) end
-- The vocabulary / merges JSON value at text[start, end) (bpe_json_spans finds them).
function M.bpe_add_vocab_json(b, text, first, last, context) return ok(C.loip_bpe_add_vocab_json(b, text, first, last), context) end
function M.bpe_add_merges_json(b, text, first, last, context) return ok(C.loip_bpe_add_merges_json(b, text, first, last), context) end
function M.bpe_json_spans(text, spans, context) return ok(C.loip_bpe_json_spans(text, #text, spans), context) end
function M.bpe_add_tiktoken(b, text, context) return ok(C.loip_bpe_add_tiktoken(b, text, #text), context) end
function M.bpe_derive_merges(b, how, context) return ok(C.loip_bpe_derive_merges(b, how), context) end
function M.bpe_set_unk(b, id, context) return ok(C.loip_bpe_set_unk(b, id), context) end
-- The id of a stored piece, or -1.
function M.bpe_lookup(b, piece) return C.loip_bpe_lookup(b, piece, #piece) end
-- The stored piece of id into piece[0], len[0]; nil for ids without one.
function M.bpe_piece(b, id, piece, len) return C.loip_bpe_piece(b, id, piece, len) == 0 or nil end
-- Ids of s into ids[cap] (pretok: its splits, or nil), their count in n_out[0].
function M.bpe_encode(b, pretok, s, ids, cap, n_out, context)
  return ok(C.loip_bpe_encode(b, pretok, s, #s, ids, cap, n_out), context)
end

-- ---- llama2.c's scored BPE (tokenizer.bin)
function M.scoredbpe_open(path, vocab_size)
  return core.new("loip_scoredbpe *", C.loip_scoredbpe_open, C.loip_scoredbpe_free, path, vocab_size)
end
function M.scoredbpe_size(t) return tonumber(C.loip_scoredbpe_size(t)) end
function M.scoredbpe_piece(t, id, piece, len, score, context) return ok(C.loip_scoredbpe_piece(t, id, piece, len, score), context) end
function M.scoredbpe_encode(t, text, bos, eos, ids, cap, n_out, context)
  return ok(C.loip_scoredbpe_encode(t, text, #text, bos and 1 or 0, eos and 1 or 0, ids, cap, n_out), context)
end
function M.scoredbpe_free(t) core.free(t, C.loip_scoredbpe_free) end

-- ---- SentencePiece model files
function M.spm_open(path) return core.new("loip_spm *", C.loip_spm_open, C.loip_spm_free, path) end
function M.spm_size(m) return tonumber(C.loip_spm_size(m)) end
-- A field (LOIP_SPM_*) into value[0].
function M.spm_get(m, field, value, context) return ok(C.loip_spm_get(m, field, value), context) end
function M.spm_normalizer_name(m) return ffi.string(C.loip_spm_normalizer_name(m)) end
function M.spm_piece(m, id, piece, len, score, ty, context) return ok(C.loip_spm_piece(m, id, piece, len, score, ty), context) end
function M.spm_free(m) core.free(m, C.loip_spm_free) end

return M
