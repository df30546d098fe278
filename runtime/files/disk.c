/* Files as the disk sees them: whole-range reads that skip the page cache where they can
 * (O_DIRECT), a file's pages dropped from the cache, and the space left for writing. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/core.h"

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
