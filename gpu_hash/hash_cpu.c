/* SPDX-License-Identifier: Apache-2.0 */
/* The CPU backend of block-key hashing: XXH3-64 chained over full blocks (docs/hashing.md). */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "gpu_hash.h"

/* The root's preimage starts with this tag, so a future change of the function can change
 * the tag and never collide with keys of this one. */
#define ROOT_TAG "kvgate-block-v1"

static const char *const unit_names[KVG_HASH_UNIT_COUNT] = {
    [KVG_HASH_BYTES] = "bytes",
    [KVG_HASH_TOKENS] = "tokens",
};

const char *kvg_hash_unit_str(kvg_hash_unit u)
{
    return (unsigned)u < KVG_HASH_UNIT_COUNT ? unit_names[u] : "?";
}

static void put_le32(XXH3_state_t *st, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    XXH3_64bits_update(st, b, sizeof(b));
}

/* A length-prefixed field: no two (salt, model, adapter) triples give the same preimage. */
static void put_field(XXH3_state_t *st, const char *s, size_t len)
{
    put_le32(st, (uint32_t)len);
    if (len)
        XXH3_64bits_update(st, s, len);
}

uint64_t kvg_hash_root(const kvg_hash_job *job)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, ROOT_TAG, sizeof(ROOT_TAG)); /* with its NUL */
    put_le32(&st, (uint32_t)job->unit);
    put_le32(&st, job->block_size);
    put_field(&st, job->salt, job->salt_len);
    put_field(&st, job->model, job->model_len);
    put_field(&st, job->adapter, job->adapter_len);
    return XXH3_64bits_digest(&st);
}

static bool job_valid(const kvg_hash_job *j)
{
    if ((unsigned)j->unit >= KVG_HASH_UNIT_COUNT || j->block_size == 0 ||
        j->block_size > KVG_HASH_BLOCK_MAX)
        return false;
    if ((j->salt_len && !j->salt) || (j->model_len && !j->model) || (j->adapter_len && !j->adapter))
        return false;
    if (j->salt_len > UINT32_MAX || j->model_len > UINT32_MAX || j->adapter_len > UINT32_MAX)
        return false;
    size_t blocks = j->len / j->block_size;
    if (blocks && j->max_blocks && (!j->data || !j->keys))
        return false;
    return true;
}

/* Token ids are hashed as little-endian uint32: on a big-endian host each block is swapped
 * into a scratch buffer first, so keys never depend on the machine. */
static uint64_t hash_block(const kvg_hash_job *j, size_t i, uint64_t seed)
{
    if (j->unit == KVG_HASH_BYTES) {
        const unsigned char *p = (const unsigned char *)j->data + i * j->block_size;
        /* The default size as a constant: the inlined XXH3 drops its length dispatch. */
        if (j->block_size == 64)
            return XXH3_64bits_withSeed(p, 64, seed);
        return XXH3_64bits_withSeed(p, j->block_size, seed);
    }
    const uint32_t *t = (const uint32_t *)j->data + i * j->block_size;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return XXH3_64bits_withSeed(t, (size_t)j->block_size * 4, seed);
#else
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, seed);
    for (uint32_t k = 0; k < j->block_size; k++) {
        uint32_t v = __builtin_bswap32(t[k]);
        XXH3_64bits_update(&st, &v, 4);
    }
    return XXH3_64bits_digest(&st);
#endif
}

int kvg_hash_batch(kvg_hash_job *jobs, size_t n)
{
    if (n && !jobs)
        return -EINVAL;
    for (size_t k = 0; k < n; k++)
        if (!job_valid(&jobs[k]))
            return -EINVAL;
    for (size_t k = 0; k < n; k++) {
        kvg_hash_job *j = &jobs[k];
        size_t blocks = j->len / j->block_size;
        if (blocks > j->max_blocks)
            blocks = j->max_blocks;
        uint64_t h = blocks ? kvg_hash_root(j) : 0;
        for (size_t i = 0; i < blocks; i++) {
            h = hash_block(j, i, h);
            j->keys[i] = h;
        }
        j->nkeys = (uint32_t)blocks;
    }
    return 0;
}

const char *kvg_hash_backend(void)
{
    return "cpu";
}
