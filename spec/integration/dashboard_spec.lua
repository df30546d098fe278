-- The live dashboard of `loip serve` (docs/dashboard.md): headless Chromium (Debian's package
-- chromium, driven over the DevTools protocol through a pipe) loads / while 3 local devices
-- serve a burst: the page shows the 3 devices with their stages and a budget bar each, and its
-- step count and its count of events grow from the event stream (an event it cannot read counted
-- and skipped), its budget bars have a legend in colours of their own, a link says "not measured
-- yet" until an interval measured it; the page is public, /v1/cluster* need the API key.
-- On one device the snapshot and the stream show that device; a client too slow for its
-- stream is dropped without holding the serving loop; a device's loss is streamed.
local json = require "loip.text.json"
local client = require "loip.runtime.http_client"
local loip = require "loip"
local T = require "spec.support"
local chromium = require "spec.support.chromium"
teardown(function() T.cleanup() end)
local C = require("loip.core").C

local S260 = T.root .. "/models/stories260K"
teardown(T.drop_stores)
after_each(T.stop_servers)

local function get(cl, url, headers)
  local t = cl:get(url, headers)
  while cl.live[t] do cl:run(20) end -- (other transfers, an event stream, may go on)
  return t.status, t.body
end

-- The devices the page's DOM shows: { device, stages (count), budget (data-budget), used }.
local function devices_in(html)
  local out = {}
  for card in html:gmatch('<div class="device" data%-device="%d+">.-<div class="mem">') do
    local d = { device = tonumber(card:match('data%-device="(%d+)"')), stages = 0 }
    for _ in card:gmatch('class="stage"') do d.stages = d.stages + 1 end
    d.budget = tonumber(card:match('class="budget" data%-budget="(%d+)"'))
    d.used = tonumber(card:match('data%-used="(%d+)"'))
    out[#out + 1] = d
  end
  return out
end

local function steps_in(html) return tonumber(html:match('id="steps">(%d+)<')) end
local function events_in(html) return tonumber(html:match('id="events" data%-count="(%d+)"')) end

describe("the dashboard", function()
  it("shows 3 devices, their stages and budgets, live while they serve a burst (headless Chromium)", function()
    if not chromium.exe() then
      pending("needs chromium (Debian's package chromium: recipes/setup-debian.sh installs it)")
      return
    end
    local st = T.slice_store(S260, "s260")
    local url = T.serve(string.format("--model %s --devices 3 --mem 1000K,1000K,1000K --threads 1 --context 256 "
      .. "--max-batch 8 --step-tokens 32 --kv-tokens 1024 --api-key dash-key", st))
    local base = url:gsub("/v1$", "")
    local cl = client.new()
    local dir = T.tmpdir()
    local b
    local ok, err = pcall(function()
      -- the page is public; what it fetches needs the key
      local status, body = get(cl, base .. "/")
      assert.are.equal(200, status)
      assert.matches("/dashboard/app.js", body, 1, true)
      assert.are.equal(401, (get(cl, base .. "/v1/cluster")))
      assert.are.equal(401, (get(cl, base .. "/v1/cluster/events")))
      -- a burst: 16 requests of 240 tokens on 8 slots
      local burst = {}
      for k = 1, 16 do
        burst[k] = cl:post(url .. "/completions", json.encode({ model = st:match("([^/]+)$"), prompt = "Once upon a time",
          max_tokens = 240, ignore_eos = true, temperature = 0.8, seed = k }), { Authorization = "Bearer dash-key" })
      end
      b = assert(chromium.open(dir))
      -- (the first text a link shows, recorded as the page draws it: from the snapshot, before
      -- any interval measured the link)
      b:navigate("about:blank")
      b:call("Page.enable")
      b:call("Page.addScriptToEvaluateOnNewDocument", { source = "new MutationObserver(() => { const l = "
        .. "document.querySelector('.link'); if (l && window.firstLink == null) window.firstLink = l.textContent; })"
        .. ".observe(document, { childList: true, subtree: true });" })
      b:navigate(base .. "/#key=dash-key")
      local function dom() return b:eval("document.documentElement ? document.documentElement.outerHTML : ''") end
      -- the first reading: the snapshot and at least one step event shown
      local html
      for _ = 1, 600 do
        cl:run(50)
        html = dom()
        if #devices_in(html) == 3 and (steps_in(html) or 0) > 0 and (events_in(html) or 0) >= 2 then break end
      end
      local devs = devices_in(html)
      assert.are.equal(3, #devs, html)
      for i, d in ipairs(devs) do
        assert.are.equal(i, d.device)
        assert.is_true(d.stages >= 1, "device " .. i .. " shows its stages")
        assert.are.equal(1000 * 1024, d.budget, "device " .. i .. "'s budget bar")
        assert.is_true(d.used > 0 and d.used <= d.budget, string.format("device %d uses %s of its budget", i, tostring(d.used)))
      end
      assert.matches('class="link" data%-from="1" data%-to="2"', html)
      local s1, e1 = steps_in(html), events_in(html)
      assert.is_true(s1 > 0, html)
      -- the budget bars' legend, in colours of their own (not the timeline's)
      local legend = b:eval("(document.getElementById('budget-legend') || {}).textContent || ''")
      for _, a in ipairs({ "weights", "slots", "kv", "activations" }) do assert.matches(a, legend, 1, true) end
      local colours = json.decode(b:eval([[JSON.stringify({
        bars: Array.from(document.querySelectorAll('.budget span')).map((e) => getComputedStyle(e).backgroundColor),
        legend: Array.from(document.querySelectorAll('#budget-legend .k')).map((e) => getComputedStyle(e).backgroundColor),
        timeline: ['compute', 'load', 'stall', 'send'].map((k) => getComputedStyle(document.querySelector('h2 .k.' + k)).backgroundColor) })]]))
      assert.is_true(#colours.bars > 0 and #colours.legend == 5)
      local legend_set = {}
      for _, c in ipairs(colours.legend) do legend_set[c] = true end
      for _, c in ipairs(colours.bars) do assert.is_true(legend_set[c], c .. ": a bar's colour is in the legend") end
      for _, c in ipairs(colours.timeline) do assert.is_nil(legend_set[c], c .. ": the timeline's colour is a budget account's too") end
      -- a link not measured yet says so; once an interval measured it, its rate
      assert.matches("not measured yet", b:eval("window.firstLink"), 1, true)
      -- the second reading, once the server ran more steps: the page (not reloaded) shows them
      local s2
      for _ = 1, 600 do
        cl:run(50)
        s2 = steps_in(dom())
        if s2 > s1 then break end
      end
      assert.is_true(s2 > s1, string.format("the step count grew: %d then %d", s1, s2))
      html = dom()
      local e2 = events_in(html)
      assert.is_true(e2 > e1, string.format("the page counts the events it received: %d then %d", e1, e2))
      assert.matches('class="link" data%-from="1" data%-to="2"><span class="arrow">→</span><span>[%d.]+ %a+/s now</span>', html)
      -- an event the page cannot read is counted and skipped; the stream goes on
      assert.are.equal(1, b:eval("(() => { const n = state.events; dispatch('step', '{ not json'); return state.events - n; })()"))
      local e3 = events_in(dom())
      assert.is_true(b:wait_for("state.events > " .. e3, 60000), "events after an unreadable one")
      cl:wait(120000)
      for k = 1, 16 do assert.are.equal(200, burst[k].status, burst[k].body) end
    end)
    if b then b:close() end
    cl:close()
    -- nothing of the browser is left: no process holds its profile
    local _, ps = T.run("ps -eo pid=,args=")
    assert.is_nil(ps:find(dir .. "/profile", 1, true), ps)
    assert(ok, err)
  end)

  it("streams a device's loss (and its membership event) and the plan over the devices left; the snapshot lists the loss", function()
    local st = T.slice_store(S260, "s260")
    local url = T.serve(string.format("--model %s --devices 3 --threads 1 --context 256 --max-batch 2 --link-delay 10ms", st))
    local base = url:gsub("/v1$", "")
    local cl = client.new()
    local ok, err = pcall(function()
      local ev = cl:get(base .. "/v1/cluster/events")
      local events = {}
      ev.on_data = function(_, bytes) events[#events + 1] = bytes end
      local function seen()
        local out = {}
        for kind, data in table.concat(events):gmatch("event: (%w+)\ndata: ([^\n]*)\n\n") do
          out[kind] = out[kind] or {}
          table.insert(out[kind], json.decode(data))
        end
        return out
      end
      local status, body = get(cl, base .. "/v1/cluster")
      assert.are.equal(200, status, body)
      local pid = json.decode(body).devices[2].pid
      local r = cl:post(url .. "/completions", json.encode({ model = st:match("([^/]+)$"), prompt = "Once upon a time",
        max_tokens = 200, ignore_eos = true, temperature = 0 }))
      -- the request runs (a step event says so: 10 ms links make its 200 tokens take seconds),
      -- then device 2's worker is killed
      local function running()
        local steps = seen().step
        return steps and steps[#steps].running == 1 and steps[#steps].requests[1].tokens > 10
      end
      while cl.live[r] and not running() do cl:run(20) end
      assert.is_true(running(), "the request runs while its device is killed")
      os.execute("kill -KILL " .. pid)
      while cl.live[r] do cl:run(20) end
      assert.are.equal(200, r.status, r.body)
      local deadline = require("loip.core").now_ms() + 60000 -- (the events come; a busy machine sends them late)
      while require("loip.core").now_ms() < deadline do
        local s = seen()
        if s.loss and #s.plan >= 2 and s.member then break end
        cl:run(20)
      end
      local s = seen()
      assert.are.equal(1, #s.loss, table.concat(events))
      assert.are.same({ 2 }, s.loss[1].devices)
      assert.is_true(s.loss[1].replanned)
      assert.are.equal(3, #s.plan[1].devices)
      assert.are.equal(2, #s.plan[#s.plan].devices)
      local _, snap = get(cl, base .. "/v1/cluster")
      snap = json.decode(snap)
      assert.are.equal(2, #snap.devices)
      assert.are.equal(1, #snap.losses)
      -- and as a membership event (joins, leaves and losses in one list, as /health's)
      assert.are.equal(1, #(s.member or {}), table.concat(events))
      assert.are.equal("loss", s.member[1].kind)
      assert.are.equal(2, s.member[1].device)
      assert.are.equal(1, #snap.membership)
    end)
    cl:close()
    assert(ok, err)
  end)

  -- in this process: a server over a model on one device, driven by turns
  local function in_process()
    local server = require "loip.serve.server"
    local m = loip.model.open(S260, { threads = 1, context = 512, mem = "8M" })
    local srv = server.new { model = m, tokenizer = m.tokenizer, dir = S260, name = "stories260K", port = 0, quiet = true }
    local base = string.format("http://127.0.0.1:%d", srv.port)
    local function close() srv:close() m:close() end
    return srv, base, close
  end

  it("on one device: GET /v1/cluster shows that device, the event stream its plan, steps and requests", function()
    local srv, base, close = in_process()
    local cl = client.new()
    local ok, err = pcall(function()
      local snap = cl:get(base .. "/v1/cluster")
      while cl:busy() do srv:turn(5) cl:run(5) end
      assert.are.equal(200, snap.status, snap.body)
      local s = json.decode(snap.body)
      assert.are.equal("cluster", s.object)
      assert.is_false(s.cluster)
      assert.are.equal(1, #s.devices)
      local d = s.devices[1]
      assert.are.equal(1, d.device)
      -- the whole model on the one device: blocks 0 .. 2 * n_layers - 1
      assert.are.same({ { stage = 1, blocks = { 0, 2 * srv.opts.model.n_layers - 1 }, offloaded = 0 } }, d.stages)
      assert.are.equal(8 * 1024 * 1024, d.budget_bytes)
      assert.is_true(d.accounts.weights > 0 and d.memory_bytes <= d.budget_bytes)
      -- the stream while a request runs
      local ev = cl:get(base .. "/v1/cluster/events")
      for _ = 1, 20 do srv:turn(5) cl:run(5) end
      local r = cl:post(base .. "/v1/completions", json.encode({ model = "stories260K", prompt = "Lily", max_tokens = 200,
        temperature = 0, ignore_eos = true }))
      while r.status == nil or cl.live[r] do srv:turn(5) cl:run(5) end
      assert.are.equal(200, r.status, r.body)
      -- (until the stream told the request's end and a step after its compute: the next
      -- interval's, at most INTERVAL_MS later)
      local kinds
      local deadline = require("loip.core").now_ms() + 30000
      repeat
        srv:turn(5) cl:run(5)
        kinds = {}
        for kind, data in table.concat(ev.parts):gmatch("event: (%w+)\ndata: ([^\n]*)\n\n") do
          kinds[kind] = kinds[kind] or {}
          table.insert(kinds[kind], json.decode(data))
        end
        local steps, reqs = kinds.step or {}, kinds.request or {}
        local done = #reqs >= 2 and #steps > 0 and steps[#steps].devices[1].compute_ms > 0
      until done or require("loip.core").now_ms() > deadline
      assert.are.equal(1, #kinds.plan[1].devices)
      assert.are.same({ "running", "done" }, { kinds.request[1].state, kinds.request[2].state })
      assert.are.equal(200, kinds.request[2].tokens)
      assert.is_true(kinds.request[2].tokens_per_s > 0)
      local last = kinds.step[#kinds.step]
      assert.is_true(last.step > 0)
      assert.are.equal(1, #last.devices)
      assert.is_true(last.devices[1].compute_ms > 0)
      -- the page and its files; nothing outside the dashboard's folder
      local page = cl:get(base .. "/")
      local js = cl:get(base .. "/dashboard/app.js")
      local bad = cl:get(base .. "/dashboard/..%2Fdashboard.lua")
      local post = cl:post(base .. "/v1/cluster", "{}")
      while cl:busy() and (cl.live[page] or cl.live[js] or cl.live[bad] or cl.live[post]) do srv:turn(5) cl:run(5) end
      assert.are.equal(200, page.status)
      assert.are.equal("text/html; charset=utf-8", page.headers["content-type"])
      assert.are.equal(200, js.status)
      assert.are.equal(404, bad.status)
      assert.are.equal(405, post.status)
    end)
    cl:close()
    close()
    assert(ok, err)
  end)

  it("drops an event stream whose client does not read, without holding the serving loop", function()
    local srv, base, close = in_process()
    local cl = client.new()
    local ok, err = pcall(function()
      local ev = cl:get(base .. "/v1/cluster/events")
      while #srv.dashboard.clients == 0 do srv:turn(5) cl:run(5) end
      -- the client stops reading: what the server writes piles up past the bound
      local chunk = ": " .. string.rep("x", 65536) .. "\n\n"
      local turns = 0
      while #srv.dashboard.clients > 0 and turns < 2000 do
        srv.dashboard:broadcast(chunk)
        srv:turn(0)
        turns = turns + 1
      end
      assert.are.equal(0, #srv.dashboard.clients)
      assert.are.equal(1, srv.dashboard.dropped)
      -- the server goes on serving (the dropped stream ends once its client reads again)
      local r = cl:post(base .. "/v1/completions", json.encode({ model = "stories260K", prompt = "Lily", max_tokens = 8, temperature = 0 }))
      while cl.live[r] or cl.live[ev] do srv:turn(5) cl:run(5) end
      assert.are.equal(200, r.status, r.body)
    end)
    cl:close()
    close()
    assert(ok, err)
  end)
end)
