-- Helpers the benchmark recipes share: robust statistics (loip.measure.stats') and
-- progress lines on stderr (stdout carries the recipe's one JSON object).
local stats = require "loip.measure.stats"
local core = require "loip.core"
local proc = require "loip.cluster.proc"
local json = require "loip.text.json"
local synth = require "loip.model.synth"
local store_mod = require "loip.model.store"
local slice_mod = require "loip.model.slice"

local M = {}

M.median, M.quantile, M.mean = stats.median, stats.quantile, stats.mean -- (loip.measure.stats)

function M.log(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end

-- First line of a shell command's output ("" when none).
function M.sh(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local r = p and p:read("*l") or ""
  if p then p:close() end
  return r
end

-- A `loip serve ARGS --port 0 --quiet` child: { pid, url, log() (its stderr), stop() (SIGTERM,
-- then SIGKILL after 15 s: srv.killed; its files removed, its log kept for srv.log()) }.
-- Raises, with its log, when it does not listen within 300 s (what: who started it).
function M.serve(args, what)
  local out, err = os.tmpname(), os.tmpname()
  local p = io.popen(string.format("%s serve %s --port 0 --quiet > %s 2> %s & echo $!", proc.exe(), args, out, err))
  local pid = tonumber(p:read("*l"))
  p:close()
  local url
  local deadline = core.now_ms() + 300000
  while not url and proc.alive(pid) and core.now_ms() < deadline do
    local f = io.open(out)
    url = f and f:read("*a"):match("listening (http://%S+)")
    if f then f:close() end
    if not url then core.sleep_ms(50) end
  end
  local srv = { pid = pid, url = url }
  function srv.log()
    if srv.log_text then return srv.log_text end
    local f = io.open(err)
    local s = f and f:read("*a") or ""
    if f then f:close() end
    return s
  end
  function srv.stop()
    if srv.stopped then return end
    srv.stopped = true
    os.execute("kill -TERM " .. pid .. " 2>/dev/null")
    local t = core.now_ms()
    while proc.alive(pid) and core.now_ms() - t < 15000 do core.sleep_ms(50) end
    srv.killed = proc.alive(pid)
    if srv.killed then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
    srv.log_text = srv.log()
    os.remove(out)
    os.remove(err)
  end
  if not url then
    srv.stop()
    error(what .. ": loip serve did not start:\n" .. srv.log(), 0)
  end
  return srv
end

-- The synthetic llama-3.2-1b BF16 model and slice store the benchmarks share (made on first use
-- by M.ensure_store), and the prompt (token ids) the decoding benchmarks start from.
M.MODEL = "/tmp/loip-bench/llama-3.2-1b-bf16"
M.STORE = M.MODEL .. "-store"
M.PROMPT = { 1, 2028, 374, 264, 1296, 315, 279, 1887 }

-- The benchmarks' prompt for a model of vocab_size tokens (M.PROMPT's ids folded into its
-- vocabulary: a small model, stories260K's 512, runs every recipe too).
function M.prompt(vocab_size)
  local ids = {}
  for i, id in ipairs(M.PROMPT) do ids[i] = id % vocab_size end
  return ids
end

-- A recipe's flags (loip.ui.flags rows): --store and --model of the shared store, then the
-- recipe's own.
function M.store_flags(what, own)
  local rows = { { "store", "string", "slice store " .. what .. " (made if missing)", default = M.STORE },
    { "model", "string", "synthetic model the store is sliced from (made if missing)", default = M.MODEL } }
  for _, r in ipairs(own) do rows[#rows + 1] = r end
  return rows
end

-- The decoding steps of a generation (an iterator of loip.model's or a cluster's generate), ms
-- each: the time between two tokens (one forward pass and a sample). Generate two tokens more
-- than the steps wanted: the first token's time is the prompt's, and the last token has no
-- forward pass after it, so its step is dropped.
function M.token_steps(it)
  local now_ms = core.now_ms
  local steps, last = {}, nil
  for _ in it do
    local now = now_ms()
    if last then steps[#steps + 1] = now - last end
    last = now
  end
  steps[#steps] = nil
  return steps
end

-- A cluster's decoding (the iterator of its generate, asked for two tokens more than the steps
-- wanted, as M.token_steps), measured over decoding steps only: the devices' stats snapshot
-- after the first token (the prefill is behind it) and at the end, and the step that carried the
-- snapshot left out of the times. Returns the steps (ms each), the per-device figures per
-- decoding step (M.device_figures), the end snapshot, and when the last token came (core.now_ms).
function M.decode_figures(c, it)
  local now_ms = core.now_ms
  local steps, last, before, k = {}, nil, nil, 0
  for _ in it do
    local now = now_ms()
    k = k + 1
    if k == 1 then before = c:stats() end
    if k >= 3 then steps[#steps + 1] = now - last end
    last = now
  end
  steps[#steps] = nil -- the last token has no forward pass after it
  local after = c:stats()
  return steps, M.device_figures(before or after, after, math.max(1, k - 1)), after, last
end

-- Per device and decoding step, what the devices' stats (Cluster:stats) grew by between two
-- snapshots over n_steps steps: compute, load, stall, send and waiting ms.
function M.device_figures(before, after, n_steps)
  local per = {}
  for i = 1, #after do
    local function d(k) return ((after[i][k] or 0) - (before[i][k] or 0)) / n_steps end
    per[i] = { compute_ms = d("compute_ms"), load_ms = d("load_ms"), stall_ms = d("stall_ms"), send_ms = d("send_ms"),
      waiting_ms = d("recv_wait_ms") }
  end
  return per
end

-- A synthetic slice store made on first use (the model with loip.synth, then sliced): shape is
-- loip.synth's options, by default the llama-3.2-1b BF16 model the benchmarks share.
function M.ensure_store(store_dir, model_dir, shape)
  if store_mod.is_store(store_dir) then return store_dir end
  if not json.exists(model_dir .. "/config.json") then
    M.log("making the synthetic model in %s (once)", model_dir)
    synth.write(model_dir, shape or { like = "llama-3.2-1b", dtype = "bf16", seed = 1 })
  end
  M.log("slicing %s into %s (once)", model_dir, store_dir)
  slice_mod.write(model_dir, store_dir)
  return store_dir
end

-- Budgets for n devices totalling `share` of a model's weights (sizes: loip.plan.sizes), as the
-- cluster benchmarks make them: device 1 holds the embedding, device n the head (with tied
-- embeddings, the embedding again): they get those on top of an equal share of the rest; each
-- also gets its KV cache, activations and message buffers. Raises when the ends take it all.
function M.budgets(sizes, n, share)
  local ends = sizes.embed_file_bytes + sizes.head_file_bytes + (sizes.tied and sizes.embed_file_bytes or 0)
  local rest = share * sizes.weight_bytes - ends
  if rest <= 0 then
    error(string.format("a budget of %.2f of the weights leaves nothing for the layers once the embedding and head are held", share), 0)
  end
  local each = math.floor(rest / n)
  local out = {}
  for i = 1, n do
    local extra = sizes.kv_bytes[math.ceil(sizes.n_layers / n) + 1] + sizes.activation_bytes + 4 * 1024 * 1024
    if i == 1 then extra = extra + sizes.embed_file_bytes end
    if i == n then extra = extra + sizes.head_file_bytes + (sizes.tied and sizes.embed_file_bytes or 0) end
    out[i] = each + extra
  end
  return out
end

return M
