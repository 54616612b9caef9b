/* SPDX-License-Identifier: Apache-2.0 */
/* /admin/v1/workers routes: list, show, define (PUT), remove and drain workers, with strict
 * validation of the JSON body and one audit log line per change. */
#include "admin_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define BODY_DEPTH_MAX 16
#define BODY_ARENA_MAX (16u * 1024 * 1024)

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
        "],\"kv_blocks\":%lu,\"max_inflight\":%lu,\"source\":\"%s\",\"health\":\"%s\","
        "\"draining\":%s,\"inflight\":%lu}",
        (unsigned long)kvg_worker_kv_blocks(w), (unsigned long)kvg_worker_max_inflight(w),
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
        kvg_admin_error(c->resp, 404, "worker \"%s\" not found", name);
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

/* A JSON string usable as a C string; writes the complaint about field otherwise. */
static bool c_string(const kvg_json *v, const char *field, char *msg, size_t msg_len)
{
    if (v->type != KVG_JSON_STRING) {
        snprintf(msg, msg_len, "%s: must be a string", field);
        return false;
    }
    if (strlen(v->u.str.ptr) != v->u.str.len) {
        snprintf(msg, msg_len, "%s: must not contain NUL characters", field);
        return false;
    }
    return true;
}

static bool get_u32(const kvg_json *v, uint32_t *out)
{
    if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0 ||
        v->u.num.ival > (int64_t)UINT32_MAX)
        return false;
    *out = (uint32_t)v->u.num.ival;
    return true;
}

/* Fill def from the body; on error writes the message naming the field and returns false. */
static bool parse_def(const kvg_json *root, const char *name, kvg_worker_def *def,
                      const char **models, char *msg, size_t msg_len)
{
    if (root->type != KVG_JSON_OBJECT) {
        snprintf(msg, msg_len, "body: must be a JSON object");
        return false;
    }
    *def = (kvg_worker_def){.name = name};
    for (size_t i = 0; i < root->u.obj.count; i++) {
        const char *key = root->u.obj.keys[i];
        const kvg_json *v = root->u.obj.values[i];
        if (strcmp(key, "url") == 0 && root->u.obj.key_lens[i] == 3) {
            if (!c_string(v, "url", msg, msg_len))
                return false;
            def->url = v->u.str.ptr;
        } else if (strcmp(key, "models") == 0 && root->u.obj.key_lens[i] == 6) {
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
                if (!c_string(v->u.arr.items[k], field, msg, msg_len))
                    return false;
                models[k] = v->u.arr.items[k]->u.str.ptr;
            }
            def->models = models;
            def->nmodels = v->u.arr.count;
        } else if (strcmp(key, "kv_blocks") == 0 && root->u.obj.key_lens[i] == 9) {
            if (!get_u32(v, &def->kv_blocks)) {
                snprintf(msg, msg_len, "kv_blocks: must be an integer in 0..%lu",
                         (unsigned long)UINT32_MAX);
                return false;
            }
        } else if (strcmp(key, "max_inflight") == 0 && root->u.obj.key_lens[i] == 12) {
            if (!get_u32(v, &def->max_inflight)) {
                snprintf(msg, msg_len, "max_inflight: must be an integer in 0..%lu",
                         (unsigned long)UINT32_MAX);
                return false;
            }
        } else if (strcmp(key, "name") == 0 && root->u.obj.key_lens[i] == 4) {
            /* Accepted so a GET result can be sent back, but the path names the worker. */
            if (!c_string(v, "name", msg, msg_len))
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

static void audit_rejected(admin_ctx *c, const char *action, const char *name, int status,
                           const char *why)
{
    char safe[160];
    kvg_log_info("admin: remote=%s %s worker %s rejected (%d): %s", c->remote, action, name, status,
                 kvg_admin_log_safe(why, safe, sizeof(safe)));
}

void kvg_admin_worker_put(admin_ctx *c, const char *name)
{
    const kvg_admin_request *req = c->req;
    char msg[256];
    int status = 400;
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    arena.limit = BODY_ARENA_MAX;

    kvg_json *root;
    kvg_json_error jerr = {0};
    kvg_json_limits lim = {.max_depth = BODY_DEPTH_MAX, .reject_duplicate_keys = true};
    const char *body = req->body ? req->body : "";
    int rc = kvg_json_parse(body, req->body_len, &arena, &lim, &root, &jerr);
    if (rc == -ENOMEM) {
        status = 500;
        snprintf(msg, sizeof(msg), "out of memory parsing the body");
        goto reject;
    }
    if (rc < 0) {
        if (req->body_len == 0)
            snprintf(msg, sizeof(msg), "body: must be a JSON object");
        else
            snprintf(msg, sizeof(msg), "body: invalid JSON at byte %zu: %s", jerr.offset,
                     jerr.message);
        goto reject;
    }
    kvg_worker_def def;
    const char *models[KVG_WORKER_MODELS_MAX];
    if (!parse_def(root, name, &def, models, msg, sizeof(msg)))
        goto reject;

    kvg_worker_set *before = kvg_registry_acquire(c->admin->reg);
    bool existed = kvg_worker_set_find(before, name) != NULL;
    kvg_worker_set_unref(before);

    rc = kvg_registry_put(c->admin->reg, &def, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg));
    if (rc < 0) {
        status = rc == -ENOMEM ? 500 : rc == KVG_ELIMIT ? 409 : 400;
        goto reject;
    }
    kvg_log_info("admin: remote=%s put worker %s url=%s models=%zu kv_blocks=%lu "
                 "max_inflight=%lu (%s)",
                 c->remote, name, def.url, def.nmodels, (unsigned long)def.kv_blocks,
                 (unsigned long)def.max_inflight, existed ? "updated" : "created");
    respond_worker(c, name, existed ? 200 : 201);
    kvg_arena_done(&arena);
    return;

reject:
    audit_rejected(c, "put", name, status, msg);
    kvg_admin_error(c->resp, status, "%s", msg);
    kvg_arena_done(&arena);
}

void kvg_admin_worker_delete(admin_ctx *c, const char *name)
{
    int rc = kvg_registry_remove(c->admin->reg, name);
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_error(c->resp, 404, "worker \"%s\" not found", name);
        return;
    }
    if (rc < 0) {
        audit_rejected(c, "delete", name, 500, kvg_strerror(rc));
        kvg_admin_error(c->resp, 500, "could not remove worker: %s", kvg_strerror(rc));
        return;
    }
    kvg_log_info("admin: remote=%s delete worker %s", c->remote, name);
    kvg_admin_json(c->resp, 204);
}

void kvg_admin_worker_drain(admin_ctx *c, const char *name)
{
    int rc = kvg_registry_drain(c->admin->reg, name);
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_error(c->resp, 404, "worker \"%s\" not found", name);
        return;
    }
    if (rc < 0) {
        audit_rejected(c, "drain", name, 500, kvg_strerror(rc));
        kvg_admin_error(c->resp, 500, "could not drain worker: %s", kvg_strerror(rc));
        return;
    }
    kvg_log_info("admin: remote=%s drain worker %s", c->remote, name);
    respond_worker(c, name, 200);
}
