/* SPDX-License-Identifier: Apache-2.0 */
/* Work too long for an event loop (the token-exact keys of a large body: tens of microseconds a
 * kilobyte), run on a small pool of threads and completed on the loop that submitted it. */
#ifndef KVG_GATEWAY_OFFLOAD_H
#define KVG_GATEWAY_OFFLOAD_H

#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct kvg_offload kvg_offload;
typedef struct kvg_offload_sink kvg_offload_sink;
typedef struct kvg_offload_job kvg_offload_job;

/* A job: the submitter fills the three callbacks and owns the memory. Exactly one of done and
 * discard is called, on the sink's loop (or, for a job that never ran because the pool was
 * freed, discard on the freeing thread). */
struct kvg_offload_job {
    void (*run)(kvg_offload_job *j);     /* on a pool thread; must not touch the loop's state */
    void (*done)(kvg_offload_job *j);    /* on the sink's loop, after run */
    void (*discard)(kvg_offload_job *j); /* instead of done, after kvg_offload_cancel: frees */
    /* private */
    kvg_offload_sink *sink;
    bool cancelled; /* read and written on the sink's loop only */
    kvg_offload_job *next;
};

/** A pool of nthreads threads (1..64) taking at most max_queued jobs waiting (a full queue
 *  refuses: the caller does the work itself). 0 and *out, -ENOMEM, -EINVAL, or pthread's
 *  error. */
int kvg_offload_new(unsigned nthreads, size_t max_queued, kvg_offload **out);
/** Stop the threads after the job each is running; jobs still queued are discarded here.
 *  Completed jobs not yet drained stay in their sinks (kvg_offload_sink_free discards them).
 *  NULL is a no-op. */
void kvg_offload_free(kvg_offload *o);

/** A loop's completion sink: an eventfd its pool threads write and the loop watches. 0 and
 *  *out, or a negative errno. */
int kvg_offload_sink_new(kvg_offload *o, struct event_base *base, kvg_offload_sink **out);
/** Discard the completed jobs still waiting, then free. Call after kvg_offload_free (so no
 *  thread can complete into it). NULL is a no-op. */
void kvg_offload_sink_free(kvg_offload_sink *s);

/** Queue j for the pool; its completion comes to sink's loop (the caller's). 0, or -EBUSY
 *  (queue full: nothing was queued, no callback will come). */
int kvg_offload_submit(kvg_offload_sink *sink, kvg_offload_job *j);
/** The submitter no longer wants j's result: discard instead of done. On the sink's loop. */
void kvg_offload_cancel(kvg_offload_job *j);

/** Jobs run so far, and refused for a full queue (for metrics). */
void kvg_offload_counts(const kvg_offload *o, unsigned long long *run, unsigned long long *refused);

#endif
