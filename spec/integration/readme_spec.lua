-- The README's "Using it" examples, run as written: every ```sh block as one bash script (a
-- user pasting it into a shell), every ```lua block through `loip run`, in README order, in a
-- scratch directory that links build/, models/ and recipes/ from the checkout, with the cache
-- there too. What the examples make must go into scratch/ (which git ignores), not the root of
-- the checkout: the directory holds nothing else afterwards. Lines marked ‡ say
-- what they need (other machines, the network, minutes, gigabytes) and are left out; so is a
-- ```lua block whose first line is marked (a fragment). The harness adds one thing the text
-- does not say: after a line that starts a server in the background (`&`), it waits until the
-- server answers /health, as a person typing the next line would have.
local T = require "spec.support"

local function sections()
  local text = T.read(T.root .. "/README.md")
  local a = text:find("\n## Using it\n", 1, true)
  assert(a, "README.md has no \"## Using it\" section")
  local b = text:find("\n## ", a + 5, true) or #text
  local part = text:sub(a, b)
  local blocks = {}
  for lang, body in part:gmatch("\n```(%w+)\n(.-)\n```") do blocks[#blocks + 1] = { lang = lang, body = body } end
  return blocks
end

-- A ```sh block as a bash script: continuation lines joined, ‡ lines dropped, a wait after each
-- server started in the background.
local function script_of(body)
  local lines, cur = {}, nil
  for line in (body .. "\n"):gmatch("([^\n]*)\n") do
    cur = cur and (cur .. "\n" .. line) or line
    if not line:match("\\$") then lines[#lines + 1] = cur cur = nil end
  end
  local out, kept = {}, 0
  for _, l in ipairs(lines) do
    if not l:find("‡", 1, true) and l:match("%S") then
      out[#out + 1] = l
      kept = kept + 1
      local port = l:match("%-%-port (%d+)")
      if port and l:gsub("#.*$", ""):match("&%s*$") then
        out[#out + 1] = string.format("for i in $(seq 1200); do curl -s -o /dev/null localhost:%s/health && break; sleep 0.1; done", port)
      end
    end
  end
  return table.concat(out, "\n"), kept
end

describe("README, \"Using it\"", function()
  after_each(function() T.cleanup() end)
  it("runs every example as written", function()
    local blocks = sections()
    assert.is_true(#blocks >= 10, "found only " .. #blocks .. " code blocks")
    local dir = T.tmpdir()
    local h = io.popen("cd '" .. T.root .. "' && pwd -P")
    local root = h:read("*l")
    h:close()
    -- (the build directory the specs run from: LOIP_BIN's, else build/)
    local bin_dir = T.loip:match("^(.*)/loip$") or (root .. "/build")
    if bin_dir:sub(1, 1) ~= "/" then bin_dir = root .. "/" .. bin_dir end
    for d, target in pairs({ build = bin_dir, models = root .. "/models", recipes = root .. "/recipes" }) do
      assert.are.equal(0, os.execute(string.format("ln -s '%s' '%s/%s'", target, dir, d)))
    end
    local ran = 0
    for i, b in ipairs(blocks) do
      local cmd
      if b.lang == "sh" then
        local script, kept = script_of(b.body)
        if kept > 0 then
          T.write(dir .. "/block.sh", "set -e\ntrap 'rc=$?; kill $(jobs -p) 2>/dev/null || true; wait; exit $rc' EXIT\n" .. script .. "\n")
          cmd = string.format("cd '%s' && LOIP_CACHE_DIR='%s/.cache' bash block.sh </dev/null", dir, dir)
          ran = ran + kept
        end
      elseif b.lang == "lua" and not b.body:match("^[^\n]*‡") then
        T.write(dir .. "/block.lua", b.body .. "\n")
        cmd = string.format("cd '%s' && LOIP_CACHE_DIR='%s/.cache' build/loip run block.lua </dev/null", dir, dir)
        ran = ran + 1
      end
      if cmd then
        local rc, out, err = T.run(cmd)
        assert.are.equal(0, rc, string.format("README block %d (%s) failed:\n%s\n--- stdout (end) ---\n%s\n--- stderr (end) ---\n%s",
          i, b.lang, b.body, out:sub(-1500), err:sub(-3000)))
      end
    end
    assert.is_true(ran >= 30, "ran only " .. ran .. " examples")
    -- what they made is in scratch/: nothing else beside the links, the cache and the scripts
    local left, expected = {}, { build = true, models = true, recipes = true, scratch = true, [".cache"] = true,
      ["block.sh"] = true, ["block.lua"] = true }
    local ls = io.popen("ls -A '" .. dir .. "'")
    for name in ls:lines() do
      if not expected[name] then left[#left + 1] = name end
    end
    ls:close()
    table.sort(left)
    assert.are.same({}, left, "the README's examples wrote into the repository's root instead of scratch/: "
      .. table.concat(left, ", "))
    assert.is_true(T.exists(dir .. "/scratch/s260k/manifest.json"), "no slice store in scratch/s260k")
  end)

  it("runs the bundled GGUF (above) and keeps scratch/ out of git", function()
    local n = 0
    for _, b in ipairs(sections()) do
      if b.lang == "sh" then
        local script = script_of(b.body)
        for l in script:gmatch("[^\n]+") do
          if l:match("^build/loip generate %-%-model models/stories260K%-gguf/stories260K%.gguf ") then n = n + 1 end
        end
      end
    end
    assert.is_true(n >= 1, "no example runs models/stories260K-gguf/stories260K.gguf (without ‡)")
    local h = io.open(T.root .. "/.gitignore")
    local ignored = h:read("*a")
    h:close()
    assert.truthy(ignored:find("\n/scratch/\n", 1, true) or ignored:find("^/scratch/\n"), ".gitignore lacks /scratch/")
  end)
end)
