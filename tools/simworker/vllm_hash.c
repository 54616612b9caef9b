/* SPDX-License-Identifier: Apache-2.0 */
/* vLLM v1's block hash (sha256_cbor, xxhash_cbor), the simulated engine's own: each block's
 * canonical CBOR is built whole in a buffer, then hashed. Written apart from gpu_hash/vllm_hash.c
 * on purpose, plain rather than fast: the simulated worker is the ground truth the gateway's
 * hashes are checked against. */
#include "simworker.h"

#include <errno.h>
#include <string.h>

#include <openssl/evp.h>
#include <xxhash.h>

/* CBOR's initial byte: major type in the top 3 bits, then the argument, inline below 24, else
 * in the next 1, 2, 4 or 8 bytes big-endian; canonical CBOR takes the shortest that fits. */
static void cbor_head(kvg_buf *b, unsigned major, uint64_t arg)
{
    unsigned char out[9];
    size_t width = 0;
    unsigned info;
    if (arg < 24) {
        info = (unsigned)arg;
    } else {
        width = 1;
        while (width < 8 && (arg >> (8 * width)) != 0)
            width *= 2;
        info = width == 1 ? 24 : width == 2 ? 25 : width == 4 ? 26 : 27;
    }
    out[0] = (unsigned char)(major << 5 | info);
    for (size_t i = 0; i < width; i++)
        out[1 + i] = (unsigned char)(arg >> (8 * (width - 1 - i)));
    kvg_buf_append(b, out, 1 + width);
}

static void cbor_text(kvg_buf *b, const char *s, size_t n)
{
    cbor_head(b, 3, n);
    kvg_buf_append(b, s, n);
}

static bool is_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = kvg_utf8_seq_len((const unsigned char *)s + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

static int digest(sim_vllm_algo algo, const kvg_buf *b, uint8_t *out, size_t *out_len)
{
    if (b->failed)
        return -ENOMEM;
    if (algo == SIM_VLLM_XXHASH_CBOR) {
        XXH128_hash_t h = XXH3_128bits(b->data, b->len);
        /* xxhash.xxh3_128_digest: the 128-bit value, most significant byte first. */
        for (int i = 0; i < 8; i++) {
            out[i] = (uint8_t)(h.high64 >> (56 - 8 * i));
            out[8 + i] = (uint8_t)(h.low64 >> (56 - 8 * i));
        }
        *out_len = 16;
        return 0;
    }
    unsigned int len = 0;
    if (EVP_Digest(b->data, b->len, out, &len, EVP_sha256(), NULL) != 1 || len != 32)
        return KVG_ETLS;
    *out_len = 32;
    return 0;
}

const char *sim_vllm_algo_str(sim_vllm_algo algo)
{
    return algo == SIM_VLLM_SHA256_CBOR   ? "sha256_cbor"
           : algo == SIM_VLLM_XXHASH_CBOR ? "xxhash_cbor"
                                          : "?";
}

int sim_vllm_algo_parse(const char *name, sim_vllm_algo *out)
{
    if (strcmp(name, "sha256_cbor") == 0)
        *out = SIM_VLLM_SHA256_CBOR;
    else if (strcmp(name, "xxhash_cbor") == 0)
        *out = SIM_VLLM_XXHASH_CBOR;
    else
        return -EINVAL;
    return 0;
}

int sim_vllm_none_hash(sim_vllm_algo algo, const char *seed, size_t seed_len,
                       uint8_t out[SIM_VLLM_DIGEST_MAX], size_t *out_len)
{
    if (algo >= SIM_VLLM_ALGO_COUNT || !seed)
        return -EINVAL;
    if (!is_utf8(seed, seed_len))
        return -EILSEQ;
    kvg_buf b;
    kvg_buf_init(&b);
    cbor_text(&b, seed, seed_len);
    int rc = digest(algo, &b, out, out_len);
    kvg_buf_done(&b);
    return rc;
}

int sim_vllm_block_hashes(sim_vllm_algo algo, const uint8_t *none_hash, size_t none_len,
                          const uint32_t *tokens, size_t ntokens, uint32_t block_size,
                          const char *lora, size_t lora_len, const char *salt, size_t salt_len,
                          uint8_t *out, size_t max_blocks, size_t *nblocks)
{
    if (algo >= SIM_VLLM_ALGO_COUNT || block_size == 0 || !none_hash || !nblocks ||
        none_len != (algo == SIM_VLLM_SHA256_CBOR ? 32u : 16u) || (!tokens && ntokens > 0) ||
        (!out && max_blocks > 0))
        return -EINVAL;
    if ((lora && !is_utf8(lora, lora_len)) || (salt && !is_utf8(salt, salt_len)))
        return -EILSEQ;
    size_t nb = ntokens / block_size;
    if (nb > max_blocks)
        nb = max_blocks;
    kvg_buf b;
    kvg_buf_init(&b);
    int rc = 0;
    const uint8_t *parent = none_hash;
    for (size_t i = 0; i < nb && rc == 0; i++) {
        kvg_buf_reset(&b);
        /* hash_block_tokens: hash((parent, tuple(tokens), extra_keys)). */
        cbor_head(&b, 4, 3);
        cbor_head(&b, 2, none_len);
        kvg_buf_append(&b, parent, none_len);
        cbor_head(&b, 4, block_size);
        for (size_t t = 0; t < block_size; t++)
            cbor_head(&b, 0, tokens[i * block_size + t]);
        /* generate_block_hash_extra_keys: [lora_name] + [cache_salt if first block and the salt
         * is truthy], a tuple, or None when there is neither. */
        size_t n_extra = 0;
        if (lora)
            n_extra++;
        if (i == 0 && salt && salt_len > 0)
            n_extra++;
        if (n_extra == 0) {
            kvg_buf_putc(&b, (char)0xF6);
        } else {
            cbor_head(&b, 4, n_extra);
            if (lora)
                cbor_text(&b, lora, lora_len);
            if (i == 0 && salt && salt_len > 0)
                cbor_text(&b, salt, salt_len);
        }
        size_t len = 0;
        rc = digest(algo, &b, out + i * none_len, &len);
        parent = out + i * none_len;
    }
    kvg_buf_done(&b);
    if (rc == 0)
        *nblocks = nb;
    return rc;
}

uint64_t sim_vllm_hash_u64(const uint8_t *h, size_t len)
{
    /* int.from_bytes(h, "big") & (2**64 - 1): the low 64 bits of the integer. */
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++)
        v = (v << 8) | h[i];
    return v;
}
