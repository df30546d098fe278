/* sentencepiece.c — reads a SentencePiece tokenizer.model: a protobuf ModelProto
 * (sentencepiece_model.proto, proto2) decoded by hand, as only a few fields are needed:
 *
 *   ModelProto      1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec
 *   SentencePiece   1 piece (string), 2 score (float), 3 type (enum, default NORMAL)
 *   TrainerSpec     3 model_type, 24 treat_whitespace_as_suffix, 35 byte_fallback,
 *                   40 unk_id, 41 bos_id, 42 eos_id, 43 pad_id
 *   NormalizerSpec  1 name, 2 precompiled_charsmap, 3 add_dummy_prefix,
 *                   4 remove_extra_whitespaces, 5 escape_whitespaces
 *
 * Every other field is skipped by its wire type. A file whose fields run past its end, or
 * without a trainer_spec and normalizer_spec (which a SentencePiece model always has, after
 * its pieces: a file cut between two pieces lacks them), is LOIP_EFORMAT with the offset. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const uint64_t MAX_FILE = 1ull << 30;

struct loip_spm {
    int32_t n, cap;
    uint32_t *off; /* (cap) piece offsets in text */
    int32_t *len;  /* (cap) */
    float *score;  /* (cap) */
    int32_t *type; /* (cap) LOIP_SPM_NORMAL ... */
    char *text;    /* pieces, each followed by a NUL */
    size_t text_len, text_cap;
    int32_t field[LOIP_SPM_FIELD_COUNT];
    char name[64];
};

typedef struct reader {
    const uint8_t *d;
    uint64_t pos, end;
    const char *path;
} reader;

static int truncated(const reader *r, const char *what) {
    return loip_fail(LOIP_EFORMAT, "sentencepiece: %s: truncated or malformed at byte %llu (%s)",
                     r->path, (unsigned long long)r->pos, what);
}

static int varint(reader *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->pos >= r->end) return truncated(r, "a varint runs past the end");
        uint8_t c = r->d[r->pos++];
        x |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return truncated(r, "a varint longer than 10 bytes");
}

/* The next field: number, wire type; for length-delimited fields, *sub spans the payload. */
static int next_field(reader *r, uint32_t *num, uint32_t *wt, reader *sub) {
    uint64_t tag;
    int rc = varint(r, &tag);
    if (rc != 0) return rc;
    *num = (uint32_t)(tag >> 3);
    *wt = (uint32_t)(tag & 7);
    if (*num == 0) return truncated(r, "field number 0");
    if (*wt == 2) {
        uint64_t n;
        if ((rc = varint(r, &n)) != 0) return rc;
        if (n > r->end - r->pos) return truncated(r, "a length-delimited field runs past the end");
        *sub = (reader){r->d, r->pos, r->pos + n, r->path};
        r->pos += n;
    }
    return 0;
}

static int skip_value(reader *r, uint32_t wt) {
    uint64_t v;
    switch (wt) {
    case 0: return varint(r, &v);
    case 1:
        if (r->end - r->pos < 8) return truncated(r, "a fixed64 runs past the end");
        r->pos += 8;
        return 0;
    case 2: return 0; /* next_field consumed it */
    case 5:
        if (r->end - r->pos < 4) return truncated(r, "a fixed32 runs past the end");
        r->pos += 4;
        return 0;
    default: return truncated(r, "an unsupported wire type (group)");
    }
}

static int int_value(reader *r, uint32_t wt, int32_t *out) {
    if (wt != 0) return truncated(r, "an integer field that is not a varint");
    uint64_t v;
    int rc = varint(r, &v);
    if (rc == 0) *out = (int32_t)(int64_t)v;
    return rc;
}

static int add_piece(loip_spm *m, const reader *s, float score, int32_t type) {
    if (m->n == m->cap) {
        int32_t cap = m->cap ? 2 * m->cap : 1024;
        uint32_t *off = realloc(m->off, (size_t)cap * sizeof *off);
        if (off) m->off = off;
        int32_t *len = realloc(m->len, (size_t)cap * sizeof *len);
        if (len) m->len = len;
        float *sc = realloc(m->score, (size_t)cap * sizeof *sc);
        if (sc) m->score = sc;
        int32_t *ty = realloc(m->type, (size_t)cap * sizeof *ty);
        if (ty) m->type = ty;
        if (!off || !len || !sc || !ty) return loip_fail(LOIP_ENOMEM, "sentencepiece: no memory");
        m->cap = cap;
    }
    size_t n = (size_t)(s->end - s->pos);
    if (m->text_len + n + 1 > m->text_cap) {
        size_t cap = m->text_cap ? m->text_cap : 1 << 16;
        while (cap < m->text_len + n + 1) cap *= 2;
        char *t = realloc(m->text, cap);
        if (t == NULL) return loip_fail(LOIP_ENOMEM, "sentencepiece: no memory");
        m->text = t, m->text_cap = cap;
    }
    m->off[m->n] = (uint32_t)m->text_len;
    m->len[m->n] = (int32_t)n;
    memcpy(m->text + m->text_len, s->d + s->pos, n);
    m->text[m->text_len + n] = '\0';
    m->text_len += n + 1;
    m->score[m->n] = score;
    m->type[m->n] = type;
    m->n++;
    return 0;
}

static int parse_piece(loip_spm *m, reader *r) {
    reader piece = {0}, sub;
    int have = 0;
    float score = 0.0f;
    int32_t type = LOIP_SPM_NORMAL;
    while (r->pos < r->end) {
        uint32_t num, wt;
        int rc = next_field(r, &num, &wt, &sub);
        if (rc != 0) return rc;
        if (num == 1 && wt == 2) {
            piece = sub;
            have = 1;
        } else if (num == 2 && wt == 5) {
            if (r->end - r->pos < 4) return truncated(r, "a score runs past the end");
            memcpy(&score, r->d + r->pos, 4);
            r->pos += 4;
        } else if (num == 3) {
            if ((rc = int_value(r, wt, &type)) != 0) return rc;
            if (type < LOIP_SPM_NORMAL || type > LOIP_SPM_BYTE)
                return truncated(r, "a piece type outside 1..6");
        } else if ((rc = skip_value(r, wt)) != 0) {
            return rc;
        }
    }
    if (!have || piece.end == piece.pos) return truncated(r, "a piece without its string");
    return add_piece(m, &piece, score, type);
}

static int parse_trainer(loip_spm *m, reader *r) {
    while (r->pos < r->end) {
        uint32_t num, wt;
        reader sub;
        int rc = next_field(r, &num, &wt, &sub);
        if (rc != 0) return rc;
        int32_t *dst = NULL;
        switch (num) {
        case 3: dst = &m->field[LOIP_SPM_MODEL_TYPE]; break;
        case 24: dst = &m->field[LOIP_SPM_TREAT_WHITESPACE_AS_SUFFIX]; break;
        case 35: dst = &m->field[LOIP_SPM_BYTE_FALLBACK]; break;
        case 40: dst = &m->field[LOIP_SPM_UNK_ID]; break;
        case 41: dst = &m->field[LOIP_SPM_BOS_ID]; break;
        case 42: dst = &m->field[LOIP_SPM_EOS_ID]; break;
        case 43: dst = &m->field[LOIP_SPM_PAD_ID]; break;
        }
        rc = dst ? int_value(r, wt, dst) : skip_value(r, wt);
        if (rc != 0) return rc;
    }
    return 0;
}

static int parse_normalizer(loip_spm *m, reader *r) {
    while (r->pos < r->end) {
        uint32_t num, wt;
        reader sub;
        int rc = next_field(r, &num, &wt, &sub);
        if (rc != 0) return rc;
        int32_t *dst = NULL;
        if (num == 1 && wt == 2) {
            size_t n = (size_t)(sub.end - sub.pos);
            if (n >= sizeof m->name) n = sizeof m->name - 1;
            memcpy(m->name, sub.d + sub.pos, n);
            m->name[n] = '\0';
            continue;
        }
        if (num == 2 && wt == 2) {
            m->field[LOIP_SPM_CHARSMAP_BYTES] = (int32_t)(sub.end - sub.pos);
            continue;
        }
        switch (num) {
        case 3: dst = &m->field[LOIP_SPM_ADD_DUMMY_PREFIX]; break;
        case 4: dst = &m->field[LOIP_SPM_REMOVE_EXTRA_WHITESPACES]; break;
        case 5: dst = &m->field[LOIP_SPM_ESCAPE_WHITESPACES]; break;
        }
        rc = dst ? int_value(r, wt, dst) : skip_value(r, wt);
        if (rc != 0) return rc;
    }
    return 0;
}

static int parse_model(loip_spm *m, reader *r) {
    int trainer = 0, normalizer = 0;
    while (r->pos < r->end) {
        uint32_t num, wt;
        reader sub;
        int rc = next_field(r, &num, &wt, &sub);
        if (rc != 0) return rc;
        if (num == 1 && wt == 2) rc = parse_piece(m, &sub);
        else if (num == 2 && wt == 2) rc = parse_trainer(m, &sub), trainer = 1;
        else if (num == 3 && wt == 2) rc = parse_normalizer(m, &sub), normalizer = 1;
        else rc = skip_value(r, wt);
        if (rc != 0) return rc;
    }
    if (m->n == 0)
        return loip_fail(LOIP_EFORMAT, "sentencepiece: %s holds no pieces: not a SentencePiece "
                                       "model", r->path);
    if (!trainer || !normalizer)
        return loip_fail(LOIP_EFORMAT, "sentencepiece: %s: no %s after its %d pieces: the file is "
                                       "truncated (or not a SentencePiece model)", r->path,
                         trainer ? "normalizer_spec" : "trainer_spec", (int)m->n);
    return 0;
}

LOIP_API int loip_spm_open(const char *path, loip_spm **out) {
    if (out == NULL || path == NULL) return loip_fail(LOIP_EINVAL, "loip_spm_open: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return loip_fail(LOIP_EIO, "sentencepiece: cannot open %s: %s", path, strerror(errno));
    uint8_t *d = NULL;
    long size = -1;
    int rc = 0;
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        rc = loip_fail(LOIP_EIO, "sentencepiece: cannot seek in %s: %s", path, strerror(errno));
    else if ((uint64_t)size > MAX_FILE)
        rc = loip_fail(LOIP_EFORMAT, "sentencepiece: %s is %ld bytes, over 1 GiB", path, size);
    else if ((d = malloc((size_t)size + 1)) == NULL)
        rc = loip_fail(LOIP_ENOMEM, "sentencepiece: no memory to read %s", path);
    else if (fread(d, 1, (size_t)size, f) != (size_t)size)
        rc = loip_fail(LOIP_EIO, "sentencepiece: short read of %s", path);
    fclose(f);
    if (rc == 0) rc = loip_spm_parse(d, (uint64_t)size, path, out);
    free(d);
    return rc;
}

LOIP_API int loip_spm_parse(const uint8_t *d, uint64_t size, const char *name, loip_spm **out) {
    if (out == NULL || (d == NULL && size > 0)) return loip_fail(LOIP_EINVAL, "loip_spm_parse: NULL argument");
    *out = NULL;
    if (!name) name = "(memory)";
    if (size > MAX_FILE) return loip_fail(LOIP_EFORMAT, "sentencepiece: %s is %llu bytes, over 1 GiB", name,
                                          (unsigned long long)size);
    int rc = 0;
    loip_spm *m = calloc(1, sizeof *m);
    if (m == NULL) rc = loip_fail(LOIP_ENOMEM, "sentencepiece: no memory");
    if (rc == 0) {
        int32_t defaults[LOIP_SPM_FIELD_COUNT] = {
            [LOIP_SPM_MODEL_TYPE] = 1, [LOIP_SPM_BYTE_FALLBACK] = 0, [LOIP_SPM_UNK_ID] = 0,
            [LOIP_SPM_BOS_ID] = 1, [LOIP_SPM_EOS_ID] = 2, [LOIP_SPM_PAD_ID] = -1,
            [LOIP_SPM_ADD_DUMMY_PREFIX] = 1, [LOIP_SPM_REMOVE_EXTRA_WHITESPACES] = 1,
            [LOIP_SPM_ESCAPE_WHITESPACES] = 1, [LOIP_SPM_TREAT_WHITESPACE_AS_SUFFIX] = 0,
            [LOIP_SPM_CHARSMAP_BYTES] = 0,
        };
        memcpy(m->field, defaults, sizeof defaults);
        reader r = {d, 0, size, name};
        rc = parse_model(m, &r);
    }
    if (rc != 0) {
        loip_spm_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

LOIP_API void loip_spm_free(loip_spm *m) {
    if (m == NULL) return;
    free(m->off);
    free(m->len);
    free(m->score);
    free(m->type);
    free(m->text);
    free(m);
}

LOIP_API int32_t loip_spm_size(const loip_spm *m) { return m ? m->n : 0; }

LOIP_API int loip_spm_get(const loip_spm *m, int32_t field, int32_t *value) {
    if (m == NULL || value == NULL) return loip_fail(LOIP_EINVAL, "loip_spm_get: NULL argument");
    if (field < 0 || field >= LOIP_SPM_FIELD_COUNT)
        return loip_fail(LOIP_EINVAL, "loip_spm_get: unknown field %d", (int)field);
    *value = m->field[field];
    return 0;
}

LOIP_API const char *loip_spm_normalizer_name(const loip_spm *m) { return m ? m->name : ""; }

LOIP_API int loip_spm_piece(const loip_spm *m, int32_t id, const char **piece, int32_t *len,
                            float *score, int32_t *type) {
    if (m == NULL) return loip_fail(LOIP_EINVAL, "loip_spm_piece: NULL argument");
    if (id < 0 || id >= m->n)
        return loip_fail(LOIP_EINVAL, "loip_spm_piece: id %d outside [0, %d)", (int)id, (int)m->n);
    if (piece) *piece = m->text + m->off[id];
    if (len) *len = m->len[id];
    if (score) *score = m->score[id];
    if (type) *type = m->type[id];
    return 0;
}
