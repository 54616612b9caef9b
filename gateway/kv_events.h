/* SPDX-License-Identifier: Apache-2.0 */
/* The engines' KV-cache events (docs/kv-events.md): one thread subscribes to the publisher of
 * every worker that names one (the worker's kv_events), and applies what the engines say they
 * stored, removed and cleared to the embedded prefix index. */
#ifndef KVG_GATEWAY_KV_EVENTS_H
#define KVG_GATEWAY_KV_EVENTS_H

#include "common.h"
#include "router.h"

typedef struct kvg_kv_consumer kvg_kv_consumer;

/* Where a worker's events stand (docs/kv-events.md, "Subscribing"). */
typedef enum kvg_kv_state {
    KVG_KV_OFF = 0,    /* no kv_events (or not subscribed): the index uses the model */
    KVG_KV_CONNECTING, /* subscribed, no batch yet: the model until the first one */
    KVG_KV_EVENTS,     /* batches arrive in order: the index learns from them */
    KVG_KV_STALE,      /* silent or unreachable: the model until a batch arrives in order */
    KVG_KV_STATE_COUNT
} kvg_kv_state;

/* One worker's events as the consumer last saw them. */
typedef struct kvg_kv_worker_view {
    kvg_kv_state state;
    bool has_batch;             /* a live batch received since the subscription */
    uint64_t last_batch_age_ms; /* since the last one (0 without one) */
    int64_t sequence;           /* the last batch applied; -1: none since the (re)connection */
} kvg_kv_worker_view;

/** "off", "connecting", "events", "stale"; "?" out of range. */
const char *kvg_kv_state_name(kvg_kv_state st);

/** Start the consumer's thread on reg's workers, applying to rt's index. 0 and *out, or a
 *  negative errno (the ZeroMQ context, the thread). */
int kvg_kv_consumer_start(kvg_registry *reg, kvg_router *rt, kvg_kv_consumer **out);
/** Stop the thread (within its poll interval, 100 ms) and free everything. NULL is a no-op. */
void kvg_kv_consumer_stop(kvg_kv_consumer *c);
/** Append kvgate_kv_events_* (kvg_admin_add_metrics's signature; arg is the consumer). */
void kvg_kv_consumer_write_metrics(kvg_buf *out, void *arg);
/** The worker's state (KVG_KV_OFF for one not subscribed to, c NULL included), with *out filled.
 *  Thread-safe: takes the consumer's lock for a few loads. */
kvg_kv_state kvg_kv_consumer_worker(kvg_kv_consumer *c, uint64_t worker_id,
                                    kvg_kv_worker_view *out);
/** Append the worker's `,"kv_events_status":{...}` member for the workers API
 * (kvg_admin_worker_fn's signature; arg is the consumer): state, the index's source for it and, for
 * a worker with kv_events, last_batch_age_ms (null before one) and sequence. Thread-safe. */
void kvg_kv_consumer_write_worker(kvg_buf *out, const kvg_worker *w, void *arg);

#endif
