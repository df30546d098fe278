-- The expert cache played in the simulator (mixture of experts): a step's rows each pick their
-- top-k experts of every offloaded MoE layer at random (uniformly, or as a routing profile's
-- frequencies say), the device's cache of `slots` experts keeps the most recently used (the lru
-- policy) and what it lacks is read, one expert a read. Seeded: the same plan plays the same.
--
--   local xs = require("loip.sim.experts").new { experts = 64, used = 8, slots = 100, seed = 1 }
--   local reads, hits = xs:step({ 3, 4, 5 }, rows)
local M = {}

local Cache = {}
Cache.__index = Cache

-- o: experts, used (top-k), slots (the cache), routing (frequencies[layer + 1][expert + 1], or
-- nil: uniform), seed.
function M.new(o)
  return setmetatable({ E = o.experts, k = o.used, slots = o.slots or 0, routing = o.routing, at = {}, n = 0,
    clock = 0, rng = (o.seed or 1) % 2147483647 + 1, reads = 0, hits = 0 }, Cache)
end

-- A uniform number in [0, 1) (Park-Miller, so runs repeat on every LuaJIT).
function Cache:random()
  self.rng = (self.rng * 48271) % 2147483647
  return self.rng / 2147483647
end

-- One row's k distinct experts of layer l (drawn from its profile while it names k experts with
-- a share above 0, uniformly for the rest).
function Cache:pick(l, out)
  local f = self.routing and self.routing[l + 1]
  if f then
    local named = 0
    for _, v in ipairs(f) do if v > 0 then named = named + 1 end end
    if named < self.k then f = nil end
  end
  local got = 0
  while got < self.k do
    local e
    if f then
      local u, acc = self:random() * self.k, 0 -- (frequencies sum to k over a layer)
      e = self.E - 1
      for j = 1, self.E do
        acc = acc + f[j]
        if u < acc then e = j - 1 break end
      end
    else
      e = math.floor(self:random() * self.E)
    end
    if not out[e] then out[e], got = true, got + 1 end
  end
end

-- A step of `rows` tokens through layers (0-based, the offloaded MoE layers a stage runs):
-- returns the experts read and those found in the cache.
function Cache:step(layers, rows)
  local reads, hits = 0, 0
  for _, l in ipairs(layers) do
    local chosen = {}
    for _ = 1, rows do
      local one = {}
      self:pick(l, one)
      for e in pairs(one) do chosen[e] = true end
    end
    for e in pairs(chosen) do
      local key = l * self.E + e
      self.clock = self.clock + 1
      if self.at[key] then
        hits = hits + 1
      elseif self.slots == 0 then
        reads = reads + 1
      else
        reads = reads + 1
        if self.n < self.slots then
          self.n = self.n + 1
        else -- the least recently used gives up its slot
          local old, t = nil, math.huge
          for k2, t2 in pairs(self.at) do if t2 < t then old, t = k2, t2 end end
          if old then self.at[old] = nil end
        end
      end
      if self.slots > 0 then self.at[key] = self.clock end
    end
  end
  self.reads, self.hits = self.reads + reads, self.hits + hits
  return reads, hits
end

return M
