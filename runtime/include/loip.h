/* loip.h — the public C surface of the loip runtime: everything Lua may call, nothing else.
 *
 * The LuaJIT FFI declarations are generated at build time from the text between the
 * FFI-BEGIN and FFI-END markers (LOIP_API is stripped), so that region holds only plain C
 * declarations: no macros, no includes, enums for constants.
 *
 * Conventions (CONVENTIONS.md): functions return 0 or a negative LOIP_E* code and deliver
 * results through out-parameters; the detail of the last failure on this thread is read with
 * loip_last_error(). Owning handles come in _new and _free (or _open and _free) pairs, and
 * freeing NULL is a no-op. */
#ifndef LOIP_H
#define LOIP_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define LOIP_API __attribute__((visibility("default")))
#else
#define LOIP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* FFI-BEGIN */

/* ---- version, errors ------------------------------------------------------------------ */

enum {
    LOIP_ABI_VERSION = 41, /* bump on any change of this header's declarations */
};

enum {
    LOIP_OK = 0,
    LOIP_EIO = -5,
    LOIP_ENOMEM = -12,
    LOIP_EINVAL = -22,
    LOIP_ENOSPC = -28,
    LOIP_ERANGE = -34,
    LOIP_ENOSYS = -38,
    LOIP_EFORMAT = -1001, /* a file's content is malformed */
    LOIP_ESHAPE = -1002,  /* a tensor's shape or dtype does not fit the model */
    LOIP_ESTATE = -1003,  /* call out of order (e.g. forward before all weights are bound) */
    LOIP_EPROTO = -1004,  /* a malformed or unexpected message (transport) */
    LOIP_EAUTH = -1005,   /* a peer failed authentication */
};

LOIP_API int loip_abi_version(void);
/* Message of the last failure on the calling thread ("" if none). */
LOIP_API const char *loip_last_error(void);
/* Monotonic clock, nanoseconds. */
LOIP_API uint64_t loip_now_ns(void);
/* Layout check for the FFI: sizeof(struct type) when field is "" , else offsetof(type, field);
 * -1 when unknown. A spec compares these with ffi.sizeof/ffi.offsetof. */
LOIP_API int64_t loip_layout(const char *type, const char *field);

/* Catch SIGINT and SIGTERM from now on: loip_signal_received() returns the signal number once
 * one arrived (0 before), and blocking receives return early. For long-running commands. */
LOIP_API int loip_signal_watch(void);
LOIP_API int loip_signal_received(void);
/* Start argv[0] (a path) with argv, the environment plus env (NAME=value strings, NULL-ended;
 * they replace inherited ones), stdout truncated into out_path and stderr appended to err_path
 * (NULL: inherited). The child receives SIGTERM when the calling thread exits, however it ends:
 * children die with their parent. */
LOIP_API int loip_spawn(const char *const *argv, const char *const *env, const char *out_path,
                        const char *err_path, int32_t *pid);
/* Collect a child that exited (no zombie): 1 when it did, 0 while it runs, -1 not a child. */
LOIP_API int loip_reap(int32_t pid);
/* Sleep ms milliseconds (cut short by a watched signal). */
LOIP_API void loip_sleep_ms(int32_t ms);

/* Hold a CPU wake-up latency of us microseconds (Linux PM QoS, /dev/cpu_dma_latency: idle CPUs
 * stay in states they leave within us; 0 = never sleep deeper than polling) until the process
 * ends or loip_cpu_wake_latency(-1) releases it. Needs root. Cuts the thread wake-ups of each
 * hop; idle CPUs then draw more power. loip_cpu_wake_latency_held(): the held value, -1 none. */
LOIP_API int loip_cpu_wake_latency(int32_t us);
LOIP_API int32_t loip_cpu_wake_latency_held(void);

/* ---- machine, kernels, threads -------------------------------------------------------- */

typedef struct loip_cpu_info {
    int32_t n_cpus;     /* online logical CPUs */
    int32_t has_avx2;   /* with FMA and F16C */
    int32_t has_avx512; /* F, BW, VL */
    int32_t has_avx512_bf16;
    int32_t has_neon;
    int32_t has_cuda;   /* built with CUDA and a device is present */
} loip_cpu_info;

LOIP_API int loip_cpu_info_get(loip_cpu_info *out);
/* Kernel variant used by every later computation: "ref", "avx2", "avx512", or NULL/"auto"
 * for the best this CPU supports. LOIP_EINVAL when the variant is unknown or unsupported. */
LOIP_API int loip_kernels_use(const char *name);
LOIP_API const char *loip_kernels_name(void);
/* The software prefetch distance of the MXFP4 and F8 matrix-vector kernels: bytes ahead in each
 * weight row stream that they ask memory for (0: none; < 0: the default, 1024). A machine's
 * best is its memory latency times its rate: `loip profile` measures it (the profile's kernels
 * section) and a kernels policy sets it when a device opens (docs/planning.md); recipes/bench/
 * quant.lua --prefetch compares distances. LOIP_EINVAL above LOIP_KERNELS_PREFETCH_MAX. */
enum { LOIP_KERNELS_PREFETCH_MAX = 1048576 };
LOIP_API int loip_kernels_set_prefetch(int64_t bytes);
LOIP_API int64_t loip_kernels_prefetch(void);
/* amx-auto (the default where AMX-BF16 is): the number of tokens from which a BF16 matmul runs on
 * AMX tiles, fewer on avx512. rows > 0 sets it (process-wide), rows <= 0 leaves it; returns the
 * value in force (also read from LOIP_AMX_ROWS at startup). */
LOIP_API int64_t loip_kernels_amx_threshold(int64_t rows);

typedef struct loip_pool loip_pool;
/* A fork-join pool of n_threads (the caller counts as one; n_threads <= 0: all CPUs). */
LOIP_API int loip_pool_new(int32_t n_threads, loip_pool **out);
LOIP_API void loip_pool_free(loip_pool *pool);
LOIP_API int32_t loip_pool_size(const loip_pool *pool);

/* ---- memory and files ----------------------------------------------------------------- */

enum {
    LOIP_F32 = 0,
    LOIP_BF16 = 1,
    LOIP_F16 = 2,
    LOIP_I32 = 3,
    /* Block-quantized weights: a matrix [rows, cols] of these is not cols elements a row of one
     * size, so its bytes are loip_dtype_bytes' (loip_dequantize: their f32 values). Both are
     * computed from as stored, accumulated in f32: MXFP4 with its exact values (bit for bit the
     * F32 kernels on the dequantized matrix), F8 by the SIMD kernels as the sum of E4M3 * x over
     * each 128-column block (exact products) times the block's scale (within f32 rounding of the
     * dequantized matrix's products; the reference kernel: bit for bit).
     * LOIP_MXFP4 (OCP MX FP4, GGUF's block_mxfp4): each row is cols/32 blocks of 17 bytes, an
     *   E8M0 scale byte e, then 16 bytes: element j in the low nibble of byte j, element j + 16
     *   in its high nibble; value = E2M1(nibble) * 2^(e-127) (E2M1: 0, .5, 1, 1.5, 2, 3, 4, 6 and
     *   their negatives; e = 0xFF is NaN). cols % 32 == 0.
     * LOIP_F8_E4M3 (E4M3FN with 128x128 block scales, as Hugging Face FP8 checkpoints store
     *   weight + weight_scale_inv): the rows in groups of 128 (the last may be shorter), each
     *   group ceil(cols/128) float32 scales (scale k covers its rows' columns [128k, 128k+128))
     *   followed by its rows of cols E4M3 bytes; value = fl(E4M3 * scale), one f32 rounding
     *   (S.1111.111 is NaN). The scales travel with the weights: one pointer, one tensor, and
     *   rows [128g, ...) of a tensor are themselves a tensor of this dtype (loip_f8_pack). */
    LOIP_MXFP4 = 4,
    LOIP_F8_E4M3 = 5,
    LOIP_DTYPE_COUNT = 6,
};

LOIP_API int32_t loip_dtype_size(int32_t dtype);
/* Bytes of a [rows, cols] matrix of dtype (a vector: rows 1); 0 when the dtype is unknown or
 * the shape does not fit it (MXFP4: cols not a multiple of 32). */
LOIP_API uint64_t loip_dtype_bytes(int32_t dtype, int64_t rows, int64_t cols);
/* LOIP_OK when a [rows, cols] tensor called name fits dtype, else LOIP_ESHAPE naming the tensor
 * and the field (e.g. an MXFP4 row length that is not a whole number of blocks). */
LOIP_API int loip_dtype_check(int32_t dtype, int64_t rows, int64_t cols, const char *name);
/* dst[rows*cols] = the f32 values of a [rows, cols] matrix of any dtype (exact for all but
 * F8's one rounding of E4M3 * scale). */
LOIP_API int loip_dequantize(float *dst, const void *src, int32_t dtype, int64_t rows, int64_t cols);
/* dst (loip_dtype_bytes(LOIP_F8_E4M3, rows, cols) bytes) = the LOIP_F8_E4M3 layout of a
 * Hugging Face FP8 weight: w[rows*cols] E4M3FN bytes and scale_inv[scale_rows*scale_cols]
 * (its weight_scale_inv). LOIP_ESHAPE naming the tensor (name) and its weight_scale_inv when
 * the scales are not [ceil(rows/128), ceil(cols/128)]. */
LOIP_API int loip_f8_pack(void *dst, const uint8_t *w, const float *scale_inv, int64_t rows,
                          int64_t cols, int64_t scale_rows, int64_t scale_cols, const char *name);
/* Weights a file keeps otherwise than loip binds them (gpt-oss's fused experts), made anew:
 * loip_gather_elements: dst[r * cols + c] = src[base + r * rs + c * cs] for r < rows, c < cols,
 *   elements of elem_bytes (1, 2 or 4): a transposition or a de-interleaving;
 * loip_mxfp4_from_openai: rows r < rows of an MXFP4 matrix as LOIP_MXFP4 (nb blocks a row), from
 *   OpenAI's layout (Hugging Face's *_blocks: 16 bytes a block, value 2j in the low nibble of
 *   byte j and 2j+1 in its high; *_scales: a byte a block) at source row first + r * step. */
LOIP_API int loip_gather_elements(void *dst, const void *src, int32_t elem_bytes, int64_t base, int64_t rows,
                                  int64_t rs, int64_t cols, int64_t cs);
LOIP_API int loip_mxfp4_from_openai(void *dst, const uint8_t *blocks, const uint8_t *scales, int64_t first,
                                    int64_t step, int64_t rows, int64_t nb);

typedef struct loip_buffer loip_buffer;
/* Zeroed, 64-byte aligned (huge-page advised when large) memory. */
LOIP_API int loip_buffer_new(uint64_t bytes, loip_buffer **out);
LOIP_API void loip_buffer_free(loip_buffer *buf);
LOIP_API void *loip_buffer_data(loip_buffer *buf);
LOIP_API uint64_t loip_buffer_size(const loip_buffer *buf);

/* Bytes the C heap (malloc) holds in use by this process, small and mmapped blocks alike
 * (glibc's mallinfo2); 0 where the C library cannot say. */
LOIP_API uint64_t loip_heap_in_use(void);

typedef struct loip_mapping loip_mapping;
/* Read-only memory map of a whole file. */
LOIP_API int loip_mapping_open(const char *path, loip_mapping **out);
LOIP_API void loip_mapping_free(loip_mapping *map);
LOIP_API const uint8_t *loip_mapping_data(const loip_mapping *map);
LOIP_API uint64_t loip_mapping_size(const loip_mapping *map);
/* Ask the kernel to read [offset, offset+len) ahead (madvise WILLNEED). */
LOIP_API int loip_mapping_prefetch(const loip_mapping *map, uint64_t offset, uint64_t len);

typedef struct loip_writer loip_writer;
/* Writes go to "<path>.tmp.<pid>"; loip_writer_commit() fsyncs and renames it to path.
 * Freeing an uncommitted writer removes the temporary file: no half-written output. */
LOIP_API int loip_writer_open(const char *path, loip_writer **out);
LOIP_API int loip_writer_write(loip_writer *w, const void *data, uint64_t len);
LOIP_API int loip_writer_commit(loip_writer *w);
LOIP_API void loip_writer_free(loip_writer *w);
/* Bytes available to an unprivileged writer on the filesystem holding path. */
LOIP_API int loip_disk_available(const char *path, uint64_t *bytes);
/* Drop the file's pages from the page cache (written ones flushed first), so that the next
 * read comes from the disk: what a profile measures. */
LOIP_API int loip_file_drop_cache(const char *path);

enum {
    LOIP_READ_DIRECT = 1, /* bypass the page cache (O_DIRECT) where the filesystem allows */
};
/* Read len bytes at offset of the file at path into dst, in requests of up to 64 MiB.
 * LOIP_READ_DIRECT reads with O_DIRECT when offset, len and dst are 4 KiB aligned and the
 * filesystem accepts it, else buffered; *direct (may be NULL) tells which was used. A file
 * shorter than offset + len is LOIP_EIO naming the file. */
LOIP_API int loip_file_read(const char *path, uint64_t offset, uint64_t len, void *dst,
                            int32_t flags, int32_t *direct);

/* Fill n elements of dtype with seeded pseudo-normal values (mean, std). Element i takes the
 * value of stream position first+i, so a tensor filled in chunks equals one filled at once. */
LOIP_API int loip_fill_random(void *dst, uint64_t n, int32_t dtype, uint64_t seed,
                              uint64_t first, float mean, float std);
/* Convert n elements between float dtypes (F32/BF16/F16; round to nearest even); MXFP4 as a
 * source too (n whole blocks of 32). */
LOIP_API int loip_convert(void *dst, int32_t dst_dtype, const void *src, int32_t src_dtype,
                          uint64_t n);

/* ---- memory budget ------------------------------------------------------------------- */

/* A device's memory budget: a limit in bytes (0: unlimited) and named accounts ("weights",
 * "slots", "kv", "activations", "scratch", ...; at most LOIP_BUDGET_MAX_ACCOUNTS) that every
 * allocation is charged to. A charge that would pass the limit fails with LOIP_ENOMEM before
 * anything is allocated, naming the account, the shortfall and what the others hold. Safe to
 * charge from several threads. Objects charged to a budget keep it alive: loip_budget_free
 * drops the caller's reference and the budget goes when the last charged object does. */
enum {
    LOIP_BUDGET_MAX_ACCOUNTS = 32,
    LOIP_BUDGET_NAME_MAX = 32, /* account names are shorter than this */
};

typedef struct loip_budget_account {
    char name[32];
    uint64_t bytes; /* charged now */
    uint64_t peak;  /* most charged at once */
} loip_budget_account;

typedef struct loip_budget loip_budget;
LOIP_API int loip_budget_new(uint64_t limit, loip_budget **out);
LOIP_API void loip_budget_free(loip_budget *b);
LOIP_API uint64_t loip_budget_limit(const loip_budget *b);
LOIP_API uint64_t loip_budget_used(const loip_budget *b);
/* Most bytes charged at once over all accounts. */
LOIP_API uint64_t loip_budget_peak(const loip_budget *b);
/* Charge bytes to account (created on first use). LOIP_ENOMEM when the budget cannot hold
 * them (nothing is charged), LOIP_EINVAL for an empty or too long name or too many accounts. */
LOIP_API int loip_budget_charge(loip_budget *b, const char *account, uint64_t bytes);
/* Give back bytes charged to account (clamped at what it holds). */
LOIP_API void loip_budget_release(loip_budget *b, const char *account, uint64_t bytes);
/* The accounts in the order they were first charged; returns how many there are (only the
 * first cap are written). */
LOIP_API int32_t loip_budget_report(const loip_budget *b, loip_budget_account *out, int32_t cap);
/* A buffer (as loip_buffer_new) whose bytes are charged to account of budget (NULL: not
 * charged) before they are allocated, and released when it is freed. */
LOIP_API int loip_buffer_new_charged(loip_budget *budget, const char *account, uint64_t bytes,
                                     loip_buffer **out);
/* Address space for bytes (rounded up to whole pages), zero, charged nothing and resident
 * nowhere until ranges of it are taken (loip_buffer_take_range) and written. */
LOIP_API int loip_buffer_new_reserved(loip_budget *budget, const char *account, uint64_t bytes,
                                      loip_buffer **out);
/* Give back a range of whole pages (its memory to the system, its bytes to the budget): its
 * contents are gone (zero when next read). take_range charges it again (the budget may refuse)
 * and makes it resident (zero) before the caller refills it. */
LOIP_API int loip_buffer_drop_range(loip_buffer *b, uint64_t offset, uint64_t bytes);
LOIP_API int loip_buffer_take_range(loip_buffer *b, uint64_t offset, uint64_t bytes);
/* A charge without memory behind it (e.g. weights used from a file mapping): bytes stay
 * charged to account until loip_charge_free. */
typedef struct loip_charge loip_charge;
LOIP_API int loip_charge_new(loip_budget *budget, const char *account, uint64_t bytes,
                             loip_charge **out);
LOIP_API void loip_charge_free(loip_charge *c);

/* ---- single operations (tests, benchmarks, experiments) ------------------------------- */

/* y[rows] = W[rows, cols] (dtype: a float one, LOIP_MXFP4 or LOIP_F8_E4M3) . x[cols], split over
 * the pool's threads. */
LOIP_API int loip_op_matvec(loip_pool *pool, int32_t dtype, const void *W, const float *x,
                            float *y, int64_t rows, int64_t cols);
/* Streaming read of bytes of buf, reps times, split over the pool's threads; returns a
 * checksum so that the reads cannot be optimised away. */
LOIP_API int loip_op_read_probe(loip_pool *pool, const void *buf, uint64_t bytes, int32_t reps,
                                double *checksum);
/* Y[n, rows] = X[n, cols] . W[rows, cols]^T (dtype), split over the pool's threads: the
 * many-row product of a prefill or a verified tree, as one operation. */
LOIP_API int loip_op_matmul(loip_pool *pool, int32_t dtype, const void *W, const float *X,
                            float *Y, int64_t n, int64_t rows, int64_t cols);
/* The FMA roof: every thread of the pool runs `iters` rounds of independent fp32 fused
 * multiply-adds on the widest vectors the CPU has, or 256 bits while the avx2 kernels are in use
 * (so that they are measured against their own roof on a CPU with AVX-512); *flops gets the
 * floating-point operations done (2 per FMA lane), for the caller to divide by the time it
 * measured. */
LOIP_API int loip_op_fma_probe(loip_pool *pool, int64_t iters, double *flops);
/* Nanoseconds this process has spent, over all sessions' forward passes so far, in
 * out[0]: the linear layers (matvec/matmul dispatches, with their thread synchronisation) and
 * out[1]: attention over the cache; differences of two reads time a span. */
LOIP_API void loip_phase_ns(uint64_t out[2]);

/* ---- hashing -------------------------------------------------------------------------- */

/* SHA-256 (FIPS 180-4), streaming: the content hashes of slice stores and their sources. From
 * OpenSSL's libcrypto, which uses the CPU's SHA instructions where present. */
typedef struct loip_sha256 loip_sha256;
LOIP_API int loip_sha256_new(loip_sha256 **out);
LOIP_API void loip_sha256_free(loip_sha256 *h);
LOIP_API int loip_sha256_update(loip_sha256 *h, const void *data, uint64_t len);
/* The digest of everything given since _new (or the last _final): digest[32] raw bytes and/or
 * hex[65] as 64 lowercase hex digits and a NUL (either may be NULL). The state then restarts,
 * ready for the next message. */
LOIP_API int loip_sha256_final(loip_sha256 *h, uint8_t *digest, char *hex);
/* SHA-256 of a whole file, read in large buffered requests; *bytes (may be NULL) its size. */
LOIP_API int loip_sha256_file(const char *path, char *hex, uint64_t *bytes);
/* HMAC-SHA256 (RFC 2104) of msg under key: mac[32] raw bytes. The proof a discovery beacon
 * carries (lua/loip/cluster/discovery.lua). */
LOIP_API int loip_hmac_sha256(const void *key, uint64_t key_len, const void *msg, uint64_t msg_len,
                              uint8_t *mac);
/* CRC32C (Castagnoli) of n bytes, continuing crc (0 to start): a block file's checksum in a
 * slice store's manifest. Hardware (SSE4.2) where the CPU has it; _portable: the table path. */
LOIP_API uint32_t loip_crc32c(uint32_t crc, const void *data, uint64_t n);
LOIP_API uint32_t loip_crc32c_portable(uint32_t crc, const void *data, uint64_t n);

/* ---- loader --------------------------------------------------------------------------- */

/* Reads offloaded weights from files into reusable slots (aligned memory, one stage's offloaded
 * blocks each), on its own thread, so that compute never waits on a system call. io_uring with
 * O_DIRECT into registered buffers where the kernel allows; a conventional path (buffered
 * pread into a bounce buffer, then a copy into the slot) for the ablation and as the fallback.
 * Completion is pulled with loip_loader_poll/_wait: C never calls back. */
enum {
    LOIP_LOADER_AUTO = 0,     /* io_uring if the probe at start succeeds, else buffered */
    LOIP_LOADER_URING = 1,    /* io_uring or fail (LOIP_ENOSYS naming the reason) */
    LOIP_LOADER_BUFFERED = 2, /* pread + copy, one request at a time */
};
enum {
    LOIP_ETIMEDOUT = -110, /* loip_loader_wait ran out of time */
};

typedef struct loip_loader_config {
    uint64_t slot_bytes;      /* each slot's size, rounded up to 4 KiB */
    uint64_t request_bytes;   /* loads are split into reads of at most this (0: 1 MiB; never
                                 more than slot_bytes) */
    uint64_t rate_limit_bps;  /* emulate a slower disk: bytes/s over all reads (0: off) */
    int32_t n_slots;          /* <= 0: 1 */
    int32_t mode;             /* LOIP_LOADER_* */
    int32_t queue_depth;      /* io_uring reads in flight (<= 0: 32) */
    int32_t debug_short_every; /* tests: every Nth read returns only a part (as a device may
                                  return less than asked), so the remainder is read again;
                                  0: off */
    int32_t overlap_loads;    /* 0 (the default): a load's reads start once the reads of the
                                 load before it have all landed (in-order completion: the stage
                                 waiting on the first load gets it sooner on devices that serve
                                 queued reads in parallel); 1: a load's reads are issued as soon
                                 as the queue has room, overlapping the previous load's tail
                                 (io_uring; the buffered path reads one request at a time
                                 either way). Which is faster is the device's: a profile
                                 measures it, a policy chooses. Other values: LOIP_EINVAL */
    loip_budget *budget;      /* slots charged to its "slots" account, the buffered path's
                                 bounce buffer to "scratch" (NULL: not charged) */
} loip_loader_config;

/* One piece of a load: length bytes at file_offset of a file go to slot_offset of the slot.
 * The file is path (opened once and cached, O_DIRECT where the filesystem allows), or the
 * caller's open fd when path is NULL (not closed by the loader). Reads are O_DIRECT when the
 * file offset, length and slot offset are 4 KiB aligned (slice stores are laid out so). */
typedef struct loip_load_extent {
    const char *path;
    int32_t fd;
    int32_t check;          /* nonzero: the bytes read must have CRC32C crc32c (a block file's,
                               whole), else the load fails (LOIP_EIO) naming the file */
    uint64_t file_offset;
    uint64_t length;
    uint64_t slot_offset;
    uint32_t crc32c;
    uint32_t reserved;
} loip_load_extent;

/* A finished load: status 0, or a negative LOIP_E* code with message naming the file and the
 * offset (LOIP_EIO for a file that ends before the extent: truncated). A failed load's slot
 * bytes are undefined. */
typedef struct loip_load_done {
    uint64_t tag;
    int32_t slot;
    int32_t status;
    uint64_t bytes;       /* bytes read into the slot */
    uint64_t t_submit_ns; /* loip_now_ns() clock */
    uint64_t t_done_ns;
    char message[240];    /* "" on success */
} loip_load_done;

typedef struct loip_loader_stats_t {
    uint64_t bytes_read;
    uint64_t reads;        /* read requests issued, resubmissions included */
    uint64_t short_reads;  /* reads that returned less than asked (remainder resubmitted) */
    uint64_t loads_done;
    uint64_t loads_failed;
    uint64_t busy_ns;      /* time with at least one read in flight */
    uint64_t throttle_ns;  /* time the rate limit held reads back */
    uint64_t bytes_verified; /* checked against their CRC32C (loip_load_extent.check) */
    uint64_t verify_ns;    /* time spent checking them (the loader's thread) */
} loip_loader_stats_t;

typedef struct loip_loader loip_loader;
/* cfg NULL: defaults (one slot of 0 bytes is useless: give slot_bytes). */
LOIP_API int loip_loader_new(const loip_loader_config *cfg, loip_loader **out);
/* What loip_loader_new(cfg) would charge to cfg->budget, for planning before anything is
 * allocated: *slot_bytes to "slots" (n_slots x slot_bytes, each rounded up to 4 KiB as the
 * loader rounds it) and *scratch_bytes to "scratch" (the buffered path's bounce buffer; 0 for
 * io_uring). For LOIP_LOADER_AUTO it decides the path as loip_loader_new does, with the same
 * probe (an io_uring ring set up and closed at once; nothing else is allocated), so a machine
 * without io_uring counts the bounce buffer. LOIP_LOADER_URING counts no bounce buffer and does
 * not probe (loip_loader_new fails where io_uring is unavailable). LOIP_EINVAL for a config
 * loip_loader_new refuses; the budget is not touched. Either out-parameter may be NULL. */
LOIP_API int loip_loader_size(const loip_loader_config *cfg, uint64_t *slot_bytes,
                              uint64_t *scratch_bytes);
/* Waits for reads in flight (the kernel writes into the slots), drops loads not yet started. */
LOIP_API void loip_loader_free(loip_loader *l);
/* One more holder of l (the runner that reads through it): each loip_loader_free lets one go,
 * and the loader is freed with the last, so that it outlives whoever reads through it whatever
 * order they are freed in (a Lua state's finalizers at exit run in no set order). Returns l. */
LOIP_API loip_loader *loip_loader_retain(loip_loader *l);
/* LOIP_LOADER_URING or LOIP_LOADER_BUFFERED: the path in use. */
LOIP_API int32_t loip_loader_mode(const loip_loader *l);
/* A line saying which path is used and why (io_uring probe result, registered buffers, files
 * opened O_DIRECT or buffered); LOIP_ERANGE when cap is too small (truncated). */
LOIP_API int loip_loader_describe(loip_loader *l, char *buf, size_t cap);
LOIP_API int32_t loip_loader_slots(const loip_loader *l);
LOIP_API uint64_t loip_loader_slot_bytes(const loip_loader *l);
/* The slot's memory (4 KiB aligned, 2 MiB when large); NULL for a slot out of range. */
LOIP_API void *loip_loader_slot_data(loip_loader *l, int32_t slot);
/* Queue a load of n extents into slot, identified by tag in the completions. Files are opened
 * here: a missing file fails now, naming it, and nothing is queued. */
LOIP_API int loip_loader_submit(loip_loader *l, int32_t slot, const loip_load_extent *ext,
                                int32_t n, uint64_t tag);
/* Up to cap finished loads, oldest first; waits up to wait_ms (< 0: until one finishes) when
 * none is ready and some are queued. Returns the count (>= 0). The message of the last failed
 * load returned is also loip_last_error(). */
LOIP_API int loip_loader_poll(loip_loader *l, loip_load_done *out, int32_t cap, int32_t wait_ms);
/* Waits for the load with tag (timeout_ms < 0: no limit) and returns its status; out (may be
 * NULL) gets its record. LOIP_ETIMEDOUT; LOIP_EINVAL when no load with tag is queued. */
LOIP_API int loip_loader_wait(loip_loader *l, uint64_t tag, int32_t timeout_ms,
                              loip_load_done *out);
/* Loads queued and not yet returned by poll/wait. */
LOIP_API int32_t loip_loader_pending(loip_loader *l);
LOIP_API int loip_loader_stats(loip_loader *l, loip_loader_stats_t *out);

/* ---- models --------------------------------------------------------------------------- */

enum {
    LOIP_ROPE_INTERLEAVED = 0, /* Meta / llama2.c: pairs (2i, 2i+1) */
    LOIP_ROPE_HALF = 1,        /* Hugging Face rotate_half: pairs (i, i + head_dim/2) */
};

enum {
    LOIP_ROPE_SCALING_NONE = 0,
    LOIP_ROPE_SCALING_LLAMA3 = 1,
    LOIP_ROPE_SCALING_LINEAR = 2, /* positions divided by rope_factor (inverse frequencies / factor) */
    LOIP_ROPE_SCALING_YARN = 3, /* YaRN (gpt-oss): rope_factor, rope_original_max_pos, rope_beta_* */
};

/* How a mixture of experts weighs its chosen experts (loip_model_config.moe_gating). */
enum {
    LOIP_GATING_SOFTMAX = 0,      /* softmax over all router logits, then the top k */
    LOIP_GATING_TOPK_SOFTMAX = 1, /* the top k logits, then a softmax over those k (gpt-oss) */
};

/* The gated unit of an expert's MLP (loip_model_config.glu). */
enum {
    LOIP_GLU_SILU = 0, /* silu(gate) * up */
    /* gpt-oss: g = min(gate, glu_limit), u = clamp(up, -glu_limit, glu_limit),
     * g * sigmoid(glu_alpha * g) * (u + 1) */
    LOIP_GLU_OAI_CLAMPED = 1,
};

enum {
    LOIP_MAX_LAYERS = 512, /* layers a model's per-layer switches (layer_window) name */
};

/* The activation of the MLP's gate (loip_model_config.ffn_act): act(gate . x) * (up . x). */
enum {
    LOIP_ACT_SILU = 0,      /* SwiGLU */
    LOIP_ACT_GELU_TANH = 1, /* GELU, tanh approximation (PyTorch's gelu_pytorch_tanh): GeGLU */
};

/* A model's shape and the switches of its forward pass. Lua fills it from the family's
 * description (lua/loip/model/families/: docs/adding-a-model.md); C reads only these fields and
 * knows no family by name. */
typedef struct loip_model_config {
    int32_t dim;         /* hidden size */
    int32_t hidden_dim;  /* FFN inner size */
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t vocab_size;
    int32_t max_seq;     /* positions the model was trained for */
    float norm_eps;
    float rope_theta;
    int32_t rope_layout; /* LOIP_ROPE_* */
    int32_t rope_scaling;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int32_t rope_original_max_pos;
    int32_t qkv_bias;    /* q/k/v projections have biases (Qwen2) */
    int32_t qk_norm;     /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int32_t tied_embeddings;
    /* Mixture of experts (n_experts > 0): every layer's MLP block is ffn_norm, a router
     * (LOIP_W_ROUTER) whose softmax picks the n_experts_used most probable of n_experts experts
     * per token (ties: the lower index), each a SwiGLU MLP of inner size expert_dim bound with
     * loip_model_bind_expert, their outputs weighted by those probabilities (renormalised to sum
     * 1 when norm_topk_prob: Mixtral, Qwen3-MoE) and summed in the order of the ranking; plus,
     * when shared_expert, a SwiGLU MLP of hidden_dim (LOIP_W_GATE/UP/DOWN) run on every token
     * and added, scaled by sigmoid(LOIP_W_SHARED_GATE . x) when shared_expert_gate (Qwen2-MoE).
     * Without a shared expert, hidden_dim is not used (give expert_dim). */
    int32_t n_experts;
    int32_t n_experts_used;
    int32_t expert_dim;
    int32_t norm_topk_prob;
    int32_t shared_expert;
    int32_t shared_expert_gate;
    /* Sliding-window attention (Hugging Face's sliding_window and layer_types: Mistral, Qwen2,
     * Phi-3, Gemma 3, gpt-oss): a layer l with layer_window[l] != 0 lets the token at position p
     * attend to the positions q with p - sliding_window < q <= p only: Hugging Face's
     * sliding-window mask (kv_idx > q_idx - sliding_window), and llama.cpp's
     * LLAMA_SWA_TYPE_STANDARD (masked when p - q >= n_swa), which agree. Such a layer keeps at
     * most the window (and a batch) of KV positions per sequence (a ring: loip_session_kv_size).
     * sliding_window 0: no layer is windowed. Layers past LOIP_MAX_LAYERS are never windowed. */
    int32_t sliding_window;
    uint8_t layer_window[LOIP_MAX_LAYERS];
    /* Switches of Gemma-style layers; 0 means "not used", so every other config is unchanged.
     * norm_add_one: every RMSNorm (the layers', q/k's and the output's) scales by (1 + w), the
     * 1 added to the widened weight in fp32 (Hugging Face's Gemma checkpoints; llama.cpp's
     * converter stores 1 + w, read with norm_add_one 0: the same floats).
     * post_norms: the attention's and the MLP's outputs are RMS-normalised (LOIP_W_POST_ATTN_NORM,
     * LOIP_W_POST_FFN_NORM) before they are added to the residual.
     * ffn_act: LOIP_ACT_* of the MLP's gate (dense MLPs).
     * embed_scale > 0: the embedding rows are multiplied by it after the lookup, in the
     * embedding's dtype (the scale and the product rounded to BF16/F16 when the table is).
     * attn_scale > 0: attention scores are (q . k) * attn_scale, in place of q . k / sqrt(head_dim).
     * rope_local_theta > 0: the windowed layers (layer_window) rotate with this base and no
     * rope_scaling; the others with rope_theta and rope_scaling.
     * final_softcap > 0: the logits are final_softcap * tanh(logits / final_softcap). */
    int32_t norm_add_one;
    int32_t post_norms;
    int32_t ffn_act;
    float embed_scale;
    float attn_scale;
    float rope_local_theta;
    float final_softcap;
    /* gpt-oss's switches; 0 is "not used", so every other family's config is unchanged.
     * attn_sinks: a learned logit per head (LOIP_W_SINKS) joins each softmax's denominator (it
     * takes a share of the weight and gives no value); attn_out_bias: the output projection's
     * bias (LOIP_W_BO); router_bias: the router's (LOIP_W_ROUTER_BIAS); expert_bias: each routed
     * expert's gate, up and down biases (LOIP_W_EXPERT_*_BIAS, a row per expert). */
    int32_t attn_sinks;
    int32_t attn_out_bias;
    int32_t router_bias;
    int32_t expert_bias;
    int32_t moe_gating;  /* LOIP_GATING_* */
    int32_t glu;         /* LOIP_GLU_*: of the routed experts */
    float glu_alpha;
    float glu_limit;
    /* YaRN (rope_scaling LOIP_ROPE_SCALING_YARN, with rope_factor and rope_original_max_pos):
     * pair i's frequency blends base^(-2i/d) / factor (interpolated) and base^(-2i/d)
     * (extrapolated) by a ramp between the pairs that turn beta_fast and beta_slow times in the
     * original context (floored and ceiled when rope_yarn_truncate: Hugging Face's default and
     * llama.cpp's only way); cos and sin are scaled by rope_attn_factor. */
    float rope_beta_fast;
    float rope_beta_slow;
    float rope_attn_factor;
    int32_t rope_yarn_truncate;
} loip_model_config;

enum {
    /* global tensors (layer = -1) */
    LOIP_W_EMBED = 0,       /* [vocab, dim] */
    LOIP_W_OUTPUT_NORM = 1, /* [dim] */
    LOIP_W_LM_HEAD = 2,     /* [vocab, dim]; not bound when tied */
    /* per-layer tensors */
    LOIP_W_ATTN_NORM = 3,   /* [dim] */
    LOIP_W_WQ = 4,          /* [n_heads*head_dim, dim] */
    LOIP_W_WK = 5,          /* [n_kv_heads*head_dim, dim] */
    LOIP_W_WV = 6,          /* [n_kv_heads*head_dim, dim] */
    LOIP_W_WO = 7,          /* [dim, n_heads*head_dim] */
    LOIP_W_BQ = 8,          /* [n_heads*head_dim] */
    LOIP_W_BK = 9,          /* [n_kv_heads*head_dim] */
    LOIP_W_BV = 10,         /* [n_kv_heads*head_dim] */
    LOIP_W_Q_NORM = 11,     /* [head_dim] */
    LOIP_W_K_NORM = 12,     /* [head_dim] */
    LOIP_W_FFN_NORM = 13,   /* [dim] */
    LOIP_W_GATE = 14,       /* [hidden_dim, dim] */
    LOIP_W_UP = 15,         /* [hidden_dim, dim] */
    LOIP_W_DOWN = 16,       /* [dim, hidden_dim] */
    LOIP_W_ROUTER = 17,     /* [n_experts, dim]: mixture of experts only */
    LOIP_W_SHARED_GATE = 18, /* [1, dim]: the shared expert's gate (shared_expert_gate) */
    LOIP_W_POST_ATTN_NORM = 19, /* [dim]: the attention output's norm (post_norms); MHA block */
    LOIP_W_POST_FFN_NORM = 20,  /* [dim]: the MLP output's norm (post_norms); MLP block */
    LOIP_W_BO = 21,          /* [dim]: attn_out_bias (attention block) */
    LOIP_W_SINKS = 22,       /* [n_heads]: attn_sinks (attention block) */
    LOIP_W_ROUTER_BIAS = 23, /* [n_experts]: router_bias */
    LOIP_W_EXPERT_GATE_BIAS = 24, /* [n_experts, expert_dim]: expert_bias, row e expert e's */
    LOIP_W_EXPERT_UP_BIAS = 25,   /* [n_experts, expert_dim] */
    LOIP_W_EXPERT_DOWN_BIAS = 26, /* [n_experts, dim] */
    LOIP_W_COUNT = 27,
};

typedef struct loip_tensor {
    const void *data; /* not owned: points into a mapping or buffer that outlives the model */
    int32_t dtype;    /* LOIP_F32 / LOIP_BF16 / LOIP_F16 */
    int32_t ndim;
    int64_t shape[4];
} loip_tensor;

typedef struct loip_model loip_model;
LOIP_API int loip_model_new(const loip_model_config *cfg, loip_model **out);
LOIP_API void loip_model_free(loip_model *m);
/* Bind a weight view; the shape and dtype are checked against the config (LOIP_ESHAPE). */
LOIP_API int loip_model_bind(loip_model *m, int32_t layer, int32_t which, const loip_tensor *t);
/* A routed expert's weights (mixture of experts): part LOIP_EXPERT_GATE and _UP are
 * [expert_dim, dim], _DOWN [dim, expert_dim]. t->data NULL unbinds it: an expert not bound is
 * not in memory, and a layer that routes a token to it reads it through the session's expert
 * cache (loip_session_set_experts), or fails naming it. */
enum {
    LOIP_EXPERT_GATE = 0,
    LOIP_EXPERT_UP = 1,
    LOIP_EXPERT_DOWN = 2,
    LOIP_EXPERT_PARTS = 3,
};
LOIP_API int loip_model_bind_expert(loip_model *m, int32_t layer, int32_t expert, int32_t part,
                                    const loip_tensor *t);
/* A [rows, cols] weight table (the embedding or the output head of a large vocabulary) that
 * stays in its file: dtype at offset of path, read as it is needed. cache_rows: rows kept after
 * their read (the embedding: a token's row, least recently used out, read with pread);
 * chunk_rows (a multiple of 16, 0: none): the rows the head reads at once, each chunk's logits
 * computed as it lands (the same logits, bit for bit, as the table in memory). The head's
 * chunks are read ahead into two buffers of chunk_rows rows (one when chunk_rows holds the
 * table): the next chunk's read in flight (io_uring) while this one computes, and after the
 * last the next call's first. The cache and the chunk buffers are charged to budget's "slots"
 * account (NULL: not charged) before they are allocated: (cache_rows + buffers x chunk_rows)
 * rows. */
typedef struct loip_rows loip_rows;
LOIP_API int loip_rows_new(const char *path, uint64_t offset, int32_t dtype, int64_t rows, int64_t cols,
                           int32_t cache_rows, int32_t chunk_rows, loip_budget *budget, loip_rows **out);
LOIP_API void loip_rows_free(loip_rows *r);
/* Row id of the table as floats into out[cols] (from the cache, or read into it). */
LOIP_API int loip_rows_get(loip_rows *r, int32_t id, float *out);
/* What the table's reads have read: bytes, reads, rows found in the cache, and the head's
 * chunks whose read was under way before they were needed (read ahead). */
LOIP_API uint64_t loip_rows_bytes_read(const loip_rows *r);
LOIP_API uint64_t loip_rows_reads(const loip_rows *r);
LOIP_API uint64_t loip_rows_hits(const loip_rows *r);
LOIP_API uint64_t loip_rows_ahead(const loip_rows *r);
/* The logits of the table's rows [first, last) for n vectors x ([n, cols], fp32) into
 * logits[t * rows + i] (the whole [n, rows] buffer; other rows untouched), read by chunks
 * (chunk_rows > 0), on pool's threads: what the head computes with r bound. */
LOIP_API int loip_rows_logits(loip_rows *r, loip_pool *pool, const float *x, int32_t n, int64_t first, int64_t last,
                              float *logits);
/* on 0: each head chunk read when it is needed (pread; a kernel read-ahead hint for the next),
 * as where io_uring is not allowed; 1 (the default): read ahead. Reads in flight land first. */
LOIP_API int loip_rows_set_ahead(loip_rows *r, int32_t on);
/* on 1: reads whose offset, length and buffer are 4 KiB aligned go past the page cache
 * (O_DIRECT), as the loader reads blocks: for a device whose memory cannot also cache the table
 * (a filesystem that refuses O_DIRECT: an error naming the file at once, or buffered from the
 * first read refused); 0 (the default): through the page cache. Reads in flight land first. */
LOIP_API int loip_rows_set_direct(loip_rows *r, int32_t on);
/* The embedding (LOIP_W_EMBED) or head (LOIP_W_LM_HEAD; a tied model's head is its embedding)
 * read from r instead of a tensor in memory (r NULL: neither); r must be [vocab_size, dim] and
 * outlive its use. loip_model_bind of the same kind binds memory again. */
LOIP_API int loip_model_bind_rows(loip_model *m, int32_t which, loip_rows *r);
/* LOIP_ESTATE naming the first required tensor not bound in layers [first, last). */
LOIP_API int loip_model_check(const loip_model *m, int32_t first_layer, int32_t last_layer);
/* Bytes of the weights bound so far. */
LOIP_API uint64_t loip_model_weight_bytes(const loip_model *m);

enum {
    LOIP_LOGITS_NONE = 0,
    LOIP_LOGITS_LAST = 1, /* logits[vocab] of the last token */
    LOIP_LOGITS_ALL = 2,  /* logits[n][vocab] */
};

typedef struct loip_session loip_session;
LOIP_API void loip_session_free(loip_session *s);
/* Tokens tokens[0..n) at positions pos..pos+n-1 through embedding, layers and head. The KV
 * cache must hold positions 0..pos-1 (they were forwarded before). */
LOIP_API int loip_session_forward(loip_session *s, const int32_t *tokens, int32_t n, int32_t pos,
                                  float *logits, int32_t logits_mode);
/* The same, in parts, for running a range of blocks (a pipeline stage: loip_session_blocks).
 * hidden is [n, dim] fp32. */
LOIP_API int loip_session_embed(loip_session *s, const int32_t *tokens, int32_t n, float *hidden);
LOIP_API int loip_session_head(loip_session *s, const float *hidden, int32_t n, float *logits,
                               int32_t logits_mode);
enum {
    LOIP_KV_BLOCK_TOKENS = 16, /* positions per KV cache block */
};
/* The KV cache is paged: per layer, blocks of LOIP_KV_BLOCK_TOKENS positions from a pool
 * sized for max_ctx (rounded up to whole blocks). Its bytes: the pool and block tables. */
LOIP_API uint64_t loip_session_kv_bytes(const loip_session *s);
LOIP_API int32_t loip_session_kv_block_tokens(const loip_session *s);
/* Bytes of the session's scratch (activations), without the KV cache. */
LOIP_API uint64_t loip_session_scratch_bytes(const loip_session *s);
/* What loip_session_new_seqs would charge for a model with cfg: the KV cache (kv_bytes) and
 * the activations (scratch_bytes), for planning before anything is allocated. kv_layers: how
 * many layers' cache is kept (< 0: all); kv_tokens (<= 0: max_ctx) and max_seqs (<= 0: 1) as
 * in loip_session_new_seqs. */
LOIP_API int loip_session_size(const loip_model_config *cfg, int32_t max_ctx, int32_t max_batch,
                               int32_t n_threads, int32_t kv_layers, int32_t kv_tokens,
                               int32_t max_seqs, uint64_t *kv_bytes, uint64_t *scratch_bytes);
/* The KV cache a session keeping the layers kv_layers marks (NULL: all) would charge, as
 * loip_session_size's kv_bytes (whose kv_layers count names the first layers): the paged pool of
 * the layers attending to all positions, and a ring of the window and a batch
 * (sliding_window - 1 + max_batch, rounded up to LOIP_KV_BLOCK_TOKENS) per sequence for each
 * windowed layer where that is shorter than max_ctx (those layers' KV stops growing). */
LOIP_API uint64_t loip_session_kv_size(const loip_model_config *cfg, int32_t max_ctx, int32_t max_batch,
                                       const uint8_t *kv_layers, int32_t kv_tokens, int32_t max_seqs);
/* Of a session: the layers whose KV is kept in windows (rings), and the ring's bytes (K and V of
 * them all, every sequence), charged to "kv" whole when the session is made. */
LOIP_API int32_t loip_session_kv_window_layers(const loip_session *s);
/* The ring's positions per sequence that a session of cfg at this context and batch gives each
 * windowed layer (0: none is ringed: no window, or one as long as the context). */
LOIP_API int32_t loip_session_kv_ring_tokens(const loip_model_config *cfg, int32_t max_ctx, int32_t max_batch);
LOIP_API uint64_t loip_session_kv_window_bytes(const loip_session *s);
/* A KV cache for max_ctx positions and scratch for batches of up to max_batch tokens, charged
 * to budget's "kv" and "activations" accounts (budget NULL: not charged) before allocation,
 * keeping the KV cache of only the layers with kv_layers[l] != 0 (NULL: all): a device of a
 * cluster holds its own layers' cache. */
LOIP_API int loip_session_new_layers(const loip_model *m, loip_pool *pool, int32_t max_ctx,
                                     int32_t max_batch, loip_budget *budget,
                                     const uint8_t *kv_layers, loip_session **out);
/* A session serving up to max_seqs sequences (requests) at once, numbered 0..max_seqs-1, each
 * up to max_ctx positions, sharing a KV pool of kv_tokens positions (<= 0: max_ctx) in groups of
 * LOIP_KV_BLOCK_TOKENS: a sequence takes a group when it first writes a position in it and gives
 * its groups back with loip_session_seq_free. loip_session_new_layers is one sequence with a
 * pool of max_ctx. flags: LOIP_SESSION_*. */
LOIP_API int loip_session_new_seqs(const loip_model *m, loip_pool *pool, int32_t max_ctx,
                                   int32_t max_batch, int32_t kv_tokens, int32_t max_seqs,
                                   loip_budget *budget, const uint8_t *kv_layers, uint32_t flags,
                                   loip_session **out);
enum {
    LOIP_SESSION_KV_GROWS = 1, /* from the start as loip_session_set_kv_growth(s, 1) leaves it */
};
/* Sequence seq ends: its KV groups go back to the pool (its positions are forgotten). */
LOIP_API int loip_session_seq_free(loip_session *s, int32_t seq);
/* KV growth: with grows != 0 the pool is charged to the budget's "kv" account group by group as
 * sequences take groups (and released as they give them back) rather than all at once, so that
 * the account follows the contexts actually held; without it (the default) the whole pool is
 * charged at creation. A position that needs a group the budget cannot pay for fails with the
 * budget's message. The pool is an anonymous mapping: charged at once, it is made resident at
 * once; growing, its pages become resident as positions are written. Changes only while no
 * sequence holds KV (LOIP_ESTATE). */
LOIP_API int loip_session_set_kv_growth(loip_session *s, int32_t grows);
/* What the "kv" account holds for this session now (the tables and the groups charged). */
LOIP_API uint64_t loip_session_kv_charged(const loip_session *s);
/* Bytes of one group (LOIP_KV_BLOCK_TOKENS positions of every layer kept): what a sequence
 * takes each time its context crosses into a new group. */
LOIP_API uint64_t loip_session_kv_group_bytes(const loip_session *s);
/* Bytes of one chunk: K and V of one layer's LOIP_KV_BLOCK_TOKENS positions (a group holds one
 * per layer kept). The unit of lending. */
LOIP_API uint64_t loip_session_kv_chunk_bytes(const loip_session *s);
/* Groups sequence seq holds now (its positions' groups, the evicted ones not counted). */
LOIP_API int32_t loip_session_kv_groups_held(const loip_session *s, int32_t seq);
/* KV lending (the paper's KV transfer protocol; the device runs it, see loip_device_lend):
 * the K/V of layers [layer0, layer1) of sequence seq's groups [g0, g0 + n) (positions
 * g0*16 .. (g0+n)*16 - 1) copied into buf (layers, then groups; per chunk K then V: *bytes =
 * layers x n x loip_session_kv_chunk_bytes), then given up here: their pages go back to the
 * kernel where a chunk covers whole pages, their charge leaves the "kv" account (growing
 * sessions), and a layer with any chunk away refuses to run (LOIP_ESTATE) until
 * loip_session_kv_return brings the same range back (charged again; the budget may refuse).
 * Chunks must be held and home to lend, lent to return (LOIP_ESTATE otherwise). A sequence
 * that ends forgets its lent chunks. */
LOIP_API int loip_session_kv_lend(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                  int32_t n, void *buf, uint64_t cap, uint64_t *bytes);
LOIP_API int loip_session_kv_return(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n, const void *buf, uint64_t bytes);
/* A lent range's rows read in place from buf (as loip_session_kv_lend wrote them) while its
 * blob is back: its layers may run, nothing is copied or charged (buf is the caller's, and must
 * stay until loip_session_kv_detach or _return). Detached, the range is away again. */
LOIP_API int loip_session_kv_attach(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n, const void *buf, uint64_t bytes);
LOIP_API int loip_session_kv_detach(loip_session *s, int32_t seq, int32_t layer0, int32_t layer1, int32_t g0,
                                    int32_t n);
/* Evict-and-recompute (the baselines' KV handling): sequence seq's first `positions` positions
 * (a multiple of LOIP_KV_BLOCK_TOKENS, never fewer than before) keep no KV from now on: their
 * groups go back to the pool. Every later batch with a token of seq must recompute them: rows
 * for positions 0..positions-1, in order and consecutive, whose K/V serve the batch one layer at
 * a time and are not kept. Undone only when the sequence ends. */
LOIP_API int loip_session_kv_evict(loip_session *s, int32_t seq, int32_t positions);
LOIP_API int32_t loip_session_kv_evicted(const loip_session *s, int32_t seq);
/* Positions the pool can still give out (free groups x LOIP_KV_BLOCK_TOKENS). */
LOIP_API int32_t loip_session_kv_free_tokens(const loip_session *s);
LOIP_API int32_t loip_session_max_seqs(const loip_session *s);
/* Sharing KV (runtime/exec/kv_share.c, docs/prefix-cache.md). A group is named by block
 * tables and by the prompt cache's holds, counted per group; a group named more than once is
 * never written: a sequence's first write into it copies it into a fresh group of its own
 * (copy-on-write: every kept layer's rows, charged as any group it takes). Lending refuses a
 * shared group (LOIP_ESTATE naming the sequence); evicting (loip_session_kv_evict) or freeing a
 * sequence drops its references only, a group going back to the pool when none is left.
 * Sequence dst (holding no KV) takes src's groups covering positions [0, n_positions). */
LOIP_API int loip_session_seq_share(loip_session *s, int32_t dst, int32_t src, int32_t n_positions);
/* The prompt cache's holds: seq's groups [first, first + n) held outside any sequence (their ids
 * into ids[n]; they stay when seq ends). A group only the cache holds is charged to the
 * budget's "prompt_cache" account (growing sessions) instead of "kv", and is evicted, least
 * recently held or adopted first, when a sequence needs a group and none is free or the budget
 * refuses one: the plan's needs come first. Its gen (loip_session_kv_gen) changes whenever it
 * goes back to the pool, so a holder knows whether its hold survived. */
LOIP_API int loip_session_kv_hold(loip_session *s, int32_t seq, int32_t first, int32_t n, int32_t *ids);
/* Sequence seq (holding no KV) starts with the held groups ids[0..n) as its first n groups; where
 * sliding-window layers keep their KV in rings, its rings start from the snapshot ids[n - 1]
 * carries (LOIP_ESTATE when it carries none: loip_session_kv_hold_window). */
LOIP_API int loip_session_kv_adopt(loip_session *s, int32_t seq, const int32_t *ids, int32_t n);
/* Where layers keep their KV in rings (loip_session_kv_window_layers): seq's held group i (its
 * positions end at (i + 1) * LOIP_KV_BLOCK_TOKENS = e) given a snapshot of seq's rings at e, the
 * window - 1 positions before e of every ringed layer (what a sequence reads from e on), charged
 * to "prompt_cache" (the least recent held groups evicted for it when the budget refuses) and
 * freed with the group's last hold. LOIP_ESTATE when the rings no longer hold those positions or
 * the group is not held; a no-op where nothing is ringed. loip_session_kv_window_end: the
 * positions held group id's snapshot ends at (0: none). */
LOIP_API int loip_session_kv_hold_window(loip_session *s, int32_t seq, int32_t i);
LOIP_API int32_t loip_session_kv_window_end(const loip_session *s, int32_t id);
/* Held group id (its positions end at end) to get seq's rings at end once seq has written them:
 * taken before the next batch writes the rings (or when seq is freed), where the group is still
 * held without one and the rings still hold those positions. What a request that recomputes a
 * held run (the run's end carries no snapshot) leaves for the next. A no-op where nothing is
 * ringed; one wanted a sequence (a later call replaces it). */
LOIP_API int loip_session_kv_window_at(loip_session *s, int32_t seq, int32_t id, int32_t end);
/* The prompt cache's disk tier: a snapshot's bytes (0: nothing is ringed); held group id's
 * snapshot copied into buf (its end into *end; LOIP_ESTATE: none); a snapshot (as read) given to
 * held group id, ending at end (charged as loip_session_kv_hold_window's). */
LOIP_API uint64_t loip_session_kv_window_snapshot_bytes(const loip_session *s);
LOIP_API int loip_session_kv_read_window(loip_session *s, int32_t id, void *buf, uint64_t cap, int32_t *end);
LOIP_API int loip_session_kv_load_window(loip_session *s, int32_t id, int32_t end, const void *buf, uint64_t bytes);
/* One hold of group id given up (back to the pool when nothing names it). */
LOIP_API int loip_session_kv_drop(loip_session *s, int32_t id);
/* Block tables and holds naming group id (0: free; -1: no such group). */
LOIP_API int32_t loip_session_kv_refs(const loip_session *s, int32_t id);
LOIP_API uint32_t loip_session_kv_gen(const loip_session *s, int32_t id);
typedef struct loip_kv_share_stats {
    int32_t n_groups, free_groups;
    int32_t cache_groups;        /* held by the cache alone */
    int32_t cache_shared_groups; /* held by the cache and named by a sequence */
    int32_t shared_groups;       /* named by more than one sequence */
    int32_t window_snapshots;    /* held groups carrying their sliding-window rings */
    uint64_t cache_bytes;        /* cache_groups x the group's bytes, and the snapshots' */
    uint64_t cache_charged;      /* what the "prompt_cache" account holds for this session */
    uint64_t evictions;          /* held groups evicted for a sequence's need */
    uint64_t cow_copies;         /* shared groups copied before a write */
} loip_kv_share_stats;
LOIP_API void loip_session_kv_share_stats(const loip_session *s, loip_kv_share_stats *st);
/* The prompt cache's disk tier: held group id's rows (per kept layer in order, its K then its V
 * rows: loip_session_kv_group_bytes) copied into buf; a group's rows (as read) loaded into a
 * group taken for the cache alone (held once, charged as held; the least recent held group
 * evicted for it when none is free); a held group made the most recently used. */
LOIP_API int loip_session_kv_read_group(loip_session *s, int32_t id, void *buf, uint64_t cap);
LOIP_API int loip_session_kv_load_group(loip_session *s, const void *buf, uint64_t bytes, int32_t *id);
LOIP_API int loip_session_kv_touch(loip_session *s, int32_t id);

/* A token of a batch of several sequences: its sequence and position (the KV position it is
 * written at). parent > 0 makes it a node of a tree of drafts (speculative decoding's tree mode):
 * its parent is the row `parent` rows before it (same sequence, a lower position); the tree's
 * root is the first ancestor with parent 0, at position n. A node at depth d (a child of the
 * root: 1) is rotated as position n + d and attends to positions 0..n and to its ancestors' and
 * its own positions only, which must lie in n+1..n+R (siblings and cousins are not seen), R the
 * session's tree reach: its batch rounded up to 64, at most LOIP_TREE_MAX. */
enum {
    LOIP_TREE_MAX = 512, /* the most positions past its root a tree of drafts reaches */
};
typedef struct loip_batch_token {
    int32_t seq;
    int32_t pos;
    int32_t parent;         /* 0: an ordinary row */
} loip_batch_token;
/* Tokens tokens[0..n) of several sequences (toks[t]: token t's sequence and position; a
 * sequence's positions before the ones here must have been forwarded before, or come earlier
 * in this batch) through embedding, layers and the head of the rows rows[0..n_rows) into
 * logits [n_rows, vocab]. One pass over the weights serves every sequence of the batch. */
LOIP_API int loip_session_forward_batch(loip_session *s, const int32_t *tokens, int32_t n,
                                        const loip_batch_token *toks, const int32_t *rows,
                                        int32_t n_rows, float *logits);
/* The head of the rows rows[0..n_rows) of hidden [n, dim] into logits [n_rows, vocab]. */
LOIP_API int loip_session_head_rows(loip_session *s, const float *hidden, int32_t n,
                                    const int32_t *rows, int32_t n_rows, float *logits);
/* The head cut by vocabulary rows (a plan's head_shares): the rows rows[0..n_rows) of hidden
 * [n, dim] gathered and put through the final norm into out [n_rows, dim]; then the logits of
 * vocabulary rows [first, last) of those normalised rows into logits [n_rows, vocab] (the other
 * columns untouched), from the table in memory (only rows [first, last) need be there) or read
 * by chunks. Each logit is the one loip_session_head_rows computes, bit for bit. */
LOIP_API int loip_session_head_norm(loip_session *s, const float *hidden, int32_t n,
                                    const int32_t *rows, int32_t n_rows, float *out);
LOIP_API int loip_session_head_share(loip_session *s, const float *normed, int32_t n_rows,
                                     int32_t first, int32_t last, float *logits);

/* Blocks, the unit of offloading: block b is layer b/2's attention (MHA: attention norm, q/k/v/o
 * and their biases and norms) when b is even, its MLP (ffn norm, gate, up, down) when odd. */
enum {
    LOIP_BLOCK_MHA = 0,
    LOIP_BLOCK_MLP = 1,
};
/* Blocks [first, last) over hidden [n, dim] (layers [f, l) are blocks [2f, 2l)). */
LOIP_API int loip_session_blocks(loip_session *s, int32_t first, int32_t last, float *hidden,
                                 int32_t n, int32_t pos);

/* ---- offloaded execution (runtime/exec/runner.c) --------------------------------------- */

/* A runner executes a device's stages every step (docs/design.md, section 3): each stage is a range of
 * blocks whose first n_offloaded are read from the slice store into a loader slot every step
 * and the rest are resident. Running a stage waits for its slot, computes the offloaded blocks,
 * releases the slot (the loader starts reading the next stage's blocks into it at once), then
 * computes the resident blocks, so that loading overlaps compute. Stages run in cyclic order
 * 0, 1, ..., S-1, 0, ... (one step after another); a stage run out of that order is still
 * correct (the runner drains its loads and reads the stage first) but loses the overlap. */

/* Where one offloaded weight lies inside the slot: the "proxy" tensor. The views are given
 * once; after each load the model's weight (layer, which) is re-bound to the slot it landed in
 * (a pointer update: nothing is parsed or allocated per step). */
typedef struct loip_stage_view {
    int32_t layer;
    int32_t which;        /* LOIP_W_* */
    uint64_t slot_offset; /* bytes from the start of the slot */
    int32_t dtype;
    int32_t ndim;
    int64_t shape[4];
} loip_stage_view;

typedef struct loip_stage_desc {
    int32_t first_block;  /* blocks [first_block, last_block) */
    int32_t last_block;
    int32_t n_offloaded;  /* the first n_offloaded of them are read into a slot every step */
    int32_t n_extents;    /* the reads that bring them (slot_offset relative to the slot) */
    const loip_load_extent *extents;
    int32_t n_views;      /* their tensors in the slot */
    int32_t flags;        /* LOIP_STAGE_* */
    const loip_stage_view *views;
} loip_stage_desc;
enum {
    /* The conventional way, for baselines: each offloaded block is read (into the start of
     * the first slot) when its turn comes, then computed; nothing is read ahead. The slot
     * needs to hold only the largest block. Extent i must be block first_block + i. */
    LOIP_STAGE_PER_BLOCK = 1,
};

enum {
    LOIP_EVENT_LOAD = 0,    /* the disk: a stage's offloaded blocks read into a slot */
    LOIP_EVENT_COMPUTE = 1, /* blocks [first_block, last_block) computed; stage -1: the
                               embedding (blocks [-1, 0)) or the head ([2L, 2L+1), L layers) */
    LOIP_EVENT_WAIT = 2,    /* compute waiting for a load */
    LOIP_EVENT_SEND = 3,    /* the network: a message handed to the transport (a device) */
    LOIP_EVENT_RECV = 4,    /* the network: a message's transit, sent (sender's clock) to delivered */
};

typedef struct loip_runner_event {
    int32_t kind;        /* LOIP_EVENT_* */
    int32_t stage;       /* -1: embedding or head */
    int32_t first_block;
    int32_t last_block;
    uint64_t t0_ns;      /* loip_now_ns() clock */
    uint64_t t1_ns;
    uint64_t bytes;      /* loads: bytes read */
    int32_t offloaded;   /* compute: the blocks were read from the slot */
    int32_t n_tokens;    /* compute: tokens in the batch */
} loip_runner_event;

typedef struct loip_runner_stats_t {
    uint64_t stage_runs;
    uint64_t compute_ns;   /* blocks, embedding and head */
    uint64_t stall_ns;     /* waiting for loads */
    uint64_t load_ns;      /* loads from submit to done, summed */
    uint64_t bytes_loaded;
    uint64_t loads;
    uint64_t events_dropped; /* the event buffer was full */
} loip_runner_stats_t;

typedef struct loip_runner loip_runner;
/* Stages (copied) over session s of model m; loader (NULL when no stage offloads) reads the
 * offloaded blocks; its slots must hold every stage's offloaded bytes. The offloaded weights
 * are bound to the first slot now and re-bound after every load; the first loads start now.
 * event_capacity: events kept until drained by loip_runner_events (0: none recorded). The
 * session and model must outlive the runner; it holds the loader (loip_loader_retain) until it
 * is freed or given another. */
LOIP_API int loip_runner_new(loip_session *s, loip_model *m, loip_loader *loader,
                             const loip_stage_desc *stages, int32_t n_stages,
                             int32_t event_capacity, loip_runner **out);
/* Waits for the loads in flight (they write into slots). */
LOIP_API void loip_runner_free(loip_runner *r);
/* Run stage over hidden [n, dim], a batch of several sequences (toks[t]: token t's sequence
 * and position, as loip_session_forward_batch): an offloaded block is read once per step for
 * every sequence of the batch. A failed load fails the stage with the loader's message (nothing
 * is computed from its slot); the next run reads it again. */
LOIP_API int loip_runner_stage_batch(loip_runner *r, int32_t stage, float *hidden, int32_t n,
                                     const loip_batch_token *toks);
/* One device holding the whole model: embedding, every stage in order, the head of the rows
 * rows[0..n_rows) (as loip_session_forward_batch). */
LOIP_API int loip_runner_forward_batch(loip_runner *r, const int32_t *tokens, int32_t n,
                                       const loip_batch_token *toks, const int32_t *rows,
                                       int32_t n_rows, float *logits);
/* Change stage k's offloaded prefix at a step boundary (a live plan change): desc has the
 * stage's blocks and its new n_offloaded with their extents and views, as at loip_runner_new.
 * Loads in flight are waited for and the loads start again from stage 0. A block that becomes
 * offloaded is read into the slot from the next time its stage runs (its resident copy may go
 * once this returns); one that becomes resident must have its weights bound by the caller
 * before its stage runs. The slot must hold the new stage (LOIP_EINVAL otherwise, nothing
 * changed). */
LOIP_API int loip_runner_restage(loip_runner *r, int32_t k, const loip_stage_desc *desc);
/* Read the offloaded blocks through loader l from now on (slots of another size, between steps:
 * a live change that needs a larger slot). The old loader's loads are waited for; it may be
 * freed once this returns. Every stage must fit l's slots (LOIP_EINVAL otherwise, nothing
 * changed); the runner holds l (loip_loader_retain) and lets the old one go. l NULL detaches the loader (its memory can go before the
 * next one is made); a stage that offloads must not run until one is set. */
LOIP_API int loip_runner_set_loader(loip_runner *r, loip_loader *l);
/* prefetch 0: a stage's reads start only when the stage runs (a conventional pipeline with
 * offloading: load, then compute), for baselines; 1 (the default): as soon as there is room. */
LOIP_API int loip_runner_set_prefetch(loip_runner *r, int32_t prefetch);
/* Moves up to cap recorded events, oldest first, into out; returns how many. */
LOIP_API int loip_runner_events(loip_runner *r, loip_runner_event *out, int32_t cap);
/* Record an event of another part (the device loop's network events) in the runner's buffer. */
LOIP_API int loip_runner_record(loip_runner *r, int32_t kind, int32_t stage, uint64_t t0_ns,
                                uint64_t t1_ns, uint64_t bytes);
LOIP_API int loip_runner_stats(loip_runner *r, loip_runner_stats_t *out);

/* ---- the expert cache (runtime/exec/experts.c) ------------------------------------------ */

/* A device's routed experts that are not bound in the model (mixture of experts): a cache of
 * its loader's slots, each holding one expert (its three tensors as one file extent). When a
 * layer routes its batch, every expert the rows chose is computed: those bound or cached at
 * once, while the others are read into slots (evicting by the policy experts not used by the
 * layer running) and computed as they land; every chosen expert, never fewer. Before a layer's
 * attention runs, its router (and that of the `prefetch` - 1 layers after it) is applied to the
 * layer's input (pre-gating) and the experts it predicts start loading: a wrong prediction
 * costs reads, never a token (the real router decides what is computed). */
enum {
    LOIP_EXPERTS_LRU = 0,    /* evict the expert used longest ago */
    LOIP_EXPERTS_LFU = 1,    /* evict the expert routed least often (ties: longest ago) */
    LOIP_EXPERTS_STATIC = 2, /* pinned experts (loip_experts_pin) stay; the rest as LRU */
    LOIP_EXPERTS_ALL = 3,    /* a baseline, offloading without routing: every expert of a layer is
                                read at each run of the layer (pre-gating reads what the slots
                                hold, the rest after the layer computed, read and dropped), and
                                none is kept for the next; the router still decides what is computed */
};

typedef struct loip_experts_config {
    int32_t policy;         /* LOIP_EXPERTS_* */
    int32_t prefetch;       /* layers whose experts are predicted ahead (pre-gating); 0: off */
    int32_t event_capacity; /* expert reads kept for loip_experts_events (0: none) */
    /* Pre-gating that does not pay stops: a layer whose predictions the router confirmed less
     * often than prefetch_min_accuracy (a running average over its runs) is predicted only at
     * every prefetch_probe_every-th run of it, to notice when it would pay again. 0: always. */
    float prefetch_min_accuracy;
    int32_t prefetch_probe_every;
} loip_experts_config;

typedef struct loip_experts_stats_t {
    uint64_t routed;        /* experts a layer's batch chose (each expert once per layer run) */
    uint64_t bound;         /* of those, bound in the model (a resident layer's) */
    uint64_t cache_hits;    /* in a slot when the layer asked for it (prefetched or kept) */
    uint64_t read;          /* read on demand, after the router chose it */
    uint64_t prefetched;    /* reads started by pre-gating */
    uint64_t prefetch_hits; /* prefetched experts the router then chose */
    uint64_t prefetch_skipped; /* layer runs not predicted: their predictions did not pay */
    uint64_t bytes_read;    /* demand and prefetch reads */
    uint64_t stall_ns;      /* waiting for experts the router chose */
    uint64_t events_dropped;
} loip_experts_stats_t;

typedef struct loip_experts loip_experts;
/* An expert cache of model m with a loader of its own made from lc (its n_slots experts, each
 * slot_bytes: the largest expert's extent; charged to lc->budget's "slots" as a loader is). The
 * model must outlive its use, not its free. */
LOIP_API int loip_experts_new(loip_model *m, const loip_loader_config *lc, const loip_experts_config *cfg,
                              loip_experts **out);
/* Waits for its reads in flight, frees its loader. */
LOIP_API void loip_experts_free(loip_experts *x);
/* Its loader (owned by it: for the loader's mode and statistics). */
LOIP_API loip_loader *loip_experts_loader(loip_experts *x);
/* Where expert e of layer l lies: ext (its file; slot_offset 0) and its parts at offsets
 * offset[LOIP_EXPERT_*] of the extent, of dtype (shapes from the model's config). */
LOIP_API int loip_experts_set_source(loip_experts *x, int32_t layer, int32_t expert,
                                     const loip_load_extent *ext, const uint64_t *offset,
                                     int32_t dtype);
/* Layer l's ffn_norm and router for pre-gating (views the caller keeps alive); a layer without
 * them is not predicted. */
LOIP_API int loip_experts_set_gating(loip_experts *x, int32_t layer, const loip_tensor *ffn_norm,
                                     const loip_tensor *router);
/* Layer l's router bias for pre-gating (router_bias: gpt-oss), [n_experts], a view the caller
 * keeps alive; NULL clears it. Without it the layer's prediction goes without its bias. */
LOIP_API int loip_experts_set_gating_bias(loip_experts *x, int32_t layer, const loip_tensor *router_bias);
/* Read expert e of layer l into a slot now and keep it there (LOIP_EXPERTS_STATIC), waiting for
 * the read; LOIP_ENOMEM when every slot is pinned. */
LOIP_API int loip_experts_pin(loip_experts *x, int32_t layer, int32_t expert);
/* Forget every cached expert (after the model's bytes on disk or the plan changed); waits for
 * reads in flight. Pinned experts are forgotten too. */
LOIP_API int loip_experts_clear(loip_experts *x);
LOIP_API int loip_experts_stats(loip_experts *x, loip_experts_stats_t *out);
/* Moves up to cap recorded reads, oldest first, into out (kind LOIP_EVENT_LOAD, stage: the
 * layer, first_block: the expert, offloaded: 1 for a prefetch); returns how many. */
LOIP_API int loip_experts_events(loip_experts *x, loip_runner_event *out, int32_t cap);
/* Route the session's layers' unbound experts through x (NULL: none; then such an expert is an
 * error naming it). x must be of the session's model and outlive its use. */
LOIP_API int loip_session_set_experts(loip_session *s, loip_experts *x);
/* The routing seen so far (a routing profile): out[layer * n_experts + e] += the tokens whose
 * router chose expert e of layer (cap >= n_layers * n_experts entries), then the counts restart
 * from 0. Counted by every MoE layer the session runs (pre-gating's predictions are not). */
LOIP_API int loip_session_take_routing(loip_session *s, uint64_t *out, int64_t cap);

/* ---- transport (runtime/transport) ------------------------------------------------------ */

/* Messages between the head and the devices, over ZeroMQ: a fixed little-endian header frame
 * and an optional payload frame. Every field is checked on receipt; a malformed message is
 * consumed and reported (LOIP_EPROTO naming the field), the connection stays usable. Peers
 * authenticate with CURVE: either a keypair derived from a shared cluster token (every member
 * holds the same key, the token never crosses the wire) or explicit keys; a ZAP handler
 * refuses every other client key and logs it. */
enum {
    LOIP_MSG_MAGIC = 0x50494f4c, /* "LOIP" */
    LOIP_MSG_VERSION = 1,
};
enum {
    LOIP_MSG_HELLO = 1,   /* head -> device: who are you (reply: HELLO with a JSON payload) */
    LOIP_MSG_PLAN = 2,    /* head -> device: a JSON plan for the device (reply: READY/ERROR) */
    LOIP_MSG_READY = 3,
    LOIP_MSG_ERROR = 4,   /* payload: message text; status: LOIP_E* */
    LOIP_MSG_START = 5,   /* head -> devices: a request in a sequence slot (JSON: seq, request,
                             sampler, prompt ids); the slot's KV cache starts empty */
    LOIP_MSG_TOKENS = 6,  /* ids (I32) into the first stage */
    LOIP_MSG_HIDDEN = 7,  /* hidden states (F32, n_tokens x dim) between stages */
    LOIP_MSG_RESULT = 8,  /* last device -> head: loip_step_output per flagged token, logits */
    LOIP_MSG_STATS = 9,   /* head -> device: report (reply: STATS with a JSON payload) */
    LOIP_MSG_PING = 10,   /* heartbeat (reply: PONG) */
    LOIP_MSG_PONG = 11,
    LOIP_MSG_STOP = 12,   /* head -> device: shut down */
    LOIP_MSG_TRACE = 13,  /* head -> device: its recorded events (reply: TRACE, JSON) */
    LOIP_MSG_PROFILE = 14, /* head -> device: measure yourself (JSON options; reply: PROFILE, JSON) */
    LOIP_MSG_END = 15,    /* head -> devices: a request's sequence slot is free (JSON: seq,
                             request); its KV cache goes back to the pool; no reply */
    LOIP_MSG_CHANGE = 16, /* head -> device, between steps: a live plan change (JSON: plan_id,
                             change, stage, offloaded; reply: READY with its memory, or ERROR) */
    LOIP_MSG_LINK = 17,   /* head -> device: the emulated link into it changes (JSON: rate,
                             delay_ms); no reply */
    /* KV lending between devices (loip_device_lend): the lender's device loop to the holder's
     * in-socket; hop: the lender's stage; the holder's device loop answers, Lua never sees them */
    LOIP_MSG_KV_PUT = 18,  /* lender -> holder: a stage's lent KV (a blob the holder keeps) */
    LOIP_MSG_KV_GET = 19,  /* lender -> holder: the stage's blob back, please */
    LOIP_MSG_KV_DATA = 20, /* holder -> lender: the blob (empty: the holder has none) */
    LOIP_MSG_KV_DROP = 21, /* lender -> holder: forget the stage's blob (its requests ended) */
    LOIP_MSG_LEND = 22,    /* head -> device, between steps: lend KV (JSON: plan_id, peer, groups);
                              reply: READY with its memory, or ERROR */
    LOIP_MSG_DRAFT = 23,   /* head -> device: speculative decoding's draft run there (JSON: plan_id,
                              op open|propose|release|close; reply: DRAFT, JSON) */
    LOIP_MSG_LOOKUP = 24,  /* head -> device: which of a prompt's leading KV group keys it holds
                              (JSON: keys; reply: READY, JSON held; loip.engine.request.prefix_cache) */
    LOIP_MSG_SHIP = 25,    /* head -> device, on the bulk link: block files shipped into its cache
                              (JSON op need|check, reply SHIP, JSON; or flags 1: a chunk of file
                              hop of the manifest at offset step, no reply; loip.cluster.cache) */
    LOIP_MSG_LOGITS = 26, /* last device -> round the ring -> last device: a step's normalised
                             output rows, each device adding its share of the head's logits (a
                             plan's head_shares): pos (rows) x model-dim floats, then pos x
                             dim (vocabulary) floats of logits, then n_tokens loip_step_token */
    LOIP_MSG_KINDS = 27,
};

typedef struct loip_msg_header {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;          /* LOIP_MSG_* */
    uint32_t plan_id;       /* the plan it belongs to (0: none) */
    int32_t hop;            /* ring position the payload is for: device-major within a stage
                               round (stage * n_devices + device); -1: none */
    uint64_t step;          /* the head's step number (its RESULT carries it back) */
    int32_t n_tokens;
    int32_t pos;            /* unused by data messages (each token carries its own) */
    int32_t dtype;          /* payload elements: LOIP_F32 or LOIP_I32; -1: bytes (text/JSON) */
    int32_t dim;            /* elements per token (TOKENS: 1, HIDDEN: model dim) */
    uint64_t payload_bytes;
    uint64_t t_send_ns;     /* sender's loip_now_ns() */
    int32_t status;
    int32_t flags;          /* unused (0) */
} loip_msg_header;

/* A micro-batch travels the ring as one message: TOKENS carry n ids (int32) then n
 * loip_step_token, HIDDEN n x dim floats then the same n loip_step_token. Each token names its
 * sequence (the request's slot on every device), the request that slot must be running (an
 * older one's token is stale and refused), its position, and what the last device returns for
 * it. Its RESULT carries n_tokens loip_step_output (one per token flagged), then the logits
 * rows of those flagged LOIP_TOKF_LOGITS, in order (dtype -1). */
typedef struct loip_step_token {
    int32_t seq;
    int32_t pos;
    uint32_t request;
    int32_t flags;          /* LOIP_TOKF_* */
    int32_t id;             /* the token's id (the last device verifies a draft against it) */
    int32_t parent;         /* a tree node's parent, rows back (loip_batch_token); 0: none */
} loip_step_token;
enum {
    LOIP_TOKF_SAMPLE = 1,   /* sample the sequence's next token from this token's logits */
    LOIP_TOKF_LOGITS = 2,   /* return this token's logits */
    LOIP_TOKF_RECOMPUTE = 4, /* an evicted position recomputed (loip_session_kv_evict): the
                               sequence's rows 0..E-1 so flagged evict its first E positions
                               on every device before the step runs */
    LOIP_TOKF_DRAFT = 8,    /* with SAMPLE: a draft token, verified on the last device against
                               the distribution of the sequence's row before it (a run of rows
                               SAMPLE, SAMPLE|DRAFT, ...: loip_sampler_verify); the outputs are
                               the accepted drafts (flags SAMPLE|DRAFT) and the next token */
    LOIP_TOKF_TREE = 16,    /* with SAMPLE|DRAFT: a node of a tree of drafts (its parent set):
                               the run after a SAMPLE row is verified as a tree
                               (loip_sampler_verify_tree); the outputs are the accepted path's
                               drafts (SAMPLE|DRAFT) and the next token */
    LOIP_TOKF_PEEK = 32,    /* with SAMPLE|DRAFT: after its run's outputs, one more of flags
                               PEEK for each such row not on the accepted path, in row order:
                               the row's argmax over its slot's ids (the model's own guess after
                               it; lookahead decoding's n-grams). Tokens and KV are unchanged. */
};
typedef struct loip_step_output {
    int32_t seq;
    uint32_t request;
    int32_t id;             /* the sampled id; -1 for logits */
    int32_t flags;          /* the token's LOIP_TOKF_* */
} loip_step_output;

typedef struct loip_net loip_net;
/* A transport context. token: the cluster secret (the CURVE keypair derived from it); NULL
 * with keys_dir: the cluster's CURVE secret key from keys_dir/secret.key (z85 text, 40
 * characters; the same file on every member), for a full-entropy key instead of a token. */
LOIP_API int loip_net_new(const char *token, const char *keys_dir, loip_net **out);
LOIP_API void loip_net_free(loip_net *n);
/* Lines logged by the ZAP handler (rejected peers), oldest first, moved into buf; count. */
LOIP_API int loip_net_auth_log(loip_net *n, char *buf, size_t cap);

typedef struct loip_sock loip_sock;
/* A server socket (ROUTER) listening at endpoint ("tcp://host:port", "ipc://path"). */
LOIP_API int loip_sock_bind(loip_net *n, const char *endpoint, loip_sock **out);
/* The endpoint actually bound (a port given as 0 or "*" resolved), into buf. */
LOIP_API int loip_sock_endpoint(loip_sock *s, char *buf, size_t cap);
/* A client socket (DEALER) to a server, with identity (its name on the server's side). */
LOIP_API int loip_sock_connect(loip_net *n, const char *endpoint, const char *identity,
                               loip_sock **out);
LOIP_API void loip_sock_free(loip_sock *s);
/* A client socket: how many times the server dropped the connection before the handshake
 * succeeded since the last success (> 0: it cannot read our key: another cluster token). */
LOIP_API int loip_sock_refused(loip_sock *s);
/* Send header h (magic, version and t_send filled in) and payload[h->payload_bytes]; to:
 * the peer's identity on a server socket, NULL on a client. Does not block for the peer
 * beyond timeout_ms (< 0: no limit): LOIP_ETIMEDOUT when the message could not be queued. */
LOIP_API int loip_sock_send(loip_sock *s, const char *to, const loip_msg_header *h,
                            const void *payload, int32_t timeout_ms);
/* Receive one message within timeout_ms (< 0: no limit; LOIP_ETIMEDOUT): the header, its
 * payload into payload[cap], and on a server socket the sender's identity into from[64].
 * Checks magic, version, kind, the payload's size against the header, and dtype x dim x
 * n_tokens against the size for TOKENS/HIDDEN/RESULT (LOIP_EPROTO, message naming the field).
 * With emulation on, returns only when the emulated link would have delivered it. */
/* A received header checked against what the wire may carry: magic, version, kind, payload at
 * most cap bytes, and per kind its fields against its payload's size (LOIP_EPROTO naming the
 * field; who: the sender, for the message). loip_sock_recv runs it on every message. */
LOIP_API int loip_msg_check(const loip_msg_header *h, uint64_t cap, const char *who);
LOIP_API int loip_sock_recv(loip_sock *s, int32_t timeout_ms, loip_msg_header *h, void *payload,
                            uint64_t cap, char *from);
/* The same, where a KV lending message (LOIP_MSG_KV_*) larger than cap comes in a buffer of its
 * own (*large, malloc'd: the caller frees it; NULL when the payload is in payload). Lent KV
 * moves while its receiver works: its emulated wire starts when it was sent, not when it is
 * taken. */
LOIP_API int loip_sock_recv_large(loip_sock *s, int32_t timeout_ms, loip_msg_header *h, void *payload,
                                  uint64_t cap, char *from, void **large);
/* Emulate a slower link on everything this socket receives: rate_bps bytes/s (0: off) as a
 * serial wire, plus delay_ns one-way. */
LOIP_API int loip_sock_emulate(loip_sock *s, uint64_t rate_bps, uint64_t delay_ns);
/* How long before an emulated delivery time the receiver stops sleeping and spins on the
 * clock, so that the timer's lateness (the machine's: a profile measures it) does not add to
 * every emulated message; 0 (the default): sleep only. */
LOIP_API int loip_sock_emulate_spin(loip_sock *s, uint64_t spin_ns);
/* The weight of a new sample in the moving averages of s's link statistics (bw_bps,
 * latency_ns): average = (1 - weight) x average + weight x sample; the first sample is taken
 * as it is. In (0, 1], LOIP_EINVAL outside. A socket never given one uses 1 (no smoothing:
 * the last sample); the Lua side gives each socket its default at birth. */
LOIP_API int loip_sock_smoothing(loip_sock *s, double weight);

/* A heartbeat: a thread with its own server socket at endpoint answering PING with PONG, so
 * that a worker whose main thread computes a long stage still answers. The PONG's payload is
 * two uint64: how long the worker has been busy with one message (0: idle), and how many it
 * has finished; a device updates them through loip_heartbeat_busy. */
typedef struct loip_heartbeat loip_heartbeat;
LOIP_API int loip_heartbeat_new(loip_net *n, const char *endpoint, loip_heartbeat **out);
LOIP_API void loip_heartbeat_free(loip_heartbeat *hb);
LOIP_API int loip_heartbeat_endpoint(loip_heartbeat *hb, char *buf, size_t cap);
/* busy: 1 when a message starts, 0 when it is done (counted). */
LOIP_API void loip_heartbeat_busy(loip_heartbeat *hb, int32_t busy);
/* When the last PING came (loip_now_ns(); 0: none yet): a worker whose head pings it no more
 * knows the head is gone. */
LOIP_API uint64_t loip_heartbeat_last_ping(loip_heartbeat *hb);

/* A UDP broadcast beacon on a LAN (CZMQ's zbeacon actor: no daemon, no D-Bus): a speaker
 * publishes a payload every interval, a listener receives (sender address, payload). Used by
 * discovery (lua/loip/cluster/discovery.lua), which decides what a payload says. port: the UDP
 * port; iface: an interface name, "*" (all: sends to 255.255.255.255), or NULL/"" for zbeacon's
 * default (the first broadcast-capable interface). host[64]: the address it uses ("*" for all). */
enum { LOIP_BEACON_MAX = 255 }; /* a payload's bytes at most (zbeacon's limit) */
typedef struct loip_beacon loip_beacon;
LOIP_API int loip_beacon_new(int32_t port, const char *iface, loip_beacon **out);
LOIP_API void loip_beacon_free(loip_beacon *b);
LOIP_API int loip_beacon_host(loip_beacon *b, char *host, size_t cap);
/* Speak: send payload now and every interval_ms until _silence or _free (replaces the last). */
LOIP_API int loip_beacon_publish(loip_beacon *b, const void *payload, int32_t len, int32_t interval_ms);
LOIP_API int loip_beacon_silence(loip_beacon *b);
/* Listen to beacons whose payload starts with prefix (len 0: all). */
LOIP_API int loip_beacon_subscribe(loip_beacon *b, const void *prefix, int32_t len);
/* One beacon heard within timeout_ms: its sender's address (addr[cap]) and payload
 * (payload[LOIP_BEACON_MAX], *len bytes). 1: one; 0: none in time; < 0: failure. */
LOIP_API int loip_beacon_recv(loip_beacon *b, int32_t timeout_ms, char *addr, size_t cap,
                              uint8_t *payload, int32_t *len);

typedef struct loip_link_stats {
    char peer[64];          /* sender identity ("" on a client socket) */
    uint64_t messages;
    uint64_t bytes;         /* header + payload */
    uint64_t emulated_ns;   /* time held back by the emulation */
    double bw_bps;          /* bytes/s of large messages, send to delivery (moving average) */
    double latency_ns;      /* send to delivery of small messages (moving average) */
    uint64_t latency_sum_ns; /* ... all of them summed (same-host clocks only) */
    uint64_t latency_count;
    uint64_t transit_sum_ns; /* ... of which before receipt: the sender's and receiver's transport
                              * (thread hand-offs, wake-ups, the medium), summed */
    uint64_t late_sum_ns;   /* ... of which after the emulated delivery time (timer lateness;
                             * unemulated: after receipt) */
} loip_link_stats;
/* Per-sender statistics of what s received (peers in first-seen order); returns the count. */
LOIP_API int loip_sock_stats(loip_sock *s, loip_link_stats *out, int32_t cap);

/* ---- sampling ------------------------------------------------------------------------- */

typedef struct loip_sampler_params {
    float temperature;        /* <= 0: greedy (lowest index among equal maxima) */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; CTRL-style: positive logits divided, negative multiplied */
    int32_t penalty_last_n;   /* how many recent tokens the penalty looks at (<= 0: all given) */
} loip_sampler_params;

typedef struct loip_sampler loip_sampler;
LOIP_API int loip_sampler_new(int32_t vocab_size, uint64_t seed, loip_sampler **out);
LOIP_API void loip_sampler_free(loip_sampler *s);
/* The state n draws on: a sampler re-made with the same seed after n samples at temperature > 0
 * (each draws once) continues as the first would have. */
LOIP_API int loip_sampler_skip(loip_sampler *s, uint64_t n);
/* history: previous token ids (prompt and generated), for the repetition penalty. */
LOIP_API int loip_sampler_sample(loip_sampler *s, const float *logits,
                                 const loip_sampler_params *p, const int32_t *history,
                                 int32_t n_history, int32_t *token);
/* Verify k draft tokens against k + 1 rows of logits (row j: the distribution after the
 * history and drafts[0..j)): row j's token drawn as loip_sampler_sample draws it (greedy: the
 * argmax), the draft accepted when they are equal, else that token emitted instead and the rest
 * rejected; all accepted, the last row's token too. The tokens go to out (room for k + 1) and,
 * as far as max_history allows, onto history (*n_history grows); *n_out = accepted + 1. This is
 * speculative sampling with q = 1 on the draft (accepted with probability p(d), else a draw from
 * p without d), coupled to the sampler's stream: one draw per token out, the tokens a seeded
 * sampler gives without drafts. */
LOIP_API int loip_sampler_verify(loip_sampler *s, const float *logits, int32_t k,
                                 const int32_t *drafts, const loip_sampler_params *p,
                                 int32_t *history, int32_t *n_history, int32_t max_history,
                                 int32_t *out, int32_t *n_out);
/* Verify a tree of m drafts against m + 1 rows of logits (row 0: the root's, after the history;
 * row i: node i's, after the history and node i's path): node i (1..m) is token drafts[i-1],
 * child of node parents[i-1] (0: the root; < i). From the root, a token is drawn from the row
 * as loip_sampler_sample would (greedy: the argmax); the first child with that token is
 * accepted and the walk goes on from it, none: the token ends the path (speculative sampling
 * over several candidates: a child accepted with its probability under the row's distribution
 * less the children rejected before it, renormalised). The path's drafts, then the next token,
 * go to out (room for m + 1) and onto history as loip_sampler_verify does; one draw per token
 * out, each the token sampling alone would give at that point of the stream. */
LOIP_API int loip_sampler_verify_tree(loip_sampler *s, const float *logits, int32_t m,
                                      const int32_t *drafts, const int32_t *parents,
                                      const loip_sampler_params *p, int32_t *history,
                                      int32_t *n_history, int32_t max_history, int32_t *out,
                                      int32_t *n_out);

/* ---- the head: a step's outputs (runtime/exec/head.c) ---------------------------------- */

/* What follows a step's last layer, for both engines (the local one and a ring's last device):
 * which rows give an output, and per sequence slot the sampler, its parameters and its history
 * that turn a row of logits into tokens: one sampled, a chain or a tree of drafts verified, or
 * (at the head of a request asking for logprobs or under a grammar) one sampled with its
 * logprobs under a mask. */
typedef struct loip_head loip_head;
struct loip_grammar_matcher; /* (a grammar's matcher: below, with the grammars) */
/* A head for max_seqs slots (each empty until loip_head_start) and steps of up to max_tokens
 * rows. */
LOIP_API int loip_head_new(int32_t max_seqs, int32_t max_tokens, loip_head **out);
LOIP_API void loip_head_free(loip_head *h);
/* Slot seq samples with p and seed over ids [0, n_sample), the prompt's n_prompt ids its first
 * history for the repetition penalty (max_history ids kept, at least n_prompt); what the slot
 * held before is freed. */
LOIP_API int loip_head_start(loip_head *h, int32_t seq, const loip_sampler_params *p, uint64_t seed,
                             int32_t n_sample, const int32_t *prompt, int32_t n_prompt, int32_t max_history);
/* Slot seq is empty again (its sampler and history freed; an empty or out-of-range slot: nothing). */
LOIP_API void loip_head_end(loip_head *h, int32_t seq);
/* Slot seq's sampler as if it had drawn n times already (a request resumed on a new plan). */
LOIP_API int loip_head_skip(loip_head *h, int32_t seq, uint64_t n);
/* The rows of a step's n tokens that give an output (flagged SAMPLE or LOGITS), as token
 * indices into rows (room for n): those flagged LOGITS first, in order, when logits_first (a
 * RESULT carries their logits together after the outputs), else all in token order. *n_logits:
 * how many of them are flagged LOGITS. */
LOIP_API int loip_head_rows(const loip_step_token *toks, int32_t n, int32_t logits_first, int32_t *rows,
                            int32_t *n_rows, int32_t *n_logits);
/* A step's outputs from the logits of its n_rows rows (loip_head_rows; row r's logits at
 * logits + r * vocab), in the rows' order: a row flagged LOGITS gives an output of id -1; a
 * row flagged SAMPLE its slot's next token, or with the run of SAMPLE|DRAFT rows after it (its
 * sequence's, at the next positions) the run verified as a chain (loip_sampler_verify) or,
 * flagged TREE, as a tree (loip_sampler_verify_tree): the accepted drafts (flags with DRAFT)
 * and the next token. outs: room for n_rows; out_rows (NULL: not wanted) each output's row;
 * *n_outs their count; *drafted and *accepted (NULL: not wanted) the drafts verified and those
 * accepted; after a run's outputs, one output flagged PEEK (id: the row's argmax) for each of
 * its draft rows flagged PEEK that is not on the accepted path, in row order (outs never need
 * more than n_rows: a run of k + 1 rows gives at most k + 1 outputs). LOIP_EPROTO for a draft
 * with no row of its sequence before it or a tree node whose
 * parent is not an earlier node of its tree; LOIP_ESTATE for a row to sample in an empty slot. */
LOIP_API int loip_head_outputs(loip_head *h, const loip_step_token *toks, const int32_t *rows, int32_t n_rows,
                               const float *logits, int32_t vocab, loip_step_output *outs, int32_t *out_rows,
                               int32_t *n_outs, int32_t *drafted, int32_t *accepted);
/* Slot seq's next token from row (its n_sample logits), into *token and onto the history: mask
 * (NULL: none) sets what its grammar does not allow to -inf first, on a copy. With n_top >= 0,
 * the model's log-probabilities (a log-softmax of the row before any mask, penalty or
 * temperature): *logprob the token's, and the n_top most likely ids (ties: lower id first) with
 * theirs, in descending order, into top_ids and top_logprobs (room for n_top), *n_top_out how
 * many. */
LOIP_API int loip_head_sample(loip_head *h, int32_t seq, const float *row, struct loip_grammar_matcher *mask,
                              int32_t n_top, int32_t *token, double *logprob, int32_t *top_ids,
                              double *top_logprobs, int32_t *n_top_out);

/* ---- a device of a cluster (runtime/worker: device.c, lending.c) ---------------------- */

/* The per-step path of a worker, in C: receive tokens (first hop) or hidden states, run the
 * stage they are for (loading, compute and the network overlapping through the runner and
 * ZeroMQ's I/O threads), forward the result to the next hop, or after the last hop compute the
 * head and sample (or return logits) to the head. Hops go around the ring stage by stage: hop
 * h = stage * n_devices + device. Only control messages come back to the caller (Lua). */
typedef struct loip_device_config {
    loip_runner *runner;
    loip_session *session;
    loip_sock *in;          /* this device's server socket: data and control arrive here */
    loip_sock *next;        /* client socket to the next device (NULL with one device) */
    loip_sock *head;        /* client socket to the head: results and errors */
    uint32_t plan_id;
    int32_t device;         /* 0-based position in the ring */
    int32_t n_devices;
    int32_t n_stages;
    int32_t max_tokens;     /* most tokens a message may carry (a micro-batch with prefill chunks) */
    int32_t logits_tokens;  /* most tokens whose logits one message may return (LOIP_TOKF_LOGITS) */
    int32_t max_seqs;       /* sequence slots: requests served at once (the session's) */
    float slowdown;         /* > 1: after each stage, idle (slowdown - 1) x its compute time, to
                               mimic a slower board in a local cluster; <= 1: off */
    loip_heartbeat *heartbeat; /* told when data messages start and end (NULL: none) */
} loip_device_config;

typedef struct loip_device_stats {
    uint64_t hops;           /* stages run */
    uint64_t recv_wait_ns;   /* waiting for data between hops */
    uint64_t send_ns;        /* in loip_sock_send for data and results */
    uint64_t bytes_sent;
    uint64_t rejected;       /* malformed or stale messages refused */
    uint64_t head_ns;        /* embedding, head and sampling */
    /* KV lending: as lender, bytes shipped and fetched back and the time a stage waited for
     * its KV to come back; as holder, the bytes held for other devices now and taken to hold
     * in all (held_bytes goes to 0 whenever a lender fetches its KV back: held_in_bytes says
     * that holding happened, whenever it is read) */
    uint64_t lent_bytes;
    uint64_t fetched_bytes;
    uint64_t lend_wait_ns;
    uint64_t held_bytes;
    uint64_t held_in_bytes;
    uint64_t drafted;        /* draft tokens verified (last device) */
    uint64_t accepted;       /* ... of which accepted */
} loip_device_stats_t;

typedef struct loip_device loip_device;
/* Buffers (hidden states, logits, the payload) charged to budget's "activations" first.
 * max_tokens is lowered to the session's max_batch, logits_tokens (<= 0: 1) to max_tokens,
 * max_seqs to the session's. */
LOIP_API int loip_device_new(const loip_device_config *cfg, loip_budget *budget, loip_device **out);
/* KV lending (the paper's bandwidth-sensitive KV transfer protocol, Alg. 2), this device the
 * lender: after each of its stages runs, the K/V of the stage's layers [stage_layers[2k],
 * stage_layers[2k+1]) of each running sequence's oldest groups (groups[seq] of them, at most
 * all but its newest) is shipped to the holder over peer (a client socket connected to the
 * holder's in-socket) and given up here (loip_session_kv_lend); the fetch of the device's next
 * stage is asked for at once, and a stage waits for its KV before it runs. groups NULL or all 0:
 * nothing more is lent, what is away comes back as its stage runs. A new peer: everything away
 * comes back first (blocking). The holder keeps the blobs charged to its "kv_lent" account and
 * refuses (an ERROR to the head naming it) what its budget cannot hold. The staging buffer
 * (one stage's lent bytes) is charged to "kv". Sizes are copied; the socket stays the caller's
 * and must outlive its use (pass NULL to detach once everything is home). */
LOIP_API int loip_device_lend(loip_device *d, loip_sock *peer, const int32_t *stage_layers,
                              const int32_t *groups);
/* Everything lent comes back now (blocking) and lending stops: before a plan change, or to
 * detach the peer. */
LOIP_API int loip_device_recall(loip_device *d);
/* The head cut across devices (a plan's head_shares): this device computes the logits of
 * vocabulary rows [first, last) (first == last: none), from the head's table as its session's
 * model binds it (those rows in memory, or read by chunks). On the last device a range short of
 * the whole vocabulary makes each step's normalised rows go round the ring as LOIP_MSG_LOGITS
 * (to device 1, ..., device N-1 and back), each device adding its share, before the last device
 * samples; the shares must cover the vocabulary between them. Grows the device's receive buffer
 * to hold such a message (charged to "activations"). */
LOIP_API int loip_device_head_share(loip_device *d, int32_t first, int32_t last);
/* The bytes of the largest LOGITS message a device of a model with cfg receives (its receive
 * buffer's size when the head is cut), for loip_device_size's limits. */
LOIP_API int loip_device_share_size(const loip_model_config *cfg, int32_t max_tokens, int32_t logits_tokens,
                                    int32_t max_seqs, uint64_t *bytes);
/* What loip_device_new charges to "activations" for a device of a model with cfg: the hidden
 * states and token table (max_tokens x (dim floats + a loip_step_token)), the logits of the
 * most rows one message returns (max(logits_tokens, max_seqs), at most max_tokens, x
 * vocab_size floats) with their outputs, the incoming payloads (the hidden states and token
 * table, at least the 64 KiB a control message may need), the token ids and tables, into
 * *bytes. logits_tokens is clamped as
 * loip_device_new clamps it (<= 0: 1; at most max_tokens), max_seqs <= 0 is 1; lowering
 * max_tokens to the session's max_batch is the caller's (pass the smaller). LOIP_EINVAL for
 * max_tokens <= 0, or a cfg without a positive dim and vocab_size. */
LOIP_API int loip_device_size(const loip_model_config *cfg, int32_t max_tokens,
                              int32_t logits_tokens, int32_t max_seqs, uint64_t *bytes);
LOIP_API void loip_device_free(loip_device *d);
/* Request number request (> 0) starts in sequence slot seq: data messages' tokens of that slot
 * must name it (older requests' are stale and refused, so that a late message of a stopped
 * request cannot write into the new one's KV cache, which starts empty). The last device
 * samples with p and seed over ids [0, n_sample), the prompt as the first history for the
 * repetition penalty (max_history ids kept). */
LOIP_API int loip_device_start(loip_device *d, int32_t seq, uint32_t request,
                               const loip_sampler_params *p, uint64_t seed, int32_t n_sample,
                               const int32_t *prompt, int32_t n_prompt, int32_t max_history);
/* The request in slot seq is done (request must be the one it runs, 0: whatever it runs): the
 * slot's KV cache goes back to the pool, its sampler is freed. */
LOIP_API int loip_device_end(loip_device *d, int32_t seq, uint32_t request);
/* Sequence seq's sampler as if it had drawn n times already (a request resumed on a new plan). */
LOIP_API int loip_device_skip_draws(loip_device *d, int32_t seq, uint64_t n);
/* Serve data messages until a control message arrives (returns 1: it is in h, payload[cap],
 * from[64]), timeout_ms passes (0), or a message is refused or a step fails (< 0; the head
 * has been sent an ERROR naming this device). */
LOIP_API int loip_device_serve(loip_device *d, int32_t timeout_ms, loip_msg_header *h,
                               void *payload, uint64_t cap, char *from);
LOIP_API int loip_device_stats(loip_device *d, loip_device_stats_t *out);

/* ---- HTTP server (runtime/http/server.c, libmicrohttpd) --------------------------------- */

/* Requests are read by the server's threads (one per connection, bodies up to max_body bytes)
 * and handed to the caller's loop; each waits until the caller answers it, whole or as a
 * stream. A client that hangs up while its request waits or streams marks it cancelled. */
typedef struct loip_http loip_http;
typedef struct loip_http_req loip_http_req;
/* Listen at host (IPv4 address, "": 127.0.0.1) and port (0: any; loip_http_port tells);
 * max_connections at once (<= 0: 256); a connection idle for timeout_s is closed (<= 0: 30). */
LOIP_API int loip_http_start(const char *host, int32_t port, uint64_t max_body, int32_t max_connections,
                             int32_t timeout_s, loip_http **out);
LOIP_API int32_t loip_http_port(const loip_http *s);
/* Stop listening; requests still waiting are answered 503; waits for the connections. */
LOIP_API void loip_http_stop(loip_http *s);
/* The next request within timeout_ms (1, *out; 0: none). The caller answers and releases it. */
LOIP_API int loip_http_next(loip_http *s, int32_t timeout_ms, loip_http_req **out);
LOIP_API const char *loip_http_method(const loip_http_req *r);
LOIP_API const char *loip_http_url(const loip_http_req *r);
/* The body (NUL-terminated, *len bytes); *too_large: it passed max_body (and was dropped). */
LOIP_API const char *loip_http_body(const loip_http_req *r, uint64_t *len, int32_t *too_large);
/* A header's value into buf; 0 when the request has none. */
LOIP_API int loip_http_header(loip_http_req *r, const char *name, char *buf, size_t cap);
/* The client hung up (or the server stops): nobody will read an answer. */
LOIP_API int loip_http_cancelled(loip_http_req *r);
/* The whole answer: status, Content-Type, more headers ("Name: value" lines), body. */
LOIP_API int loip_http_respond(loip_http_req *r, int32_t status, const char *content_type,
                               const char *headers, const void *body, uint64_t len);
/* An answer of unknown length, written piece by piece (end != 0: the last piece); a write to
 * a client that hung up fails (LOIP_EIO). */
LOIP_API int loip_http_stream_begin(loip_http_req *r, int32_t status, const char *content_type,
                                    const char *headers);
LOIP_API int loip_http_stream_write(loip_http_req *r, const void *data, uint64_t len, int32_t end);
/* The bytes of r's stream written and not yet taken by its connection (a caller bounds what it
 * buffers for a slow client with it). */
LOIP_API uint64_t loip_http_stream_pending(loip_http_req *r);
/* The caller is done with r (answered, or given up). */
LOIP_API void loip_http_release(loip_http_req *r);

/* ---- HTTP client (runtime/http/client.c, libcurl's multi interface) --------------------- */

/* Many requests at once, moved along by loip_fetch_run; each one's response bytes are taken as
 * they arrive, with the arrival time of the last piece taken. */
typedef struct loip_fetch loip_fetch;
LOIP_API int loip_fetch_new(loip_fetch **out);
LOIP_API void loip_fetch_free(loip_fetch *f);
/* Start method url with headers ("Name: value" lines) and body (NULL: none); timeout_ms <= 0:
 * none. *id names it. */
LOIP_API int loip_fetch_add(loip_fetch *f, const char *url, const char *method, const char *headers,
                            const void *body, uint64_t len, int32_t timeout_ms, int32_t *id);
/* Move every transfer along, waiting up to timeout_ms for activity; how many still run. */
LOIP_API int loip_fetch_run(loip_fetch *f, int32_t timeout_ms);
/* Up to cap response bytes of id into buf (how many); *arrived: when they came (loip_now_ns). */
LOIP_API int64_t loip_fetch_take(loip_fetch *f, int32_t id, char *buf, uint64_t cap, uint64_t *arrived);
/* 1 when id is done (*status: HTTP status, 0 if none; err: the transport's error), 0 if not. */
LOIP_API int loip_fetch_state(loip_fetch *f, int32_t id, int32_t *status, char *err, size_t cap);
/* The response's header lines so far into buf (cap bytes with the NUL); their length. */
LOIP_API int64_t loip_fetch_headers(loip_fetch *f, int32_t id, char *buf, uint64_t cap);
/* Drop id (hang up if it still runs). */
LOIP_API void loip_fetch_close(loip_fetch *f, int32_t id);

/* ---- llama2.c tokenizer (tokenizer.bin: scored BPE with byte fallback) ---------------- */

typedef struct loip_scoredbpe loip_scoredbpe;
/* vocab_size <= 0: read records until the end of the file. */
LOIP_API int loip_scoredbpe_open(const char *path, int32_t vocab_size, loip_scoredbpe **out);
LOIP_API void loip_scoredbpe_free(loip_scoredbpe *t);
LOIP_API int32_t loip_scoredbpe_size(const loip_scoredbpe *t);
LOIP_API int loip_scoredbpe_piece(const loip_scoredbpe *t, int32_t id, const char **piece,
                                  int32_t *len, float *score);
/* Encode text as llama2.c run.c does (dummy prefix " " before non-empty text, byte
 * fallback to ids 3 + byte). *n_out is the count; LOIP_ERANGE when cap is too small. */
LOIP_API int loip_scoredbpe_encode(const loip_scoredbpe *t, const char *text, size_t len,
                                   int32_t bos, int32_t eos, int32_t *ids, int32_t cap,
                                   int32_t *n_out);

/* ---- BPE tokenizers ------------------------------------------------------------------ */

/* Hugging Face tokenizer.json and vocab.json + merges.txt (byte-level and SentencePiece-style
 * BPE), tiktoken rank files and SentencePiece tokenizer.model. The Lua side (loip.tokenizer)
 * decodes the files' small JSON sections and assembles these objects; tokenizer.json's
 * vocabulary and merges (nearly all of the file) are read here, and the hot paths (regex
 * pre-tokenization, the merges, NFC) run here. The objects are not safe to share between
 * threads while encoding: they keep match data and a cache of encoded chunks. */

/* NFC of text[0..len): *unchanged = 1 when the text already is in NFC (nothing is written),
 * else the result goes to out[0..*n_out); LOIP_ERANGE (with *n_out the size needed) when cap
 * is too small. Bytes that are not well-formed UTF-8 are kept as they are, and nothing
 * composes across them. The result is at most 3 * len bytes. */
LOIP_API int loip_utf8_nfc(const char *text, size_t len, char *out, size_t cap, size_t *n_out,
                           int32_t *unchanged);

/* Pre-tokenizer: a sequence of regex splits, each applied to every chunk of the one before,
 * with Hugging Face's SplitDelimiterBehavior. Patterns are PCRE2 (UTF, Unicode properties,
 * invalid UTF-8 in the subject never matches), JIT-compiled when PCRE2 supports it. */
enum {
    LOIP_SPLIT_REMOVED = 0,              /* matches are dropped */
    LOIP_SPLIT_ISOLATED = 1,             /* matches and the text between are chunks */
    LOIP_SPLIT_MERGED_WITH_PREVIOUS = 2, /* a match joins the chunk before it */
    LOIP_SPLIT_MERGED_WITH_NEXT = 3,     /* a match joins the chunk after it */
    LOIP_SPLIT_CONTIGUOUS = 4,           /* adjacent matches form one chunk */
};
enum {
    LOIP_SPLIT_INVERT = 1,  /* the text between matches is what the behavior applies to */
    LOIP_SPLIT_LITERAL = 2, /* the pattern is a plain string, not a regex */
};

typedef struct loip_pretok loip_pretok;
LOIP_API int loip_pretok_new(loip_pretok **out);
LOIP_API void loip_pretok_free(loip_pretok *p);
/* LOIP_EINVAL with PCRE2's message and the offset in the pattern when it does not compile. */
LOIP_API int loip_pretok_add_split(loip_pretok *p, const char *pattern, size_t len,
                                   int32_t behavior, int32_t flags);
/* Chunks of text as bounds[2i] = start, bounds[2i+1] = end (byte offsets); *n_out chunks,
 * LOIP_ERANGE when more than cap. Empty chunks are left out. */
LOIP_API int loip_pretok_split(loip_pretok *p, const char *text, size_t len, int32_t *bounds,
                               int32_t cap, int32_t *n_out);

/* Added tokens: strings found in the text before anything else and never split, leftmost
 * first, the longest among those starting at the same place (Hugging Face's rule). */
enum {
    LOIP_ADDED_SPECIAL = 1,     /* left as text when split is asked to skip special tokens */
    LOIP_ADDED_LSTRIP = 2,      /* swallows the white space before it */
    LOIP_ADDED_RSTRIP = 4,      /* swallows the white space after it */
    LOIP_ADDED_SINGLE_WORD = 8, /* only where no word character touches it */
};

typedef struct loip_added loip_added;
LOIP_API int loip_added_new(loip_added **out);
LOIP_API void loip_added_free(loip_added *a);
/* LOIP_EINVAL for an empty string; adding the same string again replaces its id and flags. */
LOIP_API int loip_added_add(loip_added *a, const char *text, size_t len, int32_t id,
                            int32_t flags);
/* Segments of text: seg[3i] = start, seg[3i+1] = end, seg[3i+2] = the added token's id, or -1
 * for text between added tokens (empty text segments are left out). skip_special: special
 * tokens are not looked for. *n_out segments; LOIP_ERANGE when more than cap. */
LOIP_API int loip_added_split(const loip_added *a, const char *text, size_t len,
                              int32_t skip_special, int32_t *seg, int32_t cap, int32_t *n_out);

/* The BPE model: a vocabulary of pieces (byte strings) with ids, and ranked merges. */
enum {
    LOIP_BPE_BYTELEVEL = 1,     /* chunks start as single bytes (GPT-2 byte-level BPE) */
    LOIP_BPE_GPT2_SPELLING = 2, /* pieces and merges are given in GPT-2's bytes_to_unicode
                                   spelling ("Ġ" for a space) and stored as raw bytes */
    LOIP_BPE_BYTE_FALLBACK = 4, /* a character without a piece becomes its <0xXX> pieces */
    LOIP_BPE_IGNORE_MERGES = 8, /* a chunk that is a whole piece is that piece (tiktoken) */
    LOIP_BPE_FUSE_UNK = 16,     /* consecutive unknown characters give one unk id */
};
enum {
    LOIP_BPE_PIECE_UNMATCHED = 1, /* never produced from text (SentencePiece control, byte
                                     and unknown pieces) */
};
enum {
    LOIP_BPE_MERGES_LISTED = 0,   /* merges ranked in the order they were added */
    LOIP_BPE_MERGES_BY_ID = 1,    /* tiktoken: every split a + b of a piece, ranked by the
                                     piece's id (its rank), leftmost first among equals */
    LOIP_BPE_MERGES_BY_SCORE = 2, /* SentencePiece BPE: every split, ranked by the piece's
                                     score, the highest first, leftmost among equals */
};

typedef struct loip_bpe loip_bpe;
LOIP_API int loip_bpe_new(int32_t flags, loip_bpe **out);
LOIP_API void loip_bpe_free(loip_bpe *b);
/* Piece piece[0..len) is token id (score: for LOIP_BPE_MERGES_BY_SCORE; flags:
 * LOIP_BPE_PIECE_*). LOIP_EINVAL for an id outside [0, 2^24), an id given twice or an empty
 * piece. A piece given twice keeps its first id. Under LOIP_BPE_GPT2_SPELLING a piece with a
 * character outside GPT-2's alphabet (an added token in the vocabulary) is stored as given. */
LOIP_API int loip_bpe_add_token(loip_bpe *b, const char *piece, size_t len, int32_t id,
                                float score, int32_t flags);
/* The merge left + right, ranked after those added before. LOIP_EFORMAT when a piece or
 * their concatenation is not in the vocabulary. */
LOIP_API int loip_bpe_add_merge(loip_bpe *b, const char *left, size_t llen, const char *right,
                                size_t rlen);
/* Merges as merges.txt writes them: "left right" per line; empty lines, and a first line
 * giving the file's version (as merges.txt starts), are skipped. LOIP_EFORMAT naming the
 * line number (counted from first_line) and the piece at fault. */
LOIP_API int loip_bpe_add_merges(loip_bpe *b, const char *text, size_t len, int32_t first_line);
/* Hugging Face tokenizer.json read in C where it is big: the byte ranges of the values of
 * model.vocab, spans[0..2), and model.merges, spans[2..4), in text[0..len), -1 where the file
 * has none. The whole text is checked to be one JSON value (LOIP_EFORMAT "invalid JSON at
 * byte N: ..."), so that the rest can be decoded with those two values blanked out. */
LOIP_API int loip_bpe_json_spans(const char *text, size_t len, int64_t *spans);
/* The JSON object text[start..end) of piece -> id (tokenizer.json's model.vocab, vocab.json),
 * as loip_bpe_add_token would add them. Errors name the byte offset in text. */
LOIP_API int loip_bpe_add_vocab_json(loip_bpe *b, const char *text, size_t start, size_t end);
/* The JSON array text[start..end) of merges, each "left right" (split at its one space) or
 * ["left", "right"], as loip_bpe_add_merge would add them. Errors name the merge (merges[i],
 * from 1) and the byte offset in text. */
LOIP_API int loip_bpe_add_merges_json(loip_bpe *b, const char *text, size_t start, size_t end);
/* tiktoken's "base64 rank" lines: each token with id = rank. LOIP_EFORMAT naming the line. */
LOIP_API int loip_bpe_add_tiktoken(loip_bpe *b, const char *text, size_t len);
/* Derives the merges from the vocabulary (LOIP_BPE_MERGES_BY_ID or _BY_SCORE). */
LOIP_API int loip_bpe_derive_merges(loip_bpe *b, int32_t how);
/* Id given to characters without a piece when there is no byte fallback; -1: none (they are
 * dropped). */
LOIP_API int loip_bpe_set_unk(loip_bpe *b, int32_t id);
/* Ends the setup: finds the byte pieces. Encoding calls it when it was not called. */
LOIP_API int loip_bpe_finish(loip_bpe *b);
/* One more than the highest id (ids without a piece in between are holes). */
LOIP_API int32_t loip_bpe_size(const loip_bpe *b);
LOIP_API int32_t loip_bpe_merge_count(const loip_bpe *b);
/* The stored piece of id (raw bytes under GPT-2 spelling); LOIP_EINVAL for a hole. */
LOIP_API int loip_bpe_piece(const loip_bpe *b, int32_t id, const char **piece, int32_t *len);
/* Id of the stored piece piece[0..len), or -1. */
LOIP_API int32_t loip_bpe_lookup(const loip_bpe *b, const char *piece, size_t len);
/* Ids of text: split by p (NULL: one chunk), each chunk merged. *n_out ids; LOIP_ERANGE (with
 * *n_out the count needed) when more than cap. len + 1 ids are always enough. */
LOIP_API int loip_bpe_encode(loip_bpe *b, loip_pretok *p, const char *text, size_t len,
                             int32_t *ids, int32_t cap, int32_t *n_out);
/* Entries in the chunk cache, and bytes of text encoded through it with hits / in all. */
LOIP_API int loip_bpe_cache_stats(const loip_bpe *b, int64_t *entries, int64_t *hit_bytes,
                                  int64_t *total_bytes);

/* SentencePiece tokenizer.model (a protobuf ModelProto): pieces and the spec fields used. */
enum {
    LOIP_SPM_NORMAL = 1, /* piece types, as in sentencepiece_model.proto */
    LOIP_SPM_UNKNOWN = 2,
    LOIP_SPM_CONTROL = 3,
    LOIP_SPM_USER_DEFINED = 4,
    LOIP_SPM_UNUSED = 5,
    LOIP_SPM_BYTE = 6,
};
enum {
    LOIP_SPM_MODEL_TYPE = 0, /* 1 unigram (the default), 2 BPE, 3 word, 4 char */
    LOIP_SPM_BYTE_FALLBACK = 1,
    LOIP_SPM_UNK_ID = 2,
    LOIP_SPM_BOS_ID = 3,
    LOIP_SPM_EOS_ID = 4,
    LOIP_SPM_PAD_ID = 5,
    LOIP_SPM_ADD_DUMMY_PREFIX = 6,
    LOIP_SPM_REMOVE_EXTRA_WHITESPACES = 7,
    LOIP_SPM_ESCAPE_WHITESPACES = 8,
    LOIP_SPM_TREAT_WHITESPACE_AS_SUFFIX = 9,
    LOIP_SPM_CHARSMAP_BYTES = 10, /* size of normalizer_spec.precompiled_charsmap */
    LOIP_SPM_FIELD_COUNT = 11,
};

typedef struct loip_spm loip_spm;
/* LOIP_EFORMAT naming the file and the byte offset for a truncated or malformed file. */
LOIP_API int loip_spm_open(const char *path, loip_spm **out);
/* The same from size bytes in memory (name: for messages). */
LOIP_API int loip_spm_parse(const uint8_t *data, uint64_t size, const char *name, loip_spm **out);
LOIP_API void loip_spm_free(loip_spm *m);
LOIP_API int32_t loip_spm_size(const loip_spm *m);
LOIP_API int loip_spm_get(const loip_spm *m, int32_t field, int32_t *value);
/* normalizer_spec.name ("" when absent). */
LOIP_API const char *loip_spm_normalizer_name(const loip_spm *m);
LOIP_API int loip_spm_piece(const loip_spm *m, int32_t id, const char **piece, int32_t *len,
                            float *score, int32_t *type);

/* ---- CUDA (optional) ------------------------------------------------------------------ */

/* The CUDA side (runtime/cuda over kernels/cuda): devices, the memory the UMA-aware loading
 * path uses, and the decoder's kernels on device pointers. Built without CUDA, every call but
 * loip_cuda_device_count fails with LOIP_ENOSYS. Kernels run on the default stream: a failure
 * to launch is reported at once, one while running at loip_cuda_sync. */

/* Number of CUDA devices; 0 when built without CUDA or none is present. */
LOIP_API int32_t loip_cuda_device_count(void);
/* Device dev's name (cap bytes with the NUL), whether it shares the host's memory (a Jetson),
 * its SMs, memory, and peak memory bandwidth (from its memory clock and bus width). Any
 * out-parameter may be NULL. */
LOIP_API int loip_cuda_device_info(int32_t dev, char *name, size_t cap, int32_t *integrated,
                                   int32_t *sm_count, uint64_t *total_bytes, double *bandwidth_Bps);

enum {
    LOIP_CUDA_MEM_DEVICE = 0, /* cudaMalloc: *dev only */
    LOIP_CUDA_MEM_MAPPED = 1, /* pinned host memory mapped into the device: *host and *dev */
};
LOIP_API int loip_cuda_alloc(uint64_t bytes, int32_t kind, void **host, void **dev);
/* p: the device pointer (DEVICE) or the host pointer (MAPPED); NULL is a no-op. */
LOIP_API void loip_cuda_free(void *p, int32_t kind);
/* Pin and map bytes of host memory allocated elsewhere (the loader's slot: io_uring's O_DIRECT
 * reads land there and kernels read them in place); *dev its device address. */
LOIP_API int loip_cuda_register(void *host, uint64_t bytes, void **dev);
LOIP_API void loip_cuda_unregister(void *host);
/* Any direction (unified addressing); waits for it. */
LOIP_API int loip_cuda_copy(void *dst, const void *src, uint64_t bytes);
/* Waits for every kernel launched; the first failure among them, named. */
LOIP_API int loip_cuda_sync(void);

/* y[r] = W[r, :] . x for r < rows; W rows x cols of dtype (LOIP_F32/BF16/F16), row-major, or
 * LOIP_MXFP4 / LOIP_F8_E4M3 in their layouts (above). */
LOIP_API int loip_cuda_matvec(int32_t dtype, float *y, const void *W, const float *x, uint64_t rows,
                              uint64_t cols);
/* Y[t][r] = W[r, :] . X[t, :] for t < n (fp32 sums; 16-bit weights widened exactly). */
LOIP_API int loip_cuda_matmul(int32_t dtype, float *Y, const void *W, const float *X, uint64_t n,
                              uint64_t rows, uint64_t cols);
/* o[t] = x[t] / rms(x[t]) * w for each of n_tokens rows of dim; w of wdtype. */
LOIP_API int loip_cuda_rmsnorm(float *o, const float *x, const void *w, int32_t wdtype, uint64_t n_tokens,
                               uint64_t dim, float eps);
/* Rotate q ([n_tokens][n_heads][head_dim]) in place: pair i of token t by pos[t] * inv_freq[i]
 * (inv_freq: head_dim/2 values, llama3 scaling already in them); layout LOIP_ROPE_*. */
LOIP_API int loip_cuda_rope(float *q, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                            const int32_t *pos, const float *inv_freq, int32_t layout);
/* h[i] = silu(h[i]) * u[i] */
LOIP_API int loip_cuda_silu_gate(float *h, const float *u, uint64_t n);
/* x[i] += y[i] */
LOIP_API int loip_cuda_add(float *x, const float *y, uint64_t n);
/* x[t] = table[ids[t]] (rows of dim, dtype) widened to fp32, for t < n. */
LOIP_API int loip_cuda_embed(float *x, const void *table, int32_t dtype, const int32_t *ids, int32_t n,
                             uint64_t dim);
/* out[r] = the first index of the largest value of row r of logits (n_rows x vocab). */
LOIP_API int loip_cuda_argmax(int32_t *out, const float *logits, int32_t n_rows, int32_t vocab);
/* Attention of one new token per sequence (q: [n_seqs][n_heads][head_dim]) over its ctx_len[s]
 * positions in a paged KV cache: position p's K and V rows are row p % block_tokens of group
 * block_table[s * max_blocks + p / block_tokens] of k_pool / v_pool (groups of block_tokens x
 * n_kv_heads*head_dim floats). The context is split in `splits` parts whose results are merged;
 * scratch: loip_cuda_attention_scratch bytes of device memory. head_dim <= 256. */
LOIP_API int loip_cuda_attention_decode(float *out, const float *q, const float *k_pool, const float *v_pool,
                                        const int32_t *block_table, const int32_t *ctx_len, int32_t n_seqs,
                                        int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                        int32_t block_tokens, int32_t max_blocks, float scale, float *scratch,
                                        int32_t splits);
LOIP_API uint64_t loip_cuda_attention_scratch(int32_t n_seqs, int32_t n_heads, int32_t head_dim,
                                              int32_t splits);
/* Causal attention of a prompt of n tokens over its own K and V ([n][n_kv_heads*head_dim]). */
LOIP_API int loip_cuda_attention_prefill(float *out, const float *q, const float *k, const float *v, int32_t n,
                                         int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale);

/* ---- grammars: constrained decoding ------------------------------------------------- */

/* A grammar over UTF-8 bytes whose allowed next tokens form a mask over a tokenizer's
 * vocabulary (structured outputs, GBNF). The Lua side (loip.text.grammar) parses GBNF and JSON
 * schemas and hands over an IR of rules; the recogniser and the token masks run here.
 *
 * IR (int32): n_rules, then per rule: n_alts, then per alternative: n_elems, elements. An
 * element is (kind << 28) | arg: LOIP_GRAMMAR_SET (arg: a byte set, 32 bytes each in sets,
 * bit b of byte b/8 set when byte b matches) or LOIP_GRAMMAR_REF (arg: a rule). Repetition is
 * rules (x* is r ::= x r | empty). names: the rules' names, '\n'-separated, for messages (or
 * NULL). Left recursion is refused naming the rule. The objects are reference counted inside:
 * a matcher keeps its grammar and vocabulary alive; nothing is safe to share between threads. */
enum {
    LOIP_GRAMMAR_SET = 1,
    LOIP_GRAMMAR_REF = 2,
};
typedef struct loip_grammar loip_grammar;
typedef struct loip_grammar_vocab loip_grammar_vocab;
typedef struct loip_grammar_matcher loip_grammar_matcher;
LOIP_API int loip_grammar_new(const int32_t *ir, int32_t n_ir, const uint8_t *sets, int32_t n_sets,
                              int32_t root, const char *names, loip_grammar **out);
LOIP_API void loip_grammar_free(loip_grammar *g);
/* A tokenizer's tokens as bytes (token id i: bytes[offsets[i], offsets[i+1])), in a trie sorted
 * so that shared prefixes are walked once. excluded[i] != 0: never allowed by a grammar
 * (special and control tokens); empty tokens are never allowed either. */
LOIP_API int loip_grammar_vocab_new(const char *bytes, const int64_t *offsets, const uint8_t *excluded,
                                    int32_t n, loip_grammar_vocab **out);
LOIP_API void loip_grammar_vocab_free(loip_grammar_vocab *v);
LOIP_API int32_t loip_grammar_vocab_size(const loip_grammar_vocab *v);
/* Trie nodes and tokens in it (statistics). */
LOIP_API int64_t loip_grammar_vocab_nodes(const loip_grammar_vocab *v);
/* A recogniser at the grammar's start. stop_ids: allowed exactly when the grammar may end, and
 * only they when it must. */
LOIP_API int loip_grammar_matcher_new(loip_grammar *g, loip_grammar_vocab *v, const int32_t *stop_ids,
                                      int32_t n_stop, loip_grammar_matcher **out);
LOIP_API int loip_grammar_matcher_clone(const loip_grammar_matcher *m, loip_grammar_matcher **out);
LOIP_API void loip_grammar_matcher_free(loip_grammar_matcher *m);
/* The allowed ids as bits (bit i%32 of bits[i/32]); n_words >= (vocab size + 31) / 32. */
LOIP_API int loip_grammar_matcher_mask(loip_grammar_matcher *m, uint32_t *bits, int32_t n_words);
/* logits[i] = -INFINITY for every id i < n not allowed (ids past the vocabulary too). */
LOIP_API int loip_grammar_matcher_apply(loip_grammar_matcher *m, float *logits, int32_t n);
/* Advance by token id: LOIP_EINVAL naming it when it is not allowed (the state unchanged). */
LOIP_API int loip_grammar_matcher_accept(loip_grammar_matcher *m, int32_t id);
/* Advance by raw bytes (documents checked without a tokenizer); LOIP_EINVAL naming the offset. */
LOIP_API int loip_grammar_matcher_accept_bytes(loip_grammar_matcher *m, const char *s, size_t len);
/* 1 when the grammar may end here (a stop id is allowed), else 0. */
LOIP_API int loip_grammar_matcher_can_end(const loip_grammar_matcher *m);
/* 1 when it must (nothing but a stop id is allowed), else 0. */
LOIP_API int loip_grammar_matcher_must_end(const loip_grammar_matcher *m);
/* The mask cache shared by the matchers of this grammar and vocabulary: entries, bytes. */
LOIP_API void loip_grammar_matcher_cache_stats(const loip_grammar_matcher *m, int64_t *entries, int64_t *bytes);

/* FFI-END */

#ifdef __cplusplus
}
#endif

#endif /* LOIP_H */
