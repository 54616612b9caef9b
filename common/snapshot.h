/* SPDX-License-Identifier: Apache-2.0 */
/* Immutable refcounted snapshots published under a generation number, and the per-thread cache
 * that takes a new one only when the number moved: how shared read-mostly state (workers,
 * tenants, policy settings) reaches every thread. */
#ifndef KVG_SNAPSHOT_H
#define KVG_SNAPSHOT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A writer builds a new object, never changes it after publishing, and swaps it into a slot;
 * readers take references to whatever the slot holds, and a request keeps its reference (its
 * snapshot) to the end even when a newer one is published meanwhile.
 *
 *   writer: obj = build(); kvg_snapshot_init(&obj->snap, obj_free);
 *           kvg_snapshot_unref(kvg_snapshot_slot_publish(&slot, &obj->snap));
 *   thread: kvg_snapshot_cache_refresh(&cache);            (per request: a load and a compare)
 *           obj = (obj_type *)kvg_snapshot_cache_get(&cache);
 *
 * The header is the published object's first member, so that a pointer to one is a pointer to
 * the other: a module can hand out its snapshots under an opaque type and convert with a cast
 * (a _Static_assert next to the struct keeps that true).
 */

typedef struct kvg_snapshot kvg_snapshot;
/** Frees the object whose header snap is; called once, by whichever thread drops the last
 *  reference. */
typedef void kvg_snapshot_free_fn(kvg_snapshot *snap);

struct kvg_snapshot {
    _Atomic size_t refs;
    /* 0 until published; written once by kvg_snapshot_slot_publish before any other thread
     * can reach the object, read-only after. */
    uint64_t generation;
    kvg_snapshot_free_fn *free;
};

/** Start an object's life with one reference (the caller's) and no generation. */
void kvg_snapshot_init(kvg_snapshot *snap, kvg_snapshot_free_fn *free_fn);
/** Take one more reference; returns snap. Any thread. */
kvg_snapshot *kvg_snapshot_ref(kvg_snapshot *snap);
/** Drop a reference; the last one frees the object through its free function. NULL is a
 *  no-op. Any thread. */
void kvg_snapshot_unref(kvg_snapshot *snap);
/** The number the object was published under (1 for a slot's first), 0 if never published. */
static inline uint64_t kvg_snapshot_generation(const kvg_snapshot *snap)
{
    return snap->generation;
}

/*
 * Where a writer publishes and readers acquire. The generation is a relaxed atomic that readers
 * poll; current changes under a mutex held for a pointer swap (publish) or a pointer load and a
 * refcount increment (acquire), never for longer, and only a thread whose cached generation is
 * out of date takes it. The number moves inside that critical section, which gives the two
 * guarantees readers rely on: a thread that reads the generation and then acquires finds at
 * least the snapshot of that number, and one that acquires and then reads the generation sees
 * at least the number of the snapshot it holds. Generations only grow, by one per publish.
 */
typedef struct kvg_snapshot_slot {
    _Atomic uint64_t generation; /* current's */
    pthread_mutex_t lock;
    kvg_snapshot *current; /* one reference, the slot's */
} kvg_snapshot_slot;

/** Set up a slot holding first, published as generation 1; takes the caller's reference to
 *  first on success only. 0 or a negative errno (from pthread_mutex_init). */
int kvg_snapshot_slot_init(kvg_snapshot_slot *slot, kvg_snapshot *first);
/** Drop the slot's reference to its current object (which lives on in the threads still
 *  holding it) and the mutex. No thread may use the slot any more, caches bound to it
 *  included, except kvg_snapshot_cache_done. */
void kvg_snapshot_slot_done(kvg_snapshot_slot *slot);
/** Publish next (never published before) as generation current + 1, taking the caller's
 *  reference. Returns the object it replaced with the slot's reference, which the caller drops
 *  (kvg_snapshot_unref) once it is done looking at it. Thread-safe, but the writers of one slot
 *  usually serialise among themselves anyway, to build next from the current object. */
kvg_snapshot *kvg_snapshot_slot_publish(kvg_snapshot_slot *slot, kvg_snapshot *next);
/** The current object with a new reference for the caller. Never NULL. Any thread; takes the
 *  mutex, so hot paths go through a kvg_snapshot_cache instead. */
kvg_snapshot *kvg_snapshot_slot_acquire(kvg_snapshot_slot *slot);
/** The current object, borrowed, without the mutex: only for a writer that serialises the
 *  slot's publishes (holds its module's write lock), since the next publish may free it. */
static inline kvg_snapshot *kvg_snapshot_slot_current(const kvg_snapshot_slot *slot)
{
    return slot->current;
}
/** The current generation: one relaxed atomic load. Any thread. */
static inline uint64_t kvg_snapshot_slot_generation(const kvg_snapshot_slot *slot)
{
    /* C11 atomic loads take a pointer to non-const (clang insists). */
    return atomic_load_explicit(&((kvg_snapshot_slot *)slot)->generation, memory_order_relaxed);
}

/*
 * One thread's reference to a slot's snapshot, re-acquired only when the slot's generation has
 * moved: when nothing changed a refresh costs a relaxed load and a compare, no lock, no
 * refcount traffic, no write. Owned by one thread; not thread-safe.
 */
typedef struct kvg_snapshot_cache {
    kvg_snapshot_slot *slot;
    kvg_snapshot *snap;  /* one reference; NULL until the first refresh */
    uint64_t generation; /* snap's; 0 (never a published number) before the first refresh */
} kvg_snapshot_cache;

/** Bind an empty cache to slot (which must outlive every refresh). */
void kvg_snapshot_cache_init(kvg_snapshot_cache *cache, kvg_snapshot_slot *slot);
/** Drop the cached reference. Does not touch the slot, which may be gone already. */
void kvg_snapshot_cache_done(kvg_snapshot_cache *cache);
/** Acquire the slot's current object in place of the cached one (the slow path of
 *  kvg_snapshot_cache_refresh). */
void kvg_snapshot_cache_reload(kvg_snapshot_cache *cache);
/** Make the cache hold the slot's current snapshot, or a newer one: true when it changed
 *  (the caller may have derived state to update), false when the generation had not moved. */
static inline bool kvg_snapshot_cache_refresh(kvg_snapshot_cache *cache)
{
    if (__builtin_expect(kvg_snapshot_slot_generation(cache->slot) == cache->generation, 1))
        return false;
    kvg_snapshot_cache_reload(cache);
    return true;
}
/** The cached snapshot, borrowed: valid until the cache's next refresh or done. NULL before
 *  the first refresh. */
static inline kvg_snapshot *kvg_snapshot_cache_get(const kvg_snapshot_cache *cache)
{
    return cache->snap;
}

#endif
