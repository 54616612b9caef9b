/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the admin API: every route, authentication, validation, error shapes,
 * readiness, the metrics hook, the state file, the audit log, allocation failures and
 * concurrent changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admin.h"
#include "fail_alloc.h"

#define AUTH "Bearer tok-a"

typedef struct fixture {
    kvg_registry *reg;
    kvg_tenants *tenants;
    kvg_policy_state *policy;
    kvg_admin *admin;
    kvg_arena arena; /* for parsed response bodies */
    char dir[64];    /* a fresh folder for the state file and the audit log */
    char state_path[128];
    char audit_path[128];
} fixture;

/* The objects an admin works on, as a gateway creates them at start-up. */
static int make_objects(kvg_registry **reg, kvg_tenants **tenants, kvg_policy_state **policy)
{
    kvg_registry_config rcfg = {.nthreads = 2};
    if (kvg_registry_new(&rcfg, reg) < 0 || kvg_tenants_new(tenants) < 0 ||
        kvg_policy_state_new(policy) < 0)
        return -1;
    return 0;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvg-admin-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->state_path, sizeof(f->state_path), "%s/state.json", f->dir);
    snprintf(f->audit_path, sizeof(f->audit_path), "%s/audit.log", f->dir);
    if (make_objects(&f->reg, &f->tenants, &f->policy) < 0)
        return -1;
    const char *tokens[] = {"tok-a", "tok-b"};
    kvg_admin_config cfg = {
        .tokens = tokens,
        .ntokens = 2,
        .tenants = f->tenants,
        .policy = f->policy,
        .state_path = f->state_path,
        .audit_path = f->audit_path,
    };
    if (kvg_admin_new(&cfg, f->reg, &f->admin) < 0)
        return -1;
    kvg_arena_init(&f->arena, 0);
    kvg_log_set_level(KVG_LOG_ERROR); /* keep the audit lines out of the TAP output */
    *state = f;
    return 0;
}

static void remove_dir(const char *dir)
{
    static const char *const names[] = {"state.json", "audit.log", "file", "ro"};
    char path[256];
    for (size_t i = 0; i < KVG_ARRAY_LEN(names); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
        rmdir(path);
    }
    rmdir(dir);
}

static int teardown(void **state)
{
    fixture *f = *state;
    kvg_admin_free(f->admin);
    kvg_registry_free(f->reg);
    kvg_tenants_free(f->tenants);
    kvg_policy_state_free(f->policy);
    kvg_arena_done(&f->arena);
    remove_dir(f->dir);
    free(f);
    return 0;
}

typedef struct reply {
    int status;
    const char *content_type;
    const char *allow;
    const char *www_authenticate;
    const char *cache_control;
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
        .cache_control = resp.cache_control,
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

/* The error log, for tests that provoke errors on purpose: off, then back. */
static int saved_stderr = -1;

static void quiet_stderr(void)
{
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    assert_true(null >= 0);
    saved_stderr = dup(2);
    assert_true(saved_stderr >= 0);
    assert_true(dup2(null, 2) >= 0);
    close(null);
}

static void restore_stderr(void)
{
    assert_true(dup2(saved_stderr, 2) >= 0);
    close(saved_stderr);
    saved_stderr = -1;
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

/* Before the body: what kvg_admin_handle would do up to authentication, nothing more. */
static void test_preauthorize(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *method, *path, *auth;
        int status; /* 0: may go on */
        const char *www;
    } cases[] = {
        {"PUT", "/admin/v1/workers/w1", NULL, 401, "Bearer realm=\"kvgate-admin\""},
        {"PUT", "/admin/v1/workers/w1", "Bearer tok-c", 401,
         "Bearer realm=\"kvgate-admin\", error=\"invalid_token\""},
        {"POST", "/admin/v1/route/explain?x=1", "Basic eA==", 401, "Bearer realm=\"kvgate-admin\""},
        {"PUT", "/admin/v1/nothing", NULL, 401, "Bearer realm=\"kvgate-admin\""},
        {"PUT", "/admin/v1/workers/w1", AUTH, 0, NULL},
        {"PUT", "/admin/v1/tenants/t1", "bearer  tok-b ", 0, NULL},
        {"POST", "/healthz", NULL, 0, NULL}, /* probes answer anyone, as in kvg_admin_handle */
        {"GET", "/readyz?verbose", NULL, 0, NULL},
        {NULL, "/admin/v1/workers", NULL, 0, NULL}, /* kvg_admin_handle answers 400 */
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        kvg_admin_request req = {.method = cases[i].method,
                                 .path = cases[i].path,
                                 .authorization = cases[i].auth,
                                 .remote = "192.0.2.7:1"};
        kvg_admin_response resp;
        memset(&resp, 0xa5, sizeof(resp));
        bool go = kvg_admin_preauthorize(f->admin, &req, &resp);
        if (go != (cases[i].status == 0))
            fail_msg("case %zu (%s %s): preauthorize said %d", i, cases[i].method, cases[i].path,
                     go);
        if (go)
            continue;
        assert_int_equal(resp.status, cases[i].status);
        assert_string_equal(resp.www_authenticate, cases[i].www);
        assert_string_equal(resp.content_type, "application/json");
        assert_non_null(strstr(resp.body.data, "\"authentication_error\""));
        kvg_admin_response_done(&resp);
        /* The full handler gives the same answer. */
        reply r = call(f, cases[i].method, cases[i].path, cases[i].auth, NULL);
        assert_int_equal(r.status, cases[i].status);
        assert_string_equal(r.www_authenticate, cases[i].www);
    }
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
        "/admin/v1/tenants/",
        "/admin/v1/tenants//keys",
        "/admin/v1/tenants/a/",
        "/admin/v1/tenants/a/key",
        "/admin/v1/tenants/a/keys/",
        "/admin/v1/tenants/a/keys/k1/x",
        "/admin/v1/tenantsx",
        "/admin/v1/policy/",
        "/admin/v1/policyx",
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
    static const struct {
        const char *method, *path, *allow;
    } wrong[] = {
        {"POST", "/admin/v1/tenants", "GET"},
        {"POST", "/admin/v1/tenants/a", "GET, PUT, DELETE"},
        {"GET", "/admin/v1/tenants/a/keys", "POST"},
        {"GET", "/admin/v1/tenants/a/keys/k1", "DELETE"},
        {"DELETE", "/admin/v1/policy", "GET, PUT"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(wrong); i++) {
        r = call(f, wrong[i].method, wrong[i].path, AUTH, NULL);
        assert_error(&r, 405, "invalid_request_error", "method ");
        assert_string_equal(r.allow, wrong[i].allow);
    }
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
                                "\"cache_salt\":true,\"source\":\"admin\",\"health\":\"up\","
                                "\"draining\":false,\"inflight\":0}");
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

/* Read a whole file (caller frees); NULL when it does not exist. */
static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    kvg_buf b;
    kvg_buf_init(&b);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
        kvg_buf_append(&b, chunk, n);
    fclose(fp);
    kvg_buf_putc(&b, '\0');
    assert_false(b.failed);
    return kvg_buf_steal(&b, NULL);
}

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

/* ---- policy ------------------------------------------------------------------------------- */

static void test_policy(void **state)
{
    fixture *f = *state;
    reply r = call(f, "GET", "/admin/v1/policy", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "policy"), "cost");
    assert_null(r.cache_control);
    /* every setting, the defaults */
    assert_string_equal(r.body, "{\"policy\":\"cost\",\"block_bytes\":64,\"block_tokens\":16,"
                                "\"max_blocks\":4096,\"cold_blocks\":4,\"load_factor\":0.5,"
                                "\"prefill_cost_per_block\":200,\"queue_cost_per_request\":1000,"
                                "\"waiting_cost_per_request\":5000,\"kv_usage_cost\":0}");

    r = call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"round_robin\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "policy"), "round_robin");
    kvg_policy_config cfg;
    kvg_policy_state_get(f->policy, &cfg);
    assert_int_equal(cfg.kind, KVG_POLICY_ROUND_ROBIN);

    /* omitted fields keep their value */
    r = call(f, "PUT", "/admin/v1/policy", AUTH, "{}");
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "policy"), "round_robin");
    r = call(f, "PUT", "/admin/v1/policy", AUTH, "{\"load_factor\":0.5,\"cold_blocks\":2}");
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "policy"), "round_robin");
    assert_int_equal(int_field(&r, "cold_blocks"), 2);
    kvg_policy_state_get(f->policy, &cfg);
    assert_true(cfg.load_factor == 0.5);
    assert_int_equal(cfg.cold_blocks, 2);

    static const body_case cases[] = {
        {"", "body: must be a JSON object"},
        {"[1]", "body: must be a JSON object"},
        {"{\"policy\":\"random\",\"policy\":\"random\"}", "body: invalid JSON"},
        {"{\"policy\":\"fastest\"}", "policy: unknown policy"},
        {"{\"policy\":3}", "policy: must be a string"},
        {"{\"weights\":{}}", "weights: unknown field"},
        {"{\"block_bytes\":1.5}", "block_bytes: must be an integer in 16..65536"},
        {"{\"load_factor\":-1}", "load_factor: must be a number in 0..100"},
        {"{\"policy\":\"cost\",\"kv_usage_cost\":\"x\"}", "kv_usage_cost: must be a number"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        r = call(f, "PUT", "/admin/v1/policy", AUTH, cases[i].body);
        assert_error(&r, 400, "invalid_request_error", cases[i].msg);
    }
    kvg_policy_state_get(f->policy, &cfg);
    assert_int_equal(cfg.kind, KVG_POLICY_ROUND_ROBIN);
    r = call(f, "GET", "/admin/v1/policy", AUTH, NULL);
    assert_string_equal(r.body,
                        "{\"policy\":\"round_robin\",\"block_bytes\":64,\"block_tokens\":16,"
                        "\"max_blocks\":4096,\"cold_blocks\":2,\"load_factor\":0.5,"
                        "\"prefill_cost_per_block\":200,\"queue_cost_per_request\":1000,"
                        "\"waiting_cost_per_request\":5000,\"kv_usage_cost\":0}");
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

/* ---- no tenant store, no policy ----------------------------------------------------------- */

static void test_without_tenants(void **state)
{
    fixture *f = *state;
    const char *tokens[] = {"tok-a"};
    kvg_admin_config cfg = {.tokens = tokens, .ntokens = 1};
    kvg_admin *a;
    assert_int_equal(kvg_admin_new(&cfg, f->reg, &a), 0);
    static const char *const paths[] = {"/admin/v1/tenants", "/admin/v1/tenants/x",
                                        "/admin/v1/policy"};
    for (size_t i = 0; i < KVG_ARRAY_LEN(paths); i++) {
        kvg_admin_request req = {.method = "GET", .path = paths[i], .authorization = AUTH};
        kvg_admin_response resp;
        kvg_admin_handle(a, &req, &resp);
        assert_int_equal(resp.status, 404);
        kvg_admin_response_done(&resp);
    }
    kvg_admin_request req = {.method = "GET", .path = "/metrics", .authorization = AUTH};
    kvg_admin_response resp;
    kvg_admin_handle(a, &req, &resp);
    assert_int_equal(resp.status, 200);
    kvg_admin_response_done(&resp);
    /* no state file: nothing to load */
    char msg[128];
    assert_int_equal(kvg_admin_load_state(a, msg, sizeof(msg)), 0);
    kvg_admin_free(a);

    /* an audit log that cannot be opened fails creation */
    cfg.audit_path = "/nonexistent-kvg-dir/audit.log";
    a = (kvg_admin *)(uintptr_t)1;
    assert_int_equal(kvg_admin_new(&cfg, f->reg, &a), -ENOENT);
    assert_ptr_equal(a, (kvg_admin *)(uintptr_t)1);
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
    const char *tn = strstr(r.body, "# TYPE kvgate_tenants gauge\n");
    const char *a = strstr(r.body, "gw_a_total 42\n");
    const char *b = strstr(r.body, "gw_b 1\n");
    assert_non_null(up);
    assert_non_null(tn);
    assert_non_null(a);
    assert_non_null(b);
    /* registry first, then tenants, then writers in registration order */
    assert_true(up < tn && tn < a && a < b);
    assert_true(r.body[r.len - 1] == '\n');

    /* per-tenant series, with the label cap */
    const char *tokens[] = {"tok-a"};
    kvg_admin_config cfg = {
        .tokens = tokens, .ntokens = 1, .tenants = f->tenants, .tenant_label_cap = 2};
    kvg_admin *capped;
    assert_int_equal(kvg_admin_new(&cfg, f->reg, &capped), 0);
    static const char *const ids[] = {"t0", "t1", "t2"};
    for (size_t i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/admin/v1/tenants/%s", ids[i]);
        assert_int_equal(call(f, "PUT", path, AUTH, "{}").status, 201);
        kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
        kvg_tenant_record(kvg_tenant_set_find(set, ids[i]), 200, 100);
        kvg_tenant_set_unref(set);
    }
    kvg_admin *fixture_admin = f->admin;
    f->admin = capped;
    r = call(f, "GET", "/metrics", AUTH, NULL);
    f->admin = fixture_admin;
    kvg_admin_free(capped);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "tenant=\"t0\""));
    assert_non_null(strstr(r.body, "tenant=\"t1\""));
    assert_non_null(strstr(r.body, "tenant=\"other\""));
    assert_null(strstr(r.body, "tenant=\"t2\""));
    r = call(f, "GET", "/metrics", AUTH, NULL); /* the default cap: 100 */
    assert_non_null(strstr(r.body, "tenant=\"t2\""));

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

/* Keys created while the log was captured: none may show up in it. */
static char audit_keys[2][KVG_KEY_LEN + 1];
static char audit_key_id[KVG_KEY_ID_LEN + 1];

static void audit_actions(fixture *f)
{
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}");
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:2\"}");
    call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"https://h:2\"}");
    call(f, "POST", "/admin/v1/workers/w1/drain", AUTH, NULL);
    call(f, "DELETE", "/admin/v1/workers/w1", AUTH, NULL);
    call(f, "GET", "/admin/v1/workers", "Bearer tok-secret-typo", NULL);
    call(f, "GET", "/admin/v1/workers", AUTH, NULL);
    call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{\"sharing\":\"group\",\"group\":\"g1\"}");
    call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{\"sharing\":\"everyone\"}");
    reply r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    snprintf(audit_keys[0], sizeof(audit_keys[0]), "%s", str_field(&r, "key"));
    snprintf(audit_key_id, sizeof(audit_key_id), "%s", str_field(&r, "id"));
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, "{}");
    snprintf(audit_keys[1], sizeof(audit_keys[1]), "%s", str_field(&r, "key"));
    char path[128];
    snprintf(path, sizeof(path), "/admin/v1/tenants/acme/keys/%s", audit_key_id);
    call(f, "DELETE", path, AUTH, NULL);
    call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}");
    call(f, "DELETE", "/admin/v1/tenants/acme", AUTH, NULL);
    call(f, "DELETE", "/admin/v1/tenants/bad\"id\n", AUTH, NULL);
    /* the key itself sent as if it were a tenant id */
    snprintf(path, sizeof(path), "/admin/v1/tenants/%s", audit_keys[1]);
    call(f, "GET", path, AUTH, NULL);
    call(f, "DELETE", path, AUTH, NULL);
    call(f, "PUT", "/admin/v1/tenants/x", "Bearer wrong", "{}"); /* not authenticated: no line */
    call(f, "GET", "/admin/v1/tenants", AUTH, NULL);             /* a read: no line */
}

typedef struct audit_want {
    const char *action, *target;
    int status;
    const char *detail; /* prefix */
} audit_want;

static void test_audit_log(void **state)
{
    fixture *f = *state;
    char *log = capture_stderr(audit_actions, f);
    char *file = slurp(f->audit_path);
    assert_non_null(file);
    char key_target[64];
    snprintf(key_target, sizeof(key_target), "acme/%s", audit_key_id);
    const audit_want want[] = {
        {"worker.put", "w1", 201, "created url=http://h:1"},
        {"worker.put", "w1", 200, "replaced url=http://h:2"},
        {"worker.put", "w1", 400, "url: https is not supported"},
        {"worker.drain", "w1", 200, "draining"},
        {"worker.delete", "w1", 204, "deleted"},
        {"tenant.put", "acme", 201, "created sharing=group:g1"},
        {"tenant.put", "acme", 400, "sharing: must be"},
        {"key.create", key_target, 201, "created"},
        {"key.create", "acme/", 201, "created"},
        {"key.delete", key_target, 204, "deleted"},
        {"policy.put", "policy", 200, "policy=random"},
        {"tenant.delete", "acme", 204, "deleted"},
        {"tenant.delete", "bad\"id\n", 400, "id: "},
        {"tenant.delete", "kvg-[redacted]", 404, "tenant \"kvg-[redacted]\" not found"},
    };

    /* the file: one JSON object per line, exactly these fields */
    size_t n = 0;
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    for (char *line = file, *nl; (nl = strchr(line, '\n')); line = nl + 1, n++) {
        assert_true(n < KVG_ARRAY_LEN(want));
        kvg_json *v;
        kvg_json_error err;
        if (kvg_json_parse(line, (size_t)(nl - line), &arena, NULL, &v, &err) != 0)
            fail_msg("audit line %zu is not JSON (%s): %.*s", n, err.message, (int)(nl - line),
                     line);
        assert_int_equal(v->type, KVG_JSON_OBJECT);
        assert_int_equal(v->u.obj.count, 6);
        static const char *const names[] = {"time",   "remote", "action",
                                            "target", "status", "detail"};
        for (size_t k = 0; k < 6; k++)
            assert_string_equal(v->u.obj.keys[k], names[k]);
        const char *ts = kvg_json_get(v, "time")->u.str.ptr;
        assert_int_equal(strlen(ts), 24);
        assert_true(ts[4] == '-' && ts[10] == 'T' && ts[19] == '.' && ts[23] == 'Z');
        assert_string_equal(kvg_json_get(v, "remote")->u.str.ptr, "192.0.2.7:5555");
        assert_string_equal(kvg_json_get(v, "action")->u.str.ptr, want[n].action);
        const char *target = kvg_json_get(v, "target")->u.str.ptr;
        if (strncmp(target, want[n].target, strlen(want[n].target)) != 0)
            fail_msg("line %zu: target %s, expected %s", n, target, want[n].target);
        assert_int_equal(kvg_json_get(v, "status")->u.num.ival, want[n].status);
        const char *detail = kvg_json_get(v, "detail")->u.str.ptr;
        if (strncmp(detail, want[n].detail, strlen(want[n].detail)) != 0)
            fail_msg("line %zu: detail \"%s\", expected \"%s\"", n, detail, want[n].detail);
        /* the same line went to the error log */
        char *copy = kvg_arena_strndup(&arena, line, (size_t)(nl - line));
        if (!strstr(log, copy))
            fail_msg("audit line %zu not in the error log:\n%s", n, log);
    }
    assert_int_equal(n, KVG_ARRAY_LEN(want));
    kvg_arena_done(&arena);

    /* the error log: those lines at info level, plus the authentication failures as warnings */
    size_t lines = 0, audit = 0;
    for (const char *p = log; (p = strchr(p, '\n')); p++)
        lines++;
    for (const char *p = log; (p = strstr(p, "[info] admin: audit {\"time\":")); p++)
        audit++;
    assert_int_equal(audit, KVG_ARRAY_LEN(want));
    assert_non_null(strstr(log, "[warn] admin: remote=192.0.2.7:5555 GET /admin/v1/workers: "
                                "authentication failed: invalid admin token\n"));
    assert_int_equal(lines, audit + 2);

    /* never a token, never key material */
    for (int i = 0; i < 2; i++) {
        const char *secret = audit_keys[i] + strlen(KVG_KEY_PREFIX);
        assert_null(strstr(log, secret));
        assert_null(strstr(file, secret));
    }
    for (const char *p = file; (p = strstr(p, "kvg-")); p++)
        assert_memory_equal(p, "kvg-[redacted]", 14);
    for (const char *p = log; (p = strstr(p, "kvg-")); p++)
        assert_memory_equal(p, "kvg-[redacted]", 14);
    assert_null(strstr(log, "tok-a"));
    assert_null(strstr(log, "tok-secret-typo"));
    free(file);
    free(log);
}

/* ---- the state file ------------------------------------------------------------------------ */

static void assert_saved(fixture *f, const char *must_contain)
{
    char *text = slurp(f->state_path);
    if (!text)
        fail_msg("no state file after a change");
    if (!strstr(text, must_contain))
        fail_msg("state file lacks %s:\n%s", must_contain, text);
    free(text);
}

static void test_persistence(void **state)
{
    fixture *f = *state;
    char msg[256];
    /* no file yet: a fresh start */
    assert_null(slurp(f->state_path));
    assert_int_equal(kvg_admin_load_state(f->admin, msg, sizeof(msg)), 0);
    /* reads save nothing */
    call(f, "GET", "/admin/v1/tenants", AUTH, NULL);
    assert_null(slurp(f->state_path));

    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/acme", AUTH,
                          "{\"sharing\":\"group\",\"group\":\"g1\",\"models\":[\"m\"],"
                          "\"rate\":{\"rps\":2.5,\"burst\":10},\"max_inflight\":3}")
                         .status,
                     201);
    assert_saved(f, "\"acme\"");
    struct stat st;
    assert_int_equal(stat(f->state_path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    reply r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    assert_int_equal(r.status, 201);
    char key[KVG_KEY_LEN + 1], key_id[KVG_KEY_ID_LEN + 1];
    snprintf(key, sizeof(key), "%s", str_field(&r, "key"));
    snprintf(key_id, sizeof(key_id), "%s", str_field(&r, "id"));
    assert_saved(f, key_id);
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/gone", AUTH, "{}").status, 201);
    assert_saved(f, "\"gone\"");
    assert_int_equal(call(f, "DELETE", "/admin/v1/tenants/gone", AUTH, NULL).status, 204);
    char *text = slurp(f->state_path);
    assert_null(strstr(text, "\"gone\""));
    free(text);
    assert_int_equal(call(f, "PUT", "/admin/v1/workers/w1", AUTH,
                          "{\"url\":\"http://h:1\",\"models\":[\"m\"],\"kv_blocks\":7,"
                          "\"cache_salt\":false}")
                         .status,
                     201);
    assert_saved(f, "\"w1\"");
    assert_int_equal(
        call(f, "PUT", "/admin/v1/workers/w2", AUTH, "{\"url\":\"http://h:2\"}").status, 201);
    assert_int_equal(call(f, "DELETE", "/admin/v1/workers/w2", AUTH, NULL).status, 204);
    text = slurp(f->state_path);
    assert_null(strstr(text, "\"w2\""));
    free(text);
    assert_int_equal(call(f, "POST", "/admin/v1/workers/w1/drain", AUTH, NULL).status, 200);
    assert_int_equal(
        call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"round_robin\"}").status, 200);
    assert_saved(f, "round_robin");

    /* the file: version 1 and the three sections */
    text = slurp(f->state_path);
    kvg_json *root;
    assert_int_equal(kvg_json_parse(text, strlen(text), &f->arena, NULL, &root, NULL), 0);
    assert_int_equal(kvg_json_get(root, "version")->u.num.ival, 1);
    assert_int_equal(kvg_json_get(root, "tenants")->type, KVG_JSON_ARRAY);
    assert_int_equal(kvg_json_get(root, "workers")->type, KVG_JSON_ARRAY);
    assert_int_equal(kvg_json_get(root, "policy")->type, KVG_JSON_OBJECT);
    assert_null(strstr(text, key + strlen(KVG_KEY_PREFIX)));
    free(text);

    /* a restart: fresh objects, the same file */
    kvg_registry *reg;
    kvg_tenants *tenants;
    kvg_policy_state *policy;
    assert_int_equal(make_objects(&reg, &tenants, &policy), 0);
    const char *tokens[] = {"tok-a"};
    kvg_admin_config cfg = {.tokens = tokens,
                            .ntokens = 1,
                            .tenants = tenants,
                            .policy = policy,
                            .state_path = f->state_path};
    kvg_admin *a;
    assert_int_equal(kvg_admin_new(&cfg, reg, &a), 0);
    assert_int_equal(kvg_admin_load_state(a, msg, sizeof(msg)), 0);

    kvg_tenant_set *set = kvg_tenants_acquire(tenants);
    assert_int_equal(kvg_tenant_set_count(set), 1);
    kvg_tenant *t = kvg_tenant_set_authenticate(set, key, strlen(key));
    assert_non_null(t);
    assert_string_equal(kvg_tenant_id(t), "acme");
    assert_int_equal(kvg_tenant_sharing(t), KVG_SHARING_GROUP);
    assert_string_equal(kvg_tenant_group(t), "g1");
    assert_int_equal(kvg_tenant_model_count(t), 1);
    assert_true(kvg_tenant_limits_of(t)->rps == 2.5);
    assert_true(kvg_tenant_limits_of(t)->burst == 10);
    assert_int_equal(kvg_tenant_limits_of(t)->max_inflight, 3);
    assert_int_equal(kvg_tenant_key_count(t), 1);
    assert_string_equal(kvg_tenant_key(t, 0)->id, key_id);
    kvg_tenant_set_unref(set);

    kvg_worker_set *ws = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_count(ws), 1);
    kvg_worker *w = kvg_worker_set_find(ws, "w1");
    assert_non_null(w);
    assert_string_equal(kvg_worker_url(w), "http://h:1");
    assert_int_equal(kvg_worker_kv_blocks(w), 7);
    assert_int_equal(kvg_worker_source_of(w), KVG_WORKER_SOURCE_ADMIN);
    assert_false(kvg_worker_injects_salt(w));
    kvg_worker_set_unref(ws);

    kvg_policy_config pc;
    kvg_policy_state_get(policy, &pc);
    assert_int_equal(pc.kind, KVG_POLICY_ROUND_ROBIN);

    /* what the restored admin answers and saves next is the same state */
    kvg_admin_request req = {
        .method = "GET", .path = "/admin/v1/tenants/acme", .authorization = AUTH};
    kvg_admin_response resp;
    kvg_admin_handle(a, &req, &resp);
    assert_int_equal(resp.status, 200);
    assert_non_null(strstr(resp.body.data, key_id));
    kvg_admin_response_done(&resp);
    kvg_admin_free(a);
    kvg_registry_free(reg);
    kvg_tenants_free(tenants);
    kvg_policy_state_free(policy);
}

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void test_load_errors(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *text;
        int rc;
        const char *msg; /* after "state file PATH: " */
    } cases[] = {
        {"", KVG_EPARSE, "invalid JSON at byte 0"},
        {"{\"version\":1", KVG_EPARSE, "invalid JSON at byte"},
        {"[]", KVG_EPARSE, "must be a JSON object"},
        {"{}", KVG_EPARSE, "version: required"},
        {"{\"version\":2}", KVG_EPARSE, "version: must be 1"},
        {"{\"version\":\"1\"}", KVG_EPARSE, "version: must be 1"},
        {"{\"version\":1,\"version\":1}", KVG_EPARSE, "invalid JSON"},
        {"{\"version\":1,\"extra\":[]}", KVG_EPARSE, "extra: unknown field"},
        {"{\"version\":1,\"tenants\":{}}", KVG_EPARSE, "tenants: must be an array"},
        {"{\"version\":1,\"workers\":null}", KVG_EPARSE, "workers: must be an array"},
        {"{\"version\":1,\"policy\":[]}", KVG_EPARSE, "policy: must be an object"},
        {"{\"version\":1,\"policy\":{\"policy\":\"zzz\"}}", KVG_EPARSE, "policy: policy: "},
        {"{\"version\":1,\"policy\":{\"max_blocks\":0}}", KVG_EPARSE,
         "policy: max_blocks: must be an integer in 1..1048576"},
        {"{\"version\":1,\"tenants\":[{\"nonsense\":1}]}", KVG_EPARSE, "tenants: "},
        {"{\"version\":1,\"workers\":[{\"name\":\"w\"}]}", KVG_EPARSE, "workers: "},
    };
    char msg[512], prefix[200];
    snprintf(prefix, sizeof(prefix), "state file %s: ", f->state_path);
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        write_file(f->state_path, cases[i].text);
        msg[0] = '\0';
        int rc = kvg_admin_load_state(f->admin, msg, sizeof(msg));
        if (rc != cases[i].rc || strncmp(msg, prefix, strlen(prefix)) != 0 ||
            strncmp(msg + strlen(prefix), cases[i].msg, strlen(cases[i].msg)) != 0)
            fail_msg("case %zu (%s): rc %d, message \"%s\"", i, cases[i].text, rc, msg);
    }
    /* nothing was applied by the bad files */
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    assert_int_equal(kvg_tenant_set_count(set), 0);
    kvg_tenant_set_unref(set);
    kvg_policy_config pc;
    kvg_policy_state_get(f->policy, &pc);
    assert_int_equal(pc.kind, KVG_POLICY_COST);

    /* sections may be absent */
    write_file(f->state_path, "{\"version\":1}\n");
    assert_int_equal(kvg_admin_load_state(f->admin, msg, sizeof(msg)), 0);
    write_file(f->state_path, "{\"version\":1,\"policy\":{\"policy\":\"random\"}}");
    assert_int_equal(kvg_admin_load_state(f->admin, msg, sizeof(msg)), 0);
    kvg_policy_state_get(f->policy, &pc);
    assert_int_equal(pc.kind, KVG_POLICY_RANDOM);

    /* a folder where the file should be */
    unlink(f->state_path);
    assert_int_equal(mkdir(f->state_path, 0700), 0);
    assert_true(kvg_admin_load_state(f->admin, msg, sizeof(msg)) < 0);
    assert_non_null(strstr(msg, "cannot read it"));
    rmdir(f->state_path);
}

static void test_state_write_failure(void **state)
{
    fixture *f = *state;
    /* the state file's folder is a plain file: every write fails */
    char path[200], file[160];
    snprintf(file, sizeof(file), "%s/file", f->dir);
    write_file(file, "x");
    snprintf(path, sizeof(path), "%s/state.json", file);
    const char *tokens[] = {"tok-a"};
    kvg_admin_config cfg = {.tokens = tokens,
                            .ntokens = 1,
                            .tenants = f->tenants,
                            .policy = f->policy,
                            .state_path = path,
                            .audit_path = f->audit_path};
    kvg_admin *a;
    assert_int_equal(kvg_admin_new(&cfg, f->reg, &a), 0);
    kvg_admin *good = f->admin;
    f->admin = a;
    quiet_stderr();

    reply r = call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{}");
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved: ");
    assert_non_null(strstr(str_field(&r, "error.message"), path));
    assert_int_equal(call(f, "GET", "/admin/v1/tenants/acme", AUTH, NULL).status, 200);
    r = call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}");
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved");
    r = call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}");
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved");
    r = call(f, "DELETE", "/admin/v1/workers/w1", AUTH, NULL);
    assert_error(&r, 500, "server_error", "the change is applied but could not be saved");

    /* a key that cannot be saved is not handed out, and does not exist */
    r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    assert_error(&r, 500, "server_error", "the key could not be saved, so it was not created");
    assert_null(kvg_json_get(r.json, "key"));
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    assert_int_equal(kvg_tenant_key_count(kvg_tenant_set_find(set, "acme")), 0);
    kvg_tenant_set_unref(set);
    /* rejected changes do not try to save */
    r = call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{\"x\":1}");
    assert_int_equal(r.status, 400);

    /* the audit log tells */
    char *audit = slurp(f->audit_path);
    assert_non_null(strstr(audit, "\"action\":\"tenant.put\",\"target\":\"acme\",\"status\":500,"
                                  "\"detail\":\"the change is applied but could not be saved"));
    assert_non_null(strstr(audit, "\"action\":\"key.create\",\"target\":\"acme/k"));
    free(audit);
    restore_stderr();
    f->admin = good;
    kvg_admin_free(a);
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
        /* a delete applied but not saved (500) answers 404 when tried again */
        {"DELETE", "/admin/v1/workers/w1", AUTH, NULL, 204, 404},
        {"PUT", "/admin/v1/tenants/t1", AUTH,
         "{\"sharing\":\"group\",\"group\":\"g\",\"models\":[\"a\"],\"rate\":{\"rps\":1}}", 201,
         200},
        {"PUT", "/admin/v1/tenants/t1", AUTH, "{\"max_inflight\":4}", 200, 200},
        {"PUT", "/admin/v1/tenants/t1", AUTH, "{\"sharing\":\"nope\"}", 400, 400},
        {"POST", "/admin/v1/tenants/t1/keys", AUTH, NULL, 201, 201},
        {"GET", "/admin/v1/tenants", AUTH, NULL, 200, 200},
        {"GET", "/admin/v1/tenants/t1", AUTH, NULL, 200, 200},
        {"GET", "/metrics", AUTH, NULL, 200, 200},
        {"GET", "/admin/v1/policy", AUTH, NULL, 200, 200},
        {"PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}", 200, 200},
        {"DELETE", "/admin/v1/tenants/t1", AUTH, NULL, 204, 404},
    };
    long injections = 0;
    quiet_stderr(); /* "applied but not saved" errors */
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
            uint64_t tg = kvg_tenants_generation(f->tenants);
            fail_alloc_nth(n);
            kvg_admin_handle(f->admin, &req, &resp);
            bool injected = fail_alloc_off();
            injections += injected;
            assert_non_null(resp.content_type);
            assert_false(resp.body.failed);
            if (kvg_registry_generation(f->reg) != g || kvg_tenants_generation(f->tenants) != tg)
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

    restore_stderr();
    assert_true(injections > 20);
    print_message("# %ld allocation failures injected\n", injections);
    /* a change applied but not saved (a 500) is saved with the next change that succeeds */
    assert_int_equal(call(f, "PUT", "/admin/v1/policy", AUTH, "{}").status, 200);
    char *saved = slurp(f->state_path);
    assert_non_null(saved);
    assert_non_null(strstr(saved, "random"));
    assert_null(strstr(saved, "\"t1\""));
    free(saved);

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

/* Restoring under allocation failures: all or nothing per section, never a crash or a leak. */
static void test_load_alloc_failures(void **state)
{
    fixture *f = *state;
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/a", AUTH, "{\"models\":[\"m\"]}").status,
                     201);
    assert_int_equal(call(f, "POST", "/admin/v1/tenants/a/keys", AUTH, NULL).status, 201);
    assert_int_equal(
        call(f, "PUT", "/admin/v1/tenants/b", AUTH, "{\"sharing\":\"group\",\"group\":\"g\"}")
            .status,
        201);
    assert_int_equal(call(f, "PUT", "/admin/v1/workers/w", AUTH, "{\"url\":\"http://h:1\"}").status,
                     201);
    assert_int_equal(call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}").status,
                     200);
    long injections = 0;
    for (long n = 0;; n++) {
        kvg_registry *reg;
        kvg_tenants *tenants;
        kvg_policy_state *policy;
        assert_int_equal(make_objects(&reg, &tenants, &policy), 0);
        const char *tokens[] = {"t"};
        kvg_admin_config cfg = {.tokens = tokens,
                                .ntokens = 1,
                                .tenants = tenants,
                                .policy = policy,
                                .state_path = f->state_path};
        kvg_admin *a;
        assert_int_equal(kvg_admin_new(&cfg, reg, &a), 0);
        char msg[256];
        fail_alloc_nth(n);
        int rc = kvg_admin_load_state(a, msg, sizeof(msg));
        bool injected = fail_alloc_off();
        injections += injected;
        if (!injected)
            assert_int_equal(rc, 0);
        else if (rc != 0 && rc != -ENOMEM)
            fail_msg("allocation %ld: %d %s", n, rc, msg);
        if (!injected || rc == 0) {
            kvg_tenant_set *set = kvg_tenants_acquire(tenants);
            assert_int_equal(kvg_tenant_set_count(set), 2);
            kvg_tenant_set_unref(set);
        }
        kvg_admin_free(a);
        kvg_registry_free(reg);
        kvg_tenants_free(tenants);
        kvg_policy_state_free(policy);
        if (!injected)
            break;
    }
    assert_true(injections > 5);
    print_message("# %ld allocation failures injected while loading\n", injections);
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

/* Changes from several threads: each saves the whole state, and the file after the last one
 * must hold every change (no slower writer puts an older state back). */
typedef struct changer_arg {
    fixture *f;
    int id;
    int failures;
} changer_arg;

#define CHANGES_PER_THREAD 40

static void *changer(void *p)
{
    changer_arg *ca = p;
    for (int i = 0; i < CHANGES_PER_THREAD; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/admin/v1/tenants/t%d-%d", ca->id, i);
        kvg_admin_request put = {.method = "PUT",
                                 .path = path,
                                 .authorization = AUTH,
                                 .body = "{}",
                                 .body_len = 2,
                                 .remote = "thread"};
        kvg_admin_response resp;
        kvg_admin_handle(ca->f->admin, &put, &resp);
        ca->failures += resp.status != 201;
        kvg_admin_response_done(&resp);
        strcat(path, "/keys");
        kvg_admin_request key = {.method = "POST", .path = path, .authorization = AUTH};
        kvg_admin_handle(ca->f->admin, &key, &resp);
        ca->failures += resp.status != 201;
        kvg_admin_response_done(&resp);
    }
    return NULL;
}

static void test_concurrent_changes(void **state)
{
    fixture *f = *state;
    pthread_t th[4];
    changer_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (changer_arg){.f = f, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, changer, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    char *text = slurp(f->state_path);
    kvg_json *root;
    assert_int_equal(kvg_json_parse(text, strlen(text), &f->arena, NULL, &root, NULL), 0);
    const kvg_json *tenants = kvg_json_get(root, "tenants");
    assert_int_equal(tenants->u.arr.count, 4 * CHANGES_PER_THREAD);
    for (size_t i = 0; i < tenants->u.arr.count; i++) {
        const kvg_json *keys = kvg_json_get(tenants->u.arr.items[i], "keys");
        assert_non_null(keys);
        assert_int_equal(keys->u.arr.count, 1);
    }
    free(text);
    /* and the audit log has one whole line per change */
    char *audit = slurp(f->audit_path);
    size_t lines = 0;
    for (const char *p = audit; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, 2 * 4 * CHANGES_PER_THREAD);
    free(audit);
}

/* The names in a path are checked as the parameter they stand for, wherever it stands; an
 * empty one makes no path at all: 404 whatever the method, and no audit line. */
static void test_route_params(void **state)
{
    fixture *f = *state;
    reply r = call(f, "POST", "/admin/v1/workers/a%20b/drain", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error", "name: invalid character '%'");
    r = call(f, "DELETE", "/admin/v1/tenants/a%20b/keys/kaaaaaaaaaaaaaaa", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error", "id: invalid character '%'");
    r = call(f, "DELETE", "/admin/v1/tenants/acme/keys/K1", AUTH, NULL);
    assert_error(&r, 400, "invalid_request_error",
                 "key id: invalid character; key ids are [a-z0-9]");
    static const char *const methods[] = {"PUT", "DELETE", "PATCH"};
    static const char *const empty[] = {"/admin/v1/workers/", "/admin/v1/tenants/"};
    for (size_t i = 0; i < KVG_ARRAY_LEN(methods); i++) {
        for (size_t j = 0; j < KVG_ARRAY_LEN(empty); j++) {
            r = call(f, methods[i], empty[j], AUTH, "{}");
            assert_error(&r, 404, "not_found_error", "no such endpoint");
            assert_null(r.allow);
        }
    }
    /* the three refused changes above, and nothing for the paths that do not exist */
    char *log = slurp(f->audit_path);
    assert_non_null(log);
    size_t lines = 0;
    for (const char *p = log; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, 3);
    assert_null(strstr(log, "\"target\":\"\""));
    free(log);
}

int main(void)
{
    ready_value = true;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_healthz_readyz, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_preauthorize, setup, teardown),
        cmocka_unit_test_setup_teardown(test_routing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_route_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_crud, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_limit_conflict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenants_crud, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_cache_salt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_without_tenants, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_audit_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persistence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_write_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_alloc_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_changes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
