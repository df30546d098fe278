/* The loip command: LuaJIT with the runtime linked in and lua/ on its path. Everything the
 * command does is decided in Lua (lua/loip/cli.lua); this file only hosts the interpreter and
 * gives the REPL line editing (libedit) when it was found at build time. */
#include <errno.h>
#include <limits.h>
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
 * prefix; the build tree's generated modules (cdef.lua, build_config.lua) come first. */
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

/* line = loip_readline(prompt) -> string or nil at end of input */
static int l_readline(lua_State *L) {
    const char *prompt = luaL_optstring(L, 1, "> ");
#ifdef LOIP_HAVE_LIBEDIT
    char *line = readline(prompt);
    if (!line) return 0;
    lua_pushstring(L, line);
    free(line);
    return 1;
#else
    char buf[65536];
    fputs(prompt, stdout);
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) return 0;
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
    /* The runtime is linked in: Lua finds it through ffi.C (this reference also keeps the
     * linker from dropping the library as unneeded). */
    lua_pushinteger(L, loip_abi_version());
    lua_setglobal(L, "LOIP_LINKED_ABI");
    lua_pushboolean(L, isatty(0) && isatty(1));
    lua_setglobal(L, "LOIP_INTERACTIVE");

    lua_pushcfunction(L, traceback);
    lua_getglobal(L, "require");
    lua_pushstring(L, "loip.tools.cli");
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
