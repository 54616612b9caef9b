/* SPDX-License-Identifier: Apache-2.0 */
/* The operator's policy settings: their JSON form and the shared copy every thread reads. */
#include "policy.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvg_policy_state {
    kvg_snapshot_slot snapshots; /* of kvg_policy_settings */
};

#define COST_MAX 1e12 /* us: 11 days; a bound that keeps every product finite */

#define INT_FIELD(field, lo, hi, dflt)                                                             \
    {                                                                                              \
        .name = #field, .type = KVG_FIELD_U32, .set_in = KVG_SET_ANY,                              \
        .offset = offsetof(kvg_policy_config, field), .min = (lo), .max = (hi), .def.u = (dflt)    \
    }

#define COST_FIELD(field, dflt)                                                                    \
    {                                                                                              \
        .name = #field, .type = KVG_FIELD_DOUBLE, .set_in = KVG_SET_ANY,                           \
        .offset = offsetof(kvg_policy_config, field), .dmax = COST_MAX, .def.d = (dflt)            \
    }

/* Every setting once, for PUT /admin/v1/policy, the state file's "policy" and `kvgate admin
 * policy set`; the defaults and their reasons are in docs/admin-api.md. Integer fields take
 * integers as written (1.0, 1e3 and 1.5 are refused rather than rounded). */
static const kvg_field policy_fields[] = {
    {.name = "policy",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_policy_config, kind),
     .keywords = kvg_policy_kind_names,
     .nkeywords = KVG_POLICY_KIND_COUNT,
     .def.u = KVG_POLICY_COST,
     .invalid = "{path}: unknown policy \"{value}\" (one of {keywords})"},
    INT_FIELD(block_bytes, 16, 65536, 64),
    INT_FIELD(block_tokens, 1, 65536, 16),
    INT_FIELD(max_blocks, 1, 1048576, 4096),
    INT_FIELD(cold_blocks, 1, 1024, 4),
    {.name = "load_factor",
     .type = KVG_FIELD_DOUBLE,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_policy_config, load_factor),
     .dmax = 100,
     .def.d = 2.0},
    INT_FIELD(load_slack, 0, 1048576, 4),
    COST_FIELD(prefill_cost_per_block, 200),
    COST_FIELD(queue_cost_per_request, 1000),
    COST_FIELD(waiting_cost_per_request, 5000),
    COST_FIELD(kv_usage_cost, 0),
    COST_FIELD(turnover_cost_per_block, 50),
    COST_FIELD(pending_cost_per_block, 200),
    {.name = "pending_hit_weight",
     .type = KVG_FIELD_DOUBLE,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_policy_config, pending_hit_weight),
     .dmax = 1,
     .def.d = 0},
    /* llm-d's precise prefix scorer weighs a block on the GPU 1.0 and one on the CPU 0.8. */
    {.name = "cpu_block_weight",
     .type = KVG_FIELD_DOUBLE,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_policy_config, cpu_block_weight),
     .dmax = 1,
     .def.d = 0.8},
};

const kvg_fields kvg_policy_fields = {"policy", policy_fields, KVG_ARRAY_LEN(policy_fields), NULL};

void kvg_policy_config_init(kvg_policy_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    kvg_fields_defaults(&kvg_policy_fields, cfg);
}

int kvg_policy_config_apply_json(kvg_policy_config *cfg, const kvg_json *obj, char *msg,
                                 size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (!obj || obj->type != KVG_JSON_OBJECT) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "policy settings: must be a JSON object, not %s",
                     obj ? kvg_json_type_str(obj->type) : "nothing");
        return KVG_EPARSE;
    }
    /* Work on a copy: a bad member after a good one leaves cfg as it was. No field is a list,
     * so the walker allocates nothing. */
    kvg_policy_config next = *cfg;
    kvg_fields_ctx c = {.from = KVG_SET_ADMIN | KVG_SET_STATE, .msg = msg, .msg_len = msg_len};
    int rc = kvg_fields_decode(&kvg_policy_fields, &next, obj, "", &c);
    if (rc == 0)
        *cfg = next;
    return rc;
}

void kvg_policy_config_to_json(const kvg_policy_config *cfg, kvg_buf *out)
{
    kvg_fields_encode(&kvg_policy_fields, cfg, KVG_SET_ADMIN, out);
}

/* ---- the shared settings ---------------------------------------------------------------- */

static void settings_free(kvg_snapshot *snap)
{
    free(KVG_CONTAINER_OF(snap, kvg_policy_settings, snap));
}

/* An unpublished settings object with one reference. */
static kvg_policy_settings *settings_new(const kvg_policy_config *cfg)
{
    kvg_policy_settings *s = malloc(sizeof(*s));
    if (!s)
        return NULL;
    kvg_snapshot_init(&s->snap, settings_free);
    s->cfg = *cfg;
    return s;
}

int kvg_policy_state_new(kvg_policy_state **out)
{
    kvg_policy_config cfg;
    kvg_policy_config_init(&cfg);
    kvg_policy_state *st = malloc(sizeof(*st));
    if (!st)
        return -ENOMEM;
    kvg_policy_settings *first = settings_new(&cfg);
    if (!first) {
        free(st);
        return -ENOMEM;
    }
    int rc = kvg_snapshot_slot_init(&st->snapshots, &first->snap);
    if (rc < 0) {
        kvg_snapshot_unref(&first->snap);
        free(st);
        return rc;
    }
    *out = st;
    return 0;
}

void kvg_policy_state_free(kvg_policy_state *st)
{
    if (!st)
        return;
    kvg_snapshot_slot_done(&st->snapshots);
    free(st);
}

void kvg_policy_state_get(kvg_policy_state *st, kvg_policy_config *out)
{
    kvg_snapshot *snap = kvg_snapshot_slot_acquire(&st->snapshots);
    *out = *kvg_policy_config_of(snap);
    kvg_snapshot_unref(snap);
}

int kvg_policy_state_set(kvg_policy_state *st, const kvg_policy_config *cfg)
{
    kvg_policy_settings *next = settings_new(cfg);
    if (!next)
        return -ENOMEM;
    kvg_snapshot_unref(kvg_snapshot_slot_publish(&st->snapshots, &next->snap));
    return 0;
}

uint64_t kvg_policy_state_generation(const kvg_policy_state *st)
{
    return kvg_snapshot_slot_generation(&st->snapshots);
}

kvg_snapshot_slot *kvg_policy_state_snapshots(kvg_policy_state *st)
{
    return &st->snapshots;
}
