/* test_rows.c — a weight table kept on disk (loip_rows_*, runtime/exec/rows.c) as the head reads
 * it: the logits of every chunking, read ahead (two buffers, io_uring) or each chunk when it is
 * needed, are the same bits as one chunk holding the table, for the whole table and for a range
 * of it (a cut head's share), F32 and BF16, at an unaligned offset, with a chunk that does not
 * divide the rows; from the second chunk of a call on, each chunk's read was under way before it
 * was needed, and from the second call on the first's too (loip_rows_ahead); another range's
 * read ahead is not mistaken for this one's; the buffers charged are two chunks (one when a chunk
 * holds the table); rows past the file's end fail naming the file, read ahead or not, and the
 * next call after it still works; a table freed with a read in flight is freed cleanly; a table
 * whose chunks are 4 KiB aligned gives the same bits every way, read through the page cache or
 * past it (loip_rows_set_direct: O_DIRECT where the filesystem allows). Exit 0 pass, 1 fail, 77 skip. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loip.h"
#include "check.h"

#define ROWS 100
#define COLS 40
#define N 3
#define OFFSET 37 /* the table's first byte in its file: not aligned */

static char dir[256], path[3][300];

/* Row i, column j of the table: values exact in bf16 (8 significant bits). */
static float value(int i, int j) {
    int v = ((i * 131 + j * 71) % 255) - 127;
    return ldexpf((float)v, -6 - (i + j) % 5);
}

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* The table in dtype at OFFSET of path k (a header of junk before it). */
static int write_table(int k, int dtype) {
    FILE *f = fopen(path[k], "wb");
    if (!f) return -1;
    for (int b = 0; b < OFFSET; b++) fputc(0xA5, f);
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < COLS; j++) {
            float v = value(i, j);
            uint16_t h = bf16(v);
            if (dtype == LOIP_F32) fwrite(&v, 4, 1, f);
            else fwrite(&h, 2, 1, f);
        }
    return fclose(f);
}

static float x[N * COLS];

/* Logits of rows [first, last) through a table of chunk rows (ahead on or off), calls times;
 * out: [N, ROWS], other rows left NAN. Returns the table's ahead count. */
static uint64_t logits_of(loip_pool *pool, int k, int dtype, int chunk, int ahead, int first, int last, int calls,
                          float *out) {
    loip_rows *r = NULL;
    CHECK(loip_rows_new(path[k], OFFSET, dtype, ROWS, COLS, 0, chunk, NULL, &r) == 0, "rows_new: %s", loip_last_error());
    if (!r) return 0;
    CHECK(loip_rows_set_ahead(r, ahead) == 0, "set_ahead");
    for (int c = 0; c < calls; c++) {
        for (int i = 0; i < N * ROWS; i++) out[i] = NAN;
        int rc = loip_rows_logits(r, pool, x, N, first, last, out);
        CHECK(rc == 0, "chunk %d ahead %d [%d, %d) call %d: %s", chunk, ahead, first, last, c, loip_last_error());
    }
    uint64_t got = loip_rows_ahead(r);
    loip_rows_free(r);
    return got;
}

static int same_bits(const float *a, const float *b, int first, int last) {
    for (int t = 0; t < N; t++)
        for (int i = first; i < last; i++)
            if (memcmp(&a[t * ROWS + i], &b[t * ROWS + i], 4) != 0) return 0;
    return 1;
}

static void test_dtype(loip_pool *pool, int k, int dtype, int ring) {
    const char *name = dtype == LOIP_F32 ? "F32" : "BF16";
    static float ref[N * ROWS], got[N * ROWS];
    /* one chunk holds the table (112 rows: 100 rounded up to 16), read when needed */
    logits_of(pool, k, dtype, 112, 0, 0, ROWS, 1, ref);
    double worst = 0;
    for (int t = 0; t < N; t++)
        for (int i = 0; i < ROWS; i++) {
            double want = 0;
            for (int j = 0; j < COLS; j++) want += (double)value(i, j) * x[t * COLS + j];
            worst = fmax(worst, fabs(ref[t * ROWS + i] - want));
        }
    CHECK(worst < 1e-4, "%s: logits against a double reference: off by %g", name, worst);
    int chunks[3] = {16, 48, 64};
    for (int c = 0; c < 3; c++)
        for (int ahead = 0; ahead < 2; ahead++) {
            int per = (ROWS + chunks[c] - 1) / chunks[c];
            uint64_t a = logits_of(pool, k, dtype, chunks[c], ahead, 0, ROWS, 3, got);
            CHECK(same_bits(ref, got, 0, ROWS), "%s chunk %d ahead %d: the bits of one chunk", name, chunks[c], ahead);
            uint64_t want = ahead && ring ? (uint64_t)(3 * per - 1) : 0;
            CHECK(a == want, "%s chunk %d ahead %d: %llu chunks read ahead, want %llu (%d a call, 3 calls)", name,
                  chunks[c], ahead, (unsigned long long)a, (unsigned long long)want, per);
            /* a range (a cut head's share): its rows the same, the others untouched */
            logits_of(pool, k, dtype, chunks[c], ahead, 21, 77, 2, got);
            CHECK(same_bits(ref, got, 21, 77) && isnan(got[20]) && isnan(got[77]) && isnan(got[2 * ROWS + 99]),
                  "%s chunk %d ahead %d: rows [21, 77) alone, the same bits", name, chunks[c], ahead);
        }
    /* ranges alternating on one table: the first chunk read ahead for one range is not the other's */
    loip_rows *r = NULL;
    CHECK(loip_rows_new(path[k], OFFSET, dtype, ROWS, COLS, 0, 16, NULL, &r) == 0, "rows_new: %s", loip_last_error());
    int ranges[4][2] = {{0, ROWS}, {21, 77}, {16, 48}, {0, ROWS}};
    for (int q = 0; q < 4 && r; q++) {
        for (int i = 0; i < N * ROWS; i++) got[i] = NAN;
        CHECK(loip_rows_logits(r, pool, x, N, ranges[q][0], ranges[q][1], got) == 0, "%s", loip_last_error());
        CHECK(same_bits(ref, got, ranges[q][0], ranges[q][1]), "%s: range [%d, %d) after another", name, ranges[q][0],
              ranges[q][1]);
    }
    loip_rows_free(r); /* (the next call's first chunk in flight: freed cleanly) */
}

static void test_budget(void) {
    loip_budget *b = NULL;
    CHECK(loip_budget_new(1 << 20, &b) == 0, "budget");
    loip_rows *r = NULL;
    const uint64_t row = COLS * 2;
    CHECK(loip_rows_new(path[1], OFFSET, LOIP_BF16, ROWS, COLS, 3, 16, b, &r) == 0, "%s", loip_last_error());
    CHECK(loip_budget_used(b) == (3 + 2 * 16) * row, "3 cached rows and two chunks of 16: %llu bytes",
          (unsigned long long)loip_budget_used(b));
    loip_rows_free(r);
    CHECK(loip_budget_used(b) == 0, "all given back");
    CHECK(loip_rows_new(path[1], OFFSET, LOIP_BF16, ROWS, COLS, 0, 128, b, &r) == 0, "%s", loip_last_error());
    CHECK(loip_budget_used(b) == 112 * row, "one chunk holds the table (112 rows): %llu bytes",
          (unsigned long long)loip_budget_used(b));
    loip_rows_free(r);
    loip_budget_free(b);
}

static void test_short_file(loip_pool *pool) {
    static float out[N * 2 * ROWS];
    for (int ahead = 0; ahead < 2; ahead++) {
        loip_rows *r = NULL;
        /* twice the rows the file holds */
        CHECK(loip_rows_new(path[0], OFFSET, LOIP_F32, 2 * ROWS, COLS, 0, 16, NULL, &r) == 0, "%s", loip_last_error());
        if (!r) continue;
        loip_rows_set_ahead(r, ahead);
        int rc = loip_rows_logits(r, pool, x, N, 0, 2 * ROWS, out);
        CHECK(rc == LOIP_EIO && strstr(loip_last_error(), path[0]) && strstr(loip_last_error(), "ends before"),
              "ahead %d: rows past the end: rc %d, %s", ahead, rc, loip_last_error());
        /* the rows that are there, read after the failure */
        rc = loip_rows_logits(r, pool, x, N, 0, 64, out);
        CHECK(rc == 0, "ahead %d: rows within the file after the failure: %s", ahead, loip_last_error());
        loip_rows_free(r);
    }
    CHECK(loip_rows_logits(NULL, pool, x, N, 0, 1, out) == LOIP_EINVAL, "no table");
}

/* A table of 4 KiB rows at a 4 KiB offset (50 x 1024 F32): its chunks of 16 rows aligned. */
static void test_aligned(loip_pool *pool, int ring) {
    enum { R = 50, C = 1024, T = 2 };
    FILE *f = fopen(path[2], "wb");
    CHECK(f != NULL, "open %s", path[2]);
    if (!f) return;
    for (int b = 0; b < 4096; b++) fputc(0x5A, f);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            float v = value(i, j);
            fwrite(&v, 4, 1, f);
        }
    fclose(f);
    static float xs[T * C], ref[T * R], got[T * R];
    for (int i = 0; i < T * C; i++) xs[i] = ldexpf((float)((i * 29) % 53 - 26), -5);
    int chunks[2] = {64, 16}; /* (64: one chunk holds the table) */
    for (int c = 0; c < 2; c++)
        for (int v = 0; v < 4; v++) {
            int ahead = v & 1, direct = v >> 1;
            loip_rows *r = NULL;
            CHECK(loip_rows_new(path[2], 4096, LOIP_F32, R, C, 0, chunks[c], NULL, &r) == 0, "%s", loip_last_error());
            if (!r) continue;
            loip_rows_set_ahead(r, ahead);
            /* (a filesystem without O_DIRECT, as tmpfs was: refused at once, read buffered) */
            if (direct && loip_rows_set_direct(r, 1) != 0) printf("  %s\n", loip_last_error());
            float *out = c == 0 && v == 0 ? ref : got;
            for (int k = 0; k < 2; k++)
                CHECK(loip_rows_logits(r, pool, xs, T, 0, R, out) == 0, "aligned chunk %d: %s", chunks[c], loip_last_error());
            int per = (R + chunks[c] - 1) / chunks[c];
            CHECK(loip_rows_ahead(r) == (ahead && ring ? (uint64_t)(2 * per - 1) : 0),
                  "aligned chunk %d ahead %d direct %d: %llu ahead", chunks[c], ahead, direct,
                  (unsigned long long)loip_rows_ahead(r));
            loip_rows_free(r);
            CHECK(memcmp(ref, out, sizeof ref) == 0, "aligned chunk %d ahead %d direct %d: the bits of one chunk", chunks[c],
                  ahead, direct);
        }
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < R; i++) {
            double want = 0;
            for (int j = 0; j < C; j++) want += (double)value(i, j) * xs[t * C + j];
            worst = fmax(worst, fabs(ref[t * R + i] - want));
        }
    CHECK(worst < 1e-3, "aligned: logits against a double reference: off by %g", worst);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/loip-rows-XXXXXX");
    if (!mkdtemp(dir)) {
        printf("test_rows: cannot make a temp dir; skipped\n");
        return 77;
    }
    for (int k = 0; k < 3; k++) snprintf(path[k], sizeof path[k], "%s/table-%d", dir, k);
    int ok = write_table(0, LOIP_F32) == 0 && write_table(1, LOIP_BF16) == 0;
    for (int i = 0; i < N * COLS; i++) x[i] = ldexpf((float)((i * 37) % 61 - 30), -4);
    loip_pool *pool = NULL;
    CHECK(ok && loip_pool_new(2, &pool) == 0, "setup: %s", loip_last_error());
    /* whether reads go ahead here: io_uring allowed (the loader's probe, as test_loader's) */
    loip_loader *probe = NULL;
    loip_loader_config pc = {.slot_bytes = 4096, .mode = LOIP_LOADER_AUTO};
    int ring = loip_loader_new(&pc, &probe) == 0 && loip_loader_mode(probe) == LOIP_LOADER_URING;
    loip_loader_free(probe);
    if (!ring) printf("  io_uring unavailable here: chunks are read when needed (nothing counts as ahead)\n");
    if (pool) {
        test_dtype(pool, 0, LOIP_F32, ring);
        test_dtype(pool, 1, LOIP_BF16, ring);
        test_budget();
        test_short_file(pool);
        test_aligned(pool, ring);
    }
    loip_pool_free(pool);
    for (int k = 0; k < 3; k++) unlink(path[k]);
    rmdir(dir);
    printf("test_rows: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
