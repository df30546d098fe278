-- `loip profile`: measure a device (or running workers) for planning: compute, disk, transport.
-- Requires inside functions: `loip help` loads every command, so a command loads the modules
-- it uses when it runs (`loip help` loads no FFI).
local common = require "loip.cli.inputs"
local flags = require "loip.ui.flags"

local usage = common.usage

local M = {
  brief = "measure a device (or running workers) for planning: compute, disk, transport",
  usage = "loip profile --model STORE [--out FILE] [flags]\n       loip profile --hosts h1:p,h2:p,... --out FILE",
  summary = "Measure a device for planning and write a JSON profile (for --profile): compute time of an MHA and an\n"
    .. "MLP block of the store's shape for batches and context lengths, compute while the disk streams, the\n"
    .. "loader's cold read rate (O_DIRECT), the transport's time per message, memory available, the quantized\n"
    .. "kernels' fastest prefetch distance. With --hosts, every running worker measures itself on its own store,\n"
    .. "and the link to its ring neighbour.",
  flags = {
    { "model", "string", "the slice store whose blocks are timed and read", metavar = "STORE" },
    { "hosts", "string", "running workers to profile instead (with --token, LOIP_CLUSTER_TOKEN or --curve-keys)", metavar = "LIST" },
    flags.shared.token, flags.shared.curve_keys,
    { "out", "string", "the profile file to write (default: print it)", metavar = "FILE.json" },
    flags.shared.threads,
    { "batches", "string", "batch sizes to time", default = "1,2,4,8" },
    { "contexts", "string", "context lengths to time attention at", default = "64,256,1024" },
    { "read", "bytes", "bytes to read for the disk rate", default = 512 * 1024 * 1024 },
    { "prefetch", "string", "the quantized kernels' software prefetch distances to time, in bytes ('off': none; "
      .. "default 0,512,1024,2048,4096); the fastest goes into the profile (kernels.prefetch_bytes)", metavar = "LIST" },
    { "prefetch-read", "bytes", "bytes of MXFP4 matrices each prefetch distance is timed over "
      .. "(default: twice the last cache, from 64 MiB to 512 MiB)" },
    { "disk-rate", "bytes", "read through the loader held to this rate (emulating a slower disk)" },
    { "routing", "string", "instead: record a mixture of experts' routing over the prompts of FILE (one a line): how "
      .. "often each layer's router picks each expert (a routing profile, for --experts static and the planner)",
      metavar = "PROMPTS.txt" },
    { "generate", "int", "with --routing: greedy tokens generated after each prompt, counted too", default = 0 },
    { "readers", "int", "local devices that will read this disk at once (a cluster of N local workers): the disk and "
      .. "compute while it streams are measured with as many readers, each device priced at its share", default = 1,
      check = function(v) return v >= 1, "must be >= 1" end },
  },
}

local function numbers(cmd, flag, text)
  local out = {}
  for item in tostring(text):gmatch("[^,]+") do
    local v = tonumber(item)
    if not v or v < 1 or v ~= math.floor(v) then usage(cmd, "--%s: '%s' is not a positive integer", flag, item) end
    out[#out + 1] = v
  end
  return out
end

-- The --prefetch and --prefetch-read flags as loip.plan.profile.measure's prefetch option.
local function prefetch_opts(o)
  if o.prefetch == "off" then return false end
  if not o.prefetch then return { bytes = o.prefetch_read } end -- (loip.plan.prefetch's distances)
  local ds = {}
  for item in tostring(o.prefetch):gmatch("[^,]+") do
    local v, pf = tonumber(item), require "loip.plan.prefetch"
    if not pf.is_distance(v) then usage("profile", "--prefetch: '%s' is not a distance in bytes (0 to %d), nor 'off'", item, pf.MAX) end
    ds[#ds + 1] = v
  end
  if #ds == 0 then usage("profile", "--prefetch: no distance given") end
  return { distances = ds, bytes = o.prefetch_read }
end

function M.run(o)
  local profile = require "loip.plan.profile"
  local json = require "loip.text.json"
  local pr
  if o.routing then
    if not o.model then usage("profile", "--routing needs --model (the model whose routing is recorded)") end
    local prompts = {}
    local f, err = io.open(o.routing, "rb")
    if not f then usage("profile", "--routing: %s", err) end
    for line in f:lines() do if line:match("%S") then prompts[#prompts + 1] = line end end
    f:close()
    if #prompts == 0 then usage("profile", "--routing: %s holds no prompt (one a line)", o.routing) end
    local m = require("loip.model").open(o.model, { threads = o.threads > 0 and o.threads or nil })
    local bar = require("loip.ui.progress").new(#prompts, "routing " .. o.model, { bytes = false })
    local ok, r = pcall(require("loip.model.experts").profile_routing, m, prompts,
      { generate = o.generate, on_prompt = function(i) bar:update(i) end })
    bar:finish()
    m:close()
    if not ok then error(r, 0) end
    pr = r
  elseif o.hosts then
    local cluster = require "loip.cluster"
    local hosts = common.hosts("profile", o)
    if not o.model then usage("profile", "--hosts needs --model STORE: the head's copy of the store the workers hold") end
    local c = cluster.connect(hosts, { store = o.model, token = common.token(o), keys = o.curve_keys })
    local ok, err = pcall(function()
      pr = { loip_profile = profile.VERSION, created = os.date("!%Y-%m-%dT%H:%M:%SZ"), devices = {} }
      for i, d in ipairs(c.devices) do
        io.stderr:write(string.format("device %d (%s): measuring\n", i, d.endpoint))
        local nxt = c.devices[i % #c.devices + 1].endpoint
        local r = c:ask(i, { kind = "PROFILE", payload = json.encode({ full = true, batches = numbers("profile", "batches", o.batches),
          contexts = numbers("profile", "contexts", o.contexts), read = o.read, disk_rate = o.disk_rate,
          prefetch = prefetch_opts(o), link_to = #c.devices > 1 and nxt or nil }) }, 600000, d.bulk)
        pr.devices[i] = json.decode(r.payload)
      end
    end)
    c:close()
    if not ok then error(err, 0) end
  else
    if not o.model then usage("profile", "--model STORE is required (or --hosts)") end
    pr = profile.of_store(o.model, { threads = o.threads, batches = numbers("profile", "batches", o.batches),
      contexts = numbers("profile", "contexts", o.contexts), read = o.read, disk_rate = o.disk_rate, readers = o.readers,
      prefetch = prefetch_opts(o), progress = function(what) io.stderr:write("measuring ", what, "\n") end })
  end
  if o.out and o.routing then
    local wrote, werr = json.write_file(o.out, json.encode_sorted(pr, 2) .. "\n")
    if not wrote then error(werr, 0) end
    io.stderr:write("routing profile -> ", o.out, "\n")
  elseif o.out then
    profile.save(o.out, pr)
    io.stderr:write("profile -> ", o.out, "\n")
  else
    io.stdout:write(json.encode_sorted(pr, 2), "\n")
  end
  return 0
end

return M
