-- A slice store's manifest (loip.model.store, slice.lua describe it), read and checked: every
-- file named and sized, every tensor inside its file, aligned, its bytes matching shape and
-- dtype, and a routed expert's file (mixture of experts) holding that expert's parts alone.
local json = require "loip.text.json"
local files_rt = require "loip.runtime.files"

local M = {}

-- The store's format (its kinds, dtypes, files, alignment: loip.model.store), handed over by the
-- store as it loads (it requires this module; its read_manifest, check_manifest and check_files
-- are this module's read, check and check_files).
local S
function M.for_store(store) S = store return M end

local function is_int(v) return type(v) == "number" and v == math.floor(v) end

-- A routed expert's tensor (kind expert_gate/_up/_down) names its expert, as its file does; no
-- other tensor has one.
local function check_expert_tensor(S, f, t, tw, bad)
  local part = S.expert_kinds[t.kind]
  if not part then
    if t.expert ~= nil then bad(tw .. ": 'expert' on a tensor of kind '" .. tostring(t.kind) .. "'") end
    return
  end
  if not is_int(t.expert) or t.expert < 0 then bad(tw .. ": 'expert' is not an expert's index") end
  if f.expert ~= t.expert or f.layer ~= t.layer then
    bad(string.format("%s: expert %s of layer %s in the file of expert %s of layer %s", tw, tostring(t.expert),
      tostring(t.layer), tostring(f.expert), tostring(f.layer)))
  end
end

-- A file with an 'expert' field is S.expert_file(layer, expert) and holds that expert's gate, up
-- and down once each.
local function check_expert_file(S, f, where, bad)
  if f.expert == nil then return end
  if not is_int(f.expert) or f.expert < 0 or not is_int(f.layer) or f.layer < 0 then
    bad(where .. ": 'expert' and 'layer' are not an expert's and a layer's index")
  end
  if f.name ~= S.expert_file(f.layer, f.expert) then
    bad(string.format("%s: the file of expert %d of layer %d is named %s", where, f.expert, f.layer, S.expert_file(f.layer, f.expert)))
  end
  local seen = {}
  for _, t in ipairs(f.tensors) do
    if not S.expert_kinds[t.kind] or seen[t.kind] then bad(where .. ": holds a tensor of kind '" .. tostring(t.kind) .. "'") end
    seen[t.kind] = true
  end
  for _, kind in ipairs(S.expert_kind_names) do
    if not seen[kind] then bad(where .. ": has no tensor of kind '" .. kind .. "'") end
  end
end

-- The manifest of store dir, checked for consistency (every tensor inside its file, aligned,
-- its bytes matching shape and dtype). Raises naming the file and the fault.
function M.read(dir)
  local path = dir .. "/manifest.json"
  local man, err = json.load(path)
  if not man then error(err .. "; the manifest is damaged: " .. S.redo(nil, dir), 0) end
  return M.check(man, dir)
end

-- A decoded manifest (of store dir, for the messages) checked as read_manifest checks it.
function M.check(man, dir)
  local path = dir .. "/manifest.json"
  if type(man) ~= "table" or man.format ~= S.FORMAT then
    error(path .. ": not a loip slice store manifest (no \"format\": \"" .. S.FORMAT .. "\")", 0)
  end
  if man.version ~= S.VERSION then
    error(string.format("%s: store format version %s; this loip reads version %d: %s", path,
      tostring(man.version), S.VERSION, S.redo(man, dir)), 0)
  end
  local function bad(what) error(string.format("%s: %s; the manifest is damaged: %s", path, what, S.redo(man, dir)), 0) end
  if type(man.config) ~= "table" then bad("field 'config' is missing") end
  if type(man.source) ~= "table" or type(man.source.sha256) ~= "string" then bad("field 'source.sha256' is missing") end
  for _, list in ipairs({ "files", "model_files" }) do
    if type(man[list]) ~= "table" then bad("field '" .. list .. "' is missing") end
    for i, f in ipairs(man[list]) do
      local where = string.format("%s[%d]", list, i)
      if type(f) ~= "table" or type(f.name) ~= "string" or f.name:find("/", 1, true) or f.name == "manifest.json" then
        bad(where .. ": not a file name")
      end
      where = string.format("%s (%s)", where, f.name)
      if not is_int(f.size) or f.size < 0 then bad(where .. ": 'size' is not a byte count") end
      if type(f.sha256) ~= "string" or not f.sha256:match("^" .. string.rep("%x", 64) .. "$") then
        bad(where .. ": 'sha256' is not a sha256")
      end
      if f.crc32c ~= nil and (not is_int(f.crc32c) or f.crc32c < 0 or f.crc32c > 4294967295) then
        bad(where .. ": 'crc32c' is not a 32-bit checksum")
      end
      if list == "files" then
        if f.size % S.ALIGN ~= 0 then bad(where .. ": size is not a multiple of " .. S.ALIGN) end
        if type(f.tensors) ~= "table" then bad(where .. ": 'tensors' is missing") end
        for k, t in ipairs(f.tensors) do
          if type(t) ~= "table" then bad(string.format("%s: tensors[%d] is not an object", where, k)) end
          local tw = string.format("%s: tensor '%s'", where, tostring(t.name))
          if not S.kinds[t.kind] then bad(tw .. ": unknown kind '" .. tostring(t.kind) .. "'") end
          if not is_int(t.layer) then bad(tw .. ": 'layer' is not an integer") end
          local dt = S.dtypes[t.dtype]
          if not dt then bad(tw .. ": dtype '" .. tostring(t.dtype) .. "' is not F32, BF16 or F16") end
          if type(t.shape) ~= "table" or #t.shape < 1 or #t.shape > 4 then bad(tw .. ": bad shape") end
          local numel = 1
          for _, d in ipairs(t.shape) do
            if not is_int(d) or d < 0 then bad(tw .. ": bad shape") end
            numel = numel * d
          end
          if not is_int(t.offset) or t.offset % S.ALIGN ~= 0 then bad(tw .. ": offset is not a multiple of " .. S.ALIGN) end
          -- (the block-quantized dtypes' bytes as loip_dtype_bytes counts them: F8's with its scales)
          if t.nbytes ~= (S.tensor_bytes(t.dtype, t.shape) or numel * dt[2]) then bad(tw .. ": nbytes does not match shape and dtype") end
          if t.offset + t.nbytes > f.size then bad(tw .. ": runs past the end of the file") end
          check_expert_tensor(S, f, t, tw, bad)
        end
        check_expert_file(S, f, where, bad)
      end
    end
  end
  return man
end

-- Every file of the store: present with the manifest's size (fast), and with verify its sha256
-- (reads everything). Returns the number of files and bytes checked; raises naming the first
-- file at fault and what to do. bar: a progress bar (bytes) for the hashing.
function M.check_files(dir, man, verify, bar)
  local all = {}
  for _, f in ipairs(man.files) do all[#all + 1] = f end
  for _, f in ipairs(man.model_files) do all[#all + 1] = f end
  local bytes = 0
  for _, f in ipairs(all) do
    local size = S.file_size(dir .. "/" .. f.name)
    if not size then
      error(string.format("%s/%s is missing: the store is incomplete; %s", dir, f.name, S.redo(man, dir)), 0)
    end
    if size ~= f.size then
      error(string.format("%s/%s has %d bytes but the manifest says %d: the file is damaged or from another slicing; %s",
        dir, f.name, size, f.size, S.redo(man, dir)), 0)
    end
    bytes = bytes + size
  end
  if verify then
    local done = 0
    for _, f in ipairs(all) do
      local got = assert(files_rt.sha256_file(dir .. "/" .. f.name))
      if got ~= f.sha256 then
        error(string.format("%s/%s: sha256 %s does not match the manifest's %s: the file is damaged; %s",
          dir, f.name, got, f.sha256, S.redo(man, dir)), 0)
      end
      done = done + f.size
      if bar then bar:update(done) end
    end
  end
  return #all, bytes
end

return M
