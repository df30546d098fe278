-- A small model sharing the target's tokenizer as the draft (e.g. Llama-3.2-1B for Llama-3.x,
-- Qwen3-0.6B for Qwen3), run in the head's process, its weights and KV cache charged to a
-- budget of its own (mem). Refused when its tokenizer is not the target's. A speculative
-- decoding draft (loip.policy kind "draft"):
--   loip generate --model big --draft model --draft-model small/ [--draft-mem 512M]
local draft_mod = require "loip.cluster.draft"

local M = { name = "model" }
local drafter = require "loip.engine.request.drafter"

M.settings = {
  { "path", "string", "the draft model (a slice store, Hugging Face directory, GGUF or llama2.c file; --draft-model)", default = "" },
  { "mem", "string", "a memory budget for the draft's weights and KV cache (a size such as 512M; empty: none)", default = "" },
}
drafter.settings(M.settings) -- (device, tree, width, levels)
M.per_request = drafter.PER_REQUEST -- (a request may change these: they load nothing; loip.serve.request_draft)

-- Whether two tokenizers are one: the same vocabulary, every id the same piece (a sample of at
-- most 4096 ids spread over it), a text encoded alike. nil, or why not.
local function differ(a, b)
  if not a or not b then return nil end
  if a.vocab_size ~= b.vocab_size then
    return string.format("%d tokens against the target's %d", b.vocab_size, a.vocab_size)
  end
  -- (control and byte tokens are left out: formats spell them differently, "<unk>" or " ⁇ ",
  -- "" or the byte)
  local function control(s)
    return s == "" or s:match("^%s*<.*>%s*$") or s:find("\226\129\135", 1, true) or s == "\239\191\189" or (#s == 1 and (s:byte() < 32 or s:byte() > 126))
  end
  local step = math.max(1, math.floor(a.vocab_size / 4096))
  for id = 0, a.vocab_size - 1, step do
    local x, y = a:decode({ id }), b:decode({ id })
    if x ~= y and not (control(x) and control(y)) then return string.format("token %d is %q, the target's is %q", id, y, x) end
  end
  for _, text in ipairs({ "Once upon a time, 12 robots said: \"hello, world!\"", "  tabs\tand\nnew lines, ÄÖÜ é 東京 🙂" }) do
    local x, y = a:encode(text), b:encode(text)
    if table.concat(x, ",") ~= table.concat(y, ",") then return string.format("%q encodes differently", text) end
  end
end

local function need_path(o)
  if o.path == "" then error("draft model: which model? (--draft-model DIR, or --draft model:path=DIR)", 0) end
end

-- The bytes the draft takes where it runs (its weights, KV cache and scratch).
function M.memory(t, o)
  need_path(o)
  return drafter.bytes(o.path, { context = t.context, max_seqs = t.max_seqs, batch = drafter.batch_for(o) })
end

function M.open(ctx, o)
  local t = ctx.target
  need_path(o)
  if o.device ~= "head" and not t.cluster then error("--draft-device: one device runs its draft in its own process (head)", 0) end
  -- the tokenizers compared here (a device's copy of the draft must be the same files)
  local d = drafter.open(o.path, { context = t.context, max_seqs = t.max_seqs,
    mem = not t.draft_device and o.mem ~= "" and o.mem or nil, batch = drafter.batch_for(o) })
  local why
  if not t.tokenizer then why = "the target has no tokenizer to compare with"
  elseif not d.model.tokenizer then why = "it has no tokenizer"
  else why = differ(t.tokenizer, d.model.tokenizer) end
  if why then
    d:close()
    error(string.format("draft model %s: its tokenizer is not the target's (%s): a draft must share the target's tokenizer", o.path, why), 0)
  end
  if t.draft_device then
    d:close()
    ctx.drafter = draft_mod.open(t.cluster, t.draft_device, { path = o.path, context = t.context,
      max_seqs = t.max_seqs, batch = drafter.batch_for(o) })
    return
  end
  ctx.drafter = d
end

-- propose, propose_tree, finish, close: a drafter's (ctx.drafter), as every model draft's
drafter.policy(M)

return M
