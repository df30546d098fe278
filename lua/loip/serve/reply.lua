-- The reply to one API request (loip.serve.server): its n choices, each a request of the batcher,
-- turned into text as their tokens come (detokenized, stop strings held back, logprobs), streamed
-- as server-sent events (each chunk naming its choice's index) or answered when the last choice
-- ends. A client that hangs up cancels every choice; a choice that fails fails the reply.
--
--   local rp = reply.new(server, { http = req, spec, kind, ids (the prompt), requests = { r1, ... } })
--   -- then the batcher calls rp:on_token(c, id) and rp:on_done(c) for each choice c
local openai = require "loip.serve.openai"
local tools = require "loip.serve.tools"
local logprobs = require "loip.serve.logprobs"
local text_stream = require("loip.text.tokenizer").text_stream

local M = {}

local Reply = {}
Reply.__index = Reply

local function log(fmt, ...) io.stderr:write(os.date("%H:%M:%S "), string.format(fmt, ...), "\n") io.stderr:flush() end

local function random_id(prefix, n)
  local f = io.open("/dev/urandom", "rb")
  local b = f:read(12)
  f:close()
  return prefix .. (b:gsub(".", function(c) return string.format("%02x", c:byte()) end)) .. string.format("%x", n)
end

-- o: http (the HTTP request), spec (openai.parse's), kind ("chat" | "completion"), ids (the
-- prompt's ids), requests (the batcher's, one per choice), seq (the server's count: ids), api
-- (loip.serve.openai, or loip.serve.anthropic for kind "messages").
function M.new(srv, o)
  local rp = setmetatable({ srv = srv, http = o.http, spec = o.spec, kind = o.kind, n_prompt = #o.ids, prompt_last = o.ids[#o.ids],
    id = random_id(o.kind == "messages" and "msg_" or o.kind == "chat" and "chatcmpl-" or "cmpl-", o.seq), created = os.time(),
    model = srv.name, choices = {}, left = #o.requests, api = o.api or openai }, Reply)
  for i, r in ipairs(o.requests) do
    local c = { reply = rp, index = i - 1, request = r, parts = {}, stopper = openai.stopper(o.spec.stop), first_chunk = true,
      stream = text_stream(srv.tok, o.ids), lp_sent = 0, lp_offset = 0 }
    local p, wanted = srv.tool_parser, tools.wanted(o.spec)
    -- the model's calls parsed out of its text (and, for a parser of channels, its reasoning
    -- apart from its content in every chat reply: harmony's)
    if p and (wanted or (p.channels and o.kind ~= "completion")) then
      c.tools = p.stream({ parallel = o.spec.parallel_tool_calls, id_prefix = rp.api.call_id_prefix, calls = wanted })
      c.order = {} -- text and calls in the order they came (loip.serve.tool_calls' parts)
      c.reasoning = {}
    end
    rp.choices[i] = c
    srv.active[r] = c
  end
  if o.spec.stream then
    o.http:stream_begin(200, "text/event-stream", { ["Cache-Control"] = "no-cache" })
    if o.kind ~= "completion" then -- the role first, as OpenAI does (Anthropic's message_start)
      for _, c in ipairs(rp.choices) do rp:send_chunk(c, "") end
    end
  end
  for _, c in ipairs(rp.choices) do
    c.request.on_token = function(_, id) rp:on_token(c, id) end
    c.request.on_done = function() rp:on_done(c) end
  end
  for _, c in ipairs(rp.choices) do
    if c.request.state == "done" then rp:on_done(c) end
  end
  return rp
end

-- The logprobs of c's tokens not yet sent (streamed: with the chunk that carries their text, or
-- the last), or of all of them; nil when not asked for.
function Reply:logprobs_of(c, all)
  local list = c.request.token_logprobs
  if not self.spec.logprobs or not list then return nil end
  local first = all and 1 or c.lp_sent + 1
  if first > #list and not all then return nil end
  local prev = first > 1 and list[first - 1].id or self.prompt_last
  c.lp_sent = #list
  local lp = logprobs
  if self.kind == "chat" then return lp.chat(self.srv.tok, prev, list, first, #list) end
  local o
  o, c.lp_offset = lp.completion(self.srv.tok, prev, list, first, #list, all and 0 or c.lp_offset)
  return o
end

function Reply:send_chunk(c, text, finish, usage, tool_deltas, order, reasoning)
  local ev
  if self.api == openai then
    local lp = c and not usage and self:logprobs_of(c) or nil
    ev = openai.chunk(self.kind, { id = self.id, created = self.created, model = self.model,
      first_chunk = c and c.first_chunk, index = c and c.index or 0 }, text, finish, usage, lp, tool_deltas, reasoning)
  else -- Anthropic's events: one choice, c keeping its blocks' state (reasoning is not sent)
    if text == nil and not tool_deltas and not finish and not usage and reasoning then return true end
    c.id, c.model, c.n_prompt = self.id, self.model, self.n_prompt
    ev = self.api.chunk(self.kind, c, text, finish, usage, tool_deltas, order)
  end
  local ok = self.http:write(ev)
  if c then c.first_chunk = false end
  if not ok then self.client_gone = true end
  return ok
end

-- Text to the client (through the tool-call parser, which holds back what may begin a call;
-- final: the end of the output).
function Reply:emit(c, text, final)
  local deltas, order, reasoning
  if c.tools then
    text, deltas, order, reasoning = c.tools.put(text)
    if final then
      local t, d, o, r = c.tools.finish()
      text, reasoning = text .. t, (reasoning or "") .. (r or "")
      for _, x in ipairs(d) do deltas[#deltas + 1] = x end
      for _, x in ipairs(o) do order[#order + 1] = x end
    end
    for _, x in ipairs(order) do c.order[#c.order + 1] = x end
    if not deltas[1] then deltas = nil end
    if reasoning == "" then reasoning = nil end
    if reasoning then c.reasoning[#c.reasoning + 1] = reasoning end
  end
  if text == "" and not deltas and not reasoning then return end
  if text ~= "" then c.parts[#c.parts + 1] = text end
  if self.spec.stream and not self.client_gone then
    self:send_chunk(c, text ~= "" and text or nil, nil, nil, deltas, order, reasoning)
  end
end

function Reply:on_token(c, id)
  local show, stopped, which = c.stopper.put(c.stream:put(id))
  self:emit(c, show)
  if stopped then
    c.stop_string, c.stop_sequence = true, which
    c.request:cancel()
  end
end

-- Every choice still running is cancelled (the client hung up, the server stops, one failed).
function Reply:cancel_all()
  for _, c in ipairs(self.choices) do c.request:cancel() end
end

-- The body of an error ending the reply: streamed as an event, else the answer.
function Reply:fail(status, message, kind, code)
  local st, body = self.api.error(status, message, kind, nil, code)
  if self.spec.stream then self.http:finish(self.api.stream_error(body))
  else self.http:respond(st, "application/json", body) end
end

-- The connection of a client that hung up is let go once no choice runs.
function Reply:release_when_done()
  if self.left == 0 and self.release and not self.released then
    self.released = true
    self.http:release()
  end
end

function Reply:on_done(c)
  if c.finished then return end
  c.finished = true
  local r = c.request
  local srv = self.srv
  srv.active[r] = nil
  self.left = self.left - 1
  if self.closed then return self:release_when_done() end
  if self.shutdown then
    self.closed = true
    self:cancel_all()
    return self:fail(503, "the server is stopping", "server_error", "stopping")
  end
  if self.client_gone or (self.http:cancelled() and not c.stop_string) then
    srv.metrics:add("loip_requests_cancelled_total", "requests whose client hung up", 1)
    self.closed, self.release = true, true
    self:cancel_all()
    return self:release_when_done()
  end
  if r.finish_reason == "error" then
    log("request %s failed: %s", self.id, tostring(r.error))
    srv.metrics:add("loip_requests_failed_total", "requests that failed", 1)
    self.closed = true
    self:cancel_all()
    return self:fail(500, tostring(r.error), "server_error", "engine_error")
  end
  if not c.stop_string then -- what the detokenizer and the stop strings held back
    local show, stopped, which = c.stopper.put(c.stream:finish())
    self:emit(c, show)
    if stopped then c.stop_string, c.stop_sequence = true, which else self:emit(c, c.stopper.rest()) end
  end
  if c.tools then self:emit(c, "", true) end
  c.calls = c.tools and c.tools.tool_calls()
  c.finish = c.calls and "tool_calls" or (c.stop_string or r.finish_reason == "stop") and "stop" or "length"
  srv:count_done(r, c.finish, self.n_prompt, c)
  c.usage = { completion_tokens = #r.token_ids } -- (Anthropic's message_delta carries it)
  if self.spec.stream then self:send_chunk(c, nil, c.finish) end
  if self.left == 0 then self:finish() end
end

-- Every choice ended: the usage (and the answer, not streamed).
function Reply:finish()
  self.closed = true
  local generated, cached = 0, 0
  for _, c in ipairs(self.choices) do
    generated = generated + #c.request.token_ids
    cached = math.max(cached, c.request.cached_tokens or 0)
  end
  local usage = { prompt_tokens = self.n_prompt, completion_tokens = generated, total_tokens = self.n_prompt + generated,
    prompt_tokens_details = { cached_tokens = cached } }
  if self.spec.stream then
    if self.spec.include_usage then self:send_chunk(nil, nil, nil, usage) end
    self.http:finish(self.api.DONE)
  else
    local choices = {}
    for i, c in ipairs(self.choices) do
      local text = table.concat(c.parts)
      if c.calls and text:match("^%s*$") then text = nil end -- content null: only calls
      local reasoning = c.reasoning and c.reasoning[1] and table.concat(c.reasoning) or nil
      choices[i] = { text = text, finish_reason = c.finish, logprobs = self:logprobs_of(c, true),
        message = (c.calls or reasoning) and { tool_calls = c.calls, reasoning_content = reasoning } or nil }
    end
    local body
    if self.api == openai then
      body = openai.response(self.kind, { id = self.id, created = self.created, model = self.model, choices = choices, usage = usage })
    else -- (one choice)
      local c = self.choices[1]
      body = self.api.response(self.kind, { id = self.id, model = self.model, text = choices[1].text, finish_reason = c.finish,
        usage = usage, tool_calls = c.calls, stop_sequence = c.stop_sequence, order = c.order })
    end
    self.http:respond(200, "application/json", body)
  end
  if not self.srv.quiet then
    local t = self.choices[1].request:timings()
    log("%s: %d+%d tokens%s, %s, ttft %.0f ms, %.1f ms/token", self.id, self.n_prompt, generated,
      #self.choices > 1 and string.format(" in %d choices", #self.choices) or "", self.choices[1].finish, t.ttft_ms or 0,
      t.decode_ms_per_token or 0)
  end
end

return M
