-- The exact prefix cache (docs/prefix-cache.md): requests that share a prefix reuse its KV.
--
-- A prompt's full KV groups are keyed by a hash chain, h_0 the model's identity (its store's
-- manifest hash, else its path) and h_i = sha256(h_{i-1} .. the group's token ids as int32), so
-- a key names every token before it. Each device keeps a Store over its session: the groups it
-- holds for its layers (loip_session_kv_hold: outside any sequence, charged to "prompt_cache",
-- evicted least recent first when a sequence needs a group: the plan's needs come first), by key.
-- At admission the batcher asks the engine how many of the prompt's leading keys every device
-- holds (at most n_prompt - 1 positions: the last prompt token is always computed), the
-- request's sequence starts with those groups (loip_session_kv_adopt) and its prefill after
-- them (request.cached_tokens); at its end its full groups (prompt and generated tokens whose KV
-- was written) are held by the cache.
--
-- Sliding-window layers whose KV lives in rings (loip_session_kv_window_layers) are in no group:
-- a kept run's last group carries a snapshot of the rings at its end (loip_session_kv_hold_window:
-- the window - 1 positions before it, per ringed layer, charged as held groups are), and a
-- request adopts only a run ending at a group with one (the rings at any other end are gone), so
-- a prompt matching part of a kept run reuses the longest run some request's kept groups ended
-- at (M.agree), and its sequence, recomputing the rest of the held run, leaves the rings at the
-- held run's end to its last group (r.window_at: loip_session_kv_window_at), so that the next
-- request sharing as much (a system prompt) finds them. The disk tier keeps the snapshots beside the groups (loip.engine.request.prefix_disk).
--
--   batcher side   M.new(identity) -> the batcher's cache (b.prefix); M.admit(b, r) before the
--                  engine starts r, M.started(r) after, M.retire(b, r, reason) before it finishes
--   device side    M.store(session) -> Store: lookup(keys) -> k, at, adopt(seq, keys), keep(seq, keys),
--                  stats(), clear(); M.agree(answers, n) -> the k every device may adopt
local ffi = require "ffi"
local exec = require "loip.runtime.exec"
local files = require "loip.runtime.files"
local prefix_disk = require "loip.engine.request.prefix_disk"
local json = require "loip.text.json"

local M = {}

-- The identity h_0 of a model or store directory: its manifest's hash, else its absolute path.
function M.identity(dir)
  local ok, id = pcall(files.sha256_file, dir .. "/manifest.json")
  if ok and id then return "store:" .. id end
  dir = tostring(dir)
  return "path:" .. (dir:sub(1, 1) == "/" and dir or (os.getenv("PWD") or ".") .. "/" .. dir)
end

-- Keys of groups first..last (1-based) of tokens (a list of ids), kb tokens each, extending
-- keys (the chain so far: keys[first - 1] is h_{first-1}; keys[0] or identity is h_0).
function M.chain(identity, tokens, kb, last, keys)
  keys = keys or {}
  local buf = ffi.new("int32_t[?]", kb)
  for i = #keys + 1, last do
    local h = files.sha256()
    files.sha256_update(h, i == 1 and identity or keys[i - 1])
    for j = 0, kb - 1 do buf[j] = tokens[(i - 1) * kb + j + 1] end
    files.sha256_update(h, buf, 4 * kb)
    keys[i] = files.sha256_hex(h)
    files.sha256_free(h)
  end
  return keys
end

-- ---- the batcher's side ------------------------------------------------------------------

-- The batcher's cache over engine: identity (h_0) and its counters (M.metrics reads them). opt:
-- true, or { dir, bytes } for a disk tier on every device (engine:cache_configure: dir made
-- absolute, so that every worker of this host finds the same).
function M.new(engine, opt)
  if type(opt) == "table" and opt.dir then
    local dir = opt.dir:sub(1, 1) == "/" and opt.dir or (os.getenv("PWD") or ".") .. "/" .. opt.dir
    engine:cache_configure { dir = dir, bytes = opt.bytes, identity = engine.cache_identity }
  end
  return { identity = engine.cache_identity, stats = { lookups = 0, hits = 0, misses = 0, cached_tokens = 0, prompt_tokens = 0 } }
end

-- Before r starts: the longest run of its prompt's full groups every device holds (at most
-- n_prompt - 1 positions) is what it adopts (r.attach: their keys; r.cached_tokens).
function M.admit(b, r)
  local pc = b.prefix
  r.cached_tokens = 0
  if not pc or r.want_logits or (r.choice or 0) > 0 then return end -- (other choices share the first's)
  local kb = b.engine.kv_block
  local n = math.floor((r.n_prompt - 1) / kb)
  r.keys = M.chain(pc.identity, r.prompt, kb, n)
  local k, held = 0, 0
  if n > 0 then k, held = b.engine:cache_lookup(r.keys) end
  -- (a held run longer than the one adopted: its end gets this sequence's rings there)
  r.window_at = (held or 0) > k and { key = r.keys[held], at = held * kb } or nil
  local st = pc.stats
  st.lookups, st.prompt_tokens = st.lookups + 1, st.prompt_tokens + r.n_prompt
  if k > 0 then
    st.hits, st.cached_tokens = st.hits + 1, st.cached_tokens + k * kb
    r.attach, r.cached_tokens = { unpack(r.keys, 1, k) }, k * kb
  else
    st.misses = st.misses + 1
  end
end

-- The run of groups every device may adopt, from answers (one a device: { held = how many of the
-- keys from the first it holds, at = nil, or (rings) the runs it may start from: a list of
-- lengths }) for n keys: the least held, and where any device has rings, the longest run all of
-- their lists name within it (0: none); and the least held.
function M.agree(answers, n)
  local k = n
  for _, a in ipairs(answers) do k = math.min(k, a.held or 0) end
  local ok = {}
  for j = 1, k do ok[j] = true end
  for _, a in ipairs(answers) do
    if a.at then
      local mine = {}
      for _, j in ipairs(a.at) do mine[j] = true end
      for j = 1, k do ok[j] = ok[j] and mine[j] or false end
    end
  end
  local held = k
  while k > 0 and not ok[k] do k = k - 1 end
  return k, held
end

-- After r started: its prefill starts past the adopted groups.
function M.started(r)
  if r.attach then r.pos, r.attach = r.cached_tokens, nil end
  r.window_at = nil
end

-- Before r finishes: its full groups' keys for the devices to hold (r.keep) when it ended
-- normally (stop or length: not failed or cancelled) with no evicted KV; past the prompt only
-- without speculative decoding (whose KV there may hold rejected drafts' rows).
function M.retire(b, r, reason)
  r.keep = nil
  if not b.prefix or (reason ~= "stop" and reason ~= "length") or (r.evicted or 0) > 0 or r.want_logits then return end
  local kb = b.engine.kv_block
  local n = math.floor((b.draft and math.min(r.pos, r.n_prompt) or r.pos) / kb)
  if n == 0 then return end
  local tokens = r.prompt
  if n * kb > r.n_prompt then
    tokens = {}
    for i = 1, r.n_prompt do tokens[i] = r.prompt[i] end
    for _, id in ipairs(r.token_ids) do tokens[#tokens + 1] = id end
  end
  local keys = M.chain(b.prefix.identity, tokens, kb, n, r.keys)
  r.keep = #keys > n and { unpack(keys, 1, n) } or keys
end

-- /metrics (m: loip.serve.metrics) of batcher b's cache: lookups, hits, misses, cached tokens,
-- and per device the bytes held and the evictions (dev: a cluster's STATS, else the engine's).
function M.metrics(m, b, dev)
  if not b.prefix then return end
  local st = b.prefix.stats
  m:count("loip_prompt_cache_lookups_total", "requests that looked for their prompt's prefix in the cache", st.lookups)
  m:count("loip_prompt_cache_hits_total", "requests that found a prefix of their prompt cached", st.hits)
  m:count("loip_prompt_cache_misses_total", "requests that found none", st.misses)
  m:count("loip_prompt_cache_tokens_total", "prompt tokens served from the cache (not computed)", st.cached_tokens)
  for i, d in ipairs(dev) do
    local c = d.prompt_cache or {}
    m:set("loip_prompt_cache_bytes", "KV held by the prefix cache alone, per device and tier", c.bytes or 0, { device = i, tier = "memory" })
    if c.disk_files and (c.disk_writes > 0 or c.disk_files > 0) then
      m:set("loip_prompt_cache_bytes", "KV held by the prefix cache alone, per device and tier", c.disk_bytes, { device = i, tier = "disk" })
      m:count("loip_prompt_cache_disk_reads_total", "groups read back from the disk tier, per device", c.disk_reads, { device = i })
    end
    m:count("loip_prompt_cache_evictions_total", "held groups evicted for a request's KV, per device", c.evictions or 0, { device = i })
  end
end

-- A re-plan lost every device's cache: r starts again from its tokens.
function M.resume(r) r.attach, r.window_at = nil, nil end

-- ---- a device's side ---------------------------------------------------------------------

local Store = {}
Store.__index = Store

-- The cache of session s (a loip_session *): key -> { id, gen } of the groups it holds; disk
-- (optional): its disk tier (loip.engine.request.prefix_disk), written through and read on a miss.
-- rings: whether the session's layers keep KV in rings (sliding windows).
function M.store(s, disk)
  return setmetatable({ s = s, index = {}, n = 0, disk = disk, rings = exec.session_kv_window_layers(s) > 0,
    kb = exec.session_kv_block_tokens(s) }, Store)
end

local function valid(self, key)
  local e = self.index[key]
  if e and exec.session_kv_gen(self.s, e.id) == e.gen then return e end
  if e then self.index[key], self.n = nil, self.n - 1 end -- evicted for a sequence's need
  return nil
end

-- How many of keys, from the first, this device holds: in memory, else read back from its disk
-- tier (each made the most recently used, so that reading the next one evicts none of them);
-- with rings, also the runs of them a sequence may start from (those whose last group carries
-- its window: a list of lengths), else nil.
function Store:lookup(keys)
  local k = 0
  while k < #keys do
    local e = valid(self, keys[k + 1])
    if not e then break end
    exec.session_kv_touch(self.s, e.id)
    k = k + 1
  end
  local d, missing = self.disk, {}
  while d and k + #missing < #keys and d:has(keys[k + #missing + 1]) do missing[#missing + 1] = keys[k + #missing + 1] end
  if #missing > 0 then
    for i, id in ipairs(d:load(missing, self.s)) do
      self.index[missing[i]], self.n = { id = id, gen = exec.session_kv_gen(self.s, id) }, self.n + 1
      k = k + 1
    end
  end
  if not self.rings then return k end
  local at = {}
  for j = 1, k do
    local id = self.index[keys[j]].id
    local ends = exec.session_kv_window_end(self.s, id)
    if ends == 0 and d and d:has(keys[j], "win") and d:load_window(keys[j], self.s, id) then
      ends = exec.session_kv_window_end(self.s, id)
    end
    if ends == j * self.kb then at[#at + 1] = j end
  end
  -- (a window read back may have evicted a group held before it: the runs past it are lost)
  local still = 0
  while still < k and valid(self, keys[still + 1]) do still = still + 1 end
  k = still
  for i = #at, 1, -1 do if at[i] > k then table.remove(at, i) end end
  return k, at
end

-- Sequence seq (holding nothing) starts with the groups of keys (all held: lookup said so).
function Store:adopt(seq, keys)
  local ids = {}
  for i, key in ipairs(keys) do
    local e = valid(self, key)
    if not e then error(string.format("prefix cache: group %d of the prompt (key %s) is no longer held", i, key:sub(1, 12)), 0) end
    ids[i] = e.id
  end
  return assert(exec.session_kv_adopt(self.s, seq, ids, "prefix cache"))
end

-- The held group keyed w.key (w: r.window_at) to get seq's rings at w.at once seq wrote them
-- (nothing when it is no longer held).
function Store:window_at(seq, w)
  local e = valid(self, w.key)
  if e then return exec.session_kv_window_at(self.s, seq, e.id, w.at, "prefix cache") end
  return true
end

-- Sequence seq's first #keys groups held by the cache (those whose key it holds already kept once);
-- with rings, the last of them carrying seq's rings at its end.
function Store:keep(seq, keys)
  for i, key in ipairs(keys) do
    if not valid(self, key) then
      local ids, gens = exec.session_kv_hold(self.s, seq, i - 1, 1)
      if not ids then return nil, gens end
      self.index[key], self.n = { id = ids[1], gen = gens[1] }, self.n + 1
      if self.disk then
        local ok, err = self.disk:write(key, self.s, ids[1])
        if not ok then return nil, err end
      end
    end
  end
  if not self.rings or #keys == 0 then return true end
  local ok, err = exec.session_kv_hold_window(self.s, seq, #keys - 1, "prefix cache")
  if ok and self.disk then ok, err = self.disk:write_window(keys[#keys], self.s, self.index[keys[#keys]].id) end
  return ok, err
end

-- { groups (held by the cache alone), shared_groups (held and named by a sequence), bytes (theirs
-- and the window snapshots'), evictions, window_snapshots }.
function Store:stats()
  local st = exec.session_kv_share_stats(self.s)
  local d = self.disk
  return { groups = st.cache_groups, shared_groups = st.cache_shared_groups, bytes = st.cache_bytes, evictions = st.evictions,
    window_snapshots = st.window_snapshots,
    disk_files = d and d.n or 0, disk_bytes = d and d.total or 0, disk_reads = d and d.stats.reads or 0,
    disk_writes = d and d.stats.writes or 0 }
end

-- A worker's device d (loip.cluster.device_server; its part d.part, loip.model.part): its
-- session's store, made with the session (disk: the head's { dir, bytes, identity } for its disk
-- tier, from the first message that has it); what it holds of keys (a device lending KV holds
-- nothing: lending refuses shared groups); seq's groups of keys held (a failure logged with
-- log(fmt, ...)).
function M.device_store(d, disk)
  local pt = d.part
  if not d.store or d.store.s ~= pt.session then d.store = M.store(pt.session) end
  if disk and not d.store.disk then
    d.store.disk = prefix_disk.new { dir = disk.dir, bytes = disk.bytes, identity = disk.identity,
      device = pt.index, layers = prefix_disk.stage_layers(pt.plan.devices[pt.index].stages),
      kv_block = exec.session_kv_block_tokens(pt.session), group_bytes = exec.session_kv_group_bytes(pt.session),
      window_bytes = exec.session_kv_window_snapshot_bytes(pt.session), budget = pt.budget }
  end
  return d.store
end
-- A LOOKUP's answer (body: { keys }): { held = k, at (rings: the runs it may start from) } as JSON.
function M.device_lookup(d, body)
  local held, at = 0, nil
  body = assert(body, "a LOOKUP without its keys")
  if d and not d.lend_peer then held, at = M.device_store(d, body.disk):lookup(body.keys or {}) end
  return json.encode({ held = held, at = at })
end
-- A START's (body) KV: the cache's groups its prompt starts with (body.attach: the head's LOOKUP
-- found them on every device) or another choice's first positions shared (body.share).
function M.device_start(d, body)
  if body.attach then M.device_store(d):adopt(body.seq or 0, body.attach) end
  if body.window_at then M.device_store(d):window_at(body.seq or 0, body.window_at) end
  if body.share then assert(exec.session_seq_share(d.part.session, body.seq or 0, body.share.seq, body.share.positions)) end
end
function M.device_keep(d, body, log)
  if not body.keep or d.lend_peer then return end
  local ok, kept, why = pcall(Store.keep, M.device_store(d, body.disk), body.seq, body.keep)
  if not (ok and kept) then log("END: the prefix cache: %s", tostring(ok and why or kept)) end
end

-- Every hold given up.
function Store:clear()
  for key in pairs(self.index) do
    local e = valid(self, key)
    if e then exec.session_kv_drop(self.s, e.id) end
  end
  self.index, self.n = {}, 0
end

return M
