/* Output files that appear whole or not at all: written under a temporary name, fsynced and
 * renamed on commit, removed when abandoned. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
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

LOIP_API int loip_disk_available(const char *path, uint64_t *bytes) {
    struct statvfs st;
    if (statvfs(path, &st) != 0) return loip_fail(-errno, "%s: %s", path, strerror(errno));
    *bytes = (uint64_t)st.f_bavail * (uint64_t)st.f_frsize;
    return LOIP_OK;
}

/* A profile measures the disk, not the page cache: a file just written (by loip slice) sits in
 * it, and a buffered read of it would time memory. Written pages are flushed first: the kernel
 * drops only clean ones. */
LOIP_API int loip_file_drop_cache(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loip_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    fdatasync(fd);
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (rc != 0) return loip_fail(-rc, "%s: cannot drop its cached pages: %s", path, strerror(rc));
    return LOIP_OK;
}

/* Weights are read once into memory that keeps them: through the page cache they would sit in
 * memory twice until the kernel reclaims the cache, which a memory-starved device cannot
 * afford. O_DIRECT needs 4 KiB-aligned offsets, lengths and memory (slice stores are laid out
 * so); where any of those or the filesystem (tmpfs before Linux 6.6) refuses, the read is
 * buffered instead. */
LOIP_API int loip_file_read(const char *path, uint64_t offset, uint64_t len, void *dst,
                            int32_t flags, int32_t *direct) {
    const uint64_t align = 4096, chunk = 64u << 20;
    int use_direct = (flags & LOIP_READ_DIRECT) && offset % align == 0 && len % align == 0 &&
                     (uintptr_t)dst % align == 0;
    int fd = -1;
    if (use_direct) {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd < 0 && errno != EINVAL) return loip_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
        if (fd < 0) use_direct = 0;
    }
    if (fd < 0) fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loip_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    uint8_t *p = dst;
    uint64_t done = 0;
    while (done < len) {
        uint64_t want = len - done < chunk ? len - done : chunk;
        ssize_t k = pread(fd, p + done, (size_t)want, (off_t)(offset + done));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL && use_direct && done == 0) {
            /* some filesystems accept O_DIRECT at open and refuse it at read time */
            close(fd);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) return loip_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
            use_direct = 0;
            continue;
        }
        if (k < 0) {
            int e = errno;
            close(fd);
            return loip_fail(-e, "%s: read failed at byte %llu: %s", path,
                             (unsigned long long)(offset + done), strerror(e));
        }
        if (k == 0) {
            close(fd);
            return loip_fail(LOIP_EIO, "%s: file ends at byte %llu, before the %llu bytes asked for",
                             path, (unsigned long long)(offset + done),
                             (unsigned long long)(offset + len));
        }
        done += (uint64_t)k;
    }
    close(fd);
    if (direct) *direct = use_direct;
    return LOIP_OK;
}
