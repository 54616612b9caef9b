/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the admin API's entry point (admin/admin.c): routing, the routes an admin made
 * without a tenant store or policy lacks, allocation failures and requests on many threads; its
 * main also runs the tests of the other files, one per route file. */
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

#include "admin.h"
#include "admin_helpers.h"
#include "fail_alloc.h"
#include "test_parts.h"

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
        cmocka_unit_test_setup_teardown(test_routing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_route_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_without_tenants, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    const test_part parts[] = {
        {tests, KVG_ARRAY_LEN(tests)},        {probes_tests, probes_tests_count},
        {auth_tests, auth_tests_count},       {workers_tests, workers_tests_count},
        {tenants_tests, tenants_tests_count}, {policy_tests, policy_tests_count},
        {audit_tests, audit_tests_count},     {state_tests, state_tests_count},
        {shared_tests, shared_tests_count},
    };
    return run_test_parts(parts, KVG_ARRAY_LEN(parts));
}
