/* Internal: batched linear layers on the pool. */
#ifndef LOIP_OPS_H
#define LOIP_OPS_H

#include <stddef.h>

#include "loip.h"

/* y = W . x for n tokens (n == 1: matvec; else y is [n][rows], x is [n][cols]). A list of
 * jobs ends with W == NULL and runs as one dispatch, each thread taking its share of the rows
 * of every job: q/k/v or gate/up then cost one synchronisation instead of three. */
typedef struct loip_linear_job_s {
    const void *W;
    int32_t dtype;
    const float *x;
    float *y;
    size_t n, rows, cols;
    size_t ldy; /* floats between two tokens' outputs (0: rows); a head read by chunks: the vocabulary */
} loip_linear_job;

void loip_linear_run(loip_pool *pool, loip_linear_job *jobs);

/* Process-wide time spent in phases of the forward pass (loip_phase_ns reads them): ns added
 * to LOIP_PHASE_* by the caller that timed it. */
enum { LOIP_PHASE_LINEAR = 0, LOIP_PHASE_ATTENTION = 1, LOIP_PHASE_COUNT = 2 };
void loip_phase_add(int phase, uint64_t ns);

/* The job y = w . x for n tokens (w a bound [rows, cols] weight). */
static inline loip_linear_job loip_linear_of(const loip_tensor *w, const float *x, float *y, int n) {
    return (loip_linear_job){.W = w->data, .dtype = w->dtype, .x = x, .y = y, .n = (size_t)n,
                             .rows = (size_t)w->shape[0], .cols = (size_t)w->shape[1]};
}

/* h = silu(h) * h2, as run.c computes it, over rows [start[r], start[r] + count[r]) of width
 * floats each, r < n_ranges (a dense MLP: one range; a mixture of experts: the experts computed
 * at once), in one dispatch. */
void loip_swiglu_run(loip_pool *pool, float *h, const float *h2, const int32_t *start, const int32_t *count,
                     int n_ranges, int width);
/* The same with the gate's activation act (LOIP_ACT_*: SiLU, or GELU's tanh approximation). */
void loip_gate_run(loip_pool *pool, int act, float *h, const float *h2, const int32_t *start, const int32_t *count,
                   int n_ranges, int width);
/* The same with the config's gated unit (c->glu: LOIP_GLU_*; the routed experts'). */
void loip_glu_run(loip_pool *pool, const loip_model_config *c, float *h, const float *h2, const int32_t *start,
                  const int32_t *count, int n_ranges, int width);

#endif
