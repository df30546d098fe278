/* The block-quantized weight dtypes (loip.h's LOIP_MXFP4 and LOIP_F8_E4M3) as the CPU kernels
 * read them: element decoding, the packed layouts' addresses, and each variant's matvec and
 * matmul (quant_ref.c, quant_avx2.c, quant_avx512.c), which kernels_*.c put in their tables.
 *
 * MXFP4, every variant, and F8 in the reference compute with the dequantized weight w, exactly
 * the f32 value loip_dequantize gives (MXFP4: E2M1 x 2^(e-127), exact or +-inf; F8:
 * fl(E4M3 x scale), one rounding), accumulated as that variant's f32 kernel does (the same
 * lanes, column order and final reduction): bit for bit its f32 kernel on the dequantized
 * matrix. The SIMD F8 kernels instead sum E4M3 x x over each 128-column block (every product
 * exact) and add that sum times the block's scale: one multiply per block, not per weight,
 * which is what keeps them at memory speed; within f32 rounding of the others
 * (tests/test_quant_kernels.c checks both). In every variant matmul equals matvec per token, bit
 * for bit (the determinism contract of kernels.h). The avx512 table's F8 kernels are
 * quant_avx512_vbmi.c's where the CPU has VBMI, AVX2's elsewhere.
 *
 * Decode reads each weight once, so the SIMD matvecs are meant to be paced by memory (where one
 * is paced by its decoding instead, recipes/bench/quant.lua's rate from L2 shows it): a tile's
 * rows are not adjacent but one from each of MV_ROWS runs of the thread's rows, so that each
 * row's FMA chain is also one sequential stream through memory (as the read probe's), which the
 * hardware prefetchers follow across pages, helped by a software prefetch
 * loip_quant_prefetch() bytes ahead in every stream. */
#ifndef LOIP_QUANT_H
#define LOIP_QUANT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/kernels.h"

/* MXFP4: 32 values in 17 bytes (E8M0 scale, then 16 bytes: element j in the low nibble of byte
 * j, element j + 16 in its high nibble). Rows of cols / 32 blocks; cols % 32 == 0. */
#define LOIP_MXFP4_BLOCK 32
#define LOIP_MXFP4_BLOCK_BYTES 17
/* F8: groups of 128 rows, each [ceil(cols/128) float32 scales][rows x cols E4M3 bytes]. */
#define LOIP_F8_BLOCK 128

static inline float loip_q_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* E2M1 (OCP MX FP4): sign, 2 exponent bits (bias 1), 1 mantissa bit; no NaN or infinity. */
static const float loip_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E8M0: 2^(e-127); 0xFF is NaN (the OCP MX spec); e = 0 is 2^-127, an f32 subnormal. */
static inline float loip_e8m0_to_f32(uint8_t e) {
    if (e == 0xFF) return loip_q_bits_f32(0x7FC00000u);
    if (e == 0) return loip_q_bits_f32(0x00400000u);
    return loip_q_bits_f32((uint32_t)e << 23);
}

/* E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits (subnormals below 2^-6); S.1111.111
 * is NaN, there is no infinity. A table (quant_ref.c): computing it through an f32 subnormal
 * would cost a microcode assist per value on x86. */
extern const float loip_e4m3_table[256];
static inline float loip_e4m3_to_f32(uint8_t b) { return loip_e4m3_table[b]; }

/* The same for every e (quant_ref.c): what the SIMD kernels broadcast, a load and no shuffle. */
extern const float loip_e8m0_table[256];

static inline size_t loip_mxfp4_row_bytes(size_t cols) {
    return cols / LOIP_MXFP4_BLOCK * LOIP_MXFP4_BLOCK_BYTES;
}

/* F8's scales per row (ceil(cols/128)) and the bytes of one whole group of 128 rows. */
static inline size_t loip_f8_scales_per_row(size_t cols) {
    return (cols + LOIP_F8_BLOCK - 1) / LOIP_F8_BLOCK;
}
static inline size_t loip_f8_group_bytes(size_t cols) {
    return 4 * loip_f8_scales_per_row(cols) + (size_t)LOIP_F8_BLOCK * cols;
}
/* Row r's E4M3 bytes, and the scales of its group (scale k covers columns [128k, 128k+128)). */
static inline const uint8_t *loip_f8_row(const void *W, size_t r, size_t cols) {
    return (const uint8_t *)W + r / LOIP_F8_BLOCK * loip_f8_group_bytes(cols) +
           4 * loip_f8_scales_per_row(cols) + r % LOIP_F8_BLOCK * cols;
}
/* (bytes, not floats: a row range's scales need not be 4-byte aligned, since W is wherever the
 * range starts in the loaded layer; read scale k with loip_f8_scale) */
static inline const uint8_t *loip_f8_scales(const void *W, size_t r, size_t cols) {
    return (const uint8_t *)W + r / LOIP_F8_BLOCK * loip_f8_group_bytes(cols);
}
static inline float loip_f8_scale(const uint8_t *scales, size_t k) {
    float s;
    memcpy(&s, scales + 4 * k, sizeof s);
    return s;
}

/* The SIMD matvec kernels' software prefetch distance: bytes ahead in each weight row stream
 * (0: none). A parameter, not a constant (loip_kernels_set_prefetch; recipes/bench/quant.lua
 * --prefetch measures it): the best distance is the machine's memory latency times the rate,
 * LOIP_QUANT_PREFETCH_DEFAULT what the kernels use unless told. */
#define LOIP_QUANT_PREFETCH_DEFAULT 1024
extern _Atomic size_t loip_quant_prefetch_bytes;
static inline size_t loip_quant_prefetch(void) {
    return atomic_load_explicit(&loip_quant_prefetch_bytes, memory_order_relaxed);
}

/* The variants' kernels (signatures of kernels.h's loip_matvec_fn / loip_matmul_fn). */
#define LOIP_QUANT_KERNELS(v)                                                                    \
    void loip_##v##_matvec_mxfp4(float *y, const void *W, const float *x, size_t r0, size_t r1, \
                                 size_t cols);                                                   \
    void loip_##v##_matmul_mxfp4(float *Y, size_t ldy, const void *W, const float *X, size_t n, \
                                 size_t r0, size_t r1, size_t cols);                             \
    void loip_##v##_matvec_f8(float *y, const void *W, const float *x, size_t r0, size_t r1,    \
                              size_t cols);                                                      \
    void loip_##v##_matmul_f8(float *Y, size_t ldy, const void *W, const float *X, size_t n,    \
                              size_t r0, size_t r1, size_t cols);
LOIP_QUANT_KERNELS(ref)
LOIP_QUANT_KERNELS(avx2)
LOIP_QUANT_KERNELS(avx512)
#undef LOIP_QUANT_KERNELS
void loip_avx512vbmi_matvec_f8(float *y, const void *W, const float *x, size_t r0, size_t r1,
                               size_t cols);
void loip_avx512vbmi_matmul_f8(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                               size_t r0, size_t r1, size_t cols);
/* Their tables (MXFP4's E2M1 values under each of the 256 scales, F8's bf16 bytes), made once;
 * called by loip_kernels_avx2() / loip_kernels_avx512() once the CPU has passed their checks
 * (loip_avx512_quant_init calls the VBMI one where the CPU has VBMI). */
void loip_avx2_quant_init(void);
void loip_avx512_quant_init(void);
void loip_avx512vbmi_quant_init(void);

#endif
