-- Features that each have their specs alone, checked together (issue 36): a pairwise covering
-- array (spec/support/pairwise.lua, printed when the spec runs) over the engine, the model, the
-- draft, online adaptation, the requests, the output, the prefix cache and a fault, every value of
-- each meeting every value of each other in some row. Each row is served by `loip serve` (stories260K
-- and a tiny synthetic MoE) and must give: the single device's greedy text for every request and
-- choice, valid UTF-8 in every JSON (bodies and streamed chunks), no 5xx and no request lost, every
-- device's accounted peak within its budget (GET /v1/cluster), a loss counted for a killed worker,
-- and nothing left in /tmp. Pairs the design cannot serve are listed in REFUSED, each with what
-- loip answers instead, checked too: on one device the server's own process runs the model, so
-- there is no worker to kill, join or drain.
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local core = require "loip.core"
local T = require "spec.support"
local pw = require "spec.support.pairwise"
local C = require "spec.support.combinations"

local DIMS = {
  { name = "engine", values = { "1dev", "local3", "hosts3" } },
  { name = "model", values = { "dense", "moe" } },
  { name = "draft", values = { "none", "ngram", "self2", "tree" } },
  { name = "online", values = { "none", "loip" } },
  { name = "requests", values = { "1", "3n2" } },
  { name = "output", values = { "text", "grammar", "logprobs" } },
  { name = "prefix", values = { "cold", "warm" } },
  { name = "fault", values = { "none", "kill-busy", "kill-idle", "join", "drain" } },
}

-- The pairs no row holds, and how loip refuses each up front.
local REFUSED = {
  { { "engine", "1dev" }, { "fault", "join" },
    why = "serve --join-listen without --devices/--hosts is refused: one device is no cluster to join" },
  { { "engine", "1dev" }, { "fault", "drain" },
    why = "POST /v1/cluster/drain on one device answers 400: nothing to drain" },
  { { "engine", "1dev" }, { "fault", "kill-busy" },
    why = "one device runs in the server's own process (endpoint in-process): there is no worker to kill" },
  { { "engine", "1dev" }, { "fault", "kill-idle" },
    why = "one device runs in the server's own process (endpoint in-process): there is no worker to kill" },
}

-- A request the design refuses in some rows, which the row checks is refused in words (400,
-- naming the field and the feature it meets): n > 1 shares the prompt's KV between the choices,
-- and on a cluster the online policy may lend KV, which moves no shared group. For the same
-- reason such a server keeps no prefix cache (a warm prompt is no hit), and says so when it starts.
local function refused_request(r)
  if r.engine ~= "1dev" and r.online == "loip" then return { param = "n", says = { "n > 1", "online policy" } } end
end

local ROWS = pw.generate(DIMS, { seed = 36, refused = REFUSED })

-- A row as { engine = "local3", model = "dense", ... }.
local function named(row)
  local r = {}
  for d, dim in ipairs(DIMS) do r[dim.name] = dim.values[row[d]] end
  return r
end

local t0 = core.now_ms()
teardown(function()
  C.stop_all()
  T.cleanup()
  T.drop_stores()
  io.stderr:write(string.format("combinations: %d rows in %.1f s\n", #ROWS, (core.now_ms() - t0) / 1000))
end)

describe("features together (a pairwise covering array)", function()
  it("covers every pair of values of two dimensions, or lists it as refused", function()
    io.stderr:write(pw.describe(DIMS, ROWS, REFUSED), "\n")
    for _, r in ipairs(REFUSED) do io.stderr:write(string.format("  refused %s=%s & %s=%s: %s\n", r[1][1], r[1][2], r[2][1], r[2][2], r.why)) end
    io.stderr:write("  refused per request: n: 2 where engine is local3 or hosts3 and online is loip (400, param n: the online policy may lend KV);\n"
      .. "    there a warm prompt is no prefix-cache hit: the server says when it starts that it keeps no prefix cache\n")
    local missing, held = pw.uncovered(DIMS, ROWS, REFUSED)
    assert.are.same({}, missing, "pairs no row covers")
    assert.are.same({}, held, "refused pairs a row holds")
    -- deterministic: the same seed gives the same rows; 5 x 4 values is the lower bound
    assert.are.same(ROWS, pw.generate(DIMS, { seed = 36, refused = REFUSED }))
    assert.is_true(#ROWS >= 20 and #ROWS <= 26, #ROWS .. " rows")
    -- the checker sees a missing pair, and a refused pair a row holds
    local small = { { name = "a", values = { "0", "1" } }, { name = "b", values = { "0", "1" } }, { name = "c", values = { "0", "1" } } }
    local rows = pw.generate(small, { seed = 1 })
    assert.is_true(#rows >= 4 and #rows <= 6)
    assert.are.same({}, (pw.uncovered(small, rows)))
    local missing, held = pw.uncovered(small, { rows[1] }, { { { "a", small[1].values[rows[1][1]] }, { "b", small[2].values[rows[1][2]] } } })
    assert.are.equal(12 - 3, #missing) -- (of 3 x 4 value pairs, the row holds 3)
    assert.are.equal(1, #held)
  end)

  it("refuses up front what one device cannot serve: a join, a drain; and has no worker to kill", function()
    -- join: --join-listen on one device
    local rc, _, err = T.run(string.format("%s serve --model %s --join-listen 127.0.0.1:0 --token t --port 0", T.loip, C.store("dense")))
    assert.are_not.equal(0, rc)
    assert.matches("--join-listen", err, 1, true)
    assert.matches("--devices or --hosts", err, 1, true)
    -- drain: a 400 naming the one device; kills: the one device is the server's process
    local s = C.server({ engine = "1dev", model = "dense", draft = "none", online = "none" })
    local cl = client.new()
    local d = cl:post(s.url .. "/cluster/drain", json.encode({ device = 1 }))
    local v = cl:get(s.base .. "/v1/cluster")
    cl:wait(30000)
    cl:close()
    assert.are.equal(400, d.status)
    assert.matches("runs one device, not a cluster: there is nothing to drain", d.body, 1, true)
    local view = json.decode(v.body)
    assert.are.equal(1, #view.devices)
    assert.are.equal("in-process", view.devices[1].endpoint)
    assert.is_nil(view.devices[1].pid)
  end)

  -- Pairs that failed apart from the array's other values (each fix's own check):
  it("one device adapting online beside the prefix cache: a block taken back first frees the cache's groups", function()
    -- (the policy counts the cache's groups as KV it may reclaim; they were not given up when a
    -- block came back: "memory budget: weights needs 82.0 KiB more ... prompt_cache 240.0 KiB")
    -- (stories260K: its text is whole characters; the MoE's rows meet this pair too)
    local url, stop = T.serve(string.format("--model %s --served-name combo --threads 1 --context 256 --max-batch 4 --mem 1800K "
      .. "--online loip --plan-positions 32", C.store("dense")))
    local ok, err = pcall(C.concurrent, url, "dense", 160)
    stop()
    assert(ok, err)
  end)

  it("says when it starts that a cluster's online policy leaves no prefix cache, and refuses --prompt-cache-dir beside it", function()
    local args = string.format("--model %s --devices 3 --threads 1 --context 256 --online loip --plan-positions 32", C.store("dense"))
    local _, stop, errlog = T.serve(args)
    stop()
    assert.matches("serve: no prefix cache: the online policy on a cluster (--online loip) may lend KV", T.read(errlog), 1, true)
    local dir = T.tmpdir()
    local rc, _, err = T.run(string.format("%s serve %s --prompt-cache-dir %s --port 0", T.loip, args, dir))
    assert.are_not.equal(0, rc)
    assert.matches("--prompt-cache-dir: the prefix cache is off beside the online policy on a cluster (--online loip", err, 1, true)
  end)

  for i, row in ipairs(ROWS) do
    local r = named(row)
    r.index = i
    local label = string.format("row %d: engine %s, model %s, draft %s, online %s, requests %s, output %s, prefix %s, fault %s",
      i, r.engine, r.model, r.draft, r.online, r.requests, r.output, r.prefix, r.fault)
    it(label, function() C.run_row(r, refused_request) end)
  end

  it("leaves nothing in /tmp: every server and worker stopped, their private directories gone", function()
    C.stop_all()
    for _, dir in ipairs(C.private_dirs()) do
      assert.are_not.equal(0, os.execute("test -e '" .. dir .. "'"), dir .. " is left")
    end
    local scratch = C.scratch_dirs()
    T.cleanup()
    T.drop_stores()
    for _, dir in ipairs(scratch) do assert.are_not.equal(0, os.execute("test -e '" .. dir .. "'"), dir .. " is left") end
  end)
end)
