/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/snapshot.c: references, publishing, the per-thread cache, and readers
 * acquiring while a writer publishes (build with -Db_sanitize=thread to check the ordering). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common.h"
#include "common_parts.h"
#include "snapshot.h"

/* A published object whose payload follows from its serial, so that a reader can tell a sound
 * object from a torn or recycled one. */
typedef struct item {
    kvg_snapshot snap;
    uint64_t serial; /* the writer's count when it built the item */
    uint64_t check;  /* serial * CHECK_MUL */
    _Atomic uint64_t *freed;
} item;

#define CHECK_MUL 0x9e3779b97f4a7c15ull

static item *item_of(kvg_snapshot *snap)
{
    return KVG_CONTAINER_OF(snap, item, snap);
}

static void item_free(kvg_snapshot *snap)
{
    item *it = item_of(snap);
    atomic_fetch_add(it->freed, 1);
    it->check = 0; /* a reader that still looked would notice (and ASan would say so) */
    free(it);
}

static item *item_new(uint64_t serial, _Atomic uint64_t *freed)
{
    item *it = malloc(sizeof(*it));
    assert_non_null(it);
    kvg_snapshot_init(&it->snap, item_free);
    it->serial = serial;
    it->check = serial * CHECK_MUL;
    it->freed = freed;
    return it;
}

static bool item_sound(const item *it)
{
    return it->check == it->serial * CHECK_MUL;
}

static void test_refs(void **state)
{
    (void)state;
    _Atomic uint64_t freed = 0;
    item *it = item_new(7, &freed);
    assert_int_equal(kvg_snapshot_generation(&it->snap), 0);
    assert_ptr_equal(kvg_snapshot_ref(&it->snap), &it->snap);
    kvg_snapshot_unref(&it->snap);
    assert_int_equal(atomic_load(&freed), 0);
    kvg_snapshot_unref(&it->snap);
    assert_int_equal(atomic_load(&freed), 1);
    kvg_snapshot_unref(NULL);
}

static void test_publish(void **state)
{
    (void)state;
    _Atomic uint64_t freed = 0;
    kvg_snapshot_slot slot;
    item *first = item_new(0, &freed);
    assert_int_equal(kvg_snapshot_slot_init(&slot, &first->snap), 0);
    assert_int_equal(kvg_snapshot_slot_generation(&slot), 1);
    assert_int_equal(kvg_snapshot_generation(&first->snap), 1);
    assert_ptr_equal(kvg_snapshot_slot_current(&slot), &first->snap);

    /* A reader's reference outlives the publish that replaces the object. */
    kvg_snapshot *held = kvg_snapshot_slot_acquire(&slot);
    assert_ptr_equal(held, &first->snap);
    item *second = item_new(1, &freed);
    kvg_snapshot *old = kvg_snapshot_slot_publish(&slot, &second->snap);
    assert_ptr_equal(old, &first->snap);
    assert_int_equal(kvg_snapshot_slot_generation(&slot), 2);
    assert_int_equal(kvg_snapshot_generation(&second->snap), 2);
    assert_int_equal(kvg_snapshot_generation(old), 1); /* a published number never changes */
    kvg_snapshot_unref(old);
    assert_int_equal(atomic_load(&freed), 0);
    assert_true(item_sound(item_of(held)));
    kvg_snapshot_unref(held);
    assert_int_equal(atomic_load(&freed), 1);

    /* One up per publish. */
    for (uint64_t i = 2; i < 10; i++)
        kvg_snapshot_unref(kvg_snapshot_slot_publish(&slot, &item_new(i, &freed)->snap));
    assert_int_equal(kvg_snapshot_slot_generation(&slot), 10);
    kvg_snapshot *last = kvg_snapshot_slot_acquire(&slot);
    assert_int_equal(kvg_snapshot_generation(last), 10);
    assert_int_equal(item_of(last)->serial, 9);
    assert_int_equal(atomic_load(&freed), 9);

    /* The slot's end leaves a held object alive. */
    kvg_snapshot_slot_done(&slot);
    assert_int_equal(atomic_load(&freed), 9);
    kvg_snapshot_unref(last);
    assert_int_equal(atomic_load(&freed), 10);
}

static void test_cache(void **state)
{
    (void)state;
    _Atomic uint64_t freed = 0;
    kvg_snapshot_slot slot;
    item *first = item_new(0, &freed);
    assert_int_equal(kvg_snapshot_slot_init(&slot, &first->snap), 0);
    kvg_snapshot_cache cache;
    kvg_snapshot_cache_init(&cache, &slot);
    assert_null(kvg_snapshot_cache_get(&cache));

    assert_true(kvg_snapshot_cache_refresh(&cache));
    assert_ptr_equal(kvg_snapshot_cache_get(&cache), &first->snap);
    assert_false(kvg_snapshot_cache_refresh(&cache)); /* nothing moved */
    assert_false(kvg_snapshot_cache_refresh(&cache));
    assert_ptr_equal(kvg_snapshot_cache_get(&cache), &first->snap);

    /* The cache keeps the old object alive until it refreshes. */
    item *second = item_new(1, &freed);
    kvg_snapshot_unref(kvg_snapshot_slot_publish(&slot, &second->snap));
    assert_int_equal(atomic_load(&freed), 0);
    assert_ptr_equal(kvg_snapshot_cache_get(&cache), &first->snap);
    assert_true(kvg_snapshot_cache_refresh(&cache));
    assert_ptr_equal(kvg_snapshot_cache_get(&cache), &second->snap);
    assert_int_equal(atomic_load(&freed), 1);
    assert_false(kvg_snapshot_cache_refresh(&cache));

    /* Several publishes between two refreshes: one reload, to the newest. */
    for (uint64_t i = 2; i < 6; i++)
        kvg_snapshot_unref(kvg_snapshot_slot_publish(&slot, &item_new(i, &freed)->snap));
    assert_true(kvg_snapshot_cache_refresh(&cache));
    assert_int_equal(item_of(kvg_snapshot_cache_get(&cache))->serial, 5);
    assert_int_equal(kvg_snapshot_generation(kvg_snapshot_cache_get(&cache)), 6);
    assert_int_equal(atomic_load(&freed), 5);

    /* The cache may end after its slot (a thread that outlives the store). */
    kvg_snapshot_slot_done(&slot);
    assert_int_equal(atomic_load(&freed), 5);
    kvg_snapshot_cache_done(&cache);
    assert_int_equal(atomic_load(&freed), 6);
    assert_null(kvg_snapshot_cache_get(&cache));
    kvg_snapshot_cache_done(&cache); /* twice is harmless */
}

/* ---- threads ------------------------------------------------------------------------------- */

#define READERS 4
#define PUBLISHES 20000

typedef struct reader {
    kvg_snapshot_slot *slot;
    _Atomic bool *stop;
    unsigned failures;
    uint64_t rounds;
    uint64_t reloads;
} reader;

/* Checks the contract both ways round, through acquire and through a cache, while holding one
 * snapshot across many publishes as a long request does. */
static void *read_loop(void *p)
{
    reader *r = p;
    kvg_snapshot_cache cache;
    kvg_snapshot_cache_init(&cache, r->slot);
    kvg_snapshot *long_held = kvg_snapshot_slot_acquire(r->slot);
    uint64_t last = 0;
    /* At least one round, even when the writer was done before this thread first ran (a
     * loaded machine with two cores). */
    do {
        /* Read the number, then acquire: at least that snapshot. */
        uint64_t g = kvg_snapshot_slot_generation(r->slot);
        kvg_snapshot *s = kvg_snapshot_slot_acquire(r->slot);
        if (kvg_snapshot_generation(s) < g || !item_sound(item_of(s)))
            r->failures++;
        /* Acquire, then read the number: at least the snapshot's. */
        if (kvg_snapshot_slot_generation(r->slot) < kvg_snapshot_generation(s))
            r->failures++;
        /* Serials were published in order, one generation each. */
        if (kvg_snapshot_generation(s) != item_of(s)->serial + 1)
            r->failures++;
        kvg_snapshot_unref(s);

        /* The cache: what a refresh leaves is at least what was current before it, and the
         * numbers it sees never go back. */
        g = kvg_snapshot_slot_generation(r->slot);
        if (kvg_snapshot_cache_refresh(&cache))
            r->reloads++;
        kvg_snapshot *c = kvg_snapshot_cache_get(&cache);
        uint64_t cg = kvg_snapshot_generation(c);
        if (cg < g || cg < last || !item_sound(item_of(c)))
            r->failures++;
        last = cg;

        if (++r->rounds % 64 == 0) {
            if (!item_sound(item_of(long_held)))
                r->failures++;
            kvg_snapshot_unref(long_held);
            long_held = kvg_snapshot_slot_acquire(r->slot);
        }
    } while (!atomic_load_explicit(r->stop, memory_order_relaxed));
    kvg_snapshot_unref(long_held);
    kvg_snapshot_cache_done(&cache);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    _Atomic uint64_t freed = 0;
    _Atomic bool stop = false;
    kvg_snapshot_slot slot;
    assert_int_equal(kvg_snapshot_slot_init(&slot, &item_new(0, &freed)->snap), 0);
    pthread_t th[READERS];
    reader r[READERS];
    for (int i = 0; i < READERS; i++) {
        r[i] = (reader){.slot = &slot, .stop = &stop};
        assert_int_equal(pthread_create(&th[i], NULL, read_loop, &r[i]), 0);
    }
    for (uint64_t i = 1; i <= PUBLISHES; i++) {
        kvg_snapshot *old = kvg_snapshot_slot_publish(&slot, &item_new(i, &freed)->snap);
        if (!item_sound(item_of(old)))
            fail_msg("the slot's reference to serial %llu was dropped early",
                     (unsigned long long)item_of(old)->serial);
        kvg_snapshot_unref(old);
        if (i % 256 == 0)
            sched_yield(); /* let the readers see the numbers move on a small machine */
    }
    atomic_store(&stop, true);
    for (int i = 0; i < READERS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(r[i].failures, 0);
        assert_true(r[i].rounds > 0);
    }
    assert_int_equal(kvg_snapshot_slot_generation(&slot), PUBLISHES + 1);
    /* Every reference went back: all but the current object are freed, then that one too. */
    assert_int_equal(atomic_load(&freed), PUBLISHES);
    kvg_snapshot_slot_done(&slot);
    assert_int_equal(atomic_load(&freed), PUBLISHES + 1);
}

const struct CMUnitTest snapshot_tests[] = {
    cmocka_unit_test(test_refs),
    cmocka_unit_test(test_publish),
    cmocka_unit_test(test_cache),
    cmocka_unit_test(test_threads),
};
const size_t snapshot_tests_count = KVG_ARRAY_LEN(snapshot_tests);
