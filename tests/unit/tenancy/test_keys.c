/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for API keys (tenancy/keys.c): their format, authentication by digest, deletion,
 * restoring saved keys, and the limit per tenant. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tenancy.h"
#include "tenancy_helpers.h"

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

const struct CMUnitTest keys_tests[] = {
    cmocka_unit_test(test_keys),
};
const size_t keys_tests_count = KVG_ARRAY_LEN(keys_tests);
