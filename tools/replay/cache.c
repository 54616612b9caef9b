/* SPDX-License-Identifier: Apache-2.0 */
/* A simulated KV cache: blocks held by running sequences (pinned) or free in an LRU list, as
 * vLLM's block manager keeps them; also the pooled LRU and the ceiling's set. */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>

#define NIL UINT32_MAX

typedef struct entry {
    uint64_t key;
    uint32_t ref;        /* sequences using it; 0 = in the LRU list */
    uint32_t prev, next; /* LRU links (head = most recent) */
} entry;

struct replay_cache {
    uint32_t capacity;
    uint32_t used;   /* entries[0..used) are held blocks */
    uint32_t pinned; /* held blocks with ref > 0 */
    uint32_t head, tail;
    entry *entries;
    uint32_t *slots; /* open addressing, linear probing: entry index + 1, 0 = empty */
    uint64_t mask;
};

/* Keys are hashes already, but a mix keeps a run of close keys (tests) apart. */
static uint64_t home(const replay_cache *c, uint64_t key)
{
    return kvg_policy_mix64(key) & c->mask;
}

int replay_cache_new(uint32_t capacity, replay_cache **out)
{
    replay_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    uint64_t tsize = 16;
    while (tsize < 2 * (uint64_t)capacity)
        tsize *= 2;
    c->capacity = capacity;
    c->head = c->tail = NIL;
    c->mask = tsize - 1;
    c->entries = malloc((capacity ? capacity : 1) * sizeof(*c->entries));
    c->slots = calloc(tsize, sizeof(*c->slots));
    if (!c->entries || !c->slots) {
        replay_cache_free(c);
        return -ENOMEM;
    }
    *out = c;
    return 0;
}

void replay_cache_free(replay_cache *c)
{
    if (!c)
        return;
    free(c->entries);
    free(c->slots);
    free(c);
}

/* The slot of key, or of the empty place where it would go. */
static uint64_t slot_of(const replay_cache *c, uint64_t key)
{
    uint64_t i = home(c, key);
    while (c->slots[i] && c->entries[c->slots[i] - 1].key != key)
        i = (i + 1) & c->mask;
    return i;
}

static entry *find(const replay_cache *c, uint64_t key)
{
    uint32_t s = c->slots[slot_of(c, key)];
    return s ? &c->entries[s - 1] : NULL;
}

/* Backward-shift deletion keeps every probe run unbroken without tombstones. */
static void table_remove(replay_cache *c, uint64_t key)
{
    uint64_t i = slot_of(c, key), j = i;
    for (;;) {
        j = (j + 1) & c->mask;
        if (!c->slots[j])
            break;
        uint64_t k = home(c, c->entries[c->slots[j] - 1].key);
        /* the entry at j may move to i when its home is not within (i, j] cyclically */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            c->slots[i] = c->slots[j];
            i = j;
        }
    }
    c->slots[i] = 0;
}

static void lru_unlink(replay_cache *c, uint32_t idx)
{
    entry *e = &c->entries[idx];
    if (e->prev != NIL)
        c->entries[e->prev].next = e->next;
    else
        c->head = e->next;
    if (e->next != NIL)
        c->entries[e->next].prev = e->prev;
    else
        c->tail = e->prev;
}

static void lru_push_head(replay_cache *c, uint32_t idx)
{
    entry *e = &c->entries[idx];
    e->prev = NIL;
    e->next = c->head;
    if (c->head != NIL)
        c->entries[c->head].prev = idx;
    else
        c->tail = idx;
    c->head = idx;
}

uint32_t replay_cache_match(const replay_cache *c, const uint64_t *keys, uint32_t n)
{
    uint32_t i = 0;
    while (i < n && find(c, keys[i]))
        i++;
    return i;
}

bool replay_cache_fits(const replay_cache *c, const uint64_t *keys, uint32_t n)
{
    uint64_t need = c->pinned;
    for (uint32_t i = 0; i < n; i++) {
        const entry *e = find(c, keys[i]);
        if (!e || !e->ref)
            need++;
    }
    return need <= c->capacity;
}

void replay_cache_pin(replay_cache *c, const uint64_t *keys, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        entry *e = find(c, keys[i]);
        if (e) {
            if (!e->ref++) {
                lru_unlink(c, (uint32_t)(e - c->entries));
                c->pinned++;
            }
            continue;
        }
        uint32_t idx;
        if (c->used < c->capacity) {
            idx = c->used++;
        } else if (c->tail != NIL) {
            idx = c->tail;
            lru_unlink(c, idx);
            table_remove(c, c->entries[idx].key);
        } else {
            continue; /* every block is pinned: this one is computed, not kept */
        }
        c->entries[idx] = (entry){.key = keys[i], .ref = 1, .prev = NIL, .next = NIL};
        c->slots[slot_of(c, keys[i])] = idx + 1;
        c->pinned++;
    }
}

void replay_cache_unpin(replay_cache *c, const uint64_t *keys, uint32_t n)
{
    for (uint32_t i = n; i-- > 0;) {
        entry *e = find(c, keys[i]);
        if (!e || !e->ref)
            continue;
        if (!--e->ref) {
            lru_push_head(c, (uint32_t)(e - c->entries));
            c->pinned--;
        }
    }
}

uint32_t replay_cache_held(const replay_cache *c)
{
    return c->used;
}

uint32_t replay_cache_pinned(const replay_cache *c)
{
    return c->pinned;
}
