/* SPDX-License-Identifier: Apache-2.0 */
/* The prefix index's sources of truth: speculative entries (their TTL, confirmation by a
 * BlockStored, the source transitions), the GPU and CPU tiers, and how both live with the LRU
 * model and a failing allocator. Time is the test's own clock (kvg_index_config.clock_ms). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fail_alloc.h"
#include "index_int.h"

#define TTL 5000u

static uint64_t now_ms;

static uint64_t test_clock(void *arg)
{
    (void)arg;
    return now_ms;
}

static kvg_prefix_index *new_index(uint64_t max_entries)
{
    kvg_index_config cfg = {
        .max_entries = max_entries, .speculative_ttl_ms = TTL, .clock_ms = test_clock};
    kvg_prefix_index *idx = NULL;
    assert_int_equal(kvg_index_new(&cfg, &idx), 0);
    return idx;
}

static void workers(kvg_prefix_index *idx, uint32_t cap1, uint32_t cap2)
{
    kvg_index_worker ws[] = {{.id = 1, .name = "a", .capacity = cap1},
                             {.id = 2, .name = "b", .capacity = cap2}};
    assert_int_equal(kvg_index_set_workers(idx, ws, 2), 0);
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

static uint32_t match1(kvg_prefix_index *idx, uint64_t id, const uint64_t *keys, size_t n)
{
    uint32_t m = 12345;
    kvg_index_match(idx, keys, n, &id, 1, &m);
    return m;
}

/* Depth on any tier and on the GPU, both through kvg_index_match_tiers. */
static void match_tiers1(kvg_prefix_index *idx, uint64_t id, const uint64_t *keys, size_t n,
                         uint32_t *any, uint32_t *gpu)
{
    *gpu = 12345;
    bool differ = kvg_index_match_tiers(idx, keys, n, &id, 1, any, gpu);
    if (!differ) {
        assert_int_equal(*gpu, 12345); /* not written */
        *gpu = *any;
    }
    assert_true(differ == (*gpu != *any));
    assert_int_equal(*any, match1(idx, id, keys, n)); /* the same answer as the plain match */
}

static void store(kvg_prefix_index *idx, uint64_t id, kvg_kv_medium medium, uint64_t *keys,
                  size_t n)
{
    kvg_kv_event ev = {.kind = KVG_KV_BLOCK_STORED, .medium = medium, .hashes = keys, .nhashes = n};
    kvg_kv_batch b = {.events = &ev, .nevents = 1};
    assert_int_equal(kvg_index_apply_events(idx, id, &b, NULL), 0);
}

static uint64_t removed(kvg_prefix_index *idx, uint64_t id, kvg_kv_medium medium, uint64_t *keys,
                        size_t n)
{
    kvg_kv_event ev = {
        .kind = KVG_KV_BLOCK_REMOVED, .medium = medium, .hashes = keys, .nhashes = n};
    kvg_kv_batch b = {.events = &ev, .nevents = 1};
    kvg_index_apply_stats st;
    assert_int_equal(kvg_index_apply_events(idx, id, &b, &st), 0);
    return st.removed;
}

/* A speculative entry counts for lookups until its TTL, then goes; a model entry stays. */
static void test_ttl(void **state)
{
    (void)state;
    now_ms = 1000;
    kvg_prefix_index *idx = new_index(0);
    workers(idx, 100, 100);
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
    uint64_t keys[] = {11, 12, 13, 14, 15};
    assert_int_equal(kvg_index_record(idx, 1, keys, 5), 0);
    assert_int_equal(kvg_index_record(idx, 2, keys, 5), 0); /* worker 2: the model */
    assert_int_equal(match1(idx, 1, keys, 5), 5);
    assert_int_equal(stats(idx).speculative, 5);
    assert_int_equal(stats(idx).spec_inserted, 5);
    check(idx);

    /* a record again within the TTL: no new deadline (nothing pushed, nothing refreshed) */
    now_ms += 1000;
    assert_int_equal(kvg_index_record(idx, 1, keys, 5), 0);
    assert_int_equal(stats(idx).spec_inserted, 5);

    now_ms = 1000 + TTL - 1;
    assert_int_equal(kvg_index_expire(idx, 0), 0);
    assert_int_equal(match1(idx, 1, keys, 5), 5);
    now_ms = 1000 + TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 5);
    assert_int_equal(match1(idx, 1, keys, 5), 0);
    assert_int_equal(match1(idx, 2, keys, 5), 5);
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.speculative, 0);
    assert_int_equal(st.spec_expired, 5);
    assert_int_equal(st.entries, 5);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 0);
    check(idx);

    /* an explicit time; nothing left to expire */
    assert_int_equal(kvg_index_expire(idx, UINT64_MAX), 0);

    /* a record sweeps passed deadlines itself (a consumer that never calls expire) */
    assert_int_equal(kvg_index_record(idx, 1, keys, 2), 0);
    now_ms += TTL;
    uint64_t other[] = {99};
    assert_int_equal(kvg_index_record(idx, 1, other, 1), 0);
    assert_int_equal(match1(idx, 1, keys, 2), 0);
    assert_int_equal(stats(idx).spec_expired, 7);
    check(idx);
    kvg_index_free(idx);
}

/* A BlockStored before the deadline confirms: the entry is then an ordinary one. Keys held
 * confirmed stay confirmed when the gateway records them. */
static void test_confirm(void **state)
{
    (void)state;
    now_ms = 1000;
    kvg_prefix_index *idx = new_index(0);
    workers(idx, 100, 100);
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
    uint64_t keys[] = {21, 22, 23, 24, 25, 26};
    assert_int_equal(kvg_index_record(idx, 1, keys, 5), 0);
    now_ms += 100;
    store(idx, 1, KVG_KV_MEDIUM_GPU, keys, 3); /* the engine computed the first three */
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.speculative, 2);
    assert_int_equal(st.spec_confirmed, 3);
    check(idx);
    now_ms += TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 2);
    assert_int_equal(match1(idx, 1, keys, 6), 3);

    /* recorded again: the confirmed three stay confirmed, the three after are speculative */
    assert_int_equal(kvg_index_record(idx, 1, keys, 6), 0);
    assert_int_equal(stats(idx).speculative, 3);
    assert_int_equal(match1(idx, 1, keys, 6), 6);
    now_ms += TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 3);
    assert_int_equal(match1(idx, 1, keys, 6), 3);

    /* a store with no medium (engines before mediums) is the GPU: it confirms too */
    assert_int_equal(kvg_index_record(idx, 1, keys, 4), 0);
    store(idx, 1, KVG_KV_MEDIUM_ABSENT, keys + 3, 1);
    now_ms += TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 0);
    assert_int_equal(match1(idx, 1, keys, 6), 4);
    check(idx);
    kvg_index_free(idx);
}

/* The source transitions: leaving events keeps the guesses (as model entries); coming back
 * gives every unconfirmed guess a fresh TTL; an older deadline of the same entry is void. */
static void test_transitions(void **state)
{
    (void)state;
    now_ms = 1000;
    kvg_prefix_index *idx = new_index(0);
    workers(idx, 100, 100);
    uint64_t keys[] = {31, 32, 33, 34, 35, 36, 37, 38};
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
    assert_int_equal(kvg_index_record(idx, 1, keys, 4), 0); /* deadline 1000 + TTL */

    now_ms = 2000;
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS_STALE), 0);
    assert_int_equal(kvg_index_get_source(idx, 1), KVG_INDEX_SOURCE_EVENTS_STALE);
    assert_int_equal(stats(idx).speculative, 0);
    check(idx);
    now_ms = 1000 + TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 0); /* the old deadline is void */
    assert_int_equal(match1(idx, 1, keys, 8), 4);
    /* stale: records are model entries */
    assert_int_equal(kvg_index_record(idx, 1, keys, 6), 0);
    assert_int_equal(stats(idx).speculative, 0);
    /* events still arrive now and then: a stored key is confirmed */
    store(idx, 1, KVG_KV_MEDIUM_GPU, keys, 2);

    /* back to events at 7000: the four unconfirmed guesses get a deadline of 12000 */
    now_ms = 7000;
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
    assert_int_equal(stats(idx).speculative, 4);
    check(idx);
    assert_int_equal(kvg_index_expire(idx, 7000 + TTL - 1), 0);
    assert_int_equal(match1(idx, 1, keys, 8), 6);
    assert_int_equal(kvg_index_expire(idx, 7000 + TTL), 4);
    assert_int_equal(match1(idx, 1, keys, 8), 2);
    check(idx);

    /* events -> stale -> events within one TTL: the first deadline does not cut the second */
    now_ms = 20000;
    assert_int_equal(kvg_index_record(idx, 1, keys, 8), 0); /* 6 new guesses, deadline 25000 */
    now_ms = 21000;
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS_STALE), 0);
    now_ms = 22000;
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0); /* 27000 */
    check(idx);
    assert_int_equal(kvg_index_expire(idx, 25000), 0);
    assert_int_equal(match1(idx, 1, keys, 8), 8);
    assert_int_equal(kvg_index_expire(idx, 27000), 6);
    assert_int_equal(match1(idx, 1, keys, 8), 2);

    /* model <-> stale changes nothing but the source; events -> model keeps the guesses */
    assert_int_equal(kvg_index_set_source(idx, 2, KVG_INDEX_SOURCE_EVENTS_STALE), 0);
    assert_int_equal(kvg_index_set_source(idx, 2, KVG_INDEX_SOURCE_MODEL), 0);
    assert_int_equal(kvg_index_record(idx, 1, keys, 8), 0);
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_MODEL), 0);
    now_ms += 10 * TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 0);
    assert_int_equal(match1(idx, 1, keys, 8), 8);

    /* errors */
    assert_int_equal(kvg_index_set_source(idx, 9, KVG_INDEX_SOURCE_EVENTS), KVG_ENOTFOUND);
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_COUNT), -EINVAL);
    check(idx);
    kvg_index_free(idx);
}

/* Tiers: a CPU store, both tiers, the removal of one, a clear; depth on the GPU and on any. */
static void test_tiers(void **state)
{
    (void)state;
    now_ms = 1000;
    kvg_prefix_index *idx = new_index(0);
    workers(idx, 100, 100);
    uint64_t keys[] = {41, 42, 43, 44, 45, 46};
    uint32_t any, gpu;
    store(idx, 1, KVG_KV_MEDIUM_GPU, keys, 4);
    store(idx, 1, KVG_KV_MEDIUM_CPU, keys, 6);
    match_tiers1(idx, 1, keys, 6, &any, &gpu);
    assert_int_equal(any, 6);
    assert_int_equal(gpu, 4);
    assert_int_equal(stats(idx).cpu_entries, 6);
    check(idx);

    /* the GPU drops two: held on the CPU still */
    assert_int_equal(removed(idx, 1, KVG_KV_MEDIUM_GPU, keys + 2, 2), 2);
    match_tiers1(idx, 1, keys, 6, &any, &gpu);
    assert_int_equal(any, 6);
    assert_int_equal(gpu, 2);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 6);
    /* the CPU drops the last two (held nowhere else: gone) and again (held: none) */
    assert_int_equal(removed(idx, 1, KVG_KV_MEDIUM_CPU, keys + 4, 2), 2);
    assert_int_equal(removed(idx, 1, KVG_KV_MEDIUM_CPU, keys + 4, 2), 0);
    assert_int_equal(kvg_index_worker_entries(idx, 1), 4);
    match_tiers1(idx, 1, keys, 6, &any, &gpu);
    assert_int_equal(any, 4);
    assert_int_equal(gpu, 2);
    /* another tier ("STORAGE") counts as the CPU */
    assert_int_equal(removed(idx, 1, KVG_KV_MEDIUM_OTHER, keys, 1), 1);
    match_tiers1(idx, 1, keys, 6, &any, &gpu);
    assert_int_equal(any, 4);
    assert_int_equal(gpu, 2);
    assert_int_equal(stats(idx).cpu_entries, 3);
    check(idx);

    /* a worker without CPU entries, and no GPU depth asked */
    store(idx, 2, KVG_KV_MEDIUM_GPU, keys, 3);
    uint64_t ids[] = {1, 2, 7};
    uint32_t m3[3], g3[3];
    assert_true(kvg_index_match_tiers(idx, keys, 6, ids, 3, m3, g3));
    assert_int_equal(m3[0], 4);
    assert_int_equal(g3[0], 2);
    assert_int_equal(m3[1], 3);
    assert_int_equal(g3[1], 3);
    assert_int_equal(m3[2], 0);
    assert_int_equal(g3[2], 0);
    assert_false(kvg_index_match_tiers(idx, keys, 6, ids, 3, m3, NULL));
    assert_int_equal(m3[0], 4);
    assert_false(kvg_index_match_tiers(idx, keys, 0, ids, 3, m3, g3));
    assert_int_equal(m3[0], 0);
    assert_false(kvg_index_match_tiers(idx, keys + 4, 2, ids + 1, 1, m3, g3)); /* 2: none */

    /* a speculative guess the engine then stores on the CPU only: confirmed there, not on the
     * GPU the gateway guessed */
    assert_int_equal(kvg_index_set_source(idx, 2, KVG_INDEX_SOURCE_EVENTS), 0);
    uint64_t more[] = {41, 42, 43, 47};
    assert_int_equal(kvg_index_record(idx, 2, more, 4), 0);
    store(idx, 2, KVG_KV_MEDIUM_CPU, more + 3, 1);
    assert_int_equal(stats(idx).speculative, 0);
    match_tiers1(idx, 2, more, 4, &any, &gpu);
    assert_int_equal(any, 4);
    assert_int_equal(gpu, 3);

    /* a clear takes every tier */
    kvg_kv_event clear = {.kind = KVG_KV_ALL_BLOCKS_CLEARED};
    kvg_kv_batch b = {.events = &clear, .nevents = 1};
    assert_int_equal(kvg_index_apply_events(idx, 1, &b, NULL), 0);
    assert_int_equal(kvg_index_apply_events(idx, 2, &b, NULL), 0);
    assert_int_equal(stats(idx).entries, 0);
    assert_int_equal(stats(idx).cpu_entries, 0);
    check(idx);
    kvg_index_free(idx);
}

/* Capacity evicts speculative entries like any (dropped, not expired), and the ring entries of
 * evicted nodes, since reused for other keys, expire nothing. */
static void test_capacity(void **state)
{
    (void)state;
    now_ms = 1000;
    kvg_prefix_index *idx = new_index(0);
    workers(idx, 4, 100);
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
    uint64_t a[] = {51, 52, 53, 54};
    uint64_t b[] = {61, 62};
    assert_int_equal(kvg_index_record(idx, 1, a, 4), 0);
    now_ms += 10;
    store(idx, 1, KVG_KV_MEDIUM_GPU, b, 2); /* evicts a's tail: 53, 54 */
    kvg_index_stats st = stats(idx);
    assert_int_equal(st.speculative, 2);
    assert_int_equal(st.spec_dropped, 2);
    assert_int_equal(st.evictions, 2);
    check(idx);
    now_ms += TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 2);
    assert_int_equal(match1(idx, 1, b, 2), 2);
    assert_int_equal(match1(idx, 1, a, 4), 0);
    check(idx);

    /* the same key guessed, evicted and guessed again within a TTL: the second deadline holds */
    uint64_t c[] = {71, 72, 73, 74};
    now_ms = 100000;
    assert_int_equal(kvg_index_record(idx, 1, a, 1), 0); /* 51, deadline 105000 */
    assert_int_equal(kvg_index_record(idx, 1, c, 4), 0); /* evicts 51 and the rest */
    now_ms = 102000;
    assert_int_equal(kvg_index_record(idx, 1, a, 1), 0); /* 51 again, deadline 107000 */
    assert_int_equal(kvg_index_expire(idx, 105000), 3);  /* c's three left, not 51 */
    assert_int_equal(match1(idx, 1, a, 1), 1);
    assert_int_equal(kvg_index_expire(idx, 107000), 1);
    assert_int_equal(match1(idx, 1, a, 1), 0);
    check(idx);

    /* max_entries: a speculative entry takes the place of the worker's own least recent one */
    kvg_prefix_index *small = new_index(3);
    workers(small, 100, 100);
    assert_int_equal(kvg_index_set_source(small, 1, KVG_INDEX_SOURCE_EVENTS), 0);
    assert_int_equal(kvg_index_record(small, 1, a, 4), 0);
    assert_int_equal(stats(small).entries, 3);
    assert_int_equal(stats(small).speculative, 3);
    check(small);
    now_ms += TTL;
    assert_int_equal(kvg_index_expire(small, 0), 3);
    check(small);
    kvg_index_free(small);

    /* a worker that leaves takes its guesses along (dropped) */
    assert_int_equal(kvg_index_record(idx, 1, c, 2), 0);
    kvg_index_worker only2 = {.id = 2, .name = "b", .capacity = 100};
    assert_int_equal(kvg_index_set_workers(idx, &only2, 1), 0);
    assert_int_equal(stats(idx).speculative, 0);
    check(idx);
    now_ms += TTL;
    assert_int_equal(kvg_index_expire(idx, 0), 0);
    check(idx);
    kvg_index_free(idx);
}

/* The ring's allocations fail: a record stops there (-ENOMEM, the index consistent); a
 * transition to events drops the guesses it cannot give a deadline to. */
static void test_alloc_failures(void **state)
{
    (void)state;
    now_ms = 1000;
    enum { N = 700 };
    uint64_t keys[N];
    for (size_t i = 0; i < N; i++)
        keys[i] = 0x5bec000 + i;
    for (long n = 0;; n++) {
        kvg_prefix_index *idx = new_index(0);
        workers(idx, N, N);
        assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
        fail_alloc_nth(n);
        int rc = kvg_index_record(idx, 1, keys, N);
        bool injected = fail_alloc_off();
        check(idx);
        kvg_index_stats st = stats(idx);
        assert_int_equal(st.speculative, st.entries); /* nothing recorded without a deadline */
        if (!injected) {
            assert_int_equal(rc, 0);
            assert_int_equal(match1(idx, 1, keys, N), N);
            kvg_index_free(idx);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        now_ms += TTL;
        assert_int_equal(kvg_index_expire(idx, 0), st.entries);
        assert_int_equal(stats(idx).entries, 0);
        check(idx);
        kvg_index_free(idx);
    }

    for (long n = 0;; n++) {
        kvg_prefix_index *idx = new_index(0);
        workers(idx, N, N);
        assert_int_equal(kvg_index_record(idx, 1, keys, N), 0); /* model entries */
        store(idx, 1, KVG_KV_MEDIUM_GPU, keys, 10);             /* 10 confirmed */
        fail_alloc_nth(n);
        assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
        bool injected = fail_alloc_off();
        check(idx);
        if (!injected) {
            assert_int_equal(stats(idx).speculative, N - 10);
            kvg_index_free(idx);
            break;
        }
        /* no deadline to give: the guesses went at once, the confirmed stay */
        assert_int_equal(stats(idx).entries, 10);
        assert_int_equal(match1(idx, 1, keys, N), 10);
        kvg_index_free(idx);
    }
}

/* The configuration's ceiling of max_entries is accepted (taken as the 28-bit link's most),
 * above it refused. */
static void test_max_entries_limit(void **state)
{
    (void)state;
    kvg_prefix_index *idx = NULL;
    kvg_index_config ok = {.max_entries = UINT64_C(1) << 30};
    assert_int_equal(kvg_index_new(&ok, &idx), 0);
    kvg_index_free(idx);
    kvg_index_config bad = {.max_entries = (UINT64_C(1) << 30) + 1};
    assert_int_equal(kvg_index_new(&bad, &idx), -EINVAL);
}

/* The metrics of speculative entries, tiers and sources. */
static void test_metrics(void **state)
{
    (void)state;
    now_ms = 1000;
    kvg_prefix_index *idx = new_index(0);
    workers(idx, 100, 100);
    assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
    uint64_t keys[] = {81, 82, 83};
    assert_int_equal(kvg_index_record(idx, 1, keys, 3), 0);
    store(idx, 1, KVG_KV_MEDIUM_GPU, keys, 1);
    store(idx, 1, KVG_KV_MEDIUM_CPU, keys, 1);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_index_write_metrics(idx, &b);
    assert_false(b.failed);
    const char *want[] = {
        "# TYPE kvgate_index_speculative_entries gauge\nkvgate_index_speculative_entries 2\n",
        "kvgate_index_speculative_total{outcome=\"inserted\"} 3\n",
        "kvgate_index_speculative_total{outcome=\"confirmed\"} 1\n",
        "kvgate_index_speculative_total{outcome=\"expired\"} 0\n",
        "kvgate_index_speculative_total{outcome=\"dropped\"} 0\n",
        "kvgate_index_cpu_entries 1\n",
        "kvgate_index_worker_source{worker=\"a\",source=\"model\"} 0\n"
        "kvgate_index_worker_source{worker=\"a\",source=\"events\"} 1\n"
        "kvgate_index_worker_source{worker=\"a\",source=\"events_stale\"} 0\n"
        "kvgate_index_worker_source{worker=\"b\",source=\"model\"} 1\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(b.data, want[i]))
            fail_msg("missing %s in:\n%s", want[i], b.data);
    kvg_buf_done(&b);
    kvg_index_free(idx);
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

/* Random records, events on both tiers, source changes, clock steps and sweeps, with every
 * invariant checked after each step: the counters, the flags and the ring must agree. At the
 * end, with both workers on events and every deadline passed, no speculative entry is left. */
static void test_random(void **state)
{
    (void)state;
    now_ms = 1000;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        rnd_state = seed;
        kvg_prefix_index *idx = new_index(seed % 2 ? 0 : 50);
        workers(idx, (uint32_t)(5 + rnd() % 40), (uint32_t)(5 + rnd() % 40));
        for (int op = 0; op < 3000; op++) {
            uint64_t id = 1 + rnd() % 2;
            uint64_t keys[12];
            size_t n = (size_t)(rnd() % 12);
            uint64_t base = rnd() % 8;
            for (size_t i = 0; i < n; i++)
                keys[i] = base * 100 + i; /* chains that share their openings */
            unsigned r = (unsigned)(rnd() % 100);
            kvg_kv_medium med = rnd() % 3 ? KVG_KV_MEDIUM_GPU : KVG_KV_MEDIUM_CPU;
            if (r < 35) {
                assert_true(kvg_index_record(idx, id, keys, n) == 0);
            } else if (r < 60) {
                store(idx, id, med, keys, n);
            } else if (r < 75) {
                removed(idx, id, med, keys, n);
            } else if (r < 80) {
                kvg_index_set_source(idx, id, (kvg_index_source)(rnd() % KVG_INDEX_SOURCE_COUNT));
            } else if (r < 95) {
                now_ms += rnd() % (TTL / 2);
                kvg_index_expire(idx, 0);
            } else if (r < 97) {
                assert_int_equal(kvg_index_clear_worker(idx, id), 0);
            } else {
                workers(idx, (uint32_t)(5 + rnd() % 40), (uint32_t)(5 + rnd() % 40));
            }
            int rc = kvg_index_check(idx);
            if (rc)
                fail_msg("seed %llu op %d: invariant %d", (unsigned long long)seed, op, rc);
        }
        /* Everything the gateway guessed goes once it is speculative and its deadline passed. */
        assert_int_equal(kvg_index_set_source(idx, 1, KVG_INDEX_SOURCE_EVENTS), 0);
        assert_int_equal(kvg_index_set_source(idx, 2, KVG_INDEX_SOURCE_EVENTS), 0);
        now_ms += TTL;
        kvg_index_expire(idx, 0);
        kvg_index_stats st = stats(idx);
        assert_int_equal(st.speculative, 0);
        check(idx);
        kvg_index_free(idx);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ttl),         cmocka_unit_test(test_confirm),
        cmocka_unit_test(test_transitions), cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_capacity),    cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_metrics),     cmocka_unit_test(test_max_entries_limit),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
