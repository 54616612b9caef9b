/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for /healthz, /readyz and /metrics (admin/probes.c): readiness and what vetoes it,
 * the series in order, extra writers and the per-tenant label cap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "admin.h"
#include "admin_helpers.h"

static bool live_value = true;
static bool live_cb(void *ud, char *why, size_t len)
{
    snprintf(why, len, "loop 1 stuck");
    return *(bool *)ud;
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
    /* the liveness callback can fail it, with its reason */
    kvg_admin_set_live(f->admin, live_cb, &live_value);
    assert_int_equal(call(f, "GET", "/healthz", NULL, NULL).status, 200);
    live_value = false;
    r = call(f, "GET", "/healthz", NULL, NULL);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.body, "{\"status\":\"unhealthy\",\"reason\":\"loop 1 stuck\"}");
    live_value = true;
    kvg_admin_set_live(f->admin, NULL, NULL);

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

const struct CMUnitTest probes_tests[] = {
    cmocka_unit_test_setup_teardown(test_healthz_readyz, setup, teardown),
    cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
};
const size_t probes_tests_count = KVG_ARRAY_LEN(probes_tests);
