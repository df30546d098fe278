-- fuzz_openai: the body of an OpenAI API request as loip serve reads it (loip.serve.openai.parse):
-- the JSON, then every field's type and range; a chat request's messages. The first byte picks
-- the endpoint (even: chat completions, odd: completions).
local openai = require "loip.serve.openai"
return function(data)
  local kind = #data > 0 and data:byte(1) % 2 == 1 and "completion" or "chat"
  openai.parse(kind, data:sub(2))
end
