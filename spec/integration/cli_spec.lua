-- The loip command as a user types it.
local json = require "loip.text.json"
local T = require "spec.support"

local loip = T.loip
local MODEL = T.root .. "/models/stories260K"
local greedy = assert(json.load(T.root .. "/models/stories260K/reference/greedy.json"))

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
teardown(T.drop_stores)

describe("loip generate", function()
  after_each(function() T.cleanup() end)

  it("prints the prompt and run.c's greedy continuation, nothing else", function()
    local c = greedy.cases[2] -- "Once upon a time", 200 positions
    local n = greedy.steps - #c.prompt_ids + 1
    local rc, out, err = T.run(string.format("%s generate --model %s --prompt %s --temperature 0 --max-tokens %d",
      loip, MODEL, q(c.prompt), n))
    assert.are.equal(0, rc, err)
    assert.are.equal(c.output_text .. "\n", out)
  end)

  it("prints one JSON object with --json", function()
    local rc, out, err = T.run(string.format("%s generate --model %s --prompt %s --temperature 0 --max-tokens 20 --json",
      loip, MODEL, q("The little dog")))
    assert.are.equal(0, rc, err)
    local r = assert(json.decode(out))
    assert.are.equal("The little dog", r.prompt)
    assert.are.equal(20, #r.token_ids)
    assert.are.same(greedy.cases[3].prompt_ids, r.prompt_ids)
    assert.are.equal(#greedy.cases[3].prompt_ids, r.prompt_tokens)
    assert.are.same({ unpack(greedy.cases[3].generated_ids, 1, 20) }, r.token_ids)
    assert.is_true(greedy.cases[3].output_text:find(r.prompt .. r.text, 1, true) == 1)
    assert.is_number(r.prefill_ms)
    assert.is_number(r.decode_ms_per_token)
  end)

  it("reproduces a seeded sampled run", function()
    local cmd = string.format("%s generate --model %s --prompt Hi --temperature 1 --top-p 0.9 --seed 7 --max-tokens 30 --json", loip, MODEL)
    local _, a = T.run(cmd)
    local _, b = T.run(cmd)
    assert.are.same(json.decode(a).token_ids, json.decode(b).token_ids)
  end)

  it("documents every flag in --help", function()
    local rc, out = T.run(loip .. " generate --help")
    assert.are.equal(0, rc)
    for _, f in ipairs({ "--model", "--prompt", "--max-tokens", "--temperature", "--seed", "--threads", "--json" }) do
      assert.matches(f, out, 1, true)
    end
  end)

  it("exits 2 with the flag named on a usage error", function()
    local rc, out, err = T.run(loip .. " generate --model " .. MODEL .. " --temperature hot")
    assert.are.equal(2, rc)
    assert.are.equal("", out)
    assert.matches("--temperature: 'hot' is not a valid number", err, 1, true)
    rc, _, err = T.run(loip .. " generate --prompt x")
    assert.are.equal(2, rc)
    assert.matches("--model is required", err, 1, true)
    rc, _, err = T.run(loip .. " generate --bogus")
    assert.are.equal(2, rc)
    assert.matches("unknown flag --bogus", err, 1, true)
  end)

  it("suggests the flag a mistyped one meant, and prints no empty default in --help", function()
    for typo, meant in pairs({ ["max-token"] = "max-tokens", temprature = "temperature", ["ignore-eso"] = "ignore-eos",
      prom = "prompt" }) do
      local rc, out, err = T.run(string.format("%s generate --model %s --%s 3", loip, MODEL, typo))
      assert.are.equal(2, rc)
      assert.are.equal("", out)
      assert.matches("unknown flag --" .. typo .. "; did you mean --" .. meant .. "?", err, 1, true)
    end
    local _, _, err = T.run(loip .. " generate --zebra-crossing")
    assert.matches("unknown flag --zebra-crossing (see --help)", err, 1, true) -- nothing close: no guess
    local _, help = T.run(loip .. " generate --help")
    assert.is_nil(help:find("(default )", 1, true), "--prompt's empty default shows no '(default )'")
    assert.matches("--prompt STRING%s+prompt text %(none: generate from the start of a document", help)
  end)

  -- "Lily" greedily: 223 tokens, then llama2.c's end token (BOS, id 1)
  it("--ignore-eos runs past the model's end tokens to --max-tokens or the context, one device and a cluster", function()
    local function gen(model, extra)
      local rc, out, err = T.run(string.format("%s generate --model %s --prompt Lily --temperature 0 --threads 1 --json %s",
        loip, model, extra))
      assert.are.equal(0, rc, err)
      return json.decode(out)
    end
    local plain = gen(MODEL, "--max-tokens 240")
    assert.are.equal("stop", plain.stop_reason)
    assert.are.equal(223, plain.generated_tokens)
    local long = gen(MODEL, "--max-tokens 240 --ignore-eos")
    assert.are.equal("max_tokens", long.stop_reason)
    assert.are.equal(240, long.generated_tokens)
    assert.are.same(plain.token_ids, { unpack(long.token_ids, 1, 223) })
    assert.are.equal(1, long.token_ids[224]) -- the end token, generated and passed
    local ctx = gen(MODEL, "--max-tokens 1000 --context 240 --ignore-eos")
    assert.are.equal("context", ctx.stop_reason)
    assert.are.equal(240 - #ctx.prompt_ids, ctx.generated_tokens)
    -- a cluster of 2 local devices: the same tokens
    local st = T.slice_store(MODEL, "s260-cli")
    local two = gen(st, "--devices 2 --max-tokens 240 --ignore-eos")
    assert.are.equal("max_tokens", two.stop_reason)
    assert.are.same(long.token_ids, two.token_ids)
    local two_plain = gen(st, "--devices 2 --max-tokens 240")
    assert.are.equal("stop", two_plain.stop_reason)
    assert.are.equal(223, two_plain.generated_tokens)
  end)

  it("gen.ignore_eos in Lua: the model's end tokens do not stop, a stop given still does", function()
    local m = require("loip.model").open(MODEL, { threads = 1, context = 256 })
    local function run(opts)
      opts.temperature, opts.max_tokens = 0, 240
      local it, st = m:generate("Lily", opts)
      for _ in it do end
      return st
    end
    local a = run({ ignore_eos = true })
    assert.are.equal("max_tokens", a.stop_reason)
    assert.are.equal(240, #a.token_ids)
    local b = run({ ignore_eos = true, stop = { 1 } })
    assert.are.equal("stop", b.stop_reason)
    assert.are.equal(223, #b.token_ids)
    m:close()
  end)

  it("refuses words past the flags', naming them, and suggests a flag one edit away, a swap of two letters too", function()
    local rc, out, err = T.run(string.format("%s generate --model %s --prompt Once upon a time --max-tokens 4", loip, MODEL))
    assert.are.equal(2, rc)
    assert.are.equal("", out)
    assert.are.equal("loip: generate: unexpected words 'upon' 'a' 'time': it takes no words besides its flags (if they belong to "
      .. "--prompt's value, quote it: --prompt \"Once upon a time\")\n", err)
    for _, case in ipairs({ { "generate", "modle", "model" }, { "serve", "prot", "port" }, { "generate", "promt", "prompt" } }) do
      rc, out, err = T.run(string.format("%s %s --%s x", loip, case[1], case[2]))
      assert.are.equal(2, rc)
      assert.are.equal("loip: " .. case[1] .. ": unknown flag --" .. case[2] .. "; did you mean --" .. case[3] .. "?\n", err)
    end
  end)

  it("refuses a prompt longer than the context in words, before any work, one device or several", function()
    local long = string.rep("Once upon a time ", 250) -- (1002 tokens with the BOS)
    local st = T.slice_store(MODEL, "s260-cli")
    for _, case in ipairs({ { MODEL, "" }, { st, "--devices 2" }, { st, "--devices 2 --json" } }) do
      local rc, out, err = T.run(string.format("%s generate --model %s %s --context 512 --max-tokens 4 --prompt %s", loip,
        case[1], case[2], q(long)))
      assert.are.equal(2, rc, err)
      assert.are.equal("", out)
      -- (the one line: nothing sliced, planned or shipped first)
      assert.are.equal("loip: generate: the prompt has 1002 tokens; the context is 512: raise --context (to at least 1003) "
        .. "or shorten the prompt\n", err)
    end
    local rc, _, err = T.run(string.format("%s generate --model %s --context 14 --max-tokens 4 --prompt %s", loip, MODEL,
      q("Once upon a time there was a little girl named Lily")))
    assert.are.equal(2, rc)
    assert.matches("the prompt has 14 tokens; the context is 14, which leaves no room for a token to generate: raise --context "
      .. "(to at least 15)", err, 1, true)
    -- loip simulate takes generate's --prompt: the same words, before it plans
    rc, _, err = T.run(string.format("%s simulate --model %s --devices 2 --context 256 --max-tokens 4 --prompt %s", loip, st,
      q(string.rep("Once upon a time ", 100))))
    assert.are.equal(2, rc)
    assert.are.equal("loip: simulate: the prompt has 402 tokens; the context is 256: raise --context (to at least 403) or "
      .. "shorten the prompt\n", err)
    rc, _, err = T.run(string.format("%s simulate --model %s --devices 2 --context 512 --prompt %s", loip, st, q(long)))
    assert.are.equal(2, rc)
    assert.matches("the prompt has 1002 tokens; the context is 512, and this model takes at most 512: shorten the prompt", err, 1, true)
  end)

  it("starts an error printed after generated text on a line of its own", function()
    local dir = T.tmpdir()
    local st = dir .. "/st"
    require("loip.model.slice").write(MODEL, st, { quiet = true })
    -- (plans that read blocks every step: with the embedding and head in memory, --ends memory;
    -- one of them damaged, read in the prompt's step, then put back)
    for _, extra in ipairs({ "--mem 1400K --ends memory", "--devices 2 --mem 1000K,1000K --ends memory" }) do
      local pl, files = T.plan_offloading(st, extra, dir)
      assert.is_true(#files > 0, extra .. ": no MLP block offloaded")
      T.flip_bit(st .. "/" .. files[1], 5000)
      local cmd = string.format("%s generate --model %s --prompt %s --temperature 0 --max-tokens 8 --verify-reads --plan %s %s", loip, st,
        q("Once upon a time"), pl, extra)
      local rc, out, err = T.run(cmd)
      assert.are.equal(1, rc, err)
      assert.are.equal("Once upon a time\n", out)
      -- (stdout and stderr on one terminal: the error's line starts with loip:)
      local _, both = T.run("{ " .. cmd .. " 2>&1; }")
      assert.matches("\nOnce upon a time\nloip: [^\n]*stage %d+: [^\n]*" .. files[1]:gsub("%-", "%%-"):gsub("%.", "%%.")
        .. ": CRC32C", "\n" .. both)
      T.flip_bit(st .. "/" .. files[1], 5000)
    end
  end)

  it("prints a need and its budget with the digits it takes to tell them apart", function()
    local st = T.slice_store(MODEL, "s260-cli")
    -- 1 device, every block read from disk: the least it needs, found to the byte ("short by N bytes" under 1 KiB)
    local function refusal(mem)
      local rc, _, err = T.run(string.format("%s plan --model %s --mem %d --context 256", loip, st, mem))
      assert.are.equal(1, rc, err)
      return err
    end
    local kib = tonumber(refusal(300 * 1024):match("it needs ([%d.]+) KiB"))
    local guess = math.floor(kib * 1024) - 300
    local need = guess + tonumber(refusal(guess):match("short by (%d+) bytes"))
    local err = refusal(need - 40)
    local budget_s, need_s = err:match("memory budget of ([%d.]+) KiB cannot run this model: even with every block offloaded it needs ([%d.]+) KiB")
    assert.is_string(budget_s, err)
    assert.are_not.equal(budget_s, need_s, err)
    assert.matches("short by 40 bytes", err, 1, true)
  end)

  it("exits 1 naming the file when the model is bad, printing nothing on stdout", function()
    local dir = T.tmpdir()
    T.write(dir .. "/config.json", '{"architectures": ["LlamaForCausalLM"]}')
    local rc, out, err = T.run(loip .. " generate --model " .. dir .. " --prompt x")
    assert.are.equal(1, rc)
    assert.are.equal("", out)
    assert.matches(dir .. "/config.json: field 'hidden_size' is missing", err, 1, true)
  end)
end)

describe("loip run", function()
  after_each(function() T.cleanup() end)

  it("runs a script with loip available and arg set as luajit sets it", function()
    local dir = T.tmpdir()
    T.write(dir .. "/s.lua", 'local loip = require "loip"; print(arg[0], arg[1], arg[2], select("#", ...), loip.abi)')
    local rc, out, err = T.run(loip .. " run " .. dir .. "/s.lua a b")
    assert.are.equal(0, rc, err)
    assert.are.equal(dir .. "/s.lua\ta\tb\t2\t" .. require("loip").abi .. "\n", out)
  end)
end)

describe("loip synth", function()
  after_each(function() T.cleanup() end)

  it("writes a loadable, deterministic model with a named model's shapes", function()
    local dir = T.tmpdir()
    local cmd = "LOIP_QUIET=1 %s synth --like qwen3-0.6b --layers 2 --dim 128 --heads 4 --kv-heads 2 --head-dim 32 --ffn 256 --vocab 400 --dtype bf16 --shard-size 200K %s"
    local rc, _, err = T.run(string.format(cmd, loip, dir .. "/a"))
    assert.are.equal(0, rc, err)
    rc = T.run(string.format(cmd, loip, dir .. "/b"))
    assert.are.equal(0, rc)
    assert.is_true(T.exists(dir .. "/a/model.safetensors.index.json"), "sharded")
    local cfg = json.load(dir .. "/a/config.json")
    assert.are.equal("Qwen3ForCausalLM", cfg.architectures[1])
    local ls = io.popen("cd " .. dir .. "/a && ls *.safetensors"):read("*a")
    for f in ls:gmatch("%S+") do
      assert.is_true(T.read(dir .. "/a/" .. f) == T.read(dir .. "/b/" .. f), f .. " differs between runs")
    end
    local r = select(2, T.run(loip .. " generate --model " .. dir .. "/a --prompt 'hello world' --temperature 0 --max-tokens 5 --json"))
    assert.are.equal(5, #json.decode(r).token_ids)
  end)

  it("refuses to overwrite a model without --force", function()
    local dir = T.tmpdir()
    T.write(dir .. "/config.json", "{}")
    local rc, _, err = T.run(loip .. " synth --like llama-3.2-1b " .. dir)
    assert.are.equal(1, rc)
    assert.matches("already holds a model", err, 1, true)
  end)

  it("knows the shapes the benchmarks use", function()
    local _, out = T.run(loip .. " synth --list")
    for _, n in ipairs({ "llama-3.2-1b", "llama-3.1-8b", "llama-2-13b", "qwen3-0.6b", "qwen3-32b", "llama-3.3-70b" }) do
      assert.matches(n, out, 1, true)
    end
  end)
end)
