-- n > 1 choices of one prompt (loip.engine.request.batcher's hooks; docs/prefix-cache.md): the prompt is
-- prefilled once, its KV shared copy-on-write by the n sequences.
--
-- A request submitted with n = k > 1 is the first of k requests (its .choices lists all k in
-- order, each with .choice its 0-based index and its own sampler stream: seed + index). They are
-- admitted together (k slots; KV reserved with the prompt's shared full groups counted once).
-- The first prefills the prompt but its last token; then each other choice starts in its slot
-- sharing those positions (engine:start with r.share = { seq, positions }: loip_session_seq_share
-- on every device) and every choice computes the prompt's last token itself, as a row of its own:
-- n rows, no special sampling path. A partial group of the prompt is copied by each choice at its
-- first write; the full ones are read by all and written by none.
local M = {}

-- The choices of leader r (a request of the batcher b just made from spec): the k - 1 others made
-- (not queued: they ride with r), r's reservation made the family's. Raises a refusal (kind
-- "invalid", param "n") when k cannot be served.
function M.attach(b, r, spec, Request, refusal)
  local k = spec.n or 1
  if type(k) ~= "number" or k < 1 or k ~= math.floor(k) then
    error(refusal("invalid", string.format("n must be a whole number >= 1, not %s", tostring(k)), "n"), 0)
  end
  if k == 1 then return end
  if spec.logits then error(refusal("invalid", "n > 1 returns generated choices, not a prompt's logits", "n"), 0) end
  if not b.shares_kv then
    error(refusal("invalid", "n > 1 shares the prompt's KV between the choices, and this cluster's online policy may lend "
      .. "KV, which moves no shared group: ask for one choice at a time", "n"), 0)
  end
  if k > b.max_batch then
    error(refusal("invalid", string.format("n = %d choices need %d sequence slots and this server has %d", k, k, b.max_batch),
      "n"), 0)
  end
  local kb = b.engine.kv_block
  local shared = math.floor((r.n_prompt - 1) / kb) -- full groups of the shared positions
  local family = { shared = shared, alive = k, members = { r } }
  r.family, r.choice, r.choices, r.groups = family, 0, family.members, r.groups - shared
  r.share_at = r.n_prompt - 1
  r.admit_groups = shared + k * r.groups
  if r.admit_groups > b.kv_groups then
    error(refusal("too_long", string.format("n = %d choices of %d tokens each (the prompt's %d shared) need %d groups of KV "
      .. "and the devices hold %d", k, r.n_prompt + r.max_tokens, r.n_prompt - 1, r.admit_groups, b.kv_groups), "n"), 0)
  end
  for i = 1, k - 1 do
    local c = setmetatable({}, Request)
    for key, v in pairs(r) do c[key] = v end
    c.id = b:new_id()
    c.choice, c.seed, c.token_ids, c.pending, c.head, c.tail = i, (spec.seed or 0) + i, {}, {}, 1, 0
    c.share_at, c.admit_groups, c.state = nil, nil, "queued"
    if r.constraint then c.constraint = r.constraint:clone() end -- (each choice's grammar its own)
    family.members[#family.members + 1] = c
  end
end

-- Slots for r's other choices as r is admitted (their KV reserved with r's); they wait for r's
-- shared prefix. The batcher has checked the free slots (M.slots).
function M.admit(b, r)
  if not r.family or r.choice ~= 0 then return end
  for i = 2, #r.family.members do
    local c = r.family.members[i]
    if c.state == "queued" then
      c.seq, c.state, c.t_admit = table.remove(b.free_seqs), "waiting", b.now()
      b.running[#b.running + 1] = c
    end
  end
  -- its KV holds the shared positions already (a one-token prompt: none; a cached prefix of all
  -- of them): no step of its own comes first
  if r.share_at and r.pos >= r.share_at then M.share(b, r) end
end

-- Slots r needs at admission.
function M.slots(r) return r.family and r.choice == 0 and #r.family.members or 1 end

-- The groups r's admission reserves.
function M.reserve(r) return r.admit_groups or r.groups end

-- r leaves: the groups it reserved go back (the family's shared ones with the last choice; none
-- when it was never admitted: queued); a first choice leaving before its prefix was shared
-- takes the waiting choices with it.
function M.release(b, r, reason, err, queued)
  local f = r.family
  local back = r.groups
  if f then
    f.alive = f.alive - 1
    if f.alive == 0 then back = back + f.shared end
  end
  if not queued then b.kv_used = b.kv_used - back end
  if f and r.choice == 0 and (r.share_at or queued) then
    r.share_at = nil
    for i = 2, #f.members do
      local c = f.members[i]
      if c.state == "waiting" or c.state == "queued" then b:retire(c, reason, err) end
    end
  end
end

-- After a step: first choices whose prompt but its last token is in their KV now share it.
function M.after_step(b)
  for _, r in ipairs(b.running) do
    if r.share_at and r.state == "prefill" and r.pos >= r.share_at then M.share(b, r) end
  end
end

function M.share(b, r)
  local at = r.share_at
  r.share_at = nil
  for i = 2, #r.family.members do
    local c = r.family.members[i]
    if c.state == "waiting" then
      c.share, c.pos, c.state = at > 0 and { seq = r.seq, positions = at } or nil, at, "prefill"
      local ok, err = pcall(b.engine.start, b.engine, c.seq, c)
      c.share = nil
      if not ok then
        -- (a device found lost: every request, this family's too, resumed on the others' plan)
        local resumed, rerr = b:resumed(err)
        if resumed then return end
        b:retire(c, "error", rerr)
      end
    end
  end
end

-- A re-plan starts every running request again from its tokens (the batcher sets them to
-- prefill): the choices prefill their prompt on their own now, each reserving all of it.
function M.resume(b, r)
  r.share_at = nil
  local f = r.family
  if f and f.shared > 0 then -- each choice holds the whole prompt of its own now
    b.kv_used = b.kv_used + (f.alive - 1) * f.shared
    for _, c in ipairs(f.members) do if c.state ~= "done" then c.groups = c.groups + f.shared end end
    f.shared = 0
  end
end

return M
