/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the admin token (admin/auth.c): every way a request fails to authenticate, and
 * the check a front makes before it reads a body. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "admin.h"
#include "admin_helpers.h"

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

/* A metrics token reads GET /metrics and gets 403 everywhere else; admin tokens still read it. */
static void test_metrics_token(void **state)
{
    fixture *f = *state;
    const char *m[] = {"tok-metrics", "tok-metrics-2"};
    assert_int_equal(kvg_admin_set_metrics_tokens(f->admin, m, 2), 0);
    assert_int_equal(call(f, "GET", "/metrics", "Bearer tok-metrics", NULL).status, 200);
    assert_int_equal(call(f, "GET", "/metrics?name=x", "bearer tok-metrics-2 ", NULL).status, 200);
    assert_int_equal(call(f, "GET", "/metrics", AUTH, NULL).status, 200);
    static const struct {
        const char *method, *path;
    } elsewhere[] = {{"GET", "/admin/v1/workers"},
                     {"PUT", "/admin/v1/workers/w1"},
                     {"POST", "/metrics"},
                     {"GET", "/metricsx"},
                     {"GET", "/metrics/x"},
                     {"GET", "/admin/v1/nothing"},
                     {"DELETE", "/admin/v1/tenants/t"}};
    for (size_t i = 0; i < KVG_ARRAY_LEN(elsewhere); i++) {
        reply r = call(f, elsewhere[i].method, elsewhere[i].path, "Bearer tok-metrics", NULL);
        assert_error(&r, 403, "permission_error", "the metrics token grants GET /metrics only");
        assert_null(r.www_authenticate);
        kvg_admin_request req = {.method = elsewhere[i].method,
                                 .path = elsewhere[i].path,
                                 .authorization = "Bearer tok-metrics",
                                 .remote = "192.0.2.7:1"};
        kvg_admin_response resp;
        assert_false(kvg_admin_preauthorize(f->admin, &req, &resp));
        assert_int_equal(resp.status, 403);
        kvg_admin_response_done(&resp);
    }
    /* The probes answer anyone; a wrong token is still a 401. */
    assert_int_equal(call(f, "GET", "/healthz", "Bearer tok-metrics", NULL).status, 200);
    assert_int_equal(call(f, "GET", "/metrics", "Bearer tok-metric", NULL).status, 401);
    /* Removed: a 401 again; bad tokens are refused and the old ones kept. */
    const char *bad[] = {"has space"};
    assert_int_equal(kvg_admin_set_metrics_tokens(f->admin, bad, 1), -EINVAL);
    assert_int_equal(call(f, "GET", "/metrics", "Bearer tok-metrics", NULL).status, 200);
    assert_int_equal(kvg_admin_set_metrics_tokens(f->admin, NULL, 0), 0);
    assert_int_equal(call(f, "GET", "/metrics", "Bearer tok-metrics", NULL).status, 401);
    assert_int_equal(call(f, "GET", "/metrics", AUTH, NULL).status, 200);
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

const struct CMUnitTest auth_tests[] = {
    cmocka_unit_test_setup_teardown(test_auth, setup, teardown),
    cmocka_unit_test_setup_teardown(test_preauthorize, setup, teardown),
    cmocka_unit_test_setup_teardown(test_metrics_token, setup, teardown),
};
const size_t auth_tests_count = KVG_ARRAY_LEN(auth_tests);
