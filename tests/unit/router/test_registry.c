/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the worker registry (router/registry.c): snapshots, layers, replacing the
 * config workers, the admin layer as JSON, the cache_salt switch, the per-thread snapshot cache,
 * concurrency and allocation failures; its main also runs the tests of test_worker.c,
 * test_metrics.c and test_route.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fail_alloc.h"
#include "router.h"
#include "router_helpers.h"
#include "test_parts.h"

/* ---- registry ------------------------------------------------------------------------------- */

static void test_registry_config(void **state)
{
    (void)state;
    kvg_registry *reg = (kvg_registry *)(uintptr_t)1;
    kvg_registry_config bad = {.nthreads = 5000};
    assert_int_equal(kvg_registry_new(&bad, &reg), -EINVAL);
    bad = (kvg_registry_config){.health_fall = 1001};
    assert_int_equal(kvg_registry_new(&bad, &reg), -EINVAL);
    assert_ptr_equal(reg, (kvg_registry *)(uintptr_t)1); /* untouched on failure */
    assert_int_equal(kvg_registry_new(NULL, &reg), 0);
    kvg_worker_set *set = kvg_registry_acquire(reg);
    assert_non_null(set);
    assert_int_equal(kvg_worker_set_count(set), 0);
    assert_int_equal(kvg_worker_set_generation(set), 1);
    assert_null(kvg_worker_set_at(set, 0));
    assert_null(kvg_worker_set_find(set, "x"));
    size_t n = 99;
    kvg_worker_set_models(set, &n);
    assert_int_equal(n, 0);
    kvg_worker_set_unref(set);
    kvg_registry_free(reg);
    kvg_registry_free(NULL);
    kvg_worker_set_unref(NULL);
    kvg_worker_unref(NULL);

    assert_string_equal(kvg_worker_source_str(KVG_WORKER_SOURCE_CONFIG), "config");
    assert_string_equal(kvg_worker_source_str(KVG_WORKER_SOURCE_ADMIN), "admin");
    assert_string_equal(kvg_worker_source_str(KVG_WORKER_SOURCE_COUNT), "?");
    assert_string_equal(kvg_worker_health_str(KVG_WORKER_UP), "up");
    assert_string_equal(kvg_worker_health_str(KVG_WORKER_DOWN), "down");
}

static void test_reput_identical_and_changed(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    assert_int_equal(put(reg, "w", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s1 = kvg_registry_acquire(reg);
    kvg_worker *w1 = kvg_worker_set_find(s1, "w");
    uint64_t id1 = kvg_worker_id(w1);
    for (int i = 0; i < 3; i++)
        kvg_worker_health_observe(w1, false);
    assert_int_equal(kvg_worker_health_get(w1), KVG_WORKER_DOWN);
    kvg_worker_record(w1, 200, 1000000, 500000);

    /* identical: same object, health and counters kept, new generation */
    assert_int_equal(put(reg, "w", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s2 = kvg_registry_acquire(reg);
    assert_true(kvg_worker_set_generation(s2) > kvg_worker_set_generation(s1));
    kvg_worker *w2 = kvg_worker_set_find(s2, "w");
    assert_ptr_equal(w1, w2);
    assert_int_equal(kvg_worker_id(w2), id1);
    assert_int_equal(kvg_worker_health_get(w2), KVG_WORKER_DOWN);
    assert_false(kvg_worker_retired(w1));

    /* changed: a fresh worker that starts up; the old one is retired, old snapshots keep it */
    assert_int_equal(put(reg, "w", "http://h:2", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s3 = kvg_registry_acquire(reg);
    kvg_worker *w3 = kvg_worker_set_find(s3, "w");
    assert_ptr_not_equal(w3, w1);
    assert_true(kvg_worker_id(w3) > id1);
    assert_int_equal(kvg_worker_health_get(w3), KVG_WORKER_UP);
    assert_int_equal(kvg_worker_port(w3), 2);
    assert_true(kvg_worker_retired(w1));
    assert_false(kvg_worker_retired(w3));
    assert_string_equal(kvg_worker_url(kvg_worker_set_find(s1, "w")), "http://h:1");

    /* a changed model list or limits is a change too */
    const char *models[] = {"m"};
    kvg_worker_def d = {.name = "w", .url = "http://h:2", .models = models, .nmodels = 1};
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    kvg_worker_set *s4 = kvg_registry_acquire(reg);
    assert_ptr_not_equal(kvg_worker_set_find(s4, "w"), w3);
    assert_true(kvg_worker_retired(w3));
    /* max_inflight 0 and the default it stands for are the same definition */
    d.max_inflight = 1024;
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    kvg_worker_set *s5 = kvg_registry_acquire(reg);
    assert_ptr_equal(kvg_worker_set_find(s5, "w"), kvg_worker_set_find(s4, "w"));

    kvg_registry_free(reg);
    /* snapshots outlive the registry */
    assert_true(kvg_worker_retired(kvg_worker_set_find(s5, "w")));
    kvg_worker_set_unref(s1);
    kvg_worker_set_unref(s2);
    kvg_worker_set_unref(s3);
    kvg_worker_set_unref(s4);
    kvg_worker_set_unref(s5);
}

static void test_remove_and_drain(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    assert_int_equal(put(reg, "a", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    assert_int_equal(put(reg, "b", "http://h:2", KVG_WORKER_SOURCE_CONFIG), 0);
    kvg_worker_set *before = kvg_registry_acquire(reg);

    uint64_t g = kvg_registry_generation(reg);
    assert_int_equal(kvg_registry_drain(reg, "nope"), KVG_ENOTFOUND);
    assert_int_equal(kvg_registry_drain(reg, NULL), KVG_ENOTFOUND);
    assert_int_equal(kvg_registry_generation(reg), g);
    assert_int_equal(kvg_registry_drain(reg, "a"), 0);
    assert_int_equal(kvg_registry_generation(reg), g + 1);
    kvg_worker *a = kvg_worker_set_find(before, "a");
    assert_true(kvg_worker_draining(a));
    assert_false(kvg_worker_retired(a));
    assert_int_equal(kvg_registry_drain(reg, "a"), 0); /* idempotent */

    /* re-putting the same definition puts it back into service, same object */
    assert_int_equal(put(reg, "a", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    assert_false(kvg_worker_draining(a));
    assert_false(kvg_worker_retired(a));

    assert_int_equal(kvg_registry_remove(reg, "a"), 0);
    assert_int_equal(kvg_registry_remove(reg, "a"), KVG_ENOTFOUND);
    assert_int_equal(kvg_registry_remove(reg, NULL), KVG_ENOTFOUND);
    assert_true(kvg_worker_retired(a));
    assert_int_equal(kvg_registry_remove(reg, "b"), 0); /* config workers can go too */
    kvg_worker_set *after = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_count(after), 0);
    /* the old snapshot is unchanged and its workers usable */
    assert_int_equal(kvg_worker_set_count(before), 2);
    assert_string_equal(kvg_worker_name(kvg_worker_set_at(before, 1)), "b");
    assert_true(kvg_worker_inflight_try_acquire(a));
    kvg_worker_inflight_release(a);
    kvg_worker_set_unref(after);
    kvg_worker_set_unref(before);
    kvg_registry_free(reg);
}

static void test_layers(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    kvg_worker_def cfg[] = {
        {.name = "a", .url = "http://c:1"},
        {.name = "b", .url = "http://c:2"},
    };
    char msg[128];
    assert_int_equal(kvg_registry_replace_config(reg, cfg, 2, msg, sizeof(msg)), 0);
    /* an admin definition hides the config one of the same name */
    assert_int_equal(put(reg, "a", "http://admin:1", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_count(s), 2);
    kvg_worker *a = kvg_worker_ref(kvg_worker_set_find(s, "a")); /* outlives the snapshots */
    assert_string_equal(kvg_worker_url(a), "http://admin:1");
    assert_int_equal(kvg_worker_source_of(a), KVG_WORKER_SOURCE_ADMIN);
    kvg_worker_set_unref(s);

    /* a reload does not touch it, even when the config changes that name */
    cfg[0].url = "http://c:11";
    assert_int_equal(kvg_registry_replace_config(reg, cfg, 2, msg, sizeof(msg)), 0);
    s = kvg_registry_acquire(reg);
    assert_ptr_equal(kvg_worker_set_find(s, "a"), a);
    assert_false(kvg_worker_retired(a));
    kvg_worker_set_unref(s);

    /* a config put under an admin name is recorded but stays hidden, and does not undrain */
    assert_int_equal(kvg_registry_drain(reg, "a"), 0);
    assert_int_equal(put(reg, "a", "http://c:12", KVG_WORKER_SOURCE_CONFIG), 0);
    assert_true(kvg_worker_draining(a));

    /* removing the admin one brings the config one back */
    assert_int_equal(kvg_registry_remove(reg, "a"), 0);
    s = kvg_registry_acquire(reg);
    kvg_worker *ca = kvg_worker_ref(kvg_worker_set_find(s, "a"));
    assert_non_null(ca);
    assert_string_equal(kvg_worker_url(ca), "http://c:12");
    assert_int_equal(kvg_worker_source_of(ca), KVG_WORKER_SOURCE_CONFIG);
    assert_false(kvg_worker_draining(ca));
    assert_true(kvg_worker_retired(a));
    kvg_worker_set_unref(s);

    /* an identical admin definition adopts the config worker: same object, source admin */
    assert_int_equal(put(reg, "b", "http://c:2", KVG_WORKER_SOURCE_ADMIN), 0);
    s = kvg_registry_acquire(reg);
    kvg_worker *b = kvg_worker_set_find(s, "b");
    assert_int_equal(kvg_worker_source_of(b), KVG_WORKER_SOURCE_ADMIN);
    kvg_worker_set_unref(s);
    /* and survives a reload that drops the config entry */
    assert_int_equal(kvg_registry_replace_config(reg, NULL, 0, msg, sizeof(msg)), 0);
    s = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_count(s), 1);
    assert_ptr_equal(kvg_worker_set_find(s, "b"), b);
    assert_false(kvg_worker_retired(b));
    assert_true(kvg_worker_retired(ca));
    kvg_worker_set_unref(s);
    kvg_worker_unref(ca);
    kvg_worker_unref(a);
    kvg_registry_free(reg);
}

static void test_replace_config_all_or_nothing(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    const char *models[] = {"m1"};
    kvg_worker_def good[] = {
        {.name = "z", .url = "http://h:3"},
        {.name = "x", .url = "http://h:1", .models = models, .nmodels = 1},
        {.name = "y", .url = "http://h:2"},
    };
    char msg[256];
    assert_int_equal(kvg_registry_replace_config(reg, good, 3, msg, sizeof(msg)), 0);
    kvg_worker_set *s1 = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_count(s1), 3);
    assert_string_equal(kvg_worker_name(kvg_worker_set_at(s1, 0)), "x");
    assert_int_equal(kvg_worker_source_of(kvg_worker_set_at(s1, 0)), KVG_WORKER_SOURCE_CONFIG);
    uint64_t g = kvg_registry_generation(reg);

    kvg_worker_def bad[] = {
        {.name = "x", .url = "http://h:1"},
        {.name = "y", .url = "https://h:2"},
    };
    assert_int_equal(kvg_registry_replace_config(reg, bad, 2, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "worker \"y\": url: https is not supported; workers are reached "
                             "over cleartext HTTP (http://host:port)");
    bad[1] = (kvg_worker_def){.name = "bad name", .url = "http://h:2"};
    assert_int_equal(kvg_registry_replace_config(reg, bad, 2, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg,
                        "workers[1]: name: invalid character 0x20 (allowed: A-Z a-z 0-9 . _ -)");
    bad[1] = (kvg_worker_def){.name = "x", .url = "http://h:9"};
    assert_int_equal(kvg_registry_replace_config(reg, bad, 2, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "worker \"x\": defined more than once");
    assert_int_equal(
        kvg_registry_replace_config(reg, bad, KVG_REGISTRY_WORKERS_MAX + 1, msg, sizeof(msg)),
        KVG_ELIMIT);

    /* nothing changed */
    assert_int_equal(kvg_registry_generation(reg), g);
    kvg_worker_set *s2 = kvg_registry_acquire(reg);
    assert_ptr_equal(s1, s2);
    kvg_worker_set_unref(s2);

    /* a reload keeps identical workers, replaces changed ones and retires dropped ones */
    kvg_worker_def next[] = {
        {.name = "x", .url = "http://h:1", .models = models, .nmodels = 1},
        {.name = "y", .url = "http://h:22"},
        {.name = "w", .url = "http://h:4"},
    };
    assert_int_equal(kvg_registry_replace_config(reg, next, 3, msg, sizeof(msg)), 0);
    s2 = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_count(s2), 3);
    assert_ptr_equal(kvg_worker_set_find(s2, "x"), kvg_worker_set_find(s1, "x"));
    assert_ptr_not_equal(kvg_worker_set_find(s2, "y"), kvg_worker_set_find(s1, "y"));
    assert_true(kvg_worker_retired(kvg_worker_set_find(s1, "y")));
    assert_true(kvg_worker_retired(kvg_worker_set_find(s1, "z")));
    assert_false(kvg_worker_retired(kvg_worker_set_find(s1, "x")));
    assert_null(kvg_worker_set_find(s2, "z"));
    kvg_worker_set_unref(s2);
    kvg_worker_set_unref(s1);
    kvg_registry_free(reg);
}

static void test_worker_limit(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    char name[16], msg[128];
    for (int i = 0; i < KVG_REGISTRY_WORKERS_MAX; i++) {
        snprintf(name, sizeof(name), "w%d", i);
        assert_int_equal(put(reg, name, "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    }
    kvg_worker_def d = {.name = "one-more", .url = "http://h:1"};
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg)),
                     KVG_ELIMIT);
    assert_string_equal(msg, "too many workers (at most 4096)");
    /* replacing an existing one is still fine, and config has its own budget */
    assert_int_equal(put(reg, "w7", "http://h:2", KVG_WORKER_SOURCE_ADMIN), 0);
    assert_int_equal(put(reg, "one-more", "http://h:2", KVG_WORKER_SOURCE_CONFIG), 0);
    kvg_worker_set *s = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_count(s), KVG_REGISTRY_WORKERS_MAX + 1);
    kvg_worker_set_unref(s);
    kvg_registry_free(reg);
}

/* ---- concurrency -------------------------------------------------------------------------- */

#define STRESS_READERS 4
#define STRESS_ROUNDS 3000

typedef struct stress {
    kvg_registry *reg;
    _Atomic bool stop;
    _Atomic unsigned long reads;
    unsigned thread;
} stress;

typedef struct reader_arg {
    stress *st;
    unsigned thread;
    int failures;
} reader_arg;

static void *reader(void *p)
{
    reader_arg *ra = p;
    stress *st = ra->st;
    uint64_t last_gen = 0;
    unsigned long n = 0;
    while (!atomic_load(&st->stop) || n < 100) {
        kvg_worker_set *s = kvg_registry_acquire(st->reg);
        uint64_t g = kvg_worker_set_generation(s);
        if (g < last_gen)
            ra->failures++;
        last_gen = g;
        if (kvg_registry_generation(st->reg) < g)
            ra->failures++;
        size_t cnt = kvg_worker_set_count(s);
        for (size_t i = 0; i < cnt; i++) {
            kvg_worker *w = kvg_worker_set_at(s, i);
            if (i && strcmp(kvg_worker_name(kvg_worker_set_at(s, i - 1)), kvg_worker_name(w)) >= 0)
                ra->failures++;
            if (kvg_worker_set_find(s, kvg_worker_name(w)) != w)
                ra->failures++;
            /* hold a worker beyond the snapshot, like a request in flight */
            kvg_worker *held = kvg_worker_ref(w);
            void **slot = kvg_worker_thread_slot(held, ra->thread);
            if (!slot || *slot)
                ra->failures++;
            if (kvg_worker_inflight_try_acquire(held)) {
                if (kvg_worker_inflight(held) > kvg_worker_max_inflight(held))
                    ra->failures++;
                kvg_worker_record(held, (int)(n % 600), n * 1000, n * 100);
                kvg_worker_record_retry(held);
                kvg_worker_health_observe(held, (n & 3) != 0);
                kvg_worker_inflight_release(held);
            }
            (void)kvg_worker_draining(held);
            (void)kvg_worker_retired(held);
            (void)kvg_worker_serves(held, "m");
            (void)kvg_worker_authority(held);
            kvg_worker_unref(held);
        }
        size_t nm;
        kvg_worker_set_models(s, &nm);
        if (n % 64 == 0) {
            kvg_buf b;
            kvg_buf_init(&b);
            kvg_registry_write_metrics(st->reg, &b);
            if (b.failed || b.len == 0)
                ra->failures++;
            kvg_buf_done(&b);
        }
        kvg_worker_set_unref(s);
        n++;
    }
    atomic_fetch_add(&st->reads, n);
    return NULL;
}

static void test_concurrent_stress(void **state)
{
    (void)state;
    kvg_registry_config cfg = {.nthreads = STRESS_READERS, .default_max_inflight = 2};
    stress st = {.reg = NULL};
    assert_int_equal(kvg_registry_new(&cfg, &st.reg), 0);
    atomic_init(&st.stop, false);
    atomic_init(&st.reads, 0);
    pthread_t th[STRESS_READERS];
    reader_arg args[STRESS_READERS];
    for (unsigned i = 0; i < STRESS_READERS; i++) {
        args[i] = (reader_arg){.st = &st, .thread = i};
        assert_int_equal(pthread_create(&th[i], NULL, reader, &args[i]), 0);
    }

    const char *models[] = {"m", "n"};
    char name[16], url[32], msg[128];
    uint64_t last = kvg_registry_generation(st.reg);
    for (int r = 0; r < STRESS_ROUNDS; r++) {
        snprintf(name, sizeof(name), "w%d", r % 13);
        snprintf(url, sizeof(url), "http://h%d:%d", r % 3, 1000 + r % 5);
        kvg_worker_def d = {.name = name, .url = url, .models = models, .nmodels = (size_t)(r % 3)};
        switch (r % 5) {
        case 0:
        case 1:
            assert_int_equal(
                kvg_registry_put(st.reg, &d, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg)), 0);
            break;
        case 2: {
            int rc = kvg_registry_remove(st.reg, name);
            assert_true(rc == 0 || rc == KVG_ENOTFOUND);
            break;
        }
        case 3: {
            int rc = kvg_registry_drain(st.reg, name);
            assert_true(rc == 0 || rc == KVG_ENOTFOUND);
            break;
        }
        case 4: {
            kvg_worker_def defs[3] = {d, d, d};
            defs[1].name = "c1";
            defs[2].name = "c2";
            defs[2].url = r % 2 ? "http://x:1" : "http://x:2";
            assert_int_equal(kvg_registry_replace_config(st.reg, defs, 3, msg, sizeof(msg)), 0);
            break;
        }
        }
        uint64_t g = kvg_registry_generation(st.reg);
        assert_true(g >= last);
        last = g;
    }
    atomic_store(&st.stop, true);
    for (unsigned i = 0; i < STRESS_READERS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    assert_true(atomic_load(&st.reads) >= STRESS_READERS * 100);

    kvg_worker_set *s = kvg_registry_acquire(st.reg);
    for (size_t i = 0; i < kvg_worker_set_count(s); i++)
        assert_int_equal(kvg_worker_inflight(kvg_worker_set_at(s, i)), 0);
    kvg_worker_set_unref(s);
    kvg_registry_free(st.reg);
}

/* ---- the cache_salt switch ------------------------------------------------------------------ */

static void test_cache_salt_switch(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    /* zero-initialised definitions inject, as before the switch existed */
    kvg_worker_def d = {.name = "w", .url = "http://h:1"};
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    kvg_worker_set *s1 = kvg_registry_acquire(reg);
    kvg_worker *w1 = kvg_worker_set_find(s1, "w");
    assert_true(kvg_worker_injects_salt(w1));

    /* the same definition again keeps the worker */
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    kvg_worker_set *s2 = kvg_registry_acquire(reg);
    assert_ptr_equal(kvg_worker_set_find(s2, "w"), w1);

    /* a changed switch is a changed definition: a fresh worker */
    d.no_cache_salt = true;
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    kvg_worker_set *s3 = kvg_registry_acquire(reg);
    kvg_worker *w3 = kvg_worker_set_find(s3, "w");
    assert_ptr_not_equal(w3, w1);
    assert_false(kvg_worker_injects_salt(w3));
    assert_true(kvg_worker_retired(w1));
    assert_true(kvg_worker_injects_salt(w1)); /* old snapshots keep what they had */

    /* and back */
    d.no_cache_salt = false;
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    kvg_worker_set *s4 = kvg_registry_acquire(reg);
    assert_ptr_not_equal(kvg_worker_set_find(s4, "w"), w3);
    assert_true(kvg_worker_injects_salt(kvg_worker_set_find(s4, "w")));

    /* config workers carry it too */
    kvg_worker_def cfg[] = {{.name = "c", .url = "http://h:2", .no_cache_salt = true}};
    assert_int_equal(kvg_registry_replace_config(reg, cfg, 1, NULL, 0), 0);
    kvg_worker_set *s5 = kvg_registry_acquire(reg);
    assert_false(kvg_worker_injects_salt(kvg_worker_set_find(s5, "c")));

    kvg_worker_set_unref(s1);
    kvg_worker_set_unref(s2);
    kvg_worker_set_unref(s3);
    kvg_worker_set_unref(s4);
    kvg_worker_set_unref(s5);
    kvg_registry_free(reg);
}

/* ---- the admin layer as JSON ---------------------------------------------------------------- */

static char *admin_json(kvg_registry *reg)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_registry_admin_to_json(reg, &b);
    assert_false(b.failed);
    return kvg_buf_steal(&b, NULL);
}

/* Parse text (a test literal) and load it as the admin layer. */
static int load_admin(kvg_registry *reg, const char *text, char *msg, size_t len)
{
    kvg_arena a;
    kvg_json *v;
    kvg_arena_init(&a, 0);
    assert_int_equal(kvg_json_parse(text, strlen(text), &a, NULL, &v, NULL), 0);
    int rc = kvg_registry_admin_from_json(reg, v, msg, len);
    kvg_arena_done(&a);
    return rc;
}

static void test_admin_json_round_trip(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    char *empty = admin_json(reg);
    assert_string_equal(empty, "[]");
    free(empty);

    kvg_worker_def cfg[] = {
        {.name = "cfg", .url = "http://c:1"},
        {.name = "shadow", .url = "http://c:2"},
    };
    assert_int_equal(kvg_registry_replace_config(reg, cfg, 2, NULL, 0), 0);
    const char *models[] = {"llama \"3\"", "m\\2"};
    kvg_worker_def a1 = {.name = "a1",
                         .url = "http://[::1]:8001/",
                         .models = models,
                         .nmodels = 2,
                         .kv_blocks = 4294967295u,
                         .max_inflight = 7,
                         .no_cache_salt = true};
    kvg_worker_def shadow = {.name = "shadow", .url = "http://admin:2"};
    assert_int_equal(kvg_registry_put(reg, &a1, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    assert_int_equal(kvg_registry_put(reg, &shadow, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);

    /* only the admin layer, sorted, every field, max_inflight as defined */
    char *text = admin_json(reg);
    assert_string_equal(
        text,
        "[\n{\"name\":\"a1\",\"url\":\"http://[::1]:8001/\",\"models\":"
        "[\"llama \\\"3\\\"\",\"m\\\\2\"],\"kv_blocks\":4294967295,"
        "\"max_inflight\":7,\"cache_salt\":false,\"kv_events_stale_ms\":0},\n"
        "{\"name\":\"shadow\",\"url\":\"http://admin:2\",\"models\":[],"
        "\"kv_blocks\":0,\"max_inflight\":0,\"cache_salt\":true,\"kv_events_stale_ms\":0}\n]");

    /* into a fresh registry with the same config: the same workers, the same JSON */
    kvg_registry *reg2 = new_registry(1);
    assert_int_equal(kvg_registry_replace_config(reg2, cfg, 2, NULL, 0), 0);
    char msg[256];
    uint64_t g = kvg_registry_generation(reg2);
    assert_int_equal(load_admin(reg2, text, msg, sizeof(msg)), 0);
    assert_int_equal(kvg_registry_generation(reg2), g + 1); /* one publish */
    char *text2 = admin_json(reg2);
    assert_string_equal(text2, text);
    kvg_worker_set *s = kvg_registry_acquire(reg2);
    assert_int_equal(kvg_worker_set_count(s), 3);
    kvg_worker *w = kvg_worker_set_find(s, "a1");
    assert_int_equal(kvg_worker_source_of(w), KVG_WORKER_SOURCE_ADMIN);
    assert_false(kvg_worker_injects_salt(w));
    assert_int_equal(kvg_worker_kv_blocks(w), 4294967295u);
    assert_int_equal(kvg_worker_max_inflight(w), 7);
    assert_int_equal(kvg_worker_model_count(w), 2);
    assert_string_equal(kvg_worker_model(w, 0), "llama \"3\"");
    assert_string_equal(kvg_worker_url(kvg_worker_set_find(s, "shadow")), "http://admin:2");
    assert_int_equal(kvg_worker_max_inflight(kvg_worker_set_find(s, "shadow")), 1024);
    kvg_worker *c = kvg_worker_set_find(s, "cfg");
    assert_int_equal(kvg_worker_source_of(c), KVG_WORKER_SOURCE_CONFIG);
    assert_true(kvg_worker_injects_salt(c));

    /* loading the same again keeps every worker object; a smaller array removes the rest
     * and brings the hidden config worker back; config workers stay */
    assert_int_equal(load_admin(reg2, text, msg, sizeof(msg)), 0);
    kvg_worker_set *s2 = kvg_registry_acquire(reg2);
    assert_ptr_equal(kvg_worker_set_find(s2, "a1"), w);
    assert_ptr_equal(kvg_worker_set_find(s2, "cfg"), c);
    assert_int_equal(
        load_admin(reg2, "[{\"url\":\"http://x:9\",\"name\":\"new\"}]", msg, sizeof(msg)), 0);
    kvg_worker_set *s3 = kvg_registry_acquire(reg2);
    assert_int_equal(kvg_worker_set_count(s3), 3);
    assert_null(kvg_worker_set_find(s3, "a1"));
    assert_true(kvg_worker_retired(w));
    assert_ptr_equal(kvg_worker_set_find(s3, "cfg"), c);
    kvg_worker *sh = kvg_worker_set_find(s3, "shadow");
    assert_string_equal(kvg_worker_url(sh), "http://c:2");
    assert_int_equal(kvg_worker_source_of(sh), KVG_WORKER_SOURCE_CONFIG);
    kvg_worker *nw = kvg_worker_set_find(s3, "new");
    assert_true(kvg_worker_injects_salt(nw)); /* cache_salt defaults to true */
    assert_int_equal(kvg_worker_max_inflight(nw), 1024);
    assert_int_equal(load_admin(reg2, "[]", msg, sizeof(msg)), 0);
    kvg_worker_set *s4 = kvg_registry_acquire(reg2);
    assert_int_equal(kvg_worker_set_count(s4), 2);
    char *none = admin_json(reg2);
    assert_string_equal(none, "[]");

    free(none);
    kvg_worker_set_unref(s);
    kvg_worker_set_unref(s2);
    kvg_worker_set_unref(s3);
    kvg_worker_set_unref(s4);
    free(text2);
    free(text);
    kvg_registry_free(reg2);
    kvg_registry_free(reg);
}

typedef struct admin_json_case {
    const char *json;
    int rc;
    const char *msg;
} admin_json_case;

static void test_admin_json_rejects(void **state)
{
    (void)state;
    static const admin_json_case cases[] = {
        {"{}", KVG_EPARSE, "must be an array of worker objects"},
        {"[1]", KVG_EPARSE, "workers[0]: must be an object"},
        {"[{\"url\":\"http://h:1\"}]", KVG_EPARSE, "workers[0]: name: required"},
        {"[{\"name\":\"w\"}]", KVG_EPARSE, "worker \"w\": url: required"},
        {"[{\"name\":\"w\",\"url\":\"ftp://h:1\"}]", KVG_EPARSE,
         "worker \"w\": url: must look like"},
        {"[{\"name\":\"a/b\",\"url\":\"http://h:1\"}]", KVG_EPARSE,
         "workers[0]: name: invalid character '/'"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"gpu\":1}]", KVG_EPARSE,
         "worker \"w\": gpu: unknown field"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"url\":\"http://h:2\"}]", KVG_EPARSE,
         "worker \"w\": url: appears more than once"},
        {"[{\"name\":1,\"url\":\"http://h:1\"}]", KVG_EPARSE, "workers[0]: name: must be a string"},
        {"[{\"name\":\"w\\u0000x\",\"url\":\"http://h:1\"}]", KVG_EPARSE,
         "workers[0]: name: must not contain NUL characters"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"models\":\"m\"}]", KVG_EPARSE,
         "worker \"w\": models: must be an array of strings"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"models\":[\"m\",2]}]", KVG_EPARSE,
         "worker \"w\": models[1]: must be a string"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"models\":[\"m\",\"m\"]}]", KVG_EPARSE,
         "worker \"w\": models[1]: duplicate of models[0]"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"kv_blocks\":-1}]", KVG_EPARSE,
         "worker \"w\": kv_blocks: must be an integer in 0..4294967295"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"kv_blocks\":4294967296}]", KVG_EPARSE,
         "worker \"w\": kv_blocks: must be an integer"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"max_inflight\":1.5}]", KVG_EPARSE,
         "worker \"w\": max_inflight: must be an integer"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"max_inflight\":\"8\"}]", KVG_EPARSE,
         "worker \"w\": max_inflight: must be an integer"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"cache_salt\":\"off\"}]", KVG_EPARSE,
         "worker \"w\": cache_salt: must be true or false"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\",\"cache_salt\":null}]", KVG_EPARSE,
         "worker \"w\": cache_salt: must be true or false"},
        {"[{\"name\":\"w\",\"url\":\"http://h:1\"},{\"name\":\"w\",\"url\":\"http://h:2\"}]",
         KVG_EPARSE, "worker \"w\": defined more than once"},
        {"[{\"name\":\"ok\",\"url\":\"http://h:1\"},{\"name\":\"bad\",\"url\":\"http://h\"}]",
         KVG_EPARSE, "worker \"bad\": url: missing port"},
    };
    kvg_registry *reg = new_registry(1);
    kvg_worker_def cfg[] = {{.name = "cfg", .url = "http://c:1"}};
    assert_int_equal(kvg_registry_replace_config(reg, cfg, 1, NULL, 0), 0);
    assert_int_equal(put(reg, "keep", "http://h:9", KVG_WORKER_SOURCE_ADMIN), 0);
    char *before = admin_json(reg);
    uint64_t g = kvg_registry_generation(reg);
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        char msg[256] = "";
        int rc = load_admin(reg, cases[i].json, msg, sizeof(msg));
        if (rc != cases[i].rc || strncmp(msg, cases[i].msg, strlen(cases[i].msg)) != 0)
            fail_msg("case %zu %s: got %d '%s', want %d '%s'", i, cases[i].json, rc, msg,
                     cases[i].rc, cases[i].msg);
        /* nothing changed */
        assert_int_equal(kvg_registry_generation(reg), g);
        char *after = admin_json(reg);
        assert_string_equal(after, before);
        free(after);
    }
    assert_int_equal(kvg_registry_admin_from_json(reg, NULL, NULL, 0), -EINVAL);
    /* an unknown field with a hostile name is shown bounded and printable */
    char msg[256];
    assert_int_equal(load_admin(reg,
                                "[{\"name\":\"w\",\"url\":\"http://h:1\",\"\\n\\u0000\\\"x"
                                "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\":1}]",
                                msg, sizeof(msg)),
                     KVG_EPARSE);
    assert_string_equal(msg, "worker \"w\": ???xyyyyyyyyyyyyyyyyyyyyyyyyyyyy...: unknown field");

    /* too many */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_putc(&b, '[');
    for (int i = 0; i <= KVG_REGISTRY_WORKERS_MAX; i++)
        kvg_buf_printf(&b, "%s{\"name\":\"w%d\",\"url\":\"http://h:1\"}", i ? "," : "", i);
    kvg_buf_putc(&b, ']');
    assert_int_equal(load_admin(reg, b.data, msg, sizeof(msg)), KVG_ELIMIT);
    assert_string_equal(msg, "too many workers (at most 4096)");
    kvg_buf_done(&b);
    assert_int_equal(kvg_registry_generation(reg), g);
    free(before);
    kvg_registry_free(reg);
}

/* ---- allocation failures -------------------------------------------------------------------- */

/* Run op with the n-th allocation failing, for n = 0, 1, ... until it runs clean. Each failing
 * run must return -ENOMEM and leave the registry as it was (same generation and snapshot);
 * ASan checks that nothing leaks. */
typedef int (*reg_op)(kvg_registry *reg, char *msg, size_t len);

static void check_alloc_failures(reg_op op, reg_op setup)
{
    for (long n = 0;; n++) {
        kvg_registry *reg = new_registry(2);
        char msg[128];
        if (setup)
            assert_int_equal(setup(reg, msg, sizeof(msg)), 0);
        kvg_worker_set *before = kvg_registry_acquire(reg);
        uint64_t g = kvg_registry_generation(reg);
        fail_alloc_nth(n);
        int rc = op(reg, msg, sizeof(msg));
        bool injected = fail_alloc_off();
        kvg_worker_set *after = kvg_registry_acquire(reg);
        if (injected) {
            if (rc != -ENOMEM)
                fail_msg("allocation %ld failed but op returned %d", n, rc);
            assert_int_equal(kvg_registry_generation(reg), g);
            assert_ptr_equal(before, after);
        } else {
            assert_int_equal(rc, 0);
            assert_true(kvg_registry_generation(reg) > g);
        }
        kvg_worker_set_unref(after);
        kvg_worker_set_unref(before);
        kvg_registry_free(reg);
        if (!injected) {
            assert_true(n > 0);
            return;
        }
    }
}

static int op_setup(kvg_registry *reg, char *msg, size_t len)
{
    const char *models[] = {"m"};
    kvg_worker_def defs[] = {
        {.name = "c1", .url = "http://h:1", .models = models, .nmodels = 1},
        {.name = "c2", .url = "http://h:2"},
    };
    int rc = kvg_registry_replace_config(reg, defs, 2, msg, len);
    if (rc == 0)
        rc = put(reg, "a1", "http://h:3", KVG_WORKER_SOURCE_ADMIN);
    return rc;
}

static int op_put_new(kvg_registry *reg, char *msg, size_t len)
{
    const char *models[] = {"x", "y"};
    kvg_worker_def d = {.name = "new", .url = "http://[::1]:5", .models = models, .nmodels = 2};
    return kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, msg, len);
}

static int op_put_replace(kvg_registry *reg, char *msg, size_t len)
{
    kvg_worker_def d = {.name = "c1", .url = "http://h:99"};
    return kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, msg, len);
}

static int op_replace_config(kvg_registry *reg, char *msg, size_t len)
{
    kvg_worker_def defs[] = {
        {.name = "c2", .url = "http://h:2"},
        {.name = "c3", .url = "http://h:4"},
        {.name = "a1", .url = "http://h:5"},
    };
    return kvg_registry_replace_config(reg, defs, 3, msg, len);
}

static int op_remove(kvg_registry *reg, char *msg, size_t len)
{
    return kvg_registry_remove(reg, "c1");
}

static int op_drain(kvg_registry *reg, char *msg, size_t len)
{
    return kvg_registry_drain(reg, "a1");
}

static int op_admin_from_json(kvg_registry *reg, char *msg, size_t len)
{
    const char *text = "[{\"name\":\"a1\",\"url\":\"http://h:3\"},"
                       "{\"name\":\"c1\",\"url\":\"http://h:8\",\"models\":[\"m\",\"n\"],"
                       "\"cache_salt\":false},{\"name\":\"z\",\"url\":\"http://h:9\"}]";
    kvg_arena a;
    kvg_json *v;
    kvg_arena_init(&a, 0);
    /* A failure in the parse counts too: it fails with -ENOMEM and changes nothing. */
    int rc = kvg_json_parse(text, strlen(text), &a, NULL, &v, NULL);
    if (rc == 0)
        rc = kvg_registry_admin_from_json(reg, v, msg, len);
    kvg_arena_done(&a);
    return rc;
}

static void test_alloc_failures(void **state)
{
    (void)state;
    check_alloc_failures(op_admin_from_json, NULL);
    check_alloc_failures(op_admin_from_json, op_setup);
    check_alloc_failures(op_put_new, NULL);
    check_alloc_failures(op_put_new, op_setup);
    check_alloc_failures(op_put_replace, op_setup);
    check_alloc_failures(op_replace_config, NULL);
    check_alloc_failures(op_replace_config, op_setup);
    check_alloc_failures(op_remove, op_setup);
    check_alloc_failures(op_drain, op_setup);

    /* the constructor, and the metrics writer into a failing buffer */
    for (long n = 0;; n++) {
        kvg_registry *reg = NULL;
        fail_alloc_nth(n);
        int rc = kvg_registry_new(NULL, &reg);
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_registry_free(reg);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        assert_null(reg);
    }
    kvg_registry *reg = new_registry(1);
    assert_int_equal(put(reg, "w", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_buf b;
    kvg_buf_init(&b);
    fail_alloc_nth(0);
    kvg_registry_write_metrics(reg, &b);
    assert_true(fail_alloc_off());
    assert_true(b.failed);
    kvg_buf_done(&b);
    kvg_buf_init(&b);
    fail_alloc_nth(0);
    kvg_registry_admin_to_json(reg, &b);
    assert_true(fail_alloc_off());
    assert_true(b.failed);
    kvg_buf_done(&b);
    kvg_registry_free(reg);
}

/* ---- the registry's snapshot slot through a per-thread cache (common/snapshot.h) ---------- */

static void test_snapshot_cache(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    kvg_snapshot_cache cache;
    kvg_snapshot_cache_init(&cache, kvg_registry_snapshots(reg));
    assert_true(kvg_snapshot_cache_refresh(&cache));
    kvg_worker_set *set = kvg_worker_set_of(kvg_snapshot_cache_get(&cache));
    kvg_worker_set *acquired = kvg_registry_acquire(reg);
    assert_ptr_equal(set, acquired); /* the same published object, not a copy */
    kvg_worker_set_unref(acquired);
    assert_int_equal(kvg_worker_set_generation(set), kvg_registry_generation(reg));
    assert_int_equal(kvg_worker_set_count(set), 0);

    /* Nothing published: no reload, whatever was tried. */
    char msg[256];
    kvg_worker_def bad = {.name = "a", .url = "ftp://h:1"};
    assert_int_equal(kvg_registry_put(reg, &bad, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg)),
                     KVG_EPARSE);
    assert_int_equal(kvg_registry_remove(reg, "nope"), KVG_ENOTFOUND);
    assert_int_equal(kvg_registry_drain(reg, "nope"), KVG_ENOTFOUND);
    assert_false(kvg_snapshot_cache_refresh(&cache));

    /* A put: the new snapshot, one generation up; the old one, still held, is unchanged. */
    kvg_worker_set *before = kvg_registry_acquire(reg);
    assert_int_equal(put(reg, "a", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    assert_true(kvg_snapshot_cache_refresh(&cache));
    set = kvg_worker_set_of(kvg_snapshot_cache_get(&cache));
    assert_int_equal(kvg_worker_set_generation(set), kvg_worker_set_generation(before) + 1);
    assert_int_equal(kvg_worker_set_count(set), 1);
    assert_int_equal(kvg_worker_set_count(before), 0);
    kvg_worker_set_unref(before);
    kvg_worker *a = kvg_worker_set_find(set, "a");

    /* A drain publishes the same workers under a new number. */
    assert_int_equal(kvg_registry_drain(reg, "a"), 0);
    assert_true(kvg_snapshot_cache_refresh(&cache));
    set = kvg_worker_set_of(kvg_snapshot_cache_get(&cache));
    assert_ptr_equal(kvg_worker_set_find(set, "a"), a);
    assert_true(kvg_worker_draining(a));
    assert_false(kvg_snapshot_cache_refresh(&cache));

    /* The thread's snapshot outlives the registry (a thread that ends after it). */
    kvg_registry_free(reg);
    assert_true(kvg_worker_retired(a));
    assert_string_equal(kvg_worker_name(kvg_worker_set_at(set, 0)), "a");
    kvg_snapshot_cache_done(&cache);
}

typedef struct cache_reader {
    kvg_registry *reg;
    _Atomic bool *stop;
    int failures;
    unsigned long reloads;
} cache_reader;

/* A gateway thread's pattern: refresh per "request", route with the cached set. */
static void *read_through_cache(void *p)
{
    cache_reader *r = p;
    kvg_snapshot_cache cache;
    kvg_snapshot_cache_init(&cache, kvg_registry_snapshots(r->reg));
    uint64_t last = 0;
    while (!atomic_load(r->stop)) {
        uint64_t g = kvg_registry_generation(r->reg);
        if (kvg_snapshot_cache_refresh(&cache))
            r->reloads++;
        kvg_worker_set *s = kvg_worker_set_of(kvg_snapshot_cache_get(&cache));
        uint64_t sg = kvg_worker_set_generation(s);
        if (sg < g || sg < last)
            r->failures++;
        last = sg;
        for (size_t i = 0; i < kvg_worker_set_count(s); i++) {
            kvg_worker *w = kvg_worker_set_at(s, i);
            if (kvg_worker_set_find(s, kvg_worker_name(w)) != w)
                r->failures++;
        }
    }
    kvg_snapshot_cache_done(&cache);
    return NULL;
}

static void test_snapshot_cache_threads(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(2);
    _Atomic bool stop = false;
    pthread_t th[2];
    cache_reader r[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (cache_reader){.reg = reg, .stop = &stop};
        assert_int_equal(pthread_create(&th[i], NULL, read_through_cache, &r[i]), 0);
    }
    char name[16], url[32];
    uint64_t g = kvg_registry_generation(reg);
    for (int i = 0; i < 2000; i++) {
        snprintf(name, sizeof(name), "w%d", i % 7);
        snprintf(url, sizeof(url), "http://h:%d", 1000 + i % 3);
        if (i % 4 == 3) {
            int rc = kvg_registry_remove(reg, name);
            assert_true(rc == 0 || rc == KVG_ENOTFOUND);
        } else {
            assert_int_equal(put(reg, name, url, KVG_WORKER_SOURCE_ADMIN), 0);
        }
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(r[i].failures, 0);
    }
    assert_true(kvg_registry_generation(reg) > g);
    kvg_registry_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_config),
        cmocka_unit_test(test_reput_identical_and_changed),
        cmocka_unit_test(test_remove_and_drain),
        cmocka_unit_test(test_layers),
        cmocka_unit_test(test_replace_config_all_or_nothing),
        cmocka_unit_test(test_worker_limit),
        cmocka_unit_test(test_cache_salt_switch),
        cmocka_unit_test(test_admin_json_round_trip),
        cmocka_unit_test(test_admin_json_rejects),
        cmocka_unit_test(test_concurrent_stress),
        cmocka_unit_test(test_snapshot_cache),
        cmocka_unit_test(test_snapshot_cache_threads),
        cmocka_unit_test(test_alloc_failures),
    };
    const test_part parts[] = {
        {tests, KVG_ARRAY_LEN(tests)},
        {worker_tests, worker_tests_count},
        {metrics_tests, metrics_tests_count},
        {route_tests, route_tests_count},
    };
    return run_test_parts(parts, KVG_ARRAY_LEN(parts));
}
