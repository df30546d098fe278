-- The FFI surface: the handshake, and struct layouts as C and LuaJIT see them.
local ffi = require "ffi"
local loip = require "loip"
local T = require "spec.support"

describe("the FFI surface", function()
  it("agrees on the ABI version", function()
    assert.are.equal(tonumber(loip.C.LOIP_ABI_VERSION), loip.C.loip_abi_version())
  end)

  it("lays out every struct Lua touches as the C compiler does", function()
    local structs = {
      loip_cpu_info = { "n_cpus", "has_cuda" },
      loip_model_config = { "dim", "norm_eps", "rope_theta", "rope_layout", "rope_factor",
        "rope_original_max_pos", "qkv_bias", "qk_norm", "tied_embeddings", "sliding_window", "layer_window",
        "norm_add_one", "embed_scale", "final_softcap", "attn_sinks", "glu_limit", "rope_yarn_truncate" },
      loip_tensor = { "data", "dtype", "ndim", "shape" },
      loip_sampler_params = { "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "penalty_last_n" },
      loip_loader_config = { "rate_limit_bps", "n_slots", "debug_short_every", "overlap_loads", "budget" },
      loip_budget_account = { "name", "bytes", "peak" },
      loip_load_extent = { "fd", "file_offset", "slot_offset" },
      loip_load_done = { "status", "t_done_ns", "message" },
      loip_loader_stats_t = { "throttle_ns" },
      loip_stage_view = { "slot_offset", "shape" },
      loip_stage_desc = { "extents", "n_views", "views" },
      loip_runner_event = { "t0_ns", "bytes", "n_tokens" },
      loip_runner_stats_t = { "events_dropped" },
      loip_msg_header = { "step", "payload_bytes", "flags" },
      loip_link_stats = { "bw_bps", "latency_ns", "transit_sum_ns", "late_sum_ns" },
      loip_device_config = { "plan_id", "logits_tokens", "heartbeat" },
      loip_device_stats_t = { "head_ns" },
      loip_kv_share_stats = { "cache_bytes", "cow_copies" },
      loip_step_token = { "request", "flags", "id", "parent" },
      loip_step_output = { "request", "id", "flags" },
    }
    for name, fields in pairs(structs) do
      assert.are.equal(ffi.sizeof(name), tonumber(loip.C.loip_layout(name, "")), "sizeof " .. name)
      for _, f in ipairs(fields) do
        assert.are.equal(ffi.offsetof(name, f), tonumber(loip.C.loip_layout(name, f)), name .. "." .. f)
      end
    end
  end)

  it("declares exactly what loip.h declares (generated, not hand-copied)", function()
    local header = T.read(T.root .. "/runtime/include/loip.h")
    local region = header:match("/%* FFI%-BEGIN %*/(.-)/%* FFI%-END %*/")
    assert.is_truthy(region)
    local cdef = require "loip.cdef"
    assert.are.equal(region:gsub("LOIP_API ", ""), cdef)
  end)

  it("holds every enumerator of loip.h in loip.constants (generated), as the library has it", function()
    local K = require "loip.constants"
    local decls = (require "loip.cdef"):gsub("/%*.-%*/", "")
    local n, seen = 0, {}
    for name in decls:gmatch("LOIP_([%w_]+)%s*=") do
      n, seen[name] = n + 1, true
      assert.are.equal(tonumber(loip.C["LOIP_" .. name]), K[name], "LOIP_" .. name)
    end
    for name, v in pairs(K) do
      if type(v) ~= "table" then assert.is_true(seen[name], "loip.constants." .. name .. " is not in loip.h") end
    end
    assert.is_true(n > 100)
    assert.are.equal(loip.C.loip_abi_version(), K.ABI_VERSION)
    -- the groups Lua names: each member is the enumerator, each enumerator of the group is there
    local function group(g, prefix, count)
      local k = 0
      for name, v in pairs(g) do
        k = k + 1
        assert.are.equal(K[prefix .. name], v, prefix .. name)
      end
      assert.are.equal(count, k, prefix .. "*")
    end
    group(K.msg, "MSG_", K.MSG_KINDS - 1)
    local n_tokf = 0
    for name in pairs(K) do if name:match("^TOKF_") then n_tokf = n_tokf + 1 end end
    group(K.tokf, "TOKF_", n_tokf)
    group(K.dtype, "", K.DTYPE_COUNT)
    for name, v in pairs(K.dtype) do
      -- the block-quantized dtypes have no element size: their matrices have bytes
      local block = v == K.MXFP4 or v == K.F8_E4M3
      assert.are.equal(not block, loip.C.loip_dtype_size(v) > 0, name)
      assert.is_true(tonumber(loip.C.loip_dtype_bytes(v, 3, 256)) > 0, name)
    end
    assert.are.equal(0ULL, loip.C.loip_dtype_bytes(K.DTYPE_COUNT, 3, 256))
    assert.are.equal(0, loip.C.loip_dtype_size(K.DTYPE_COUNT))
    -- what the Lua side reads from them
    assert.are.same(K.msg, require("loip.runtime.transport").kinds)
    assert.are.same(K.dtype, require("loip.core").dtype)
    assert.are.equal(K.KV_BLOCK_TOKENS, require("loip.sim").KV_BLOCK)
  end)

  it("counts a tensor's bytes in Lua (store.tensor_bytes) as loip_dtype_bytes does", function()
    local K, store = require "loip.constants", require "loip.model.store"
    for _, name in ipairs({ "F32", "BF16", "F16", "MXFP4", "F8_E4M3" }) do
      for _, shape in ipairs({ { 1, 32 }, { 3, 64 }, { 127, 2880 }, { 300, 129 }, { 2880 }, { 129, 1 } }) do
        local rows, cols = #shape == 2 and shape[1] or 1, shape[#shape]
        local c = tonumber(loip.C.loip_dtype_bytes(store.dtypes[name][1], rows, cols))
        local l, why = store.tensor_bytes(name, shape)
        if c == 0 then assert.is_nil(l, name) assert.matches("not a multiple of the block size 32", why)
        else assert.are.equal(c, l, name .. " " .. table.concat(shape, "x")) end
      end
    end
    assert.are.equal("MXFP4", store.dtype_name[K.MXFP4])
    assert.are.equal("F8_E4M3", store.dtype_name[K.F8_E4M3])
  end)

  it("is called only by the wrappers: lua/loip/runtime/* and loip.core (the rest, recipes too, calls them)", function()
    local p = io.popen("cd '" .. T.root .. "' && find lua recipes -name '*.lua' | sort")
    local direct, n = {}, 0
    for f in p:lines() do
      if not f:match("^lua/loip/runtime/") and f ~= "lua/loip/core.lua" then
        n = n + 1
        local ln = 0
        for line in io.lines(T.root .. "/" .. f) do
          ln = ln + 1
          local code = line:gsub("%-%-.*$", "") -- (a comment may name a C function)
          local call = code:match("%f[%w_]C%.loip_[%w_]+")
          if call then direct[#direct + 1] = f .. ":" .. ln .. ": " .. call end
        end
      end
    end
    p:close()
    assert.is_true(n > 50)
    assert.are.same({}, direct)
  end)

  it("reports errors through loip_last_error", function()
    local out = ffi.new("loip_mapping *[1]")
    local rc = loip.C.loip_mapping_open("/nonexistent/file", out)
    assert.is_true(rc < 0)
    assert.matches("/nonexistent/file", ffi.string(loip.C.loip_last_error()))
  end)
end)
