-- Small file-system helpers the model tools share (the slicer, `loip pull`, synthetic models,
-- finding a model's files): through the shell where Lua has no call for it.
local M = {}

-- s quoted for sh.
function M.quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local quote = M.quote

-- Names in directory dir (no . and ..); nil when it cannot be listed.
function M.list(dir)
  local p = io.popen("ls -A " .. quote(dir) .. " 2>/dev/null")
  if not p then return nil end
  local names = {}
  for name in p:lines() do names[#names + 1] = name end
  p:close()
  return names
end

function M.is_dir(p) return os.execute("test -d " .. quote(p)) == 0 end

-- The directory p with symbolic links resolved; nil when it does not exist.
function M.real_dir(p)
  local h = io.popen("cd " .. quote(p) .. " 2>/dev/null && pwd -P")
  local r = h and h:read("*l")
  if h then h:close() end
  return r ~= "" and r or nil
end

-- p, or the nearest directory above it that exists (where its free space is counted).
function M.existing_dir(p)
  p = p:gsub("/+$", "")
  while p ~= "" and p ~= "." and not M.is_dir(p) do
    local up = p:match("^(.*)/[^/]*$")
    if not up then return "." end
    p = up
  end
  return p == "" and "/" or p
end

-- Size of the file at path, nil when it cannot be opened.
function M.size(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

-- Make dir and its parents; true, or nil and "DIR: cannot create the directory".
function M.mkdir_p(dir)
  if os.execute("mkdir -p " .. quote(dir)) ~= 0 then return nil, dir .. ": cannot create the directory" end
  return true
end

-- Where loip keeps its cache (calibrations, slice stores): $LOIP_CACHE_DIR, else
-- $XDG_CACHE_HOME/loip, else ~/.cache/loip.
function M.cache_dir()
  local d = os.getenv("LOIP_CACHE_DIR")
  if d and d ~= "" then return d end
  local x = os.getenv("XDG_CACHE_HOME")
  if x and x ~= "" then return x .. "/loip" end
  return (os.getenv("HOME") or "/tmp") .. "/.cache/loip"
end

return M
