-- The test data ships in the repository (models/, listed in models/README.md): a clone with
-- nothing beside it runs every spec, C test and benchmark. Every file they name is there, each
-- under 4 MiB and not ignored by git; nothing reads a shared folder beside the checkout; and a
-- spec whose data is missing skips, saying what it needs, instead of failing.
local T = require "spec.support"

local function lines_of(cmd)
  local h = io.popen(cmd)
  local out = {}
  for l in h:lines() do out[#out + 1] = l end
  h:close()
  return out
end

-- Every data path (relative to the repository) that the specs, the C tests and the tokenizer
-- benchmark name literally.
local function named_paths()
  local seen, paths = {}, {}
  local function add(rel, where)
    if not seen[rel] then seen[rel] = where paths[#paths + 1] = rel end
  end
  for _, f in ipairs(lines_of("cd '" .. T.root .. "' && find spec -name '*.lua' | sort")) do
    local text = T.read(T.root .. "/" .. f)
    for rel in text:gmatch('fixture_path%("(models/[^"]+)"%)') do add(rel, f) end
    for rel in text:gmatch('fixture%("(models/[^"]+)"%)') do add(rel, f) end
    for rel in text:gmatch('T%.root %.%. "/(models/[^"]+)"') do add(rel, f) end
  end
  local c = T.read(T.root .. "/tests/test_scoredbpe.c")
  for rel in c:gmatch('"%%s/(models/[^"]+)"') do add(rel, "tests/test_scoredbpe.c") end
  for rel in c:gmatch('"(models/[^"]+)"') do add(rel, "tests/test_scoredbpe.c") end
  for rel in T.read(T.root .. "/recipes/bench/tokenizer.lua"):gmatch('models %.%. "/([^"]+)"') do
    add("models/" .. rel, "recipes/bench/tokenizer.lua")
  end
  table.sort(paths)
  return paths, seen
end

describe("test data in models/", function()
  after_each(function() T.cleanup() end)
  it("holds every file the specs, C tests and benchmarks name, each under 4 MiB, none ignored by git", function()
    local paths, where = named_paths()
    assert.is_true(#paths >= 20, "found only " .. #paths .. " data paths: has the way specs name them changed?")
    local missing = {}
    for _, rel in ipairs(paths) do
      if not T.exists(T.root .. "/" .. rel) then missing[#missing + 1] = rel .. " (named in " .. where[rel] .. ")" end
    end
    assert.are.same({}, missing, "not in the repository: " .. table.concat(missing, ", "))
    local big = lines_of("cd '" .. T.root .. "' && find models -type f -size +4096k")
    assert.are.same({}, big, "files over 4 MiB in models/")
    if os.execute("git -C '" .. T.root .. "' rev-parse --git-dir >/dev/null 2>&1") == 0 then
      local quoted = {}
      for i, rel in ipairs(paths) do quoted[i] = "'" .. rel .. "'" end
      local ignored = lines_of("git -C '" .. T.root .. "' check-ignore --no-index " .. table.concat(quoted, " "))
      assert.are.same({}, ignored, "ignored by git, so a clone lacks them")
    end
  end)

  it("lists each folder in models/README.md, with the folder's own README", function()
    -- (the folders the specs name, and every row's: models/ may also hold models a user pulled)
    local index = T.read(T.root .. "/models/README.md")
    local folders, seen = {}, {}
    for _, rel in ipairs((named_paths())) do
      local name = rel:match("^models/([^/]+)/") or rel:match("^models/([^/.]+)$")
      if name and not seen[name] then seen[name] = true folders[#folders + 1] = name end
    end
    for name in index:gmatch("\n| `([^`/]+)/` |") do
      if not seen[name] then seen[name] = true folders[#folders + 1] = name end
    end
    assert.is_true(#folders >= 8, "found only " .. #folders .. " folders")
    for _, name in ipairs(folders) do
      assert.truthy(index:find("\n| `" .. name .. "/` |", 1, true), "models/README.md has no row for " .. name .. "/")
      assert.is_true(T.exists(T.root .. "/models/" .. name .. "/README.md"), "models/" .. name .. "/ has no README.md")
    end
  end)

  it("is found in the repository first, else in LOIP_SHARED_DIR, else named as missing", function()
    local saved = T.extra_data
    finally(function() T.extra_data = saved end)
    T.extra_data = nil
    assert.are.equal(T.root .. "/models/chat-templates/reference.json", T.fixture_path("models/chat-templates/reference.json"))
    local p, why = T.fixture_path("models/" .. "no-such-folder/x.json")
    assert.is_nil(p)
    assert.truthy(why:find("needs models/no-such-folder/x.json: not in this checkout", 1, true), why)
    local other = T.tmpdir()
    T.write(other .. "/x.json", "{}")
    T.extra_data = other:match("^(.*)/[^/]+$")
    local name = other:match("([^/]+)$")
    assert.are.equal(other .. "/x.json", T.fixture_path(name .. "/x.json"))
    assert.are.equal(T.root .. "/models/chat-templates/reference.json", T.fixture_path("models/chat-templates/reference.json"))
    p, why = T.fixture_path("models/" .. "no-such-folder/x.json")
    assert.is_nil(p)
    assert.truthy(why:find("nor in LOIP_SHARED_DIR", 1, true), why)
  end)

  it("is read from nowhere else: no spec, C test, recipe or module reads a folder beside the checkout", function()
    local hits = lines_of("cd '" .. T.root .. "' && grep -rlF --include='*.lua' --include='*.c' --include='*.h' "
      .. "--include='*.sh' --include='*.txt' --exclude-dir=node_modules '" .. ".." .. "/shared' spec tests recipes lua")
    assert.are.same({}, hits, "files that read the shared folder")
  end)
end)

describe("a spec whose data is missing", function()
  it("skips, saying what it needs, instead of failing", function()
    -- a checkout without models/: the GGUF spec's stories260K.gguf cases must all be pending
    local root = lines_of("cd '" .. T.root .. "' && pwd -P")[1]
    local loip = T.loip:sub(1, 1) == "/" and T.loip or (lines_of("pwd -P")[1] .. "/" .. T.loip)
    local dir = T.tmpdir()
    assert.are.equal(0, os.execute(string.format("ln -s '%s/spec' '%s/spec'", root, dir)))
    local rc, out, err = T.run(string.format("cd '%s' && LOIP_REPO='%s' LOIP_SHARED_DIR='%s/none' '%s' test "
      .. "--filter 'stories260K.gguf' spec/integration/gguf_spec.lua", dir, dir, dir, loip))
    T.cleanup()
    assert.are.equal(0, rc, out .. err)
    assert.truthy(out:find("0 successes / 0 failures / 0 errors / 4 pending", 1, true), out)
    assert.truthy(out:find("needs models/stories260K-gguf/stories260K.gguf: not in this checkout", 1, true), out)
    assert.truthy(out:find("needs models/stories260K/reference/encode.json: not in this checkout", 1, true), out)
  end)
end)
