-- The REPL at a terminal (issue 24): Ctrl-C cancels the line being typed or interrupts the
-- running chunk, and the REPL goes on with its variables; Ctrl-D leaves. The REPL runs in a
-- pseudo-terminal (util-linux `script`), typed at through a FIFO: Ctrl-C is the byte 0x03, which
-- the terminal turns into SIGINT for the REPL, as a keyboard does. Each step waits for what the
-- REPL printed (or echoed) before the next, so that a keystroke is not sent before the REPL
-- reads.
local T = require "spec.support"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local have_script = os.execute("command -v script >/dev/null 2>&1") == 0

-- The driver: send STRING types it (printf's escapes: \003 is Ctrl-C, \004 Ctrl-D); want TEXT
-- waits (up to 60 s) until the terminal shows it; prompts N until it shows the N-th prompt (the
-- line editor is reading, its terminal mode set: what is typed before may be flushed by Ctrl-C).
local PRELUDE = [[
set -u
cd "$1"
mkfifo in
script -qfec "exec env HOME=$1 $2" /dev/null <in >out 2>&1 &
pid=$!
exec 3>in
send() { printf "$1" >&3; }
fail() { echo "$1" >&2; exec 3>&-; kill $pid 2>/dev/null; exit 3; }
want() {
  for _ in $(seq 600); do grep -qF -- "$1" out && return 0; sleep 0.1; done
  fail "the REPL never showed: $1"
}
prompts() {
  for _ in $(seq 600); do [ "$(grep -oF 'loip> ' out | wc -l)" -ge "$1" ] && return 0; sleep 0.1; done
  fail "the REPL never showed its prompt $1 times"
}
leave() {
  send '\004'
  for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  exec 3>&-
  if kill -0 $pid 2>/dev/null; then echo "the REPL did not leave on Ctrl-D" >&2; kill $pid; exit 4; fi
  wait $pid
}
]]

local DRIVER = PRELUDE .. [[
prompts 1
send 'x = 4242\n'
send 'print("re" .. "ady")\n'
want 'ready'
prompts 3
# a line typed, then Ctrl-C: dropped
send 'x = 17'
want 'x = 17'
send '\003'
prompts 4
send 'print(x + 1)\n'
want '4243'
prompts 5
# a statement left unfinished, then Ctrl-C: dropped with its lines
send 'for i = 1, 2 do\n'
want '  ... '
send '\003'
prompts 6
send 'print(x + 2)\n'
want '4244'
prompts 7
# a chunk that loops: interrupted, the REPL goes on
send 'print("spin" .. "ning") while true do end\n'
want 'spinning'
send '\003'
want 'interrupted (Ctrl-C)'
prompts 8
send 'print(x + 3)\n'
want '4245'
prompts 9
# a function defined here, looping (LuaJIT would compile the loop)
send 'function f() local n = 0 while true do n = n + 1 end end\n'
prompts 10
send 'print("spin" .. "again") f()\n'
want 'spinagain'
sleep 0.5
send '\003'
prompts 11
send 'print(x + 4)\n'
want '4246'
prompts 12
# Ctrl-D leaves
leave
]]

-- A local cluster started from the REPL: its workers are not the terminal's to interrupt (they
-- were, and died: the cluster started them again on the next request, its state gone).
local CLUSTER_DRIVER = PRELUDE .. [[
prompts 1
send "c = loip.cluster.start_local { store = '$3', devices = 2, threads = 1 }\n"
send 'p = c:plan { context = 64 }\n'
send 'p1, p2 = c.devices[1].pid, c.devices[2].pid print("started " .. "workers")\n'
want 'started workers'
prompts 4
send '\003'
prompts 5
send 'for _ in c:generate("Once upon a time", { max_tokens = 4, sampler = { temperature = 0 } }) do end\n'
prompts 6
send 'print("same " .. "workers: " .. tostring(c.devices[1].pid == p1 and c.devices[2].pid == p2))\n'
want 'same workers: '
prompts 7
send 'c:close()\n'
prompts 8
leave
]]

-- Runs a driver in a fresh directory with the loip binary (and $3: arg); returns what the
-- terminal showed, after checking that the driver got through.
local function drive(script, arg)
  local dir = T.tmpdir()
  T.write(dir .. "/drive.sh", script)
  local loip = T.loip
  if loip:sub(1, 1) ~= "/" then
    local h = io.popen("pwd")
    loip = h:read("*l") .. "/" .. loip
    h:close()
  end
  local rc, _, err = T.run(string.format("timeout 300 bash %s/drive.sh %s %s %s", q(dir), q(dir), q(loip), q(arg or "")))
  local shown = T.exists(dir .. "/out") and T.read(dir .. "/out") or ""
  assert.are.equal(0, rc, err .. "\n--- the terminal ---\n" .. shown)
  return shown
end

describe("the REPL at a terminal", function()
  after_each(function() T.cleanup() collectgarbage() collectgarbage() end)
  teardown(function() T.drop_stores() end)

  it("cancels a line or interrupts a chunk on Ctrl-C, keeping its variables, and leaves on Ctrl-D", function()
    if not have_script then return pending("needs util-linux `script` (a pseudo-terminal to type Ctrl-C into)") end
    local dir = T.tmpdir()
    T.write(dir .. "/drive.sh", DRIVER)
    local shown = drive(DRIVER)
    -- the interrupted chunks said so, twice, and nothing asked to leave
    local _, n = shown:gsub("interrupted %(Ctrl%-C%)", "")
    assert.are.equal(2, n, shown)
    assert.is_nil(shown:find("leaving", 1, true), shown)
  end)

  it("keeps a local cluster's workers through a Ctrl-C at the prompt", function()
    if not have_script then return pending("needs util-linux `script` (a pseudo-terminal to type Ctrl-C into)") end
    local store = T.slice_store(T.root .. "/models/stories260K", "s260k")
    local shown = drive(CLUSTER_DRIVER, store)
    assert.truthy(shown:find("same workers: true", 1, true), shown)
  end)
end)
