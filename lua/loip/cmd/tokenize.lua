-- `loip tokenize`: show the token ids and pieces of a text.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"

local M = {
  brief = "show the token ids and pieces of a text",
  usage = "loip tokenize --model DIR [--json] TEXT",
  positional = { "TEXT..." },
  summary = "Print the token ids and pieces of TEXT under the model's tokenizer.",
  flags = {
    { "model", "string", "model directory, or a tokenizer file", required = true, metavar = "DIR" },
    { "no-special", "bool", "do not add the tokenizer's special tokens (BOS)" },
    { "json", "bool", "print a JSON object: ids and pieces" },
  },
}

function M.run(o, pos)
  local tokenizer = require "loip.text.tokenizer"
  local text = table.concat(pos, " ")
  local is_dir = os.execute("test -d '" .. o.model:gsub("'", "'\\''") .. "'") == 0
  local tok, m
  if not is_dir then
    tok = tokenizer.open_file(o.model)
  else
    local ok, t = pcall(tokenizer.open, o.model)
    if ok then
      tok = t
    else -- a llama2.c directory names its tokenizer by the model's vocabulary: ask the model
      m = require("loip.model").open(o.model, { load = "mmap", threads = 1, context = 1 })
      tok = m.tokenizer
    end
  end
  local ids = tok:encode(text, { add_special = not o.no_special, bos = not o.no_special })
  -- The token as the vocabulary spells it (byte-level files write bytes as letters like "Ġ")
  -- and, where that differs, the text it decodes to.
  local pieces, texts = {}, {}
  for i, id in ipairs(ids) do
    pieces[i] = tok.id_to_token and tok:id_to_token(id) or tok.pieces[id]
    texts[i] = tok:piece_text(nil, id)
  end
  if o.json then
    print(require("loip.text.json").encode({ text = text, ids = ids, pieces = pieces, texts = texts }))
  else
    local function show(p)
      return '"' .. p:gsub('[%c"\\]', function(c)
        local named = { ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\" }
        return named[c] or string.format("\\x%02x", c:byte())
      end) .. '"'
    end
    for i, id in ipairs(ids) do
      local extra = texts[i] ~= pieces[i] and ("  " .. show(texts[i])) or ""
      print(string.format("%8d  %s%s", id, show(pieces[i]), extra))
    end
    io.stdout:flush()
    common.stderr("%d tokens\n", #ids)
  end
  if m then m:close() else tok:close() end
  return 0
end

return M
