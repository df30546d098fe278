/* Run-time choice of the kernel variant: the best the CPU supports, or one named by the caller
 * or by the environment variable LOIP_KERNELS (ref, avx2, avx512, amx, amx-auto, auto). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/kernels.h"

#define EXPORT __attribute__((visibility("default")))

static const loip_kernels *best(void) {
#ifdef LOIP_X86
    /* avx512, never amx or amx-auto by default: only a variant whose matmul equals its matvec
     * bit for bit at every token count keeps a request's tokens independent of what shares its
     * step (other requests' rows, its drafts, a prefix cache's groups). amx-auto (AMX from a
     * threshold of tokens) prefills ~2x faster but differs from one-token decode in the last
     * bits there; LOIP_KERNELS=amx-auto chooses it (README, "Build options"). */
    const loip_kernels *k;
    if ((k = loip_kernels_avx512())) return k;
    if ((k = loip_kernels_avx2())) return k;
#endif
    return loip_kernels_ref();
}

static const loip_kernels *by_name(const char *name) {
    if (!strcmp(name, "auto")) return best();
    if (!strcmp(name, "ref")) return loip_kernels_ref();
#ifdef LOIP_X86
    if (!strcmp(name, "avx2")) return loip_kernels_avx2();
    if (!strcmp(name, "avx512")) return loip_kernels_avx512();
#ifdef LOIP_HAVE_AMX
    if (!strcmp(name, "amx")) return loip_kernels_amx();
    if (!strcmp(name, "amx-auto")) return loip_kernels_amx_auto();
#endif
#endif
    return NULL;
}

static _Atomic size_t amx_rows = LOIP_AMX_ROWS_DEFAULT;

EXPORT size_t loip_kernels_amx_rows(size_t rows) {
    if (rows) atomic_store_explicit(&amx_rows, rows, memory_order_relaxed);
    return atomic_load_explicit(&amx_rows, memory_order_relaxed);
}

/* The answer for name == NULL, decided once: the environment is read at the first call only, so
 * a later setenv() cannot switch variants under a running model. A variant the environment
 * names but the CPU lacks (or a misspelling) is remembered as NULL, for the caller to report. */
static const loip_kernels none; /* stands for "decided: NULL" */
static _Atomic(const loip_kernels *) from_env;

EXPORT const loip_kernels *loip_kernels_select(const char *name) {
    if (name) return by_name(name);
    const loip_kernels *k = atomic_load_explicit(&from_env, memory_order_acquire);
    if (!k) {
        /* Racing first calls compute the same answer; whichever store lands is fine. */
        const char *env = getenv("LOIP_KERNELS");
        k = env && *env ? by_name(env) : best();
        if (!k) k = &none;
        atomic_store_explicit(&from_env, k, memory_order_release);
    }
    return k == &none ? NULL : k;
}

static _Atomic size_t sweep_bytes; /* 0 until the first call reads the L2 size */

size_t loip_kernels_sweep_rows(size_t row_bytes, size_t tile, size_t min, size_t max) {
    size_t b = atomic_load_explicit(&sweep_bytes, memory_order_relaxed);
    if (!b) {
        long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); /* 0 or -1 where the C library cannot tell */
        b = l2 > 0 ? (size_t)l2 / 2 : (size_t)256 * 1024;
        atomic_store_explicit(&sweep_bytes, b, memory_order_relaxed);
    }
    size_t rows = row_bytes ? b / row_bytes : max;
    rows = rows < min ? min : rows > max ? max : rows;
    return rows > tile ? rows / tile * tile : tile;
}
