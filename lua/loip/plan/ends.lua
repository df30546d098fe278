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
--                       -- (a multiple of 16), each chunk's logits computed as it lands: the
--                       -- logits are the resident head's, concatenated by row. Two buffers of
--                       -- head_rows rows: the next chunk is read while this one computes (one
--                       -- buffer when a chunk holds the table: M.head_buffers)
--
--   head_shares = { r1, ..., rN }  -- the head cut across devices by vocabulary rows: device i
--                       -- computes the logits of rows [r1 + ... + r(i-1), ... + ri) (0: none),
--                       -- its share in memory, or read head_rows at a time when head_rows is
--                       -- set; the last device (the final norm's) normalises the step's rows
--                       -- and sends them round the ring (LOGITS: to device 1, ..., N-1 and back),
--                       -- each device adding its share's logits, then samples as before. Each
--                       -- logit is one row's dot product: the one device's, bit for bit.
--
-- A tied model's one table serves both: it is in memory on a device that needs it whole (the
-- head resident, or the embedding resident on a device that also runs the head), else read.
-- The buffers count in the device's "slots"; what stays resident in its "weights".
local M = {}

M.CACHE_ROWS = 64              -- embedding rows kept by default
M.CHUNK_BYTES = 2 * 1024 * 1024 -- about what a head's read brings by default (two such buffers)

local function align(n) return math.ceil(n / 4096) * 4096 end

-- Bytes of one row of the [vocab, dim] table (the head's tensor; the embedding's is the same).
function M.row_bytes(sizes)
  return (sizes.vocab or 0) > 0 and sizes.head_bytes / sizes.vocab or 0
end

-- What stays resident of head.bin when the head's table is not (read by chunks, or cut): the
-- final norm, i.e. head.bin less an untied head's table (a tied head.bin holds only the norm).
local function norm_bytes(sizes)
  return sizes.tied and sizes.head_file_bytes or math.max(0, sizes.head_file_bytes - align(sizes.head_bytes))
end

-- The ends of plan p as a part keeps them: { embed_rows, head_rows } or nil (both resident).
function M.of(p)
  if p.embed_rows or p.head_rows or p.head_shares then
    return { embed_rows = p.embed_rows, head_rows = p.head_rows, head_shares = p.head_shares }
  end
  return nil
end

-- Device i's vocabulary rows under head_shares (a list of counts): first (0-based), count.
function M.share_of(shares, i)
  local first = 0
  for k = 1, i - 1 do first = first + (shares[k] or 0) end
  return first, shares[i] or 0
end

-- Shares of the vocabulary V for N devices: equal (weights nil) or in proportion to weights,
-- in whole rows, the remainder to the last.
function M.shares(V, N, weights)
  local out, sum, given = {}, 0, 0
  for i = 1, N do sum = sum + (weights and weights[i] or 1) end
  for i = 1, N - 1 do
    out[i] = math.floor(V * (weights and weights[i] or 1) / sum)
    given = given + out[i]
  end
  out[N] = V - given
  return out
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

-- The buffers a head read by chunks of `chunk` rows keeps (runtime/exec/rows.c): two, the next
-- chunk read while this one computes, or one when a chunk holds the table (read ahead from one
-- step to the next alone).
function M.head_buffers(sizes, chunk)
  return chunk < (sizes.vocab or 0) and 2 or 1
end

-- The rows a share of count vocabulary rows read by chunks reads at once (rows of row bytes):
-- head_rows, or about M.CHUNK_BYTES, at most the share rounded up to 16.
function M.share_chunk(row, head_rows, count)
  local chunk = head_rows or (row > 0 and math.max(16, math.floor(M.CHUNK_BYTES / row / 16) * 16) or 16)
  return math.min(chunk, math.ceil(count / 16) * 16)
end

-- The rows a head read by chunks reads at once on a device that keeps it so (how: M.how's):
-- its share's chunk when the head is cut, else the whole head's.
local function head_chunk(sizes, ends, how)
  if how.cut then return M.share_chunk(M.row_bytes(sizes), ends.head_rows, how.share) end
  return M.chunk_rows(sizes, ends.head_rows)
end

-- How a device holding the first end (first) and/or the last (last) keeps them under ends
-- (a tied model: tied true): { embed = "memory" | "rows" | nil, head = "memory" | "rows" | nil,
-- table = true when the embedding's table is in memory whole }.
function M.how(ends, first, last, tied, share)
  local er, hr = ends and ends.embed_rows, ends and ends.head_rows
  if ends and ends.head_shares then
    -- the head cut: this device's share (share rows) in memory or by chunks, the final norm on the
    -- last; the embedding's table whole only for the first device's embedding
    local whole = (first and not er) or false
    -- (a tied table read by rows for the embedding is read by chunks for the head too: one binding)
    local head = (share or 0) > 0 and (((hr or (tied and first and er)) and not (tied and whole)) and "rows" or "memory") or nil
    return { embed = first and (whole and "memory" or "rows") or nil, head = head, table = whole, cut = true,
      norm = last, share = share or 0 }
  end
  -- the embedding's table whole: the first device's, unless read by rows; a tied head's, unless read by chunks
  local whole = (first and not er) or (last and tied and not hr) or false
  return { embed = first and (whole and "memory" or "rows") or nil,
    head = last and ((hr and not whole) and "rows" or "memory") or nil, table = whole }
end

-- What a device holding the first end (first) and/or the last (last) needs for them under ends:
-- weights (bytes resident), buffers (the row cache and the head's chunk buffers), and which of the
-- tables it keeps: { embed = "memory" | "rows" | nil, head = "memory" | "rows" | nil }.
function M.memory(sizes, ends, first, last, share)
  local how = M.how(ends, first, last, sizes.tied, share)
  local row = M.row_bytes(sizes)
  local w, buf = 0, 0
  if how.table then w = w + sizes.embed_file_bytes end
  if how.embed == "rows" then buf = buf + ends.embed_rows * row end
  if how.cut then
    -- the final norm on the last device (head.bin less an untied head's table); the share's rows
    -- in memory (none more for a tied table held whole) or its chunk; the LOGITS message's room
    -- in the device's receive buffer (4th: activations, in a cluster)
    if last then w = w + norm_bytes(sizes) end
    if how.head == "memory" and not (sizes.tied and how.table) then w = w + align(how.share * row) end
    if how.head == "rows" then
      local chunk = head_chunk(sizes, ends, how)
      buf = buf + M.head_buffers(sizes, chunk) * chunk * row
    end
    return w, buf, how, math.max(0, (sizes.share_bytes or 0) - (sizes.payload_bytes or 0))
  end
  if how.head == "rows" then
    local chunk = head_chunk(sizes, ends, how)
    buf = buf + M.head_buffers(sizes, chunk) * chunk * row
    -- (the final norm stays: head.bin less an untied head's table)
    w = w + norm_bytes(sizes)
  elseif how.head then
    w = w + sizes.head_file_bytes
  end
  return w, buf, how, 0
end

-- The head's table bytes a device reads every step under ends (0: in memory).
function M.head_read_bytes(sizes, ends, first, last, share)
  local _, _, how = M.memory(sizes, ends, first, last, share)
  if how.cut then return how.head == "rows" and how.share * M.row_bytes(sizes) or 0 end
  return how.head == "rows" and sizes.head_bytes or 0
end

-- ms the ends' reads take on device i's step (part: loip.plan.device_part's, or a part the
-- schedulers build): the embedding's rows for the step's tokens (rows, default the problem's
-- micro-batch; priced as misses), the head's table read chunk by chunk (M.pipelined: each
-- chunk's logits computed while the next is read), and the head's chunks. read(d, bytes, reads):
-- how a read is priced (loip.plan.space.read_ms, which the cost model and the simulator pass).
-- Returns embed, head, chunks.
function M.read_ms(problem, i, part, read, rows)
  local ends = part.ends or problem.ends
  local share = ends and ends.head_shares and ends.head_shares[i]
  if not ends or not (part.first or part.last or (share or 0) > 0) then return 0, 0, 0 end
  local sizes, d = problem.model, problem.devices[i]
  local _, _, how = M.memory(sizes, ends, part.first, part.last, share)
  local embed, head, chunks = 0, 0, 0
  if how.embed == "rows" then
    rows = rows or problem.micro_batch or 1
    embed = read(d, rows * M.row_bytes(sizes), rows)
  end
  if how.head == "rows" then
    local rows_read = how.cut and how.share or sizes.vocab
    chunks = math.ceil(rows_read / head_chunk(sizes, ends, how))
    head = read(d, rows_read * M.row_bytes(sizes), chunks)
  end
  return embed, head, chunks
end

-- ms of a head of `compute` ms whose table takes `read` ms to read in `chunks` chunks, each
-- chunk's logits computed as it lands while the next is read (runtime/exec/rows.c reads one
-- chunk ahead): the first chunk's read, then for each next chunk the slower of its read and the
-- compute of the one before, and the last chunk's compute. In memory (read 0): the compute.
-- (The next step's first chunk is read ahead too, but the disk is then the offloaded blocks':
-- not counted.)
function M.pipelined(compute, read, chunks)
  if read <= 0 then return compute end
  chunks = math.max(1, chunks or 1)
  local r, c = read / chunks, compute / chunks
  return r + (chunks - 1) * math.max(r, c) + c
end

-- The fraction of the head's compute device i does under ends (the last device: all of it,
-- unless the head is cut).
function M.head_fraction(sizes, ends, i, N)
  if ends and ends.head_shares then return (ends.head_shares[i] or 0) / math.max(1, sizes.vocab or 1) end
  return i == N and 1 or 0
end

-- ms of the head on a step of rows output rows under plan p's ends, from the last device's stage
-- end to its sampling: uncut, the last device's head (head_ms(N)) and its read; cut, each share
-- computed in ring order (the last device's, then devices 1..N-1) with its read, and the N hops
-- of the LOGITS message (hop(i, bytes): over the link out of device i; the rows normalised and
-- 4 bytes per row per vocabulary row, and the step's table). head_ms(i): device i's whole head.
function M.step_ms(problem, p, rows, head_ms, hop, read)
  local ends = M.of(p) or problem.ends
  local N, sizes = #p.devices, problem.model
  local function part_of(i) return { first = i == 1, last = i == N, ends = ends } end
  if not (ends and ends.head_shares) or N == 1 then
    local _, head_read, chunks = M.read_ms(problem, N, part_of(N), read)
    return M.pipelined(head_ms(N), head_read, chunks)
  end
  rows = math.max(1, rows or 1)
  local bytes = (sizes.header_bytes or 0) + rows * ((sizes.hidden_bytes or 0) + 4 * (sizes.vocab or 0))
  local t = 0
  for k = 0, N - 1 do
    local i = (N - 1 + k) % N + 1 -- N, 1, 2, ..., N-1
    local _, head_read, chunks = M.read_ms(problem, i, part_of(i), read)
    t = t + M.pipelined(head_ms(i) * M.head_fraction(sizes, ends, i, N), head_read, chunks) + hop(i, bytes)
  end
  return t
end

-- The other ways to keep the ends that loip.policy.plan schedules under budgets, beside both in
-- memory: the embedding on disk, then the head too. (A problem whose `ends` is set, {} for both
-- in memory, is planned with those alone.)
function M.fallbacks(sizes)
  if (sizes.vocab or 0) <= 0 or M.row_bytes(sizes) <= 0 then return {} end
  return { { embed_rows = M.CACHE_ROWS }, { embed_rows = M.CACHE_ROWS, head_rows = M.chunk_rows(sizes) } }
end

-- The head cut across a problem's devices that loip.policy.plan schedules under budgets besides
-- the fallbacks (the embedding on disk each time): equal shares and shares by budget, each in
-- memory and read by chunks. None for one device.
function M.cuts(sizes, devices)
  local N = #devices
  if N < 2 or (sizes.vocab or 0) <= 0 or M.row_bytes(sizes) <= 0 then return {} end
  local budgets, all = {}, true
  for i, d in ipairs(devices) do
    budgets[i] = d.budget or 0
    all = all and budgets[i] > 0
  end
  local ways, seen = { M.shares(sizes.vocab, N) }, {}
  if all then ways[2] = M.shares(sizes.vocab, N, budgets) end
  local out = {}
  for _, shares in ipairs(ways) do
    local key = table.concat(shares, ",")
    if not seen[key] then
      seen[key] = true
      out[#out + 1] = { embed_rows = M.CACHE_ROWS, head_shares = shares }
      out[#out + 1] = { embed_rows = M.CACHE_ROWS, head_shares = shares, head_rows = M.chunk_rows(sizes) }
    end
  end
  return out
end

-- A plan's ends settings checked: a message naming the field, or nil.
function M.check(p, bad)
  if p.embed_rows ~= nil and (type(p.embed_rows) ~= "number" or p.embed_rows < 1 or p.embed_rows ~= math.floor(p.embed_rows)) then
    return bad("embed_rows must be a positive integer (embedding rows kept in memory; the table stays on disk)")
  end
  if p.head_rows ~= nil and (type(p.head_rows) ~= "number" or p.head_rows < 16 or p.head_rows % 16 ~= 0) then
    return bad("head_rows must be a positive multiple of 16 (vocabulary rows the head reads at once)")
  end
  if p.head_shares ~= nil then
    local hs, N = p.head_shares, type(p.devices) == "table" and #p.devices or 0
    if type(hs) ~= "table" or #hs ~= N then
      return bad("head_shares must be a list of %d counts (vocabulary rows of the head per device)", N)
    end
    for k, v in pairs(hs) do
      if type(k) ~= "number" or k < 1 or k > N or type(v) ~= "number" or v < 0 or v ~= math.floor(v) then
        return bad("head_shares[%s] must be a count >= 0 (vocabulary rows of the head on device %s)", tostring(k), tostring(k))
      end
    end
  end
end

-- A plan's head_shares checked against the vocabulary V (their sum): a message, or nil.
function M.check_vocab(p, V, bad)
  if p.head_shares == nil or not V or V <= 0 then return nil end
  local sum = 0
  for _, v in ipairs(p.head_shares) do sum = sum + v end
  if sum ~= V then
    return bad("head_shares must sum to the vocabulary (%d rows), not %d", V, sum)
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
  if hN.cut then
    local row, at = M.row_bytes(sizes), 0
    lines[#lines + 1] = string.format("  head: cut by vocabulary rows across the devices (the final norm on device %d, "
      .. "the logits gathered round the ring)", N)
    for i = 1, N do
      local _, _, h = M.memory(sizes, ends, i == 1, i == N, p.head_shares[i])
      local n = p.head_shares[i]
      local where = n == 0 and "none" or h.head == "rows" and string.format("on disk, read every step %d rows (%s) a read",
        M.share_chunk(row, p.head_rows, n), fmt(M.share_chunk(row, p.head_rows, n) * row))
        or (sizes.tied and h.table) and "in memory (the embedding's table)" or string.format("in memory (%s)", fmt(n * row))
      lines[#lines + 1] = string.format("    device %d: %d rows [%d, %d), %s", i, n, at, at + n, where)
      at = at + n
    end
  elseif hN.head == "rows" then
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
