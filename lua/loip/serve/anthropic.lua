-- Anthropic's Messages API (POST /v1/messages, docs/serving.md "Anthropic Messages"): a request
-- checked field by field into the spec the server runs (the one loip.serve.openai makes for a
-- chat: the conversation in OpenAI's shape, tool_use and tool_result blocks as tool calls and
-- tool messages), and the message object, its streamed events and errors in Anthropic's shapes.
-- The same functions as loip.serve.openai (parse, error, response, chunk, stream_error, DONE),
-- so the server serves both alike. No I/O here.
local json = require "loip.text.json"
local openai = require "loip.serve.openai"
local tools = require "loip.serve.tools"
local request_draft = require "loip.serve.request_draft"

local M = {}

M.DONE = ""              -- (no end marker after message_stop)
M.call_id_prefix = "toolu_"

local KNOWN = { model = true, max_tokens = true, messages = true, system = true, stop_sequences = true, temperature = true,
  top_p = true, top_k = true, stream = true, metadata = true, tools = true, tool_choice = true, service_tier = true,
  draft = true, draft_tokens = true } -- (loip's: a request's own drafts, loip.serve.request_draft)

-- Anthropic's error types by HTTP status.
local TYPES = { [400] = "invalid_request_error", [401] = "authentication_error", [403] = "permission_error",
  [404] = "not_found_error", [405] = "invalid_request_error", [413] = "request_too_large", [429] = "rate_limit_error",
  [500] = "api_error", [503] = "overloaded_error", [529] = "overloaded_error" }

-- An error in Anthropic's shape: status, body (the field, when one is to blame, begins the message).
function M.error(status, message, _, param)
  if param and param ~= json.null and not message:find(param, 1, true) then message = param .. ": " .. message end
  return status, openai.encode({ type = "error", error = { type = TYPES[status] or "api_error", message = message } })
end

function M.stream_error(body) return "event: error\ndata: " .. body .. "\n\n" end

local function null(v) return v == nil or v == json.null end
local function bad(param, fmt, ...)
  return nil, { status = 400, message = string.format(fmt, ...), param = param }
end

-- A content's text: a string or an array of text blocks.
local function text_of(v, at)
  if type(v) == "string" then return v end
  if type(v) ~= "table" or v == json.null then return nil, at .. " must be a string or an array of text blocks" end
  local parts = {}
  for j, b in ipairs(v) do
    if type(b) ~= "table" or b.type ~= "text" or type(b.text) ~= "string" then
      return nil, string.format("%s[%d] must be a text block {\"type\": \"text\", \"text\": ...}", at, j - 1)
    end
    parts[#parts + 1] = b.text
  end
  return table.concat(parts)
end

-- One message's blocks -> OpenAI-shaped messages appended to out (tool results become tool
-- messages, before the user's text).
local function convert(out, m, i)
  local at = string.format("messages.%d", i)
  if m.role ~= "user" and m.role ~= "assistant" then return string.format("%s.role must be \"user\" or \"assistant\", not %s", at, json.encode(m.role)), at .. ".role" end
  if type(m.content) == "string" then out[#out + 1] = { role = m.role, content = m.content } return end
  if type(m.content) ~= "table" or m.content == json.null then return at .. ".content must be a string or an array of blocks", at .. ".content" end
  local texts, calls = {}, {}
  for j, b in ipairs(m.content) do
    local bat = string.format("%s.content.%d", at, j - 1)
    local kind = type(b) == "table" and b.type
    if kind == "text" and type(b.text) == "string" then texts[#texts + 1] = b.text
    elseif (kind == "thinking" or kind == "redacted_thinking") and m.role == "assistant" then -- (another model's; not shown to this one)
    elseif kind == "tool_use" and m.role == "assistant" then
      if type(b.id) ~= "string" or type(b.name) ~= "string" or type(b.input) ~= "table" or b.input == json.null then
        return bat .. ": a tool_use block needs id, name and input (an object)", bat
      end
      calls[#calls + 1] = { id = b.id, type = "function", ["function"] = { name = b.name, arguments = json.encode(b.input) } }
    elseif kind == "tool_result" and m.role == "user" then
      if type(b.tool_use_id) ~= "string" then return bat .. ".tool_use_id must name the tool_use this answers", bat .. ".tool_use_id" end
      local content, err = "", nil
      if not null(b.content) then content, err = text_of(b.content, bat .. ".content") end
      if not content then return err, bat .. ".content" end
      out[#out + 1] = { role = "tool", tool_call_id = b.tool_use_id, content = content }
    else
      return string.format("%s: a %s message's blocks are text%s, not %s", bat, m.role,
        m.role == "assistant" and " and tool_use" or " and tool_result", json.encode(kind or b)), bat
    end
  end
  if #calls > 0 then out[#out + 1] = { role = m.role, content = table.concat(texts), tool_calls = calls }
  elseif #texts > 0 then out[#out + 1] = { role = m.role, content = table.concat(texts) } end
end

local function number_in(body, k, lo, hi, integer)
  local v = body[k]
  if null(v) then return true end
  if type(v) ~= "number" or v ~= v or (integer and v ~= math.floor(v)) or v < lo or (hi and v > hi) then
    return false, string.format("%s must be %s in [%s, %s], not %s", k, integer and "an integer" or "a number", lo, hi or "inf", json.encode(v))
  end
  return true
end

-- A request body -> the server's spec (as openai.parse gives for a chat), or nil and an error.
function M.parse(_, text)
  if not openai.utf8_valid(text) then return bad(nil, "the request body is not valid UTF-8") end
  local body = json.decode(text)
  if type(body) ~= "table" or body == json.null or #body > 0 then return bad(nil, "the request body must be a JSON object") end
  for k in pairs(body) do
    if not KNOWN[k] then return bad(k, "%s: Extra inputs are not permitted", tostring(k)) end
  end
  if type(body.model) ~= "string" or body.model == "" then return bad("model", "model: Field required (a string naming the model)") end
  if null(body.max_tokens) then return bad("max_tokens", "max_tokens: Field required") end
  for _, c in ipairs({ { "max_tokens", 1, nil, true }, { "temperature", 0, 1 }, { "top_p", 0, 1 }, { "top_k", 0, nil, true } }) do
    local ok, why = number_in(body, c[1], c[2], c[3], c[4])
    if not ok then return bad(c[1], "%s", why) end
  end
  if not null(body.stream) and type(body.stream) ~= "boolean" then return bad("stream", "stream must be true or false") end
  if not null(body.metadata) and type(body.metadata) ~= "table" then return bad("metadata", "metadata must be an object") end
  local s = { kind = "chat", model = body.model, max_tokens = body.max_tokens, stream = body.stream == true, stop = {}, n = 1,
    sampler = { temperature = null(body.temperature) and 1 or body.temperature, top_p = null(body.top_p) and 1 or body.top_p,
      top_k = null(body.top_k) and 0 or body.top_k, min_p = 0, repetition_penalty = 1 } }
  local dp, why = request_draft.parse(body, s)
  if dp then return bad(dp, "%s", why) end
  if not null(body.stop_sequences) then
    if type(body.stop_sequences) ~= "table" then return bad("stop_sequences", "stop_sequences must be an array of strings") end
    for i, x in ipairs(body.stop_sequences) do
      if type(x) ~= "string" or x == "" then return bad("stop_sequences", "stop_sequences.%d must be a non-empty string", i - 1) end
      s.stop[i] = x
    end
  end
  s.messages = {}
  if not null(body.system) then
    local sys, err = text_of(body.system, "system")
    if not sys then return bad("system", "%s", err) end
    s.messages[1] = { role = "system", content = sys }
  end
  if type(body.messages) ~= "table" or body.messages == json.null or #body.messages == 0 then
    return bad("messages", "messages must be a non-empty array of {role, content}")
  end
  for i, m in ipairs(body.messages) do
    if type(m) ~= "table" then return bad("messages." .. (i - 1), "messages.%d must be an object", i - 1) end
    local err, param = convert(s.messages, m, i - 1)
    if err then return bad(param, "%s", err) end
  end
  -- tools and tool_choice, checked as OpenAI's (loip.serve.tools) after naming them so
  local otools
  if not null(body.tools) then
    if type(body.tools) ~= "table" then return bad("tools", "tools must be an array") end
    otools = {}
    for i, t in ipairs(body.tools) do
      if type(t) ~= "table" then return bad("tools." .. (i - 1), "tools.%d must be an object", i - 1) end
      if not null(t.input_schema) and (type(t.input_schema) ~= "table" or #t.input_schema > 0) then
        return bad(string.format("tools.%d.input_schema", i - 1), "tools.%d.input_schema must be a JSON schema object", i - 1)
      end
      otools[i] = { type = "function", ["function"] = { name = t.name, description = t.description, parameters = t.input_schema } }
    end
  end
  local choice, parallel = nil, nil
  local tc = body.tool_choice
  if not null(tc) then
    if type(tc) ~= "table" then return bad("tool_choice", "tool_choice must be an object {type: auto | any | tool | none}") end
    local map = { auto = "auto", any = "required", none = "none" }
    if tc.type == "tool" then choice = { type = "function", ["function"] = { name = tc.name } }
    elseif map[tc.type] then choice = map[tc.type]
    else return bad("tool_choice.type", "tool_choice.type must be auto, any, tool or none, not %s", json.encode(tc.type)) end
    if tc.disable_parallel_tool_use == true then parallel = false end
  end
  local e = tools.check({ tools = otools, tool_choice = choice, parallel_tool_calls = parallel }, s)
  if e then
    -- OpenAI's names of the fields back to Anthropic's
    local param = e.param and e.param:gsub("%[(%d+)%]", ".%1"):gsub("%.function%.parameters", ".input_schema"):gsub("%.function", "")
    local msg = e.message:gsub("%[(%d+)%]", ".%1"):gsub("%.function%.parameters", ".input_schema"):gsub("%.function", "")
    return bad(param, "%s", msg)
  end
  return s
end

local STOP = { tool_calls = "tool_use", length = "max_tokens" }
local function stop_reason(r)
  return STOP[r.finish_reason] or (r.stop_sequence and "stop_sequence") or "end_turn"
end

local function input_of(arguments)
  local v = json.decode(arguments)
  return type(v) == "table" and v or {}
end

-- The message object of a finished request (r: id, model, text, finish_reason, usage,
-- tool_calls, stop_sequence, order: its text and calls in the order they came, as the stream
-- gave them).
function M.response(_, r)
  local content = {}
  local order = r.order or { r.text }
  if not r.order then for i = 1, #(r.tool_calls or {}) do order[#order + 1] = i - 1 end end
  for _, x in ipairs(order) do
    local last = content[#content]
    if type(x) == "string" then
      if last and last.type == "text" then last.text = last.text .. x
      elseif x ~= "" then content[#content + 1] = { type = "text", text = x } end
    else
      local c = r.tool_calls[x + 1]
      content[#content + 1] = { type = "tool_use", id = c.id, name = c["function"].name, input = input_of(c["function"].arguments) }
    end
  end
  return openai.encode({ id = r.id, type = "message", role = "assistant", model = r.model,
    content = #content > 0 and content or openai.EMPTY_ARRAY, stop_reason = stop_reason(r),
    stop_sequence = r.stop_sequence or json.null,
    usage = { input_tokens = r.usage.prompt_tokens, output_tokens = r.usage.completion_tokens } })
end

local function event(out, name, obj)
  obj.type = name
  out[#out + 1] = "event: " .. name .. "\ndata: " .. openai.encode(obj) .. "\n\n"
end

local function close_block(out, a)
  if a.block then
    event(out, "content_block_stop", { index = a.block })
    a.block, a.block_type = nil, nil
  end
end
local function open_block(out, a, block)
  close_block(out, a)
  a.blocks = (a.blocks or 0) + 1
  a.block, a.block_type = a.blocks - 1, block.type
  event(out, "content_block_start", { index = a.block, content_block = block })
end

-- The events of a stream step (a: the running request: id, model, n_prompt, first_chunk;
-- text, tool-call deltas in OpenAI's shape and order (the two in the order they came), finish:
-- the end, a.usage and a.stop_sequence then).
function M.chunk(_, a, text, finish, _, deltas, order)
  local out = {}
  if a.first_chunk then
    event(out, "message_start", { message = { id = a.id, type = "message", role = "assistant", model = a.model,
      content = openai.EMPTY_ARRAY, stop_reason = json.null, stop_sequence = json.null,
      usage = { input_tokens = a.n_prompt, output_tokens = 0 } } })
    event(out, "ping", {})
  end
  if not order then
    order = { text }
    for _, d in ipairs(deltas or {}) do if d.id then order[#order + 1] = d.index end end
  end
  for _, x in ipairs(order) do
    if type(x) == "string" and x ~= "" then
      if a.block_type ~= "text" then open_block(out, a, { type = "text", text = "" }) end
      event(out, "content_block_delta", { index = a.block, delta = { type = "text_delta", text = x } })
    elseif type(x) == "number" then
      for _, d in ipairs(deltas) do
        local f = d["function"]
        if d.index == x and d.id then open_block(out, a, { type = "tool_use", id = d.id, name = f.name, input = {} }) end
        if d.index == x and f.arguments and f.arguments ~= "" then
          event(out, "content_block_delta", { index = a.block, delta = { type = "input_json_delta", partial_json = f.arguments } })
        end
      end
    end
  end
  if finish then
    close_block(out, a)
    local u = a.usage or { completion_tokens = 0 }
    event(out, "message_delta", { delta = { stop_reason = stop_reason({ finish_reason = finish, stop_sequence = a.stop_sequence }),
      stop_sequence = a.stop_sequence or json.null }, usage = { output_tokens = u.completion_tokens } })
    event(out, "message_stop", {})
  end
  return table.concat(out)
end

return M
