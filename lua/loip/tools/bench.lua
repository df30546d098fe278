-- Helpers the benchmark recipes share: robust statistics and progress lines on stderr (stdout
-- carries the recipe's one JSON object).
local M = {}

function M.median(xs)
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

function M.log(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end

-- First line of a shell command's output ("" when none).
function M.sh(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local r = p and p:read("*l") or ""
  if p then p:close() end
  return r
end

-- The synthetic llama-3.2-1b BF16 slice store the benchmarks share: made on first use
-- (the model with loip.synth, then sliced).
function M.ensure_store(store_dir, model_dir)
  if require("loip.model.store").is_store(store_dir) then return store_dir end
  if not require("loip.tools.json").exists(model_dir .. "/config.json") then
    M.log("making the synthetic model in %s (once)", model_dir)
    require("loip.model.synth").write(model_dir, { like = "llama-3.2-1b", dtype = "bf16", seed = 1 })
  end
  M.log("slicing %s into %s (once)", model_dir, store_dir)
  require("loip.model.slice").write(model_dir, store_dir)
  return store_dir
end

return M
