/* SPDX-License-Identifier: Apache-2.0 */
/* API keys: generation (256 random bits), SHA-256 digests, authentication by digest, and the
 * key changes of the store (create, restore, delete). */
/* SHA256_Init/_Update/_Final, deprecated by OpenSSL 3: see kvg_tenancy_sha256. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "tenancy_int.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/types.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/sha.h>

#define KEY_RANDOM_BYTES 32
#define KEY_ID_ATTEMPTS 8

/* ---- digests --------------------------------------------------------------------------------- */

/* A digest on every request with a key. OpenSSL 3's EVP interface allocates and frees a
 * context and its provider state each time, even when one context is kept and re-initialised
 * (four allocations, ~1,300 instructions besides the hash; callgrind, 2026-12-02). The low-level
 * SHA256_Init/_Update/_Final run the same assembly (SHA-NI where the CPU has it) with the state on
 * the stack (SHA256() goes through EVP again). OpenSSL 3 marks it deprecated in favour of EVP,
 * which is what costs here: the warning is silenced for this file alone. */
int kvg_tenancy_sha256(const void *data, size_t len, uint8_t out[KVG_KEY_DIGEST_LEN])
{
    SHA256_CTX c;
    if (!SHA256_Init(&c) || !SHA256_Update(&c, data, len) || !SHA256_Final(out, &c))
        return KVG_ETLS;
    return 0;
}

/* ---- generation ------------------------------------------------------------------------------ */

/* "kvg-" + base64url(32 random bytes): 47 characters. */
static int make_key(char key[KVG_KEY_LEN + 1])
{
    uint8_t raw[KEY_RANDOM_BYTES];
    int rc = kvg_random_bytes(raw, sizeof(raw));
    if (rc < 0)
        return rc;
    memcpy(key, KVG_KEY_PREFIX, strlen(KVG_KEY_PREFIX));
    kvg_base64url(raw, sizeof(raw), key + strlen(KVG_KEY_PREFIX));
    OPENSSL_cleanse(raw, sizeof(raw));
    return 0;
}

static const char id_alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";

/* "k" + 15 characters of [a-z0-9], uniform by rejection sampling (252 = 7 x 36). Not secret:
 * 77 bits only make collisions within a tenant unlikely. */
static int make_key_id(char id[KVG_KEY_ID_LEN + 1])
{
    uint8_t raw[32];
    size_t o = 0;
    id[o++] = 'k';
    while (o < KVG_KEY_ID_LEN) {
        int rc = kvg_random_bytes(raw, sizeof(raw));
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < sizeof(raw) && o < KVG_KEY_ID_LEN; i++)
            if (raw[i] < 252)
                id[o++] = id_alphabet[raw[i] % 36];
    }
    id[o] = '\0';
    return 0;
}

bool kvg_tenancy_key_id_valid(const char *id)
{
    if (!id || strnlen(id, KVG_KEY_ID_LEN + 1) != KVG_KEY_ID_LEN || id[0] != 'k')
        return false;
    for (size_t i = 1; i < KVG_KEY_ID_LEN; i++)
        if (!strchr(id_alphabet, id[i]) || id[i] == '\0')
            return false;
    return true;
}

/* ---- lookups --------------------------------------------------------------------------------- */

kvg_tenant *kvg_tenant_set_authenticate(const kvg_tenant_set *set, const char *key, size_t len)
{
    uint8_t digest[KVG_KEY_DIGEST_LEN];
    /* Length and prefix are public (every key has them): checking them first leaks nothing. */
    if (!set || !key || len != KVG_KEY_LEN ||
        memcmp(key, KVG_KEY_PREFIX, strlen(KVG_KEY_PREFIX)) != 0)
        return NULL;
    if (kvg_tenancy_sha256(key, len, digest) < 0)
        return NULL;
    kvg_tenant *t = kvg_tenancy_set_lookup(set, digest, NULL);
    OPENSSL_cleanse(digest, sizeof(digest));
    return t;
}

static ssize_t key_position(const kvg_tenant *t, const char *key_id)
{
    for (size_t i = 0; i < t->nkeys; i++)
        if (strcmp(t->keys[i].id, key_id) == 0)
            return (ssize_t)i;
    return -1;
}

/* ---- changes --------------------------------------------------------------------------------- */

/* With write_lock held: replace tenants[at] by an object with the same spec and runtime and
 * keys old->keys plus add (when not NULL) minus the key at drop (when >= 0). */
static int commit_keys(kvg_tenants *ts, size_t at, const kvg_key_info *add, ssize_t drop)
{
    const kvg_tenant *old = kvg_tenancy_current(ts)->tenants[at];
    kvg_key_info keys[KVG_TENANT_KEYS_MAX];
    size_t n = 0;
    for (size_t i = 0; i < old->nkeys; i++)
        if ((ssize_t)i != drop)
            keys[n++] = old->keys[i];
    if (add)
        keys[n++] = *add;
    kvg_tenant *t;
    int rc = kvg_tenancy_tenant_new(kvg_tenancy_spec_ref(old->spec),
                                    kvg_tenancy_runtime_ref(old->rt), keys, n, &t);
    if (rc == 0) {
        rc = kvg_tenancy_commit(ts, COMMIT_REPLACE, at, t);
        if (rc < 0)
            kvg_tenant_unref(t);
    }
    return rc;
}

int kvg_tenants_key_create(kvg_tenants *ts, const char *tenant_id, char *key, char *key_id)
{
    char k[KVG_KEY_LEN + 1];
    kvg_key_info info = {.created_wall_ns = kvg_wall_ns()};
    bool found;
    if (!tenant_id)
        return KVG_ENOTFOUND;
    int rc = make_key(k);
    if (rc < 0)
        return rc;
    rc = kvg_tenancy_sha256(k, KVG_KEY_LEN, info.digest);
    if (rc < 0)
        goto out;

    pthread_mutex_lock(&ts->write_lock);
    const kvg_tenant_set *cur = kvg_tenancy_current(ts);
    size_t at = kvg_tenancy_set_search(cur, tenant_id, &found);
    if (!found) {
        rc = KVG_ENOTFOUND;
        goto unlock;
    }
    if (cur->tenants[at]->nkeys >= KVG_TENANT_KEYS_MAX) {
        rc = KVG_ELIMIT;
        goto unlock;
    }
    /* Key ids only need to be unique within their tenant. */
    for (int attempt = 0;; attempt++) {
        rc = make_key_id(info.id);
        if (rc < 0)
            goto unlock;
        if (key_position(cur->tenants[at], info.id) < 0)
            break;
        if (attempt == KEY_ID_ATTEMPTS) {
            rc = -EEXIST;
            goto unlock;
        }
    }
    /* 256 random bits do not collide; -EEXIST from the index would mean a broken generator. */
    rc = commit_keys(ts, at, &info, -1);
unlock:
    pthread_mutex_unlock(&ts->write_lock);
    if (rc == 0) {
        memcpy(key, k, sizeof(k));
        memcpy(key_id, info.id, sizeof(info.id));
    }
out:
    OPENSSL_cleanse(k, sizeof(k));
    return rc;
}

int kvg_tenants_key_restore(kvg_tenants *ts, const char *tenant_id, const kvg_key_info *key)
{
    bool found;
    int rc;
    if (!tenant_id)
        return KVG_ENOTFOUND;
    if (!key || !kvg_tenancy_key_id_valid(key->id))
        return KVG_EPARSE;
    pthread_mutex_lock(&ts->write_lock);
    const kvg_tenant_set *cur = kvg_tenancy_current(ts);
    size_t at = kvg_tenancy_set_search(cur, tenant_id, &found);
    if (!found)
        rc = KVG_ENOTFOUND;
    else if (key_position(cur->tenants[at], key->id) >= 0 ||
             kvg_tenancy_set_lookup(cur, key->digest, NULL))
        rc = -EEXIST;
    else if (cur->tenants[at]->nkeys >= KVG_TENANT_KEYS_MAX)
        rc = KVG_ELIMIT;
    else
        rc = commit_keys(ts, at, key, -1);
    pthread_mutex_unlock(&ts->write_lock);
    return rc;
}

int kvg_tenants_key_delete(kvg_tenants *ts, const char *tenant_id, const char *key_id)
{
    bool found;
    int rc = KVG_ENOTFOUND;
    if (!tenant_id || !key_id)
        return rc;
    pthread_mutex_lock(&ts->write_lock);
    const kvg_tenant_set *cur = kvg_tenancy_current(ts);
    size_t at = kvg_tenancy_set_search(cur, tenant_id, &found);
    if (found) {
        ssize_t k = key_position(cur->tenants[at], key_id);
        if (k >= 0)
            rc = commit_keys(ts, at, NULL, k);
    }
    pthread_mutex_unlock(&ts->write_lock);
    return rc;
}
