/* SPDX-License-Identifier: Apache-2.0 */
/* The offline optimum: Belady's MIN over the pooled LRU's access sequence and capacity. */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define NEVER UINT64_MAX /* next use of a block not accessed again */

/* One distinct block: its key, and whether it is cached with which next use. */
typedef struct block {
    uint64_t key;
    uint64_t next; /* backward pass: next access; forward pass: the cached copy's next use */
    bool used, cached;
} block;

typedef struct heap_entry {
    uint64_t next;
    uint32_t block;
} heap_entry;

/* A max-heap on next use; an entry is stale once its block left the cache or was accessed
 * again (its next use moved), and is dropped when it reaches the top. */
typedef struct min_heap {
    heap_entry *e;
    size_t n;
} min_heap;

static void heap_push(min_heap *h, uint64_t next, uint32_t b)
{
    size_t i = h->n++;
    while (i && h->e[(i - 1) / 2].next < next) {
        h->e[i] = h->e[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->e[i] = (heap_entry){next, b};
}

static void heap_pop(min_heap *h)
{
    heap_entry last = h->e[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->e[c + 1].next > h->e[c].next)
            c++;
        if (h->e[c].next <= last.next)
            break;
        h->e[i] = h->e[c];
        i = c;
    }
    if (h->n)
        h->e[i] = last;
}

/* The cached block with the farthest next use (the top, stale entries dropped), or NULL. */
static const heap_entry *heap_top(min_heap *h, const block *bl)
{
    while (h->n) {
        const heap_entry *t = &h->e[0];
        if (bl[t->block].cached && bl[t->block].next == t->next)
            return t;
        heap_pop(h);
    }
    return NULL;
}

static int min_pass(const replay_trace *t, uint64_t capacity, replay_row *row)
{
    size_t n = (size_t)t->blocks;
    uint64_t tsize = 16;
    while (tsize < 2 * (uint64_t)n)
        tsize *= 2;
    uint64_t mask = tsize - 1;
    block *bl = calloc(tsize, sizeof(*bl));
    uint32_t *slot = malloc((n ? n : 1) * sizeof(*slot)); /* the block of each access */
    uint64_t *next = malloc((n ? n : 1) * sizeof(*next)); /* each access's next use */
    min_heap h = {.e = malloc((n ? n : 1) * sizeof(*h.e))};
    if (!bl || !slot || !next || !h.e || tsize > UINT32_MAX) {
        free(bl);
        free(slot);
        free(next);
        free(h.e);
        return bl && slot && next && h.e ? -EINVAL : -ENOMEM;
    }
    /* Backward pass: access i is block b of request r, in request order then block order. */
    size_t i = n;
    for (size_t r = t->n; r-- > 0;) {
        const replay_request *q = &t->reqs[r];
        for (uint32_t b = q->nblocks; b-- > 0;) {
            uint64_t key = q->keys[b];
            uint64_t s = kvg_policy_mix64(key) & mask;
            while (bl[s].used && bl[s].key != key)
                s = (s + 1) & mask;
            if (!bl[s].used) {
                bl[s] = (block){.key = key, .next = NEVER, .used = true};
            }
            i--;
            slot[i] = (uint32_t)s;
            next[i] = bl[s].next;
            bl[s].next = i;
        }
    }
    /* Forward pass: hits are the leading blocks cached when the request arrives, as for the
     * LRU; then each access in order updates or inserts its block. */
    uint64_t held = 0;
    i = 0;
    for (size_t r = 0; r < t->n; r++) {
        const replay_request *q = &t->reqs[r];
        uint32_t hits = 0;
        while (hits < q->nblocks && bl[slot[i + hits]].cached)
            hits++;
        row->hit_blocks += hits;
        for (uint32_t b = 0; b < hits; b++)
            row->hit_tokens += replay_block_tokens(q, b);
        for (uint32_t b = 0; b < q->nblocks; b++, i++) {
            block *k = &bl[slot[i]];
            uint64_t nu = next[i];
            if (!k->cached) {
                if (held == capacity) {
                    /* Full: the block used farthest ahead goes, unless it is this one (or a
                     * tie, which only blocks never used again can be): then it is not kept. */
                    const heap_entry *top = heap_top(&h, bl);
                    if (!top || top->next <= nu)
                        continue;
                    bl[top->block].cached = false;
                    heap_pop(&h);
                    held--;
                }
                k->cached = true;
                held++;
            }
            k->next = nu;
            heap_push(&h, nu, slot[i]);
        }
    }
    row->capacity = capacity;
    free(bl);
    free(slot);
    free(next);
    free(h.e);
    return 0;
}

int replay_min(const replay_trace *t, uint64_t capacity, replay_row *out)
{
    uint64_t t0 = kvg_now_ns();
    replay_row row;
    memset(&row, 0, sizeof(row));
    snprintf(row.name, sizeof(row.name), "%s", "min");
    row.requests = t->n;
    row.blocks = t->blocks;
    row.tokens = t->tokens;
    int rc = min_pass(t, capacity, &row);
    if (rc < 0)
        return rc;
    row.seconds = (double)(kvg_now_ns() - t0) / 1e9;
    *out = row;
    return 0;
}
