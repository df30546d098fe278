-- The Lua layers (lua/loip/layers.lua, mirrored by docs/design.md §1 "Lua layers"): every
-- `require "name"` / `require("name")` in lua/ and recipes/, those inside functions too, read
-- from the files; no require goes round a cycle, none goes up the table, every loip module it
-- names exists and every module is in a layer; a require inside a function or block has a
-- comment on its line saying why (or its file's leading comment a line "Requires inside
-- functions: why"). Failures name the file, the line and the rule.
local T = require "spec.support"
local layers = require "loip.layers"

local root = T.root

local lines_of = T.lines_of

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- A file whose leading comment says this, and why, keeps its requires inside functions.
local FILE_REASON = "Requires inside functions:"

-- Modules the build generates (build/lua/loip/): they have no file under lua/.
local GENERATED = { ["loip.cdef"] = true, ["loip.constants"] = true, ["loip.build_config"] = true }

-- The module a file is: lua/loip/x/y.lua is loip.x.y, lua/loip/x/init.lua loip.x; a recipe is
-- its path.
local function module_of(rel)
  local m = rel:match("^lua/(.+)%.lua$")
  if not m then return rel end
  m = m:gsub("/", ".")
  return (m:gsub("%.init$", ""))
end

-- The requires of Lua source text: { { name =, line =, depth = } }, outside comments and strings
-- (a require written in a comment or a message is none), at any depth (0: the file's top level;
-- more: inside a function or a block).
local OPENS = { ["function"] = true, ["if"] = true, ["do"] = true, ["repeat"] = true }
local CLOSES = { ["end"] = true, ["until"] = true }
local function requires_of(text)
  local out, i, n, line, depth = { commented = {} }, 1, #text, 1, 0
  local function long_close(at)
    -- at: the first "[" of a long bracket; returns its level's closing pattern and the index
    -- after the opening, or nil when it is none
    local eq = text:match("^%[(=*)%[", at)
    if not eq then return nil end
    return "]" .. eq .. "]", at + #eq + 2
  end
  local function skip_to(close, from)
    local a, b = text:find(close, from, true)
    b = b or n
    for _ in text:sub(from, b):gmatch("\n") do line = line + 1 end
    return b + 1
  end
  while i <= n do
    local c = text:sub(i, i)
    if c == "\n" then line = line + 1 i = i + 1
    elseif c == "-" and text:sub(i, i + 1) == "--" then
      out.commented[line] = true
      local close, after = long_close(i + 2)
      if close then i = skip_to(close, after)
      else
        local e = text:find("\n", i, true)
        i = e or n + 1
      end
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n do
        local d = text:sub(j, j)
        if d == "\\" then j = j + 2
        elseif d == c or d == "\n" then break
        else j = j + 1 end
      end
      i = j + 1
    elseif c == "[" and long_close(i) then
      local close, after = long_close(i)
      i = skip_to(close, after)
    elseif c:match("[%a_]") then
      local word = text:match("^[%w_]+", i)
      local prev = i > 1 and text:sub(i - 1, i - 1) or ""
      if word == "require" and prev ~= "." and prev ~= ":" then
        local name = text:match("^require%s*%(?%s*[\"']([^\"'\n]+)[\"']", i)
        if name then out[#out + 1] = { name = name, line = line, depth = depth } end
      elseif prev ~= "." and prev ~= ":" then
        if OPENS[word] then depth = depth + 1 elseif CLOSES[word] then depth = depth - 1 end
      end
      i = i + #word
    else i = i + 1 end
  end
  return out
end

-- Every Lua file of lua/ and recipes/: { rel =, module = }.
local function sources()
  local out = {}
  for _, rel in ipairs(lines_of("cd '" .. root .. "' && find lua recipes -name '*.lua' -type f | LC_ALL=C sort")) do
    out[#out + 1] = { rel = rel, module = module_of(rel) }
  end
  return out
end

-- The layer of module m: { index =, name = } and the part that placed it, or nil. A part named
-- exactly wins over a folder ("loip.x.*"); of folders, the longest.
local function layer_of(m)
  local best, best_len, part
  for i, l in ipairs(layers) do
    for _, p in ipairs(l.parts) do
      local folder = p:match("^(.-)%.%*$") or p:match("^(.-)/%*$")
      local len
      if p == m then len = math.huge
      elseif folder and (m == folder or m:sub(1, #folder + 1) == folder .. "." or m:sub(1, #folder + 1) == folder .. "/") then
        len = #folder
      end
      if len and (not best_len or len > best_len) then best, best_len, part = i, len, p end
    end
  end
  return best and { index = best, name = layers[best].name } or nil, part
end

-- The graph: modules (name -> rel), edges (name -> list of { to =, line = }), problems found on
-- the way (a loip module required that does not exist).
local function graph()
  local mods, edges, missing, inner = {}, {}, {}, {}
  local files = sources()
  for _, f in ipairs(files) do mods[f.module] = f.rel end
  for _, f in ipairs(files) do
    local e = {}
    local text = read(root .. "/" .. f.rel)
    local reqs = requires_of(text)
    local said = false -- (the file's leading comment says why)
    for l in text:gmatch("([^\n]*)\n") do
      if l:sub(1, 2) ~= "--" then break end
      if l:find(FILE_REASON, 1, true) then said = true end
    end
    for _, r in ipairs(reqs) do
      if r.depth > 0 and not reqs.commented[r.line] and not said then
        inner[#inner + 1] = string.format("%s:%d: requires %s inside a function or block with no comment on its line "
          .. "saying why: move it to the top of the file (or say why not on that line)", f.rel, r.line, r.name)
      end
      if mods[r.name] or GENERATED[r.name] then
        e[#e + 1] = { to = r.name, line = r.line }
      elseif r.name == "loip" or r.name:match("^loip%.") then
        missing[#missing + 1] = string.format("%s:%d: requires %s, which is no module of lua/ (renamed? moved?)",
          f.rel, r.line, r.name)
      end
    end
    edges[f.module] = e
  end
  return mods, edges, missing, files, inner
end

-- The cycles of the graph (Tarjan's strongly connected components), each written as one
-- circle through the component: "a -> b (file:line) -> ... -> a (file:line)".
local function cycles(mods, edges)
  local index, low, on, stack, comps, n = {}, {}, {}, {}, {}, 0
  local function visit(v)
    n = n + 1
    index[v], low[v] = n, n
    stack[#stack + 1], on[v] = v, true
    for _, e in ipairs(edges[v] or {}) do
      local w = e.to
      if edges[w] then
        if not index[w] then visit(w) low[v] = math.min(low[v], low[w])
        elseif on[w] then low[v] = math.min(low[v], index[w]) end
      end
    end
    if low[v] == index[v] then
      local comp = {}
      repeat
        local w = table.remove(stack)
        on[w] = nil
        comp[w] = true
        comp[#comp + 1] = w
      until w == v
      comps[#comps + 1] = comp
    end
  end
  local names = {}
  for m in pairs(edges) do names[#names + 1] = m end
  table.sort(names)
  for _, m in ipairs(names) do if not index[m] then visit(m) end end
  local out = {}
  for _, comp in ipairs(comps) do
    local self_loop
    for _, e in ipairs(edges[comp[1]]) do if e.to == comp[1] then self_loop = true end end
    if #comp > 1 or self_loop then
      table.sort(comp)
      -- one circle from the first module back to it, by breadth-first search inside the component
      local start, prev, queue, seen = comp[1], {}, { comp[1] }, {}
      local closing
      while #queue > 0 and not closing do
        local v = table.remove(queue, 1)
        for _, e in ipairs(edges[v]) do
          if e.to == start then closing = { from = v, line = e.line } break end
          if comp[e.to] and not seen[e.to] then
            seen[e.to] = true
            prev[e.to] = { from = v, line = e.line }
            queue[#queue + 1] = e.to
          end
        end
      end
      local path, v = {}, closing.from
      table.insert(path, 1, string.format("%s (%s:%d)", start, mods[closing.from], closing.line))
      while v ~= start do
        table.insert(path, 1, string.format("%s (%s:%d)", v, mods[prev[v].from], prev[v].line))
        v = prev[v].from
      end
      out[#out + 1] = string.format("require cycle of %d modules (%s): %s -> %s", #comp, table.concat(comp, ", "),
        start, table.concat(path, " -> "))
    end
  end
  return out
end

-- The requires that go up the table, and the modules in no layer.
local function against_table(mods, edges, files)
  local out = {}
  for _, f in ipairs(files) do
    local from, part = layer_of(f.module)
    if not from then
      out[#out + 1] = string.format("%s: module %s is in no layer: add it (or its folder) to a layer's parts in "
        .. "lua/loip/layers.lua and to docs/design.md's table", f.rel, f.module)
    else
      for _, e in ipairs(edges[f.module]) do
        local to, to_part = layer_of(e.to)
        if to and to.index > from.index then
          out[#out + 1] = string.format("%s:%d: %s (layer %d %s, part %s) requires %s (layer %d %s, part %s), a layer "
            .. "above it: a lower layer must not call up (pass it a function, or move the shared piece down; "
            .. "lua/loip/layers.lua)", f.rel, e.line, f.module, from.index, from.name, part, e.to, to.index, to.name, to_part)
        end
      end
    end
  end
  return out
end

-- docs/design.md's table, as this table writes it.
local function design_table()
  local out = { "| layer | parts | holds | may require |", "|---|---|---|---|" }
  for i, l in ipairs(layers) do
    local parts = {}
    for j, p in ipairs(l.parts) do parts[j] = "`" .. p .. "`" end
    out[#out + 1] = string.format("| %d %s | %s | %s | %s |", i, l.name, table.concat(parts, ", "), l.holds,
      i == 1 and "itself" or i == 2 and "layer 1" or ("layers 1–" .. (i - 1)))
  end
  return table.concat(out, "\n")
end

local function fail_with(list, what)
  if #list > 0 then
    error(string.format("%d %s:\n  %s", #list, what, table.concat(list, "\n  ")), 0)
  end
end

describe("the Lua layers", function()
  it("reads requires as Lua does, not in comments or strings, inside functions too", function()
    local got = requires_of(table.concat({
      'local a = require "loip.a"',
      "local b = require('loip.b') -- require 'loip.not1'",
      'local s = "require \'loip.not2\'"',
      "--[[ require 'loip.not3'",
      "]] local function f() return require(\"loip.c\").x, x.require 'loip.not4' end",
      "local t = [==[ require 'loip.not5' ]==] local d = require 'loip.d'",
    }, "\n"))
    local names = {}
    for i, r in ipairs(got) do names[i] = r.name .. ":" .. r.line end
    assert.are.same({ "loip.a:1", "loip.b:2", "loip.c:5", "loip.d:6" }, names)
  end)

  it("finds a cycle and names the modules round it", function()
    local mods = { a = "lua/a.lua", b = "lua/b.lua", c = "lua/c.lua" }
    local edges = { a = { { to = "b", line = 3 } }, b = { { to = "c", line = 4 } }, c = { { to = "a", line = 9 } } }
    local got = cycles(mods, edges)
    assert.are.equal(1, #got)
    assert.are.equal("require cycle of 3 modules (a, b, c): a -> b (lua/a.lua:3) -> c (lua/b.lua:4) -> a (lua/c.lua:9)", got[1])
    edges.c = {}
    assert.are.same({}, cycles(mods, edges))
  end)

  it("places a module by its most specific part", function()
    assert.are.equal("engine", layer_of("loip.model").name)
    assert.are.equal("formats", layer_of("loip.model.store").name)
    assert.are.equal("engine", layer_of("loip.model.experts").name)
    assert.are.equal("front", layer_of("loip.cli").name)
    assert.are.equal("recipes", layer_of("recipes/bench/soak.lua").name)
    assert.is_nil(layer_of("loip.nowhere"))
  end)

  it("has no require cycle in lua/ and recipes/", function()
    local mods, edges = graph()
    fail_with(cycles(mods, edges), "require cycle(s); break each by moving the shared piece down or passing a function")
  end)

  it("has every require go down the table (lua/loip/layers.lua), and every loip module it names exist", function()
    local mods, edges, missing, files = graph()
    fail_with(missing, "require(s) of missing modules")
    fail_with(against_table(mods, edges, files), "require(s) against the layer table")
  end)

  it("has requires at the top of their files, or a comment saying why not", function()
    local _, _, _, _, inner = graph()
    fail_with(inner, "require(s) inside functions")
  end)

  it("is the table docs/design.md shows", function()
    local want = design_table()
    local doc = read(root .. "/docs/design.md")
    assert(doc:find(want, 1, true), "docs/design.md (§1, \"Lua layers\") does not hold lua/loip/layers.lua's table; "
      .. "write it as:\n" .. want)
  end)
end)
