-- The test command's spec entries (CMakeLists.txt, LOIP_LUA_ONLY_SPECS): every spec file of
-- spec/unit and spec/integration runs in exactly one ctest entry, spec.<suite> (spec.integration:
-- its halves spec.integration.a-l and spec.integration.m-z) or spec.<suite>.lua;
-- the .lua ones, and only they, carry the label lua-only, which CI's sanitizer stage skips and
-- nothing else does. So a new spec cannot fall out of both entries, nor be run twice, nor miss
-- the sanitizers unless it is listed. Read from the build that runs the specs (ctest --show-only).
local json = require "loip.text.json"
local T = require "spec.support"

local lines_of = T.lines_of

-- the build directory the specs run from (LOIP_BIN's, as ctest gives it, else the running binary's)
local function build_dir()
  return T.loip:match("^(.*)/[^/]+$") or "."
end

local function spec_files(suite)
  local out = {}
  for _, f in ipairs(lines_of("ls -1 '" .. T.root .. "/spec/" .. suite .. "'")) do
    if f:match("_spec%.lua$") then out[#out + 1] = f end
  end
  return out
end

-- the spec files (by "suite/name") one ctest entry's command runs, as busted picks them: files
-- named, and a directory's *_spec.lua files less those an --exclude-pattern matches
local function files_run(args)
  local excludes, roots = {}, {}
  for i = 2, #args do
    local a = args[i]
    local pat = a:match("^%-%-exclude%-pattern=(.*)$")
    if pat then excludes[#excludes + 1] = pat
    elseif a:match("^spec/") then roots[#roots + 1] = a end
  end
  local out = {}
  for _, r in ipairs(roots) do
    local suite, file = r:match("^spec/(%w+)/([^/]+_spec%.lua)$")
    if suite then
      out[#out + 1] = suite .. "/" .. file
    else
      suite = assert(r:match("^spec/(%w+)/?$"), "a spec root neither a suite nor a spec file: " .. r)
      for _, f in ipairs(spec_files(suite)) do
        local skip = false
        for _, p in ipairs(excludes) do if f:find(p) then skip = true end end
        if not skip then out[#out + 1] = suite .. "/" .. f end
      end
    end
  end
  return out
end

local function label_of(test)
  for _, p in ipairs(test.properties or {}) do
    if p.name == "LABELS" then return p.value end
  end
  return {}
end

describe("the test command's spec entries", function()
  it("run every spec file exactly once, the lua-only entries labelled so", function()
    local dir = build_dir()
    if not T.exists(dir .. "/CTestTestfile.cmake") then
      return pending("needs the build directory of the loip that runs the specs (no CTestTestfile.cmake in " .. dir .. ")")
    end
    local listing = json.decode(table.concat(lines_of("ctest --test-dir '" .. dir .. "' --show-only=json-v1 2>/dev/null"), "\n"))
    assert.is_table(listing, "ctest --show-only=json-v1 printed no JSON")
    local entry_of, entries = {}, {}
    for _, t in ipairs(listing.tests) do
      -- (spec.<suite>, or its shards spec.<suite>.<first letters>, e.g. spec.integration.a-l; spec.<suite>.lua)
      local suite, lua = t.name:match("^spec%.(%w+)$") or t.name:match("^spec%.(%w+)%.%l%-%l$"), false
      if not suite then suite, lua = t.name:match("^spec%.(%w+)%.lua$"), true end
      if suite then
        entries[t.name] = true
        local labels = label_of(t)
        if lua then
          assert.are.same({ "lua-only" }, labels, t.name .. "'s labels")
        else
          for _, l in ipairs(labels) do
            assert.are_not.equal("lua-only", l, t.name .. " is labelled lua-only: the sanitizers would skip it")
          end
        end
        assert.is_table(t.command, t.name .. ": ctest gives no command (is its loip built?)")
        for _, f in ipairs(files_run(t.command)) do
          assert.is_nil(entry_of[f], string.format("spec/%s runs in %s and in %s", f, tostring(entry_of[f]), t.name))
          assert.are.equal(suite, f:match("^(%w+)/"), string.format("%s runs spec/%s, of another suite", t.name, f))
          entry_of[f] = t.name
        end
      else
        for _, l in ipairs(label_of(t)) do
          assert.are_not.equal("lua-only", l, t.name .. " is labelled lua-only but runs no spec")
        end
      end
    end
    for _, e in ipairs({ "spec.unit", "spec.unit.lua", "spec.integration.a-l", "spec.integration.m-z", "spec.integration.lua" }) do
      assert.is_true(entries[e], "no ctest entry " .. e)
    end
    for _, suite in ipairs({ "unit", "integration" }) do
      for _, f in ipairs(spec_files(suite)) do
        assert.is_not_nil(entry_of[suite .. "/" .. f], "spec/" .. suite .. "/" .. f .. " runs in no ctest entry")
      end
    end
    -- this check itself is one of them
    assert.are.equal("spec.unit.lua", entry_of["unit/ctest_split_spec.lua"])
  end)

  it("are skipped by label in CI's sanitizer stage and nowhere else", function()
    local ci = T.read(T.root .. "/.ci/run")
    local asan = ci:match("\n(ASAN_OPTIONS=[^\n]*ctest %-%-test%-dir build%-asan[^\n]*)")
    assert.is_string(asan, ".ci/run runs no ctest in build-asan")
    assert.truthy(asan:find("-LE lua-only", 1, true), ".ci/run's ASan stage does not skip the label lua-only: " .. asan)
    local n = select(2, ci:gsub("%-LE lua%-only", ""))
    assert.are.equal(1, n, ".ci/run skips lua-only in more than the ASan stage")
  end)
end)
