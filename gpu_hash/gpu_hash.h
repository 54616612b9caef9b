/* SPDX-License-Identifier: Apache-2.0 */
/* Block keys: the chained hashes that name a request's prefix blocks (docs/hashing.md). The
 * interface takes batches so that a GPU backend can take a whole batch in one launch; callers
 * never know which backend ran. */
#ifndef KVG_GPU_HASH_H
#define KVG_GPU_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kvg_hash_unit {
    KVG_HASH_BYTES = 0, /* data is canonical text; block_size counts bytes */
    KVG_HASH_TOKENS,    /* data is uint32_t token ids; block_size counts tokens */
    KVG_HASH_UNIT_COUNT,
} kvg_hash_unit;

const char *kvg_hash_unit_str(kvg_hash_unit u);

/* Largest block size, in bytes or tokens. */
#define KVG_HASH_BLOCK_MAX 65536u

/* One request's hashing: the inputs, and the keys out. */
typedef struct kvg_hash_job {
    const char *salt; /* scope salt; salt_len 0 = none */
    size_t salt_len;
    const char *model; /* model name as the request gives it; model_len 0 = none */
    size_t model_len;
    const char *adapter; /* LoRA adapter; adapter_len 0 = none */
    size_t adapter_len;
    kvg_hash_unit unit;
    const void *data; /* len bytes, or len tokens (uint32_t) */
    size_t len;
    uint32_t block_size; /* 1..KVG_HASH_BLOCK_MAX */
    uint32_t max_blocks; /* keys wanted at most */
    uint64_t *keys;      /* room for max_blocks keys */
    uint32_t nkeys;      /* out: min(len / block_size, max_blocks) */
} kvg_hash_job;

/** The root of a job's chain: a function of (salt, model, adapter, unit, block_size) alone. */
uint64_t kvg_hash_root(const kvg_hash_job *job);
/** Whether kvg_hash_batch accepts job (the rules below); for callers that queue a job before
 *  it is hashed and must refuse it at once. */
bool kvg_hash_job_valid(const kvg_hash_job *job);
/** Fill keys and nkeys of each job: d[i] = XXH3(block i, seed root), key[0] = link(root ^ d[0]),
 *  key[i] = link(key[i-1] ^ d[i]), full blocks only (docs/hashing.md). 0, or -EINVAL (a job
 *  with block_size 0 or above KVG_HASH_BLOCK_MAX, an unknown unit, or data/keys NULL where
 *  needed; no job is hashed). */
int kvg_hash_batch(kvg_hash_job *jobs, size_t n);
/** The backend that hashes ("cpu", or "cuda" when built with one and a device is present). */
const char *kvg_hash_backend(void);

#endif
