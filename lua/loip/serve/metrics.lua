-- What `loip serve` counts, in Prometheus' text format (GET /metrics): counters, gauges and
-- histograms with fixed bucket bounds.
local M = {}

local Metrics = {}
Metrics.__index = Metrics

local MS_BUCKETS = { 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000 }

function M.new()
  return setmetatable({ counters = {}, gauges = {}, hists = {}, help = {} }, Metrics)
end

local function key(name, labels)
  if not labels then return name end
  local parts = {}
  for k, v in pairs(labels) do parts[#parts + 1] = string.format('%s="%s"', k, tostring(v):gsub('[\\"]', "\\%0")) end
  table.sort(parts)
  return name .. "{" .. table.concat(parts, ",") .. "}"
end

function Metrics:add(name, help, v, labels)
  self.help[name] = { help, "counter" }
  local k = key(name, labels)
  self.counters[k] = (self.counters[k] or 0) + (v or 1)
end

-- Counter `name` at its total v (a count kept elsewhere).
function Metrics:count(name, help, v, labels)
  self.help[name] = { help, "counter" }
  self.counters[key(name, labels)] = v
end

function Metrics:set(name, help, v, labels)
  self.help[name] = { help, "gauge" }
  self.gauges[key(name, labels)] = v
end

-- One observation v of histogram `name`; buckets: its upper bounds, ascending (default: times
-- in ms, 1 .. 60000), fixed by its first observation.
function Metrics:observe(name, help, v, buckets)
  self.help[name] = { help, "histogram" }
  local h = self.hists[name]
  if not h then
    h = { counts = {}, sum = 0, n = 0, buckets = buckets or MS_BUCKETS }
    for i = 1, #h.buckets do h.counts[i] = 0 end
    self.hists[name] = h
  end
  for i, b in ipairs(h.buckets) do if v <= b then h.counts[i] = h.counts[i] + 1 end end
  h.sum, h.n = h.sum + v, h.n + 1
end

local function num(v) return v == math.floor(v) and string.format("%d", v) or string.format("%.6g", v) end

function Metrics:text()
  local out, names = {}, {}
  for n in pairs(self.help) do names[#names + 1] = n end
  table.sort(names)
  for _, n in ipairs(names) do
    out[#out + 1] = string.format("# HELP %s %s\n# TYPE %s %s", n, self.help[n][1], n, self.help[n][2])
    local src = self.help[n][2] == "counter" and self.counters or self.help[n][2] == "gauge" and self.gauges
    if src then
      local ks = {}
      for k in pairs(src) do if k == n or k:sub(1, #n + 1) == n .. "{" then ks[#ks + 1] = k end end
      table.sort(ks)
      for _, k in ipairs(ks) do out[#out + 1] = k .. " " .. num(src[k]) end
    else
      local h = self.hists[n]
      for i, b in ipairs(h.buckets) do out[#out + 1] = string.format('%s_bucket{le="%s"} %d', n, num(b), h.counts[i]) end
      out[#out + 1] = string.format('%s_bucket{le="+Inf"} %d', n, h.n)
      out[#out + 1] = string.format("%s_sum %s", n, num(h.sum))
      out[#out + 1] = string.format("%s_count %d", n, h.n)
    end
  end
  return table.concat(out, "\n") .. "\n"
end

return M
