/* SPDX-License-Identifier: Apache-2.0 */
/* The pieces cache: token ids of text pieces between added tokens, shared by every thread that
 * encodes with one tokenizer, bounded in bytes with an LRU per shard. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common.h"
#include "token_cache.h"

#define SHARDS 64
#define BUCKETS 1024 /* per shard, chained */

typedef struct entry {
    XXH128_hash_t key;
    size_t len; /* of the piece, a second check */
    struct entry *chain;
    struct entry *prev, *next; /* LRU: head most recent */
    uint32_t n;
    uint32_t ids[];
} entry;

typedef struct shard {
    pthread_mutex_t lock;
    entry *buckets[BUCKETS];
    entry *head, *tail;
    size_t bytes;
} shard;

struct kvg_tokenizer_cache {
    size_t max_shard_bytes;
    uint64_t seed; /* random per cache: nobody outside can aim at a key */
    _Atomic uint64_t hits, misses;
    shard shards[SHARDS];
};

int kvg_tokenizer_cache_new(size_t max_bytes, kvg_tokenizer_cache **out)
{
    *out = NULL;
    kvg_tokenizer_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->max_shard_bytes = max_bytes / SHARDS;
    int rc = kvg_random_bytes(&c->seed, sizeof(c->seed));
    if (rc < 0) {
        free(c);
        return rc;
    }
    for (int i = 0; i < SHARDS; i++)
        pthread_mutex_init(&c->shards[i].lock, NULL);
    *out = c;
    return 0;
}

void kvg_tokenizer_cache_free(kvg_tokenizer_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < SHARDS; i++) {
        for (entry *e = c->shards[i].head, *next; e; e = next) {
            next = e->next;
            free(e);
        }
        pthread_mutex_destroy(&c->shards[i].lock);
    }
    free(c);
}

void kvg_tokenizer_cache_stats(const kvg_tokenizer_cache *c, uint64_t *hits, uint64_t *misses,
                               size_t *bytes)
{
    *hits = c ? atomic_load_explicit(&c->hits, memory_order_relaxed) : 0;
    *misses = c ? atomic_load_explicit(&c->misses, memory_order_relaxed) : 0;
    size_t b = 0;
    for (int i = 0; c && i < SHARDS; i++) {
        shard *s = (shard *)&c->shards[i];
        pthread_mutex_lock(&s->lock);
        b += s->bytes;
        pthread_mutex_unlock(&s->lock);
    }
    *bytes = b;
}

kvg_piece_key kvg_piece_key_of(const kvg_tokenizer_cache *c, const void *scope, size_t scope_len,
                               const char *piece, size_t len)
{
    /* The scope goes into the key: pieces are shared only within a cache scope, so that one
     * tenant cannot learn from the gateway's timing what another one sent. */
    uint64_t seed = XXH3_64bits_withSeed(scope, scope_len, c->seed);
    XXH128_hash_t h = XXH3_128bits_withSeed(piece, len, seed);
    return (kvg_piece_key){.lo = h.low64, .hi = h.high64, .len = len};
}

static shard *shard_of(kvg_tokenizer_cache *c, const kvg_piece_key *k)
{
    return &c->shards[k->lo % SHARDS];
}

static entry **bucket_of(shard *s, const kvg_piece_key *k)
{
    return &s->buckets[(k->lo / SHARDS) % BUCKETS];
}

static void lru_unlink(shard *s, entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        s->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->tail = e->prev;
}

static void lru_push(shard *s, entry *e)
{
    e->prev = NULL;
    e->next = s->head;
    if (s->head)
        s->head->prev = e;
    s->head = e;
    if (!s->tail)
        s->tail = e;
}

static entry *find(shard *s, const kvg_piece_key *k, entry ***link)
{
    entry **l = bucket_of(s, k);
    for (; *l; l = &(*l)->chain) {
        entry *e = *l;
        if (e->key.low64 == k->lo && e->key.high64 == k->hi && e->len == k->len) {
            if (link)
                *link = l;
            return e;
        }
    }
    return NULL;
}

int kvg_tokenizer_cache_get(kvg_tokenizer_cache *c, const kvg_piece_key *k,
                            int (*take)(void *ud, const uint32_t *ids, size_t n), void *ud)
{
    shard *s = shard_of(c, k);
    pthread_mutex_lock(&s->lock);
    entry *e = find(s, k, NULL);
    int rc = 0;
    if (e) {
        lru_unlink(s, e);
        lru_push(s, e);
        rc = take(ud, e->ids, e->n); /* under the lock: the entry may go as soon as it drops */
        rc = rc < 0 ? rc : 1;
    }
    pthread_mutex_unlock(&s->lock);
    atomic_fetch_add_explicit(e ? &c->hits : &c->misses, 1, memory_order_relaxed);
    return rc;
}

static size_t entry_bytes(size_t n)
{
    return sizeof(entry) + n * sizeof(uint32_t);
}

static void evict(shard *s, entry *e)
{
    entry **l = NULL;
    find(s, &(kvg_piece_key){.lo = e->key.low64, .hi = e->key.high64, .len = e->len}, &l);
    *l = e->chain;
    lru_unlink(s, e);
    s->bytes -= entry_bytes(e->n);
    free(e);
}

void kvg_tokenizer_cache_put(kvg_tokenizer_cache *c, const kvg_piece_key *k, const uint32_t *ids,
                             size_t n)
{
    size_t bytes = entry_bytes(n);
    if (bytes > c->max_shard_bytes / 4)
        return; /* one piece may not take a shard */
    entry *e = malloc(bytes);
    if (!e)
        return; /* a cache: nothing is lost but time */
    e->key = (XXH128_hash_t){.low64 = k->lo, .high64 = k->hi};
    e->len = k->len;
    e->n = (uint32_t)n;
    memcpy(e->ids, ids, n * sizeof(uint32_t));
    shard *s = shard_of(c, k);
    pthread_mutex_lock(&s->lock);
    if (find(s, k, NULL)) { /* another thread put it meanwhile */
        pthread_mutex_unlock(&s->lock);
        free(e);
        return;
    }
    while (s->tail && s->bytes + bytes > c->max_shard_bytes)
        evict(s, s->tail);
    entry **b = bucket_of(s, k);
    e->chain = *b;
    *b = e;
    lru_push(s, e);
    s->bytes += bytes;
    pthread_mutex_unlock(&s->lock);
}
