/* SPDX-License-Identifier: Apache-2.0 */
/* /admin/v1/workers routes: list, show, define (PUT), remove and drain workers, with strict
 * validation of the JSON body; every change is saved before the answer. */
#include "admin_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void put_worker(kvg_buf *b, const kvg_worker *w)
{
    const char *s;
    kvg_buf_puts(b, "{\"name\":");
    s = kvg_worker_name(w);
    kvg_buf_json_string(b, s, strlen(s));
    kvg_buf_puts(b, ",\"url\":");
    s = kvg_worker_url(w);
    kvg_buf_json_string(b, s, strlen(s));
    kvg_buf_puts(b, ",\"models\":[");
    for (size_t i = 0; i < kvg_worker_model_count(w); i++) {
        if (i)
            kvg_buf_putc(b, ',');
        s = kvg_worker_model(w, i);
        kvg_buf_json_string(b, s, strlen(s));
    }
    kvg_buf_printf(
        b,
        "],\"kv_blocks\":%lu,\"max_inflight\":%lu,\"cache_salt\":%s,\"source\":\"%s\","
        "\"health\":\"%s\",\"draining\":%s,\"inflight\":%lu}",
        (unsigned long)kvg_worker_kv_blocks(w), (unsigned long)kvg_worker_max_inflight(w),
        kvg_worker_injects_salt(w) ? "true" : "false",
        kvg_worker_source_str(kvg_worker_source_of(w)),
        kvg_worker_health_str(kvg_worker_health_get(w)), kvg_worker_draining(w) ? "true" : "false",
        (unsigned long)kvg_worker_inflight(w));
}

/* 200 (or status) with the worker as the registry now has it; 404 if it vanished. */
static void respond_worker(admin_ctx *c, const char *name, int status)
{
    kvg_worker_set *set = kvg_registry_acquire(c->admin->reg);
    kvg_worker *w = kvg_worker_set_find(set, name);
    if (w) {
        kvg_admin_json(c->resp, status);
        put_worker(&c->resp->body, w);
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
        put_worker(b, kvg_worker_set_at(set, i));
    }
    kvg_buf_puts(b, "]}");
    kvg_worker_set_unref(set);
}

void kvg_admin_worker_get(admin_ctx *c, const char *name)
{
    respond_worker(c, name, 200);
}

/* Fill def from the body; on error writes the message naming the field and returns false. */
static bool parse_def(const kvg_json *root, const char *name, kvg_worker_def *def,
                      const char **models, char *msg, size_t msg_len)
{
    *def = (kvg_worker_def){.name = name};
    for (size_t i = 0; i < root->u.obj.count; i++) {
        const char *key = root->u.obj.keys[i];
        size_t klen = root->u.obj.key_lens[i];
        const kvg_json *v = root->u.obj.values[i];
        if (kvg_admin_key_is(key, klen, "url")) {
            if (!kvg_admin_c_string(v, "url", msg, msg_len))
                return false;
            def->url = v->u.str.ptr;
        } else if (kvg_admin_key_is(key, klen, "models")) {
            if (v->type != KVG_JSON_ARRAY) {
                snprintf(msg, msg_len, "models: must be an array of strings");
                return false;
            }
            if (v->u.arr.count > KVG_WORKER_MODELS_MAX) {
                snprintf(msg, msg_len, "models: more than %d models", KVG_WORKER_MODELS_MAX);
                return false;
            }
            for (size_t k = 0; k < v->u.arr.count; k++) {
                char field[32];
                snprintf(field, sizeof(field), "models[%zu]", k);
                if (!kvg_admin_c_string(v->u.arr.items[k], field, msg, msg_len))
                    return false;
                models[k] = v->u.arr.items[k]->u.str.ptr;
            }
            def->models = models;
            def->nmodels = v->u.arr.count;
        } else if (kvg_admin_key_is(key, klen, "kv_blocks")) {
            if (!kvg_admin_get_u32(v, &def->kv_blocks)) {
                snprintf(msg, msg_len, "kv_blocks: must be an integer in 0..%lu",
                         (unsigned long)UINT32_MAX);
                return false;
            }
        } else if (kvg_admin_key_is(key, klen, "max_inflight")) {
            if (!kvg_admin_get_u32(v, &def->max_inflight)) {
                snprintf(msg, msg_len, "max_inflight: must be an integer in 0..%lu",
                         (unsigned long)UINT32_MAX);
                return false;
            }
        } else if (kvg_admin_key_is(key, klen, "cache_salt")) {
            if (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE) {
                snprintf(msg, msg_len, "cache_salt: must be true or false");
                return false;
            }
            def->no_cache_salt = v->type == KVG_JSON_FALSE;
        } else if (kvg_admin_key_is(key, klen, "name")) {
            /* Accepted so a GET result can be sent back, but the path names the worker. */
            if (!kvg_admin_c_string(v, "name", msg, msg_len))
                return false;
            if (strcmp(v->u.str.ptr, name) != 0) {
                snprintf(msg, msg_len, "name: must match the name in the path");
                return false;
            }
        } else {
            snprintf(msg, msg_len, "unknown field \"%.64s\"", key);
            return false;
        }
    }
    if (!def->url) {
        snprintf(msg, msg_len, "url: required");
        return false;
    }
    return true;
}

void kvg_admin_worker_put(admin_ctx *c, const char *name)
{
    char msg[256];
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    const kvg_json *root = kvg_admin_parse_body(c, &arena, false);
    if (!root)
        goto out;
    kvg_worker_def def;
    const char *models[KVG_WORKER_MODELS_MAX];
    if (!parse_def(root, name, &def, models, msg, sizeof(msg))) {
        kvg_admin_fail(c, 400, "%s", msg);
        goto out;
    }

    /* Changes are serialised (change_lock), so nothing else defines it in between. */
    kvg_worker_set *before = kvg_registry_acquire(c->admin->reg);
    bool existed = kvg_worker_set_find(before, name) != NULL;
    kvg_worker_set_unref(before);

    int rc = kvg_registry_put(c->admin->reg, &def, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg));
    if (rc < 0) {
        kvg_admin_fail(c, rc == -ENOMEM ? 500 : rc == KVG_ELIMIT ? 409 : 400, "%s", msg);
        goto out;
    }
    if (!kvg_admin_commit(c))
        goto out;
    kvg_admin_detail(c, "%s url=%s", existed ? "replaced" : "created", def.url);
    respond_worker(c, name, existed ? 200 : 201);
out:
    kvg_arena_done(&arena);
}

void kvg_admin_worker_delete(admin_ctx *c, const char *name)
{
    int rc = kvg_registry_remove(c->admin->reg, name);
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_fail(c, 404, "worker \"%s\" not found", name);
        return;
    }
    if (rc < 0) {
        kvg_admin_fail(c, 500, "could not remove worker: %s", kvg_strerror(rc));
        return;
    }
    if (!kvg_admin_commit(c))
        return;
    kvg_admin_detail(c, "deleted");
    kvg_admin_json(c->resp, 204);
}

void kvg_admin_worker_drain(admin_ctx *c, const char *name)
{
    int rc = kvg_registry_drain(c->admin->reg, name);
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_fail(c, 404, "worker \"%s\" not found", name);
        return;
    }
    if (rc < 0) {
        kvg_admin_fail(c, 500, "could not drain worker: %s", kvg_strerror(rc));
        return;
    }
    if (!kvg_admin_commit(c))
        return;
    kvg_admin_detail(c, "draining");
    respond_worker(c, name, 200);
}
