/* SPDX-License-Identifier: Apache-2.0 */
/* Bump allocator: many small allocations, one free at the end of a request or a parse. */
#include "common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct kvg_arena_chunk {
    kvg_arena_chunk *next;
    size_t size;
    size_t used;
    _Alignas(16) unsigned char data[];
};

#define ARENA_DEFAULT_CHUNK 4096u
#define ARENA_ALIGN 16u

/*
 * Chunks of the two sizes requests use (an exchange's 4 KiB, an upstream request's 2 KiB) are
 * kept for reuse on the thread that freed them, up to CACHE_MAX each, on threads that ask for
 * it (kvg_arena_thread_cache: the gateway's event-loop threads): every proxied request made and
 * freed one of each, and glibc serves blocks of that size from its bins, not its per-thread
 * cache (callgrind, 2026-12-02: ~700 instructions a request in malloc and free). Elsewhere
 * (tests, tools) every chunk is a malloc, so that allocation-failure tests still reach the
 * arena's callers. A thread's cache is freed when the thread exits (a key destructor).
 */
#define CACHE_MAX 64u

typedef struct chunk_cache {
    kvg_arena_chunk *head[2]; /* [0] 2 KiB chunks, [1] 4 KiB */
    unsigned n[2];
    bool on;
} chunk_cache;

static _Thread_local chunk_cache cache;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static pthread_key_t cache_key;
static bool cache_keyed; /* the key exists: caching can be on */

static void cache_drain(void *unused)
{
    (void)unused;
    cache.on = false;
    for (size_t i = 0; i < 2; i++) {
        while (cache.head[i]) {
            kvg_arena_chunk *c = cache.head[i];
            cache.head[i] = c->next;
            free(c);
        }
        cache.n[i] = 0;
    }
}

static void cache_init(void)
{
    cache_keyed = pthread_key_create(&cache_key, cache_drain) == 0;
}

void kvg_arena_thread_cache(void)
{
    pthread_once(&cache_once, cache_init);
    /* The key's value only has to be non-NULL for its destructor to run at thread exit. */
    cache.on = cache_keyed && pthread_setspecific(cache_key, &cache) == 0;
}

static int cache_class(size_t size)
{
    return size == 2048 ? 0 : size == 4096 ? 1 : -1;
}

static void chunk_free(kvg_arena_chunk *c)
{
    int k = cache_class(c->size);
    if (cache.on && k >= 0 && cache.n[k] < CACHE_MAX) {
        c->next = cache.head[k];
        cache.head[k] = c;
        cache.n[k]++;
        return;
    }
    free(c);
}

static kvg_arena_chunk *chunk_new(size_t cap)
{
    int k = cache_class(cap);
    if (k >= 0 && cache.head[k]) {
        kvg_arena_chunk *c = cache.head[k];
        cache.head[k] = c->next;
        cache.n[k]--;
        return c;
    }
    return malloc(sizeof(kvg_arena_chunk) + cap);
}

void kvg_arena_init(kvg_arena *a, size_t chunk_size)
{
    a->head = NULL;
    a->chunk_size = chunk_size ? chunk_size : ARENA_DEFAULT_CHUNK;
    a->total = 0;
    a->limit = 0;
    a->over_limit = false;
}

void kvg_arena_done(kvg_arena *a)
{
    kvg_arena_chunk *c = a->head;
    while (c) {
        kvg_arena_chunk *next = c->next;
        chunk_free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

void kvg_arena_reset(kvg_arena *a)
{
    /* Keep one regular-sized chunk (the oldest, the one the next request will fill first) and
     * free the rest; oversized chunks can sit anywhere in the list. */
    kvg_arena_chunk *keep = NULL;
    for (kvg_arena_chunk *c = a->head; c; c = c->next)
        if (c->size == a->chunk_size)
            keep = c;
    kvg_arena_chunk *c = a->head;
    while (c) {
        kvg_arena_chunk *next = c->next;
        if (c != keep)
            chunk_free(c);
        c = next;
    }
    if (keep) {
        keep->next = NULL;
        keep->used = 0;
    }
    a->head = keep;
    a->total = 0;
    a->over_limit = false;
}

void *kvg_arena_alloc(kvg_arena *a, size_t size)
{
    size_t rounded = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (rounded < size)
        return NULL;
    if (a->limit && (a->total + rounded > a->limit || a->total + rounded < a->total)) {
        a->over_limit = true;
        return NULL;
    }
    kvg_arena_chunk *c = a->head;
    if (!c || c->size - c->used < rounded) {
        /* Big requests get a chunk of their own so the current chunk's tail is not wasted. */
        size_t cap = rounded > a->chunk_size / 2 ? rounded : a->chunk_size;
        kvg_arena_chunk *n = chunk_new(cap);
        if (!n)
            return NULL;
        n->size = cap;
        n->used = 0;
        if (c && cap == rounded && c->size - c->used > 0) {
            /* keep the current chunk at the head: it still has room for small requests */
            n->next = c->next;
            c->next = n;
            n->used = rounded;
            a->total += rounded;
            return n->data;
        }
        n->next = c;
        a->head = n;
        c = n;
    }
    void *p = c->data + c->used;
    c->used += rounded;
    a->total += rounded;
    return p;
}

char *kvg_arena_strndup(kvg_arena *a, const char *s, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *p = kvg_arena_alloc(a, len + 1);
    if (!p)
        return NULL;
    if (len)
        memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

char *kvg_arena_strdup(kvg_arena *a, const char *s)
{
    return kvg_arena_strndup(a, s, strlen(s));
}
