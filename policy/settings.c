/* SPDX-License-Identifier: Apache-2.0 */
/* The operator's policy settings: their JSON form and the shared copy every thread reads. */
#include "policy.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvg_policy_state {
    pthread_mutex_t lock; /* guards cfg; held for a struct copy only */
    kvg_policy_config cfg;
    _Atomic uint64_t generation;
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
    memset(cfg, 0, sizeof(*cfg));
    cfg->kind = KVG_POLICY_LEAST_LOADED;
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
        if (key_len == strlen("policy") && memcmp(key, "policy", key_len) == 0) {
            if (v->type != KVG_JSON_STRING)
                return bad(msg, msg_len, "policy: must be a string, not %s",
                           kvg_json_type_str(v->type));
            if (strlen(v->u.str.ptr) != v->u.str.len ||
                kvg_policy_kind_parse(v->u.str.ptr, &next.kind) < 0) {
                show_name(v->u.str.ptr, v->u.str.len, name);
                return bad(msg, msg_len,
                           "policy: unknown policy \"%s\" (one of least_loaded, round_robin, "
                           "random)",
                           name);
            }
            continue;
        }
        show_name(key, key_len, name);
        return bad(msg, msg_len, "%s: unknown field", name);
    }
    *cfg = next;
    return 0;
}

void kvg_policy_config_to_json(const kvg_policy_config *cfg, kvg_buf *out)
{
    kvg_buf_puts(out, "{\"policy\":");
    const char *kind = kvg_policy_kind_str(cfg->kind);
    kvg_buf_json_string(out, kind, strlen(kind));
    kvg_buf_putc(out, '}');
}

int kvg_policy_state_new(kvg_policy_state **out)
{
    kvg_policy_state *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    int rc = -pthread_mutex_init(&st->lock, NULL);
    if (rc < 0) {
        free(st);
        return rc;
    }
    kvg_policy_config_init(&st->cfg);
    atomic_init(&st->generation, 1);
    *out = st;
    return 0;
}

void kvg_policy_state_free(kvg_policy_state *st)
{
    if (!st)
        return;
    pthread_mutex_destroy(&st->lock);
    free(st);
}

void kvg_policy_state_get(kvg_policy_state *st, kvg_policy_config *out)
{
    pthread_mutex_lock(&st->lock);
    *out = st->cfg;
    pthread_mutex_unlock(&st->lock);
}

void kvg_policy_state_set(kvg_policy_state *st, const kvg_policy_config *cfg)
{
    /* The number moves inside the critical section (as the registry's does): a reader that
     * sees the new number and then copies gets at least these settings. */
    pthread_mutex_lock(&st->lock);
    st->cfg = *cfg;
    atomic_fetch_add_explicit(&st->generation, 1, memory_order_relaxed);
    pthread_mutex_unlock(&st->lock);
}

uint64_t kvg_policy_state_generation(const kvg_policy_state *st)
{
    return atomic_load_explicit(&((kvg_policy_state *)st)->generation, memory_order_relaxed);
}
