/* sizeof/offsetof of every struct Lua touches, as the C compiler lays them out; the FFI
 * layout spec compares them with LuaJIT's view of the same declarations. */
#include <stddef.h>
#include <string.h>

#include "loip.h"

#define FIELD(T, F) {#T, #F, offsetof(T, F)}
#define SIZE(T) {#T, "", sizeof(T)}

static const struct {
    const char *type, *field;
    size_t value;
} table[] = {
    SIZE(loip_cpu_info), FIELD(loip_cpu_info, n_cpus), FIELD(loip_cpu_info, has_cuda),
    SIZE(loip_model_config), FIELD(loip_model_config, dim), FIELD(loip_model_config, norm_eps),
    FIELD(loip_model_config, rope_theta), FIELD(loip_model_config, rope_layout),
    FIELD(loip_model_config, rope_factor), FIELD(loip_model_config, rope_original_max_pos),
    FIELD(loip_model_config, qkv_bias), FIELD(loip_model_config, qk_norm),
    FIELD(loip_model_config, tied_embeddings),
    FIELD(loip_model_config, sliding_window),
    FIELD(loip_model_config, layer_window),
    FIELD(loip_model_config, norm_add_one), FIELD(loip_model_config, embed_scale),
    FIELD(loip_model_config, final_softcap),
    FIELD(loip_model_config, attn_sinks), FIELD(loip_model_config, glu_limit),
    FIELD(loip_model_config, rope_yarn_truncate),
    SIZE(loip_tensor), FIELD(loip_tensor, data), FIELD(loip_tensor, dtype),
    FIELD(loip_tensor, ndim), FIELD(loip_tensor, shape),
    SIZE(loip_sampler_params), FIELD(loip_sampler_params, temperature),
    FIELD(loip_sampler_params, top_k), FIELD(loip_sampler_params, top_p),
    FIELD(loip_sampler_params, min_p), FIELD(loip_sampler_params, repetition_penalty),
    FIELD(loip_sampler_params, penalty_last_n),
    SIZE(loip_loader_config), FIELD(loip_loader_config, rate_limit_bps),
    FIELD(loip_loader_config, n_slots), FIELD(loip_loader_config, debug_short_every),
    FIELD(loip_loader_config, overlap_loads), FIELD(loip_loader_config, budget),
    SIZE(loip_budget_account), FIELD(loip_budget_account, name), FIELD(loip_budget_account, bytes),
    FIELD(loip_budget_account, peak),
    SIZE(loip_load_extent), FIELD(loip_load_extent, fd), FIELD(loip_load_extent, file_offset),
    FIELD(loip_load_extent, slot_offset),
    SIZE(loip_load_done), FIELD(loip_load_done, status), FIELD(loip_load_done, t_done_ns),
    FIELD(loip_load_done, message),
    SIZE(loip_loader_stats_t), FIELD(loip_loader_stats_t, throttle_ns),
    SIZE(loip_stage_view), FIELD(loip_stage_view, slot_offset), FIELD(loip_stage_view, shape),
    SIZE(loip_stage_desc), FIELD(loip_stage_desc, extents), FIELD(loip_stage_desc, n_views),
    FIELD(loip_stage_desc, views),
    SIZE(loip_runner_event), FIELD(loip_runner_event, t0_ns), FIELD(loip_runner_event, bytes),
    FIELD(loip_runner_event, n_tokens),
    SIZE(loip_runner_stats_t), FIELD(loip_runner_stats_t, events_dropped),
    SIZE(loip_msg_header), FIELD(loip_msg_header, step), FIELD(loip_msg_header, payload_bytes),
    FIELD(loip_msg_header, flags),
    SIZE(loip_link_stats), FIELD(loip_link_stats, bw_bps), FIELD(loip_link_stats, latency_ns),
    FIELD(loip_link_stats, latency_count), FIELD(loip_link_stats, transit_sum_ns),
    FIELD(loip_link_stats, late_sum_ns),
    SIZE(loip_device_config), FIELD(loip_device_config, plan_id), FIELD(loip_device_config, logits_tokens),
    FIELD(loip_device_config, heartbeat),
    SIZE(loip_device_stats_t), FIELD(loip_device_stats_t, head_ns),
    SIZE(loip_kv_share_stats), FIELD(loip_kv_share_stats, cache_bytes), FIELD(loip_kv_share_stats, cow_copies),
    SIZE(loip_step_token), FIELD(loip_step_token, request), FIELD(loip_step_token, flags), FIELD(loip_step_token, id),
    FIELD(loip_step_token, parent),
    SIZE(loip_step_output), FIELD(loip_step_output, request), FIELD(loip_step_output, id),
    FIELD(loip_step_output, flags),
};

LOIP_API int64_t loip_layout(const char *type, const char *field) {
    if (!type || !field) return -1;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].type, type) && !strcmp(table[i].field, field)) return (int64_t)table[i].value;
    return -1;
}
