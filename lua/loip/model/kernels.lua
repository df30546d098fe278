-- The kernels' settings a device runs with, chosen when it opens (loip.model.part): today the
-- quantized matvecs' software prefetch distance (loip_kernels_set_prefetch), which a kernels
-- policy (recipes/policies/kernels/, default "loip") chooses from the device's own profile
-- (its `kernels` section, measured by `loip profile`: loip.plan.prefetch). LOIP_KERNELS_PREFETCH
-- (bytes, read at startup by loip.core) sets it for the process instead, and no policy is asked.
-- The setting is the process's: one device a process (a Model, or a worker's plan).
--
--   local kernels = require "loip.model.kernels"
--   local k = kernels.apply { profile = pr, policy = "loip:within=0.02" }  -- { prefetch = 1024, from = "policy loip" }
local core = require "loip.core"
local exec = require "loip.runtime.exec"
local policy = require "loip.policy"
local prefetch = require "loip.plan.prefetch"

local M = {}

-- Apply the settings. o: profile (the device's profile: one device's, or nil: none), policy (a
-- kernels policy's name or path, with settings; default "loip"). Returns { prefetch (the
-- distance in force, bytes), from ("LOIP_KERNELS_PREFETCH", "policy NAME" or "default": the
-- policy chose none) }. Raises naming the policy when it answers a distance that is not one.
function M.apply(o)
  o = o or {}
  if core.kernels_prefetch_env then return { prefetch = exec.kernels_prefetch(), from = "LOIP_KERNELS_PREFETCH" } end
  local pr = o.profile
  if type(pr) == "table" and pr.devices then pr = pr.devices[1] end -- (a cluster's profile: its first device)
  local p = policy.load("kernels", o.policy or "loip")
  local r = p.configure { profile = type(pr) == "table" and pr.kernels or nil, variant = exec.kernels_name() }
  local d = type(r) == "table" and r.prefetch or nil
  if d ~= nil and not prefetch.is_distance(d) then
    error(string.format("kernels policy %s: prefetch %s is not a distance in bytes from 0 to %d", p.name or tostring(o.policy),
      tostring(d), prefetch.MAX), 0)
  end
  assert(exec.kernels_set_prefetch(d or -1, "kernels"))
  return { prefetch = exec.kernels_prefetch(), from = d and ("policy " .. (p.name or tostring(o.policy))) or "default" }
end

-- What a device's kernels run with now, for its stats: { variant, prefetch (bytes), from (how it
-- was chosen: M.apply's, the part's when it opened) }.
function M.state(part)
  return { variant = exec.kernels_name(), prefetch = exec.kernels_prefetch(), from = part and part.kernels and part.kernels.from }
end

return M
