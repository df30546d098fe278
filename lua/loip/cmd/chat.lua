-- `loip chat`: chat with a loip serve (or any OpenAI-compatible) server, streaming.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local M = {
  brief = "chat with a loip serve (or any OpenAI-compatible) server, streaming",
  usage = "loip chat --url URL [--api-key KEY] [--model NAME] [--system TEXT]",
  summary = "Chat with an OpenAI-compatible server (loip serve, or another): each line you type is a user\n"
    .. "message, the reply streams as it is generated, and the conversation is kept (/reset clears it,\n"
    .. "/exit or end of input leaves, /help lists the commands). Without a terminal, reads one message per\n"
    .. "line from stdin.",
  flags = {
    { "url", "string", "the API's base URL, e.g. http://127.0.0.1:8080/v1", required = true },
    { "api-key", "string", "sent as Authorization: Bearer KEY (default: LOIP_API_KEY, else OPENAI_API_KEY)", metavar = "KEY" },
    { "model", "string", "the model to ask (default: the server's first, from /models)", metavar = "NAME" },
    { "system", "string", "a system message first", metavar = "TEXT" },
    { "max-tokens", "int", "tokens per reply at most", check = function(v) return v >= 1, "must be >= 1" end },
    { "temperature", "number", "sampling temperature (server default if not given)",
      check = function(v) return v >= 0 and v <= 2, "must be in [0, 2]" end },
  },
}

function M.run(o)
  local client = require "loip.runtime.http_client"
  local json = require "loip.text.json"
  local url = o.url:gsub("/+$", "")
  local key = o.api_key or os.getenv("LOIP_API_KEY") or os.getenv("OPENAI_API_KEY")
  local headers = key and key ~= "" and { Authorization = "Bearer " .. key } or {}
  local cl = client.new()
  local function fail_of(t)
    local e = json.decode(t.body or "")
    local msg = type(e) == "table" and type(e.error) == "table" and e.error.message or t.error or (t.body or ""):sub(1, 200)
    -- a bare 404 from a URL without the API's version: the usual mistake, said
    local hint = t.status == 404 and not url:match("/v%d+$")
      and string.format(" (the API's base URL ends in /v1 on loip serve and OpenAI-compatible servers: try --url %s/v1)", url) or ""
    return string.format("%s: %s%s%s", url, t.status and t.status > 0 and ("HTTP " .. t.status .. ": ") or "", tostring(msg), hint)
  end
  local model = o.model
  if not model then
    local t = cl:get(url .. "/models", headers)
    cl:wait(30000)
    local list = t.status == 200 and json.decode(t.body)
    if not (list and type(list.data) == "table" and list.data[1]) then error("chat: cannot list the models: " .. fail_of(t), 0) end
    model = list.data[1].id
  end
  local interactive = LOIP_INTERACTIVE
  local history = {}
  if o.system then history[1] = { role = "system", content = o.system } end
  if interactive then io.stderr:write(string.format("chatting with %s at %s (/help, /reset, /exit)\n", model, url)) end
  while true do
    local line
    if interactive then line = loip_readline("you> ") else line = io.read("*l") end
    if line == nil or line == "/exit" then break end
    if line == "/reset" then
      history = o.system and { { role = "system", content = o.system } } or {}
      io.stderr:write("(history cleared)\n")
    elseif line == "/help" then
      io.stderr:write("/reset clears the conversation, /exit (or end of input) leaves, /help shows this; "
        .. "a line that starts with // is sent as a message with one / less\n")
    elseif line:match("^/[%w_-]*$") then -- a command, never a message to the model
      io.stderr:write(string.format("chat: no command %s (/help lists them; //%s sends it as a message)\n", line, line:sub(2)))
    elseif line:match("%S") then
      if line:sub(1, 2) == "//" then line = line:sub(2) end
      if interactive then loip_history("add", line) end
      history[#history + 1] = { role = "user", content = line }
      local body = { model = model, messages = history, stream = true, max_tokens = o.max_tokens, temperature = o.temperature }
      local t = cl:post(url .. "/chat/completions", json.encode(body), headers)
      local reply = {}
      t.on_event = function(_, data)
        if data == "[DONE]" then return end
        local e = json.decode(data)
        local c = e and type(e.choices) == "table" and e.choices[1]
        local piece = c and type(c.delta) == "table" and c.delta.content
        if type(piece) == "string" then
          reply[#reply + 1] = piece
          io.stdout:write(piece)
          io.stdout:flush()
        end
      end
      cl:wait(3600 * 1000)
      io.stdout:write("\n") -- each reply ends its line now, also into a pipe (the next waits for input)
      io.stdout:flush()
      if t.status ~= 200 then
        history[#history] = nil
        io.stderr:write("chat: ", fail_of(t), "\n")
        if not interactive then cl:close() return 1 end
      else
        history[#history + 1] = { role = "assistant", content = table.concat(reply) }
      end
    end
  end
  cl:close()
  return 0
end

return M
