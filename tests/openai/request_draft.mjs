// The official OpenAI client (npm "openai") against `loip serve --draft-per-request`: a chat and a
// completion choosing their own drafts (loip's `draft` field, sent as the client sends any extra
// field), streamed and not, and one naming a draft the server does not allow (the client's
// BadRequestError: status, param, message). Prints one JSON object;
// spec/integration/serve_request_draft_spec.lua checks it.
// Usage: node request_draft.mjs BASE_URL API_KEY MODEL [plain]   (plain: no draft fields sent)
import OpenAI from "openai";

const [baseURL, apiKey, model, mode] = process.argv.slice(2);
const own = (fields) => (mode === "plain" ? {} : fields);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const story = "Lily went to the park. Lily went to the park. Lily went to the park. Lily went";
const out = {};

const c = await client.completions.create({ model, prompt: story, max_tokens: 40, temperature: 0, ...own({ draft: "ngram" }) });
out.completion = c.choices[0].text;
const chat = await client.chat.completions.create({ model, max_tokens: 20, temperature: 0, ...own({ draft: "none" }),
  messages: [{ role: "user", content: story }] });
out.chat = chat.choices[0].message.content;
let text = "";
const stream = await client.completions.create({ model, prompt: story, max_tokens: 40, temperature: 0, stream: true,
  ...own({ draft: "ngram:tree=on", draft_tokens: 3 }) });
for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
out.stream = text;
try {
  await client.completions.create({ model, prompt: story, max_tokens: 4, draft: "model" });
  out.refused = null;
} catch (e) {
  out.refused = { status: e.status, param: e.param, code: e.code, message: e.message };
}
console.log(JSON.stringify(out));
