/* SPDX-License-Identifier: Apache-2.0 */
/* The simulated engine's KV block pool, modelled on vLLM v1's BlockPool: refcounted blocks,
 * a hash table of cached full blocks, and an LRU list of unreferenced blocks. Pure: no I/O. */
#include "simworker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

typedef struct block {
    sim_hash hash;
    uint32_t refs;
    uint32_t prev, next; /* LRU links; valid while free */
    uint32_t hnext;      /* hash chain; valid while cached */
    bool cached;
    bool free;
} block;

struct sim_kvcache {
    block *blocks;
    uint32_t *buckets; /* head block of each chain, NONE when empty */
    uint32_t bucket_mask;
    uint32_t n;
    uint32_t n_free;
    uint32_t n_cached;
    uint32_t head, tail; /* LRU: head is evicted first */
    uint64_t evictions;
    sim_kvcache_evict_cb evict_cb;
    void *evict_arg;
};

int sim_kvcache_new(uint32_t num_blocks, sim_kvcache **out)
{
    if (num_blocks == 0 || num_blocks > SIM_MAX_KV_BLOCKS)
        return -EINVAL;
    sim_kvcache *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return -ENOMEM;
    /* At most one table entry per block, so the table is bounded by the pool: a power of two
     * at least as large keeps chains short. */
    uint32_t nb = 1;
    while (nb < num_blocks)
        nb <<= 1;
    kv->blocks = calloc(num_blocks, sizeof(*kv->blocks));
    if (!kv->blocks)
        goto fail_kv;
    kv->buckets = malloc((size_t)nb * sizeof(*kv->buckets));
    if (!kv->buckets)
        goto fail_blocks;
    for (uint32_t i = 0; i < nb; i++)
        kv->buckets[i] = NONE;
    kv->bucket_mask = nb - 1;
    kv->n = num_blocks;
    for (uint32_t i = 0; i < num_blocks; i++) {
        block *b = &kv->blocks[i];
        b->prev = i ? i - 1 : NONE;
        b->next = i + 1 < num_blocks ? i + 1 : NONE;
        b->hnext = NONE;
        b->free = true;
    }
    kv->head = 0;
    kv->tail = num_blocks - 1;
    kv->n_free = num_blocks;
    *out = kv;
    return 0;

fail_blocks:
    free(kv->blocks);
fail_kv:
    free(kv);
    return -ENOMEM;
}

void sim_kvcache_free(sim_kvcache *kv)
{
    if (!kv)
        return;
    free(kv->buckets);
    free(kv->blocks);
    free(kv);
}

uint32_t sim_kvcache_num_blocks(const sim_kvcache *kv)
{
    return kv->n;
}

uint32_t sim_kvcache_num_free(const sim_kvcache *kv)
{
    return kv->n_free;
}

uint32_t sim_kvcache_num_cached(const sim_kvcache *kv)
{
    return kv->n_cached;
}

uint64_t sim_kvcache_evictions(const sim_kvcache *kv)
{
    return kv->evictions;
}

uint32_t sim_kvcache_block_refs(const sim_kvcache *kv, uint32_t id)
{
    return id < kv->n ? kv->blocks[id].refs : 0;
}

/* ---- hash table ----------------------------------------------------------------------------- */

static uint32_t bucket_of(const sim_kvcache *kv, const sim_hash *h)
{
    /* SHA-256 output is uniform, so any four bytes make a good index. */
    uint32_t x = (uint32_t)h->b[0] | (uint32_t)h->b[1] << 8 | (uint32_t)h->b[2] << 16 |
                 (uint32_t)h->b[3] << 24;
    return x & kv->bucket_mask;
}

static uint32_t find(const sim_kvcache *kv, const sim_hash *h)
{
    for (uint32_t id = kv->buckets[bucket_of(kv, h)]; id != NONE; id = kv->blocks[id].hnext)
        if (memcmp(kv->blocks[id].hash.b, h->b, sizeof(h->b)) == 0)
            return id;
    return NONE;
}

static void table_insert(sim_kvcache *kv, uint32_t id, const sim_hash *h)
{
    block *b = &kv->blocks[id];
    uint32_t bi = bucket_of(kv, h);
    b->hash = *h;
    b->hnext = kv->buckets[bi];
    kv->buckets[bi] = id;
    b->cached = true;
    kv->n_cached++;
}

static void table_remove(sim_kvcache *kv, uint32_t id)
{
    block *b = &kv->blocks[id];
    uint32_t *link = &kv->buckets[bucket_of(kv, &b->hash)];
    while (*link != NONE && *link != id)
        link = &kv->blocks[*link].hnext;
    if (*link == id)
        *link = b->hnext;
    b->hnext = NONE;
    b->cached = false;
    kv->n_cached--;
}

/* ---- LRU list ------------------------------------------------------------------------------- */

static void lru_unlink(sim_kvcache *kv, uint32_t id)
{
    block *b = &kv->blocks[id];
    if (b->prev != NONE)
        kv->blocks[b->prev].next = b->next;
    else
        kv->head = b->next;
    if (b->next != NONE)
        kv->blocks[b->next].prev = b->prev;
    else
        kv->tail = b->prev;
    b->prev = b->next = NONE;
    b->free = false;
    kv->n_free--;
}

static void lru_append(sim_kvcache *kv, uint32_t id)
{
    block *b = &kv->blocks[id];
    b->prev = kv->tail;
    b->next = NONE;
    if (kv->tail != NONE)
        kv->blocks[kv->tail].next = id;
    else
        kv->head = id;
    kv->tail = id;
    b->free = true;
    kv->n_free++;
}

/* ---- requests ------------------------------------------------------------------------------- */

uint32_t sim_kvcache_match(const sim_kvcache *kv, const sim_hash *hashes, uint32_t n)
{
    uint32_t i = 0;
    while (i < n && find(kv, &hashes[i]) != NONE)
        i++;
    return i;
}

int sim_kvcache_acquire(sim_kvcache *kv, const sim_hash *hashes, uint32_t hit, uint32_t total,
                        uint32_t *ids)
{
    if (hit > total)
        return -EINVAL;
    /* Check first so that a request that does not fit changes nothing. Hit blocks that sit on
     * the LRU list are leaving it, so they do not count as room for fresh blocks. */
    uint32_t hit_free = 0;
    for (uint32_t i = 0; i < hit; i++) {
        uint32_t id = find(kv, &hashes[i]);
        if (id == NONE)
            return -EINVAL;
        ids[i] = id;
        if (kv->blocks[id].refs == 0)
            hit_free++;
    }
    if ((uint64_t)(total - hit) + hit_free > kv->n_free)
        return KVG_ELIMIT;
    for (uint32_t i = 0; i < hit; i++) {
        block *b = &kv->blocks[ids[i]];
        if (b->refs++ == 0)
            lru_unlink(kv, ids[i]);
    }
    for (uint32_t i = hit; i < total; i++) {
        uint32_t id = kv->head;
        lru_unlink(kv, id);
        if (kv->blocks[id].cached) {
            if (kv->evict_cb)
                kv->evict_cb(kv->evict_arg, &kv->blocks[id].hash);
            table_remove(kv, id);
            kv->evictions++;
        }
        kv->blocks[id].refs = 1;
        ids[i] = id;
    }
    return 0;
}

void sim_kvcache_commit(sim_kvcache *kv, const uint32_t *ids, const sim_hash *hashes, uint32_t from,
                        uint32_t to)
{
    for (uint32_t i = from; i < to; i++) {
        uint32_t id = ids[i];
        if (id < kv->n && !kv->blocks[id].cached)
            table_insert(kv, id, &hashes[i]);
    }
}

void sim_kvcache_release(sim_kvcache *kv, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = n; i-- > 0;) {
        uint32_t id = ids[i];
        if (id >= kv->n || kv->blocks[id].refs == 0)
            continue; /* programmer error; keep the pool consistent rather than corrupt it */
        if (--kv->blocks[id].refs == 0)
            lru_append(kv, id);
    }
}

void sim_kvcache_set_evict_cb(sim_kvcache *kv, sim_kvcache_evict_cb cb, void *arg)
{
    kv->evict_cb = cb;
    kv->evict_arg = arg;
}

int sim_kvcache_reset(sim_kvcache *kv)
{
    /* vLLM refuses too while a request holds blocks: their hashes would go stale under it. */
    if (kv->n_free != kv->n)
        return -EBUSY;
    for (uint32_t id = 0; id < kv->n; id++)
        if (kv->blocks[id].cached)
            table_remove(kv, id);
    return 0;
}
