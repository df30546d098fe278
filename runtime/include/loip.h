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
    LOIP_ABI_VERSION = 1, /* bump on any change of this header's declarations */
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
};

LOIP_API int loip_abi_version(void);
LOIP_API const char *loip_version_string(void);
/* Message of the last failure on the calling thread ("" if none). */
LOIP_API const char *loip_last_error(void);
/* Monotonic clock, nanoseconds. */
LOIP_API uint64_t loip_now_ns(void);
/* Layout check for the FFI: sizeof(struct type) when field is "" , else offsetof(type, field);
 * -1 when unknown. A spec compares these with ffi.sizeof/ffi.offsetof. */
LOIP_API int64_t loip_layout(const char *type, const char *field);

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
    LOIP_DTYPE_COUNT = 4,
};

LOIP_API int32_t loip_dtype_size(int32_t dtype);

typedef struct loip_buffer loip_buffer;
/* Zeroed, 64-byte aligned (huge-page advised when large) memory. */
LOIP_API int loip_buffer_new(uint64_t bytes, loip_buffer **out);
LOIP_API void loip_buffer_free(loip_buffer *buf);
LOIP_API void *loip_buffer_data(loip_buffer *buf);
LOIP_API uint64_t loip_buffer_size(const loip_buffer *buf);

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
LOIP_API int loip_disk_free(const char *path, uint64_t *bytes);

/* Fill n elements of dtype with seeded pseudo-normal values (mean, std). Element i takes the
 * value of stream position first+i, so a tensor filled in chunks equals one filled at once. */
LOIP_API int loip_fill_random(void *dst, uint64_t n, int32_t dtype, uint64_t seed,
                              uint64_t first, float mean, float std);
/* Convert n elements between float dtypes (F32/BF16/F16; round to nearest even). */
LOIP_API int loip_convert(void *dst, int32_t dst_dtype, const void *src, int32_t src_dtype,
                          uint64_t n);

/* ---- single operations (tests, benchmarks, experiments) ------------------------------- */

/* y[rows] = W[rows, cols] (dtype) . x[cols], split over the pool's threads. */
LOIP_API int loip_op_matvec(loip_pool *pool, int32_t dtype, const void *W, const float *x,
                            float *y, int64_t rows, int64_t cols);
/* Y[n, rows] = X[n, cols] . W[rows, cols]^T. */
LOIP_API int loip_op_matmul(loip_pool *pool, int32_t dtype, const void *W, const float *X,
                            float *Y, int64_t n, int64_t rows, int64_t cols);
/* Streaming read of bytes of buf, reps times, split over the pool's threads; returns a
 * checksum so that the reads cannot be optimised away. */
LOIP_API int loip_op_read_probe(loip_pool *pool, const void *buf, uint64_t bytes, int32_t reps,
                                double *checksum);

/* ---- models --------------------------------------------------------------------------- */

enum {
    LOIP_ROPE_INTERLEAVED = 0, /* Meta / llama2.c: pairs (2i, 2i+1) */
    LOIP_ROPE_HALF = 1,        /* Hugging Face rotate_half: pairs (i, i + head_dim/2) */
};

enum {
    LOIP_ROPE_SCALING_NONE = 0,
    LOIP_ROPE_SCALING_LLAMA3 = 1,
};

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
    LOIP_W_COUNT = 17,
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
/* A KV cache for max_ctx positions and scratch for batches of up to max_batch tokens. */
LOIP_API int loip_session_new(const loip_model *m, loip_pool *pool, int32_t max_ctx,
                              int32_t max_batch, loip_session **out);
LOIP_API void loip_session_free(loip_session *s);
/* Tokens tokens[0..n) at positions pos..pos+n-1 through embedding, layers and head. The KV
 * cache must hold positions 0..pos-1 (they were forwarded before). */
LOIP_API int loip_session_forward(loip_session *s, const int32_t *tokens, int32_t n, int32_t pos,
                                  float *logits, int32_t logits_mode);
/* The same, in three parts, for running a range of layers (a pipeline stage). hidden is
 * [n, dim] fp32. */
LOIP_API int loip_session_embed(loip_session *s, const int32_t *tokens, int32_t n, float *hidden);
LOIP_API int loip_session_layers(loip_session *s, int32_t first, int32_t last, float *hidden,
                                 int32_t n, int32_t pos);
LOIP_API int loip_session_head(loip_session *s, const float *hidden, int32_t n, float *logits,
                               int32_t logits_mode);
LOIP_API uint64_t loip_session_kv_bytes(const loip_session *s);

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
/* history: previous token ids (prompt and generated), for the repetition penalty. */
LOIP_API int loip_sampler_sample(loip_sampler *s, const float *logits,
                                 const loip_sampler_params *p, const int32_t *history,
                                 int32_t n_history, int32_t *token);

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

/* ---- CUDA (optional) ------------------------------------------------------------------ */

/* Number of CUDA devices; 0 when built without CUDA or none is present. */
LOIP_API int32_t loip_cuda_device_count(void);

/* FFI-END */

#ifdef __cplusplus
}
#endif

#endif /* LOIP_H */
