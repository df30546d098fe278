/* The loader's I/O: the bookkeeping of loads and reads, and the two threads that serve them
 * (io_uring, and the conventional buffered path). See loader.c for the design. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "files/crc32c.h"
#include "loader/loader.h"

/* ---- completion bookkeeping (under mu) ------------------------------------------------ */

static void load_fail(loip_loader *l, lload *ld, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void load_fail(loip_loader *l, lload *ld, int code, const char *fmt, ...) {
    if (ld->status == 0) {
        ld->status = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ld->message, sizeof ld->message, fmt, ap);
        va_end(ap);
    }
    if (!ld->issued_all) { /* stop issuing: unlink from pending */
        ld->issued_all = 1;
        lload **pp = &l->pend_head, *prev = NULL;
        while (*pp && *pp != ld) prev = *pp, pp = &(*pp)->next;
        if (*pp) {
            *pp = ld->next;
            if (l->pend_tail == ld) l->pend_tail = prev;
        }
        ld->next = NULL;
    }
}

void loader_finish_if_done(loip_loader *l, lload *ld) {
    if (!ld->issued_all || ld->in_flight > 0) return;
    /* checked reads: every extent so marked must carry its file's CRC32C (its pieces' CRCs were
     * taken on the I/O thread as each read landed, overlapping the reads still in flight) */
    for (int32_t i = 0; i < ld->n_ext && ld->status == 0; i++) {
        const lext *e = &ld->ext[i];
        if (!e->check) continue;
        uint32_t got = ~(loip_crc32c_shift(0xFFFFFFFFu, e->length) ^ e->acc);
        if (got != e->crc32c) {
            ld->status = LOIP_EIO;
            snprintf(ld->message, sizeof ld->message, "%s: CRC32C %08x of the %llu bytes read, the manifest says %08x: "
                     "the file is damaged (or changed since it was sliced)", l->files[e->file]->path, got,
                     (unsigned long long)e->length, e->crc32c);
        }
    }
    ld->t_done = loip_now_ns();
    ld->next = NULL;
    if (l->done_tail) l->done_tail->next = ld;
    else l->done_head = ld;
    l->done_tail = ld;
    l->n_active--;
    l->st.loads_done++;
    if (ld->status) l->st.loads_failed++;
    pthread_cond_broadcast(&l->cv_done);
}

/* Take the next read of the oldest pending load (NULL when none, throttled, or held back).
 * overlap_loads 0: a load starts only when the reads of the loads before it have all landed.
 * Loads are consumed in order, and a device that serves the reads it holds in parallel makes
 * the current load end later by the next one's bytes when the two overlap (on the VM this was
 * written on, a 96 MiB load and the 20 MiB one queued behind it finished together), so the
 * stage waiting for it holds its slot longer; the cost is one drain of the queue per load.
 * overlap_loads 1: no drain, for devices where it costs more than it gives. Which holds is
 * the machine's (a profile measures it; the caller chooses). */
static lread *next_read(loip_loader *l, uint64_t *throttle_ns) {
    while (l->pend_head) {
        lload *ld = l->pend_head;
        if (!l->cfg.overlap_loads && ld->next_ext == 0 && ld->next_off == 0 && l->in_flight > 0)
            return NULL;
        lext *e = &ld->ext[ld->next_ext];
        if (ld->next_off >= e->length) { /* (zero-length extents) */
            ld->next_ext++, ld->next_off = 0;
            if (ld->next_ext == ld->n_ext) {
                ld->issued_all = 1;
                l->pend_head = ld->next;
                if (!l->pend_head) l->pend_tail = NULL;
                loader_finish_if_done(l, ld);
            }
            continue;
        }
        uint64_t so = e->slot_offset + ld->next_off;
        uint64_t len = min_u64(e->length - ld->next_off, l->cfg.request_bytes);
        if (l->registered) len = min_u64(len, REG_CHUNK - so % REG_CHUNK);
        if (l->cfg.rate_limit_bps) {
            uint64_t now = loip_now_ns();
            double rate = (double)l->cfg.rate_limit_bps, burst = (double)l->cfg.request_bytes;
            l->tokens += rate * (double)(now - l->tokens_t) * 1e-9;
            if (l->tokens > burst) l->tokens = burst;
            l->tokens_t = now;
            if (l->tokens <= 0) { /* in debt: wait until it is paid */
                *throttle_ns = (uint64_t)(-l->tokens / rate * 1e9) + 1000;
                return NULL;
            }
            l->tokens -= (double)len;
        }
        lread *r = l->free_reads;
        l->free_reads = r->next;
        lfile *f = l->files[e->file];
        r->ld = ld;
        r->ext = ld->next_ext;
        r->f = f;
        r->file_offset = e->file_offset + ld->next_off;
        r->len = len;
        r->dst = l->slots[ld->slot] + so;
        r->direct = f->fd_direct >= 0 && !f->direct_refused && r->file_offset % ALIGN == 0 && len % ALIGN == 0 &&
                    so % ALIGN == 0;
        r->buf_index = l->registered ? (int32_t)(ld->slot * ((l->cfg.slot_bytes + REG_CHUNK - 1) /
                                                              REG_CHUNK) + so / REG_CHUNK)
                                     : -1;
        r->next = NULL;
        ld->in_flight++;
        ld->next_off += len;
        if (ld->next_off == e->length && ld->next_ext + 1 == ld->n_ext) {
            ld->issued_all = 1;
            l->pend_head = ld->next;
            if (!l->pend_head) l->pend_tail = NULL;
            ld->next = NULL;
        } else if (ld->next_off == e->length) {
            ld->next_ext++, ld->next_off = 0;
        }
        return r;
    }
    return NULL;
}

/* A read returned res (bytes or -errno). Returns 1 when r goes to the retry list. */
static int read_done(loip_loader *l, lread *r, int64_t res) {
    lload *ld = r->ld;
    l->st.reads++;
    if (res > 0 && l->cfg.debug_short_every > 0 && (uint64_t)res == r->len && r->len > 1 &&
        l->st.reads % (uint64_t)l->cfg.debug_short_every == 0) {
        /* Pretend the device returned only the first part (that part is really in the slot),
         * as a device or filesystem may: the rest must be read again. */
        res = (int64_t)(r->direct && r->len > ALIGN ? (r->len / 2) & ~(uint64_t)(ALIGN - 1)
                                                     : r->len / 2);
    }
    if (res == -EINTR || res == -EAGAIN) return 1;
    if (res == -EINVAL && r->direct) {
        /* some filesystems accept O_DIRECT at open and refuse it at read time: read buffered */
        r->f->direct_refused = 1;
        r->direct = 0;
        return 1;
    }
    if (res < 0) {
        load_fail(l, ld, (int)res, "%s: read failed at byte %llu: %s", r->f->path,
                  (unsigned long long)r->file_offset, strerror((int)-res));
    } else if (res == 0) {
        struct stat st; /* say where the file ends now (it may have been truncated) */
        long long size = fstat(r->f->fd_buf, &st) == 0 ? (long long)st.st_size : -1;
        load_fail(l, ld, LOIP_EIO,
                  "%s: file ends at byte %lld, before bytes %llu..%llu asked for (truncated?)",
                  r->f->path, size, (unsigned long long)r->file_offset,
                  (unsigned long long)(r->file_offset + r->len));
    } else {
        ld->bytes += (uint64_t)res;
        l->st.bytes_read += (uint64_t)res;
        lext *e = &ld->ext[r->ext];
        if (e->check) { /* this piece's CRC now, while the next pieces are still on their way */
            uint64_t t0 = loip_now_ns();
            uint64_t end = (uint64_t)(r->dst - (l->slots[ld->slot] + e->slot_offset)) + (uint64_t)res;
            e->acc ^= loip_crc32c_shift(loip_crc32c_raw(0, r->dst, (uint64_t)res), e->length - end);
            l->st.verify_ns += loip_now_ns() - t0;
            l->st.bytes_verified += (uint64_t)res;
        }
        if ((uint64_t)res < r->len) {
            l->st.short_reads++;
            r->file_offset += (uint64_t)res;
            r->dst += res;
            r->len -= (uint64_t)res;
            if (r->file_offset % ALIGN || r->len % ALIGN || (uintptr_t)r->dst % ALIGN) r->direct = 0;
            if (ld->status == 0) return 1;
        }
    }
    ld->in_flight--;
    loader_finish_if_done(l, ld);
    return 0;
}

/* A read that will not be issued again (the loader is being freed): its load fails. */
static void drop_read(loip_loader *l, lread *r) {
    r->ld->in_flight--;
    load_fail(l, r->ld, LOIP_ESTATE, "loader freed before the load finished");
    loader_finish_if_done(l, r->ld);
    r->next = l->free_reads;
    l->free_reads = r;
}

/* ---- the io_uring thread ---------------------------------------------------------------- */

static void arm_wake(loip_loader *l) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
    io_uring_prep_poll_add(sqe, l->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, WAKE_TAG);
}

static void prep_read(loip_loader *l, lread *r) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
    int fd = r->direct ? r->f->fd_direct : r->f->fd_buf;
    if (r->buf_index >= 0)
        io_uring_prep_read_fixed(sqe, fd, r->dst, (unsigned)r->len, r->file_offset, r->buf_index);
    else
        io_uring_prep_read(sqe, fd, r->dst, (unsigned)r->len, r->file_offset);
    io_uring_sqe_set_data(sqe, r);
    if (l->in_flight++ == 0) l->busy_since = loip_now_ns();
}

void *loader_uring_thread(void *arg) {
    loip_loader *l = arg;
    arm_wake(l);
    for (;;) {
        uint64_t throttle = 0;
        pthread_mutex_lock(&l->mu);
        int stopping = l->stop;
        while (!stopping && (l->retry || l->free_reads)) {
            lread *r = l->retry;
            if (r) l->retry = r->next;
            else if (!(r = next_read(l, &throttle))) break;
            prep_read(l, r);
        }
        pthread_mutex_unlock(&l->mu);
        if (stopping && l->in_flight == 0) break;
        io_uring_submit(&l->ring);
        struct io_uring_cqe *cqe = NULL;
        int rc;
        uint64_t t0 = throttle ? loip_now_ns() : 0;
        if (throttle) {
            struct __kernel_timespec ts = {(long long)(throttle / 1000000000ull),
                                           (long long)(throttle % 1000000000ull)};
            rc = io_uring_wait_cqe_timeout(&l->ring, &cqe, &ts);
        } else {
            rc = io_uring_wait_cqe(&l->ring, &cqe);
        }
        if (rc < 0 && rc != -ETIME && rc != -EINTR) {
            /* The ring itself failed: fail what is in flight rather than hang. */
            pthread_mutex_lock(&l->mu);
            for (lload *ld = l->pend_head; ld; ld = l->pend_head)
                load_fail(l, ld, rc, "loader: io_uring wait failed: %s", strerror(-rc));
            pthread_mutex_unlock(&l->mu);
            usleep(1000);
            continue;
        }
        unsigned head, n = 0;
        int rearm = 0;
        pthread_mutex_lock(&l->mu);
        if (throttle) l->st.throttle_ns += loip_now_ns() - t0;
        io_uring_for_each_cqe(&l->ring, head, cqe) {
            n++;
            if (cqe->user_data == WAKE_TAG) {
                uint64_t v;
                if (read(l->efd, &v, sizeof v) < 0) { /* nothing to drain */ }
                rearm = 1;
                continue;
            }
            lread *r = io_uring_cqe_get_data(cqe);
            if (--l->in_flight == 0) l->st.busy_ns += loip_now_ns() - l->busy_since;
            if (read_done(l, r, cqe->res)) {
                r->next = l->retry;
                l->retry = r;
            } else {
                r->next = l->free_reads;
                l->free_reads = r;
            }
        }
        pthread_mutex_unlock(&l->mu);
        io_uring_cq_advance(&l->ring, n);
        if (rearm) arm_wake(l);
    }
    pthread_mutex_lock(&l->mu);
    while (l->retry) {
        lread *r = l->retry;
        l->retry = r->next;
        drop_read(l, r);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ---- the buffered thread ---------------------------------------------------------------- */

void *loader_buffered_thread(void *arg) {
    loip_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        uint64_t throttle = 0;
        lread *r = NULL;
        while (!l->stop && !(r = next_read(l, &throttle))) {
            if (throttle) {
                uint64_t t0 = loip_now_ns();
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                uint64_t ns = (uint64_t)ts.tv_nsec + throttle;
                ts.tv_sec += (time_t)(ns / 1000000000ull);
                ts.tv_nsec = (long)(ns % 1000000000ull);
                pthread_cond_timedwait(&l->cv_work, &l->mu, &ts);
                l->st.throttle_ns += loip_now_ns() - t0;
                throttle = 0;
            } else {
                pthread_cond_wait(&l->cv_work, &l->mu);
            }
        }
        if (l->stop) {
            if (r) drop_read(l, r);
            break;
        }
        int retry;
        uint64_t t0 = loip_now_ns();
        do {
            pthread_mutex_unlock(&l->mu);
            ssize_t k = pread(r->f->fd_buf, l->bounce, (size_t)r->len, (off_t)r->file_offset);
            int64_t res = k < 0 ? -(int64_t)errno : (int64_t)k;
            if (res > 0) memcpy(r->dst, l->bounce, (size_t)res);
            pthread_mutex_lock(&l->mu);
            retry = read_done(l, r, res);
        } while (retry && !l->stop);
        l->st.busy_ns += loip_now_ns() - t0;
        if (retry) { /* stopping mid-read */
            drop_read(l, r);
        } else {
            r->next = l->free_reads;
            l->free_reads = r;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}


/* ---- io_uring setup ------------------------------------------------------------------------ */

int loader_open_ring(loip_loader *l) {
    int rc = io_uring_queue_init((unsigned)l->cfg.queue_depth + 2, &l->ring, 0);
    if (rc < 0) {
        snprintf(l->why, sizeof l->why, "io_uring unavailable: io_uring_queue_init: %s",
                 strerror(-rc));
        return rc;
    }
    l->ring_ok = 1;
    l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->efd < 0) {
        rc = -errno;
        snprintf(l->why, sizeof l->why, "eventfd: %s", strerror(errno));
        return rc;
    }
    return 0;
}

void loader_close_ring(loip_loader *l) {
    if (l->ring_ok) io_uring_queue_exit(&l->ring);
    l->ring_ok = 0;
    if (l->efd >= 0) close(l->efd);
    l->efd = -1;
}

int loader_pick_path(loip_loader *l) {
    if (l->cfg.mode == LOIP_LOADER_BUFFERED) {
        l->mode = LOIP_LOADER_BUFFERED;
        snprintf(l->why, sizeof l->why, "chosen");
        return 0;
    }
    l->mode = LOIP_LOADER_URING;
    if (loader_open_ring(l) == 0) return 0;
    loader_close_ring(l);
    if (l->cfg.mode == LOIP_LOADER_URING) return loip_fail(LOIP_ENOSYS, "loader: %s", l->why);
    l->mode = LOIP_LOADER_BUFFERED; /* AUTO: fall back; why says why */
    return 0;
}

void loader_register_slots(loip_loader *l) {
    uint64_t chunks = (l->cfg.slot_bytes + REG_CHUNK - 1) / REG_CHUNK;
    size_t n = (size_t)(chunks * (uint64_t)l->cfg.n_slots);
    struct iovec *iov = n ? calloc(n, sizeof *iov) : NULL;
    int rc = -EINVAL;
    if (iov) {
        for (int32_t s = 0; s < l->cfg.n_slots; s++)
            for (uint64_t c = 0; c < chunks; c++) {
                struct iovec *v = &iov[(uint64_t)s * chunks + c];
                v->iov_base = l->slots[s] + c * REG_CHUNK;
                v->iov_len = (size_t)min_u64(REG_CHUNK, l->cfg.slot_bytes - c * REG_CHUNK);
            }
        rc = io_uring_register_buffers(&l->ring, iov, (unsigned)n);
        free(iov);
    }
    l->registered = rc == 0;
    snprintf(l->why, sizeof l->why, "%s",
             l->registered ? "slots registered, fixed-buffer reads"
                           : "slots not registered (memlock limit?): plain reads");
}
