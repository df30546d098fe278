/* The loader: reads loads (lists of file extents) into slots on its own thread.
 *
 * io_uring path: up to queue_depth reads in flight, O_DIRECT into slots registered with
 * io_uring_register_buffers (fixed-buffer reads: no page pinning per read), refilled as
 * completions arrive. The thread sleeps in the ring only: a poll on an eventfd, always armed,
 * is how submit and free wake it. Buffered path (the conventional one, for the ablation and as
 * the fallback): pread into a bounce buffer, memcpy into the slot, one read at a time.
 *
 * Loads are served in submission order; each is split into reads of at most request_bytes (and
 * never across a registered-buffer chunk). Whether a load's reads wait for the previous load's
 * to land is the caller's choice (overlap_loads; see next_read in io.c). A read that returns
 * less than asked is resubmitted for the remainder; one that returns 0 before the extent's end
 * (the file was truncated) fails the load with LOIP_EIO naming the file and the offset. A
 * failed load is reported only after its reads in flight have landed, so nothing writes into a
 * slot the caller believes idle. */
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
#include "memory/budget.h"
#include "loader/loader.h"

/* ---- files ------------------------------------------------------------------------------- */

/* Index of the cached file for path (or the caller's fd), opening it on first use. */
static int file_get(loip_loader *l, const char *path, int fd, int32_t *idx) {
    char name[32];
    if (!path) snprintf(name, sizeof name, "fd %d", fd);
    const char *key = path ? path : name;
    for (int32_t i = 0; i < l->n_files; i++)
        if (!strcmp(l->files[i]->path, key)) return *idx = i, LOIP_OK;
    if (l->n_files == l->cap_files) {
        int32_t cap = l->cap_files ? 2 * l->cap_files : 16;
        lfile **nf = realloc(l->files, (size_t)cap * sizeof *nf);
        if (!nf) return loip_fail(LOIP_ENOMEM, "loader: out of memory");
        l->files = nf;
        l->cap_files = cap;
    }
    lfile f = {strdup(key), -1, -1, path != NULL, 0};
    if (!f.path) return loip_fail(LOIP_ENOMEM, "loader: out of memory");
    if (path) {
        f.fd_buf = open(path, O_RDONLY | O_CLOEXEC);
        if (f.fd_buf < 0) {
            int e = errno;
            free(f.path);
            return loip_fail(-e, "%s: cannot open: %s", path, strerror(e));
        }
        struct stat st;
        if (fstat(f.fd_buf, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(f.fd_buf);
            free(f.path);
            return loip_fail(LOIP_EINVAL, "%s: not a regular file", path);
        }
        /* tmpfs (before Linux 6.6) and some FUSE filesystems refuse O_DIRECT: read buffered */
        if (l->mode == LOIP_LOADER_URING) f.fd_direct = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    } else {
        if (fd < 0 || fcntl(fd, F_GETFL) < 0) {
            free(f.path);
            return loip_fail(LOIP_EINVAL, "loader: extent without a path and with a bad fd %d", fd);
        }
        f.fd_buf = fd;
        if (l->mode == LOIP_LOADER_URING && (fcntl(fd, F_GETFL) & O_DIRECT)) f.fd_direct = fd;
    }
    lfile *fp = malloc(sizeof *fp);
    if (!fp) {
        if (f.owned) {
            if (f.fd_direct >= 0) close(f.fd_direct);
            close(f.fd_buf);
        }
        free(f.path);
        return loip_fail(LOIP_ENOMEM, "loader: out of memory");
    }
    *fp = f;
    l->files[l->n_files] = fp;
    *idx = l->n_files++;
    return LOIP_OK;
}

/* ---- the API ----------------------------------------------------------------------------- */

/* cfg (NULL: defaults) with the defaults filled in and the sizes rounded as the loader uses
 * them; LOIP_EINVAL for one it refuses. Shared by loip_loader_new and loip_loader_size. */
static int config_normalise(const loip_loader_config *cfg, loip_loader_config *out) {
    loip_loader_config c = {0};
    if (cfg) c = *cfg;
    if (c.n_slots <= 0) c.n_slots = 1;
    if (c.queue_depth <= 0) c.queue_depth = 32;
    if (c.request_bytes == 0) c.request_bytes = 1u << 20;
    c.request_bytes = (c.request_bytes + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    c.slot_bytes = (c.slot_bytes + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    /* No read is larger than a slot: nor need the bounce buffer be. */
    if (c.slot_bytes && c.request_bytes > c.slot_bytes) c.request_bytes = c.slot_bytes;
    *out = c;
    if (c.mode < LOIP_LOADER_AUTO || c.mode > LOIP_LOADER_BUFFERED || c.queue_depth > 4096 ||
        c.request_bytes > (1u << 30) || c.n_slots > 1024 ||
        (c.overlap_loads != 0 && c.overlap_loads != 1))
        return loip_fail(LOIP_EINVAL, "loader: bad config (mode %d, queue depth %d, request "
                         "bytes %llu, slots %d, overlap_loads %d)", c.mode, c.queue_depth,
                         (unsigned long long)c.request_bytes, c.n_slots, c.overlap_loads);
    return LOIP_OK;
}

/* Bytes charged to "slots" for a normalised config (a slot of 0 bytes still takes a page). */
static uint64_t slots_charge(const loip_loader_config *c) {
    return (uint64_t)c->n_slots * (c->slot_bytes ? c->slot_bytes : ALIGN);
}

LOIP_API int loip_loader_size(const loip_loader_config *cfg, uint64_t *slot_bytes,
                              uint64_t *scratch_bytes) {
    loip_loader_config c;
    int rc = config_normalise(cfg, &c);
    if (rc) return rc;
    int32_t mode = c.mode;
    if (mode == LOIP_LOADER_AUTO) {
        /* the decision loip_loader_new makes, on a loader that holds nothing but the ring */
        loip_loader *probe = calloc(1, sizeof *probe);
        if (!probe) return loip_fail(LOIP_ENOMEM, "loader size: out of memory");
        probe->cfg = c;
        probe->efd = -1;
        rc = loader_pick_path(probe);
        mode = probe->mode;
        loader_close_ring(probe);
        free(probe);
        if (rc) return rc;
    }
    if (slot_bytes) *slot_bytes = slots_charge(&c);
    if (scratch_bytes) *scratch_bytes = mode == LOIP_LOADER_BUFFERED ? c.request_bytes : 0;
    return LOIP_OK;
}

LOIP_API int loip_loader_new(const loip_loader_config *cfg, loip_loader **out) {
    *out = NULL;
    loip_loader_config c;
    int rc = config_normalise(cfg, &c);
    if (rc) return rc;
    /* The slots are charged before anything is allocated (and the buffered path's bounce
     * buffer to "scratch" once the path is known); the loader then holds a reference
     * to the budget and gives the charge back when freed. */
    uint64_t slot_charge = slots_charge(&c);
    if (c.budget) {
        int brc = loip_budget_charge(c.budget, "slots", slot_charge);
        if (brc) return brc;
    }
    loip_loader *l = calloc(1, sizeof *l);
    if (l) l->refs = 1;
    if (!l) {
        if (c.budget) loip_budget_release(c.budget, "slots", slot_charge);
        return loip_fail(LOIP_ENOMEM, "loader: out of memory");
    }
    l->cfg = c;
    l->cfg.budget = loip_budget_retain(c.budget);
    l->efd = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca; /* deadlines on the loip_now_ns() clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv_done, &ca);
    pthread_cond_init(&l->cv_work, &ca);
    pthread_condattr_destroy(&ca);
    rc = LOIP_ENOMEM;
    l->slots = calloc((size_t)c.n_slots, sizeof *l->slots);
    l->reads = calloc((size_t)c.queue_depth, sizeof *l->reads);
    if (!l->slots || !l->reads) goto fail;
    for (int32_t s = 0; s < c.n_slots; s++) {
        if (!(l->slots[s] = loip_aligned_alloc(c.slot_bytes ? c.slot_bytes : ALIGN))) goto fail;
        memset(l->slots[s], 0, c.slot_bytes);
    }
    if ((rc = loader_pick_path(l))) goto fail; /* LOIP_ENOSYS: io_uring asked, unavailable */
    if (l->mode == LOIP_LOADER_URING) loader_register_slots(l);
    int nreads = l->mode == LOIP_LOADER_URING ? c.queue_depth : 1;
    for (int i = nreads - 1; i >= 0; i--) {
        l->reads[i].next = l->free_reads;
        l->free_reads = &l->reads[i];
    }
    if (l->mode == LOIP_LOADER_BUFFERED) {
        if (c.budget) {
            int brc = loip_budget_charge(c.budget, "scratch", c.request_bytes);
            if (brc) {
                loip_loader_free(l);
                return brc;
            }
            l->bounce_charged = c.request_bytes;
        }
        rc = LOIP_ENOMEM;
        if (!(l->bounce = loip_aligned_alloc(c.request_bytes))) goto fail;
    }
    l->tokens = (double)c.request_bytes;
    l->tokens_t = loip_now_ns();
    if (pthread_create(&l->thread, NULL, l->mode == LOIP_LOADER_URING ? loader_uring_thread
                                                                      : loader_buffered_thread, l)) {
        rc = loip_fail(LOIP_ENOMEM, "loader: cannot start the thread");
        goto fail;
    }
    l->thread_ok = 1;
    *out = l;
    return LOIP_OK;
fail:
    if (rc == LOIP_ENOMEM) loip_fail(rc, "loader: cannot allocate %d slots of %llu bytes",
                                     c.n_slots, (unsigned long long)c.slot_bytes);
    loip_loader_free(l);
    return rc;
}

static void wake(loip_loader *l) {
    if (l->mode == LOIP_LOADER_URING) {
        uint64_t one = 1;
        if (write(l->efd, &one, sizeof one) < 0) { /* counter full: already awake */ }
    } else {
        pthread_cond_signal(&l->cv_work);
    }
}

LOIP_API loip_loader *loip_loader_retain(loip_loader *l) {
    if (l) __atomic_add_fetch(&l->refs, 1, __ATOMIC_ACQ_REL);
    return l;
}

LOIP_API void loip_loader_free(loip_loader *l) {
    if (!l || __atomic_sub_fetch(&l->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (l->thread_ok) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_mutex_unlock(&l->mu);
        wake(l);
        pthread_join(l->thread, NULL); /* returns once no read is in flight */
    }
    loader_close_ring(l);
    /* loads: those still pending or finished and never polled */
    for (lload *ld = l->done_head, *nx; ld; ld = nx) nx = ld->next, free(ld->ext), free(ld);
    for (lload *ld = l->pend_head, *nx; ld; ld = nx) nx = ld->next, free(ld->ext), free(ld);
    for (int32_t i = 0; i < l->n_files; i++) {
        lfile *f = l->files[i];
        if (f->owned) {
            if (f->fd_direct >= 0) close(f->fd_direct);
            if (f->fd_buf >= 0) close(f->fd_buf);
        }
        free(f->path);
        free(f);
    }
    free(l->files);
    if (l->slots)
        for (int32_t s = 0; s < l->cfg.n_slots; s++) loip_aligned_free(l->slots[s]);
    free(l->slots);
    loip_aligned_free(l->bounce);
    free(l->reads);
    if (l->cfg.budget) {
        loip_budget_release(l->cfg.budget, "scratch", l->bounce_charged);
        loip_budget_release(l->cfg.budget, "slots", slots_charge(&l->cfg));
        loip_budget_free(l->cfg.budget);
    }
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_done);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

LOIP_API int32_t loip_loader_mode(const loip_loader *l) { return l->mode; }
LOIP_API int32_t loip_loader_slots(const loip_loader *l) { return l->cfg.n_slots; }
LOIP_API uint64_t loip_loader_slot_bytes(const loip_loader *l) { return l->cfg.slot_bytes; }

LOIP_API void *loip_loader_slot_data(loip_loader *l, int32_t slot) {
    return slot >= 0 && slot < l->cfg.n_slots ? l->slots[slot] : NULL;
}

LOIP_API int loip_loader_describe(loip_loader *l, char *buf, size_t cap) {
    pthread_mutex_lock(&l->mu);
    int direct = 0, buffered = 0;
    for (int32_t i = 0; i < l->n_files; i++)
        l->files[i]->fd_direct >= 0 && !l->files[i]->direct_refused ? direct++ : buffered++;
    pthread_mutex_unlock(&l->mu);
    int n;
    if (l->mode == LOIP_LOADER_URING)
        n = snprintf(buf, cap, "io_uring: queue depth %d, reads of %llu KiB, %d slot(s) of %llu "
                     "KiB, %s; files: %d O_DIRECT, %d not (filesystem refuses it, or a caller's fd)",
                     l->cfg.queue_depth, (unsigned long long)(l->cfg.request_bytes >> 10),
                     l->cfg.n_slots, (unsigned long long)(l->cfg.slot_bytes >> 10), l->why,
                     direct, buffered);
    else
        n = snprintf(buf, cap, "buffered: pread into a %llu KiB bounce buffer, then copy into "
                     "%d slot(s) of %llu KiB (%s); files: %d",
                     (unsigned long long)(l->cfg.request_bytes >> 10), l->cfg.n_slots,
                     (unsigned long long)(l->cfg.slot_bytes >> 10), l->why, direct + buffered);
    if (l->cfg.rate_limit_bps && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "; rate limit %.1f MB/s",
                      (double)l->cfg.rate_limit_bps / 1e6);
    if (n < 0 || (size_t)n >= cap) return loip_fail(LOIP_ERANGE, "loader describe: buffer too small");
    return LOIP_OK;
}

LOIP_API int loip_loader_submit(loip_loader *l, int32_t slot, const loip_load_extent *ext,
                                int32_t n, uint64_t tag) {
    if (slot < 0 || slot >= l->cfg.n_slots)
        return loip_fail(LOIP_EINVAL, "loader submit: slot %d out of range (%d slots)", slot,
                         l->cfg.n_slots);
    if (n < 0 || (n > 0 && !ext)) return loip_fail(LOIP_EINVAL, "loader submit: bad extent list");
    for (int32_t i = 0; i < n; i++)
        if (ext[i].slot_offset > l->cfg.slot_bytes ||
            ext[i].length > l->cfg.slot_bytes - ext[i].slot_offset)
            return loip_fail(LOIP_ERANGE, "loader submit: extent %d (%s, %llu bytes at slot offset "
                             "%llu) does not fit the slot of %llu bytes", i,
                             ext[i].path ? ext[i].path : "fd", (unsigned long long)ext[i].length,
                             (unsigned long long)ext[i].slot_offset,
                             (unsigned long long)l->cfg.slot_bytes);
    lload *ld = calloc(1, sizeof *ld);
    lext *e = calloc(n > 0 ? (size_t)n : 1, sizeof *e);
    if (!ld || !e) {
        free(ld), free(e);
        return loip_fail(LOIP_ENOMEM, "loader submit: out of memory");
    }
    pthread_mutex_lock(&l->mu);
    for (int32_t i = 0; i < n; i++) {
        int rc = file_get(l, ext[i].path, ext[i].fd, &e[i].file);
        if (rc) {
            pthread_mutex_unlock(&l->mu);
            free(ld), free(e);
            return rc;
        }
        e[i].file_offset = ext[i].file_offset;
        e[i].length = ext[i].length;
        e[i].slot_offset = ext[i].slot_offset;
        e[i].check = ext[i].check != 0, e[i].crc32c = ext[i].crc32c;
    }
    ld->tag = tag;
    ld->slot = slot;
    ld->ext = e;
    ld->n_ext = n;
    ld->t_submit = loip_now_ns();
    l->n_active++;
    l->n_unreturned++;
    if (n == 0) {
        ld->issued_all = 1;
        loader_finish_if_done(l, ld);
    } else {
        if (l->pend_tail) l->pend_tail->next = ld;
        else l->pend_head = ld;
        l->pend_tail = ld;
    }
    pthread_mutex_unlock(&l->mu);
    wake(l);
    return LOIP_OK;
}

static void fill_done(loip_load_done *o, const lload *ld) {
    o->tag = ld->tag;
    o->slot = ld->slot;
    o->status = ld->status;
    o->bytes = ld->bytes;
    o->t_submit_ns = ld->t_submit;
    o->t_done_ns = ld->t_done;
    memcpy(o->message, ld->message, sizeof o->message);
    if (ld->status) loip_fail(ld->status, "%s", ld->message);
}

/* Wait on cv_done until deadline (0: forever); 0 on timeout. Called with mu held. */
static int wait_done(loip_loader *l, uint64_t deadline) {
    if (!deadline) return pthread_cond_wait(&l->cv_done, &l->mu), 1;
    uint64_t now = loip_now_ns();
    if (now >= deadline) return 0;
    struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
    pthread_cond_timedwait(&l->cv_done, &l->mu, &ts);
    return 1;
}

LOIP_API int loip_loader_poll(loip_loader *l, loip_load_done *out, int32_t cap, int32_t wait_ms) {
    if (cap <= 0) return 0;
    uint64_t deadline = wait_ms > 0 ? loip_now_ns() + (uint64_t)wait_ms * 1000000ull : 0;
    pthread_mutex_lock(&l->mu);
    while (!l->done_head && wait_ms != 0 && l->n_active > 0)
        if (!wait_done(l, deadline)) break;
    int32_t k = 0;
    while (k < cap && l->done_head) {
        lload *ld = l->done_head;
        l->done_head = ld->next;
        if (!l->done_head) l->done_tail = NULL;
        l->n_unreturned--;
        fill_done(&out[k++], ld);
        free(ld->ext);
        free(ld);
    }
    pthread_mutex_unlock(&l->mu);
    return k;
}

LOIP_API int loip_loader_wait(loip_loader *l, uint64_t tag, int32_t timeout_ms,
                              loip_load_done *out) {
    uint64_t deadline = timeout_ms >= 0 ? loip_now_ns() + (uint64_t)timeout_ms * 1000000ull + 1 : 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        lload *prev = NULL;
        for (lload *ld = l->done_head; ld; prev = ld, ld = ld->next) {
            if (ld->tag != tag) continue;
            if (prev) prev->next = ld->next;
            else l->done_head = ld->next;
            if (l->done_tail == ld) l->done_tail = prev;
            l->n_unreturned--;
            loip_load_done tmp;
            fill_done(out ? out : &tmp, ld);
            int st = ld->status;
            free(ld->ext);
            free(ld);
            pthread_mutex_unlock(&l->mu);
            return st;
        }
        if (l->n_active == 0) {
            pthread_mutex_unlock(&l->mu);
            return loip_fail(LOIP_EINVAL, "loader wait: no load with tag %llu is queued",
                             (unsigned long long)tag);
        }
        if (!wait_done(l, deadline)) {
            pthread_mutex_unlock(&l->mu);
            return loip_fail(LOIP_ETIMEDOUT, "loader wait: load %llu not done after %d ms",
                             (unsigned long long)tag, timeout_ms);
        }
    }
}

LOIP_API int32_t loip_loader_pending(loip_loader *l) {
    pthread_mutex_lock(&l->mu);
    int32_t n = l->n_unreturned;
    pthread_mutex_unlock(&l->mu);
    return n;
}

LOIP_API int loip_loader_stats(loip_loader *l, loip_loader_stats_t *out) {
    pthread_mutex_lock(&l->mu);
    *out = l->st;
    pthread_mutex_unlock(&l->mu);
    return LOIP_OK;
}

