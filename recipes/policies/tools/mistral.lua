-- tools "mistral": Mistral's tool calls (v0.3 tokenizer), [TOOL_CALLS] and a JSON array of
-- {"name": ..., "arguments": {...}} (an "id" beside them is ignored: the server gives its own).
-- Serves the templates that write [TOOL_CALLS].
--   loip serve --tool-parser mistral
-- (A tools parser: see recipes/policies/tools/hermes.lua for what each function does.)
local tc = require "loip.serve.tool_calls"

local M = { name = "mistral" }

-- the call syntax a grammar writes (tool_choice "required" or named)
M.syntax = { open = "[TOOL_CALLS][", sep = ", ", close = "]" }

M.markers = { { open = "[TOOL_CALLS]", json = true } }

function M.calls(body)
  return tc.call_list(body, { "arguments" }, nil, true)
end

function M.serves(template)
  return template:find("[TOOL_CALLS]", 1, true) ~= nil
end

return tc.family(M) -- parse, stream and grammar from the markers, calls and syntax
