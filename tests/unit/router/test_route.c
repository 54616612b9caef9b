/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for routing decisions over a snapshot (router/route.c): which workers are eligible,
 * the holder first, and a rank limit that keeps the first places of the full ranking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "router.h"
#include "router_helpers.h"

/* One decision over a snapshot: eligibility (model, drain), the holder first, and with a rank
 * limit exactly the first places of the full ranking, terms included. */
static void test_decide_ranked_places(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    static const char *const other_model[] = {"other-model"};
    for (int i = 0; i < 40; i++) {
        char name[16], url[32];
        snprintf(name, sizeof(name), "w%02d", i);
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9000 + i);
        kvg_worker_def def = {.name = name, .url = url, .kv_blocks = 1024};
        if (i % 10 == 3) { /* four workers serve another model only */
            def.models = other_model;
            def.nmodels = 1;
        }
        assert_int_equal(kvg_registry_put(reg, &def, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    }
    assert_int_equal(kvg_registry_drain(reg, "w05"), 0);
    kvg_router *rt;
    assert_int_equal(kvg_router_new(NULL, &rt), 0);
    kvg_policy_config pc;
    kvg_policy_config_init(&pc);

    char body[2048];
    int n = snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"");
    while (n < 1500)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "block %d of the prompt. ", n);
    n += snprintf(body + n, sizeof(body) - (size_t)n, "\"}");
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_body_info info;
    kvg_body_plan plan;
    assert_int_equal(kvg_body_scan_plan(body, (size_t)n, KVG_BODY_API_COMPLETIONS, "salt", &arena,
                                        &plan, &info, NULL),
                     0);
    kvg_worker_set *set = kvg_registry_acquire(reg);
    kvg_route_request rq = {.body = &info, .salt = "salt", .policy = &pc};
    kvg_route_decision all, top;
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &all), 0);
    assert_true(all.nkeys > 10);
    assert_int_equal(all.serving, 36);
    assert_int_equal(all.ncands, 35); /* w05 drains */
    for (size_t i = 0; i < all.ncands; i++) {
        const char *name = kvg_worker_name(all.cands[i].worker);
        assert_string_not_equal(name, "w05");
        assert_int_not_equal(name[2], '3');
        assert_int_equal(all.cands[i].matched, 0);
    }
    /* The holder of the whole prefix comes first, whatever its rendezvous score. */
    kvg_worker *holder = kvg_worker_set_find(set, "w17");
    assert_int_equal(kvg_router_record(rt, NULL, holder, &all, 0), 0);
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &all), 0);
    assert_ptr_equal(all.cands[0].worker, holder);
    assert_int_equal(all.cands[0].matched, all.nkeys);
    assert_int_equal(all.reason, KVG_POLICY_REASON_HIT);
    for (size_t limit = 1; limit <= 36; limit += 7) {
        rq.rank_limit = limit;
        assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &top), 0);
        assert_int_equal(top.ncands, KVG_MIN(limit, all.ncands));
        for (size_t i = 0; i < top.ncands; i++) {
            assert_ptr_equal(top.cands[i].worker, all.cands[i].worker);
            assert_true(top.cands[i].terms.total == all.cands[i].terms.total);
            assert_true(top.cands[i].terms.rendezvous == all.cands[i].terms.rendezvous);
        }
    }
    kvg_worker_set_unref(set);
    kvg_arena_done(&arena);
    kvg_router_free(rt);
    kvg_registry_free(reg);
}

const struct CMUnitTest route_tests[] = {
    cmocka_unit_test(test_decide_ranked_places),
};
const size_t route_tests_count = KVG_ARRAY_LEN(route_tests);
