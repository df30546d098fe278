-- The engine interface and the one front-end over it (docs/design.md, "The engine").
--
-- Three engines run a plan's steps: one device in this process (loip.engine.local, under
-- loip.model), a ring of workers (loip.engine.ring, under loip.cluster) and the simulator
-- (loip.engine.sim, under loip.sim). Each is a table with these fields and methods; everything
-- else — plan choice and checks, generate and logits, the request loop and the online policy —
-- is written once, here and in loip.engine.request.batcher / loip.engine.request.online, over them.
--
--   fields     max_seqs, context, kv_tokens, kv_block (positions per KV group), step_tokens,
--              logits_tokens, vocab; clock (optional: ms now; the simulator's is simulated)
--   a step     start(seq, request): a request takes sequence slot seq (its prompt, sampler, seed)
--                and, with request.share = { seq, positions }, the first positions of sequence
--                share.seq's KV shared copy-on-write (n > 1 choices: loip.engine.request.choices)
--              step(toks) -> outs: one step of the batch. toks: { seq, pos, request, id, flags
--                (LOIP_TOKF_*: 1 sample, 2 logits, 4 recompute) }; outs: per sampled or logits
--                token { seq, request, id, logits (a float* row, valid until the next step) }
--                (with drafts, flags: 8 draft, 16 tree, 32 peek: an output flagged PEEK is a draft
--                row's argmax off the accepted path, not a token; the simulator returns none).
--                A lost device raises an error of kind "replanned" (loip.error) once the engine
--                planned again over the others (the batcher then resumes every request from its tokens).
--              finish(seq, request): the slot's KV is freed (request.keep: the keys of its first
--                groups, held by the prefix cache first)
--   prefix     cache_lookup(keys) (optional) -> how many of the keys, from the first, every device
--                holds (loip.engine.request.prefix_cache); start's request.attach: the keys its sequence
--                starts with; cache_identity: the model's h_0; cache_stats() -> per device
--                { groups, shared_groups, bytes, evictions }
--              idle() (optional): nothing runs (a ring takes lost devices back here)
--              recover(err) (optional) -> err, or an error of kind "replanned" when err (met by start,
--                cache_lookup or an online policy's call) found a device lost and the engine
--                planned again over the others: the batcher resumes every request then
--              step_price(rows) (optional): the cost model's ms for a step of that many rows
--   plan       restage(device, stage, offloaded): live, between steps (no token changes)
--              lend(device, holder, groups) (optional: several devices): KV lending
--              replan_kv(positions) (optional): plan again for more KV positions
--              set_link(i, rate) (optional): an emulated link's rate
--   state      online_devices() -> per device M.device_state(...): what an online policy sees
--              link_rates() -> per link bytes/s (nil: not emulated); link_state() (optional)
--              plan_positions (or sizes.plan_positions): KV positions the plan's memory holds
--              device_stats() -> per device { compute_ms, load_ms, stall_ms (nil: no plan's
--                runner measures them), kv_free_tokens, accounts ({ [account] = bytes }; nil:
--                no budget), prompt_cache (as cache_stats'), kernels ({ variant, prefetch,
--                from }: loip.model.kernels.state) }: what a server's /metrics reports
--              metrics(m) (optional): the engine's own figures added to a loip.serve.metrics m
--   losses     (ring) its cluster's c.losses: { step, devices, why, replan_ms, replanned }
--
-- The front-end (the functions below) is what loip.model's Model, loip.cluster's Cluster and
-- loip.sim call: M.generate and M.logits (one generate, one stats vocabulary), M.batcher (the
-- request loop with the plan's online policy and link schedule), M.check_plan (through
-- loip.policy.check_plan only) and M.restaged (one restage of a plan table).
local policy = require "loip.policy"
local plan = require "loip.plan"
local batcher = require "loip.engine.request.batcher"
local profile = require "loip.plan.profile"
local online_mod = require "loip.engine.request.online"
local draft_mod = require "loip.engine.request.draft"
local sampler_mod = require "loip.model.sampler"
local tokenizer_mod = require "loip.text.tokenizer"

local M = {}

M.restaged = plan.restaged -- (loip.plan: one restage of a plan table)

-- A plan given (a table, or a Lua file returning one) checked for a problem: loaded, then
-- loip.policy.check_plan (well formed, the problem's devices and stage count, every budget).
-- where: how messages name it (the file, else "plan"); over: how a broken budget is introduced.
-- Returns the plan and where.
function M.check_plan(p, problem, where, over)
  if type(p) == "string" then p, where = plan.load(p), p end
  where = where or "plan"
  local bad = policy.check_plan(p, problem, where, over or where)
  if bad then error(bad, 0) end
  return p, where
end

-- What an online policy sees of one device (loip.engine.request.online's state.devices[i]): o.stages the
-- device's stages in the plan (their offloaded counts), o.limit (bytes, 0: unlimited), o.nonkv
-- (its memory outside the KV cache), o.kv_base (its KV tables), o.group_bytes (one KV group of
-- its layers), o.slot_bytes, o.block_bytes, o.lend ({ holder, groups } or nil), o.staging_bytes,
-- o.chunk_bytes (one layer's group; default group_bytes over the KV layers), o.idle_ms (the cost
-- model's idle window per stage, or nil).
-- What a block offloaded gives back to memory, by block (nil: its file, block_bytes): a mixture
-- of experts' MLP block its experts too, less its router (kept for pre-gating). sizes: loip.plan.sizes.
function M.freed_bytes(sizes)
  if not (sizes and sizes.moe) then return nil end
  local out = {}
  for b = 0, sizes.n_blocks - 1 do out[b] = sizes.res_bytes[b] - (b % 2 == 1 and sizes.moe.gating_bytes or 0) end
  return out
end

function M.device_state(o)
  local stages, kv_layers = {}, 0
  for s, st in ipairs(o.stages) do
    local kl = plan.stage_kv_layers(st, o.sizes)
    stages[s] = { first = st.blocks[1], last = st.blocks[2], offloaded = st.offloaded or 0, kv_layers = kl }
    kv_layers = kv_layers + kl
  end
  local g = o.group_bytes or 0
  return { limit = o.limit or 0, nonkv = o.nonkv or 0, kv_base = o.kv_base or 0, group_bytes = g, slot_bytes = o.slot_bytes or 0,
    stages = stages, block_bytes = o.block_bytes, freed_bytes = M.freed_bytes(o.sizes),
    -- KV lending moves one layer's group (K and V) at a time (o.chunk_bytes: known as such)
    chunk_bytes = o.chunk_bytes or (kv_layers > 0 and g / kv_layers or 0),
    lend = o.lend and { holder = o.lend.holder, groups = o.lend.groups } or nil, staging_bytes = o.staging_bytes or 0,
    idle_ms = o.idle_ms }
end

-- The request loop over engine (loip.engine.request.batcher), with the plan's online policy and link
-- schedule: o.online (a loip.policy "online" name, path or table; "none" or nil: none), o.links
-- (a "links" policy), speculative decoding: o.draft (a "draft" policy; "none" or nil: none) with
-- o.draft_tokens (a fixed draft length; nil: chosen each step), o.draft_target (what the draft
-- knows of the model: path, context, vocab, max_seqs, tokenizer); and the batcher's own options
-- (max_batch, max_queue, prefill_chunk, prefill, prefix_cache).
function M.batcher(engine, o)
  o = o or {}
  return batcher.new(engine, { max_batch = o.max_batch, max_queue = o.max_queue,
    prefill_chunk = o.prefill_chunk, prefill = o.prefill, prefix_cache = o.prefix_cache,
    online = online_mod.choose(o.online) and policy.load("online", o.online) or nil,
    links = o.links and policy.load("links", o.links) or nil, draft = M.draft(engine, o) })
end

-- The problem pb at `rows` tokens a step: its micro-batch, and each device's compute figures
-- from its profile at that many rows (a view over pb).
function M.at_rows(pb, rows)
  local devs = {}
  for i, d in ipairs(pb.devices) do
    local c = setmetatable({}, { __index = d.compute })
    if d.profile then
      for _, kind in ipairs({ "mha", "mlp", "head" }) do c[kind .. "_ms"] = profile.block_ms(d.profile, kind, rows, pb.position, pb.shape) end
    end
    devs[i] = setmetatable({ compute = c }, { __index = d })
  end
  return setmetatable({ devices = devs, micro_batch = rows }, { __index = pb })
end

-- The cost model's price (ms) of a step of `rows` rows on plan p for problem (M.at_rows), cached
-- in cache (a table kept by the caller per plan); nil without both.
function M.step_price(p, problem, cost, rows, cache)
  if not p or not problem then return nil end
  if cache[rows] == nil then
    local ok, est = pcall(policy.load("cost", cost or "loip").estimate, p, M.at_rows(problem, rows))
    cache[rows] = ok and type(est) == "table" and est.ms_per_token or false
  end
  return cache[rows] or nil
end

-- Speculative decoding's drafts for engine (loip.engine.request.draft), or nil: o.draft, o.draft_tokens,
-- o.draft_target as M.batcher takes them.
function M.draft(engine, o)
  if o.draft == nil or o.draft == "none" or o.draft == false then return nil end
  local k = o.draft_tokens
  if k ~= nil and (type(k) ~= "number" or k < 0 or k ~= math.floor(k)) then
    error(string.format("--draft-tokens: %s is not a whole number >= 0", tostring(k)), 0)
  end
  local t = setmetatable({}, { __index = o.draft_target or {} })
  t.vocab, t.context = t.vocab or engine.vocab, t.context or engine.context
  t.max_seqs = t.max_seqs or engine.max_seqs
  return draft_mod.new(policy.load("draft", o.draft), t, { tokens = k, engine = engine })
end

-- The ids that end a generation: the model's own (its config's eos_token_id, one or a list;
-- llama2.c's checkpoints stop on BOS as well as EOS), else the tokenizer's. One rule for a
-- model on this machine and for a cluster serving its store.
function M.stop_ids(facts, tok)
  local eos = facts and facts.eos_token_id
  if eos == nil and tok then eos = tok.stop_ids or tok.eos_id end
  return type(eos) == "table" and eos or { eos }
end

-- Token ids of a prompt (text through tok, or ids as given), checked against the vocabulary and
-- the context. who: the prefix of messages ("" or "cluster: ").
local function prompt_ids(f, prompt, opts, who)
  local tok, ids = f.tokenizer, prompt
  if type(prompt) ~= "table" then
    if not tok then error(who .. "no tokenizer" .. (f.tokenizer_error and (" (" .. tostring(f.tokenizer_error) .. ")") or "")
      .. ": pass token ids", 3) end
    ids = tok:encode(prompt or "", { bos = opts.bos ~= false })
  end
  if type(ids) ~= "table" or #ids == 0 then error(who .. "token ids must be a non-empty array", 3) end
  if #ids > f.context then error(string.format("%s%d tokens exceed the context of %d", who, #ids, f.context), 3) end
  for i, id in ipairs(ids) do
    if type(id) ~= "number" or id < 0 or id >= f.vocab or id ~= math.floor(id) then
      error(string.format("%stoken id #%d (%s) is not in [0, %d)", who, i, tostring(id), f.vocab), 3)
    end
  end
  return ids
end
M.prompt_ids = prompt_ids

-- Logits of ids at positions 0.. through the front-end f's batcher: a float array [#ids * vocab]
-- and an accessor row(pos) -> float* of position pos (1-based).
function M.logits(f, ids)
  prompt_ids(f, ids, {}, f.who or "")
  local r = f.batcher():submit { prompt = ids, logits = true }
  r:wait()
  local out, V = r.logits, f.vocab
  return out, function(p) return out + (p - 1) * V end
end

-- Generate from a prompt (text, or an array of token ids) on front-end f: { batcher (a function
-- returning the request loop), tokenizer (or nil; tokenizer_error: why), context, vocab, stop_ids,
-- who (message prefix) }. Returns an iterator for a generic for (yielding token id and its text)
-- and a state whose .stats fill in as it runs. Text comes only as whole UTF-8 characters: bytes
-- of an unfinished character are held back, and a last pair (false, text) carries what was held
-- when generation stops there. Iterators of several generate calls may be interleaved: each is
-- its own request, and they run as one batch (state.request is the batcher's request).
-- opts: max_tokens (default: to the end of the context), temperature, top_k, top_p, min_p,
-- repetition_penalty (or all of them in opts.sampler), seed, stop (ids, as a list or a set;
-- default the model's end tokens), ignore_eos (true: the model's end tokens do not stop it, a stop
-- given still does: a fixed length), bos (text: add BOS, default true), n_sample.
-- state: prompt_ids, token_ids, seed, request, stop_reason, stop_id, stats = { prompt_tokens,
-- generated, prefill_ms, decode_ms, decode_steps (steps after the first token's: decode_ms per
-- decode_steps is the ms per token); decode_forwards: decode_steps under its deprecated name }.
function M.generate(f, prompt, opts)
  opts = opts or {}
  local who, tok = f.who or "", f.tokenizer
  local ids = prompt_ids(f, prompt, opts, who)
  if #ids >= f.context then
    error(string.format("%s%d prompt tokens leave no room in the context of %d", who, #ids, f.context), 2)
  end
  local stop = {}
  if opts.stop then
    for k, v in pairs(opts.stop) do
      if v == true then stop[k] = true else stop[v] = true end
    end
  elseif not opts.ignore_eos then
    for _, id in ipairs(f.stop_ids or {}) do stop[id] = true end
  end
  local params = opts.sampler
  if not params then
    params = {}
    for k in pairs(sampler_mod.defaults) do params[k] = opts[k] end
  end
  local room = f.context - #ids
  local max_tokens = math.min(opts.max_tokens or room, room)
  local seed = opts.seed or (os.time() * 1000 + math.floor(os.clock() * 1e6))
  -- Rows of a padded embedding past the tokenizer's last id have no text: never sample them.
  local req = f.batcher():submit { prompt = ids, max_tokens = max_tokens, sampler = params, seed = seed,
    n_sample = opts.n_sample or (tok and math.min(tok.vocab_size, f.vocab)) or nil, stop = stop }
  local state = { prompt_ids = ids, token_ids = req.token_ids, request = req, seed = seed,
    stats = { prompt_tokens = #ids, generated = 0, prefill_ms = 0, decode_ms = 0, decode_steps = 0, decode_forwards = 0 } }
  local stream = tok and tokenizer_mod.text_stream(tok, ids)
  local done = false
  return function()
    if done then return nil end
    local id = req:next()
    local st = state.stats
    if req.t_first then st.prefill_ms = req.t_first - req.t_submit end
    if req.t_first and req.t_last then st.decode_ms = req.t_last - req.t_first end
    st.generated = #req.token_ids
    st.decode_steps = math.max(0, st.generated - 1)
    st.decode_forwards = st.decode_steps
    if id == nil then
      done = true
      state.stop_id = req.stop_id
      local why = req.finish_reason
      if why == "length" then why = max_tokens < room and "max_tokens" or "context" end
      state.stop_reason = why
      local rest = stream and stream:finish() or ""
      if rest ~= "" then return false, rest end
      return nil
    end
    return id, stream and stream:put(id) or ""
  end, state
end

return M
