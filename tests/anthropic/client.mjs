// The official Anthropic client (npm "@anthropic-ai/sdk"), unchanged, against `loip serve`'s
// /v1/messages: a message streamed and not (the same content), the system prompt, stop
// sequences, tools (calls from the parser the server was started with) as tool_use blocks, a
// conversation with tool_use and tool_result blocks, x-api-key, and errors in Anthropic's shape.
// Prints one JSON object; spec/integration/serve_tools_spec.lua checks it.
// Usage: node client.mjs BASE_URL API_KEY MODEL
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
const out = {};

const tools = [{ name: "get_weather", description: "The weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
const base = { model, max_tokens: 40, temperature: 0, system: "You tell stories.", messages: [{ role: "user", content: "Once upon a time" }] };

function shape(m) {
  return { id: m.id, type: m.type, role: m.role, content: m.content, stop_reason: m.stop_reason, stop_sequence: m.stop_sequence, usage: m.usage };
}

async function error(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return { status: e.status ?? null, type: e.error?.error?.type ?? null, message: e.error?.error?.message ?? e.message };
  }
}

out.plain = shape(await client.messages.create(base));
const events = [];
const stream = client.messages.stream(base);
stream.on("streamEvent", (e) => events.push(e.type));
out.plain_stream = shape(await stream.finalMessage());
out.events = events;
out.stopped = shape(await client.messages.create({ ...base, stop_sequences: ["bird", "big"] }));

out.tools = shape(await client.messages.create({ ...base, system: undefined, tools, tool_choice: { type: "auto" } }));
out.tools_stream = shape(await client.messages.stream({ ...base, system: undefined, tools }).finalMessage());
const use = out.tools.content.find((b) => b.type === "tool_use") ?? { id: "toolu_01", name: "get_weather", input: { city: "Paris" } };
const convo = await client.messages.create({ ...base, tools, tool_choice: { type: "none" }, messages: [...base.messages,
  { role: "assistant", content: [{ type: "text", text: "Let me look." }, { type: "tool_use", id: use.id, name: use.name, input: use.input }] },
  { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: [{ type: "text", text: "sunny" }] }] }] });
out.answered = shape(convo);

out.errors = {
  bad_key: await error(() => new Anthropic({ baseURL, apiKey: "not-the-key", maxRetries: 0 }).messages.create(base)),
  no_max_tokens: await error(() => client.messages.create({ ...base, max_tokens: undefined })),
  unknown_tool: await error(() => client.messages.create({ ...base, tools, tool_choice: { type: "tool", name: "get_time" } })),
  tool_without_name: await error(() => client.messages.create({ ...base, tools: [{ input_schema: { type: "object" } }] })),
  unknown_model: await error(() => client.messages.create({ ...base, model: "claude-none" })),
};
console.log(JSON.stringify(out));
