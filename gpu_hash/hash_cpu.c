/* SPDX-License-Identifier: Apache-2.0 */
/* The CPU backend of block-key hashing (docs/hashing.md): each full block hashed alone with
 * XXH3-64 seeded by the root, the hashes then chained by a multiply-fold. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "gpu_hash.h"
#include "xxh3_hd.h"

/* The root's preimage starts with this tag, so a future change of the function can change
 * the tag and never collide with keys of this one. */
#define ROOT_TAG "kvgate-block-v2"

static const char *const unit_names[KVG_HASH_UNIT_COUNT] = {
    [KVG_HASH_BYTES] = "bytes",
    [KVG_HASH_TOKENS] = "tokens",
};

const char *kvg_hash_unit_str(kvg_hash_unit u)
{
    return (unsigned)u < KVG_HASH_UNIT_COUNT ? unit_names[u] : "?";
}

static unsigned char *le32_at(unsigned char *o, uint32_t v)
{
    o[0] = (unsigned char)v, o[1] = (unsigned char)(v >> 8);
    o[2] = (unsigned char)(v >> 16), o[3] = (unsigned char)(v >> 24);
    return o + 4;
}

static void put_le32(XXH3_state_t *st, uint32_t v)
{
    unsigned char b[4];
    le32_at(b, v);
    XXH3_64bits_update(st, b, sizeof(b));
}

/* A length-prefixed field: no two (salt, model, adapter) triples give the same preimage. */
static void put_field(XXH3_state_t *st, const char *s, size_t len)
{
    put_le32(st, (uint32_t)len);
    if (len)
        XXH3_64bits_update(st, s, len);
}

/* The preimage in one buffer, when it fits: one XXH3 call over it gives the same digest as the
 * streaming state at a quarter of the time (~110 ns per request saved). */
#define ROOT_STACK 512

static unsigned char *field_at(unsigned char *o, const char *s, size_t len)
{
    o = le32_at(o, (uint32_t)len);
    if (len)
        memcpy(o, s, len);
    return o + len;
}

uint64_t kvg_hash_root(const kvg_hash_job *job)
{
    size_t need = sizeof(ROOT_TAG) + 4 * 5 + job->salt_len + job->model_len + job->adapter_len;
    if (need <= ROOT_STACK) {
        unsigned char buf[ROOT_STACK];
        memcpy(buf, ROOT_TAG, sizeof(ROOT_TAG)); /* with its NUL */
        unsigned char *o = buf + sizeof(ROOT_TAG);
        o = le32_at(o, (uint32_t)job->unit);
        o = le32_at(o, job->block_size);
        o = field_at(o, job->salt, job->salt_len);
        o = field_at(o, job->model, job->model_len);
        o = field_at(o, job->adapter, job->adapter_len);
        return XXH3_64bits(buf, (size_t)(o - buf));
    }
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, ROOT_TAG, sizeof(ROOT_TAG));
    put_le32(&st, (uint32_t)job->unit);
    put_le32(&st, job->block_size);
    put_field(&st, job->salt, job->salt_len);
    put_field(&st, job->model, job->model_len);
    put_field(&st, job->adapter, job->adapter_len);
    return XXH3_64bits_digest(&st);
}

bool kvg_hash_job_valid(const kvg_hash_job *j)
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

/* link(a) = lo64(a * P) ^ hi64(a * P), the full 128-bit product, P = XXH_PRIME64_1: XXH3's own
 * fold, written once for the CPU and the GPU (xxh3_hd.h). The only serial step of the chain:
 * one multiply and two XORs, a few cycles. */
static inline uint64_t link_key(uint64_t a)
{
    return kvg_hd_link(a);
}

/* key[i] = link(key[i-1] ^ d[i]) over n blocks of w bytes, d[i] = XXH3(block i, seed root) and
 * key[-1] = root. No d[i] waits for a key, so the CPU hashes the next blocks while a link is
 * in flight: this simple loop overlaps them (unrolled batches of four were no faster with gcc
 * and slower with clang; all d first, then all links, slower with both). Inlined twice: with
 * w the constant 64, XXH3 drops its length dispatch. */
static inline void chain(const unsigned char *p, size_t w, size_t n, uint64_t root, uint64_t *keys)
{
    uint64_t h = root;
    for (size_t i = 0; i < n; i++) {
        h = link_key(h ^ XXH3_64bits_withSeed(p + i * w, w, root));
        keys[i] = h;
    }
}

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
/* Token ids are hashed as little-endian uint32: on a big-endian host each block is swapped
 * through XXH3's streaming state, so keys never depend on the machine. */
static void chain_tokens_swapped(const uint32_t *t, uint32_t block, size_t n, uint64_t root,
                                 uint64_t *keys)
{
    uint64_t h = root;
    for (size_t i = 0; i < n; i++, t += block) {
        XXH3_state_t st;
        XXH3_64bits_reset_withSeed(&st, root);
        for (uint32_t k = 0; k < block; k++) {
            uint32_t v = __builtin_bswap32(t[k]);
            XXH3_64bits_update(&st, &v, 4);
        }
        h = link_key(h ^ XXH3_64bits_digest(&st));
        keys[i] = h;
    }
}
#endif

int kvg_hash_batch(kvg_hash_job *jobs, size_t n)
{
    if (n && !jobs)
        return -EINVAL;
    for (size_t k = 0; k < n; k++)
        if (!kvg_hash_job_valid(&jobs[k]))
            return -EINVAL;
    for (size_t k = 0; k < n; k++) {
        kvg_hash_job *j = &jobs[k];
        size_t blocks = j->len / j->block_size;
        if (blocks > j->max_blocks)
            blocks = j->max_blocks;
        j->nkeys = (uint32_t)blocks;
        if (!blocks)
            continue;
        uint64_t root = kvg_hash_root(j);
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
        if (j->unit == KVG_HASH_TOKENS) {
            chain_tokens_swapped(j->data, j->block_size, blocks, root, j->keys);
            continue;
        }
#endif
        /* Token ids are little-endian uint32 here already: a block of either unit is bytes. */
        size_t w = j->unit == KVG_HASH_TOKENS ? (size_t)j->block_size * 4 : j->block_size;
        if (w == 64) /* the default: 64 text bytes, or 16 tokens */
            chain(j->data, 64, blocks, root, j->keys);
        else
            chain(j->data, w, blocks, root, j->keys);
    }
    return 0;
}

const char *kvg_hash_backend(void)
{
    return "cpu";
}
