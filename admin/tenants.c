/* SPDX-License-Identifier: Apache-2.0 */
/* /admin/v1/tenants routes: list, show, define (PUT) and remove tenants, create and delete their
 * API keys. A new key is shown once, in the creation answer; nothing else ever shows a key or
 * its digest. Every change is saved before the answer. */
#include "admin_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

/* Rates and bursts above this are typos, not limits. */
#define RATE_MAX 1e15

/* The shortest decimal that reads back as v (integers without a fraction). */
static void put_number(kvg_buf *b, double v)
{
    char s[40];
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        kvg_buf_printf(b, "%.0f", v);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(s, sizeof(s), "%.*g", prec, v);
        if (strtod(s, NULL) == v)
            break;
    }
    kvg_buf_puts(b, s);
}

static void put_str(kvg_buf *b, const char *s)
{
    kvg_buf_json_string(b, s, strlen(s));
}

static void put_tenant(kvg_buf *b, const kvg_tenant *t)
{
    kvg_buf_puts(b, "{\"id\":");
    put_str(b, kvg_tenant_id(t));
    kvg_buf_puts(b, ",\"sharing\":");
    put_str(b, kvg_sharing_str(kvg_tenant_sharing(t)));
    if (kvg_tenant_sharing(t) == KVG_SHARING_GROUP && kvg_tenant_group(t)) {
        kvg_buf_puts(b, ",\"group\":");
        put_str(b, kvg_tenant_group(t));
    }
    kvg_buf_puts(b, ",\"models\":[");
    for (size_t i = 0; i < kvg_tenant_model_count(t); i++) {
        if (i)
            kvg_buf_putc(b, ',');
        put_str(b, kvg_tenant_model(t, i));
    }
    const kvg_tenant_limits *lim = kvg_tenant_limits_of(t);
    kvg_buf_puts(b, "],\"rate\":{\"rps\":");
    put_number(b, lim->rps);
    kvg_buf_puts(b, ",\"burst\":");
    put_number(b, lim->burst);
    kvg_buf_puts(b, ",\"prompt_bytes_per_s\":");
    put_number(b, lim->prompt_bytes_per_s);
    kvg_buf_puts(b, ",\"prompt_bytes_burst\":");
    put_number(b, lim->prompt_bytes_burst);
    kvg_buf_printf(b, "},\"max_inflight\":%lu,\"keys\":[", (unsigned long)lim->max_inflight);
    for (size_t i = 0; i < kvg_tenant_key_count(t); i++) {
        const kvg_key_info *k = kvg_tenant_key(t, i);
        char ts[40];
        kvg_format_time(k->created_wall_ns, ts, sizeof(ts));
        if (i)
            kvg_buf_putc(b, ',');
        /* the id and the creation time only: never the digest */
        kvg_buf_puts(b, "{\"id\":");
        put_str(b, k->id);
        kvg_buf_printf(b, ",\"created\":\"%s\"}", ts);
    }
    kvg_buf_printf(b, "],\"inflight\":%lu}", (unsigned long)kvg_tenant_inflight(t));
}

/* status with the tenant as the store now has it; 404 if it is gone. */
static void respond_tenant(admin_ctx *c, const char *id, int status)
{
    kvg_tenant_set *set = kvg_tenants_acquire(c->admin->tenants);
    kvg_tenant *t = kvg_tenant_set_find(set, id);
    if (t) {
        kvg_admin_json(c->resp, status);
        put_tenant(&c->resp->body, t);
    } else {
        kvg_admin_fail(c, 404, "tenant \"%s\" not found", id);
    }
    kvg_tenant_set_unref(set);
}

void kvg_admin_tenants_list(admin_ctx *c)
{
    kvg_tenant_set *set = kvg_tenants_acquire(c->admin->tenants);
    kvg_admin_json(c->resp, 200);
    kvg_buf *b = &c->resp->body;
    kvg_buf_puts(b, "{\"tenants\":[");
    for (size_t i = 0; i < kvg_tenant_set_count(set) && !b->failed; i++) {
        if (i)
            kvg_buf_putc(b, ',');
        put_tenant(b, kvg_tenant_set_at(set, i));
    }
    kvg_buf_puts(b, "]}");
    kvg_tenant_set_unref(set);
}

void kvg_admin_tenant_get(admin_ctx *c, const char *id)
{
    respond_tenant(c, id, 200);
}

static bool get_rate(const kvg_json *v, double *out)
{
    if (v->type != KVG_JSON_NUMBER || !isfinite(v->u.num.value) || v->u.num.value < 0 ||
        v->u.num.value > RATE_MAX)
        return false;
    *out = v->u.num.value;
    return true;
}

static bool parse_rate(const kvg_json *v, kvg_tenant_limits *lim, char *msg, size_t msg_len)
{
    static const char *const names[] = {"rps", "burst", "prompt_bytes_per_s", "prompt_bytes_burst"};
    double *fields[] = {&lim->rps, &lim->burst, &lim->prompt_bytes_per_s, &lim->prompt_bytes_burst};
    if (v->type != KVG_JSON_OBJECT) {
        snprintf(msg, msg_len, "rate: must be an object");
        return false;
    }
    for (size_t i = 0; i < v->u.obj.count; i++) {
        size_t k = 0;
        while (k < KVG_ARRAY_LEN(names) &&
               !kvg_admin_key_is(v->u.obj.keys[i], v->u.obj.key_lens[i], names[k]))
            k++;
        if (k == KVG_ARRAY_LEN(names)) {
            snprintf(msg, msg_len, "unknown field \"rate.%.64s\"", v->u.obj.keys[i]);
            return false;
        }
        if (!get_rate(v->u.obj.values[i], fields[k])) {
            snprintf(msg, msg_len, "rate.%s: must be a number in 0..%g (0 = unlimited)", names[k],
                     RATE_MAX);
            return false;
        }
    }
    return true;
}

static bool parse_models(const kvg_json *v, const char **models, kvg_tenant_def *def, char *msg,
                         size_t msg_len)
{
    if (v->type != KVG_JSON_ARRAY) {
        snprintf(msg, msg_len, "models: must be an array of strings");
        return false;
    }
    if (v->u.arr.count > KVG_TENANT_MODELS_MAX) {
        snprintf(msg, msg_len, "models: more than %d models", KVG_TENANT_MODELS_MAX);
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
    return true;
}

/* Fill def from the body (omitted fields: the defaults); false with msg naming the field. */
static bool parse_def(const kvg_json *root, const char *id, kvg_tenant_def *def,
                      const char **models, char *msg, size_t msg_len)
{
    *def = (kvg_tenant_def){.id = id, .sharing = KVG_SHARING_ISOLATED};
    for (size_t i = 0; i < root->u.obj.count; i++) {
        const char *key = root->u.obj.keys[i];
        size_t klen = root->u.obj.key_lens[i];
        const kvg_json *v = root->u.obj.values[i];
        if (kvg_admin_key_is(key, klen, "sharing")) {
            if (!kvg_admin_c_string(v, "sharing", msg, msg_len))
                return false;
            if (kvg_sharing_parse(v->u.str.ptr, &def->sharing) < 0) {
                snprintf(msg, msg_len, "sharing: must be \"isolated\", \"group\" or \"global\"");
                return false;
            }
        } else if (kvg_admin_key_is(key, klen, "group")) {
            if (!kvg_admin_c_string(v, "group", msg, msg_len))
                return false;
            def->group = v->u.str.ptr;
        } else if (kvg_admin_key_is(key, klen, "models")) {
            if (!parse_models(v, models, def, msg, msg_len))
                return false;
        } else if (kvg_admin_key_is(key, klen, "rate")) {
            if (!parse_rate(v, &def->limits, msg, msg_len))
                return false;
        } else if (kvg_admin_key_is(key, klen, "max_inflight")) {
            if (!kvg_admin_get_u32(v, &def->limits.max_inflight)) {
                snprintf(msg, msg_len, "max_inflight: must be an integer in 0..%lu",
                         (unsigned long)UINT32_MAX);
                return false;
            }
        } else if (kvg_admin_key_is(key, klen, "id")) {
            /* Accepted so a GET result can be sent back, but the path names the tenant. */
            if (!kvg_admin_c_string(v, "id", msg, msg_len))
                return false;
            if (strcmp(v->u.str.ptr, id) != 0) {
                snprintf(msg, msg_len, "id: must match the id in the path");
                return false;
            }
        } else {
            snprintf(msg, msg_len, "unknown field \"%.64s\"", key);
            return false;
        }
    }
    if (def->sharing == KVG_SHARING_GROUP && !def->group) {
        snprintf(msg, msg_len, "group: required when sharing is \"group\"");
        return false;
    }
    if (def->sharing != KVG_SHARING_GROUP && def->group) {
        snprintf(msg, msg_len, "group: only allowed when sharing is \"group\"");
        return false;
    }
    if (def->group && kvg_tenant_id_validate(def->group, "group", msg, msg_len) < 0)
        return false;
    return kvg_tenant_def_validate(def, msg, msg_len) == 0;
}

void kvg_admin_tenant_put(admin_ctx *c, const char *id)
{
    char msg[256];
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    const kvg_json *root = kvg_admin_parse_body(c, &arena, false);
    if (!root)
        goto out;
    kvg_tenant_def def;
    const char *models[KVG_TENANT_MODELS_MAX];
    if (!parse_def(root, id, &def, models, msg, sizeof(msg))) {
        kvg_admin_fail(c, 400, "%s", msg);
        goto out;
    }
    bool created = false;
    int rc = kvg_tenants_put(c->admin->tenants, &def, &created, msg, sizeof(msg));
    if (rc < 0) {
        if (rc == -ENOMEM)
            kvg_admin_fail(c, 500, "out of memory");
        else
            kvg_admin_fail(c, rc == KVG_ELIMIT ? 409 : 400, "%s", msg);
        goto out;
    }
    if (!kvg_admin_commit(c))
        goto out;
    if (def.sharing == KVG_SHARING_GROUP)
        kvg_admin_detail(c, "%s sharing=group:%s", created ? "created" : "replaced", def.group);
    else
        kvg_admin_detail(c, "%s sharing=%s", created ? "created" : "replaced",
                         kvg_sharing_str(def.sharing));
    respond_tenant(c, id, created ? 201 : 200);
out:
    kvg_arena_done(&arena);
}

void kvg_admin_tenant_delete(admin_ctx *c, const char *id)
{
    int rc = kvg_tenants_remove(c->admin->tenants, id);
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_fail(c, 404, "tenant \"%s\" not found", id);
        return;
    }
    if (rc < 0) {
        kvg_admin_fail(c, 500, "could not remove tenant: %s", kvg_strerror(rc));
        return;
    }
    if (!kvg_admin_commit(c))
        return;
    kvg_admin_detail(c, "deleted");
    kvg_admin_json(c->resp, 204);
}

/* A key-creation body carries nothing (absent or {}); a field is a mistake worth naming. */
static bool empty_body(admin_ctx *c)
{
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    const kvg_json *root = kvg_admin_parse_body(c, &arena, true);
    bool ok = root && root->u.obj.count == 0;
    if (root && !ok)
        kvg_admin_fail(c, 400, "unknown field \"%.64s\"", root->u.obj.keys[0]);
    kvg_arena_done(&arena);
    return ok;
}

void kvg_admin_key_create(admin_ctx *c, const char *id)
{
    kvg_tenants *ts = c->admin->tenants;
    char key[KVG_KEY_LEN + 1], key_id[KVG_KEY_ID_LEN + 1];
    kvg_buf *b = &c->resp->body;
    if (!empty_body(c))
        return;
    /* Room for the whole answer before the key exists: once it does, writing the answer can
     * neither fail nor realloc (which would leave a copy of the key in freed memory). */
    if (kvg_buf_reserve(b, 64 + KVG_KEY_ID_LEN + KVG_KEY_LEN + 6 * KVG_TENANT_ID_MAX) < 0)
        return; /* kvg_admin_handle answers 500 */
    int rc = kvg_tenants_key_create(ts, id, key, key_id);
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_fail(c, 404, "tenant \"%s\" not found", id);
        return;
    }
    if (rc == KVG_ELIMIT) {
        kvg_admin_fail(c, 409, "tenant \"%s\" already has %d keys; delete one first", id,
                       KVG_TENANT_KEYS_MAX);
        return;
    }
    if (rc < 0) {
        kvg_admin_fail(c, 500, "could not create a key: %s", kvg_strerror(rc));
        return;
    }
    snprintf(c->target, sizeof(c->target), "%s/%s", id, key_id);

    /* A key that is not saved would stop working at the next restart, and its creator could
     * not know: take it back and say so rather than hand it out. */
    char why[256];
    rc = kvg_admin_save_state(c->admin, why, sizeof(why));
    if (rc < 0) {
        int undo = kvg_tenants_key_delete(ts, id, key_id);
        OPENSSL_cleanse(key, sizeof(key));
        kvg_log_error("admin: key.create %s/%s not saved (%s): %s", id, key_id,
                      undo == 0 ? "key withdrawn" : "could not withdraw the key", why);
        kvg_admin_fail(c, 500, "the key could not be saved, so it was %s: %s",
                       undo == 0 ? "not created" : "withdrawn from the answer", why);
        return;
    }

    kvg_admin_json(c->resp, 201);
    kvg_buf_puts(b, "{\"id\":");
    put_str(b, key_id);
    kvg_buf_puts(b, ",\"key\":");
    put_str(b, key);
    kvg_buf_puts(b, ",\"tenant\":");
    put_str(b, id);
    kvg_buf_putc(b, '}');
    OPENSSL_cleanse(key, sizeof(key));
    kvg_admin_detail(c, "created");
}

void kvg_admin_key_delete(admin_ctx *c, const char *id, const char *key_id)
{
    int rc = kvg_tenants_key_delete(c->admin->tenants, id, key_id);
    if (rc == KVG_ENOTFOUND) {
        kvg_tenant_set *set = kvg_tenants_acquire(c->admin->tenants);
        bool tenant = kvg_tenant_set_find(set, id) != NULL;
        kvg_tenant_set_unref(set);
        if (tenant)
            kvg_admin_fail(c, 404, "key \"%s\" of tenant \"%s\" not found", key_id, id);
        else
            kvg_admin_fail(c, 404, "tenant \"%s\" not found", id);
        return;
    }
    if (rc < 0) {
        kvg_admin_fail(c, 500, "could not delete the key: %s", kvg_strerror(rc));
        return;
    }
    if (!kvg_admin_commit(c))
        return;
    kvg_admin_detail(c, "deleted");
    kvg_admin_json(c->resp, 204);
}
