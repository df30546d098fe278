-- gpt-oss's o200k_harmony vocabulary in the forms other programs write it, from loip's
-- tiktoken reading of OpenAI's o200k_base.tiktoken (models/o200k-harmony): Hugging Face's
-- tokenizer.json (byte-level BPE, GPT-2's spelling, merges derived from the ranks) and the
-- tokenizer.ggml.* metadata llama.cpp's converter writes into gpt-oss's GGUF (pre "gpt-4o").
local tiktoken = require "loip.text.tokenizers.tiktoken"
local bpe = require "loip.text.tokenizers.bpe"
local T = require "spec.support"

local M = {}

M.N_BASE = 199998 -- o200k_base's ranks

-- The vocabulary in GPT-2's spelling (id -> string, ids 0..199997) and the merges Hugging Face's
-- TikTokenConverter derives from the ranks (so gpt-oss's tokenizer.json, and llama.cpp's GGUF
-- after it): for each token in rank order, every split of it into two tokens, ordered by the
-- left's rank then the right's, "left right" in GPT-2's spelling. tok: the tiktoken tokenizer.
function M.hf_vocab(tok)
  local bytes, rank, spelled = {}, {}, {}
  for id = 0, M.N_BASE - 1 do
    local p = tok:piece(id)
    bytes[id], rank[p] = p, id
    spelled[id] = bpe.gpt2_encode(p)
  end
  local merges = {}
  for id = 0, M.N_BASE - 1 do
    local t, l = bytes[id], {}
    for i = 1, #t - 1 do
      local a, b = rank[t:sub(1, i)], rank[t:sub(i + 1)]
      if a and b then l[#l + 1] = { a, b } end
    end
    table.sort(l, function(x, y) if x[1] ~= y[1] then return x[1] < y[1] end return x[2] < y[2] end)
    for _, m in ipairs(l) do merges[#merges + 1] = spelled[m[1]] .. " " .. spelled[m[2]] end
  end
  return spelled, merges
end

-- tokenizer.ggml.* metadata as llama.cpp's converter writes gpt-oss's: the ranks as normal
-- tokens, the o200k_harmony special tokens as control tokens, BOS <|startoftext|>, EOS
-- <|return|>, padding <|endoftext|>. spelled, merges: M.hf_vocab's.
function M.gguf_metadata(spelled, merges)
  local tokens, types = {}, {}
  for id = 0, M.N_BASE - 1 do tokens[id + 1], types[id + 1] = spelled[id], 1 end
  for name, id in pairs(tiktoken.o200k_harmony_special_tokens()) do tokens[id + 1], types[id + 1] = name, 3 end
  return {
    { "tokenizer.ggml.model", "STRING", "gpt2" }, { "tokenizer.ggml.pre", "STRING", "gpt-4o" },
    { "tokenizer.ggml.tokens", "ARRAY[STRING]", tokens }, { "tokenizer.ggml.token_type", "ARRAY[INT32]", types },
    { "tokenizer.ggml.merges", "ARRAY[STRING]", merges },
    { "tokenizer.ggml.bos_token_id", "UINT32", 199998 }, { "tokenizer.ggml.eos_token_id", "UINT32", 200002 },
    { "tokenizer.ggml.padding_token_id", "UINT32", 199999 },
  }
end

-- A small random-weight gpt-oss-20b shape (2 layers, width 64, 4 experts, BF16: its 201,088-row
-- embedding and head take 51 MB) with o200k_harmony for its tokenizer (`loip synth --tokenizer`),
-- in a fresh temporary directory's hf/: that directory; nil and why when the ranks are missing.
function M.synth_gpt_oss()
  local ranks, why = T.fixture_path("models/o200k-harmony/o200k_base.tiktoken")
  if not ranks then return nil, why end
  local dir = T.tmpdir()
  local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like gpt-oss-20b --dtype bf16 --experts-dtype bf16 "
    .. "--layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --ffn 32 --experts 4 --std 0.25 --seed 5 --tokenizer %s %s/hf",
    T.loip, ranks, dir))
  assert(rc == 0, err)
  return dir
end

return M
