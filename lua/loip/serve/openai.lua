-- The OpenAI API's shapes: a request body checked field by field into what the batcher needs
-- (or an error naming the field, with the status OpenAI gives), and the response objects and
-- streamed chunks built from a finished or running request. No I/O here.
local json = require "loip.text.json"
local tools = require "loip.serve.tools"
local utf8 = require "loip.text.utf8"
local request_draft = require "loip.serve.request_draft"

local M = {}

local EMPTY = "__loip_empty_array__" -- encodes as [] (this cjson has no array marker)
M.EMPTY_ARRAY = EMPTY

function M.encode(v)
  return (json.encode(v):gsub('"__loip_empty_array__"', "[]"))
end

-- An error in OpenAI's shape: { status, body }.
function M.error(status, message, kind, param, code)
  return status, M.encode({ error = { message = message, type = kind or "invalid_request_error",
    param = param or json.null, code = code or json.null } })
end

-- Whether s is well-formed UTF-8 (cjson lets malformed bytes through).
M.utf8_valid = utf8.valid -- (loip.text.utf8: one check of UTF-8 for the project)

-- Fields each endpoint knows; those accepted and ignored are listed with what they must be.
local COMMON = { model = true, max_tokens = true, temperature = true, top_p = true, seed = true, stop = true, n = true,
  stream = true, stream_options = true, user = true, presence_penalty = true, frequency_penalty = true,
  logit_bias = true, logprobs = true, top_k = true, min_p = true, repetition_penalty = true, ignore_eos = true,
  grammar = true, draft = true, draft_tokens = true }
local CHAT = { messages = true, max_completion_tokens = true, response_format = true, top_logprobs = true, tools = true,
  tool_choice = true, parallel_tool_calls = true, reasoning_effort = true }
local COMPLETION = { prompt = true, echo = true, suffix = true, best_of = true }

local function null_or_nil(v) return v == nil or v == json.null end

local function bad(param, fmt, ...)
  return nil, { status = 400, message = string.format(fmt, ...), param = param, code = "invalid_value" }
end

local function number_in(body, k, lo, hi, integer)
  local v = body[k]
  if v == nil or v == json.null then return true end
  if type(v) ~= "number" then return false, string.format("'%s' must be a number, not %s", k, json.encode(v)) end
  if v ~= v or v == math.huge or v == -math.huge then return false, string.format("'%s' must be a finite number", k) end
  if integer and v ~= math.floor(v) then return false, string.format("'%s' must be an integer, not %s", k, tostring(v)) end
  if (lo and v < lo) or (hi and v > hi) then
    return false, string.format("'%s' is %s; it must be in [%s, %s]", k, tostring(v), tostring(lo or "-inf"), tostring(hi or "inf"))
  end
  return true
end

-- logprobs: chat's `logprobs` (true/false) with `top_logprobs` (0..20), or completions'
-- `logprobs` (0..5, the alternatives): the number of alternatives per token, or nil.
local function parse_logprobs(kind, body)
  local lp, top = body.logprobs, body.top_logprobs
  if lp == json.null then lp = nil end
  if top == json.null then top = nil end
  if kind == "chat" then
    if lp ~= nil and type(lp) ~= "boolean" then return nil, "logprobs", "'logprobs' must be true or false" end
    if top ~= nil then
      if type(top) ~= "number" or top ~= math.floor(top) or top < 0 or top > 20 then
        return nil, "top_logprobs", "'top_logprobs' must be an integer in [0, 20]"
      end
      if lp ~= true then return nil, "top_logprobs", "'top_logprobs' needs 'logprobs': true" end
    end
    return lp == true and (top or 0) or nil
  end
  if lp == nil or lp == false then return nil end
  if type(lp) ~= "number" or lp ~= math.floor(lp) or lp < 0 or lp > 5 then
    return nil, "logprobs", "'logprobs' must be an integer in [0, 5] (the alternatives per token)"
  end
  return lp
end

-- response_format (chat) and llama.cpp's `grammar` (GBNF text): spec.format = { type = "text" |
-- "json_object" | "json_schema", name, schema, strict } or { type = "grammar", gbnf = text }.
local function parse_format(kind, body)
  local rf, g = body.response_format, body.grammar
  if rf == json.null then rf = nil end
  if g == json.null then g = nil end
  if g ~= nil then
    if type(g) ~= "string" or g == "" then return nil, "grammar", "'grammar' must be a non-empty string (GBNF)" end
    if rf ~= nil then return nil, "grammar", "give 'grammar' or 'response_format', not both" end
    return { type = "grammar", gbnf = g }
  end
  if rf == nil then return nil end
  if type(rf) ~= "table" or #rf > 0 then return nil, "response_format", "'response_format' must be an object" end
  if rf.type == "text" then return nil end
  if rf.type == "json_object" then return { type = "json_object" } end
  if rf.type ~= "json_schema" then
    return nil, "response_format.type", string.format("'response_format.type' must be text, json_object or json_schema, not %s",
      json.encode(rf.type))
  end
  local js = rf.json_schema
  if type(js) ~= "table" or js == json.null or #js > 0 then
    return nil, "response_format.json_schema", "'response_format.json_schema' must be an object {name, schema, strict}"
  end
  if type(js.name) ~= "string" or not js.name:match("^[%w_%-]+$") or #js.name > 64 then
    return nil, "response_format.json_schema.name", "'response_format.json_schema.name' must be 1-64 letters, digits, _ or -"
  end
  local schema = js.schema
  if schema == nil or schema == json.null then schema = {} end -- (OpenAI: absent, any JSON)
  if type(schema) ~= "table" and type(schema) ~= "boolean" then
    return nil, "response_format.json_schema.schema", "'response_format.json_schema.schema' must be a JSON schema (an object)"
  end
  if js.strict ~= nil and js.strict ~= json.null and type(js.strict) ~= "boolean" then
    return nil, "response_format.json_schema.strict", "'response_format.json_schema.strict' must be true or false"
  end
  return { type = "json_schema", name = js.name, schema = schema, strict = js.strict == true }
end

-- The sampling fields of body into spec s (the numbers' ranges, n, logprobs, format, stream,
-- ignore_eos, max_tokens, the sampler, seed): true, or nil and the error (as M.parse's).
local function parse_sampling(kind, s, body)
  for _, c in ipairs({ { "temperature", 0, 2 }, { "top_p", 0, 1 }, { "max_tokens", 1, nil, true },
    { "max_completion_tokens", 1, nil, true }, { "seed", nil, nil, true }, { "n", 1, 128, true },
    { "presence_penalty", -2, 2 }, { "frequency_penalty", -2, 2 }, { "top_k", 0, nil, true }, { "min_p", 0, 1 },
    { "repetition_penalty", 0.01, 10 } }) do
    local ok, why = number_in(body, c[1], c[2], c[3], c[4])
    if not ok then return bad(c[1], "%s", why) end
  end
  s.n = body.n ~= json.null and body.n or 1
  if (body.presence_penalty or 0) ~= 0 or (body.frequency_penalty or 0) ~= 0 then
    return bad(body.presence_penalty and "presence_penalty" or "frequency_penalty",
      "presence and frequency penalties are not supported (use repetition_penalty)")
  end
  local lp, lp_param, lp_why = parse_logprobs(kind, body)
  if lp_param then return bad(lp_param, "%s", lp_why) end
  s.logprobs = lp
  local fmt, f_param, f_why = parse_format(kind, body)
  if f_param then return bad(f_param, "%s", f_why) end
  s.format = fmt
  if body.logit_bias ~= nil and body.logit_bias ~= json.null and (type(body.logit_bias) ~= "table" or next(body.logit_bias)) then
    return bad("logit_bias", "'logit_bias' is not supported")
  end
  if body.stream ~= nil and type(body.stream) ~= "boolean" then return bad("stream", "'stream' must be true or false") end
  s.stream = body.stream == true
  if body.ignore_eos ~= nil and body.ignore_eos ~= json.null and type(body.ignore_eos) ~= "boolean" then
    return bad("ignore_eos", "'ignore_eos' must be true or false, not %s", json.encode(body.ignore_eos))
  end
  s.ignore_eos = body.ignore_eos == true
  if body.stream_options ~= nil and body.stream_options ~= json.null then
    if type(body.stream_options) ~= "table" then return bad("stream_options", "'stream_options' must be an object") end
    s.include_usage = body.stream_options.include_usage == true
  end
  local mt = body.max_completion_tokens
  if mt == nil or mt == json.null then mt = body.max_tokens end
  if mt == json.null then mt = nil end
  s.max_tokens = mt
  s.sampler = { temperature = body.temperature ~= json.null and body.temperature or 1, top_p = body.top_p ~= json.null and body.top_p or 1,
    top_k = body.top_k ~= json.null and body.top_k or 0, min_p = body.min_p ~= json.null and body.min_p or 0,
    repetition_penalty = body.repetition_penalty ~= json.null and body.repetition_penalty or 1 }
  if body.seed ~= nil and body.seed ~= json.null then s.seed = body.seed end
  return true
end

-- body.stop into s.stop (a list of strings): true, or nil and the error.
local function parse_stop(s, body)
  local stop = body.stop
  if stop == nil or stop == json.null then s.stop = {}
  elseif type(stop) == "string" then s.stop = stop ~= "" and { stop } or {}
  elseif type(stop) == "table" then
    if #stop > 4 then return bad("stop", "'stop' holds at most 4 sequences, not %d", #stop) end
    s.stop = {}
    for i, x in ipairs(stop) do
      if type(x) ~= "string" or x == "" then return bad("stop", "'stop' item %d must be a non-empty string", i - 1) end
      s.stop[i] = x
    end
  else return bad("stop", "'stop' must be a string or an array of strings") end
  return true
end

-- A chat's messages (and tools) into s.messages: true, or nil and the error.
local function parse_messages(s, body, text)
  if type(body.messages) ~= "table" or body.messages == json.null or #body.messages == 0 then
    return bad("messages", "'messages' must be a non-empty array of {role, content}")
  end
  s.messages = {}
  for i, m in ipairs(body.messages) do
    if type(m) ~= "table" or m == json.null then return bad("messages", "messages[%d] must be an object", i - 1) end
    local role = m.role
    if role ~= "system" and role ~= "user" and role ~= "assistant" and role ~= "developer" and role ~= "tool" then
      return bad("messages", "messages[%d].role must be system, developer, user, assistant or tool, not %s", i - 1, json.encode(role))
    end
    local content = m.content
    if null_or_nil(content) and tools.content_optional(m) then content = "" end
    if type(content) == "table" and content ~= json.null then -- parts: text only
      local parts = {}
      for j, p in ipairs(content) do
        if type(p) ~= "table" or p.type ~= "text" or type(p.text) ~= "string" then
          return bad("messages", "messages[%d].content[%d]: only {\"type\": \"text\", \"text\": ...} parts are supported", i - 1, j - 1)
        end
        parts[#parts + 1] = p.text
      end
      content = table.concat(parts)
    end
    if type(content) ~= "string" then
      return bad("messages", "messages[%d].content must be a string or an array of text parts", i - 1)
    end
    s.messages[i] = { role = role == "developer" and "system" or role, content = content }
    local terr = tools.message(s.messages[i], m, i - 1)
    if terr then return nil, terr end
  end
  local terr = tools.check(body, s, text)
  if terr then return nil, terr end
  -- reasoning_effort: the chat template's variable of that name (gpt-oss's "Reasoning: ..."), as vLLM passes it
  local effort = body.reasoning_effort
  if not null_or_nil(effort) then
    if effort ~= "low" and effort ~= "medium" and effort ~= "high" then
      return bad("reasoning_effort", "'reasoning_effort' must be \"low\", \"medium\" or \"high\", not %s", json.encode(effort))
    end
    s.template_vars = { reasoning_effort = effort }
  end
  return true
end

-- A completion's prompt (text or ids) into s.prompt or s.prompt_ids: true, or nil and the error.
local function parse_prompt(s, body)
  local p = body.prompt
  if type(p) == "table" and p ~= json.null and #p == 1 and type(p[1]) == "string" then p = p[1] end
  if type(p) == "string" then
    s.prompt = p -- "": from the start of a document (the BOS alone), as OpenAI's API and loip generate do
  elseif type(p) == "table" and p ~= json.null and #p > 0 and type(p[1]) == "number" then
    for i, id in ipairs(p) do
      if type(id) ~= "number" or id ~= math.floor(id) or id < 0 then return bad("prompt", "'prompt' token %d is not a token id", i - 1) end
    end
    s.prompt_ids = p
  else
    return bad("prompt", "'prompt' must be a string (or one string in an array, or a non-empty array of token ids)")
  end
  if body.echo == true then return bad("echo", "'echo' is not supported") end
  if body.suffix ~= nil and body.suffix ~= json.null then return bad("suffix", "'suffix' is not supported") end
  if body.best_of ~= nil and body.best_of ~= json.null and body.best_of ~= 1 then return bad("best_of", "'best_of' must be 1") end
  return true
end

-- Check an endpoint's body. kind: "chat" or "completion". Returns a spec { model, messages |
-- prompt (string, "" for the start of a document, or ids), max_tokens (nil: to the end of the
-- context), sampler, seed, stop (list of strings), ignore_eos (llama.cpp's server's: the model's
-- end tokens do not stop it), stream, include_usage, logprobs (alternatives per token, or nil),
-- format (response_format or grammar: parse_format), n, draft and draft_tokens (a request's own
-- drafts, loip.serve.request_draft) }, or nil and { status, message, param, code }.
function M.parse(kind, text)
  if not M.utf8_valid(text) then
    return nil, { status = 400, message = "the request body is not valid UTF-8", code = "invalid_encoding" }
  end
  local body, err = json.decode(text)
  if type(body) ~= "table" or body == json.null or #body > 0 then
    return nil, { status = 400, message = body == nil and ("the request body is not valid JSON: " .. tostring(err))
      or "the request body must be a JSON object", code = "invalid_json" }
  end
  local known = kind == "chat" and CHAT or COMPLETION
  for k in pairs(body) do
    if not COMMON[k] and not known[k] then
      return nil, { status = 400, message = "Unrecognized request argument supplied: " .. tostring(k), param = k,
        code = "unknown_parameter" }
    end
  end
  local s = { kind = kind }
  if type(body.model) ~= "string" or body.model == "" then return bad("model", "'model' is required: a string naming the model") end
  s.model = body.model
  local ok, e = parse_sampling(kind, s, body)
  if ok then ok, e = parse_stop(s, body) end
  if ok then
    local dp, why = request_draft.parse(body, s) -- (loip's draft, draft_tokens: loip.serve.request_draft)
    if dp then ok, e = bad(dp, "%s", why) end
  end
  if ok and kind == "chat" then ok, e = parse_messages(s, body, text)
  elseif ok then ok, e = parse_prompt(s, body) end
  if not ok then return nil, e end
  return s
end

-- Text that stops at the first of several strings: put(piece) -> the text that may be shown now
-- (what could still begin a stop string is held back), whether a stop string was met, and which.
function M.stopper(stops)
  local held, longest = "", 0
  for _, x in ipairs(stops) do longest = math.max(longest, #x) end
  local st = {}
  function st.put(piece)
    local buf = held .. piece
    local at
    for _, x in ipairs(stops) do
      local i = buf:find(x, 1, true)
      if i and (not at or i < at) then at = i end
    end
    if at then
      held = ""
      local which
      for _, x in ipairs(stops) do if buf:find(x, 1, true) == at and (not which or #x > #which) then which = x end end
      return buf:sub(1, at - 1), true, which
    end
    -- hold the longest tail of buf that a stop string begins with
    local keep = 0
    for k = math.min(longest - 1, #buf), 1, -1 do
      local tail = buf:sub(-k)
      for _, x in ipairs(stops) do
        if x:sub(1, k) == tail then keep = k break end
      end
      if keep > 0 then break end
    end
    held = keep > 0 and buf:sub(-keep) or ""
    -- never cut a UTF-8 character: move back to a character's start
    local cut = #buf - keep
    while cut > 0 and cut < #buf and bit.band(buf:byte(cut + 1), 0xC0) == 0x80 do cut = cut - 1 end
    held = buf:sub(cut + 1)
    return buf:sub(1, cut), false
  end
  function st.rest() local r = held held = "" return r end
  return st
end

-- The response object of a finished request (r: id, created, model, usage, choices: each { text,
-- finish_reason, logprobs (loip.serve.logprobs' object, or nil), message (chat: fields of the
-- message beside role and content, e.g. tool_calls) }).
function M.response(kind, r)
  local choices = {}
  for i, c in ipairs(r.choices) do
    local lp = c.logprobs or json.null
    if kind == "chat" then
      local msg = { role = "assistant", content = c.text == nil and json.null or c.text } -- (nil: only tool calls)
      for k, v in pairs(c.message or {}) do msg[k] = v end
      choices[i] = { index = i - 1, message = msg, finish_reason = c.finish_reason, logprobs = lp }
    else
      choices[i] = { index = i - 1, text = c.text, finish_reason = c.finish_reason, logprobs = lp }
    end
  end
  return M.encode({ id = r.id, object = kind == "chat" and "chat.completion" or "text_completion", created = r.created,
    model = r.model, choices = choices, usage = r.usage, system_fingerprint = "loip" })
end

-- The end of a stream: after the last event, and after an error's body.
M.DONE = "data: [DONE]\n\n"
function M.stream_error(body) return "data: " .. body .. "\n\n" .. M.DONE end

-- One server-sent event of a stream: the delta (text, tool-call deltas, reasoning) or the end
-- (finish_reason), or usage, of choice r.index (r: id, created, model, first_chunk (the role goes
-- with it), index); logprobs: those of the tokens it carries (loip.serve.logprobs), or nil;
-- reasoning: delta.reasoning_content, as llama.cpp's server streams it.
function M.chunk(kind, r, text, finish_reason, usage, logprobs, tool_deltas, reasoning)
  local choice
  if kind == "chat" then
    local delta = {}
    if r.first_chunk then delta.role = "assistant" end
    if text then delta.content = text end
    if reasoning then delta.reasoning_content = reasoning end
    if tool_deltas and #tool_deltas > 0 then delta.tool_calls = tool_deltas end
    choice = { index = r.index or 0, delta = delta, finish_reason = finish_reason or json.null, logprobs = logprobs or json.null }
  else
    choice = { index = r.index or 0, text = text or "", finish_reason = finish_reason or json.null, logprobs = logprobs or json.null }
  end
  local obj = { id = r.id, object = kind == "chat" and "chat.completion.chunk" or "text_completion", created = r.created,
    model = r.model, choices = usage and EMPTY or { choice }, system_fingerprint = "loip" }
  if usage then obj.usage = usage end
  return "data: " .. M.encode(obj) .. "\n\n"
end

return M
