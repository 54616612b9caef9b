/* SPDX-License-Identifier: Apache-2.0 */
/* /admin/v1/tenants routes: list, show, define (PUT) and remove tenants, create and delete their
 * API keys. A new key is shown once, in the creation answer; nothing else ever shows a key or
 * its digest. Every change is saved before the answer. */
#include "admin_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

static void put_str(kvg_buf *b, const char *s)
{
    kvg_buf_json_string(b, s, strlen(s));
}

static void put_tenant(kvg_buf *b, const kvg_tenant *t)
{
    /* The definition through the tenant's field table, then what is read-only: the keys (their
     * ids and creation times only, never a digest) and the requests in flight. */
    const char *models[KVG_TENANT_MODELS_MAX];
    size_t n = KVG_MIN(kvg_tenant_model_count(t), (size_t)KVG_TENANT_MODELS_MAX);
    for (size_t i = 0; i < n; i++)
        models[i] = kvg_tenant_model(t, i);
    kvg_tenant_def def = {
        .id = kvg_tenant_id(t),
        .sharing = kvg_tenant_sharing(t),
        .group = kvg_tenant_sharing(t) == KVG_SHARING_GROUP ? kvg_tenant_group(t) : NULL,
        .models = models,
        .nmodels = n,
        .limits = *kvg_tenant_limits_of(t),
    };
    bool first = true;
    kvg_buf_putc(b, '{');
    kvg_fields_encode_members(&kvg_tenant_fields, &def, KVG_SET_ADMIN, &first, b);
    kvg_buf_puts(b, ",\"keys\":[");
    for (size_t i = 0; i < kvg_tenant_key_count(t); i++) {
        const kvg_key_info *k = kvg_tenant_key(t, i);
        char ts[40];
        kvg_format_time(k->created_wall_ns, ts, sizeof(ts));
        if (i)
            kvg_buf_putc(b, ',');
        kvg_buf_puts(b, "{\"id\":");
        put_str(b, k->id);
        kvg_buf_printf(b, ",\"created\":\"%s\"}", ts);
    }
    kvg_buf_printf(b, "],\"inflight\":%lu}", (unsigned long)kvg_tenant_inflight(t));
}

/* status with the tenant of the path as the store now has it; 404 if it is gone. */
static void respond_tenant(admin_ctx *c, int status)
{
    const char *id = c->name;
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

void kvg_admin_tenant_get(admin_ctx *c)
{
    respond_tenant(c, 200);
}

/* Fill def from the body through the tenant's field table (omitted fields: the defaults) and
 * check it; on error answers 400 (500 when out of memory) and returns false. */
static bool parse_def(admin_ctx *c, kvg_tenant_def *def)
{
    char msg[256];
    kvg_fields_defaults(&kvg_tenant_fields, def);
    def->id = c->name;
    if (!kvg_admin_decode(c, &kvg_tenant_fields, def))
        return false;
    /* An id is accepted so a GET result can be sent back, but the path names the tenant. */
    if (strcmp(def->id, c->name) != 0) {
        kvg_admin_fail(c, 400, "id: must match the id in the path");
        return false;
    }
    if (kvg_tenant_def_validate(def, msg, sizeof(msg)) < 0) {
        kvg_admin_fail(c, 400, "%s", msg);
        return false;
    }
    return true;
}

void kvg_admin_tenant_put(admin_ctx *c)
{
    char msg[256];
    kvg_tenant_def def;
    if (!parse_def(c, &def))
        return;
    bool created = false;
    int rc = kvg_tenants_put(c->admin->tenants, &def, &created, msg, sizeof(msg));
    if (!kvg_admin_applied(c, rc, msg))
        return;
    if (def.sharing == KVG_SHARING_GROUP)
        kvg_admin_detail(c, "%s sharing=group:%s", created ? "created" : "replaced", def.group);
    else
        kvg_admin_detail(c, "%s sharing=%s", created ? "created" : "replaced",
                         kvg_sharing_str(def.sharing));
    respond_tenant(c, created ? 201 : 200);
}

void kvg_admin_tenant_delete(admin_ctx *c)
{
    if (kvg_admin_changed(c, kvg_tenants_remove(c->admin->tenants, c->name), "tenant", "remove",
                          "deleted"))
        kvg_admin_json(c->resp, 204);
}

void kvg_admin_key_create(admin_ctx *c)
{
    kvg_tenants *ts = c->admin->tenants;
    const char *id = c->name;
    char key[KVG_KEY_LEN + 1], key_id[KVG_KEY_ID_LEN + 1];
    kvg_buf *b = &c->resp->body;
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
    char why[320];
    bool undone;
    rc = kvg_admin_store(c->admin, &undone, why, sizeof(why));
    if (rc == -EAGAIN) {
        /* Another replica changed the shared state first; this key is gone with the state it
         * was made on, and kvg_admin_handle makes a new one on top of the newer state. */
        OPENSSL_cleanse(key, sizeof(key));
        c->again = true;
        return;
    }
    if (rc < 0 && undone) {
        OPENSSL_cleanse(key, sizeof(key));
        kvg_log_error("admin: key.create %s/%s not applied: %s", id, key_id, why);
        kvg_admin_fail(c, 503, "the key was not created: %s", why);
        return;
    }
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

void kvg_admin_key_delete(admin_ctx *c)
{
    const char *id = c->name, *key_id = c->key_id;
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
    if (kvg_admin_changed(c, rc, "key", "delete", "deleted"))
        kvg_admin_json(c->resp, 204);
}
