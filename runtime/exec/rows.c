/* rows.c — a [rows, cols] weight table that stays on disk (see loip.h, loip_rows_*).
 *
 * The token embedding and the output head of a large vocabulary are a big share of a small
 * model (Gemma 3 1B: ~30% of its bytes) yet a token needs one row of the embedding, and the
 * head is read once per step. Bound with loip_model_bind_rows instead of a tensor, the
 * embedding is read a row at a time as tokens need it (a cache of the rows used last, least
 * recently used out, read with pread: a row is 2–8 KiB at a random offset), and the head a
 * chunk of vocabulary rows at a time, each chunk's logits computed as it lands.
 *
 * The head's chunks are read ahead: two buffers, the next chunk's read in flight (io_uring)
 * while this one's logits are computed, and after a step's last chunk the next step's first
 * read into the buffer that frees, so that it lands while the layers before the head run. A
 * table read in one chunk keeps one buffer (read ahead across steps only). Without io_uring
 * (no ring at start) or with loip_rows_set_ahead(r, 0) each chunk is read when it is needed,
 * with a kernel read-ahead hint for the next (posix_fadvise). Reads go through the page cache
 * unless loip_rows_set_direct(r, 1): then those 4 KiB aligned go past it (O_DIRECT), as the
 * loader reads blocks, for a device whose memory cannot hold the table beside its budget.
 *
 * Exactness: a chunk's logits are those rows' dot products, computed by the same kernels on
 * row ranges that start at multiples of 16 (chunk_rows is one), as the thread pool splits a
 * resident head: the logits are the resident head's, bit for bit, concatenated by row. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "core/pool.h"
#include "exec/ops.h"
#include "memory/budget.h"

/* A head buffer and the read that fills it: rows [r0, r0 + k) of the table, got bytes landed. */
enum { CHUNK_IDLE = 0, CHUNK_WANTED, CHUNK_READING, CHUNK_READY };
typedef struct {
    uint8_t *data;
    int64_t r0, k;
    size_t got;
    int state;  /* IDLE: holds nothing; WANTED: to be read when needed (no ring); READING: a read
                   in flight; READY: landed */
    int early;  /* its read began before the chunk was needed (counts in ahead_reads) */
    int direct; /* its read in flight goes through the O_DIRECT descriptor */
} chunk_buf;

struct loip_rows {
    char path[512];
    int fd;
    int dfd;               /* the file O_DIRECT for aligned reads (loip_rows_set_direct; -1: none,
                              or refused at a read) */
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
    int32_t n_bufs;        /* head buffers: 2 (one read ahead), 1 when one chunk holds the table */
    chunk_buf chunk[2];    /* each (chunk_rows, row_bytes) */
    struct io_uring ring;  /* the head's reads (ring_ok: set up) */
    int ring_ok;
    int32_t ahead;         /* read ahead (default 1; loip_rows_set_ahead) */
    loip_budget *budget;
    uint64_t charged;      /* to budget's "slots" */
    uint64_t reads, bytes_read, hits, ahead_reads;
};

static void drain(loip_rows *r);

LOIP_API void loip_rows_free(loip_rows *r) {
    if (!r) return;
    drain(r); /* (no read may land in a buffer freed) */
    if (r->ring_ok) io_uring_queue_exit(&r->ring);
    if (r->fd >= 0) close(r->fd);
    if (r->dfd >= 0) close(r->dfd);
    free(r->cache_ids);
    free(r->cache_used);
    loip_aligned_free(r->cache);
    for (int b = 0; b < 2; b++) loip_aligned_free(r->chunk[b].data);
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
    r->fd = r->dfd = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->offset = offset, r->dtype = dtype, r->rows = rows, r->cols = cols;
    r->row_bytes = (size_t)cols * (size_t)loip_dtype_size(dtype);
    if (chunk_rows > rows) chunk_rows = (int32_t)((rows + 15) / 16 * 16);
    r->cache_rows = cache_rows, r->chunk_rows = chunk_rows, r->ahead = 1;
    r->n_bufs = chunk_rows <= 0 ? 0 : chunk_rows < rows ? 2 : 1;
    uint64_t bytes = ((uint64_t)cache_rows + (uint64_t)r->n_bufs * (uint64_t)chunk_rows) * r->row_bytes;
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
    for (int32_t b = 0; b < r->n_bufs; b++) {
        if (!(r->chunk[b].data = loip_aligned_alloc((size_t)chunk_rows * r->row_bytes))) {
            loip_rows_free(r);
            return loip_fail(LOIP_ENOMEM, "rows: out of memory");
        }
    }
    /* (no ring, as where io_uring is not allowed: each chunk read when it is needed) */
    if (r->n_bufs > 0) r->ring_ok = io_uring_queue_init(4, &r->ring, 0) == 0;
    *out = r;
    return LOIP_OK;
}

/* The descriptor a read of len bytes at offset into dst goes through: O_DIRECT when all three
 * are 4 KiB aligned and the file allows it, else the buffered one. */
static int fd_for(const loip_rows *r, const void *dst, uint64_t offset, size_t len) {
    const uint64_t a = 4096;
    return r->dfd >= 0 && (uintptr_t)dst % a == 0 && offset % a == 0 && len % a == 0 ? r->dfd : r->fd;
}

/* A read through the O_DIRECT descriptor (direct) refused (some filesystems accept it at open
 * and refuse it at read time): buffered from now on. Returns whether the read should be asked
 * again. (A read in flight through it when it closes keeps the file: the ring holds it.) */
static int direct_refused(loip_rows *r, int direct, int err) {
    if (err != EINVAL || !direct) return 0;
    if (r->dfd >= 0) close(r->dfd);
    r->dfd = -1;
    return 1;
}

/* bytes of the file at offset into dst, whole. */
static int read_at(loip_rows *r, void *dst, size_t bytes, uint64_t offset) {
    size_t got = 0;
    while (got < bytes) {
        int fd = fd_for(r, (uint8_t *)dst + got, offset + got, bytes - got);
        ssize_t k = pread(fd, (uint8_t *)dst + got, bytes - got, (off_t)(offset + got));
        if (k < 0 && (errno == EINTR || direct_refused(r, fd != r->fd, errno))) continue;
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

/* ---- the head, by chunks read ahead ------------------------------------------------------ */

static size_t chunk_bytes(const loip_rows *r, const chunk_buf *c) { return (size_t)c->k * r->row_bytes; }

/* The rest of c's read (from c->got) asked of the ring; c is READING, or IDLE when it could
 * not be asked (nothing of it in flight). */
static int submit_rest(loip_rows *r, chunk_buf *c) {
    c->state = CHUNK_IDLE;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (!sqe) return loip_fail(LOIP_EIO, "head: %s: no room in the read ring", r->path);
    uint64_t at = r->offset + (uint64_t)c->r0 * r->row_bytes + c->got;
    size_t len = chunk_bytes(r, c) - c->got;
    int fd = fd_for(r, c->data + c->got, at, len);
    c->direct = fd != r->fd;
    io_uring_prep_read(sqe, fd, c->data + c->got, (unsigned)len, at);
    io_uring_sqe_set_data(sqe, c);
    int rc = io_uring_submit(&r->ring);
    if (rc < 0) return loip_fail(rc, "head: %s: io_uring_submit: %s", r->path, strerror(-rc));
    c->state = CHUNK_READING;
    return LOIP_OK;
}

/* One completion of the ring taken (*done: its chunk; NULL when the ring itself failed): its
 * bytes counted, the rest of a short read asked again. A failed read leaves its chunk IDLE and
 * fails naming the file and the offset. */
static int reap_one(loip_rows *r, chunk_buf **done) {
    struct io_uring_cqe *cqe;
    int rc;
    *done = NULL;
    do rc = io_uring_wait_cqe(&r->ring, &cqe);
    while (rc == -EINTR);
    if (rc < 0) return loip_fail(rc, "head: %s: io_uring_wait_cqe: %s", r->path, strerror(-rc));
    chunk_buf *c = io_uring_cqe_get_data(cqe);
    *done = c;
    int res = cqe->res;
    io_uring_cqe_seen(&r->ring, cqe);
    uint64_t at = r->offset + (uint64_t)c->r0 * r->row_bytes + c->got;
    if (res == -EINTR || res == -EAGAIN || (res < 0 && direct_refused(r, c->direct, -res))) return submit_rest(r, c);
    if (res < 0) {
        c->state = CHUNK_IDLE;
        return loip_fail(res, "head: read %s at %llu: %s", r->path, (unsigned long long)at, strerror(-res));
    }
    if (res == 0) {
        c->state = CHUNK_IDLE;
        return loip_fail(LOIP_EIO, "head: %s ends before byte %llu (the table's rows run past it)", r->path,
                         (unsigned long long)(r->offset + (uint64_t)(c->r0 + c->k) * r->row_bytes));
    }
    c->got += (size_t)res;
    if (c->got < chunk_bytes(r, c)) return submit_rest(r, c);
    c->state = CHUNK_READY;
    r->reads++, r->bytes_read += chunk_bytes(r, c);
    return LOIP_OK;
}

/* Buffer c's read in flight landed or failed (its state then READY or IDLE). Only a ring that
 * fails to wait leaves it given up (IDLE: nothing more is asked of that ring's reads). */
static void settle(loip_rows *r, chunk_buf *c) {
    while (c->state == CHUNK_READING) {
        chunk_buf *done;
        if (reap_one(r, &done) && !done) c->state = CHUNK_IDLE;
    }
}

/* Every read in flight landed or failed. */
static void drain(loip_rows *r) {
    for (int b = 0; b < 2; b++) settle(r, &r->chunk[b]);
}

/* Rows [r0, r0 + k) into buffer b: asked of the ring now (early: before they are needed), or,
 * without one, when they are (a hint to the kernel meanwhile). */
static int chunk_start(loip_rows *r, int b, int64_t r0, int64_t k, int early) {
    chunk_buf *c = &r->chunk[b];
    settle(r, c);
    c->state = CHUNK_IDLE;
    c->r0 = r0, c->k = k, c->got = 0, c->early = early && r->ring_ok && r->ahead;
    if (!r->ring_ok || !r->ahead) {
        c->state = CHUNK_WANTED;
        posix_fadvise(r->fd, (off_t)(r->offset + (uint64_t)r0 * r->row_bytes), (off_t)chunk_bytes(r, c),
                      POSIX_FADV_WILLNEED);
        return LOIP_OK;
    }
    return submit_rest(r, c);
}

/* Buffer b's chunk landed (read now if it was only wanted). */
static int chunk_wait(loip_rows *r, int b) {
    chunk_buf *c = &r->chunk[b];
    if (c->state == CHUNK_WANTED) {
        int rc = read_at(r, c->data, chunk_bytes(r, c), r->offset + (uint64_t)c->r0 * r->row_bytes);
        c->state = rc ? CHUNK_IDLE : CHUNK_READY;
        return rc;
    }
    while (c->state == CHUNK_READING) {
        chunk_buf *done;
        int rc = reap_one(r, &done);
        if (rc && !done) c->state = CHUNK_IDLE; /* (the ring failed: its reads given up) */
        if (rc) return rc; /* (this chunk's read failed, or the next one's: the step fails) */
    }
    if (c->state != CHUNK_READY) return loip_fail(LOIP_ESTATE, "head: %s: a chunk awaited that was not read", r->path);
    if (c->early) r->ahead_reads++;
    return LOIP_OK;
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
    if (first == last) return LOIP_OK;
    const int64_t step = r->chunk_rows;
    const int64_t k0 = last - first < step ? last - first : step;
    /* the first chunk: read ahead at the end of the last call when that was of the same rows */
    chunk_buf *c0 = &r->chunk[0];
    if (!(c0->state != CHUNK_IDLE && c0->r0 == first && c0->k == k0)) {
        int rc = chunk_start(r, 0, first, k0, 0);
        if (rc) return rc;
    }
    int b = 0;
    for (int64_t r0 = first; r0 < last; r0 += step, b = (b + 1) % r->n_bufs) {
        int64_t k = last - r0 < step ? last - r0 : step, next = r0 + k;
        /* the next chunk asked for now, into the other buffer (its chunk's logits are done;
         * there is a next chunk only with two buffers: one is kept when a chunk holds the table) */
        if (next < last) {
            int rc = chunk_start(r, (b + 1) % r->n_bufs, next, last - next < step ? last - next : step, 1);
            if (rc) return rc;
        }
        int rc = chunk_wait(r, b);
        if (rc) return rc;
        /* rows [r0, r0 + k) of every token's logits: the chunk's own products, in place */
        loip_linear_job job[2] = {{.W = r->chunk[b].data, .dtype = r->dtype, .x = x, .y = logits + r0, .n = (size_t)n,
                                   .rows = (size_t)k, .cols = (size_t)r->cols, .ldy = (size_t)r->rows}, {0}};
        loip_linear_run(pool, job);
        r->chunk[b].state = CHUNK_IDLE;
    }
    /* the next step's first chunk, into buffer 0 (free now): it lands while the layers before
     * the head run */
    return chunk_start(r, 0, first, k0, 1);
}

LOIP_API int loip_rows_logits(loip_rows *r, loip_pool *pool, const float *x, int32_t n, int64_t first, int64_t last,
                              float *logits) {
    if (!r || !pool || !x || !logits || n <= 0)
        return loip_fail(LOIP_EINVAL, "rows logits: rows, pool, x, logits and n > 0 are required");
    return loip_rows_head_range(r, pool, x, n, first, last, logits);
}

LOIP_API int loip_rows_set_direct(loip_rows *r, int32_t on) {
    if (!r) return loip_fail(LOIP_EINVAL, "rows set direct: rows is NULL");
    drain(r); /* (no read in flight through the descriptor closed) */
    if (r->dfd >= 0) close(r->dfd);
    r->dfd = -1;
    if (!on) return LOIP_OK;
    if ((r->dfd = open(r->path, O_RDONLY | O_CLOEXEC | O_DIRECT)) < 0) {
        int e = errno;
        return loip_fail(-e, "rows: %s cannot be read past the page cache (O_DIRECT): %s; read buffered", r->path,
                         strerror(e));
    }
    return LOIP_OK;
}

LOIP_API int loip_rows_set_ahead(loip_rows *r, int32_t on) {
    if (!r) return loip_fail(LOIP_EINVAL, "rows set ahead: rows is NULL");
    drain(r);
    for (int b = 0; b < 2; b++) r->chunk[b].state = CHUNK_IDLE;
    r->ahead = on != 0;
    return LOIP_OK;
}

int loip_rows_fits(const loip_rows *r, int64_t rows, int64_t cols) { return r->rows == rows && r->cols == cols; }
int32_t loip_rows_dtype(const loip_rows *r) { return r->dtype; }

LOIP_API uint64_t loip_rows_bytes_read(const loip_rows *r) { return r ? r->bytes_read : 0; }
LOIP_API uint64_t loip_rows_reads(const loip_rows *r) { return r ? r->reads : 0; }
LOIP_API uint64_t loip_rows_hits(const loip_rows *r) { return r ? r->hits : 0; }
LOIP_API uint64_t loip_rows_ahead(const loip_rows *r) { return r ? r->ahead_reads : 0; }
