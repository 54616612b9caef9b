/* SPDX-License-Identifier: Apache-2.0 */
/* /admin/v1/workers routes: list, show, define (PUT), remove and drain workers, with strict
 * validation of the JSON body; every change is saved before the answer. */
#include "admin_int.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Passive outlier detection's view of the worker: the deadline as wall-clock time (the
 * router keeps it on the monotonic clock) and as milliseconds left. */
static void put_outlier(kvg_buf *b, const kvg_worker *w)
{
    kvg_worker_outlier_state st;
    kvg_worker_outlier_get(w, kvg_now_ns(), &st);
    kvg_buf_printf(
        b, ",\"outlier\":{\"ejected\":%s,\"ejected_until\":", st.ejected ? "true" : "false");
    if (st.ejected) {
        char ts[40];
        kvg_format_time(kvg_wall_ns() + st.remaining_ns, ts, sizeof(ts));
        kvg_buf_printf(b, "\"%s\"", ts);
    } else {
        kvg_buf_puts(b, "null");
    }
    kvg_buf_printf(b,
                   ",\"remaining_ms\":%llu,\"consecutive_5xx\":%lu,"
                   "\"consecutive_gateway_failures\":%lu,\"ejections\":%llu,\"multiplier\":%lu}",
                   (unsigned long long)((st.remaining_ns + 999999) / 1000000),
                   (unsigned long)st.consecutive_5xx,
                   (unsigned long)st.consecutive_gateway_failures, (unsigned long long)st.ejections,
                   (unsigned long)st.multiplier);
}

void kvg_admin_set_worker_extra(kvg_admin *admin, kvg_admin_worker_fn fn, void *ud)
{
    pthread_mutex_lock(&admin->lock);
    admin->worker_extra = fn;
    admin->worker_extra_ud = ud;
    pthread_mutex_unlock(&admin->lock);
}

static void put_worker(kvg_admin *admin, kvg_buf *b, const kvg_worker *w)
{
    /* The definition through the worker's field table, with the effective in-flight limit
     * (0 in a PUT means the gateway default, and this shows which); then what is read-only. */
    const char *models[KVG_WORKER_MODELS_MAX];
    size_t n = KVG_MIN(kvg_worker_model_count(w), (size_t)KVG_WORKER_MODELS_MAX);
    for (size_t i = 0; i < n; i++)
        models[i] = kvg_worker_model(w, i);
    kvg_worker_def def = {
        .name = kvg_worker_name(w),
        .url = kvg_worker_url(w),
        .models = models,
        .nmodels = n,
        .kv_blocks = kvg_worker_kv_blocks(w),
        .max_inflight = kvg_worker_max_inflight(w),
        .no_cache_salt = !kvg_worker_injects_salt(w),
        .kv_events = kvg_worker_kv_events(w),
        .kv_events_replay = kvg_worker_kv_events_replay(w),
        .kv_events_stale_ms = kvg_worker_kv_events_stale_ms(w),
    };
    bool first = true;
    kvg_buf_putc(b, '{');
    kvg_fields_encode_members(&kvg_worker_fields, &def, KVG_SET_ADMIN, &first, b);
    kvg_buf_printf(b, ",\"source\":\"%s\",\"health\":\"%s\",\"draining\":%s,\"inflight\":%lu",
                   kvg_worker_source_str(kvg_worker_source_of(w)),
                   kvg_worker_health_str(kvg_worker_health_get(w)),
                   kvg_worker_draining(w) ? "true" : "false",
                   (unsigned long)kvg_worker_inflight(w));
    put_outlier(b, w);
    /* The KV-event consumer's view ("kv_events_status": state, ...): it lives in gateway/. */
    pthread_mutex_lock(&admin->lock);
    kvg_admin_worker_fn extra = admin->worker_extra;
    void *ud = admin->worker_extra_ud;
    pthread_mutex_unlock(&admin->lock);
    if (extra)
        extra(b, w, ud);
    kvg_buf_putc(b, '}');
}

/* status with the worker of the path as the registry now has it; 404 if it vanished. */
static void respond_worker(admin_ctx *c, int status)
{
    const char *name = c->name;
    kvg_worker_set *set = kvg_registry_acquire(c->admin->reg);
    kvg_worker *w = kvg_worker_set_find(set, name);
    if (w) {
        kvg_admin_json(c->resp, status);
        put_worker(c->admin, &c->resp->body, w);
    } else {
        kvg_admin_fail(c, 404, "worker \"%s\" not found", name);
    }
    kvg_worker_set_unref(set);
}

void kvg_admin_workers_list(admin_ctx *c)
{
    kvg_worker_set *set = kvg_registry_acquire(c->admin->reg);
    kvg_admin_json(c->resp, 200);
    kvg_buf *b = &c->resp->body;
    kvg_buf_puts(b, "{\"workers\":[");
    for (size_t i = 0; i < kvg_worker_set_count(set); i++) {
        if (i)
            kvg_buf_putc(b, ',');
        put_worker(c->admin, b, kvg_worker_set_at(set, i));
    }
    kvg_buf_puts(b, "]}");
    kvg_worker_set_unref(set);
}

void kvg_admin_worker_get(admin_ctx *c)
{
    respond_worker(c, 200);
}

/* Fill def from the body through the worker's field table (omitted fields: the defaults); on
 * error answers 400 (500 when out of memory) and returns false. */
static bool parse_def(admin_ctx *c, kvg_worker_def *def)
{
    kvg_fields_defaults(&kvg_worker_fields, def);
    def->name = c->name;
    if (!kvg_admin_decode(c, &kvg_worker_fields, def))
        return false;
    /* A name is accepted so a GET result can be sent back, but the path names the worker. */
    if (strcmp(def->name, c->name) != 0) {
        kvg_admin_fail(c, 400, "name: must match the name in the path");
        return false;
    }
    return true;
}

void kvg_admin_worker_put(admin_ctx *c)
{
    char msg[256];
    kvg_worker_def def;
    if (!parse_def(c, &def))
        return;
    /* Changes are serialised (change_lock), so nothing else defines it in between. */
    kvg_worker_set *before = kvg_registry_acquire(c->admin->reg);
    bool existed = kvg_worker_set_find(before, c->name) != NULL;
    kvg_worker_set_unref(before);

    int rc = kvg_registry_put(c->admin->reg, &def, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg));
    if (!kvg_admin_applied(c, rc, msg))
        return;
    kvg_admin_detail(c, "%s url=%s", existed ? "replaced" : "created", def.url);
    respond_worker(c, existed ? 200 : 201);
}

void kvg_admin_worker_delete(admin_ctx *c)
{
    if (kvg_admin_changed(c, kvg_registry_remove(c->admin->reg, c->name), "worker", "remove",
                          "deleted"))
        kvg_admin_json(c->resp, 204);
}

void kvg_admin_worker_drain(admin_ctx *c)
{
    if (kvg_admin_changed(c, kvg_registry_drain(c->admin->reg, c->name), "worker", "drain",
                          "draining"))
        respond_worker(c, 200);
}
