/* rows.c — a [rows, cols] weight table that stays on disk (see loip.h, loip_rows_*).
 *
 * The token embedding and the output head of a large vocabulary are a big share of a small
 * model (Gemma 3 1B: ~30% of its bytes) yet a token needs one row of the embedding, and the
 * head is read once per step. Bound with loip_model_bind_rows instead of a tensor, the
 * embedding is read a row at a time as tokens need it (a cache of the rows used last, least
 * recently used out), and the head a chunk of vocabulary rows at a time into one buffer, each
 * chunk's logits computed as it lands (loip_rows_head). Both read the store's file with pread:
 * a row is 2–8 KiB at a random offset, and the head's chunks are read in order, a few MiB each.
 *
 * Exactness: a chunk's logits are those rows' dot products, computed by the same kernels on
 * row ranges that start at multiples of 16 (chunk_rows is one), as the thread pool splits a
 * resident head: the logits are the resident head's, bit for bit, concatenated by row. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "core/pool.h"
#include "exec/ops.h"
#include "memory/budget.h"

struct loip_rows {
    char path[512];
    int fd;
    uint64_t offset;       /* the table's first byte in the file */
    int32_t dtype;
    int64_t rows, cols;
    size_t row_bytes;
    int32_t cache_rows;    /* rows the cache keeps (0: none) */
    int32_t *cache_ids;    /* (cache_rows) the id each cache entry holds, -1: empty */
    uint64_t *cache_used;  /* (cache_rows) when each was last used (a counter) */
    uint8_t *cache;        /* (cache_rows, row_bytes) */
    uint64_t clock;
    int32_t chunk_rows;    /* rows the head reads at once (0: no head from this table) */
    uint8_t *chunk;        /* (chunk_rows, row_bytes) */
    loip_budget *budget;
    uint64_t charged;      /* to budget's "slots" */
    uint64_t reads, bytes_read, hits;
};

LOIP_API void loip_rows_free(loip_rows *r) {
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    free(r->cache_ids);
    free(r->cache_used);
    loip_aligned_free(r->cache);
    loip_aligned_free(r->chunk);
    if (r->budget) {
        loip_budget_release(r->budget, "slots", r->charged);
        loip_budget_free(r->budget);
    }
    free(r);
}

LOIP_API int loip_rows_new(const char *path, uint64_t offset, int32_t dtype, int64_t rows, int64_t cols,
                           int32_t cache_rows, int32_t chunk_rows, loip_budget *budget, loip_rows **out) {
    if (!out) return loip_fail(LOIP_EINVAL, "rows: out is NULL");
    *out = NULL;
    if (!path) return loip_fail(LOIP_EINVAL, "rows: path is NULL");
    if (dtype != LOIP_F32 && dtype != LOIP_BF16 && dtype != LOIP_F16)
        return loip_fail(LOIP_ESHAPE, "rows %s: dtype %d not supported (F32, BF16, F16)", path, dtype);
    if (rows <= 0 || cols <= 0 || cache_rows < 0 || chunk_rows < 0 || chunk_rows % 16)
        return loip_fail(LOIP_EINVAL, "rows %s: a [%lld, %lld] table, %d rows cached, %d a read (chunks: a multiple "
                         "of 16 rows)", path, (long long)rows, (long long)cols, cache_rows, chunk_rows);
    loip_rows *r = calloc(1, sizeof *r);
    if (!r) return loip_fail(LOIP_ENOMEM, "rows: out of memory");
    r->fd = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->offset = offset, r->dtype = dtype, r->rows = rows, r->cols = cols;
    r->row_bytes = (size_t)cols * (size_t)loip_dtype_size(dtype);
    if (chunk_rows > rows) chunk_rows = (int32_t)((rows + 15) / 16 * 16);
    r->cache_rows = cache_rows, r->chunk_rows = chunk_rows;
    uint64_t bytes = ((uint64_t)cache_rows + (uint64_t)chunk_rows) * r->row_bytes;
    if (budget) {
        int rc = loip_budget_charge(budget, "slots", bytes);
        if (rc) {
            free(r);
            return rc;
        }
        r->budget = loip_budget_retain(budget), r->charged = bytes;
    }
    if ((r->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        int e = errno;
        loip_rows_free(r);
        return loip_fail(-e, "rows: open %s: %s", path, strerror(e));
    }
    if (cache_rows > 0) {
        r->cache_ids = malloc((size_t)cache_rows * sizeof *r->cache_ids);
        r->cache_used = calloc((size_t)cache_rows, sizeof *r->cache_used);
        r->cache = loip_aligned_alloc((size_t)cache_rows * r->row_bytes);
        if (!r->cache_ids || !r->cache_used || !r->cache) {
            loip_rows_free(r);
            return loip_fail(LOIP_ENOMEM, "rows: out of memory");
        }
        for (int32_t i = 0; i < cache_rows; i++) r->cache_ids[i] = -1;
    }
    if (chunk_rows > 0 && !(r->chunk = loip_aligned_alloc((size_t)chunk_rows * r->row_bytes))) {
        loip_rows_free(r);
        return loip_fail(LOIP_ENOMEM, "rows: out of memory");
    }
    *out = r;
    return LOIP_OK;
}

/* bytes of the file at offset into dst, whole. */
static int read_at(loip_rows *r, void *dst, size_t bytes, uint64_t offset) {
    size_t got = 0;
    while (got < bytes) {
        ssize_t k = pread(r->fd, (uint8_t *)dst + got, bytes - got, (off_t)(offset + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return loip_fail(-errno, "rows: read %s at %llu: %s", r->path, (unsigned long long)(offset + got),
                                    strerror(errno));
        if (k == 0)
            return loip_fail(LOIP_EIO, "rows: %s ends before byte %llu (the table's rows run past it)", r->path,
                             (unsigned long long)(offset + bytes));
        got += (size_t)k;
    }
    r->reads++, r->bytes_read += bytes;
    return LOIP_OK;
}

LOIP_API int loip_rows_get(loip_rows *r, int32_t id, float *out) {
    if (!r || !out) return loip_fail(LOIP_EINVAL, "rows get: rows and out are required");
    if (id < 0 || id >= r->rows)
        return loip_fail(LOIP_EINVAL, "embed: token id %d out of range [0, %lld)", id, (long long)r->rows);
    if (r->cache_rows <= 0)
        return loip_fail(LOIP_ESTATE, "embed: the table %s is bound without a cache to read its rows into", r->path);
    int32_t at = -1, old = 0;
    for (int32_t i = 0; i < r->cache_rows && at < 0; i++) {
        if (r->cache_ids[i] == id) at = i;
        else if (r->cache_used[i] < r->cache_used[old]) old = i; /* (empty entries: 0, taken first) */
    }
    if (at >= 0) {
        r->hits++;
    } else {
        at = old;
        r->cache_ids[at] = -1;
        int rc = read_at(r, r->cache + (size_t)at * r->row_bytes, r->row_bytes,
                         r->offset + (uint64_t)id * r->row_bytes);
        if (rc) return rc;
        r->cache_ids[at] = id;
    }
    r->cache_used[at] = ++r->clock;
    return loip_convert(out, LOIP_F32, r->cache + (size_t)at * r->row_bytes, r->dtype, (uint64_t)r->cols);
}

int loip_rows_head_range(loip_rows *r, loip_pool *pool, const float *x, int32_t n, int64_t first, int64_t last,
                         float *logits);

int loip_rows_head(loip_rows *r, loip_pool *pool, const float *x, int32_t n, float *logits) {
    return loip_rows_head_range(r, pool, x, n, 0, r->rows, logits);
}

int loip_rows_head_range(loip_rows *r, loip_pool *pool, const float *x, int32_t n, int64_t first, int64_t last,
                         float *logits) {
    if (r->chunk_rows <= 0)
        return loip_fail(LOIP_ESTATE, "head: the table %s is bound without a chunk to read it through", r->path);
    if (first < 0 || last > r->rows || first > last)
        return loip_fail(LOIP_EINVAL, "head: rows [%lld, %lld) of a table of %lld", (long long)first, (long long)last,
                         (long long)r->rows);
    for (int64_t r0 = first; r0 < last; r0 += r->chunk_rows) {
        int64_t k = last - r0 < r->chunk_rows ? last - r0 : r->chunk_rows;
        int rc = read_at(r, r->chunk, (size_t)k * r->row_bytes, r->offset + (uint64_t)r0 * r->row_bytes);
        if (rc) return rc;
        /* the next chunk (after the last: the first, for the next step) asked of the disk now,
         * to arrive while this one computes (a hint: the read above is what counts) */
        int64_t next = r0 + k < last ? r0 + k : first;
        posix_fadvise(r->fd, (off_t)(r->offset + (uint64_t)next * r->row_bytes),
                      (off_t)((size_t)r->chunk_rows * r->row_bytes), POSIX_FADV_WILLNEED);
        /* rows [r0, r0 + k) of every token's logits: the chunk's own products, in place */
        loip_linear_job job[2] = {{.W = r->chunk, .dtype = r->dtype, .x = x, .y = logits + r0, .n = (size_t)n,
                                   .rows = (size_t)k, .cols = (size_t)r->cols, .ldy = (size_t)r->rows}, {0}};
        loip_linear_run(pool, job);
    }
    return LOIP_OK;
}

int loip_rows_fits(const loip_rows *r, int64_t rows, int64_t cols) { return r->rows == rows && r->cols == cols; }
int32_t loip_rows_dtype(const loip_rows *r) { return r->dtype; }

LOIP_API uint64_t loip_rows_bytes_read(const loip_rows *r) { return r ? r->bytes_read : 0; }
LOIP_API uint64_t loip_rows_reads(const loip_rows *r) { return r ? r->reads : 0; }
LOIP_API uint64_t loip_rows_hits(const loip_rows *r) { return r ? r->hits : 0; }
