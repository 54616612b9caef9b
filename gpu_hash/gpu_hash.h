/* SPDX-License-Identifier: Apache-2.0 */
/* Block keys: the chained hashes that name a request's prefix blocks (docs/hashing.md). The
 * interface takes batches so that a GPU backend can take a whole batch in one launch; callers
 * never know which backend ran. */
#ifndef KVG_GPU_HASH_H
#define KVG_GPU_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kvg_hash_unit {
    KVG_HASH_BYTES = 0, /* data is canonical text; block_size counts bytes */
    KVG_HASH_TOKENS,    /* data is uint32_t token ids; block_size counts tokens */
    KVG_HASH_UNIT_COUNT,
} kvg_hash_unit;

const char *kvg_hash_unit_str(kvg_hash_unit u);

/* Largest block size, in bytes or tokens. */
#define KVG_HASH_BLOCK_MAX 65536u

/* One request's hashing: the inputs, and the keys out. */
typedef struct kvg_hash_job {
    const char *salt; /* scope salt; salt_len 0 = none */
    size_t salt_len;
    const char *model; /* model name as the request gives it; model_len 0 = none */
    size_t model_len;
    const char *adapter; /* LoRA adapter; adapter_len 0 = none */
    size_t adapter_len;
    kvg_hash_unit unit;
    const void *data; /* len bytes, or len tokens (uint32_t) */
    size_t len;
    uint32_t block_size; /* 1..KVG_HASH_BLOCK_MAX */
    uint32_t max_blocks; /* keys wanted at most */
    uint64_t *keys;      /* room for max_blocks keys */
    uint32_t nkeys;      /* out: min(len / block_size, max_blocks) */
} kvg_hash_job;

/** The root of a job's chain: a function of (salt, model, adapter, unit, block_size) alone. */
uint64_t kvg_hash_root(const kvg_hash_job *job);
/** Whether kvg_hash_batch accepts job (the rules below); for callers that queue a job before
 *  it is hashed and must refuse it at once. */
bool kvg_hash_job_valid(const kvg_hash_job *job);
/** Fill keys and nkeys of each job: d[i] = XXH3(block i, seed root), key[0] = link(root ^ d[0]),
 *  key[i] = link(key[i-1] ^ d[i]), full blocks only (docs/hashing.md). 0, or -EINVAL (a job
 *  with block_size 0 or above KVG_HASH_BLOCK_MAX, an unknown unit, or data/keys NULL where
 *  needed; no job is hashed). */
int kvg_hash_batch(kvg_hash_job *jobs, size_t n);
/** The backend that hashes ("cpu", or "cuda" when built with one and a device is present). */
const char *kvg_hash_backend(void);

/* ---- vLLM's prefix-cache block hash (token-exact mode) ----------------------------------------
 * The engine's own names for its blocks, exactly as vLLM v1 computes them with
 * --prefix-caching-hash-algo sha256_cbor or xxhash_cbor (docs/hashing.md, "vLLM's block hash"):
 * block i = H(canonical CBOR of [parent digest, [token ids of block i], extra keys or null]),
 * the parent of block 0 being NONE_HASH = H(CBOR text string of the engine's PYTHONHASHSEED).
 * Nothing is allocated; the functions are reentrant. */

typedef enum kvg_vllm_algo {
    KVG_VLLM_SHA256_CBOR = 0, /* SHA-256, 32-byte digests */
    KVG_VLLM_XXHASH_CBOR,     /* XXH3-128, 16-byte digests (canonical: big-endian) */
    KVG_VLLM_ALGO_COUNT,
} kvg_vllm_algo;

/** vLLM's name of algo ("sha256_cbor", "xxhash_cbor"); "?" when out of range. */
const char *kvg_vllm_algo_str(kvg_vllm_algo algo);
/** Parse vLLM's --prefix-caching-hash-algo value (name[0..len)). 0 and *out for sha256_cbor and
 *  xxhash_cbor; -ENOTSUP for vLLM's algorithms that cannot be reproduced outside the engine's
 *  Python ("sha256" and "xxhash", which hash pickle bytes; "builtin"; the old
 *  "sha256_cbor_64bit"); KVG_EPARSE for any other name. */
int kvg_vllm_algo_parse(const char *name, size_t len, kvg_vllm_algo *out);

#define KVG_VLLM_HASH_MAX 32

/** One block hash as vLLM holds it (its BlockHash bytes). */
typedef struct kvg_vllm_hash {
    uint8_t len; /* 32 (sha256_cbor) or 16 (xxhash_cbor); the bytes past len are zero */
    uint8_t bytes[KVG_VLLM_HASH_MAX];
} kvg_vllm_hash;

/** Digest length of algo: 32 or 16; 0 when out of range. */
size_t kvg_vllm_digest_len(kvg_vllm_algo algo);

/** NONE_HASH, the parent of every request's first block: H(cbor(seed)), the engine's
 *  PYTHONHASHSEED string (seed[0..seed_len), UTF-8; "" is a valid seed, distinct from none). An
 *  engine without PYTHONHASHSEED draws 32 random bytes instead, which no one else can know.
 *  0 and *out; -EINVAL (unknown algo, NULL seed or out), -EILSEQ (seed not UTF-8). */
int kvg_vllm_none_hash(kvg_vllm_algo algo, const char *seed, size_t seed_len, kvg_vllm_hash *out);

/** The inputs of one request's block hashes. Strings are UTF-8, borrowed. */
typedef struct kvg_vllm_blocks {
    kvg_vllm_algo algo;
    /* Parent of the block of tokens[0]: NONE_HASH (kvg_vllm_none_hash) at a request's start; to
     * continue a chain, the hash of the block before tokens[0] (and cache_salt NULL). */
    const kvg_vllm_hash *parent;
    const uint32_t *tokens;
    size_t ntokens;
    uint32_t block_size;   /* tokens per block, >= 1 (the engine's --block-size) */
    const char *lora_name; /* LoRA adapter's name (the request's model); NULL = no adapter */
    size_t lora_name_len;
    const char *cache_salt; /* vLLM's cache_salt, first block only; NULL or empty = none */
    size_t cache_salt_len;
} kvg_vllm_blocks;

/** Hash the full blocks of in->tokens: n = min(ntokens / block_size, max_blocks) blocks, into
 *  hashes[0..n) and/or keys[0..n) (the event form, kvg_vllm_hash_u64); either may be NULL,
 *  not both when max_blocks > 0. 0 and *nblocks = n; -EINVAL (unknown algo, block_size 0, parent
 *  NULL or of the wrong length, NULL tokens with ntokens > 0, NULL nblocks), -EILSEQ (a name or
 *  salt not UTF-8); KVG_ETLS (OpenSSL failed). Outputs are unspecified after an error. */
int kvg_vllm_block_hashes(const kvg_vllm_blocks *in, kvg_vllm_hash *hashes, uint64_t *keys,
                          size_t max_blocks, size_t *nblocks);

/** The 64-bit integer a KV event carries for h (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the
 *  default): int.from_bytes(h, "big") & (2**64 - 1), that is its last 8 bytes read big-endian. */
uint64_t kvg_vllm_hash_u64(const kvg_vllm_hash *h);

#endif
