/* Internal: references to a budget held by the objects charged to it. */
#ifndef LOIP_BUDGET_H
#define LOIP_BUDGET_H

#include "loip.h"

/* Another reference (NULL-safe); loip_budget_free drops one. */
loip_budget *loip_budget_retain(loip_budget *b);
/* Human-readable size, "512.0 MiB", into buf. */
const char *loip_format_bytes(uint64_t bytes, char *buf, size_t cap);

#endif
