-- A request as its caller holds it (loip.engine.request.batcher's submit returns one): its
-- tokens as they come, stepping the batch as needed, its end, its cancellation and its timings.
-- The batcher owns its state (r.batcher, r.state, r.pending/head/tail, r.token_ids, the t_* times).
local M = {}

local Request = {}
Request.__index = Request
M.Request = Request

-- The next id of r (stepping the batch as needed), or nil when it is done. Raises the error
-- that ended it.
function Request:next()
  local b = self.batcher
  while self.head > self.tail do
    if self.state == "done" then
      if self.finish_reason == "error" then error(self.error, 0) end
      return nil
    end
    if not b:step() and self.state == "queued" then
      error("batcher: request " .. self.id .. " is queued but nothing runs (its KV can never be reserved)", 0)
    end
  end
  local id = self.pending[self.head]
  self.pending[self.head] = nil
  self.head = self.head + 1
  return id
end

function Request:tokens() return function() return self:next() end end

-- Run to the end (stepping the batch); the request.
function Request:wait()
  while self.state ~= "done" do self.batcher:step() end
  if self.finish_reason == "error" then error(self.error, 0) end
  return self
end

-- Stop it (at once when queued; its slot and KV are freed now, its tokens in flight dropped).
function Request:cancel()
  if self.state == "done" then return end
  if self.state == "queued" then
    for i, x in ipairs(self.batcher.queue) do
      if x == self then table.remove(self.batcher.queue, i) break end
    end
  end
  self.batcher:retire(self, "cancelled")
end

-- Timings: ttft_ms (submit to first token), queue_ms, decode_ms_per_token.
function Request:timings()
  local t = { queue_ms = (self.t_admit or self.t_done or self.batcher.now()) - self.t_submit }
  if self.t_first then t.ttft_ms = self.t_first - self.t_submit end
  if self.t_first and self.t_last and #self.token_ids > 1 then
    t.decode_ms_per_token = (self.t_last - self.t_first) / (#self.token_ids - 1)
  end
  return t
end

return M
