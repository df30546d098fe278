-- llama2.c's tokenizer.bin (scored BPE with byte fallback), the format stories260K and
-- llama2.c checkpoints ship with. Encoding runs in C; turning ids back into text (piece
-- rules, byte tokens) is done here.
local ffi = require "ffi"
local tk = require "loip.runtime.tokenizer"

local M = {}

local Tokenizer = {}
Tokenizer.__index = Tokenizer

-- Open a tokenizer.bin file. opts.vocab_size: the model's vocabulary size (checked).
function M.open(path, opts)
  opts = opts or {}
  local h, err = tk.scoredbpe_open(path, opts.vocab_size or 0)
  if not h then return nil, err end
  local n = tk.scoredbpe_size(h)
  local t = setmetatable({ handle = h, path = path, kind = "llama2c", vocab_size = n,
    bos_id = 1, eos_id = 2, pieces = {} }, Tokenizer)
  local piece, len, score = ffi.new("const char *[1]"), ffi.new("int32_t[1]"), ffi.new("float[1]")
  for id = 0, n - 1 do
    assert(tk.scoredbpe_piece(h, id, piece, len, score))
    t.pieces[id] = ffi.string(piece[0], len[0])
  end
  return t
end

-- ids (Lua array) of text. opts.bos (default true), opts.eos (default false).
function Tokenizer:encode(text, opts)
  opts = opts or {}
  local bos = opts.bos ~= false and opts.add_special ~= false
  local eos = opts.eos == true
  local cap = #text + 3
  local ids, n = ffi.new("int32_t[?]", cap), ffi.new("int32_t[1]")
  assert(tk.scoredbpe_encode(self.handle, text, bos, eos, ids, cap, n, self.path))
  local out = {}
  for i = 0, n[0] - 1 do out[i + 1] = ids[i] end
  return out
end

-- The text of token id following token prev, with run.c's rules: the piece after BOS loses
-- its leading space; "<0xNN>" pieces are that raw byte; a lone non-printable byte (other
-- than white space) prints as nothing.
function Tokenizer:piece_text(prev, id)
  local p = self.pieces[id]
  if p == nil then error(string.format("token id %d out of range [0, %d)", id, self.vocab_size), 2) end
  if prev == self.bos_id and p:byte(1) == 32 then p = p:sub(2) end
  local hex = p:match("^<0x(%x%x)>$")
  if hex then p = string.char(tonumber(hex, 16)) end
  if #p == 1 then
    local b = p:byte()
    if not (b >= 32 and b < 127) and not (b >= 9 and b <= 13) and b < 128 then return "" end
  end
  return p
end

-- Text of ids; prev is the token before ids[1] (default: BOS when ids[1] is not BOS).
function Tokenizer:decode(ids, prev)
  local parts = {}
  prev = prev or self.bos_id
  for i, id in ipairs(ids) do
    if not (i == 1 and id == self.bos_id and prev == self.bos_id) then
      parts[#parts + 1] = self:piece_text(prev, id)
    end
    prev = id
  end
  return table.concat(parts)
end

function Tokenizer:close()
  tk.scoredbpe_free(self.handle)
  self.handle = nil
end

return M
