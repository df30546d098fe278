-- A request's own speculative decoding (docs/serving.md, "Drafts per request"): the API's loip
-- extension fields `draft` (a policy as `--draft` takes it: "none", "ngram", "ngram:n=4,tree=on",
-- "self:tree=on,width=3") and `draft_tokens` (a fixed k, as `--draft-tokens`), on the OpenAI
-- endpoints and Anthropic's /v1/messages alike. The server chooses what requests may choose
-- (`loip serve --draft-per-request LIST`, default none: any such field is refused naming it):
-- `none` (no drafts), a policy that loads nothing (`ngram`), and the server's own policy with
-- settings that keep the draft it has loaded (a self draft's tree, width, levels: the policy's
-- `per_request`); a draft model the server has not loaded is refused. A request's drafts are a
-- Draft:variant of the server's (loip.engine.request.draft): exact as any draft is.
local json = require "loip.text.json"
local policy = require "loip.policy"

local M = {}

local function null(v) return v == nil or v == json.null end

-- The fields' shapes from body into s (s.draft: a string; s.draft_tokens: an integer >= 0): nil,
-- or the field named and what is wrong.
function M.parse(body, s)
  if not null(body.draft) then
    if type(body.draft) ~= "string" or body.draft == "" then
      return "draft", "'draft' must be a string naming a draft policy (\"none\", \"ngram\", \"NAME:KEY=VALUE,...\"), not "
        .. json.encode(body.draft)
    end
    s.draft = body.draft
  end
  local k = body.draft_tokens
  if not null(k) then
    if type(k) ~= "number" or k ~= math.floor(k) or k < 0 then
      return "draft_tokens", "'draft_tokens' must be an integer >= 0, not " .. json.encode(k)
    end
    s.draft_tokens = k
  end
end

-- What the server allows (from --draft-per-request LIST, comma-separated; d: the batcher's
-- Draft, or nil without --draft): { names = { name = true }, list (for messages), server (its
-- policy's label) }, or raises naming the flag. nil: nothing allowed.
function M.allowance(list, d)
  if list == nil or list == "" or list == false then return nil end
  if not d then error("--draft-per-request: needs --draft (the server's own draft; `--draft ngram` loads nothing)", 0) end
  local a = { names = {}, list = {}, server = M.label(d.policy) }
  for name in (list .. ","):gmatch("([^,]*),") do
    name = name:match("^%s*(.-)%s*$")
    if name == "" then error("--draft-per-request: an empty name in '" .. list .. "'", 0) end
    if name ~= "none" then
      local ok, p = pcall(policy.load, "draft", name)
      if not ok then error("--draft-per-request: " .. tostring(p), 0) end
      if p.module ~= d.policy.module and p.module.open then
        error(string.format("--draft-per-request: %s loads a draft of its own; the server has loaded %s (a request may choose "
          .. "the server's own policy, policies that load nothing such as ngram, and none)", name, a.server), 0)
      end
    end
    a.names[name], a.list[#a.list + 1] = true, name
  end
  return a
end

-- A loaded policy as --draft names it: NAME:KEY=VALUE,... (its given settings, sorted).
function M.label(p)
  local keys = {}
  for k in pairs(p.given or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. tostring(p.given[k]) end
  return (p.name or "?") .. (#parts > 0 and ":" .. table.concat(parts, ",") or "")
end

local function allows(a)
  return string.format("this server (--draft %s) lets a request choose: %s", a.server, table.concat(a.list, ", "))
end

-- The drafts of a request whose spec has draft / draft_tokens: nil (the server's), false (none),
-- or a Draft:variant; or nil and { param, message } when the server does not allow it.
function M.resolve(spec, a, d)
  if spec.draft == nil and spec.draft_tokens == nil then return nil end
  local param = spec.draft ~= nil and "draft" or "draft_tokens"
  if not a then
    return nil, { param = param, message = string.format("'%s': this server lets no request choose its drafts "
      .. "(start it with --draft-per-request LIST to allow some)", param) }
  end
  if spec.draft == "none" then
    if not a.names.none then return nil, { param = "draft", message = "'draft': none is not allowed; " .. allows(a) } end
    return false
  end
  local name, given = spec.draft or d.policy.name, nil
  if spec.draft then
    local ok, n, g = pcall(policy.parse, spec.draft)
    if not ok then return nil, { param = "draft", message = "'draft': " .. tostring(n) } end
    name, given = n, g
  end
  if not a.names[name] then
    return nil, { param = "draft", message = string.format("'draft': %s is not allowed; %s", name, allows(a)) }
  end
  local k = spec.draft_tokens
  if k and k > d.max then
    return nil, { param = "draft_tokens", message = string.format("'draft_tokens' is %d; this server verifies at most %d drafts "
      .. "a request a step (--draft-tokens)", k, d.max) }
  end
  local base = d.policy
  local ok, p
  if policy.load("draft", name).module == base.module then
    -- the server's policy: settings that open nothing new change; the rest must be the server's
    local keep = base.module.per_request or {}
    for key, v in pairs(given or {}) do
      if base.module.open and not keep[key] and tostring(v) ~= tostring(base.params[key]) then
        local names = {}
        for n in pairs(keep) do names[#names + 1] = n end
        table.sort(names)
        return nil, { param = "draft", message = string.format("'draft': %s=%s needs a draft the server has not loaded (it runs %s); "
          .. "a request may change %s", key, tostring(v), a.server, #names > 0 and table.concat(names, ", ") or "none of its settings") }
      end
    end
    ok, p = pcall(policy.load, "draft", base, given or {})
  else
    ok, p = pcall(policy.load, "draft", spec.draft)
  end
  if not ok then return nil, { param = "draft", message = "'draft': " .. tostring(p) } end
  local vok, v = pcall(d.variant, d, p, { tokens = k })
  if not vok then return nil, { param = "draft", message = "'draft': " .. tostring(v) } end
  return v
end

return M
