-- tools "harmony": gpt-oss's harmony format (OpenAI), read channel by channel: `analysis` is
-- reasoning (reasoning_content), a message to=functions.NAME on `commentary` (its body
-- <|constrain|>json) a call of NAME, `final` (and a commentary preamble) content; whole or
-- streamed, no part of a marker ever shown. Serves the templates that write <|channel|> in
-- <|start|> turns. Its stream is used for every chat request (not only those with tools), since
-- the channels are always there: channels = true.
--   loip serve --tool-parser harmony
-- (A tools parser: see recipes/policies/tools/hermes.lua for what each function does; stream's
-- put and finish give a fourth value, the reasoning to show.)
local harmony = require "loip.serve.harmony"

local M = { name = "harmony", channels = true }

function M.serves(template)
  return template:find("<|channel|>", 1, true) ~= nil and template:find("<|start|>", 1, true) ~= nil
end

function M.parse(text) return harmony.parse(text) end
function M.stream(opts) return harmony.stream(opts) end
function M.grammar(req) return harmony.grammar(req) end

return M
