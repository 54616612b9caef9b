/* SPDX-License-Identifier: Apache-2.0 */
/* The simulated worker's KV-event encoder against the fixture packed from a real vLLM event,
 * and the cache hooks (evictions, reset) the events report. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fail_alloc.h"
#include "simworker.h"
#include "vllm_event_data.h"

/* The batch timestamp tests/integration/test_simworker_events.py wrote into the fixtures. */
#define FIXTURE_TS 1764676800.25

static vllm_event_data ev;

static char *read_all(const char *name, size_t *len)
{
    const char *json = getenv("KVG_VLLM_EVENT_JSON");
    assert_non_null(json);
    char path[4096];
    const char *slash = strrchr(json, '/');
    snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - json), json, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(1 << 16);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

static void add_base(sim_kvev_enc *e)
{
    assert_int_equal(
        sim_kvev_enc_stored(e, ev.hashes, ev.nhashes, NULL, ev.tokens, ev.ntokens, ev.block_size),
        0);
}

static void check_bytes(const char *fixture, const kvg_buf *b)
{
    size_t len;
    char *want = read_all(fixture, &len);
    assert_int_equal(b->len, len);
    assert_memory_equal(b->data, want, len);
    free(want);
}

static void base_event_matches_fixture(sim_kvev_format format, const char *fixture)
{
    assert_true(ev.lora_name_null);
    sim_kvev_enc *e;
    assert_int_equal(sim_kvev_enc_new(format, &e), 0);
    add_base(e);
    assert_int_equal(sim_kvev_enc_count(e), 1);
    kvg_buf b;
    kvg_buf_init(&b);
    assert_int_equal(sim_kvev_enc_finish(e, FIXTURE_TS, 0, &b), 0);
    assert_int_equal(sim_kvev_enc_count(e), 0);
    check_bytes(fixture, &b);
    /* The encoder is empty again: the same batch twice gives the same bytes. */
    kvg_buf_reset(&b);
    add_base(e);
    assert_int_equal(sim_kvev_enc_finish(e, FIXTURE_TS, 0, &b), 0);
    check_bytes(fixture, &b);
    kvg_buf_done(&b);
    sim_kvev_enc_free(e);
}

static void test_base_event_matches_fixture(void **state)
{
    (void)state;
    base_event_matches_fixture(SIM_KVEV_FORMAT_ARRAY, "kv_event_batch_base.msgpack");
    base_event_matches_fixture(SIM_KVEV_FORMAT_MAP, "kv_event_batch_base_map.msgpack");
}

static void mixed_batch_matches_fixture(sim_kvev_format format, const char *fixture,
                                        const char *base_fixture)
{
    sim_kvev_enc *e;
    assert_int_equal(sim_kvev_enc_new(format, &e), 0);
    add_base(e);
    assert_int_equal(sim_kvev_enc_removed(e, ev.hashes + ev.nhashes - 2, 2), 0);
    assert_int_equal(sim_kvev_enc_cleared(e), 0);
    kvg_buf b;
    kvg_buf_init(&b);
    assert_int_equal(sim_kvev_enc_finish(e, FIXTURE_TS, 0, &b), 0);
    check_bytes(fixture, &b);
    /* A different timestamp or a parent changes the bytes (the comparison can fail). */
    kvg_buf_reset(&b);
    uint64_t parent = ev.hashes[0];
    assert_int_equal(sim_kvev_enc_stored(e, ev.hashes + 1, ev.nhashes - 1, &parent, ev.tokens,
                                         ev.ntokens - ev.block_size, ev.block_size),
                     0);
    assert_int_equal(sim_kvev_enc_finish(e, FIXTURE_TS + 1, 0, &b), 0);
    size_t len;
    char *want = read_all(base_fixture, &len);
    assert_true(b.len != len || memcmp(b.data, want, len) != 0);
    free(want);
    kvg_buf_done(&b);
    sim_kvev_enc_free(e);
}

static void test_mixed_batch_matches_fixture(void **state)
{
    (void)state;
    mixed_batch_matches_fixture(SIM_KVEV_FORMAT_ARRAY, "kv_event_batch_mixed.msgpack",
                                "kv_event_batch_base.msgpack");
    mixed_batch_matches_fixture(SIM_KVEV_FORMAT_MAP, "kv_event_batch_mixed_map.msgpack",
                                "kv_event_batch_base_map.msgpack");
}

static void test_format_names(void **state)
{
    (void)state;
    sim_kvev_format f;
    assert_int_equal(sim_kvev_format_parse("map", &f), 0);
    assert_int_equal(f, SIM_KVEV_FORMAT_MAP);
    assert_int_equal(sim_kvev_format_parse("array", &f), 0);
    assert_int_equal(f, SIM_KVEV_FORMAT_ARRAY);
    assert_int_equal(sim_kvev_format_parse("Map", &f), -EINVAL);
    assert_string_equal(sim_kvev_format_str(SIM_KVEV_FORMAT_COUNT), "?");
}

static void test_encoder_out_of_memory(void **state)
{
    (void)state;
    for (long n = 0;; n++) {
        sim_kvev_enc *e = NULL;
        kvg_buf b;
        kvg_buf_init(&b);
        fail_alloc_nth(n);
        int rc = sim_kvev_enc_new(SIM_KVEV_FORMAT_ARRAY, &e);
        if (rc == 0) {
            int r1 = sim_kvev_enc_stored(e, ev.hashes, ev.nhashes, NULL, ev.tokens, ev.ntokens,
                                         ev.block_size);
            int r2 = sim_kvev_enc_finish(e, FIXTURE_TS, 0, &b);
            rc = r1 < 0 ? r1 : r2;
            assert_int_equal(sim_kvev_enc_count(e), 0);
        }
        bool injected = fail_alloc_off();
        if (rc == 0) {
            assert_false(injected);
            check_bytes("kv_event_batch_base.msgpack", &b);
        } else {
            assert_int_equal(rc, -ENOMEM);
        }
        kvg_buf_done(&b);
        sim_kvev_enc_free(e);
        if (!injected)
            break;
    }
}

typedef struct evictions {
    sim_hash h[16];
    int n;
} evictions;

static void on_evict(void *arg, const sim_hash *hash)
{
    evictions *ev_ = arg;
    assert_true(ev_->n < 16);
    ev_->h[ev_->n++] = *hash;
}

static sim_hash hash_of(uint8_t x)
{
    sim_hash h;
    memset(&h, 0, sizeof(h));
    h.b[0] = x;
    h.b[5] = (uint8_t)(x * 7);
    return h;
}

static void test_kvcache_reports_evictions_and_resets(void **state)
{
    (void)state;
    sim_kvcache *kv;
    assert_int_equal(sim_kvcache_new(4, &kv), 0);
    evictions got = {0};
    sim_kvcache_set_evict_cb(kv, on_evict, &got);
    sim_hash a[3] = {hash_of(1), hash_of(2), hash_of(3)};
    uint32_t ids[4];
    assert_int_equal(sim_kvcache_acquire(kv, a, 0, 3, ids), 0);
    sim_kvcache_commit(kv, ids, a, 0, 3);
    assert_int_equal(sim_kvcache_reset(kv), -EBUSY); /* held: nothing changes */
    assert_int_equal(sim_kvcache_num_cached(kv), 3);
    sim_kvcache_release(kv, ids, 3);
    /* Four fresh blocks: the free one first, then the LRU order (tail block first). */
    sim_hash b[4] = {hash_of(4), hash_of(5), hash_of(6), hash_of(7)};
    assert_int_equal(sim_kvcache_acquire(kv, b, 0, 4, ids), 0);
    assert_int_equal(got.n, 3);
    assert_memory_equal(&got.h[0], &a[2], sizeof(sim_hash));
    assert_memory_equal(&got.h[1], &a[1], sizeof(sim_hash));
    assert_memory_equal(&got.h[2], &a[0], sizeof(sim_hash));
    sim_kvcache_commit(kv, ids, b, 0, 4);
    sim_kvcache_release(kv, ids, 4);
    assert_int_equal(sim_kvcache_num_cached(kv), 4);
    assert_int_equal(sim_kvcache_reset(kv), 0);
    assert_int_equal(sim_kvcache_num_cached(kv), 0);
    assert_int_equal(sim_kvcache_match(kv, b, 4), 0);
    assert_int_equal(got.n, 3); /* a reset is not an eviction */
    sim_kvcache_free(kv);
}

int main(void)
{
    if (vllm_event_load(&ev) < 0) {
        fprintf(stderr, "cannot load KVG_VLLM_EVENT_JSON\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_event_matches_fixture),
        cmocka_unit_test(test_mixed_batch_matches_fixture),
        cmocka_unit_test(test_format_names),
        cmocka_unit_test(test_encoder_out_of_memory),
        cmocka_unit_test(test_kvcache_reports_evictions_and_resets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
