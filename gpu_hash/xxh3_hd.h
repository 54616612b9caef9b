/* SPDX-License-Identifier: Apache-2.0 */
/* XXH3-64 with a seed (xxHash 0.8's stable format, XXH3_64bits_withSeed), the block hash and the
 * link of docs/hashing.md, written once for the host (plain C) and for CUDA device code (KVG_HD).
 * The CUDA kernel runs this code; tests/unit/gpu_hash/test_xxh3_hd.c checks it against
 * libxxhash on the CPU, so its arithmetic is proven on machines without a GPU.
 *
 * Derived from the algorithm of xxHash (BSD-2-Clause, Yann Collet): the scalar paths only, with
 * no dependency, no unaligned pointer cast and no endianness assumption on the host. */
#ifndef KVG_XXH3_HD_H
#define KVG_XXH3_HD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KVG_HD __host__ __device__
#else
#define KVG_HD
#endif

#define KVG_XXH_PRIME32_1 UINT64_C(0x9E3779B1)
#define KVG_XXH_PRIME32_2 UINT64_C(0x85EBCA77)
#define KVG_XXH_PRIME32_3 UINT64_C(0xC2B2AE3D)
#define KVG_XXH_PRIME64_1 UINT64_C(0x9E3779B185EBCA87)
#define KVG_XXH_PRIME64_2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define KVG_XXH_PRIME64_3 UINT64_C(0x165667B19E3779F9)
#define KVG_XXH_PRIME64_4 UINT64_C(0x85EBCA77C2B2AE63)
#define KVG_XXH_PRIME64_5 UINT64_C(0x27D4EB2F165667C5)
#define KVG_XXH_PRIME_MX1 UINT64_C(0x165667919E3779F9)
#define KVG_XXH_PRIME_MX2 UINT64_C(0x9FB21C651E98DF25)

#define KVG_XXH3_SECRET_SIZE 192
#define KVG_XXH3_STRIPE_LEN 64
/* (secret size - stripe) / 8 stripes per block of the long path: 16 stripes, 1024 bytes. */
#define KVG_XXH3_STRIPES_PER_BLOCK 16

/* XXH3's default secret (XXH3_kSecret). */
#define KVG_XXH3_SECRET_BYTES                                                                      \
    {                                                                                              \
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,  \
            0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7,    \
            0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0,    \
            0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0,    \
            0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00,    \
            0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2,    \
            0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76,    \
            0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a,    \
            0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73,    \
            0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa,    \
            0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55,    \
            0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f,    \
            0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04,    \
            0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,                                  \
    }

/* Device code cannot read a host array: the kernel reads its own copy in constant memory, where
 * a warp's threads all read the same offsets (a broadcast). */
#ifdef __CUDACC__
static __constant__ uint8_t kvg_xxh3_secret_dev[KVG_XXH3_SECRET_SIZE] = KVG_XXH3_SECRET_BYTES;
#endif
static const uint8_t kvg_xxh3_secret_host[KVG_XXH3_SECRET_SIZE] = KVG_XXH3_SECRET_BYTES;
#ifdef __CUDA_ARCH__
#define KVG_XXH3_SECRET kvg_xxh3_secret_dev
#else
#define KVG_XXH3_SECRET kvg_xxh3_secret_host
#endif

KVG_HD static inline uint64_t kvg_xxh_read64(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    /* One 8-byte load where the address allows it (the kernel keeps blocks 8-aligned when their
     * width is a multiple of 8); byte loads otherwise. The device is little-endian. */
    if (((uintptr_t)p & 7) == 0)
        return *(const uint64_t *)p;
#endif
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

KVG_HD static inline uint32_t kvg_xxh_read32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

KVG_HD static inline void kvg_xxh_write64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

KVG_HD static inline uint64_t kvg_xxh_rotl64(uint64_t x, unsigned r)
{
    return (x << r) | (x >> (64 - r));
}

KVG_HD static inline uint64_t kvg_xxh_swap64(uint64_t x)
{
    return ((x << 56) & UINT64_C(0xff00000000000000)) | ((x << 40) & UINT64_C(0x00ff000000000000)) |
           ((x << 24) & UINT64_C(0x0000ff0000000000)) | ((x << 8) & UINT64_C(0x000000ff00000000)) |
           ((x >> 8) & UINT64_C(0x00000000ff000000)) | ((x >> 24) & UINT64_C(0x0000000000ff0000)) |
           ((x >> 40) & UINT64_C(0x000000000000ff00)) | ((x >> 56) & UINT64_C(0x00000000000000ff));
}

KVG_HD static inline uint32_t kvg_xxh_swap32(uint32_t x)
{
    return ((x << 24) & 0xff000000u) | ((x << 8) & 0x00ff0000u) | ((x >> 8) & 0x0000ff00u) |
           ((x >> 24) & 0x000000ffu);
}

/* lo64(a * b) ^ hi64(a * b), the full 128-bit product. */
KVG_HD static inline uint64_t kvg_xxh_mul128_fold64(uint64_t a, uint64_t b)
{
#if defined(__CUDA_ARCH__)
    return (a * b) ^ __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#else
    uint64_t alo = (uint32_t)a, ahi = a >> 32, blo = (uint32_t)b, bhi = b >> 32;
    uint64_t lolo = alo * blo, hilo = ahi * blo, lohi = alo * bhi, hihi = ahi * bhi;
    uint64_t cross = (lolo >> 32) + (uint32_t)hilo + lohi;
    uint64_t hi = (hilo >> 32) + (cross >> 32) + hihi;
    uint64_t lo = (cross << 32) | (uint32_t)lolo;
    return lo ^ hi;
#endif
}

KVG_HD static inline uint64_t kvg_xxh64_avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= KVG_XXH_PRIME64_2;
    h ^= h >> 29;
    h *= KVG_XXH_PRIME64_3;
    h ^= h >> 32;
    return h;
}

KVG_HD static inline uint64_t kvg_xxh3_avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= KVG_XXH_PRIME_MX1;
    h ^= h >> 32;
    return h;
}

KVG_HD static inline uint64_t kvg_xxh3_rrmxmx(uint64_t h, uint64_t len)
{
    h ^= kvg_xxh_rotl64(h, 49) ^ kvg_xxh_rotl64(h, 24);
    h *= KVG_XXH_PRIME_MX2;
    h ^= (h >> 35) + len;
    h *= KVG_XXH_PRIME_MX2;
    h ^= h >> 28;
    return h;
}

KVG_HD static inline uint64_t kvg_xxh3_len_0to16(const uint8_t *in, size_t len, uint64_t seed)
{
    const uint8_t *s = KVG_XXH3_SECRET;
    if (len > 8) {
        uint64_t flip1 = (kvg_xxh_read64(s + 24) ^ kvg_xxh_read64(s + 32)) + seed;
        uint64_t flip2 = (kvg_xxh_read64(s + 40) ^ kvg_xxh_read64(s + 48)) - seed;
        uint64_t lo = kvg_xxh_read64(in) ^ flip1;
        uint64_t hi = kvg_xxh_read64(in + len - 8) ^ flip2;
        uint64_t acc = len + kvg_xxh_swap64(lo) + hi + kvg_xxh_mul128_fold64(lo, hi);
        return kvg_xxh3_avalanche(acc);
    }
    if (len >= 4) {
        seed ^= (uint64_t)kvg_xxh_swap32((uint32_t)seed) << 32;
        uint64_t in1 = kvg_xxh_read32(in), in2 = kvg_xxh_read32(in + len - 4);
        uint64_t flip = (kvg_xxh_read64(s + 8) ^ kvg_xxh_read64(s + 16)) - seed;
        return kvg_xxh3_rrmxmx((in2 + (in1 << 32)) ^ flip, len);
    }
    if (len > 0) {
        uint32_t combined = (uint32_t)in[0] << 16 | (uint32_t)in[len >> 1] << 24 |
                            (uint32_t)in[len - 1] | (uint32_t)len << 8;
        uint64_t flip = (uint64_t)(kvg_xxh_read32(s) ^ kvg_xxh_read32(s + 4)) + seed;
        return kvg_xxh64_avalanche((uint64_t)combined ^ flip);
    }
    return kvg_xxh64_avalanche(seed ^ (kvg_xxh_read64(s + 56) ^ kvg_xxh_read64(s + 64)));
}

KVG_HD static inline uint64_t kvg_xxh3_mix16(const uint8_t *in, const uint8_t *s, uint64_t seed)
{
    return kvg_xxh_mul128_fold64(kvg_xxh_read64(in) ^ (kvg_xxh_read64(s) + seed),
                                 kvg_xxh_read64(in + 8) ^ (kvg_xxh_read64(s + 8) - seed));
}

KVG_HD static inline uint64_t kvg_xxh3_len_17to128(const uint8_t *in, size_t len, uint64_t seed)
{
    const uint8_t *s = KVG_XXH3_SECRET;
    uint64_t acc = len * KVG_XXH_PRIME64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += kvg_xxh3_mix16(in + 48, s + 96, seed);
                acc += kvg_xxh3_mix16(in + len - 64, s + 112, seed);
            }
            acc += kvg_xxh3_mix16(in + 32, s + 64, seed);
            acc += kvg_xxh3_mix16(in + len - 48, s + 80, seed);
        }
        acc += kvg_xxh3_mix16(in + 16, s + 32, seed);
        acc += kvg_xxh3_mix16(in + len - 32, s + 48, seed);
    }
    acc += kvg_xxh3_mix16(in, s, seed);
    acc += kvg_xxh3_mix16(in + len - 16, s + 16, seed);
    return kvg_xxh3_avalanche(acc);
}

KVG_HD static inline uint64_t kvg_xxh3_len_129to240(const uint8_t *in, size_t len, uint64_t seed)
{
    const uint8_t *s = KVG_XXH3_SECRET;
    uint64_t acc = len * KVG_XXH_PRIME64_1;
    int rounds = (int)len / 16;
    for (int i = 0; i < 8; i++)
        acc += kvg_xxh3_mix16(in + 16 * i, s + 16 * i, seed);
    acc = kvg_xxh3_avalanche(acc);
    for (int i = 8; i < rounds; i++) /* MIDSIZE_STARTOFFSET 3 */
        acc += kvg_xxh3_mix16(in + 16 * i, s + 16 * (i - 8) + 3, seed);
    /* SECRET_SIZE_MIN 136 - MIDSIZE_LASTOFFSET 17 */
    acc += kvg_xxh3_mix16(in + len - 16, s + 136 - 17, seed);
    return kvg_xxh3_avalanche(acc);
}

KVG_HD static inline void kvg_xxh3_accumulate_512(uint64_t *acc, const uint8_t *in,
                                                  const uint8_t *s)
{
    for (int i = 0; i < 8; i++) {
        uint64_t v = kvg_xxh_read64(in + 8 * i);
        uint64_t k = v ^ kvg_xxh_read64(s + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += (uint64_t)(uint32_t)k * (k >> 32);
    }
}

KVG_HD static inline void kvg_xxh3_scramble(uint64_t *acc, const uint8_t *s)
{
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= kvg_xxh_read64(s + 8 * i);
        acc[i] = a * KVG_XXH_PRIME32_1;
    }
}

/* Above 240 bytes: stripes of 64 bytes into 8 accumulators, scrambled after every 1024 bytes,
 * with the secret derived from the seed (seed 0 derives the default secret itself, so one path
 * serves every seed). */
KVG_HD static inline uint64_t kvg_xxh3_long(const uint8_t *in, size_t len, uint64_t seed)
{
    uint64_t secret_words[KVG_XXH3_SECRET_SIZE / 8]; /* 8-aligned: the kernel's 8-byte loads */
    uint8_t *s = (uint8_t *)secret_words;
    for (int i = 0; i < KVG_XXH3_SECRET_SIZE / 16; i++) {
        kvg_xxh_write64(s + 16 * i, kvg_xxh_read64(KVG_XXH3_SECRET + 16 * i) + seed);
        kvg_xxh_write64(s + 16 * i + 8, kvg_xxh_read64(KVG_XXH3_SECRET + 16 * i + 8) - seed);
    }
    uint64_t acc[8] = {KVG_XXH_PRIME32_3, KVG_XXH_PRIME64_1, KVG_XXH_PRIME64_2, KVG_XXH_PRIME64_3,
                       KVG_XXH_PRIME64_4, KVG_XXH_PRIME32_2, KVG_XXH_PRIME64_5, KVG_XXH_PRIME32_1};
    const size_t block_len = KVG_XXH3_STRIPE_LEN * KVG_XXH3_STRIPES_PER_BLOCK;
    size_t nblocks = (len - 1) / block_len;
    for (size_t n = 0; n < nblocks; n++) {
        const uint8_t *b = in + n * block_len;
        for (int st = 0; st < KVG_XXH3_STRIPES_PER_BLOCK; st++)
            kvg_xxh3_accumulate_512(acc, b + st * KVG_XXH3_STRIPE_LEN, s + st * 8);
        kvg_xxh3_scramble(acc, s + KVG_XXH3_SECRET_SIZE - KVG_XXH3_STRIPE_LEN);
    }
    size_t nstripes = ((len - 1) - block_len * nblocks) / KVG_XXH3_STRIPE_LEN;
    const uint8_t *b = in + nblocks * block_len;
    for (size_t st = 0; st < nstripes; st++)
        kvg_xxh3_accumulate_512(acc, b + st * KVG_XXH3_STRIPE_LEN, s + st * 8);
    /* The last stripe, ending at the input's end; SECRET_LASTACC_START 7. */
    kvg_xxh3_accumulate_512(acc, in + len - KVG_XXH3_STRIPE_LEN,
                            s + KVG_XXH3_SECRET_SIZE - KVG_XXH3_STRIPE_LEN - 7);
    /* Merge, SECRET_MERGEACCS_START 11. */
    uint64_t r = len * KVG_XXH_PRIME64_1;
    for (int i = 0; i < 4; i++)
        r += kvg_xxh_mul128_fold64(acc[2 * i] ^ kvg_xxh_read64(s + 11 + 16 * i),
                                   acc[2 * i + 1] ^ kvg_xxh_read64(s + 11 + 16 * i + 8));
    return kvg_xxh3_avalanche(r);
}

/** XXH3_64bits_withSeed(in, len, seed) of xxHash 0.8, for any length. */
KVG_HD static inline uint64_t kvg_xxh3_64_seed(const void *data, size_t len, uint64_t seed)
{
    const uint8_t *in = (const uint8_t *)data;
    if (len <= 16)
        return kvg_xxh3_len_0to16(in, len, seed);
    if (len <= 128)
        return kvg_xxh3_len_17to128(in, len, seed);
    if (len <= 240)
        return kvg_xxh3_len_129to240(in, len, seed);
    return kvg_xxh3_long(in, len, seed);
}

/** link(a) = lo64(a * P) ^ hi64(a * P), P = XXH_PRIME64_1 (docs/hashing.md). */
KVG_HD static inline uint64_t kvg_hd_link(uint64_t a)
{
    return kvg_xxh_mul128_fold64(a, KVG_XXH_PRIME64_1);
}

/** d[i] of docs/hashing.md: the block's w bytes hashed with the chain's root as seed. */
KVG_HD static inline uint64_t kvg_hd_block_hash(const void *block, size_t w, uint64_t root)
{
    return kvg_xxh3_64_seed(block, w, root);
}

#endif
