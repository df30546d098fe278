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
} loip_linear_job;

void loip_linear_run(loip_pool *pool, loip_linear_job *jobs);

#endif
