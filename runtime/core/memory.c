/* Aligned allocation and read-only file mappings. */
#include <errno.h>
#include <fcntl.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

void *loip_aligned_alloc(size_t bytes) {
    void *p = NULL;
    const size_t huge = 2u << 20;
    if (bytes == 0) bytes = 64;
    /* Large arrays (weights, KV cache) stream through the TLB: align them to a huge page and
     * ask for huge pages. Page-sized ones are page-aligned so that O_DIRECT can read into them. */
    size_t align = bytes >= huge ? huge : bytes >= 4096 ? 4096 : 64;
    if (posix_memalign(&p, align, bytes) != 0) return NULL;
    if (align == huge) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

void loip_aligned_free(void *p) { free(p); }

LOIP_API uint64_t loip_heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    struct mallinfo2 mi = mallinfo2();
    return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#else
    return 0;
#endif
}

struct loip_mapping {
    uint8_t *data;
    uint64_t size;
};

LOIP_API int loip_mapping_open(const char *path, loip_mapping **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loip_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return loip_fail(-e, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return loip_fail(LOIP_EINVAL, "%s: not a regular file", path);
    }
    loip_mapping *m = calloc(1, sizeof *m);
    if (!m) {
        close(fd);
        return loip_fail(LOIP_ENOMEM, "%s: out of memory", path);
    }
    m->size = (uint64_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(m);
            return loip_fail(-e, "%s: cannot map: %s", path, strerror(e));
        }
        m->data = p;
    }
    close(fd);
    *out = m;
    return LOIP_OK;
}

LOIP_API void loip_mapping_free(loip_mapping *m) {
    if (!m) return;
    if (m->data) munmap(m->data, m->size);
    free(m);
}

LOIP_API const uint8_t *loip_mapping_data(const loip_mapping *m) { return m->data; }
LOIP_API uint64_t loip_mapping_size(const loip_mapping *m) { return m->size; }

LOIP_API int loip_mapping_prefetch(const loip_mapping *m, uint64_t offset, uint64_t len) {
    if (offset > m->size || len > m->size - offset)
        return loip_fail(LOIP_ERANGE, "mapping prefetch: range past the end of the file");
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = offset & ~(page - 1);
    if (len && madvise(m->data + start, len + (offset - start), MADV_WILLNEED) != 0)
        return loip_fail(-errno, "mapping prefetch: %s", strerror(errno));
    return LOIP_OK;
}
