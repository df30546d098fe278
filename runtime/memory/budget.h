/* Internal: references to a budget held by the objects charged to it. */
#ifndef LOIP_BUDGET_H
#define LOIP_BUDGET_H

#include "loip.h"

/* Another reference (NULL-safe); loip_budget_free drops one. */
loip_budget *loip_budget_retain(loip_budget *b);
/* bytes charged to account `from` moved to account `to` at once (the total, its limit and peak
 * unchanged): what one object holds changes hands. LOIP_ESTATE when `from` holds less. */
int loip_budget_move(loip_budget *b, const char *from, const char *to, uint64_t bytes);
/* Human-readable size, "512.0 MiB", into buf. */
const char *loip_format_bytes(uint64_t bytes, char *buf, size_t cap);

#endif
