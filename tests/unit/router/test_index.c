/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the embedded prefix index: exact scenarios, LRU and limits, worker changes,
 * allocation failures, a randomized comparison with a reference model, and threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fail_alloc.h"
#include "index_int.h"

static kvg_prefix_index *new_index(uint64_t max_entries, uint32_t default_capacity)
{
    kvg_index_config cfg = {.max_entries = max_entries, .default_capacity = default_capacity};
    kvg_prefix_index *idx = NULL;
    assert_int_equal(kvg_index_new(&cfg, &idx), 0);
    assert_non_null(idx);
    return idx;
}

static void set1(kvg_prefix_index *idx, uint64_t id, uint32_t capacity)
{
    kvg_index_worker w = {.id = id, .name = "w", .capacity = capacity};
    assert_int_equal(kvg_index_set_workers(idx, &w, 1), 0);
}

static uint32_t match1(kvg_prefix_index *idx, uint64_t id, const uint64_t *keys, size_t n)
{
    uint32_t m = 12345;
    kvg_index_match(idx, keys, n, &id, 1, &m);
    return m;
}

static void check(kvg_prefix_index *idx)
{
    int rc = kvg_index_check(idx);
    if (rc != 0)
        fail_msg("index invariant %d broken", rc);
}

static kvg_index_stats stats(kvg_prefix_index *idx)
{
    kvg_index_stats st;
    kvg_index_stats_get(idx, &st);
    return st;
}

/* ---- scenarios ------------------------------------------------------------------------------- */

static void test_empty(void **state)
{
    (void)state;
    kvg_prefix_index *idx = NULL;
    assert_int_equal(kvg_index_new(NULL, &idx), 0);
    uint64_t keys[] = {1, 2, 3};
    uint64_t ids[] = {1, 2};
    uint32_t m[2] = {9, 9};
    kvg_index_match(idx, keys, 3, ids, 2, m);
    assert_int_equal(m[0], 0);
    assert_int_equal(m[1], 0);
    kvg_index_match(idx, keys, 3, ids, 0, NULL);
    assert_int_equal(kvg_index_record(idx, 1, keys, 3), KVG_ENOTFOUND);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 0);
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.capacity, 0);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.inserts, 0);
    assert_int_equal(st.workers, 0);
    check(idx);

    /* a worker with the default capacity (65536), capped by max_entries (1 << 24) */
    set1(idx, 7, 0);
    assert_int_equal(stats(idx).capacity, 65536);
    assert_int_equal(stats(idx).workers, 1);
    assert_int_equal(kvg_index_record(idx, 7, NULL, 0), 0);
    assert_int_equal(match1(idx, 7, keys, 0), 0);
    assert_int_equal(match1(idx, 7, keys, 3), 0);
    kvg_index_free(idx);
    kvg_index_free(NULL);

    kvg_index_config bad = {.max_entries = (UINT64_C(1) << 31) + 1};
    idx = NULL;
    assert_int_equal(kvg_index_new(&bad, &idx), -EINVAL);
    assert_null(idx);
}

static void test_one_chain(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 1, 100);
    uint64_t chain[12];
    for (int i = 0; i < 12; i++)
        chain[i] = 1000 + (uint64_t)i;
    assert_int_equal(kvg_index_record(idx, 1, chain, 10), 0);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 10);
    assert_int_equal(match1(idx, 1, chain, 10), 10);
    /* a longer request: the worker holds its first 10 */
    assert_int_equal(match1(idx, 1, chain, 12), 10);
    assert_int_equal(match1(idx, 1, chain, 4), 4);

    uint64_t shares6[10];
    memcpy(shares6, chain, sizeof(shares6));
    for (int i = 6; i < 10; i++)
        shares6[i] = 5000 + (uint64_t)i;
    assert_int_equal(match1(idx, 1, shares6, 10), 6);

    uint64_t differs0[10];
    memcpy(differs0, chain, sizeof(differs0));
    differs0[0] = 999;
    assert_int_equal(match1(idx, 1, differs0, 10), 0);

    kvg_index_stats st = stats(idx);
    assert_int_equal(st.entries, 10);
    assert_int_equal(st.inserts, 10);
    assert_int_equal(st.evictions, 0);
    /* recording what is already held adds nothing */
    assert_int_equal(kvg_index_record(idx, 1, chain, 10), 0);
    assert_int_equal(stats(idx).inserts, 10);
    assert_int_equal(stats(idx).entries, 10);
    check(idx);
    kvg_index_free(idx);
}

/* Keys that no real chain gives (13 after 11 here, after 12 there): the answer is only bounded,
 * since the depth is found by bisection on the rule that what a worker holds of a chain is a
 * prefix of it. Real chains are exact (test_model). */
static void test_gap(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 1, 100);
    uint64_t held[] = {10, 11, 13};
    assert_int_equal(kvg_index_record(idx, 1, held, 3), 0);
    uint64_t req[] = {10, 11, 12, 13};
    uint32_t got = match1(idx, 1, req, 4);
    assert_true(got == 2 || got == 4);
    uint64_t req1[] = {10, 11, 12, 14, 15};
    assert_int_equal(match1(idx, 1, req1, 5), 2);
    uint64_t req2[] = {11, 10};
    assert_int_equal(match1(idx, 1, req2, 2), 2);
    uint64_t req3[] = {12, 10};
    assert_int_equal(match1(idx, 1, req3, 2), 0);
    kvg_index_free(idx);
}

static void test_several_workers(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    kvg_index_worker ws[] = {
        {.id = 11, .name = "a", .capacity = 100},
        {.id = 22, .name = "b", .capacity = 100},
        {.id = 33, .name = "c", .capacity = 100},
        {.id = 44, .name = "d", .capacity = 100},
    };
    assert_int_equal(kvg_index_set_workers(idx, ws, 4), 0);
    uint64_t chain[10];
    for (int i = 0; i < 10; i++)
        chain[i] = 77 * (uint64_t)i + 5;
    assert_int_equal(kvg_index_record(idx, 11, chain, 10), 0);
    assert_int_equal(kvg_index_record(idx, 22, chain, 5), 0);
    assert_int_equal(kvg_index_record(idx, 33, chain, 1), 0);
    uint64_t other[] = {chain[0], chain[1], chain[2], 9999};
    assert_int_equal(kvg_index_record(idx, 44, other, 4), 0);

    /* unknown ids and a repeated id, interleaved */
    uint64_t ids[] = {99, 11, 22, 33, 44, 0, 22, 11};
    uint32_t m[8];
    memset(m, 0xff, sizeof(m));
    kvg_index_match(idx, chain, 10, ids, 8, m);
    uint32_t want[] = {0, 10, 5, 1, 3, 0, 5, 10};
    assert_memory_equal(m, want, sizeof(want));

    kvg_index_match(idx, other, 4, ids, 8, m);
    uint32_t want2[] = {0, 3, 3, 1, 4, 0, 3, 3};
    assert_memory_equal(m, want2, sizeof(want2));

    assert_int_equal(stats(idx).entries, 10 + 5 + 1 + 4);
    assert_int_equal(kvg_index_worker_entries(idx, 44), 4);
    assert_int_equal(kvg_index_worker_entries(idx, 99), 0);
    assert_int_equal(kvg_index_record(idx, 99, chain, 1), KVG_ENOTFOUND);
    check(idx);
    kvg_index_free(idx);
}

/* ---- LRU ------------------------------------------------------------------------------------- */

static void test_lru(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 1, 4);
    uint64_t a[] = {100, 101, 102, 103};
    uint64_t b[] = {200, 201};
    assert_int_equal(kvg_index_record(idx, 1, a, 4), 0);
    assert_int_equal(kvg_index_record(idx, 1, b, 2), 0);
    /* a's tail went first: a[3], then a[2] */
    assert_int_equal(match1(idx, 1, a, 4), 2);
    assert_int_equal(match1(idx, 1, b, 2), 2);
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.entries, 4);
    assert_int_equal(st.inserts, 6);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 4);

    /* recording a again evicts LRU entries one by one as it goes: a[1], a[0], then b's */
    assert_int_equal(kvg_index_record(idx, 1, a, 4), 0);
    assert_int_equal(match1(idx, 1, a, 4), 4);
    assert_int_equal(match1(idx, 1, b, 2), 0);
    st = stats(idx);
    assert_int_equal(st.entries, 4);
    assert_int_equal(st.inserts, 10);
    assert_int_equal(st.evictions, 6);

    /* a chain longer than the capacity keeps its head */
    uint64_t c[] = {300, 301, 302, 303, 304, 305};
    assert_int_equal(kvg_index_record(idx, 1, c, 6), 0);
    assert_int_equal(match1(idx, 1, c, 6), 4);
    assert_int_equal(match1(idx, 1, a, 4), 0);
    assert_int_equal(stats(idx).evictions, 12);
    check(idx);
    kvg_index_free(idx);
}

static void test_lru_refresh(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 1, 4);
    uint64_t a[] = {100, 101, 102, 103};
    uint64_t b[] = {200, 201};
    uint64_t c[] = {300};
    assert_int_equal(kvg_index_record(idx, 1, a, 4), 0);
    assert_int_equal(kvg_index_record(idx, 1, b, 2), 0); /* MRU b0 b1 a0 a1 */
    assert_int_equal(kvg_index_record(idx, 1, a, 1), 0); /* MRU a0 b0 b1 a1 */
    assert_int_equal(stats(idx).inserts, 6);
    /* match does not refresh: a1 stays the least recent */
    assert_int_equal(match1(idx, 1, a, 4), 2);
    assert_int_equal(kvg_index_record(idx, 1, c, 1), 0); /* evicts a1 */
    assert_int_equal(match1(idx, 1, a, 4), 1);
    assert_int_equal(match1(idx, 1, b, 2), 2);
    assert_int_equal(match1(idx, 1, c, 1), 1);
    assert_int_equal(stats(idx).evictions, 3);
    check(idx);
    kvg_index_free(idx);
}

/* ---- worker changes -------------------------------------------------------------------------- */

/* Turnover: entries added to a worker lately over its capacity, every entry added anywhere
 * ageing the count by exp(-1 / total capacity); the same across rebases (every 32 horizons) and
 * across set_workers. */
static void record_fresh(kvg_prefix_index *idx, uint64_t id, uint64_t *next, size_t n)
{
    uint64_t keys[200];
    while (n) {
        size_t k = n < 200 ? n : 200;
        for (size_t i = 0; i < k; i++)
            keys[i] = (*next)++;
        assert_int_equal(kvg_index_record(idx, id, keys, k), 0);
        n -= k;
    }
}

static void assert_turnover(kvg_prefix_index *idx, double want_a, double want_b)
{
    uint64_t ids[3] = {1, 2, 99};
    float out[3];
    kvg_index_turnover(idx, ids, 3, out);
    assert_true(fabs(out[0] - want_a) <= 1e-4 * (want_a + 1e-3));
    assert_true(fabs(out[1] - want_b) <= 1e-4 * (want_b + 1e-3));
    assert_true(out[2] == 0); /* unknown worker */
}

static void test_turnover(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    kvg_index_worker ws[] = {
        {.id = 1, .name = "a", .capacity = 100},
        {.id = 2, .name = "b", .capacity = 100},
    };
    assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0); /* horizon 200 */
    uint64_t next = 1000;
    assert_turnover(idx, 0, 0);
    record_fresh(idx, 1, &next, 50);
    assert_turnover(idx, 0.5, 0);
    /* 200 more on b: a ages by e^-1; b evicts as it goes, but counts every entry added */
    record_fresh(idx, 2, &next, 200);
    double a = 0.5 * exp(-1.0), b = 2.0;
    assert_turnover(idx, a, b);
    /* keys already held add nothing (a record's first keys end most recent: these are held) */
    uint64_t held[3] = {next - 200, next - 199, next - 198};
    assert_int_equal(kvg_index_record(idx, 2, held, 3), 0);
    assert_turnover(idx, a, b);
    /* past several rebases (32 horizons = 6400 entries), 100 at a time on b */
    for (int r = 0; r < 80; r++) {
        record_fresh(idx, 2, &next, 100);
        a *= exp(-0.5);
        b = b * exp(-0.5) + 1.0;
    }
    assert_turnover(idx, a, b);
    /* a new set of workers (horizon 300) keeps the counts and ages them from then on */
    kvg_index_worker ws2[] = {
        {.id = 1, .name = "a", .capacity = 100},
        {.id = 2, .name = "b", .capacity = 100},
        {.id = 3, .name = "c", .capacity = 100},
    };
    assert_int_equal(kvg_index_set_workers(idx, ws2, 3), 0);
    assert_turnover(idx, a, b);
    record_fresh(idx, 3, &next, 300);
    assert_turnover(idx, a * exp(-1.0), b * exp(-1.0));
    check(idx);
    kvg_index_free(idx);
}

static void test_set_workers(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 50);
    kvg_index_worker ws[] = {
        {.id = 1, .name = "a", .capacity = 10},
        {.id = 2, .name = "b", .capacity = 0},
        {.id = 3, .name = "c", .capacity = 10},
    };
    assert_int_equal(kvg_index_set_workers(idx, ws, 3), 0);
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.capacity, 70);
    assert_int_equal(st.workers, 3);
    uint64_t chain[8];
    for (int i = 0; i < 8; i++)
        chain[i] = (uint64_t)i * 3 + 1;
    for (uint64_t id = 1; id <= 3; id++)
        assert_int_equal(kvg_index_record(idx, id, chain, 8), 0);
    assert_int_equal(stats(idx).entries, 24);

    /* drop b, lower a to 3, keep c, add d; the names change order */
    kvg_index_worker ws2[] = {
        {.id = 4, .name = "d", .capacity = 5},
        {.id = 3, .name = "c", .capacity = 10},
        {.id = 1, .name = "a", .capacity = 3},
    };
    assert_int_equal(kvg_index_set_workers(idx, ws2, 3), 0);
    st = stats(idx);
    assert_int_equal(st.entries, 3 + 8);
    assert_int_equal(st.evictions, 5);
    assert_int_equal(st.capacity, 18);
    assert_int_equal(st.workers, 3);
    assert_int_equal(kvg_index_worker_entries(idx, 2), 0);
    assert_int_equal(kvg_index_record(idx, 2, chain, 1), KVG_ENOTFOUND);
    uint64_t ids[] = {1, 2, 3, 4};
    uint32_t m[4];
    kvg_index_match(idx, chain, 8, ids, 4, m);
    uint32_t want[] = {3, 0, 8, 0};
    assert_memory_equal(m, want, sizeof(want));
    check(idx);

    /* b comes back under the same id: it starts empty */
    kvg_index_worker ws3[] = {ws2[0], ws2[1], ws2[2], ws[1]};
    assert_int_equal(kvg_index_set_workers(idx, ws3, 4), 0);
    assert_int_equal(kvg_index_worker_entries(idx, 2), 0);
    assert_int_equal(match1(idx, 2, chain, 8), 0);
    assert_int_equal(kvg_index_record(idx, 4, chain, 8), 0);
    assert_int_equal(kvg_index_worker_entries(idx, 4), 5);
    check(idx);

    /* duplicate ids are refused and change nothing */
    kvg_index_worker dup[] = {ws[0], ws[0]};
    assert_int_equal(kvg_index_set_workers(idx, dup, 2), -EINVAL);
    assert_int_equal(stats(idx).workers, 4);
    assert_int_equal(match1(idx, 3, chain, 8), 8);
    assert_int_equal(kvg_index_set_workers(idx, NULL, 1), -EINVAL);

    /* raising a capacity keeps the entries; an empty list drops everything */
    kvg_index_worker up = {.id = 1, .name = "a", .capacity = 1000};
    assert_int_equal(kvg_index_set_workers(idx, &up, 1), 0);
    assert_int_equal(match1(idx, 1, chain, 8), 3);
    assert_int_equal(stats(idx).entries, 3);
    assert_int_equal(kvg_index_set_workers(idx, NULL, 0), 0);
    st = stats(idx);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.workers, 0);
    assert_int_equal(st.capacity, 0);
    check(idx);

    /* the freed nodes are reused */
    set1(idx, 9, 100);
    assert_int_equal(kvg_index_record(idx, 9, chain, 8), 0);
    assert_int_equal(match1(idx, 9, chain, 8), 8);
    check(idx);
    kvg_index_free(idx);
}

static void test_max_entries(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(6, 0);
    kvg_index_worker ws[] = {
        {.id = 1, .name = "a", .capacity = 100},
        {.id = 2, .name = "b", .capacity = 100},
        {.id = 3, .name = "c", .capacity = 100},
    };
    assert_int_equal(kvg_index_set_workers(idx, ws, 3), 0);
    assert_int_equal(stats(idx).capacity, 6);
    uint64_t a[] = {10, 11, 12, 13};
    uint64_t b[] = {20, 21, 22, 23};
    assert_int_equal(kvg_index_record(idx, 1, a, 4), 0);
    /* b23 and b22 fit; b21 and b0 take b's own oldest entries */
    assert_int_equal(kvg_index_record(idx, 2, b, 4), 0);
    assert_int_equal(match1(idx, 1, a, 4), 4);
    assert_int_equal(match1(idx, 2, b, 4), 2);
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.entries, 6);
    assert_int_equal(st.inserts, 8);
    assert_int_equal(st.evictions, 2);
    /* c holds nothing it could give up: nothing is recorded */
    assert_int_equal(kvg_index_record(idx, 3, a, 4), 0);
    assert_int_equal(kvg_index_worker_entries(idx, 3), 0);
    assert_int_equal(match1(idx, 3, a, 4), 0);
    assert_int_equal(stats(idx).inserts, 8);
    check(idx);
    kvg_index_free(idx);
}

static void test_zero_and_repeated_keys(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 0, 100); /* id 0 is an id like any other */
    uint64_t zeros[] = {0, 0, 0};
    assert_int_equal(kvg_index_record(idx, 0, zeros, 3), 0);
    assert_int_equal(kvg_index_worker_entries(idx, 0), 1);
    assert_int_equal(match1(idx, 0, zeros, 3), 3);
    uint64_t rep[] = {5, 7, 5, 9};
    assert_int_equal(kvg_index_record(idx, 0, rep, 4), 0);
    assert_int_equal(kvg_index_worker_entries(idx, 0), 4);
    assert_int_equal(match1(idx, 0, rep, 4), 4);
    uint64_t zero_then[] = {0, 5, 0, 8};
    assert_int_equal(match1(idx, 0, zero_then, 4), 3);
    check(idx);
    kvg_index_free(idx);

    /* with a capacity of 2: touch 3, 1, 2 (evicts 3), 1 again */
    idx = new_index(0, 0);
    set1(idx, 1, 2);
    uint64_t c[] = {1, 2, 1, 3};
    assert_int_equal(kvg_index_record(idx, 1, c, 4), 0);
    assert_int_equal(match1(idx, 1, c, 4), 3);
    assert_int_equal(stats(idx).evictions, 1);
    assert_int_equal(stats(idx).inserts, 3);
    check(idx);
    kvg_index_free(idx);
}

/* Pool and bucket growth: far beyond the initial 1024 nodes, over several workers. */
static void test_growth(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    enum { NW = 5, LEN = 3000 };
    kvg_index_worker ws[NW];
    for (int i = 0; i < NW; i++)
        ws[i] = (kvg_index_worker){.id = (uint64_t)i + 100, .name = "w", .capacity = 2500};
    assert_int_equal(kvg_index_set_workers(idx, ws, NW), 0);
    uint64_t *chain = malloc(sizeof(*chain) * LEN);
    assert_non_null(chain);
    for (int i = 0; i < LEN; i++)
        chain[i] = (uint64_t)i; /* small sequential keys: the hash must still spread them */
    for (int w = 0; w < NW; w++)
        assert_int_equal(kvg_index_record(idx, ws[w].id, chain, (size_t)(w + 1) * 600), 0);
    check(idx);
    uint64_t ids[NW];
    uint32_t m[NW];
    for (int i = 0; i < NW; i++)
        ids[i] = ws[i].id;
    kvg_index_match(idx, chain, LEN, ids, NW, m);
    for (int w = 0; w < NW; w++)
        assert_int_equal(m[w], KVG_MIN((w + 1) * 600, 2500));
    assert_int_equal(stats(idx).entries, 600 + 1200 + 1800 + 2400 + 2500);
    assert_int_equal(stats(idx).evictions, 500);
    free(chain);
    kvg_index_free(idx);
}

static uint32_t held(int i)
{
    return i % 50 == 0 ? (uint32_t)(i % 41) : 0;
}

/* More requested workers than fit on the stack, and more than one heap batch. */
static void test_many_workers(void **state)
{
    (void)state;
    enum { NW = 5000 };
    kvg_prefix_index *idx = new_index(0, 0);
    kvg_index_worker *ws = calloc(NW, sizeof(*ws));
    uint64_t *ids = calloc(NW + 3, sizeof(*ids));
    uint32_t *m = calloc(NW + 3, sizeof(*m));
    assert_non_null(ws);
    assert_non_null(ids);
    assert_non_null(m);
    for (int i = 0; i < NW; i++) {
        ws[i] = (kvg_index_worker){.id = 1000000 + (uint64_t)i * 7, .name = "w", .capacity = 64};
        ids[i] = ws[i].id;
    }
    ids[NW] = 5;             /* unknown */
    ids[NW + 1] = ids[4999]; /* repeated, in another batch */
    ids[NW + 2] = ids[4950];
    assert_int_equal(kvg_index_set_workers(idx, ws, NW), 0);
    uint64_t chain[40];
    for (int i = 0; i < 40; i++)
        chain[i] = 0xabcdef00u + (uint64_t)i;
    /* every 50th worker i holds the first i % 41 keys (every worker holding the same keys
     * would make each chain 5000 nodes long and recording slow: see index.c) */
    for (int i = 0; i < NW; i += 50)
        assert_int_equal(kvg_index_record(idx, ws[i].id, chain, (size_t)(i % 41)), 0);
    check(idx);
    for (int pass = 0; pass < 2; pass++) {
        memset(m, 0xff, sizeof(*m) * (NW + 3));
        if (pass == 1)
            fail_alloc_nth(0); /* no heap scratch: stack batches give the same answer */
        kvg_index_match(idx, chain, 40, ids, NW + 3, m);
        if (pass == 1)
            assert_true(fail_alloc_off());
        for (int i = 0; i < NW; i++)
            assert_int_equal(m[i], held(i));
        assert_int_equal(m[NW], 0);
        assert_int_equal(m[NW + 1], held(4999));
        assert_int_equal(m[NW + 2], held(4950));
    }
    /* 100 of them: one heap batch */
    kvg_index_match(idx, chain, 40, ids + 100, 100, m);
    for (int i = 0; i < 100; i++)
        assert_int_equal(m[i], held(i + 100));
    free(ws);
    free(ids);
    free(m);
    kvg_index_free(idx);
}

/* ---- metrics --------------------------------------------------------------------------------- */

static void test_metrics(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(100, 10);
    kvg_index_worker ws[] = {
        {.id = 1, .name = "w1", .capacity = 4},
        {.id = 2, .name = "a\"b\\c\nd", .capacity = 0},
    };
    assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0);
    uint64_t keys[] = {1, 2, 3, 4, 5};
    assert_int_equal(kvg_index_record(idx, 1, keys, 5), 0);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_index_write_metrics(idx, &b);
    assert_false(b.failed);
    const char *want[] = {
        "# TYPE kvgate_index_entries gauge\nkvgate_index_entries 4\n",
        "# TYPE kvgate_index_capacity_entries gauge\nkvgate_index_capacity_entries 14\n",
        "# TYPE kvgate_index_evictions_total counter\nkvgate_index_evictions_total 1\n",
        "# TYPE kvgate_index_inserts_total counter\nkvgate_index_inserts_total 5\n",
        "# TYPE kvgate_index_worker_entries gauge\n"
        "kvgate_index_worker_entries{worker=\"w1\"} 4\n"
        "kvgate_index_worker_entries{worker=\"a\\\"b\\\\c\\nd\"} 0\n",
        "# HELP kvgate_index_entries ",
        "# HELP kvgate_index_worker_entries ",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(want); i++)
        if (!strstr(b.data, want[i]))
            fail_msg("missing %s in:\n%s", want[i], b.data);
    /* every line is a comment or a kvgate_index_ sample */
    for (const char *line = b.data; *line;) {
        const char *end = strchr(line, '\n');
        assert_non_null(end);
        assert_true(strncmp(line, "# HELP kvgate_index_", 20) == 0 ||
                    strncmp(line, "# TYPE kvgate_index_", 20) == 0 ||
                    strncmp(line, "kvgate_index_", 13) == 0);
        line = end + 1;
    }
    kvg_buf_done(&b);

    kvg_buf_init(&b);
    fail_alloc_nth(0);
    kvg_index_write_metrics(idx, &b);
    assert_true(fail_alloc_off());
    assert_true(b.failed);
    kvg_buf_done(&b);
    kvg_index_free(idx);
}

/* ---- allocation failures --------------------------------------------------------------------- */

static void test_alloc_failures(void **state)
{
    (void)state;
    /* the constructor */
    for (long n = 0;; n++) {
        kvg_prefix_index *idx = NULL;
        fail_alloc_nth(n);
        int rc = kvg_index_new(NULL, &idx);
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_index_free(idx);
            assert_true(n > 0);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        assert_null(idx);
    }

    /* set_workers: all or nothing */
    uint64_t chain[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvg_index_worker ws[] = {
        {.id = 1, .name = "a", .capacity = 100},
        {.id = 2, .name = "b", .capacity = 100},
    };
    kvg_index_worker ws2[] = {
        {.id = 2, .name = "b", .capacity = 3},
        {.id = 3, .name = "c", .capacity = 100},
        {.id = 4, .name = "d", .capacity = 100},
    };
    for (long n = 0;; n++) {
        kvg_prefix_index *idx = new_index(0, 0);
        assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0);
        assert_int_equal(kvg_index_record(idx, 1, chain, 8), 0);
        assert_int_equal(kvg_index_record(idx, 2, chain, 8), 0);
        fail_alloc_nth(n);
        int rc = kvg_index_set_workers(idx, ws2, 3);
        bool injected = fail_alloc_off();
        check(idx);
        if (injected) {
            assert_int_equal(rc, -ENOMEM);
            assert_int_equal(match1(idx, 1, chain, 8), 8);
            assert_int_equal(match1(idx, 2, chain, 8), 8);
            assert_int_equal(stats(idx).workers, 2);
            assert_int_equal(stats(idx).entries, 16);
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(match1(idx, 1, chain, 8), 0);
            assert_int_equal(match1(idx, 2, chain, 8), 3);
            assert_int_equal(stats(idx).workers, 3);
        }
        kvg_index_free(idx);
        if (!injected) {
            assert_true(n > 0);
            break;
        }
    }

    /* record: the pool cannot grow past its first 1024 nodes */
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 1, 5000);
    enum { LEN = 2000 };
    uint64_t *big = malloc(sizeof(*big) * LEN);
    assert_non_null(big);
    for (int i = 0; i < LEN; i++)
        big[i] = 0x5000 + (uint64_t)i;
    fail_alloc_nth(0);
    assert_int_equal(kvg_index_record(idx, 1, big, LEN), -ENOMEM);
    assert_true(fail_alloc_off());
    check(idx);
    /* the keys from the tail were recorded, up to the pool's size */
    assert_int_equal(stats(idx).entries, 1024);
    assert_int_equal(match1(idx, 1, big, LEN), 0);
    assert_int_equal(match1(idx, 1, big + LEN - 1024, 1024), 1024);
    /* and it works again once memory is back */
    assert_int_equal(kvg_index_record(idx, 1, big, LEN), 0);
    assert_int_equal(match1(idx, 1, big, LEN), LEN);
    check(idx);
    free(big);
    kvg_index_free(idx);
}

/* ---- a reference model ----------------------------------------------------------------------- */

#define MODEL_WORKERS 8
#define MODEL_CAP 48

typedef struct model_worker {
    uint64_t id;
    bool live;
    uint32_t cap;
    size_t n;
    uint64_t keys[MODEL_CAP]; /* keys[0] most recent */
    uint8_t tiers[MODEL_CAP]; /* of keys[i]: MT_GPU, MT_CPU or both */
} model_worker;

#define MT_GPU 1u
#define MT_CPU 2u

typedef struct model {
    model_worker w[MODEL_WORKERS];
    uint64_t max_entries;
    uint32_t default_capacity;
    uint64_t total, inserts, evictions;
} model;

static model_worker *model_find(model *m, uint64_t id)
{
    for (int i = 0; i < MODEL_WORKERS; i++)
        if (m->w[i].live && m->w[i].id == id)
            return &m->w[i];
    return NULL;
}

static void model_evict(model *m, model_worker *w)
{
    w->n--;
    m->total--;
    m->evictions++;
}

/* Keys model_record found or added (those it did not give up on for want of room). */
static uint64_t model_touched;

/* Stored on a tier: a GPU store (or a record) moves a held key to the front, a CPU store only
 * adds its tier; a new key goes to the front either way. */
static int model_store(model *m, uint64_t id, const uint64_t *keys, size_t n, uint8_t tier)
{
    model_worker *w = model_find(m, id);
    if (!w)
        return KVG_ENOTFOUND;
    for (size_t i = n; i-- > 0;) {
        size_t j = 0;
        while (j < w->n && w->keys[j] != keys[i])
            j++;
        if (j < w->n) {
            uint8_t t = w->tiers[j] | tier;
            model_touched++;
            if (tier == MT_CPU) {
                w->tiers[j] = t;
                continue;
            }
            memmove(&w->keys[1], &w->keys[0], j * sizeof(uint64_t));
            memmove(&w->tiers[1], &w->tiers[0], j);
            w->keys[0] = keys[i];
            w->tiers[0] = t;
            continue;
        }
        if (w->n >= w->cap)
            model_evict(m, w);
        if (m->total >= m->max_entries) {
            if (w->n == 0)
                break;
            model_evict(m, w);
        }
        memmove(&w->keys[1], &w->keys[0], w->n * sizeof(uint64_t));
        memmove(&w->tiers[1], &w->tiers[0], w->n);
        w->keys[0] = keys[i];
        w->tiers[0] = tier;
        w->n++;
        m->total++;
        m->inserts++;
        model_touched++;
    }
    return 0;
}

static int model_record(model *m, uint64_t id, const uint64_t *keys, size_t n)
{
    return model_store(m, id, keys, n, MT_GPU);
}

static uint32_t model_match(model *m, uint64_t id, const uint64_t *keys, size_t n)
{
    model_worker *w = model_find(m, id);
    if (!w)
        return 0;
    uint32_t k = 0;
    for (; k < n; k++) {
        size_t j = 0;
        while (j < w->n && w->keys[j] != keys[k])
            j++;
        if (j == w->n)
            break;
    }
    return k;
}

/* ws lists ids from a fixed pool of MODEL_WORKERS, each at most once: model slot = pool index. */
static void model_set(model *m, const kvg_index_worker *ws, size_t n, const uint64_t *pool)
{
    for (int i = 0; i < MODEL_WORKERS; i++) {
        const kvg_index_worker *d = NULL;
        for (size_t k = 0; k < n; k++)
            if (ws[k].id == pool[i])
                d = &ws[k];
        model_worker *w = &m->w[i];
        if (!d) {
            if (w->live)
                m->total -= w->n;
            *w = (model_worker){.id = pool[i]};
            continue;
        }
        w->live = true;
        w->cap = d->capacity ? d->capacity : m->default_capacity;
        while (w->n > w->cap)
            model_evict(m, w);
    }
}

static uint64_t rnd_state;

static uint64_t rnd(void)
{
    /* splitmix64: reproducible from the seed printed on failure */
    uint64_t z = (rnd_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* A request: a real key chain (key i a hash of key i - 1 and block i), the blocks those of one of
 * a few documents, sometimes diverging into blocks from a tiny alphabet (so that diverged
 * chains meet again), sometimes all from that alphabet. */
static size_t random_chain(uint64_t *keys, size_t max)
{
    size_t n = (size_t)(rnd() % (max + 1));
    uint64_t doc = rnd() % 6;
    size_t diverge = rnd() % 3 == 0 ? (size_t)(rnd() % (max + 1)) : max;
    bool noise = rnd() % 8 == 0;
    uint64_t prev = 0x5eed;
    for (size_t i = 0; i < n; i++) {
        uint64_t block = noise ? rnd() % 2 : i < diverge ? doc * 1000 + i + 1 : 100 + rnd() % 3;
        uint64_t z = (prev ^ block) * UINT64_C(0x9E3779B97F4A7C15);
        prev = keys[i] = z ^ (z >> 29);
    }
    return n;
}

static void run_model(uint64_t seed, uint64_t max_entries, int ops)
{
    rnd_state = seed;
    const uint64_t pool[MODEL_WORKERS] = {1, 2, 3, 0, 77, UINT64_MAX, 1ull << 40, 12345};
    kvg_prefix_index *idx = new_index(max_entries, 20);
    model m = {.max_entries = max_entries ? max_entries : UINT64_C(1) << 24,
               .default_capacity = 20};
    for (int i = 0; i < MODEL_WORKERS; i++)
        m.w[i].id = pool[i];

    for (int op = 0; op < ops; op++) {
        uint64_t keys[64];
        unsigned r = (unsigned)(rnd() % 100);
        if (r < 4 || op == 0) {
            kvg_index_worker ws[MODEL_WORKERS];
            size_t n = 0;
            for (int i = 0; i < MODEL_WORKERS; i++) {
                if (rnd() % 4 == 0)
                    continue;
                uint32_t cap = rnd() % 5 == 0 ? 0 : (uint32_t)(1 + rnd() % MODEL_CAP);
                ws[n++] = (kvg_index_worker){.id = pool[i], .name = "w", .capacity = cap};
            }
            /* shuffle: the order must not matter */
            for (size_t i = n; i > 1; i--) {
                size_t j = (size_t)(rnd() % i);
                kvg_index_worker t = ws[i - 1];
                ws[i - 1] = ws[j];
                ws[j] = t;
            }
            assert_int_equal(kvg_index_set_workers(idx, ws, n), 0);
            model_set(&m, ws, n, pool);
        } else if (r < 55) {
            size_t n = random_chain(keys, 40);
            uint64_t id = rnd() % 16 == 0 ? 999 : pool[rnd() % MODEL_WORKERS];
            int want = model_record(&m, id, keys, n);
            int got = kvg_index_record(idx, id, keys, n);
            if (got != want)
                fail_msg("seed %llu op %d: record returned %d, model %d", (unsigned long long)seed,
                         op, got, want);
        } else {
            size_t n = random_chain(keys, 64);
            uint64_t ids[12];
            size_t nids = (size_t)(rnd() % 12);
            for (size_t i = 0; i < nids; i++)
                ids[i] = rnd() % 10 == 0 ? 4242 : pool[rnd() % MODEL_WORKERS];
            uint32_t got[12];
            kvg_index_match(idx, keys, n, ids, nids, got);
            for (size_t i = 0; i < nids; i++) {
                uint32_t want = model_match(&m, ids[i], keys, n);
                if (got[i] != want)
                    fail_msg("seed %llu op %d: worker %llu matched %u, model %u",
                             (unsigned long long)seed, op, (unsigned long long)ids[i], got[i],
                             want);
            }
        }
        kvg_index_stats st = stats(idx);
        if (st.entries != m.total || st.inserts != m.inserts || st.evictions != m.evictions)
            fail_msg("seed %llu op %d: stats %llu/%llu/%llu, model %llu/%llu/%llu",
                     (unsigned long long)seed, op, (unsigned long long)st.entries,
                     (unsigned long long)st.inserts, (unsigned long long)st.evictions,
                     (unsigned long long)m.total, (unsigned long long)m.inserts,
                     (unsigned long long)m.evictions);
        for (int i = 0; i < MODEL_WORKERS; i++)
            assert_int_equal(kvg_index_worker_entries(idx, pool[i]), m.w[i].live ? m.w[i].n : 0);
        if (op % 97 == 0)
            check(idx);
    }
    check(idx);
    kvg_index_free(idx);
}

static void test_model(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 4; seed++)
        run_model(seed, 0, 5000);
    /* a global limit below the sum of the capacities */
    for (uint64_t seed = 11; seed <= 14; seed++)
        run_model(seed, 60, 5000);
    run_model(21, 1, 2000);
}

/* ---- threads --------------------------------------------------------------------------------- */

#define TH_WORKERS 12
#define TH_THREADS 8
#define TH_NS 500000000ull

typedef struct th_shared {
    kvg_prefix_index *idx;
    _Atomic bool stop;
    _Atomic unsigned long ops;
} th_shared;

typedef struct th_arg {
    th_shared *sh;
    uint64_t seed;
    int failures;
} th_arg;

static uint64_t th_rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *th_main(void *p)
{
    th_arg *a = p;
    uint64_t s = a->seed;
    uint64_t ids[TH_WORKERS + 1];
    for (int i = 0; i < TH_WORKERS; i++)
        ids[i] = (uint64_t)i + 1;
    ids[TH_WORKERS] = 999;
    uint64_t keys[256];
    unsigned long n = 0;
    while (!atomic_load(&a->sh->stop)) {
        size_t nk = (size_t)(th_rnd(&s) % 256);
        uint64_t doc = th_rnd(&s) % 16;
        for (size_t i = 0; i < nk; i++)
            keys[i] = doc << 32 | (i < 200 ? i : th_rnd(&s) % 64);
        uint32_t m[TH_WORKERS + 1];
        kvg_index_match(a->sh->idx, keys, nk, ids, TH_WORKERS + 1, m);
        for (int i = 0; i <= TH_WORKERS; i++)
            if (m[i] > nk)
                a->failures++;
        if (m[TH_WORKERS] != 0)
            a->failures++;
        int rc = kvg_index_record(a->sh->idx, 1 + th_rnd(&s) % TH_WORKERS, keys, nk);
        if (rc != 0 && rc != KVG_ENOTFOUND)
            a->failures++;
        if (n % 3 == 0) {
            /* engine events beside the recording: stored, half removed, sometimes cleared */
            kvg_kv_event evs[3] = {
                {.kind = KVG_KV_BLOCK_STORED, .hashes = keys, .nhashes = (uint32_t)nk},
                {.kind = KVG_KV_BLOCK_REMOVED,
                 .hashes = keys + nk / 2,
                 .nhashes = (uint32_t)(nk - nk / 2)},
                {.kind = KVG_KV_ALL_BLOCKS_CLEARED},
            };
            kvg_kv_batch b = {.events = evs, .nevents = n % 60 == 0 ? 3 : 2};
            rc = kvg_index_apply_events(a->sh->idx, 1 + th_rnd(&s) % TH_WORKERS, &b, NULL);
            if (rc != 0 && rc != KVG_ENOTFOUND)
                a->failures++;
        }
        if (n % 128 == 0) {
            kvg_index_stats st;
            kvg_index_stats_get(a->sh->idx, &st);
            if (st.entries > st.inserts)
                a->failures++;
            kvg_buf b;
            kvg_buf_init(&b);
            kvg_index_write_metrics(a->sh->idx, &b);
            if (b.failed)
                a->failures++;
            kvg_buf_done(&b);
        }
        n++;
    }
    atomic_fetch_add(&a->sh->ops, n);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    th_shared sh = {.idx = new_index(3000, 0)};
    atomic_init(&sh.stop, false);
    atomic_init(&sh.ops, 0);
    pthread_t th[TH_THREADS];
    th_arg args[TH_THREADS];
    for (int i = 0; i < TH_THREADS; i++) {
        args[i] = (th_arg){.sh = &sh, .seed = 0x1234567ull * (uint64_t)(i + 1)};
        assert_int_equal(pthread_create(&th[i], NULL, th_main, &args[i]), 0);
    }
    uint64_t start = kvg_now_ns();
    uint64_t s = 99;
    unsigned rounds = 0;
    kvg_index_worker ws[TH_WORKERS];
    size_t nws = 0;
    while (kvg_now_ns() - start < TH_NS) {
        nws = 0;
        for (int i = 0; i < TH_WORKERS; i++) {
            if (th_rnd(&s) % 5 == 0)
                continue;
            ws[nws++] = (kvg_index_worker){
                .id = (uint64_t)i + 1, .name = "w", .capacity = (uint32_t)(1 + th_rnd(&s) % 600)};
        }
        assert_int_equal(kvg_index_set_workers(sh.idx, ws, nws), 0);
        rounds++;
        struct timespec ts = {.tv_nsec = 2000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&sh.stop, true);
    for (int i = 0; i < TH_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    assert_true(atomic_load(&sh.ops) > 0);
    assert_true(rounds > 10);

    check(sh.idx);
    kvg_index_stats st = stats(sh.idx);
    uint64_t sum = 0;
    for (size_t i = 0; i < nws; i++) {
        uint64_t e = kvg_index_worker_entries(sh.idx, ws[i].id);
        assert_true(e <= ws[i].capacity);
        sum += e;
    }
    assert_int_equal(sum, st.entries);
    assert_true(st.entries <= 3000);
    assert_int_equal(st.workers, nws);
    kvg_index_free(sh.idx);
}

/* Chains longer than one hold of the write lock (RECORD_BATCH keys): the whole chain is held
 * when it fits, its head when it does not, whatever the batch boundaries. */
static void test_long_chains(void **state)
{
    (void)state;
    enum { N = 1000 };
    static uint64_t keys[N];
    for (size_t i = 0; i < N; i++)
        keys[i] = 0xabc000 + i * 7919;
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 1, 2000);
    assert_int_equal(kvg_index_record(idx, 1, keys, N), 0);
    assert_int_equal(match1(idx, 1, keys, N), N);
    assert_int_equal(stats(idx).entries, N);
    check(idx);
    /* Capacity 600: the tail goes first, the head stays. */
    set1(idx, 2, 0);
    kvg_index_worker ws[] = {{.id = 1, .name = "w1", .capacity = 2000},
                             {.id = 2, .name = "w2", .capacity = 600}};
    assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0);
    assert_int_equal(kvg_index_record(idx, 2, keys, N), 0);
    assert_int_equal(match1(idx, 2, keys, N), 600);
    assert_int_equal(kvg_index_worker_entries(idx, 2), 600);
    check(idx);
    kvg_index_free(idx);
}

/* Many holders of one opening (a shared system prompt spread by the load bound): every worker
 * holds a prefix of one chain, to its own depth, and some hold a branch off it. The answer for
 * each requested id is exactly its depth along the request's chain, whatever the number of
 * ids (stack and heap batches), with ids repeated and unknown ones among them. */
static uint64_t chain_key(uint64_t prev, uint64_t block)
{
    uint64_t z = (prev ^ block) * UINT64_C(0x9E3779B97F4A7C15);
    return z ^ (z >> 29);
}

static void test_many_holders(void **state)
{
    (void)state;
    enum { WORKERS = 150, LEN = 300 };
    kvg_prefix_index *idx = new_index(0, 4096);
    kvg_index_worker ws[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        ws[i] = (kvg_index_worker){.id = 1000 + (uint64_t)i, .name = "w"};
    assert_int_equal(kvg_index_set_workers(idx, ws, WORKERS), 0);
    uint64_t main_chain[LEN], branch[LEN];
    uint64_t a = 7, b = 7;
    for (int i = 0; i < LEN; i++) {
        main_chain[i] = a = chain_key(a, (uint64_t)i);
        /* the branch shares the first 40 blocks, then goes its own way */
        branch[i] = b = chain_key(b, i < 40 ? (uint64_t)i : 100000 + (uint64_t)i);
    }
    uint32_t depth[WORKERS];
    uint64_t r = 99;
    for (int i = 0; i < WORKERS; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        /* a few at the same depths (the common case), the rest anywhere, some not at all */
        depth[i] = i % 3 == 0 ? 60 : i % 7 == 0 ? 0 : (uint32_t)((r >> 33) % (LEN + 1));
        if (depth[i])
            assert_int_equal(kvg_index_record(idx, ws[i].id, main_chain, depth[i]), 0);
        if (i % 5 == 0) /* a branch held too: it must not count along the main chain */
            assert_int_equal(kvg_index_record(idx, ws[i].id, branch, LEN), 0);
    }
    for (size_t n = 1; n <= WORKERS + 10; n += n < 20 ? 1 : 37) {
        uint64_t ids[WORKERS + 10];
        uint32_t got[WORKERS + 10];
        for (size_t p = 0; p < n; p++)
            ids[p] = p % 11 == 10 ? 424242 : 1000 + (p * 7) % WORKERS; /* repeats, unknowns */
        kvg_index_match(idx, main_chain, LEN, ids, n, got);
        for (size_t p = 0; p < n; p++) {
            uint32_t want = ids[p] == 424242 ? 0 : depth[ids[p] - 1000];
            /* the branch shares 40 blocks with the main chain */
            if (ids[p] != 424242 && (ids[p] - 1000) % 5 == 0 && want < 40)
                want = 40;
            if (got[p] != want)
                fail_msg("n %zu, id %llu: matched %u, want %u", n, (unsigned long long)ids[p],
                         got[p], want);
        }
    }
    check(idx);
    kvg_index_free(idx);
}

/* ---- engine events: removal, clearing, applying a decoded batch ------------------------------ */

static bool holds(kvg_prefix_index *idx, uint64_t id, uint64_t key)
{
    return match1(idx, id, &key, 1) == 1;
}
/* Whether the index has the worker's key on the GPU. */
static bool holds_gpu(kvg_prefix_index *idx, uint64_t id, uint64_t key)
{
    uint32_t any = 0, gpu = 0;
    if (!kvg_index_match_tiers(idx, &key, 1, &id, 1, &any, &gpu))
        gpu = any;
    assert_true(gpu <= any);
    return gpu == 1;
}

static void test_remove(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    kvg_index_worker ws[] = {{.id = 1, .name = "a", .capacity = 100},
                             {.id = 2, .name = "b", .capacity = 100}};
    assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0);
    uint64_t chain[6] = {11, 12, 13, 14, 15, 16};
    assert_int_equal(kvg_index_record(idx, 1, chain, 6), 0);
    assert_int_equal(kvg_index_record(idx, 2, chain, 3), 0);

    /* the tail of worker 1's chain, a key it does not hold, a key only worker 2 holds */
    uint64_t gone[] = {16, 15, 99, 14};
    uint64_t removed = 77;
    assert_int_equal(kvg_index_remove(idx, 1, gone, 4, &removed), 0);
    assert_int_equal(removed, 3);
    check(idx);
    assert_int_equal(match1(idx, 1, chain, 6), 3);
    assert_int_equal(match1(idx, 2, chain, 6), 3);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 3);
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.entries, 6);
    assert_int_equal(st.evictions, 0); /* the engine's removals are not the model's evictions */

    /* again: nothing left to remove; NULL removed is allowed */
    assert_int_equal(kvg_index_remove(idx, 1, gone, 4, &removed), 0);
    assert_int_equal(removed, 0);
    assert_int_equal(kvg_index_remove(idx, 1, gone, 4, NULL), 0);
    assert_int_equal(kvg_index_remove(idx, 1, NULL, 0, &removed), 0);
    assert_int_equal(kvg_index_remove(idx, 1, NULL, 1, &removed), -EINVAL);
    assert_int_equal(kvg_index_remove(idx, 9, chain, 1, &removed), KVG_ENOTFOUND);

    /* a hole in the middle: the key is gone for that worker only */
    uint64_t mid = 12;
    assert_int_equal(kvg_index_remove(idx, 2, &mid, 1, &removed), 0);
    assert_int_equal(removed, 1);
    assert_false(holds(idx, 2, 12));
    assert_true(holds(idx, 1, 12));
    assert_true(holds(idx, 2, 13));
    check(idx);

    /* the LRU goes on working after removals: capacity 3, the least recent goes first */
    kvg_index_worker w3 = {.id = 3, .name = "c", .capacity = 3};
    assert_int_equal(kvg_index_set_workers(idx, &w3, 1), 0);
    uint64_t a[] = {1, 2, 3};
    assert_int_equal(kvg_index_record(idx, 3, a, 3), 0);
    uint64_t two = 2;
    assert_int_equal(kvg_index_remove(idx, 3, &two, 1, &removed), 0);
    uint64_t b[] = {4, 5};
    assert_int_equal(kvg_index_record(idx, 3, b, 2), 0); /* 4 fits, 5 evicts 3 (least recent) */
    assert_true(holds(idx, 3, 1));
    assert_false(holds(idx, 3, 3));
    assert_true(holds(idx, 3, 4));
    assert_true(holds(idx, 3, 5));
    check(idx);
    kvg_index_free(idx);
}

static void test_clear_worker(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    kvg_index_worker ws[] = {{.id = 1, .name = "a", .capacity = 5000},
                             {.id = 2, .name = "b", .capacity = 5000}};
    assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0);
    static uint64_t chain[3000];
    for (size_t i = 0; i < 3000; i++)
        chain[i] = 0x77000 + i;
    assert_int_equal(kvg_index_record(idx, 1, chain, 3000), 0);
    assert_int_equal(kvg_index_record(idx, 2, chain, 2000), 0);
    assert_int_equal(kvg_index_clear_worker(idx, 1), 0);
    check(idx);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 0);
    assert_int_equal(match1(idx, 1, chain, 3000), 0);
    assert_int_equal(match1(idx, 2, chain, 3000), 2000);
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.entries, 2000);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.workers, 2);
    /* the worker stays, with its capacity: it records again, and clears again */
    assert_int_equal(kvg_index_record(idx, 1, chain, 10), 0);
    assert_int_equal(match1(idx, 1, chain, 3000), 10);
    assert_int_equal(kvg_index_clear_worker(idx, 1), 0);
    assert_int_equal(kvg_index_clear_worker(idx, 1), 0);
    assert_int_equal(kvg_index_clear_worker(idx, 3), KVG_ENOTFOUND);
    check(idx);
    /* the freed nodes are reused: recording as much again does not grow the index */
    assert_int_equal(kvg_index_record(idx, 1, chain, 3000), 0);
    check(idx);
    assert_int_equal(stats(idx).entries, 5000);
    kvg_index_free(idx);
}

static void test_apply_events(void **state)
{
    (void)state;
    kvg_prefix_index *idx = new_index(0, 0);
    kvg_index_worker ws[] = {{.id = 1, .name = "a", .capacity = 100},
                             {.id = 2, .name = "b", .capacity = 4}};
    assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0);
    uint64_t chain[] = {0xa1, 0xa2, 0xa3, 0xa4, 0xa5};
    uint64_t more[] = {0xa6, 0xa7};
    uint64_t cpu[] = {0xc1, 0xc2};
    kvg_kv_event evs[] = {
        {.kind = KVG_KV_BLOCK_STORED, .medium = KVG_KV_MEDIUM_GPU, .hashes = chain, .nhashes = 5},
        {.kind = KVG_KV_BLOCK_STORED,
         .has_parent = true,
         .parent = 0xa5,
         .hashes = more,
         .nhashes = 2},
        {.kind = KVG_KV_BLOCK_STORED, .medium = KVG_KV_MEDIUM_CPU, .hashes = cpu, .nhashes = 2},
        {.kind = KVG_KV_BLOCK_REMOVED,
         .medium = KVG_KV_MEDIUM_GPU,
         .hashes = more + 1,
         .nhashes = 1},
        {.kind = KVG_KV_BLOCK_REMOVED,
         .medium = KVG_KV_MEDIUM_OTHER,
         .hashes = chain,
         .nhashes = 5},
    };
    kvg_kv_batch b = {.events = evs, .nevents = 5};
    kvg_index_apply_stats st;
    assert_int_equal(kvg_index_apply_events(idx, 1, &b, &st), 0);
    assert_int_equal(st.stored, 9);  /* the CPU tier's two as well */
    assert_int_equal(st.removed, 1); /* the "other" tier (as CPU) held none of chain */
    assert_int_equal(st.cleared, 0);
    assert_int_equal(st.skipped, 0);
    check(idx);
    uint64_t whole[] = {0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7};
    assert_int_equal(match1(idx, 1, whole, 7), 6);
    assert_true(holds(idx, 1, 0xc1));
    assert_false(holds_gpu(idx, 1, 0xc1));
    assert_true(holds_gpu(idx, 1, 0xa1));
    assert_int_equal(kvg_index_worker_entries(idx, 1), 8);

    /* capacity 4: a stored event of 5 keeps its first 4 (recorded last to first) */
    kvg_kv_batch b1 = {.events = evs, .nevents = 1};
    assert_int_equal(kvg_index_apply_events(idx, 2, &b1, NULL), 0);
    assert_int_equal(match1(idx, 2, chain, 5), 4);
    assert_int_equal(stats(idx).evictions, 1);

    /* cleared, then stored again in the same batch: the order of the events holds */
    kvg_kv_event again[] = {
        {.kind = KVG_KV_ALL_BLOCKS_CLEARED},
        {.kind = KVG_KV_BLOCK_STORED, .hashes = chain, .nhashes = 2},
    };
    kvg_kv_batch b2 = {.events = again, .nevents = 2};
    assert_int_equal(kvg_index_apply_events(idx, 1, &b2, &st), 0);
    assert_int_equal(st.cleared, 1);
    assert_int_equal(st.stored, 2);
    assert_int_equal(match1(idx, 1, whole, 7), 2);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 2);
    assert_int_equal(stats(idx).cpu_entries, 0);
    check(idx);

    /* unknown worker; an empty batch; bad arguments */
    assert_int_equal(kvg_index_apply_events(idx, 9, &b, &st), KVG_ENOTFOUND);
    kvg_kv_batch empty = {0};
    assert_int_equal(kvg_index_apply_events(idx, 1, &empty, &st), 0);
    assert_int_equal(st.stored + st.removed + st.cleared + st.skipped, 0);
    assert_int_equal(kvg_index_apply_events(idx, 1, NULL, &st), -EINVAL);
    kvg_kv_batch bad = {.nevents = 1};
    assert_int_equal(kvg_index_apply_events(idx, 1, &bad, &st), -EINVAL);
    kvg_index_free(idx);
}

/* Events longer than one hold of the write lock: the same result as one hold. */
static void test_apply_long_events(void **state)
{
    (void)state;
    enum { N = 1500 };
    static uint64_t keys[N];
    for (size_t i = 0; i < N; i++)
        keys[i] = 0xbee000 + i * 31;
    kvg_prefix_index *idx = new_index(0, 0);
    set1(idx, 1, 1000);
    kvg_kv_event evs[] = {
        {.kind = KVG_KV_BLOCK_STORED, .hashes = keys, .nhashes = N},
        {.kind = KVG_KV_BLOCK_REMOVED, .hashes = keys + 600, .nhashes = 700},
    };
    kvg_kv_batch b = {.events = evs, .nevents = 1};
    kvg_index_apply_stats st;
    assert_int_equal(kvg_index_apply_events(idx, 1, &b, &st), 0);
    assert_int_equal(st.stored, N);
    assert_int_equal(match1(idx, 1, keys, N), 1000); /* the head, as kvg_index_record keeps */
    b.events = evs + 1;
    assert_int_equal(kvg_index_apply_events(idx, 1, &b, &st), 0);
    assert_int_equal(st.removed, 400);
    assert_int_equal(match1(idx, 1, keys, N), 600);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 600);
    check(idx);
    kvg_index_free(idx);
}

static void test_apply_alloc_failures(void **state)
{
    (void)state;
    enum { N = 3000 };
    static uint64_t keys[N];
    for (size_t i = 0; i < N; i++)
        keys[i] = 0xfa11000 + i;
    kvg_kv_event ev = {.kind = KVG_KV_BLOCK_STORED, .hashes = keys, .nhashes = N};
    kvg_kv_batch b = {.events = &ev, .nevents = 1};
    for (long n = 0;; n++) {
        kvg_prefix_index *idx = new_index(0, 0);
        set1(idx, 1, N);
        fail_alloc_nth(n);
        int rc = kvg_index_apply_events(idx, 1, &b, NULL);
        bool injected = fail_alloc_off();
        check(idx);
        if (!injected) {
            assert_int_equal(rc, 0);
            assert_int_equal(match1(idx, 1, keys, N), N);
            kvg_index_free(idx);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        /* what was recorded is the chain's tail; removing and clearing need no memory */
        assert_int_equal(match1(idx, 1, keys, N), 0);
        fail_alloc_nth(0);
        assert_int_equal(kvg_index_remove(idx, 1, keys, N, NULL), 0);
        assert_int_equal(kvg_index_clear_worker(idx, 1), 0);
        assert_false(fail_alloc_off());
        check(idx);
        kvg_index_free(idx);
    }
}

/* The reference model with engine events: random batches of stored, removed and cleared events
 * on the GPU and CPU tiers, next to kvg_index_record, compared key by key (removals leave holes, so
 * chains are compared one key at a time rather than by their matched depth). */
static void model_remove(model *m, uint64_t id, const uint64_t *keys, size_t n, uint8_t tier,
                         uint64_t *removed)
{
    model_worker *w = model_find(m, id);
    for (size_t i = 0; w && i < n; i++) {
        for (size_t j = 0; j < w->n; j++) {
            if (w->keys[j] != keys[i])
                continue;
            if (w->tiers[j] & tier)
                (*removed)++;
            w->tiers[j] &= (uint8_t)~tier;
            if (!w->tiers[j]) {
                memmove(&w->keys[j], &w->keys[j + 1], (w->n - j - 1) * sizeof(uint64_t));
                memmove(&w->tiers[j], &w->tiers[j + 1], w->n - j - 1);
                w->n--;
                m->total--;
            }
            break;
        }
    }
}

static void run_events_model(uint64_t seed, uint64_t max_entries, int ops)
{
    rnd_state = seed;
    const uint64_t pool[MODEL_WORKERS] = {1, 2, 3, 0, 77, UINT64_MAX, 1ull << 40, 12345};
    kvg_prefix_index *idx = new_index(max_entries, 20);
    model m = {.max_entries = max_entries ? max_entries : UINT64_C(1) << 24,
               .default_capacity = 20};
    kvg_index_worker ws[MODEL_WORKERS];
    for (int i = 0; i < MODEL_WORKERS; i++) {
        m.w[i].id = pool[i];
        ws[i] = (kvg_index_worker){
            .id = pool[i], .name = "w", .capacity = (uint32_t)(1 + rnd() % MODEL_CAP)};
    }
    assert_int_equal(kvg_index_set_workers(idx, ws, MODEL_WORKERS), 0);
    model_set(&m, ws, MODEL_WORKERS, pool);

    for (int op = 0; op < ops; op++) {
        uint64_t keys[8][40];
        kvg_kv_event evs[8];
        size_t nev = (size_t)(rnd() % 8);
        uint64_t id = rnd() % 16 == 0 ? 999 : pool[rnd() % MODEL_WORKERS];
        model_worker *w = model_find(&m, id);
        kvg_index_apply_stats want = {0};
        for (size_t e = 0; e < nev; e++) {
            unsigned r = (unsigned)(rnd() % 100);
            kvg_kv_event *ev = &evs[e];
            *ev = (kvg_kv_event){.hashes = keys[e]};
            ev->medium = r % 10 == 0 ? KVG_KV_MEDIUM_CPU
                         : r % 2     ? KVG_KV_MEDIUM_GPU
                                     : KVG_KV_MEDIUM_ABSENT;
            if (r < 55) {
                ev->kind = KVG_KV_BLOCK_STORED;
                ev->nhashes = (uint32_t)random_chain(keys[e], 40);
            } else if (r < 95) {
                ev->kind = KVG_KV_BLOCK_REMOVED;
                /* keys the worker holds, most of the time, and some it does not */
                ev->nhashes = (uint32_t)(rnd() % 12);
                for (uint32_t i = 0; i < ev->nhashes; i++)
                    keys[e][i] = w && w->n && rnd() % 4 ? w->keys[rnd() % w->n] : rnd() % 50;
            } else {
                ev->kind = KVG_KV_ALL_BLOCKS_CLEARED;
            }
            if (!w)
                continue;
            uint8_t tier = ev->medium == KVG_KV_MEDIUM_CPU ? MT_CPU : MT_GPU;
            if (ev->kind == KVG_KV_BLOCK_STORED) {
                model_touched = 0;
                model_store(&m, id, ev->hashes, ev->nhashes, tier);
                want.stored += model_touched;
            } else if (ev->kind == KVG_KV_BLOCK_REMOVED) {
                model_remove(&m, id, ev->hashes, ev->nhashes, tier, &want.removed);
            } else {
                m.total -= w->n;
                w->n = 0;
                want.cleared++;
            }
        }
        kvg_kv_batch b = {.events = evs, .nevents = nev};
        kvg_index_apply_stats got;
        int rc = kvg_index_apply_events(idx, id, &b, &got);
        if (rc != (w ? 0 : KVG_ENOTFOUND))
            fail_msg("seed %llu op %d: apply returned %d", (unsigned long long)seed, op, rc);
        if (w && (got.stored != want.stored || got.removed != want.removed ||
                  got.cleared != want.cleared || got.skipped != want.skipped))
            fail_msg(
                "seed %llu op %d: apply counted %llu/%llu/%llu/%llu, model %llu/%llu/%llu/%llu",
                (unsigned long long)seed, op, (unsigned long long)got.stored,
                (unsigned long long)got.removed, (unsigned long long)got.cleared,
                (unsigned long long)got.skipped, (unsigned long long)want.stored,
                (unsigned long long)want.removed, (unsigned long long)want.cleared,
                (unsigned long long)want.skipped);
        kvg_index_stats st = stats(idx);
        if (st.entries != m.total || st.inserts != m.inserts || st.evictions != m.evictions)
            fail_msg("seed %llu op %d: stats %llu/%llu/%llu, model %llu/%llu/%llu",
                     (unsigned long long)seed, op, (unsigned long long)st.entries,
                     (unsigned long long)st.inserts, (unsigned long long)st.evictions,
                     (unsigned long long)m.total, (unsigned long long)m.inserts,
                     (unsigned long long)m.evictions);
        /* every key of the worker, and the keys of this batch, one at a time */
        if (w) {
            for (size_t j = 0; j < w->n; j++) {
                if (!holds(idx, id, w->keys[j]))
                    fail_msg("seed %llu op %d: key lost", (unsigned long long)seed, op);
                if (holds_gpu(idx, id, w->keys[j]) != ((w->tiers[j] & MT_GPU) != 0))
                    fail_msg("seed %llu op %d: GPU tier wrong", (unsigned long long)seed, op);
            }
            for (size_t e = 0; e < nev; e++)
                for (uint32_t i = 0; i < evs[e].nhashes; i++)
                    assert_int_equal(holds(idx, id, evs[e].hashes[i]),
                                     model_match(&m, id, &evs[e].hashes[i], 1));
        }
        for (int i = 0; i < MODEL_WORKERS; i++)
            assert_int_equal(kvg_index_worker_entries(idx, pool[i]), m.w[i].n);
        if (op % 97 == 0)
            check(idx);
    }
    check(idx);
    kvg_index_free(idx);
}

static void test_events_model(void **state)
{
    (void)state;
    for (uint64_t seed = 31; seed <= 34; seed++)
        run_events_model(seed, 0, 3000);
    for (uint64_t seed = 41; seed <= 43; seed++)
        run_events_model(seed, 60, 3000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_long_chains),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_one_chain),
        cmocka_unit_test(test_gap),
        cmocka_unit_test(test_many_holders),
        cmocka_unit_test(test_several_workers),
        cmocka_unit_test(test_lru),
        cmocka_unit_test(test_lru_refresh),
        cmocka_unit_test(test_turnover),
        cmocka_unit_test(test_set_workers),
        cmocka_unit_test(test_max_entries),
        cmocka_unit_test(test_zero_and_repeated_keys),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_many_workers),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_clear_worker),
        cmocka_unit_test(test_apply_events),
        cmocka_unit_test(test_apply_long_events),
        cmocka_unit_test(test_apply_alloc_failures),
        cmocka_unit_test(test_events_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
