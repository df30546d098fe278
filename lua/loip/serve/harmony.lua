-- OpenAI's harmony format (gpt-oss) read out of a model's output: after the prompt's
-- `<|start|>assistant` the model writes messages
--
--   [<|start|>assistant][ to=R]<|channel|>CHANNEL[ to=R][ [<|constrain|>]TYPE]<|message|>BODY END
--
-- (END: <|end|>, <|call|>, <|return|>, the next <|start|>, or the end of the output; the
-- recipient R may come before or after the channel). A message on channel `analysis` is
-- reasoning (OpenAI's `reasoning_content`, as llama.cpp's server and vLLM answer it); one to
-- `functions.NAME` is a call of NAME with BODY its arguments' JSON; `final`, and `commentary`
-- with no recipient (a preamble), are content; other recipients (built-in tools: browser,
-- python) are not answered, as llama.cpp's server drops them. Output that does not begin with a
-- header is content as it stands.
--
-- One stream machine makes both the whole-text parse and the incremental stream, so they agree
-- however the text is split: text that may begin a marker is held back until it is known, so no
-- part of a marker is ever shown, and reasoning and content come out apart.
local tc = require "loip.serve.tool_calls"

local M = {}

local MESSAGE = "<|message|>"
local ENDS = { "<|end|>", "<|call|>", "<|return|>", "<|start|>" } -- (<|start|> is the next message's)
local OPENS = { "<|start|>", "<|channel|>", " to=", "<|constrain|>", MESSAGE }
M.MAX_HEADER = 512 -- bytes of a header without <|message|>: past them it was not one

-- What a header says: the body's kind ("reasoning" | "content" | "call" | "drop") and the
-- function's name for a call.
function M.header(h)
  h = h:gsub("^<|start|>", "")
  local recipient
  for r in h:gmatch("to=([^%s<]+)") do
    if r ~= "assistant" then recipient = r end
  end
  local channel = h:match("<|channel|>([%w_%-]+)")
  if recipient then
    local name = recipient:match("^functions%.(.+)$")
    if name then return "call", name end
    return "drop"
  end
  if channel == "analysis" then return "reasoning" end
  return "content"
end

-- the earliest of the strings of list in s: its position and the string
local function earliest(s, list)
  local at, which
  for _, m in ipairs(list) do
    local i = s:find(m, 1, true)
    if i and (not at or i < at) then at, which = i, m end
  end
  return at, which
end

local Stream = {}
Stream.__index = Stream

-- a body's text to where its kind goes
function Stream:deliver(t)
  if t == "" then return end
  local kind = self.kind
  if kind == "reasoning" then self.reasoning_out[#self.reasoning_out + 1] = t
  elseif kind == "content" then self.text_out[#self.text_out + 1] = t self.parts[#self.parts + 1] = t
  elseif kind == "call" then self.args[#self.args + 1] = t end
end

-- the end of a call's body: a call when its text is one JSON object (and calls are wanted),
-- else the text is content
function Stream:close_call()
  local args = table.concat(self.args):match("^%s*(.-)%s*$")
  self.args = {}
  local _, after = tc.members(args)
  if not after or not args:sub(after):match("^%s*$") then
    self.kind = "content"
    return self:deliver(args)
  end
  local calls = self.st.calls
  if self.opts.calls == false or (self.opts.parallel == false and #calls >= 1) then return end
  local idx = #calls
  local call = { id = tc.call_id(self.opts.id_prefix), name = self.name, arguments = args }
  calls[idx + 1] = call
  self.deltas[#self.deltas + 1] = { index = idx, id = call.id, type = "function", ["function"] = { name = call.name, arguments = "" } }
  self.deltas[#self.deltas + 1] = { index = idx, ["function"] = { arguments = args } }
  self.parts[#self.parts + 1] = idx
end

-- the message ends (at its END, or at the end of the output)
function Stream:close_message()
  if self.kind == "call" then self:close_call() end
  self.mode, self.kind, self.name = "start", nil, nil
end

-- At a message's start: a header, else content with no header (false: wait for more).
function Stream:at_start()
  local buf = self.buf
  if buf == "" then return false end
  for _, o in ipairs(OPENS) do
    if buf:sub(1, #o) == o then self.mode = "header" return true end
    if #buf < #o and o:sub(1, #buf) == buf then return false end
  end
  self.mode, self.kind = "body", "content"
  return true
end

function Stream:in_header()
  local buf = self.buf
  local i = buf:find(MESSAGE, 1, true)
  local e = earliest(buf, { "<|end|>", "<|call|>", "<|return|>" })
  if i and (not e or i < e) then
    self.kind, self.name = M.header(buf:sub(1, i - 1))
    self.mode, self.buf = "body", buf:sub(i + #MESSAGE)
    return true
  end
  if e then -- a header with no body: nothing to say
    self.buf = buf:sub(e):gsub("^<|[a-z]+|>", "", 1)
    self.mode = "start"
    return true
  end
  if #buf > M.MAX_HEADER then -- not a header: content as written
    self.mode, self.kind = "body", "content"
    return true
  end
  return false
end

function Stream:in_body()
  local buf = self.buf
  local i, which = earliest(buf, ENDS)
  if i then
    self:deliver(buf:sub(1, i - 1))
    self.buf = which == "<|start|>" and buf:sub(i) or buf:sub(i + #which)
    self:close_message()
    return true
  end
  local keep = tc.tail_len(buf, ENDS)
  self:deliver(buf:sub(1, #buf - keep))
  self.buf = buf:sub(#buf - keep + 1)
  return false
end

local steps = { start = Stream.at_start, header = Stream.in_header, body = Stream.in_body }

function Stream:run()
  while steps[self.mode](self) do end
end

function Stream:begin()
  self.text_out, self.reasoning_out, self.deltas, self.parts = {}, {}, {}, {}
end

function Stream:results()
  return table.concat(self.text_out), self.deltas, self.parts, table.concat(self.reasoning_out)
end

function Stream:put(piece)
  self:begin()
  self.buf = self.buf .. piece
  self:run()
  return self:results()
end

-- The end of the output: what was held back is placed (a header never finished is dropped).
function Stream:finish()
  self:begin()
  self:run()
  if self.mode == "body" then
    self:deliver(self.buf)
    self:close_message()
  elseif self.mode == "start" and self.buf ~= "" then
    self.kind = "content"
    self:deliver(self.buf)
  end
  self.buf, self.mode = "", "start"
  return self:results()
end

-- The stream machine. opts: calls (false: calls are not answered, as with tool_choice "none"),
-- parallel (false: the first call only), id_prefix. Returns { put(piece) -> text, deltas, parts,
-- reasoning; finish() -> the same; calls; tool_calls() }: text the content to show now, deltas
-- OpenAI's streamed tool-call deltas, parts the content and calls (0-based indices) in order,
-- reasoning the analysis to show now.
function M.stream(opts)
  local st = { calls = {} }
  local sm = setmetatable({ opts = opts or {}, st = st, buf = "", mode = "start", args = {} }, Stream)
  function st.tool_calls() return tc.openai_calls(st.calls) end
  function st.put(piece) return sm:put(piece) end
  function st.finish() return sm:finish() end
  return st
end

-- A whole text: content (nil when there is none beside calls), calls (OpenAI's
-- message.tool_calls) and reasoning (nil when none).
function M.parse(text, opts)
  local st = M.stream(opts)
  local c1, _, _, r1 = st.put(text)
  local c2, _, _, r2 = st.finish()
  local content, reasoning = c1 .. c2, r1 .. r2
  local calls = st.tool_calls() or {}
  if #calls > 0 and content:match("^%s*$") then content = nil end
  return content, calls, reasoning ~= "" and reasoning or nil
end

-- The GBNF of harmony calls (tool_choice "required" or a named function): an optional analysis
-- message, then one call on the commentary channel, its arguments by schema_gbnf. req: tools,
-- choice, schema_gbnf (as loip.serve.tool_calls.gbnf_calls takes them).
function M.grammar(req)
  local rules, alts = {}, {}
  for i, t in ipairs(req.tools) do
    local f = t["function"]
    if type(req.choice) ~= "table" or req.choice.name == f.name then
      local prefix = "tool" .. (i - 1) .. "-"
      local args = req.schema_gbnf(f.parameters or { type = "object" }, string.format("tools[%d].function.parameters", i - 1))
      alts[#alts + 1] = prefix .. "call"
      rules[#rules + 1] = string.format("%scall ::= %s %sroot", prefix,
        tc.gbnf_literal("<|channel|>commentary to=functions." .. f.name .. " <|constrain|>json<|message|>"), prefix)
      rules[#rules + 1] = tc.gbnf_rename(args, prefix)
    end
  end
  if #alts == 0 then error("tool_choice names no tool of tools", 2) end
  return table.concat({
    "root ::= analysis? call",
    "analysis ::= " .. tc.gbnf_literal("<|channel|>analysis<|message|>") .. " reason " .. tc.gbnf_literal("<|end|><|start|>assistant"),
    'reason ::= ([^<] | "<" [^|])*',
    "call ::= " .. table.concat(alts, " | "),
    table.concat(rules, "\n") }, "\n") .. "\n"
end

return M
