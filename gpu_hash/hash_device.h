/* SPDX-License-Identifier: Apache-2.0 */
/* A launch backend of the hashing batcher (hash_batcher.h): where a batch of jobs is hashed off
 * the event loops. The CUDA backend (hash_cuda.cu) and the CPU stand-in (hash_standin.c: the
 * batching logic's tests on every machine, and fault injection) implement it. Every call comes
 * from the batcher's one thread; the keys it gives are bit-identical to kvg_hash_batch's. */
#ifndef KVG_HASH_DEVICE_H
#define KVG_HASH_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_hash.h"

typedef struct kvg_hash_device kvg_hash_device;

typedef struct kvg_hash_device_ops {
    /** Start hashing jobs[0..n) in slot (0 .. nslots - 1, which holds no batch), without
     *  waiting for the result. Every job is valid (kvg_hash_batch's rules) and within the
     *  device's limits below; its inputs and its keys array stay valid and unchanged until
     *  finish(slot) returns. 0, or a negative errno: nothing is in flight in slot then. */
    int (*launch)(kvg_hash_device *dev, unsigned slot, kvg_hash_job *jobs, size_t n);
    /** Wait for slot's batch and fill each of its jobs' keys and nkeys. 0, or a negative errno
     *  (a device error): then no job's keys may be trusted, and the caller hashes them all on
     *  the CPU. Either way the slot is free again. */
    int (*finish)(kvg_hash_device *dev, unsigned slot);
    /** Release everything; no batch is in flight. */
    void (*close)(kvg_hash_device *dev);
} kvg_hash_device_ops;

struct kvg_hash_device {
    const kvg_hash_device_ops *ops;
    const char *name;       /* "cuda", "standin": the backend label of metrics and explain */
    unsigned nslots;        /* batches in flight at once (2: one packs while one runs) */
    size_t max_batch_jobs;  /* jobs in one batch at most */
    size_t max_batch_bytes; /* input bytes (data, plus salt, model, adapter) of one batch */
    size_t max_batch_keys;  /* keys of one batch at most */
    char description[160];  /* for the start-up log: "NVIDIA H200, sm_90, 139 GiB, 2 streams" */
};

/* Sizes of the CUDA backend's buffers; 0 = its default. */
typedef struct kvg_hash_device_config {
    size_t max_batch_jobs;  /* 4096 */
    size_t max_batch_bytes; /* 64 MiB of pinned host memory per slot */
    int device;             /* CUDA device ordinal (0) */
} kvg_hash_device_config;

/** Open the CUDA backend. 0 and *out, or -ENODEV with why ("built without CUDA", "no CUDA
 *  driver: ...", "no CUDA device") or another negative errno with why. Never aborts: a machine
 *  without a GPU or driver gets an answer, not a crash. */
int kvg_hash_device_open_cuda(const kvg_hash_device_config *cfg, kvg_hash_device **out, char *why,
                              size_t why_len);

/* The CPU stand-in: hashes on the batcher's thread with kvg_hash_batch, with faults on request. */
typedef struct kvg_hash_standin_config {
    unsigned nslots;          /* 2 when 0 */
    size_t max_batch_jobs;    /* 4096 when 0 */
    size_t max_batch_bytes;   /* 64 MiB when 0 */
    size_t max_batch_keys;    /* 1 << 22 when 0 */
    uint32_t finish_delay_us; /* added to every finish: a slow device */
    /* Fault injection, counted over calls since open (1-based; 0 = never): the Nth launch
     * fails with -EIO; the Nth finish fails with -EIO after writing wrong keys into the
     * batch (a device error mid-batch must not leak them). */
    uint64_t fail_launch_at;
    uint64_t fail_finish_at;
    /* The Nth finish writes one wrong key into the batch and returns 0: a device that is
     * silently wrong, which only an equivalence check can catch (test_cuda_equiv's own test). */
    uint64_t corrupt_finish_at;
} kvg_hash_standin_config;

int kvg_hash_device_open_standin(const kvg_hash_standin_config *cfg, kvg_hash_device **out);

#endif
