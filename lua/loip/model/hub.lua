-- The Hub's side of `loip pull` (loip.model.pull): repository ids and endpoints checked, a
-- repository's files listed through the Hub's API (GET {endpoint}/api/models/{repo}/tree/{rev}
-- ?recursive=true, pages followed by their `Link: <...>; rel="next"`, every path checked to stay
-- inside the repository), the URL a file is downloaded from, requests run until done or stalled,
-- the token sent to the endpoint's own host only and scrubbed from every message, and a failed
-- request's status told as what it means (a private or gated repository, a revision not found).
--
--   local s = setmetatable({ repo = "owner/name", revision = "main", endpoint = hub.DEFAULT_ENDPOINT,
--     origin = hub.origin(hub.DEFAULT_ENDPOINT), token = nil, quiet = false, stall_s = 60,
--     cl = require("loip.runtime.http_client").new() }, hub.Session)
--   local files = s:list()   -- { { path, size, sha256 (LFS files) }, ... }; a failure raises a "hub" error
local core = require "loip.core"
local errors = require "loip.error"
local json = require "loip.text.json"

local M = {}

M.DEFAULT_ENDPOINT = "https://huggingface.co"

-- owner, name of a repository id, or nil and why.
function M.check_repo(repo)
  local owner, name = tostring(repo):match("^([%w][%w%-_%.]*)/([%w][%w%-_%.]*)$")
  if not owner or repo:find("..", 1, true) or #owner > 96 or #name > 96 then
    return nil, string.format("'%s' is not a repository id: owner/name, e.g. karpathy/tinyllamas", tostring(repo))
  end
  return owner, name
end

-- The endpoint without a trailing slash, or nil and why.
function M.check_endpoint(url)
  url = tostring(url):gsub("/+$", "")
  if not url:match("^https?://[^/%s]+[^%s]*$") then
    return nil, string.format("'%s' is not an endpoint: an http:// or https:// URL", url)
  end
  return url
end

-- A shell glob as an anchored Lua pattern: * any characters, ? one (a "/" too, as
-- huggingface_hub's --include matches with fnmatch), everything else itself.
function M.glob_pattern(g)
  local p = g:gsub("[%^%$%(%)%%%.%[%]%+%-]", "%%%0"):gsub("%*", ".*"):gsub("%?", ".")
  return "^" .. p .. "$"
end

-- s percent-encoded for a URL, but for unreserved characters and those in keep.
local function quote(s, keep)
  return (s:gsub("[^%w%-%._~" .. (keep or "") .. "]", function(c) return string.format("%%%02X", c:byte()) end))
end

-- The scheme and host of url, lowercase (whom a token may go to).
function M.origin(url)
  local o = url:match("^(https?://[^/]+)")
  return o and o:lower()
end

-- A failure of a pull: raised inside (M.fail) as an error of kind "hub" (loip.error), returned
-- as nil, err by loip.model.pull's pull.
function M.fail(fmt, ...) errors.raise("hub", string.format(fmt, ...)) end
local fail = M.fail

-- A path from the listing that stays inside the target directory.
local function safe_path(p)
  if type(p) ~= "string" or p == "" or p:find("^/") or p:find("[%z\\]") then return false end
  for seg in (p .. "/"):gmatch("([^/]*)/") do
    if seg == "" or seg == "." or seg == ".." then return false end
  end
  return true
end

-- A session with one repository of one endpoint: { repo, revision, endpoint (M.check_endpoint's),
-- origin (M.origin of the endpoint), token (nil: none), quiet, stall_s, cl (a loip.runtime.http_client) }.
local Session = {}
Session.__index = Session
M.Session = Session

function Session:say(fmt, ...)
  if not self.quiet then io.stderr:write(self:scrub(string.format(fmt, ...)), "\n") end
end

-- s without the token (a server's message might echo it): it is never printed.
function Session:scrub(s)
  if not self.token then return s end
  local out, i = {}, 1
  while true do
    local a, b = s:find(self.token, i, true)
    if not a then break end
    out[#out + 1] = s:sub(i, a - 1) .. "<HF_TOKEN>"
    i = b + 1
  end
  out[#out + 1] = s:sub(i)
  return table.concat(out)
end

function Session:headers(url, extra)
  local h = extra or {}
  -- the token goes to the endpoint's own host only (a redirect elsewhere drops it: client.c)
  if self.token and M.origin(url) == self.origin then h["Authorization"] = "Bearer " .. self.token end
  return h
end

-- Hang up a running t, keeping what its response said so far.
local function hang_up(t, err)
  t.status, t.headers = t:response()
  t:close()
  t.error = t.error or err
end

-- Run t until it is done; one that receives nothing for stall_s seconds is hung up.
function Session:finish(t)
  while self.cl.live[t] do
    self.cl:run(50)
    if self.cl.live[t] then
      if t.abort then
        hang_up(t, t.abort)
      elseif core.now_ms() - (t.last_byte_ms or t.t_start) > self.stall_s * 1000 then
        hang_up(t, string.format("no data for %g s", self.stall_s))
      end
    end
  end
end

-- The message of a failed request: what it means for the repo (or file), and the URL.
function Session:http_failure(t, url, file)
  local what = self.repo .. (file and (": " .. file) or "")
  if t.status == 0 or t.status == nil then
    fail("%s: cannot reach %s: %s", what, url, self:scrub(t.error or "no response"))
  end
  local h = t.headers or {}
  local code = h["x-error-code"]
  local server = h["x-error-message"]
  if not server then
    local body = json.decode(t.body or "")
    server = type(body) == "table" and type(body.error) == "string" and body.error or nil
  end
  local why
  if t.status == 401 then
    why = self.token and "the token was refused (HF_TOKEN)"
      or code == "RepoNotFound" and "repository not found, or private: it needs a token: set HF_TOKEN"
      or "the repository needs a token (private or gated, or it does not exist): set HF_TOKEN"
  elseif t.status == 403 then
    why = self.token and "no access with this token (a gated repository: accept its conditions on its page; "
      .. "or the token lacks read access)" or "access refused (a gated repository?): set HF_TOKEN"
  elseif t.status == 404 then
    why = code == "RevisionNotFound" and string.format("revision '%s' not found", self.revision)
      or code == "RepoNotFound" and "repository not found"
      or code == "EntryNotFound" and "file not found in the repository"
      or file and "not found" or "repository or revision not found"
  elseif t.status == 429 then
    why = "too many requests: the endpoint limits this client, try again later"
  else
    why = string.format("the server answered %d", t.status)
  end
  if server and #server > 300 then server = server:sub(1, 300) .. "..." end
  fail("%s: %s (GET %s: %d%s)", what, why, url, t.status, server and ("; the server says: " .. self:scrub(server)) or "")
end

-- The next page of a listing from its Link header, or nil.
local function next_link(link, base)
  for target, params in (link or ""):gmatch("<([^>]*)>([^,]*)") do
    if params:find('rel%s*=%s*"?next"?') then
      if target:find("^https?://") then return target end
      return M.origin(base) .. (target:sub(1, 1) == "/" and "" or "/") .. target
    end
  end
end

-- The repository's files: { path, size, sha256 (LFS) }, sorted by path.
function Session:list()
  local url = self.endpoint .. "/api/models/" .. self.repo .. "/tree/" .. quote(self.revision) .. "?recursive=true"
  local files, seen = {}, {}
  while url do
    if seen[url] then fail("%s: the listing's pages go round in a circle (%s)", self.repo, url) end
    seen[url] = true
    local t = self.cl:get(url, self:headers(url), { timeout_ms = 300000 })
    self:finish(t)
    if t.error or t.status ~= 200 then self:http_failure(t, url) end
    local entries, err = json.decode(t.body, "the listing")
    if type(entries) ~= "table" or (next(entries) ~= nil and entries[1] == nil) then
      fail("%s: %s is not a listing of files: %s", self.repo, url, err or "a JSON array was expected")
    end
    for _, e in ipairs(entries) do
      if type(e) ~= "table" then fail("%s: the listing holds a %s where a file was expected", self.repo, type(e)) end
      if e.type == "file" then
        if not safe_path(e.path) then fail("%s: the listing names a file outside the repository: %q", self.repo, tostring(e.path)) end
        if e.path:find("%.incomplete$") then
          fail("%s: the repository's file %s clashes with pull's temporary names (*.incomplete)", self.repo, e.path)
        end
        local f = { path = e.path, size = e.size }
        if type(e.lfs) == "table" then
          f.sha256 = type(e.lfs.oid) == "string" and e.lfs.oid:lower() or nil
          f.size = e.lfs.size or e.size
          if not (f.sha256 and f.sha256:match("^%x+$") and #f.sha256 == 64) then
            fail("%s: %s: the listing's lfs.oid is not a sha256: %s", self.repo, e.path, tostring(e.lfs.oid))
          end
        end
        if type(f.size) ~= "number" or f.size < 0 or f.size ~= math.floor(f.size) then
          fail("%s: %s: the listing gives no size", self.repo, e.path)
        end
        files[#files + 1] = f
      end
    end
    url = next_link(t.headers.link, self.endpoint)
  end
  table.sort(files, function(a, b) return a.path < b.path end)
  return files
end

-- Where the file at path of the repository is downloaded from (the Hub redirects to its CDN).
function Session:resolve_url(path)
  return self.endpoint .. "/" .. self.repo .. "/resolve/" .. quote(self.revision) .. "/" .. quote(path, "/")
end

return M
