// How js_tiktoken_vectors.json was made (documentation: no test runs this). js-tiktoken, the
// JavaScript port of OpenAI's tiktoken (MIT), encodes a varied set of texts with o200k_base's
// ranks and o200k_harmony's special tokens; loip's spec then asks its own tokenizer for the
// same ids. Run it where js-tiktoken is installed, never in the repository:
//
//   mkdir /some/scratch && cd /some/scratch && npm install js-tiktoken@1.0.21
//   cp .../models/o200k-harmony/gen_vectors.mjs . && node gen_vectors.mjs ranks.tiktoken > vectors.json
//
// With an argument it also writes the ranks js-tiktoken ships (compressed: each line of
// bpe_ranks is "<key> <first rank> b64 b64 ...", token i of a line having rank first + i) as a
// tiktoken rank file, which is o200k_base.tiktoken byte for byte (its sha256 goes to stderr).
import fs from "node:fs";
import crypto from "node:crypto";
import { Tiktoken } from "js-tiktoken/lite";
import o200k_base from "js-tiktoken/ranks/o200k_base";

// (the package's exports hide its package.json: read it beside dist/lite.js)
const version = JSON.parse(fs.readFileSync(new URL("../package.json", import.meta.resolve("js-tiktoken/lite")))).version;

if (process.argv[2]) {
  const out = [];
  for (const line of o200k_base.bpe_ranks.split("\n").filter(Boolean)) {
    const [, first, ...toks] = line.split(" ");
    toks.forEach((t, i) => out.push([Number.parseInt(first, 10) + i, t]));
  }
  out.sort((a, b) => a[0] - b[0]);
  const text = out.map(([r, t]) => `${t} ${r}\n`).join("");
  fs.writeFileSync(process.argv[2], text);
  const sha = crypto.createHash("sha256").update(text).digest("hex");
  process.stderr.write(`${process.argv[2]}: ${out.length} ranks, ${text.length} bytes, sha256 ${sha}\n`);
}

// o200k_harmony's special tokens (openai/gpt-oss gpt_oss/tokenizer.py): o200k_base's two, the
// harmony markers, <|reserved_N|> for every other id up to 201087.
const named = { "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
  "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
  "<|message|>": 200008, "<|call|>": 200012, "<|endofprompt|>": 200018 };
const specials = { ...named };
const used = new Set(Object.values(named));
for (let id = 200000; id <= 201087; id++) if (!used.has(id)) specials[`<|reserved_${id}|>`] = id;
const enc = new Tiktoken(o200k_base, specials);

// A seeded mix of characters from many scripts (xorshift32), so that no one wrote the text.
function mixed(seed, n) {
  const pool = [..."abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    ..."     \n\n\t.,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`",
    ..."éèàüößçñÉÀÜØÅæœ", ..."абвгдежзийклмнопрстуфхцчшщыэюяАБВГД", ..."αβγδεζηθλμπσωΩΔ",
    ..."的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年", ..."ひらがなカタカナ", ..."한국어텍스트",
    ..."العربيةمرحبا", ..."हिन्दीभाषा", ..."\u0301\u0308\u0327", "👍", "🏽", "👩‍💻", "🇯🇵", "…", "—", "’", "\r\n"];
  let x = seed >>> 0, s = "";
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    s += pool[x % pool.length];
  }
  return s;
}

const prose = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age " +
  "of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, " +
  "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything " +
  "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the other " +
  "way \u2014 in short, the period was so far like the present period, that some of its noisiest authorities " +
  "insisted on its being received, for good or for evil, in the superlative degree of comparison only.\n\n" +
  "There were a king with a large jaw and a queen with a plain face, on the throne of England; there were a " +
  "king with a large jaw and a queen with a fair face, on the throne of France.";
const code = `#include <stdio.h>
#include <stdlib.h>

/* Sum the first n integers: O(n), on purpose. */
static long sum(long n) {
    long s = 0;
    for (long i = 1; i <= n; ++i) s += i;
    return s;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 100;
    printf("sum(%ld) = %ld\\n", n, sum(n));
    return n > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
`;
const python = "def fib(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n" +
  "    a, b = 0, 1\n    out = []\n    for _ in range(n):\n        out.append(a)\n        a, b = b, a + b\n" +
  "    return out\n\n\nif __name__ == \"__main__\":\n\tprint(fib(10))  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n";
const chat = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n" +
  "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n" +
  "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n" +
  "Calls to these tools must go to the commentary channel: 'functions'.<|end|>" +
  "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n" +
  "// Gets the location of the user.\ntype get_location = () => any;\n\n" +
  "// Gets the current weather in the provided location.\ntype get_current_weather = (_: {\n" +
  "// The city and state, e.g. San Francisco, CA\nlocation: string,\nformat?: \"celsius\" | \"fahrenheit\", // default: celsius\n" +
  "}) => any;\n\n} // namespace functions<|end|>" +
  "<|start|>user<|message|>What is the weather like in SF?<|end|>" +
  "<|start|>assistant<|channel|>analysis<|message|>Need to use function get_current_weather.<|end|>" +
  "<|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>" +
  "{\"location\":\"San Francisco\"}<|call|>" +
  "<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>" +
  "{\"sunny\": true, \"temperature\": 20}<|end|>" +
  "<|start|>assistant<|channel|>final<|message|>It is sunny and 20 \u00b0C in San Francisco.<|return|>";

// [name, text, special]: special = the special tokens are tokens (else they are text)
const cases = [
  ["empty", "", false],
  ["hello_world", "hello world", false],
  ["prose", prose, false],
  ["code_c", code, false],
  ["code_python", python, false],
  ["numbers", "1 12 123 1234 12345 123456 1234567 3.14159 -42 1e10 0x1F 2024-06-28 10:30:00 $1,234.56 99% 007", false],
  ["digits_run", "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280", false],
  ["whitespace", "a  b   c    d\t\te\n\nf\n \n  g   \n\n\n   h \t \n", false],
  ["spaces_only", "        ", false],
  ["newlines_crlf", "line one\r\nline two\r\n\r\nline four\rline five\n\r\n", false],
  ["contractions", "I'm sure you'll see they've said it's his, we'd know. DON'T, I'LL, She'S, we'Re, THEY'VE", false],
  ["mixed_case", "camelCase PascalCase snake_case SCREAMING_CASE kebab-case iPhone eBay XMLHttpRequest HTMLParser", false],
  ["punctuation", "Wait... what?!? (yes) [no] {maybe} <tag/> a/b//c \\n \"quoted\" 'single' `tick` ~~~ ***", false],
  ["urls", "See https://github.com/openai/tiktoken/blob/main/README.md#readme or mailto:someone@example.com.", false],
  ["cjk_chinese", "我们的模型在多个设备上无损地运行大型语言模型。今天天气很好，我们去公园散步吧！", false],
  ["cjk_japanese", "東京は日本の首都です。ひらがなとカタカナと漢字を混ぜて書きます。ラーメンが好き！", false],
  ["korean", "안녕하세요, 세계! 한국어 토크나이저 테스트입니다.", false],
  ["arabic", "مرحبا بالعالم! اللغة العربية تكتب من اليمين إلى اليسار. ١٢٣ ٤٥٦", false],
  ["hindi", "नमस्ते दुनिया, यह हिन्दी पाठ है।", false],
  ["russian", "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка!", false],
  ["greek_accents", "Ελληνικά: καλημέρα κόσμε. Café naïve façade résumé coöperate Straße ŒUVRE", false],
  ["combining", "e\u0301 a\u0308 n\u0303 c\u0327 Zalgo: z\u0351\u0357a\u0341\u0334l\u0358g\u0336o\u0334", false],
  ["emoji", "I ❤️ NY 👍🏽 👨‍👩‍👧‍👦 👩🏻‍💻 🏳️‍🌈 🇯🇵🇫🇷 😀😃😄 ⭐️ #️⃣", false],
  ["specials_as_text", "<|start|>user<|message|>hi<|end|> <|endoftext|> <|reserved_200015|>", false],
  ["harmony_chat", chat, true],
  ["harmony_reasoning", "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.<|return|>" +
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.", true],
  ["harmony_endoftext", "<|startoftext|>Hello<|endoftext|><|endofprompt|><|reserved_201087|>", true],
  ["mixed_1", mixed(1, 600), false],
  ["mixed_2", mixed(2, 600), false],
  ["mixed_3", mixed(3, 2000), false],
];

const vectors = cases.map(([name, text, special]) => {
  const ids = special ? enc.encode(text, "all") : enc.encode(text, [], []);
  if (enc.decode(ids) !== text) throw new Error(`${name}: js-tiktoken does not decode its own ids`);
  return { name, text, special, ids };
});
// one vector a line
const source = `js-tiktoken ${version} (npm, MIT; JavaScript port of openai/tiktoken): new Tiktoken(o200k_base, ` +
    "o200k_harmony's special tokens), encode(text, \"all\") where special, else encode(text, [], []) " +
    "(special tokens are text); made by models/o200k-harmony/gen_vectors.mjs under node " + process.version;
process.stdout.write(`{"source": ${JSON.stringify(source)},\n "vectors": [\n` +
  vectors.map((v) => "  " + JSON.stringify(v)).join(",\n") + "\n ]\n}\n");
