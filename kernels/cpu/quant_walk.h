/* How the SIMD quantized kernels (quant_avx2.c, quant_avx512.c, quant_avx512_vbmi.c) walk a
 * matrix's rows: matvec in MV_ROWS streams, matmul in sweeps of rows that stay in L2 while every
 * token passes. Included by each of them after it has defined:
 *   AI, MV_ROWS, MM_ROWS, MM_TOKENS (4), MM_SWEEP_MIN, MM_SWEEP_MAX, and
 *   qtile(dt, R, T, Y, ldy, W, X, r, S, cols, pf): Y[j*ldy + r + i*S] = row r + i*S of W dot
 *   token j of X, for i < R, j < T, with dt a constant at each call site and pf matvec's software
 *   prefetch distance (0: none).
 * The walk decides only which rows share a tile, never a row's order of operations, so matmul
 * equals matvec per token bit for bit whatever the tiles are. */
#ifndef LOIP_QUANT_WALK_H
#define LOIP_QUANT_WALK_H

/* matvec's software prefetch: pf bytes ahead of byte off of the row at p. A matvec tile's rows
 * are MV_ROWS streams through memory (matvec_impl), so once off + pf passes this row's end it
 * lands in the row the same stream reads next. (Integer arithmetic: the address may lie past
 * W's end, which a prefetch may name and C pointer arithmetic may not.) */
AI void prefetch_at(const uint8_t *p, size_t off, size_t pf) {
    _mm_prefetch((const char *)((uintptr_t)p + off + pf), _MM_HINT_T0);
}

AI void qtile(const int dt, const int R, const int T, float *Y, size_t ldy, const void *W,
              const float *X, size_t r, size_t S, size_t cols, size_t pf);

/* The thread's rows [r0, r1) as MV_ROWS runs of q consecutive rows: tile i takes row i of every
 * run, so its rows are MV_ROWS streams, each walking its run's bytes in order as the probe's
 * streams do (adjacent rows in one tile would put several streams in each 4 KB page, which
 * the hardware prefetchers do not follow; this took AVX-512's MXFP4 2880x2880 from ~0.65 to
 * ~0.95 of the probe, AVX2's F8 from ~0.59 to ~0.75). */
AI void matvec_impl(const int dt, float *y, const void *W, const float *x, size_t r0, size_t r1,
                    size_t cols) {
    const size_t pf = loip_quant_prefetch(), q = (r1 - r0) / MV_ROWS;
    for (size_t i = 0; i < q; i++) qtile(dt, MV_ROWS, 1, y, 0, W, x, r0 + i, q, cols, pf);
    for (size_t r = r0 + q * MV_ROWS; r < r1; r++) qtile(dt, 1, 1, y, 0, W, x, r, 1, cols, pf);
}

_Static_assert(MM_TOKENS == 4, "tile_any covers 1..4 tokens");
AI void tile_any(const int dt, const int R, size_t T, float *Y, size_t ldy, const void *W,
                 const float *X, size_t r, size_t cols) {
    switch (T) {
    case 1: qtile(dt, R, 1, Y, ldy, W, X, r, 1, cols, 0); break;
    case 2: qtile(dt, R, 2, Y, ldy, W, X, r, 1, cols, 0); break;
    case 3: qtile(dt, R, 3, Y, ldy, W, X, r, 1, cols, 0); break;
    default: qtile(dt, R, 4, Y, ldy, W, X, r, 1, cols, 0); break;
    }
}

AI void matmul_impl(const int dt, float *Y, size_t ldy, const void *W, const float *X, size_t n,
                    size_t r0, size_t r1, size_t cols) {
    const int TR = dt == LOIP_KDT_F8_E4M3 ? MM_ROWS / 2 : MM_ROWS; /* (F8: twice the accumulators) */
    const size_t sweep = loip_kernels_sweep_rows(
        dt == LOIP_KDT_MXFP4 ? loip_mxfp4_row_bytes(cols) : cols, TR, MM_SWEEP_MIN, MM_SWEEP_MAX);
    for (size_t rs = r0; rs < r1; rs += sweep) {
        size_t re = rs + sweep < r1 ? rs + sweep : r1;
        for (size_t t = 0; t < n; t += MM_TOKENS) {
            size_t T = n - t < MM_TOKENS ? n - t : MM_TOKENS;
            size_t r = rs;
            for (; r + TR <= re; r += TR) tile_any(dt, TR, T, Y + t * ldy, ldy, W, X + t * cols, r, cols);
            for (; r < re; r++) tile_any(dt, 1, T, Y + t * ldy, ldy, W, X + t * cols, r, cols);
        }
    }
}

#endif
