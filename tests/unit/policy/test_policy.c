/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for policy/: ranking (least loaded, round robin, random), the prefix-aware choice
 * (cost, prefix_only, rendezvous, bounded load), token buckets, scope salts and the operator's
 * settings. */
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
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "fail_alloc.h"
#include "policy.h"

/* Field by field: kvg_policy_candidate has padding, which compound literals need not zero. */
static void assert_cands_equal(const kvg_policy_candidate *a, const kvg_policy_candidate *b,
                               size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(a[i].index, b[i].index);
        assert_int_equal(a[i].inflight, b[i].inflight);
        assert_int_equal(a[i].matched, b[i].matched);
        assert_true(a[i].id_hash == b[i].id_hash);
        assert_int_equal(a[i].waiting, b[i].waiting);
        assert_memory_equal(&a[i].kv_usage, &b[i].kv_usage, sizeof(a[i].kv_usage));
    }
}

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
        assert_cands_equal(c, d, N);
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

/* ---- prefix-aware choice -------------------------------------------------------------------- */

static kvg_policy_config cfg_of(kvg_policy_kind kind)
{
    kvg_policy_config cfg;
    kvg_policy_config_init(&cfg);
    cfg.kind = kind;
    /* The hand-made scenarios below are worked out with these weights, whatever the defaults. */
    cfg.prefill_cost_per_block = 200;
    cfg.queue_cost_per_request = 5000;
    cfg.waiting_cost_per_request = 5000;
    cfg.load_factor = 0.25;
    cfg.load_slack = 0; /* the relative bound alone; test_cost_slack covers the slack */
    return cfg;
}

static uint64_t test_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A counter-based stream of test numbers (splitmix64). */
static uint64_t next_rand(uint64_t *s)
{
    return test_mix(*s += 0x9e3779b97f4a7c15ull);
}

static uint64_t rdv(uint64_t key, uint64_t id)
{
    return kvg_policy_rendezvous(key, id);
}

static void shuffle_cands(kvg_policy_candidate *c, size_t n, uint64_t seed)
{
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(next_rand(&seed) % (i + 1));
        kvg_policy_candidate t = c[i];
        c[i] = c[j];
        c[j] = t;
    }
}

/* The candidate with the highest rendezvous score for key (the cold owner). */
static uint32_t owner(const kvg_policy_candidate *c, size_t n, uint64_t key)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (rdv(key, c[i].id_hash) > rdv(key, c[best].id_hash))
            best = i;
    return c[best].index;
}

static uint32_t choose_first(const kvg_policy_config *cfg, uint32_t blocks, uint64_t key,
                             const kvg_policy_candidate *in, size_t n, uint64_t rotation)
{
    kvg_policy_candidate c[64];
    assert_true(n <= 64);
    memcpy(c, in, n * sizeof(*c));
    kvg_policy_request req = {.blocks = blocks, .cold_key = key};
    kvg_policy_choose(cfg, &req, c, n, rotation, NULL, NULL);
    return c[0].index;
}

static void test_rendezvous(void **state)
{
    (void)state;
    /* the documented formula, written out: replicas and the simulator must agree on it */
    uint64_t keys[] = {0, 1, 42, 0x0123456789abcdefull, UINT64_MAX};
    uint64_t ids[] = {0, 2, 7, 0xfedcba9876543210ull, UINT64_MAX};
    for (size_t i = 0; i < KVG_ARRAY_LEN(keys); i++)
        for (size_t j = 0; j < KVG_ARRAY_LEN(ids); j++)
            assert_true(rdv(keys[i], ids[j]) ==
                        test_mix(keys[i] ^ test_mix(ids[j] + 0x9e3779b97f4a7c15ull)));
    assert_true(rdv(0, 0) == 0x48218226ff3cd4bfull);
    assert_true(rdv(1, 2) == 0xf2826f98653e9e57ull);
    assert_true(rdv(0x0123456789abcdefull, 0xfedcba9876543210ull) == 0x729fab7ea7d788c6ull);
    /* neighbouring identities and keys give unrelated scores: about half the bits differ */
    uint64_t seed = 1;
    unsigned bits = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t k = next_rand(&seed), id = next_rand(&seed);
        bits += (unsigned)__builtin_popcountll(rdv(k, id) ^ rdv(k, id ^ 1));
        bits += (unsigned)__builtin_popcountll(rdv(k, id) ^ rdv(k ^ 1, id));
    }
    assert_true(bits > 2000 * 30 && bits < 2000 * 34);

    assert_string_equal(kvg_policy_reason_str(KVG_POLICY_REASON_LOAD), "load");
    assert_string_equal(kvg_policy_reason_str(KVG_POLICY_REASON_HIT), "hit");
    assert_string_equal(kvg_policy_reason_str(KVG_POLICY_REASON_COLD), "cold");
    assert_string_equal(kvg_policy_reason_str(KVG_POLICY_REASON_COUNT), "?");
    kvg_policy_kind k;
    assert_int_equal(kvg_policy_kind_parse("cost", &k), 0);
    assert_int_equal(k, KVG_POLICY_COST);
    assert_int_equal(kvg_policy_kind_parse("prefix_only", &k), 0);
    assert_int_equal(k, KVG_POLICY_PREFIX_ONLY);
}

static void assert_terms(const kvg_policy_terms *t, uint32_t index, double prefill, double queue,
                         bool over, uint64_t rendezvous)
{
    assert_int_equal(t->index, index);
    assert_true(t->prefill_cost == prefill);
    assert_true(t->queue_cost == queue);
    assert_true(t->pending_cost == 0); /* scenarios with pending work check it themselves */
    assert_true(t->total == prefill + queue);
    assert_int_equal(t->over_bound, over);
    assert_true(t->rendezvous == rendezvous);
}

/* A holder one request busier than an idle worker wins when the blocks it saves cost more to
 * prefill than one request in flight: 200 us x m > 5000 us, so m > 25 of 64. */
static void test_cost_hit_vs_cold(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_request req = {.blocks = 64, .cold_key = 42};
    kvg_policy_candidate c[2] = {
        {.index = 0, .inflight = 1, .matched = 60, .id_hash = 11},
        {.index = 1, .inflight = 0, .matched = 0, .id_hash = 12},
    };
    kvg_policy_terms t[2];
    kvg_policy_reason why = KVG_POLICY_REASON_COUNT;
    /* bound: ceil(1.25 x (1 + 1) / 2) = 2, both within */
    kvg_policy_choose(&cfg, &req, c, 2, 0, t, &why);
    assert_int_equal(c[0].index, 0);
    assert_int_equal(why, KVG_POLICY_REASON_HIT);
    assert_terms(&t[0], 0, 800, 5000, false, rdv(42, 11));
    assert_terms(&t[1], 1, 12800, 0, false, rdv(42, 12));

    for (uint32_t m = 20; m <= 30; m++) {
        kvg_policy_candidate d[2] = {
            {.index = 0, .inflight = 1, .matched = m, .id_hash = 11},
            {.index = 1, .inflight = 0, .matched = 0, .id_hash = 12},
        };
        kvg_policy_choose(&cfg, &req, d, 2, m, t, &why);
        uint32_t want = m > 25 ? 0 : m < 25 ? 1 : owner(d, 2, 42); /* 25: a tie, by rendezvous */
        assert_int_equal(d[0].index, want);
        assert_int_equal(why, want == 0 ? KVG_POLICY_REASON_HIT : KVG_POLICY_REASON_COLD);
        assert_true(t[0].total <= t[1].total);
    }
}

/* Blocks held only on a CPU tier cost (1 - cpu_block_weight) of a prefill each. A holds 10 of
 * 20 blocks on its GPU; B holds 12, all only on its CPU. At 0.8 (llm-d's weight): A's prefill
 * 200 x 10 = 2000, B's 200 x (8 + 0.2 x 12) = 2080: A. At 1 a CPU block is as good as a GPU one
 * (B: 1600), at 0 worth nothing (B: 4000). Worked out by hand. */
static void test_cost_cpu_tier(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_request req = {.blocks = 20, .cold_key = 7};
    const struct {
        double weight;
        uint32_t best;
        double a_cost, b_cost;
    } cases[] = {
        {0.8, 0, 2000, 2080}, {1, 1, 2000, 1600}, {0, 0, 2000, 4000}, {0.5, 0, 2000, 2800}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        cfg.cpu_block_weight = cases[k].weight;
        kvg_policy_candidate c[2] = {
            {.index = 0, .matched = 10, .id_hash = 11},
            {.index = 1, .matched = 12, .matched_cpu = 12, .id_hash = 12},
        };
        kvg_policy_terms t[2];
        kvg_policy_reason why;
        kvg_policy_choose(&cfg, &req, c, 2, 0, t, &why);
        assert_int_equal(c[0].index, cases[k].best);
        assert_int_equal(why, KVG_POLICY_REASON_HIT);
        const kvg_policy_terms *ta = t[0].index == 0 ? &t[0] : &t[1];
        const kvg_policy_terms *tb = t[0].index == 1 ? &t[0] : &t[1];
        assert_true(fabs(ta->prefill_cost - cases[k].a_cost) < 1e-6);
        assert_true(fabs(tb->prefill_cost - cases[k].b_cost) < 1e-6);
    }
    /* matched_cpu beyond what counts (the request's blocks) counts no further */
    cfg.cpu_block_weight = 0.5;
    req.blocks = 4;
    kvg_policy_candidate d[1] = {{.index = 0, .matched = 12, .matched_cpu = 12, .id_hash = 1}};
    kvg_policy_terms t1;
    kvg_policy_choose(&cfg, &req, d, 1, 0, &t1, NULL);
    assert_true(fabs(t1.prefill_cost - 200 * 0.5 * 4) < 1e-6);
}

/* block_weight scales the prefill price of each block (an engine block of 64 tokens is four of
 * the 16-token blocks the prices are set for): the same holder loses at weight 1 and 1/4 and
 * wins at 4. Unset (0), negative and NaN weigh 1. */
static void test_cost_block_weight(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    const struct {
        double weight;
        uint32_t best;
        double a_prefill, b_prefill;
    } cases[] = {{1, 1, 2000, 4000}, {4, 0, 8000, 16000}, {0.25, 1, 500, 1000},
                 {0, 1, 2000, 4000}, {-2, 1, 2000, 4000}, {NAN, 1, 2000, 4000}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        kvg_policy_request req = {.blocks = 20, .cold_key = 7, .block_weight = cases[k].weight};
        kvg_policy_candidate c[2] = {
            {.index = 0, .inflight = 1, .matched = 10, .id_hash = 11}, /* 5000 of queue */
            {.index = 1, .id_hash = 12},
        };
        kvg_policy_terms t[2];
        kvg_policy_reason why;
        kvg_policy_choose(&cfg, &req, c, 2, 0, t, &why);
        assert_int_equal(c[0].index, cases[k].best);
        assert_int_equal(why, cases[k].best == 0 ? KVG_POLICY_REASON_HIT : KVG_POLICY_REASON_COLD);
        const kvg_policy_terms *ta = t[0].index == 0 ? &t[0] : &t[1];
        const kvg_policy_terms *tb = t[0].index == 1 ? &t[0] : &t[1];
        assert_true(fabs(ta->prefill_cost - cases[k].a_prefill) < 1e-6);
        assert_true(fabs(tb->prefill_cost - cases[k].b_prefill) < 1e-6);
        assert_true(fabs(ta->queue_cost - 5000) < 1e-6);
    }
}

/* The holder is much busier: an idle-ish cold worker is cheaper, and the reason is cold. */
static void test_cost_busy_holder_loses(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_request req = {.blocks = 64, .cold_key = 7};
    kvg_policy_candidate c[4] = {
        {.index = 0, .inflight = 3, .matched = 20, .id_hash = 100},
        {.index = 1, .inflight = 1, .id_hash = 101},
        {.index = 2, .inflight = 3, .id_hash = 102},
        {.index = 3, .inflight = 3, .id_hash = 103},
    };
    kvg_policy_terms t[4];
    kvg_policy_reason why;
    /* bound: ceil(1.25 x 11 / 4) = ceil(3.4375) = 4: nobody over */
    kvg_policy_choose(&cfg, &req, c, 4, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    assert_terms(&t[0], 1, 12800, 5000, false, rdv(7, 101));
    assert_terms(&t[1], 0, 8800, 15000, false, rdv(7, 100));
    /* 2 and 3 cost the same (27800): the higher rendezvous score first */
    bool two_first = rdv(7, 102) > rdv(7, 103);
    assert_terms(&t[2], two_first ? 2 : 3, 12800, 15000, false, rdv(7, two_first ? 102 : 103));
    assert_terms(&t[3], two_first ? 3 : 2, 12800, 15000, false, rdv(7, two_first ? 103 : 102));

    /* waiting and KV usage terms; matched beyond the request counts as the whole request */
    cfg.kv_usage_cost = 1000;
    kvg_policy_candidate d[3] = {
        {.index = 5, .inflight = 2, .matched = 4, .id_hash = 1, .waiting = 3, .kv_usage = 0.5f},
        {.index = 6, .inflight = 0, .matched = 99, .id_hash = 2, .kv_usage = NAN},
        {.index = 7, .inflight = 0, .matched = 0, .id_hash = 3, .kv_usage = 2.0f},
    };
    req.blocks = 10;
    kvg_policy_choose(&cfg, &req, d, 3, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_HIT);
    assert_terms(&t[0], 6, 0, 0, false, rdv(7, 2));
    assert_terms(&t[1], 7, 2000, 1000, false, rdv(7, 3));
    /* bound ceil(1.25 x 3 / 3) = 2: inflight 2 is over */
    assert_terms(&t[2], 5, 1200, 10000 + 15000 + 500, true, rdv(7, 1));
}

/* Turnover: a missing block costs more on a worker whose cache turns over fast; a cold request
 * then goes to the worker with the lowest turnover (and load) instead of by rendezvous, and
 * with nothing known of turnover (or its price 0) the rendezvous order stands. */
static void test_cost_turnover(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    cfg.turnover_cost_per_block = 100;
    kvg_policy_request req = {.blocks = 10, .cold_key = 42};
    kvg_policy_candidate c[3] = {
        {.index = 0, .inflight = 1, .id_hash = 11, .turnover = 0.5f},
        {.index = 1, .inflight = 1, .id_hash = 12, .turnover = 0.25f},
        {.index = 2, .inflight = 1, .id_hash = 13, .turnover = 2.0f},
    };
    kvg_policy_terms t[3];
    kvg_policy_reason why;
    kvg_policy_choose(&cfg, &req, c, 3, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    /* prefill (200 + 100 x turnover) x 10, queue 5000 x 1 */
    assert_terms(&t[0], 1, (200 + 25) * 10, 5000, false, rdv(42, 12));
    assert_terms(&t[1], 0, (200 + 50) * 10, 5000, false, rdv(42, 11));
    assert_terms(&t[2], 2, (200 + 200) * 10, 5000, false, rdv(42, 13));
    /* a holder of 8 blocks pays turnover on its 2 missing ones only */
    kvg_policy_candidate h[2] = {
        {.index = 0, .inflight = 1, .matched = 8, .id_hash = 11, .turnover = 2.0f},
        {.index = 1, .inflight = 1, .id_hash = 12, .turnover = 0.0f},
    };
    kvg_policy_choose(&cfg, &req, h, 2, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_HIT);
    assert_terms(&t[0], 0, (200 + 200) * 2, 5000, false, rdv(42, 11));
    assert_terms(&t[1], 1, 200 * 10, 5000, false, rdv(42, 12));
    /* turnover unknown everywhere, or not priced: a cold request goes by rendezvous */
    for (int priced = 0; priced < 2; priced++) {
        kvg_policy_candidate z[3];
        memcpy(z, c, sizeof(z));
        for (int i = 0; i < 3; i++)
            z[i].turnover = priced ? 0.0f : z[i].turnover;
        cfg.turnover_cost_per_block = priced ? 100 : 0;
        kvg_policy_candidate want[3];
        memcpy(want, z, sizeof(want));
        kvg_policy_choose(&cfg, &req, z, 3, 0, NULL, &why);
        assert_int_equal(why, KVG_POLICY_REASON_COLD);
        assert_int_equal(z[0].index, owner(want, 3, 42));
    }
}

/* Pending prefill work: at full weight when every candidate holds as many blocks as every other
 * (nothing to lose by going where the queue is shortest), at pending_hit_weight otherwise. */
static void test_cost_pending(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    cfg.turnover_cost_per_block = 0;
    cfg.pending_cost_per_block = 100;
    kvg_policy_request req = {.blocks = 10, .cold_key = 42};
    kvg_policy_terms t[3];
    kvg_policy_reason why;
    /* cold: the least pending work wins whatever the rendezvous says */
    kvg_policy_candidate c[3] = {
        {.index = 0, .inflight = 1, .id_hash = 11, .pending = 30},
        {.index = 1, .inflight = 1, .id_hash = 12, .pending = 5},
        {.index = 2, .inflight = 1, .id_hash = 13, .pending = 80},
    };
    kvg_policy_choose(&cfg, &req, c, 3, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    static const uint32_t order[3] = {1, 0, 2};
    static const double pend[3] = {500, 3000, 8000};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(t[i].index, order[i]);
        assert_true(t[i].pending_cost == pend[i]);
        assert_true(t[i].prefill_cost == 2000 && t[i].queue_cost == 5000);
        assert_true(t[i].total == 2000 + 5000 + pend[i]);
    }
    /* every candidate holds the same 4 blocks (a shared system prompt): still a tie, full weight */
    kvg_policy_candidate s[2] = {
        {.index = 0, .inflight = 1, .matched = 4, .id_hash = 11, .pending = 30},
        {.index = 1, .inflight = 1, .matched = 4, .id_hash = 12, .pending = 5},
    };
    kvg_policy_choose(&cfg, &req, s, 2, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_HIT);
    assert_int_equal(t[0].index, 1);
    assert_true(t[0].pending_cost == 500 && t[1].pending_cost == 3000);
    /* a holder of 8 blocks with 100 blocks pending: the pending term is off by default (weight
     * 0), so the holder keeps the request (1200 + 5000 < 10000 + 5000) */
    kvg_policy_candidate h[2] = {
        {.index = 0, .inflight = 1, .matched = 8, .id_hash = 11, .pending = 100},
        {.index = 1, .inflight = 1, .id_hash = 12, .pending = 0},
    };
    kvg_policy_candidate h0[2];
    memcpy(h0, h, sizeof(h));
    kvg_policy_choose(&cfg, &req, h, 2, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_HIT);
    assert_int_equal(t[0].index, 0);
    assert_true(t[0].pending_cost == 0 && t[0].total == 400 + 5000);
    /* at weight 1 the wait counts: 400 + 5000 + 10000 > 2000 + 5000, the idle one wins */
    cfg.pending_hit_weight = 1;
    memcpy(h, h0, sizeof(h));
    kvg_policy_choose(&cfg, &req, h, 2, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    assert_int_equal(t[0].index, 1);
    assert_true(t[1].pending_cost == 10000 && t[1].total == 400 + 5000 + 10000);
    /* at 0.1: 400 + 5000 + 1000 = 6400 < 7000, the holder again */
    cfg.pending_hit_weight = 0.1;
    memcpy(h, h0, sizeof(h));
    kvg_policy_choose(&cfg, &req, h, 2, 0, t, &why);
    assert_int_equal(t[0].index, 0);
    assert_true(t[0].pending_cost == 1000);
    /* pending_cost_per_block 0: pending work is not priced, and cold goes by rendezvous */
    cfg.pending_cost_per_block = 0;
    kvg_policy_candidate z[3];
    memcpy(z, c, sizeof(z));
    for (int i = 0; i < 3; i++)
        z[i].index = (uint32_t)i;
    kvg_policy_candidate want[3];
    memcpy(want, z, sizeof(want));
    kvg_policy_choose(&cfg, &req, z, 3, 0, t, &why);
    assert_int_equal(z[0].index, owner(want, 3, 42));
    assert_true(t[0].pending_cost == 0);
}

/* The slack: with few requests in flight over many workers the relative bound is 1 or 2, and
 * the slack keeps a holder within it up to load_slack requests above the least loaded. */
static void test_cost_slack(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    cfg.load_factor = 2;
    kvg_policy_request req = {.blocks = 100, .cold_key = 9};
    kvg_policy_terms t[8];
    kvg_policy_reason why;
    /* 8 workers, 3 in flight, all on the holder: relative B = ceil(3 x 4 / 8) = 2, 3 + 1 > 2 */
    kvg_policy_candidate c[8];
    for (uint32_t i = 0; i < 8; i++)
        c[i] = (kvg_policy_candidate){.index = i, .id_hash = 100 + i};
    c[5].inflight = 3;
    c[5].matched = 100;
    kvg_policy_candidate c0[8];
    memcpy(c0, c, sizeof(c));
    kvg_policy_choose(&cfg, &req, c, 8, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    assert_true(t[7].index == 5 && t[7].over_bound);
    /* slack 4: B = max(2, 0 + 4) = 4, 3 + 1 <= 4: the holder wins */
    for (uint32_t slack = 4; slack <= 5; slack++) {
        cfg.load_slack = slack;
        memcpy(c, c0, sizeof(c));
        kvg_policy_choose(&cfg, &req, c, 8, 0, t, &why);
        assert_int_equal(why, KVG_POLICY_REASON_HIT);
        assert_true(t[0].index == 5 && !t[0].over_bound);
    }
    /* slack 3: B = 3, 3 + 1 > 3: over again */
    cfg.load_slack = 3;
    memcpy(c, c0, sizeof(c));
    kvg_policy_choose(&cfg, &req, c, 8, 0, t, &why);
    assert_true(t[7].index == 5 && t[7].over_bound);
    /* the slack counts from the least loaded, and the relative bound still applies: everyone
     * else at 2, the holder at 9 (sum 23, relative ceil(3 x 24 / 8) = 9, slack 2 + 4 = 6): over;
     * the holder at 5 (sum 19, relative ceil(3 x 20 / 8) = 8 >= 5 + 1): within, and its 25000 us
     * of queue beat 20000 + 10000 */
    cfg.load_slack = 4;
    for (uint32_t i = 0; i < 8; i++)
        c0[i].inflight = i == 5 ? 9 : 2;
    memcpy(c, c0, sizeof(c));
    kvg_policy_choose(&cfg, &req, c, 8, 0, t, &why);
    assert_true(t[7].index == 5 && t[7].over_bound);
    c0[5].inflight = 5;
    memcpy(c, c0, sizeof(c));
    kvg_policy_choose(&cfg, &req, c, 8, 0, t, &why);
    assert_true(t[0].index == 5 && !t[0].over_bound);
}

/* The bounded-load rule, at its edges. */
static void test_cost_bound(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_request req = {.blocks = 1000, .cold_key = 3};
    kvg_policy_terms t[11];
    kvg_policy_reason why;
    /* {5,0,0,0}: B = ceil(1.25 x 6 / 4) = 2; the holder (6 > 2) ranks last, though its total
     * (25000) is the lowest; the three cold ones tie at 200000 and go by rendezvous */
    kvg_policy_candidate c[4] = {
        {.index = 0, .inflight = 5, .matched = 1000, .id_hash = 50},
        {.index = 1, .id_hash = 51},
        {.index = 2, .id_hash = 52},
        {.index = 3, .id_hash = 53},
    };
    uint32_t cold_owner = owner(c + 1, 3, 3);
    kvg_policy_choose(&cfg, &req, c, 4, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    assert_int_equal(c[0].index, cold_owner);
    assert_true(t[0].rendezvous > t[1].rendezvous && t[1].rendezvous > t[2].rendezvous);
    for (int i = 0; i < 3; i++) {
        assert_false(t[i].over_bound);
        assert_true(t[i].total == 200000);
    }
    assert_terms(&t[3], 0, 0, 25000, true, rdv(3, 50));

    /* {2,1,1,0}: B = ceil(1.25 x 5 / 4) = ceil(1.5625) = 2: inflight 1 is within (2 <= 2),
     * inflight 2 is not (3 > 2) */
    kvg_policy_candidate d[4] = {
        {.index = 0, .inflight = 2, .id_hash = 50},
        {.index = 1, .inflight = 1, .matched = 1000, .id_hash = 51},
        {.index = 2, .inflight = 1, .id_hash = 52},
        {.index = 3, .inflight = 0, .id_hash = 53},
    };
    assert_int_equal(choose_first(&cfg, 1000, 3, d, 4, 0), 1);
    d[1].matched = 0;
    d[0].matched = 1000;
    kvg_policy_candidate e[4];
    memcpy(e, d, sizeof(e));
    kvg_policy_choose(&cfg, &req, e, 4, 0, t, &why);
    assert_int_equal(e[0].index, 3); /* the cheapest within the bound: 200000 */
    assert_int_equal(e[3].index, 0);
    assert_true(t[3].over_bound && !t[2].over_bound);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);

    /* load_factor 0.1, 11 workers, 49 in flight: B = 1.1 x 50 / 11 = 5 exactly (doubles give
     * 5.000000000000001, which ceil would make 6): inflight 5 is over */
    cfg.load_factor = 0.1;
    kvg_policy_candidate f[11];
    for (uint32_t i = 0; i < 11; i++)
        f[i] = (kvg_policy_candidate){.index = i, .inflight = i < 5 ? 5 : 4, .id_hash = 60 + i};
    f[0].matched = 100;
    req.blocks = 100;
    kvg_policy_choose(&cfg, &req, f, 11, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    for (int i = 0; i < 11; i++) {
        assert_int_equal(t[i].over_bound, f[i].inflight == 5);
        assert_int_equal(f[i].inflight, i < 6 ? 4 : 5);
    }
    /* the over-bound ones by total too: the holder (25000) first of them, not first overall */
    assert_int_equal(f[6].index, 0);
    assert_terms(&t[6], 0, 0, 25000, true, rdv(3, 60));
    assert_true(t[0].total == 40000 && t[7].total == 45000);

    /* load_factor 0: strict balance. {1,1,1,0}: B = ceil(4 / 4) = 1 */
    cfg.load_factor = 0;
    kvg_policy_candidate g[4] = {
        {.index = 0, .inflight = 1, .matched = 1000, .id_hash = 1},
        {.index = 1, .inflight = 1, .id_hash = 2},
        {.index = 2, .inflight = 1, .id_hash = 3},
        {.index = 3, .inflight = 0, .id_hash = 4},
    };
    assert_int_equal(choose_first(&cfg, 1000, 3, g, 4, 0), 3);
    /* a large load factor lets the holder through: ceil(101 x 4 / 4) = 101 */
    cfg.load_factor = 100;
    assert_int_equal(choose_first(&cfg, 1000, 3, g, 4, 0), 0);
}

/* A cold prefix goes to the same worker whatever the rotation and the order of the input. */
static void test_cold_stable(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_candidate base[8];
    /* {2,1,2,1,...}: B = ceil(1.25 x 13 / 8) = 3, all within: load does not move a cold key */
    for (uint32_t i = 0; i < 8; i++)
        base[i] = (kvg_policy_candidate){
            .index = i, .inflight = 2 - i % 2, .id_hash = 0x5000 + 7 * (uint64_t)i};
    uint64_t seed = 99;
    for (int k = 0; k < 50; k++) {
        uint64_t key = next_rand(&seed);
        kvg_policy_candidate want[8];
        memcpy(want, base, sizeof(want));
        kvg_policy_request req = {.blocks = 4, .cold_key = key};
        kvg_policy_reason why;
        kvg_policy_choose(&cfg, &req, want, 8, 0, NULL, &why);
        assert_int_equal(why, KVG_POLICY_REASON_COLD);
        assert_int_equal(want[0].index, owner(base, 8, key));
        for (uint64_t r = 0; r < 40; r++) {
            kvg_policy_candidate c[8];
            memcpy(c, base, sizeof(c));
            shuffle_cands(c, 8, r * 1000 + (uint64_t)k);
            kvg_policy_choose(&cfg, &req, c, 8, r, NULL, &why);
            assert_cands_equal(c, want, 8); /* the whole ranking, not only the first */
        }
    }
}

/* 1000 random cold keys over 4 workers: each gets 15-35 %. */
static void test_cold_spread(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_candidate base[4];
    for (uint32_t i = 0; i < 4; i++)
        base[i] = (kvg_policy_candidate){.index = i, .id_hash = 0x77 + (uint64_t)i};
    unsigned count[4] = {0};
    uint64_t seed = 2024;
    for (int k = 0; k < 1000; k++)
        count[choose_first(&cfg, 1, next_rand(&seed), base, 4, (uint64_t)k)]++;
    for (int i = 0; i < 4; i++)
        assert_true(count[i] >= 150 && count[i] <= 350);
}

/* Removing a worker moves only the cold keys it owned (prefix_only and cost alike). */
static void test_cold_removal(void **state)
{
    (void)state;
    kvg_policy_kind kinds[] = {KVG_POLICY_COST, KVG_POLICY_PREFIX_ONLY};
    kvg_policy_candidate all[5], rest[4];
    for (uint32_t i = 0; i < 5; i++)
        all[i] = (kvg_policy_candidate){.index = i, .id_hash = 0xabc000 + (uint64_t)i};
    for (uint32_t i = 0, o = 0; i < 5; i++)
        if (i != 2)
            rest[o++] = all[i];
    for (size_t kk = 0; kk < KVG_ARRAY_LEN(kinds); kk++) {
        kvg_policy_config cfg = cfg_of(kinds[kk]);
        uint64_t seed = 5;
        unsigned moved = 0, on_two = 0;
        for (int k = 0; k < 1000; k++) {
            uint64_t key = next_rand(&seed);
            uint32_t before = choose_first(&cfg, 2, key, all, 5, 0);
            uint32_t after = choose_first(&cfg, 2, key, rest, 4, 0);
            assert_int_not_equal(after, 2);
            on_two += before == 2;
            moved += before != after;
            if (before != 2)
                assert_int_equal(after, before);
        }
        assert_int_equal(moved, on_two);
        assert_true(on_two > 100); /* it did own some */
    }
}

/* Cold keys whose owner is over the bound go to the next owner within it. */
static void test_cold_bound(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_candidate c[4];
    for (uint32_t i = 0; i < 4; i++)
        c[i] = (kvg_policy_candidate){.index = i, .id_hash = 900 + (uint64_t)i};
    uint64_t key = 31337;
    uint32_t top = owner(c, 4, key);
    c[top].inflight = 5; /* B = 2 */
    kvg_policy_request req = {.blocks = 3, .cold_key = key};
    kvg_policy_terms t[4];
    kvg_policy_reason why;
    kvg_policy_choose(&cfg, &req, c, 4, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
    assert_int_equal(c[3].index, top);
    assert_true(t[3].over_bound);
    for (int i = 0; i < 3; i++) {
        assert_false(t[i].over_bound);
        assert_int_equal(t[i].index, c[i].index);
        assert_true(t[i].rendezvous == rdv(key, c[i].id_hash));
        if (i > 0)
            assert_true(t[i - 1].rendezvous > t[i].rendezvous);
    }
}

static void test_prefix_only(void **state)
{
    (void)state;
    kvg_policy_config cfg = cfg_of(KVG_POLICY_PREFIX_ONLY);
    kvg_policy_request req = {.blocks = 8, .cold_key = 12};
    kvg_policy_candidate c[4] = {
        {.index = 0, .inflight = 100, .matched = 5, .id_hash = 1},
        {.index = 1, .matched = 3, .id_hash = 2},
        {.index = 2, .matched = 3, .id_hash = 3},
        {.index = 3, .matched = 0, .id_hash = 4},
    };
    kvg_policy_terms t[4];
    kvg_policy_reason why;
    /* the most matched wins, overloaded as it is (B = ceil(1.25 x 101 / 4) = 32) */
    kvg_policy_choose(&cfg, &req, c, 4, 0, t, &why);
    assert_int_equal(why, KVG_POLICY_REASON_HIT);
    bool one_first = rdv(12, 2) > rdv(12, 3);
    assert_int_equal(c[0].index, 0);
    assert_int_equal(c[1].index, one_first ? 1 : 2);
    assert_int_equal(c[2].index, one_first ? 2 : 1);
    assert_int_equal(c[3].index, 3);
    assert_terms(&t[0], 0, 600, 500000, true, rdv(12, 1));
    assert_terms(&t[3], 3, 1600, 0, false, rdv(12, 4));

    /* matched beyond the request is the whole request: 10 and 8 of 8 tie, by rendezvous */
    kvg_policy_candidate d[2] = {{.index = 0, .matched = 10, .id_hash = 1},
                                 {.index = 1, .matched = 8, .id_hash = 2}};
    assert_int_equal(choose_first(&cfg, 8, 12, d, 2, 0), owner(d, 2, 12));

    /* nobody holds anything: rendezvous, load or not */
    kvg_policy_candidate e[4] = {
        {.index = 0, .inflight = 50, .id_hash = 1},
        {.index = 1, .inflight = 0, .id_hash = 2},
        {.index = 2, .inflight = 9, .id_hash = 3},
        {.index = 3, .inflight = 1, .id_hash = 4},
    };
    for (uint64_t key = 0; key < 20; key++) {
        kvg_policy_candidate f[4];
        memcpy(f, e, sizeof(f));
        req.cold_key = key;
        kvg_policy_choose(&cfg, &req, f, 4, key, t, &why);
        assert_int_equal(why, KVG_POLICY_REASON_COLD);
        assert_int_equal(f[0].index, owner(e, 4, key));
        for (int i = 1; i < 4; i++)
            assert_true(t[i - 1].rendezvous > t[i].rendezvous);
    }
}

/* The load-only kinds, and requests without a full block, rank as kvg_policy_rank does. */
static void test_choose_load(void **state)
{
    (void)state;
    kvg_policy_candidate base[6];
    for (uint32_t i = 0; i < 6; i++)
        base[i] = (kvg_policy_candidate){
            .index = i, .inflight = i % 3, .matched = i, .id_hash = 40 + (uint64_t)i};
    kvg_policy_kind kinds[] = {KVG_POLICY_LEAST_LOADED, KVG_POLICY_ROUND_ROBIN, KVG_POLICY_RANDOM,
                               KVG_POLICY_COST, KVG_POLICY_PREFIX_ONLY};
    for (size_t k = 0; k < KVG_ARRAY_LEN(kinds); k++) {
        kvg_policy_config cfg = cfg_of(kinds[k]);
        for (uint64_t r = 0; r < 12; r++) {
            /* load-only kinds ignore the request; prefix-aware ones see no block */
            bool aware = kinds[k] == KVG_POLICY_COST || kinds[k] == KVG_POLICY_PREFIX_ONLY;
            kvg_policy_request req = {.blocks = aware ? 0 : 6, .cold_key = 77};
            kvg_policy_candidate c[6], want[6];
            memcpy(c, base, sizeof(c));
            memcpy(want, base, sizeof(want));
            kvg_policy_rank(aware ? KVG_POLICY_LEAST_LOADED : kinds[k], want, 6, r);
            kvg_policy_terms t[6];
            kvg_policy_reason why = KVG_POLICY_REASON_COUNT;
            kvg_policy_choose(&cfg, &req, c, 6, r, t, &why);
            assert_cands_equal(c, want, 6);
            assert_int_equal(why, KVG_POLICY_REASON_LOAD);
            for (int i = 0; i < 6; i++) {
                assert_int_equal(t[i].index, c[i].index);
                assert_true(t[i].rendezvous == (aware ? 0 : rdv(77, c[i].id_hash)));
                assert_true(t[i].queue_cost == 5000.0 * c[i].inflight);
            }
        }
    }
    /* n 0 writes nothing */
    kvg_policy_config cfg = cfg_of(KVG_POLICY_COST);
    kvg_policy_request req = {.blocks = 3, .cold_key = 1};
    kvg_policy_reason why = KVG_POLICY_REASON_COUNT;
    kvg_policy_choose(&cfg, &req, NULL, 0, 0, NULL, &why);
    assert_int_equal(why, KVG_POLICY_REASON_COUNT);
    /* one candidate, any kind */
    kvg_policy_candidate one = {.index = 9, .inflight = 1000, .id_hash = 5};
    kvg_policy_choose(&cfg, &req, &one, 1, 0, NULL, &why);
    assert_int_equal(one.index, 9);
    assert_int_equal(why, KVG_POLICY_REASON_COLD);
}

/* The reference least_loaded order: a stable sort by load, then each tie rotated. */
static void ref_least_loaded(kvg_policy_candidate *c, size_t n, uint64_t rotation)
{
    for (size_t i = 1; i < n; i++) {
        kvg_policy_candidate x = c[i];
        size_t j = i;
        for (; j > 0 && c[j - 1].inflight > x.inflight; j--)
            c[j] = c[j - 1];
        c[j] = x;
    }
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && c[j].inflight == c[i].inflight)
            j++;
        for (size_t r = (size_t)(rotation % (j - i)); r > 0; r--) {
            kvg_policy_candidate first = c[i];
            memmove(c + i, c + i + 1, (j - i - 1) * sizeof(*c));
            c[j - 1] = first;
        }
        i = j;
    }
}

/* Up to 4096 candidates: the order keeps its rules, and does not depend on the input order. */
static void test_choose_many(void **state)
{
    (void)state;
    enum { N = 4096 };
    static kvg_policy_candidate c[N], d[N], e[N];
    static kvg_policy_terms t[N];
    uint64_t seed = 77;
    size_t sizes[] = {33, 100, 1000, N};
    for (size_t s = 0; s < KVG_ARRAY_LEN(sizes); s++) {
        size_t n = sizes[s];
        for (uint32_t i = 0; i < n; i++)
            c[i] = (kvg_policy_candidate){.index = i,
                                          .inflight = (uint32_t)(next_rand(&seed) % 20),
                                          .matched = (uint32_t)(next_rand(&seed) % 150),
                                          .id_hash = next_rand(&seed),
                                          .waiting = (uint32_t)(next_rand(&seed) % 3)};
        /* least_loaded at this size: the merge sort agrees with the reference */
        memcpy(d, c, n * sizeof(*c));
        memcpy(e, c, n * sizeof(*c));
        kvg_policy_rank(KVG_POLICY_LEAST_LOADED, d, n, 12345);
        ref_least_loaded(e, n, 12345);
        assert_cands_equal(d, e, n);

        kvg_policy_kind kinds[] = {KVG_POLICY_COST, KVG_POLICY_PREFIX_ONLY};
        for (size_t k = 0; k < KVG_ARRAY_LEN(kinds); k++) {
            kvg_policy_config cfg = cfg_of(kinds[k]);
            kvg_policy_request req = {.blocks = 100, .cold_key = 4242};
            kvg_policy_reason why;
            memcpy(d, c, n * sizeof(*c));
            kvg_policy_choose(&cfg, &req, d, n, 1, t, &why);
            assert_int_equal(why, KVG_POLICY_REASON_HIT);
            bool seen_over = false;
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(t[i].index, d[i].index);
                if (i == 0)
                    continue;
                const kvg_policy_terms *p = &t[i - 1], *q = &t[i];
                if (kinds[k] == KVG_POLICY_COST) {
                    seen_over |= q->over_bound;
                    assert_false(p->over_bound && !q->over_bound);
                    if (p->over_bound == q->over_bound) {
                        assert_true(p->total <= q->total);
                        if (p->total == q->total)
                            assert_true(p->rendezvous > q->rendezvous);
                    }
                } else {
                    uint32_t pm = KVG_MIN(d[i - 1].matched, 100), qm = KVG_MIN(d[i].matched, 100);
                    assert_true(pm >= qm);
                    if (pm == qm)
                        assert_true(p->rendezvous > q->rendezvous);
                }
            }
            if (kinds[k] == KVG_POLICY_COST)
                assert_true(seen_over);
            /* the same set in another order ranks the same */
            memcpy(e, c, n * sizeof(*c));
            shuffle_cands(e, n, n + k);
            kvg_policy_choose(&cfg, &req, e, n, 999, NULL, NULL);
            assert_cands_equal(d, e, n);
        }
    }
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

#define DEFAULT_JSON                                                                               \
    "{\"policy\":\"cost\",\"block_bytes\":64,\"block_tokens\":16,\"max_blocks\":4096,"             \
    "\"cold_blocks\":4,\"load_factor\":2,\"load_slack\":4,\"prefill_cost_per_block\":200,"         \
    "\"queue_cost_per_request\":1000,\"waiting_cost_per_request\":5000,\"kv_usage_cost\":0,"       \
    "\"turnover_cost_per_block\":50,\"pending_cost_per_block\":200,\"pending_hit_weight\":0,"      \
    "\"cpu_block_weight\":0.8}"

/* Field by field: the struct has padding that memcmp would compare. */
static void assert_config_equal(const kvg_policy_config *a, const kvg_policy_config *b)
{
    assert_int_equal(a->kind, b->kind);
    assert_int_equal(a->block_bytes, b->block_bytes);
    assert_int_equal(a->block_tokens, b->block_tokens);
    assert_int_equal(a->max_blocks, b->max_blocks);
    assert_int_equal(a->cold_blocks, b->cold_blocks);
    assert_true(a->load_factor == b->load_factor);
    assert_int_equal(a->load_slack, b->load_slack);
    assert_true(a->prefill_cost_per_block == b->prefill_cost_per_block);
    assert_true(a->queue_cost_per_request == b->queue_cost_per_request);
    assert_true(a->waiting_cost_per_request == b->waiting_cost_per_request);
    assert_true(a->kv_usage_cost == b->kv_usage_cost);
    assert_true(a->turnover_cost_per_block == b->turnover_cost_per_block);
    assert_true(a->pending_cost_per_block == b->pending_cost_per_block);
    assert_true(a->pending_hit_weight == b->pending_hit_weight);
    assert_true(a->cpu_block_weight == b->cpu_block_weight);
}

static void test_config(void **state)
{
    (void)state;
    kvg_policy_config cfg;
    char msg[160];
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_policy_config_init(&cfg);
    assert_int_equal(cfg.kind, KVG_POLICY_COST);
    assert_int_equal(cfg.block_bytes, 64);
    assert_int_equal(cfg.block_tokens, 16);
    assert_int_equal(cfg.max_blocks, 4096);
    assert_int_equal(cfg.cold_blocks, 4);
    assert_true(cfg.load_factor == 2.0);
    assert_int_equal(cfg.load_slack, 4);
    assert_true(cfg.prefill_cost_per_block == 200);
    assert_true(cfg.queue_cost_per_request == 1000);
    assert_true(cfg.waiting_cost_per_request == 5000);
    assert_true(cfg.kv_usage_cost == 0);
    assert_true(cfg.turnover_cost_per_block == 50);
    assert_true(cfg.pending_cost_per_block == 200);
    assert_true(cfg.pending_hit_weight == 0);
    assert_true(cfg.cpu_block_weight == 0.8);
    kvg_policy_config_to_json(&cfg, &b);
    assert_string_equal(b.data, DEFAULT_JSON);
    /* what to_json writes, apply_json reads back to the same settings */
    kvg_policy_config again;
    memset(&again, 0xa5, sizeof(again));
    again.kind = KVG_POLICY_RANDOM;
    assert_int_equal(apply(&again, b.data, msg, sizeof(msg)), 0);
    assert_config_equal(&again, &cfg);

    assert_int_equal(apply(&cfg, "{\"policy\":\"random\"}", msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_RANDOM);
    /* fields omitted keep their value */
    assert_int_equal(apply(&cfg, "{}", msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_RANDOM);
    assert_int_equal(cfg.block_bytes, 64);
    assert_int_equal(
        apply(&cfg, "{\"policy\":\"prefix_only\",\"load_factor\":0.1}", msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_PREFIX_ONLY);
    assert_true(cfg.load_factor == 0.1);
    assert_int_equal(cfg.max_blocks, 4096);

    /* every field, at its limits, and a round trip that changes nothing */
    const char *full =
        "{\"policy\":\"round_robin\",\"block_bytes\":16,\"block_tokens\":65536,"
        "\"max_blocks\":1048576,\"cold_blocks\":1024,\"load_factor\":0,\"load_slack\":1048576,"
        "\"prefill_cost_per_block\":0.1,\"queue_cost_per_request\":1000000000000,"
        "\"waiting_cost_per_request\":1.5e-7,\"kv_usage_cost\":12345.678,\"turnover_"
        "cost_per_block\":0,\"pending_cost_per_block\":1e12,\"pending_hit_weight\":1,"
        "\"cpu_block_weight\":0}";
    assert_int_equal(apply(&cfg, full, msg, sizeof(msg)), 0);
    assert_int_equal(cfg.kind, KVG_POLICY_ROUND_ROBIN);
    assert_int_equal(cfg.block_bytes, 16);
    assert_int_equal(cfg.block_tokens, 65536);
    assert_int_equal(cfg.max_blocks, 1048576);
    assert_int_equal(cfg.cold_blocks, 1024);
    assert_true(cfg.load_factor == 0);
    assert_int_equal(cfg.load_slack, 1048576);
    assert_true(cfg.prefill_cost_per_block == 0.1);
    assert_true(cfg.queue_cost_per_request == 1e12);
    assert_true(cfg.waiting_cost_per_request == 1.5e-7);
    assert_true(cfg.kv_usage_cost == 12345.678);
    assert_true(cfg.pending_cost_per_block == 1e12);
    assert_true(cfg.pending_hit_weight == 1);
    assert_true(cfg.cpu_block_weight == 0);
    kvg_buf_reset(&b);
    kvg_policy_config_to_json(&cfg, &b);
    assert_string_equal(b.data,
                        "{\"policy\":\"round_robin\",\"block_bytes\":16,\"block_tokens\":65536,"
                        "\"max_blocks\":1048576,\"cold_blocks\":1024,\"load_factor\":0,"
                        "\"load_slack\":1048576,\"prefill_cost_per_block\":0.1,\"queue_cost_per_"
                        "request\":1000000000000,"
                        "\"waiting_cost_per_request\":1.5e-07,\"kv_usage_cost\":12345.678,"
                        "\"turnover_cost_per_block\":0,\"pending_cost_per_block\":1000000000000,"
                        "\"pending_hit_weight\":1,\"cpu_block_weight\":0}");
    kvg_policy_config_init(&again);
    assert_int_equal(apply(&again, b.data, msg, sizeof(msg)), 0);
    assert_config_equal(&again, &cfg);
    /* -0 is 0, and is written as 0; an integer-valued number is fine for a number field */
    assert_int_equal(apply(&cfg, "{\"load_factor\":-0,\"kv_usage_cost\":7}", msg, sizeof(msg)), 0);
    assert_false(signbit(cfg.load_factor));
    assert_true(cfg.kv_usage_cost == 7);
    assert_int_equal(apply(&cfg, "{\"load_factor\":100}", msg, sizeof(msg)), 0);
    assert_true(cfg.load_factor == 100);
    assert_int_equal(apply(&cfg, "{\"policy\":\"round_robin\"}", msg, sizeof(msg)), 0);
    kvg_policy_config before = cfg;

    /* errors name the field and leave cfg unchanged */
    static const struct {
        const char *json;
        const char *msg; /* the whole message */
    } bad[] = {
        {"{\"policy\":\"fastest\"}",
         "policy: unknown policy \"fastest\" (one of least_loaded, round_robin, random, cost, "
         "prefix_only)"},
        {"{\"policy\":\"random\",\"polcy\":1}", "polcy: unknown field"},
        {"{\"policy\":7}", "policy: must be a string, not number"},
        {"{\"policy\":null}", "policy: must be a string, not null"},
        {"{\"policy\":\"random\\u0000x\"}",
         "policy: unknown policy \"random?x\" (one of least_loaded, round_robin, random, cost, "
         "prefix_only)"},
        {"{\"a\\u0000b\":1}", "a?b: unknown field"},
        {"[]", "policy settings: must be a JSON object, not array"},
        {"{\"block_bytes\":15}", "block_bytes: must be an integer in 16..65536"},
        {"{\"block_bytes\":65537}", "block_bytes: must be an integer in 16..65536"},
        {"{\"block_bytes\":1.5}", "block_bytes: must be an integer in 16..65536"},
        {"{\"block_bytes\":64.0}", "block_bytes: must be an integer in 16..65536"},
        {"{\"block_bytes\":6.4e1}", "block_bytes: must be an integer in 16..65536"},
        {"{\"block_bytes\":-64}", "block_bytes: must be an integer in 16..65536"},
        {"{\"block_bytes\":99999999999999999999}", "block_bytes: must be an integer in 16..65536"},
        {"{\"block_bytes\":\"64\"}", "block_bytes: must be an integer in 16..65536, not string"},
        {"{\"block_tokens\":0}", "block_tokens: must be an integer in 1..65536"},
        {"{\"block_tokens\":65537}", "block_tokens: must be an integer in 1..65536"},
        {"{\"block_tokens\":true}", "block_tokens: must be an integer in 1..65536, not boolean"},
        {"{\"max_blocks\":0}", "max_blocks: must be an integer in 1..1048576"},
        {"{\"max_blocks\":1048577}", "max_blocks: must be an integer in 1..1048576"},
        {"{\"max_blocks\":4294967297}", "max_blocks: must be an integer in 1..1048576"},
        {"{\"max_blocks\":null}", "max_blocks: must be an integer in 1..1048576, not null"},
        {"{\"cold_blocks\":0}", "cold_blocks: must be an integer in 1..1024"},
        {"{\"cold_blocks\":1025}", "cold_blocks: must be an integer in 1..1024"},
        {"{\"cold_blocks\":[4]}", "cold_blocks: must be an integer in 1..1024, not array"},
        {"{\"load_factor\":-0.01}", "load_factor: must be a number in 0..100"},
        {"{\"load_factor\":100.5}", "load_factor: must be a number in 0..100"},
        {"{\"load_factor\":1e400}", "load_factor: must be a number in 0..100"},
        {"{\"load_factor\":\"0.25\"}", "load_factor: must be a number in 0..100, not string"},
        {"{\"prefill_cost_per_block\":-1}", "prefill_cost_per_block: must be a number in 0..1e12"},
        {"{\"prefill_cost_per_block\":1.000001e12}",
         "prefill_cost_per_block: must be a number in 0..1e12"},
        {"{\"prefill_cost_per_block\":{}}",
         "prefill_cost_per_block: must be a number in 0..1e12, not object"},
        {"{\"queue_cost_per_request\":-5000}",
         "queue_cost_per_request: must be a number in 0..1e12"},
        {"{\"queue_cost_per_request\":2e12}",
         "queue_cost_per_request: must be a number in 0..1e12"},
        {"{\"queue_cost_per_request\":false}",
         "queue_cost_per_request: must be a number in 0..1e12, not boolean"},
        {"{\"waiting_cost_per_request\":-1e-9}",
         "waiting_cost_per_request: must be a number in 0..1e12"},
        {"{\"waiting_cost_per_request\":1e13}",
         "waiting_cost_per_request: must be a number in 0..1e12"},
        {"{\"kv_usage_cost\":-2}", "kv_usage_cost: must be a number in 0..1e12"},
        {"{\"kv_usage_cost\":1e999}", "kv_usage_cost: must be a number in 0..1e12"},
        {"{\"kv_usage_cost\":\"high\"}", "kv_usage_cost: must be a number in 0..1e12, not string"},
        {"{\"load_slack\":-1}", "load_slack: must be an integer in 0..1048576"},
        {"{\"load_slack\":1048577}", "load_slack: must be an integer in 0..1048576"},
        {"{\"load_slack\":1.5}", "load_slack: must be an integer in 0..1048576"},
        {"{\"pending_cost_per_block\":-1}", "pending_cost_per_block: must be a number in 0..1e12"},
        {"{\"pending_hit_weight\":1.01}", "pending_hit_weight: must be a number in 0..1"},
        {"{\"cpu_block_weight\":-0.1}", "cpu_block_weight: must be a number in 0..1"},
        {"{\"cpu_block_weight\":1.5}", "cpu_block_weight: must be a number in 0..1"},
        {"{\"pending_hit_weight\":-0.5}", "pending_hit_weight: must be a number in 0..1"},
        /* a good member before a bad one is not applied either */
        {"{\"block_bytes\":128,\"cold_blocks\":0}", "cold_blocks: must be an integer in 1..1024"},
        {"{\"load_factor\":1,\"weights\":{}}", "weights: unknown field"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        msg[0] = '\0';
        assert_int_equal(apply(&cfg, bad[i].json, msg, sizeof(msg)), KVG_EPARSE);
        if (strcmp(msg, bad[i].msg) != 0)
            fail_msg("%s: got \"%s\", want \"%s\"", bad[i].json, msg, bad[i].msg);
        assert_config_equal(&cfg, &before);
    }
    assert_int_equal(kvg_policy_config_apply_json(&cfg, NULL, NULL, 0), KVG_EPARSE);
    /* a repeated member is an error, as at every entry point, and changes nothing */
    assert_int_equal(
        apply(&cfg, "{\"policy\":\"random\",\"policy\":\"least_loaded\"}", msg, sizeof(msg)),
        KVG_EPARSE);
    assert_string_equal(msg, "policy: appears more than once");
    assert_config_equal(&cfg, &before);
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
    assert_int_equal(c.kind, KVG_POLICY_COST);
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

/* The settings as immutable snapshots: a thread's cached settings are the published object
 * (no copy), stay as they were while it holds them, and reload once per change. */
static void test_state_snapshots(void **state)
{
    (void)state;
    kvg_policy_state *st = NULL;
    assert_int_equal(kvg_policy_state_new(&st), 0);
    kvg_snapshot_cache cache;
    kvg_snapshot_cache_init(&cache, kvg_policy_state_snapshots(st));
    assert_true(kvg_snapshot_cache_refresh(&cache));
    const kvg_policy_config *held = kvg_policy_config_of(kvg_snapshot_cache_get(&cache));
    kvg_policy_config defaults;
    kvg_policy_config_init(&defaults);
    kvg_buf a, b; /* compared as JSON: the struct has padding */
    kvg_buf_init(&a);
    kvg_buf_init(&b);
    kvg_policy_config_to_json(held, &a);
    kvg_policy_config_to_json(&defaults, &b);
    assert_string_equal(a.data, b.data);
    kvg_buf_done(&a);
    kvg_buf_done(&b);
    assert_int_equal(kvg_snapshot_generation(kvg_snapshot_cache_get(&cache)),
                     kvg_policy_state_generation(st));
    assert_false(kvg_snapshot_cache_refresh(&cache));

    /* A set publishes a new object; the one the thread holds does not change under it. */
    kvg_policy_config c = defaults;
    c.kind = KVG_POLICY_LEAST_LOADED;
    c.load_factor = 2;
    assert_int_equal(kvg_policy_state_set(st, &c), 0);
    assert_int_equal(held->kind, KVG_POLICY_COST);
    assert_true(held->load_factor == defaults.load_factor);
    assert_true(kvg_snapshot_cache_refresh(&cache));
    const kvg_policy_config *now = kvg_policy_config_of(kvg_snapshot_cache_get(&cache));
    assert_ptr_not_equal(now, held);
    assert_int_equal(now->kind, KVG_POLICY_LEAST_LOADED);
    assert_true(now->load_factor == 2);
    assert_false(kvg_snapshot_cache_refresh(&cache));

    /* Out of memory: -ENOMEM, and neither the settings nor the number move. */
    uint64_t g = kvg_policy_state_generation(st);
    c.kind = KVG_POLICY_RANDOM;
    fail_alloc_nth(0);
    assert_int_equal(kvg_policy_state_set(st, &c), -ENOMEM);
    assert_true(fail_alloc_off());
    assert_int_equal(kvg_policy_state_generation(st), g);
    assert_false(kvg_snapshot_cache_refresh(&cache));
    kvg_policy_config d;
    kvg_policy_state_get(st, &d);
    assert_int_equal(d.kind, KVG_POLICY_LEAST_LOADED);

    /* The thread's settings outlive the state. */
    kvg_policy_state_free(st);
    assert_int_equal(now->kind, KVG_POLICY_LEAST_LOADED);
    kvg_snapshot_cache_done(&cache);

    /* Creation fails cleanly at each of its allocations. */
    for (long n = 0;; n++) {
        kvg_policy_state *s2 = NULL;
        fail_alloc_nth(n);
        int rc = kvg_policy_state_new(&s2);
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_policy_state_free(s2);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        assert_null(s2);
    }
}

/* The first `top` places of choose_top are exactly choose's, for random inputs. */
static void test_choose_top(void **state)
{
    (void)state;
    uint64_t seed = 99;
    for (int round = 0; round < 300; round++) {
        size_t n = 1 + (size_t)(test_mix(++seed) % 300);
        size_t top = (size_t)(test_mix(++seed) % (n + 2));
        kvg_policy_config cfg = cfg_of(round % 3 ? KVG_POLICY_COST : KVG_POLICY_PREFIX_ONLY);
        kvg_policy_candidate a[300], b[300];
        for (size_t i = 0; i < n; i++) {
            uint64_t r = test_mix(++seed);
            a[i] = (kvg_policy_candidate){.index = (uint32_t)i,
                                          .inflight = (uint32_t)(r % 7),
                                          .matched =
                                              (uint32_t)((r >> 8) % 3 == 0 ? (r >> 16) % 40 : 0),
                                          .id_hash = test_mix(r)};
        }
        memcpy(b, a, n * sizeof(*a));
        kvg_policy_request req = {.blocks = 32, .cold_key = test_mix(++seed)};
        kvg_policy_terms ta[300], tb[300];
        kvg_policy_reason ra, rb;
        kvg_policy_choose(&cfg, &req, a, n, 0, ta, &ra);
        kvg_policy_choose_top(&cfg, &req, b, n, top, 0, tb, &rb);
        size_t want = top == 0 || top > n ? n : top;
        assert_int_equal(ra, rb);
        for (size_t i = 0; i < want; i++) {
            assert_int_equal(a[i].index, b[i].index);
            assert_true(ta[i].total == tb[i].total);
        }
        /* The rest is a permutation of the rest. */
        unsigned seen[300] = {0};
        for (size_t i = 0; i < n; i++)
            seen[b[i].index]++;
        for (size_t i = 0; i < n; i++)
            assert_int_equal(seen[i], 1);
    }
}

/* The salt memo answers what the HMAC answers, for more scopes than it has slots (entries are
 * replaced) and again for each of them. */
static void test_salt_cache(void **state)
{
    (void)state;
    static const uint8_t secret[] = "0123456789abcdef0123456789abcdef";
    kvg_salt_cache c;
    kvg_salt_cache_init(&c, secret, sizeof(secret) - 1);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 3 * KVG_SALT_CACHE_SLOTS; i++) {
            char scope[32], want[KVG_SALT_LEN + 1], got[KVG_SALT_LEN + 1];
            snprintf(scope, sizeof(scope), i % 2 ? "tenant:t%d" : "group:g%d", i % (round + 40));
            assert_int_equal(kvg_policy_scope_salt(secret, sizeof(secret) - 1, scope, want), 0);
            assert_int_equal(kvg_salt_cache_get(&c, scope, got), 0);
            assert_string_equal(got, want);
        }
    }
    char out[KVG_SALT_LEN + 1];
    assert_int_equal(kvg_salt_cache_get(&c, NULL, out), -EINVAL);
    kvg_salt_cache_done(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_least_loaded),
        cmocka_unit_test(test_cost_turnover),
        cmocka_unit_test(test_cost_pending),
        cmocka_unit_test(test_cost_slack),
        cmocka_unit_test(test_ties_rotate),
        cmocka_unit_test(test_round_robin),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_random_permutation),
        cmocka_unit_test(test_rendezvous),
        cmocka_unit_test(test_cost_hit_vs_cold),
        cmocka_unit_test(test_cost_cpu_tier),
        cmocka_unit_test(test_cost_block_weight),
        cmocka_unit_test(test_cost_busy_holder_loses),
        cmocka_unit_test(test_cost_bound),
        cmocka_unit_test(test_cold_stable),
        cmocka_unit_test(test_cold_spread),
        cmocka_unit_test(test_cold_removal),
        cmocka_unit_test(test_cold_bound),
        cmocka_unit_test(test_prefix_only),
        cmocka_unit_test(test_choose_load),
        cmocka_unit_test(test_choose_many),
        cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_scope_salt),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_choose_top),
        cmocka_unit_test(test_salt_cache),
        cmocka_unit_test(test_state),
        cmocka_unit_test(test_state_snapshots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
