/* SPDX-License-Identifier: Apache-2.0 */
/* /admin/v1/models routes: list, show, define (PUT) and remove token-exact models; a PUT loads
 * the model's files before it answers, and every change is saved before the answer. */
#include "admin_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *const source_names[] = {"config", "admin"};
_Static_assert(KVG_ARRAY_LEN(source_names) == KVG_MODEL_SOURCE_COUNT, "a source has its name");

/* A definition through the model's field table, then what is read-only: where it came from,
 * whether it is loaded (an admin definition restored while its files were missing is not:
 * docs/admin-api.md) and whether chat requests are token-exact (the model has a template). */
static void put_model(kvg_buf *b, const kvg_model_def *def, kvg_model_source src, bool loaded,
                      bool chat)
{
    bool first = true;
    kvg_buf_putc(b, '{');
    kvg_fields_encode_members(&kvg_model_fields, def, KVG_SET_ADMIN, &first, b);
    kvg_buf_printf(b, ",\"source\":\"%s\",\"loaded\":%s,\"chat\":%s}", source_names[src],
                   loaded ? "true" : "false", chat ? "true" : "false");
}

static void put_loaded(kvg_buf *b, const kvg_model *m, kvg_model_source src)
{
    kvg_model_def def;
    kvg_model_get_def(m, &def);
    put_model(b, &def, src, true, kvg_model_has_template(m));
}

/* The admin definitions that are not in the snapshot as the admin's (kept while their files
 * are missing), each through fn; name NULL for all of them. The definitions borrow from a tree
 * in c->arena. Returns how many were found (-ENOMEM when out of memory). */
static int each_unloaded(admin_ctx *c, const kvg_model_set *set, const char *name,
                         void (*fn)(admin_ctx *c, const kvg_model_def *def))
{
    kvg_buf text;
    kvg_buf_init(&text);
    kvg_model_registry_admin_to_json(c->admin->models, &text);
    kvg_json *arr = NULL;
    int rc =
        text.failed ? -ENOMEM : kvg_json_parse(text.data, text.len, &c->arena, NULL, &arr, NULL);
    if (rc < 0 || arr->type != KVG_JSON_ARRAY) {
        kvg_buf_done(&text);
        return -ENOMEM; /* what the registry wrote, it reads: only memory fails here */
    }
    int found = 0;
    kvg_fields_ctx fc = {.from = KVG_SET_STATE, .arena = &c->arena, .copy_strings = true};
    for (size_t i = 0; i < arr->u.arr.count; i++) {
        kvg_model_def def;
        kvg_fields_defaults(&kvg_model_fields, &def);
        if (kvg_fields_decode(&kvg_model_fields, &def, arr->u.arr.items[i], "", &fc) < 0)
            continue;
        if (name && strcmp(def.name, name) != 0)
            continue;
        const kvg_model *m = kvg_model_set_find(set, def.name, strlen(def.name));
        kvg_model_source src = KVG_MODEL_SOURCE_CONFIG;
        for (size_t k = 0; m && k < kvg_model_set_count(set); k++)
            if (kvg_model_set_at(set, k, &src) == m)
                break;
        if (m && src == KVG_MODEL_SOURCE_ADMIN)
            continue; /* loaded */
        fn(c, &def);
        found++;
    }
    kvg_buf_done(&text);
    return found;
}

/* An item of the list: a comma before all but the first. */
static void list_sep(kvg_buf *b)
{
    if (b->len && b->data[b->len - 1] != '[')
        kvg_buf_putc(b, ',');
}

static void list_unloaded(admin_ctx *c, const kvg_model_def *def)
{
    list_sep(&c->resp->body);
    put_model(&c->resp->body, def, KVG_MODEL_SOURCE_ADMIN, false, false);
}

static void show_unloaded(admin_ctx *c, const kvg_model_def *def)
{
    put_model(&c->resp->body, def, KVG_MODEL_SOURCE_ADMIN, false, false);
}

void kvg_admin_models_list(admin_ctx *c)
{
    kvg_model_set *set = kvg_model_registry_acquire(c->admin->models);
    kvg_admin_json(c->resp, 200);
    kvg_buf *b = &c->resp->body;
    kvg_buf_puts(b, "{\"models\":[");
    for (size_t i = 0; i < kvg_model_set_count(set); i++) {
        kvg_model_source src;
        const kvg_model *m = kvg_model_set_at(set, i, &src);
        list_sep(b);
        put_loaded(b, m, src);
    }
    if (each_unloaded(c, set, NULL, list_unloaded) < 0)
        b->failed = true;
    kvg_buf_puts(b, "]}");
    kvg_model_set_unref(set);
}

/* status with the model of the path as the registry now has it; 404 when it has none. */
static void respond_model(admin_ctx *c, int status)
{
    kvg_model_set *set = kvg_model_registry_acquire(c->admin->models);
    const kvg_model *m = kvg_model_set_find(set, c->model, strlen(c->model));
    if (m) {
        kvg_model_source src = KVG_MODEL_SOURCE_CONFIG;
        for (size_t k = 0; k < kvg_model_set_count(set); k++)
            if (kvg_model_set_at(set, k, &src) == m)
                break;
        kvg_admin_json(c->resp, status);
        put_loaded(&c->resp->body, m, src);
    } else {
        kvg_admin_json(c->resp, status);
        int n = each_unloaded(c, set, c->model, show_unloaded);
        if (n < 0)
            kvg_admin_fail(c, 500, "out of memory");
        else if (n == 0)
            kvg_admin_fail(c, 404, "model \"%s\" not found", c->model);
    }
    kvg_model_set_unref(set);
}

void kvg_admin_model_get(admin_ctx *c)
{
    respond_model(c, 200);
}

void kvg_admin_model_put(admin_ctx *c)
{
    char msg[640];
    kvg_model_def def;
    kvg_fields_defaults(&kvg_model_fields, &def);
    def.name = c->model;
    if (!kvg_admin_decode(c, &kvg_model_fields, &def))
        return;
    /* A name is accepted so that a GET result can be sent back, but the path names the model. */
    if (strcmp(def.name, c->model) != 0) {
        kvg_admin_fail(c, 400, "name: must match the name in the path");
        return;
    }
    kvg_model_set *before = kvg_model_registry_acquire(c->admin->models);
    bool existed = kvg_model_set_find(before, c->model, strlen(c->model)) != NULL;
    kvg_model_set_unref(before);

    /* The files are read here, on the admin API's thread (the control thread), never on a
     * request thread: a tokenizer.json of ~10 MB takes ~100 ms. A file that does not load is
     * the client's to fix: 400 naming the field and the file, and nothing changes. */
    int rc =
        kvg_model_registry_put(c->admin->models, &def, KVG_MODEL_SOURCE_ADMIN, msg, sizeof(msg));
    if (rc < 0 && rc != -ENOMEM && rc != KVG_ELIMIT)
        rc = KVG_EPARSE;
    if (!kvg_admin_applied(c, rc, msg))
        return;
    kvg_admin_detail(c, "%s tokenizer=%s", existed ? "replaced" : "created", def.tokenizer);
    respond_model(c, existed ? 200 : 201);
}

void kvg_admin_model_delete(admin_ctx *c)
{
    int rc = kvg_model_registry_remove(c->admin->models, c->model);
    if (rc == KVG_ENOTFOUND) {
        kvg_admin_fail(c, 404, "model \"%s\" not found", c->model);
        return;
    }
    if (kvg_admin_changed(c, rc, "model", "remove", "deleted"))
        kvg_admin_json(c->resp, 204);
}
