// llama_logits: reference logits from llama.cpp's libllama for a given token-id sequence.
//
//   llama_logits MODEL.gguf TOKENS.txt OUT.f32 [--n-threads N] [--greedy N]
//                [--token-by-token] [--f32-weights] [--fusion] [--verbose]
//
// TOKENS.txt holds whitespace-separated token ids; they are used exactly as given
// (no BOS insertion, no tokenizer, no sampler). All tokens are evaluated as one
// sequence (seq 0, positions 0..n-1) and the logits of every position are written
// to OUT.f32 as little-endian float32 [n_tokens][n_vocab].
//
// Default evaluation: ONE llama_decode of the whole batch, logits requested for every
// position (n_batch = n_ubatch >= n_tokens). --token-by-token instead decodes one token
// per llama_decode call (same results within float noise).
//
// Numerics: flash attention DISABLED, K/V cache F32 (no KV quantization), CPU only,
// and ggml-cpu op fusion disabled (GGML_CPU_DISABLE_FUSION=1) unless --fusion is given.
//
// --f32-weights: first widen all weights to F32 with llama_model_quantize(LLAMA_FTYPE_ALL_F32)
// into a temp file ($TMPDIR or /tmp, deleted after loading). Without it, F16/BF16 weights make
// ggml-cpu round the matmul activations to F16/BF16 (vec_dot_type): measured ~3e-4..1e-3 (F16)
// and ~1e-2..8e-2 (BF16) of the largest logit. The temp copy is the full F32 model: set TMPDIR.
//
// --greedy N: after the given tokens, continue N greedy steps (argmax of the logits,
// lowest id on ties), decoding one token per step, and print {"greedy":[ids...]} on stdout.
// The N generated ids are printed; the first is argmax of the last given position's logits.

#include "llama.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_verbose = 0;

static void log_cb(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static void usage(void) {
    fprintf(stderr,
        "usage: llama_logits MODEL.gguf TOKENS.txt OUT.f32 [--n-threads N] [--greedy N]\n"
        "                    [--token-by-token] [--f32-weights] [--fusion] [--verbose]\n");
    exit(2);
}

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) best = i;
    }
    return best;
}

// decode tokens[0..n) at positions pos0.. in seq 0, logits for all of them
static int decode_span(struct llama_context * ctx, const llama_token * toks, int n, int pos0) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i]     = toks[i];
        b.pos[i]       = pos0 + i;
        b.n_seq_id[i]  = 1;
        b.seq_id[i][0] = 0;
        b.logits[i]    = 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc;
}

int main(int argc, char ** argv) {
    const char * pos_args[3];
    int n_pos = 0;
    int n_threads = 1;
    int n_greedy = -1;
    int token_by_token = 0;
    int fusion = 0;
    int f32_weights = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--n-threads") == 0 && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--greedy") == 0 && i + 1 < argc) {
            n_greedy = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--token-by-token") == 0) {
            token_by_token = 1;
        } else if (strcmp(argv[i], "--f32-weights") == 0) {
            f32_weights = 1;
        } else if (strcmp(argv[i], "--fusion") == 0) {
            fusion = 1;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            g_verbose = 1;
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            usage();
        } else if (n_pos < 3) {
            pos_args[n_pos++] = argv[i];
        } else {
            usage();
        }
    }
    if (n_pos != 3 || n_threads < 1) usage();

    // must be set before the CPU backend initialises (ggml_cpu_init reads it once)
    if (!fusion) setenv("GGML_CPU_DISABLE_FUSION", "1", 1);

    // ---- read token ids
    FILE * tf = fopen(pos_args[1], "r");
    if (!tf) { fprintf(stderr, "cannot open %s: %s\n", pos_args[1], strerror(errno)); return 1; }
    int cap = 256, n_tok = 0;
    llama_token * toks = malloc(sizeof(llama_token) * cap);
    long v;
    while (fscanf(tf, "%ld", &v) == 1) {
        if (n_tok == cap) { cap *= 2; toks = realloc(toks, sizeof(llama_token) * cap); }
        toks[n_tok++] = (llama_token) v;
    }
    if (!feof(tf)) { fprintf(stderr, "%s: non-integer content\n", pos_args[1]); return 1; }
    fclose(tf);
    if (n_tok == 0) { fprintf(stderr, "%s: no tokens\n", pos_args[1]); return 1; }

    llama_log_set(log_cb, NULL);
    llama_backend_init();

    // ---- model (CPU only)
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_mmap = true;
    mp.use_extra_bufts = false; // no weight repacking: plain ggml-cpu kernels
    const char * model_path = pos_args[0];
    char tmp_path[4096] = "";
    if (f32_weights) {
        // widen every tensor to F32 with llama.cpp's own llama_model_quantize (ALL_F32, pure):
        // F16/BF16 -> F32 is exact, and F32 weights make ggml-cpu keep activations in F32
        const char * td = getenv("TMPDIR");
        snprintf(tmp_path, sizeof(tmp_path), "%s/llama_logits_f32_XXXXXX", td && *td ? td : "/tmp");
        int fd = mkstemp(tmp_path);
        if (fd < 0) { fprintf(stderr, "mkstemp %s: %s\n", tmp_path, strerror(errno)); return 1; }
        close(fd);
        struct llama_model_quantize_params qp = llama_model_quantize_default_params();
        qp.nthread = n_threads;
        qp.ftype = LLAMA_FTYPE_ALL_F32;
        qp.pure = true;
        qp.quantize_output_tensor = true;
        qp.allow_requantize = true;
        if (llama_model_quantize(pos_args[0], tmp_path, &qp) != 0) {
            fprintf(stderr, "llama_model_quantize to F32 failed for %s\n", pos_args[0]);
            unlink(tmp_path);
            return 1;
        }
        model_path = tmp_path;
    }
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (tmp_path[0]) unlink(tmp_path); // mmap keeps the data alive
    if (!model) { fprintf(stderr, "failed to load model %s\n", pos_args[0]); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (int i = 0; i < n_tok; i++) {
        if (toks[i] < 0 || toks[i] >= n_vocab) {
            fprintf(stderr, "token %d at index %d out of range [0,%d)\n", toks[i], i, n_vocab);
            return 1;
        }
    }

    // ---- context
    int n_total = n_tok + (n_greedy > 0 ? n_greedy : 0);
    uint32_t n_ctx = 256;
    while ((int) n_ctx < n_total + 1) n_ctx *= 2;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_ctx;
    cp.n_batch         = n_ctx;   // >= n_tokens: the whole sequence fits one ubatch
    cp.n_ubatch        = n_ctx;
    cp.n_seq_max       = 1;
    cp.n_threads       = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k          = GGML_TYPE_F32;
    cp.type_v          = GGML_TYPE_F32;
    cp.embeddings      = false;
    cp.offload_kqv     = false;
    cp.op_offload      = false;
    cp.no_perf         = true;
    cp.swa_full        = true;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    // ---- evaluate the given sequence
    float * out = malloc(sizeof(float) * (size_t) n_tok * n_vocab);
    if (!token_by_token) {
        int rc = decode_span(ctx, toks, n_tok, 0);
        if (rc != 0) { fprintf(stderr, "llama_decode failed: %d\n", rc); return 1; }
        for (int i = 0; i < n_tok; i++) {
            const float * lg = llama_get_logits_ith(ctx, i);
            if (!lg) { fprintf(stderr, "no logits for position %d\n", i); return 1; }
            memcpy(out + (size_t) i * n_vocab, lg, sizeof(float) * n_vocab);
        }
    } else {
        for (int i = 0; i < n_tok; i++) {
            int rc = decode_span(ctx, toks + i, 1, i);
            if (rc != 0) { fprintf(stderr, "llama_decode failed at %d: %d\n", i, rc); return 1; }
            const float * lg = llama_get_logits_ith(ctx, -1);
            memcpy(out + (size_t) i * n_vocab, lg, sizeof(float) * n_vocab);
        }
    }

    FILE * of = fopen(pos_args[2], "wb");
    if (!of) { fprintf(stderr, "cannot open %s: %s\n", pos_args[2], strerror(errno)); return 1; }
    // x86-64/aarch64 hosts are little-endian; float32 written as-is
    if (fwrite(out, sizeof(float), (size_t) n_tok * n_vocab, of) != (size_t) n_tok * n_vocab) {
        fprintf(stderr, "short write to %s\n", pos_args[2]); return 1;
    }
    fclose(of);

    // ---- greedy continuation
    if (n_greedy >= 0) {
        printf("{\"greedy\":[");
        int cur = argmax(out + (size_t) (n_tok - 1) * n_vocab, n_vocab);
        for (int s = 0; s < n_greedy; s++) {
            printf(s ? ",%d" : "%d", cur);
            if (s + 1 == n_greedy) break;
            llama_token t = cur;
            int rc = decode_span(ctx, &t, 1, n_tok + s);
            if (rc != 0) { fprintf(stderr, "llama_decode failed in greedy step %d: %d\n", s, rc); return 1; }
            cur = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        }
        printf("]}\n");
    }
    fprintf(stderr, "llama_logits: %d tokens x %d vocab -> %s (%s, %d thread(s), fusion %s, weights %s)\n",
            n_tok, n_vocab, pos_args[2], token_by_token ? "token-by-token" : "one batch",
            n_threads, fusion ? "on" : "off", f32_weights ? "widened to F32" : "as stored");

    free(out);
    free(toks);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
