// The official OpenAI client, unchanged, against `loip serve` with gpt-oss's chat template (the
// harmony format, read by the harmony tools parser): a tool call and a final answer, each streamed
// and not, reasoning_content apart from content; the call sent back with its reasoning and result.
// The model's output is forced by llama.cpp's `grammar` request field (the model writes harmony
// text under it), so what the server must parse is known. Prints one JSON object;
// spec/integration/serve_harmony_spec.lua checks it. Usage: node harmony.mjs BASE_URL API_KEY MODEL
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const out = {};

const gbnf = (s) => "root ::= " + JSON.stringify(s);
const CALL = "<|channel|>analysis<|message|>Weather: call it.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
const FINAL = "<|channel|>analysis<|message|>It said sunny.<|end|><|start|>assistant<|channel|>final<|message|>Sunny in Paris.";
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const ask = [{ role: "user", content: "Weather?" }];
const base = { model, temperature: 0 }; // (no max_tokens: to the end of stories260K's 512 positions)

function shape(c) {
  return { content: c.message.content, reasoning: c.message.reasoning_content ?? null, finish: c.finish_reason,
    calls: (c.message.tool_calls ?? []).map((t) => ({ id: t.id, type: t.type, name: t.function.name, arguments: t.function.arguments })) };
}

// a stream put together from its deltas, as a client does; every delta's text kept
async function streamed(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let content = "", reasoning = "", finish = null;
  const calls = [], pieces = [], kinds = [];
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    const d = c.delta ?? {};
    if (d.content) { content += d.content; pieces.push(d.content); kinds.push("content"); }
    if (d.reasoning_content) { reasoning += d.reasoning_content; pieces.push(d.reasoning_content); kinds.push("reasoning"); }
    for (const t of d.tool_calls ?? []) {
      if (!calls[t.index]) { calls[t.index] = { id: t.id, type: t.type, name: t.function?.name, arguments: "" }; kinds.push("call"); }
      calls[t.index].arguments += t.function?.arguments ?? "";
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, reasoning, finish, calls, pieces, kinds };
}

const call = await client.chat.completions.create({ ...base, messages: ask, tools, grammar: gbnf(CALL) });
out.call = shape(call.choices[0]);
out.call_stream = await streamed({ ...base, messages: ask, tools, grammar: gbnf(CALL) });

// the call sent back as a client does: its reasoning_content, and the tool's result
const first = call.choices[0].message;
const convo = [...ask, { role: "assistant", content: first.content, reasoning_content: first.reasoning_content, tool_calls: first.tool_calls },
  { role: "tool", tool_call_id: first.tool_calls?.[0]?.id ?? "call_x", content: "sunny" }];
const final = await client.chat.completions.create({ ...base, messages: convo, tools, grammar: gbnf(FINAL) });
out.final = { ...shape(final.choices[0]), usage: final.usage };
out.final_stream = await streamed({ ...base, messages: convo, tools, grammar: gbnf(FINAL) });
out.call_usage = call.usage;

// no tools at all: the channels are still read
const plain = await client.chat.completions.create({ ...base, messages: ask, grammar: gbnf(FINAL) });
out.plain = { ...shape(plain.choices[0]), usage: plain.usage };
// reasoning_effort: the template's "Reasoning: high" instead of its default "medium"
const high = await client.chat.completions.create({ ...base, messages: ask, grammar: gbnf(FINAL), reasoning_effort: "high" });
out.high = { ...shape(high.choices[0]), usage: high.usage };
out.plain_stream = await streamed({ ...base, messages: ask, grammar: gbnf(FINAL) });
console.log(JSON.stringify(out));
