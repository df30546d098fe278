-- Shared helpers for the specs: where the reference data lives, temp dirs, float files.
local ffi = require "ffi"

local M = {}

M.root = os.getenv("LOIP_REPO") or "."
-- Test data (models, tokenizers, chat templates, reference outputs) ships in the repository's
-- models/ (models/README.md lists each folder with its source and licence). $LOIP_SHARED_DIR
-- may name a folder laid out the same way (models/<folder>/...) holding more; nothing the specs
-- use needs it.
M.extra_data = os.getenv("LOIP_SHARED_DIR")

-- run.c's continuation of a greedy reference case c (models/*/reference/greedy.json), its first n
-- tokens (run.c stops at BOS, id 1).
function M.reference_ids(c, n)
  local out = {}
  for i = 1, math.min(n, #c.generated_ids) do out[i] = c.generated_ids[i] end
  return out
end

function M.exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

-- The path of test data rel ("models/<folder>/<file>"): the repository's copy, else
-- $LOIP_SHARED_DIR's; nil and the reason (for pending()) when neither has it.
function M.fixture_path(rel)
  local p = M.root .. "/" .. rel
  if M.exists(p) then return p end
  if M.extra_data and M.extra_data ~= "" then
    local q = M.extra_data .. "/" .. rel
    if M.exists(q) then return q end
    return nil, string.format("needs %s: not in this checkout (%s) nor in LOIP_SHARED_DIR (%s)", rel, p, q)
  end
  return nil, string.format("needs %s: not in this checkout (%s); models/README.md lists the test data", rel, p)
end

function M.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

function M.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

-- A fresh temporary directory, removed by M.cleanup().
local made = {}
function M.tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p '" .. p .. "'") == 0)
  made[#made + 1] = p
  return p
end

-- A plain chat template ("role: content" lines, then "assistant:" when a reply is wanted;
-- bare: the messages' text alone) written as dir/chat.jinja (dir: a fresh M.tmpdir() if nil):
-- its path.
function M.chat_template(dir, bare)
  dir = dir or M.tmpdir()
  M.write(dir .. "/chat.jinja", bare and "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    or "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
  return dir .. "/chat.jinja"
end

function M.cleanup()
  for _, p in ipairs(made) do os.execute("rm -rf '" .. p .. "'") end
  made = {}
end

-- float32 file -> a float array holding a copy of it, and its count. (A pointer cast from the
-- file's Lua string would not keep the string alive: a caller that dropped the string could
-- read memory the GC had freed.)
function M.read_f32(path)
  local s = M.read(path)
  local n = #s / 4
  local a = ffi.new("float[?]", n)
  ffi.copy(a, s, n * 4)
  return a, n
end

function M.max_abs_diff(a, b, n)
  local m = 0
  for i = 0, n - 1 do
    local d = math.abs(a[i] - b[i])
    if d ~= d then return math.huge end
    if d > m then m = d end
  end
  return m
end

-- The largest |logit - reference| over |largest reference logit|, over n positions of V logits
-- (out and R: float arrays of n * V): how far a run is from an outside reference's logits.
function M.worst_relative(out, R, n, V)
  local w = 0
  for p = 0, n - 1 do
    local big, err = 0, 0
    for v = 0, V - 1 do
      big = math.max(big, math.abs(R[p * V + v]))
      err = math.max(err, math.abs(out[p * V + v] - R[p * V + v]))
    end
    w = math.max(w, err / big)
  end
  return w
end

-- A reference model made again here (models/*-reference/reference.json's entry r: loip synth
-- --like r.like r.flags, then r.config's fields in its config.json): a fresh directory holding hf/ (the Hugging Face model), m.gguf (its
-- GGUF, as spec.support.to_gguf writes it) and store/ (its slice store); the directory.
function M.reference_model(r)
  local dir = M.tmpdir()
  local rc, _, err = M.run(string.format("LOIP_QUIET=1 %s synth --like %s %s %s/hf", M.loip, r.like, r.flags, dir))
  assert(rc == 0, err)
  if r.config then -- (config.json fields the entry sets: a table's named fields replaced, the rest kept)
    local json = require "loip.text.json"
    local cfg = assert(json.load(dir .. "/hf/config.json"))
    for k, v in pairs(r.config) do
      if type(v) == "table" and type(cfg[k]) == "table" then for kk, vv in pairs(v) do cfg[k][kk] = vv end
      else cfg[k] = v end
    end
    M.write(dir .. "/hf/config.json", json.encode_sorted(cfg, 2))
  end
  require("spec.support.to_gguf").convert(dir .. "/hf", dir .. "/m.gguf")
  require("loip.model.slice").write(dir .. "/hf", dir .. "/store", { quiet = true })
  return dir
end

-- A shell command's output lines.
function M.lines_of(cmd)
  local p = assert(io.popen(cmd))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- Number of 32-bit words that differ between two arrays (0: bit-identical).
function M.bit_diffs(a, b, n)
  local x, y = ffi.cast("const uint32_t *", a), ffi.cast("const uint32_t *", b)
  local d = 0
  for i = 0, n - 1 do if x[i] ~= y[i] then d = d + 1 end end
  return d
end

-- The logits of the last position of ids (a Lua list) through sequence seq of session s,
-- positions from..#ids-1 fed in chunks of `chunk` rows (a copy of V floats).
function M.last_logits(s, ids, from, seq, chunk, V)
  local exec = require "loip.runtime.exec"
  local n = #ids
  local tok, bt, rows = ffi.new("int32_t[?]", chunk), ffi.new("loip_batch_token[?]", chunk), ffi.new("int32_t[1]")
  local out = ffi.new("float[?]", V)
  for p0 = from, n - 1, chunk do
    local k = math.min(chunk, n - p0)
    for j = 0, k - 1 do tok[j], bt[j].seq, bt[j].pos, bt[j].parent = ids[p0 + j + 1], seq, p0 + j, 0 end
    rows[0] = k - 1
    assert(exec.session_forward_batch(s, tok, k, bt, rows, 1, out))
  end
  return out
end

-- Run a shell command; returns exit code, stdout, stderr.
function M.run(cmd)
  local out, err = os.tmpname(), os.tmpname()
  local rc = os.execute(cmd .. " >" .. out .. " 2>" .. err)
  local o, e = M.read(out), M.read(err)
  os.remove(out)
  os.remove(err)
  if rc > 255 then rc = math.floor(rc / 256) end -- LuaJIT returns the raw wait status
  return rc, o, e
end

-- The loip binary that runs these specs: ctest names it (LOIP_BIN); else the one running them
-- (`loip test` is the loip binary), whatever build directory it is in.
M.loip = os.getenv("LOIP_BIN") or require("loip.cluster.proc").exe()

-- `loip generate --model store --threads 1 --temperature 0 --prompt 'Once upon a time' --json
-- FLAGS`: its exit code, its JSON report (nil when it printed none) and its stderr.
function M.generate_json(store, flags)
  local rc, out, err = M.run(string.format("%s generate --model %s --threads 1 --temperature 0 "
    .. "--prompt 'Once upon a time' --json %s", M.loip, store, flags))
  return rc, require("loip.text.json").decode(out), err
end

function M.u64le(n)
  local b = {}
  for i = 1, 8 do b[i] = string.char(n % 256) n = math.floor(n / 256) end
  return table.concat(b)
end

-- A safetensors file from { name = { dtype=, shape=, data= (bytes) [, offsets=] } }.
function M.safetensors(path, tensors, opts)
  opts = opts or {}
  local cjson = require "cjson"
  local header, blobs, off = {}, {}, 0
  local names = {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local t = tensors[name]
    header[name] = { dtype = t.dtype, shape = t.shape, data_offsets = t.offsets or { off, off + #t.data } }
    blobs[#blobs + 1] = t.data
    off = off + #t.data
  end
  local h = opts.header or cjson.encode(header)
  M.write(path, M.u64le(opts.header_len or #h) .. h .. table.concat(blobs))
end

function M.f32_bytes(values)
  local n = #values
  local a = ffi.new("float[?]", n, values)
  return ffi.string(a, n * 4)
end


-- A slice store of the model at src (sliced once per name and kept until M.drop_stores()).
local stores = {}
-- Flip one bit (0x10) of the byte at offset in the file at path: a damaged block.
function M.flip_bit(path, offset)
  local f = assert(io.open(path, "r+b"))
  f:seek("set", offset)
  local b = f:read(1)
  f:seek("set", offset)
  f:write(string.char(bit.bxor(b:byte(), 0x10)))
  f:close()
end

-- The plan `loip plan --model store FLAGS` makes on this machine's figures, saved to dir/plan.lua
-- (what --plan runs as it is), and the MLP block files it offloads, in ring order: read again
-- every step. A spec that damages a block read every step takes it from here, not from a plan
-- it assumes: which blocks a budget offloads is the scheduler's choice on the machine's figures.
function M.plan_offloading(store, flags, dir)
  local path = dir .. "/plan.lua"
  local rc, out, err = M.run(string.format("%s plan --model '%s' %s --save-plan '%s' --json", M.loip, store, flags, path))
  assert(rc == 0, "loip plan " .. flags .. ": " .. err)
  local files = {}
  for _, d in ipairs(require("loip.text.json").decode(out).plan.devices) do
    for _, s in ipairs(d.stages) do
      -- (a stage's first `offloaded` blocks are read into its slot; odd blocks are MLPs)
      for b = s.blocks[1], s.blocks[1] + s.offloaded - 1 do
        if b % 2 == 1 then files[#files + 1] = string.format("layer-%03d-mlp.bin", (b - 1) / 2) end
      end
    end
  end
  return path, files
end

function M.slice_store(src, name)
  if not stores[name] then
    local dir = os.tmpname()
    os.remove(dir)
    require("loip.model.slice").write(src, dir, { quiet = true })
    stores[name] = dir
  end
  return stores[name]
end

function M.drop_stores()
  for _, d in pairs(stores) do os.execute("rm -rf '" .. d .. "'") end
  stores = {}
end

-- A file's text, "" while it does not exist yet.
function M.read_or_empty(p) return require("loip.text.json").read_file(p) or "" end

-- Servers still running when a spec ends (it failed before stopping its own): M.stop_servers
-- (after_each) stops them, so that a failure leaves no process behind.
local servers = {}
function M.stop_servers()
  for stop in pairs(servers) do stop() end
end

-- Start `loip serve ARGS --port 0`; returns its base URL, a stop function (SIGTERM, waited for;
-- then SIGKILL), the stderr path. opts.verbose: its log line per request (not --quiet).
function M.serve(args, opts)
  local alive = require("loip.cluster.proc").alive
  local C = require("loip.core").C
  local dir = M.tmpdir()
  local p = io.popen(string.format("%s serve %s --port 0%s > %s/out 2> %s/err & echo $!", M.loip, args,
    opts and opts.verbose and "" or " --quiet", dir, dir))
  local pid = tonumber(p:read("*l"))
  p:close()
  local url
  for _ = 1, 2400 do -- (up to 2 minutes on a busy machine; a server that died ends the wait)
    url = M.read_or_empty(dir .. "/out"):match("listening (http://%S+)")
    if url or not alive(pid) then break end
    C.loip_sleep_ms(50)
  end
  local stop
  stop = function()
    servers[stop] = nil
    os.execute("kill -TERM " .. pid .. " 2>/dev/null")
    for _ = 1, 200 do
      if not alive(pid) then break end
      C.loip_sleep_ms(25)
    end
    if alive(pid) then os.execute("kill -KILL " .. pid) end
  end
  servers[stop] = true
  if not url then stop() end
  assert(url, "the server started: " .. M.read_or_empty(dir .. "/err"))
  return url, stop, dir .. "/err"
end

-- A streamed completion (POST url/completions with body, a table, stream = true added) on the
-- loip.runtime.http_client cl: its transfer, whose .events counts the chunks come so far and .pieces
-- gathers their text.
function M.stream_completion(cl, url, body, headers)
  body.stream = true
  local t = cl:post(url .. "/completions", require("loip.text.json").encode(body), headers)
  t.events, t.pieces = 0, {}
  t.on_event = function(tr, data)
    local e = require("loip.text.json").decode(data)
    if e and e.choices and e.choices[1] then tr.events = tr.events + 1 tr.pieces[#tr.pieces + 1] = e.choices[1].text end
  end
  return t
end

-- nil when node and an npm package the specs drive (pkg: its folder under tests/, default
-- "openai/node_modules/openai") are installed, else why not (a spec marks itself pending with it:
-- recipes/setup-debian.sh installs them).
function M.npm_missing(pkg)
  pkg = pkg or "openai/node_modules/openai"
  if os.execute("node --version > /dev/null 2>&1") ~= 0 or not M.exists(M.root .. "/tests/" .. pkg .. "/package.json") then
    return "needs node and the " .. pkg .. " npm package (recipes/setup-debian.sh installs it)"
  end
end

-- The model m's log-probabilities of each of tokens after prompt (ids): the log-softmax of its
-- logits (m:logits of prompt .. tokens) at the position before each.
function M.reference_logprobs(m, prompt, tokens)
  local ids, V = {}, m.vocab_size
  for _, id in ipairs(prompt) do ids[#ids + 1] = id end
  for _, id in ipairs(tokens) do ids[#ids + 1] = id end
  local logits = m:logits(ids)
  local out = {}
  for j, id in ipairs(tokens) do
    local row = logits + (#prompt + j - 2) * V
    local mx = -math.huge
    for i = 0, V - 1 do mx = math.max(mx, row[i]) end
    local s = 0
    for i = 0, V - 1 do s = s + math.exp(row[i] - mx) end
    out[j] = row[id] - mx - math.log(s)
  end
  return out
end

-- llama.cpp's test-tokenizer files: inputs separated by "\n__ggml_vocab_test__\n" (the file
-- ends with one), outputs one line of space-separated ids per input.
function M.ggml_vectors(inp, out)
  local text, outs = M.read(inp), M.read(out)
  local sep = "\n__ggml_vocab_test__\n"
  local cases, pos = {}, 1
  while true do
    local a, b = text:find(sep, pos, true)
    if not a then break end
    cases[#cases + 1] = { text = text:sub(pos, a - 1) }
    pos = b + 1
  end
  local i = 0
  for line in outs:gmatch("([^\n]*)\n") do
    i = i + 1
    local ids = {}
    for n in line:gmatch("%d+") do ids[#ids + 1] = tonumber(n) end
    cases[i].ids = ids
  end
  assert(i == #cases, "inputs and outputs differ in number")
  return cases
end

-- Model sizes as loip.plan.sizes makes them, for L layers of MHA and MLP blocks of the given
-- bytes (tied: the head is the embedding's), for planning problems made without weights.
function M.model_sizes(L, mha, mlp, tied)
  local MiB = 1024 * 1024
  local s = { n_layers = L, n_blocks = 2 * L, block_bytes = {}, files = {}, mha_bytes = mha, mlp_bytes = mlp,
    embed_file_bytes = 8 * MiB, head_file_bytes = tied and 4096 or 8 * MiB, tied = tied or false, head_bytes = 8 * MiB,
    dim = 512, vocab = 4096, hidden_bytes = 2048, header_bytes = 64, activation_bytes = 2 * MiB, device_bytes = MiB,
    kv_bytes = {}, context = 256, batch = 16 }
  for k = 0, L do s.kv_bytes[k] = k * MiB / 4 end
  s.weight_bytes = s.embed_file_bytes + s.head_file_bytes
  for b = 0, 2 * L - 1 do
    s.block_bytes[b] = b % 2 == 0 and mha or mlp
    s.files[b] = string.format("layer-%03d-%s.bin", math.floor(b / 2), b % 2 == 0 and "mha" or "mlp")
    s.weight_bytes = s.weight_bytes + s.block_bytes[b]
  end
  return s
end

return M
