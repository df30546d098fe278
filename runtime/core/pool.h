/* Fork-join thread pool used by the executor (internal). */
#ifndef LOIP_POOL_H
#define LOIP_POOL_H

#include <stddef.h>

#include "loip.h"

/* A task runs once on each of the pool's nth threads (ith = 0 is the caller). */
typedef void (*loip_task_fn)(void *arg, int ith, int nth);

/* Runs fn on every thread and returns when all are done. pool == NULL runs fn(arg, 0, 1). */
void loip_pool_run(loip_pool *pool, loip_task_fn fn, void *arg);

/* Thread ith's share [*b, *e) of [0, total), cut at multiples of `grain` so that threads do
 * not write to the same cache line. */
void loip_split(size_t total, size_t grain, int ith, int nth, size_t *b, size_t *e);

#endif
