/* SPDX-License-Identifier: Apache-2.0 */
/* The crossover of the hashing batcher: below it a job hashes sooner on the caller's CPU than
 * in a batch of one on the device, so it never waits for a batch. Measured once at start. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "hash_crossover.h"

#define SIZE_MIN 1024u
#define SIZE_MAX_ (1024u * 1024u)
#define BLOCK 64u
/* Minimum of a few runs after one warm-up: the first run pays for cold caches (and on a GPU for
 * lazy module loading), and the minimum is what a quiet machine gives. With the stand-in the
 * whole measure took 2-3 ms with no finish delay, 15 ms with 1 ms (gcc -O2, 2 cores). */
#define RUNS 5

static uint64_t time_cpu(kvg_hash_job *job)
{
    uint64_t t0 = kvg_now_ns();
    kvg_hash_batch(job, 1);
    return kvg_now_ns() - t0;
}

/* UINT64_MAX when the device failed. */
static uint64_t time_device(kvg_hash_device *dev, kvg_hash_job *job, uint64_t *errors)
{
    uint64_t t0 = kvg_now_ns();
    int rc = dev->ops->launch(dev, 0, job, 1);
    if (rc == 0)
        rc = dev->ops->finish(dev, 0);
    uint64_t dt = kvg_now_ns() - t0;
    if (rc < 0) {
        (*errors)++;
        return UINT64_MAX;
    }
    return dt;
}

uint64_t kvg_hash_crossover_measure(kvg_hash_device *dev, uint64_t *errors)
{
    unsigned char *data = malloc(SIZE_MAX_);
    uint64_t *keys = malloc(SIZE_MAX_ / BLOCK * sizeof(uint64_t));
    uint64_t crossover = UINT64_MAX;
    if (!data || !keys) {
        kvg_log_warn("hash crossover: out of memory: every job hashes on the CPU");
        goto out;
    }
    /* Any bytes do: the hash's time does not depend on them. */
    for (size_t i = 0; i < SIZE_MAX_; i++)
        data[i] = (unsigned char)(i * 131u + (i >> 9));

    kvg_buf table;
    kvg_buf_init(&table);
    for (size_t size = SIZE_MIN; size <= SIZE_MAX_; size *= 4) {
        if (size > dev->max_batch_bytes || size / BLOCK > dev->max_batch_keys)
            break;
        kvg_hash_job job = {
            .unit = KVG_HASH_BYTES,
            .data = data,
            .len = size,
            .block_size = BLOCK,
            .max_blocks = (uint32_t)(size / BLOCK),
            .keys = keys,
        };
        /* Alternated, and in turns first, so that neither gains from the other's warm caches
         * or a slow spell of the machine. A clear loss needs no more runs: a slow device
         * (the stand-in's finish delay) then costs two runs per size, not RUNS + 1. */
        uint64_t cpu = UINT64_MAX, gpu = UINT64_MAX;
        for (int r = 0; r <= RUNS; r++) {
            uint64_t c, g;
            if (r & 1) {
                g = time_device(dev, &job, errors);
                c = time_cpu(&job);
            } else {
                c = time_cpu(&job);
                g = time_device(dev, &job, errors);
            }
            if (!r) /* the warm-up */
                continue;
            cpu = KVG_MIN(cpu, c);
            gpu = KVG_MIN(gpu, g);
            if (gpu != UINT64_MAX && gpu / 2 > cpu)
                break;
        }
        if (gpu == UINT64_MAX)
            kvg_buf_printf(&table, " %zu: cpu %.1f us, device failed;", size, (double)cpu / 1e3);
        else
            kvg_buf_printf(&table, " %zu: cpu %.1f us, device %.1f us;", size, (double)cpu / 1e3,
                           (double)gpu / 1e3);
        /* A clear win only: near a tie, run-to-run noise (over 10% at 1 MiB under the
         * sanitizers) would decide, and a queued job also waits for its batch to close. */
        if (gpu != UINT64_MAX && gpu < cpu - cpu / 10) {
            crossover = size;
            break;
        }
    }
    if (crossover == UINT64_MAX)
        kvg_log_info("hash crossover (%s):%s the device never wins: every job hashes on the CPU",
                     dev->name, table.failed || !table.data ? "" : table.data);
    else
        kvg_log_info("hash crossover (%s):%s jobs of %llu bytes and more go to the device",
                     dev->name, table.failed || !table.data ? "" : table.data,
                     (unsigned long long)crossover);
    kvg_buf_done(&table);
out:
    free(keys);
    free(data);
    return crossover;
}
