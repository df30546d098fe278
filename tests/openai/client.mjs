// The official OpenAI client (npm "openai"), unchanged, against a running `loip serve`: chat and
// completions, streamed and not, ignore_eos and an empty prompt, the model list, and the errors the
// client raises. Prints one JSON object with what it got; spec/integration/serve_spec.lua checks it.
// Usage: node client.mjs BASE_URL API_KEY MODEL
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const out = {};

async function streamed(kind, params) {
  const stream = kind === "chat"
    ? await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } })
    : await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    text += (kind === "chat" ? c.delta?.content : c.text) ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage, chunks };
}

async function error(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return { status: e.status ?? null, type: e.error?.type ?? e.type ?? null, code: e.code ?? null, message: e.message };
  }
}

const chatParams = { model, messages: [{ role: "system", content: "You tell stories." }, { role: "user", content: "Once upon a time" }],
  max_tokens: 24, temperature: 0 };
const chat = await client.chat.completions.create(chatParams);
out.chat = { text: chat.choices[0].message.content, finish: chat.choices[0].finish_reason, usage: chat.usage, object: chat.object };
out.chat_stream = await streamed("chat", chatParams);

const compParams = { model, prompt: "Once upon a time", max_tokens: 30, temperature: 0 };
const comp = await client.completions.create(compParams);
out.completion = { text: comp.choices[0].text, finish: comp.choices[0].finish_reason, usage: comp.usage, object: comp.object };
out.completion_stream = await streamed("completion", compParams);
const stopped = await client.completions.create({ ...compParams, stop: ["girl"] });
out.completion_stop = { text: stopped.choices[0].text, finish: stopped.choices[0].finish_reason };
// llama.cpp's ignore_eos passes through the client as any extra field does: "Lily" ends after 223 tokens without it
const long = await client.completions.create({ model, prompt: "Lily", max_tokens: 240, temperature: 0, ignore_eos: true });
out.ignore_eos = { finish: long.choices[0].finish_reason, tokens: long.usage.completion_tokens };
// an empty prompt: from the start of a document
const empty = await client.completions.create({ model, prompt: "", max_tokens: 8, temperature: 0 });
out.empty_prompt = { prompt_tokens: empty.usage.prompt_tokens, tokens: empty.usage.completion_tokens };

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

out.errors = {
  bad_key: await error(() => new OpenAI({ baseURL, apiKey: "not-the-key", maxRetries: 0 }).completions.create(compParams)),
  unknown_model: await error(() => client.completions.create({ ...compParams, model: "no-such-model" })),
  n_over_slots: await error(() => client.completions.create({ ...compParams, n: 3 })),
  too_long: await error(() => client.completions.create({ ...compParams, max_tokens: 100000 })),
};
process.stdout.write(JSON.stringify(out) + "\n");
