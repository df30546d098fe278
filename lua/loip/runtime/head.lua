-- The head (runtime/exec/head.c: a step's outputs, each sequence slot's sampler and history)
-- seen from Lua: one thin function per C call of loip.h. The local engine (loip.engine.local)
-- and sampling at the head (loip.engine.request.head_sample) use it; a ring's last device calls
-- the same C directly. The head is cdata under ffi.gc from birth; head_free is the explicit,
-- idempotent close. A runtime failure returns nil, err (context, when given, first, as core.ok).
local core = require "loip.core"
local C = core.C

local M = {}

-- A head for max_seqs slots and steps of up to max_tokens rows; nil, err.
function M.head_new(max_seqs, max_tokens) return core.new("loip_head *", C.loip_head_new, C.loip_head_free, max_seqs, max_tokens) end
function M.head_free(h) core.free(h, C.loip_head_free) end

-- Slot seq samples with p (a loip_sampler_params) and seed over ids [0, n_sample), prompt
-- (int32_t[n_prompt]) its first history (max_history ids kept).
function M.head_start(h, seq, p, seed, n_sample, prompt, n_prompt, max_history, context)
  return core.ok(C.loip_head_start(h, seq, p, seed, n_sample, prompt, n_prompt, max_history), context)
end
-- Slot seq is empty again.
function M.head_end(h, seq) C.loip_head_end(h, seq) end

-- The output rows of a step's n tokens (toks: loip_step_token[n]) into rows (int32_t[n]), those
-- flagged LOGITS first when logits_first ~= 0; n_rows and n_logits (int32_t[1]) their counts.
function M.head_rows(toks, n, logits_first, rows, n_rows, n_logits, context)
  return core.ok(C.loip_head_rows(toks, n, logits_first, rows, n_rows, n_logits), context)
end
-- The step's outputs from its rows' logits (float *, row r at logits + r * vocab) into outs
-- (loip_step_output[n_rows]) and out_rows (int32_t[n_rows], or nil), their count into n_outs
-- (int32_t[1]); drafted and accepted (int32_t[1], or nil) the drafts verified and accepted.
function M.head_outputs(h, toks, rows, n_rows, logits, vocab, outs, out_rows, n_outs, drafted, accepted, context)
  return core.ok(C.loip_head_outputs(h, toks, rows, n_rows, logits, vocab, outs, out_rows, n_outs, drafted, accepted),
    context)
end
-- Slot seq's next token from row (float *) into token (int32_t[1]), under mask (a
-- loip_grammar_matcher *, or nil); with n_top >= 0 the logprobs: logprob (double[1]), the n_top
-- most likely ids and theirs into top_ids (int32_t[n_top]) and top_logprobs (double[n_top]),
-- n_top_out (int32_t[1]) how many.
function M.head_sample(h, seq, row, mask, n_top, token, logprob, top_ids, top_logprobs, n_top_out, context)
  return core.ok(C.loip_head_sample(h, seq, row, mask, n_top, token, logprob, top_ids, top_logprobs, n_top_out), context)
end

return M
