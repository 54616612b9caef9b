/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for gpu_hash/vllm_hash.c: the 25 block hashes a real vLLM engine published
 * (tests/data/vllm/kv_event_base.json), chaining, the cache salt, limits and errors. Random
 * cases against vLLM's own Python functions: tests/integration/test_vllm_hash.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include "common.h"
#include "gpu_hash.h"
#include "vllm_event_data.h"

static vllm_event_data ev;

static int load(void **state)
{
    (void)state;
    int rc = vllm_event_load(&ev);
    if (rc < 0)
        fprintf(stderr, "# cannot load $KVG_VLLM_EVENT_JSON: %s\n", kvg_strerror(rc));
    return rc < 0 ? -1 : 0;
}

static kvg_vllm_blocks blocks_of(kvg_vllm_algo algo, const kvg_vllm_hash *parent,
                                 const uint32_t *tokens, size_t n, uint32_t block)
{
    return (kvg_vllm_blocks){
        .algo = algo, .parent = parent, .tokens = tokens, .ntokens = n, .block_size = block};
}

/* The hashes of the engine's prompt under algo and seed, with lora (NULL: none); returns how many
 * of the event's hashes they match, in order. */
static size_t matches(kvg_vllm_algo algo, const char *seed, const char *lora)
{
    kvg_vllm_hash none;
    assert_int_equal(kvg_vllm_none_hash(algo, seed, strlen(seed), &none), 0);
    kvg_vllm_blocks in = blocks_of(algo, &none, ev.tokens, ev.ntokens, ev.block_size);
    in.lora_name = lora;
    in.lora_name_len = lora ? strlen(lora) : 0;
    uint64_t keys[VLLM_EVENT_MAX_BLOCKS];
    size_t n = 0;
    assert_int_equal(kvg_vllm_block_hashes(&in, NULL, keys, VLLM_EVENT_MAX_BLOCKS, &n), 0);
    assert_int_equal(n, ev.ntokens / ev.block_size);
    size_t m = 0;
    for (size_t i = 0; i < n && i < ev.nhashes; i++)
        m += keys[i] == ev.hashes[i];
    return m;
}

/* The exactness proof: every block hash of the real engine's events, in both output forms. */
static void test_real_engine(void **state)
{
    (void)state;
    assert_int_equal(ev.nhashes, 25);
    assert_int_equal(ev.ntokens, 400);
    assert_int_equal(ev.block_size, 16);
    assert_string_equal(ev.seed, "42");
    /* The record's lora_name is null: the request had no adapter, so no extra keys at all. */
    assert_true(ev.lora_name_null);
    assert_int_equal(matches(KVG_VLLM_SHA256_CBOR, ev.seed, NULL), 25);

    kvg_vllm_hash none, hashes[VLLM_EVENT_MAX_BLOCKS];
    uint64_t keys[VLLM_EVENT_MAX_BLOCKS];
    size_t n = 0;
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "42", 2, &none), 0);
    kvg_vllm_blocks in = blocks_of(KVG_VLLM_SHA256_CBOR, &none, ev.tokens, ev.ntokens, 16);
    assert_int_equal(kvg_vllm_block_hashes(&in, hashes, keys, VLLM_EVENT_MAX_BLOCKS, &n), 0);
    assert_int_equal(n, 25);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(hashes[i].len, 32);
        assert_true(kvg_vllm_hash_u64(&hashes[i]) == ev.hashes[i]);
        assert_true(keys[i] == ev.hashes[i]);
    }
}

/* The data tells the variants apart: another seed, the other algorithm, or the record's
 * lora_path taken as an adapter name match none of the engine's hashes. */
static void test_real_engine_discriminates(void **state)
{
    (void)state;
    assert_int_equal(matches(KVG_VLLM_SHA256_CBOR, "43", NULL), 0);
    assert_int_equal(matches(KVG_VLLM_SHA256_CBOR, "", NULL), 0);
    assert_int_equal(matches(KVG_VLLM_XXHASH_CBOR, ev.seed, NULL), 0);
    assert_int_equal(matches(KVG_VLLM_SHA256_CBOR, ev.seed, "charent/self_cognition_Alice"), 0);
    /* One token changed in block 3: blocks 0-2 still match, none after. */
    uint32_t saved = ev.tokens[3 * 16 + 5];
    ev.tokens[3 * 16 + 5] ^= 1;
    assert_int_equal(matches(KVG_VLLM_SHA256_CBOR, ev.seed, NULL), 3);
    ev.tokens[3 * 16 + 5] = saved;
}

/* NONE_HASH is the digest of the seed as a CBOR text string: 0x60 + length, then the bytes
 * (RFC 8949), digested here by the libraries directly. */
static void test_none_hash(void **state)
{
    (void)state;
    static const unsigned char cbor42[] = {0x62, '4', '2'};
    unsigned char want[32];
    unsigned int wlen = 0;
    assert_int_equal(EVP_Digest(cbor42, 3, want, &wlen, EVP_sha256(), NULL), 1);
    kvg_vllm_hash h;
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "42", 2, &h), 0);
    assert_int_equal(h.len, 32);
    assert_memory_equal(h.bytes, want, 32);

    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(cbor42, 3));
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_XXHASH_CBOR, "42", 2, &h), 0);
    assert_int_equal(h.len, 16);
    assert_memory_equal(h.bytes, c.digest, 16);
    static const uint8_t zero[16];
    assert_memory_equal(h.bytes + 16, zero, 16); /* whole structs compare as bytes */

    /* The empty seed is a seed (os.getenv gives ""): cbor("") is the one byte 0x60. */
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "", 0, &h), 0);
    assert_int_equal(EVP_Digest("\x60", 1, want, &wlen, EVP_sha256(), NULL), 1);
    assert_memory_equal(h.bytes, want, 32);
}

/* int.from_bytes(h, "big") & (2**64 - 1): the last eight bytes, big-endian. */
static void test_u64_form(void **state)
{
    (void)state;
    kvg_vllm_hash h = {.len = 32};
    for (int i = 0; i < 32; i++)
        h.bytes[i] = (uint8_t)i;
    assert_true(kvg_vllm_hash_u64(&h) == 0x18191A1B1C1D1E1FULL);
    h.len = 16;
    assert_true(kvg_vllm_hash_u64(&h) == 0x08090A0B0C0D0E0FULL);
}

/* A chain continued from block k's hash gives the same later hashes as one run. */
static void test_continue_chain(void **state)
{
    (void)state;
    for (int a = 0; a < KVG_VLLM_ALGO_COUNT; a++) {
        kvg_vllm_hash none, all[25], rest[25];
        size_t n = 0, m = 0;
        assert_int_equal(kvg_vllm_none_hash((kvg_vllm_algo)a, "7", 1, &none), 0);
        kvg_vllm_blocks in = blocks_of((kvg_vllm_algo)a, &none, ev.tokens, 400, 16);
        in.lora_name = "adapter-1";
        in.lora_name_len = 9;
        assert_int_equal(kvg_vllm_block_hashes(&in, all, NULL, 25, &n), 0);
        in.parent = &all[9];
        in.tokens = ev.tokens + 160;
        in.ntokens = 240;
        assert_int_equal(kvg_vllm_block_hashes(&in, rest, NULL, 25, &m), 0);
        assert_int_equal(m, 15);
        for (size_t i = 0; i < m; i++)
            assert_memory_equal(&rest[i], &all[10 + i], sizeof(rest[i]));
    }
}

/* The salt enters the first block only (and through it, every later one); "" is no salt. */
static void test_cache_salt_first_block(void **state)
{
    (void)state;
    kvg_vllm_hash none, plain[25], salted[25], empty[25], rest[25];
    size_t n = 0;
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "42", 2, &none), 0);
    kvg_vllm_blocks in = blocks_of(KVG_VLLM_SHA256_CBOR, &none, ev.tokens, 400, 16);
    assert_int_equal(kvg_vllm_block_hashes(&in, plain, NULL, 25, &n), 0);
    in.cache_salt = "";
    assert_int_equal(kvg_vllm_block_hashes(&in, empty, NULL, 25, &n), 0);
    assert_memory_equal(plain, empty, sizeof(plain));
    in.cache_salt = "scope-salt";
    in.cache_salt_len = 10;
    assert_int_equal(kvg_vllm_block_hashes(&in, salted, NULL, 25, &n), 0);
    for (size_t i = 0; i < 25; i++)
        assert_memory_not_equal(&salted[i], &plain[i], sizeof(plain[i]));
    /* Blocks 1.. are the unsalted function of their parent. */
    in.cache_salt = NULL;
    in.cache_salt_len = 0;
    in.parent = &salted[0];
    in.tokens = ev.tokens + 16;
    in.ntokens = 384;
    assert_int_equal(kvg_vllm_block_hashes(&in, rest, NULL, 25, &n), 0);
    assert_int_equal(n, 24);
    assert_memory_equal(rest, &salted[1], 24 * sizeof(rest[0]));
}

static void test_full_blocks_and_limits(void **state)
{
    (void)state;
    kvg_vllm_hash none, h[25];
    uint64_t keys[25], k2[25];
    size_t n = 99;
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_XXHASH_CBOR, "0", 1, &none), 0);
    kvg_vllm_blocks in = blocks_of(KVG_VLLM_XXHASH_CBOR, &none, ev.tokens, 15, 16);
    assert_int_equal(kvg_vllm_block_hashes(&in, h, keys, 25, &n), 0);
    assert_int_equal(n, 0);
    in.ntokens = 399; /* 24 full blocks and a partial one */
    assert_int_equal(kvg_vllm_block_hashes(&in, h, keys, 25, &n), 0);
    assert_int_equal(n, 24);
    assert_int_equal(kvg_vllm_block_hashes(&in, NULL, k2, 5, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(k2, keys, 5 * sizeof(keys[0]));
    assert_int_equal(kvg_vllm_block_hashes(&in, NULL, NULL, 0, &n), 0);
    assert_int_equal(n, 0);
    in.tokens = NULL;
    in.ntokens = 0;
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 25, &n), 0);
    assert_int_equal(n, 0);
}

static void test_errors(void **state)
{
    (void)state;
    kvg_vllm_hash none, h[4];
    size_t n;
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_ALGO_COUNT, "1", 1, &none), -EINVAL);
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, NULL, 0, &none), -EINVAL);
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "1", 1, NULL), -EINVAL);
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "\xff", 1, &none), -EILSEQ);
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "\xed\xa0\x80", 3, &none), -EILSEQ);
    assert_int_equal(kvg_vllm_none_hash(KVG_VLLM_SHA256_CBOR, "1", 1, &none), 0);

    kvg_vllm_blocks in = blocks_of(KVG_VLLM_SHA256_CBOR, &none, ev.tokens, 64, 16);
    assert_int_equal(kvg_vllm_block_hashes(NULL, h, NULL, 4, &n), -EINVAL);
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 4, NULL), -EINVAL);
    assert_int_equal(kvg_vllm_block_hashes(&in, NULL, NULL, 4, &n), -EINVAL);
    in.block_size = 0;
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 4, &n), -EINVAL);
    in.block_size = 16;
    in.algo = KVG_VLLM_XXHASH_CBOR; /* a 32-byte parent for a 16-byte algorithm */
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 4, &n), -EINVAL);
    in.algo = KVG_VLLM_SHA256_CBOR;
    in.parent = NULL;
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 4, &n), -EINVAL);
    in.parent = &none;
    in.tokens = NULL;
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 4, &n), -EINVAL);
    in.tokens = ev.tokens;
    in.lora_name = "a\x80";
    in.lora_name_len = 2;
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 4, &n), -EILSEQ);
    in.lora_name = NULL;
    in.cache_salt = "\xc0\xaf"; /* an overlong '/' */
    in.cache_salt_len = 2;
    assert_int_equal(kvg_vllm_block_hashes(&in, h, NULL, 4, &n), -EILSEQ);
}

static void test_algo_names(void **state)
{
    (void)state;
    kvg_vllm_algo a = KVG_VLLM_ALGO_COUNT;
    assert_int_equal(kvg_vllm_algo_parse("sha256_cbor", 11, &a), 0);
    assert_int_equal(a, KVG_VLLM_SHA256_CBOR);
    assert_int_equal(kvg_vllm_algo_parse("xxhash_cbor", 11, &a), 0);
    assert_int_equal(a, KVG_VLLM_XXHASH_CBOR);
    assert_string_equal(kvg_vllm_algo_str(KVG_VLLM_SHA256_CBOR), "sha256_cbor");
    assert_string_equal(kvg_vllm_algo_str(KVG_VLLM_XXHASH_CBOR), "xxhash_cbor");
    assert_string_equal(kvg_vllm_algo_str(KVG_VLLM_ALGO_COUNT), "?");
    assert_int_equal(kvg_vllm_algo_parse("sha256", 6, &a), -ENOTSUP);
    assert_int_equal(kvg_vllm_algo_parse("xxhash", 6, &a), -ENOTSUP);
    assert_int_equal(kvg_vllm_algo_parse("builtin", 7, &a), -ENOTSUP);
    assert_int_equal(kvg_vllm_algo_parse("sha256_cbor_64bit", 17, &a), -ENOTSUP);
    assert_int_equal(kvg_vllm_algo_parse("sha256_cbor", 6, &a), -ENOTSUP); /* "sha256" */
    assert_int_equal(kvg_vllm_algo_parse("sha256_cbor", 10, &a), KVG_EPARSE);
    assert_int_equal(kvg_vllm_algo_parse("SHA256_CBOR", 11, &a), KVG_EPARSE);
    assert_int_equal(kvg_vllm_algo_parse("", 0, &a), KVG_EPARSE);
    assert_int_equal(kvg_vllm_digest_len(KVG_VLLM_SHA256_CBOR), 32);
    assert_int_equal(kvg_vllm_digest_len(KVG_VLLM_XXHASH_CBOR), 16);
    assert_int_equal(kvg_vllm_digest_len(KVG_VLLM_ALGO_COUNT), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_engine),
        cmocka_unit_test(test_real_engine_discriminates),
        cmocka_unit_test(test_none_hash),
        cmocka_unit_test(test_u64_form),
        cmocka_unit_test(test_continue_chain),
        cmocka_unit_test(test_cache_salt_first_block),
        cmocka_unit_test(test_full_blocks_and_limits),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_algo_names),
    };
    return cmocka_run_group_tests(tests, load, NULL);
}
