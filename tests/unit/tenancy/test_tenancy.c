/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for tenancy/: validation, tenants and keys, snapshots, admission, counters and
 * metrics, persistence, state files, concurrency and allocation failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "fail_alloc.h"
#include "tenancy.h"

#define SEC 1000000000ull

static kvg_tenants *new_store(void)
{
    kvg_tenants *ts = NULL;
    assert_int_equal(kvg_tenants_new(&ts), 0);
    assert_non_null(ts);
    return ts;
}

static int put_def(kvg_tenants *ts, const kvg_tenant_def *def, bool *created)
{
    char msg[256];
    int rc = kvg_tenants_put(ts, def, created, msg, sizeof(msg));
    if (rc != 0 && rc != -ENOMEM)
        print_message("put %s: %s\n", def->id ? def->id : "(null)", msg);
    return rc;
}

static int put_simple(kvg_tenants *ts, const char *id)
{
    kvg_tenant_def d = {.id = id};
    return put_def(ts, &d, NULL);
}

static void sha256(const char *s, size_t len, uint8_t out[32])
{
    unsigned n = 0;
    assert_true(EVP_Digest(s, len, out, &n, EVP_sha256(), NULL));
    assert_int_equal(n, 32);
}

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static kvg_json *parse(kvg_arena *a, const char *text)
{
    kvg_json *j = NULL;
    kvg_json_error err;
    int rc = kvg_json_parse(text, strlen(text), a, NULL, &j, &err);
    if (rc != 0)
        fail_msg("json: %s at %zu", err.message, err.offset);
    return j;
}

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

/* ---- keys ------------------------------------------------------------------------------------ */

static bool b64url_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void test_keys(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    assert_int_equal(put_simple(ts, "acme"), 0);
    assert_int_equal(put_simple(ts, "other-tenant"), 0);
    char key[KVG_KEY_LEN + 1], kid[KVG_KEY_ID_LEN + 1];
    char key2[KVG_KEY_LEN + 1], kid2[KVG_KEY_ID_LEN + 1];
    uint64_t before_ns = kvg_wall_ns();
    assert_int_equal(kvg_tenants_key_create(ts, "acme", key, kid), 0);
    assert_int_equal(kvg_tenants_key_create(ts, "acme", key2, kid2), 0);

    /* formats */
    assert_int_equal(strlen(key), KVG_KEY_LEN);
    assert_memory_equal(key, KVG_KEY_PREFIX, 4);
    for (size_t i = 4; i < KVG_KEY_LEN; i++)
        assert_true(b64url_char(key[i]));
    /* 32 bytes = 43 characters: the last one carries 2 bits, so it is one of AEIMQUYcgkosw048 */
    assert_non_null(strchr("AEIMQUYcgkosw048", key[KVG_KEY_LEN - 1]));
    assert_int_equal(strlen(kid), KVG_KEY_ID_LEN);
    assert_int_equal(kid[0], 'k');
    for (size_t i = 1; i < KVG_KEY_ID_LEN; i++)
        assert_true((kid[i] >= 'a' && kid[i] <= 'z') || (kid[i] >= '0' && kid[i] <= '9'));
    assert_string_not_equal(key, key2);
    assert_string_not_equal(kid, kid2);

    kvg_tenant_set *s = kvg_tenants_acquire(ts);
    kvg_tenant *t = kvg_tenant_set_find(s, "acme");
    assert_int_equal(kvg_tenant_key_count(t), 2);
    const kvg_key_info *ki = kvg_tenant_key(t, 0);
    assert_string_equal(ki->id, kid);
    uint8_t d[32];
    sha256(key, strlen(key), d);
    assert_memory_equal(ki->digest, d, 32); /* the digest of the whole key string */
    assert_true(ki->created_wall_ns >= before_ns && ki->created_wall_ns <= kvg_wall_ns());

    /* authentication */
    assert_ptr_equal(kvg_tenant_set_authenticate(s, key, strlen(key)), t);
    assert_ptr_equal(kvg_tenant_set_authenticate(s, key2, strlen(key2)), t);
    char wrong[KVG_KEY_LEN + 1];
    memcpy(wrong, key, sizeof(wrong));
    wrong[10] = wrong[10] == 'A' ? 'B' : 'A'; /* right length, right prefix */
    assert_null(kvg_tenant_set_authenticate(s, wrong, strlen(wrong)));
    memcpy(wrong, key, sizeof(wrong));
    wrong[KVG_KEY_LEN - 1] = wrong[KVG_KEY_LEN - 1] == 'A' ? 'E' : 'A';
    assert_null(kvg_tenant_set_authenticate(s, wrong, strlen(wrong)));
    assert_null(kvg_tenant_set_authenticate(s, key, KVG_KEY_LEN - 1));
    memcpy(wrong, key, sizeof(wrong));
    wrong[0] = 'K';
    assert_null(kvg_tenant_set_authenticate(s, wrong, KVG_KEY_LEN));
    assert_null(kvg_tenant_set_authenticate(s, NULL, 0));
    assert_null(kvg_tenant_set_authenticate(s, "", 0));
    char longer[KVG_KEY_LEN + 2];
    snprintf(longer, sizeof(longer), "%sA", key);
    assert_null(kvg_tenant_set_authenticate(s, longer, strlen(longer)));

    /* the key appears nowhere in the persistent form or the metrics; the digest does */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_tenants_to_json(ts, &b);
    assert_null(strstr(b.data, key));
    assert_null(strstr(b.data, key + 4));
    assert_null(strstr(b.data, key2 + 4));
    char dhex[65];
    hex(d, 32, dhex);
    assert_non_null(strstr(b.data, dhex));
    kvg_buf_reset(&b);
    kvg_tenants_write_metrics(ts, 10, &b);
    assert_null(strstr(b.data, key + 4));
    kvg_buf_done(&b);

    /* delete */
    kvg_key_info saved = *ki;
    assert_int_equal(kvg_tenants_key_delete(ts, "acme", kid), 0);
    assert_int_equal(kvg_tenants_key_delete(ts, "acme", kid), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_key_delete(ts, "nope", kid2), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_key_delete(ts, "other-tenant", kid2), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_key_delete(ts, NULL, kid2), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_key_delete(ts, "acme", NULL), KVG_ENOTFOUND);
    kvg_tenant_set *s2 = kvg_tenants_acquire(ts);
    assert_null(kvg_tenant_set_authenticate(s2, key, strlen(key)));
    kvg_tenant *t2 = kvg_tenant_set_find(s2, "acme");
    assert_ptr_equal(kvg_tenant_set_authenticate(s2, key2, strlen(key2)), t2);
    assert_int_equal(kvg_tenant_key_count(t2), 1);
    assert_string_equal(kvg_tenant_key(t2, 0)->id, kid2);
    /* the snapshot from before still knows it */
    assert_ptr_equal(kvg_tenant_set_authenticate(s, key, strlen(key)), t);
    kvg_tenant_set_unref(s2);
    kvg_tenant_set_unref(s);

    /* restore */
    assert_int_equal(kvg_tenants_key_restore(ts, "nope", &saved), KVG_ENOTFOUND);
    kvg_key_info badid = saved;
    strcpy(badid.id, "K000000000000000");
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", &badid), KVG_EPARSE);
    strcpy(badid.id, "kABCDEFGHIJKLMNO");
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", &badid), KVG_EPARSE);
    strcpy(badid.id, "kshort");
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", &badid), KVG_EPARSE);
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", NULL), KVG_EPARSE);
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", &saved), 0);
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", &saved), -EEXIST); /* id and digest */
    kvg_key_info same_digest = saved;
    strcpy(same_digest.id, "kzzzzzzzzzzzzzzz");
    assert_int_equal(kvg_tenants_key_restore(ts, "other-tenant", &same_digest), -EEXIST);
    kvg_key_info same_id = saved;
    same_id.digest[0] ^= 1;
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", &same_id), -EEXIST);
    assert_int_equal(kvg_tenants_key_restore(ts, "other-tenant", &same_id), 0); /* per tenant */
    s = kvg_tenants_acquire(ts);
    t = kvg_tenant_set_find(s, "acme");
    assert_ptr_equal(kvg_tenant_set_authenticate(s, key, strlen(key)), t);
    assert_int_equal(kvg_tenant_key(t, 1)->created_wall_ns, saved.created_wall_ns);
    kvg_tenant_set_unref(s);

    /* limits: KVG_TENANT_KEYS_MAX per tenant, for create and restore */
    assert_int_equal(kvg_tenants_key_create(ts, "nope", key, kid), KVG_ENOTFOUND);
    assert_int_equal(kvg_tenants_key_create(ts, NULL, key, kid), KVG_ENOTFOUND);
    for (int i = 2; i < KVG_TENANT_KEYS_MAX; i++)
        assert_int_equal(kvg_tenants_key_create(ts, "acme", key, kid), 0);
    char untouched[KVG_KEY_LEN + 1];
    memcpy(untouched, key, sizeof(untouched));
    assert_int_equal(kvg_tenants_key_create(ts, "acme", key, kid), KVG_ELIMIT);
    assert_memory_equal(key, untouched, sizeof(untouched)); /* outputs only on success */
    kvg_key_info fresh = saved;
    fresh.digest[5] ^= 0x40;
    strcpy(fresh.id, "k000000000000000");
    assert_int_equal(kvg_tenants_key_restore(ts, "acme", &fresh), KVG_ELIMIT);
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

/* ---- admission ------------------------------------------------------------------------------- */

static kvg_tenant *one_tenant(kvg_tenants **ts, const kvg_tenant_limits *l, kvg_tenant_set **s)
{
    *ts = new_store();
    kvg_tenant_def d = {.id = "t", .limits = *l};
    assert_int_equal(put_def(*ts, &d, NULL), 0);
    *s = kvg_tenants_acquire(*ts);
    return kvg_tenant_set_find(*s, "t");
}

static void release_all(kvg_tenant *t)
{
    while (kvg_tenant_inflight(t))
        kvg_tenant_release(t);
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

/* ---- metrics --------------------------------------------------------------------------------- */

typedef struct family {
    char name[96];
    char type[16];
} family;

/* Parse the exposition text like a scraper would: HELP then TYPE before each family's samples,
 * each family once, samples contiguous, counters named _total, label values quoted with only
 * \\, \" and \n escapes, values non-negative numbers. Returns the number of samples. */
static size_t check_exposition(const char *text, family *fams, size_t *nfams)
{
    size_t samples = 0;
    const family *current = NULL;
    *nfams = 0;
    const char *line = text;
    while (*line) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol);
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
                assert_string_not_equal(fams[i].name, name);
            assert_true(*nfams < 16);
            family *f = &fams[(*nfams)++];
            snprintf(f->name, sizeof(f->name), "%s", name);
            f->type[0] = '\0';
            assert_true(strlen(buf) > 8 + strlen(name));
            current = f;
            continue;
        }
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            char name[96], type[16];
            assert_int_equal(sscanf(buf + 7, "%95s %15s", name, type), 2);
            assert_non_null(current);
            assert_string_equal(name, current->name);
            assert_true(strcmp(type, "gauge") == 0 || strcmp(type, "counter") == 0);
            snprintf(((family *)current)->type, sizeof(current->type), "%s", type);
            continue;
        }
        assert_true(buf[0] != '#');
        char *sp = strrchr(buf, ' ');
        assert_non_null(sp);
        char *end;
        double v = strtod(sp + 1, &end);
        assert_true(*end == '\0' && end != sp + 1);
        assert_true(v >= 0);
        *sp = '\0';
        char *brace = strchr(buf, '{');
        if (brace) {
            assert_true(sp[-1] == '}');
            sp[-1] = '\0';
            *brace = '\0';
            const char *p = brace + 1;
            while (*p) {
                const char *eq = strchr(p, '=');
                assert_non_null(eq);
                assert_true(eq[1] == '"');
                const char *q = eq + 2;
                while (*q && *q != '"') {
                    if (*q == '\\') {
                        q++;
                        assert_true(*q == '\\' || *q == '"' || *q == 'n');
                    }
                    q++;
                }
                assert_true(*q == '"');
                p = q + 1;
                if (*p == ',')
                    p++;
                else
                    assert_true(*p == '\0');
            }
        }
        assert_non_null(current);
        assert_string_equal(buf, current->name);
        assert_true(current->type[0] != '\0');
        if (strcmp(current->type, "counter") == 0)
            assert_non_null(strstr(current->name, "_total"));
        samples++;
    }
    return samples;
}

static void expect_line(const char *text, const char *line)
{
    if (!strstr(text, line))
        fail_msg("missing line %s in:\n%s", line, text);
}

static void test_metrics(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    kvg_buf out;
    kvg_buf_init(&out);
    family fams[16];
    size_t nfams;
    kvg_tenants_write_metrics(ts, 10, &out);
    assert_int_equal(check_exposition(out.data, fams, &nfams), 1 + 3);
    assert_int_equal(nfams, 10); /* + prompt, cached and predicted tokens */
    expect_line(out.data, "kvgate_tenants 0\n");
    expect_line(out.data, "kvgate_auth_failures_total{reason=\"unknown\"} 0\n");

    /* ordinals 0..4: a, b, other, c, d */
    const char *ids[] = {"a", "b", "other", "c", "d"};
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(put_simple(ts, ids[i]), 0);
    kvg_tenant_set *s = kvg_tenants_acquire(ts);
    kvg_tenant *a = kvg_tenant_set_find(s, "a");
    kvg_tenant *c = kvg_tenant_set_find(s, "c");
    kvg_tenant *d = kvg_tenant_set_find(s, "d");
    kvg_tenant *o = kvg_tenant_set_find(s, "other");
    kvg_tenant_record(a, 200, 100);
    kvg_tenant_record(a, 200, 50);
    kvg_tenant_record(a, 429, 0);
    kvg_tenant_record(a, 201, 0);  /* by class */
    kvg_tenant_record(a, 302, 0);  /* by class */
    kvg_tenant_record(a, 499, 7);  /* client left */
    kvg_tenant_record(a, 0, 0);    /* outside 100..599 */
    kvg_tenant_record(a, 1000, 0); /* outside 100..599 */
    kvg_tenant_record(a, -5, 0);   /* outside 100..599 */
    kvg_tenant_record_refusal(a, KVG_ADMIT_RATE);
    kvg_tenant_record_refusal(a, KVG_ADMIT_INFLIGHT);
    kvg_tenant_record_refusal(a, KVG_ADMIT_OK);         /* not a refusal: ignored */
    kvg_tenant_record_refusal(a, (kvg_admit_result)42); /* out of range: ignored */
    kvg_tenant_record(c, 200, 1);
    kvg_tenant_record(d, 200, 2);
    kvg_tenant_record(d, 503, 0);
    kvg_tenant_record(o, 200, 4);
    kvg_tenant_record_refusal(c, KVG_ADMIT_BYTES);
    kvg_tenant_record_refusal(d, KVG_ADMIT_BYTES);
    kvg_tenant_record_refusal(d, KVG_ADMIT_BUFFER);
    assert_true(kvg_tenant_buffer_charge(a, 1000, 0));
    assert_true(kvg_tenant_buffer_charge(c, 30, 0));
    assert_true(kvg_tenant_buffer_charge(d, 12, 0));
    assert_int_equal(kvg_tenant_admit(d, 0, 0, NULL), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(c, 0, 0, NULL), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(a, 0, 0, NULL), KVG_ADMIT_OK);
    kvg_tenants_record_auth_failure(ts, "missing");
    kvg_tenants_record_auth_failure(ts, "unknown");
    kvg_tenants_record_auth_failure(ts, "unknown");
    kvg_tenants_record_auth_failure(ts, "malformed");
    kvg_tenants_record_auth_failure(ts, "bogus"); /* counted as unknown */
    kvg_tenants_record_auth_failure(ts, NULL);

    /* cap 3: a, b have labels ("other", ordinal 2, never does); c and d are summed */
    kvg_buf_reset(&out);
    kvg_tenants_write_metrics(ts, 3, &out);
    assert_false(out.failed);
    size_t n = check_exposition(out.data, fams, &nfams);
    assert_int_equal(nfams, 10);
    static const char *const order[] = {
        "kvgate_tenants",
        "kvgate_tenant_requests_total",
        "kvgate_tenant_rate_limited_total",
        "kvgate_tenant_prompt_bytes_total",
        "kvgate_tenant_inflight",
        "kvgate_tenant_buffered_bytes",
        "kvgate_tenant_prompt_tokens_total",
        "kvgate_tenant_cached_tokens_total",
        "kvgate_tenant_predicted_tokens_total",
        "kvgate_auth_failures_total",
    };
    for (size_t i = 0; i < nfams; i++)
        assert_string_equal(fams[i].name, order[i]);
    assert_string_equal(fams[0].type, "gauge");
    assert_string_equal(fams[4].type, "gauge");
    static const char *const expect[] = {
        "kvgate_tenants 5\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"200\"} 2\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"429\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"499\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"2xx\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"3xx\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"other\"} 3\n",
        "kvgate_tenant_requests_total{tenant=\"other\",code=\"200\"} 3\n",
        "kvgate_tenant_requests_total{tenant=\"other\",code=\"503\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"rate\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"bytes\"} 0\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"inflight\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"b\",reason=\"rate\"} 0\n",
        "kvgate_tenant_rate_limited_total{tenant=\"other\",reason=\"bytes\"} 2\n",
        "kvgate_tenant_prompt_bytes_total{tenant=\"a\"} 157\n",
        "kvgate_tenant_prompt_bytes_total{tenant=\"b\"} 0\n",
        "kvgate_tenant_prompt_bytes_total{tenant=\"other\"} 7\n",
        "kvgate_tenant_inflight{tenant=\"a\"} 1\n",
        "kvgate_tenant_inflight{tenant=\"other\"} 2\n",
        "kvgate_tenant_rate_limited_total{tenant=\"other\",reason=\"buffer\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"buffer\"} 0\n",
        "kvgate_tenant_buffered_bytes{tenant=\"a\"} 1000\n",
        "kvgate_tenant_buffered_bytes{tenant=\"b\"} 0\n",
        "kvgate_tenant_buffered_bytes{tenant=\"other\"} 42\n",
        "kvgate_auth_failures_total{reason=\"missing\"} 1\n",
        "kvgate_auth_failures_total{reason=\"malformed\"} 1\n",
        "kvgate_auth_failures_total{reason=\"unknown\"} 4\n",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(expect); i++)
        expect_line(out.data, expect[i]);
    assert_null(strstr(out.data, "tenant=\"c\""));
    assert_null(strstr(out.data, "tenant=\"d\""));
    assert_null(strstr(out.data, "reason=\"ok\""));
    assert_null(strstr(out.data, "tenant=\"b\",code"));
    /* "other" comes once per series, after the labelled tenants */
    const char *first = strstr(out.data, "kvgate_tenant_inflight{tenant=\"other\"}");
    assert_null(strstr(first + 1, "kvgate_tenant_inflight{tenant=\"other\"}"));
    assert_true(first > strstr(out.data, "kvgate_tenant_inflight{tenant=\"b\"}"));
    /* 1 + a: 6 codes + b: 0 + other: 2 codes + 3 x 4 reasons + 3 bytes + 3 inflight
     * + 3 buffered + 3 x 3 usage counters + 3 auth */
    assert_int_equal(n, 1 + 6 + 2 + 12 + 3 + 3 + 3 + 9 + 3);

    /* a cap above every ordinal: no "other" series unless the tenant named so */
    kvg_buf_reset(&out);
    kvg_tenants_write_metrics(ts, 1000, &out);
    check_exposition(out.data, fams, &nfams);
    expect_line(out.data, "kvgate_tenant_inflight{tenant=\"c\"} 1\n");
    expect_line(out.data, "kvgate_tenant_requests_total{tenant=\"other\",code=\"200\"} 1\n");
    /* cap 0: everything is "other" */
    kvg_buf_reset(&out);
    kvg_tenants_write_metrics(ts, 0, &out);
    n = check_exposition(out.data, fams, &nfams);
    expect_line(out.data, "kvgate_tenant_inflight{tenant=\"other\"} 3\n");
    expect_line(out.data, "kvgate_tenant_prompt_bytes_total{tenant=\"other\"} 164\n");
    assert_null(strstr(out.data, "tenant=\"a\""));

    release_all(a);
    release_all(c);
    release_all(d);
    kvg_tenant_set_unref(s);
    kvg_buf_done(&out);
    kvg_tenants_free(ts);
}

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

static int load(kvg_tenants *ts, const char *text, char *msg, size_t msg_len)
{
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *j = parse(&a, text);
    int rc = kvg_tenants_from_json(ts, j, msg, msg_len);
    kvg_arena_done(&a);
    return rc;
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
    print_message("10k tenants (%zu bytes of JSON): parse %.1f ms, from_json %.1f ms, one put "
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

static void make_tmpdir(char *dir, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, len, "%s/kvg-tenancy-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
}

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
    print_message("stress: %lu tenant lookups, %lu admitted\n", auth, admitted);
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
        cmocka_unit_test(test_id_validation),
        cmocka_unit_test(test_def_validation),
        cmocka_unit_test(test_put_and_accessors),
        cmocka_unit_test(test_replace_keeps_runtime),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_snapshot_lifetime),
        cmocka_unit_test(test_admit_rate),
        cmocka_unit_test(test_admit_bytes_and_inflight),
        cmocka_unit_test(test_admit_all_or_nothing),
        cmocka_unit_test(test_buffer_share),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_json_created_times),
        cmocka_unit_test(test_json_rejects),
        cmocka_unit_test(test_load_10k),
        cmocka_unit_test(test_state_file),
        cmocka_unit_test(test_concurrent_stress),
        cmocka_unit_test(test_snapshot_cache),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
