-- JSON files with errors that name the file.
-- a private instance, strict: NaN, Infinity and hexadecimal numbers are not JSON
local cjson = require("cjson.safe").new()
cjson.decode_invalid_numbers(false)
cjson.encode_invalid_numbers(false)
local utf8 = require "loip.text.utf8"

local M = {}

M.null = cjson.null
-- cjson escapes every "/" as "\/": valid, but noisy in paths. Every "/" it emits carries
-- that escape, so dropping the backslash before a "/" is exact. cjson copies a string's bytes
-- >= 0x80 as they are, well-formed or not: JSON is UTF-8 (RFC 8259), so each ill-formed part
-- becomes U+FFFD (loip.text.utf8; every such byte lies inside a string, between ASCII quotes).
function M.encode(v)
  local s, err = cjson.encode(v)
  if not s then error("JSON: cannot encode: " .. tostring(err), 2) end
  return utf8.sanitize((s:gsub("\\/", "/")))
end

local function holds_objects(a)
  for i = 1, #a do if type(a[i]) == "table" and a[i] ~= cjson.null and #a[i] == 0 and next(a[i]) then return true end end
  return false
end

-- Deterministic encoding: object keys sorted, so the same value always gives the same bytes
-- (cjson's order follows its hash table). indent: nil for one line, else spaces per level.
function M.encode_sorted(v, indent, level)
  level = level or 0
  local t = type(v)
  if t ~= "table" or v == cjson.null then return M.encode(v) end
  local nl, pad, pad_in = "", "", ""
  if indent then
    nl = "\n"
    pad = string.rep(" ", indent * level)
    pad_in = string.rep(" ", indent * (level + 1))
  end
  local sep = indent and ": " or ":"
  local n = #v
  local is_array = n > 0 or next(v) == nil and getmetatable(v) == cjson.array_mt
  if n > 0 then
    for k in pairs(v) do
      if type(k) ~= "number" or k > n or k < 1 then is_array = false break end
    end
  end
  local parts = {}
  if is_array then
    -- Arrays of scalars stay on one line. When indenting, an array of objects (a manifest's
    -- list of files and their tensors) gets a line per element, and an element is itself
    -- spread over lines only when it holds such an array.
    if not (indent and holds_objects(v)) then
      for i = 1, n do parts[i] = M.encode_sorted(v[i], nil, 0) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    for i = 1, n do
      local spread = false
      if type(v[i]) == "table" then
        for _, x in pairs(v[i]) do if type(x) == "table" and holds_objects(x) then spread = true break end end
      end
      parts[i] = pad_in .. M.encode_sorted(v[i], spread and indent or nil, level + 1)
    end
    return "[" .. nl .. table.concat(parts, "," .. nl) .. nl .. pad .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for i, k in ipairs(keys) do
    local val = v[k]
    if val == nil then val = v[tonumber(k)] end
    parts[i] = pad_in .. M.encode(k) .. sep .. M.encode_sorted(val, indent, level + 1)
  end
  if #parts == 0 then return "{}" end
  return "{" .. nl .. table.concat(parts, "," .. nl) .. nl .. pad .. "}"
end

function M.decode(text, what)
  -- cjson stops at a NUL byte and takes what came before it for the whole text; JSON has no
  -- raw NUL anywhere (in a string it is escaped)
  local nul = text:find("\0", 1, true)
  if nul then return nil, string.format("%s: invalid JSON: a NUL byte at offset %d", what or "JSON", nul - 1) end
  local v, err = cjson.decode(text)
  if v == nil then return nil, (what or "JSON") .. ": invalid JSON: " .. tostring(err) end
  return v
end

function M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local text = f:read("*a")
  f:close()
  return text
end

-- Write text to path whole or not at all (through the runtime's writer: a temporary file, synced
-- and renamed when complete); true, or nil and why.
function M.write_file(path, text)
  local files_rt = require "loip.runtime.files" -- (not at the top: the command line reads JSON before a command runs, and loads no FFI)
  local w, err = files_rt.writer(path)
  if not w then return nil, err end
  local ok, werr = files_rt.write(w, text)
  if ok then ok, werr = files_rt.commit(w) end
  files_rt.writer_free(w)
  if not ok then return nil, werr end
  return true
end

-- Decode a JSON file holding an object or an array (every file loip reads); nil, "path:
-- reason" on any failure, a file of one scalar (false, null, 3) included.
function M.load(path)
  local text, err = M.read_file(path)
  if not text then return nil, err end
  local v, derr = M.decode(text, path)
  if v == nil then return nil, derr end
  if type(v) ~= "table" then return nil, path .. ": not a JSON object or array" end
  return v
end

function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

return M
