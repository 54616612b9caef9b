/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for passive outlier detection and the retry budget (router/worker.c, registry.c,
 * route.c): the pure steps first, then the worker state machine over a snapshot and routing
 * eligibility with ejected workers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "router.h"

#define MS 1000000ull

static const kvg_outlier_config cfg5 = {
    .consecutive_5xx = 5,
    .consecutive_gateway_failure = 3,
    .base_ejection_ns = 100 * MS,
    .max_ejection_ns = 250 * MS,
    .max_ejection_percent = 50,
};

static void test_result_of_status(void **state)
{
    (void)state;
    assert_int_equal(kvg_outlier_result_of_status(200), KVG_OUTLIER_SUCCESS);
    assert_int_equal(kvg_outlier_result_of_status(404), KVG_OUTLIER_SUCCESS);
    assert_int_equal(kvg_outlier_result_of_status(429), KVG_OUTLIER_SUCCESS);
    assert_int_equal(kvg_outlier_result_of_status(500), KVG_OUTLIER_5XX);
    assert_int_equal(kvg_outlier_result_of_status(501), KVG_OUTLIER_5XX);
    assert_int_equal(kvg_outlier_result_of_status(502), KVG_OUTLIER_GATEWAY_ERROR);
    assert_int_equal(kvg_outlier_result_of_status(503), KVG_OUTLIER_GATEWAY_ERROR);
    assert_int_equal(kvg_outlier_result_of_status(504), KVG_OUTLIER_GATEWAY_ERROR);
    assert_int_equal(kvg_outlier_result_of_status(599), KVG_OUTLIER_5XX);
    assert_string_equal(kvg_outlier_result_str(KVG_OUTLIER_LOCAL_FAILURE), "local_failure");
    assert_string_equal(kvg_outlier_result_str(KVG_OUTLIER_RESULT_COUNT), "?");
}

/* Streaks: 5xx counts in one, gateway errors and local failures in both; a success clears
 * both, a plain 5xx clears the gateway streak; a trip restarts them. */
static void test_step(void **state)
{
    (void)state;
    bool trip;
    uint32_t s = 0;
    for (int i = 1; i <= 4; i++) {
        s = kvg_outlier_step(s, KVG_OUTLIER_5XX, &cfg5, &trip);
        assert_false(trip);
        assert_int_equal(KVG_OUTLIER_5XX_STREAK(s), (unsigned)i);
        assert_int_equal(KVG_OUTLIER_GATEWAY_STREAK(s), 0);
    }
    s = kvg_outlier_step(s, KVG_OUTLIER_5XX, &cfg5, &trip);
    assert_true(trip);
    assert_int_equal(s, 0);

    s = kvg_outlier_step(0, KVG_OUTLIER_GATEWAY_ERROR, &cfg5, &trip);
    s = kvg_outlier_step(s, KVG_OUTLIER_LOCAL_FAILURE, &cfg5, &trip);
    assert_false(trip);
    assert_int_equal(KVG_OUTLIER_5XX_STREAK(s), 2);
    assert_int_equal(KVG_OUTLIER_GATEWAY_STREAK(s), 2);
    uint32_t t = kvg_outlier_step(s, KVG_OUTLIER_5XX, &cfg5, &trip);
    assert_false(trip);
    assert_int_equal(KVG_OUTLIER_5XX_STREAK(t), 3);
    assert_int_equal(KVG_OUTLIER_GATEWAY_STREAK(t), 0);
    s = kvg_outlier_step(s, KVG_OUTLIER_GATEWAY_ERROR, &cfg5, &trip);
    assert_true(trip); /* the gateway streak reached 3 first */
    assert_int_equal(s, 0);
    s = kvg_outlier_step(kvg_outlier_step(0, KVG_OUTLIER_5XX, &cfg5, NULL), KVG_OUTLIER_SUCCESS,
                         &cfg5, &trip);
    assert_false(trip);
    assert_int_equal(s, 0);

    /* 0 turns a detector off; streaks saturate. */
    kvg_outlier_config off = cfg5;
    off.consecutive_5xx = off.consecutive_gateway_failure = 0;
    s = 0;
    for (int i = 0; i < 70000; i++) {
        s = kvg_outlier_step(s, KVG_OUTLIER_LOCAL_FAILURE, &off, &trip);
        assert_false(trip);
    }
    assert_int_equal(KVG_OUTLIER_5XX_STREAK(s), KVG_OUTLIER_STREAK_MAX);
    assert_int_equal(KVG_OUTLIER_GATEWAY_STREAK(s), KVG_OUTLIER_STREAK_MAX);
}

static void test_ejection_time(void **state)
{
    (void)state;
    assert_int_equal(kvg_outlier_ejection_ns(&cfg5, 0), 100 * MS);
    assert_int_equal(kvg_outlier_ejection_ns(&cfg5, 1), 100 * MS);
    assert_int_equal(kvg_outlier_ejection_ns(&cfg5, 2), 200 * MS);
    assert_int_equal(kvg_outlier_ejection_ns(&cfg5, 3), 250 * MS); /* capped */
    assert_int_equal(kvg_outlier_ejection_ns(&cfg5, UINT32_MAX), 250 * MS);
    kvg_outlier_config big = {.base_ejection_ns = UINT64_MAX / 2, .max_ejection_ns = UINT64_MAX};
    assert_int_equal(kvg_outlier_ejection_ns(&big, 3), UINT64_MAX); /* no overflow */
}

static void test_may_eject(void **state)
{
    (void)state;
    assert_false(kvg_outlier_may_eject(1, 0, 100)); /* the last worker stays */
    assert_true(kvg_outlier_may_eject(2, 0, 50));
    assert_false(kvg_outlier_may_eject(2, 1, 100));
    assert_true(kvg_outlier_may_eject(3, 0, 50));
    assert_false(kvg_outlier_may_eject(3, 1, 50)); /* 2 of 3 > 50% */
    assert_true(kvg_outlier_may_eject(4, 1, 50));
    assert_false(kvg_outlier_may_eject(4, 2, 50));
    assert_true(kvg_outlier_may_eject(10, 0, 0)); /* one always may be (as Envoy) */
    assert_false(kvg_outlier_may_eject(10, 1, 10));
    assert_true(kvg_outlier_may_eject(10, 8, 100));
    assert_false(kvg_outlier_may_eject(10, 9, 100));
}

static void test_retry_budget(void **state)
{
    (void)state;
    assert_true(kvg_retry_budget_allows(0, 0, 20, 3));
    assert_true(kvg_retry_budget_allows(2, 0, 20, 3));
    assert_false(kvg_retry_budget_allows(3, 0, 20, 3));
    assert_true(kvg_retry_budget_allows(19, 100, 20, 3));
    assert_false(kvg_retry_budget_allows(20, 100, 20, 3));
    assert_false(kvg_retry_budget_allows(0, 100, 0, 0)); /* off */

    kvg_registry *reg;
    assert_int_equal(kvg_registry_new(NULL, &reg), 0);
    kvg_worker_set *set = kvg_registry_acquire(reg);
    assert_true(kvg_registry_retry_acquire(reg, set, 20, 2));
    assert_true(kvg_registry_retry_acquire(reg, set, 20, 2));
    assert_false(kvg_registry_retry_acquire(reg, set, 20, 2));
    kvg_registry_retry_release(reg);
    assert_true(kvg_registry_retry_acquire(reg, set, 20, 2));
    kvg_registry_retry_release(reg);
    kvg_registry_retry_release(reg);
    kvg_registry_retry_release(reg); /* one too many: no wrap */
    assert_true(kvg_registry_retry_acquire(reg, set, 20, 1));
    assert_false(kvg_registry_retry_acquire(reg, set, 20, 1));
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_registry_write_metrics(reg, &out);
    kvg_buf_putc(&out, '\0');
    assert_non_null(strstr(out.data, "kvgate_upstream_retries_active 1\n"));
    assert_non_null(strstr(out.data, "kvgate_upstream_retry_budget_exceeded_total 2\n"));
    kvg_buf_done(&out);
    kvg_worker_set_unref(set);
    kvg_registry_free(reg);
}

static kvg_registry *three_workers(const char *model)
{
    kvg_registry *reg;
    assert_int_equal(kvg_registry_new(NULL, &reg), 0);
    const char *const models[] = {model};
    for (int i = 0; i < 3; i++) {
        char name[8], url[32];
        snprintf(name, sizeof(name), "w%d", i);
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9100 + i);
        kvg_worker_def def = {.name = name, .url = url, .models = models, .nmodels = 1};
        assert_int_equal(kvg_registry_put(reg, &def, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    }
    return reg;
}

static void fail_n(kvg_worker *w, kvg_worker_set *set, int n, uint64_t now, bool *ejected,
                   uint64_t *len)
{
    *ejected = false;
    for (int i = 0; i < n; i++)
        if (kvg_worker_outlier_observe(w, set, KVG_OUTLIER_5XX, now, &cfg5, len))
            *ejected = true;
}

/* The state machine on a worker: eject at the threshold, out until the deadline, back after
 * it, the second ejection twice as long, capped; the multiplier restarts after a long good
 * spell; never a second worker of three at 50%. */
static void test_worker_ejection(void **state)
{
    (void)state;
    kvg_registry *reg = three_workers("m");
    kvg_worker_set *set = kvg_registry_acquire(reg);
    kvg_worker *w0 = kvg_worker_set_find(set, "w0"), *w1 = kvg_worker_set_find(set, "w1");
    uint64_t now = 1000 * MS, len = 0;
    bool ejected;
    fail_n(w0, set, 4, now, &ejected, &len);
    assert_false(ejected);
    assert_false(kvg_worker_ejected(w0, now));
    kvg_worker_outlier_state st;
    kvg_worker_outlier_get(w0, now, &st);
    assert_int_equal(st.consecutive_5xx, 4);
    fail_n(w0, set, 1, now, &ejected, &len);
    assert_true(ejected);
    assert_int_equal(len, 100 * MS);
    assert_true(kvg_worker_ejected(w0, now + 99 * MS));
    assert_false(kvg_worker_ejected(w0, now + 100 * MS));
    kvg_worker_outlier_get(w0, now + 40 * MS, &st);
    assert_true(st.ejected);
    assert_int_equal(st.remaining_ns, 60 * MS);
    assert_int_equal(st.ejections, 1);
    assert_int_equal(st.consecutive_5xx, 0);

    /* Answers of requests sent before: no second ejection while out. */
    fail_n(w0, set, 5, now + 10 * MS, &ejected, &len);
    assert_false(ejected);
    /* 50% of three: w1 may not go while w0 is out. */
    fail_n(w1, set, 5, now + 10 * MS, &ejected, &len);
    assert_false(ejected);
    assert_false(kvg_worker_ejected(w1, now + 10 * MS));

    /* Back at 1100 ms; fails again: 200 ms, then the cap of 250. */
    now += 100 * MS;
    fail_n(w0, set, 5, now, &ejected, &len);
    assert_true(ejected);
    assert_int_equal(len, 200 * MS);
    now += 200 * MS;
    fail_n(w0, set, 5, now, &ejected, &len);
    assert_true(ejected);
    assert_int_equal(len, 250 * MS);
    kvg_worker_outlier_get(w0, now, &st);
    assert_int_equal(st.ejections, 3);
    assert_int_equal(st.multiplier, 3);
    /* In for max_ejection (250 ms) since it came back: starts over at base. */
    now += 250 * MS + 250 * MS;
    fail_n(w0, set, 5, now, &ejected, &len);
    assert_true(ejected);
    assert_int_equal(len, 100 * MS);

    /* A success in between breaks the streak. */
    now += 100 * MS;
    fail_n(w0, set, 4, now, &ejected, &len);
    assert_false(kvg_worker_outlier_observe(w0, set, KVG_OUTLIER_SUCCESS, now, &cfg5, NULL));
    fail_n(w0, set, 4, now, &ejected, &len);
    assert_false(ejected);

    kvg_buf out;
    kvg_buf_init(&out);
    kvg_registry_write_metrics(reg, &out);
    kvg_buf_putc(&out, '\0');
    assert_non_null(strstr(out.data, "# TYPE kvgate_worker_ejections_total counter\n"));
    assert_non_null(strstr(out.data, "kvgate_worker_ejections_total{worker=\"w0\"} 4\n"));
    assert_non_null(strstr(out.data, "kvgate_worker_ejections_total{worker=\"w1\"} 0\n"));
    assert_non_null(strstr(out.data, "# TYPE kvgate_worker_ejected gauge\n"));
    kvg_buf_done(&out);
    kvg_worker_set_unref(set);
    kvg_registry_free(reg);
}

static kvg_route_decision decide(kvg_worker_set *set, uint64_t now, kvg_arena *arena)
{
    static kvg_router *rt;
    static kvg_policy_config pc;
    if (!rt) {
        assert_int_equal(kvg_router_new(NULL, &rt), 0);
        kvg_policy_config_init(&pc);
    }
    static const char body[] = "{\"model\":\"m\",\"prompt\":\"hello\"}";
    kvg_body_info *info = kvg_arena_alloc(arena, sizeof(*info));
    kvg_body_plan plan;
    assert_int_equal(kvg_body_scan_plan(body, sizeof(body) - 1, KVG_BODY_API_COMPLETIONS, "s",
                                        arena, &plan, info, NULL),
                     0);
    kvg_route_request rq = {.body = info, .salt = "s", .policy = &pc, .now_ns = now};
    kvg_route_decision d;
    assert_int_equal(kvg_router_decide(rt, set, &rq, arena, &d), 0);
    return d;
}

/* Routing: an ejected worker is not a candidate until its deadline; without a clock (now 0)
 * ejections are ignored; when every worker of the model is out, the ejected ones come back. */
static void test_route_skips_ejected(void **state)
{
    (void)state;
    kvg_registry *reg = three_workers("m");
    kvg_worker_set *set = kvg_registry_acquire(reg);
    kvg_worker *w0 = kvg_worker_set_find(set, "w0");
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    uint64_t now = 5000 * MS;
    bool ejected;
    uint64_t len;
    fail_n(w0, set, 5, now, &ejected, &len);
    assert_true(ejected);
    kvg_route_decision d = decide(set, now + MS, &arena);
    assert_int_equal(d.serving, 3);
    assert_int_equal(d.ejected, 1);
    assert_int_equal(d.ncands, 2);
    for (size_t i = 0; i < d.ncands; i++)
        assert_ptr_not_equal(d.cands[i].worker, w0);
    d = decide(set, 0, &arena);
    assert_int_equal(d.ncands, 3);
    d = decide(set, now + 100 * MS, &arena);
    assert_int_equal(d.ncands, 3);
    assert_int_equal(d.ejected, 0);

    /* The two others drain: the ejected one is all there is, and gets the request. */
    assert_int_equal(kvg_registry_drain(reg, "w1"), 0);
    assert_int_equal(kvg_registry_drain(reg, "w2"), 0);
    kvg_worker_set *set2 = kvg_registry_acquire(reg);
    d = decide(set2, now + MS, &arena);
    assert_int_equal(d.ncands, 1);
    assert_ptr_equal(d.cands[0].worker, w0);
    assert_int_equal(d.ejected, 0);
    kvg_worker_set_unref(set2);
    kvg_arena_done(&arena);
    kvg_worker_set_unref(set);
    kvg_registry_free(reg);
}

typedef struct hammer {
    kvg_worker *w;
    kvg_worker_set *set;
    int ejected; /* by this thread */
} hammer;

static void *hammer_run(void *arg)
{
    hammer *h = arg;
    kvg_outlier_config c = cfg5;
    c.consecutive_5xx = 1;
    c.base_ejection_ns = c.max_ejection_ns = 1000000 * MS;
    for (int i = 0; i < 20000; i++) {
        kvg_outlier_result r = i % 3 == 0 ? KVG_OUTLIER_SUCCESS : KVG_OUTLIER_LOCAL_FAILURE;
        if (kvg_worker_outlier_observe(h->w, h->set, r, 7 * MS, &c, NULL))
            h->ejected++;
    }
    return NULL;
}

/* Many threads feeding one worker at the same instant: one ejection, counted once, by exactly
 * one of them (the CAS on the deadline decides). */
static void test_concurrent_observers(void **state)
{
    (void)state;
    kvg_registry *reg = three_workers("m");
    kvg_worker_set *set = kvg_registry_acquire(reg);
    hammer hs[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        hs[i] = (hammer){.w = kvg_worker_set_find(set, "w1"), .set = set};
        assert_int_equal(pthread_create(&th[i], NULL, hammer_run, &hs[i]), 0);
    }
    int total = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        total += hs[i].ejected;
    }
    assert_int_equal(total, 1);
    kvg_worker_outlier_state st;
    kvg_worker_outlier_get(hs[0].w, 7 * MS, &st);
    assert_true(st.ejected);
    assert_int_equal(st.ejections, 1);
    assert_int_equal(st.multiplier, 1);
    kvg_worker_set_unref(set);
    kvg_registry_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_of_status),    cmocka_unit_test(test_step),
        cmocka_unit_test(test_ejection_time),       cmocka_unit_test(test_may_eject),
        cmocka_unit_test(test_retry_budget),        cmocka_unit_test(test_worker_ejection),
        cmocka_unit_test(test_route_skips_ejected), cmocka_unit_test(test_concurrent_observers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
