/* SPDX-License-Identifier: Apache-2.0 */
/* The snapshot primitive: refcounted published objects, the slot they are published in, and
 * the per-thread cache of a slot's current one (contracts in snapshot.h). */
#include "snapshot.h"

#include <assert.h>
#include <stddef.h>

void kvg_snapshot_init(kvg_snapshot *snap, kvg_snapshot_free_fn *free_fn)
{
    atomic_init(&snap->refs, 1);
    snap->generation = 0;
    snap->free = free_fn;
}

kvg_snapshot *kvg_snapshot_ref(kvg_snapshot *snap)
{
    /* Relaxed: a new reference is made from an existing one, which keeps the object alive. */
    atomic_fetch_add_explicit(&snap->refs, 1, memory_order_relaxed);
    return snap;
}

void kvg_snapshot_unref(kvg_snapshot *snap)
{
    /* acq_rel: every thread's reads of the object happen before the free. */
    if (!snap || atomic_fetch_sub_explicit(&snap->refs, 1, memory_order_acq_rel) != 1)
        return;
    snap->free(snap);
}

int kvg_snapshot_slot_init(kvg_snapshot_slot *slot, kvg_snapshot *first)
{
    int rc = -pthread_mutex_init(&slot->lock, NULL);
    if (rc < 0)
        return rc;
    assert(first->generation == 0);
    first->generation = 1;
    slot->current = first;
    atomic_init(&slot->generation, 1);
    return 0;
}

void kvg_snapshot_slot_done(kvg_snapshot_slot *slot)
{
    kvg_snapshot_unref(slot->current);
    slot->current = NULL;
    pthread_mutex_destroy(&slot->lock);
}

kvg_snapshot *kvg_snapshot_slot_publish(kvg_snapshot_slot *slot, kvg_snapshot *next)
{
    assert(next->generation == 0); /* a published object is never changed, nor published again */
    pthread_mutex_lock(&slot->lock);
    kvg_snapshot *old = slot->current;
    /* No other thread can reach next before the unlock, so its number is written plainly. The
     * slot's number moves inside the critical section: see snapshot.h for what readers get. */
    next->generation = old->generation + 1;
    slot->current = next;
    atomic_store_explicit(&slot->generation, next->generation, memory_order_relaxed);
    pthread_mutex_unlock(&slot->lock);
    return old;
}

kvg_snapshot *kvg_snapshot_slot_acquire(kvg_snapshot_slot *slot)
{
    /* The mutex makes the load and the increment one step: a publish between them could
     * otherwise drop the last reference to the object being taken. */
    pthread_mutex_lock(&slot->lock);
    kvg_snapshot *snap = kvg_snapshot_ref(slot->current);
    pthread_mutex_unlock(&slot->lock);
    return snap;
}

void kvg_snapshot_cache_init(kvg_snapshot_cache *cache, kvg_snapshot_slot *slot)
{
    *cache = (kvg_snapshot_cache){.slot = slot};
}

void kvg_snapshot_cache_done(kvg_snapshot_cache *cache)
{
    kvg_snapshot_unref(cache->snap);
    cache->snap = NULL;
    cache->generation = 0;
}

void kvg_snapshot_cache_reload(kvg_snapshot_cache *cache)
{
    kvg_snapshot *old = cache->snap;
    cache->snap = kvg_snapshot_slot_acquire(cache->slot);
    cache->generation = cache->snap->generation;
    /* After the swap: the last reference may go here, and the free must not run while the
     * cache still points at the object. */
    kvg_snapshot_unref(old);
}
