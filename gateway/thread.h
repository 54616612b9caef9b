/* SPDX-License-Identifier: Apache-2.0 */
/* A gateway thread: its event loop, listeners, connections, upstream pools and the snapshots it
 * serves with (threads.c). */
#ifndef KVG_GATEWAY_THREAD_H
#define KVG_GATEWAY_THREAD_H

#include <event2/event.h>
#include <event2/listener.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "config.h"
#include "exchange.h"
#include "hash_batcher.h"
#include "model.h"
#include "offload.h"
#include "policy.h"
#include "router.h"
#include "tenancy.h"

typedef struct kvg_gateway kvg_gateway;
typedef struct kvg_listener kvg_listener;

struct kvg_thread {
    unsigned index;
    kvg_gateway *gw;
    struct event_base *base;
    struct evdns_base *dns;
    pthread_t tid;
    bool is_control; /* the main thread: admin, health, signals */
    int notify_fd;   /* eventfd other threads write to wake this loop */
    struct event *notify_ev;
    struct evconnlistener *listeners[KVG_MAX_LISTENERS * 2];
    void *bindings[KVG_MAX_LISTENERS * 2];
    size_t nlisteners;
    kvg_link conns; /* open connections (front or admin), newest first */
    size_t nconns;
    size_t nrefusing;                /* connections being refused politely (over a limit) */
    struct event *accept_resume_ev;  /* re-enables the listeners after an accept failure */
    bool accept_paused;              /* listeners disabled until accept_resume_ev */
    uint64_t accept_failures;        /* in the current episode of failures (for the log) */
    kvg_link pools;                  /* upstream pools of this thread */
    kvg_exchange_env exchange_env;   /* what this thread's exchanges charge and call */
    kvg_exchange_pool exchange_pool; /* HTTP/1.1 exchanges kept for reuse (exchange_env.pool) */
    /* The snapshots this thread routes (kvg_worker_set), authenticates (kvg_tenant_set) and
     * decides (kvg_policy_settings) with, re-acquired when their generation moves. */
    kvg_snapshot_cache workers;
    kvg_snapshot_cache tenants;
    kvg_snapshot_cache policy;
    kvg_snapshot_cache models; /* kvg_model_set: models in token-exact mode */
    uint64_t rng;              /* xorshift state for request ids */
    kvg_buf scratch;           /* reused to compose heads without an allocation per request */
    kvg_salt_cache salts;      /* the scopes' cache salts this thread has computed */
    kvg_redis_client *redis;   /* the shared prefix map on this loop; NULL without Redis */
    kvg_hash_sink *hash_sink;  /* GPU hashing completions for this loop; NULL on the CPU */
    int hash_fd;               /* eventfd the batcher's thread writes to wake this loop */
    struct event *hash_ev;
    kvg_offload_sink *offload_sink; /* large bodies' token-exact keys come back here */
    bool draining;                  /* shutdown: no new requests, close when idle */
    bool stopped;
    /* When this loop last ran its notify callback: /healthz (health.c pings it each second). */
    _Atomic uint64_t heartbeat_ns;
    /* Counted per loop, not on one line every loop writes: the decisions' rotation (round robin
     * and ties), started at the loop's index; block-key jobs hashed at once (kvg_hash_stats_write
     * sums them). */
    uint64_t rotation;
    _Atomic uint64_t hash_cpu_jobs;
};

int kvg_thread_init(kvg_thread *t, kvg_gateway *gw, unsigned index, bool is_control);
void kvg_thread_done(kvg_thread *t);
int kvg_thread_spawn(kvg_thread *t);
/** Wake t's loop (any thread may call this). */
void kvg_thread_notify(kvg_thread *t);
/** Wake every front thread (they pick up registry changes, shutdown). */
void kvg_gateway_notify_all(kvg_gateway *gw);
/** Bind and listen; SO_REUSEPORT lets every thread own a socket on the same port. */
int kvg_listen_socket(const char *host, uint16_t port, bool reuseport, evutil_socket_t *out,
                      uint16_t *bound_port);
int kvg_thread_add_listener(kvg_thread *t, kvg_listener *l, evutil_socket_t fd);
void kvg_thread_close_listeners(kvg_thread *t);
void kvg_thread_start_drain(kvg_thread *t);
void kvg_thread_force_close(kvg_thread *t);

/** A fresh request id (hex) from the thread's generator. */
void kvg_thread_request_id(kvg_thread *t, char *buf, size_t len);
/* The thread's snapshots, refreshed when their generation moved (a relaxed load and a compare
 * when it did not). Each is borrowed until the thread's next call of the same function, which
 * may drop it: take a reference (or copy) to keep something longer. */
/** The current worker snapshot; a change also drops the pools of retired workers. */
kvg_worker_set *kvg_thread_workers(kvg_thread *t);
/** The current tenant snapshot. */
kvg_tenant_set *kvg_thread_tenants(kvg_thread *t);
/** The current policy settings. */
const kvg_policy_config *kvg_thread_policy(kvg_thread *t);
/** The current models in token-exact mode; NULL when the gateway has no model registry. */
kvg_model_set *kvg_thread_models(kvg_thread *t);

#endif
