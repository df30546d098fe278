/* An object's arrays from one table (arrays.h). */
#include <string.h>

#include "core/core.h"
#include "exec/arrays.h"

static void **slot_of(void *obj, const loip_array *a) { return (void **)((char *)obj + a->at); }

uint64_t loip_arrays_bytes(const loip_array *table, size_t n) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (table[i].flags & LOIP_ARRAY_COUNTED) bytes += table[i].n * table[i].elem;
    return bytes;
}

int loip_arrays_alloc(void *obj, const loip_array *table, size_t n, uint64_t *failed) {
    for (size_t i = 0; i < n; i++) {
        size_t bytes = (size_t)(table[i].n ? table[i].n : 1) * table[i].elem;
        void *p = loip_aligned_alloc(bytes);
        if (!p) {
            *failed = bytes;
            return LOIP_ENOMEM;
        }
        if (table[i].flags & LOIP_ARRAY_ZERO) memset(p, 0, bytes);
        *slot_of(obj, &table[i]) = p;
    }
    return LOIP_OK;
}

void loip_arrays_free(void *obj, const loip_array *table, size_t n) {
    for (size_t i = 0; i < n; i++) {
        void **p = slot_of(obj, &table[i]);
        loip_aligned_free(*p);
        *p = NULL;
    }
}
