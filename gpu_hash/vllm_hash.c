/* SPDX-License-Identifier: Apache-2.0 */
/* vLLM v1's prefix-cache block hash (sha256_cbor, xxhash_cbor): canonical CBOR streamed into the
 * digest, one stack buffer per block, for token-exact routing (docs/hashing.md). */
/* SHA256_Init/_Update/_Final, deprecated by OpenSSL 3: EVP allocates a context per digest, and
 * this hashes one digest per 16 tokens (tenancy/keys.c measured the difference). */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <openssl/sha.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common.h"
#include "gpu_hash.h"

/* CBOR major types (RFC 8949 section 3.1), pre-shifted into the initial byte. */
#define MT_UINT 0x00u
#define MT_BYTES 0x40u
#define MT_TEXT 0x60u
#define MT_ARRAY 0x80u
#define CBOR_NULL 0xF6u

/* One block's encoding is gathered here and hashed in one call when it fits (a 16-token block
 * takes at most 35 + 1 + 80 bytes besides its extra keys): XXH3's one-shot function costs ~99
 * instructions on 85 bytes where its streaming state costs ~121 (callgrind, 2026-12-02), and
 * SHA-256 pays one call instead of one per field. Longer encodings (large blocks, long names)
 * stream through in SINK_CAP slices. */
#define SINK_CAP 2048
/* The most bytes one encoded token takes (0x1A and four bytes), and the room put_token needs:
 * it stores eight bytes at once and advances by the token's length. */
#define TOKEN_MAX 5
#define TOKEN_STORE 8

typedef struct sink {
    kvg_vllm_algo algo;
    bool streaming; /* xxhash: the state below holds the slices flushed so far */
    bool failed;    /* sha256: OpenSSL said no */
    size_t len;
    union {
        SHA256_CTX sha;
        XXH3_state_t xxh;
    } u;
    uint8_t buf[SINK_CAP];
} sink;

static void sink_init(sink *s, kvg_vllm_algo algo)
{
    s->algo = algo;
    s->streaming = false;
    s->failed = false;
    s->len = 0;
    if (algo == KVG_VLLM_SHA256_CBOR && !SHA256_Init(&s->u.sha))
        s->failed = true;
}

/* Hand p[0..n) to the digest itself, past the buffer. */
static void sink_absorb(sink *s, const void *p, size_t n)
{
    if (n == 0)
        return;
    if (s->algo == KVG_VLLM_SHA256_CBOR) {
        if (!SHA256_Update(&s->u.sha, p, n))
            s->failed = true;
        return;
    }
    if (!s->streaming) {
        (void)XXH3_128bits_reset(&s->u.xxh);
        s->streaming = true;
    }
    (void)XXH3_128bits_update(&s->u.xxh, p, n);
}

static void sink_flush(sink *s)
{
    sink_absorb(s, s->buf, s->len);
    s->len = 0;
}

static void sink_write(sink *s, const void *p, size_t n)
{
    if (n > SINK_CAP - s->len) {
        sink_flush(s);
        if (n > SINK_CAP) {
            sink_absorb(s, p, n);
            return;
        }
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

/* Canonical CBOR's one rule for these types: the argument in the shortest form that holds it
 * (RFC 8949 section 4.2.1, what cbor2.dumps(canonical=True) writes; cbor2 writes integers
 * shortest in any mode). Room for 9 bytes at p. */
static inline uint8_t *put_head(uint8_t *p, unsigned major, uint64_t v)
{
    if (v < 24) {
        *p++ = (uint8_t)(major | v);
    } else if (v <= 0xFF) {
        *p++ = (uint8_t)(major | 24);
        *p++ = (uint8_t)v;
    } else if (v <= 0xFFFF) {
        *p++ = (uint8_t)(major | 25);
        *p++ = (uint8_t)(v >> 8);
        *p++ = (uint8_t)v;
    } else if (v <= 0xFFFFFFFFu) {
        *p++ = (uint8_t)(major | 26);
        for (int sh = 24; sh >= 0; sh -= 8)
            *p++ = (uint8_t)(v >> sh);
    } else {
        *p++ = (uint8_t)(major | 27);
        for (int sh = 56; sh >= 0; sh -= 8)
            *p++ = (uint8_t)(v >> sh);
    }
    return p;
}

/* put_head for a token id without branches: ids of a 150 K vocabulary straddle the 65536 edge at
 * random, so the head's width is a branch the CPU cannot predict. Class k (0-3) picks the head
 * (the id itself, or 0x18/0x19/0x1A) and the payload length (0, 1, 2, 4 bytes); the payload is
 * the id's low bytes big-endian, shifted to the top of a 32-bit word and byte-swapped into
 * place behind the head, all in one 8-byte store. Room for TOKEN_STORE bytes at p. */
static inline uint8_t *put_token(uint8_t *p, uint32_t t)
{
    static const uint8_t payload[4] = {0, 1, 2, 4};
    unsigned k = (unsigned)(t >= 24) + (unsigned)(t >= 256) + (unsigned)(t >= 65536);
    unsigned n = payload[k];
    uint64_t head = k ? 0x17u + k : t;
    uint32_t top = (uint32_t)((uint64_t)t << (32 - 8 * n)); /* the payload, high bytes first */
    uint64_t word = head | (uint64_t)__builtin_bswap32(top) << 8;
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    word = __builtin_bswap64(word);
#endif
    memcpy(p, &word, sizeof(word));
    return p + 1 + n;
}

static void sink_head(sink *s, unsigned major, uint64_t v)
{
    if (SINK_CAP - s->len < 9)
        sink_flush(s);
    s->len = (size_t)(put_head(s->buf + s->len, major, v) - s->buf);
}

static void sink_text(sink *s, const char *t, size_t n)
{
    sink_head(s, MT_TEXT, n);
    sink_write(s, t, n);
}

/* The block's token ids as a CBOR array, the room checked per slice rather than per token. */
static void sink_tokens(sink *s, const uint32_t *t, size_t n)
{
    sink_head(s, MT_ARRAY, n);
    while (n) {
        size_t avail = SINK_CAP - s->len;
        size_t room = avail < TOKEN_STORE ? 0 : (avail - (TOKEN_STORE - TOKEN_MAX)) / TOKEN_MAX;
        if (room == 0) {
            sink_flush(s);
            continue;
        }
        size_t k = n < room ? n : room;
        uint8_t *p = s->buf + s->len;
        for (size_t i = 0; i < k; i++)
            p = put_token(p, t[i]);
        s->len = (size_t)(p - s->buf);
        t += k;
        n -= k;
    }
}

static int sink_final(sink *s, kvg_vllm_hash *out)
{
    if (s->algo == KVG_VLLM_SHA256_CBOR) {
        sink_flush(s);
        if (s->failed || !SHA256_Final(out->bytes, &s->u.sha))
            return KVG_ETLS;
        out->len = 32;
        return 0;
    }
    XXH128_hash_t h;
    if (s->streaming) {
        sink_flush(s);
        h = XXH3_128bits_digest(&s->u.xxh);
    } else {
        h = XXH3_128bits(s->buf, s->len);
    }
    /* Python's xxhash.xxh3_128_digest: the 128-bit value big-endian, high half first. */
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out->bytes, c.digest, 16);
    /* Zero the rest, so that whole structs compare and copy as their bytes. */
    memset(out->bytes + 16, 0, sizeof(out->bytes) - 16);
    out->len = 16;
    return 0;
}

/* A Python str holds code points, and cbor2 writes them as UTF-8: bytes that are not UTF-8 are
 * no string vLLM could have hashed. */
static bool utf8_valid(const char *t, size_t n)
{
    const unsigned char *p = (const unsigned char *)t;
    for (size_t i = 0; i < n;) {
        size_t k = kvg_utf8_seq_len(p + i, n - i);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}

const char *kvg_vllm_algo_str(kvg_vllm_algo algo)
{
    switch (algo) {
    case KVG_VLLM_SHA256_CBOR:
        return "sha256_cbor";
    case KVG_VLLM_XXHASH_CBOR:
        return "xxhash_cbor";
    case KVG_VLLM_ALGO_COUNT:
        break;
    }
    return "?";
}

int kvg_vllm_algo_parse(const char *name, size_t len, kvg_vllm_algo *out)
{
    static const char *const unreproducible[] = {"sha256", "xxhash", "builtin",
                                                 "sha256_cbor_64bit"};
    if (!name || !out)
        return -EINVAL;
    for (int a = 0; a < KVG_VLLM_ALGO_COUNT; a++) {
        const char *s = kvg_vllm_algo_str((kvg_vllm_algo)a);
        if (len == strlen(s) && memcmp(name, s, len) == 0) {
            *out = (kvg_vllm_algo)a;
            return 0;
        }
    }
    for (size_t i = 0; i < KVG_ARRAY_LEN(unreproducible); i++)
        if (len == strlen(unreproducible[i]) && memcmp(name, unreproducible[i], len) == 0)
            return -ENOTSUP;
    return KVG_EPARSE;
}

size_t kvg_vllm_digest_len(kvg_vllm_algo algo)
{
    switch (algo) {
    case KVG_VLLM_SHA256_CBOR:
        return 32;
    case KVG_VLLM_XXHASH_CBOR:
        return 16;
    case KVG_VLLM_ALGO_COUNT:
        break;
    }
    return 0;
}

int kvg_vllm_none_hash(kvg_vllm_algo algo, const char *seed, size_t seed_len, kvg_vllm_hash *out)
{
    if ((unsigned)algo >= KVG_VLLM_ALGO_COUNT || !seed || !out)
        return -EINVAL;
    if (!utf8_valid(seed, seed_len))
        return -EILSEQ;
    sink s;
    sink_init(&s, algo);
    sink_text(&s, seed, seed_len);
    return sink_final(&s, out);
}

uint64_t kvg_vllm_hash_u64(const kvg_vllm_hash *h)
{
    uint64_t v = 0;
    if (h->len >= 8) { /* always: digests are 16 or 32 bytes */
        memcpy(&v, h->bytes + h->len - 8, 8);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        v = __builtin_bswap64(v);
#endif
        return v;
    }
    for (size_t i = 0; i < h->len; i++)
        v = v << 8 | h->bytes[i];
    return v;
}

int kvg_vllm_block_hashes(const kvg_vllm_blocks *in, kvg_vllm_hash *hashes, uint64_t *keys,
                          size_t max_blocks, size_t *nblocks)
{
    if (!in || !nblocks || (unsigned)in->algo >= KVG_VLLM_ALGO_COUNT || in->block_size == 0 ||
        !in->parent || in->parent->len != kvg_vllm_digest_len(in->algo) ||
        (!in->tokens && in->ntokens > 0) || (max_blocks > 0 && !hashes && !keys))
        return -EINVAL;
    bool lora = in->lora_name != NULL;
    /* vLLM: [cache_salt] if start_token_idx == 0 and cache_salt, so "" is no salt. */
    bool salt = in->cache_salt != NULL && in->cache_salt_len > 0;
    if ((lora && !utf8_valid(in->lora_name, in->lora_name_len)) ||
        (salt && !utf8_valid(in->cache_salt, in->cache_salt_len)))
        return -EILSEQ;
    size_t n = in->ntokens / in->block_size;
    if (n > max_blocks)
        n = max_blocks;

    kvg_vllm_hash prev = *in->parent, cur;
    const uint32_t *t = in->tokens;
    for (size_t i = 0; i < n; i++, t += in->block_size) {
        sink s;
        sink_init(&s, in->algo);
        uint8_t *p = s.buf;
        /* (parent, tokens, extra): a 3-array, the parent as a byte string. */
        *p++ = MT_ARRAY | 3;
        p = put_head(p, MT_BYTES, prev.len);
        memcpy(p, prev.bytes, prev.len);
        s.len = (size_t)(p - s.buf) + prev.len;
        sink_tokens(&s, t, in->block_size);
        /* Extra keys: lora_extra_keys + mm + cache_salt_keys (block 0 only) + prompt embeds, as a
         * tuple, or None when empty. kvgate sends neither images nor prompt embeddings. */
        size_t nextra = (size_t)lora + (size_t)(salt && i == 0);
        if (nextra == 0) {
            sink_write(&s, &(uint8_t){CBOR_NULL}, 1);
        } else {
            sink_head(&s, MT_ARRAY, nextra);
            if (lora)
                sink_text(&s, in->lora_name, in->lora_name_len);
            if (salt && i == 0)
                sink_text(&s, in->cache_salt, in->cache_salt_len);
        }
        int rc = sink_final(&s, &cur);
        if (rc < 0)
            return rc;
        if (hashes)
            hashes[i] = cur;
        if (keys)
            keys[i] = kvg_vllm_hash_u64(&cur);
        prev = cur;
    }
    *nblocks = n;
    return 0;
}
