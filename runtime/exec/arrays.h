/* Internal: an object's arrays described by one table (where each pointer lives in the object,
 * its element's size and count, whether the budget counts it), walked to size them, to
 * allocate them and to free them, so that what is charged is what is allocated. */
#ifndef LOIP_ARRAYS_H
#define LOIP_ARRAYS_H

#include <stddef.h>
#include <stdint.h>

enum {
    LOIP_ARRAY_COUNTED = 1, /* charged to the owner's budget account; else outside the budget's sizes */
    LOIP_ARRAY_ZERO = 2,    /* zeroed when allocated */
};

typedef struct {
    size_t at;     /* offsetof the array's pointer in its object */
    size_t elem;   /* bytes of one element */
    uint64_t n;    /* elements */
    uint32_t flags; /* LOIP_ARRAY_* */
} loip_array;

/* Bytes of the counted arrays of table[0..n). */
uint64_t loip_arrays_bytes(const loip_array *table, size_t n);
/* Each array of table[0..n) allocated into its pointer in obj (aligned; an empty one gets a
 * few bytes, so that no pointer is NULL): LOIP_ENOMEM, *failed the bytes that could not be
 * had; the arrays allocated so far stay for loip_arrays_free. */
int loip_arrays_alloc(void *obj, const loip_array *table, size_t n, uint64_t *failed);
/* Each array of table[0..n) in obj freed (NULL ones skipped) and its pointer cleared. */
void loip_arrays_free(void *obj, const loip_array *table, size_t n);

#endif
