-- kernels "loip": the quantized matvecs' software prefetch distance (bytes ahead in each weight
-- row stream, loip_kernels_set_prefetch) from the device's own profile: the fastest distance its
-- profile measured (kernels.prefetch_bps; `loip profile`), or, with `within` > 0, the shortest
-- of those within that fraction of the fastest (a margin for a noisy profile). The kernels'
-- default when the profile did not measure it or measured other kernels than those in force.
-- A kernels policy (loip.policy kind "kernels"), applied when a device opens (loip.model.kernels):
--   configure(ctx, params) -> { prefetch = bytes, or nil: the kernels' default }
-- ctx: { profile (the device profile's `kernels` section, or nil), variant (the kernels in
-- force: "avx512", "avx2", "ref", ...) }.
local M = { name = "loip" }

M.settings = {
  { "within", "number", "take the shortest distance whose rate is within this fraction of the fastest", default = 0,
    check = function(v) return v >= 0 and v < 1, "must be from 0 to below 1" end },
}

function M.configure(ctx, params)
  local k = ctx.profile
  if type(k) ~= "table" or (k.variant and k.variant ~= ctx.variant) then return {} end
  local bps = k.prefetch_bps
  if type(bps) ~= "table" or next(bps) == nil then return { prefetch = k.prefetch_bytes } end
  local fastest = 0
  for _, v in pairs(bps) do fastest = math.max(fastest, v) end
  local pick
  for d, v in pairs(bps) do
    d = tonumber(d)
    if v >= fastest * (1 - params.within) and (not pick or d < pick) then pick = d end
  end
  return { prefetch = pick }
end

return M
