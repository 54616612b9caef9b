/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's keys against kvg_hash_batch's, through the device ops (launch, finish):
 * edge lengths, every kind of block size, salts, and batches of 1 to 4096 jobs. Without a
 * device (or a build without CUDA) it prints why and exits 77, which meson reports as SKIP.
 * Plain C with its own checks, no cmocka: bench/gpu/run.sh builds it on the device machine,
 * whose image has CUDA and a C compiler but none of the project's Debian libraries. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_hash.h"
#include "hash_device.h"

/* A failed check: what and where, then exit 1 (the test is a process: nothing to unwind). */
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                            \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            FAIL("check failed: %s", #cond);                                                       \
    } while (0)
#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            FAIL("%s == %lld, expected %s == %lld", #a, a_, #b, b_);                               \
    } while (0)

#define DATA_BYTES (8u << 20)

static kvg_hash_device *dev;
static unsigned char *data;

static uint64_t rng_state = 0x6375646171ull;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* jobs[0..n) on the device in slot, and the same jobs on the CPU: equal nkeys and keys. */
static void check_batch(kvg_hash_job *jobs, size_t n, unsigned slot)
{
    kvg_hash_job *cpu = malloc(sizeof(*cpu) * (n ? n : 1));
    CHECK(cpu != NULL);
    for (size_t k = 0; k < n; k++) {
        cpu[k] = jobs[k];
        cpu[k].keys = malloc(sizeof(uint64_t) * (jobs[k].max_blocks ? jobs[k].max_blocks : 1));
        CHECK(cpu[k].keys != NULL);
        jobs[k].nkeys = UINT32_MAX; /* finish must set it */
    }
    CHECK_EQ(kvg_hash_batch(cpu, n), 0);
    CHECK_EQ(dev->ops->launch(dev, slot, jobs, n), 0);
    CHECK_EQ(dev->ops->finish(dev, slot), 0);
    for (size_t k = 0; k < n; k++) {
        CHECK_EQ(jobs[k].nkeys, cpu[k].nkeys);
        for (uint32_t i = 0; i < cpu[k].nkeys; i++)
            if (jobs[k].keys[i] != cpu[k].keys[i])
                FAIL("job %zu of %zu (unit %d, block %u, len %zu): key %u %016llx, cpu %016llx", k,
                     n, (int)jobs[k].unit, jobs[k].block_size, jobs[k].len, i,
                     (unsigned long long)jobs[k].keys[i], (unsigned long long)cpu[k].keys[i]);
        free(cpu[k].keys);
    }
    free(cpu);
}

static kvg_hash_job make_job(kvg_hash_unit unit, uint32_t block, size_t len, uint32_t max_blocks,
                             int scoped)
{
    size_t unit_bytes = unit == KVG_HASH_TOKENS ? 4 : 1;
    size_t bytes = len * unit_bytes;
    CHECK(bytes <= DATA_BYTES);
    /* Any start for text (misaligned blocks take the device's byte loads), 4-aligned tokens. */
    size_t off = (size_t)(rng() % (DATA_BYTES - bytes + 1));
    off -= off % unit_bytes;
    kvg_hash_job j = {
        .unit = unit,
        .data = data + off,
        .len = len,
        .block_size = block,
        .max_blocks = max_blocks,
        .keys = malloc(sizeof(uint64_t) * (max_blocks ? max_blocks : 1)),
    };
    CHECK(j.keys != NULL);
    if (scoped) {
        j.salt = "kvgate-test-salt", j.salt_len = 16;
        j.model = "demo-model", j.model_len = 10;
        j.adapter = scoped > 1 ? "lora-1" : NULL, j.adapter_len = scoped > 1 ? 6 : 0;
    }
    return j;
}

static void free_jobs(kvg_hash_job *jobs, size_t n)
{
    for (size_t k = 0; k < n; k++)
        free(jobs[k].keys);
}

/* Empty, shorter than a block, exact multiples, one past, the max_blocks cut, max_blocks 0. */
static void test_edges(void)
{
    kvg_hash_job j[8] = {
        make_job(KVG_HASH_BYTES, 64, 0, 16, 0),   make_job(KVG_HASH_BYTES, 64, 63, 16, 1),
        make_job(KVG_HASH_BYTES, 64, 64, 16, 2),  make_job(KVG_HASH_BYTES, 64, 640, 16, 0),
        make_job(KVG_HASH_BYTES, 64, 641, 16, 1), make_job(KVG_HASH_BYTES, 64, 64 * 40, 16, 2),
        make_job(KVG_HASH_TOKENS, 16, 160, 0, 1), make_job(KVG_HASH_TOKENS, 16, 15, 16, 0),
    };
    for (size_t k = 0; k < 8; k++)
        check_batch(&j[k], 1, 0); /* alone */
    check_batch(j, 8, 1);         /* together, in the other slot */
    free_jobs(j, 8);
}

/* Block sizes 16, 64, 100, 4096 and 65536, both units, each scope: every XXH3 length class of
 * the kernel (64 bytes: 17-128; 100 and 16 tokens: 129-240 and 17-128; the rest the long path,
 * up to 256 KiB blocks). */
static void test_block_sizes(void)
{
    static const uint32_t sizes[] = {1, 3, 5, 16, 64, 100, 4096, 65536};
    kvg_hash_job j[2 * 8 * 3];
    size_t n = 0;
    for (int unit = 0; unit < 2; unit++)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
            for (int scoped = 0; scoped < 3; scoped++) {
                uint32_t b = sizes[s];
                size_t ub = unit ? 4 : 1, max_len = DATA_BYTES / 4 / ub;
                size_t len = (size_t)b * (1 + rng() % 8) + rng() % b;
                if (len > max_len)
                    len = max_len;
                j[n++] = make_job((kvg_hash_unit)unit, b, len, 4096, scoped);
            }
    check_batch(j, n, 0);
    free_jobs(j, n);
}

/* 100k blocks in one job: the longest chain, one device thread. */
static void test_100k_blocks(void)
{
    kvg_hash_job j = make_job(KVG_HASH_BYTES, 16, 100000 * 16 + 7, 100000, 1);
    check_batch(&j, 1, 0);
    kvg_hash_job t = make_job(KVG_HASH_TOKENS, 16, 100000 * 16, 100000, 2);
    check_batch(&t, 1, 1);
    free_jobs(&j, 1);
    free_jobs(&t, 1);
}

/* A full batch of 4096 jobs of random shape, then one of 1; both slots in flight at once. */
static void test_big_batches(void)
{
    static const uint32_t sizes[] = {16, 64, 100, 256};
    size_t n = 4096;
    kvg_hash_job *j = malloc(sizeof(*j) * n);
    CHECK(j != NULL);
    for (size_t k = 0; k < n; k++) {
        kvg_hash_unit u = (rng() & 1) ? KVG_HASH_TOKENS : KVG_HASH_BYTES;
        uint32_t b = sizes[rng() % 4];
        j[k] = make_job(u, b, (size_t)(rng() % (b * 24)), (uint32_t)(rng() % 20), (int)(rng() % 3));
    }
    check_batch(j, n, 1);
    check_batch(j, 1, 0);

    /* Two batches in flight: launch both, finish in the other order. */
    kvg_hash_job *cpu = malloc(sizeof(*cpu) * n);
    CHECK(cpu != NULL);
    for (size_t k = 0; k < n; k++) {
        cpu[k] = j[k];
        cpu[k].keys = malloc(sizeof(uint64_t) * (j[k].max_blocks ? j[k].max_blocks : 1));
        CHECK(cpu[k].keys != NULL);
    }
    CHECK_EQ(kvg_hash_batch(cpu, n), 0);
    CHECK_EQ(dev->ops->launch(dev, 0, j, n / 2), 0);
    CHECK_EQ(dev->ops->launch(dev, 1, j + n / 2, n - n / 2), 0);
    CHECK_EQ(dev->ops->finish(dev, 1), 0);
    CHECK_EQ(dev->ops->finish(dev, 0), 0);
    for (size_t k = 0; k < n; k++) {
        CHECK_EQ(j[k].nkeys, cpu[k].nkeys);
        CHECK(memcmp(j[k].keys, cpu[k].keys, sizeof(uint64_t) * cpu[k].nkeys) == 0);
        free(cpu[k].keys);
    }
    free(cpu);
    free_jobs(j, n);
    free(j);
}

int main(void)
{
    char why[200] = "";
#ifdef KVG_EQUIV_STANDIN
    /* The harness itself, on every machine: against the CPU stand-in it must pass, and with
     * KVG_EQUIV_CORRUPT=N (the Nth batch silently one key wrong) it must fail. */
    const char *corrupt = getenv("KVG_EQUIV_CORRUPT");
    kvg_hash_standin_config sc = {.corrupt_finish_at = corrupt ? strtoull(corrupt, NULL, 10) : 0};
    int rc = kvg_hash_device_open_standin(&sc, &dev);
#else
    kvg_hash_device_config cfg = {0};
    int rc = kvg_hash_device_open_cuda(&cfg, &dev, why, sizeof(why));
#endif
    if (rc) {
        printf("SKIP: no CUDA backend here: %s\n", why);
        return 77;
    }
    printf("# %s\n", dev->description);
    data = malloc(DATA_BYTES);
    if (!data)
        return 1;
    for (size_t i = 0; i < DATA_BYTES; i++)
        data[i] = (unsigned char)rng();
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"edges", test_edges},
        {"block_sizes", test_block_sizes},
        {"100k_blocks", test_100k_blocks},
        {"big_batches", test_big_batches},
    };
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        tests[i].fn();
        printf("ok %zu - %s\n", i + 1, tests[i].name);
    }
    rc = 0;
    dev->ops->close(dev);
    free(data);
    return rc;
}
