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
local tk = require "loip.runtime.tokenizer"
local K = core.constants

local M = {}

local types = { [K.SPM_UNKNOWN] = "unknown", [K.SPM_CONTROL] = "control",
  [K.SPM_BYTE] = "byte", [K.SPM_USER_DEFINED] = "user", [K.SPM_UNUSED] = "unused" }
local model_types = { "unigram", "BPE", "word", "char" }

function M.open(path, opts)
  local m, err = tk.spm_open(path)
  if not m then error(err, 0) end
  local v = ffi.new("int32_t[1]")
  local function get(field)
    assert(tk.spm_get(m, field, v, path))
    return v[0]
  end
  local model_type = get(K.SPM_MODEL_TYPE)
  if model_type ~= 2 then
    tk.spm_free(m)
    error(string.format("%s: SentencePiece model type %s is not supported (only BPE)", path,
      model_types[model_type] or tostring(model_type)), 0)
  end
  local name = tk.spm_normalizer_name(m)
  if get(K.SPM_CHARSMAP_BYTES) > 0 then
    tk.spm_free(m)
    error(string.format("%s: SentencePiece normalizer %q (a precompiled charsmap) is not supported; "
      .. "only identity", path, name), 0)
  end
  local info = {
    byte_fallback = get(K.SPM_BYTE_FALLBACK) ~= 0,
    unk_id = get(K.SPM_UNK_ID), bos_id = get(K.SPM_BOS_ID), eos_id = get(K.SPM_EOS_ID),
    add_dummy_prefix = get(K.SPM_ADD_DUMMY_PREFIX) ~= 0,
    remove_extra_whitespaces = get(K.SPM_REMOVE_EXTRA_WHITESPACES) ~= 0,
    escape_whitespaces = get(K.SPM_ESCAPE_WHITESPACES) ~= 0,
    treat_whitespace_as_suffix = get(K.SPM_TREAT_WHITESPACE_AS_SUFFIX) ~= 0,
    normalizer = name,
  }
  local n = tk.spm_size(m)
  local piece, len, score, ty = ffi.new("const char *[1]"), ffi.new("int32_t[1]"), ffi.new("float[1]"),
    ffi.new("int32_t[1]")
  local ok, tok = pcall(M.build, path, n, info, function(id)
    assert(tk.spm_piece(m, id, piece, len, score, ty, path))
    return ffi.string(piece[0], len[0]), score[0], ty[0]
  end)
  tk.spm_free(m)
  if not ok then error(tok, 0) end
  return tok
end

-- The tokenizer of n SentencePiece pieces: piece(id) -> text, score, type (the protobuf's numbers:
-- 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; GGUF's token_type uses the
-- same); info as the fields of the model's trainer and normalizer specs (byte_fallback, unk_id,
-- bos_id, eos_id, add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces,
-- treat_whitespace_as_suffix). kind names the format.
function M.build(path, n, info, piece, kind)
  local h = bpe.bpe(info.byte_fallback and K.BPE_BYTE_FALLBACK or 0, path)
  local piece_type, user, added = {}, {}, {}
  for id = 0, n - 1 do
    local text, score, ty = piece(id)
    local k = types[ty]
    piece_type[id] = k
    local unmatched = (k == "unknown" or k == "control" or k == "byte") and K.BPE_PIECE_UNMATCHED or 0
    assert(tk.bpe_add_token(h, text, id, score, unmatched, path))
    if k == "user" then user[#user + 1] = { content = text, id = id } end
    if (k == "control" or k == "unknown") and text ~= "" then added[#added + 1] = { content = text, id = id, special = true } end
  end
  assert(tk.bpe_derive_merges(h, K.BPE_MERGES_BY_SCORE, path))
  if info.unk_id and info.unk_id >= 0 and info.unk_id < n then assert(tk.bpe_set_unk(h, info.unk_id, path)) end
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
