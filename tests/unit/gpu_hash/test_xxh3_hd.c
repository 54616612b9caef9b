/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for gpu_hash/xxh3_hd.h, the XXH3 that the CUDA kernel runs: on the CPU, against
 * libxxhash's XXH3_64bits_withSeed on every length class and boundary, so the device code's
 * arithmetic is checked on machines without a GPU; then the kernel's two phases (block hashes,
 * then one chain per job) and the CUDA backend's packing (hash_pack.h) emulated on the host
 * against kvg_hash_batch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "gpu_hash.h"
#include "hash_pack.h"
#include "xxh3_hd.h"

#define BUF_MAX (262144 + 64)

/* splitmix64 with a fixed start: every run checks the same cases. */
static uint64_t rng_state = 0x6b7667617465ull;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static unsigned char *random_buf(size_t n)
{
    unsigned char *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)rng();
    return b;
}

static unsigned long checked;

static void check(const unsigned char *p, size_t len, uint64_t seed)
{
    uint64_t want = XXH3_64bits_withSeed(p, len, seed);
    uint64_t got = kvg_xxh3_64_seed(p, len, seed);
    if (want != got)
        fail_msg("len %zu seed %016llx offset %u: %016llx, libxxhash %016llx", len,
                 (unsigned long long)seed, (unsigned)((uintptr_t)p & 7), (unsigned long long)got,
                 (unsigned long long)want);
    checked++;
}

/* Every length up to 2048 (the short classes and the first long blocks), each with seed 0, an
 * all-ones seed and a random one, at a random misalignment. */
static void test_every_length(void **state)
{
    (void)state;
    unsigned char *buf = random_buf(2048 + 8);
    for (size_t len = 0; len <= 2048; len++) {
        const unsigned char *p = buf + (rng() & 7);
        check(p, len, 0);
        check(p, len, ~0ull);
        check(p, len, rng());
    }
    free(buf);
}

/* The class boundaries, and both sides of every stripe (64) and block of stripes (1024) edge. */
static void test_boundaries(void **state)
{
    (void)state;
    unsigned char *buf = random_buf(BUF_MAX);
    static const size_t edges[] = {0,   1,    3,    4,    8,     9,     16,    17,  32,
                                   33,  64,   65,   96,   97,    128,   129,   240, 241,
                                   256, 1024, 1025, 2048, 16384, 65536, 262144};
    for (size_t e = 0; e < sizeof(edges) / sizeof(edges[0]); e++)
        for (int d = -1; d <= 1; d++) {
            if (edges[e] == 0 && d < 0)
                continue;
            size_t len = edges[e] + (size_t)d;
            if (len > 262144)
                continue;
            check(buf, len, 0);
            check(buf + 1, len, rng());
        }
    for (size_t len = 64; len <= 16384; len += 64)
        for (int d = -1; d <= 1; d++)
            check(buf + (rng() & 7), len + (size_t)d, rng());
    for (size_t len = 1024; len <= 262144; len += 1024)
        for (int d = -1; d <= 1; d++)
            check(buf, len + (size_t)d, rng() & 0xffff); /* buf has room for +1 */
    free(buf);
}

/* Random lengths up to 256 KiB, random seeds (one in eight is 0), random misalignment. */
static void test_random(void **state)
{
    (void)state;
    unsigned char *buf = random_buf(BUF_MAX);
    for (int i = 0; i < 1500; i++) {
        size_t len = (size_t)(rng() % (262144 + 1));
        if (i % 3 == 0)
            len %= 4096; /* more of the sizes that blocks have */
        uint64_t seed = (rng() & 7) == 0 ? 0 : rng();
        check(buf + (rng() & 7), len, seed);
        /* Fresh bytes now and then, so no case depends on one buffer. */
        if (i % 100 == 0)
            for (size_t k = 0; k < BUF_MAX; k += 8)
                buf[k] = (unsigned char)rng();
    }
    free(buf);
    printf("# %lu lengths and seeds checked against libxxhash\n", checked);
}

/* The kernel's two phases on the host: every d[i] first, then the links of each job, as the
 * device runs them; the keys must equal kvg_hash_batch's. */
static void test_two_phases_equal_batch(void **state)
{
    (void)state;
    static const uint32_t blocks[] = {1, 4, 16, 63, 64, 65, 100, 241, 1024, 4096};
    uint64_t *want = malloc(sizeof(uint64_t) * 4096);
    uint64_t *d = malloc(sizeof(uint64_t) * 4096);
    assert_non_null(want);
    assert_non_null(d);
    unsigned char *data = random_buf(1 << 20);
    for (int i = 0; i < 200; i++) {
        kvg_hash_job j = {
            .salt = "kvgate-test-salt",
            .salt_len = (size_t)(rng() % 17),
            .model = "demo-model",
            .model_len = (size_t)(rng() % 11),
            .unit = (rng() & 1) ? KVG_HASH_TOKENS : KVG_HASH_BYTES,
            .data = data,
            .block_size = blocks[rng() % (sizeof(blocks) / sizeof(blocks[0]))],
            .max_blocks = 4096,
            .keys = want,
        };
        size_t unit = j.unit == KVG_HASH_TOKENS ? 4 : 1, w = j.block_size * unit;
        j.len = (size_t)(rng() % ((1 << 20) / unit + 1));
        assert_int_equal(kvg_hash_batch(&j, 1), 0);
        uint64_t root = kvg_hash_root(&j);
        for (uint32_t k = 0; k < j.nkeys; k++)
            d[k] = kvg_hd_block_hash(data + k * w, w, root);
        uint64_t h = root;
        for (uint32_t k = 0; k < j.nkeys; k++) {
            h = kvg_hd_link(h ^ d[k]);
            if (h != want[k])
                fail_msg("job %d block %u of %u (w %zu): %016llx, want %016llx", i, k, j.nkeys, w,
                         (unsigned long long)h, (unsigned long long)want[k]);
        }
    }
    free(data);
    free(d);
    free(want);
}

/* A batch as hash_cuda.cu runs it, each kernel thread's body called in a loop: pack, every
 * block's d (the binary search included), every job's chain, unpack; equal to kvg_hash_batch.
 * Jobs without keys, tokens, and widths that are and are not multiples of 8 are mixed. */
static void test_packed_batch(void **state)
{
    (void)state;
    static const uint32_t blocks[] = {1, 3, 16, 64, 100, 241, 4096};
    enum { N = 300, DATA = 1 << 20, CAP = 64 << 20, KEYS = 1 << 20 };
    unsigned char *src = random_buf(DATA);
    uint8_t *packed = malloc(CAP);
    kvg_hash_dev_job *dj = malloc(sizeof(*dj) * N);
    uint64_t *keys = malloc(sizeof(uint64_t) * KEYS);
    kvg_hash_job *dev = calloc(N, sizeof(*dev)), *cpu = calloc(N, sizeof(*cpu));
    assert_true(packed && dj && keys && dev && cpu);
    for (int round = 0; round < 4; round++) {
        size_t n = round == 0 ? 1 : (size_t)(rng() % N) + 1;
        for (size_t k = 0; k < n; k++) {
            kvg_hash_unit u = (rng() & 1) ? KVG_HASH_TOKENS : KVG_HASH_BYTES;
            uint32_t b = blocks[rng() % (sizeof(blocks) / sizeof(blocks[0]))];
            size_t ub = u == KVG_HASH_TOKENS ? 4 : 1, len = (size_t)(rng() % (b * 12 + 1));
            if (len * ub > DATA)
                len = DATA / ub;
            size_t off = (size_t)(rng() % (DATA - len * ub + 1));
            dev[k] = (kvg_hash_job){
                .salt = "s",
                .salt_len = (size_t)(rng() & 1),
                .unit = u,
                .data = src + off - off % ub,
                .len = len,
                .block_size = b,
                .max_blocks = (uint32_t)(rng() % 16),
            };
            dev[k].keys = malloc(sizeof(uint64_t) * (dev[k].max_blocks + 1));
            cpu[k] = dev[k];
            cpu[k].keys = malloc(sizeof(uint64_t) * (dev[k].max_blocks + 1));
            assert_true(dev[k].keys && cpu[k].keys);
        }
        assert_int_equal(kvg_hash_batch(cpu, n), 0);
        uint32_t ndev = 0;
        uint64_t nbytes = 0, nkeys = 0;
        assert_int_equal(kvg_hash_pack(dev, n, packed, CAP, KEYS, dj, &ndev, &nbytes, &nkeys), 0);
        for (uint64_t b = 0; b < nkeys; b++)
            keys[b] = kvg_hash_dev_block(packed, dj, ndev, b);
        for (uint32_t t = 0; t < ndev; t++)
            kvg_hash_dev_chain(&dj[t], keys);
        kvg_hash_unpack(dev, n, keys);
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(dev[k].nkeys, cpu[k].nkeys);
            assert_memory_equal(dev[k].keys, cpu[k].keys, sizeof(uint64_t) * cpu[k].nkeys);
        }
        if (ndev) { /* one byte short of the last job's end is refused */
            size_t need = dj[ndev - 1].data_off + (size_t)dj[ndev - 1].nblocks * dj[ndev - 1].width;
            assert_int_equal(
                kvg_hash_pack(dev, n, packed, need - 1, KEYS, dj, &ndev, &nbytes, &nkeys), -E2BIG);
        }
        for (size_t k = 0; k < n; k++)
            free(dev[k].keys), free(cpu[k].keys);
    }
    free(cpu), free(dev), free(keys), free(dj), free(packed), free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_length), cmocka_unit_test(test_boundaries),
        cmocka_unit_test(test_random),       cmocka_unit_test(test_two_phases_equal_batch),
        cmocka_unit_test(test_packed_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
