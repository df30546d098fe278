-- `loip trace`: draw a trace written by --trace as an SVG timeline.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"

local M = {
  brief = "draw a trace written by --trace as an SVG timeline",
  usage = "loip trace plot TRACE.json OUT.svg [--from MS] [--to MS]",
  positional = { "plot", "TRACE.json", "OUT.svg" },
  summary = "Draw a trace written by --trace (one device or a cluster) as an SVG timeline: per device,\n"
    .. "lanes for disk, compute, network and waits.",
  flags = {
    { "from", "number", "start of the window, ms from the trace's first event", metavar = "MS" },
    { "to", "number", "end of the window, ms", metavar = "MS" },
    { "width", "int", "drawing width in pixels", default = 1200 },
  },
}

function M.run(o, pos)
  if pos[1] ~= "plot" or not pos[2] or not pos[3] or pos[4] then
    common.usage("trace", "usage: loip trace plot TRACE.json OUT.svg (see --help)")
  end
  local n = require("loip.engine.trace").plot(pos[2], pos[3], { from_ms = o.from, to_ms = o.to, width = o.width })
  io.stderr:write(string.format("%d events -> %s\n", n, pos[3]))
  return 0
end

return M
