/* Internal: what the mixture-of-experts block (moe.c) asks of the expert cache (experts.c). */
#ifndef LOIP_EXPERTS_H
#define LOIP_EXPERTS_H

#include "loip.h"

enum { XS_EMPTY = 0, XS_LOADING = 1, XS_READY = 2 };

/* Expert e of layer l for the layer run now: *slot (>= 0; *state XS_READY or XS_LOADING, a
 * read started), or -1 when no slot can take it now (every slot is in use by this layer run or
 * pinned: release some and ask again). The slot is held until loip_experts_release. Counts the
 * hit or the read; a read that cannot start returns its error. */
int loip_experts_acquire(loip_experts *x, int32_t layer, int32_t e, int32_t *slot, int *state);
/* Layer l's batch chose experts[0..n), n_bound of them bound in the model (counted, for LFU
 * and the stats); the layer's prefetches that were not chosen become ordinary cached ones. */
void loip_experts_routed(loip_experts *x, int32_t layer, const int32_t *experts, int32_t n, int32_t n_bound);
/* Waits for slot's read (timeout_ms < 0: no limit, 0: only if done); LOIP_ETIMEDOUT when not
 * done yet; a failed read's code and message, naming the file. */
int loip_experts_wait(loip_experts *x, int32_t slot, int32_t timeout_ms);
/* The three tensors of the expert in a ready slot. */
void loip_experts_tensors(loip_experts *x, int32_t slot, loip_tensor out[LOIP_EXPERT_PARTS]);
void loip_experts_release(loip_experts *x, int32_t slot);
/* Is expert e of layer l in a slot (ready or loading)? */
int loip_experts_holds(const loip_experts *x, int32_t layer, int32_t e);
/* Was the read into slot a prefetch (pre-gating's guess)? */
int loip_experts_was_prefetch(const loip_experts *x, int32_t slot);
/* The layer's run ended (LOIP_EXPERTS_ALL forgets its experts: the next run reads them again). */
void loip_experts_layer_done(loip_experts *x, int32_t layer);
/* LOIP_EXPERTS_ALL: pre-gating reads every expert of a layer, whatever its router says. */
int loip_experts_reads_all(const loip_experts *x);
/* A new layer run begins (slots held by the last one are free to go). */
void loip_experts_next_run(loip_experts *x);
/* Pre-gating: predict layer l now? It has unbound experts this cache reads, views to predict
 * them, and predictions that pay (loip_experts_config.prefetch_min_accuracy; a skip is counted). */
/* The router bias pre-gating adds for layer (loip_experts_set_gating_bias), NULL: none. */
const loip_tensor *loip_experts_gating_bias(const loip_experts *x, int32_t layer);
int loip_experts_predicts(loip_experts *x, int32_t layer, const loip_tensor **ffn_norm,
                          const loip_tensor **router);
/* Start reads of the predicted experts of layer l (those neither bound nor cached), into slots
 * not held by the layer run now and not holding experts prefetched for a layer not yet run. */
void loip_experts_prefetch(loip_experts *x, int32_t layer, const int32_t *experts, int32_t n);
int32_t loip_experts_prefetch_depth(const loip_experts *x);
void loip_experts_add_stall(loip_experts *x, uint64_t ns);

#endif
