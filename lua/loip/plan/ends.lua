-- The ends of a model in a plan (loip.plan.ends, re-exported by loip.plan): where the token
-- embedding and the output head stay, what they take of a device's memory and what they read.
--
-- By default both are in memory: device 1 holds the embedding (embed.bin), device N the head
-- (head.bin: the final norm and, untied, lm_head; tied, the embedding too). A large vocabulary
-- makes them a big share of a small device (151,936 x 2048 in BF16: 594 MiB each), so a plan
-- may keep them on disk instead:
--
--   embed_rows = 64     -- the embedding stays in its file: each token's row is read as it is
--                       -- needed, the last 64 rows used kept (a cache of embed_rows rows)
--   head_rows = 1024    -- the head is read every step, head_rows vocabulary rows at a time
--                       -- into one buffer (a multiple of 16), each chunk's logits computed as it
--                       -- lands: the logits are the resident head's, concatenated by row
--
-- A tied model's one table serves both: it is in memory on a device that needs it whole (the
-- head resident, or the embedding resident on a device that also runs the head), else read.
-- The buffers count in the device's "slots"; what stays resident in its "weights".
local M = {}

M.CACHE_ROWS = 64              -- embedding rows kept by default
M.CHUNK_BYTES = 4 * 1024 * 1024 -- about what a head's read brings by default

local function align(n) return math.ceil(n / 4096) * 4096 end

-- Bytes of one row of the [vocab, dim] table (the head's tensor; the embedding's is the same).
function M.row_bytes(sizes)
  return (sizes.vocab or 0) > 0 and sizes.head_bytes / sizes.vocab or 0
end

-- The ends of plan p as a part keeps them: { embed_rows, head_rows } or nil (both resident).
function M.of(p)
  if p.embed_rows or p.head_rows then return { embed_rows = p.embed_rows, head_rows = p.head_rows } end
  return nil
end

-- The head's rows per read: `rows` (a plan's head_rows) up to the table's, or by default a chunk
-- of about M.CHUNK_BYTES and at most a sixteenth of the table, a multiple of 16.
function M.chunk_rows(sizes, rows)
  local most = math.ceil((sizes.vocab or 0) / 16) * 16
  if rows then return math.min(rows, most) end
  local row = M.row_bytes(sizes)
  if row <= 0 then return 16 end
  local bytes = math.min(M.CHUNK_BYTES, sizes.head_bytes / 16)
  return math.min(math.max(16, math.floor(bytes / row / 16) * 16), most)
end

-- How a device holding the first end (first) and/or the last (last) keeps them under ends
-- (a tied model: tied true): { embed = "memory" | "rows" | nil, head = "memory" | "rows" | nil,
-- table = true when the embedding's table is in memory whole }.
function M.how(ends, first, last, tied)
  local er, hr = ends and ends.embed_rows, ends and ends.head_rows
  -- the embedding's table whole: the first device's, unless read by rows; a tied head's, unless read by chunks
  local whole = (first and not er) or (last and tied and not hr) or false
  return { embed = first and (whole and "memory" or "rows") or nil,
    head = last and ((hr and not whole) and "rows" or "memory") or nil, table = whole }
end

-- What a device holding the first end (first) and/or the last (last) needs for them under ends:
-- weights (bytes resident), buffers (the row cache and the head's chunk), and which of the
-- tables it keeps: { embed = "memory" | "rows" | nil, head = "memory" | "rows" | nil }.
function M.memory(sizes, ends, first, last)
  local how = M.how(ends, first, last, sizes.tied)
  local row = M.row_bytes(sizes)
  local w, buf = 0, 0
  if how.table then w = w + sizes.embed_file_bytes end
  if how.embed == "rows" then buf = buf + ends.embed_rows * row end
  if how.head == "rows" then
    buf = buf + M.chunk_rows(sizes, ends.head_rows) * row
    -- (the final norm stays: head.bin less an untied head's table)
    w = w + (sizes.tied and sizes.head_file_bytes or math.max(0, sizes.head_file_bytes - align(sizes.head_bytes)))
  elseif how.head then
    w = w + sizes.head_file_bytes
  end
  return w, buf, how
end

-- The head's table bytes a device reads every step under ends (0: in memory).
function M.head_read_bytes(sizes, ends, first, last)
  local _, _, how = M.memory(sizes, ends, first, last)
  return how.head == "rows" and sizes.head_bytes or 0
end

-- ms the ends' reads add to device i's step (part: loip.plan.device_part's, or a part the
-- schedulers build): the head's table read chunk by chunk (not overlapped: each chunk's
-- logits wait for it), and the embedding's rows for the step's tokens (rows, default the
-- problem's micro-batch; priced as misses). read(d, bytes, reads): how a read is priced
-- (loip.plan.space.read_ms, which the cost model and the simulator pass).
function M.read_ms(problem, i, part, read, rows)
  local ends = part.ends or problem.ends
  if not ends or not (part.first or part.last) then return 0, 0 end
  local sizes, d = problem.model, problem.devices[i]
  local _, _, how = M.memory(sizes, ends, part.first, part.last)
  local embed, head = 0, 0
  if how.embed == "rows" then
    rows = rows or problem.micro_batch or 1
    embed = read(d, rows * M.row_bytes(sizes), rows)
  end
  if how.head == "rows" then
    local chunk = M.chunk_rows(sizes, ends.head_rows)
    head = read(d, sizes.head_bytes, math.ceil(sizes.vocab / chunk))
  end
  return embed, head
end

-- The other ways to keep the ends that loip.policy.plan schedules under budgets, beside both in
-- memory: the embedding on disk, then the head too. (A problem whose `ends` is set, {} for both
-- in memory, is planned with those alone.)
function M.fallbacks(sizes)
  if (sizes.vocab or 0) <= 0 or M.row_bytes(sizes) <= 0 then return {} end
  return { { embed_rows = M.CACHE_ROWS }, { embed_rows = M.CACHE_ROWS, head_rows = M.chunk_rows(sizes) } }
end

-- A plan's ends settings checked: a message naming the field, or nil.
function M.check(p, bad)
  if p.embed_rows ~= nil and (type(p.embed_rows) ~= "number" or p.embed_rows < 1 or p.embed_rows ~= math.floor(p.embed_rows)) then
    return bad("embed_rows must be a positive integer (embedding rows kept in memory; the table stays on disk)")
  end
  if p.head_rows ~= nil and (type(p.head_rows) ~= "number" or p.head_rows < 16 or p.head_rows % 16 ~= 0) then
    return bad("head_rows must be a positive multiple of 16 (vocabulary rows the head reads at once)")
  end
end

-- Lines for a plan's description: where the embedding and the head went.
function M.describe(p, sizes, fmt)
  local N = #p.devices
  local ends = M.of(p)
  local _, _, h1 = M.memory(sizes, ends, true, N == 1)
  local _, _, hN = M.memory(sizes, ends, N == 1, true)
  local lines = {}
  if h1.embed == "rows" then
    lines[#lines + 1] = string.format("  embedding: on disk, read by token on device 1 (%d rows cached, %s)", p.embed_rows,
      fmt(p.embed_rows * M.row_bytes(sizes)))
  else
    lines[#lines + 1] = string.format("  embedding: in memory on device 1 (%s)", fmt(sizes.embed_file_bytes))
  end
  if hN.head == "rows" then
    local chunk = M.chunk_rows(sizes, p.head_rows)
    lines[#lines + 1] = string.format("  head: on disk, read every step on device %d, %d vocabulary rows (%s) a read, %s per step",
      N, chunk, fmt(chunk * M.row_bytes(sizes)), fmt(sizes.head_bytes))
  else
    lines[#lines + 1] = string.format("  head: in memory on device %d (%s%s)", N, fmt(sizes.head_file_bytes),
      sizes.tied and ", tied: the embedding's table" or "")
  end
  return lines
end

return M
