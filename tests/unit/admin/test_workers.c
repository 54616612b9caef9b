/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for /admin/v1/workers (admin/workers.c): defining, listing, draining and removing
 * workers, the bodies refused, the worker limit and the cache_salt switch. */
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

/* ---- workers ------------------------------------------------------------------------------ */

static void test_workers_crud(void **state)
{
    fixture *f = *state;
    reply r = call(f, "GET", "/admin/v1/workers", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"workers\":[]}");

    r = call(f, "PUT", "/admin/v1/workers/gpu-1", AUTH,
             "{\"url\": \"http://127.0.0.1:8001\", \"models\": [\"llama\", \"q\\\"wen\"],"
             " \"kv_blocks\": 4096, \"max_inflight\": 64}");
    assert_int_equal(r.status, 201);
    assert_string_equal(r.body,
                        "{\"name\":\"gpu-1\",\"url\":\"http://127.0.0.1:8001\",\"models\":"
                        "[\"llama\",\"q\\\"wen\"],\"kv_blocks\":4096,\"max_inflight\":64,"
                        "\"cache_salt\":true,\"kv_events_stale_ms\":5000,\"source\":\"admin\","
                        "\"health\":\"up\","
                        "\"draining\":false,\"inflight\":0,\"outlier\":{\"ejected\":false,"
                        "\"ejected_until\":null,\"remaining_ms\":0,\"consecutive_5xx\":0,"
                        "\"consecutive_gateway_failures\":0,\"ejections\":0,"
                        "\"multiplier\":0}}");
    assert_null(r.cache_control);
    /* the same again: 200, the worker object (and its state) kept */
    kvg_worker_set *s = kvg_registry_acquire(f->reg);
    kvg_worker *w = kvg_worker_set_find(s, "gpu-1");
    assert_true(kvg_worker_inflight_try_acquire(w));
    r = call(f, "PUT", "/admin/v1/workers/gpu-1", AUTH,
             "{\"url\": \"http://127.0.0.1:8001\", \"models\": [\"llama\", \"q\\\"wen\"],"
             " \"kv_blocks\": 4096, \"max_inflight\": 64, \"name\": \"gpu-1\"}");
    assert_int_equal(r.status, 200);
    assert_int_equal(int_field(&r, "inflight"), 1);
    kvg_worker_inflight_release(w);
    kvg_worker_set_unref(s);

    /* only url is required; defaults fill the rest */
    r = call(f, "PUT", "/admin/v1/workers/gpu-0", AUTH, "{\"url\":\"http://[::1]:9000/\"}");
    assert_int_equal(r.status, 201);
    assert_int_equal(int_field(&r, "kv_blocks"), 0);
    assert_int_equal(int_field(&r, "max_inflight"), 1024);
    assert_int_equal(field(r.json, "models")->u.arr.count, 0);

    r = call(f, "GET", "/admin/v1/workers", AUTH, NULL);
    assert_int_equal(r.status, 200);
    const kvg_json *list = kvg_json_get(r.json, "workers");
    assert_int_equal(list->u.arr.count, 2);
    assert_string_equal(kvg_json_get(list->u.arr.items[0], "name")->u.str.ptr, "gpu-0");
    assert_string_equal(kvg_json_get(list->u.arr.items[1], "name")->u.str.ptr, "gpu-1");
    assert_string_equal(kvg_json_get(list->u.arr.items[1], "source")->u.str.ptr, "admin");

    r = call(f, "GET", "/admin/v1/workers/gpu-1", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "url"), "http://127.0.0.1:8001");
    assert_string_equal(str_field(&r, "health"), "up");

    /* config workers show their source */
    kvg_worker_def cfg[] = {{.name = "from-cfg", .url = "http://c:1"}};
    assert_int_equal(kvg_registry_replace_config(f->reg, cfg, 1, NULL, 0), 0);
    r = call(f, "GET", "/admin/v1/workers/from-cfg", AUTH, NULL);
    assert_string_equal(str_field(&r, "source"), "config");

    /* drain */
    r = call(f, "POST", "/admin/v1/workers/gpu-1/drain", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_true(bool_field(&r, "draining"));
    r = call(f, "POST", "/admin/v1/workers/gpu-1/drain?now=1", AUTH, "ignored");
    assert_int_equal(r.status, 200);
    r = call(f, "POST", "/admin/v1/workers/nope/drain", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "worker \"nope\" not found");
    /* a PUT puts it back into service */
    r = call(f, "PUT", "/admin/v1/workers/gpu-1", AUTH, "{\"url\":\"http://127.0.0.1:8002\"}");
    assert_int_equal(r.status, 200);
    assert_false(bool_field(&r, "draining"));
    assert_int_equal(field(r.json, "models")->u.arr.count, 0);

    /* delete */
    r = call(f, "DELETE", "/admin/v1/workers/gpu-1", AUTH, NULL);
    assert_int_equal(r.status, 204);
    assert_int_equal(r.len, 0);
    r = call(f, "DELETE", "/admin/v1/workers/gpu-1", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "worker \"gpu-1\" not found");
    r = call(f, "GET", "/admin/v1/workers/gpu-1", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "worker \"gpu-1\" not found");
}

static void test_put_validation(void **state)
{
    fixture *f = *state;
    static const body_case cases[] = {
        {"", "body: must be a JSON object"},
        {"[]", "body: must be a JSON object"},
        {"\"http://h:1\"", "body: must be a JSON object"},
        {"null", "body: must be a JSON object"},
        {"{", "body: invalid JSON at byte 1"},
        {"{\"url\":\"http://h:1\"} x", "body: invalid JSON"},
        {"{\"url\":\"http://h:1\",\"url\":\"http://h:2\"}", "body: invalid JSON at byte"},
        {"{}", "url: required"},
        {"{\"models\":[\"m\"]}", "url: required"},
        {"{\"url\":5}", "url: must be a string"},
        {"{\"url\":null}", "url: must be a string"},
        {"{\"url\":\"http://h\\u0000:1\"}", "url: must not contain NUL characters"},
        {"{\"url\":\"https://h:1\"}", "url: https is not supported"},
        {"{\"url\":\"http://h:1/v1\"}", "url: a path is not allowed"},
        {"{\"url\":\"http://u@h:1\"}", "url: user information is not allowed"},
        {"{\"url\":\"http://h:99999\"}", "url: port must be"},
        {"{\"url\":\"http://h:1\",\"models\":\"m\"}", "models: must be an array of strings"},
        {"{\"url\":\"http://h:1\",\"models\":[1]}", "models[0]: must be a string"},
        {"{\"url\":\"http://h:1\",\"models\":[\"a\",[]]}", "models[1]: must be a string"},
        {"{\"url\":\"http://h:1\",\"models\":[\"a\",\"a\"]}", "models[1]: duplicate of models[0]"},
        {"{\"url\":\"http://h:1\",\"models\":[\"\"]}", "models[0]: must not be empty"},
        {"{\"url\":\"http://h:1\",\"models\":[\"tab\\there\"]}", "models[0]: must be printable"},
        {"{\"url\":\"http://h:1\",\"kv_blocks\":-1}",
         "kv_blocks: must be an integer in 0..4294967295"},
        {"{\"url\":\"http://h:1\",\"kv_blocks\":1.5}", "kv_blocks: must be an integer"},
        {"{\"url\":\"http://h:1\",\"kv_blocks\":1e3}", "kv_blocks: must be an integer"},
        {"{\"url\":\"http://h:1\",\"kv_blocks\":4294967296}", "kv_blocks: must be an integer"},
        {"{\"url\":\"http://h:1\",\"kv_blocks\":\"8\"}", "kv_blocks: must be an integer"},
        {"{\"url\":\"http://h:1\",\"max_inflight\":true}", "max_inflight: must be an integer"},
        {"{\"url\":\"http://h:1\",\"max_inflight\":99999999999999999999}",
         "max_inflight: must be an integer"},
        {"{\"url\":\"http://h:1\",\"extra\":1}", "extra: unknown field"},
        {"{\"url\":\"http://h:1\",\"URL\":\"x\"}", "URL: unknown field"},
        {"{\"url\":\"http://h:1\",\"url\\u0000\":\"x\"}", "url?: unknown field"},
        {"{\"url\":\"http://h:1\",\"health\":\"up\"}", "health: unknown field"},
        {"{\"url\":\"http://h:1\",\"name\":\"other\"}", "name: must match the name in the path"},
        {"{\"url\":\"http://h:1\",\"name\":7}", "name: must be a string"},
        {"{\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":{\"g\":{\"h\":{\"i\":{\"j\":{\"k\":{\"l\":"
         "{\"m\":{\"n\":{\"o\":{\"p\":{\"q\":1}}}}}}}}}}}}}}}}}",
         "body: invalid JSON"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        reply r = call(f, "PUT", "/admin/v1/workers/w", AUTH, cases[i].body);
        if (r.status != 400)
            fail_msg("case %zu (%s): status %d %s", i, cases[i].body, r.status, r.body);
        assert_error(&r, 400, "invalid_request_error", cases[i].msg);
    }

    /* 65 models */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"url\":\"http://h:1\",\"models\":[");
    for (int i = 0; i < 65; i++)
        kvg_buf_printf(&b, "%s\"m%d\"", i ? "," : "", i);
    kvg_buf_puts(&b, "]}");
    reply r = call(f, "PUT", "/admin/v1/workers/w", AUTH, b.data);
    assert_error(&r, 400, "invalid_request_error", "models: more than 64 models");
    kvg_buf_done(&b);

    /* a field name full of junk is escaped and shortened in the message */
    r = call(
        f, "PUT", "/admin/v1/workers/w", AUTH,
        "{\"url\":\"http://h:1\",\"\\n\\u0001\\\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\":1}");
    assert_error(&r, 400, "invalid_request_error",
                 "???xxxxxxxxxxxxxxxxxxxxxxxxxxxxx...: unknown field");
    assert_true(strlen(str_field(&r, "error.message")) < 100);

    /* too large */
    size_t big = KVG_ADMIN_BODY_MAX + 1;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, ' ', big);
    r = call_body(f, "PUT", "/admin/v1/workers/w", AUTH, huge, big);
    assert_error(&r, 413, "invalid_request_error", "request body larger than 1048576 bytes");
    free(huge);

    /* under the size limit, but more values than the parse may hold: 413, not a 500 */
    kvg_buf many;
    kvg_buf_init(&many);
    kvg_buf_puts(&many, "{\"url\":\"http://h:1\",\"models\":[");
    while (many.len < KVG_ADMIN_BODY_MAX - 16)
        kvg_buf_puts(&many, "[],");
    kvg_buf_puts(&many, "[]]}");
    r = call_body(f, "PUT", "/admin/v1/workers/w", AUTH, many.data, many.len);
    assert_error(&r, 413, "invalid_request_error", "body: too many JSON values");
    kvg_buf_done(&many);

    /* nothing of that reached the registry */
    kvg_worker_set *s = kvg_registry_acquire(f->reg);
    assert_int_equal(kvg_worker_set_count(s), 0);
    assert_int_equal(kvg_worker_set_generation(s), 1);
    kvg_worker_set_unref(s);

    /* the body need not be NUL-terminated */
    const char raw[] = "{\"url\":\"http://h:1\"}GARBAGE";
    r = call_body(f, "PUT", "/admin/v1/workers/w", AUTH, raw, strlen("{\"url\":\"http://h:1\"}"));
    assert_int_equal(r.status, 201);
}

static void test_worker_limit_conflict(void **state)
{
    fixture *f = *state;
    char path[64];
    for (int i = 0; i < KVG_REGISTRY_WORKERS_MAX; i++) {
        kvg_worker_def d = {.name = path, .url = "http://h:1"};
        snprintf(path, sizeof(path), "w%d", i);
        assert_int_equal(kvg_registry_put(f->reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    }
    reply r = call(f, "PUT", "/admin/v1/workers/one-more", AUTH, "{\"url\":\"http://h:1\"}");
    assert_error(&r, 409, "invalid_request_error", "too many workers");
}

/* ---- workers: cache salt -------------------------------------------------------------------- */

static void test_worker_cache_salt(void **state)
{
    fixture *f = *state;
    reply r = call(f, "PUT", "/admin/v1/workers/w1", AUTH,
                   "{\"url\":\"http://h:1\",\"cache_salt\":false}");
    assert_int_equal(r.status, 201);
    assert_false(bool_field(&r, "cache_salt"));
    kvg_worker_set *s = kvg_registry_acquire(f->reg);
    assert_false(kvg_worker_injects_salt(kvg_worker_set_find(s, "w1")));
    kvg_worker_set_unref(s);
    r = call(f, "GET", "/admin/v1/workers/w1", AUTH, NULL);
    assert_false(bool_field(&r, "cache_salt"));

    /* PUT replaces: omitted is the default, true */
    r = call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}");
    assert_int_equal(r.status, 200);
    assert_true(bool_field(&r, "cache_salt"));
    r = call(f, "PUT", "/admin/v1/workers/w1", AUTH,
             "{\"url\":\"http://h:1\",\"cache_salt\":true}");
    assert_true(bool_field(&r, "cache_salt"));
    s = kvg_registry_acquire(f->reg);
    assert_true(kvg_worker_injects_salt(kvg_worker_set_find(s, "w1")));
    kvg_worker_set_unref(s);

    static const char *const bad[] = {"\"no\"", "0", "null", "[]"};
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        char body[128];
        snprintf(body, sizeof(body), "{\"url\":\"http://h:1\",\"cache_salt\":%s}", bad[i]);
        r = call(f, "PUT", "/admin/v1/workers/w1", AUTH, body);
        assert_error(&r, 400, "invalid_request_error", "cache_salt: must be true or false");
    }
}

/* ---- workers: what another module adds (the KV-event consumer's kv_events_status) ---------- */

static void put_extra(kvg_buf *out, const kvg_worker *w, void *ud)
{
    kvg_buf_printf(out, ",\"extra\":{\"of\":\"%s\",\"ud\":%d}", kvg_worker_name(w), *(int *)ud);
}

static void test_worker_extra(void **state)
{
    fixture *f = *state;
    reply r = call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}");
    assert_int_equal(r.status, 201);
    assert_null(strstr(r.body, "\"extra\""));
    static int ud = 7;
    kvg_admin_set_worker_extra(f->admin, put_extra, &ud);
    r = call(f, "GET", "/admin/v1/workers/w1", AUTH, NULL);
    assert_int_equal(r.status, 200);
    size_t n = strlen(r.body);
    assert_true(n > 27);
    /* the last member of the object, after everything the admin writes itself */
    assert_string_equal(r.body + n - 27, "\"extra\":{\"of\":\"w1\",\"ud\":7}}");
    r = call(f, "GET", "/admin/v1/workers", AUTH, NULL);
    assert_non_null(strstr(r.body, "\"extra\":{\"of\":\"w1\",\"ud\":7}}]}"));
    kvg_admin_set_worker_extra(f->admin, NULL, NULL);
    r = call(f, "GET", "/admin/v1/workers/w1", AUTH, NULL);
    assert_null(strstr(r.body, "\"extra\""));
}

const struct CMUnitTest workers_tests[] = {
    cmocka_unit_test_setup_teardown(test_workers_crud, setup, teardown),
    cmocka_unit_test_setup_teardown(test_put_validation, setup, teardown),
    cmocka_unit_test_setup_teardown(test_worker_limit_conflict, setup, teardown),
    cmocka_unit_test_setup_teardown(test_worker_cache_salt, setup, teardown),
    cmocka_unit_test_setup_teardown(test_worker_extra, setup, teardown),
};
const size_t workers_tests_count = KVG_ARRAY_LEN(workers_tests);
