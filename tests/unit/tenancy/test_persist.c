/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the tenants as JSON (tenancy/persist.c): round trips, creation times, the
 * messages of bad entries, loading 10k tenants, and the state file written and read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tenancy.h"
#include "tenancy_helpers.h"

/* ---- persistence ----------------------------------------------------------------------------- */

static void fill_store(kvg_tenants *ts, char keys[3][KVG_KEY_LEN + 1])
{
    const char *models[] = {"llama-3-8b", "qwen \"2\""};
    kvg_tenant_def defs[] = {
        {.id = "acme",
         .sharing = KVG_SHARING_GROUP,
         .group = "research",
         .models = models,
         .nmodels = 2,
         .limits = {.rps = 50, .burst = 100, .max_inflight = 64}},
        {.id = "beta",
         .sharing = KVG_SHARING_GLOBAL,
         .limits = {.rps = 0.1, .prompt_bytes_per_s = 1e6, .prompt_bytes_burst = 2.5e6}},
        {.id = "Z.z_z-9", .limits = {.max_inflight = 4294967295u}},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(defs); i++)
        assert_int_equal(put_def(ts, &defs[i], NULL), 0);
    char kid[KVG_KEY_ID_LEN + 1];
    assert_int_equal(kvg_tenants_key_create(ts, "acme", keys[0], kid), 0);
    assert_int_equal(kvg_tenants_key_create(ts, "acme", keys[1], kid), 0);
    assert_int_equal(kvg_tenants_key_create(ts, "Z.z_z-9", keys[2], kid), 0);
}

static void test_json_round_trip(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    char keys[3][KVG_KEY_LEN + 1];
    kvg_buf b1, b2;
    kvg_buf_init(&b1);
    kvg_buf_init(&b2);
    kvg_tenants_to_json(ts, &b1);
    assert_string_equal(b1.data, "[]");
    kvg_buf_reset(&b1);

    fill_store(ts, keys);
    kvg_tenants_to_json(ts, &b1);
    assert_false(b1.failed);
    /* the documented shape, sorted by id (ASCII: 'Z' before 'a'), one tenant per line */
    assert_memory_equal(b1.data,
                        "[\n{\"id\":\"Z.z_z-9\",\"sharing\":\"isolated\",\"models\":[],"
                        "\"rate\":{\"rps\":0,\"burst\":0,\"prompt_bytes_per_s\":0,"
                        "\"prompt_bytes_burst\":0},\"max_inflight\":4294967295,"
                        "\"keys\":[{\"id\":\"k",
                        121);
    expect_line(b1.data, "\n{\"id\":\"acme\",\"sharing\":\"group\",\"group\":\"research\","
                         "\"models\":[\"llama-3-8b\",\"qwen \\\"2\\\"\"],\"rate\":{\"rps\":50,"
                         "\"burst\":100,\"prompt_bytes_per_s\":0,\"prompt_bytes_burst\":0},"
                         "\"max_inflight\":64,\"keys\":[{\"id\":\"k");
    expect_line(b1.data, "\n{\"id\":\"beta\",\"sharing\":\"global\",\"models\":[],\"rate\":"
                         "{\"rps\":0.1,\"burst\":0,\"prompt_bytes_per_s\":1000000,"
                         "\"prompt_bytes_burst\":2500000},\"max_inflight\":0,\"keys\":[]}\n]");
    for (int i = 0; i < 3; i++)
        assert_null(strstr(b1.data, keys[i] + 4));

    /* into a new store: the same text, and the keys authenticate */
    kvg_tenants *ts2 = new_store();
    char msg[256] = "";
    uint64_t g = kvg_tenants_generation(ts2);
    assert_int_equal(load(ts2, b1.data, msg, sizeof(msg)), 0);
    assert_int_equal(kvg_tenants_generation(ts2), g + 1); /* one snapshot for the whole array */
    kvg_tenants_to_json(ts2, &b2);
    assert_string_equal(b1.data, b2.data);
    kvg_tenant_set *s = kvg_tenants_acquire(ts2);
    assert_int_equal(kvg_tenant_set_count(s), 3);
    assert_ptr_equal(kvg_tenant_set_authenticate(s, keys[0], KVG_KEY_LEN),
                     kvg_tenant_set_find(s, "acme"));
    assert_ptr_equal(kvg_tenant_set_authenticate(s, keys[1], KVG_KEY_LEN),
                     kvg_tenant_set_find(s, "acme"));
    assert_ptr_equal(kvg_tenant_set_authenticate(s, keys[2], KVG_KEY_LEN),
                     kvg_tenant_set_find(s, "Z.z_z-9"));
    /* new tenants are numbered in id order */
    assert_int_equal(kvg_tenant_ordinal(kvg_tenant_set_find(s, "Z.z_z-9")), 0);
    assert_int_equal(kvg_tenant_ordinal(kvg_tenant_set_find(s, "acme")), 1);
    assert_int_equal(kvg_tenant_ordinal(kvg_tenant_set_find(s, "beta")), 2);
    kvg_tenant *beta = kvg_tenant_set_find(s, "beta");
    assert_true(kvg_tenant_limits_of(beta)->rps == 0.1);
    assert_true(kvg_tenant_limits_of(beta)->prompt_bytes_burst == 2.5e6);
    kvg_tenant_set_unref(s);

    /* into the first store again, minus one tenant and with another added: the ones that stay
     * keep their runtime (ordinal, in-flight count, counters) */
    s = kvg_tenants_acquire(ts);
    kvg_tenant *acme = kvg_tenant_set_find(s, "acme");
    assert_int_equal(kvg_tenant_admit(acme, 0, 0, NULL), KVG_ADMIT_OK);
    kvg_tenant_record(acme, 200, 3);
    uint64_t acme_ord = kvg_tenant_ordinal(acme);
    kvg_tenant_set_unref(s);
    assert_int_equal(load(ts,
                          "[{\"id\":\"acme\",\"sharing\":\"isolated\"},"
                          "{\"id\":\"new\",\"sharing\":\"global\",\"group\":null}]",
                          msg, sizeof(msg)),
                     0);
    s = kvg_tenants_acquire(ts);
    assert_int_equal(kvg_tenant_set_count(s), 2);
    acme = kvg_tenant_set_find(s, "acme");
    assert_int_equal(kvg_tenant_ordinal(acme), acme_ord);
    assert_int_equal(kvg_tenant_inflight(acme), 1);
    assert_int_equal(kvg_tenant_key_count(acme), 0); /* keys are what the file says */
    assert_null(kvg_tenant_set_authenticate(s, keys[0], KVG_KEY_LEN));
    assert_int_equal(kvg_tenant_ordinal(kvg_tenant_set_find(s, "new")), 3);
    assert_null(kvg_tenant_set_find(s, "beta"));
    kvg_tenant_release(acme);
    kvg_tenant_set_unref(s);
    kvg_buf_reset(&b2);
    kvg_tenants_write_metrics(ts, 100, &b2);
    expect_line(b2.data, "kvgate_tenant_prompt_bytes_total{tenant=\"acme\"} 3\n");

    /* numbers come back in their plainest form */
    assert_int_equal(load(ts,
                          "[{\"id\":\"z\",\"sharing\":\"isolated\",\"rate\":{\"rps\":-0,"
                          "\"burst\":1e3,\"prompt_bytes_per_s\":0.25}}]",
                          msg, sizeof(msg)),
                     0);
    kvg_buf_reset(&b2);
    kvg_tenants_to_json(ts, &b2);
    expect_line(b2.data, "\"rate\":{\"rps\":0,\"burst\":1000,\"prompt_bytes_per_s\":0.25,");

    /* an empty array empties the store */
    assert_int_equal(load(ts, "[]", msg, sizeof(msg)), 0);
    s = kvg_tenants_acquire(ts);
    assert_int_equal(kvg_tenant_set_count(s), 0);
    kvg_tenant_set_unref(s);

    kvg_buf_done(&b1);
    kvg_buf_done(&b2);
    kvg_tenants_free(ts);
    kvg_tenants_free(ts2);
}

static void test_json_created_times(void **state)
{
    (void)state;
    static const struct {
        const char *created;
        uint64_t ns;
    } ok[] = {
        {"1970-01-01T00:00:00Z", 0},
        {"2024-05-01T12:00:00Z", 1714564800ull * SEC},
        {"2024-05-01T12:00:00.5Z", 1714564800ull * SEC + SEC / 2},
        {"2024-05-01t12:00:00.123456789123z", 1714564800ull * SEC + 123456789},
        {"2024-05-01T14:30:00+02:30", 1714564800ull * SEC},
        {"2024-05-01T09:00:00-03:00", 1714564800ull * SEC},
        {"2024-02-29T00:00:00Z", 1709164800ull * SEC},
    };
    static const char *const bad[] = {
        "2024-05-01",
        "2024-05-01 12:00:00Z",
        "2024-05-01T12:00:00",
        "2024-13-01T00:00:00Z",
        "2023-02-29T00:00:00Z",
        "2024-04-31T00:00:00Z",
        "2024-05-01T24:00:00Z",
        "2024-05-01T12:60:00Z",
        "1969-12-31T23:59:59Z",
        "1970-01-01T00:00:00+01:00",
        "2024-05-01T12:00:00.Z",
        "2024-05-01T12:00:00Zx",
        "2024-05-01T12:00:00+0200",
        "2024-05-01T12:00:00+24:00",
        "x024-05-01T12:00:00Z",
    };
    char text[512], msg[256];
    const char *digest = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    for (size_t i = 0; i < KVG_ARRAY_LEN(ok); i++) {
        kvg_tenants *ts = new_store();
        snprintf(text, sizeof(text),
                 "[{\"id\":\"t\",\"sharing\":\"isolated\",\"keys\":[{\"id\":\"kaaaaaaaaaaaaaaa\","
                 "\"sha256\":\"%s\",\"created\":\"%s\"}]}]",
                 digest, ok[i].created);
        if (load(ts, text, msg, sizeof(msg)) != 0)
            fail_msg("%s: %s", ok[i].created, msg);
        kvg_tenant_set *s = kvg_tenants_acquire(ts);
        const kvg_key_info *k = kvg_tenant_key(kvg_tenant_set_find(s, "t"), 0);
        assert_int_equal(k->created_wall_ns, ok[i].ns);
        assert_int_equal(k->digest[0], 0x00);
        assert_int_equal(k->digest[31], 0xff);
        kvg_tenant_set_unref(s);
        kvg_tenants_free(ts);
    }
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        kvg_tenants *ts = new_store();
        snprintf(text, sizeof(text),
                 "[{\"id\":\"t\",\"sharing\":\"isolated\",\"keys\":[{\"id\":\"kaaaaaaaaaaaaaaa\","
                 "\"sha256\":\"%s\",\"created\":\"%s\"}]}]",
                 digest, bad[i]);
        assert_int_equal(load(ts, text, msg, sizeof(msg)), KVG_EPARSE);
        if (!strstr(msg, "tenant \"t\": keys[0].created: must be an RFC 3339 time"))
            fail_msg("%s: %s", bad[i], msg);
        kvg_tenants_free(ts);
    }
}

static void test_json_rejects(void **state)
{
    (void)state;
#define KEY(id, d) "{\"id\":\"" id "\",\"sha256\":\"" d "\",\"created\":\"2024-01-01T00:00:00Z\"}"
#define D1 "1111111111111111111111111111111111111111111111111111111111111111"
#define D2 "2222222222222222222222222222222222222222222222222222222222222222"
    static const struct {
        const char *json;
        const char *msg;
    } bad[] = {
        {"{}", "tenants: must be a JSON array, not object"},
        {"[1]", "tenants[0]: must be an object, not number"},
        {"[{}]", "tenants[0]: id: required"},
        {"[{\"id\":\"a\"}]", "tenant \"a\": sharing: required"},
        {"[{\"id\":\"a b\",\"sharing\":\"isolated\"}]", "tenants[0]: id: invalid character 0x20"},
        {"[{\"id\":7,\"sharing\":\"isolated\"}]", "tenants[0]: id: must be a string, not number"},
        {"[{\"id\":\"a\\u0000b\",\"sharing\":\"isolated\"}]",
         "tenants[0]: id: must not contain NUL"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"colour\":1}]",
         "tenant \"a\": colour: unknown field"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"id\":\"a\"}]",
         "tenant \"a\": id: appears more than once"},
        {"[{\"id\":\"a\",\"sharing\":\"shared\"}]",
         "tenant \"a\": sharing: must be isolated, group or global"},
        {"[{\"id\":\"a\",\"sharing\":\"group\"}]", "tenant \"a\": group: required"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"group\":\"g\"}]",
         "tenant \"a\": group: only allowed"},
        {"[{\"id\":\"a\",\"sharing\":\"group\",\"group\":\"g/h\"}]",
         "tenant \"a\": group: invalid character '/'"},
        {"[{\"id\":\"a\",\"sharing\":\"group\",\"group\":1}]",
         "tenant \"a\": group: must be a string"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"models\":\"m\"}]",
         "tenant \"a\": models: must be an array of strings, not string"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"models\":[\"m\",2]}]",
         "tenant \"a\": models[1]: must be a string, not number"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"models\":[\"m\",\"m\"]}]",
         "tenant \"a\": models[1]: duplicate of models[0]"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":[]}]",
         "tenant \"a\": rate: must be an object, not array"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"rps\":-1}}]",
         "tenant \"a\": rate.rps: must be a number in 0..1e15"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"rps\":1e999}}]",
         "tenant \"a\": rate.rps: must be a number in 0..1e15"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"rps\":\"5\"}}]",
         "tenant \"a\": rate.rps: must be a number in 0..1e15, not string"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"burst\":0.5}}]",
         "tenant \"a\": rate.burst: must be 0 (the default) or at least 1"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"prompt_bytes_burst\":-2}}]",
         "tenant \"a\": rate.prompt_bytes_burst: must be a number in 0..1e15"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"prompt_bytes_per_s\":null}}]",
         "tenant \"a\": rate.prompt_bytes_per_s: must be a number in 0..1e15, not null"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"rpm\":1}}]",
         "tenant \"a\": rate.rpm: unknown field"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"rate\":{\"rps\":1,\"rps\":2}}]",
         "tenant \"a\": rate.rps: appears more than once"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"max_inflight\":-1}]",
         "tenant \"a\": max_inflight: must be an integer in 0..4294967295"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"max_inflight\":4294967296}]",
         "tenant \"a\": max_inflight: must be an integer"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"max_inflight\":1.5}]",
         "tenant \"a\": max_inflight: must be an integer"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":{}}]",
         "tenant \"a\": keys: must be an array of objects, not object"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[\"kvg-x\"]}]",
         "tenant \"a\": keys[0]: must be an object, not string"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[{\"id\":\"kaaaaaaaaaaaaaaa\"}]}]",
         "tenant \"a\": keys[0].sha256: required"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[" KEY("kAAAAAAAAAAAAAAA", D1) "]}]",
         "tenant \"a\": keys[0].id: must be \"k\" and 15 characters of a-z 0-9"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[" KEY("kaaaaaaaaaaaaaa", D1) "]}]",
         "tenant \"a\": keys[0].id: must be"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[" KEY("kaaaaaaaaaaaaaaa", "11") "]}]",
         "tenant \"a\": keys[0].sha256: must be 64 hex digits"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[" KEY(
             "kaaaaaaaaaaaaaaa",
             "g111111111111111111111111111111111111111111111111111111111111111") "]}]",
         "tenant \"a\": keys[0].sha256: must be 64 hex digits"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[" KEY("kaaaaaaaaaaaaaaa", D1) "," KEY(
             "kaaaaaaaaaaaaaaa", D2) "]}]",
         "tenant \"a\": keys[1].id: duplicate of keys[0]"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[" KEY("kaaaaaaaaaaaaaaa", D1) "," KEY(
             "kbbbbbbbbbbbbbbb", D1) "]}]",
         "tenant \"a\": keys[1].sha256: duplicate of keys[0]"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[{\"id\":\"kaaaaaaaaaaaaaaa\","
         "\"sha256\":\"" D1 "\",\"created\":\"2024-01-01T00:00:00Z\",\"key\":\"kvg-x\"}]}]",
         "tenant \"a\": keys[0].key: unknown field"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\"},{\"id\":\"a\",\"sharing\":\"global\"}]",
         "tenant \"a\": defined more than once"},
        {"[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[" KEY(
             "kaaaaaaaaaaaaaaa", D1) "]},"
                                     "{\"id\":\"b\",\"sharing\":\"isolated\",\"keys\":[" KEY(
                                         "kaaaaaaaaaaaaaaa", D1) "]}]",
         "tenant \"b\": keys: a key digest also belongs to another key"},
        {"[{\"id\":\"ok\",\"sharing\":\"isolated\"},{\"id\":\"b\",\"sharing\":\"isolated\","
         "\"rate\":{\"rps\":-3}}]",
         "tenant \"b\": rate.rps:"},
    };
#undef KEY
#undef D1
#undef D2
    kvg_tenants *ts = new_store();
    char keys[3][KVG_KEY_LEN + 1];
    fill_store(ts, keys);
    kvg_buf before, after;
    kvg_buf_init(&before);
    kvg_buf_init(&after);
    kvg_tenants_to_json(ts, &before);
    uint64_t g = kvg_tenants_generation(ts);
    char msg[256];
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        msg[0] = '\0';
        int rc = load(ts, bad[i].json, msg, sizeof(msg));
        if (rc != KVG_EPARSE || strncmp(msg, bad[i].msg, strlen(bad[i].msg)) != 0)
            fail_msg("case %zu: rc %d \"%s\", want \"%s...\"", i, rc, msg, bad[i].msg);
        /* all or nothing */
        assert_int_equal(kvg_tenants_generation(ts), g);
    }
    assert_int_equal(kvg_tenants_from_json(ts, NULL, msg, sizeof(msg)), KVG_EPARSE);
    kvg_tenants_to_json(ts, &after);
    assert_string_equal(before.data, after.data);

    /* too many keys, too many models */
    kvg_buf big;
    kvg_buf_init(&big);
    kvg_buf_puts(&big, "[{\"id\":\"a\",\"sharing\":\"isolated\",\"keys\":[");
    for (int i = 0; i <= KVG_TENANT_KEYS_MAX; i++)
        kvg_buf_printf(
            &big, "%s{\"id\":\"k%015d\",\"sha256\":\"%064d\",\"created\":\"2024-01-01T00:00:00Z\"}",
            i ? "," : "", i, i);
    kvg_buf_puts(&big, "]}]");
    assert_int_equal(load(ts, big.data, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "tenant \"a\": keys: more than 16 keys");
    kvg_buf_reset(&big);
    kvg_buf_puts(&big, "[{\"id\":\"a\",\"sharing\":\"isolated\",\"models\":[");
    for (int i = 0; i <= KVG_TENANT_MODELS_MAX; i++)
        kvg_buf_printf(&big, "%s\"m%d\"", i ? "," : "", i);
    kvg_buf_puts(&big, "]}]");
    assert_int_equal(load(ts, big.data, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "tenant \"a\": models: more than 64 models");
    assert_int_equal(kvg_tenants_generation(ts), g);
    kvg_buf_done(&big);
    kvg_buf_done(&before);
    kvg_buf_done(&after);
    kvg_tenants_free(ts);
}

static double elapsed_ms(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) / 1e6;
}

/* 10k tenants with a key each load as one snapshot. Times are printed, never asserted. */
static void test_load_10k(void **state)
{
    (void)state;
    enum { N = 10000 };
    kvg_buf text;
    kvg_buf_init(&text);
    kvg_buf_putc(&text, '[');
    char key[64], dhex[65];
    uint8_t d[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "kvg-%043d", i);
        sha256(key, KVG_KEY_LEN, d);
        hex(d, 32, dhex);
        kvg_buf_printf(&text,
                       "%s{\"id\":\"tenant-%05d\",\"sharing\":\"%s\",%s\"models\":[\"m\"],"
                       "\"rate\":{\"rps\":50,\"burst\":100,\"prompt_bytes_per_s\":0,"
                       "\"prompt_bytes_burst\":0},\"max_inflight\":64,\"keys\":[{\"id\":"
                       "\"k%015d\",\"sha256\":\"%s\",\"created\":\"2024-05-01T12:00:00.000Z\"}]}",
                       i ? ",\n" : "\n", (N - 1 - i) * 7 % N, i % 3 ? "isolated" : "group",
                       i % 3 ? "" : "\"group\":\"g\",", i, dhex);
    }
    kvg_buf_puts(&text, "\n]");
    assert_false(text.failed);

    kvg_tenants *ts = new_store();
    struct timespec t0, t1, t2, t3, t4;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *j = parse(&a, text.data);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char msg[256];
    uint64_t g = kvg_tenants_generation(ts);
    int rc = kvg_tenants_from_json(ts, j, msg, sizeof(msg));
    clock_gettime(CLOCK_MONOTONIC, &t2);
    if (rc)
        fail_msg("%s", msg);
    kvg_arena_done(&a);
    assert_int_equal(kvg_tenants_generation(ts), g + 1);

    /* one change on top of 10k tenants, and the serialisation back */
    assert_int_equal(put_simple(ts, "one-more"), 0);
    clock_gettime(CLOCK_MONOTONIC, &t3);
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_tenants_to_json(ts, &out);
    clock_gettime(CLOCK_MONOTONIC, &t4);
    print_message("# 10k tenants (%zu bytes of JSON): parse %.1f ms, from_json %.1f ms, one put "
                  "%.2f ms, to_json %.1f ms\n",
                  text.len, elapsed_ms(&t0, &t1), elapsed_ms(&t1, &t2), elapsed_ms(&t2, &t3),
                  elapsed_ms(&t3, &t4));

    kvg_tenant_set *s = kvg_tenants_acquire(ts);
    assert_int_equal(kvg_tenant_set_count(s), N + 1);
    for (int i = 0; i < N; i += 997) {
        snprintf(key, sizeof(key), "kvg-%043d", i);
        kvg_tenant *t = kvg_tenant_set_authenticate(s, key, KVG_KEY_LEN);
        assert_non_null(t);
        char id[32];
        snprintf(id, sizeof(id), "tenant-%05d", (N - 1 - i) * 7 % N);
        assert_string_equal(kvg_tenant_id(t), id);
        assert_ptr_equal(kvg_tenant_set_find(s, id), t);
    }
    kvg_tenant_set_unref(s);
    kvg_buf_done(&out);
    kvg_buf_done(&text);
    kvg_tenants_free(ts);
}

/* ---- state files ----------------------------------------------------------------------------- */

static size_t count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static void test_state_file(void **state)
{
    (void)state;
    char dir[256], path[512], sub[512];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/state.json", dir);
    kvg_buf b;
    kvg_buf_init(&b);

    mode_t old_umask = umask(077);
    assert_int_equal(kvg_state_write_file(path, "hello", 5, 0640), 0);
    umask(old_umask);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640); /* exactly, whatever the umask */
    assert_int_equal(kvg_state_write_file(path, "second version", 14, 0600), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(count_entries(dir), 1); /* no temporary file left */

    kvg_buf_puts(&b, "prefix:");
    assert_int_equal(kvg_state_read_file(path, 1 << 20, &b), 0);
    assert_string_equal(b.data, "prefix:second version");
    kvg_buf_reset(&b);
    assert_int_equal(kvg_state_read_file(path, 14, &b), 0);
    assert_int_equal(b.len, 14);
    kvg_buf_reset(&b);
    kvg_buf_puts(&b, "kept");
    assert_int_equal(kvg_state_read_file(path, 13, &b), -EFBIG);
    assert_string_equal(b.data, "kept");
    kvg_buf_reset(&b);
    assert_int_equal(kvg_state_read_file(path, SIZE_MAX, &b), 0);
    assert_int_equal(b.len, 14);

    /* empty files, big files */
    assert_int_equal(kvg_state_write_file(path, NULL, 0, 0600), 0);
    kvg_buf_reset(&b);
    assert_int_equal(kvg_state_read_file(path, 10, &b), 0);
    assert_int_equal(b.len, 0);
    size_t big = 3 * 65536 + 17;
    char *data = malloc(big);
    assert_non_null(data);
    for (size_t i = 0; i < big; i++)
        data[i] = (char)('a' + i % 26);
    assert_int_equal(kvg_state_write_file(path, data, big, 0600), 0);
    kvg_buf_reset(&b);
    assert_int_equal(kvg_state_read_file(path, big, &b), 0);
    assert_int_equal(b.len, big);
    assert_memory_equal(b.data, data, big);
    kvg_buf_reset(&b);
    assert_int_equal(kvg_state_read_file(path, big - 1, &b), -EFBIG);
    free(data);

    /* missing folders and files */
    snprintf(sub, sizeof(sub), "%s/missing/state.json", dir);
    assert_int_equal(kvg_state_write_file(sub, "x", 1, 0600), -ENOENT);
    assert_int_equal(kvg_state_read_file(sub, 10, &b), -ENOENT);
    snprintf(sub, sizeof(sub), "%s/nope.json", dir);
    assert_int_equal(kvg_state_read_file(sub, 10, &b), -ENOENT);
    assert_int_equal(kvg_state_read_file(dir, 10, &b), -EISDIR);
    /* a folder in the way of the target: the rename fails, nothing is left behind */
    snprintf(sub, sizeof(sub), "%s/adir", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    int rc = kvg_state_write_file(sub, "x", 1, 0600);
    assert_true(rc == -EISDIR || rc == -ENOTEMPTY || rc == -EEXIST);
    assert_int_equal(count_entries(dir), 2);
    assert_int_equal(rmdir(sub), 0);

    /* the store's persistent form through a file */
    kvg_tenants *ts = new_store();
    char keys[3][KVG_KEY_LEN + 1];
    fill_store(ts, keys);
    kvg_buf_reset(&b);
    kvg_tenants_to_json(ts, &b);
    assert_int_equal(kvg_state_write_file(path, b.data, b.len, 0600), 0);
    kvg_buf in;
    kvg_buf_init(&in);
    assert_int_equal(kvg_state_read_file(path, 1 << 20, &in), 0);
    assert_string_equal(in.data, b.data);
    kvg_tenants *ts2 = new_store();
    char msg[256];
    assert_int_equal(load(ts2, in.data, msg, sizeof(msg)), 0);
    kvg_tenant_set *s = kvg_tenants_acquire(ts2);
    assert_non_null(kvg_tenant_set_authenticate(s, keys[2], KVG_KEY_LEN));
    kvg_tenant_set_unref(s);
    kvg_tenants_free(ts2);
    kvg_tenants_free(ts);
    kvg_buf_done(&in);

    /* a relative path (the folder is "."): run inside dir */
    char cwd[512];
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_int_equal(chdir(dir), 0);
    assert_int_equal(kvg_state_write_file("rel.json", "r", 1, 0600), 0);
    assert_int_equal(chdir(cwd), 0);
    snprintf(sub, sizeof(sub), "%s/rel.json", dir);
    assert_int_equal(unlink(sub), 0);

    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
    kvg_buf_done(&b);
}

const struct CMUnitTest persist_tests[] = {
    cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_json_created_times),
    cmocka_unit_test(test_json_rejects),    cmocka_unit_test(test_load_10k),
    cmocka_unit_test(test_state_file),
};
const size_t persist_tests_count = KVG_ARRAY_LEN(persist_tests);
