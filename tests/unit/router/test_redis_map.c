/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the prefix map's scripts (router/redis_map_*.lua) and their arguments
 * (router/redis_map.c), against a redis-server of the test's own: a differential test with the
 * embedded index on random sequences, the edge cases, the key layout, the lookup reply parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "index_int.h"
#include "redis_int.h"
#include "redis_server.h"

#define PREFIX "test"

static test_redis server;
static redisContext *rc;

/* ---- calling the scripts --------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64: every seed, 0 included, gives a good stream. */
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static size_t rng_below(uint64_t *s, size_t n)
{
    return n ? (size_t)(rng_next(s) % n) : 0;
}

/* EVALSHA script with the given keys and arguments; the reply (never NULL). */
static redisReply *evalsha(const redis_script *script, size_t nkeys,
                           char (*keys)[REDIS_MAP_KEY_MAX], size_t nargs, const char *const *args,
                           const size_t *arglens)
{
    size_t argc = 3 + nkeys + nargs;
    const char **argv = calloc(argc, sizeof(*argv));
    size_t *lens = calloc(argc, sizeof(*lens));
    char numkeys[24];
    assert_non_null(argv);
    assert_non_null(lens);
    snprintf(numkeys, sizeof(numkeys), "%zu", nkeys);
    argv[0] = "EVALSHA";
    argv[1] = script->sha;
    argv[2] = numkeys;
    for (size_t i = 0; i < nkeys; i++)
        argv[3 + i] = keys[i];
    for (size_t i = 0; i < nargs; i++)
        argv[3 + nkeys + i] = args[i];
    for (size_t i = 0; i < argc; i++)
        lens[i] = i >= 3 + nkeys ? arglens[i - 3 - nkeys] : strlen(argv[i]);
    redisReply *r = redisCommandArgv(rc, (int)argc, argv, lens);
    free(argv);
    free(lens);
    if (!r)
        fail_msg("EVALSHA %s: %s", script->name, rc->errstr);
    return r;
}

static unsigned char *packed(const uint64_t *chain, size_t n)
{
    unsigned char *p = malloc(8 * n + 1);
    assert_non_null(p);
    redis_map_pack_keys(chain, n, p);
    return p;
}

/* The lookup script's answer for nw workers, through redis_map_parse_lookup. */
static void map_lookup(char (*keys)[REDIS_MAP_KEY_MAX], size_t nw, const uint64_t *chain, size_t n,
                       uint32_t *matched)
{
    unsigned char *p = packed(chain, n);
    const char *args[] = {(const char *)p};
    size_t lens[] = {8 * n};
    redisReply *r = evalsha(&redis_map_lookup_script, nw, keys, 1, args, lens);
    free(p);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("lookup: %s", r->str);
    assert_int_equal(redis_map_parse_lookup(r, nw, matched), 0);
    freeReplyObject(r);
}

/* The record script: evicted count, or -1 for an error reply (its text in err when not NULL). */
static long long map_record_ex(const char *key, const char *cap, const char *ttl,
                               const uint64_t *chain, size_t n, char *err, size_t errlen)
{
    char k[1][REDIS_MAP_KEY_MAX];
    snprintf(k[0], sizeof(k[0]), "%s", key);
    unsigned char *p = packed(chain, n);
    const char *args[] = {cap, ttl, (const char *)p};
    size_t lens[] = {strlen(cap), strlen(ttl), 8 * n};
    redisReply *r = evalsha(&redis_map_record_script, 1, k, 3, args, lens);
    free(p);
    long long v = -1;
    if (r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    else if (r->type == REDIS_REPLY_ERROR && err)
        snprintf(err, errlen, "%s", r->str);
    else
        fail_msg("record: unexpected reply type %d (%s)", r->type,
                 r->type == REDIS_REPLY_ERROR ? r->str : "");
    freeReplyObject(r);
    return v;
}

static long long map_record(const char *key, uint32_t cap, uint64_t ttl_ms, const uint64_t *chain,
                            size_t n)
{
    char c[16], t[24];
    snprintf(c, sizeof(c), "%" PRIu32, cap);
    snprintf(t, sizeof(t), "%" PRIu64, ttl_ms);
    return map_record_ex(key, c, t, chain, n, NULL, 0);
}

static redisReply *cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    if (!r)
        fail_msg("%s: %s", fmt, rc->errstr);
    return r;
}

static long long cmd_int(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    if (!r)
        fail_msg("%s: %s", fmt, rc->errstr);
    if (r->type != REDIS_REPLY_INTEGER)
        fail_msg("%s: not an integer reply (%s)", fmt, r->type == REDIS_REPLY_ERROR ? r->str : "");
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

static void key_of(char *out, kvg_redis_mode mode, uint64_t root, uint64_t map_id)
{
    redis_map_key(out, PREFIX, mode, root, map_id);
}

/* ---- the embedded index beside it ------------------------------------------------------------ */

static kvg_prefix_index *new_index(void)
{
    kvg_index_config cfg = {.max_entries = UINT64_C(1) << 22};
    kvg_prefix_index *idx = NULL;
    assert_int_equal(kvg_index_new(&cfg, &idx), 0);
    return idx;
}

static uint64_t evictions(kvg_prefix_index *idx)
{
    kvg_index_stats st;
    kvg_index_stats_get(idx, &st);
    return st.evictions;
}

/* Record into the embedded index; the number it evicted. */
static long long index_record(kvg_prefix_index *idx, uint64_t id, const uint64_t *chain, size_t n)
{
    uint64_t before = evictions(idx);
    assert_int_equal(kvg_index_record(idx, id, chain, n), 0);
    return (long long)(evictions(idx) - before);
}

/* ---- group setup ----------------------------------------------------------------------------- */

static int group_setup(void **state)
{
    if (test_redis_start(&server, NULL) != 0)
        return -1;
    rc = test_redis_connect(&server);
    if (!rc)
        return -1;
    /* SCRIPT LOAD names a script by the SHA-1 of what it got: the embedded SHA must agree, or
     * every EVALSHA of the client would miss. */
    const redis_script *scripts[] = {&redis_map_lookup_script, &redis_map_record_script};
    for (size_t i = 0; i < KVG_ARRAY_LEN(scripts); i++) {
        redisReply *r = redisCommand(rc, "SCRIPT LOAD %s", scripts[i]->body);
        bool ok = r && r->type == REDIS_REPLY_STRING && strcmp(r->str, scripts[i]->sha) == 0;
        if (!ok)
            fprintf(stderr, "SCRIPT LOAD %s: %s (embedded SHA %s)\n", scripts[i]->name,
                    r ? r->str : rc->errstr, scripts[i]->sha);
        freeReplyObject(r);
        if (!ok)
            return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    if (rc)
        redisFree(rc);
    test_redis_stop(&server);
    return 0;
}

static int flush(void **state)
{
    redisReply *r = redisCommand(rc, "FLUSHALL");
    freeReplyObject(r);
    return r ? 0 : -1;
}

/* ---- the differential test ------------------------------------------------------------------- */

/* Chains drawn from random prefix trees: a new chain copies a random existing chain up to a
 * random depth (at least its root key) and continues with fresh keys, so chains share openings
 * and diverge, and a key names one path from its root, as block keys do. */
#define MAX_CHAINS 512
#define MAX_WORKERS 12
#define MAX_ROOTS 4

typedef struct sim {
    uint64_t rng;
    unsigned seed;
    size_t op;
    kvg_redis_mode mode;
    size_t nworkers, nroots, max_len;
    uint32_t cap[MAX_WORKERS];
    kvg_prefix_index *idx;
    uint64_t root_key[MAX_ROOTS];
    uint64_t *chain[MAX_CHAINS];
    size_t len[MAX_CHAINS];
    size_t root_of[MAX_CHAINS];
    size_t nchains;
} sim;

#define SIM_FAIL(s, ...)                                                                           \
    fail_msg("seed %u (%s) op %zu: %s", (s)->seed, kvg_redis_mode_str((s)->mode), (s)->op,         \
             (snprintf(sim_msg, sizeof(sim_msg), __VA_ARGS__), sim_msg))
static char sim_msg[256];

static uint64_t map_id(size_t w)
{
    return UINT64_C(0xabc0000000000000) + w;
}

/* The embedded index's worker for (worker, root): the worker itself on a single primary (one
 * LRU per worker), one per pair on a cluster (one LRU per worker and root). */
static uint64_t index_id(const sim *s, size_t w, size_t r)
{
    return s->mode == KVG_REDIS_CLUSTER ? map_id(w) * MAX_ROOTS + r : map_id(w);
}

static void sim_workers(sim *s)
{
    kvg_index_worker ws[MAX_WORKERS * MAX_ROOTS];
    size_t n = 0;
    for (size_t w = 0; w < s->nworkers; w++)
        for (size_t r = 0; r < (s->mode == KVG_REDIS_CLUSTER ? s->nroots : 1); r++)
            ws[n++] =
                (kvg_index_worker){.id = index_id(s, w, r), .name = "w", .capacity = s->cap[w]};
    assert_int_equal(kvg_index_set_workers(s->idx, ws, n), 0);
}

static size_t new_chain(sim *s)
{
    size_t c = s->nchains < MAX_CHAINS ? s->nchains++ : rng_below(&s->rng, MAX_CHAINS);
    size_t len = 1 + rng_below(&s->rng, s->max_len);
    uint64_t *keys = malloc(len * sizeof(*keys));
    assert_non_null(keys);
    size_t shared = 0, root;
    if (s->nchains > 1 && rng_below(&s->rng, 8) != 0) {
        size_t p = rng_below(&s->rng, s->nchains - 1);
        p = p >= c ? p + 1 : p;
        if (p < s->nchains && s->chain[p]) {
            shared = 1 + rng_below(&s->rng, KVG_MIN(s->len[p], len));
            memcpy(keys, s->chain[p], shared * sizeof(*keys));
            root = s->root_of[p];
        }
    }
    if (shared == 0) {
        root = rng_below(&s->rng, s->nroots);
        keys[0] = s->root_key[root];
        shared = 1;
    }
    for (size_t i = shared; i < len; i++)
        keys[i] = rng_next(&s->rng);
    free(s->chain[c]);
    s->chain[c] = keys;
    s->len[c] = len;
    s->root_of[c] = root;
    return c;
}

static void sim_record(sim *s)
{
    size_t c = rng_below(&s->rng, 3) == 0 || s->nchains == 0 ? new_chain(s)
                                                             : rng_below(&s->rng, s->nchains);
    size_t n = 1 + rng_below(&s->rng, s->len[c]);
    size_t w = rng_below(&s->rng, s->nworkers), r = s->root_of[c];
    char key[REDIS_MAP_KEY_MAX];
    key_of(key, s->mode, r, map_id(w));
    long long want = index_record(s->idx, index_id(s, w, r), s->chain[c], n);
    long long got = map_record(key, s->cap[w], 3600000, s->chain[c], n);
    if (got != want)
        SIM_FAIL(s, "record of %zu keys on worker %zu (capacity %u): %lld evicted, the index %lld",
                 n, w, s->cap[w], got, want);
}

static void sim_lookup(sim *s)
{
    size_t c = rng_below(&s->rng, s->nchains);
    size_t n = rng_below(&s->rng, s->len[c] + 1);
    size_t extra = rng_below(&s->rng, 4) == 0 ? 1 + rng_below(&s->rng, 20) : 0;
    uint64_t *keys = malloc((n + extra + 1) * sizeof(*keys));
    assert_non_null(keys);
    memcpy(keys, s->chain[c], n * sizeof(*keys));
    for (size_t i = 0; i < extra; i++) /* a continuation nobody has seen */
        keys[n + i] = rng_next(&s->rng);
    n += extra;

    /* Every worker, one twice, and one nobody knows. */
    size_t nw = s->nworkers + 2;
    char(*names)[REDIS_MAP_KEY_MAX] = malloc(nw * sizeof(*names));
    uint64_t ids[MAX_WORKERS + 2];
    uint32_t got[MAX_WORKERS + 2], want[MAX_WORKERS + 2];
    assert_non_null(names);
    for (size_t w = 0; w < nw; w++) {
        size_t wk = w < s->nworkers ? w : w == s->nworkers ? 0 : 999;
        key_of(names[w], s->mode, s->root_of[c], map_id(wk));
        ids[w] = index_id(s, wk, s->root_of[c]);
    }
    kvg_index_match(s->idx, keys, n, ids, nw, want);
    map_lookup(names, nw, keys, n, got);
    for (size_t w = 0; w < nw; w++)
        if (got[w] != want[w])
            SIM_FAIL(s, "lookup of %zu keys, worker %zu: depth %u, the index %u", n, w, got[w],
                     want[w]);
    free(names);
    free(keys);
}

/* Every entry of one worker's set is held by the index's worker, and the counts agree: the
 * same set (the order shows in the eviction counts and later lookups). */
static void sim_compare_sets(sim *s)
{
    for (size_t w = 0; w < s->nworkers; w++) {
        for (size_t r = 0; r < (s->mode == KVG_REDIS_CLUSTER ? s->nroots : 1); r++) {
            char key[REDIS_MAP_KEY_MAX];
            key_of(key, s->mode, r, map_id(w));
            uint64_t id = index_id(s, w, r);
            redisReply *rep = cmd("ZRANGE %s 0 -1", key);
            assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
            uint64_t held = kvg_index_worker_entries(s->idx, id);
            if (rep->elements != held)
                SIM_FAIL(s, "worker %zu root %zu: %zu entries, the index %" PRIu64, w, r,
                         rep->elements, held);
            for (size_t i = 0; i < rep->elements; i++) {
                uint64_t k = 0;
                assert_int_equal(rep->element[i]->len, 8);
                for (int b = 7; b >= 0; b--)
                    k = k << 8 | (unsigned char)rep->element[i]->str[b];
                uint32_t m = 0;
                kvg_index_match(s->idx, &k, 1, &id, 1, &m);
                if (m != 1)
                    SIM_FAIL(s, "worker %zu root %zu holds %016" PRIx64 ", the index does not", w,
                             r, k);
            }
            freeReplyObject(rep);
        }
    }
}

/* A worker removed and added again: the index drops its entries; its map entries go (as they
 * would by TTL, or a new map id). */
static void sim_remove(sim *s)
{
    size_t w = rng_below(&s->rng, s->nworkers);
    for (size_t r = 0; r < s->nroots; r++) {
        char key[REDIS_MAP_KEY_MAX];
        key_of(key, s->mode, r, map_id(w));
        freeReplyObject(cmd("DEL %s", key));
    }
    kvg_index_worker ws[MAX_WORKERS * MAX_ROOTS];
    size_t n = 0;
    for (size_t x = 0; x < s->nworkers; x++) {
        if (x == w)
            continue;
        for (size_t r = 0; r < (s->mode == KVG_REDIS_CLUSTER ? s->nroots : 1); r++)
            ws[n++] =
                (kvg_index_worker){.id = index_id(s, x, r), .name = "w", .capacity = s->cap[x]};
    }
    assert_int_equal(kvg_index_set_workers(s->idx, ws, n), 0);
    sim_workers(s); /* back, empty */
}

static void run_sim(unsigned seed, kvg_redis_mode mode, size_t nworkers, size_t nroots,
                    uint32_t cap_min, uint32_t cap_max, size_t max_len, size_t ops)
{
    assert_int_equal(flush(NULL), 0);
    sim *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    s->seed = seed;
    s->rng = seed;
    s->mode = mode;
    s->nworkers = nworkers;
    s->nroots = nroots;
    s->max_len = max_len;
    s->idx = new_index();
    for (size_t w = 0; w < nworkers; w++)
        s->cap[w] = cap_min + (uint32_t)rng_below(&s->rng, cap_max - cap_min + 1);
    for (size_t r = 0; r < nroots; r++)
        s->root_key[r] = rng_next(&s->rng);
    sim_workers(s);
    new_chain(s);

    for (s->op = 0; s->op < ops; s->op++) {
        size_t what = rng_below(&s->rng, 100);
        if (what < 48)
            sim_record(s);
        else if (what < 97)
            sim_lookup(s);
        else if (what < 99)
            sim_compare_sets(s);
        else
            sim_remove(s);
    }
    sim_compare_sets(s);
    assert_int_equal(kvg_index_check(s->idx), 0);

    for (size_t c = 0; c < s->nchains; c++)
        free(s->chain[c]);
    kvg_index_free(s->idx);
    free(s);
}

/* Small capacities against chains of up to 40 keys: nearly every record evicts, often keys of
 * its own chain that it then records again (the case where the count needs the replay). */
static void test_differential_small(void **state)
{
    for (unsigned seed = 1; seed <= 4; seed++)
        run_sim(seed, KVG_REDIS_STANDALONE, 5, 3, 1, 24, 40, 3000);
}

/* More workers than index.c's FEW_HOLDERS, so its lookups take the batched bisection. */
static void test_differential_many_holders(void **state)
{
    for (unsigned seed = 11; seed <= 12; seed++)
        run_sim(seed, KVG_REDIS_STANDALONE, 12, 1, 20, 120, 60, 2000);
}

/* Longer chains (past the scripts' argument chunks) and larger capacities. */
static void test_differential_long(void **state)
{
    run_sim(21, KVG_REDIS_STANDALONE, 4, 2, 100, 3000, 2500, 300);
}

/* The cluster layout: one LRU per (worker, root), each with the worker's capacity. */
static void test_differential_cluster(void **state)
{
    for (unsigned seed = 31; seed <= 33; seed++)
        run_sim(seed, KVG_REDIS_CLUSTER, 5, 4, 1, 24, 40, 3000);
}

/* ---- edge cases ------------------------------------------------------------------------------ */

static void fill(uint64_t *keys, size_t n, uint64_t base)
{
    for (size_t i = 0; i < n; i++)
        keys[i] = base + i * UINT64_C(0x100000001);
}

static uint32_t lookup1(const char *key, const uint64_t *chain, size_t n)
{
    char k[1][REDIS_MAP_KEY_MAX];
    snprintf(k[0], sizeof(k[0]), "%s", key);
    uint32_t m = 12345;
    map_lookup(k, 1, chain, n, &m);
    return m;
}

static void test_empty_chain(void **state)
{
    uint64_t keys[4];
    fill(keys, 4, 7);
    assert_int_equal(map_record(PREFIX ":m:1", 10, 1000, keys, 4), 0);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 0), 0);
    /* Recording nothing changes nothing, and does not create a set. */
    assert_int_equal(map_record(PREFIX ":m:2", 10, 1000, keys, 0), 0);
    assert_int_equal(cmd_int("EXISTS %s", PREFIX ":m:2"), 0);
    /* No workers at all: an empty array. */
    unsigned char *p = packed(keys, 4);
    const char *args[] = {(const char *)p};
    size_t lens[] = {32};
    redisReply *r = evalsha(&redis_map_lookup_script, 0, NULL, 1, args, lens);
    free(p);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 0);
    assert_int_equal(redis_map_parse_lookup(r, 0, NULL), 0);
    freeReplyObject(r);
}

static void test_longer_than_stored(void **state)
{
    uint64_t keys[300];
    fill(keys, 300, 1000);
    assert_int_equal(map_record(PREFIX ":m:1", 1000, 60000, keys, 37), 0);
    for (size_t n = 0; n <= 300; n += 1)
        assert_int_equal(lookup1(PREFIX ":m:1", keys, n), KVG_MIN(n, (size_t)37));
    /* A chain that diverges after 20 keys (every key after a changed one changes). */
    for (size_t i = 20; i < 300; i++)
        keys[i] ^= UINT64_C(1) << 63;
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 300), 20);
    for (size_t i = 0; i < 300; i++)
        keys[i] ^= UINT64_C(1) << 62;
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 300), 0);
}

static void test_unknown_and_removed_worker(void **state)
{
    uint64_t keys[50];
    fill(keys, 50, 99);
    char names[3][REDIS_MAP_KEY_MAX];
    for (size_t w = 0; w < 3; w++)
        key_of(names[w], KVG_REDIS_STANDALONE, 0, map_id(w));
    assert_int_equal(map_record(names[0], 100, 60000, keys, 50), 0);
    assert_int_equal(map_record(names[1], 100, 60000, keys, 10), 0);
    uint32_t m[3];
    map_lookup(names, 3, keys, 50, m);
    assert_int_equal(m[0], 50);
    assert_int_equal(m[1], 10);
    assert_int_equal(m[2], 0); /* never recorded */
    freeReplyObject(cmd("DEL %s", names[0]));
    map_lookup(names, 3, keys, 50, m);
    assert_int_equal(m[0], 0);
    assert_int_equal(m[1], 10);
    /* The lookup never creates anything. */
    assert_int_equal(cmd_int("EXISTS %s %s", names[0], names[2]), 0);
}

/* A chain longer than the capacity keeps its opening, as the index does. */
static void test_chain_over_capacity(void **state)
{
    uint64_t keys[100];
    fill(keys, 100, 5);
    kvg_prefix_index *idx = new_index();
    kvg_index_worker w = {.id = 1, .name = "w", .capacity = 30};
    assert_int_equal(kvg_index_set_workers(idx, &w, 1), 0);
    long long want = index_record(idx, 1, keys, 100);
    assert_int_equal(want, 70);
    assert_int_equal(map_record(PREFIX ":m:1", 30, 60000, keys, 100), want);
    assert_int_equal(cmd_int("ZCARD %s", PREFIX ":m:1"), 30);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 100), 30);
    /* Again, with a new tail: the opening stays, the tail cycles through. */
    fill(keys + 10, 90, 777);
    want = index_record(idx, 1, keys, 100);
    assert_int_equal(map_record(PREFIX ":m:1", 30, 60000, keys, 100), want);
    uint32_t m = 0;
    uint64_t id = 1;
    kvg_index_match(idx, keys, 100, &id, 1, &m);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 100), m);
    assert_int_equal(m, 30);
    kvg_index_free(idx);
}

static void test_capacity_one(void **state)
{
    uint64_t keys[10];
    fill(keys, 10, 3);
    assert_int_equal(map_record(PREFIX ":m:1", 1, 60000, keys, 10), 9);
    assert_int_equal(cmd_int("ZCARD %s", PREFIX ":m:1"), 1);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 10), 1);
    /* The same opening again: held, nothing evicted; another one: one evicted. */
    assert_int_equal(map_record(PREFIX ":m:1", 1, 60000, keys, 1), 0);
    assert_int_equal(map_record(PREFIX ":m:1", 1, 60000, keys + 5, 1), 1);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 10), 0);
    assert_int_equal(lookup1(PREFIX ":m:1", keys + 5, 3), 1);
}

/* Key lists with repeats are not chains; the scripts still do what the index does with them. */
static void test_duplicate_keys(void **state)
{
    kvg_prefix_index *idx = new_index();
    kvg_index_worker w = {.id = 1, .name = "w", .capacity = 4};
    assert_int_equal(kvg_index_set_workers(idx, &w, 1), 0);
    const uint64_t seqs[][7] = {
        {1, 2, 1, 3, 1, 4, 5}, {2, 2, 2, 2, 2, 2, 2}, {9, 8, 7, 9, 8, 7, 6},
        {1, 2, 3, 4, 4, 3, 2}, {5, 1, 5, 1, 5, 1, 5}, {6, 6, 7, 7, 8, 8, 1},
    };
    uint64_t id = 1;
    for (size_t i = 0; i < KVG_ARRAY_LEN(seqs); i++) {
        long long want = index_record(idx, 1, seqs[i], 7);
        assert_int_equal(map_record(PREFIX ":m:1", 4, 60000, seqs[i], 7), want);
        for (size_t j = 0; j < KVG_ARRAY_LEN(seqs); j++) {
            uint32_t m = 0;
            kvg_index_match(idx, seqs[j], 7, &id, 1, &m);
            assert_int_equal(lookup1(PREFIX ":m:1", seqs[j], 7), m);
        }
        /* The key listed first is the most recent, whatever else repeats. */
        redisReply *r = cmd("ZRANGE %s -1 -1", PREFIX ":m:1");
        assert_int_equal(r->elements, 1);
        uint64_t top = 0;
        for (int b = 7; b >= 0; b--)
            top = top << 8 | (unsigned char)r->element[0]->str[b];
        assert_int_equal(top, seqs[i][0]);
        freeReplyObject(r);
    }
    assert_int_equal(cmd_int("ZCARD %s", PREFIX ":m:1"), kvg_index_worker_entries(idx, 1));
    kvg_index_free(idx);
}

static void test_ttl(void **state)
{
    uint64_t keys[5];
    fill(keys, 5, 42);
    assert_int_equal(map_record(PREFIX ":m:1", 10, 50000, keys, 5), 0);
    long long pttl = cmd_int("PTTL %s", PREFIX ":m:1");
    assert_true(pttl > 40000 && pttl <= 50000);
    /* Every record sets it again; a lookup does not touch it. */
    assert_int_equal(map_record(PREFIX ":m:1", 10, 900000, keys, 2), 0);
    pttl = cmd_int("PTTL %s", PREFIX ":m:1");
    assert_true(pttl > 800000 && pttl <= 900000);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 5), 5);
    assert_true(cmd_int("PTTL %s", PREFIX ":m:1") <= 900000);
    /* TTL 0: no expiry. */
    assert_int_equal(map_record(PREFIX ":m:1", 10, 0, keys, 2), 0);
    assert_int_equal(cmd_int("PTTL %s", PREFIX ":m:1"), -1);
    /* And it does expire. */
    assert_int_equal(map_record(PREFIX ":m:1", 10, 30, keys, 2), 0);
    struct timespec ts = {.tv_nsec = 10 * 1000000L};
    for (int i = 0; i < 100 && cmd_int("EXISTS %s", PREFIX ":m:1"); i++)
        nanosleep(&ts, NULL);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 5), 0);
}

/* Scores are exact integers well past what %.14g would print: a counter near 2^50. */
static void test_scores_exact(void **state)
{
    uint64_t keys[3];
    fill(keys, 3, 11);
    unsigned char old[8];
    uint64_t other = 77;
    redis_map_pack_keys(&other, 1, old);
    freeReplyObject(cmd("ZADD %s 1125899906842624 %b", PREFIX ":m:1", old, (size_t)8));
    assert_int_equal(map_record(PREFIX ":m:1", 10, 60000, keys, 3), 0);
    redisReply *r = cmd("ZRANGE %s 0 -1 WITHSCORES", PREFIX ":m:1");
    assert_int_equal(r->elements, 8);
    assert_string_equal(r->element[1]->str, "1125899906842624");
    assert_string_equal(r->element[3]->str, "1125899906842625"); /* keys[2] */
    assert_string_equal(r->element[5]->str, "1125899906842626");
    assert_string_equal(r->element[7]->str, "1125899906842627"); /* keys[0] */
    freeReplyObject(r);
}

/* A capacity lowered since the last record: trimmed first, counted, as set_workers does. */
static void test_capacity_lowered(void **state)
{
    uint64_t keys[20];
    fill(keys, 20, 500);
    assert_int_equal(map_record(PREFIX ":m:1", 20, 60000, keys, 20), 0);
    assert_int_equal(map_record(PREFIX ":m:1", 5, 60000, keys, 3), 15);
    assert_int_equal(cmd_int("ZCARD %s", PREFIX ":m:1"), 5);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, 20), 5);
}

static void test_bad_arguments(void **state)
{
    uint64_t keys[2] = {1, 2};
    char err[256];
    assert_int_equal(map_record_ex(PREFIX ":m:1", "0", "1000", keys, 2, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "capacity"));
    assert_int_equal(map_record_ex(PREFIX ":m:1", "x", "1000", keys, 2, err, sizeof(err)), -1);
    assert_int_equal(map_record_ex(PREFIX ":m:1", "1.5", "1000", keys, 2, err, sizeof(err)), -1);
    assert_int_equal(map_record_ex(PREFIX ":m:1", "10", "-1", keys, 2, err, sizeof(err)), -1);
    assert_int_equal(cmd_int("EXISTS %s", PREFIX ":m:1"), 0);
    /* A chain that is not whole 8-byte keys. */
    char k[1][REDIS_MAP_KEY_MAX] = {PREFIX ":m:1"};
    const char *args[] = {"1234567"};
    size_t lens[] = {7};
    redisReply *r = evalsha(&redis_map_lookup_script, 1, k, 1, args, lens);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    uint32_t m;
    assert_int_equal(redis_map_parse_lookup(r, 1, &m), KVG_EPROTO);
    freeReplyObject(r);
}

/* Chains past the scripts' argument chunks and Lua's unpack limit (~8000 values). */
static void test_long_chain(void **state)
{
    size_t n = 9000;
    uint64_t *keys = malloc(n * sizeof(*keys));
    assert_non_null(keys);
    fill(keys, n, 1);
    kvg_prefix_index *idx = new_index();
    kvg_index_worker w = {.id = 1, .name = "w", .capacity = 100000};
    assert_int_equal(kvg_index_set_workers(idx, &w, 1), 0);
    assert_int_equal(map_record(PREFIX ":m:1", 100000, 60000, keys, n), 0);
    assert_int_equal(index_record(idx, 1, keys, n), 0);
    assert_int_equal(cmd_int("ZCARD %s", PREFIX ":m:1"), (long long)n);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, n), n);
    /* The capacity lowered (the index trims at once), then the chain less its first key again:
     * every key it touches is the one the previous key's insertion evicted, so all of them
     * miss (LRU thrashing), and the counts say so. */
    uint64_t before = evictions(idx);
    w.capacity = 8500;
    assert_int_equal(kvg_index_set_workers(idx, &w, 1), 0);
    long long want = (long long)(evictions(idx) - before) + index_record(idx, 1, keys + 1, n - 1);
    assert_int_equal(want, 500 + 8999);
    assert_int_equal(map_record(PREFIX ":m:1", 8500, 60000, keys + 1, n - 1), want);
    assert_int_equal(lookup1(PREFIX ":m:1", keys + 1, n - 1), 8500);
    assert_int_equal(lookup1(PREFIX ":m:1", keys, n), 0);
    kvg_index_free(idx);
    free(keys);
}

/* The scripts are what they claim: a flushed script cache answers NOSCRIPT, EVAL of the body
 * works and brings the SHA back. */
static void test_noscript(void **state)
{
    freeReplyObject(cmd("SCRIPT FLUSH"));
    uint64_t keys[2] = {1, 2};
    char k[1][REDIS_MAP_KEY_MAX] = {PREFIX ":m:1"};
    unsigned char p[16];
    redis_map_pack_keys(keys, 2, p);
    const char *args[] = {(const char *)p};
    size_t lens[] = {16};
    redisReply *r = evalsha(&redis_map_lookup_script, 1, k, 1, args, lens);
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_memory_equal(r->str, "NOSCRIPT", 8);
    freeReplyObject(r);
    const redis_script *scripts[] = {&redis_map_lookup_script, &redis_map_record_script};
    for (size_t i = 0; i < 2; i++) {
        r = cmd("EVAL %s 0", scripts[i]->body);
        freeReplyObject(r);
        r = cmd("SCRIPT EXISTS %s", scripts[i]->sha);
        assert_int_equal(r->element[0]->integer, 1);
        freeReplyObject(r);
    }
}

/* ---- key layout ------------------------------------------------------------------------------ */

static void test_key_layout(void **state)
{
    char k[REDIS_MAP_KEY_MAX];
    size_t n = redis_map_key(k, "kvg", KVG_REDIS_STANDALONE, 0x1234, 0xabcdef);
    assert_string_equal(k, "kvg:m:0000000000abcdef");
    assert_int_equal(n, strlen(k));
    n = redis_map_key(k, "kvg", KVG_REDIS_SENTINEL, 0x1234, UINT64_MAX);
    assert_string_equal(k, "kvg:m:ffffffffffffffff");
    n = redis_map_key(k, "kvg", KVG_REDIS_CLUSTER, 0x1234, 0xabcdef);
    assert_string_equal(k, "kvg:m:{0000000000001234}:0000000000abcdef");
    assert_int_equal(n, strlen(k));
    /* A prefix far too long is cut; the key stays whole and bounded. */
    char longp[400];
    memset(longp, 'p', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    n = redis_map_key(k, longp, KVG_REDIS_CLUSTER, 1, 2);
    assert_true(n < REDIS_MAP_KEY_MAX);
    assert_int_equal(n, strlen(k));
    assert_string_equal(k + n - 38, ":m:{0000000000000001}:0000000000000002");
}

/* On a cluster every key of one call (the candidates of one chain's root) is in one slot, and
 * roots spread over the slots. */
static void test_cluster_slots(void **state)
{
    uint64_t s = 5;
    static bool used[REDIS_SLOTS];
    memset(used, 0, sizeof(used));
    size_t distinct = 0;
    for (int r = 0; r < 2000; r++) {
        uint64_t root = rng_next(&s);
        char k[REDIS_MAP_KEY_MAX];
        size_t n = redis_map_key(k, "kvg", KVG_REDIS_CLUSTER, root, 0);
        uint16_t slot = redis_key_slot(k, n);
        for (int w = 1; w < 64; w++) {
            n = redis_map_key(k, "kvg", KVG_REDIS_CLUSTER, root, rng_next(&s));
            assert_int_equal(redis_key_slot(k, n), slot);
        }
        distinct += !used[slot];
        used[slot] = true;
    }
    /* 2000 roots into 16384 slots: ~1890 distinct expected; clumping would show. */
    assert_true(distinct > 1800);
    /* The same root under another prefix: the same slot (the tag is the root alone). */
    char a[REDIS_MAP_KEY_MAX], b[REDIS_MAP_KEY_MAX];
    size_t na = redis_map_key(a, "kvg", KVG_REDIS_CLUSTER, 99, 1);
    size_t nb = redis_map_key(b, "other:prefix", KVG_REDIS_CLUSTER, 99, 2);
    assert_int_equal(redis_key_slot(a, na), redis_key_slot(b, nb));
}

static void test_pack_keys(void **state)
{
    uint64_t keys[2] = {UINT64_C(0x0102030405060708), UINT64_C(0xf0e0d0c0b0a09080)};
    unsigned char out[16];
    redis_map_pack_keys(keys, 2, out);
    const unsigned char want[16] = {8,    7,    6,    5,    4,    3,    2,    1,
                                    0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0};
    assert_memory_equal(out, want, 16);
}

/* ---- the lookup reply ------------------------------------------------------------------------ */

static redisReply *reply_int(long long v)
{
    redisReply *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    r->type = REDIS_REPLY_INTEGER;
    r->integer = v;
    return r;
}

static redisReply *reply_array(size_t n)
{
    redisReply *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    r->type = REDIS_REPLY_ARRAY;
    r->elements = n;
    r->element = calloc(n ? n : 1, sizeof(*r->element));
    assert_non_null(r->element);
    return r;
}

static void test_parse_lookup(void **state)
{
    uint32_t m[3] = {7, 7, 7};
    const uint32_t untouched[3] = {7, 7, 7};
    assert_int_equal(redis_map_parse_lookup(NULL, 3, m), KVG_EPROTO);

    redisReply *a = reply_array(3);
    a->element[0] = reply_int(0);
    a->element[1] = reply_int(12);
    a->element[2] = reply_int(UINT32_MAX);
    assert_int_equal(redis_map_parse_lookup(a, 3, m), 0);
    assert_int_equal(m[0], 0);
    assert_int_equal(m[1], 12);
    assert_int_equal(m[2], UINT32_MAX);

    memcpy(m, untouched, sizeof(m));
    /* Wrong length, either way. */
    assert_int_equal(redis_map_parse_lookup(a, 2, m), KVG_EPROTO);
    assert_int_equal(redis_map_parse_lookup(a, 4, m), KVG_EPROTO);
    /* Negative, huge: nothing written. */
    a->element[1]->integer = -1;
    assert_int_equal(redis_map_parse_lookup(a, 3, m), KVG_EPROTO);
    a->element[1]->integer = (long long)UINT32_MAX + 1;
    assert_int_equal(redis_map_parse_lookup(a, 3, m), KVG_EPROTO);
    a->element[1]->integer = LLONG_MIN;
    assert_int_equal(redis_map_parse_lookup(a, 3, m), KVG_EPROTO);
    assert_memory_equal(m, untouched, sizeof(m));
    /* An element of the wrong type (a string, nil, a nested array, a missing one). */
    a->element[1]->integer = 3;
    a->element[1]->type = REDIS_REPLY_STRING;
    assert_int_equal(redis_map_parse_lookup(a, 3, m), KVG_EPROTO);
    a->element[1]->type = REDIS_REPLY_NIL;
    assert_int_equal(redis_map_parse_lookup(a, 3, m), KVG_EPROTO);
    a->element[1]->type = REDIS_REPLY_ARRAY;
    assert_int_equal(redis_map_parse_lookup(a, 3, m), KVG_EPROTO);
    a->element[1]->type = REDIS_REPLY_INTEGER;
    redisReply *saved = a->element[2];
    a->element[2] = NULL;
    assert_int_equal(redis_map_parse_lookup(a, 3, m), KVG_EPROTO);
    a->element[2] = saved;
    assert_memory_equal(m, untouched, sizeof(m));
    freeReplyObject(a);

    /* Not an array at all: an error reply, an integer, nil, a status. */
    static const int types[] = {REDIS_REPLY_ERROR, REDIS_REPLY_INTEGER, REDIS_REPLY_NIL,
                                REDIS_REPLY_STATUS, REDIS_REPLY_STRING};
    for (size_t i = 0; i < KVG_ARRAY_LEN(types); i++) {
        redisReply *r = reply_int(0);
        r->type = types[i];
        assert_int_equal(redis_map_parse_lookup(r, 0, m), KVG_EPROTO);
        freeReplyObject(r);
    }
    /* A real error reply from the server. */
    redisReply *e = cmd("EVALSHA 0000000000000000000000000000000000000000 0");
    assert_int_equal(e->type, REDIS_REPLY_ERROR);
    assert_int_equal(redis_map_parse_lookup(e, 0, m), KVG_EPROTO);
    freeReplyObject(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_layout),
        cmocka_unit_test(test_cluster_slots),
        cmocka_unit_test(test_pack_keys),
        cmocka_unit_test_setup(test_parse_lookup, flush),
        cmocka_unit_test_setup(test_empty_chain, flush),
        cmocka_unit_test_setup(test_longer_than_stored, flush),
        cmocka_unit_test_setup(test_unknown_and_removed_worker, flush),
        cmocka_unit_test_setup(test_chain_over_capacity, flush),
        cmocka_unit_test_setup(test_capacity_one, flush),
        cmocka_unit_test_setup(test_duplicate_keys, flush),
        cmocka_unit_test_setup(test_ttl, flush),
        cmocka_unit_test_setup(test_scores_exact, flush),
        cmocka_unit_test_setup(test_capacity_lowered, flush),
        cmocka_unit_test_setup(test_bad_arguments, flush),
        cmocka_unit_test_setup(test_long_chain, flush),
        cmocka_unit_test_setup(test_differential_small, flush),
        cmocka_unit_test_setup(test_differential_many_holders, flush),
        cmocka_unit_test_setup(test_differential_long, flush),
        cmocka_unit_test_setup(test_differential_cluster, flush),
        cmocka_unit_test_setup(test_noscript, flush),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
