/* SPDX-License-Identifier: Apache-2.0 */
/* Chained SHA-256 block hashes, the simulated engine's own (vLLM v1's scheme, not the
 * gateway's code): the salt enters the first block only, every later block its parent. */
#include "simworker.h"

#include <errno.h>
#include <string.h>

#include <openssl/evp.h>

static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Feed the tokens of one block as little-endian 32-bit words, in bounded stack slices. */
static int update_tokens(EVP_MD_CTX *ctx, const uint32_t *tokens, size_t n)
{
    unsigned char buf[4 * 64];
    while (n) {
        size_t k = KVG_MIN(n, sizeof(buf) / 4);
        for (size_t i = 0; i < k; i++)
            put_le32(buf + 4 * i, tokens[i]);
        if (EVP_DigestUpdate(ctx, buf, 4 * k) != 1)
            return KVG_ETLS;
        tokens += k;
        n -= k;
    }
    return 0;
}

int sim_block_hashes(const uint32_t *tokens, size_t n, uint32_t block_tokens, const void *salt,
                     size_t salt_len, sim_hash *out)
{
    if (block_tokens == 0 || salt_len > UINT32_MAX || (salt_len && !salt))
        return -EINVAL;
    size_t nb = n / block_tokens;
    if (nb == 0)
        return 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return -ENOMEM;
    int rc = 0;
    for (size_t b = 0; b < nb; b++) {
        if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
            rc = KVG_ETLS;
            goto done;
        }
        if (b == 0) {
            /* The length prefix keeps (salt, tokens) unambiguous: salt bytes can never be
             * mistaken for token bytes. No salt hashes like an empty one. */
            unsigned char len_le[4];
            put_le32(len_le, (uint32_t)salt_len);
            if (EVP_DigestUpdate(ctx, len_le, 4) != 1 ||
                (salt_len && EVP_DigestUpdate(ctx, salt, salt_len) != 1)) {
                rc = KVG_ETLS;
                goto done;
            }
        } else if (EVP_DigestUpdate(ctx, out[b - 1].b, sizeof(out[b - 1].b)) != 1) {
            rc = KVG_ETLS;
            goto done;
        }
        rc = update_tokens(ctx, tokens + b * block_tokens, block_tokens);
        unsigned int mdlen = 0;
        if (rc == 0 && (EVP_DigestFinal_ex(ctx, out[b].b, &mdlen) != 1 || mdlen != 32))
            rc = KVG_ETLS;
        if (rc < 0)
            goto done;
    }
done:
    EVP_MD_CTX_free(ctx);
    return rc;
}
