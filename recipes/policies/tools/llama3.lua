-- tools "llama3": Llama 3.1-3.3's JSON tool calls, {"name": ..., "parameters": {...}}, the whole output
-- (after spaces) or after <|python_tag|>; several separated by ";". Built-in tools' Python
-- (<|python_tag|>brave_search.call(...)) is not JSON and stays content. Serves the templates with
-- Llama 3's headers (<|start_header_id|>) that speak of tools.
--   loip serve --tool-parser llama3
-- (A tools parser: see recipes/policies/tools/hermes.lua for what each function does.)
local tc = require "loip.serve.tool_calls"

local M = { name = "llama3" }

-- the call syntax a grammar writes (tool_choice "required" or named)
M.syntax = { open = "", sep = "; ", close = "", args_key = "parameters" }

-- both run to the end of the output (the call is the whole message)
M.markers = { { open = "<|python_tag|>" }, { open = "{", keep = true, at_start = true } }

function M.calls(body)
  return tc.call_list(body, { "parameters", "arguments" }, ";")
end

function M.serves(template)
  return template:find("<|start_header_id|>", 1, true) ~= nil and template:find("tool", 1, true) ~= nil
end

return tc.family(M) -- parse, stream and grammar from the markers, calls and syntax
