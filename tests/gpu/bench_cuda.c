/* bench_cuda: the CUDA kernels' figures, as one JSON object on stdout.
 *
 *   matvec     GB/s of the decode kernel over BF16 and F32 matrices (several of them in turn,
 *              together far larger than the L2 cache), and the fraction of the device's peak
 *              memory bandwidth (memory clock x bus width) that is
 *   offload    one step of a model of 8 BF16 blocks of 64 MiB, half resident in device memory
 *              and half read every step from a file by the loader (io_uring, O_DIRECT) into
 *              its slot: "zero_copy" computes on the slot in place (registered, mapped into the
 *              device: the paper's UMA-aware loading), "copy" copies the slot into device
 *              memory first and computes there (the conventional path); ms per step of each,
 *              alternated, median of the runs
 *
 * Usage: bench_cuda DIR (a directory for the 256 MiB file of offloaded blocks; removed after).
 * Exit: 0, 1 on an error, 77 without a CUDA device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/kernels.h"
#include "loip.h"

#define MiB (1024.0 * 1024.0)

static void die(const char *what) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, loip_last_error());
    exit(1);
}

static void *dev(size_t n) {
    void *d = NULL;
    if (loip_cuda_alloc(n, LOIP_CUDA_MEM_DEVICE, NULL, &d)) die("cuda alloc");
    return d;
}

static void fill_bf16(uint16_t *w, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        w[i] = loip_f32_to_bf16(((seed >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.1f);
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GB/s of matvec over `count` matrices of rows x cols of dtype, each used in turn. */
static double matvec_rate(int dtype, size_t rows, size_t cols, int count) {
    size_t es = dtype == LOIP_F32 ? 4 : 2, bytes = rows * cols * es;
    void **w = calloc((size_t)count, sizeof *w);
    void *host = malloc(bytes);
    memset(host, 0x3c, bytes); /* small finite values in every dtype */
    for (int i = 0; i < count; i++) {
        w[i] = dev(bytes);
        if (loip_cuda_copy(w[i], host, bytes)) die("cuda copy");
    }
    float *x = dev(cols * 4), *y = dev(rows * 4);
    if (loip_cuda_copy(x, host, cols * 4)) die("cuda copy");
    for (int i = 0; i < count; i++) loip_cuda_matvec(dtype, y, w[i], x, rows, cols);
    if (loip_cuda_sync()) die("warm-up");
    int reps = 20;
    uint64_t t0 = loip_now_ns();
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < count; i++)
            if (loip_cuda_matvec(dtype, y, w[i], x, rows, cols)) die("matvec");
    if (loip_cuda_sync()) die("matvec");
    double s = (loip_now_ns() - t0) / 1e9;
    for (int i = 0; i < count; i++) loip_cuda_free(w[i], LOIP_CUDA_MEM_DEVICE);
    loip_cuda_free(x, LOIP_CUDA_MEM_DEVICE), loip_cuda_free(y, LOIP_CUDA_MEM_DEVICE);
    free(w), free(host);
    return (double)bytes * count * reps / s / 1e9;
}

int main(int argc, char **argv) {
    if (loip_cuda_device_count() == 0) {
        fprintf(stderr, "bench_cuda: skipped: no CUDA device\n");
        return 77;
    }
    const char *dir = argc > 1 ? argv[1] : ".";
    char name[256];
    int32_t integrated = 0, sms = 0;
    uint64_t total = 0;
    double peak = 0;
    if (loip_cuda_device_info(0, name, sizeof name, &integrated, &sms, &total, &peak)) die("device info");

    double bf16 = matvec_rate(LOIP_BF16, 14336, 4096, 8); /* Llama 3 8B's MLP matrix, 112 MiB each */
    double f32 = matvec_rate(LOIP_F32, 4096, 4096, 8);

    /* the offloading step */
    const size_t rows = 8192, cols = 4096, block = rows * cols * 2; /* 64 MiB */
    const int n_blocks = 8, n_res = 4, n_off = n_blocks - n_res;
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_cuda_blocks.bin", dir);
    uint16_t *host = malloc(block);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    for (int b = 0; b < n_off; b++) {
        fill_bf16(host, rows * cols, 7u + (uint32_t)b);
        if (fwrite(host, 1, block, f) != block) {
            perror(path);
            return 1;
        }
    }
    fclose(f);
    void *res[4];
    for (int b = 0; b < n_res; b++) {
        fill_bf16(host, rows * cols, 100u + (uint32_t)b);
        res[b] = dev(block);
        if (loip_cuda_copy(res[b], host, block)) die("cuda copy");
    }
    loip_loader_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.slot_bytes = block, cfg.n_slots = 1, cfg.mode = LOIP_LOADER_AUTO;
    loip_loader *l = NULL;
    if (loip_loader_new(&cfg, &l)) die("loader");
    void *slot = loip_loader_slot_data(l, 0), *dslot = NULL;
    if (loip_cuda_register(slot, block, &dslot)) die("register the slot");
    void *staged = dev(block);
    float *x = dev(cols * 4), *y = dev(rows * 4);
    memset(host, 0, cols * 4);
    if (loip_cuda_copy(x, host, cols * 4)) die("cuda copy");
    const int runs = 7;
    double zc[7], cp[7];
    uint64_t tag = 1;
    for (int r = 0; r < 2 * runs + 2; r++) {
        int zero_copy = r % 2 == 0;
        uint64_t t0 = loip_now_ns();
        for (int b = 0; b < n_res; b++) loip_cuda_matvec(LOIP_BF16, y, res[b], x, rows, cols);
        for (int b = 0; b < n_off; b++) {
            if (loip_cuda_sync()) die("compute"); /* the slot is free once the kernel reading it is done */
            loip_load_extent e;
            memset(&e, 0, sizeof e);
            e.path = path, e.fd = -1, e.file_offset = (uint64_t)b * block, e.length = block;
            if (loip_loader_submit(l, 0, &e, 1, tag)) die("load");
            if (loip_loader_wait(l, tag++, -1, NULL)) die("load");
            if (zero_copy) {
                loip_cuda_matvec(LOIP_BF16, y, dslot, x, rows, cols);
            } else {
                if (loip_cuda_copy(staged, slot, block)) die("copy");
                loip_cuda_matvec(LOIP_BF16, y, staged, x, rows, cols);
            }
        }
        if (loip_cuda_sync()) die("compute");
        double ms = (loip_now_ns() - t0) / 1e6;
        if (r >= 2) (zero_copy ? zc : cp)[(r - 2) / 2] = ms; /* (the first pair warms up) */
    }
    qsort(zc, runs, sizeof *zc, cmp_d), qsort(cp, runs, sizeof *cp, cmp_d);
    char mode[160] = "";
    loip_loader_describe(l, mode, sizeof mode);
    loip_cuda_unregister(slot);
    loip_loader_free(l);
    unlink(path);
    for (int b = 0; b < n_res; b++) loip_cuda_free(res[b], LOIP_CUDA_MEM_DEVICE);
    loip_cuda_free(staged, LOIP_CUDA_MEM_DEVICE), loip_cuda_free(x, LOIP_CUDA_MEM_DEVICE), loip_cuda_free(y, LOIP_CUDA_MEM_DEVICE);
    free(host);
    for (char *p = mode; *p; p++)
        if (*p == '"' || *p == '\\') *p = '\'';
    printf("{\"device\": \"%s\", \"integrated\": %d, \"sms\": %d, \"memory_bytes\": %llu, \"peak_bandwidth_GBps\": %.1f,\n"
           " \"matvec\": {\"bf16_GBps\": %.1f, \"f32_GBps\": %.1f, \"bf16_fraction_of_peak\": %.3f, \"f32_fraction_of_peak\": %.3f},\n"
           " \"offload\": {\"blocks\": %d, \"offloaded\": %d, \"block_MiB\": %.0f, \"loader\": \"%s\",\n"
           "   \"zero_copy_ms_per_step\": %.2f, \"copy_ms_per_step\": %.2f, \"zero_copy_faster\": %s}}\n",
           name, integrated, sms, (unsigned long long)total, peak / 1e9, bf16, f32, bf16 * 1e9 / peak, f32 * 1e9 / peak,
           n_blocks, n_off, block / MiB, mode, zc[runs / 2], cp[runs / 2], zc[runs / 2] < cp[runs / 2] ? "true" : "false");
    return 0;
}
