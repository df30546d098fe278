-- An n-gram pool for drafts that need no second model (docs/serving.md, "Speculative
-- decoding"): what followed each short run of tokens (a key of `min`..`n` tokens), `span`
-- tokens of it, most recent first, a few per key. The `lookahead` draft policy keeps one per
-- request and fills it with the target's own guesses; `ngram:shared=on` keeps one per model in
-- the process, shared by every request and fed with the sequences requests leave (their prompt
-- and tokens: what the prefix cache keeps of them).
--
-- Bounded: at most `entries` continuations in all; a key that must make room drops its oldest,
-- and a new key past the bound drops the key least recently fed. Memory is about
-- entries x (span + n) tokens of Lua tables (a few hundred bytes per entry).
--
--   local p = pool.new{ n = 3, min = 1, span = 4, entries = 4096, per_key = 4 }
--   p:feed(ids, from)              -- every continuation of ids ending at from..#ids
--   p:add_ending(ids)              -- those ending at #ids only (one new token)
--   for _, cont in ipairs(p:lookup(ids, 3)) do ... end
local M = {}

local Pool = {}
Pool.__index = Pool

local function whole(v, least, what)
  if type(v) ~= "number" or v ~= math.floor(v) or v < least then
    error(string.format("ngram pool: %s must be a whole number >= %d, not %s", what, least, tostring(v)), 0)
  end
  return v
end

-- opts: n (the longest key, tokens; 3), min (the shortest; 1), span (tokens of a continuation;
-- 4), entries (continuations kept in all; 65536), per_key (continuations kept per key; 4).
function M.new(opts)
  opts = opts or {}
  local p = setmetatable({ n = whole(opts.n or 3, 1, "n"), min = whole(opts.min or 1, 1, "min"),
    span = whole(opts.span or 4, 1, "span"), entries = whole(opts.entries or 65536, 1, "entries"),
    per_key = whole(opts.per_key or 4, 1, "per_key"), keys = {}, count = 0, nkeys = 0, tick = 0,
    order = {}, first = 1, last = 0 }, Pool)
  if p.min > p.n then error(string.format("ngram pool: min (%d) is more than n (%d)", p.min, p.n), 0) end
  return p
end

local function key_of(ids, from, to)
  local t = {}
  for i = from, to do t[#t + 1] = ids[i] end
  return table.concat(t, ",")
end

-- Drop the key least recently fed (the front of the order that is still current).
function Pool:evict_key()
  while self.first <= self.last do
    local x = self.order[self.first]
    self.order[self.first] = nil
    self.first = self.first + 1
    local e = self.keys[x.key]
    if e and e.tick == x.tick then
      self.keys[x.key] = nil
      self.count, self.nkeys = self.count - #e.conts, self.nkeys - 1
      return true
    end
  end
  return false
end

-- cont (a list of ids) after the key `key` (a string), the most recent first.
function Pool:put(key, cont)
  local e = self.keys[key]
  local sig = table.concat(cont, ",")
  if e then
    for i, c in ipairs(e.conts) do
      if c.sig == sig then table.remove(e.conts, i) self.count = self.count - 1 break end
    end
  else
    while self.count >= self.entries and self:evict_key() do end
    e = { conts = {} }
    self.keys[key], self.nkeys = e, self.nkeys + 1
  end
  cont.sig = sig
  table.insert(e.conts, 1, cont)
  self.count = self.count + 1
  if #e.conts > self.per_key then
    e.conts[#e.conts] = nil
    self.count = self.count - 1
  end
  self.tick = self.tick + 1
  e.tick = self.tick
  self.last = self.last + 1
  self.order[self.last] = { key = key, tick = self.tick }
  -- (a full pool: the key fed longest ago goes, never the one just fed)
  while self.count > self.entries and self.nkeys > 1 and self:evict_key() do end
  if self.last - self.first > 4 * self.entries + 64 then self:compact() end
end

-- The order of keys without its stale marks (a key fed again leaves one behind): it stays
-- within a few times the bound.
function Pool:compact()
  local live = {}
  for i = self.first, self.last do
    local x = self.order[i]
    local e = self.keys[x.key]
    if e and e.tick == x.tick then live[#live + 1] = x end
  end
  self.order, self.first, self.last = live, 1, #live
end

-- The continuations that end at ids[t]: for each key length m, ids[t-span-m+1 .. t-span] ->
-- ids[t-span+1 .. t].
function Pool:add_ending(ids, t)
  t = t or #ids
  local s = self.span
  if t - s < 1 then return end
  local cont = {}
  for i = t - s + 1, t do cont[#cont + 1] = ids[i] end
  for m = self.min, math.min(self.n, t - s) do
    local c = m == self.min and cont or { unpack(cont) }
    self:put(key_of(ids, t - s - m + 1, t - s), c)
  end
end

-- Every continuation of ids that ends at from..#ids (from: default 1).
function Pool:feed(ids, from)
  for t = math.max(from or 1, self.span + 1), #ids do self:add_ending(ids, t) end
end

-- Up to `want` distinct continuations of ids (after its last tokens): the longest key first,
-- each key's most recent first; with `only`, keys of that many tokens only.
function Pool:lookup(ids, want, only)
  local out, seen, N = {}, {}, #ids
  for m = math.min(only or self.n, N), only or self.min, -1 do
    local e = self.keys[key_of(ids, N - m + 1, N)]
    if e then
      for _, c in ipairs(e.conts) do
        if #out >= want then return out end
        if not seen[c.sig] then seen[c.sig] = true out[#out + 1] = c end
      end
    end
  end
  return out
end

-- { keys, entries (continuations held), bound }.
function Pool:size() return { keys = self.nkeys, entries = self.count, bound = self.entries } end

-- Pools shared in this process, one per name (a model's path and the pool's shape): created at
-- the first ask with opts, the same table after.
local shared = {}
function M.shared(name, opts)
  local p = shared[name]
  if not p then
    p = M.new(opts)
    shared[name] = p
  end
  return p
end

-- Forget the shared pool `name` (nil: all of them).
function M.drop_shared(name)
  if name then shared[name] = nil else shared = {} end
end

return M
