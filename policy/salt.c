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

/* RFC 4648 section 5, without padding. out has room for 4 * ceil(len / 3) + 1 bytes. */
static size_t base64url(const uint8_t *in, size_t len, char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = abc[v >> 6 & 63];
        out[o++] = abc[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = abc[v >> 6 & 63];
    }
    out[o] = '\0';
    return o;
}

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
    base64url(mac, 32, out);
    OPENSSL_cleanse(mac, sizeof(mac));
    return 0;
}
