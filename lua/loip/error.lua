-- The error value: a kind (what went wrong, for code to branch on), a message (what a person
-- reads: tostring(e), byte for byte what the text error said) and the fields its kind names.
-- Code that decides by an error asks its kind (M.is), never its text.
--
--   local err = require "loip.error"
--   error(err.new("too_long", "the prompt has 9000 tokens; ...", { param = "prompt" }), 0)
--   local ok, e = pcall(f)
--   if err.is(e, "too_long") then ... e.param ... end
--
-- Kinds, and the fields each names:
--   out_of_memory  a memory budget or the machine could not hold an allocation (the runtime's
--                  LOIP_ENOMEM); code
--   overloaded, too_long, invalid
--                  a request refused (loip.engine.request.batcher): an HTTP server answers 429,
--                  400, 400; param: the request's field to blame ("prompt", "max_tokens", "n")
--   usage          a command line that cannot run (a command's flags or words); exit status 2
--   device_lost    a control exchange found a cluster's device gone; lost: the device
--   replanned      a device was lost and the engine planned again over the others: the batcher
--                  resumes every request from its tokens
--   hub            a model hub's request failed (loip.model.hub)
--   json           text that is not JSON (loip.text.json_ordered, loip.text.template.json's
--                  decoders, which return it as nil, message)
--
-- "context: " .. e (or e .. " more") is an error of e's kind and fields with the longer
-- message, so a wrapper that names where a failure happened keeps what it was.
local constants = require "loip.constants"

local M = {}

local Error = {}
Error.__index = Error
Error.__tostring = function(e) return e.message end

-- kind (a string), message (a string), fields (a table or nil: copied into the value; it may
-- not name kind or message).
function M.new(kind, message, fields)
  if type(kind) ~= "string" then error("loip.error.new: kind must be a string", 2) end
  local e = {}
  for k, v in pairs(fields or {}) do e[k] = v end
  e.kind, e.message = kind, tostring(message)
  return setmetatable(e, Error)
end

-- Raise an error of kind (at no position: the message alone, as error(msg, 0)).
function M.raise(kind, message, fields) error(M.new(kind, message, fields), 0) end

-- Whether e is an error value (of kind, when given).
function M.is(e, kind)
  return getmetatable(e) == Error and (kind == nil or e.kind == kind)
end

-- e's message: an error value's, or e itself (a string raised by error(msg)) as text.
function M.message(e)
  if getmetatable(e) == Error then return e.message end
  return tostring(e)
end

Error.__concat = function(a, b)
  local e = getmetatable(a) == Error and a or b
  return M.new(e.kind, tostring(a) .. tostring(b), e)
end

-- The runtime's codes that something decides by, as kinds (loip.core: a C call that failed
-- with one of them gives an error value; any other failure, its message).
local code_kinds = { [constants.ENOMEM] = "out_of_memory" }

-- A C call's failure (rc, a negative LOIP_E* code) with its message: an error value of the
-- code's kind, or the message itself for a code no kind names.
function M.from_code(rc, message)
  local kind = code_kinds[rc]
  if not kind then return message end
  return M.new(kind, message, { code = rc })
end

return M
