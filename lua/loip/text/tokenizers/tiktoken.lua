-- tiktoken rank files: Llama 3's original/tokenizer.model ("base64(token bytes) rank" per
-- line, rank = id). Byte-level BPE where the pair whose concatenation has the lowest rank
-- merges first, and a chunk that is a whole token is that token (tiktoken's encode); chunks
-- come from Llama 3's regex. The special tokens are not in the file: they are those of Meta's
-- llama/tokenizer.py (ids from the number of ranks up), or the special_tokens.json beside the
-- file ({"special_tokens": {"<|begin_of_text|>": 128000, ...}}), or opts.special_tokens.
local bit = require "bit"
local json = require "loip.text.json"
local core = require "loip.core"
local bpe = require "loip.text.tokenizers.bpe"
local tk = require "loip.runtime.tokenizer"
local K = core.constants

local M = {}

-- Whether the start of a file looks like tiktoken ranks.
function M.sniff(head)
  return head:match("^[A-Za-z0-9+/]+=*[ ]%d+\r?\n") ~= nil
end

-- Meta's Llama 3 special tokens, from id n_base on.
function M.llama3_special_tokens(n_base)
  local names = { "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>" }
  for i = 5, 256 - 5 - 1 do names[#names + 1] = string.format("<|reserved_special_token_%d|>", i) end
  local t = {}
  for i, name in ipairs(names) do t[name] = n_base + i - 1 end
  return t
end

function M.open(path, opts)
  opts = opts or {}
  local text, err = json.read_file(path)
  if not text then error(path .. ": " .. tostring(err), 0) end
  local h = bpe.bpe(bit.bor(K.BPE_BYTELEVEL, K.BPE_IGNORE_MERGES), path)
  assert(tk.bpe_add_tiktoken(h, text, path))
  assert(tk.bpe_derive_merges(h, K.BPE_MERGES_BY_ID, path))
  local n_base = tk.bpe_size(h)

  local specials, where = opts.special_tokens, "opts.special_tokens"
  if specials == nil then
    local side = (path:match("^(.*)/[^/]*$") or ".") .. "/special_tokens.json"
    if json.exists(side) then
      local j, jerr = json.load(side)
      if not j then error(jerr, 0) end
      if type(j.special_tokens) ~= "table" then
        error(side .. ": no \"special_tokens\" object of token -> id", 0)
      end
      specials, where = j.special_tokens, side
    else
      specials, where = M.llama3_special_tokens(n_base), path .. " (Llama 3 special tokens)"
    end
  end
  local added, by_id = {}, {}
  for content, id in pairs(specials) do
    if type(id) ~= "number" or id % 1 ~= 0 or id < 0 then
      error(string.format("%s: special token %q has id %s", where, content, tostring(id)), 0)
    end
    if id < n_base then
      error(string.format("%s: special token %q has id %d, a rank of %s (which has %d)", where,
        content, id, path, n_base), 0)
    end
    if by_id[id] then
      error(string.format("%s: special tokens %q and %q share id %d", where, by_id[id], content, id), 0)
    end
    by_id[id] = content
    added[#added + 1] = { content = content, id = id, special = true }
  end
  table.sort(added, function(a, b) return a.id < b.id end)
  local by_text = {}
  for _, t in ipairs(added) do by_text[t.content] = t.id end
  for _, name in ipairs({ "<|begin_of_text|>", "<|end_of_text|>" }) do
    if not by_text[name] then
      error(string.format("%s: no special token %s, which Llama 3 needs", where, name), 0)
    end
  end
  local stop = {}
  for _, name in ipairs({ "<|eot_id|>", "<|eom_id|>" }) do
    if by_text[name] then stop[#stop + 1] = by_text[name] end
  end
  return bpe.new({
    path = path, kind = "tiktoken", bpe = h, added = added,
    pretok = bpe.pretok({ { pattern = bpe.patterns.llama3 } }, path),
    byte_level = true, spelling = "raw", decoder = { { type = "bytes" } },
    bos_id = by_text["<|begin_of_text|>"], eos_id = by_text["<|end_of_text|>"], stop_ids = stop,
    prefix_ids = { by_text["<|begin_of_text|>"] }, pretokenizer = "llama3",
  })
end

return M
