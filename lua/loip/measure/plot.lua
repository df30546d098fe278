-- Minimal SVG charts for benchmark recipes (no plotting dependency): grouped horizontal bars
-- with optional reference lines, and lines of y against x.
local M = {}

local function esc(s) return (tostring(s):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;")) end

-- spec = { title, unit, bars = { { label, value [, note] } ... }, refs = { { label, value } } }
function M.bars(path, spec)
  local bars, refs = spec.bars, spec.refs or {}
  local maxv = 0
  for _, b in ipairs(bars) do maxv = math.max(maxv, b[2]) end
  for _, r in ipairs(refs) do maxv = math.max(maxv, r[2]) end
  maxv = maxv > 0 and maxv * 1.1 or 1
  local left, width, row = 300, 520, 26
  local top = 50
  local height = top + #bars * row + 60
  local out = {}
  local function add(...) out[#out + 1] = string.format(...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">',
    left + width + 120, height)
  add('<rect width="100%%" height="100%%" fill="white"/>')
  add('<text x="10" y="22" font-size="15" font-weight="bold">%s</text>', esc(spec.title))
  for i, b in ipairs(bars) do
    local y = top + (i - 1) * row
    local w = b[2] / maxv * width
    add('<text x="%d" y="%d" text-anchor="end">%s</text>', left - 8, y + 16, esc(b[1]))
    add('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>', left, y + 3, w, row - 8, b.color or "#4a7ebb")
    add('<text x="%.1f" y="%d">%.3g %s%s</text>', left + w + 5, y + 16, b[2], esc(spec.unit),
      b[3] and (" " .. esc(b[3])) or "")
  end
  local bottom = top + #bars * row
  for i, r in ipairs(refs) do
    local x = left + r[2] / maxv * width
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c0392b" stroke-dasharray="5,3"/>', x, top - 5, x, bottom)
    add('<text x="%.1f" y="%d" fill="#c0392b">%s: %.3g %s</text>', x + 3, bottom + 16 * i, esc(r[1]), r[2], esc(spec.unit))
  end
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>', left, top - 5, left, bottom)
  add("</svg>")
  local f = assert(io.open(path, "w"))
  f:write(table.concat(out, "\n"), "\n")
  f:close()
  return path
end

-- spec = { title, xlabel, ylabel, series = { { label, points = { { x, y } ... }, color } ... } }
function M.lines(path, spec)
  local colors = { "#27ae60", "#2980b9", "#c0392b", "#8e44ad", "#7f8c8d" }
  local minx, maxx, maxy = math.huge, -math.huge, 0
  for _, s in ipairs(spec.series) do
    for _, p in ipairs(s.points) do
      minx, maxx, maxy = math.min(minx, p[1]), math.max(maxx, p[1]), math.max(maxy, p[2])
    end
  end
  if minx == math.huge then minx, maxx = 0, 1 end
  if maxx == minx then maxx = minx + 1 end
  maxy = maxy > 0 and maxy * 1.1 or 1
  local left, top, width, height = 70, 50, 640, 300
  local out = {}
  local function add(...) out[#out + 1] = string.format(...) end
  local function X(x) return left + (x - minx) / (maxx - minx) * width end
  local function Y(y) return top + height - y / maxy * height end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">',
    left + width + 200, top + height + 60)
  add('<rect width="100%%" height="100%%" fill="white"/>')
  add('<text x="10" y="22" font-size="15" font-weight="bold">%s</text>', esc(spec.title))
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>', left, top, left, top + height)
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>', left, top + height, left + width, top + height)
  for k = 0, 4 do
    local y = maxy * k / 4
    add('<text x="%d" y="%.1f" text-anchor="end">%.3g</text>', left - 6, Y(y) + 4, y)
    local x = minx + (maxx - minx) * k / 4
    add('<text x="%.1f" y="%d" text-anchor="middle">%.4g</text>', X(x), top + height + 16, x)
  end
  add('<text x="%d" y="%d" text-anchor="middle">%s</text>', left + width / 2, top + height + 36, esc(spec.xlabel or ""))
  add('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>', top + height / 2, top + height / 2,
    esc(spec.ylabel or ""))
  for i, s in ipairs(spec.series) do
    local c = s.color or colors[(i - 1) % #colors + 1]
    local pts = {}
    for _, p in ipairs(s.points) do pts[#pts + 1] = string.format("%.1f,%.1f", X(p[1]), Y(p[2])) end
    add('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>', c, table.concat(pts, " "))
    add('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>', left + width + 16, top + (i - 1) * 20, c)
    add('<text x="%d" y="%d">%s</text>', left + width + 34, top + (i - 1) * 20 + 11, esc(s.label))
  end
  add("</svg>")
  local f = assert(io.open(path, "w"))
  f:write(table.concat(out, "\n"), "\n")
  f:close()
  return path
end

return M
