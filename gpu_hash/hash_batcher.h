/* SPDX-License-Identifier: Apache-2.0 */
/* The hashing batcher: block-key jobs from every event loop go into one submission queue; one
 * thread closes batches (by size, or a deadline in microseconds after a batch's first job),
 * hands them to a launch backend (hash_device.h: CUDA, or the CPU stand-in) with a batch
 * packing while another runs, and completes each job back on the loop that submitted it. No
 * event loop ever waits for the device: small jobs (below the crossover) and jobs the device
 * cannot take are hashed at once on the caller's CPU, and a device error hashes its batch on
 * the CPU (the keys are the same either way: docs/hashing.md).
 *
 * Threads: kvg_hash_submit, kvg_hash_cancel, kvg_hash_sink_drain and kvg_hash_sink_free run on
 * the sink's own loop thread; the batcher's thread calls only the sink's wake function. This
 * module knows no event library: the caller's wake function makes its loop call
 * kvg_hash_sink_drain (the gateway: an eventfd watched by the loop). */
#ifndef KVG_HASH_BATCHER_H
#define KVG_HASH_BATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gpu_hash.h"
#include "hash_device.h"

typedef struct kvg_hash_batcher kvg_hash_batcher;
typedef struct kvg_hash_sink kvg_hash_sink;
typedef struct kvg_hash_ticket kvg_hash_ticket;

/* Which backend hashed a job. */
typedef enum kvg_hash_ran {
    KVG_HASH_RAN_CPU = 0,  /* on the caller's loop at submit, or queued when the batcher stopped */
    KVG_HASH_RAN_DEVICE,   /* by the device, in a batch */
    KVG_HASH_RAN_FALLBACK, /* on the batcher's thread, after the device failed the batch */
    KVG_HASH_RAN_COUNT,
} kvg_hash_ran;

/* "cpu", "device", "fallback". Metrics label the device's jobs with its name
 * (kvg_hash_batcher_device): a free function cannot know which device a batcher has. */
const char *kvg_hash_ran_str(kvg_hash_ran r);

typedef struct kvg_hash_batcher_config {
    uint32_t max_batch_jobs;  /* close a batch at this many jobs (0: the device's limit) */
    uint32_t deadline_us;     /* or this long after its first job arrived (0: 50) */
    uint64_t crossover_bytes; /* jobs with less data hash on the caller's CPU; UINT64_MAX:
                               * always the CPU; 0: measured when the batcher starts */
    uint32_t max_queued;      /* jobs waiting or in flight at most; past it, the CPU (0: 65536) */
} kvg_hash_batcher_config;

/** Start the batcher's thread on dev (owned from now on, closed by kvg_hash_batcher_free).
 *  With crossover_bytes 0 it first measures the crossover: the job size from which a batch
 *  of one on the device completes sooner than the CPU hashes it (logged at info). NULL with
 *  why on failure (dev is closed then). */
kvg_hash_batcher *kvg_hash_batcher_new(const kvg_hash_batcher_config *cfg, kvg_hash_device *dev,
                                       char *why, size_t why_len);
/** Stop the thread: batches in flight finish, jobs still queued are hashed on the CPU, every
 *  completion is delivered to sinks that still exist (their wake is called; a drain after
 *  this call still runs them). Every sink must be freed before or after, on its own thread;
 *  after this call a sink may still be drained and freed, but nothing may be submitted. */
void kvg_hash_batcher_free(kvg_hash_batcher *b);

/** The crossover in force (bytes of data), the device's name. */
uint64_t kvg_hash_batcher_crossover(const kvg_hash_batcher *b);
const char *kvg_hash_batcher_device(const kvg_hash_batcher *b);

/* Called on the batcher's thread when completions wait in the sink: make the sink's loop call
 * kvg_hash_sink_drain soon. Must not block or call into the batcher. */
typedef void kvg_hash_wake_fn(void *ud);

/** One per event loop. */
kvg_hash_sink *kvg_hash_sink_new(kvg_hash_batcher *b, kvg_hash_wake_fn *wake, void *wake_ud);
/** On the sink's thread: its tickets not yet completed are cancelled (no callback). No wake
 *  is called once this returns (the owner may free what wake_ud points to). Tickets still in
 *  the batcher keep the sink's memory until the batcher has finished them. From inside a done
 *  callback too: the drain then runs no more callbacks. */
void kvg_hash_sink_free(kvg_hash_sink *s);
/** On the sink's thread: run the callbacks of every completed job, in completion order.
 *  Ordering: the jobs of one sink that were queued (submit returned 0) complete in the order
 *  of their submission, whichever backend ran them (device, fallback, CPU at shutdown): one
 *  FIFO queue, batches finished in launch order, a failed launch delivered in its turn. Jobs
 *  hashed at once (submit returned 1) are not ordered with them. */
void kvg_hash_sink_drain(kvg_hash_sink *s);

/** A job's end: status 0 and keys[0..nkeys) (valid until the callback returns: copy them), or
 *  a negative errno (-ENOMEM); ran says which backend hashed it. Runs in kvg_hash_sink_drain. */
typedef void kvg_hash_done_fn(void *ud, int status, const uint64_t *keys, uint32_t nkeys,
                              kvg_hash_ran ran);

/** Hash job on s's loop thread. Returns 1 when it was hashed at once on the CPU (job->keys and
 *  nkeys filled, done not called: a job with no full block, below the crossover, larger than a
 *  batch, the queue full, no memory for its copy, or the batcher stopping), 0 when queued
 *  (done comes later through kvg_hash_sink_drain; *ticket names it until then; ticket may be
 *  NULL), or -EINVAL (kvg_hash_batch would refuse the job, or s or done is NULL). The job's
 *  inputs are copied (its full blocks only): the caller may change or free them once this
 *  returns; job->keys is written only in the return-1 case. The crossover compares the bytes
 *  of the full blocks hashed (min(len / block_size, max_blocks) blocks, x4 for tokens). */
int kvg_hash_submit(kvg_hash_sink *s, kvg_hash_job *job, kvg_hash_done_fn *done, void *ud,
                    kvg_hash_ticket **ticket);
/** On s's loop thread, before done was called: done will not be called; the ticket is gone. */
void kvg_hash_cancel(kvg_hash_ticket *t);

/** Prometheus text: kvgate_hash_jobs_total{backend}, kvgate_hash_batch_jobs (histogram of jobs
 *  per batch), kvgate_hash_queue_seconds (histogram: submit to completion ready),
 *  kvgate_hash_device_errors_total, kvgate_hash_crossover_bytes. b may be NULL (no batcher:
 *  only what the CPU did, passed by the caller as cpu_jobs); otherwise cpu_jobs (jobs the
 *  caller hashed without the batcher) is added to the batcher's own "cpu" count. Cancelled
 *  jobs are not counted. */
void kvg_hash_batcher_write_metrics(const kvg_hash_batcher *b, uint64_t cpu_jobs, kvg_buf *out);

#endif
