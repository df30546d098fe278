-- Speculative decoding on the trace's timeline (docs/serving.md, "Speculative decoding"): a span
-- per draft proposal (the policy's time, how many were asked and proposed, the request) and a
-- span per verifying step (its rows, drafts and accepted drafts), recorded by a loip.engine.request.draft
-- (times from its clock: the engine's, else core.now_ms, the clock the devices' events are
-- shifted to) and drawn on the trace's "head" process (loip.trace, device 0), lanes "draft" and
-- "verify".
--
--   draft_trace.record(b.draft)            -- before the requests run
--   draft_trace.add_to_trace(tr, b.draft)  -- then, with the devices' events
--
-- A verifying step runs from the end of its last proposal to the first request it returns to
-- (the batcher proposes every request's drafts, steps, then observes each request): its rows
-- are the decoding requests' tokens and drafts, not the prompt chunks beside them.
local M = {}

-- The most spans kept (the oldest go first): a long `loip serve --trace` stays bounded.
M.MAX_SPANS = 200000

local function push(d, e)
  local sp = d.spans
  sp[#sp + 1] = e
  if #sp > M.MAX_SPANS then -- (the older half goes at once: no shifting per span)
    local half = math.floor(#sp / 2)
    local n = #sp
    for i = 1, n - half do sp[i] = sp[i + half] end
    for i = n - half + 1, n do sp[i] = nil end
  end
end

-- The step being verified is complete: its span goes with the others (a step that verified no
-- drafts, only probed, is none).
local function close_step(d)
  local st = d.step_span
  d.step_span = nil
  if st and st.t1 and st.drafted > 0 then
    push(d, { kind = "verify", t0 = st.t0, t1 = st.t1, rows = st.rows, drafted = st.drafted, accepted = st.accepted,
      requests = st.requests })
  end
end

-- Draft:propose's hook: request r was asked for k drafts and proposed n, from t0 for dt ms.
local function span_draft(d, r, k, n, t0, dt)
  local st = d.step_span
  if st and st.t1 then close_step(d) st = nil end
  if not st then
    st = { rows = 0, drafted = 0, accepted = 0, requests = 0, seen = {}, proposals = {} }
    d.step_span = st
  end
  st.t0 = t0 + dt -- (the step starts after its last proposal)
  local sp = { kind = "draft", t0 = t0, t1 = t0 + dt, request = r.id, k = k, proposed = n }
  st.proposals[r] = sp
  push(d, sp)
end

-- Draft:observe's hook: after a step, request r had drafted k and `accepted` of them were.
local function span_verified(d, r, k, accepted)
  local st = d.step_span
  if not st then return end
  if st.seen[r] then -- r again: a new step, and one that verified nothing (nobody proposed)
    close_step(d)
    return
  end
  st.seen[r] = true
  -- r proposed but sent nothing: an unsent probe (loip.engine.request.draft, while r drafts nothing)
  local sp = st.proposals[r]
  if k == 0 and sp and sp.proposed > 0 then sp.probe = true end
  st.t1 = st.t1 or d.now()
  st.rows, st.drafted, st.accepted, st.requests = st.rows + 1 + k, st.drafted + k, st.accepted + accepted, st.requests + 1
end

-- Start recording d's spans (a loip.engine.request.draft; nil: nothing). Returns d.
function M.record(d)
  if d and not d.spans then
    d.spans, d.span_draft, d.span_verified = {}, span_draft, span_verified
  end
  return d
end

-- d's spans (the last step's too, once it was verified), as { kind = "draft" | "verify", t0, t1
-- (ms on d's clock), request, k, proposed, probe (an unsent probe) | rows, drafted, accepted,
-- requests }.
function M.spans(d)
  if not (d and d.spans) then return {} end
  local st = d.step_span
  if st and st.t1 then close_step(d) end
  return d.spans
end

-- Add d's spans to tr (a loip.trace) on its head process. Returns tr.
function M.add_to_trace(tr, d)
  local evs = {}
  for _, s in ipairs(M.spans(d)) do
    local e = { kind = s.kind, t0_ns = math.floor(s.t0 * 1e6), t1_ns = math.floor(s.t1 * 1e6) }
    if s.kind == "draft" then
      e.name = string.format("%s %d of %d (request %d)", s.probe and "probe (unsent)" or "draft", s.proposed, s.k, s.request)
      e.args = { request = s.request, k = s.k, proposed = s.proposed, ms = s.t1 - s.t0, probe = s.probe }
    else
      e.name = string.format("verify %d rows: %d of %d drafts accepted", s.rows, s.accepted, s.drafted)
      e.args = { rows = s.rows, drafted = s.drafted, accepted = s.accepted, requests = s.requests, ms = s.t1 - s.t0 }
    end
    evs[#evs + 1] = e
  end
  if #evs > 0 then tr:add(evs, 0) end
  return tr
end

return M
