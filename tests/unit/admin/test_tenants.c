/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for /admin/v1/tenants and their keys (admin/tenants.c): defining, listing and
 * removing tenants, the bodies refused, creating and deleting keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "admin_helpers.h"

/* ---- tenants ------------------------------------------------------------------------------ */

static void test_tenants_crud(void **state)
{
    fixture *f = *state;
    reply r = call(f, "GET", "/admin/v1/tenants", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"tenants\":[]}");
    assert_string_equal(r.cache_control, "no-store");

    /* everything omitted: isolated, all models, unlimited */
    r = call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{}");
    assert_int_equal(r.status, 201);
    assert_string_equal(r.cache_control, "no-store");
    assert_string_equal(r.body, "{\"id\":\"acme\",\"sharing\":\"isolated\",\"models\":[],\"rate\":"
                                "{\"rps\":0,\"burst\":0,\"prompt_bytes_per_s\":0,"
                                "\"prompt_bytes_burst\":0},\"max_inflight\":0,\"keys\":[],"
                                "\"inflight\":0}");

    /* every field */
    r = call(f, "PUT", "/admin/v1/tenants/team-b.1", AUTH,
             "{\"sharing\": \"group\", \"group\": \"research\", \"models\": [\"llama\", \"qwen\"],"
             " \"rate\": {\"rps\": 50, \"burst\": 100, \"prompt_bytes_per_s\": 1048576.5,"
             " \"prompt_bytes_burst\": 4194304}, \"max_inflight\": 64}");
    assert_int_equal(r.status, 201);
    assert_string_equal(r.body,
                        "{\"id\":\"team-b.1\",\"sharing\":\"group\",\"group\":\"research\","
                        "\"models\":[\"llama\",\"qwen\"],\"rate\":{\"rps\":50,\"burst\":100,"
                        "\"prompt_bytes_per_s\":1048576.5,\"prompt_bytes_burst\":4194304},"
                        "\"max_inflight\":64,\"keys\":[],\"inflight\":0}");

    /* PUT replaces the whole definition (omitted = default), keeps keys; 200 */
    assert_int_equal(call(f, "POST", "/admin/v1/tenants/team-b.1/keys", AUTH, NULL).status, 201);
    r = call(f, "PUT", "/admin/v1/tenants/team-b.1", AUTH,
             "{\"sharing\":\"global\",\"rate\":{\"rps\":0.25},\"id\":\"team-b.1\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "sharing"), "global");
    assert_null(kvg_json_get(r.json, "group"));
    assert_int_equal(field(r.json, "models")->u.arr.count, 0);
    assert_true(field(r.json, "rate.rps")->u.num.value == 0.25);
    assert_int_equal(int_field(&r, "max_inflight"), 0);
    assert_int_equal(field(r.json, "keys")->u.arr.count, 1);
    /* the same again is still a 200 */
    r = call(f, "PUT", "/admin/v1/tenants/team-b.1", AUTH,
             "{\"sharing\":\"global\",\"rate\":{\"rps\":0.25}}");
    assert_int_equal(r.status, 200);

    r = call(f, "GET", "/admin/v1/tenants", AUTH, NULL);
    assert_int_equal(r.status, 200);
    const kvg_json *list = kvg_json_get(r.json, "tenants");
    assert_int_equal(list->u.arr.count, 2);
    assert_string_equal(kvg_json_get(list->u.arr.items[0], "id")->u.str.ptr, "acme");
    assert_string_equal(kvg_json_get(list->u.arr.items[1], "id")->u.str.ptr, "team-b.1");

    r = call(f, "GET", "/admin/v1/tenants/acme?x=1", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "sharing"), "isolated");
    assert_string_equal(r.cache_control, "no-store");
    r = call(f, "GET", "/admin/v1/tenants/nope", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "tenant \"nope\" not found");
    assert_string_equal(r.cache_control, "no-store");

    /* the in-flight count is live */
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    kvg_tenant *t = kvg_tenant_set_find(set, "acme");
    unsigned retry;
    assert_int_equal(kvg_tenant_admit(t, kvg_now_ns(), 10, &retry), KVG_ADMIT_OK);
    r = call(f, "GET", "/admin/v1/tenants/acme", AUTH, NULL);
    assert_int_equal(int_field(&r, "inflight"), 1);
    kvg_tenant_release(t);
    kvg_tenant_set_unref(set);

    /* the change is visible to the data path at once */
    set = kvg_tenants_acquire(f->tenants);
    t = kvg_tenant_set_find(set, "team-b.1");
    assert_non_null(t);
    assert_int_equal(kvg_tenant_sharing(t), KVG_SHARING_GLOBAL);
    kvg_tenant_set_unref(set);

    r = call(f, "DELETE", "/admin/v1/tenants/acme", AUTH, NULL);
    assert_int_equal(r.status, 204);
    assert_int_equal(r.len, 0);
    assert_string_equal(r.cache_control, "no-store");
    r = call(f, "DELETE", "/admin/v1/tenants/acme", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "tenant \"acme\" not found");
    r = call(f, "GET", "/admin/v1/tenants/acme", AUTH, NULL);
    assert_int_equal(r.status, 404);

    /* authentication as everywhere else */
    r = call(f, "PUT", "/admin/v1/tenants/x", NULL, "{}");
    assert_error(&r, 401, "authentication_error", "missing Authorization header");
    r = call(f, "POST", "/admin/v1/tenants/team-b.1/keys", "Bearer tok-x", NULL);
    assert_error(&r, 401, "authentication_error", "invalid admin token");
    assert_null(strstr(r.body, "kvg-"));
    r = call(f, "GET", "/admin/v1/tenants", "Bearer tok-x", NULL);
    assert_int_equal(r.status, 401);
    r = call(f, "GET", "/admin/v1/policy", NULL, NULL);
    assert_int_equal(r.status, 401);
}

static void test_tenant_validation(void **state)
{
    fixture *f = *state;
    static const body_case cases[] = {
        {"", "body: must be a JSON object"},
        {"[]", "body: must be a JSON object"},
        {"{", "body: invalid JSON at byte 1"},
        {"{\"sharing\":\"global\",\"sharing\":\"global\"}", "body: invalid JSON at byte"},
        {"{\"sharing\":1}", "sharing: must be a string"},
        {"{\"sharing\":null}", "sharing: must be a string"},
        {"{\"sharing\":\"shared\"}", "sharing: must be isolated, group or global"},
        {"{\"sharing\":\"group\"}", "group: required when sharing is \"group\""},
        {"{\"group\":\"g\"}", "group: only allowed when sharing is \"group\""},
        {"{\"sharing\":\"global\",\"group\":\"g\"}", "group: only allowed"},
        {"{\"sharing\":\"group\",\"group\":7}", "group: must be a string"},
        {"{\"sharing\":\"group\",\"group\":\"a b\"}", "group: "},
        {"{\"sharing\":\"group\",\"group\":\"\"}", "group: "},
        {"{\"models\":\"m\"}", "models: must be an array of strings"},
        {"{\"models\":[1]}", "models[0]: must be a string"},
        {"{\"models\":[\"a\",\"b\\u0000\"]}", "models[1]: must not contain NUL characters"},
        {"{\"models\":[\"a\",\"a\"]}", "models[1]: "},
        {"{\"rate\":5}", "rate: must be an object"},
        {"{\"rate\":null}", "rate: must be an object"},
        {"{\"rate\":{\"rps\":-1}}", "rate.rps: must be a number"},
        {"{\"rate\":{\"rps\":\"5\"}}", "rate.rps: must be a number"},
        {"{\"rate\":{\"burst\":1e999}}", "rate.burst: must be a number"},
        {"{\"rate\":{\"burst\":1e300}}", "rate.burst: must be a number"},
        {"{\"rate\":{\"prompt_bytes_per_s\":true}}", "rate.prompt_bytes_per_s: must be a number"},
        {"{\"rate\":{\"prompt_bytes_burst\":[]}}", "rate.prompt_bytes_burst: must be a number"},
        {"{\"rate\":{\"rps\":1,\"rps\":2}}", "body: invalid JSON"},
        {"{\"rate\":{\"requests\":1}}", "rate.requests: unknown field"},
        {"{\"max_inflight\":-1}", "max_inflight: must be an integer in 0..4294967295"},
        {"{\"max_inflight\":1.5}", "max_inflight: must be an integer"},
        {"{\"max_inflight\":\"64\"}", "max_inflight: must be an integer"},
        {"{\"id\":\"other\"}", "id: must match the id in the path"},
        {"{\"id\":1}", "id: must be a string"},
        {"{\"keys\":[]}", "keys: unknown field"},
        {"{\"inflight\":0}", "inflight: unknown field"},
        {"{\"Sharing\":\"global\"}", "Sharing: unknown field"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        reply r = call(f, "PUT", "/admin/v1/tenants/t", AUTH, cases[i].body);
        if (r.status != 400)
            fail_msg("case %zu (%s): status %d %s", i, cases[i].body, r.status, r.body);
        assert_error(&r, 400, "invalid_request_error", cases[i].msg);
        assert_string_equal(r.cache_control, "no-store");
    }
    /* 65 models */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"models\":[");
    for (int i = 0; i < 65; i++)
        kvg_buf_printf(&b, "%s\"m%d\"", i ? "," : "", i);
    kvg_buf_puts(&b, "]}");
    reply r = call(f, "PUT", "/admin/v1/tenants/t", AUTH, b.data);
    assert_error(&r, 400, "invalid_request_error", "models: more than 64 models");
    kvg_buf_done(&b);

    /* ids from the path */
    r = call(f, "PUT", "/admin/v1/tenants/bad%20id", AUTH, "{}");
    assert_error(&r, 400, "invalid_request_error", "id: ");
    r = call(f, "GET", "/admin/v1/tenants/a:b", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error", "id: ");
    char longpath[200];
    snprintf(longpath, sizeof(longpath), "/admin/v1/tenants/%065d", 0);
    r = call(f, "PUT", longpath, AUTH, "{}");
    assert_error(&r, 400, "invalid_request_error", "id: longer than 64 characters");
    snprintf(longpath, sizeof(longpath), "/admin/v1/tenants/%064d", 0);
    assert_int_equal(call(f, "PUT", longpath, AUTH, "{}").status, 201);
    r = call(f, "DELETE", "/admin/v1/tenants/t/keys/K-1", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error", "key id: invalid character");
    r = call(f, "DELETE", "/admin/v1/tenants/t/keys/k01234567890123456", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error", "key id: longer than 16 characters");

    /* none of that reached the store */
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    assert_int_equal(kvg_tenant_set_count(set), 1);
    kvg_tenant_set_unref(set);
}

/* ---- keys --------------------------------------------------------------------------------- */

static void test_keys(void **state)
{
    fixture *f = *state;
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{}").status, 201);
    reply r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    assert_int_equal(r.status, 201);
    assert_string_equal(r.cache_control, "no-store");
    assert_int_equal(r.json->u.obj.count, 3);
    char key[KVG_KEY_LEN + 1], key_id[KVG_KEY_ID_LEN + 1];
    snprintf(key, sizeof(key), "%s", str_field(&r, "key"));
    snprintf(key_id, sizeof(key_id), "%s", str_field(&r, "id"));
    assert_string_equal(str_field(&r, "tenant"), "acme");
    assert_int_equal(strlen(key), KVG_KEY_LEN);
    assert_memory_equal(key, KVG_KEY_PREFIX, strlen(KVG_KEY_PREFIX));
    assert_int_equal(strlen(key_id), KVG_KEY_ID_LEN);

    /* the key works at once */
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    kvg_tenant *t = kvg_tenant_set_authenticate(set, key, strlen(key));
    assert_non_null(t);
    assert_string_equal(kvg_tenant_id(t), "acme");
    kvg_tenant_set_unref(set);

    /* {} is fine too; anything else in the body is not */
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, "{}");
    assert_int_equal(r.status, 201);
    char key2[KVG_KEY_LEN + 1];
    snprintf(key2, sizeof(key2), "%s", str_field(&r, "key"));
    assert_string_not_equal(key, key2);
    assert_string_not_equal(key_id, str_field(&r, "id"));
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, "{\"name\":\"ci\"}");
    assert_error(&r, 400, "invalid_request_error", "name: unknown field");
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, "[]");
    assert_error(&r, 400, "invalid_request_error", "body: must be a JSON object");
    r = call(f, "POST", "/admin/v1/tenants/nope/keys", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "tenant \"nope\" not found");
    assert_string_equal(r.cache_control, "no-store");

    /* shown once: never again in a GET, the list or the state file (only ids and dates) */
    r = call(f, "GET", "/admin/v1/tenants/acme", AUTH, NULL);
    const kvg_json *keys = kvg_json_get(r.json, "keys");
    assert_int_equal(keys->u.arr.count, 2);
    for (size_t i = 0; i < 2; i++) {
        const kvg_json *k = keys->u.arr.items[i];
        assert_int_equal(k->u.obj.count, 2);
        assert_non_null(kvg_json_get(k, "id"));
        const kvg_json *created = kvg_json_get(k, "created");
        assert_non_null(created);
        assert_int_equal(created->u.str.len, 24); /* 2025-01-01T00:00:00.000Z */
        assert_int_equal(created->u.str.ptr[23], 'Z');
    }
    assert_null(strstr(r.body, key + strlen(KVG_KEY_PREFIX)));
    assert_null(strstr(r.body, "kvg-"));
    r = call(f, "GET", "/admin/v1/tenants", AUTH, NULL);
    assert_null(strstr(r.body, key + strlen(KVG_KEY_PREFIX)));
    assert_null(strstr(r.body, "digest"));
    char *saved = slurp(f->state_path);
    assert_non_null(saved);
    assert_non_null(strstr(saved, key_id));
    assert_null(strstr(saved, key + strlen(KVG_KEY_PREFIX)));
    assert_null(strstr(saved, key2 + strlen(KVG_KEY_PREFIX)));
    free(saved);

    /* the limit */
    for (int i = 2; i < KVG_TENANT_KEYS_MAX; i++)
        assert_int_equal(call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL).status, 201);
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    assert_error(&r, 409, "invalid_request_error", "tenant \"acme\" already has 16 keys");

    /* delete: rotation */
    char path[128];
    snprintf(path, sizeof(path), "/admin/v1/tenants/acme/keys/%s", key_id);
    r = call(f, "DELETE", path, AUTH, NULL);
    assert_int_equal(r.status, 204);
    assert_string_equal(r.cache_control, "no-store");
    set = kvg_tenants_acquire(f->tenants);
    assert_null(kvg_tenant_set_authenticate(set, key, strlen(key)));
    assert_non_null(kvg_tenant_set_authenticate(set, key2, strlen(key2)));
    kvg_tenant_set_unref(set);
    r = call(f, "DELETE", path, AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "key \"");
    r = call(f, "DELETE", "/admin/v1/tenants/nope/keys/kabc", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "tenant \"nope\" not found");
    assert_int_equal(call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL).status, 201);

    /* a redefinition keeps the keys */
    assert_int_equal(
        call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{\"sharing\":\"global\"}").status, 200);
    set = kvg_tenants_acquire(f->tenants);
    assert_non_null(kvg_tenant_set_authenticate(set, key2, strlen(key2)));
    kvg_tenant_set_unref(set);
    /* deleting the tenant deletes its keys */
    assert_int_equal(call(f, "DELETE", "/admin/v1/tenants/acme", AUTH, NULL).status, 204);
    set = kvg_tenants_acquire(f->tenants);
    assert_null(kvg_tenant_set_authenticate(set, key2, strlen(key2)));
    kvg_tenant_set_unref(set);
}

const struct CMUnitTest tenants_tests[] = {
    cmocka_unit_test_setup_teardown(test_tenants_crud, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tenant_validation, setup, teardown),
    cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
};
const size_t tenants_tests_count = KVG_ARRAY_LEN(tenants_tests);
