/* Output files that appear whole or not at all: written under a temporary name, fsynced and
 * renamed on commit, removed when abandoned. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"

struct loip_writer {
    int fd;
    char *path;
    char *tmp;
};

LOIP_API int loip_writer_open(const char *path, loip_writer **out) {
    *out = NULL;
    loip_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path) + 32;
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n))) {
        if (w) free(w->path);
        free(w);
        return loip_fail(LOIP_ENOMEM, "%s: out of memory", path);
    }
    snprintf(w->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(w->tmp);
        free(w->path);
        free(w);
        return loip_fail(-e, "%s: cannot create: %s", path, strerror(e));
    }
    *out = w;
    return LOIP_OK;
}

LOIP_API int loip_writer_write(loip_writer *w, const void *data, uint64_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t k = write(w->fd, p, chunk);
        if (k < 0) {
            if (errno == EINTR) continue;
            return loip_fail(errno == ENOSPC ? LOIP_ENOSPC : -errno, "%s: write failed: %s",
                             w->path, strerror(errno));
        }
        p += k;
        len -= (uint64_t)k;
    }
    return LOIP_OK;
}

LOIP_API int loip_writer_commit(loip_writer *w) {
    if (w->fd < 0) return loip_fail(LOIP_ESTATE, "%s: already committed", w->path);
    if (fsync(w->fd) != 0 || close(w->fd) != 0) {
        int e = errno;
        w->fd = -1;
        unlink(w->tmp);
        return loip_fail(-e, "%s: cannot flush: %s", w->path, strerror(e));
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        int e = errno;
        unlink(w->tmp);
        return loip_fail(-e, "%s: cannot rename into place: %s", w->path, strerror(e));
    }
    return LOIP_OK;
}

LOIP_API void loip_writer_free(loip_writer *w) {
    if (!w) return;
    if (w->fd >= 0) { /* abandoned: leave nothing behind */
        close(w->fd);
        unlink(w->tmp);
    }
    free(w->tmp);
    free(w->path);
    free(w);
}
