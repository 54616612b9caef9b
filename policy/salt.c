/* SPDX-License-Identifier: Apache-2.0 */
/* Cache salts of sharing scopes: HMAC-SHA256 of the scope id under the server secret. */
#include "policy.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

int kvg_policy_scope_salt(const uint8_t *secret, size_t secret_len, const char *scope, char *out)
{
    static const uint8_t empty[1];
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned mac_len = 0;
    if (!scope || secret_len > INT_MAX || (secret_len && !secret))
        return -EINVAL;
    /* HMAC() with a NULL key means "reuse the previous key" in some OpenSSL paths: always pass
     * a pointer, even for an empty secret. */
    if (!HMAC(EVP_sha256(), secret_len ? (const void *)secret : empty, (int)secret_len,
              (const unsigned char *)scope, strlen(scope), mac, &mac_len) ||
        mac_len != 32) {
        ERR_clear_error(); /* the error leaves OpenSSL here, as KVG_ETLS */
        OPENSSL_cleanse(mac, sizeof(mac));
        return KVG_ETLS;
    }
    kvg_base64url(mac, 32, out);
    OPENSSL_cleanse(mac, sizeof(mac));
    return 0;
}

void kvg_salt_cache_init(kvg_salt_cache *c, const uint8_t *secret, size_t secret_len)
{
    memset(c, 0, sizeof(*c));
    c->secret = secret;
    c->secret_len = secret_len;
}

void kvg_salt_cache_done(kvg_salt_cache *c)
{
    for (size_t i = 0; i < KVG_SALT_CACHE_SLOTS; i++)
        free(c->e[i].scope);
    OPENSSL_cleanse(c->e, sizeof(c->e));
}

/* FNV-1a: the slot of a scope id. */
static size_t slot_of(const char *scope)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)scope; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return (size_t)(h ^ h >> 32) % KVG_SALT_CACHE_SLOTS;
}

int kvg_salt_cache_get(kvg_salt_cache *c, const char *scope, char *out)
{
    if (!scope)
        return -EINVAL;
    kvg_salt_cache_entry *e = &c->e[slot_of(scope)];
    if (e->scope && strcmp(e->scope, scope) == 0) {
        memcpy(out, e->salt, sizeof(e->salt));
        return 0;
    }
    int rc = kvg_policy_scope_salt(c->secret, c->secret_len, scope, out);
    if (rc < 0)
        return rc;
    char *copy = strdup(scope);
    if (copy) { /* without the memory, the next request computes it again */
        free(e->scope);
        e->scope = copy;
        memcpy(e->salt, out, sizeof(e->salt));
    }
    return 0;
}
