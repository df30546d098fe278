-- SentencePiece tokenizer.model (Llama 2, Mistral, TinyLlama...): the pieces, scores and types
-- of the protobuf (read in C), with SentencePiece's BPE: the text is normalized as a whole
-- (malformed UTF-8 -> U+FFFD, extra white space removed when asked, the dummy prefix, " " ->
-- "▁"), then the adjacent pair whose concatenation is a piece with the highest score merges
-- first, leftmost among equals; characters without a piece become <0xXX> byte pieces (byte
-- fallback) or <unk>. Decoding follows SentencePiece's DecodeIds.
--
-- Only model_type BPE, and only the "identity" normalization (no precompiled_charsmap) are
-- supported. User-defined pieces are found in the normalized text first and never split;
-- unused pieces merge like normal ones (SentencePiece re-splits them afterwards; Llama 2's
-- vocabulary has none). As transformers' LlamaTokenizer does, <s>, </s> and <unk> written in
-- the text are those tokens unless encode is given parse_special = false (SentencePiece
-- itself treats them as text).
local core = require "loip.core"
local ffi = require "ffi"
local bpe = require "loip.text.tokenizers.bpe"
local C = core.C

local M = {}

local types = { [C.LOIP_SPM_UNKNOWN] = "unknown", [C.LOIP_SPM_CONTROL] = "control",
  [C.LOIP_SPM_BYTE] = "byte", [C.LOIP_SPM_USER_DEFINED] = "user", [C.LOIP_SPM_UNUSED] = "unused" }
local model_types = { "unigram", "BPE", "word", "char" }

function M.open(path, opts)
  local m, err = core.new("loip_spm *", C.loip_spm_open, C.loip_spm_free, path)
  if not m then error(err, 0) end
  local v = ffi.new("int32_t[1]")
  local function get(field)
    core.check(C.loip_spm_get(m, field, v), path)
    return v[0]
  end
  local model_type = get(C.LOIP_SPM_MODEL_TYPE)
  if model_type ~= 2 then
    core.free(m, C.loip_spm_free)
    error(string.format("%s: SentencePiece model type %s is not supported (only BPE)", path,
      model_types[model_type] or tostring(model_type)), 0)
  end
  local name = ffi.string(C.loip_spm_normalizer_name(m))
  if get(C.LOIP_SPM_CHARSMAP_BYTES) > 0 then
    core.free(m, C.loip_spm_free)
    error(string.format("%s: SentencePiece normalizer %q (a precompiled charsmap) is not supported; "
      .. "only identity", path, name), 0)
  end
  local info = {
    byte_fallback = get(C.LOIP_SPM_BYTE_FALLBACK) ~= 0,
    unk_id = get(C.LOIP_SPM_UNK_ID), bos_id = get(C.LOIP_SPM_BOS_ID), eos_id = get(C.LOIP_SPM_EOS_ID),
    add_dummy_prefix = get(C.LOIP_SPM_ADD_DUMMY_PREFIX) ~= 0,
    remove_extra_whitespaces = get(C.LOIP_SPM_REMOVE_EXTRA_WHITESPACES) ~= 0,
    escape_whitespaces = get(C.LOIP_SPM_ESCAPE_WHITESPACES) ~= 0,
    treat_whitespace_as_suffix = get(C.LOIP_SPM_TREAT_WHITESPACE_AS_SUFFIX) ~= 0,
    normalizer = name,
  }
  local n = C.loip_spm_size(m)
  local piece, len, score, ty = ffi.new("const char *[1]"), ffi.new("int32_t[1]"), ffi.new("float[1]"),
    ffi.new("int32_t[1]")
  local ok, tok = pcall(M.build, path, n, info, function(id)
    core.check(C.loip_spm_piece(m, id, piece, len, score, ty), path)
    return ffi.string(piece[0], len[0]), score[0], ty[0]
  end)
  core.free(m, C.loip_spm_free)
  if not ok then error(tok, 0) end
  return tok
end

-- The tokenizer of n SentencePiece pieces: piece(id) -> text, score, type (the protobuf's numbers:
-- 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; GGUF's token_type uses the
-- same); info as the fields of the model's trainer and normalizer specs (byte_fallback, unk_id,
-- bos_id, eos_id, add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces,
-- treat_whitespace_as_suffix). kind names the format.
function M.build(path, n, info, piece, kind)
  local h = bpe.bpe(info.byte_fallback and C.LOIP_BPE_BYTE_FALLBACK or 0, path)
  local piece_type, user, added = {}, {}, {}
  for id = 0, n - 1 do
    local text, score, ty = piece(id)
    local k = types[ty]
    piece_type[id] = k
    local unmatched = (k == "unknown" or k == "control" or k == "byte") and C.LOIP_BPE_PIECE_UNMATCHED or 0
    core.check(C.loip_bpe_add_token(h, text, #text, id, score, unmatched), path)
    if k == "user" then user[#user + 1] = { content = text, id = id } end
    if (k == "control" or k == "unknown") and text ~= "" then added[#added + 1] = { content = text, id = id, special = true } end
  end
  core.check(C.loip_bpe_derive_merges(h, C.LOIP_BPE_MERGES_BY_SCORE), path)
  if info.unk_id and info.unk_id >= 0 and info.unk_id < n then core.check(C.loip_bpe_set_unk(h, info.unk_id), path) end
  local valid = function(id) return id and id >= 0 and id < n and id or nil end
  return bpe.new({
    path = path, kind = kind or "sentencepiece", bpe = h, added = added, user_defined = user,
    sanitize = true, spelling = "raw", decoder = "spm", spm_info = info, piece_type = piece_type,
    normalizers = { { type = "spm", add_dummy_prefix = info.add_dummy_prefix,
      remove_extra_whitespaces = info.remove_extra_whitespaces, escape_whitespaces = info.escape_whitespaces,
      treat_whitespace_as_suffix = info.treat_whitespace_as_suffix } },
    bos_id = valid(info.bos_id), eos_id = valid(info.eos_id),
    prefix_ids = valid(info.bos_id) and { info.bos_id } or {},
  })
end

return M
