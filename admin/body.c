/* SPDX-License-Identifier: Apache-2.0 */
/* Request bodies of the admin API: strict JSON parsing, and decoding through the resources'
 * field tables. */
#include "admin_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const kvg_json *kvg_admin_parse_body(admin_ctx *c, bool empty_ok)
{
    kvg_arena *arena = &c->arena;
    const kvg_admin_request *req = c->req;
    static const kvg_json empty = {.type = KVG_JSON_OBJECT};
    if (req->body_len == 0) {
        if (empty_ok)
            return &empty;
        kvg_admin_fail(c, 400, "body: must be a JSON object");
        return NULL;
    }
    kvg_json *root;
    kvg_json_error jerr = {0};
    kvg_json_limits lim = {.max_depth = ADMIN_BODY_DEPTH_MAX, .reject_duplicate_keys = true};
    arena->limit = ADMIN_BODY_ARENA_MAX;
    int rc = kvg_json_parse(req->body, req->body_len, arena, &lim, &root, &jerr);
    if (rc == -ENOMEM && arena->over_limit) {
        /* Legal JSON under the size limit can still hold too many values to parse here. */
        kvg_admin_fail(c, 413, "body: too many JSON values (more than %u MiB parsed)",
                       ADMIN_BODY_ARENA_MAX >> 20);
        return NULL;
    }
    if (rc == -ENOMEM) {
        kvg_admin_fail(c, 500, "out of memory parsing the body");
        return NULL;
    }
    if (rc < 0) {
        kvg_admin_fail(c, 400, "body: invalid JSON at byte %zu: %s", jerr.offset, jerr.message);
        return NULL;
    }
    if (root->type != KVG_JSON_OBJECT) {
        kvg_admin_fail(c, 400, "body: must be a JSON object");
        return NULL;
    }
    return root;
}

bool kvg_admin_decode(admin_ctx *c, const kvg_fields *table, void *target)
{
    char msg[256];
    kvg_fields_ctx fc = {
        .from = KVG_SET_ADMIN, .arena = &c->arena, .msg = msg, .msg_len = sizeof(msg)};
    int rc = kvg_fields_decode(table, target, c->body, "", &fc);
    if (rc == -ENOMEM)
        kvg_admin_fail(c, 500, "out of memory");
    else if (rc < 0)
        kvg_admin_fail(c, 400, "%s", msg);
    return rc == 0;
}

bool kvg_admin_c_string(const kvg_json *v, const char *field, char *msg, size_t msg_len)
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

bool kvg_admin_key_is(const char *key, size_t len, const char *lit)
{
    /* len guards against "url\u0000..." passing a plain strcmp */
    return len == strlen(lit) && memcmp(key, lit, len) == 0;
}
