/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for routing decisions over a snapshot (router/route.c): which workers are eligible,
 * the holder first, and a rank limit that keeps the first places of the full ranking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prom.h"
#include "router.h"
#include "../model/tiny_tokenizer.h"
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

/* Token-exact mode: a model defined with a tokenizer gets the engine's hashes as keys (exactly
 * kvg_model_keys' with the scope salt, under the model's root, in tokens); a request the mode
 * does not cover falls back to byte keys with the reason; the holder is found either way. */
static void test_decide_token_exact(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvg-route-exact-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(TINY_TOKENIZER_JSON, f);
    fclose(f);
    kvg_model_def mdef = {.name = "m", .tokenizer = path, .hash_seed = "42", .block_size = 16};
    kvg_model *model;
    char msg[256];
    assert_int_equal(kvg_model_load(&mdef, &model, msg, sizeof(msg)), 0);
    unlink(path);
    rmdir(dir);

    kvg_registry *reg = new_registry(1);
    for (int i = 0; i < 4; i++) {
        char name[16], url[32];
        snprintf(name, sizeof(name), "w%d", i);
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9100 + i);
        kvg_worker_def def = {.name = name, .url = url, .kv_blocks = 1024};
        assert_int_equal(kvg_registry_put(reg, &def, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    }
    kvg_router *rt;
    assert_int_equal(kvg_router_new(NULL, &rt), 0);
    kvg_policy_config pc;
    kvg_policy_config_init(&pc);
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_worker_set *set = kvg_registry_acquire(reg);

    char body[512];
    int n = snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"");
    for (int i = 0; i < 40; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "ab");
    n += snprintf(body + n, sizeof(body) - (size_t)n, "\"}");
    kvg_body_info info;
    kvg_body_plan plan;
    assert_int_equal(kvg_body_scan_plan(body, (size_t)n, KVG_BODY_API_COMPLETIONS, "salt", &arena,
                                        &plan, &info, NULL),
                     0);
    kvg_route_request rq = {.body = &info,
                            .salt = "salt",
                            .policy = &pc,
                            .model = model,
                            .model_input = KVG_MODEL_INPUT_COMPLETIONS,
                            .raw_body = body,
                            .raw_len = (size_t)n};
    kvg_route_decision d;
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &d), 0);
    kvg_model_keys_out k;
    assert_int_equal(kvg_model_keys(model, KVG_MODEL_INPUT_COMPLETIONS, body, (size_t)n, "salt",
                                    SIZE_MAX, &arena, &k, NULL, 0),
                     0);
    assert_int_equal(d.mode, KVG_ROUTE_MODE_TOKEN_EXACT);
    assert_string_equal(kvg_route_mode_str(d.mode), "token_exact");
    assert_int_equal(k.nkeys, 5); /* 80 tokens, 16 a block */
    assert_int_equal(d.nkeys, 5);
    assert_memory_equal(d.keys, k.keys, 5 * sizeof(uint64_t));
    assert_memory_equal(&d.first_hashes, &k.first_hashes, sizeof(k.first_hashes));
    assert_true(d.root == kvg_model_root(model));
    assert_int_equal(d.unit, KVG_HASH_TOKENS);
    assert_int_equal(d.stream_units, 80);
    assert_null(d.exact_error);
    /* Another scope's salt: other hashes (the engine would not share them either). */
    rq.salt = "other";
    kvg_route_decision o;
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &o), 0);
    assert_int_equal(o.nkeys, 5);
    assert_memory_not_equal(o.keys, d.keys, 5 * sizeof(uint64_t));
    rq.salt = "salt";
    /* Recorded, it is found. */
    kvg_worker *holder = kvg_worker_set_find(set, "w2");
    assert_int_equal(kvg_router_record(rt, NULL, holder, &d, 0), 0);
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &d), 0);
    assert_ptr_equal(d.cands[0].worker, holder);
    assert_int_equal(d.cands[0].matched, 5);
    assert_int_equal(kvg_route_predicted_tokens(&d, 5, 80), 80);
    /* The engine's block is the policy's (16 tokens): pending work counts block for block. */
    assert_true(d.block_weight == 1.0);
    assert_int_equal(kvg_route_pending_units(&d, 5), 5);
    kvg_route_decision w = {.block_weight = 4};
    assert_int_equal(kvg_route_pending_units(&w, 3), 12);
    w.block_weight = 1.0 / 16; /* 1-token pages: 17 of them are 2 priced blocks, rounded up */
    assert_int_equal(kvg_route_pending_units(&w, 17), 2);
    w.block_weight = 0; /* no decision taken */
    assert_int_equal(kvg_route_pending_units(&w, 3), 3);
    w.block_weight = 4096;
    assert_int_equal(kvg_route_pending_units(&w, 1048576), UINT32_MAX);

    /* A batch of prompts: byte mode, with the reason. */
    n = snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":[\"%0200d\",\"b\"]}", 7);
    assert_int_equal(kvg_body_scan_plan(body, (size_t)n, KVG_BODY_API_COMPLETIONS, "salt", &arena,
                                        &plan, &info, NULL),
                     0);
    rq.raw_len = (size_t)n;
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &d), 0);
    assert_int_equal(d.mode, KVG_ROUTE_MODE_EXACT_FALLBACK);
    assert_non_null(d.exact_error);
    assert_non_null(strstr(d.exact_error, "batch"));
    assert_int_equal(d.unit, KVG_HASH_BYTES);
    assert_true(d.nkeys > 0);
    kvg_router_count(rt, &d);
    kvg_buf m;
    kvg_buf_init(&m);
    kvg_router_write_metrics(rt, &m);
    assert_non_null(strstr(m.data, "kvgate_route_key_mode_total{mode=\"token_exact_fallback\"} 1"));
    assert_non_null(strstr(m.data, "kvgate_route_key_mode_total{mode=\"token_exact\"} 0"));
    kvg_buf_done(&m);

    kvg_worker_set_unref(set);
    kvg_arena_done(&arena);
    kvg_router_free(rt);
    kvg_registry_free(reg);
    kvg_model_free(model);
}

/* Decisions counted from threads on different stripes, two of them sharing one (17 % 16):
 * the metrics sum them all. */
typedef struct counter_thread {
    kvg_router *rt;
    unsigned stripe;
} counter_thread;

#define COUNTED 10000

static void *count_decisions(void *arg)
{
    counter_thread *c = arg;
    kvg_prom_stripe_set(c->stripe);
    kvg_route_decision d;
    memset(&d, 0, sizeof(d));
    d.nkeys = 3;
    d.policy = KVG_POLICY_COST;
    d.reason = KVG_POLICY_REASON_COLD;
    d.stage_ns[KVG_ROUTE_STAGE_TOTAL] = 2000; /* 2 us */
    for (int i = 0; i < COUNTED; i++)
        kvg_router_count(c->rt, &d);
    return NULL;
}

static void test_count_sums_stripes(void **state)
{
    (void)state;
    kvg_router *rt;
    assert_int_equal(kvg_router_new(NULL, &rt), 0);
    counter_thread cs[] = {{rt, 0}, {rt, 1}, {rt, 17}, {rt, 5}};
    pthread_t tids[KVG_ARRAY_LEN(cs)];
    for (size_t i = 0; i < KVG_ARRAY_LEN(cs); i++)
        assert_int_equal(pthread_create(&tids[i], NULL, count_decisions, &cs[i]), 0);
    for (size_t i = 0; i < KVG_ARRAY_LEN(cs); i++)
        assert_int_equal(pthread_join(tids[i], NULL), 0);
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_router_write_metrics(rt, &out);
    assert_false(out.failed);
    const unsigned long n = COUNTED * KVG_ARRAY_LEN(cs);
    char line[200];
    snprintf(line, sizeof(line), "kvgate_route_blocks_total{kind=\"hashed\"} %lu\n", n * 3);
    assert_non_null(strstr(out.data, line));
    snprintf(line, sizeof(line),
             "kvgate_route_decisions_total{policy=\"cost\",reason=\"cold\"} %lu\n", n);
    assert_non_null(strstr(out.data, line));
    snprintf(line, sizeof(line), "kvgate_route_decision_seconds_count{stage=\"total\"} %lu\n", n);
    assert_non_null(strstr(out.data, line));
    kvg_buf_done(&out);
    kvg_router_free(rt);
}

const struct CMUnitTest route_tests[] = {
    cmocka_unit_test(test_decide_ranked_places),
    cmocka_unit_test(test_decide_token_exact),
    cmocka_unit_test(test_count_sums_stripes),
};
const size_t route_tests_count = KVG_ARRAY_LEN(route_tests);
