/* Child processes that die with their parent: a cluster's local workers must not outlive the
 * head, however it ends (an error, a signal, kill -9), and that leave the terminal's signals to
 * it (a process group of their own). The child asks the kernel for SIGTERM when
 * the thread that forked it exits (PR_SET_PDEATHSIG), before it executes anything, and checks
 * that its parent did not already go in between. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"

extern char **environ;

LOIP_API int loip_spawn(const char *const *argv, const char *const *env, const char *out_path,
                        const char *err_path, int32_t *pid_out) {
    *pid_out = -1;
    if (!argv || !argv[0]) return loip_fail(LOIP_EINVAL, "spawn: no program");
    /* everything the child needs is prepared before the fork (only async-signal-safe calls after) */
    int fd_out = out_path ? open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    int fd_err = err_path ? open(err_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
    if ((out_path && fd_out < 0) || (err_path && fd_err < 0)) {
        int e = errno;
        if (fd_out >= 0) close(fd_out);
        if (fd_err >= 0) close(fd_err);
        return loip_fail(LOIP_EIO, "spawn: cannot open %s: %s", fd_out < 0 && out_path ? out_path : err_path, strerror(e));
    }
    size_t n_env = 0, n_extra = 0;
    while (environ[n_env]) n_env++;
    while (env && env[n_extra]) n_extra++;
    char **envp = calloc(n_env + n_extra + 1, sizeof *envp);
    if (!envp) {
        if (fd_out >= 0) close(fd_out);
        if (fd_err >= 0) close(fd_err);
        return loip_fail(LOIP_ENOMEM, "spawn: out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < n_extra; i++) envp[k++] = (char *)env[i];
    for (size_t i = 0; i < n_env; i++) { /* the given variables replace the inherited ones */
        const char *eq = strchr(environ[i], '=');
        size_t len = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
        int shadowed = 0;
        for (size_t j = 0; j < n_extra && !shadowed; j++) shadowed = strncmp(env[j], environ[i], len) == 0;
        if (!shadowed) envp[k++] = environ[i];
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
        /* a process group of its own: a Ctrl-C typed at the head's terminal is the head's to
         * handle (the REPL keeps its cluster, `loip serve` stops it in order), not every
         * worker's; the child still ends with the head (the death signal above) */
        setpgid(0, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        if (fd_out >= 0) dup2(fd_out, 1);
        if (fd_err >= 0) dup2(fd_err, 2);
        execve(argv[0], (char *const *)argv, envp);
        _exit(127);
    }
    int e = errno;
    free(envp);
    if (fd_out >= 0) close(fd_out);
    if (fd_err >= 0) close(fd_err);
    if (pid < 0) return loip_fail(LOIP_EIO, "spawn: fork: %s", strerror(e));
    *pid_out = (int32_t)pid;
    return LOIP_OK;
}

LOIP_API int loip_reap(int32_t pid) {
    int status;
    pid_t r = waitpid((pid_t)pid, &status, WNOHANG);
    if (r == 0) return 0;  /* still running */
    if (r < 0) return -1;  /* not our child (or already reaped) */
    return 1;
}
