-- The simulator: a plan played out over time on devices described by profiles, with no weights
-- and no workers (the engine is loip.engine.sim: what a step takes on each device's lanes).
-- Requests are admitted, prefilled in chunks beside the others' decoding, batched and retired
-- exactly as on devices, by the same code (loip.engine.request.batcher, loip.engine.request.online); only the time
-- a step takes is simulated.
--
--   local sim = require "loip.sim"
--   local s = sim.new(problem, plan, { context = 512, step_tokens = 64, max_seqs = 4 })
--   local runs = s:play(arrivals)          -- a request pattern's arrivals (recipes/policies/pattern)
--   s:device_figures(), s:events(i)        -- per device, trace events
local plan = require "loip.plan"
local space = require "loip.plan.space"
local engine = require "loip.engine"
local esim = require "loip.engine.sim"

local M = {}

M.KV_BLOCK = esim.KV_BLOCK -- positions per KV group (LOIP_KV_BLOCK_TOKENS)

-- A simulation: the engine, and what plays requests through it.
local Sim = setmetatable({}, { __index = esim.Sim })
Sim.__index = Sim

-- problem, p, opts: as loip.engine.sim.new takes them (the plan is checked as every plan is).
function M.new(problem, p, opts)
  return setmetatable(esim.new(problem, p, opts), Sim)
end

-- ---- playing requests ---------------------------------------------------------------------------

-- Play arrivals (a request pattern's: { at_ms | after = "previous" | "all", prompt_tokens,
-- max_tokens }) through the request loop; opts: prefill, links (a link schedule), online (an
-- online policy: a name, a path or a table), draft_tokens (with the simulation's draft: a fixed
-- draft length; nil: chosen each step). Returns one record per request: { t_sent, t_first,
-- t_done, ttft_ms, ms_per_token, tokens, status }; a step that failed leaves s.failure (its
-- message) and the requests it ended.
function Sim:play(arrivals, opts)
  opts = opts or {}
  local b = engine.batcher(self, { max_batch = self.max_seqs, prefill = opts.prefill, online = opts.online, links = opts.links,
    draft = self.draft and self.draft:policy(self), draft_tokens = opts.draft_tokens })
  self.batcher = b
  local runs, reqs, done = {}, {}, 0
  local t0 = self.now_ms
  local k = 1
  local function ready(a)
    if a.after == "previous" then return done >= k - 1 end
    if a.after == "all" then return done >= k - 1 and not b:busy() end
    return (a.at_ms or 0) <= self.now_ms - t0
  end
  while k <= #arrivals or b:busy() do
    while k <= #arrivals and ready(arrivals[k]) do
      local a = arrivals[k]
      local prompt = {}
      for j = 1, math.max(1, a.prompt_tokens or 8) do prompt[j] = 3 + j % 100 end
      local r = b:submit { prompt = prompt, max_tokens = a.max_tokens or 16, stop = {} }
      local rec = { t_sent = self.now_ms, prompt_tokens = #prompt }
      r.on_done = function(rr)
        done = done + 1
        rec.t_done, rec.tokens, rec.status = rr.t_done, #rr.token_ids, rr.finish_reason == "error" and tostring(rr.error) or 200
        local tm = rr:timings()
        rec.ttft_ms, rec.ms_per_token, rec.queue_ms = tm.ttft_ms, tm.decode_ms_per_token, tm.queue_ms
      end
      runs[k], reqs[k] = rec, r
      k = k + 1
    end
    local ok, more = pcall(b.step, b)
    if not ok then
      -- the step failed (a device out of memory, an online policy that cannot make room): every
      -- request in it ended with the error, as on devices
      self.failure = tostring(more)
      break
    end
    if not more then
      -- nothing runs: time goes to the next arrival that waits on the clock
      local a = arrivals[k]
      if not a then break end
      if a.after then error("simulate: arrival " .. k .. " waits for requests that never come", 0) end
      self.now_ms = math.max(self.now_ms, t0 + (a.at_ms or 0))
    end
  end
  return runs
end

-- Per device, the totals of what every step's timeline held: compute, load, stall, send (ms),
-- and per decoding token over the steps played (steps).
function Sim:device_figures()
  local out = {}
  for i, x in ipairs(self.devices) do
    out[i] = { comp_ms = x.comp_ms, load_ms = x.load_ms, stall_ms = x.stall_ms, send_ms = x.send_ms, peak_bytes = x.peak_bytes,
      lend_wait_ms = x.lend_wait_ms, draft_bytes = self.draft and self.draft:bytes_on(i) > 0 and self.draft.bytes or nil,
      memory_bytes = plan.memory(self.plan, i, self.problem.model, space.memory_opts(self.problem)).total,
      budget_bytes = self.problem.devices[i].budget,
      -- (a mixture of experts: what its expert cache played)
      experts = x.experts and { slots = x.experts.slots, read = x.experts.reads, cache_hits = x.experts.hits,
        hit_rate = x.experts.reads + x.experts.hits > 0 and x.experts.hits / (x.experts.reads + x.experts.hits) or nil } or nil }
  end
  return out
end

-- Device i's events (loip.engine.trace's format, as a device records them).
function Sim:events(i) return self.devices[i].events end

return M
