-- The C layering (docs/design.md): every #include "..." under runtime/ and kernels/, resolved as
-- the build resolves it (the including file's folder, then runtime/include, runtime, kernels:
-- CMakeLists.txt's include directories), gives an edge from the including file's folder to the
-- included file's. No two folders include each other, directly or round a circle, at either
-- depth (runtime/core and kernels/cpu; runtime and kernels): kernels/ is the ground floor, pure
-- compute that includes nothing of runtime/.
local T = require "spec.support"

local ROOTS = { "runtime", "kernels" }
local SEARCH = { "runtime/include", "runtime", "kernels" }

local lines_of = T.lines_of

local function exists(path)
  local f = io.open(T.root .. "/" .. path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function dir_of(path) return path:match("^(.*)/[^/]+$") or "." end

-- Every quoted include under ROOTS: { from = file, to = file } (paths from the repository's root).
local function includes()
  local files = lines_of("cd '" .. T.root .. "' && find " .. table.concat(ROOTS, " ")
    .. " -type f \\( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \\) | sort")
  assert(#files > 0, "no C files under " .. table.concat(ROOTS, ", ") .. " from " .. T.root)
  local out = {}
  for _, f in ipairs(files) do
    local fh = assert(io.open(T.root .. "/" .. f, "rb"))
    local text = fh:read("*a")
    fh:close()
    for name in text:gmatch('#%s*include%s*"([^"]+)"') do
      local to
      for _, base in ipairs { dir_of(f), SEARCH[1], SEARCH[2], SEARCH[3] } do
        if exists(base .. "/" .. name) then to = base .. "/" .. name break end
      end
      assert(to, f .. ' includes "' .. name .. '", which is in none of its search folders')
      out[#out + 1] = { from = f, to = to }
    end
  end
  return out
end

-- The folder a file is in, at depth 1 (runtime, kernels) or 2 (runtime/core, kernels/cpu).
local function folder(path, depth)
  local parts = {}
  for p in dir_of(path):gmatch("[^/]+") do parts[#parts + 1] = p end
  return table.concat(parts, "/", 1, math.min(depth, #parts))
end

-- The cycles among folders at depth: a list of messages, each naming a circle of folders and,
-- for each step of it, the files whose includes make it.
local function cycles(incs, depth)
  local edges, why = {}, {}
  for _, e in ipairs(incs) do
    local a, b = folder(e.from, depth), folder(e.to, depth)
    if a ~= b then
      edges[a] = edges[a] or {}
      edges[a][b] = true
      local k = a .. " -> " .. b
      why[k] = why[k] or {}
      why[k][#why[k] + 1] = e.from .. " includes " .. e.to
    end
  end
  -- depth-first search; a back edge closes a circle (each reported once, by its folder set)
  local state, stack, found, seen = {}, {}, {}, {}
  local names = {}
  for a in pairs(edges) do names[#names + 1] = a end
  table.sort(names)
  local function visit(a)
    state[a] = "open"
    stack[#stack + 1] = a
    local next_ = {}
    for b in pairs(edges[a] or {}) do next_[#next_ + 1] = b end
    table.sort(next_)
    for _, b in ipairs(next_) do
      if state[b] == "open" then
        local circle = {}
        for i = #stack, 1, -1 do
          table.insert(circle, 1, stack[i])
          if stack[i] == b then break end
        end
        local sorted = { unpack(circle) }
        table.sort(sorted)
        local key = table.concat(sorted, ",")
        if not seen[key] then
          seen[key] = true
          circle[#circle + 1] = b
          local msg = { table.concat(circle, " -> ") .. ":" }
          for i = 1, #circle - 1 do
            for _, w in ipairs(why[circle[i] .. " -> " .. circle[i + 1]]) do msg[#msg + 1] = "  " .. w end
          end
          found[#found + 1] = table.concat(msg, "\n")
        end
      elseif not state[b] then
        visit(b)
      end
    end
    stack[#stack] = nil
    state[a] = "done"
  end
  for _, a in ipairs(names) do if not state[a] then visit(a) end end
  return found
end

describe("C include layering", function()
  local incs = includes()

  it("reads the includes as the build resolves them", function()
    local seen = {}
    for _, e in ipairs(incs) do seen[e.from .. " " .. e.to] = true end
    -- (a few that must be there, so that an empty reading cannot pass)
    assert.is_true(seen["runtime/exec/forward.c runtime/exec/model.h"])
    assert.is_true(seen["runtime/core/core.h runtime/include/loip.h"])
  end)

  it("has no folder that includes another that includes it, directly or round a circle", function()
    local all = {}
    for _, depth in ipairs { 2, 1 } do
      for _, c in ipairs(cycles(incs, depth)) do all[#all + 1] = c end
    end
    assert(#all == 0, "include cycles between folders:\n" .. table.concat(all, "\n"))
  end)

  it("finds a circle when there is one, naming its files", function()
    local fake = {
      { from = "runtime/a/x.c", to = "runtime/b/y.h" },
      { from = "runtime/b/y.c", to = "runtime/c/z.h" },
      { from = "runtime/c/z.c", to = "runtime/a/x.h" },
      { from = "kernels/k/k.c", to = "runtime/a/x.h" },
    }
    local c2 = cycles(fake, 2)
    assert.are.equal(1, #c2)
    assert.is_truthy(c2[1]:find("runtime/a -> runtime/b -> runtime/c -> runtime/a", 1, true))
    assert.is_truthy(c2[1]:find("runtime/c/z.c includes runtime/a/x.h", 1, true))
    assert.are.equal(0, #cycles(fake, 1))
    fake[#fake + 1] = { from = "runtime/a/x.c", to = "kernels/k/k.h" }
    local c1 = cycles(fake, 1)
    assert.are.equal(1, #c1)
    assert.is_truthy(c1[1]:find("kernels -> runtime -> kernels", 1, true) or c1[1]:find("runtime -> kernels -> runtime", 1, true))
  end)
end)
