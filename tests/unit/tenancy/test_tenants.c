/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the tenant store (tenancy/tenants.c): tenants put, replaced and removed,
 * snapshots and their lifetime, the per-thread snapshot cache, concurrency and allocation
 * failures; its main also runs the tests of test_tenant.c, test_keys.c, test_metrics.c and
 * test_persist.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fail_alloc.h"
#include "tenancy.h"
#include "tenancy_helpers.h"
#include "test_parts.h"

/* ---- tenants --------------------------------------------------------------------------------- */

static void test_put_and_accessors(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    const char *models[] = {"llama", "qwen"};
    kvg_tenant_def d = {.id = "acme",
                        .sharing = KVG_SHARING_GROUP,
                        .group = "research",
                        .models = models,
                        .nmodels = 2,
                        .limits = {.rps = 50, .burst = 100, .max_inflight = 8}};
    bool created = false;
    uint64_t g0 = kvg_tenants_generation(ts);
    assert_int_equal(put_def(ts, &d, &created), 0);
    assert_true(created);
    assert_true(kvg_tenants_generation(ts) > g0);
    assert_int_equal(put_simple(ts, "zeta"), 0);
    kvg_tenant_def gl = {.id = "beta", .sharing = KVG_SHARING_GLOBAL};
    assert_int_equal(put_def(ts, &gl, &created), 0);
    assert_true(created);

    kvg_tenant_set *s = kvg_tenants_acquire(ts);
    assert_int_equal(kvg_tenant_set_generation(s), kvg_tenants_generation(ts));
    assert_int_equal(kvg_tenant_set_count(s), 3);
    /* sorted by id */
    assert_string_equal(kvg_tenant_id(kvg_tenant_set_at(s, 0)), "acme");
    assert_string_equal(kvg_tenant_id(kvg_tenant_set_at(s, 1)), "beta");
    assert_string_equal(kvg_tenant_id(kvg_tenant_set_at(s, 2)), "zeta");
    assert_null(kvg_tenant_set_at(s, 3));
    assert_null(kvg_tenant_set_find(s, "nope"));
    assert_null(kvg_tenant_set_find(s, NULL));

    kvg_tenant *t = kvg_tenant_set_find(s, "acme");
    assert_non_null(t);
    assert_int_equal(kvg_tenant_sharing(t), KVG_SHARING_GROUP);
    assert_string_equal(kvg_tenant_group(t), "research");
    assert_string_equal(kvg_tenant_scope(t), "group:research");
    assert_int_equal(kvg_tenant_model_count(t), 2);
    assert_string_equal(kvg_tenant_model(t, 1), "qwen");
    assert_null(kvg_tenant_model(t, 2));
    assert_true(kvg_tenant_allows_model(t, "llama"));
    assert_false(kvg_tenant_allows_model(t, "gpt"));
    assert_true(kvg_tenant_allows_model(t, NULL));
    assert_true(kvg_tenant_limits_of(t)->rps == 50);
    assert_int_equal(kvg_tenant_limits_of(t)->max_inflight, 8);
    assert_int_equal(kvg_tenant_key_count(t), 0);
    assert_null(kvg_tenant_key(t, 0));
    assert_int_equal(kvg_tenant_ordinal(t), 0);

    kvg_tenant *z = kvg_tenant_set_find(s, "zeta");
    assert_null(kvg_tenant_group(z));
    assert_string_equal(kvg_tenant_scope(z), "tenant:zeta");
    assert_true(kvg_tenant_allows_model(z, "anything"));
    assert_int_equal(kvg_tenant_ordinal(z), 1);
    kvg_tenant *b = kvg_tenant_set_find(s, "beta");
    assert_string_equal(kvg_tenant_scope(b), "global");
    assert_int_equal(kvg_tenant_ordinal(b), 2);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);
    kvg_tenants_free(NULL);
}

/* Replacing a tenant keeps its keys, ordinal, buckets, in-flight count and counters; the
 * definition changes; an object held from before keeps its own definition. */
static void test_replace_keeps_runtime(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    assert_int_equal(put_simple(ts, "first"), 0);
    kvg_tenant_def d = {.id = "acme", .limits = {.rps = 1, .burst = 2, .max_inflight = 5}};
    assert_int_equal(put_def(ts, &d, NULL), 0);
    char key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1];
    assert_int_equal(kvg_tenants_key_create(ts, "acme", key, kid), 0);

    kvg_tenant_set *s1 = kvg_tenants_acquire(ts);
    kvg_tenant *t1 = kvg_tenant_ref(kvg_tenant_set_find(s1, "acme"));
    uint64_t now = 100 * SEC;
    unsigned ra;
    assert_int_equal(kvg_tenant_admit(t1, now, 10, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t1, now, 10, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t1, now, 10, &ra), KVG_ADMIT_RATE);
    kvg_tenant_record(t1, 200, 10);
    kvg_tenant_record_refusal(t1, KVG_ADMIT_RATE);

    const char *models[] = {"m"};
    kvg_tenant_def d2 = {.id = "acme",
                         .sharing = KVG_SHARING_GLOBAL,
                         .models = models,
                         .nmodels = 1,
                         .limits = {.rps = 1, .burst = 2, .max_inflight = 3}};
    bool created = true;
    assert_int_equal(put_def(ts, &d2, &created), 0);
    assert_false(created);

    kvg_tenant_set *s2 = kvg_tenants_acquire(ts);
    assert_true(kvg_tenant_set_generation(s2) > kvg_tenant_set_generation(s1));
    kvg_tenant *t2 = kvg_tenant_set_find(s2, "acme");
    assert_ptr_not_equal(t1, t2);
    assert_int_equal(kvg_tenant_set_count(s2), 2);
    /* definition: new */
    assert_int_equal(kvg_tenant_sharing(t2), KVG_SHARING_GLOBAL);
    assert_string_equal(kvg_tenant_scope(t2), "global");
    assert_false(kvg_tenant_allows_model(t2, "x"));
    assert_int_equal(kvg_tenant_limits_of(t2)->max_inflight, 3);
    /* keys and ordinal: kept */
    assert_int_equal(kvg_tenant_key_count(t2), 1);
    assert_string_equal(kvg_tenant_key(t2, 0)->id, kid);
    assert_ptr_equal(kvg_tenant_set_authenticate(s2, key, strlen(key)), t2);
    assert_int_equal(kvg_tenant_ordinal(t2), kvg_tenant_ordinal(t1));
    assert_int_equal(kvg_tenant_ordinal(t2), 1);
    /* runtime: shared - the bucket is still empty, in-flight is shared */
    assert_int_equal(kvg_tenant_inflight(t2), 2);
    assert_int_equal(kvg_tenant_admit(t2, now, 0, &ra), KVG_ADMIT_RATE);
    assert_int_equal(kvg_tenant_admit(t2, now + 2 * SEC, 0, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_inflight(t1), 3);
    /* the new limit (3) applies to the new object; the old object keeps its own (5) */
    assert_int_equal(kvg_tenant_admit(t2, now + 10 * SEC, 0, &ra), KVG_ADMIT_INFLIGHT);
    assert_int_equal(kvg_tenant_admit(t1, now + 10 * SEC, 0, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_sharing(t1), KVG_SHARING_ISOLATED);
    assert_string_equal(kvg_tenant_scope(t1), "tenant:acme");
    for (int i = 0; i < 4; i++)
        kvg_tenant_release(i % 2 ? t1 : t2);
    assert_int_equal(kvg_tenant_inflight(t2), 0);

    /* counters: shared */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_tenants_write_metrics(ts, 100, &b);
    assert_non_null(
        strstr(b.data, "kvgate_tenant_requests_total{tenant=\"acme\",code=\"200\"} 1\n"));
    assert_non_null(
        strstr(b.data, "kvgate_tenant_rate_limited_total{tenant=\"acme\",reason=\"rate\"} 1\n"));
    assert_non_null(strstr(b.data, "kvgate_tenant_prompt_bytes_total{tenant=\"acme\"} 10\n"));
    kvg_buf_done(&b);

    kvg_tenant_unref(t1);
    kvg_tenant_set_unref(s1);
    kvg_tenant_set_unref(s2);
    kvg_tenants_free(ts);
}

static void test_remove(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    assert_int_equal(put_simple(ts, "a"), 0);
    assert_int_equal(put_simple(ts, "b"), 0);
    kvg_tenant_def d = {.id = "c", .limits = {.max_inflight = 1}};
    assert_int_equal(put_def(ts, &d, NULL), 0);
    char key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1];
    assert_int_equal(kvg_tenants_key_create(ts, "c", key, kid), 0);
    kvg_tenant_set *before = kvg_tenants_acquire(ts);
    kvg_tenant *held = kvg_tenant_ref(kvg_tenant_set_find(before, "c"));
    assert_int_equal(kvg_tenant_admit(held, 0, 0, NULL), KVG_ADMIT_OK);

    uint64_t g = kvg_tenants_generation(ts);
    assert_int_equal(kvg_tenants_remove(ts, "c"), 0);
    assert_int_equal(kvg_tenants_generation(ts), g + 1);
    assert_int_equal(kvg_tenants_remove(ts, "c"), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_remove(ts, "zz"), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_remove(ts, NULL), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_generation(ts), g + 1);

    kvg_tenant_set *after = kvg_tenants_acquire(ts);
    assert_int_equal(kvg_tenant_set_count(after), 2);
    assert_null(kvg_tenant_set_find(after, "c"));
    assert_null(kvg_tenant_set_authenticate(after, key, strlen(key)));
    /* the old snapshot and the held tenant stay usable */
    assert_ptr_equal(kvg_tenant_set_authenticate(before, key, strlen(key)), held);
    kvg_tenant_set_unref(before);
    assert_int_equal(kvg_tenant_inflight(held), 1);
    kvg_tenant_release(held);
    kvg_tenant_release(held); /* unbalanced: must not wrap */
    assert_int_equal(kvg_tenant_inflight(held), 0);
    kvg_tenant_record(held, 200, 5);

    /* created again: a fresh runtime and a new ordinal, no keys */
    bool created = false;
    assert_int_equal(put_def(ts, &d, &created), 0);
    assert_true(created);
    kvg_tenant_set *again = kvg_tenants_acquire(ts);
    kvg_tenant *c2 = kvg_tenant_set_find(again, "c");
    assert_int_equal(kvg_tenant_key_count(c2), 0);
    assert_int_equal(kvg_tenant_ordinal(c2), 3);
    assert_int_equal(kvg_tenant_ordinal(held), 2);
    assert_int_equal(kvg_tenant_admit(c2, 0, 0, NULL), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_inflight(held), 0);
    kvg_tenant_release(c2);
    kvg_tenant_unref(held);
    kvg_tenant_set_unref(again);
    kvg_tenant_set_unref(after);
    kvg_tenants_free(ts);
}

/* ---- snapshots ------------------------------------------------------------------------------- */

static void test_snapshot_lifetime(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    kvg_tenant_set *empty = kvg_tenants_acquire(ts);
    assert_int_equal(kvg_tenant_set_count(empty), 0);
    assert_null(kvg_tenant_set_authenticate(empty, "kvg-", 4));
    char key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1];
    assert_int_equal(put_simple(ts, "a"), 0);
    assert_int_equal(kvg_tenants_key_create(ts, "a", key, kid), 0);
    kvg_tenant_set *one = kvg_tenants_acquire(ts);
    assert_int_equal(put_simple(ts, "b"), 0);
    assert_int_equal(kvg_tenant_set_count(empty), 0);
    assert_int_equal(kvg_tenant_set_count(one), 1);
    assert_true(kvg_tenant_set_generation(one) > kvg_tenant_set_generation(empty));
    kvg_tenant *a = kvg_tenant_ref(kvg_tenant_set_find(one, "a"));
    /* snapshots and tenants outlive the store */
    kvg_tenants_free(ts);
    assert_ptr_equal(kvg_tenant_set_authenticate(one, key, strlen(key)), a);
    kvg_tenant_set_unref(one);
    kvg_tenant_set_unref(empty);
    assert_string_equal(kvg_tenant_id(a), "a");
    assert_int_equal(kvg_tenant_admit(a, 0, 0, NULL), KVG_ADMIT_OK);
    kvg_tenant_release(a);
    kvg_tenant_unref(a);
    kvg_tenant_set_unref(NULL);
    kvg_tenant_unref(NULL);
}

/* ---- concurrency ----------------------------------------------------------------------------- */

#define STRESS_THREADS 4
#define STRESS_ROUNDS 2000
#define STRESS_TENANTS 8

typedef struct stress {
    kvg_tenants *ts;
    _Atomic bool stop;
    /* keys published by the writer, slot per tenant; read racily on purpose (a stale key just
     * fails to authenticate) */
    pthread_mutex_t keys_lock;
    char keys[STRESS_TENANTS][KVG_KEY_LEN + 1];
} stress;

typedef struct worker_arg {
    stress *st;
    int failures;
    unsigned long authenticated, admitted;
} worker_arg;

static void *stress_worker(void *p)
{
    worker_arg *wa = p;
    stress *st = wa->st;
    uint64_t now = 0, last_gen = 0;
    unsigned long n = 0;
    while (!atomic_load(&st->stop) || n < 200) {
        char key[KVG_KEY_LEN + 1];
        pthread_mutex_lock(&st->keys_lock);
        memcpy(key, st->keys[n % STRESS_TENANTS], sizeof(key));
        pthread_mutex_unlock(&st->keys_lock);
        kvg_tenant_set *s = kvg_tenants_acquire(st->ts);
        uint64_t g = kvg_tenant_set_generation(s);
        if (g < last_gen || kvg_tenants_generation(st->ts) < g)
            wa->failures++;
        last_gen = g;
        kvg_tenant *t = key[0] ? kvg_tenant_set_authenticate(s, key, KVG_KEY_LEN) : NULL;
        if (!t)
            t = kvg_tenant_set_at(s, n % (kvg_tenant_set_count(s) + 1));
        if (t) {
            wa->authenticated++;
            /* hold the tenant beyond the snapshot, like a request in flight */
            kvg_tenant *held = kvg_tenant_ref(t);
            kvg_tenant_set_unref(s);
            s = NULL;
            now += 1000000; /* 1 ms per request per thread */
            unsigned ra = 0;
            kvg_admit_result r = kvg_tenant_admit(held, now, n % 5000, &ra);
            if (r == KVG_ADMIT_OK) {
                /* (no in-flight bound check here: a replaced definition may lower the limit
                 * under requests already admitted; limit_worker checks the bound) */
                wa->admitted++;
                kvg_tenant_record(held, 200, n % 5000);
                (void)kvg_tenant_scope(held);
                (void)kvg_tenant_allows_model(held, "m");
                kvg_tenant_release(held);
            } else {
                if (ra < 1 || ra > 3600)
                    wa->failures++;
                kvg_tenant_record_refusal(held, r);
            }
            kvg_tenant_unref(held);
        } else {
            kvg_tenants_record_auth_failure(st->ts, "unknown");
        }
        if (s) {
            for (size_t i = 1; i < kvg_tenant_set_count(s); i++)
                if (strcmp(kvg_tenant_id(kvg_tenant_set_at(s, i - 1)),
                           kvg_tenant_id(kvg_tenant_set_at(s, i))) >= 0)
                    wa->failures++;
            kvg_tenant_set_unref(s);
        }
        if (n % 128 == 0) {
            kvg_buf b;
            kvg_buf_init(&b);
            kvg_tenants_write_metrics(st->ts, 4, &b);
            if (b.failed || b.len == 0)
                wa->failures++;
            kvg_buf_reset(&b);
            kvg_tenants_to_json(st->ts, &b);
            if (b.failed || b.len == 0)
                wa->failures++;
            kvg_buf_done(&b);
        }
        n++;
    }
    return NULL;
}

/* The max_inflight limit holds across threads: a tenant whose limit never changes never goes
 * above it, however many threads admit at once. */
typedef struct limit_arg {
    kvg_tenant *t;
    _Atomic uint32_t *peak;
    int failures;
} limit_arg;

static void *limit_worker(void *p)
{
    limit_arg *la = p;
    for (int i = 0; i < 20000; i++) {
        if (kvg_tenant_admit(la->t, 0, 0, NULL) != KVG_ADMIT_OK)
            continue;
        uint32_t cur = kvg_tenant_inflight(la->t);
        if (cur > 3)
            la->failures++;
        uint32_t pk = atomic_load(la->peak);
        while (cur > pk && !atomic_compare_exchange_weak(la->peak, &pk, cur))
            ;
        kvg_tenant_release(la->t);
    }
    return NULL;
}

static void test_concurrent_stress(void **state)
{
    (void)state;
    stress st;
    memset(&st, 0, sizeof(st));
    st.ts = new_store();
    atomic_init(&st.stop, false);
    assert_int_equal(pthread_mutex_init(&st.keys_lock, NULL), 0);

    pthread_t th[STRESS_THREADS];
    worker_arg args[STRESS_THREADS];
    for (unsigned i = 0; i < STRESS_THREADS; i++) {
        args[i] = (worker_arg){.st = &st};
        assert_int_equal(pthread_create(&th[i], NULL, stress_worker, &args[i]), 0);
    }

    char id[16], key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1], msg[128];
    char kids[STRESS_TENANTS][KVG_KEY_ID_LEN + 1];
    memset(kids, 0, sizeof(kids));
    for (int r = 0; r < STRESS_ROUNDS; r++) {
        int ti = r % STRESS_TENANTS;
        snprintf(id, sizeof(id), "t%d", ti);
        kvg_tenant_def d = {.id = id,
                            .sharing = (kvg_sharing)(r % 3),
                            .group = r % 3 == 1 ? "g" : NULL,
                            .limits = {.rps = 100 + r % 7,
                                       .prompt_bytes_per_s = r % 2 ? 1e6 : 0,
                                       .max_inflight = (uint32_t)(r % 4)}};
        switch (r % 6) {
        case 0:
        case 1:
            assert_int_equal(kvg_tenants_put(st.ts, &d, NULL, msg, sizeof(msg)), 0);
            break;
        case 2: {
            int rc = kvg_tenants_key_create(st.ts, id, key, kid);
            assert_true(rc == 0 || rc == KVG_ENOTFOUND || rc == KVG_ELIMIT);
            if (rc == 0) {
                pthread_mutex_lock(&st.keys_lock);
                memcpy(st.keys[ti], key, sizeof(key));
                pthread_mutex_unlock(&st.keys_lock);
                memcpy(kids[ti], kid, sizeof(kid));
            }
            break;
        }
        case 3: {
            int rc = kvg_tenants_key_delete(st.ts, id, kids[ti]);
            assert_true(rc == 0 || rc == KVG_ENOTFOUND);
            break;
        }
        case 4: {
            int rc = kvg_tenants_remove(st.ts, id);
            assert_true(rc == 0 || rc == KVG_ENOTFOUND);
            break;
        }
        case 5:
            if (r % 60 == 5) {
                /* a whole reload in the middle of it */
                kvg_buf b;
                kvg_buf_init(&b);
                kvg_tenants_to_json(st.ts, &b);
                assert_int_equal(load(st.ts, b.data, msg, sizeof(msg)), 0);
                kvg_buf_done(&b);
            }
            break;
        }
    }
    atomic_store(&st.stop, true);
    unsigned long auth = 0, admitted = 0;
    for (unsigned i = 0; i < STRESS_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
        auth += args[i].authenticated;
        admitted += args[i].admitted;
    }
    print_message("# stress: %lu tenant lookups, %lu admitted\n", auth, admitted);
    assert_true(admitted > 0);
    kvg_tenant_set *s = kvg_tenants_acquire(st.ts);
    for (size_t i = 0; i < kvg_tenant_set_count(s); i++)
        assert_int_equal(kvg_tenant_inflight(kvg_tenant_set_at(s, i)), 0);
    kvg_tenant_set_unref(s);

    /* the in-flight limit under contention */
    kvg_tenant_def d = {.id = "limited", .limits = {.max_inflight = 3}};
    assert_int_equal(put_def(st.ts, &d, NULL), 0);
    s = kvg_tenants_acquire(st.ts);
    _Atomic uint32_t peak = 0;
    limit_arg la[STRESS_THREADS];
    for (unsigned i = 0; i < STRESS_THREADS; i++) {
        la[i] = (limit_arg){.t = kvg_tenant_set_find(s, "limited"), .peak = &peak};
        assert_int_equal(pthread_create(&th[i], NULL, limit_worker, &la[i]), 0);
    }
    for (unsigned i = 0; i < STRESS_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(la[i].failures, 0);
    }
    assert_true(atomic_load(&peak) <= 3);
    assert_int_equal(kvg_tenant_inflight(kvg_tenant_set_find(s, "limited")), 0);
    kvg_tenant_set_unref(s);

    pthread_mutex_destroy(&st.keys_lock);
    kvg_tenants_free(st.ts);
}

/* ---- allocation failures --------------------------------------------------------------------- */

/* Run op with the n-th allocation failing, for n = 0, 1, ... until it runs clean. Each failing
 * run must return -ENOMEM and leave the store as it was (same generation, same snapshot, same
 * persistent form); ASan checks that nothing leaks. An op prepares what it needs with the
 * allocator intact and arms the failure just around the call under test (RUN). */
typedef int (*store_op)(kvg_tenants *ts, long fail_at, bool *injected);

#define RUN(call)                                                                                  \
    do {                                                                                           \
        fail_alloc_nth(fail_at);                                                                   \
        rc = (call);                                                                               \
        *injected = fail_alloc_off();                                                              \
    } while (0)

static int op_setup(kvg_tenants *ts)
{
    const char *models[] = {"m"};
    kvg_tenant_def d = {.id = "a", .models = models, .nmodels = 1, .limits = {.rps = 1}};
    char key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1];
    char msg[128];
    int rc = kvg_tenants_put(ts, &d, NULL, msg, sizeof(msg));
    if (rc == 0)
        rc = put_simple(ts, "b");
    if (rc == 0)
        rc = kvg_tenants_key_create(ts, "a", key, kid);
    return rc;
}

static int op_put_new(kvg_tenants *ts, long fail_at, bool *injected)
{
    kvg_tenant_def d = {.id = "new", .sharing = KVG_SHARING_GROUP, .group = "g"};
    char msg[128];
    int rc;
    RUN(kvg_tenants_put(ts, &d, NULL, msg, sizeof(msg)));
    if (rc == -ENOMEM)
        assert_string_equal(msg, "out of memory");
    return rc;
}

static int op_put_replace(kvg_tenants *ts, long fail_at, bool *injected)
{
    kvg_tenant_def d = {.id = "a", .sharing = KVG_SHARING_GLOBAL};
    char msg[128];
    int rc;
    RUN(kvg_tenants_put(ts, &d, NULL, msg, sizeof(msg)));
    return rc;
}

static int op_remove(kvg_tenants *ts, long fail_at, bool *injected)
{
    int rc;
    RUN(kvg_tenants_remove(ts, "a"));
    return rc;
}

static int op_key_create(kvg_tenants *ts, long fail_at, bool *injected)
{
    char key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1];
    int rc;
    RUN(kvg_tenants_key_create(ts, "b", key, kid));
    return rc;
}

static int op_key_restore(kvg_tenants *ts, long fail_at, bool *injected)
{
    kvg_key_info k = {.id = "kaaaaaaaaaaaaaaa", .created_wall_ns = 5};
    memset(k.digest, 0x42, sizeof(k.digest));
    int rc;
    RUN(kvg_tenants_key_restore(ts, "b", &k));
    return rc;
}

static int op_key_delete(kvg_tenants *ts, long fail_at, bool *injected)
{
    kvg_tenant_set *s = kvg_tenants_acquire(ts);
    char kid[KVG_KEY_ID_LEN + 1];
    memcpy(kid, kvg_tenant_key(kvg_tenant_set_find(s, "a"), 0)->id, sizeof(kid));
    kvg_tenant_set_unref(s);
    int rc;
    RUN(kvg_tenants_key_delete(ts, "a", kid));
    return rc;
}

static int op_from_json(kvg_tenants *ts, long fail_at, bool *injected)
{
    static const char text[] =
        "[{\"id\":\"a\",\"sharing\":\"isolated\",\"models\":[\"x\",\"y\"],\"keys\":[{\"id\":"
        "\"kaaaaaaaaaaaaaaa\",\"sha256\":"
        "\"4242424242424242424242424242424242424242424242424242424242424242\","
        "\"created\":\"2024-01-01T00:00:00Z\"}]},{\"id\":\"c\",\"sharing\":\"global\"},"
        "{\"id\":\"d\",\"sharing\":\"group\",\"group\":\"g\"}]";
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *j = parse(&a, text);
    char msg[128];
    int rc;
    RUN(kvg_tenants_from_json(ts, j, msg, sizeof(msg)));
    if (rc == -ENOMEM)
        assert_string_equal(msg, "out of memory");
    kvg_arena_done(&a);
    return rc;
}

#undef RUN

static void check_alloc_failures(store_op op, bool setup)
{
    for (long n = 0;; n++) {
        kvg_tenants *ts = new_store();
        if (setup)
            assert_int_equal(op_setup(ts), 0);
        kvg_tenant_set *before = kvg_tenants_acquire(ts);
        uint64_t g = kvg_tenants_generation(ts);
        kvg_buf j1, j2;
        kvg_buf_init(&j1);
        kvg_buf_init(&j2);
        kvg_tenants_to_json(ts, &j1);
        bool injected = false;
        int rc = op(ts, n, &injected);
        kvg_tenant_set *after = kvg_tenants_acquire(ts);
        if (injected) {
            if (rc != -ENOMEM)
                fail_msg("allocation %ld failed but op returned %d", n, rc);
            assert_int_equal(kvg_tenants_generation(ts), g);
            assert_ptr_equal(before, after);
            kvg_tenants_to_json(ts, &j2);
            assert_string_equal(j1.data, j2.data);
        } else {
            assert_int_equal(rc, 0);
            assert_true(kvg_tenants_generation(ts) > g);
        }
        kvg_buf_done(&j1);
        kvg_buf_done(&j2);
        kvg_tenant_set_unref(after);
        kvg_tenant_set_unref(before);
        kvg_tenants_free(ts);
        if (!injected) {
            assert_true(n > 0);
            return;
        }
    }
}

static void test_alloc_failures(void **state)
{
    (void)state;
    check_alloc_failures(op_put_new, false);
    check_alloc_failures(op_put_new, true);
    check_alloc_failures(op_put_replace, true);
    check_alloc_failures(op_remove, true);
    check_alloc_failures(op_key_create, true);
    check_alloc_failures(op_key_restore, true);
    check_alloc_failures(op_key_delete, true);
    check_alloc_failures(op_from_json, false);
    check_alloc_failures(op_from_json, true);

    /* the constructor */
    for (long n = 0;; n++) {
        kvg_tenants *ts = NULL;
        fail_alloc_nth(n);
        int rc = kvg_tenants_new(&ts);
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_tenants_free(ts);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        assert_null(ts);
    }
    /* writers into a failing buffer mark it failed and leak nothing */
    kvg_tenants *ts = new_store();
    assert_int_equal(op_setup(ts), 0);
    kvg_buf b;
    kvg_buf_init(&b);
    fail_alloc_nth(0);
    kvg_tenants_write_metrics(ts, 10, &b);
    assert_true(fail_alloc_off());
    assert_true(b.failed);
    kvg_buf_done(&b);
    kvg_buf_init(&b);
    fail_alloc_nth(0);
    kvg_tenants_to_json(ts, &b);
    assert_true(fail_alloc_off());
    assert_true(b.failed);
    kvg_buf_done(&b);
    /* reading a file into a failing buffer */
    char dir[256], path[512];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/s.json", dir);
    assert_int_equal(kvg_state_write_file(path, "abc", 3, 0600), 0);
    kvg_buf_init(&b);
    fail_alloc_nth(0);
    assert_int_equal(kvg_state_read_file(path, 100, &b), -ENOMEM);
    assert_true(fail_alloc_off());
    kvg_buf_done(&b);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
    kvg_tenants_free(ts);
}

/* ---- the store's snapshot slot through a per-thread cache (common/snapshot.h) ------------- */

/* What a gateway thread sees: every published change (puts, keys, removals, a state file) is
 * one reload; a refused change none; a key works once the thread has refreshed. */
static void test_snapshot_cache(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    kvg_snapshot_cache cache;
    kvg_snapshot_cache_init(&cache, kvg_tenants_snapshots(ts));
    assert_true(kvg_snapshot_cache_refresh(&cache));
    kvg_tenant_set *set = kvg_tenant_set_of(kvg_snapshot_cache_get(&cache));
    kvg_tenant_set *acquired = kvg_tenants_acquire(ts);
    assert_ptr_equal(set, acquired);
    kvg_tenant_set_unref(acquired);
    assert_int_equal(kvg_tenant_set_generation(set), kvg_tenants_generation(ts));

    assert_int_equal(put_simple(ts, "acme"), 0);
    assert_true(kvg_snapshot_cache_refresh(&cache));
    assert_false(kvg_snapshot_cache_refresh(&cache));
    uint64_t g = kvg_tenants_generation(ts);

    char key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1];
    assert_int_equal(kvg_tenants_key_create(ts, "acme", key, kid), 0);
    /* Until the refresh the thread holds the snapshot from before the key. */
    set = kvg_tenant_set_of(kvg_snapshot_cache_get(&cache));
    assert_null(kvg_tenant_set_authenticate(set, key, strlen(key)));
    assert_true(kvg_snapshot_cache_refresh(&cache));
    set = kvg_tenant_set_of(kvg_snapshot_cache_get(&cache));
    assert_int_equal(kvg_tenant_set_generation(set), g + 1);
    kvg_tenant *t = kvg_tenant_set_authenticate(set, key, strlen(key));
    assert_non_null(t);
    assert_string_equal(kvg_tenant_id(t), "acme");

    /* Refused changes publish nothing. */
    assert_int_equal(kvg_tenants_remove(ts, "nope"), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_key_delete(ts, "acme", "k000000000000000"), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_key_create(ts, "nope", key, kid), KVG_ENOTFOUND);
    assert_false(kvg_snapshot_cache_refresh(&cache));

    /* A whole state file is one snapshot. */
    kvg_tenants *other = new_store();
    assert_int_equal(put_simple(other, "a"), 0);
    assert_int_equal(put_simple(other, "b"), 0);
    kvg_buf text;
    kvg_buf_init(&text);
    kvg_tenants_to_json(other, &text);
    kvg_tenants_free(other);
    char msg[256] = "";
    assert_int_equal(load(ts, text.data, msg, sizeof(msg)), 0);
    kvg_buf_done(&text);
    assert_true(kvg_snapshot_cache_refresh(&cache));
    set = kvg_tenant_set_of(kvg_snapshot_cache_get(&cache));
    assert_int_equal(kvg_tenant_set_generation(set), g + 2);
    assert_int_equal(kvg_tenant_set_count(set), 2);
    assert_false(kvg_snapshot_cache_refresh(&cache));

    assert_int_equal(kvg_tenants_remove(ts, "a"), 0);
    assert_true(kvg_snapshot_cache_refresh(&cache));
    set = kvg_tenant_set_of(kvg_snapshot_cache_get(&cache));
    assert_int_equal(kvg_tenant_set_count(set), 1);

    /* The thread's snapshot outlives the store. */
    kvg_tenants_free(ts);
    assert_string_equal(kvg_tenant_id(kvg_tenant_set_at(set, 0)), "b");
    kvg_snapshot_cache_done(&cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_and_accessors),
        cmocka_unit_test(test_replace_keeps_runtime),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_snapshot_lifetime),
        cmocka_unit_test(test_concurrent_stress),
        cmocka_unit_test(test_snapshot_cache),
        cmocka_unit_test(test_alloc_failures),
    };
    const test_part parts[] = {
        {tests, KVG_ARRAY_LEN(tests)},        {tenant_tests, tenant_tests_count},
        {keys_tests, keys_tests_count},       {metrics_tests, metrics_tests_count},
        {persist_tests, persist_tests_count},
    };
    return run_test_parts(parts, KVG_ARRAY_LEN(parts));
}
