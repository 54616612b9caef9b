/* SPDX-License-Identifier: Apache-2.0 */
/* Per-thread free lists for libevent's and nghttp2's allocations on the event-loop threads. */
#include "block_cache.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * Every proxied HTTP/1.1 request makes and frees about eight evbuffer chains (the request and
 * the response, in and out of two sockets): libevent frees a chain as soon as it is drained.
 * Chains are 1, 2 or 4 KiB with their header, mostly above glibc's per-thread cache (1032
 * bytes), so each pair went through malloc's bins: about 140 instructions a call, 2.4k a request;
 * an HTTP/2 stream adds nghttp2's own (stream, header buffers, frames). Blocks of the classes
 * below are kept on the thread that freed them, up to CLASS_BYTES of each class, for the next
 * allocation there: -1.2k instructions a proxied HTTP/1.1 request for libevent's alone (callgrind,
 * 2026-12-02, bench/instructions). As with the arena's chunk cache, only threads that ask for it
 * (kvg_block_cache_thread, the event-loop threads) keep blocks; elsewhere a block is a plain
 * malloc with the same header.
 *
 * A block is a 16-byte header (its class, keeping the payload 16-byte aligned) and the payload
 * of its class's size. Blocks freed on a thread other than the one that made them join the
 * freeing thread's lists: any thread may free a glibc block.
 */
/* Under AddressSanitizer a kept block is poisoned, so that a use after free still reports. */
#if defined(__SANITIZE_ADDRESS__)
#define KVG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVG_ASAN 1
#endif
#endif
#ifdef KVG_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HEADER 16u
#define CLASS_MIN_SHIFT 8u /* 256 bytes */
#define CLASS_COUNT 7u     /* 256 .. 16 KiB */
#define CLASS_BYTES (256u * 1024u)
#define NO_CLASS 0xffu

typedef struct free_block {
    struct free_block *next;
} free_block;

typedef struct block_cache {
    free_block *head[CLASS_COUNT];
    unsigned n[CLASS_COUNT];
    bool on;
} block_cache;

static _Thread_local block_cache cache;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static pthread_key_t cache_key;
static bool cache_keyed;

static size_t class_size(unsigned k)
{
    return (size_t)1 << (CLASS_MIN_SHIFT + k);
}

/* The smallest class that holds n bytes, or NO_CLASS. */
static unsigned class_of(size_t n)
{
    if (n <= class_size(0))
        return 0;
    if (n > class_size(CLASS_COUNT - 1))
        return NO_CLASS;
    return (unsigned)(64 - __builtin_clzll((unsigned long long)n - 1)) - CLASS_MIN_SHIFT;
}

static unsigned char *header_of(void *p)
{
    return (unsigned char *)p - HEADER;
}

static void cache_drain(void *unused)
{
    (void)unused;
    cache.on = false;
    for (unsigned k = 0; k < CLASS_COUNT; k++) {
        while (cache.head[k]) {
            free_block *b = cache.head[k];
            cache.head[k] = b->next;
            UNPOISON((unsigned char *)b + HEADER, class_size(k));
            free(b);
        }
        cache.n[k] = 0;
    }
}

static void cache_init(void)
{
    cache_keyed = pthread_key_create(&cache_key, cache_drain) == 0;
}

void *kvg_block_malloc(size_t n)
{
    unsigned k = class_of(n);
    unsigned char *h;
    if (k != NO_CLASS && cache.head[k]) {
        free_block *b = cache.head[k];
        cache.head[k] = b->next;
        cache.n[k]--;
        h = (unsigned char *)b;
        UNPOISON(h + HEADER, class_size(k));
    } else {
        if (n > SIZE_MAX - HEADER)
            return NULL;
        h = malloc(HEADER + (k != NO_CLASS ? class_size(k) : n));
        if (!h)
            return NULL;
    }
    h[0] = (unsigned char)k;
    return h + HEADER;
}

void kvg_block_free(void *p)
{
    if (!p)
        return;
    unsigned char *h = header_of(p);
    unsigned k = h[0];
    if (cache.on && k != NO_CLASS && (cache.n[k] + 1) * class_size(k) <= CLASS_BYTES) {
        free_block *b = (free_block *)(void *)h;
        POISON(h + HEADER, class_size(k));
        b->next = cache.head[k];
        cache.head[k] = b;
        cache.n[k]++;
        return;
    }
    free(h);
}

void *kvg_block_realloc(void *p, size_t n)
{
    if (!p)
        return kvg_block_malloc(n);
    unsigned char *h = header_of(p);
    unsigned k = h[0];
    if (k != NO_CLASS) {
        if (n <= class_size(k))
            return p;
        void *q = kvg_block_malloc(n);
        if (!q)
            return NULL;
        memcpy(q, p, class_size(k));
        kvg_block_free(p);
        return q;
    }
    /* Outside the classes, and staying there: glibc may grow the block in place. */
    if (class_of(n) == NO_CLASS) {
        if (n > SIZE_MAX - HEADER)
            return NULL;
        unsigned char *g = realloc(h, HEADER + n);
        return g ? g + HEADER : NULL;
    }
    void *q = kvg_block_malloc(n); /* shrinking into a class: the new size is what is kept */
    if (!q)
        return NULL;
    memcpy(q, p, n);
    kvg_block_free(p);
    return q;
}

void kvg_block_cache_install_libevent(void)
{
    event_set_mem_functions(kvg_block_malloc, kvg_block_realloc, kvg_block_free);
}

static void *mem_malloc(size_t n, void *ud)
{
    (void)ud;
    return kvg_block_malloc(n);
}

static void mem_free(void *p, void *ud)
{
    (void)ud;
    kvg_block_free(p);
}

static void *mem_calloc(size_t nmemb, size_t size, void *ud)
{
    (void)ud;
    if (size && nmemb > SIZE_MAX / size)
        return NULL;
    void *p = kvg_block_malloc(nmemb * size);
    if (p)
        memset(p, 0, nmemb * size);
    return p;
}

static void *mem_realloc(void *p, size_t n, void *ud)
{
    (void)ud;
    return kvg_block_realloc(p, n);
}

nghttp2_mem *kvg_block_cache_nghttp2_mem(void)
{
    static nghttp2_mem mem = {
        .malloc = mem_malloc,
        .free = mem_free,
        .calloc = mem_calloc,
        .realloc = mem_realloc,
    };
    return &mem; /* nghttp2 copies it into each session */
}

size_t kvg_block_cache_kept(void)
{
    size_t bytes = 0;
    for (unsigned k = 0; k < CLASS_COUNT; k++)
        bytes += cache.n[k] * class_size(k);
    return bytes;
}

void kvg_block_cache_thread(void)
{
    pthread_once(&cache_once, cache_init);
    /* The key's value only has to be non-NULL for its destructor to run at thread exit. */
    cache.on = cache_keyed && pthread_setspecific(cache_key, &cache) == 0;
}
