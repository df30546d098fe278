// The official OpenAI client, unchanged, against `loip serve` with tools: tool_choice "none" and
// "auto" accepted, calls (from the parser the server was started with) the same streamed and not,
// a conversation carrying tool_calls and a tool message answered, and bad tool requests refused
// with the field named. Prints one JSON object; spec/integration/serve_tools_spec.lua checks it.
// Usage: node tools.mjs BASE_URL API_KEY MODEL
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const out = {};

const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const base = { model, messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 40, temperature: 0, tools };

function shape(c) {
  return { content: c.message.content, finish: c.finish_reason,
    calls: (c.message.tool_calls ?? []).map((t) => ({ id: t.id, type: t.type, name: t.function.name, arguments: t.function.arguments })) };
}

// a stream put together from its deltas, as a client does
async function streamed(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let content = "", finish = null, usage = null, chunks = 0;
  const calls = [];
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta?.content ?? "";
    for (const d of c.delta?.tool_calls ?? []) {
      if (!calls[d.index]) calls[d.index] = { id: d.id, type: d.type, name: d.function?.name, arguments: "" };
      calls[d.index].arguments += d.function?.arguments ?? "";
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, finish, calls, usage, chunks };
}

async function error(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return { status: e.status ?? null, param: e.param ?? null, message: e.message };
  }
}

const none = await client.chat.completions.create({ ...base, tool_choice: "none" });
out.none = shape(none.choices[0]);
const auto = await client.chat.completions.create({ ...base, tool_choice: "auto" });
out.auto = { ...shape(auto.choices[0]), usage: auto.usage };
out.auto_stream = await streamed({ ...base, tool_choice: "auto" });
// the calls sent back with their answer: the model goes on
const call = auto.choices[0].message.tool_calls?.[0] ??
  { id: "call_0123456789abcdef01234567", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } };
const convo = { ...base, messages: [...base.messages, { role: "assistant", content: null, tool_calls: [call] },
  { role: "tool", tool_call_id: call.id, content: "{\"weather\": \"sunny\"}" }] };
const answered = await client.chat.completions.create({ ...convo, tool_choice: "none" });
out.answered = { ...shape(answered.choices[0]), usage: answered.usage };
out.answered_stream = await streamed({ ...convo, tool_choice: "none" });

out.errors = {
  no_name: await error(() => client.chat.completions.create({ ...base, tools: [{ type: "function", function: { description: "x" } }] })),
  bad_name: await error(() => client.chat.completions.create({ ...base, tools: [...tools, { type: "function", function: { name: "get weather" } }] })),
  unknown_choice: await error(() => client.chat.completions.create({ ...base, tool_choice: { type: "function", function: { name: "get_time" } } })),
  required_without_tools: await error(() => client.chat.completions.create({ ...base, tools: undefined, tool_choice: "required" })),
  arguments_object: await error(() => client.chat.completions.create({ ...base, messages: [...base.messages,
    { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } }] }] })),
  tool_without_id: await error(() => client.chat.completions.create({ ...base, messages: [...base.messages, { role: "tool", content: "x" }] })),
};
console.log(JSON.stringify(out));
