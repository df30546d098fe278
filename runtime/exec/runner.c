/* The runner: a device's stages, executed every step with their offloaded blocks read from the
 * slice store into loader slots while other blocks compute (docs/design.md, section 3, the paper's
 * Fig. 2(b)).
 *
 *   stage k:  wait for its slot ─► offloaded blocks ─► release the slot: the loader starts
 *             reading the next stage's blocks into it ─► resident blocks (overlapping that read)
 *
 * With one loader slot, the slot is a ring: each load takes the next free range of its bytes
 * (wrapping to the start when the end is too short) and ranges are freed in load order, so
 * that a load can start while earlier stages still compute from the same slot, as soon as its
 * bytes are free (a slot larger than the largest stage keeps the disk busy through them). With
 * several slots, each load takes a whole slot, as many loads ahead as there are slots; loads
 * always go in cyclic stage order.
 * The "proxy" views of a stage (where each offloaded weight lies in a slot) are given once;
 * after a load the model's weights are re-bound to the slot it landed in, a pointer update per
 * tensor. Nothing here allocates, parses or calls into Lua per step; the loader's ring is the
 * only system call besides the futex of the wait. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "exec/model.h"
#include "exec/session.h"

enum { IDLE = 0, LOADING = 1, READY = 2 };

typedef struct rstage {
    int32_t first, last, n_off; /* blocks [first, last), the first n_off offloaded */
    int per_block;              /* LOIP_STAGE_PER_BLOCK: read block by block when it runs */
    loip_load_extent *ext;      /* n_ext reads (paths owned), slot offsets relative to the load */
    loip_load_extent *sub;      /* the same, as submitted (offsets moved to the load's range) */
    int32_t n_ext;
    loip_stage_view *views;
    int32_t n_views;
    uint64_t bytes;             /* bytes a load reads */
    int state;                  /* IDLE, LOADING or READY */
    int32_t slot;               /* the slot it is loading into or loaded in, -1: none */
    uint64_t at;                /* ring: where its range starts in the slot */
    uint64_t tag;
} rstage;

struct loip_runner {
    loip_session *s;
    loip_model *m;
    loip_loader *l;
    rstage *st;
    int32_t n;
    int32_t n_offloading;   /* stages with offloaded blocks */
    int32_t next_load;      /* the stage whose load comes next, in cyclic order */
    int32_t *free_slots;    /* stack of idle slots (several slots) */
    int32_t n_free;
    int ring;               /* one slot, used as a ring of ranges */
    uint64_t ring_bytes;    /* its size */
    uint64_t ring_tail;     /* end of the newest range */
    int32_t *live;          /* ring: stages holding ranges, oldest first (n_live) */
    int32_t n_live;
    uint64_t next_tag;
    loip_runner_event *ev;  /* ev_cap events, ev_count kept */
    int32_t ev_cap, ev_count;
    int no_prefetch;        /* loads start only when their stage runs (baseline) */
    loip_runner_stats_t stats;
};

static void record(loip_runner *r, int kind, int stage, int first, int last, uint64_t t0,
                   uint64_t t1, uint64_t bytes, int offloaded, int n_tokens) {
    if (r->ev_cap == 0) return;
    if (r->ev_count == r->ev_cap) {
        r->stats.events_dropped++;
        return;
    }
    r->ev[r->ev_count++] = (loip_runner_event){kind, stage, first, last, t0, t1, bytes, offloaded, n_tokens};
}

static int block_of(int which) { return loip_weight_block(which); }

static int next_offloading(const loip_runner *r, int32_t after) {
    for (int32_t i = 1; i <= r->n; i++) {
        int32_t k = (after + i) % r->n;
        if (r->st[k].n_off > 0 && !r->st[k].per_block) return k;
    }
    return -1;
}

/* Ring: where a range of n bytes can start now, or -1. Free space is [tail, end) and
 * [0, head) when the live ranges do not wrap, [tail, head) when they do. */
static int64_t ring_place(const loip_runner *r, uint64_t n) {
    if (r->n_live == 0) return n <= r->ring_bytes ? 0 : -1;
    uint64_t head = r->st[r->live[0]].at, tail = r->ring_tail;
    if (tail > head) {
        if (r->ring_bytes - tail >= n) return (int64_t)tail;
        return head >= n ? 0 : -1;
    }
    return head - tail >= n ? (int64_t)tail : -1;
}

/* Start the next stages' loads (cyclic order) while there is room: an idle slot, or a free
 * range of the ring. */
static int start_loads_n(loip_runner *r, int limit) {
    while (r->n_offloading > 0 && r->l && limit-- != 0) {
        rstage *t = &r->st[r->next_load];
        if (t->state != IDLE) break; /* every offloading stage already has its bytes coming */
        int32_t slot;
        uint64_t at = 0;
        if (r->ring) {
            int64_t where = ring_place(r, t->bytes);
            if (where < 0) break;
            slot = 0, at = (uint64_t)where;
        } else {
            if (r->n_free == 0) break;
            slot = r->free_slots[r->n_free - 1];
        }
        for (int32_t i = 0; i < t->n_ext; i++) {
            t->sub[i] = t->ext[i];
            t->sub[i].slot_offset += at;
        }
        uint64_t tag = r->next_tag++;
        int rc = loip_loader_submit(r->l, slot, t->sub, t->n_ext, tag);
        if (rc) return rc;
        if (r->ring) {
            r->live[r->n_live++] = r->next_load;
            r->ring_tail = at + t->bytes;
        } else {
            r->n_free--;
        }
        t->state = LOADING, t->slot = slot, t->tag = tag, t->at = at;
        r->next_load = next_offloading(r, r->next_load);
    }
    return LOIP_OK;
}

static int start_loads(loip_runner *r) { return r->no_prefetch ? LOIP_OK : start_loads_n(r, -1); }

/* Give a stage's slot (or its ring range) back. Ring ranges go back in load order: a stage
 * released out of that order (a failed load, a drain) takes the ranges before it along. */
static void release(loip_runner *r, rstage *t) {
    if (t->slot >= 0) {
        if (r->ring) {
            int32_t k = (int32_t)(t - r->st), i = 0;
            while (i < r->n_live && r->live[i] != k) i++;
            if (i < r->n_live) {
                for (int32_t j = 0; j < i; j++) { /* (only on drain paths: they are idle) */
                    rstage *o = &r->st[r->live[j]];
                    o->slot = -1;
                    if (o->state == READY) o->state = IDLE;
                }
                memmove(r->live, r->live + i + 1, (size_t)(r->n_live - i - 1) * sizeof *r->live);
                r->n_live -= i + 1;
            }
            if (r->n_live == 0) r->ring_tail = 0;
        } else {
            r->free_slots[r->n_free++] = t->slot;
        }
    }
    t->slot = -1;
    t->state = IDLE;
}

/* Wait for a stage's load; records the wait and the load. */
static int await(loip_runner *r, int32_t k) {
    rstage *t = &r->st[k];
    loip_load_done done = {0};
    uint64_t t0 = loip_now_ns();
    int rc = loip_loader_wait(r->l, t->tag, -1, &done);
    uint64_t t1 = loip_now_ns();
    r->stats.stall_ns += t1 - t0;
    record(r, LOIP_EVENT_WAIT, k, t->first, t->first + t->n_off, t0, t1, 0, 1, 0);
    if (rc && done.tag != t->tag) {
        release(r, t);
        return rc; /* the loader does not know the tag: its message says so */
    }
    r->stats.loads++;
    r->stats.load_ns += done.t_done_ns - done.t_submit_ns;
    r->stats.bytes_loaded += done.bytes;
    record(r, LOIP_EVENT_LOAD, k, t->first, t->first + t->n_off, done.t_submit_ns, done.t_done_ns,
           done.bytes, 1, 0);
    if (rc) {
        release(r, t);
        return loip_fail(rc, "stage %d: %s", k, done.message[0] ? done.message : "load failed");
    }
    t->state = READY;
    return LOIP_OK;
}

/* Forget every load ahead (waiting for those in flight): used when a stage runs out of order. */
static void drain(loip_runner *r) {
    for (int32_t k = 0; k < r->n; k++) {
        rstage *t = &r->st[k];
        if (t->state == LOADING) loip_loader_wait(r->l, t->tag, -1, NULL);
        if (t->state != IDLE) release(r, t);
    }
}

static void bind_views(loip_runner *r, const rstage *t) {
    const uint8_t *base = (const uint8_t *)loip_loader_slot_data(r->l, t->slot) + t->at;
    for (int32_t i = 0; i < t->n_views; i++) {
        const loip_stage_view *v = &t->views[i];
        r->m->layers[(size_t)v->layer * LOIP_W_COUNT + v->which].data = base + v->slot_offset;
    }
}

static void stage_free(rstage *t) {
    for (int32_t i = 0; i < t->n_ext; i++) free((char *)t->ext[i].path);
    free(t->ext);
    free(t->sub);
    free(t->views);
}

LOIP_API void loip_runner_free(loip_runner *r) {
    if (!r) return;
    if (r->l && r->st) drain(r);
    loip_loader_free(r->l); /* (the runner's hold: loip_loader_retain) */
    for (int32_t k = 0; r->st && k < r->n; k++) stage_free(&r->st[k]);
    free(r->st);
    free(r->free_slots);
    free(r->live);
    free(r->ev);
    free(r);
}

static int copy_stage(loip_runner *r, int32_t k, const loip_stage_desc *d, uint64_t slot_bytes) {
    rstage *t = &r->st[k];
    int32_t n_blocks = 2 * r->m->cfg.n_layers;
    t->slot = -1;
    t->first = d->first_block, t->last = d->last_block, t->n_off = d->n_offloaded;
    t->per_block = (d->flags & LOIP_STAGE_PER_BLOCK) != 0;
    if (t->per_block && d->n_offloaded > 0 && d->n_extents != d->n_offloaded)
        return loip_fail(LOIP_EINVAL, "runner: stage %d reads block by block but has %d extents for %d blocks",
                         k, d->n_extents, d->n_offloaded);
    if (d->first_block < 0 || d->first_block > d->last_block || d->last_block > n_blocks)
        return loip_fail(LOIP_EINVAL, "runner: stage %d: blocks [%d, %d) out of range for %d blocks",
                         k, d->first_block, d->last_block, n_blocks);
    if (d->n_offloaded < 0 || d->n_offloaded > d->last_block - d->first_block)
        return loip_fail(LOIP_EINVAL, "runner: stage %d: %d offloaded blocks of %d", k,
                         d->n_offloaded, d->last_block - d->first_block);
    if (d->n_offloaded == 0) return LOIP_OK;
    if (!r->l)
        return loip_fail(LOIP_EINVAL, "runner: stage %d offloads %d blocks but there is no loader",
                         k, d->n_offloaded);
    if (d->n_extents <= 0 || !d->extents || d->n_views <= 0 || !d->views)
        return loip_fail(LOIP_EINVAL, "runner: stage %d offloads blocks but gives no %s", k,
                         d->n_extents <= 0 || !d->extents ? "extents" : "views");
    t->ext = calloc((size_t)d->n_extents, sizeof *t->ext);
    t->sub = calloc((size_t)d->n_extents, sizeof *t->sub);
    t->views = calloc((size_t)d->n_views, sizeof *t->views);
    if (!t->ext || !t->sub || !t->views) return loip_fail(LOIP_ENOMEM, "runner: out of memory");
    for (int32_t i = 0; i < d->n_extents; i++) {
        const loip_load_extent *e = &d->extents[i];
        uint64_t end = t->per_block ? e->length : e->slot_offset + e->length; /* per block: at 0 */
        if (end > slot_bytes || e->slot_offset + e->length < e->length)
            return loip_fail(LOIP_EINVAL, "runner: stage %d: extent %d (%s) ends at slot byte %llu, "
                             "past the slot's %llu", k, i, e->path ? e->path : "fd",
                             (unsigned long long)end,
                             (unsigned long long)slot_bytes);
        t->ext[i] = *e;
        if (e->path && !(t->ext[i].path = strdup(e->path)))
            return loip_fail(LOIP_ENOMEM, "runner: out of memory");
        t->n_ext = i + 1;
        t->bytes += e->length;
    }
    if (t->bytes > slot_bytes && !t->per_block)
        return loip_fail(LOIP_EINVAL, "runner: stage %d reads %llu bytes, more than the slot's %llu",
                         k, (unsigned long long)t->bytes, (unsigned long long)slot_bytes);
    for (int32_t i = 0; i < d->n_views; i++) {
        const loip_stage_view *v = &d->views[i];
        int32_t b = 2 * v->layer + block_of(v->which);
        if (v->which < LOIP_W_ATTN_NORM || v->which >= LOIP_W_COUNT || v->layer < 0 ||
            b < d->first_block || b >= d->first_block + d->n_offloaded)
            return loip_fail(LOIP_EINVAL, "runner: stage %d: view %d (%s of layer %d) is not in "
                             "the stage's offloaded blocks [%d, %d)", k, i,
                             loip_weight_name(v->which), v->layer, d->first_block,
                             d->first_block + d->n_offloaded);
        int nd = v->ndim < 0 ? 0 : v->ndim > 4 ? 4 : v->ndim;
        int64_t vrows = 1; /* leading dimensions as rows of the last (the block dtypes' bytes) */
        for (int j = 0; j + 1 < nd; j++) vrows *= v->shape[j];
        int64_t vcols = nd ? v->shape[nd - 1] : 1;
        uint64_t nbytes = loip_dtype_bytes(v->dtype, vrows, vcols);
        if (nbytes == 0 && vrows != 0 && vcols != 0)
            return loip_fail(LOIP_EINVAL, "runner: stage %d: view %d (%s of layer %d): its shape does not fit "
                             "dtype %d", k, i, loip_weight_name(v->which), v->layer, v->dtype);
        if (t->per_block) { /* its block's extent is read to the start of the slot */
            const loip_load_extent *e = &d->extents[b - d->first_block];
            if (v->slot_offset < e->slot_offset || v->slot_offset - e->slot_offset + nbytes > slot_bytes ||
                e->length > slot_bytes)
                return loip_fail(LOIP_EINVAL, "runner: stage %d: block %d does not fit the slot", k, b);
        } else if (v->slot_offset + nbytes > slot_bytes)
            return loip_fail(LOIP_EINVAL, "runner: stage %d: %s of layer %d ends past the slot",
                             k, loip_weight_name(v->which), v->layer);
        t->views[i] = *v;
        t->n_views = i + 1;
    }
    return LOIP_OK;
}

/* Fail runner_new with the message of the call that failed, prefixed with the stage. */
static int runner_fail(loip_runner *r, int rc, int32_t k) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", loip_last_error());
    loip_runner_free(r);
    return loip_fail(rc, "runner: stage %d: %s", k, msg);
}

LOIP_API int loip_runner_new(loip_session *s, loip_model *m, loip_loader *loader,
                             const loip_stage_desc *stages, int32_t n_stages,
                             int32_t event_capacity, loip_runner **out) {
    *out = NULL;
    if (!s || !m || n_stages <= 0 || !stages || event_capacity < 0)
        return loip_fail(LOIP_EINVAL, "runner: needs a session, a model and at least one stage");
    loip_runner *r = calloc(1, sizeof *r);
    if (!r) return loip_fail(LOIP_ENOMEM, "runner: out of memory");
    r->s = s, r->m = m, r->l = loip_loader_retain(loader), r->n = n_stages, r->next_tag = 1;
    r->st = calloc((size_t)n_stages, sizeof *r->st);
    r->ev_cap = event_capacity;
    if (!r->st || (event_capacity && !(r->ev = calloc((size_t)event_capacity, sizeof *r->ev)))) {
        loip_runner_free(r);
        return loip_fail(LOIP_ENOMEM, "runner: out of memory");
    }
    uint64_t slot_bytes = loader ? loip_loader_slot_bytes(loader) : 0;
    int rc = LOIP_OK;
    for (int32_t k = 0; k < n_stages && rc == LOIP_OK; k++) rc = copy_stage(r, k, &stages[k], slot_bytes);
    if (rc) {
        loip_runner_free(r);
        return rc;
    }
    for (int32_t k = 0; k < n_stages; k++) r->n_offloading += r->st[k].n_off > 0 && !r->st[k].per_block;
    if (loader) {
        int32_t n_slots = loip_loader_slots(loader);
        r->ring = n_slots == 1;
        r->ring_bytes = slot_bytes;
        if (!(r->free_slots = malloc((size_t)n_slots * sizeof(int32_t))) ||
            !(r->live = malloc((size_t)n_stages * sizeof(int32_t)))) {
            loip_runner_free(r);
            return loip_fail(LOIP_ENOMEM, "runner: out of memory");
        }
        for (int32_t i = n_slots - 1; i >= 0; i--) r->free_slots[r->n_free++] = i;
    }
    /* Bind the proxies to the first slot (checking each view's shape and dtype against the
     * model), so that the model is complete before the first load lands. */
    for (int32_t k = 0; k < n_stages; k++) {
        const rstage *t = &r->st[k];
        const uint8_t *base = t->n_views ? loip_loader_slot_data(loader, 0) : NULL;
        for (int32_t i = 0; i < t->n_views; i++) {
            const loip_stage_view *v = &t->views[i];
            uint64_t at = v->slot_offset;
            if (t->per_block) at -= t->ext[2 * v->layer + block_of(v->which) - t->first].slot_offset;
            loip_tensor tv = {.data = base + at, .dtype = v->dtype, .ndim = v->ndim};
            memcpy(tv.shape, v->shape, sizeof tv.shape);
            if ((rc = loip_model_bind(m, v->layer, v->which, &tv))) return runner_fail(r, rc, k);
        }
    }
    for (int32_t k = 0; k < n_stages; k++)
        if ((rc = loip_model_check_blocks(m, r->st[k].first, r->st[k].last))) return runner_fail(r, rc, k);
    r->next_load = r->n_offloading ? next_offloading(r, n_stages - 1) : 0;
    if ((rc = start_loads(r))) {
        loip_runner_free(r);
        return rc;
    }
    *out = r;
    return LOIP_OK;
}

static int compute(loip_runner *r, int32_t k, int32_t first, int32_t last, float *hidden,
                   int32_t n, int offloaded) {
    if (first == last) return LOIP_OK;
    uint64_t t0 = loip_now_ns();
    int rc = loip_session_run(r->s, first, last, hidden);
    uint64_t t1 = loip_now_ns();
    r->stats.compute_ns += t1 - t0;
    record(r, LOIP_EVENT_COMPUTE, k, first, last, t0, t1, 0, offloaded, n);
    return rc;
}

/* Stage k over the session's prepared batch of n tokens. */
static int stage_run(loip_runner *r, int32_t k, float *hidden, int32_t n) {
    if (k < 0 || k >= r->n)
        return loip_fail(LOIP_EINVAL, "runner: stage %d out of range (%d stages)", k, r->n);
    int rc;
    rstage *t = &r->st[k];
    if (t->n_off > 0 && !r->l)
        return loip_fail(LOIP_ESTATE, "runner: stage %d offloads blocks but the runner has no loader", k);
    r->stats.stage_runs++;
    if (t->n_off > 0 && t->per_block) {
        drain(r); /* the slot's start is this stage's now */
        uint8_t *base = loip_loader_slot_data(r->l, 0);
        for (int32_t j = 0; j < t->n_off; j++) {
            loip_load_extent e = t->ext[j];
            uint64_t rel = e.slot_offset;
            e.slot_offset = 0;
            uint64_t tag = r->next_tag++;
            if ((rc = loip_loader_submit(r->l, 0, &e, 1, tag))) return rc;
            t->tag = tag, t->slot = -1, t->state = LOADING; /* (no slot of the rotation is held) */
            if ((rc = await(r, k))) return rc;
            int32_t b = t->first + j;
            for (int32_t i = 0; i < t->n_views; i++) {
                const loip_stage_view *v = &t->views[i];
                if (2 * v->layer + block_of(v->which) == b)
                    r->m->layers[(size_t)v->layer * LOIP_W_COUNT + v->which].data = base + (v->slot_offset - rel);
            }
            rc = compute(r, k, b, b + 1, hidden, n, 1);
            t->state = IDLE;
            if (rc) return rc;
        }
        return compute(r, k, t->first + t->n_off, t->last, hidden, n, 0);
    }
    if (t->n_off > 0) {
        /* A ring's ranges are freed in load order: a stage run before older loads is read again. */
        if (r->ring && t->state != IDLE && r->live[0] != k) drain(r);
        if (t->state == IDLE) { /* out of order, its last load failed, or no prefetch: read it now */
            drain(r);
            r->next_load = k;
            if ((rc = start_loads_n(r, r->no_prefetch ? 1 : -1))) return rc;
            if (t->state == IDLE)
                return loip_fail(LOIP_ESTATE, "runner: stage %d: its %llu bytes do not fit the slot",
                                 k, (unsigned long long)t->bytes);
        }
        if (t->state == LOADING && (rc = await(r, k))) return rc;
        bind_views(r, t);
        rc = compute(r, k, t->first, t->first + t->n_off, hidden, n, 1);
        release(r, t);
        if (rc) return rc;
        if ((rc = start_loads(r))) return rc;
    }
    return compute(r, k, t->first + t->n_off, t->last, hidden, n, 0);
}

LOIP_API int loip_runner_restage(loip_runner *r, int32_t k, const loip_stage_desc *d) {
    if (k < 0 || k >= r->n) return loip_fail(LOIP_EINVAL, "runner: stage %d out of range (%d stages)", k, r->n);
    if (!d || d->first_block != r->st[k].first || d->last_block != r->st[k].last)
        return loip_fail(LOIP_EINVAL, "runner: a stage change keeps the stage's blocks [%d, %d)", r->st[k].first,
                         r->st[k].last);
    if (r->l) drain(r);
    rstage old = r->st[k];
    memset(&r->st[k], 0, sizeof r->st[k]);
    int rc = copy_stage(r, k, d, r->l ? loip_loader_slot_bytes(r->l) : 0);
    if (rc) {
        stage_free(&r->st[k]);
        r->st[k] = old;
        r->st[k].state = IDLE, r->st[k].slot = -1;
    } else {
        stage_free(&old);
    }
    r->n_offloading = 0;
    for (int32_t i = 0; i < r->n; i++) r->n_offloading += r->st[i].n_off > 0 && !r->st[i].per_block;
    r->next_load = r->n_offloading ? next_offloading(r, r->n - 1) : 0;
    int lrc = start_loads(r);
    return rc ? rc : lrc;
}

LOIP_API int loip_runner_set_loader(loip_runner *r, loip_loader *l) {
    if (!l) { /* detach: the loads in flight are waited for; nothing offloaded runs until a loader is set */
        if (r->l) drain(r);
        loip_loader_free(r->l);
        r->l = NULL;
        return LOIP_OK;
    }
    uint64_t slot_bytes = loip_loader_slot_bytes(l);
    int32_t n_slots = loip_loader_slots(l);
    for (int32_t k = 0; k < r->n; k++) { /* every stage's reads must fit the new slots */
        const rstage *t = &r->st[k];
        for (int32_t i = 0; i < t->n_ext; i++) {
            uint64_t end = t->per_block ? t->ext[i].length : t->ext[i].slot_offset + t->ext[i].length;
            if (end > slot_bytes)
                return loip_fail(LOIP_EINVAL, "runner: stage %d reads %llu bytes, the new loader's slots hold %llu", k,
                                 (unsigned long long)end, (unsigned long long)slot_bytes);
        }
    }
    int32_t *fs = malloc((size_t)n_slots * sizeof *fs), *live = malloc((size_t)r->n * sizeof *live);
    if (!fs || !live) {
        free(fs), free(live);
        return loip_fail(LOIP_ENOMEM, "runner: out of memory");
    }
    if (r->l) drain(r);
    free(r->free_slots);
    free(r->live);
    loip_loader_retain(l); /* (before the old one goes: it may be the same) */
    loip_loader_free(r->l);
    r->l = l, r->free_slots = fs, r->live = live, r->n_free = 0, r->n_live = 0, r->ring_tail = 0;
    r->ring = n_slots == 1, r->ring_bytes = slot_bytes;
    for (int32_t i = n_slots - 1; i >= 0; i--) r->free_slots[r->n_free++] = i;
    /* the offloaded weights point into the new first slot until their next load rebinds them */
    for (int32_t k = 0; k < r->n; k++) {
        const rstage *t = &r->st[k];
        const uint8_t *base = loip_loader_slot_data(l, 0);
        for (int32_t i = 0; i < t->n_views; i++) {
            const loip_stage_view *v = &t->views[i];
            uint64_t at = v->slot_offset;
            if (t->per_block) at -= t->ext[2 * v->layer + block_of(v->which) - t->first].slot_offset;
            r->m->layers[(size_t)v->layer * LOIP_W_COUNT + v->which].data = base + at;
        }
    }
    r->next_load = r->n_offloading ? next_offloading(r, r->n - 1) : 0;
    return start_loads(r);
}

/* Bad batches or positions fail in the preparation, before a load is consumed. */
LOIP_API int loip_runner_stage_batch(loip_runner *r, int32_t k, float *hidden, int32_t n,
                                     const loip_batch_token *toks) {
    if (!toks) return loip_fail(LOIP_EINVAL, "runner: a batch without its tokens' sequences and positions");
    int rc = loip_session_prepare(r->s, n, toks, 0);
    return rc ? rc : stage_run(r, k, hidden, n);
}

/* Embedding, every stage, head (head(r, hidden, n, arg) when the caller wants logits). */
static int forward_prepared(loip_runner *r, const int32_t *tokens, int32_t n, float *hidden) {
    uint64_t t0 = loip_now_ns();
    int rc = loip_session_embed(r->s, tokens, n, hidden);
    if (rc) return rc;
    uint64_t t1 = loip_now_ns();
    r->stats.compute_ns += t1 - t0;
    record(r, LOIP_EVENT_COMPUTE, -1, -1, 0, t0, t1, 0, 0, n);
    for (int32_t k = 0; k < r->n; k++)
        if ((rc = stage_run(r, k, hidden, n))) return rc;
    return LOIP_OK;
}

static void head_done(loip_runner *r, int32_t n, uint64_t t0) {
    uint64_t t1 = loip_now_ns();
    int32_t n_blocks = 2 * r->m->cfg.n_layers;
    r->stats.compute_ns += t1 - t0;
    record(r, LOIP_EVENT_COMPUTE, -1, n_blocks, n_blocks + 1, t0, t1, 0, 0, n);
}

LOIP_API int loip_runner_forward_batch(loip_runner *r, const int32_t *tokens, int32_t n,
                                       const loip_batch_token *toks, const int32_t *rows,
                                       int32_t n_rows, float *logits) {
    if (!toks) return loip_fail(LOIP_EINVAL, "runner: a batch without its tokens' sequences and positions");
    float *hidden = loip_session_hidden(r->s);
    int rc = loip_session_prepare(r->s, n, toks, 0);
    if (rc || (rc = forward_prepared(r, tokens, n, hidden))) return rc;
    if (n_rows <= 0) return LOIP_OK;
    uint64_t t0 = loip_now_ns();
    rc = loip_session_head_rows(r->s, hidden, n, rows, n_rows, logits);
    head_done(r, n_rows, t0);
    return rc;
}

LOIP_API int loip_runner_record(loip_runner *r, int32_t kind, int32_t stage, uint64_t t0_ns,
                                uint64_t t1_ns, uint64_t bytes) {
    record(r, kind, stage, -1, -1, t0_ns, t1_ns, bytes, 0, 0);
    return LOIP_OK;
}

LOIP_API int loip_runner_set_prefetch(loip_runner *r, int32_t prefetch) {
    r->no_prefetch = !prefetch;
    return LOIP_OK;
}

int loip_events_take(loip_runner_event *ev, int32_t *count, loip_runner_event *out, int32_t cap) {
    if (cap <= 0) return 0;
    int32_t k = *count < cap ? *count : cap;
    memcpy(out, ev, (size_t)k * sizeof *out);
    memmove(ev, ev + k, (size_t)(*count - k) * sizeof *ev);
    *count -= k;
    return k;
}

LOIP_API int loip_runner_events(loip_runner *r, loip_runner_event *out, int32_t cap) {
    return loip_events_take(r->ev, &r->ev_count, out, cap);
}

LOIP_API int loip_runner_stats(loip_runner *r, loip_runner_stats_t *out) {
    *out = r->stats;
    return LOIP_OK;
}
