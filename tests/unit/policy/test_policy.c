/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for policy/: least-loaded ranking and round-robin rotation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common.h"
#include "policy.h"

static void test_least_loaded(void **state)
{
    (void)state;
    kvg_policy_candidate c[] = {{0, 5}, {1, 2}, {2, 9}, {3, 2}};
    kvg_policy_rank(KVG_POLICY_LEAST_LOADED, c, 4, 0);
    assert_int_equal(c[0].index, 1);
    assert_int_equal(c[1].index, 3);
    assert_int_equal(c[2].index, 0);
    assert_int_equal(c[3].index, 2);
}

/* Ties rotate: over many decisions, equally loaded workers are picked equally often. */
static void test_ties_rotate(void **state)
{
    (void)state;
    unsigned picks[4] = {0};
    for (uint64_t r = 0; r < 400; r++) {
        kvg_policy_candidate c[] = {{0, 1}, {1, 1}, {2, 1}, {3, 7}};
        kvg_policy_rank(KVG_POLICY_LEAST_LOADED, c, 4, r);
        picks[c[0].index]++;
    }
    assert_true(picks[0] > 100 && picks[1] > 100 && picks[2] > 100);
    assert_int_equal(picks[3], 0);
}

static void test_round_robin(void **state)
{
    (void)state;
    for (uint64_t r = 0; r < 8; r++) {
        kvg_policy_candidate c[] = {{0, 9}, {1, 0}, {2, 4}};
        kvg_policy_rank(KVG_POLICY_ROUND_ROBIN, c, 3, r);
        assert_int_equal(c[0].index, r % 3);
        assert_int_equal(c[1].index, (r + 1) % 3);
    }
    kvg_policy_kind k;
    assert_int_equal(kvg_policy_kind_parse("round_robin", &k), 0);
    assert_int_equal(k, KVG_POLICY_ROUND_ROBIN);
    assert_int_equal(kvg_policy_kind_parse("bogus", &k), KVG_EPARSE);
    assert_string_equal(kvg_policy_kind_str(KVG_POLICY_LEAST_LOADED), "least_loaded");
}

/* Large candidate lists rotate correctly (the rotation buffer works in pieces). */
static void test_many(void **state)
{
    (void)state;
    kvg_policy_candidate c[200];
    for (uint32_t i = 0; i < 200; i++)
        c[i] = (kvg_policy_candidate){i, 0};
    kvg_policy_rank(KVG_POLICY_ROUND_ROBIN, c, 200, 130);
    for (uint32_t i = 0; i < 200; i++)
        assert_int_equal(c[i].index, (i + 130) % 200);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_least_loaded),
        cmocka_unit_test(test_ties_rotate),
        cmocka_unit_test(test_round_robin),
        cmocka_unit_test(test_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
