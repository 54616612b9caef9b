/* SPDX-License-Identifier: Apache-2.0 */
/* The operator's policy settings: their JSON form and the shared copy every thread reads. */
#include "policy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvg_policy_state {
    kvg_snapshot_slot snapshots; /* of kvg_policy_settings */
};

static int bad(char *msg, size_t msg_len, const char *fmt, ...) KVG_PRINTF(3, 4);

static int bad(char *msg, size_t msg_len, const char *fmt, ...)
{
    if (msg && msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
    }
    return KVG_EPARSE;
}

/* A field name from peer input, fit for a message: printable ASCII, at most 64 bytes. */
static void show_name(const char *s, size_t len, char out[72])
{
    size_t o = 0;
    for (size_t i = 0; i < len && o < 64; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? (char)c : '?';
    }
    if (len > 64) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

void kvg_policy_config_init(kvg_policy_config *cfg)
{
    /* docs/admin-api.md gives the reasons for each value. */
    *cfg = (kvg_policy_config){
        .kind = KVG_POLICY_COST,
        .block_bytes = 64,
        .block_tokens = 16,
        .max_blocks = 4096,
        .cold_blocks = 4,
        .load_factor = 0.5,
        .prefill_cost_per_block = 200,
        .queue_cost_per_request = 1000,
        .waiting_cost_per_request = 5000,
        .kv_usage_cost = 0,
    };
}

/* The numeric settings, in the order to_json writes them. */
typedef struct int_field {
    const char *name;
    size_t offset; /* of a uint32_t in kvg_policy_config */
    uint32_t min, max;
} int_field;

typedef struct num_field {
    const char *name;
    size_t offset; /* of a double in kvg_policy_config */
    double max;
    const char *max_str;
} num_field;

#define COST_MAX 1e12 /* us: 11 days; a bound that keeps every product finite */

static const int_field int_fields[] = {
    {"block_bytes", offsetof(kvg_policy_config, block_bytes), 16, 65536},
    {"block_tokens", offsetof(kvg_policy_config, block_tokens), 1, 65536},
    {"max_blocks", offsetof(kvg_policy_config, max_blocks), 1, 1048576},
    {"cold_blocks", offsetof(kvg_policy_config, cold_blocks), 1, 1024},
};

static const num_field num_fields[] = {
    {"load_factor", offsetof(kvg_policy_config, load_factor), 100, "100"},
    {"prefill_cost_per_block", offsetof(kvg_policy_config, prefill_cost_per_block), COST_MAX,
     "1e12"},
    {"queue_cost_per_request", offsetof(kvg_policy_config, queue_cost_per_request), COST_MAX,
     "1e12"},
    {"waiting_cost_per_request", offsetof(kvg_policy_config, waiting_cost_per_request), COST_MAX,
     "1e12"},
    {"kv_usage_cost", offsetof(kvg_policy_config, kv_usage_cost), COST_MAX, "1e12"},
};

static bool key_is(const char *key, size_t key_len, const char *name)
{
    return key_len == strlen(name) && memcmp(key, name, key_len) == 0;
}

static int apply_int(const int_field *f, const kvg_json *v, kvg_policy_config *next, char *msg,
                     size_t msg_len)
{
    /* An integer as written: 1.0, 1e3 and 1.5 are refused rather than rounded. */
    if (v->type != KVG_JSON_NUMBER)
        return bad(msg, msg_len, "%s: must be an integer in %" PRIu32 "..%" PRIu32 ", not %s",
                   f->name, f->min, f->max, kvg_json_type_str(v->type));
    if (!v->u.num.is_int || v->u.num.ival < f->min || v->u.num.ival > f->max)
        return bad(msg, msg_len, "%s: must be an integer in %" PRIu32 "..%" PRIu32, f->name, f->min,
                   f->max);
    uint32_t x = (uint32_t)v->u.num.ival;
    memcpy((char *)next + f->offset, &x, sizeof(x));
    return 0;
}

static int apply_num(const num_field *f, const kvg_json *v, kvg_policy_config *next, char *msg,
                     size_t msg_len)
{
    /* The negated test also refuses NaN (the parser never makes one; a huge exponent may make an
     * infinity, which fails the upper bound). */
    if (v->type != KVG_JSON_NUMBER)
        return bad(msg, msg_len, "%s: must be a number in 0..%s, not %s", f->name, f->max_str,
                   kvg_json_type_str(v->type));
    if (!(v->u.num.value >= 0 && v->u.num.value <= f->max))
        return bad(msg, msg_len, "%s: must be a number in 0..%s", f->name, f->max_str);
    double x = v->u.num.value + 0.0; /* -0 becomes 0, so it is written back as 0 */
    memcpy((char *)next + f->offset, &x, sizeof(x));
    return 0;
}

int kvg_policy_config_apply_json(kvg_policy_config *cfg, const kvg_json *obj, char *msg,
                                 size_t msg_len)
{
    char name[72];
    if (msg && msg_len)
        msg[0] = '\0';
    if (!obj || obj->type != KVG_JSON_OBJECT)
        return bad(msg, msg_len, "policy settings: must be a JSON object, not %s",
                   obj ? kvg_json_type_str(obj->type) : "nothing");
    /* Work on a copy: a bad member after a good one leaves cfg as it was. */
    kvg_policy_config next = *cfg;
    for (size_t i = 0; i < obj->u.obj.count; i++) {
        const char *key = obj->u.obj.keys[i];
        size_t key_len = obj->u.obj.key_lens[i];
        const kvg_json *v = obj->u.obj.values[i];
        int rc = 1; /* 1: not a known field */
        if (key_is(key, key_len, "policy")) {
            if (v->type != KVG_JSON_STRING)
                return bad(msg, msg_len, "policy: must be a string, not %s",
                           kvg_json_type_str(v->type));
            if (strlen(v->u.str.ptr) != v->u.str.len ||
                kvg_policy_kind_parse(v->u.str.ptr, &next.kind) < 0) {
                char names[128] = "";
                size_t o = 0;
                for (int k = 0; k < KVG_POLICY_KIND_COUNT && o < sizeof(names); k++)
                    o += (size_t)snprintf(names + o, sizeof(names) - o, "%s%s", k ? ", " : "",
                                          kvg_policy_kind_str((kvg_policy_kind)k));
                show_name(v->u.str.ptr, v->u.str.len, name);
                return bad(msg, msg_len, "policy: unknown policy \"%s\" (one of %s)", name, names);
            }
            continue;
        }
        for (size_t f = 0; f < KVG_ARRAY_LEN(int_fields) && rc > 0; f++)
            if (key_is(key, key_len, int_fields[f].name))
                rc = apply_int(&int_fields[f], v, &next, msg, msg_len);
        for (size_t f = 0; f < KVG_ARRAY_LEN(num_fields) && rc > 0; f++)
            if (key_is(key, key_len, num_fields[f].name))
                rc = apply_num(&num_fields[f], v, &next, msg, msg_len);
        if (rc < 0)
            return rc;
        if (rc > 0) {
            show_name(key, key_len, name);
            return bad(msg, msg_len, "%s: unknown field", name);
        }
    }
    *cfg = next;
    return 0;
}

/* The shortest of %.15g and %.17g that reads back as the same double, so that what GET shows
 * is what PUT was given (0.1, not 0.10000000000000001) and a round trip changes nothing. */
static void put_number(kvg_buf *out, double v)
{
    char s[40];
    snprintf(s, sizeof(s), "%.15g", v);
    if (strtod(s, NULL) != v)
        snprintf(s, sizeof(s), "%.17g", v);
    kvg_buf_puts(out, s);
}

void kvg_policy_config_to_json(const kvg_policy_config *cfg, kvg_buf *out)
{
    kvg_buf_puts(out, "{\"policy\":");
    const char *kind = kvg_policy_kind_str(cfg->kind);
    kvg_buf_json_string(out, kind, strlen(kind));
    for (size_t f = 0; f < KVG_ARRAY_LEN(int_fields); f++) {
        uint32_t x;
        memcpy(&x, (const char *)cfg + int_fields[f].offset, sizeof(x));
        kvg_buf_printf(out, ",\"%s\":%" PRIu32, int_fields[f].name, x);
    }
    for (size_t f = 0; f < KVG_ARRAY_LEN(num_fields); f++) {
        double x;
        memcpy(&x, (const char *)cfg + num_fields[f].offset, sizeof(x));
        kvg_buf_printf(out, ",\"%s\":", num_fields[f].name);
        put_number(out, x);
    }
    kvg_buf_putc(out, '}');
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
