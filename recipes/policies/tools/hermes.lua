-- tools "hermes": tool calls as Hermes 2 Pro writes them (NousResearch's format), the fallback
-- for a chat template no other parser serves: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
-- one or more, anywhere in the output; what is not a well-formed call stays content.
--   loip serve --tool-parser hermes
-- A tools parser (loip.policy kind "tools"): serves(template) -> whether it is the family's
-- template; parse(text) -> content, tool_calls; stream(opts) -> { put(piece), finish() } (text
-- to show now and OpenAI's tool-call deltas); grammar(req) -> GBNF of the call syntax (req:
-- tools, choice, parallel, schema_gbnf). loip.serve.tool_calls makes the three from M.markers,
-- M.calls and M.syntax (tc.family); a file may write any of them itself.
local tc = require "loip.serve.tool_calls"

local M = { name = "hermes" }

-- the call syntax a grammar writes (tool_choice "required" or named)
M.syntax = { open = "<tool_call>\n", sep = "\n</tool_call>\n<tool_call>\n", close = "\n</tool_call>" }

M.markers = { { open = "<tool_call>", close = "</tool_call>" } }

-- A region's text (between the markers) -> { { name, arguments } } or nil (not a call).
function M.calls(body)
  return tc.call_list(body, { "arguments", "parameters" })
end

function M.serves()
  return true -- the fallback: any template
end

return tc.family(M) -- parse, stream and grammar from the markers, calls and syntax
