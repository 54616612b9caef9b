/* SPDX-License-Identifier: Apache-2.0 */
/* Bump allocator: many small allocations, one free at the end of a request or a parse. */
#include "common.h"

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
        free(c);
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
            free(c);
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
        kvg_arena_chunk *n = malloc(sizeof(*n) + cap);
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
