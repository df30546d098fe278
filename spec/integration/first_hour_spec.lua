-- What a new user and a researcher trip over in their first hour (issue 17), one case each: the
-- REPL's errors, modules reachable from `loip.`, the tokenizer a model uses, --devices on a model
-- directory, `loip help`, reports that agree, plan files with math, and a cluster's generate
-- from Lua.
local loip = require "loip"
local json = require "loip.text.json"
local T = require "spec.support"

local S260K = T.root .. "/models/stories260K"

after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

describe("the REPL", function()
  it("prints an error's message, and its traceback only on :trace", function()
    local dir = T.tmpdir()
    T.write(dir .. "/in", "x = nil\nx.y = 1\n1 + 1\n:trace\n:quit\n")
    local rc, out = T.run(string.format("HOME=%s %s < %s/in", q(dir), T.loip, q(dir)))
    assert.are.equal(0, rc)
    local before, after = out:match("^(.-)\n2\n(.*)$")
    assert.truthy(before, out)
    assert.matches("attempt to index global 'x'", before)
    assert.is_nil(before:find("stack traceback", 1, true))
    assert.truthy(after:find("stack traceback", 1, true))
  end)
end)

describe("modules", function()
  it("every public module is loip.<name>, loaded on first use; the rest are named as internal", function()
    local internal = { "^loip%.core$", "^loip%.model%.hf$", "^loip%.model%.llama2c$", "^loip%.model%.gguf_model$",
      "^loip%.model%.manifest$", "^loip%.model%.locate$", "^loip%.plan%.shape$", "^loip%.measure%.stats$",
      "^loip%.model%.part$", -- (a device's part: a Model's and a worker's)
      "^loip%.model%.derive$", -- (weights converted at open: gpt-oss's fused experts)
      "^loip%.model%.fp8$", -- (FP8 checkpoints packed at open and when slicing: hf.lua's, slice.lua's)
      "^loip%.layers$", -- (the Lua layers: spec/unit/layering_spec.lua reads them)
      "^loip%.model%.families$", "^loip%.model%.families%.", -- (the families' descriptions)
      "^loip%.serve%.draft$", "^loip%.serve%.drafter$", "^loip%.serve%.tree$", "^loip%.cluster%.draft$",
      "^loip%.text%.tokenizers%.", "^loip%.text%.template%.", "^loip%.cluster%.proc$", "^loip%.cluster%.rpc$",
      "^loip%.cluster%.planner$", "^loip%.engine%.",
      "^loip%.cluster%.ship$", "^loip%.cluster%.cache$", -- (blocks shipped to workers' caches)
      -- (a serving cluster's membership: joins, leaves, drains; the head's, a worker's, the server's)
      "^loip%.cluster%.registry$", "^loip%.cluster%.join$", "^loip%.serve%.membership$",
      "^loip%.serve%.http$", "^loip%.serve%.metrics$", "^loip%.cli$", "^loip%.cmd%.",
      "^loip%.ui%.flags$", "^loip%.cli%.repl$", "^loip%.cli%.inputs$", "^loip%.measure%.leak$", -- (the soak's leak judgement)
      "^loip%.serve%.draft_trace$", -- (speculative decoding's trace spans: serve and generate use them)
      -- (tool calling and Anthropic's Messages API: the server's; tools parsers require tool_calls)
      "^loip%.serve%.tools$", "^loip%.serve%.tool_calls$", "^loip%.serve%.anthropic$",
      "^loip%.serve%.harmony$", -- (gpt-oss's harmony channels: the tools parser's)
      "^loip%.serve%.request_draft$", -- (a request's own draft fields: the server's)
      -- (the API for agents: sampling at the head, logprobs' shapes, a reply's choices, grammars)
      "^loip%.serve%.head_sample$", "^loip%.serve%.logprobs$", "^loip%.serve%.reply$", "^loip%.serve%.constrain$",
      "^loip%.serve%.choices$", "^loip%.serve%.prefix_cache$", "^loip%.serve%.prefix_disk$", -- (n > 1, the prefix cache)
      "^loip%.serve%.dashboard$", "^loip%.serve%.cluster_view$", -- (the live page at /, /v1/cluster and its events)
      -- (a mixture of experts' cache, its policies' shared settings, played and sized)
      "^loip%.model%.experts$", "^loip%.model%.experts_policy$", "^loip%.sim%.experts$", "^loip%.plan%.sizes$",
      "^loip%.plan%.ends$", -- (where the embedding and head stay: loip.plan.ends, re-exported by loip.plan)
      "^loip%.model%.kernels$", "^loip%.plan%.prefetch$", -- (the kernels' prefetch distance: measured by profile, set when a device opens)
      -- (constrained decoding: grammars, JSON schemas, the C matcher; the server uses them)
      "^loip%.text%.grammar$", "^loip%.text%.gbnf$", "^loip%.text%.schema$", "^loip%.text%.schema_check$",
      "^loip%.text%.utf8$", -- (well-formed UTF-8 out of token streams and into JSON)
      "^loip%.runtime%.grammar$", "^loip%.text%.json_ordered$",
      "^loip%.runtime%.exec$", "^loip%.runtime%.files$", "^loip%.runtime%.sampler$", "^loip%.runtime%.head$",
      "^loip%.runtime%.tokenizer$",
      "^loip%.runtime%.http$", "^loip%.runtime%.process$", "^loip%.runtime%.device$",
      "^loip%.runtime%.beacon$", "^loip%.cluster%.discovery$", -- (discovery on a LAN: worker --announce, serve --discover)
      "^loip%.deploy$", "^loip%.deploy%.describe$", "^loip%.deploy%.host$" } -- (recipes/deploy)
    local reachable = {}
    for _, name in ipairs(loip.modules()) do
      local m = loip[name]
      assert.is_truthy(m, "loip." .. name)
      for mod, v in pairs(package.loaded) do if v == m then reachable[mod] = true end end
    end
    local p = io.popen("cd " .. q(T.root .. "/lua") .. " && find loip -name '*.lua'")
    local missing = {}
    for f in p:lines() do
      local mod = f:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
      local skip = mod == "loip" or reachable[mod]
      for _, pat in ipairs(internal) do skip = skip or mod:match(pat) ~= nil end
      if not skip then missing[#missing + 1] = mod end
    end
    p:close()
    table.sort(missing)
    assert.are.same({}, missing)
    assert.is_nil(loip.cpu)
  end)

  it("scripts run by `loip run` have the `loip` global the REPL has", function()
    local dir = T.tmpdir()
    T.write(dir .. "/s.lua", "print(type(loip), loip.version, type(loip.cluster))\n")
    local rc, out, err = T.run(T.loip .. " run " .. q(dir .. "/s.lua"))
    assert.are.equal(0, rc, err)
    assert.matches("^table\t[%d.]+\ttable", out)
  end)
end)

describe("the tokenizer a model uses", function()
  it("is the one loip.tokenizer.open finds, for a llama2.c directory and for its store", function()
    local tok = loip.tokenizer.open(S260K)
    assert.are.equal(S260K .. "/tok512.bin", tok.path)
    local m = loip.model.open(S260K, { threads = 1 })
    assert.are.same(m.tokenizer:encode("Once upon a time"), tok:encode("Once upon a time"))
    m:close()
    local store = T.tmpdir() .. "/s"
    require("loip.model.slice").write(S260K, store, { quiet = true })
    local st = loip.tokenizer.open(store)
    assert.are.same(tok:encode("Once upon a time"), st:encode("Once upon a time"))
    tok:close() st:close()
  end)
end)

describe("--devices on a model directory", function()
  it("slices it into the cache once, says where, and reuses it", function()
    local cache = T.tmpdir()
    local cmd = string.format("LOIP_CACHE_DIR=%s %s generate --model %s --devices 2 --threads 1 --temperature 0 --max-tokens 30 --prompt 'Once upon a time'",
      q(cache), T.loip, q(S260K))
    local rc, out, err = T.run(cmd)
    assert.are.equal(0, rc, err)
    local dir = err:match("sliced %S+ into the slice store (%S+) %(kept for the next run%)")
    assert.truthy(dir, err)
    assert.are.equal(cache .. "/stores/", dir:sub(1, #cache + 8))
    local rc2, out2, err2 = T.run(cmd)
    assert.are.equal(0, rc2, err2)
    assert.truthy(err2:find("running the slice store of " .. S260K .. " in " .. dir .. " (sliced earlier)", 1, true), err2)
    assert.is_nil(err2:find("slicing", 1, true))
    assert.are.equal(out, out2)
    local m = loip.model.open(S260K, { threads = 1 })
    local it = m:generate("Once upon a time", { temperature = 0, max_tokens = 30 })
    local text = {}
    for _, piece in it do text[#text + 1] = piece end
    m:close()
    assert.are.equal("Once upon a time" .. table.concat(text) .. "\n", out)
    -- a source that changed is sliced again, and its old store goes
    local copy = T.tmpdir() .. "/stories260K"
    assert.are.equal(0, os.execute(string.format("cp -r %s %s", q(S260K), q(copy))))
    local function run_copy()
      local rc3, _, err3 = T.run(string.format("LOIP_CACHE_DIR=%s %s generate --model %s --devices 2 --threads 1 --max-tokens 4 --prompt x",
        q(cache), T.loip, q(copy)))
      assert.are.equal(0, rc3, err3)
      return err3:match("sliced %S+ into the slice store (%S+) %(kept")
    end
    local a = run_copy()
    assert.truthy(a)
    assert.are.equal(0, os.execute("touch -d 2001-01-01 " .. q(copy .. "/stories260K.bin")))
    local b = run_copy()
    assert.truthy(b)
    assert.are_not.equal(a, b)
    assert.is_false(T.exists(a .. "/manifest.json"))
    assert.is_true(T.exists(b .. "/manifest.json"))
    assert.is_true(T.exists(dir .. "/manifest.json")) -- (another source's store stays)
  end)

  it("refuses more devices than blocks before slicing or starting anything", function()
    local cache = T.tmpdir()
    local rc, _, err = T.run(string.format("LOIP_CACHE_DIR=%s %s generate --model %s --devices 11 --prompt x",
      q(cache), T.loip, q(S260K)))
    assert.are.equal(2, rc)
    assert.matches("11 devices but the model has only 10 blocks", err)
    assert.is_false(T.exists(cache .. "/stores"))
  end)
end)

describe("loip help", function()
  it("lists every command, one line each", function()
    local cli = require "loip.cli"
    local usage = cli.usage()
    for name in pairs(cli.commands) do
      assert.truthy(usage:find("\n  " .. name .. " ", 1, true), "loip help does not list " .. name)
    end
  end)
end)

describe("reports", function()
  it("give one JSON schema and one set of defaults for one device and for a cluster, figures that add up", function()
    -- a model whose maximum context (2048) is past the defaults' old disagreement (4096 vs 512)
    local dir = T.tmpdir()
    local rc, _, err = T.run(string.format("LOIP_QUIET=1 %s synth --like llama-3.2-1b --dtype f32 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 --seed 1 %s/hf",
      T.loip, q(dir)))
    assert.are.equal(0, rc, err)
    local cfg = json.load(dir .. "/hf/config.json")
    cfg.max_position_embeddings = 2048
    T.write(dir .. "/hf/config.json", json.encode(cfg))
    require("loip.model.slice").write(dir .. "/hf", dir .. "/store", { quiet = true })
    local flags = "--threads 1 --temperature 0 --max-tokens 12 --prompt 'Once upon a time' --json"
    local rc1, out1, err1 = T.run(string.format("%s generate --model %s/store %s", T.loip, q(dir), flags))
    assert.are.equal(0, rc1, err1)
    local rc2, out2, err2 = T.run(string.format("LOIP_CACHE_DIR=%s %s generate --model %s/store --devices 2 %s", q(dir), T.loip, q(dir), flags))
    assert.are.equal(0, rc2, err2)
    local one, two = json.decode(out1), json.decode(out2)
    for _, k in ipairs({ "prompt", "text", "prompt_ids", "token_ids", "prompt_tokens", "generated_tokens", "stop_reason",
      "prefill_ms", "decode_ms_per_token", "model", "seed", "temperature", "threads", "kernels", "context", "batch" }) do
      assert.is_not_nil(one[k], "one device lacks " .. k)
      assert.is_not_nil(two[k], "the cluster lacks " .. k)
    end
    assert.are.equal(2048, one.context)
    assert.are.equal(one.context, two.context)
    assert.are.equal(one.batch, two.batch)
    assert.are.same(one.token_ids, two.token_ids)
    assert.are.equal(one.stop_reason, two.stop_reason)
    -- a device's figures per step add up to no more than a step took (the loader's reads run
    -- beside them: not in the sum)
    for i, d in ipairs(two.devices) do
      local sum = d.compute_ms + d.stall_ms + d.send_ms + d.recv_wait_ms
      assert.is_true(sum <= two.step_ms * 1.05 + 0.05, string.format("device %d: %.3f ms of figures in a %.3f ms step", i, sum, two.step_ms))
    end
    -- and `loip plan` plans what the cluster runs: the same memory per device
    local rc3, out3, err3 = T.run(string.format("LOIP_CACHE_DIR=%s %s plan --model %s/store --devices 2 --json", q(dir), T.loip, q(dir)))
    assert.are.equal(0, rc3, err3)
    -- from the same figures (issue 24: the two once planned apart): one calibration of this
    -- machine, in one cache file, for both (the same devices sharing its disk) ...
    local cals = {}
    for f in io.popen("ls " .. q(dir)):lines() do if f:match("^calibration%-.*%.json$") then cals[#cals + 1] = f end end
    assert.are.equal(1, #cals, "calibrations: " .. table.concat(cals, ", "))
    -- ... and the run that measured it planned with the figures the file gives back, not the
    -- digits JSON leaves out (nearly tied plans went apart on them)
    T.write(dir .. "/roundtrip.lua", [[
local profile = require "loip.plan.profile"
local opts = { store = arg[1], threads = 1, context = 2048, readers = 2, quiet = true }
local a = profile.calibrate(setmetatable({ fresh = true }, { __index = opts }))
local b = profile.calibrate(opts)
local function diff(x, y, where)
  if type(x) ~= "table" or type(y) ~= "table" then
    if x ~= y then return string.format("%s: %.17g measured, %.17g from the cache", where, tonumber(x) or 0 / 0, tonumber(y) or 0 / 0) end
    return nil
  end
  for k, v in pairs(x) do local d = diff(v, y[k], where .. "." .. tostring(k)) if d then return d end end
  for k in pairs(y) do if x[k] == nil then return where .. "." .. tostring(k) .. ": only in the cache" end end
end
io.write(diff(a, b, "calibration") or "same")
]])
    local rc4, out4, err4 = T.run(string.format("LOIP_CACHE_DIR=%s %s run %s/roundtrip.lua %s/store", q(dir), T.loip, q(dir), q(dir)))
    assert.are.equal(0, rc4, err4)
    assert.are.equal("same", out4)
    local planned = json.decode(out3)
    for i, d in ipairs(two.devices) do
      local used = 0
      for _, b in pairs(d.accounts) do used = used + b end
      assert.are.equal(planned.devices[i].memory_bytes, used, "device " .. i)
    end
  end)
end)

describe("plan files", function()
  it("may use the pure functions of math, string and table, and nothing else", function()
    local dir = T.tmpdir()
    T.write(dir .. "/p.lua", "local n = math.floor(9.5) return { slots = 1, devices = { { stages = { { blocks = { 0, n }, "
      .. "offloaded = tonumber(string.format('%d', #table.concat({ 'a', 'b' }))) } } } } }\n")
    local p = require("loip.plan").load(dir .. "/p.lua")
    assert.are.same({ 0, 9 }, p.devices[1].stages[1].blocks)
    assert.are.equal(2, p.devices[1].stages[1].offloaded)
    T.write(dir .. "/bad.lua", "return { slots = math.random(3) }\n")
    local ok, err = pcall(require("loip.plan").load, dir .. "/bad.lua")
    assert.is_false(ok)
    assert.matches("bad.lua", err)
    T.write(dir .. "/io.lua", "io.open('/etc/passwd') return {}\n")
    assert.is_false((pcall(require("loip.plan").load, dir .. "/io.lua")))
  end)
end)

describe("a cluster's generate from Lua", function()
  it("takes text and stops at the model's end tokens, as one device does", function()
    local store = T.tmpdir() .. "/s"
    require("loip.model.slice").write(S260K, store, { quiet = true })
    local m = loip.model.open(S260K, { threads = 1 })
    local it1, st1 = m:generate("Once upon a time", { temperature = 0 })
    local t1 = {}
    for _, piece in it1 do t1[#t1 + 1] = piece end
    m:close()
    assert.are.equal("stop", st1.stop_reason)
    local c = loip.cluster.start_local { store = store, devices = 2, threads = 1 }
    local ok, err = pcall(function()
      c:plan {}
      local it2, st2 = c:generate("Once upon a time", { temperature = 0 })
      local t2 = {}
      for _, piece in it2 do t2[#t2 + 1] = piece end
      assert.are.same(st1.token_ids, st2.token_ids)
      assert.are.equal(table.concat(t1), table.concat(t2))
      assert.are.equal("stop", st2.stop_reason)
      -- ids still work, and an explicit stop list wins
      local it3, st3 = c:generate(st1.prompt_ids, { temperature = 0, max_tokens = 5, stop = {} })
      for _ in it3 do end
      assert.are.equal(5, #st3.token_ids)
      assert.are.equal("max_tokens", st3.stop_reason)
    end)
    c:close()
    assert.is_true(ok, tostring(err))
  end)
end)
