/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for one tenant (tenancy/tenant.c): id and definition validation, admission by
 * rate, prompt bytes and requests in flight, and its share of the body budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "tenancy.h"
#include "tenancy_helpers.h"

/* ---- validation ------------------------------------------------------------------------------ */

static void test_id_validation(void **state)
{
    (void)state;
    char msg[128];
    assert_int_equal(kvg_tenant_id_validate("acme-1.prod_x", "id", msg, sizeof(msg)), 0);
    char max[KVG_TENANT_ID_MAX + 2];
    memset(max, 'a', sizeof(max));
    max[KVG_TENANT_ID_MAX] = '\0';
    assert_int_equal(kvg_tenant_id_validate(max, "id", msg, sizeof(msg)), 0);
    max[KVG_TENANT_ID_MAX] = 'a';
    max[KVG_TENANT_ID_MAX + 1] = '\0';
    static const struct {
        const char *id;
        const char *msg;
    } bad[] = {
        {NULL, "group: missing"},
        {"", "group: must not be empty"},
        {"a b", "group: invalid character 0x20"},
        {"a/b", "group: invalid character '/'"},
        {"caf\xc3\xa9", "group: invalid character 0xc3"},
        {"..", "group: \".\" and \"..\" are reserved"},
        {".", "group: \".\" and \"..\" are reserved"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        assert_int_equal(kvg_tenant_id_validate(bad[i].id, "group", msg, sizeof(msg)), KVG_EPARSE);
        if (strncmp(msg, bad[i].msg, strlen(bad[i].msg)) != 0)
            fail_msg("case %zu: got \"%s\", want \"%s...\"", i, msg, bad[i].msg);
    }
    assert_int_equal(kvg_tenant_id_validate(max, "id", msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "id: longer than 64 characters");
    assert_int_equal(kvg_tenant_id_validate("x y", NULL, NULL, 0), KVG_EPARSE);

    kvg_sharing s;
    assert_int_equal(kvg_sharing_parse("group", &s), 0);
    assert_int_equal(s, KVG_SHARING_GROUP);
    assert_int_equal(kvg_sharing_parse("Global", &s), KVG_EPARSE);
    assert_int_equal(kvg_sharing_parse(NULL, &s), KVG_EPARSE);
    assert_string_equal(kvg_sharing_str(KVG_SHARING_ISOLATED), "isolated");
    assert_string_equal(kvg_sharing_str(KVG_SHARING_COUNT), "?");
    assert_string_equal(kvg_admit_result_str(KVG_ADMIT_BYTES), "bytes");
    assert_string_equal(kvg_admit_result_str(KVG_ADMIT_BUFFER), "buffer");
    assert_string_equal(kvg_admit_result_str(KVG_ADMIT_RESULT_COUNT), "?");
}

static void test_def_validation(void **state)
{
    (void)state;
    char msg[160];
    const char *two[] = {"m", "m"};
    const char *empty[] = {""};
    const char *ctl[] = {"a\tb"};
    const char *null_model[] = {NULL};
    const char *many[KVG_TENANT_MODELS_MAX + 1];
    for (size_t i = 0; i < KVG_ARRAY_LEN(many); i++)
        many[i] = "m";
    char longname[KVG_TENANT_MODEL_NAME_MAX + 2];
    memset(longname, 'x', sizeof(longname));
    longname[KVG_TENANT_MODEL_NAME_MAX + 1] = '\0';
    const char *long_model[] = {longname};
    typedef struct {
        kvg_tenant_def def;
        int rc;
        const char *msg;
    } def_case;
    const def_case cases[] = {
        {{.id = "a"}, 0, ""},
        {{.id = "a", .sharing = KVG_SHARING_GROUP, .group = "g"}, 0, ""},
        {{.id = "a", .limits = {.rps = 5, .burst = 1, .prompt_bytes_burst = 1}}, 0, ""},
        {{.id = NULL}, KVG_EPARSE, "id: missing"},
        {{.id = "a b"}, KVG_EPARSE, "id: invalid character"},
        {{.id = "a", .sharing = KVG_SHARING_COUNT}, KVG_EPARSE, "sharing: must be"},
        {{.id = "a", .sharing = KVG_SHARING_GROUP}, KVG_EPARSE, "group: required"},
        {{.id = "a", .sharing = KVG_SHARING_GROUP, .group = "g g"},
         KVG_EPARSE,
         "group: invalid character"},
        {{.id = "a", .sharing = KVG_SHARING_GLOBAL, .group = "g"}, KVG_EPARSE, "group: only"},
        {{.id = "a", .models = two, .nmodels = 2}, KVG_EPARSE, "models[1]: duplicate of models[0]"},
        {{.id = "a", .models = empty, .nmodels = 1}, KVG_EPARSE, "models[0]: must not be empty"},
        {{.id = "a", .models = ctl, .nmodels = 1}, KVG_EPARSE, "models[0]: must be printable"},
        {{.id = "a", .models = null_model, .nmodels = 1}, KVG_EPARSE, "models[0]: missing"},
        {{.id = "a", .models = long_model, .nmodels = 1}, KVG_ELIMIT, "models[0]: longer than"},
        {{.id = "a", .models = NULL, .nmodels = 1}, KVG_EPARSE, "models: missing"},
        {{.id = "a", .models = many, .nmodels = KVG_ARRAY_LEN(many)},
         KVG_ELIMIT,
         "models: more than 64"},
        {{.id = "a", .limits = {.rps = NAN}}, KVG_EPARSE, "rate.rps: must be a finite number"},
        {{.id = "a", .limits = {.rps = INFINITY}}, KVG_EPARSE, "rate.rps: must be a finite"},
        {{.id = "a", .limits = {.rps = -1}}, KVG_EPARSE, "rate.rps: must be a finite number >= 0"},
        {{.id = "a", .limits = {.burst = -0.5}}, KVG_EPARSE, "rate.burst: must be a finite"},
        {{.id = "a", .limits = {.rps = 1, .burst = 0.5}}, KVG_EPARSE, "rate.burst: must be 0"},
        {{.id = "a", .limits = {.prompt_bytes_per_s = -INFINITY}},
         KVG_EPARSE,
         "rate.prompt_bytes_per_s: must be a finite"},
        {{.id = "a", .limits = {.prompt_bytes_burst = NAN}},
         KVG_EPARSE,
         "rate.prompt_bytes_burst: must be a finite"},
    };
    kvg_tenants *ts = new_store();
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        msg[0] = 'x';
        int rc = kvg_tenant_def_validate(&cases[i].def, msg, sizeof(msg));
        if (rc != cases[i].rc || strncmp(msg, cases[i].msg, strlen(cases[i].msg)) != 0)
            fail_msg("case %zu: rc %d msg \"%s\", want %d \"%s...\"", i, rc, msg, cases[i].rc,
                     cases[i].msg);
        /* put validates the same way and changes nothing on error */
        uint64_t g = kvg_tenants_generation(ts);
        rc = kvg_tenants_put(ts, &cases[i].def, NULL, msg, sizeof(msg));
        assert_int_equal(rc, cases[i].rc);
        if (rc)
            assert_int_equal(kvg_tenants_generation(ts), g);
    }
    assert_int_equal(kvg_tenant_def_validate(NULL, msg, sizeof(msg)), KVG_EPARSE);
    kvg_tenants_free(ts);
}

/* ---- admission ------------------------------------------------------------------------------- */

static kvg_tenant *one_tenant(kvg_tenants **ts, const kvg_tenant_limits *l, kvg_tenant_set **s)
{
    *ts = new_store();
    kvg_tenant_def d = {.id = "t", .limits = *l};
    assert_int_equal(put_def(*ts, &d, NULL), 0);
    *s = kvg_tenants_acquire(*ts);
    return kvg_tenant_set_find(*s, "t");
}

static void test_admit_rate(void **state)
{
    (void)state;
    kvg_tenants *ts;
    kvg_tenant_set *s;
    kvg_tenant_limits l = {.rps = 2, .burst = 4};
    kvg_tenant *t = one_tenant(&ts, &l, &s);
    uint64_t now = 5000 * SEC;
    unsigned ra = 0;
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvg_tenant_admit(t, now, 1000, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 1000, &ra), KVG_ADMIT_RATE);
    assert_int_equal(ra, 1);                     /* 0.5 s, rounded up */
    assert_int_equal(kvg_tenant_inflight(t), 4); /* no in-flight limit, but counted */
    release_all(t);
    /* refill over (fake) time: 2 per second */
    now += SEC / 2;
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_RATE);
    now += 10 * SEC; /* capped at the burst */
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvg_tenant_admit(t, now, 0, NULL), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 0, NULL), KVG_ADMIT_RATE);
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);

    /* the default burst: max(1, rps); a slow rate gives a long Retry-After, capped */
    kvg_tenant_limits slow = {.rps = 0.25};
    t = one_tenant(&ts, &slow, &s);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_RATE);
    assert_int_equal(ra, 4);
    assert_int_equal(kvg_tenant_admit(t, now + SEC + SEC / 10, 0, &ra), KVG_ADMIT_RATE);
    assert_int_equal(ra, 3); /* 2.9 s left, rounded up */
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);

    kvg_tenant_limits crawl = {.rps = 0.0001};
    t = one_tenant(&ts, &crawl, &s);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_RATE);
    assert_int_equal(ra, 3600);
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);

    kvg_tenant_limits fast = {.rps = 1000, .burst = 1};
    t = one_tenant(&ts, &fast, &s);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_RATE);
    assert_int_equal(ra, 1); /* 1 ms, but at least a second */
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);

    /* no limits at all */
    kvg_tenant_limits none = {0};
    t = one_tenant(&ts, &none, &s);
    for (int i = 0; i < 10000; i++)
        assert_int_equal(kvg_tenant_admit(t, now, 1u << 30, NULL), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_inflight(t), 10000);
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);
}

static void test_admit_bytes_and_inflight(void **state)
{
    (void)state;
    kvg_tenants *ts;
    kvg_tenant_set *s;
    uint64_t now = 77 * SEC;
    unsigned ra = 0;

    /* bytes bucket: 1000 B/s, burst 4000 */
    kvg_tenant_limits lb = {.prompt_bytes_per_s = 1000, .prompt_bytes_burst = 4000};
    kvg_tenant *t = one_tenant(&ts, &lb, &s);
    assert_int_equal(kvg_tenant_admit(t, now, 3000, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 1500, &ra), KVG_ADMIT_BYTES);
    assert_int_equal(ra, 1); /* 0.5 s */
    assert_int_equal(kvg_tenant_admit(t, now, 1000, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 2500, &ra), KVG_ADMIT_BYTES);
    assert_int_equal(ra, 3); /* 2.5 s */
    assert_int_equal(kvg_tenant_admit(t, now + 3 * SEC, 2500, &ra), KVG_ADMIT_OK);
    /* a prompt larger than the burst: charged the whole burst, admitted once it is full */
    assert_int_equal(kvg_tenant_admit(t, now + 3 * SEC, 10000, &ra), KVG_ADMIT_BYTES);
    assert_int_equal(ra, 4); /* 500 left, 3500 to go */
    assert_int_equal(kvg_tenant_admit(t, now + 7 * SEC, 10000, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now + 7 * SEC, 1, &ra), KVG_ADMIT_BYTES);
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);

    /* the default bytes burst: max(rate, 1 MiB) */
    kvg_tenant_limits ld = {.prompt_bytes_per_s = 10};
    t = one_tenant(&ts, &ld, &s);
    assert_int_equal(kvg_tenant_admit(t, now, 1024 * 1024, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 10, &ra), KVG_ADMIT_BYTES);
    assert_int_equal(ra, 1);
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);

    /* in-flight */
    kvg_tenant_limits li = {.max_inflight = 2};
    t = one_tenant(&ts, &li, &s);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_OK);
    ra = 99;
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_INFLIGHT);
    assert_int_equal(ra, 1);
    assert_int_equal(kvg_tenant_inflight(t), 2);
    kvg_tenant_release(t);
    assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_OK);
    release_all(t);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);
}

/* The in-flight bound without rates is a compare-and-swap, not the tenant's lock: four threads
 * admitting and releasing at once never hold more than the bound (1: two cores suffice to
 * break it), and every admitted request
 * is counted (a plain add after a check would overshoot here within a few thousand rounds). */
#define INFLIGHT_THREADS 4
#define INFLIGHT_MAX 1

typedef struct inflight_run {
    kvg_tenant *t;
    _Atomic int held;
    _Atomic int max_seen;
    _Atomic long admitted;
} inflight_run;

static void *admit_loop(void *arg)
{
    inflight_run *run = arg;
    unsigned ra;
    for (int i = 0; i < 20000; i++) {
        if (kvg_tenant_admit(run->t, 1000 * SEC, 0, &ra) != KVG_ADMIT_OK)
            continue;
        int h = atomic_fetch_add(&run->held, 1) + 1;
        int m = atomic_load(&run->max_seen);
        while (h > m && !atomic_compare_exchange_weak(&run->max_seen, &m, h))
            ;
        atomic_fetch_add(&run->admitted, 1);
        for (volatile int spin = 0; spin < 20; spin++) /* hold the slot a little */
            ;
        atomic_fetch_sub(&run->held, 1);
        kvg_tenant_release(run->t);
    }
    return NULL;
}

static void test_admit_inflight_concurrent(void **state)
{
    (void)state;
    kvg_tenants *ts;
    kvg_tenant_set *s;
    kvg_tenant_limits l = {.max_inflight = INFLIGHT_MAX};
    inflight_run run = {.t = one_tenant(&ts, &l, &s)};
    pthread_t th[INFLIGHT_THREADS];
    for (int i = 0; i < INFLIGHT_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, admit_loop, &run), 0);
    for (int i = 0; i < INFLIGHT_THREADS; i++)
        pthread_join(th[i], NULL);
    assert_true(atomic_load(&run.max_seen) <= INFLIGHT_MAX);
    assert_true(atomic_load(&run.admitted) > 0);
    assert_int_equal(kvg_tenant_inflight(run.t), 0);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);
}

/* A refusal takes nothing: a bytes refusal gives the request token back, an in-flight refusal
 * takes no token at all. */
static void test_admit_all_or_nothing(void **state)
{
    (void)state;
    kvg_tenants *ts;
    kvg_tenant_set *s;
    uint64_t now = 1000 * SEC;
    unsigned ra;
    /* requests: 2 tokens, refilled once per 1000 s; bytes: 100, refilled at 100/s */
    kvg_tenant_limits l = {.rps = 0.001,
                           .burst = 2,
                           .prompt_bytes_per_s = 100,
                           .prompt_bytes_burst = 100,
                           .max_inflight = 1};
    kvg_tenant *t = one_tenant(&ts, &l, &s);
    assert_int_equal(kvg_tenant_admit(t, now, 100, &ra), KVG_ADMIT_OK); /* 1 request token left */
    /* in-flight full: refused first, takes no request token */
    for (int i = 0; i < 5; i++)
        assert_int_equal(kvg_tenant_admit(t, now, 0, &ra), KVG_ADMIT_INFLIGHT);
    kvg_tenant_release(t);
    /* bytes empty: refused, the request token comes back */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kvg_tenant_admit(t, now, 50, &ra), KVG_ADMIT_BYTES);
        assert_int_equal(ra, 1);
    }
    assert_int_equal(kvg_tenant_inflight(t), 0);
    /* so the one remaining request token still admits once the bytes are back */
    assert_int_equal(kvg_tenant_admit(t, now + SEC, 50, &ra), KVG_ADMIT_OK);
    kvg_tenant_release(t);
    assert_int_equal(kvg_tenant_admit(t, now + SEC, 0, &ra), KVG_ADMIT_RATE);
    assert_true(ra > 900 && ra <= 1000);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);
}

/* A tenant's share of the body budget: all or nothing against the cap, never below zero, and
 * exact under concurrent charges and releases. */
static void *buffer_churn(void *arg)
{
    kvg_tenant *t = arg;
    for (int i = 0; i < 100000; i++) {
        if (kvg_tenant_buffer_charge(t, 3, 3000))
            kvg_tenant_buffer_release(t, 3);
    }
    return NULL;
}

static void test_buffer_share(void **state)
{
    (void)state;
    kvg_tenants *ts;
    kvg_tenant_set *s;
    kvg_tenant_limits l = {0};
    kvg_tenant *t = one_tenant(&ts, &l, &s);
    assert_int_equal(kvg_tenant_buffered(t), 0);
    assert_true(kvg_tenant_buffer_charge(t, 600, 1000));
    assert_true(kvg_tenant_buffer_charge(t, 400, 1000));
    assert_false(kvg_tenant_buffer_charge(t, 1, 1000)); /* a refusal counts nothing */
    assert_int_equal(kvg_tenant_buffered(t), 1000);
    assert_true(kvg_tenant_buffer_charge(t, 5, 0));           /* no cap */
    assert_false(kvg_tenant_buffer_charge(t, UINT64_MAX, 0)); /* would wrap */
    kvg_tenant_buffer_release(t, 1005);
    assert_int_equal(kvg_tenant_buffered(t), 0);
    kvg_tenant_buffer_release(t, 7); /* more than held: stays at zero */
    assert_int_equal(kvg_tenant_buffered(t), 0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, buffer_churn, t), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(kvg_tenant_buffered(t), 0);
    /* A replaced definition keeps the runtime, and so what is held. */
    assert_true(kvg_tenant_buffer_charge(t, 10, 0));
    kvg_tenant_def def = {.id = kvg_tenant_id(t), .sharing = KVG_SHARING_ISOLATED};
    char msg[128];
    assert_int_equal(kvg_tenants_put(ts, &def, NULL, msg, sizeof(msg)), 0);
    kvg_tenant_set *s2 = kvg_tenants_acquire(ts);
    assert_int_equal(kvg_tenant_buffered(kvg_tenant_set_find(s2, kvg_tenant_id(t))), 10);
    kvg_tenant_buffer_release(t, 10);
    kvg_tenant_set_unref(s2);
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts);
}

const struct CMUnitTest tenant_tests[] = {
    cmocka_unit_test(test_id_validation),        cmocka_unit_test(test_def_validation),
    cmocka_unit_test(test_admit_rate),           cmocka_unit_test(test_admit_bytes_and_inflight),
    cmocka_unit_test(test_admit_all_or_nothing), cmocka_unit_test(test_admit_inflight_concurrent),
    cmocka_unit_test(test_buffer_share),
};
const size_t tenant_tests_count = KVG_ARRAY_LEN(tenant_tests);
