/* Internal declarations shared by the tokenizer parts (not part of the public header). */
#ifndef LOIP_TOKENIZER_H
#define LOIP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* ---- unicode_data.c (generated) ---------------------------------------------------------- */

extern const char loip_unicode_version[];
extern const int loip_ccc_count, loip_decomp_count, loip_comp_count, loip_unsafe_count;
extern const uint32_t loip_ccc[][3];        /* first, last, canonical combining class */
extern const uint32_t loip_decomp[][3];     /* code point, first, second (0: singleton) */
extern const uint32_t loip_comp[][3];       /* first, second, composite */
extern const uint32_t loip_nfc_unsafe[][2]; /* first, last */

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at p[0..n) (1..4), or 0 when p[0] does not start
 * one: a stray continuation byte, an overlong form, a surrogate, a value above U+10FFFF, or a
 * sequence cut short. *cp receives the code point when the length is not 0. */
int loip_utf8_decode(const uint8_t *p, size_t n, uint32_t *cp);
/* Bytes written (1..4) for code point cp at out. */
int loip_utf8_encode(uint32_t cp, uint8_t *out);

/* ---- pretok.c ---------------------------------------------------------------------------- */

/* A growing array of [start, end) byte spans. */
typedef struct loip_spans {
    int32_t *v; /* (2 * cap) start, end pairs */
    int32_t n, cap;
} loip_spans;

int loip_spans_push(loip_spans *s, int32_t start, int32_t end);
void loip_spans_release(loip_spans *s);

/* Appends to out the chunks of text[0..len) after every step of p (p NULL: the whole text, if
 * not empty). out is not cleared first. */
int loip_pretok_spans(loip_pretok *p, const char *text, size_t len, loip_spans *out);

/* ---- bpe_load.c --------------------------------------------------------------------------- */

/* Raw bytes of a piece in GPT-2's bytes_to_unicode spelling: out (n bytes at most) gets
 * *n_out bytes; -1 when a character is outside that alphabet. */
int loip_gpt2_decode(const char *s, size_t n, uint8_t *out, size_t *n_out);

#endif
