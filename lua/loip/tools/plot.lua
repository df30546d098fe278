-- Minimal SVG charts for benchmark recipes (no plotting dependency): grouped horizontal bars
-- with optional reference lines.
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

return M
