-- fuzz_template: the Jinja engine chat templates run on (loip.text.template): the input is a
-- template, compiled, then rendered with a conversation, tools and the usual flags, as
-- loip.text.chat renders a model's chat_template.
local template = require "loip.text.template"
local vars = {
  messages = {
    { role = "system", content = "You are a helpful assistant." },
    { role = "user", content = "Hello, who are you?" },
    { role = "assistant", content = "I am a model.", tool_calls = { { type = "function",
      ["function"] = { name = "get_time", arguments = { zone = "UTC" } } } } },
    { role = "tool", content = "12:00" },
    { role = "user", content = { { type = "text", text = "And the date?" } } },
  },
  tools = { { type = "function", ["function"] = { name = "get_time", description = "the time",
    parameters = { type = "object", properties = { zone = { type = "string" } } } } } },
  add_generation_prompt = true, bos_token = "<s>", eos_token = "</s>",
}
-- A template error is the template's fault and is reported clearly; an "InternalError" (the
-- engine failed on its own code) is a bug, unless the fuzzer's own budget stopped it.
local function check(ok, err, info)
  if ok or not info or info.type ~= "InternalError" then return end
  local msg = tostring(info.message)
  if msg:find("fuzz: instruction budget spent", 1, true) or msg:find("not enough memory", 1, true) then error(msg, 0) end
  error("assertion failed: the template engine failed on its own code: " .. msg, 0)
end
return function(data)
  local t, err, info = template.compile(data)
  check(t, err, info)
  if t then check(t:render(vars, { now = 0 })) end
end
