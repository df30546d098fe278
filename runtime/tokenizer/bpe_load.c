/* bpe_load.c — the text formats that fill a loip_bpe: GPT-2's bytes_to_unicode spelling of
 * byte-level pieces, merges.txt lines, and tiktoken's "base64 rank" lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/bpe.h"

/* ---- GPT-2 bytes_to_unicode ----------------------------------------------------------------
 * Bytes 33..126, 161..172 and 174..255 stand for themselves (as code points); the other 68
 * bytes, in increasing order, are U+0100..U+0143. */

static int self_byte(uint32_t b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* The byte that each code point below 324 stands for in GPT-2's alphabet, or -1. */
static const int16_t *gpt2_table(void) {
    static int16_t table[324];
    static int ready;
    if (!ready) { /* idempotent: racing threads write the same values */
        int k = 0;
        for (int i = 0; i < 324; i++) table[i] = -1;
        for (int b = 0; b < 256; b++) {
            if (self_byte((uint32_t)b)) table[b] = (int16_t)b;
            else table[256 + k++] = (int16_t)b;
        }
        ready = 1;
    }
    return table;
}

/* Every piece of a byte-level vocabulary and of its merges comes through here: the alphabet's
 * characters are one byte (33..126) or two (lead byte 0xC2..0xC5), decoded inline. */
int loip_gpt2_decode(const char *s, size_t n, uint8_t *out, size_t *n_out) {
    const int16_t *table = gpt2_table();
    const uint8_t *p = (const uint8_t *)s;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c = p[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xC5 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
            c = (c & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1;
        }
        int b = c < 324 ? table[c] : -1;
        if (b < 0) return -1;
        out[w++] = (uint8_t)b;
    }
    *n_out = w;
    return 0;
}

/* ---- merges.txt ---------------------------------------------------------------------------- */

/* Adds the merges of batch[0..*k) (line numbers in line), and empties it. */
static int flush_merges(loip_bpe *b, bpe_merge_in *batch, const int32_t *line, size_t *k) {
    size_t bad = 0;
    int rc = loip_bpe_add_merge_list(b, batch, *k, &bad);
    *k = 0;
    if (rc == 0) return 0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", loip_last_error());
    return loip_fail(rc, "merges line %d: %s", (int)line[bad], msg);
}

LOIP_API int loip_bpe_add_merges(loip_bpe *b, const char *text, size_t len, int32_t first_line) {
    if (b == NULL || (text == NULL && len > 0))
        return loip_fail(LOIP_EINVAL, "loip_bpe_add_merges: NULL argument");
    /* A merge a line at most: the table is sized once. */
    size_t lines = 1;
    for (const char *q = text; q && (q = memchr(q, '\n', len - (size_t)(q - text))) != NULL; q++)
        lines++;
    int rc = loip_bpe_reserve(b, 0, 0, 0, lines > INT32_MAX ? INT32_MAX : (int32_t)lines);
    enum { N = 256 };
    bpe_merge_in batch[N];
    int32_t batch_line[N];
    size_t i = 0, k = 0;
    int32_t line = first_line;
    while (rc == 0 && i < len) {
        const char *s = text + i;
        const char *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + (nl != NULL);
        if (n > 0 && s[n - 1] == '\r') n--;
        int32_t this_line = line++;
        if (n == 0 || (this_line == first_line && n >= 8 && memcmp(s, "#version", 8) == 0))
            continue;
        const char *sp = memchr(s, ' ', n);
        if (sp == NULL || sp == s || sp == s + n - 1 ||
            memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
            /* The lines before come first: one of them may be at fault too. */
            if ((rc = flush_merges(b, batch, batch_line, &k)) != 0) break;
            return loip_fail(LOIP_EFORMAT, "merges line %d: expected two pieces separated by "
                                           "one space, found \"%.*s\"", (int)this_line,
                             n > 80 ? 80 : (int)n, s);
        }
        batch[k] = (bpe_merge_in){s, sp + 1, (uint32_t)(sp - s),
                                  (uint32_t)(n - (size_t)(sp + 1 - s))};
        batch_line[k] = this_line;
        if (++k == N) rc = flush_merges(b, batch, batch_line, &k);
    }
    if (rc == 0) rc = flush_merges(b, batch, batch_line, &k);
    return rc;
}

/* ---- tiktoken ------------------------------------------------------------------------------ */

static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with padding; -1 when malformed. */
static int b64_decode(const char *s, size_t n, uint8_t *out, size_t *n_out) {
    if (n == 0 || n % 4 != 0) return -1;
    size_t w = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            uint8_t c = (uint8_t)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1; /* '=' followed by data */
                v[k] = b64_value(c);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[w++] = (uint8_t)(x >> 16);
        if (pad < 2) out[w++] = (uint8_t)(x >> 8);
        if (pad < 1) out[w++] = (uint8_t)x;
    }
    *n_out = w;
    return 0;
}

LOIP_API int loip_bpe_add_tiktoken(loip_bpe *b, const char *text, size_t len) {
    if (b == NULL || (text == NULL && len > 0))
        return loip_fail(LOIP_EINVAL, "loip_bpe_add_tiktoken: NULL argument");
    uint8_t buf[768];
    size_t i = 0;
    int32_t line = 0;
    while (i < len) {
        const char *s = text + i;
        const char *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + (nl != NULL);
        line++;
        if (n > 0 && s[n - 1] == '\r') n--;
        if (n == 0) continue;
        const char *sp = memchr(s, ' ', n);
        size_t blen = sp ? (size_t)(sp - s) : 0, dlen = 0;
        int64_t rank = -1;
        if (sp != NULL && sp + 1 < s + n) {
            rank = 0;
            for (const char *q = sp + 1; q < s + n; q++) {
                if (*q < '0' || *q > '9' || rank > INT32_MAX) {
                    rank = -1;
                    break;
                }
                rank = rank * 10 + (*q - '0');
            }
        }
        if (rank < 0 || rank > INT32_MAX || blen / 4 * 3 > sizeof buf ||
            b64_decode(s, blen, buf, &dlen) != 0)
            return loip_fail(LOIP_EFORMAT, "tiktoken line %d: expected \"base64 rank\", found "
                                           "\"%.*s\"", (int)line, n > 80 ? 80 : (int)n, s);
        int rc = loip_bpe_add_token(b, (const char *)buf, dlen, (int32_t)rank, 0.0f, 0);
        if (rc != 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", loip_last_error());
            return loip_fail(rc, "tiktoken line %d: %s", (int)line, msg);
        }
    }
    if (line == 0) return loip_fail(LOIP_EFORMAT, "tiktoken: no ranks in the file");
    return 0;
}
