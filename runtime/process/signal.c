/* Shutdown signals for long-running commands (loip worker): SIGINT and SIGTERM set a flag that
 * the command's loop reads between receives (a blocking receive returns on the signal), so that
 * it can close its sockets and free its buffers instead of dying mid-write. */
#include <signal.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

static volatile sig_atomic_t received;

static void on_signal(int sig) { received = sig; }

LOIP_API int loip_signal_watch(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0)
        return loip_fail(LOIP_EINVAL, "cannot install the SIGINT/SIGTERM handlers");
    received = 0;
    return LOIP_OK;
}

LOIP_API int loip_signal_received(void) { return received; }

LOIP_API void loip_sleep_ms(int32_t ms) {
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && !received) {}
}
