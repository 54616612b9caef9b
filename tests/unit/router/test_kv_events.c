/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the KV-event decoder (router/kv_events.c): payloads written byte by byte from
 * the msgpack specification, the limits, reuse of the decoder between batches, and a failing
 * allocator. The comparison with Python's msgpack on random batches is
 * tests/integration/test_kv_events_decoder.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fail_alloc.h"
#include "router.h"

/* A payload under construction. */
typedef struct pb {
    uint8_t b[1 << 16];
    size_t n;
} pb;

static void put(pb *p, const void *s, size_t n)
{
    assert_true(p->n + n <= sizeof(p->b));
    memcpy(p->b + p->n, s, n);
    p->n += n;
}

static void put1(pb *p, uint8_t c)
{
    put(p, &c, 1);
}

static void put_be(pb *p, uint64_t v, unsigned w)
{
    for (unsigned i = w; i-- > 0;)
        put1(p, (uint8_t)(v >> (8 * i)));
}

static void arr(pb *p, uint32_t n)
{
    if (n < 16) {
        put1(p, (uint8_t)(0x90 | n));
    } else {
        put1(p, 0xdd);
        put_be(p, n, 4);
    }
}

static void str(pb *p, const char *s)
{
    size_t n = strlen(s);
    assert_true(n < 32);
    put1(p, (uint8_t)(0xa0 | n));
    put(p, s, n);
}

static void u64(pb *p, uint64_t v)
{
    put1(p, 0xcf);
    put_be(p, v, 8);
}

static void f64(pb *p, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, 8);
    put1(p, 0xcb);
    put_be(p, bits, 8);
}

/* [ts, [event x nev], 0], each event a BlockStored of nh hashes (i * 1000 + j + 2^63) and
 * 16 token ids per block. */
static void stored_batch(pb *p, uint32_t nev, uint32_t nh)
{
    p->n = 0;
    arr(p, 3);
    f64(p, 1.5);
    arr(p, nev);
    for (uint32_t i = 0; i < nev; i++) {
        arr(p, 7);
        str(p, "BlockStored");
        arr(p, nh);
        for (uint32_t j = 0; j < nh; j++)
            u64(p, (UINT64_C(1) << 63) + i * 1000 + j);
        put1(p, 0xc0);
        arr(p, nh * 16);
        for (uint32_t j = 0; j < nh * 16; j++)
            put1(p, (uint8_t)(j & 0x7f));
        put1(p, 16);
        put1(p, 0xc0);
        str(p, "GPU");
    }
    put1(p, 0);
}

static kvg_kv_decoder *new_decoder(const kvg_kv_limits *lim)
{
    kvg_kv_decoder *d = NULL;
    assert_int_equal(kvg_kv_decoder_new(lim, &d), 0);
    return d;
}

static void test_stored(void **state)
{
    (void)state;
    static pb p;
    stored_batch(&p, 3, 5);
    kvg_kv_decoder *d = new_decoder(NULL);
    kvg_kv_batch b;
    assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), 0);
    assert_string_equal(kvg_kv_decoder_error(d), "");
    assert_true(b.ts == 1.5);
    assert_true(b.has_dp_rank);
    assert_int_equal(b.dp_rank, 0);
    assert_int_equal(b.nevents, 3);
    assert_int_equal(b.nhashes, 15);
    for (uint32_t i = 0; i < 3; i++) {
        const kvg_kv_event *e = &b.events[i];
        assert_int_equal(e->kind, KVG_KV_BLOCK_STORED);
        assert_int_equal(e->medium, KVG_KV_MEDIUM_GPU);
        assert_false(e->has_parent);
        assert_false(e->has_lora_id);
        assert_int_equal(e->nhashes, 5);
        assert_int_equal(e->ntokens, 80);
        assert_int_equal(e->block_size, 16);
        for (uint32_t j = 0; j < 5; j++)
            assert_true(e->hashes[j] == (UINT64_C(1) << 63) + i * 1000 + j);
    }
    /* every prefix of the payload is refused as truncated, never read past */
    for (size_t n = 0; n < p.n; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, p.b, n);
        int rc = kvg_kv_decode(d, copy, n, &b);
        free(copy);
        assert_int_equal(rc, KVG_EPARSE);
        assert_non_null(strstr(kvg_kv_decoder_error(d), "truncated"));
    }
    kvg_kv_decoder_free(d);
}

static void test_integers(void **state)
{
    (void)state;
    /* Each msgpack integer form as a block hash, with the uint64 vLLM means by it. */
    static const struct {
        uint8_t bytes[9];
        size_t n;
        uint64_t want;
    } cases[] = {
        {{0x05}, 1, 5},
        {{0x7f}, 1, 127},
        {{0xe0}, 1, UINT64_MAX - 31},
        {{0xff}, 1, UINT64_MAX},
        {{0xcc, 0xff}, 2, 255},
        {{0xcd, 0x12, 0x34}, 3, 0x1234},
        {{0xce, 0x89, 0xab, 0xcd, 0xef}, 5, 0x89abcdef},
        {{0xcf, 0xf0, 0, 0, 0, 0, 0, 0, 1}, 9, UINT64_C(0xf000000000000001)},
        {{0xd0, 0x80}, 2, (uint64_t)-128},
        {{0xd0, 0x7f}, 2, 127},
        {{0xd1, 0x80, 0x00}, 3, (uint64_t)-32768},
        {{0xd2, 0xff, 0xff, 0xff, 0xfe}, 5, (uint64_t)-2},
        {{0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}, 9, UINT64_C(1) << 63},
        {{0xc4, 0x02, 0x01, 0x02}, 4, 0x0102},
    };
    kvg_kv_decoder *d = new_decoder(NULL);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pb p = {.n = 0};
        arr(&p, 2);
        put1(&p, 0);
        arr(&p, 1);
        arr(&p, 2);
        str(&p, "BlockRemoved");
        arr(&p, 1);
        put(&p, cases[i].bytes, cases[i].n);
        kvg_kv_batch b;
        assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), 0);
        assert_int_equal(b.events[0].kind, KVG_KV_BLOCK_REMOVED);
        assert_int_equal(b.events[0].medium, KVG_KV_MEDIUM_ABSENT);
        assert_true(b.events[0].hashes[0] == cases[i].want);
        assert_false(b.has_dp_rank);
    }
    /* a 32-byte hash (sha256): its last 8 bytes */
    pb p = {.n = 0};
    arr(&p, 2);
    put1(&p, 0);
    arr(&p, 1);
    arr(&p, 2);
    str(&p, "BlockRemoved");
    arr(&p, 1);
    put1(&p, 0xc4);
    put1(&p, 32);
    for (int i = 0; i < 32; i++)
        put1(&p, (uint8_t)i);
    kvg_kv_batch b;
    assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), 0);
    assert_true(b.events[0].hashes[0] == UINT64_C(0x18191a1b1c1d1e1f));
    kvg_kv_decoder_free(d);
}

static void test_limits(void **state)
{
    (void)state;
    static pb p;
    kvg_kv_limits lim = {.max_events = 4, .max_hashes = 8, .max_total_hashes = 20, .max_depth = 3};
    kvg_kv_decoder *d = new_decoder(&lim);
    kvg_kv_batch b;
    stored_batch(&p, 4, 5);
    assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), 0);
    stored_batch(&p, 5, 1);
    assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), KVG_ELIMIT);
    assert_string_equal(kvg_kv_decoder_error(d), "events: too many events");
    stored_batch(&p, 1, 9);
    assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), KVG_ELIMIT);
    assert_string_equal(kvg_kv_decoder_error(d),
                        "events[0][1]: too many block hashes in one event");
    stored_batch(&p, 3, 7);
    assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), KVG_ELIMIT);
    assert_string_equal(kvg_kv_decoder_error(d),
                        "events[2][1]: too many block hashes in one batch");

    /* nesting of skipped fields: 3 levels below the batch's fourth field are refused */
    for (int depth = 1; depth <= 4; depth++) {
        p.n = 0;
        arr(&p, 4);
        put1(&p, 0);
        arr(&p, 0);
        put1(&p, 0xc0);
        for (int i = 0; i < depth; i++)
            arr(&p, 1);
        put1(&p, 0xc0);
        int rc = kvg_kv_decode(d, p.b, p.n, &b);
        assert_int_equal(rc, depth <= 2 ? 0 : KVG_ELIMIT);
    }
    /* a claimed length far beyond the bytes: refused without allocating for it */
    p.n = 0;
    arr(&p, 2);
    put1(&p, 0);
    put1(&p, 0xdd);
    put_be(&p, 0xffffffff, 4);
    kvg_kv_decoder *big = new_decoder(&(kvg_kv_limits){.max_events = UINT32_MAX});
    fail_alloc_nth(0);
    assert_int_equal(kvg_kv_decode(big, p.b, p.n, &b), KVG_EPARSE);
    assert_false(fail_alloc_off());
    kvg_kv_decoder_free(big);
    kvg_kv_decoder_free(d);
}

static void test_reuse(void **state)
{
    (void)state;
    static pb p;
    kvg_kv_decoder *d = new_decoder(NULL);
    kvg_kv_batch b;
    stored_batch(&p, 40, 30);
    assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), 0);
    /* smaller batches afterwards allocate nothing */
    for (uint32_t n = 0; n < 40; n += 7) {
        stored_batch(&p, n, 30 - n / 2);
        fail_alloc_nth(0);
        assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), 0);
        assert_false(fail_alloc_off());
        assert_int_equal(b.nevents, n);
        for (uint32_t i = 0; i < n; i++)
            assert_true(b.events[i].hashes[0] == (UINT64_C(1) << 63) + i * 1000);
    }
    /* a failed decode leaves the caller's batch alone */
    kvg_kv_batch keep = b;
    assert_int_equal(kvg_kv_decode(d, "\x91", 1, &b), KVG_EPARSE);
    assert_memory_equal(&keep, &b, sizeof(b));
    assert_int_equal(kvg_kv_decode(d, NULL, 0, &b), KVG_EPARSE);
    assert_string_equal(kvg_kv_decoder_error(d), "truncated");
    kvg_kv_decoder_free(d);
    kvg_kv_decoder_free(NULL);
    assert_int_equal(kvg_kv_decoder_new(NULL, NULL), -EINVAL);
    assert_string_equal(kvg_kv_event_kind_str(KVG_KV_ALL_BLOCKS_CLEARED), "AllBlocksCleared");
    assert_string_equal(kvg_kv_event_kind_str(KVG_KV_EVENT_KIND_COUNT), "?");
    assert_string_equal(kvg_kv_medium_str(KVG_KV_MEDIUM_CPU), "CPU");
    assert_string_equal(kvg_kv_medium_str(KVG_KV_MEDIUM_COUNT), "?");
}

static void test_alloc_failures(void **state)
{
    (void)state;
    static pb p;
    stored_batch(&p, 40, 30);
    for (long n = 0;; n++) {
        kvg_kv_decoder *d = NULL;
        fail_alloc_nth(n);
        int rc = kvg_kv_decoder_new(NULL, &d);
        if (rc == 0) {
            kvg_kv_batch b;
            rc = kvg_kv_decode(d, p.b, p.n, &b);
        }
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_kv_decoder_free(d);
            assert_true(n > 1);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        if (d) {
            /* the events array, or the hashes array as an event outgrows it: named */
            const char *err = kvg_kv_decoder_error(d);
            assert_true(!strncmp(err, "events", 6));
            assert_non_null(strstr(err, ": out of memory"));
            /* and it decodes once memory is back */
            kvg_kv_batch b;
            assert_int_equal(kvg_kv_decode(d, p.b, p.n, &b), 0);
            assert_int_equal(b.nhashes, 40 * 30);
        }
        kvg_kv_decoder_free(d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stored),         cmocka_unit_test(test_integers),
        cmocka_unit_test(test_limits),         cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
