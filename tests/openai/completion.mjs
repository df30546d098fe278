// One completion request through the official OpenAI client (npm "openai"), unchanged: prints
// {"text", "finish", "usage"} as JSON. spec/integration/deploy_spec.lua runs it against a cluster
// that recipes/deploy/up.lua brought up. Usage: node completion.mjs BASE_URL MODEL PROMPT MAX_TOKENS
import OpenAI from "openai";

const [baseURL, model, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
const r = await client.completions.create({ model, prompt, max_tokens: Number(maxTokens), temperature: 0 });
console.log(JSON.stringify({ text: r.choices[0].text, finish: r.choices[0].finish_reason, usage: r.usage }));
