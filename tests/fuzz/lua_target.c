/* libFuzzer over a parser written in Lua (tests/fuzz/lua/<what>.lua, named by
 * LOIP_FUZZ_LUA_HARNESS): the harness returns a function of the input bytes that runs the real
 * loip module on them. Coverage reaches libFuzzer through its extra counters: a line hook
 * hashes (chunk, line) pairs, consecutive ones as edges, into a counter array, so inputs that
 * reach new lines of the Lua code are kept and mutated further. The JIT is off (the hook sees
 * every line); a count hook bounds each input's work.
 *
 * The oracle: a parser answers bad input with a clear error (nil and a message, or an error
 * string); an error that the Lua VM raised inside loip's code (an index of nil, arithmetic on a
 * string, a bad argument to a library function, a stack overflow, an assertion) is a bug, and
 * the driver aborts, printing it, so libFuzzer keeps the input as a crash. */
#define _GNU_SOURCE
#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loip.h"

enum { COUNTERS = 1 << 16, COUNT_EVERY = 1000 };

/* libFuzzer reads every byte of this section as coverage (FuzzerExtraCounters). */
__attribute__((used, section("__libfuzzer_extra_counters"))) static uint8_t lua_counters[COUNTERS];

static lua_State *L;
static int harness_ref = LUA_NOREF, classify_ref = LUA_NOREF;
static uint32_t prev_loc;
static long ticks, tick_limit = 20000; /* x COUNT_EVERY VM instructions per input */
static int memfd = -1;

static void hook(lua_State *l, lua_Debug *ar) {
    if (ar->event == LUA_HOOKCOUNT) {
        if (++ticks > tick_limit) luaL_error(l, "fuzz: instruction budget spent");
        return;
    }
    if (!lua_getinfo(l, "S", ar)) return;
    /* the chunk's name is an interned string: its address names it for the whole run */
    uint32_t loc = (uint32_t)((uintptr_t)ar->source >> 4) * 2654435761u ^ (uint32_t)ar->currentline * 40503u;
    lua_counters[(loc ^ prev_loc) & (COUNTERS - 1)]++;
    prev_loc = loc >> 1;
}

/* path = loip_fuzz_file(bytes): the bytes in a memory file, as a path the parsers can open
 * (and map); the same file each time, rewritten. */
static int l_fuzz_file(lua_State *l) {
    size_t n;
    const char *data = luaL_checklstring(l, 1, &n);
    if (memfd < 0 && (memfd = memfd_create("loip-fuzz", 0)) < 0) return luaL_error(l, "memfd_create failed");
    if (ftruncate(memfd, 0) != 0 || (n && pwrite(memfd, data, n, 0) != (ssize_t)n)) return luaL_error(l, "memfd write failed");
    lua_pushfstring(l, "/proc/self/fd/%d", memfd);
    return 1;
}

/* The classifier: error value -> nil (clean) or the reason it is a bug. */
static const char CLASSIFY[] =
    "local internal = { 'attempt to ', 'bad argument', 'stack overflow', 'table index is ', \n"
    "  \"invalid key to 'next'\", 'string length overflow', 'assertion failed', 'loop in gettable',\n"
    "  'loop in settable', 'too many ', 'invalid option', 'malformed pattern', 'unfinished capture',\n"
    "  'invalid capture index', 'invalid pattern capture', 'wrong number of arguments',\n"
    "  'no integer representation', 'number expected', 'string expected', 'table expected' }\n"
    "return function(e)\n"
    "  if e == nil then return 'error with no value' end\n"
    "  if type(e) == 'table' and type(e.msg) == 'string' then e = e.msg end\n"
    "  if type(e) ~= 'string' then return 'an error that is not a message: ' .. tostring(e) end\n"
    "  if e:find('fuzz: instruction budget spent', 1, true) or e:find('not enough memory', 1, true) then return nil end\n"
    "  for _, p in ipairs(internal) do\n"
    "    if e:find('%.lua:%d+: ' .. p:gsub('%p', '%%%0')) or e:find('^' .. p:gsub('%p', '%%%0')) then return e end\n"
    "  end\n"
    "  return nil\n"
    "end\n";

static int traceback(lua_State *l) {
    const char *msg = lua_tostring(l, 1);
    if (msg) {
        luaL_traceback(l, l, msg, 1);
        return 1;
    }
    return 1; /* not a string: handed on as it is */
}

/* At exit the Lua state goes, and with it what its modules hold (lua-cjson's buffers), so
 * that LeakSanitizer reports only real leaks. */
static void close_lua(void) {
    if (L) lua_close(L);
    L = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    (void)loip_abi_version(); /* the runtime is linked in: Lua finds it through ffi.C */
    const char *limit = getenv("LOIP_FUZZ_TICKS");
    if (limit && atol(limit) > 0) tick_limit = atol(limit);
    L = luaL_newstate();
    luaL_openlibs(L);
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    lua_getglobal(L, "package");
    lua_pushstring(L, LOIP_BUILD_LUA_DIR "/?.lua;" LOIP_BUILD_LUA_DIR "/?/init.lua;" LOIP_SOURCE_LUA_DIR
                      "/?.lua;" LOIP_SOURCE_LUA_DIR "/?/init.lua;" LOIP_SOURCE_DIR "/?.lua");
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    lua_pushinteger(L, loip_abi_version());
    lua_setglobal(L, "LOIP_LINKED_ABI");
    lua_register(L, "loip_fuzz_file", l_fuzz_file);
    if (luaL_loadbuffer(L, CLASSIFY, sizeof CLASSIFY - 1, "=classify") || lua_pcall(L, 0, 1, 0)) {
        fprintf(stderr, "fuzz: classifier: %s\n", lua_tostring(L, -1));
        abort();
    }
    classify_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (luaL_loadfile(L, LOIP_FUZZ_LUA_HARNESS) || lua_pcall(L, 0, 1, 0) || !lua_isfunction(L, -1)) {
        fprintf(stderr, "fuzz: %s: %s\n", LOIP_FUZZ_LUA_HARNESS,
                lua_isstring(L, -1) ? lua_tostring(L, -1) : "does not return a function");
        abort();
    }
    harness_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    atexit(close_lua);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int top = lua_gettop(L);
    lua_pushcfunction(L, traceback);
    lua_rawgeti(L, LUA_REGISTRYINDEX, harness_ref);
    lua_pushlstring(L, (const char *)data, size);
    ticks = 0;
    prev_loc = 0;
    lua_sethook(L, hook, LUA_MASKLINE | LUA_MASKCOUNT, COUNT_EVERY);
    int rc = lua_pcall(L, 1, 0, top + 1);
    lua_sethook(L, NULL, 0, 0);
    if (rc != 0) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, classify_ref);
        lua_pushvalue(L, -2);
        if (lua_pcall(L, 1, 1, 0) != 0) {
            fprintf(stderr, "fuzz: the classifier failed: %s\n", lua_tostring(L, -1));
            abort();
        }
        if (!lua_isnil(L, -1)) {
            fprintf(stderr, "fuzz: a Lua error inside loip (a bug, not a clear error):\n%s\n", lua_tostring(L, -1));
            abort();
        }
    }
    lua_settop(L, top);
    /* the parsers' garbage (mappings, buffers) goes now, not when the heap is large */
    lua_gc(L, LUA_GCSTEP, 200);
    return 0;
}
