// The official OpenAI client against `loip serve` for what agents use (spec/integration/
// serve_agent_client_spec.lua): structured outputs parsed with a zod schema
// (chat.completions.parse), tool calls under tool_choice "required" and a named function,
// streamed (the client's own stream helper assembles the deltas) and not, n choices, logprobs.
// Prints one JSON object of what it saw; the spec checks it. Usage: node agent.mjs URL KEY MODEL
import OpenAI from "openai";
import { zodResponseFormat, zodFunction } from "openai/helpers/zod";
import { z } from "zod";

const [url, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url, apiKey, maxRetries: 0, timeout: 120000 });

const Hero = z.object({ name: z.string().max(12), age: z.number().int(), brave: z.boolean() });
const Story = z.object({
  title: z.string().max(16),
  mood: z.enum(["happy", "sad", "scared"]),
  hero: Hero,
  friends: z.array(z.string().max(8)).max(3),
  ending: z.union([z.literal("good"), z.literal("bad"), z.null()]),
});
const Weather = z.object({ city: z.string().max(16), unit: z.enum(["celsius", "fahrenheit"]), days: z.number().int() });
const Alarm = z.object({ hour: z.number().int(), label: z.string().max(10) });
const tools = [zodFunction({ name: "get_weather", parameters: Weather, description: "The weather in a city" }),
  zodFunction({ name: "set_alarm", parameters: Alarm })];
const messages = (text) => [{ role: "system", content: "You are a storyteller." }, { role: "user", content: text }];
const prompts = ["Once upon a time", "Tell me about Lily", "A story of a dog", "The sun was", "Tom and his ball",
  "A big red boat"];

const out = { parsed: [], tools: [], tools_stream: [], named: null, n_greedy: null, n_sampled: null, errors: [] };

async function step(name, f) {
  try { await f(); } catch (e) { out.errors.push(`${name}: ${e && e.stack || e}`); }
}

await step("parse", async () => {
  for (let i = 0; i < prompts.length; i++) {
    const r = await client.chat.completions.parse({ model, messages: messages(prompts[i]), max_tokens: 400,
      temperature: i % 2 ? 0.8 : 0, seed: i, response_format: zodResponseFormat(Story, "story") });
    const c = r.choices[0];
    out.parsed.push({ content: c.message.content, parsed: c.message.parsed, valid: Story.safeParse(c.message.parsed).success,
      finish: c.finish_reason });
  }
});

const check = (calls) => calls.map((t) => {
  const schema = t.function.name === "get_weather" ? Weather : t.function.name === "set_alarm" ? Alarm : null;
  let args = null;
  try { args = JSON.parse(t.function.arguments); } catch (e) { args = null; }
  return { id: t.id, name: t.function.name, arguments: t.function.arguments, valid: !!schema && schema.safeParse(args).success };
});

await step("tools", async () => {
  for (let i = 0; i < 3; i++) {
    const r = await client.chat.completions.create({ model, messages: messages(prompts[i]), max_tokens: 300, temperature: 0.8,
      seed: 10 + i, tools, tool_choice: "required" });
    const c = r.choices[0];
    out.tools.push({ finish: c.finish_reason, calls: check(c.message.tool_calls || []) });
  }
});

await step("tools_stream", async () => {
  for (let i = 0; i < 2; i++) {
    const stream = client.chat.completions.stream({ model, messages: messages(prompts[i + 3]), max_tokens: 300, temperature: 0.8,
      seed: 20 + i, tools, tool_choice: "required" });
    let chunks = 0;
    stream.on("chunk", () => { chunks++; });
    const r = await stream.finalChatCompletion();
    const c = r.choices[0];
    out.tools_stream.push({ finish: c.finish_reason, chunks, calls: check(c.message.tool_calls || []) });
  }
});

await step("named", async () => {
  const r = await client.chat.completions.create({ model, messages: messages("Wake me"), max_tokens: 300, temperature: 0,
    tools, tool_choice: { type: "function", function: { name: "set_alarm" } } });
  const c = r.choices[0];
  out.named = { finish: c.finish_reason, calls: check(c.message.tool_calls || []) };
});

await step("n", async () => {
  const g = await client.chat.completions.parse({ model, messages: messages("Once upon a time"), max_tokens: 400, n: 3,
    temperature: 0, response_format: zodResponseFormat(Story, "story") });
  out.n_greedy = g.choices.map((c) => ({ index: c.index, content: c.message.content, valid: Story.safeParse(c.message.parsed).success }));
  const s = await client.chat.completions.parse({ model, messages: messages("Once upon a time"), max_tokens: 400, n: 3,
    temperature: 0.8, seed: 5, response_format: zodResponseFormat(Story, "story") });
  out.n_sampled = s.choices.map((c) => ({ index: c.index, content: c.message.content, valid: Story.safeParse(c.message.parsed).success }));
});

console.log(JSON.stringify(out));
