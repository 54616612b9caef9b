/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for policy/: ranking (least loaded, round robin, random), token buckets, scope
 * salts and the operator's settings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "common.h"
#include "policy.h"

static void test_least_loaded(void **state)
{
    (void)state;
    kvg_policy_candidate c[] = {{.index = 0, .inflight = 5},
                                {.index = 1, .inflight = 2},
                                {.index = 2, .inflight = 9},
                                {.index = 3, .inflight = 2}};
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
        kvg_policy_candidate c[] = {{.index = 0, .inflight = 1},
                                    {.index = 1, .inflight = 1},
                                    {.index = 2, .inflight = 1},
                                    {.index = 3, .inflight = 7}};
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
        kvg_policy_candidate c[] = {
            {.index = 0, .inflight = 9}, {.index = 1, .inflight = 0}, {.index = 2, .inflight = 4}};
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
        c[i] = (kvg_policy_candidate){.index = i, .inflight = 0};
    kvg_policy_rank(KVG_POLICY_ROUND_ROBIN, c, 200, 130);
    for (uint32_t i = 0; i < 200; i++)
        assert_int_equal(c[i].index, (i + 130) % 200);
}

/* ---- random ------------------------------------------------------------------------------- */

static void test_random_permutation(void **state)
{
    (void)state;
    enum { N = 37 };
    unsigned first[N] = {0};
    unsigned distinct_orders = 0;
    kvg_policy_candidate prev[N];
    for (uint64_t r = 0; r < 2000; r++) {
        kvg_policy_candidate c[N];
        for (uint32_t i = 0; i < N; i++)
            c[i] = (kvg_policy_candidate){.index = i, .inflight = i % 3};
        kvg_policy_rank(KVG_POLICY_RANDOM, c, N, r);
        /* a permutation: every index exactly once, loads travel with their index */
        bool seen[N] = {false};
        for (uint32_t i = 0; i < N; i++) {
            assert_true(c[i].index < N);
            assert_false(seen[c[i].index]);
            seen[c[i].index] = true;
            assert_int_equal(c[i].inflight, c[i].index % 3);
        }
        first[c[0].index]++;
        if (r == 0 || memcmp(prev, c, sizeof(c)) != 0)
            distinct_orders++;
        memcpy(prev, c, sizeof(c));

        /* deterministic: the same rotation gives the same order */
        kvg_policy_candidate d[N];
        for (uint32_t i = 0; i < N; i++)
            d[i] = (kvg_policy_candidate){.index = i, .inflight = i % 3};
        kvg_policy_rank(KVG_POLICY_RANDOM, d, N, r);
        assert_memory_equal(c, d, sizeof(c));
    }
    assert_int_equal(distinct_orders, 2000); /* varies with the rotation */
    /* every candidate leads sometimes (expected 54 each; a fair die never gives 0 here) */
    for (uint32_t i = 0; i < N; i++)
        assert_true(first[i] > 10);

    kvg_policy_candidate one[1] = {{.index = 7, .inflight = 0}};
    kvg_policy_rank(KVG_POLICY_RANDOM, one, 1, 12345);
    assert_int_equal(one[0].index, 7);
    kvg_policy_rank(KVG_POLICY_RANDOM, NULL, 0, 1);

    kvg_policy_kind k;
    assert_int_equal(kvg_policy_kind_parse("random", &k), 0);
    assert_int_equal(k, KVG_POLICY_RANDOM);
    assert_string_equal(kvg_policy_kind_str(KVG_POLICY_RANDOM), "random");
    assert_string_equal(kvg_policy_kind_str(KVG_POLICY_KIND_COUNT), "?");
}

/* ---- token buckets -------------------------------------------------------------------------- */

#define SEC 1000000000ull

static void test_bucket(void **state)
{
    (void)state;
    kvg_bucket b = {0};
    double wait = -1;
    uint64_t t = 1000 * SEC;
    /* first use: full (burst 3), then empty */
    for (int i = 0; i < 3; i++)
        assert_true(kvg_policy_bucket_take(&b, 2, 3, t, 1, &wait));
    assert_true(wait == 0);
    assert_false(kvg_policy_bucket_take(&b, 2, 3, t, 1, &wait));
    assert_true(fabs(wait - 0.5) < 1e-9); /* one token at 2/s */
    assert_false(kvg_policy_bucket_take(&b, 2, 3, t, 1, NULL));
    /* a quarter second later: half a token, still 0.25 s to go */
    t += SEC / 4;
    assert_false(kvg_policy_bucket_take(&b, 2, 3, t, 1, &wait));
    assert_true(fabs(wait - 0.25) < 1e-9);
    t += SEC / 4;
    assert_true(kvg_policy_bucket_take(&b, 2, 3, t, 1, &wait));
    /* a long pause refills to burst, not beyond */
    t += 3600 * SEC;
    for (int i = 0; i < 3; i++)
        assert_true(kvg_policy_bucket_take(&b, 2, 3, t, 1, NULL));
    assert_false(kvg_policy_bucket_take(&b, 2, 3, t, 1, NULL));

    /* time going backwards refills nothing, and the span is not counted twice later */
    assert_false(kvg_policy_bucket_take(&b, 2, 3, t - 10 * SEC, 1, &wait));
    assert_true(fabs(wait - 0.5) < 1e-9);
    assert_false(kvg_policy_bucket_take(&b, 2, 3, t + SEC / 4, 1, NULL));
    assert_true(kvg_policy_bucket_take(&b, 2, 3, t + SEC / 2, 1, NULL));

    /* cost above burst never fits */
    kvg_bucket c = {0};
    assert_false(kvg_policy_bucket_take(&c, 10, 5, t, 6, &wait));
    assert_true(isinf(wait));
    /* fractional costs (bytes) and give back, capped at burst */
    assert_true(kvg_policy_bucket_take(&c, 10, 5, t, 4.5, NULL));
    assert_false(kvg_policy_bucket_take(&c, 10, 5, t, 1, &wait));
    assert_true(fabs(wait - 0.05) < 1e-9);
    kvg_policy_bucket_give(&c, 5, 4.5);
    assert_true(kvg_policy_bucket_take(&c, 10, 5, t, 5, NULL));
    kvg_policy_bucket_give(&c, 5, 100);
    assert_true(fabs(c.tokens - 5) < 1e-9);
    /* a lowered burst cuts the tokens */
    assert_false(kvg_policy_bucket_take(&c, 10, 2, t, 3, &wait));
    assert_true(isinf(wait));
    assert_true(fabs(c.tokens - 2) < 1e-9);

    /* giving to an unused bucket changes nothing: it is full at first use */
    kvg_bucket d = {0};
    kvg_policy_bucket_give(&d, 5, 1);
    assert_false(d.primed);

    /* rate 0: a one-off allowance of burst tokens */
    kvg_bucket e = {0};
    assert_true(kvg_policy_bucket_take(&e, 0, 2, t, 1, NULL));
    assert_true(kvg_policy_bucket_take(&e, 0, 2, t + SEC, 1, NULL));
    assert_false(kvg_policy_bucket_take(&e, 0, 2, t + 1000 * SEC, 1, &wait));
    assert_true(isinf(wait));
    /* cost 0 always fits */
    assert_true(kvg_policy_bucket_take(&e, 0, 2, t, 0, NULL));

    /* a start at time 0 works (primed, not last_ns, tells a used bucket) */
    kvg_bucket f = {0};
    assert_true(kvg_policy_bucket_take(&f, 1, 1, 0, 1, NULL));
    assert_false(kvg_policy_bucket_take(&f, 1, 1, 0, 1, NULL));
    assert_true(kvg_policy_bucket_take(&f, 1, 1, SEC, 1, NULL));
}

/* ---- scope salts ---------------------------------------------------------------------------- */

/* Expected values computed independently with Python's hmac module:
 *   /usr/bin/python3 -c 'import hmac,hashlib,base64; f=lambda k,s: base64.urlsafe_b64encode(
 *     hmac.new(k,s,hashlib.sha256).digest()).rstrip(b"=").decode(); print(f(b"secret",
 *     b"tenant:acme"))'
 * with the (key, scope) pairs of the table (key bytes(range(32)) for the 32-byte secret,
 * b"k"*100 for the one longer than SHA-256's block). */
static void test_scope_salt(void **state)
{
    (void)state;
    uint8_t bin[32];
    for (int i = 0; i < 32; i++)
        bin[i] = (uint8_t)i;
    uint8_t longkey[100];
    memset(longkey, 'k', sizeof(longkey));
    static const struct {
        const char *secret;
        const char *scope;
        const char *salt;
    } v[] = {
        {"secret", "tenant:acme", "PVHist2Pim0yiDWceF71ITTjlnYqNaePs8UIyJx78AU"},
        {"secret", "group:research", "_0A28P_A9RF3GK2MiVtHxADBKT3NpDK1kBB4Yvp5dVA"},
        {"secret", "global", "7Gqzg4n7BHIs_TvqNfYO-SI-pTrUCMWtOkPkZIUZyuY"},
        {"other-secret", "tenant:acme", "huJbz7COwX39WiT2bFvhmS-hGXz5EiOIkhaulSBkEXU"},
        {"", "global", "PzFjaM23TWLDBKUN-omI2Ny3jbuz4EtHTzSN7u3AQ3M"},
    };
    char out[KVG_SALT_LEN + 1];
    for (size_t i = 0; i < KVG_ARRAY_LEN(v); i++) {
        memset(out, 'x', sizeof(out));
        assert_int_equal(kvg_policy_scope_salt((const uint8_t *)v[i].secret, strlen(v[i].secret),
                                               v[i].scope, out),
                         0);
        assert_string_equal(out, v[i].salt);
        assert_int_equal(strlen(out), KVG_SALT_LEN);
    }
    assert_int_equal(kvg_policy_scope_salt(bin, sizeof(bin), "tenant:a", out), 0);
    assert_string_equal(out, "_LPLoQVtF7XVbS0aCfFdwn37qXwKjh49CH1QFnIjl5k");
    assert_int_equal(kvg_policy_scope_salt(longkey, sizeof(longkey), "tenant:acme", out), 0);
    assert_string_equal(out, "jznwHKWbW4G1qWLUaU68FJus9bvd8SIwXszXa9xV9D8");
    /* an empty secret given as NULL is the same as "" */
    assert_int_equal(kvg_policy_scope_salt(NULL, 0, "global", out), 0);
    assert_string_equal(out, "PzFjaM23TWLDBKUN-omI2Ny3jbuz4EtHTzSN7u3AQ3M");
    assert_int_equal(kvg_policy_scope_salt(bin, sizeof(bin), NULL, out), -EINVAL);
    assert_int_equal(kvg_policy_scope_salt(NULL, 3, "global", out), -EINVAL);
}

/* ---- settings ------------------------------------------------------------------------------- */

static int apply(kvg_policy_config *cfg, const char *text, char *msg, size_t msg_len)
{
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *j = NULL;
    assert_int_equal(kvg_json_parse(text, strlen(text), &a, NULL, &j, NULL), 0);
    int rc = kvg_policy_config_apply_json(cfg, j, msg, msg_len);
    kvg_arena_done(&a);
    return rc;
}

static void test_config(void **state)
{
    (void)state;
    kvg_policy_config cfg;
    char msg[128];
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_policy_config_init(&cfg);
    assert_int_equal(cfg.kind, KVG_POLICY_LEAST_LOADED);
    kvg_policy_config_to_json(&cfg, &b);
    assert_string_equal(b.data, "{\"policy\":\"least_loaded\"}");

    assert_int_equal(apply(&cfg, "{\"policy\":\"random\"}", msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_RANDOM);
    /* fields omitted keep their value */
    assert_int_equal(apply(&cfg, "{}", msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_RANDOM);
    assert_int_equal(apply(&cfg, "{\"policy\":\"round_robin\"}", msg, sizeof(msg)), 0);
    kvg_buf_reset(&b);
    kvg_policy_config_to_json(&cfg, &b);
    assert_string_equal(b.data, "{\"policy\":\"round_robin\"}");

    /* errors name the field and leave cfg unchanged */
    static const struct {
        const char *json;
        const char *msg;
    } bad[] = {
        {"{\"policy\":\"cost\"}", "policy: unknown policy \"cost\""},
        {"{\"policy\":\"random\",\"polcy\":1}", "polcy: unknown field"},
        {"{\"policy\":7}", "policy: must be a string, not number"},
        {"{\"policy\":null}", "policy: must be a string, not null"},
        {"{\"policy\":\"random\\u0000x\"}", "policy: unknown policy \"random?x\""},
        {"{\"a\\u0000b\":1}", "a?b: unknown field"},
        {"[]", "policy settings: must be a JSON object, not array"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        msg[0] = '\0';
        assert_int_equal(apply(&cfg, bad[i].json, msg, sizeof(msg)), KVG_EPARSE);
        if (strncmp(msg, bad[i].msg, strlen(bad[i].msg)) != 0)
            fail_msg("%s: got \"%s\", want \"%s...\"", bad[i].json, msg, bad[i].msg);
        assert_int_equal(cfg.kind, KVG_POLICY_ROUND_ROBIN);
    }
    assert_int_equal(kvg_policy_config_apply_json(&cfg, NULL, NULL, 0), KVG_EPARSE);
    /* the last of repeated members wins, as everywhere in kvgate's JSON */
    assert_int_equal(
        apply(&cfg, "{\"policy\":\"random\",\"policy\":\"least_loaded\"}", msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_LEAST_LOADED);
    kvg_buf_done(&b);
}

typedef struct state_reader {
    kvg_policy_state *st;
    _Atomic bool *stop;
    int failures;
} state_reader;

static void *read_state(void *p)
{
    state_reader *r = p;
    uint64_t last = 0;
    while (!atomic_load(r->stop)) {
        uint64_t g = kvg_policy_state_generation(r->st);
        kvg_policy_config c;
        kvg_policy_state_get(r->st, &c);
        if (g < last || c.kind >= KVG_POLICY_KIND_COUNT)
            r->failures++;
        last = g;
    }
    return NULL;
}

static void test_state(void **state)
{
    (void)state;
    kvg_policy_state *st = NULL;
    assert_int_equal(kvg_policy_state_new(&st), 0);
    kvg_policy_config c;
    kvg_policy_state_get(st, &c);
    assert_int_equal(c.kind, KVG_POLICY_LEAST_LOADED);
    uint64_t g = kvg_policy_state_generation(st);
    c.kind = KVG_POLICY_RANDOM;
    kvg_policy_state_set(st, &c);
    assert_int_equal(kvg_policy_state_generation(st), g + 1);
    kvg_policy_config d;
    kvg_policy_state_get(st, &d);
    assert_int_equal(d.kind, KVG_POLICY_RANDOM);

    /* readers and a writer at once (TSan checks the locking) */
    _Atomic bool stop = false;
    pthread_t th[2];
    state_reader r[2] = {{st, &stop, 0}, {st, &stop, 0}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, read_state, &r[i]), 0);
    for (int i = 0; i < 5000; i++) {
        c.kind = (kvg_policy_kind)(i % KVG_POLICY_KIND_COUNT);
        kvg_policy_state_set(st, &c);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(r[i].failures, 0);
    }
    assert_int_equal(kvg_policy_state_generation(st), g + 5001);
    kvg_policy_state_free(st);
    kvg_policy_state_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_least_loaded),
        cmocka_unit_test(test_ties_rotate),
        cmocka_unit_test(test_round_robin),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_random_permutation),
        cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_scope_salt),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
