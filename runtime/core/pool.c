/* Fork-join thread pool. Decoding dispatches ~10 tasks per layer, each only tens of
 * microseconds long, so workers spin briefly on a generation counter before sleeping on a
 * condition variable; a dispatch then costs about a microsecond instead of a futex wake-up.
 * The sleep path uses the Dekker pattern on two seq_cst atomics (generation, sleepers) so a
 * wake-up is never lost. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/core.h"
#include "core/pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

enum { SPIN_ITERS = 20000 }; /* ~1 ms of pause instructions before a worker sleeps */

struct loip_pool {
    int n;                 /* threads including the caller */
    pthread_t *threads;    /* (n - 1) workers */
    loip_task_fn fn;
    void *arg;
    atomic_uint generation; /* bumped once per dispatch */
    atomic_int remaining;   /* workers still running the current task */
    atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct {
    loip_pool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    loip_pool *pool = wa.pool;
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load(&pool->generation) == seen && spins < SPIN_ITERS) {
            cpu_relax();
            spins++;
        }
        if (atomic_load(&pool->generation) == seen) {
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->generation) == seen) pthread_cond_wait(&pool->cv, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        seen = atomic_load(&pool->generation);
        if (atomic_load(&pool->stop)) break;
        pool->fn(pool->arg, wa.ith, pool->n);
        atomic_fetch_sub_explicit(&pool->remaining, 1, memory_order_release);
    }
    return NULL;
}

static void wake_all(loip_pool *pool) {
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
}

LOIP_API int loip_pool_new(int32_t n_threads, loip_pool **out) {
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int32_t)n : 1;
    }
    if (n_threads > 1024) return loip_fail(LOIP_EINVAL, "threads: %d is more than 1024", n_threads);
    loip_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return loip_fail(LOIP_ENOMEM, "thread pool: out of memory");
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!pool->threads) {
        free(pool);
        return loip_fail(LOIP_ENOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        int rc = wa ? 0 : ENOMEM;
        if (wa) {
            wa->pool = pool;
            wa->ith = i;
            rc = pthread_create(&pool->threads[i - 1], NULL, worker_main, wa);
            if (rc) free(wa);
        }
        if (rc) {
            pool->n = i; /* join the ones started */
            loip_pool_free(pool);
            return loip_fail(-rc, "thread pool: cannot start thread %d of %d", i, n_threads);
        }
    }
    *out = pool;
    return LOIP_OK;
}

LOIP_API void loip_pool_free(loip_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i - 1], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool);
}

LOIP_API int32_t loip_pool_size(const loip_pool *pool) { return pool ? pool->n : 1; }

void loip_pool_run(loip_pool *pool, loip_task_fn fn, void *arg) {
    if (!pool || pool->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store(&pool->remaining, pool->n - 1);
    atomic_fetch_add(&pool->generation, 1); /* publishes fn/arg (seq_cst) */
    wake_all(pool);
    fn(arg, 0, pool->n);
    while (atomic_load_explicit(&pool->remaining, memory_order_acquire) > 0) cpu_relax();
}

void loip_split(size_t total, size_t grain, int ith, int nth, size_t *b, size_t *e) {
    if (grain == 0) grain = 1;
    size_t units = (total + grain - 1) / grain;
    size_t ub = units * (size_t)ith / (size_t)nth, ue = units * (size_t)(ith + 1) / (size_t)nth;
    *b = ub * grain < total ? ub * grain : total;
    *e = ue * grain < total ? ue * grain : total;
}
