/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the worker registry (validation, snapshots, layers, health, load, metrics,
 * concurrency and allocation failures) and for routing decisions over a snapshot. */
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

static kvg_registry *new_registry(unsigned nthreads)
{
    kvg_registry_config cfg = {.nthreads = nthreads};
    kvg_registry *reg = NULL;
    assert_int_equal(kvg_registry_new(&cfg, &reg), 0);
    assert_non_null(reg);
    return reg;
}

static int put(kvg_registry *reg, const char *name, const char *url, kvg_worker_source src)
{
    kvg_worker_def def = {.name = name, .url = url};
    char msg[256];
    return kvg_registry_put(reg, &def, src, msg, sizeof(msg));
}

/* ---- validation ----------------------------------------------------------------------------- */

typedef struct url_case {
    const char *url;
    int rc;
    const char *msg; /* expected message prefix */
} url_case;

static void test_validate_url(void **state)
{
    (void)state;
    static const url_case cases[] = {
        {"http://127.0.0.1:8001", 0, ""},
        {"http://127.0.0.1:8001/", 0, ""},
        {"HTTP://Worker-1.local:65535", 0, ""},
        {"http://[::1]:80", 0, ""},
        {"http://[2001:db8::1]:8000/", 0, ""},
        {"http://gpu_node_3:9000", 0, ""},
        {"https://a:443", KVG_EPARSE, "url: https is not supported"},
        {"ftp://a:21", KVG_EPARSE, "url: must look like"},
        {"a:80", KVG_EPARSE, "url: must look like"},
        {"http://a", KVG_EPARSE, "url: missing port"},
        {"http://a:", KVG_EPARSE, "url: missing port"},
        {"http://a:0", KVG_EPARSE, "url: port must be"},
        {"http://a:65536", KVG_EPARSE, "url: port must be"},
        {"http://a:+80", KVG_EPARSE, "url: port must be"},
        {"http://a:80x", KVG_EPARSE, "url: port must be"},
        {"http://a:000080", KVG_EPARSE, "url: port must be"},
        {"http://a:80/v1", KVG_EPARSE, "url: a path is not allowed"},
        {"http://a:80//", KVG_EPARSE, "url: a path is not allowed"},
        {"http://a:80?x=1", KVG_EPARSE, "url: query and fragment"},
        {"http://a:80#f", KVG_EPARSE, "url: query and fragment"},
        {"http://user:pw@a:80", KVG_EPARSE, "url: user information"},
        {"http://:80", KVG_EPARSE, "url: missing host"},
        {"http://", KVG_EPARSE, "url: missing host"},
        {"http://a..b:80", KVG_EPARSE, "url: empty label"},
        {"http://.a:80", KVG_EPARSE, "url: empty label"},
        {"http://a.:80", KVG_EPARSE, "url: empty label"},
        {"http://1.2.3:80", KVG_EPARSE, "url: invalid IPv4"},
        {"http://256.1.1.1:80", KVG_EPARSE, "url: invalid IPv4"},
        {"http://a%20b:80", KVG_EPARSE, "url: invalid character '%'"},
        {"http://a b:80", KVG_EPARSE, "url: must be ASCII"},
        {"http://a\n:80", KVG_EPARSE, "url: must be ASCII"},
        {"http://\xc3\xa9:80", KVG_EPARSE, "url: must be ASCII"},
        {"http://::1:80", KVG_EPARSE, "url: IPv6 addresses need brackets"},
        {"http://[::1]", KVG_EPARSE, "url: missing port"},
        {"http://[::1]80", KVG_EPARSE, "url: missing port"},
        {"http://[::1:80", KVG_EPARSE, "url: unterminated"},
        {"http://[zz]:80", KVG_EPARSE, "url: invalid IPv6"},
        {"http://[]:80", KVG_EPARSE, "url: invalid IPv6"},
        {NULL, KVG_EPARSE, "url: missing"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        kvg_worker_def def = {.name = "w", .url = cases[i].url};
        char msg[256] = "junk";
        int rc = kvg_worker_def_validate(&def, msg, sizeof(msg));
        if (rc != cases[i].rc || strncmp(msg, cases[i].msg, strlen(cases[i].msg)) != 0)
            fail_msg("case %zu (%s): rc %d msg \"%s\"", i, cases[i].url ? cases[i].url : "NULL", rc,
                     msg);
        if (rc == 0)
            assert_string_equal(msg, "");
    }

    char longurl[1100] = "http://a:80/";
    memset(longurl + 12, 'x', 1050);
    longurl[1062] = '\0';
    kvg_worker_def def = {.name = "w", .url = longurl};
    char msg[128];
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_ELIMIT);
    assert_string_equal(msg, "url: longer than 1024 bytes");
    /* msg may be NULL */
    assert_int_equal(kvg_worker_def_validate(&def, NULL, 0), KVG_ELIMIT);
}

static void test_validate_name_models(void **state)
{
    (void)state;
    char msg[256];
    char n64[65], n65[66];
    memset(n64, 'a', 64);
    n64[64] = '\0';
    memset(n65, 'a', 65);
    n65[65] = '\0';
    kvg_worker_def def = {.url = "http://a:1"};

    def.name = n64;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), 0);
    def.name = n65;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_ELIMIT);
    assert_string_equal(msg, "name: longer than 64 characters");
    def.name = "";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "name: must not be empty");
    def.name = NULL;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "name: missing");
    def.name = "a/b";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "name: invalid character '/' (allowed: A-Z a-z 0-9 . _ -)");
    def.name = "a\nb";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "name: invalid character 0x0a (allowed: A-Z a-z 0-9 . _ -)");
    def.name = "..";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_true(strncmp(msg, "name: ", 6) == 0);
    def.name = "Worker_1.gpu-a";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), 0);

    const char *models[KVG_WORKER_MODELS_MAX + 1];
    char names[KVG_WORKER_MODELS_MAX + 1][8];
    for (size_t i = 0; i < KVG_ARRAY_LEN(models); i++) {
        snprintf(names[i], sizeof(names[i]), "m%zu", i);
        models[i] = names[i];
    }
    def.models = models;
    def.nmodels = KVG_WORKER_MODELS_MAX;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), 0);
    def.nmodels = KVG_WORKER_MODELS_MAX + 1;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_ELIMIT);
    assert_string_equal(msg, "models: more than 64 models");

    char m256[257], m257[258];
    memset(m256, 'm', 256);
    m256[256] = '\0';
    memset(m257, 'm', 257);
    m257[257] = '\0';
    const char *one[2] = {"ok", m256};
    def.models = one;
    def.nmodels = 2;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), 0);
    one[1] = m257;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_ELIMIT);
    assert_string_equal(msg, "models[1]: longer than 256 bytes");
    one[1] = "";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "models[1]: must not be empty");
    one[1] = "bad\x7f";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "models[1]: must be printable ASCII");
    one[1] = "ok";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "models[1]: duplicate of models[0]");
    one[1] = NULL;
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "models[1]: missing");
    one[1] = "meta-llama/Llama-3.1-8B-Instruct";
    assert_int_equal(kvg_worker_def_validate(&def, msg, sizeof(msg)), 0);

    /* put reports every bad definition as KVG_EPARSE (its contract), message intact */
    kvg_registry *reg = new_registry(1);
    def.name = n65;
    assert_int_equal(kvg_registry_put(reg, &def, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg)),
                     KVG_EPARSE);
    assert_string_equal(msg, "name: longer than 64 characters");
    assert_int_equal(kvg_registry_generation(reg), 1);
    kvg_registry_free(reg);
}

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

static void test_put_and_accessors(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(2);
    const char *m1[] = {"llama", "qwen"};
    const char *m2[] = {"qwen", "mistral"};
    kvg_worker_def a = {.name = "b-worker",
                        .url = "http://10.0.0.2:8000/",
                        .models = m1,
                        .nmodels = 2,
                        .kv_blocks = 4096,
                        .max_inflight = 8};
    kvg_worker_def b = {
        .name = "a-worker", .url = "http://[fd00::1]:9000", .models = m2, .nmodels = 2};
    kvg_worker_def c = {.name = "c-any", .url = "http://gpu3:8000"};
    char msg[128];
    assert_int_equal(kvg_registry_put(reg, &a, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg)), 0);
    assert_int_equal(kvg_registry_generation(reg), 2);
    assert_int_equal(kvg_registry_put(reg, &b, KVG_WORKER_SOURCE_CONFIG, msg, sizeof(msg)), 0);
    assert_int_equal(kvg_registry_put(reg, &c, KVG_WORKER_SOURCE_ADMIN, msg, sizeof(msg)), 0);
    assert_int_equal(kvg_registry_generation(reg), 4);

    kvg_worker_set *set = kvg_registry_acquire(reg);
    assert_int_equal(kvg_worker_set_generation(set), 4);
    assert_int_equal(kvg_worker_set_count(set), 3);
    assert_string_equal(kvg_worker_name(kvg_worker_set_at(set, 0)), "a-worker");
    assert_string_equal(kvg_worker_name(kvg_worker_set_at(set, 1)), "b-worker");
    assert_string_equal(kvg_worker_name(kvg_worker_set_at(set, 2)), "c-any");

    kvg_worker *wa = kvg_worker_set_find(set, "b-worker");
    assert_non_null(wa);
    assert_string_equal(kvg_worker_url(wa), "http://10.0.0.2:8000/");
    assert_string_equal(kvg_worker_host(wa), "10.0.0.2");
    assert_int_equal(kvg_worker_port(wa), 8000);
    assert_string_equal(kvg_worker_authority(wa), "10.0.0.2:8000");
    assert_int_equal(kvg_worker_model_count(wa), 2);
    assert_string_equal(kvg_worker_model(wa, 1), "qwen");
    assert_null(kvg_worker_model(wa, 2));
    assert_true(kvg_worker_serves(wa, "llama"));
    assert_false(kvg_worker_serves(wa, "mistral"));
    assert_true(kvg_worker_serves(wa, NULL));
    assert_int_equal(kvg_worker_kv_blocks(wa), 4096);
    assert_int_equal(kvg_worker_max_inflight(wa), 8);
    assert_int_equal(kvg_worker_source_of(wa), KVG_WORKER_SOURCE_ADMIN);
    assert_int_equal(kvg_worker_health_get(wa), KVG_WORKER_UP);
    assert_false(kvg_worker_draining(wa));
    assert_false(kvg_worker_retired(wa));
    assert_int_equal(kvg_worker_inflight(wa), 0);

    kvg_worker *wb = kvg_worker_set_find(set, "a-worker");
    assert_string_equal(kvg_worker_host(wb), "fd00::1");
    assert_string_equal(kvg_worker_authority(wb), "[fd00::1]:9000");
    assert_int_equal(kvg_worker_max_inflight(wb), 1024); /* registry default */
    assert_int_equal(kvg_worker_source_of(wb), KVG_WORKER_SOURCE_CONFIG);
    assert_true(kvg_worker_id(wa) != kvg_worker_id(wb));

    kvg_worker *wc = kvg_worker_set_find(set, "c-any");
    assert_true(kvg_worker_serves(wc, "anything"));
    assert_null(kvg_worker_set_find(set, "zzz"));
    assert_null(kvg_worker_set_find(set, NULL));

    size_t n;
    const char *const *models = kvg_worker_set_models(set, &n);
    assert_int_equal(n, 3);
    assert_string_equal(models[0], "llama");
    assert_string_equal(models[1], "mistral");
    assert_string_equal(models[2], "qwen");

    /* A worker reference outlives the snapshot. */
    kvg_worker *held = kvg_worker_ref(wa);
    kvg_worker_set_unref(set);
    assert_string_equal(kvg_worker_name(held), "b-worker");
    kvg_worker_unref(held);
    kvg_registry_free(reg);
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

/* ---- health, load, slots ------------------------------------------------------------------ */

static void test_health(void **state)
{
    (void)state;
    kvg_registry_config cfg = {.nthreads = 1, .health_fall = 3, .health_rise = 2};
    kvg_registry *reg;
    assert_int_equal(kvg_registry_new(&cfg, &reg), 0);
    assert_int_equal(put(reg, "w", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s = kvg_registry_acquire(reg);
    kvg_worker *w = kvg_worker_set_at(s, 0);

    assert_int_equal(kvg_worker_health_get(w), KVG_WORKER_UP);
    assert_false(kvg_worker_health_observe(w, false));
    assert_false(kvg_worker_health_observe(w, false));
    assert_false(kvg_worker_health_observe(w, true)); /* a success resets the failure streak */
    assert_false(kvg_worker_health_observe(w, false));
    assert_false(kvg_worker_health_observe(w, false));
    assert_int_equal(kvg_worker_health_get(w), KVG_WORKER_UP);
    assert_true(kvg_worker_health_observe(w, false));
    assert_int_equal(kvg_worker_health_get(w), KVG_WORKER_DOWN);
    assert_false(kvg_worker_health_observe(w, false));
    assert_false(kvg_worker_health_observe(w, true));
    assert_false(kvg_worker_health_observe(w, false)); /* a failure resets the success streak */
    assert_false(kvg_worker_health_observe(w, true));
    assert_int_equal(kvg_worker_health_get(w), KVG_WORKER_DOWN);
    assert_true(kvg_worker_health_observe(w, true));
    assert_int_equal(kvg_worker_health_get(w), KVG_WORKER_UP);
    assert_false(kvg_worker_health_observe(w, true));
    kvg_worker_set_unref(s);
    kvg_registry_free(reg);

    /* defaults: fall 3, rise 2; thresholds of 1 flip at once */
    cfg = (kvg_registry_config){.health_fall = 1, .health_rise = 1};
    assert_int_equal(kvg_registry_new(&cfg, &reg), 0);
    assert_int_equal(put(reg, "w", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    s = kvg_registry_acquire(reg);
    w = kvg_worker_set_at(s, 0);
    assert_true(kvg_worker_health_observe(w, false));
    assert_true(kvg_worker_health_observe(w, true));
    kvg_worker_set_unref(s);
    kvg_registry_free(reg);
}

static void test_inflight_and_slots(void **state)
{
    (void)state;
    kvg_registry_config cfg = {.nthreads = 4, .default_max_inflight = 3};
    kvg_registry *reg;
    assert_int_equal(kvg_registry_new(&cfg, &reg), 0);
    kvg_worker_def d = {.name = "two", .url = "http://h:1", .max_inflight = 2};
    assert_int_equal(kvg_registry_put(reg, &d, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    assert_int_equal(put(reg, "dflt", "http://h:2", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s = kvg_registry_acquire(reg);
    kvg_worker *w = kvg_worker_set_find(s, "two");
    assert_true(kvg_worker_inflight_try_acquire(w));
    assert_true(kvg_worker_inflight_try_acquire(w));
    assert_false(kvg_worker_inflight_try_acquire(w));
    assert_int_equal(kvg_worker_inflight(w), 2);
    kvg_worker_inflight_release(w);
    assert_true(kvg_worker_inflight_try_acquire(w));
    kvg_worker_inflight_release(w);
    kvg_worker_inflight_release(w);
    kvg_worker_inflight_release(w); /* unbalanced: must not wrap */
    assert_int_equal(kvg_worker_inflight(w), 0);
    assert_true(kvg_worker_inflight_try_acquire(w));
    kvg_worker_inflight_release(w);

    kvg_worker *dw = kvg_worker_set_find(s, "dflt");
    assert_int_equal(kvg_worker_max_inflight(dw), 3);
    for (int i = 0; i < 3; i++)
        assert_true(kvg_worker_inflight_try_acquire(dw));
    assert_false(kvg_worker_inflight_try_acquire(dw));
    for (int i = 0; i < 3; i++)
        kvg_worker_inflight_release(dw);

    for (unsigned t = 0; t < 4; t++) {
        void **slot = kvg_worker_thread_slot(w, t);
        assert_non_null(slot);
        assert_null(*slot);
    }
    assert_null(kvg_worker_thread_slot(w, 4));
    static int pool;
    *kvg_worker_thread_slot(w, 2) = &pool;
    assert_ptr_equal(*kvg_worker_thread_slot(w, 2), &pool);
    assert_null(*kvg_worker_thread_slot(w, 1));
    *kvg_worker_thread_slot(w, 2) = NULL;
    kvg_worker_set_unref(s);
    kvg_registry_free(reg);
}

/* ---- metrics --------------------------------------------------------------------------------- */

typedef struct family {
    char name[96];
    char type[16];
    bool help;
} family;

/* Base family of a sample name: strips the histogram suffixes when the family is one. */
static const family *family_of(const family *fams, size_t n, const char *sample)
{
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(fams[i].name);
        if (strncmp(sample, fams[i].name, l) != 0)
            continue;
        const char *rest = sample + l;
        if (*rest == '\0')
            return &fams[i];
        if (strcmp(fams[i].type, "histogram") == 0 &&
            (strcmp(rest, "_bucket") == 0 || strcmp(rest, "_sum") == 0 ||
             strcmp(rest, "_count") == 0))
            return &fams[i];
    }
    return NULL;
}

/* Parse the exposition text; checks the format rules and returns sample values by exact
 * "name{labels}" in lookup. Returns the number of samples. */
static size_t check_exposition(const char *text, family *fams, size_t *nfams)
{
    size_t samples = 0;
    *nfams = 0;
    const char *line = text;
    const family *current = NULL;
    double last_le = -1, last_cum = -1;
    char last_hist_series[1024] = "";
    while (*line) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol); /* every line ends with \n */
        char buf[512];
        size_t len = (size_t)(eol - line);
        assert_true(len > 0 && len < sizeof(buf));
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = eol + 1;

        if (strncmp(buf, "# HELP ", 7) == 0) {
            char name[96];
            assert_int_equal(sscanf(buf + 7, "%95s", name), 1);
            for (size_t i = 0; i < *nfams; i++)
                assert_string_not_equal(fams[i].name, name); /* each family once */
            assert_true(*nfams < 32);
            family *f = &fams[(*nfams)++];
            snprintf(f->name, sizeof(f->name), "%s", name);
            f->type[0] = '\0';
            f->help = true;
            assert_true(strlen(buf) > 8 + strlen(name)); /* non-empty help text */
            current = f;
            continue;
        }
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            char name[96], type[16];
            assert_int_equal(sscanf(buf + 7, "%95s %15s", name, type), 2);
            assert_non_null(current);
            assert_string_equal(name, current->name);
            assert_true(strcmp(type, "gauge") == 0 || strcmp(type, "counter") == 0 ||
                        strcmp(type, "histogram") == 0);
            snprintf(((family *)current)->type, sizeof(current->type), "%s", type);
            continue;
        }
        assert_true(buf[0] != '#');
        /* sample: name{labels} value */
        char *brace = strchr(buf, '{');
        char *close = strrchr(buf, '}');
        assert_non_null(brace);
        assert_non_null(close);
        assert_true(close[1] == ' ');
        *brace = '\0';
        const family *f = family_of(fams, *nfams, buf);
        assert_non_null(f);
        assert_ptr_equal(f, current); /* samples of a family are contiguous, after its TYPE */
        assert_true(f->type[0] != '\0');
        if (strcmp(f->type, "counter") == 0)
            assert_true(strstr(f->name, "_total") != NULL);
        char *end;
        double v = strtod(close + 2, &end);
        assert_true(*end == '\0' && end != close + 2);
        assert_true(v >= 0);
        /* labels: k="v" pairs, comma separated */
        *close = '\0';
        const char *p = brace + 1;
        bool has_worker = false;
        double le = -2;
        while (*p) {
            const char *eq = strchr(p, '=');
            assert_non_null(eq);
            assert_true(eq[1] == '"');
            if (strncmp(p, "worker", (size_t)(eq - p)) == 0)
                has_worker = true;
            bool is_le = strncmp(p, "le", (size_t)(eq - p)) == 0 && eq - p == 2;
            const char *q = eq + 2;
            while (*q && *q != '"') {
                if (*q == '\\')
                    q++;
                q++;
            }
            assert_true(*q == '"');
            if (is_le)
                le = strncmp(eq + 2, "+Inf", 4) == 0 ? 1e300 : strtod(eq + 2, NULL);
            p = q + 1;
            if (*p == ',')
                p++;
        }
        assert_true(has_worker);
        size_t blen = strlen(buf);
        if (blen > 7 && strcmp(buf + blen - 7, "_bucket") == 0) {
            assert_true(le > -2);
            char series[1024];
            /* the series without le: the worker label comes first */
            snprintf(series, sizeof(series), "%s%.*s", buf,
                     (int)(strstr(brace + 1, ",le=") - (brace + 1)), brace + 1);
            if (strcmp(series, last_hist_series) != 0) {
                snprintf(last_hist_series, sizeof(last_hist_series), "%s", series);
                last_le = -1;
                last_cum = -1;
            }
            assert_true(le > last_le);  /* le increasing */
            assert_true(v >= last_cum); /* cumulative counts never decrease */
            last_le = le;
            last_cum = v;
        } else if (blen > 6 && strcmp(buf + blen - 6, "_count") == 0) {
            assert_true(last_le == 1e300); /* +Inf bucket came last */
            assert_true(v == last_cum);    /* _count equals the +Inf bucket */
        }
        samples++;
    }
    for (size_t i = 0; i < *nfams; i++) {
        assert_true(fams[i].help);
        assert_true(fams[i].type[0] != '\0');
    }
    return samples;
}

static void expect_text(const char *text, const char *line)
{
    if (!strstr(text, line))
        fail_msg("missing %s", line);
}

static void test_metrics_format(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_registry_write_metrics(reg, &out);
    family fams[32];
    size_t nfams;
    assert_int_equal(check_exposition(out.data, fams, &nfams), 0);
    assert_int_equal(nfams, 16); /* + five prefix-prediction and three engine-load families */

    assert_int_equal(put(reg, "w1", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    assert_int_equal(put(reg, "w2", "http://h:2", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s = kvg_registry_acquire(reg);
    kvg_worker *w1 = kvg_worker_set_find(s, "w1");
    kvg_worker *w2 = kvg_worker_set_find(s, "w2");
    kvg_worker_record(w1, 200, 3000000, 1000000);    /* 3 ms, ttfb 1 ms */
    kvg_worker_record(w1, 200, 700000000, 50000000); /* 0.7 s, ttfb 50 ms */
    kvg_worker_record(w1, 503, 200000000000ull, 0);  /* 200 s: above every bound, no ttfb */
    kvg_worker_record(w1, 0, 1000000000, 0);         /* client went away */
    kvg_worker_record(w1, 700, 1000, 0);             /* out of range: not counted by code */
    kvg_worker_record_retry(w2);
    kvg_worker_record_retry(w2);
    assert_true(kvg_worker_inflight_try_acquire(w2));
    for (int i = 0; i < 3; i++)
        kvg_worker_health_observe(w2, false);
    kvg_registry_drain(reg, "w2");
    kvg_worker_record_usage(w1, 30, 100, 40);   /* predicted 30 of 100, engine says 40 */
    kvg_worker_record_usage(w1, 0, 50, 16);     /* an unpredicted hit */
    kvg_worker_record_usage(w2, 10, 100, -1);   /* no report: unreported, nothing else */
    kvg_worker_set_engine_load(w1, 2, 0.5f, 1); /* scraped: w1 only */

    kvg_buf_reset(&out);
    kvg_registry_write_metrics(reg, &out);
    assert_false(out.failed);
    size_t n = check_exposition(out.data, fams, &nfams);
    assert_int_equal(nfams, 16);
    /* 6 gauges/counters x 2 workers + 3 code series + 2 histograms x 2 workers x 18 lines
     * + 2 engine-load gauges x 1 worker + 4 usage counters x 2 workers + 4 prediction
     * outcomes x 2 workers */
    assert_int_equal(n, 12 + 3 + 2 * 2 * 18 + 2 + 4 * 2 + 4 * 2);
    expect_text(out.data, "kvgate_worker_engine_waiting{worker=\"w1\"} 2\n");
    expect_text(out.data, "kvgate_worker_engine_kv_usage{worker=\"w1\"} 0.5\n");
    expect_text(out.data, "kvgate_prefix_predicted_tokens_total{worker=\"w1\"} 30\n");
    expect_text(out.data, "kvgate_prefix_cached_tokens_total{worker=\"w1\"} 56\n");
    expect_text(out.data, "kvgate_prefix_prompt_tokens_total{worker=\"w1\"} 150\n");
    expect_text(out.data, "kvgate_prefix_prompt_tokens_total{worker=\"w2\"} 0\n");
    expect_text(out.data, "kvgate_prefix_unreported_total{worker=\"w2\"} 1\n");
    expect_text(out.data,
                "kvgate_prefix_predictions_total{worker=\"w1\",outcome=\"hit_predicted\"} 1\n");
    expect_text(out.data,
                "kvgate_prefix_predictions_total{worker=\"w1\",outcome=\"hit_unpredicted\"} 1\n");

    static const char *const expect[] = {
        "# TYPE kvgate_worker_up gauge\n",
        "kvgate_worker_up{worker=\"w1\"} 1\n",
        "kvgate_worker_up{worker=\"w2\"} 0\n",
        "kvgate_worker_draining{worker=\"w2\"} 1\n",
        "kvgate_worker_draining{worker=\"w1\"} 0\n",
        "kvgate_worker_inflight{worker=\"w2\"} 1\n",
        "kvgate_worker_max_inflight{worker=\"w1\"} 1024\n",
        "# TYPE kvgate_worker_requests_total counter\n",
        "kvgate_worker_requests_total{worker=\"w1\",code=\"0\"} 1\n",
        "kvgate_worker_requests_total{worker=\"w1\",code=\"200\"} 2\n",
        "kvgate_worker_requests_total{worker=\"w1\",code=\"503\"} 1\n",
        "# TYPE kvgate_worker_request_duration_seconds histogram\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"0.005\"} 2\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"0.5\"} 2\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"1\"} 4\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"120\"} 4\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"+Inf\"} 5\n",
        "kvgate_worker_request_duration_seconds_sum{worker=\"w1\"} 201.703001\n",
        "kvgate_worker_request_duration_seconds_count{worker=\"w1\"} 5\n",
        "kvgate_worker_request_duration_seconds_count{worker=\"w2\"} 0\n",
        "kvgate_worker_ttfb_seconds_bucket{worker=\"w1\",le=\"0.005\"} 1\n",
        "kvgate_worker_ttfb_seconds_bucket{worker=\"w1\",le=\"0.05\"} 2\n",
        "kvgate_worker_ttfb_seconds_sum{worker=\"w1\"} 0.051000\n",
        "kvgate_worker_ttfb_seconds_count{worker=\"w1\"} 2\n",
        "# TYPE kvgate_worker_retries_total counter\n",
        "kvgate_worker_retries_total{worker=\"w2\"} 2\n",
        "kvgate_worker_retries_total{worker=\"w1\"} 0\n",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(expect); i++)
        if (!strstr(out.data, expect[i]))
            fail_msg("missing line %s in:\n%s", expect[i], out.data);
    assert_null(strstr(out.data, "code=\"700\""));
    kvg_worker_inflight_release(w2);
    kvg_worker_set_unref(s);
    kvg_buf_done(&out);
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
    assert_string_equal(text, "[\n{\"name\":\"a1\",\"url\":\"http://[::1]:8001/\",\"models\":"
                              "[\"llama \\\"3\\\"\",\"m\\\\2\"],\"kv_blocks\":4294967295,"
                              "\"max_inflight\":7,\"cache_salt\":false},\n"
                              "{\"name\":\"shadow\",\"url\":\"http://admin:2\",\"models\":[],"
                              "\"kv_blocks\":0,\"max_inflight\":0,\"cache_salt\":true}\n]");

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

/* ---- decisions --------------------------------------------------------------------------------
 */

/* One decision over a snapshot: eligibility (model, drain), the holder first, and with a rank
 * limit exactly the first places of the full ranking, terms included. */
static void test_decide_ranked_places(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    static const char *const other_model[] = {"other-model"};
    for (int i = 0; i < 40; i++) {
        char name[16], url[32];
        snprintf(name, sizeof(name), "w%02d", i);
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9000 + i);
        kvg_worker_def def = {.name = name, .url = url, .kv_blocks = 1024};
        if (i % 10 == 3) { /* four workers serve another model only */
            def.models = other_model;
            def.nmodels = 1;
        }
        assert_int_equal(kvg_registry_put(reg, &def, KVG_WORKER_SOURCE_ADMIN, NULL, 0), 0);
    }
    assert_int_equal(kvg_registry_drain(reg, "w05"), 0);
    kvg_router *rt;
    assert_int_equal(kvg_router_new(NULL, &rt), 0);
    kvg_policy_config pc;
    kvg_policy_config_init(&pc);

    char body[2048];
    int n = snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"");
    while (n < 1500)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "block %d of the prompt. ", n);
    n += snprintf(body + n, sizeof(body) - (size_t)n, "\"}");
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_body_info info;
    kvg_body_plan plan;
    assert_int_equal(kvg_body_scan_plan(body, (size_t)n, KVG_BODY_API_COMPLETIONS, "salt", &arena,
                                        &plan, &info, NULL),
                     0);
    kvg_worker_set *set = kvg_registry_acquire(reg);
    kvg_route_request rq = {.body = &info, .salt = "salt", .policy = &pc};
    kvg_route_decision all, top;
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &all), 0);
    assert_true(all.nkeys > 10);
    assert_int_equal(all.serving, 36);
    assert_int_equal(all.ncands, 35); /* w05 drains */
    for (size_t i = 0; i < all.ncands; i++) {
        const char *name = kvg_worker_name(all.cands[i].worker);
        assert_string_not_equal(name, "w05");
        assert_int_not_equal(name[2], '3');
        assert_int_equal(all.cands[i].matched, 0);
    }
    /* The holder of the whole prefix comes first, whatever its rendezvous score. */
    kvg_worker *holder = kvg_worker_set_find(set, "w17");
    assert_int_equal(kvg_router_record(rt, holder, &all, 0), 0);
    assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &all), 0);
    assert_ptr_equal(all.cands[0].worker, holder);
    assert_int_equal(all.cands[0].matched, all.nkeys);
    assert_int_equal(all.reason, KVG_POLICY_REASON_HIT);
    for (size_t limit = 1; limit <= 36; limit += 7) {
        rq.rank_limit = limit;
        assert_int_equal(kvg_router_decide(rt, set, &rq, &arena, &top), 0);
        assert_int_equal(top.ncands, KVG_MIN(limit, all.ncands));
        for (size_t i = 0; i < top.ncands; i++) {
            assert_ptr_equal(top.cands[i].worker, all.cands[i].worker);
            assert_true(top.cands[i].terms.total == all.cands[i].terms.total);
            assert_true(top.cands[i].terms.rendezvous == all.cands[i].terms.rendezvous);
        }
    }
    kvg_worker_set_unref(set);
    kvg_arena_done(&arena);
    kvg_router_free(rt);
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
        cmocka_unit_test(test_decide_ranked_places),
        cmocka_unit_test(test_validate_url),
        cmocka_unit_test(test_validate_name_models),
        cmocka_unit_test(test_registry_config),
        cmocka_unit_test(test_put_and_accessors),
        cmocka_unit_test(test_reput_identical_and_changed),
        cmocka_unit_test(test_remove_and_drain),
        cmocka_unit_test(test_layers),
        cmocka_unit_test(test_replace_config_all_or_nothing),
        cmocka_unit_test(test_worker_limit),
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_inflight_and_slots),
        cmocka_unit_test(test_metrics_format),
        cmocka_unit_test(test_cache_salt_switch),
        cmocka_unit_test(test_admin_json_round_trip),
        cmocka_unit_test(test_admin_json_rejects),
        cmocka_unit_test(test_concurrent_stress),
        cmocka_unit_test(test_snapshot_cache),
        cmocka_unit_test(test_snapshot_cache_threads),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
