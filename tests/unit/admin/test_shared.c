/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for what the shared state (admin/shared.c, admin/state.c) does without a socket:
 * the server secret's verifier, and a document from Redis applied as a replacement (what is
 * gone goes, runtime state stays, the same document twice changes nothing, a bad one is
 * refused naming the section). The Redis side is tested by
 * tests/integration/test_shared_state.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_helpers.h"
#include "admin_int.h"

static void test_verifier(void **state)
{
    (void)state;
    /* HMAC-SHA256(secret, "kvgate server secret verifier v1"), as Python's hmac computes it */
    static const char secret[] = "0123456789abcdef0123456789abcdef";
    char v[65], w[65];
    assert_int_equal(kvg_admin_secret_verifier((const uint8_t *)secret, sizeof(secret) - 1, v), 0);
    assert_string_equal(v, "45f1c7fe8094592e1094bcd1a6be7f2068a71e88303c4f697d9bcf6a6d1b2d2f");
    /* one character apart: another verifier */
    static const char other[] = "0123456789abcdef0123456789abcdeF";
    assert_int_equal(kvg_admin_secret_verifier((const uint8_t *)other, sizeof(other) - 1, w), 0);
    assert_string_equal(w, "ac320597d791b50f3ef29105bc6a9586de8bc7c0064cc8cf42b1ec4c39263523");
    assert_null(strstr(v, "0123456789abcdef"));
    /* an empty secret still has one (the gateway refuses secrets under 32 characters) */
    assert_int_equal(kvg_admin_secret_verifier(NULL, 0, w), 0);
    assert_int_equal(strlen(w), 64);
}

/* Apply a document under the change lock, as the sync thread does. */
static int apply(fixture *f, const char *doc, bool replace, char *msg, size_t len)
{
    pthread_mutex_lock(&f->admin->change_lock);
    int rc = kvg_admin_apply_doc(f->admin, doc, strlen(doc), replace, msg, len);
    pthread_mutex_unlock(&f->admin->change_lock);
    return rc;
}

static char *doc_of(fixture *f)
{
    kvg_buf b;
    kvg_buf_init(&b);
    pthread_mutex_lock(&f->admin->change_lock);
    kvg_admin_state_doc(f->admin, &b);
    pthread_mutex_unlock(&f->admin->change_lock);
    kvg_buf_putc(&b, '\0');
    assert_false(b.failed);
    size_t len;
    return kvg_buf_steal(&b, &len);
}

static const char remote_doc[] =
    "{\"version\":1,\"tenants\":[{\"id\":\"acme\",\"sharing\":\"global\",\"max_inflight\":9,"
    "\"keys\":[{\"id\":\"k000000000000001\",\"sha256\":"
    "\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\","
    "\"created\":\"2024-05-01T12:00:00.000Z\"}]}],"
    "\"workers\":[{\"name\":\"w2\",\"url\":\"http://h:2\"}]}";

static void test_replace(void **state)
{
    fixture *f = *state;
    char msg[256];
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/acme", AUTH, "{}").status, 201);
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/beta", AUTH, "{}").status, 201);
    reply r = call(f, "POST", "/admin/v1/tenants/acme/keys", AUTH, NULL);
    assert_int_equal(r.status, 201);
    char key[KVG_KEY_LEN + 1];
    snprintf(key, sizeof(key), "%s", str_field(&r, "key"));
    assert_int_equal(
        call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}").status, 201);
    assert_int_equal(
        call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\",\"load_factor\":2}")
            .status,
        200);
    /* a request of acme in flight across the replacement */
    kvg_tenant_set *set = kvg_tenants_acquire(f->tenants);
    kvg_tenant *t = kvg_tenant_ref(kvg_tenant_set_find(set, "acme"));
    kvg_tenant_set_unref(set);
    unsigned retry;
    assert_int_equal(kvg_tenant_admit(t, kvg_now_ns(), 1, &retry), KVG_ADMIT_OK);

    /* The document: acme redefined with another key, beta gone, w1 gone and w2 new, no policy
     * section (the defaults). */
    assert_int_equal(apply(f, remote_doc, true, msg, sizeof(msg)), 0);
    set = kvg_tenants_acquire(f->tenants);
    assert_int_equal(kvg_tenant_set_count(set), 1);
    kvg_tenant *now = kvg_tenant_set_find(set, "acme");
    assert_non_null(now);
    assert_int_equal(kvg_tenant_sharing(now), KVG_SHARING_GLOBAL);
    assert_int_equal(kvg_tenant_limits_of(now)->max_inflight, 9);
    assert_int_equal(kvg_tenant_key_count(now), 1);
    assert_string_equal(kvg_tenant_key(now, 0)->id, "k000000000000001");
    assert_null(kvg_tenant_set_authenticate(set, key, strlen(key)));
    /* the runtime state stays with the tenant: its request is still counted */
    assert_int_equal(kvg_tenant_inflight(now), 1);
    kvg_tenant_set_unref(set);
    kvg_tenant_release(t);
    kvg_tenant_unref(t);
    assert_int_equal(call(f, "GET", "/admin/v1/workers/w1", AUTH, NULL).status, 404);
    assert_int_equal(call(f, "GET", "/admin/v1/workers/w2", AUTH, NULL).status, 200);
    r = call(f, "GET", "/admin/v1/policy", AUTH, NULL);
    assert_string_equal(str_field(&r, "policy"), "cost");

    /* the same document again: the same state, the worker object kept */
    kvg_worker_set *ws = kvg_registry_acquire(f->reg);
    uint64_t id = kvg_worker_id(kvg_worker_set_find(ws, "w2"));
    kvg_worker_set_unref(ws);
    char *before = doc_of(f);
    assert_int_equal(apply(f, remote_doc, true, msg, sizeof(msg)), 0);
    char *after = doc_of(f);
    assert_string_equal(before, after);
    ws = kvg_registry_acquire(f->reg);
    assert_int_equal(kvg_worker_id(kvg_worker_set_find(ws, "w2")), id);
    kvg_worker_set_unref(ws);

    /* what the state builds is what it applies: a round trip changes nothing */
    assert_int_equal(apply(f, after, true, msg, sizeof(msg)), 0);
    char *again = doc_of(f);
    assert_string_equal(after, again);
    free(before);
    free(after);
    free(again);
}

static void test_load_is_not_a_replacement(void **state)
{
    fixture *f = *state;
    char msg[256];
    assert_int_equal(
        call(f, "PUT", "/admin/v1/workers/w1", AUTH, "{\"url\":\"http://h:1\"}").status, 201);
    assert_int_equal(call(f, "PUT", "/admin/v1/policy", AUTH, "{\"policy\":\"random\"}").status,
                     200);
    /* the state file at start-up: sections absent are left alone */
    assert_int_equal(apply(f, "{\"version\":1,\"tenants\":[]}", false, msg, sizeof(msg)), 0);
    assert_int_equal(call(f, "GET", "/admin/v1/workers/w1", AUTH, NULL).status, 200);
    reply r = call(f, "GET", "/admin/v1/policy", AUTH, NULL);
    assert_string_equal(str_field(&r, "policy"), "random");
    /* a replacement: they are emptied */
    assert_int_equal(apply(f, "{\"version\":1}", true, msg, sizeof(msg)), 0);
    assert_int_equal(call(f, "GET", "/admin/v1/workers/w1", AUTH, NULL).status, 404);
    r = call(f, "GET", "/admin/v1/policy", AUTH, NULL);
    assert_string_equal(str_field(&r, "policy"), "cost");
}

static void test_bad_documents(void **state)
{
    fixture *f = *state;
    char msg[256];
    assert_int_equal(call(f, "PUT", "/admin/v1/tenants/keep", AUTH, "{}").status, 201);
    static const struct {
        const char *doc, *msg;
    } cases[] = {
        {"", "invalid JSON"},
        {"[]", "must be a JSON object"},
        {"{\"version\":2}", "version: must be 1"},
        {"{\"version\":1,\"extra\":1}", "extra: unknown field"},
        {"{\"version\":1,\"policy\":{\"policy\":\"nope\"}}", "policy: "},
        {"{\"version\":1,\"tenants\":[{\"id\":\"a\",\"sharing\":\"nope\"}]}", "tenants: "},
        {"{\"version\":1,\"workers\":[{\"name\":\"w\"}]}", "workers: "},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        msg[0] = '\0';
        int rc = apply(f, cases[i].doc, true, msg, sizeof(msg));
        if (rc >= 0 || !strstr(msg, cases[i].msg))
            fail_msg("document %zu: rc %d, message \"%s\" (want \"%s\")", i, rc, msg, cases[i].msg);
    }
    /* none of them touched the tenants (the ones refused before the tenants section) */
    assert_int_equal(call(f, "GET", "/admin/v1/tenants/keep", AUTH, NULL).status, 200);
}

const struct CMUnitTest shared_tests[] = {
    cmocka_unit_test(test_verifier),
    cmocka_unit_test_setup_teardown(test_replace, setup, teardown),
    cmocka_unit_test_setup_teardown(test_load_is_not_a_replacement, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bad_documents, setup, teardown),
};
const size_t shared_tests_count = KVG_ARRAY_LEN(shared_tests);
