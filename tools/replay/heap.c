/* SPDX-License-Identifier: Apache-2.0 */
/* The simulation's event queue: a binary min-heap on (time, insertion order). */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>

static bool before(const replay_event *a, const replay_event *b)
{
    return a->time_us != b->time_us ? a->time_us < b->time_us : a->seq < b->seq;
}

void replay_heap_init(replay_heap *h)
{
    *h = (replay_heap){0};
}

void replay_heap_done(replay_heap *h)
{
    free(h->ev);
    *h = (replay_heap){0};
}

int replay_heap_push(replay_heap *h, uint64_t time_us, uint32_t req, uint32_t kind)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 256;
        replay_event *p = realloc(h->ev, nc * sizeof(*p));
        if (!p)
            return -ENOMEM;
        h->ev = p;
        h->cap = nc;
    }
    replay_event e = {.time_us = time_us, .seq = h->next_seq++, .req = req, .kind = kind};
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&e, &h->ev[parent]))
            break;
        h->ev[i] = h->ev[parent];
        i = parent;
    }
    h->ev[i] = e;
    return 0;
}

bool replay_heap_pop(replay_heap *h, replay_event *out)
{
    if (!h->n)
        return false;
    *out = h->ev[0];
    replay_event last = h->ev[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const replay_event *best = &last;
        if (l < h->n && before(&h->ev[l], best))
            m = l, best = &h->ev[l];
        if (r < h->n && before(&h->ev[r], best))
            m = r;
        if (m == i)
            break;
        h->ev[i] = h->ev[m];
        i = m;
    }
    if (h->n)
        h->ev[i] = last;
    return true;
}
