/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers of the body scanner's unit tests (body_helpers.h). */
#include "body_helpers.h"

#include <stdio.h>
#include <string.h>

void run(result *r, const char *body, size_t len, const char *salt)
{
    kvg_arena_init(&r->arena, 0);
    kvg_buf_init(&r->out);
    memset(&r->info, 0xAB, sizeof(r->info));
    memset(&r->err, 0, sizeof(r->err));
    r->rc = kvg_body_rewrite(body, len, salt, &r->arena, &r->out, &r->info, &r->err);
}

void done(result *r)
{
    kvg_buf_done(&r->out);
    kvg_arena_done(&r->arena);
}

/* The tree of text, serialised compactly (member order and duplicates kept). */
static void canonical(const char *text, size_t len, kvg_buf *b)
{
    kvg_arena a;
    kvg_json *v;
    kvg_json_error err;
    kvg_arena_init(&a, 0);
    int rc = kvg_json_parse(text, len, &a, NULL, &v, &err);
    if (rc != 0)
        fail_msg("output does not parse: %s at %zu: %.*s", err.message, err.offset, (int)len, text);
    kvg_json_write(b, v);
    kvg_arena_done(&a);
}

/* What the output must mean: the input's tree without its top-level cache_salt members, plus
 * the salt as the last member. */
static void expected_tree(const char *text, size_t len, const char *salt, kvg_buf *b,
                          unsigned *removed)
{
    kvg_arena a;
    kvg_json *v;
    kvg_arena_init(&a, 0);
    assert_int_equal(kvg_json_parse(text, len, &a, NULL, &v, NULL), 0);
    assert_int_equal(v->type, KVG_JSON_OBJECT);
    size_t n = v->u.obj.count, k = 0;
    char **keys = kvg_arena_alloc(&a, (n + 1) * sizeof(char *));
    size_t *lens = kvg_arena_alloc(&a, (n + 1) * sizeof(size_t));
    kvg_json **vals = kvg_arena_alloc(&a, (n + 1) * sizeof(kvg_json *));
    assert_true(keys && lens && vals);
    *removed = 0;
    for (size_t i = 0; i < n; i++) {
        if (v->u.obj.key_lens[i] == 10 && memcmp(v->u.obj.keys[i], "cache_salt", 10) == 0) {
            (*removed)++;
            continue;
        }
        keys[k] = v->u.obj.keys[i];
        lens[k] = v->u.obj.key_lens[i];
        vals[k++] = v->u.obj.values[i];
    }
    kvg_json salt_v = {.type = KVG_JSON_STRING};
    if (salt) {
        salt_v.u.str.ptr = (char *)salt;
        salt_v.u.str.len = strlen(salt);
        keys[k] = "cache_salt";
        lens[k] = 10;
        vals[k++] = &salt_v;
    }
    v->u.obj.keys = keys;
    v->u.obj.key_lens = lens;
    v->u.obj.values = vals;
    v->u.obj.count = k;
    kvg_json_write(b, v);
    kvg_arena_done(&a);
}

/* Rewrite an accepted body and check the output's meaning, the removal count, and that
 * rewriting the output again changes nothing but the salt. */
void check_semantics(const char *body, size_t len, const char *salt)
{
    result r;
    run(&r, body, len, salt);
    if (r.rc != 0)
        fail_msg("rejected (%d: %s at %zu): %.*s", r.rc, r.err.message, r.err.offset, (int)len,
                 body);
    kvg_buf got, want;
    unsigned removed;
    kvg_buf_init(&got);
    kvg_buf_init(&want);
    canonical(r.out.data, r.out.len, &got);
    expected_tree(body, len, salt, &want, &removed);
    if (strcmp(got.data, want.data) != 0)
        fail_msg("body %.*s\n got  %s\n want %s", (int)len, body, got.data, want.data);
    assert_int_equal(r.info.cache_salts_removed, removed);

    /* Idempotence: the output rewritten with the same salt is the same bytes. */
    result again;
    run(&again, r.out.data, r.out.len, salt);
    assert_int_equal(again.rc, 0);
    assert_int_equal(again.info.cache_salts_removed, salt ? 1 : 0);
    if (again.out.len != r.out.len || memcmp(again.out.data, r.out.data, r.out.len) != 0)
        fail_msg("not idempotent: %s\n -> %s", r.out.data, again.out.data);
    done(&again);
    kvg_buf_done(&got);
    kvg_buf_done(&want);
    done(&r);
}

/* Replace "%" in pattern by the JSON string of SALT. */
void expand(const char *pattern, char *buf, size_t len)
{
    const char *pct = strchr(pattern, '%');
    if (!pct)
        snprintf(buf, len, "%s", pattern);
    else
        snprintf(buf, len, "%.*s\"%s\"%s", (int)(pct - pattern), pattern, SALT, pct + 1);
}

int scan(result *r, const char *body, kvg_body_api api)
{
    kvg_arena_init(&r->arena, 0);
    kvg_buf_init(&r->out);
    memset(&r->info, 0xAB, sizeof(r->info));
    memset(&r->err, 0, sizeof(r->err));
    r->rc = kvg_body_scan(body, strlen(body), api, SALT, &r->arena, &r->out, &r->info, &r->err);
    return r->rc;
}
