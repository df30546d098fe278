-- An online policy of one's own (loip.policy kind "online"), to copy and change: when a
-- device's KV cache would pass its budget at this step, offload every block of the device at
-- once: one change per device, the most headroom, the most reading from then on. Compare with
-- recipes/policies/online/loip.lua, which offloads just enough, evenly across stages.
-- What it is given (state, control) and how a policy takes settings (M.settings, read from its
-- params, e.g. --online offload-all.lua:KEY=VALUE): docs/planning.md, "The policy API" and
-- "Online policies".
--   loip generate --model STORE --devices 3 --mem ... --plan-positions 32 --online recipes/policies/examples/offload-all.lua
local M = { name = "offload-all" }

function M.on_step(state, control)
  for i, d in ipairs(state.devices) do
    if d.limit > 0 and d.nonkv + d.kv_base + d.group_bytes * state.groups > d.limit then
      control.log("device %d passes its budget at %d positions: offloading all its blocks", i, state.context)
      for s, st in ipairs(d.stages) do
        local all = st.last - st.first + 1
        if st.offloaded < all then control.restage(i, s, all) end
      end
    end
  end
end

return M
