/* Internal to the loader (runtime/loader): its state, shared by the API (loader.c) and the
 * I/O threads (io.c). Everything under mu unless marked thread-only. */
#ifndef LOIP_LOADER_H
#define LOIP_LOADER_H

#include <liburing.h>
#include <pthread.h>
#include <stdint.h>

#include "loip.h"

#define ALIGN 4096u
#define REG_CHUNK (1ull << 30) /* registered buffers are limited to 1 GiB each */
#define WAKE_TAG ((uint64_t)-1)

typedef struct lfile {
    char *path;   /* strdup'd; stable for the loader's life (messages point into it) */
    int fd_direct; /* O_DIRECT descriptor, -1 when the filesystem refuses it */
    int fd_buf;    /* buffered descriptor (unaligned pieces, the buffered path) */
    int owned;     /* opened here (closed at free), else the caller's fd */
    int direct_refused; /* O_DIRECT accepted at open, refused at read time (EINVAL) */
} lfile;

typedef struct lext {
    int32_t file; /* index in l->files */
    uint64_t file_offset, length, slot_offset;
    int32_t check;   /* verify crc32c once read */
    uint32_t crc32c;
    uint32_t acc;    /* raw CRCs of the pieces read so far, each shifted to the extent's end */
} lext;

typedef struct lload {
    uint64_t tag;
    int32_t slot, status;
    uint64_t bytes;
    uint64_t t_submit, t_done;
    lext *ext;
    int32_t n_ext;
    int32_t next_ext;  /* cursor: next byte to issue is ext[next_ext] + next_off */
    uint64_t next_off;
    int32_t in_flight; /* reads issued and not completed */
    int issued_all;    /* every read issued, or failed: nothing more to issue */
    char message[240];
    struct lload *next; /* in pending, then done */
} lload;

typedef struct lread {
    lload *ld;
    int32_t ext;       /* the load's extent it reads a piece of */
    lfile *f;
    int direct;        /* O_DIRECT descriptor (all aligned) */
    int32_t buf_index; /* registered buffer, -1: none */
    uint64_t file_offset, len;
    uint8_t *dst;
    struct lread *next; /* free list / retry list */
} lread;

struct loip_loader {
    loip_loader_config cfg;
    int32_t mode;
    uint8_t **slots; /* n_slots x slot_bytes */
    uint8_t *bounce; /* buffered path: request_bytes */
    uint64_t bounce_charged; /* bytes of the bounce buffer charged to cfg.budget's "scratch" */
    int registered;  /* slots registered with the ring */
    char why[200];   /* why this path (probe result) */

    struct io_uring ring;
    int ring_ok, efd;

    pthread_t thread;
    int thread_ok;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* buffered path: the thread waits here */
    pthread_cond_t cv_done; /* pollers wait here */
    int stop;

    lfile **files; /* each allocated once: reads in flight point at them while this grows */
    int32_t n_files, cap_files;
    lload *pend_head, *pend_tail; /* loads with reads left to issue, in order */
    lload *done_head, *done_tail;
    int32_t n_active;             /* submitted, not yet finished */
    int32_t n_unreturned;         /* submitted, not yet returned by poll/wait */

    lread *reads;                 /* queue_depth read records */
    lread *free_reads, *retry;    /* thread-only */
    int32_t in_flight;            /* thread-only */
    uint64_t busy_since;

    double tokens;                /* rate limit bucket, bytes */
    uint64_t tokens_t;
    loip_loader_stats_t st;
    int refs;                     /* loip_loader_retain: freed when the last holder lets go */
};

static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Completion bookkeeping (io.c), called with mu held. */
void loader_finish_if_done(loip_loader *l, lload *ld);
/* The path for l->cfg (normalised), decided the same way by loip_loader_new and
 * loip_loader_size: LOIP_LOADER_BUFFERED when asked; else io_uring with l->ring and l->efd
 * open (loader_open_ring), or, where that fails, LOIP_LOADER_BUFFERED under AUTO and
 * LOIP_ENOSYS under URING. Sets l->mode and l->why. */
int loader_pick_path(loip_loader *l);
/* The ring (queue_depth + 2 entries) and its wake-up eventfd; l->why on failure. */
int loader_open_ring(loip_loader *l);
void loader_close_ring(loip_loader *l);
/* Registers the slots with the ring (fixed-buffer reads) where the memlock limit allows. */
void loader_register_slots(loip_loader *l);
void *loader_uring_thread(void *arg);
void *loader_buffered_thread(void *arg);

#endif
