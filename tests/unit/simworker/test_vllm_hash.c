/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for tools/simworker/vllm_hash.c, the simulated worker's own vLLM block hash: the
 * 25 block hashes a real vLLM engine published (tests/data/vllm/kv_event_base.json), the salt,
 * errors, and running out of memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "fail_alloc.h"
#include "simworker.h"
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

static size_t run(sim_vllm_algo algo, const char *seed, const char *lora, const char *salt,
                  uint8_t *out)
{
    uint8_t none[SIM_VLLM_DIGEST_MAX];
    size_t dlen = 0, n = 0;
    assert_int_equal(sim_vllm_none_hash(algo, seed, strlen(seed), none, &dlen), 0);
    assert_int_equal(sim_vllm_block_hashes(algo, none, dlen, ev.tokens, ev.ntokens, ev.block_size,
                                           lora, lora ? strlen(lora) : 0, salt,
                                           salt ? strlen(salt) : 0, out, VLLM_EVENT_MAX_BLOCKS, &n),
                     0);
    return n;
}

static size_t matches(sim_vllm_algo algo, const char *seed, const char *lora)
{
    uint8_t out[VLLM_EVENT_MAX_BLOCKS * SIM_VLLM_DIGEST_MAX];
    size_t n = run(algo, seed, lora, NULL, out), dlen = algo == SIM_VLLM_SHA256_CBOR ? 32 : 16;
    size_t m = 0;
    for (size_t i = 0; i < n && i < ev.nhashes; i++)
        m += sim_vllm_hash_u64(out + i * dlen, dlen) == ev.hashes[i];
    return m;
}

static void test_real_engine(void **state)
{
    (void)state;
    assert_int_equal(ev.nhashes, 25);
    assert_int_equal(ev.block_size, 16);
    assert_string_equal(ev.seed, "42");
    assert_true(ev.lora_name_null);
    assert_int_equal(matches(SIM_VLLM_SHA256_CBOR, ev.seed, NULL), 25);
    assert_int_equal(matches(SIM_VLLM_SHA256_CBOR, "41", NULL), 0);
    assert_int_equal(matches(SIM_VLLM_XXHASH_CBOR, ev.seed, NULL), 0);
    assert_int_equal(matches(SIM_VLLM_SHA256_CBOR, ev.seed, "charent/self_cognition_Alice"), 0);
}

/* NONE_HASH: SHA-256 of the CBOR text string "42" (0x62 '4' '2'). */
static void test_none_hash(void **state)
{
    (void)state;
    uint8_t none[SIM_VLLM_DIGEST_MAX], want[32];
    size_t dlen = 0;
    assert_int_equal(sim_vllm_none_hash(SIM_VLLM_SHA256_CBOR, "42", 2, none, &dlen), 0);
    assert_int_equal(dlen, 32);
    unsigned int wlen = 0;
    assert_int_equal(EVP_Digest("\x62"
                                "42",
                                3, want, &wlen, EVP_sha256(), NULL),
                     1);
    assert_memory_equal(none, want, 32);
    assert_int_equal(sim_vllm_none_hash(SIM_VLLM_XXHASH_CBOR, "42", 2, none, &dlen), 0);
    assert_int_equal(dlen, 16);
}

static void test_salt_first_block_only(void **state)
{
    (void)state;
    uint8_t plain[VLLM_EVENT_MAX_BLOCKS * 32], salted[VLLM_EVENT_MAX_BLOCKS * 32],
        empty[VLLM_EVENT_MAX_BLOCKS * 32];
    assert_int_equal(run(SIM_VLLM_SHA256_CBOR, "42", NULL, NULL, plain), 25);
    assert_int_equal(run(SIM_VLLM_SHA256_CBOR, "42", NULL, "", empty), 25);
    assert_memory_equal(plain, empty, 25 * 32);
    assert_int_equal(run(SIM_VLLM_SHA256_CBOR, "42", NULL, "s", salted), 25);
    assert_memory_not_equal(plain, salted, 32);
    /* Block 1 of the salted chain: the unsalted function of salted block 0. */
    uint8_t rest[24 * 32];
    size_t n = 0;
    assert_int_equal(sim_vllm_block_hashes(SIM_VLLM_SHA256_CBOR, salted, 32, ev.tokens + 16, 384,
                                           16, NULL, 0, NULL, 0, rest, 24, &n),
                     0);
    assert_int_equal(n, 24);
    assert_memory_equal(rest, salted + 32, 24 * 32);
}

static void test_errors(void **state)
{
    (void)state;
    uint8_t none[SIM_VLLM_DIGEST_MAX], out[4 * 32];
    size_t dlen = 0, n = 0;
    sim_vllm_algo a;
    assert_int_equal(sim_vllm_algo_parse("sha256_cbor", &a), 0);
    assert_int_equal(a, SIM_VLLM_SHA256_CBOR);
    assert_int_equal(sim_vllm_algo_parse("xxhash_cbor", &a), 0);
    assert_int_equal(a, SIM_VLLM_XXHASH_CBOR);
    assert_int_equal(sim_vllm_algo_parse("sha256", &a), -EINVAL);
    assert_string_equal(sim_vllm_algo_str(SIM_VLLM_XXHASH_CBOR), "xxhash_cbor");
    assert_int_equal(sim_vllm_none_hash(SIM_VLLM_SHA256_CBOR, NULL, 0, none, &dlen), -EINVAL);
    assert_int_equal(sim_vllm_none_hash(SIM_VLLM_SHA256_CBOR, "\xfe", 1, none, &dlen), -EILSEQ);
    assert_int_equal(sim_vllm_none_hash(SIM_VLLM_SHA256_CBOR, "1", 1, none, &dlen), 0);
    assert_int_equal(sim_vllm_block_hashes(SIM_VLLM_SHA256_CBOR, none, 32, ev.tokens, 64, 0, NULL,
                                           0, NULL, 0, out, 4, &n),
                     -EINVAL);
    assert_int_equal(sim_vllm_block_hashes(SIM_VLLM_XXHASH_CBOR, none, 32, ev.tokens, 64, 16, NULL,
                                           0, NULL, 0, out, 4, &n),
                     -EINVAL);
    assert_int_equal(sim_vllm_block_hashes(SIM_VLLM_SHA256_CBOR, none, 32, ev.tokens, 64, 16,
                                           "\x80", 1, NULL, 0, out, 4, &n),
                     -EILSEQ);
    assert_int_equal(sim_vllm_block_hashes(SIM_VLLM_SHA256_CBOR, none, 32, ev.tokens, 64, 16, NULL,
                                           0, NULL, 0, NULL, 4, &n),
                     -EINVAL);
    assert_int_equal(sim_vllm_block_hashes(SIM_VLLM_SHA256_CBOR, none, 32, NULL, 64, 16, NULL, 0,
                                           NULL, 0, out, 4, &n),
                     -EINVAL);
}

/* Every allocation of the encoder's buffer, failed in turn, is an error and no crash. */
static void test_out_of_memory(void **state)
{
    (void)state;
    uint8_t none[SIM_VLLM_DIGEST_MAX], out[25 * 32];
    size_t dlen = 0, n = 0;
    assert_int_equal(sim_vllm_none_hash(SIM_VLLM_SHA256_CBOR, "42", 2, none, &dlen), 0);
    for (long k = 0;; k++) {
        fail_alloc_nth(k);
        int rc = sim_vllm_block_hashes(SIM_VLLM_SHA256_CBOR, none, dlen, ev.tokens, 400, 16, "lora",
                                       4, "salt", 4, out, 25, &n);
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
    }
    for (long k = 0;; k++) {
        fail_alloc_nth(k);
        int rc = sim_vllm_none_hash(SIM_VLLM_XXHASH_CBOR, "42", 2, none, &dlen);
        if (!fail_alloc_off()) {
            assert_int_equal(rc, 0);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_engine),           cmocka_unit_test(test_none_hash),
        cmocka_unit_test(test_salt_first_block_only), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, load, NULL);
}
