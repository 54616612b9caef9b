/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA launch backend of the hashing batcher (hash_device.h): a batch's full blocks are
 * packed into pinned memory, copied to the device, hashed by one thread per block (d[i], the
 * XXH3 of xxh3_hd.h), chained by one thread per job (link is not associative: no scan), and the
 * keys copied back, all on the slot's stream (docs/hashing.md, "The CUDA backend"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "gpu_hash.h"
#include "hash_cuda.h"
#include "hash_device.h"
}

#include "hash_pack.h"

#define NSLOTS 2
#define DEFAULT_JOBS 4096
#define DEFAULT_BYTES ((size_t)64 << 20)
#define HASH_THREADS 256
#define CHAIN_THREADS 128

typedef kvg_hash_dev_job dev_job;

struct slot {
    cudaStream_t stream;
    cudaEvent_t ev0, ev1; /* kvg_hash_cuda_kernel_ms */
    uint8_t *h_data, *d_data;
    dev_job *h_jobs, *d_jobs;
    uint64_t *h_keys, *d_keys;
    /* The batch in flight. */
    kvg_hash_job *jobs;
    size_t n;
    uint32_t ndev;  /* jobs with keys */
    uint64_t nkeys; /* keys of the batch */
    bool busy;
};

struct cuda_dev {
    kvg_hash_device base; /* first: the ops get &base */
    int ordinal;
    size_t data_cap; /* bytes of h_data/d_data */
    slot slots[NSLOTS];
};

/* Phase 1: d[b] for every block b of the batch, one thread each (hash_pack.h). */
__global__ void block_hash_kernel(const uint8_t *data, const dev_job *jobs, uint32_t njobs,
                                  uint64_t nkeys, uint64_t *d)
{
    uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b < nkeys)
        d[b] = kvg_hash_dev_block(data, jobs, njobs, b);
}

/* Phase 2: each job's chain, in place over its d[]. */
__global__ void chain_kernel(const dev_job *jobs, uint32_t njobs, uint64_t *keys)
{
    uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < njobs)
        kvg_hash_dev_chain(&jobs[t], keys);
}

static void enqueue_kernels(slot *s)
{
    unsigned grid = (unsigned)((s->nkeys + HASH_THREADS - 1) / HASH_THREADS);
    block_hash_kernel<<<grid, HASH_THREADS, 0, s->stream>>>(s->d_data, s->d_jobs, s->ndev, s->nkeys,
                                                            s->d_keys);
    chain_kernel<<<(s->ndev + CHAIN_THREADS - 1) / CHAIN_THREADS, CHAIN_THREADS, 0, s->stream>>>(
        s->d_jobs, s->ndev, s->d_keys);
}

static int cuda_launch(kvg_hash_device *base, unsigned si, kvg_hash_job *jobs, size_t n)
{
    cuda_dev *dev = (cuda_dev *)base;
    if (si >= NSLOTS || dev->slots[si].busy || n > base->max_batch_jobs)
        return -EINVAL;
    /* The current device is per host thread: open ran on another than the batcher's. */
    if (cudaSetDevice(dev->ordinal) != cudaSuccess)
        return -EIO;
    slot *s = &dev->slots[si];
    uint64_t off = 0, keys = 0;
    uint32_t ndev = 0;
    /* The batcher keeps batches within the limits; a wrong one is refused, not overrun. */
    int rc = kvg_hash_pack(jobs, n, s->h_data, dev->data_cap, base->max_batch_keys, s->h_jobs,
                           &ndev, &off, &keys);
    if (rc)
        return rc;
    s->jobs = jobs, s->n = n, s->ndev = ndev, s->nkeys = keys;
    if (keys) {
        cudaMemcpyAsync(s->d_data, s->h_data, off, cudaMemcpyHostToDevice, s->stream);
        cudaMemcpyAsync(s->d_jobs, s->h_jobs, ndev * sizeof(dev_job), cudaMemcpyHostToDevice,
                        s->stream);
        enqueue_kernels(s);
        cudaMemcpyAsync(s->h_keys, s->d_keys, keys * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                        s->stream);
        if (cudaGetLastError() != cudaSuccess) {
            /* Nothing may stay in flight: wait for what was queued before failing. */
            cudaStreamSynchronize(s->stream);
            cudaGetLastError();
            return -EIO;
        }
    }
    s->busy = true;
    return 0;
}

static int cuda_finish(kvg_hash_device *base, unsigned si)
{
    cuda_dev *dev = (cuda_dev *)base;
    if (si >= NSLOTS || !dev->slots[si].busy)
        return -EINVAL;
    slot *s = &dev->slots[si];
    s->busy = false;
    if (s->nkeys) {
        cudaSetDevice(dev->ordinal);
        cudaError_t e = cudaStreamSynchronize(s->stream);
        if (e == cudaSuccess)
            e = cudaGetLastError();
        if (e != cudaSuccess) {
            cudaGetLastError(); /* clears a recoverable error; a sticky one fails every call */
            return -EIO;
        }
    }
    kvg_hash_unpack(s->jobs, s->n, s->h_keys);
    return 0;
}

static void slot_free(slot *s)
{
    if (s->stream)
        cudaStreamDestroy(s->stream);
    if (s->ev0)
        cudaEventDestroy(s->ev0);
    if (s->ev1)
        cudaEventDestroy(s->ev1);
    cudaFreeHost(s->h_data);
    cudaFreeHost(s->h_jobs);
    cudaFreeHost(s->h_keys);
    cudaFree(s->d_data);
    cudaFree(s->d_jobs);
    cudaFree(s->d_keys);
}

static void cuda_close(kvg_hash_device *base)
{
    cuda_dev *dev = (cuda_dev *)base;
    if (!dev)
        return;
    for (int i = 0; i < NSLOTS; i++)
        slot_free(&dev->slots[i]);
    free(dev);
}

static const kvg_hash_device_ops cuda_ops = {cuda_launch, cuda_finish, cuda_close};

static int slot_init(slot *s, size_t data, size_t jobs, size_t keys)
{
    if (cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&s->ev0) != cudaSuccess || cudaEventCreate(&s->ev1) != cudaSuccess)
        return -EIO;
    if (cudaHostAlloc((void **)&s->h_data, data, cudaHostAllocDefault) != cudaSuccess ||
        cudaHostAlloc((void **)&s->h_jobs, jobs * sizeof(dev_job), cudaHostAllocDefault) !=
            cudaSuccess ||
        cudaHostAlloc((void **)&s->h_keys, keys * sizeof(uint64_t), cudaHostAllocDefault) !=
            cudaSuccess ||
        cudaMalloc((void **)&s->d_data, data) != cudaSuccess ||
        cudaMalloc((void **)&s->d_jobs, jobs * sizeof(dev_job)) != cudaSuccess ||
        cudaMalloc((void **)&s->d_keys, keys * sizeof(uint64_t)) != cudaSuccess)
        return -ENOMEM;
    return 0;
}

extern "C" int kvg_hash_device_open_cuda(const kvg_hash_device_config *cfg, kvg_hash_device **out,
                                         char *why, size_t why_len)
{
    char dummy[1];
    if (!why || !why_len)
        why = dummy, why_len = sizeof(dummy);
    int ordinal = cfg ? cfg->device : 0, count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        cudaGetLastError();
        snprintf(why, why_len, "no CUDA device");
        return -ENODEV;
    }
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no CUDA driver: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return -ENODEV;
    }
    if (ordinal < 0 || ordinal >= count) {
        snprintf(why, why_len, "no CUDA device %d (%d present)", ordinal, count);
        return -ENODEV;
    }
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, ordinal)) != cudaSuccess) {
        snprintf(why, why_len, "CUDA device %d: %s", ordinal, cudaGetErrorString(e));
        cudaGetLastError();
        return -ENODEV;
    }
    cuda_dev *dev = (cuda_dev *)calloc(1, sizeof(*dev));
    if (!dev) {
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    size_t jobs = cfg && cfg->max_batch_jobs ? cfg->max_batch_jobs : DEFAULT_JOBS;
    size_t bytes = cfg && cfg->max_batch_bytes ? cfg->max_batch_bytes : DEFAULT_BYTES;
    /* Keys: one per 16 input bytes (64 MiB: 4 Mi keys, 32 MiB per slot); the default block is
     * 64 bytes, and the batcher sends jobs with more keys than this to the CPU. */
    size_t keys = bytes / 16 > ((size_t)1 << 16) ? bytes / 16 : ((size_t)1 << 16);
    dev->ordinal = ordinal;
    dev->data_cap = bytes + jobs * KVG_HASH_PACK_ALIGN;
    dev->base.ops = &cuda_ops;
    dev->base.name = "cuda";
    dev->base.nslots = NSLOTS;
    dev->base.max_batch_jobs = jobs;
    dev->base.max_batch_bytes = bytes;
    dev->base.max_batch_keys = keys;
    for (int i = 0; i < NSLOTS; i++) {
        int rc = slot_init(&dev->slots[i], dev->data_cap, jobs, keys);
        if (rc) {
            snprintf(why, why_len, "CUDA buffers (%zu MiB per slot): %s", dev->data_cap >> 20,
                     cudaGetErrorString(cudaGetLastError()));
            cuda_close(&dev->base);
            return rc;
        }
    }
    snprintf(dev->base.description, sizeof(dev->base.description),
             "%.96s, sm_%d%d, %zu GiB, %d streams", prop.name, prop.major, prop.minor,
             (size_t)(prop.totalGlobalMem >> 30), NSLOTS);
    *out = &dev->base;
    return 0;
}

extern "C" int kvg_hash_cuda_h2d_gbps(kvg_hash_device *base, size_t bytes, int reps, double *gbps)
{
    (void)base;
    uint8_t *h = NULL, *d = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaStream_t st = NULL;
    int rc = -ENOMEM;
    float ms = 0;
    if (cudaHostAlloc((void **)&h, bytes, cudaHostAllocDefault) != cudaSuccess ||
        cudaMalloc((void **)&d, bytes) != cudaSuccess)
        goto out;
    rc = -EIO;
    memset(h, 0x5a, bytes); /* touched: no first-use page faults in the timing */
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st); /* warm-up */
    cudaEventRecord(e0, st);
    for (int i = 0; i < reps; i++)
        cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st);
    cudaEventRecord(e1, st);
    if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
        goto out;
    *gbps = (double)bytes * reps / (ms * 1e-3) / 1e9;
    rc = 0;
out:
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (st)
        cudaStreamDestroy(st);
    cudaFree(d);
    cudaFreeHost(h);
    cudaGetLastError();
    return rc;
}

extern "C" int kvg_hash_cuda_kernel_ms(kvg_hash_device *base, unsigned si, int reps, double *ms)
{
    cuda_dev *dev = (cuda_dev *)base;
    if (si >= NSLOTS || !dev->slots[si].busy || reps < 1)
        return -EINVAL;
    slot *s = &dev->slots[si];
    if (!s->nkeys) {
        *ms = 0;
        return 0;
    }
    float t = 0;
    cudaEventRecord(s->ev0, s->stream);
    for (int i = 0; i < reps; i++)
        enqueue_kernels(s); /* phase 1 rewrites d[] from the data: the same keys each time */
    cudaEventRecord(s->ev1, s->stream);
    if (cudaEventSynchronize(s->ev1) != cudaSuccess ||
        cudaEventElapsedTime(&t, s->ev0, s->ev1) != cudaSuccess) {
        cudaGetLastError();
        return -EIO;
    }
    *ms = t / reps;
    return 0;
}
