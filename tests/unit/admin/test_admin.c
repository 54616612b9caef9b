/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the admin API: every route, authentication, validation, error shapes,
 * readiness, the metrics hook, the audit log and allocation failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "admin.h"
#include "fail_alloc.h"

#define AUTH "Bearer tok-a"

typedef struct fixture {
    kvg_registry *reg;
    kvg_admin *admin;
    kvg_arena arena; /* for parsed response bodies */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    kvg_registry_config rcfg = {.nthreads = 2};
    if (kvg_registry_new(&rcfg, &f->reg) < 0)
        return -1;
    const char *tokens[] = {"tok-a", "tok-b"};
    kvg_admin_config cfg = {.tokens = tokens, .ntokens = 2};
    if (kvg_admin_new(&cfg, f->reg, &f->admin) < 0)
        return -1;
    kvg_arena_init(&f->arena, 0);
    kvg_log_set_level(KVG_LOG_ERROR); /* keep the audit lines out of the TAP output */
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    kvg_admin_free(f->admin);
    kvg_registry_free(f->reg);
    kvg_arena_done(&f->arena);
    free(f);
    return 0;
}

typedef struct reply {
    int status;
    const char *content_type;
    const char *allow;
    const char *www_authenticate;
    char *body; /* copy, NUL-terminated; freed by reply_done */
    size_t len;
    kvg_json *json; /* parsed when the body is JSON */
} reply;

static reply call_body(fixture *f, const char *method, const char *path, const char *auth,
                       const char *body, size_t body_len)
{
    kvg_admin_request req = {
        .method = method,
        .path = path,
        .authorization = auth,
        .body = body,
        .body_len = body_len,
        .remote = "192.0.2.7:5555",
    };
    kvg_admin_response resp;
    memset(&resp, 0xa5, sizeof(resp)); /* the handler must fill every field */
    kvg_admin_handle(f->admin, &req, &resp);
    reply r = {
        .status = resp.status,
        .content_type = resp.content_type,
        .allow = resp.allow,
        .www_authenticate = resp.www_authenticate,
    };
    assert_non_null(r.content_type);
    assert_false(resp.body.failed);
    r.len = resp.body.len;
    r.body = kvg_arena_strndup(&f->arena, resp.body.len ? resp.body.data : "", resp.body.len);
    assert_non_null(r.body);
    kvg_admin_response_done(&resp);
    if (strcmp(r.content_type, "application/json") == 0 && r.len) {
        kvg_json_error err;
        if (kvg_json_parse(r.body, r.len, &f->arena, NULL, &r.json, &err) != 0)
            fail_msg("response is not JSON (%s): %s", err.message, r.body);
    }
    return r;
}

static reply call(fixture *f, const char *method, const char *path, const char *auth,
                  const char *body)
{
    return call_body(f, method, path, auth, body, body ? strlen(body) : 0);
}

static const kvg_json *field(const kvg_json *v, const char *path)
{
    /* dotted path of object members */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    char *save = NULL;
    for (char *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
        v = kvg_json_get(v, k);
    return v;
}

static const char *str_field(const reply *r, const char *path)
{
    assert_non_null(r->json);
    const kvg_json *v = field(r->json, path);
    if (!v || v->type != KVG_JSON_STRING)
        fail_msg("no string %s in %s", path, r->body);
    return v->u.str.ptr;
}

static int64_t int_field(const reply *r, const char *path)
{
    const kvg_json *v = field(r->json, path);
    if (!v || v->type != KVG_JSON_NUMBER || !v->u.num.is_int)
        fail_msg("no integer %s in %s", path, r->body);
    return v->u.num.ival;
}

static bool bool_field(const reply *r, const char *path)
{
    const kvg_json *v = field(r->json, path);
    if (!v || (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE))
        fail_msg("no boolean %s in %s", path, r->body);
    return v->type == KVG_JSON_TRUE;
}

/* The OpenAI error shape, exactly: {"error":{"message","type","code"}}. */
static void assert_error(const reply *r, int status, const char *type, const char *msg_prefix)
{
    if (r->status != status)
        fail_msg("status %d, expected %d: %s", r->status, status, r->body);
    assert_string_equal(r->content_type, "application/json");
    assert_non_null(r->json);
    assert_int_equal(r->json->type, KVG_JSON_OBJECT);
    assert_int_equal(r->json->u.obj.count, 1);
    const kvg_json *e = kvg_json_get(r->json, "error");
    assert_non_null(e);
    assert_int_equal(e->u.obj.count, 3);
    assert_string_equal(str_field(r, "error.type"), type);
    assert_int_equal(int_field(r, "error.code"), status);
    const char *m = str_field(r, "error.message");
    if (strncmp(m, msg_prefix, strlen(msg_prefix)) != 0)
        fail_msg("message \"%s\" does not start with \"%s\"", m, msg_prefix);
}

/* ---- probes ------------------------------------------------------------------------------- */

static bool ready_value;
static bool ready_cb(void *ud)
{
    assert_ptr_equal(ud, &ready_value);
    return ready_value;
}

static void test_healthz_readyz(void **state)
{
    fixture *f = *state;
    reply r = call(f, "GET", "/healthz", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}");
    r = call(f, "GET", "/healthz?verbose=1", "Bearer nonsense", NULL);
    assert_int_equal(r.status, 200);
    r = call(f, "POST", "/healthz", NULL, NULL);
    assert_error(&r, 405, "invalid_request_error", "method POST not allowed here; allowed: GET");
    assert_string_equal(r.allow, "GET");

    r = call(f, "GET", "/readyz", NULL, NULL);
    assert_int_equal(r.status, 503);
    assert_string_equal(str_field(&r, "status"), "not ready");
    assert_string_equal(str_field(&r, "reason"), "no workers registered");

    assert_int_equal(
        call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}").status, 201);
    r = call(f, "GET", "/readyz", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ready\"}");

    /* the probe callback can veto */
    ready_value = false;
    kvg_admin_set_ready(f->admin, ready_cb, &ready_value);
    r = call(f, "GET", "/readyz", NULL, NULL);
    assert_int_equal(r.status, 503);
    assert_string_equal(str_field(&r, "reason"), "gateway is not ready");
    ready_value = true;
    assert_int_equal(call(f, "GET", "/readyz", NULL, NULL).status, 200);

    /* a worker that is down or draining does not count */
    kvg_worker_set *s = kvg_registry_acquire(f->reg);
    kvg_worker *w = kvg_worker_set_find(s, "w1");
    for (int i = 0; i < 3; i++)
        kvg_worker_health_observe(w, false);
    r = call(f, "GET", "/readyz", NULL, NULL);
    assert_int_equal(r.status, 503);
    assert_string_equal(str_field(&r, "reason"), "no worker is up and accepting requests");
    for (int i = 0; i < 2; i++)
        kvg_worker_health_observe(w, true);
    assert_int_equal(call(f, "GET", "/readyz", NULL, NULL).status, 200);
    assert_int_equal(call(f, "POST", "/admin/v1/workers/w1/drain", AUTH, NULL).status, 200);
    assert_int_equal(call(f, "GET", "/readyz", NULL, NULL).status, 503);
    kvg_worker_set_unref(s);
    kvg_admin_set_ready(f->admin, NULL, NULL);
}

/* ---- authentication -------------------------------------------------------------------------- */

static void test_auth(void **state)
{
    fixture *f = *state;
    reply r = call(f, "GET", "/admin/v1/workers", NULL, NULL);
    assert_error(&r, 401, "authentication_error", "missing Authorization header");
    assert_string_equal(r.www_authenticate, "Bearer realm=\"kvgate-admin\"");
    r = call(f, "GET", "/admin/v1/workers", "", NULL);
    assert_error(&r, 401, "authentication_error", "missing Authorization header");
    r = call(f, "GET", "/admin/v1/workers", "Basic dG9rLWE6", NULL);
    assert_error(&r, 401, "authentication_error", "Authorization scheme must be Bearer");
    r = call(f, "GET", "/admin/v1/workers", "Bearertok-a", NULL);
    assert_error(&r, 401, "authentication_error", "Authorization scheme must be Bearer");
    r = call(f, "GET", "/admin/v1/workers", "Bearer", NULL);
    assert_error(&r, 401, "authentication_error", "missing bearer token");
    r = call(f, "GET", "/admin/v1/workers", "Bearer    ", NULL);
    assert_error(&r, 401, "authentication_error", "missing bearer token");
    static const char *const wrong[] = {"Bearer tok-c", "Bearer tok", "Bearer tok-a-",
                                        "Bearer TOK-A", "Bearer tok-a tok-b"};
    for (size_t i = 0; i < KVG_ARRAY_LEN(wrong); i++) {
        r = call(f, "GET", "/admin/v1/workers", wrong[i], NULL);
        assert_error(&r, 401, "authentication_error", "invalid admin token");
        assert_string_equal(r.www_authenticate,
                            "Bearer realm=\"kvgate-admin\", error=\"invalid_token\"");
    }
    /* unknown paths and wrong methods need credentials first: nothing leaks to strangers */
    assert_int_equal(call(f, "GET", "/admin/v1/nothing", NULL, NULL).status, 401);
    assert_int_equal(call(f, "PATCH", "/admin/v1/workers", "Bearer x", NULL).status, 401);
    assert_int_equal(call(f, "GET", "/metrics", NULL, NULL).status, 401);

    /* scheme is case-insensitive, extra blanks are fine, every configured token works */
    r = call(f, "GET", "/admin/v1/workers", "bearer \t tok-b  ", NULL);
    assert_int_equal(r.status, 200);
    assert_null(r.www_authenticate);
    assert_int_equal(call(f, "GET", "/admin/v1/workers", "BEARER tok-a", NULL).status, 200);

    /* token rotation */
    const char *next[] = {"tok-new"};
    assert_int_equal(kvg_admin_set_tokens(f->admin, next, 1), 0);
    assert_int_equal(call(f, "GET", "/admin/v1/workers", AUTH, NULL).status, 401);
    assert_int_equal(call(f, "GET", "/admin/v1/workers", "Bearer tok-new", NULL).status, 200);
    const char *bad1[] = {""};
    const char *bad2[] = {"has space"};
    const char *bad3[] = {"ok", NULL};
    const char *bad4[] = {"ctl\x01"};
    assert_int_equal(kvg_admin_set_tokens(f->admin, next, 0), -EINVAL);
    assert_int_equal(kvg_admin_set_tokens(f->admin, NULL, 1), -EINVAL);
    assert_int_equal(kvg_admin_set_tokens(f->admin, bad1, 1), -EINVAL);
    assert_int_equal(kvg_admin_set_tokens(f->admin, bad2, 1), -EINVAL);
    assert_int_equal(kvg_admin_set_tokens(f->admin, bad3, 2), -EINVAL);
    assert_int_equal(kvg_admin_set_tokens(f->admin, bad4, 1), -EINVAL);
    /* the old tokens stay after a rejected change */
    assert_int_equal(call(f, "GET", "/admin/v1/workers", "Bearer tok-new", NULL).status, 200);

    kvg_admin *a = (kvg_admin *)(uintptr_t)1;
    kvg_admin_config none = {.tokens = next, .ntokens = 0};
    assert_int_equal(kvg_admin_new(&none, f->reg, &a), -EINVAL);
    assert_ptr_equal(a, (kvg_admin *)(uintptr_t)1);
    kvg_admin_free(NULL);
    kvg_admin_response_done(NULL);
}

/* ---- routing ------------------------------------------------------------------------------ */

static void test_routing(void **state)
{
    fixture *f = *state;
    static const char *const missing[] = {
        "/",
        "/admin",
        "/admin/v1",
        "/admin/v1/workers/",
        "/admin/v1/workers//drain",
        "/admin/v1/workers/a/b",
        "/admin/v1/workers/a/drain/x",
        "/admin/v1/workers/a/",
        "/admin/v1/workersx",
        "/admin/v1/tenants",
        "/admin/v1/policy",
        "/metrics/",
        "/HEALTHZ",
        "*",
        "",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(missing); i++) {
        reply r = call(f, "GET", missing[i], AUTH, NULL);
        assert_error(&r, 404, "not_found_error", "no such endpoint");
        assert_null(r.allow);
    }
    reply r = call(f, "POST", "/admin/v1/workers", AUTH, "{}");
    assert_error(&r, 405, "invalid_request_error", "method POST not allowed here; allowed: GET");
    assert_string_equal(r.allow, "GET");
    r = call(f, "PATCH", "/admin/v1/workers/a", AUTH, "{}");
    assert_error(&r, 405, "invalid_request_error", "method PATCH not allowed");
    assert_string_equal(r.allow, "GET, PUT, DELETE");
    r = call(f, "GET", "/admin/v1/workers/a/drain", AUTH, NULL);
    assert_error(&r, 405, "invalid_request_error", "method GET not allowed");
    assert_string_equal(r.allow, "POST");
    r = call(f, "get", "/admin/v1/workers", AUTH, NULL); /* methods are case-sensitive */
    assert_int_equal(r.status, 405);
    r = call(f, "HEAD", "/metrics", AUTH, NULL);
    assert_int_equal(r.status, 405);

    /* a query string does not take part in routing */
    r = call(f, "GET", "/admin/v1/workers?limit=5&x=/y", AUTH, NULL);
    assert_int_equal(r.status, 200);
    r = call(f, "GET", "/admin/v1/workers/nope?x", AUTH, NULL);
    assert_error(&r, 404, "not_found_error", "worker \"nope\" not found");

    /* names from the path are validated */
    r = call(f, "GET", "/admin/v1/workers/bad%20name", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error", "name: invalid character '%'");
    r = call(f, "DELETE", "/admin/v1/workers/..", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error", "name: ");
    char longpath[200];
    snprintf(longpath, sizeof(longpath), "/admin/v1/workers/%065d", 0);
    r = call(f, "PUT", longpath, AUTH, "{\"url\":\"http://h:1\"}");
    assert_error(&r, 400, "invalid_request_error", "name: longer than 64 characters");

    char *huge = malloc(5000);
    assert_non_null(huge);
    memset(huge, 'a', 4999);
    huge[0] = '/';
    huge[4999] = '\0';
    r = call(f, "GET", huge, AUTH, NULL);
    assert_error(&r, 414, "invalid_request_error", "path longer than");
    free(huge);

    kvg_admin_request req = {.method = NULL, .path = "/healthz"};
    kvg_admin_response resp;
    kvg_admin_handle(f->admin, &req, &resp);
    assert_int_equal(resp.status, 400);
    kvg_admin_response_done(&resp);
}

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
    assert_string_equal(r.body, "{\"name\":\"gpu-1\",\"url\":\"http://127.0.0.1:8001\",\"models\":"
                                "[\"llama\",\"q\\\"wen\"],\"kv_blocks\":4096,\"max_inflight\":64,"
                                "\"source\":\"admin\",\"health\":\"up\",\"draining\":false,"
                                "\"inflight\":0}");
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

typedef struct body_case {
    const char *body;
    const char *msg; /* expected message prefix */
} body_case;

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
        {"{\"url\":\"http://h:1\",\"extra\":1}", "unknown field \"extra\""},
        {"{\"url\":\"http://h:1\",\"URL\":\"x\"}", "unknown field \"URL\""},
        {"{\"url\":\"http://h:1\",\"url\\u0000\":\"x\"}", "unknown field \"url\""},
        {"{\"url\":\"http://h:1\",\"health\":\"up\"}", "unknown field \"health\""},
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
    assert_error(&r, 400, "invalid_request_error", "unknown field \"\n\x01\"xxx");
    assert_true(strlen(str_field(&r, "error.message")) < 100);

    /* too large */
    size_t big = KVG_ADMIN_BODY_MAX + 1;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, ' ', big);
    r = call_body(f, "PUT", "/admin/v1/workers/w", AUTH, huge, big);
    assert_error(&r, 413, "invalid_request_error", "request body larger than 1048576 bytes");
    free(huge);

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

/* ---- metrics ------------------------------------------------------------------------------ */

static void writer_a(kvg_buf *out, void *ud)
{
    kvg_buf_printf(out, "# HELP gw_a A.\n# TYPE gw_a counter\ngw_a_total %d\n", *(int *)ud);
}

static void writer_b(kvg_buf *out, void *ud)
{
    (void)ud;
    kvg_buf_puts(out, "# HELP gw_b B.\n# TYPE gw_b gauge\ngw_b 1\n");
}

static void test_metrics(void **state)
{
    fixture *f = *state;
    reply r = call(f, "GET", "/metrics", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert_non_null(strstr(r.body, "# TYPE kvgate_worker_up gauge\n"));

    assert_int_equal(
        call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}").status, 201);
    static int value = 42;
    assert_int_equal(kvg_admin_add_metrics(f->admin, writer_a, &value), 0);
    assert_int_equal(kvg_admin_add_metrics(f->admin, writer_b, NULL), 0);
    assert_int_equal(kvg_admin_add_metrics(f->admin, NULL, NULL), -EINVAL);
    r = call(f, "GET", "/metrics?name[]=x", AUTH, NULL);
    assert_int_equal(r.status, 200);
    const char *up = strstr(r.body, "kvgate_worker_up{worker=\"w1\"} 1\n");
    const char *a = strstr(r.body, "gw_a_total 42\n");
    const char *b = strstr(r.body, "gw_b 1\n");
    assert_non_null(up);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(up < a && a < b); /* registry first, then writers in registration order */
    assert_true(r.body[r.len - 1] == '\n');

    for (int i = 2; i < 64; i++)
        assert_int_equal(kvg_admin_add_metrics(f->admin, writer_b, NULL), 0);
    assert_int_equal(kvg_admin_add_metrics(f->admin, writer_b, NULL), KVG_ELIMIT);
}

/* ---- audit log ---------------------------------------------------------------------------- */

/* Run fn with stderr captured; returns what was logged (caller frees). */
static char *capture_stderr(void (*fn)(fixture *), fixture *f)
{
    char tmpl[] = "/tmp/kvg-admin-log-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    unlink(tmpl);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fd, 2) >= 0);
    kvg_log_set_level(KVG_LOG_INFO);
    fn(f);
    kvg_log_set_level(KVG_LOG_ERROR);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    assert_true(len >= 0);
    char *text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)len, 0), len);
    close(fd);
    return text;
}

static void audit_actions(fixture *f)
{
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}");
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:2\"}");
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"https://h:2\"}");
    call(f, "POST", "/admin/v1/workers/w1/drain", AUTH, NULL);
    call(f, "DELETE", "/admin/v1/workers/w1", AUTH, NULL);
    call(f, "GET", "/admin/v1/workers", "Bearer tok-secret-typo", NULL);
    call(f, "GET", "/admin/v1/workers", AUTH, NULL);
}

static void test_audit_log(void **state)
{
    fixture *f = *state;
    char *log = capture_stderr(audit_actions, f);
    static const char *const expect[] = {
        "admin: remote=192.0.2.7:5555 put worker w1 url=http://h:1 models=0 kv_blocks=0 "
        "max_inflight=0 (created)\n",
        "admin: remote=192.0.2.7:5555 put worker w1 url=http://h:2 models=0 kv_blocks=0 "
        "max_inflight=0 (updated)\n",
        "admin: remote=192.0.2.7:5555 put worker w1 rejected (400): url: https is not",
        "admin: remote=192.0.2.7:5555 drain worker w1\n",
        "admin: remote=192.0.2.7:5555 delete worker w1\n",
        "admin: remote=192.0.2.7:5555 GET /admin/v1/workers: authentication failed: invalid "
        "admin token\n",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(expect); i++)
        if (!strstr(log, expect[i]))
            fail_msg("missing log line %s in:\n%s", expect[i], log);
    /* tokens never reach the log, nor do reads */
    assert_null(strstr(log, "tok-a"));
    assert_null(strstr(log, "tok-secret-typo"));
    size_t lines = 0;
    for (const char *p = log; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, KVG_ARRAY_LEN(expect));
    free(log);
}

/* ---- allocation failures ------------------------------------------------------------------ */

/* Each request with its n-th allocation failing must still produce a well-formed response:
 * the normal one or a 500 with the error shape (registry atomicity under allocation failure
 * is the router tests' business). Failures may also strike after a change was made (while
 * writing the response), so a PUT that created may be answered as an update afterwards. */
static void test_alloc_failures(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *method, *path, *auth, *body;
        int ok, ok_after_partial;
    } reqs[] = {
        {"PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\",\"models\":[\"a\",\"b\"]}",
         201, 200},
        {"PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:2\",\"kv_blocks\":7}", 200, 200},
        {"GET", "/admin/v1/workers", AUTH, NULL, 200, 200},
        {"GET", "/admin/v1/workers/w1", AUTH, NULL, 200, 200},
        {"GET", "/metrics", AUTH, NULL, 200, 200},
        {"GET", "/readyz", NULL, NULL, 200, 200},
        {"PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"https://h:2\"}", 400, 400},
        {"GET", "/admin/v1/workers", "Bearer nope", NULL, 401, 401},
        {"POST", "/admin/v1/workers/w1/drain", AUTH, NULL, 200, 200},
        {"DELETE", "/admin/v1/workers/w1", AUTH, NULL, 204, 204},
    };
    long injections = 0;
    for (size_t i = 0; i < KVG_ARRAY_LEN(reqs); i++) {
        bool partial = false;
        for (long n = 0;; n++) {
            kvg_admin_request req = {
                .method = reqs[i].method,
                .path = reqs[i].path,
                .authorization = reqs[i].auth,
                .body = reqs[i].body,
                .body_len = reqs[i].body ? strlen(reqs[i].body) : 0,
            };
            kvg_admin_response resp;
            uint64_t g = kvg_registry_generation(f->reg);
            fail_alloc_nth(n);
            kvg_admin_handle(f->admin, &req, &resp);
            bool injected = fail_alloc_off();
            injections += injected;
            assert_non_null(resp.content_type);
            assert_false(resp.body.failed);
            if (kvg_registry_generation(f->reg) != g)
                partial = true;
            int want = partial ? reqs[i].ok_after_partial : reqs[i].ok;
            if (!injected) {
                if (resp.status != want && resp.status != reqs[i].ok)
                    fail_msg("request %zu: status %d", i, resp.status);
                kvg_admin_response_done(&resp);
                break;
            }
            if (resp.status != want && resp.status != reqs[i].ok && resp.status != 500)
                fail_msg("request %zu, allocation %ld: status %d", i, n, resp.status);
            if (resp.status == 500 && resp.body.len) {
                kvg_json *v;
                assert_int_equal(
                    kvg_json_parse(resp.body.data, resp.body.len, &f->arena, NULL, &v, NULL), 0);
                assert_non_null(kvg_json_get(v, "error"));
            }
            kvg_admin_response_done(&resp);
        }
    }

    assert_true(injections > 20);
    print_message("# %ld allocation failures injected\n", injections);

    /* the constructor */
    const char *tokens[] = {"t"};
    kvg_admin_config cfg = {.tokens = tokens, .ntokens = 1};
    for (long n = 0;; n++) {
        kvg_admin *a = NULL;
        fail_alloc_nth(n);
        int rc = kvg_admin_new(&cfg, f->reg, &a);
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_admin_free(a);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        assert_null(a);
    }
}

/* ---- threads ------------------------------------------------------------------------------ */

typedef struct thread_arg {
    fixture *f;
    int failures;
} thread_arg;

static void *hammer(void *p)
{
    thread_arg *ta = p;
    for (int i = 0; i < 300; i++) {
        kvg_admin_request reqs[] = {
            {.method = "GET", .path = "/metrics", .authorization = "Bearer tok-a"},
            {.method = "GET", .path = "/admin/v1/workers", .authorization = "Bearer tok-b"},
            {.method = "PUT",
             .path = "/admin/v1/workers/t",
             .authorization = "Bearer tok-a",
             .body = "{\"url\":\"http://h:1\"}",
             .body_len = 20},
            {.method = "GET", .path = "/readyz"},
        };
        for (size_t k = 0; k < KVG_ARRAY_LEN(reqs); k++) {
            kvg_admin_response resp;
            kvg_admin_handle(ta->f->admin, &reqs[k], &resp);
            if (resp.status >= 500 || resp.status == 401 || resp.status == 400)
                ta->failures++;
            kvg_admin_response_done(&resp);
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    fixture *f = *state;
    assert_int_equal(call(f, "PUT", "/admin/v1/workers/t", AUTH, "{\"url\":\"http://h:1\"}").status,
                     201);
    pthread_t th[3];
    thread_arg args[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (thread_arg){.f = f};
        assert_int_equal(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
    }
    const char *tokens[] = {"tok-a", "tok-b", "tok-c"};
    for (int i = 0; i < 200; i++) {
        assert_int_equal(kvg_admin_set_tokens(f->admin, tokens, 2 + (size_t)(i % 2)), 0);
        kvg_admin_set_ready(f->admin, i % 2 ? ready_cb : NULL, &ready_value);
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
}

int main(void)
{
    ready_value = true;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_healthz_readyz, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_routing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_crud, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_limit_conflict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_audit_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
