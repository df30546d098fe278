/* CPU wake-up latency (Linux PM QoS): while a request is held, the kernel keeps every CPU out
 * of idle states slower to leave than the requested latency. A hop of the pipeline wakes three
 * sleeping threads (the sender's I/O thread, the receiver's I/O thread, the receiving device),
 * and on a board or VM whose idle CPUs sleep deeply each wake-up costs tens of microseconds
 * (measured on this project's VM: 0.18 ms of transport per hop idle, 0.12 ms with 0 us held).
 * The request lasts while the file stays open: it ends with the process, however it ends. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"

#define QOS_FILE "/dev/cpu_dma_latency"

static int held_fd = -1;
static int32_t held_us = -1;

LOIP_API int loip_cpu_wake_latency(int32_t us) {
    if (us < 0) {
        if (held_fd >= 0) close(held_fd);
        held_fd = -1, held_us = -1;
        return LOIP_OK;
    }
    int fd = open(QOS_FILE, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return loip_fail(e == EACCES || e == EPERM ? LOIP_EINVAL : LOIP_EIO,
                         "cannot hold a CPU wake-up latency of %d us: %s: %s%s", us, QOS_FILE, strerror(e),
                         e == EACCES || e == EPERM ? " (needs root or write access to it)" : "");
    }
    if (write(fd, &us, sizeof us) != (ssize_t)sizeof us) {
        int e = errno;
        close(fd);
        return loip_fail(LOIP_EIO, "cannot hold a CPU wake-up latency of %d us: writing %s: %s", us, QOS_FILE,
                         strerror(e));
    }
    if (held_fd >= 0) close(held_fd); /* the new request replaces the old one */
    held_fd = fd, held_us = us;
    return LOIP_OK;
}

LOIP_API int32_t loip_cpu_wake_latency_held(void) { return held_us; }
