/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend's batch layout and per-thread work, shared by hash_cuda.cu and the tests:
 * packing a batch (host), one block's d[i] and one job's chain (KVG_HD: a kernel thread's body),
 * unpacking the keys (host). tests/unit/gpu_hash/test_xxh3_hd.c runs them all on the CPU, so
 * everything but the CUDA calls is checked on machines without a GPU. */
#ifndef KVG_HASH_PACK_H
#define KVG_HASH_PACK_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpu_hash.h"
#include "xxh3_hd.h"

/* Blocks start 16-aligned in the packed data, so a block whose width is a multiple of 8 is read
 * with 8-byte loads on the device (xxh3_hd.h) instead of byte loads. */
#define KVG_HASH_PACK_ALIGN 16

/* A job with keys, as the kernels see it; jobs without a full block are not sent. */
typedef struct kvg_hash_dev_job {
    uint64_t data_off; /* into the packed data */
    uint64_t key_off;  /* its first key's index in the batch's keys */
    uint64_t root;
    uint32_t width; /* bytes per block */
    uint32_t nblocks;
} kvg_hash_dev_job;

static inline size_t kvg_hash_pack_keys(const kvg_hash_job *j)
{
    size_t blocks = j->len / j->block_size;
    return blocks < j->max_blocks ? blocks : j->max_blocks;
}

static inline size_t kvg_hash_pack_width(const kvg_hash_job *j)
{
    return j->unit == KVG_HASH_TOKENS ? (size_t)j->block_size * 4 : j->block_size;
}

/* Pack jobs[0..n): their full blocks into data (data_cap bytes), a descriptor per job with
 * keys into out; *ndev descriptors, *nbytes of data, *nkeys keys (at most keys_cap). 0, or
 * -E2BIG when the batch does not fit (nothing to trust in the buffers then). Token ids are
 * copied as they are: the host is little-endian, as docs/hashing.md's ids. */
static inline int kvg_hash_pack(const kvg_hash_job *jobs, size_t n, uint8_t *data, size_t data_cap,
                                size_t keys_cap, kvg_hash_dev_job *out, uint32_t *ndev,
                                uint64_t *nbytes, uint64_t *nkeys)
{
    uint64_t off = 0, keys = 0;
    uint32_t nd = 0;
    for (size_t k = 0; k < n; k++) {
        const kvg_hash_job *j = &jobs[k];
        size_t nk = kvg_hash_pack_keys(j), w = kvg_hash_pack_width(j);
        if (!nk)
            continue;
        size_t bytes = nk * w;
        if (off + bytes > data_cap || keys + nk > keys_cap)
            return -E2BIG;
        memcpy(data + off, j->data, bytes);
        kvg_hash_dev_job d = {off, keys, kvg_hash_root(j), (uint32_t)w, (uint32_t)nk};
        out[nd++] = d;
        off = (off + bytes + KVG_HASH_PACK_ALIGN - 1) & ~(uint64_t)(KVG_HASH_PACK_ALIGN - 1);
        keys += nk;
    }
    *ndev = nd, *nbytes = off, *nkeys = keys;
    return 0;
}

/* Phase 1, block b of the batch (one thread each): its job by a binary search over the first
 * keys (12 steps for 4096 jobs; no per-block table to copy), then d = XXH3(block, root). */
KVG_HD static inline uint64_t kvg_hash_dev_block(const uint8_t *data, const kvg_hash_dev_job *jobs,
                                                 uint32_t njobs, uint64_t b)
{
    uint32_t lo = 0, hi = njobs - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (jobs[mid].key_off <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const kvg_hash_dev_job *j = &jobs[lo];
    return kvg_hd_block_hash(data + j->data_off + (b - j->key_off) * j->width, j->width, j->root);
}

/* Phase 2, one job (one thread each): its chain in place over its d[]. link is not
 * associative, so this is sequential: one multiply per block. */
KVG_HD static inline void kvg_hash_dev_chain(const kvg_hash_dev_job *j, uint64_t *keys)
{
    uint64_t *k = keys + j->key_off;
    uint64_t h = j->root;
    for (uint32_t i = 0; i < j->nblocks; i++) {
        h = kvg_hd_link(h ^ k[i]);
        k[i] = h;
    }
}

/* Each job's keys out of the batch's, and nkeys (0 for jobs without a full block). */
static inline void kvg_hash_unpack(kvg_hash_job *jobs, size_t n, const uint64_t *keys)
{
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        size_t nk = kvg_hash_pack_keys(&jobs[k]);
        if (nk)
            memcpy(jobs[k].keys, keys + off, nk * sizeof(uint64_t));
        jobs[k].nkeys = (uint32_t)nk;
        off += nk;
    }
}

#endif
