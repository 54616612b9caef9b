/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the policy settings' field table (policy/settings.c): keywords, defaults, the
 * bodies kvgate admin builds from it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "policy.h"

/* The table names the kinds as kvg_policy_kind_str does (its defaults are checked through
 * kvg_policy_config_init in test_policy.c). */
static void test_keywords(void **state)
{
    (void)state;
    const kvg_field *f = kvg_fields_find(&kvg_policy_fields, "policy", 6);
    assert_non_null(f);
    assert_int_equal(f->nkeywords, KVG_POLICY_KIND_COUNT);
    for (size_t k = 0; k < KVG_POLICY_KIND_COUNT; k++)
        assert_string_equal(f->keywords[k], kvg_policy_kind_str((kvg_policy_kind)k));
}

/* What kvgate admin policy set sends, and what the gateway then makes of it. */
static void test_cli_body(void **state)
{
    (void)state;
    kvg_arena a;
    kvg_arena_init(&a, 0);
    char msg[200];
    kvg_fields_ctx c = {.from = KVG_SET_CLI, .arena = &a, .msg = msg, .msg_len = sizeof(msg)};
    kvg_json *obj = kvg_fields_json_object(&a);
    assert_int_equal(
        kvg_fields_json_set_text(&kvg_policy_fields, obj, "policy", 6, "random", 6, &c), 0);
    assert_int_equal(
        kvg_fields_json_set_text(&kvg_policy_fields, obj, "load_factor", 11, "0.75", 4, &c), 0);
    assert_int_equal(
        kvg_fields_json_set_text(&kvg_policy_fields, obj, "kv_usage_cost", 13, "-1", 2, &c),
        KVG_EPARSE);
    assert_string_equal(msg, "kv_usage_cost: must be a number in 0..1e12");
    kvg_policy_config cfg;
    kvg_policy_config_init(&cfg);
    assert_int_equal(kvg_policy_config_apply_json(&cfg, obj, msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_RANDOM);
    assert_true(cfg.load_factor == 0.75);
    kvg_arena_done(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keywords),
        cmocka_unit_test(test_cli_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
