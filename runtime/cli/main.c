/* The loip command: LuaJIT with the runtime linked in and lua/ on its path. Everything the
 * command does is decided in Lua (lua/loip/cli/init.lua); this file only hosts the interpreter and
 * gives the REPL line editing (libedit) when it was found at build time. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "loip.h"

#ifdef LOIP_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* lua/ from LOIP_LUA_DIR, else the source tree this binary was built from, else the install
 * prefix; the build tree's generated modules (cdef.lua, constants.lua, build_config.lua) come first. */
static void set_paths(lua_State *L) {
    const char *env = getenv("LOIP_LUA_DIR");
    const char *src = env && *env ? env : (is_dir(LOIP_SOURCE_LUA_DIR) ? LOIP_SOURCE_LUA_DIR : LOIP_INSTALL_LUA_DIR);
    const char *gen = is_dir(LOIP_BUILD_LUA_DIR) ? LOIP_BUILD_LUA_DIR : LOIP_INSTALL_LUA_DIR;
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    const char *old = lua_tostring(L, -1);
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s/?.lua;%s/?/init.lua;%s", gen, gen, src, src, old ? old : "");
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
    lua_pushstring(L, src);
    lua_setglobal(L, "LOIP_LUA_DIR");
}

/* Ctrl-C in the REPL, while loip_repl_signals(true) holds: at the prompt it cancels the line
 * being typed (the read returns, interrupted, and loip_readline gives false); while a chunk runs
 * (loip_repl_call) a hook set from the handler raises "interrupted" in the chunk at its next Lua
 * instruction, as LuaJIT's own lua.c does (lua_sethook is safe in a signal handler). Compiled
 * code (a JIT trace looping without leaving it) and a C call do not see the hook until they
 * return to the interpreter: a second Ctrl-C says so, a third ends loip (SIGINT's default
 * action). */
static lua_State *repl_L;
static volatile sig_atomic_t repl_interrupted; /* at the prompt */
static volatile sig_atomic_t repl_running;     /* a chunk runs */
static volatile sig_atomic_t repl_pending;     /* Ctrl-Cs the running chunk has not seen yet */
static struct sigaction repl_old_sigint;

static void repl_stop(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    repl_pending = 0;
    luaL_error(L, "interrupted (Ctrl-C)");
}

static void repl_on_sigint(int sig) {
    if (!repl_running) {
        repl_interrupted = 1;
        return;
    }
    if (repl_pending >= 2) {
        static const char bye[] = "\nloip: interrupted three times; leaving\n";
        ssize_t w = write(2, bye, sizeof bye - 1);
        (void)w;
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    if (repl_pending == 1) {
        static const char msg[] = "\nloip: the chunk has not reached a Lua instruction yet (a compiled loop or a C call); "
                                  "Ctrl-C once more leaves loip\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
    }
    repl_pending++;
    lua_sethook(repl_L, repl_stop, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* loip_repl_signals(on): take Ctrl-C (SIGINT) over while the REPL runs (again before each
 * prompt: a chunk may have installed a handler of its own, as `loip serve`'s loop does), or
 * give it back */
static int l_repl_signals(lua_State *L) {
    static int held;
    if (lua_toboolean(L, 1)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = repl_on_sigint; /* no SA_RESTART: a read at the prompt returns */
        sigemptyset(&sa.sa_mask);
        repl_L = L;
        sigaction(SIGINT, &sa, held ? NULL : &repl_old_sigint);
        held = 1;
    } else if (held) {
        sigaction(SIGINT, &repl_old_sigint, NULL);
        held = 0;
    }
    return 0;
}

/* ok, ... = loip_repl_call(handler, f): xpcall(f, handler) with Ctrl-C interrupting f */
static int l_repl_call(lua_State *L) {
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    repl_pending = 0;
    repl_running = 1;
    int rc = lua_pcall(L, 0, LUA_MULTRET, 1);
    repl_running = 0;
    if (repl_pending) { /* a Ctrl-C after the chunk's last instruction: its hook must not fire later */
        lua_sethook(L, NULL, 0, 0);
        repl_pending = 0;
    }
    lua_pushboolean(L, rc == 0);
    lua_replace(L, 1); /* (the handler's slot) */
    return lua_gettop(L);
}

/* line = loip_readline(prompt) -> string, false when Ctrl-C cancelled the line, or nil at the
 * end of input */
static int l_readline(lua_State *L) {
    const char *prompt = luaL_optstring(L, 1, "> ");
    repl_interrupted = 0;
#ifdef LOIP_HAVE_LIBEDIT
    char *line = readline(prompt);
    if (!line) {
        if (!repl_interrupted) return 0;
        lua_pushboolean(L, 0);
        return 1;
    }
    lua_pushstring(L, line);
    free(line);
    return 1;
#else
    char buf[65536];
    fputs(prompt, stdout);
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) {
        if (!repl_interrupted) return 0;
        clearerr(stdin);
        lua_pushboolean(L, 0);
        return 1;
    }
    size_t n = strlen(buf);
    if (n && buf[n - 1] == '\n') buf[--n] = '\0';
    lua_pushlstring(L, buf, n);
    return 1;
#endif
}

/* loip_history(op, arg): op "add" a line, "load"/"save" a file. */
static int l_history(lua_State *L) {
#ifdef LOIP_HAVE_LIBEDIT
    const char *op = luaL_checkstring(L, 1), *a = luaL_checkstring(L, 2);
    if (!strcmp(op, "add")) add_history(a);
    else if (!strcmp(op, "load")) read_history(a);
    else if (!strcmp(op, "save")) write_history(a);
#endif
    return 0;
}

static int traceback(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) msg = "(error object is not a string)";
    luaL_traceback(L, L, msg, 1);
    return 1;
}

int main(int argc, char **argv) {
    lua_State *L = luaL_newstate();
    if (!L) {
        fprintf(stderr, "loip: cannot create the Lua state (out of memory)\n");
        return 1;
    }
    luaL_openlibs(L);
    set_paths(L);
    lua_register(L, "loip_readline", l_readline);
    lua_register(L, "loip_history", l_history);
    lua_register(L, "loip_repl_signals", l_repl_signals);
    lua_register(L, "loip_repl_call", l_repl_call);
    /* The runtime is linked in: Lua finds it through ffi.C (this reference also keeps the
     * linker from dropping the library as unneeded). */
    lua_pushinteger(L, loip_abi_version());
    lua_setglobal(L, "LOIP_LINKED_ABI");
    lua_pushboolean(L, isatty(0) && isatty(1));
    lua_setglobal(L, "LOIP_INTERACTIVE");

    lua_pushcfunction(L, traceback);
    lua_getglobal(L, "require");
    lua_pushstring(L, "loip.cli");
    if (lua_pcall(L, 1, 1, 1) != 0) {
        fprintf(stderr, "loip: %s\n", lua_tostring(L, -1));
        lua_close(L);
        return 1;
    }
    lua_getfield(L, -1, "main");
    lua_newtable(L);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i);
    }
    int status = 1;
    if (lua_pcall(L, 1, 1, 1) != 0) {
        fprintf(stderr, "loip: internal error: %s\n", lua_tostring(L, -1));
    } else {
        status = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
    }
    fflush(stdout);
    lua_close(L);
    return status;
}
