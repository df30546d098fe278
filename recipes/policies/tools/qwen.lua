-- tools "qwen": Qwen2.5's and Qwen3's tool calls, <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
-- (one or more); Qwen3's reasoning between <think> and </think> is content (shown as it comes), never a
-- call. Serves the templates that write <tool_call> in ChatML (<|im_start|>).
--   loip serve --tool-parser qwen
-- (A tools parser: see recipes/policies/tools/hermes.lua for what each function does.)
local tc = require "loip.serve.tool_calls"

local M = { name = "qwen" }

-- the call syntax a grammar writes (tool_choice "required" or named)
M.syntax = { open = "<tool_call>\n", sep = "\n</tool_call>\n<tool_call>\n", close = "\n</tool_call>" }

M.markers = { { open = "<think>", close = "</think>", text = true }, { open = "<tool_call>", close = "</tool_call>" } }

function M.calls(body)
  return tc.call_list(body, { "arguments" })
end

function M.serves(template)
  return template:find("<tool_call>", 1, true) ~= nil and template:find("<|im_start|>", 1, true) ~= nil
end

return tc.family(M) -- parse, stream and grammar from the markers, calls and syntax
