-- The chat-template references with tools (models/chat-templates/reference*.json, rendered by
-- transformers' Jinja2) sent back through loip as an OpenAI client sends them: each case's
-- messages exported to OpenAI's request shape (arguments as JSON text; with reasoning, the
-- template's thinking as reasoning_content), parsed by loip.serve.openai, templated by
-- loip.serve.tools and loip.text.chat, and compared with the reference's text.
--
--   local n = require("spec.support.tool_references").check(path, { reasoning = true })
local json = require "loip.text.json"
local template = require "loip.text.template"
local openai = require "loip.serve.openai"
local tools = require "loip.serve.tools"
local T = require "spec.support"
local check = require "luassert" -- (busted's assert: a module does not see the spec's)

local M = {}

-- The request a client sends for reference case c: its messages in OpenAI's shape.
local function request(c, reasoning)
  local msgs = require("loip.text.template.convert").export(c.messages)
  for i, m in ipairs(msgs) do
    for j, call in ipairs(m.tool_calls or {}) do
      call["function"].arguments = template.tojson(c.messages[i].vals.tool_calls[j].vals["function"].vals.arguments)
    end
    if reasoning and m.thinking then m.reasoning_content, m.thinking = m.thinking, nil end
  end
  return '{"model": "m", "messages": ' .. json.encode(msgs) .. ', "tools": ' .. template.tojson(c.tools) .. "}"
end

-- Checks every case of the reference file at path that has tools, an expected text and no extra
-- template arguments (asserting each); returns how many it checked.
function M.check(path, opts)
  opts = opts or {}
  local dir = path:match("^(.*)/[^/]*$")
  local now = os.time({ year = 2024, month = 7, day = 26, hour = 0, min = 0, sec = 0 })
  local n = 0
  for _, case in ipairs(assert(template.ordered_decode(T.read(path)))) do
    local c = case.vals
    if c.tools and c.expected and #c.extra_kwargs.keys == 0 then
      local s = assert(openai.parse("chat", request(c, opts.reasoning)))
      local mdir = T.tmpdir()
      T.write(mdir .. "/tokenizer_config.json", json.encode({ bos_token = c.bos_token, eos_token = c.eos_token }))
      local tfile = dir .. "/" .. c.template .. ".jinja"
      local out = require("loip.text.chat").apply(mdir, tools.template_messages(s.messages, T.read(tfile)),
        { add_generation_prompt = c.add_generation_prompt, template_file = tfile, tools = s.template_tools, now = now })
      check.are.equal(c.expected, out, c.template .. " " .. c.case)
      n = n + 1
    end
  end
  return n
end

return M
