-- A static expert cache from a routing profile (`loip profile --routing`): the experts the
-- profile saw picked most often, over the layers the cache serves, are read once and pinned;
-- the slots left over (at least `spare`) serve the others as lru. Good when the traffic looks
-- like the prompts profiled; no use without a profile.
-- An expert cache policy (loip.policy kind "experts"):
--   loip generate --model STORE --mem 1.5G --experts static --routing-profile routing.json
-- configure(ctx, params): see lru.lua; ctx.routing is required.
local M = { name = "static" }

local shared = require "loip.model.experts_policy"
M.settings = shared.settings {
  { "spare", "int", "slots left unpinned for the experts the profile did not favour (at least top-k)", default = 0,
    check = function(v) return v >= 0, "must be >= 0" end },
}

function M.configure(ctx, params)
  if not ctx.routing then
    error("the static expert cache pins the experts a routing profile favours: give one (--routing-profile FILE, "
      .. "made by `loip profile --routing`)", 0)
  end
  local spare = math.max(params.spare, ctx.used)
  local all = {}
  for _, l in ipairs(ctx.layers) do
    local f = ctx.routing[l + 1] or {}
    for e = 0, ctx.experts - 1 do all[#all + 1] = { l, e, f[e + 1] or 0 } end
  end
  table.sort(all, function(a, b)
    if a[3] ~= b[3] then return a[3] > b[3] end
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  local pins = {}
  for i = 1, math.max(0, ctx.slots - spare) do
    if not all[i] or all[i][3] <= 0 then break end
    pins[i] = { all[i][1], all[i][2] }
  end
  return shared.config("static", params, pins)
end

return M
