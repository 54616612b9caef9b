/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for gpu_hash/: the vectors of docs/hashing.md (checked against Python's xxhash by
 * tests/integration/test_hashing.py), chaining, limits and batches. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "gpu_hash.h"

static kvg_hash_job text_job(const char *salt, const char *model, const char *adapter,
                             const char *data, size_t len, uint32_t block, uint64_t *keys,
                             uint32_t max)
{
    return (kvg_hash_job){
        .salt = salt,
        .salt_len = strlen(salt),
        .model = model,
        .model_len = strlen(model),
        .adapter = adapter,
        .adapter_len = strlen(adapter),
        .unit = KVG_HASH_BYTES,
        .data = data,
        .len = len,
        .block_size = block,
        .max_blocks = max,
        .keys = keys,
    };
}

/* docs/hashing.md, vector 1. */
static void test_vector_plain(void **state)
{
    (void)state;
    uint64_t keys[4];
    kvg_hash_job j = text_job("", "", "", "abcdefghij", 10, 4, keys, 4);
    assert_int_equal(kvg_hash_batch(&j, 1), 0);
    assert_int_equal(kvg_hash_root(&j), 0xc08c7447739852dbull);
    assert_int_equal(j.nkeys, 2); /* "ij" is not a full block */
    assert_int_equal(keys[0], 0x8f2c89e0b342f649ull);
    assert_int_equal(keys[1], 0x3f9340ae7dbbed74ull);
}

/* Vector 2: token ids 0..39, block 16 (64 bytes: the constant-length path). */
static void test_vector_tokens(void **state)
{
    (void)state;
    uint32_t toks[40];
    for (uint32_t i = 0; i < 40; i++)
        toks[i] = i;
    uint64_t keys[8];
    kvg_hash_job j = {.salt = "tenant-a-salt",
                      .salt_len = 13,
                      .model = "sim-model",
                      .model_len = 9,
                      .unit = KVG_HASH_TOKENS,
                      .data = toks,
                      .len = 40,
                      .block_size = 16,
                      .max_blocks = 8,
                      .keys = keys};
    assert_int_equal(kvg_hash_batch(&j, 1), 0);
    assert_int_equal(kvg_hash_root(&j), 0x6588d42b3691fa5full);
    assert_int_equal(j.nkeys, 2);
    assert_int_equal(keys[0], 0xd35dabd2d755903aull);
    assert_int_equal(keys[1], 0x001762b0730f47aeull);
}

/* Vector 3: salt, model and adapter; 180 bytes in 64-byte blocks. */
static void test_vector_salted(void **state)
{
    (void)state;
    char text[181];
    for (int i = 0; i < 4; i++)
        memcpy(text + 45 * i, "The quick brown fox jumps over the lazy dog. ", 45);
    uint64_t keys[8];
    kvg_hash_job j = text_job("kvgate-test-salt", "demo-model", "lora-1", text, 180, 64, keys, 8);
    assert_int_equal(kvg_hash_batch(&j, 1), 0);
    assert_int_equal(kvg_hash_root(&j), 0x7541c91b9275a596ull);
    assert_int_equal(j.nkeys, 2);
    assert_int_equal(keys[0], 0xeba59b7d7846b252ull);
    assert_int_equal(keys[1], 0xe9b5c2c51d39ffbaull);
}

/* A change in block i changes key i and every later key, never an earlier one; a change in
 * salt, model, adapter or block size changes every key. */
static void test_chaining(void **state)
{
    (void)state;
    char a[256], b[256];
    for (int i = 0; i < 256; i++)
        a[i] = (char)('a' + i % 26);
    uint64_t ka[4], kb[4];
    kvg_hash_job ja = text_job("s", "m", "", a, 256, 64, ka, 4);
    assert_int_equal(kvg_hash_batch(&ja, 1), 0);
    for (int pos = 0; pos < 256; pos += 37) {
        memcpy(b, a, 256);
        b[pos] ^= 1;
        kvg_hash_job jb = text_job("s", "m", "", b, 256, 64, kb, 4);
        assert_int_equal(kvg_hash_batch(&jb, 1), 0);
        for (int i = 0; i < 4; i++) {
            if (i < pos / 64)
                assert_int_equal(ka[i], kb[i]);
            else
                assert_int_not_equal(ka[i], kb[i]);
        }
    }
    const char *variants[][3] = {{"t", "m", ""}, {"s", "n", ""}, {"s", "m", "x"}, {"", "sm", ""}};
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        kvg_hash_job jb =
            text_job(variants[v][0], variants[v][1], variants[v][2], a, 256, 64, kb, 4);
        assert_int_equal(kvg_hash_batch(&jb, 1), 0);
        for (int i = 0; i < 4; i++)
            assert_int_not_equal(ka[i], kb[i]);
    }
    /* Same bytes as text and as tokens (64 bytes = 16 tokens) are different chains. */
    kvg_hash_job jt = {.salt = "s",
                       .salt_len = 1,
                       .model = "m",
                       .model_len = 1,
                       .unit = KVG_HASH_TOKENS,
                       .data = a,
                       .len = 64,
                       .block_size = 16,
                       .max_blocks = 4,
                       .keys = kb};
    kvg_hash_job jx = text_job("s", "m", "", a, 64, 64, ka, 4);
    assert_int_equal(kvg_hash_batch(&jt, 1), 0);
    assert_int_equal(kvg_hash_batch(&jx, 1), 0);
    assert_int_not_equal(ka[0], kb[0]);
}

static void test_limits_and_batches(void **state)
{
    (void)state;
    char text[1000];
    memset(text, 'x', sizeof(text));
    uint64_t k1[20], k2[20], k3[3];
    kvg_hash_job jobs[3] = {
        text_job("a", "m", "", text, 1000, 64, k1, 20), /* 15 full blocks */
        text_job("b", "m", "", text, 63, 64, k2, 20),   /* none */
        text_job("a", "m", "", text, 1000, 64, k3, 3),  /* cut at max_blocks */
    };
    assert_int_equal(kvg_hash_batch(jobs, 3), 0);
    assert_int_equal(jobs[0].nkeys, 15);
    assert_int_equal(jobs[1].nkeys, 0);
    assert_int_equal(jobs[2].nkeys, 3);
    assert_memory_equal(k1, k3, sizeof(k3));
    /* Equal blocks hash alike (d[i] is seeded by the root only); their keys still differ. */
    for (int i = 1; i < 15; i++)
        for (int m = 0; m < i; m++)
            assert_int_not_equal(k1[i], k1[m]);
    /* One bad job: -EINVAL and no job touched. */
    kvg_hash_job bad[2] = {text_job("a", "m", "", text, 1000, 64, k1, 20),
                           text_job("a", "m", "", text, 1000, 0, k2, 20)};
    bad[0].nkeys = 77;
    assert_int_equal(kvg_hash_batch(bad, 2), -EINVAL);
    assert_int_equal(bad[0].nkeys, 77);
    bad[1].block_size = KVG_HASH_BLOCK_MAX + 1;
    assert_int_equal(kvg_hash_batch(bad, 2), -EINVAL);
    bad[1].block_size = 64;
    bad[1].unit = KVG_HASH_UNIT_COUNT;
    assert_int_equal(kvg_hash_batch(bad, 2), -EINVAL);
    bad[1].unit = KVG_HASH_BYTES;
    bad[1].keys = NULL;
    assert_int_equal(kvg_hash_batch(bad, 2), -EINVAL);
    assert_int_equal(kvg_hash_batch(NULL, 0), 0);
    assert_string_equal(kvg_hash_backend(), "cpu");
    assert_string_equal(kvg_hash_unit_str(KVG_HASH_TOKENS), "tokens");
}

/* The root from one buffer (short preimages) and from the streaming state (long ones) is the
 * same function: checked against the preimage of docs/hashing.md built here, for model names
 * around the size where kvg_hash_root switches. */
static void put32(unsigned char *o, uint32_t v)
{
    o[0] = (unsigned char)v, o[1] = (unsigned char)(v >> 8);
    o[2] = (unsigned char)(v >> 16), o[3] = (unsigned char)(v >> 24);
}

static void test_root_any_length(void **state)
{
    (void)state;
    static const char salt[] = "0123456789012345678901234567890123456789abc";
    char model[1200];
    for (size_t i = 0; i < sizeof(model); i++)
        model[i] = (char)('a' + i % 26);
    for (size_t mlen = 380; mlen < sizeof(model); mlen += 7) {
        kvg_hash_job j = {.unit = KVG_HASH_BYTES,
                          .block_size = 64,
                          .salt = salt,
                          .salt_len = sizeof(salt) - 1,
                          .model = model,
                          .model_len = mlen,
                          .adapter = "lora",
                          .adapter_len = 4};
        unsigned char pre[2048];
        size_t n = 0;
        memcpy(pre, "kvgate-block-v2", 16), n = 16;
        put32(pre + n, 0), n += 4;
        put32(pre + n, 64), n += 4;
        put32(pre + n, (uint32_t)j.salt_len), n += 4;
        memcpy(pre + n, salt, j.salt_len), n += j.salt_len;
        put32(pre + n, (uint32_t)mlen), n += 4;
        memcpy(pre + n, model, mlen), n += mlen;
        put32(pre + n, 4), n += 4;
        memcpy(pre + n, "lora", 4), n += 4;
        assert_true(kvg_hash_root(&j) == XXH3_64bits(pre, n));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_plain),       cmocka_unit_test(test_vector_tokens),
        cmocka_unit_test(test_vector_salted),      cmocka_unit_test(test_chaining),
        cmocka_unit_test(test_limits_and_batches), cmocka_unit_test(test_root_any_length),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
