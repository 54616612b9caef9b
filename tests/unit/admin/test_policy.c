/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for /admin/v1/policy (admin/policy.c): showing and changing the settings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "admin.h"
#include "admin_helpers.h"

static void test_policy(void **state)
{
    fixture *f = *state;
    reply r = call(f, "GET", "/admin/v1/policy", AUTH, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(str_field(&r, "policy"), "cost");
    assert_null(r.cache_control);
    /* every setting, the defaults */
    assert_string_equal(
        r.body,
        "{\"policy\":\"cost\",\"block_bytes\":64,\"block_tokens\":16,"
        "\"max_blocks\":4096,\"cold_blocks\":4,\"load_factor\":2,\"load_slack\":4,"
        "\"prefill_cost_per_block\":200,\"queue_cost_per_request\":1000,"
        "\"waiting_cost_per_request\":5000,\"kv_usage_cost\":0,\"turnover_cost_per_block\":50,"
        "\"pending_cost_per_block\":200,\"pending_hit_weight\":0,\"cpu_block_weight\":0.8}");

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
    assert_string_equal(
        r.body,
        "{\"policy\":\"round_robin\",\"block_bytes\":64,\"block_tokens\":16,"
        "\"max_blocks\":4096,\"cold_blocks\":2,\"load_factor\":0.5,\"load_slack\":4,"
        "\"prefill_cost_per_block\":200,\"queue_cost_per_request\":1000,"
        "\"waiting_cost_per_request\":5000,\"kv_usage_cost\":0,\"turnover_cost_per_block\":50,"
        "\"pending_cost_per_block\":200,\"pending_hit_weight\":0,\"cpu_block_weight\":0.8}");
}

const struct CMUnitTest policy_tests[] = {
    cmocka_unit_test_setup_teardown(test_policy, setup, teardown),
};
const size_t policy_tests_count = KVG_ARRAY_LEN(policy_tests);
