/* SPDX-License-Identifier: Apache-2.0 */
/* Cache salts of sharing scopes: HMAC-SHA256 of the scope id under the server secret. */
#include "policy.h"

#include <errno.h>
#include <limits.h>
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
