-- `loip pull`: a model repository from a Hugging Face-compatible endpoint into a directory.
-- The files are listed through the Hub's API (GET {endpoint}/api/models/{repo}/tree/{rev}
-- ?recursive=true, pages followed by their `Link: <...>; rel="next"`), and each one is
-- downloaded from {endpoint}/{repo}/resolve/{rev}/{path} (the Hub redirects there to its CDN)
-- into "<path>.incomplete" beside its place, written as the bytes arrive, verified (a Git LFS
-- file: the sha256 the listing gives; another: its size), synced and only then renamed into
-- place. An ".incomplete" left by an interrupted pull is continued with a Range request; within
-- one pull a dropped connection is resumed a few times. Files already present and verified are
-- skipped. On failure only ".incomplete" files remain, and the next pull continues them.
--
--   local r, err = require("loip.model.pull").pull {
--     repo = "owner/name", revision = "main",
--     endpoint = nil,  -- default: $HF_ENDPOINT, else https://huggingface.co
--     to = nil,        -- default: models/<name>
--     include = { "*.json", "*.safetensors" },   -- shell globs on the path (* and ? match "/" too)
--     token = nil,     -- default: $HF_TOKEN; false: none. Sent as a bearer header, never printed
--     quiet = false, retries = 4, stall_s = 60 }
--   r: { repo, revision, endpoint, dir, bytes (downloaded now), downloaded, present,
--        files = { { path, size, sha256 (LFS files), action = "downloaded" | "resumed" | "present" } } }
-- Misuse (a repo that is not owner/name, a bad endpoint) raises; a failure returns nil, err.
-- The listing, the Hub's URLs and its HTTP failures are loip.model.hub's; this file downloads,
-- verifies and resumes.
local ffi = require "ffi"
local core = require "loip.core"
local errors = require "loip.error"
local client = require "loip.runtime.http_client"
local progress = require "loip.ui.progress"
local fs = require "loip.runtime.shell"
local files_rt = require "loip.runtime.files"
local hub = require "loip.model.hub"

pcall(ffi.cdef, "int open(const char *path, int flags, ...); int fsync(int fd); int close(int fd);")

local M = {}

-- the repository ids, endpoints and globs `loip pull` takes (loip.model.hub)
M.DEFAULT_ENDPOINT = hub.DEFAULT_ENDPOINT
M.check_repo, M.check_endpoint, M.glob_pattern = hub.check_repo, hub.check_endpoint, hub.glob_pattern
local CHUNK = 1024 * 1024
local fail = hub.fail

local file_size = fs.size

local function sha256_file(path)
  local hex, n = files_rt.sha256_file(path)
  if not hex then fail("%s: %s", path, n) end
  return hex, n
end

local new_hash = files_rt.sha256

local function hex_of(h) return (files_rt.sha256_hex(h)) end

-- h over the first n bytes of path (the part of a download already there).
local function hash_prefix(h, path, n)
  local f, err = io.open(path, "rb")
  if not f then fail("%s", err) end
  while n > 0 do
    local s = f:read(math.min(CHUNK, n))
    if not s then break end
    files_rt.sha256_update(h, s)
    n = n - #s
  end
  f:close()
end

-- Written bytes reach the disk before the rename makes the file visible whole.
local function sync(path)
  local fd = ffi.C.open(path, 0) -- O_RDONLY: fsync flushes the file's data whatever the mode
  if fd < 0 then return end
  ffi.C.fsync(fd)
  ffi.C.close(fd)
end

local function mkdir_p(dir)
  if not fs.mkdir_p(dir) then fail("cannot create the directory %s", dir) end
end

-- A pull: a Hub session (loip.model.hub) that downloads its files, with dir (where to) and
-- retries (failed transfers in a row before giving up).
local Pull = setmetatable({}, { __index = hub.Session })
Pull.__index = Pull

-- End the line a terminal's bar has drawn so far, before other text or when it stops short.
local function break_line(bar)
  if not bar.quiet and bar.tty and bar.last > 0 then
    io.stderr:write("\n")
    bar.last = 0
  end
end

-- The whole file's size as a response tells it: a 206's or a 416's Content-Range total, a 200's
-- Content-Length (unless the body is encoded); nil when it does not say.
local function served_total(status, h)
  if status == 206 or status == 416 then return tonumber((h["content-range"] or ""):match("/(%d+)%s*$")) end
  if status == 200 and not h["content-encoding"] then return tonumber(h["content-length"] or "") end
  return nil
end

-- One GET of url into part from byte st.have on (a Range request when st.have > 0), hashing
-- into st.h. Returns the finished transfer; st.have is what part holds after it.
function Pull:fetch(url, part, f, st, bar)
  local headers = { ["Range"] = st.have > 0 and string.format("bytes=%d-", st.have) or nil }
  local t = self.cl:get(url, self:headers(url, headers))
  local fh, mode, errbody = nil, nil, {}
  t.on_data = function(t, s)
    t.last_byte_ms = core.now_ms()
    if not mode then
      local status, h = t:response()
      if status == 206 then
        local from = tonumber((h["content-range"] or ""):match("^bytes%s+(%d+)%-"))
        if from ~= st.have then
          mode, t.abort, t.bad_range = "ignore", string.format("the server sent bytes from %s on, %d were asked for",
            tostring(from), st.have), true
          return
        end
      elseif status == 200 and st.have > 0 then -- the Range was not honoured: the whole file comes again
        break_line(bar)
        self:say("%s: the server sent the whole file again: starting over", f.path)
        st.have, st.h, st.restarted = 0, new_hash(), true
      end
      -- a file of another size than the listing's: no use reading it (nor asking again)
      local total = served_total(status, h)
      t.told_total = total
      if total and total ~= f.size then
        mode, t.abort, t.served_size = "ignore", "the server's file is not the listing's size", total
        return
      end
      if status == 200 or status == 206 then
        local err
        fh, err = io.open(part, st.have == 0 and "wb" or "ab")
        if not fh then mode, t.abort, t.fatal = "ignore", err, true return end
        mode = "write"
      else
        mode = "error"
      end
    end
    if mode == "write" then
      if st.have + #s > f.size then
        mode, t.abort, t.too_long = "ignore", "more bytes than the listing's size", true
        return
      end
      local ok, err = fh:write(s)
      if not ok then mode, t.abort, t.fatal = "ignore", err, true return end
      files_rt.sha256_update(st.h, s)
      st.have = st.have + #s
      bar:update(st.have)
    elseif mode == "error" and #errbody < 64 then
      errbody[#errbody + 1] = s
    end
  end
  local ok, err = pcall(self.finish, self, t)
  if fh then
    local cok, cerr = fh:close()
    if not cok and not t.fatal then t.abort, t.fatal = cerr, true end
  end
  if not ok then
    t:close()
    error(err, 0)
  end
  if mode == "error" then t.body = table.concat(errbody) end
  return t
end

-- Whether f is at dest already, whole and verified (check: how); told either way.
function Pull:present(f, dest, label, check)
  local size = file_size(dest)
  if size == f.size and (not f.sha256 or sha256_file(dest) == f.sha256) then
    self:say("%s: present, %s verified", label, check)
    return true
  end
  self:say("%s: present but not the repository's (%s differs): downloading it again", label,
    size ~= f.size and "size" or "sha256")
  return false
end

-- One response t of a transfer of f into part (st: its state): a server that sends more than
-- the listing's size, a write that failed, a file of another size and an HTTP failure that is
-- not transient fail; a part that is not a prefix of the file starts over.
function Pull:check_response(t, f, part, st, bar, url)
  if t.too_long then
    os.remove(part)
    fail("%s: %s: the server sent more than the listing's %d bytes (removed %s)", self.repo, f.path, f.size, part)
  elseif t.fatal then
    fail("%s: %s: cannot write %s: %s", self.repo, f.path, part, tostring(t.abort))
  end
  -- the server's file is not the size the listing gives: its headers say so (a 416's too), or,
  -- when they give no size, its response ended complete short of the listing's size (a
  -- connection that closed early is an error). Asking again gives the same.
  local served = t.served_size or (t.status == 416 and served_total(416, t.headers or {}))
    or (t.told_total == nil and not t.abort and not t.error and (t.status == 200 or t.status == 206)
      and st.have < f.size and st.have) or nil
  if served and served ~= f.size then
    break_line(bar)
    local removed = file_size(part) and os.remove(part) and string.format("; removed %s", part) or ""
    fail("%s: %s: the server's file is %d bytes, the listing says %d (GET %s): the repository's listing and its "
      .. "file disagree, not retried%s", self.repo, f.path, served, f.size, self:scrub(url), removed)
  end
  local transient = t.abort or t.error or t.status == 206 or t.status == 200 or (t.status >= 500 and t.status <= 599)
  if t.status == 416 or t.bad_range then -- the part is not a prefix of this file: start over
    os.remove(part)
    st.have, st.h, st.restarted = 0, new_hash(), true
    transient = true
  elseif not transient then
    break_line(bar)
    self:http_failure(t, url, f.path)
  end
end

-- f's bytes into part from st.have on, resuming after a transfer that stopped short (a pause
-- that doubles up to 8 s; after self.retries failures in a row, fail: the part kept).
function Pull:transfer(f, url, part, st, bar, label)
  local failures = 0
  while st.have < f.size do
    local before = st.have
    local t = self:fetch(url, part, f, st, bar)
    self:check_response(t, f, part, st, bar, url)
    if st.have < f.size then
      local why = self:scrub(t.abort or t.error or (t.status ~= 200 and t.status ~= 206 and ("HTTP " .. t.status))
        or "the connection closed early")
      failures = st.have > before and 1 or failures + 1
      st.resumes = (st.resumes or 0) + 1
      break_line(bar)
      if failures > self.retries then
        local tries = string.format("%d failed attempt%s in a row", failures, failures == 1 and "" or "s")
        if not file_size(part) then fail("%s: %s: %s (GET %s), %s", self.repo, f.path, why, url, tries) end
        fail("%s: %s: %s (GET %s) at %d of %d bytes, %s; kept %s: pull again to resume", self.repo,
          f.path, why, url, st.have, f.size, tries, part)
      end
      self:say("%s: %s at %s of %s: resuming", label, why, progress.human(st.have), progress.human(f.size))
      core.sleep_ms(math.min(250 * 2 ^ (failures - 1), 8000))
    end
  end
end

-- Download f unless it is here and verified (whole: ignore a part and what is here); returns
-- the action taken.
function Pull:download(f, n, count, whole)
  local dest = self.dir .. "/" .. f.path
  local part = dest .. ".incomplete"
  local label = count > 1 and string.format("[%d/%d] %s", n, count, f.path) or f.path
  local check = f.sha256 and "sha256" or "size"
  if file_size(dest) and not whole and self:present(f, dest, label, check) then return "present" end
  mkdir_p(dest:match("^(.*)/[^/]*$"))
  local url = self:resolve_url(f.path)
  local st = { have = file_size(part) or 0, h = new_hash() }
  if st.have > f.size or whole then
    os.remove(part)
    st.have = 0
  end
  local resumed_from = st.have > 0 and st.have or nil
  if resumed_from then
    hash_prefix(st.h, part, st.have)
    self:say("%s: resuming at %s of %s", label, progress.human(st.have), progress.human(f.size))
  end
  local bar = progress.new(f.size, label, { quiet = self.quiet })
  self:transfer(f, url, part, st, bar, label)
  if st.have == 0 and not file_size(part) then -- an empty file: nothing to ask for
    local fh = assert(io.open(part, "wb"))
    fh:close()
  end
  local size = file_size(part)
  local got = hex_of(st.h)
  if size ~= f.size or (f.sha256 and got ~= f.sha256) then
    os.remove(part)
    break_line(bar)
    if resumed_from and not st.restarted then
      -- the part left by an earlier pull was of another version of the file: once more, whole
      self:say("%s: the part resumed from did not belong to this file: downloading it whole", label)
      return self:download(f, n, count, true)
    end
    if size ~= f.size then
      fail("%s: %s: %d bytes arrived, the listing says %d; removed %s", self.repo, f.path, size or 0, f.size, part)
    end
    fail("%s: %s: sha256 mismatch: the repository lists %s, the download has %s; removed %s", self.repo, f.path,
      f.sha256, got, part)
  end
  sync(part)
  local ok, err = os.rename(part, dest)
  if not ok then fail("%s: %s: cannot rename %s into place: %s", self.repo, f.path, part, tostring(err)) end
  bar:finish(check .. " verified" .. (resumed_from and not st.restarted and
    string.format(", resumed at %s", progress.human(resumed_from)) or "")
    .. (st.resumes and string.format(", %d transfer%s resumed", st.resumes, st.resumes == 1 and "" or "s") or ""))
  return resumed_from and not st.restarted and "resumed" or "downloaded"
end

function M.pull(o)
  if type(o) ~= "table" then error("pull: a table of options expected", 2) end
  local owner, name = M.check_repo(o.repo)
  if not owner then error("pull: " .. name, 2) end
  local env_endpoint = os.getenv("HF_ENDPOINT")
  local endpoint, why = M.check_endpoint(o.endpoint or (env_endpoint ~= "" and env_endpoint) or M.DEFAULT_ENDPOINT)
  if not endpoint then error("pull: " .. why, 2) end
  local include = o.include
  if type(include) == "string" then include = { include } end
  local token = o.token
  if token == nil then token = os.getenv("HF_TOKEN") end
  if token == "" or token == false then token = nil end
  if token and token:find("[\r\n]") then error("pull: the token holds a line break", 2) end
  local self = setmetatable({ repo = o.repo, revision = o.revision or "main", endpoint = endpoint, origin = hub.origin(endpoint),
    dir = (o.to or ("models/" .. name)):gsub("(.)/+$", "%1"), token = token, quiet = o.quiet,
    retries = o.retries or 4, stall_s = o.stall_s or 60 }, Pull)
  local ok, r = pcall(function()
    self.cl = client.new()
    local files = self:list()
    if include and #include > 0 then
      local pats, keep = {}, {}
      for i, g in ipairs(include) do pats[i] = M.glob_pattern(g) end
      for _, f in ipairs(files) do
        for _, p in ipairs(pats) do
          if f.path:match(p) then keep[#keep + 1] = f break end
        end
      end
      if #keep == 0 then
        fail("%s: no file of its %d matches --include %s", self.repo, #files, table.concat(include, " --include "))
      end
      files = keep
    end
    if #files == 0 then fail("%s: the repository has no files at revision %s", self.repo, self.revision) end
    -- room for what is not here yet (a file present at its size counts as present)
    local need = 0
    for _, f in ipairs(files) do
      local dest = self.dir .. "/" .. f.path
      if file_size(dest) ~= f.size then
        local part = file_size(dest .. ".incomplete") or 0
        need = need + f.size - (part <= f.size and part or 0)
      end
    end
    local free = files_rt.disk_available(fs.existing_dir(self.dir))
    if free and free < need then
      fail("%s: not enough disk space in %s: the files need %s more, %s are free", self.repo, self.dir,
        progress.human(need), progress.human(free))
    end
    local out = { repo = self.repo, revision = self.revision, endpoint = self.endpoint, dir = self.dir, files = {},
      bytes = 0, downloaded = 0, present = 0 }
    for i, f in ipairs(files) do
      local have = file_size(self.dir .. "/" .. f.path .. ".incomplete") or 0
      local action = self:download(f, i, #files)
      out.files[i] = { path = f.path, size = f.size, sha256 = f.sha256, action = action }
      if action == "present" then
        out.present = out.present + 1
      else
        out.downloaded = out.downloaded + 1
        out.bytes = out.bytes + f.size - (action == "resumed" and have or 0)
      end
    end
    return out
  end)
  if self.cl then self.cl:close() end
  if ok then return r end
  if errors.is(r, "hub") then return nil, self:scrub(r.message) end
  error(r, 0)
end

return M
