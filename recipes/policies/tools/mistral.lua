-- tools "mistral": Mistral's tool calls (v0.3 tokenizer), [TOOL_CALLS] and a JSON array of
-- {"name": ..., "arguments": {...}} (an "id" beside them is ignored: the server gives its own).
-- Serves the templates that write [TOOL_CALLS].
--   loip serve --tool-parser mistral
-- (A tools parser: see recipes/policies/tools/hermes.lua for what each function does.)
local tc = require "loip.serve.tool_calls"

local M = { name = "mistral" }

M.markers = { { open = "[TOOL_CALLS]", json = true } }

function M.calls(body)
  return tc.call_list(body, { "arguments" }, nil, true)
end

function M.serves(template)
  return template:find("[TOOL_CALLS]", 1, true) ~= nil
end

function M.parse(text) return tc.parse(M, text) end
function M.stream(opts) return tc.stream(M, opts) end

function M.grammar(req)
  return tc.gbnf_calls(req, { open = "[TOOL_CALLS][", sep = ", ", close = "]" })
end

return M
