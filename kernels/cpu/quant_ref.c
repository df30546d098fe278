/* Portable reference of the MXFP4 and F8 (E4M3FN with block scales) kernels: the oracle for the
 * SIMD variants. Each weight is dequantized exactly as loip_dequantize does and accumulated as
 * kernels_ref.c's f32 dot product is (LANES partial sums, column c in lane c % LANES, then the
 * same pairwise reduction), so a row's result equals the f32 reference on the dequantized row.
 * matmul calls matvec once per token (the determinism contract). */
#include <math.h>

#include "cpu/quant.h"

#define LANES 8

/* loip_e8m0_to_f32(e) for every e, for the SIMD kernels' broadcasts from memory. */
const float loip_e8m0_table[256] = {
    0x1p-127f, 0x1p-126f, 0x1p-125f, 0x1p-124f, 0x1p-123f, 0x1p-122f, 0x1p-121f, 0x1p-120f,
    0x1p-119f, 0x1p-118f, 0x1p-117f, 0x1p-116f, 0x1p-115f, 0x1p-114f, 0x1p-113f, 0x1p-112f,
    0x1p-111f, 0x1p-110f, 0x1p-109f, 0x1p-108f, 0x1p-107f, 0x1p-106f, 0x1p-105f, 0x1p-104f,
    0x1p-103f, 0x1p-102f, 0x1p-101f, 0x1p-100f, 0x1p-99f, 0x1p-98f, 0x1p-97f, 0x1p-96f,
    0x1p-95f, 0x1p-94f, 0x1p-93f, 0x1p-92f, 0x1p-91f, 0x1p-90f, 0x1p-89f, 0x1p-88f,
    0x1p-87f, 0x1p-86f, 0x1p-85f, 0x1p-84f, 0x1p-83f, 0x1p-82f, 0x1p-81f, 0x1p-80f,
    0x1p-79f, 0x1p-78f, 0x1p-77f, 0x1p-76f, 0x1p-75f, 0x1p-74f, 0x1p-73f, 0x1p-72f,
    0x1p-71f, 0x1p-70f, 0x1p-69f, 0x1p-68f, 0x1p-67f, 0x1p-66f, 0x1p-65f, 0x1p-64f,
    0x1p-63f, 0x1p-62f, 0x1p-61f, 0x1p-60f, 0x1p-59f, 0x1p-58f, 0x1p-57f, 0x1p-56f,
    0x1p-55f, 0x1p-54f, 0x1p-53f, 0x1p-52f, 0x1p-51f, 0x1p-50f, 0x1p-49f, 0x1p-48f,
    0x1p-47f, 0x1p-46f, 0x1p-45f, 0x1p-44f, 0x1p-43f, 0x1p-42f, 0x1p-41f, 0x1p-40f,
    0x1p-39f, 0x1p-38f, 0x1p-37f, 0x1p-36f, 0x1p-35f, 0x1p-34f, 0x1p-33f, 0x1p-32f,
    0x1p-31f, 0x1p-30f, 0x1p-29f, 0x1p-28f, 0x1p-27f, 0x1p-26f, 0x1p-25f, 0x1p-24f,
    0x1p-23f, 0x1p-22f, 0x1p-21f, 0x1p-20f, 0x1p-19f, 0x1p-18f, 0x1p-17f, 0x1p-16f,
    0x1p-15f, 0x1p-14f, 0x1p-13f, 0x1p-12f, 0x1p-11f, 0x1p-10f, 0x1p-9f, 0x1p-8f,
    0x1p-7f, 0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f, 0x1p0f,
    0x1p1f, 0x1p2f, 0x1p3f, 0x1p4f, 0x1p5f, 0x1p6f, 0x1p7f, 0x1p8f,
    0x1p9f, 0x1p10f, 0x1p11f, 0x1p12f, 0x1p13f, 0x1p14f, 0x1p15f, 0x1p16f,
    0x1p17f, 0x1p18f, 0x1p19f, 0x1p20f, 0x1p21f, 0x1p22f, 0x1p23f, 0x1p24f,
    0x1p25f, 0x1p26f, 0x1p27f, 0x1p28f, 0x1p29f, 0x1p30f, 0x1p31f, 0x1p32f,
    0x1p33f, 0x1p34f, 0x1p35f, 0x1p36f, 0x1p37f, 0x1p38f, 0x1p39f, 0x1p40f,
    0x1p41f, 0x1p42f, 0x1p43f, 0x1p44f, 0x1p45f, 0x1p46f, 0x1p47f, 0x1p48f,
    0x1p49f, 0x1p50f, 0x1p51f, 0x1p52f, 0x1p53f, 0x1p54f, 0x1p55f, 0x1p56f,
    0x1p57f, 0x1p58f, 0x1p59f, 0x1p60f, 0x1p61f, 0x1p62f, 0x1p63f, 0x1p64f,
    0x1p65f, 0x1p66f, 0x1p67f, 0x1p68f, 0x1p69f, 0x1p70f, 0x1p71f, 0x1p72f,
    0x1p73f, 0x1p74f, 0x1p75f, 0x1p76f, 0x1p77f, 0x1p78f, 0x1p79f, 0x1p80f,
    0x1p81f, 0x1p82f, 0x1p83f, 0x1p84f, 0x1p85f, 0x1p86f, 0x1p87f, 0x1p88f,
    0x1p89f, 0x1p90f, 0x1p91f, 0x1p92f, 0x1p93f, 0x1p94f, 0x1p95f, 0x1p96f,
    0x1p97f, 0x1p98f, 0x1p99f, 0x1p100f, 0x1p101f, 0x1p102f, 0x1p103f, 0x1p104f,
    0x1p105f, 0x1p106f, 0x1p107f, 0x1p108f, 0x1p109f, 0x1p110f, 0x1p111f, 0x1p112f,
    0x1p113f, 0x1p114f, 0x1p115f, 0x1p116f, 0x1p117f, 0x1p118f, 0x1p119f, 0x1p120f,
    0x1p121f, 0x1p122f, 0x1p123f, 0x1p124f, 0x1p125f, 0x1p126f, 0x1p127f, NAN,
};

static float reduce_lanes(float acc[LANES]) {
    for (int h = LANES / 2; h > 0; h /= 2)
        for (int j = 0; j < h; j++) acc[j] += acc[j + h];
    return acc[0];
}

/* One MXFP4 row . x: block b holds columns [32b, 32b + 32); 32 is a multiple of LANES, so the
 * lanes of a block's columns are j % LANES in order. */
static float dot_row_mxfp4(const uint8_t *w, const float *x, size_t cols) {
    float acc[LANES] = {0};
    for (size_t b = 0; b < cols / LOIP_MXFP4_BLOCK; b++, w += LOIP_MXFP4_BLOCK_BYTES) {
        float s = loip_e8m0_to_f32(w[0]);
        const float *xb = x + b * LOIP_MXFP4_BLOCK;
        for (int j = 0; j < 16; j++) {
            acc[j % LANES] += loip_e2m1_values[w[1 + j] & 15] * s * xb[j];
        }
        for (int j = 0; j < 16; j++) {
            acc[(16 + j) % LANES] += loip_e2m1_values[w[1 + j] >> 4] * s * xb[16 + j];
        }
    }
    return reduce_lanes(acc);
}

void loip_ref_matvec_mxfp4(float *y, const void *W, const float *x, size_t r0, size_t r1,
                           size_t cols) {
    size_t rowb = loip_mxfp4_row_bytes(cols);
    for (size_t r = r0; r < r1; r++)
        y[r] = dot_row_mxfp4((const uint8_t *)W + r * rowb, x, cols);
}

void loip_ref_matmul_mxfp4(float *Y, size_t ldy, const void *W, const float *X, size_t n,
                           size_t r0, size_t r1, size_t cols) {
    for (size_t t = 0; t < n; t++) loip_ref_matvec_mxfp4(Y + t * ldy, W, X + t * cols, r0, r1, cols);
}

/* One F8 row . x with its group's scales s (scale c / 128 for column c). */
static float dot_row_f8(const uint8_t *w, const float *s, const float *x, size_t cols) {
    float acc[LANES] = {0};
    for (size_t c = 0; c < cols; c++) {
        float v = loip_e4m3_to_f32(w[c]) * s[c / LOIP_F8_BLOCK];
        acc[c % LANES] += v * x[c];
    }
    return reduce_lanes(acc);
}

void loip_ref_matvec_f8(float *y, const void *W, const float *x, size_t r0, size_t r1,
                        size_t cols) {
    for (size_t r = r0; r < r1; r++)
        y[r] = dot_row_f8(loip_f8_row(W, r, cols), loip_f8_scales(W, r, cols), x, cols);
}

void loip_ref_matmul_f8(float *Y, size_t ldy, const void *W, const float *X, size_t n, size_t r0,
                        size_t r1, size_t cols) {
    for (size_t t = 0; t < n; t++) loip_ref_matvec_f8(Y + t * ldy, W, X + t * cols, r0, r1, cols);
}
