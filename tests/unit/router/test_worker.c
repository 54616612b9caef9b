/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for a worker (router/worker.c): URL, name and model validation, accessors,
 * health, the in-flight count and its slots. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "router.h"
#include "router_helpers.h"

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

const struct CMUnitTest worker_tests[] = {
    cmocka_unit_test(test_validate_url),       cmocka_unit_test(test_validate_name_models),
    cmocka_unit_test(test_put_and_accessors),  cmocka_unit_test(test_health),
    cmocka_unit_test(test_inflight_and_slots),
};
const size_t worker_tests_count = KVG_ARRAY_LEN(worker_tests);
