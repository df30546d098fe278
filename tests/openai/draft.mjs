// The official OpenAI client (npm "openai") against `loip serve`, with or without --draft: greedy
// chat and completions on text that repeats (so that an n-gram draft is accepted), streamed and
// not. Prints one JSON object; spec/integration/serve_draft_spec.lua compares a server with
// speculative decoding to one without (the same texts, the same chunks).
// Usage: node draft.mjs BASE_URL API_KEY MODEL
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

async function streamed(kind, params) {
  const stream = kind === "chat"
    ? await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } })
    : await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  // pieces: the text of each chunk that has some, in order (one per token delivered)
  let text = "", finish = null, usage = null;
  const pieces = [];
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    const piece = (kind === "chat" ? c.delta?.content : c.text) ?? "";
    if (piece !== "") pieces.push(piece);
    text += piece;
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage, pieces };
}

const story = "Lily went to the park. Lily went to the park. Lily went to the park. Lily went";
const out = {};
const chatParams = { model, messages: [{ role: "user", content: story }], max_tokens: 48, temperature: 0 };
const chat = await client.chat.completions.create(chatParams);
out.chat = { text: chat.choices[0].message.content, finish: chat.choices[0].finish_reason, usage: chat.usage };
out.chat_stream = await streamed("chat", chatParams);
for (const [name, prompt, max_tokens] of [["repeat", story, 60], ["once", "Once upon a time", 80]]) {
  const params = { model, prompt, max_tokens, temperature: 0 };
  const c = await client.completions.create(params);
  out[name] = { text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage };
  out[name + "_stream"] = await streamed("completion", params);
}
process.stdout.write(JSON.stringify(out) + "\n");
