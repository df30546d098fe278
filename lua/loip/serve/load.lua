-- A load driver: plays a request pattern (recipes/policies/pattern) against an OpenAI-compatible
-- server through loip.runtime.http_client (libcurl's multi interface: every request in flight at
-- once), streaming, and times each request where its bytes land: time to first token, ms per
-- token after it, and the run's aggregate tokens per second.
--
--   local runs = load.play(url, model_name, arrivals, { vocab = 32000 })
--   local s = load.summary(runs)   -- tokens_per_s, ttft_ms {p50, p99}, ms_per_token {p50, p99}
local stats = require "loip.measure.stats"
local client = require "loip.runtime.http_client"
local core = require "loip.core"
local json = require "loip.text.json"
local policy = require "loip.policy"

local M = {}

-- Prompt ids of length n (a fixed pseudo-random text of ids in [3, vocab), BOS first), the
-- k-th request's: different prompts, the same for every run.
function M.prompt(n, k, vocab)
  local ids, x = { 1 }, 7919 * k
  for i = 2, n do
    x = (x * 48271 + i) % 2147483647
    ids[i] = 3 + x % math.max(1, math.min(vocab, 32000) - 3)
  end
  return ids
end

-- The arrivals of a pattern (loip.policy kind "pattern": a name in recipes/policies/pattern or a file)
-- for its options.
function M.pattern(name, opts)
  return policy.load("pattern", name).requests(opts or {})
end

-- Play arrivals; opts: vocab (prompt ids below it), api_key, temperature (0), timeout_ms,
-- ignore_eos (true: each request generates its max_tokens whatever the model ends on, as a
-- benchmark of a fixed length needs).
-- Returns one record per request: { status, prompt_tokens, tokens, t_sent, t_first, t_done
-- (ms, loip.core.now_ms), ttft_ms, ms_per_token, error }.
function M.play(url, model, arrivals, opts)
  opts = opts or {}
  local cl = client.new()
  local headers = opts.api_key and { Authorization = "Bearer " .. opts.api_key } or nil
  local runs, live, done_count = {}, 0, 0
  local t0 = core.now_ms()
  local function send(k)
    local a = arrivals[k]
    local r = { prompt_tokens = a.prompt_tokens, tokens = 0, t_sent = core.now_ms(), times = {} }
    runs[k] = r
    local body = json.encode({ model = model, prompt = M.prompt(a.prompt_tokens, k, opts.vocab or 32000),
      max_tokens = a.max_tokens, temperature = opts.temperature or 0, ignore_eos = opts.ignore_eos or nil, stream = true,
      stream_options = { include_usage = true } })
    local h = {}
    for x, y in pairs(headers or {}) do h[x] = y end
    local t = cl:post(url .. "/completions", body, h, { timeout_ms = opts.timeout_ms })
    t.on_event = function(_, data, at)
      if data == "[DONE]" then return end
      local e = json.decode(data)
      if not e then return end
      if e.usage and e.usage ~= json.null then r.tokens = e.usage.completion_tokens end
      local c = e.choices and e.choices[1]
      if c and c ~= json.null and c.text and c.text ~= "" then
        r.times[#r.times + 1] = at
        if not r.t_first then r.t_first = at end
      end
    end
    t.on_done = function(tt)
      r.status, r.error, r.t_done = tt.status, tt.error, core.now_ms()
      if tt.status ~= 200 then r.error = r.error or tt.body:sub(1, 300) end
      live, done_count = live - 1, done_count + 1
    end
    live = live + 1
  end
  local k = 1
  while k <= #arrivals or live > 0 do
    while k <= #arrivals do
      local a = arrivals[k]
      local ready = (a.after == "previous" and done_count >= k - 1) or (a.after == "all" and live == 0)
        or (a.after == nil and (a.at_ms or 0) <= core.now_ms() - t0)
      if not ready then break end
      send(k)
      k = k + 1
    end
    cl:run(2)
  end
  cl:close()
  for _, r in ipairs(runs) do
    if r.t_first then r.ttft_ms = r.t_first - r.t_sent end
    -- decoding time per token after the first, from the stream's arrival times
    if #r.times > 1 then r.ms_per_token = (r.times[#r.times] - r.times[1]) / (#r.times - 1) end
    r.times = nil
  end
  return runs
end

-- Aggregates of play's records: requests, failed, tokens, wall_ms (first send to last done),
-- tokens_per_s, ttft_ms and ms_per_token as { p50, p99, mean }.
function M.summary(runs)
  local s = { requests = #runs, failed = 0, tokens = 0 }
  local first, last = math.huge, 0
  local ttft, mpt = {}, {}
  for _, r in ipairs(runs) do
    if r.status ~= 200 then s.failed = s.failed + 1 end
    s.tokens = s.tokens + (r.tokens or 0)
    first, last = math.min(first, r.t_sent), math.max(last, r.t_done or r.t_sent)
    if r.ttft_ms then ttft[#ttft + 1] = r.ttft_ms end
    if r.ms_per_token then mpt[#mpt + 1] = r.ms_per_token end
  end
  s.wall_ms = last - first
  s.tokens_per_s = s.wall_ms > 0 and s.tokens / s.wall_ms * 1000 or 0
  local function q(xs)
    if #xs == 0 then return nil end
    local sum = 0
    for _, x in ipairs(xs) do sum = sum + x end
    return { p50 = stats.quantile(xs, 0.5), p99 = stats.quantile(xs, 0.99), mean = sum / #xs }
  end
  s.ttft_ms, s.ms_per_token = q(ttft), q(mpt)
  return s
end

return M
