/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway object's layout, its listeners and front counters, and what lifecycle.c and
 * access_log.c do for it: shared by the gateway's own files, not by its users (gateway.h). */
#ifndef KVG_GATEWAY_INT_H
#define KVG_GATEWAY_INT_H

#include <openssl/ssl.h>
#include <stdatomic.h>

#include "admin.h"
#include "config.h"
#include "exchange.h"
#include "gateway.h"
#include "kv_events.h"
#include "policy.h"
#include "router.h"
#include "tenancy.h"
#include "thread.h"
#include "tls.h"

/* A listening address, shared read-only by all threads serving it. */
struct kvg_listener {
    kvg_listener_config cfg;
    bool has_tls;               /* tls is set up (its context may be swapped by a reload) */
    kvg_tls_slot tls;           /* the context new TLS connections get */
    const kvg_handler *handler; /* proxy or admin */
    bool is_admin;
    uint16_t port; /* as bound (the configured one may be 0) */
};

/* Why an accept(2) failed, for kvgate_accept_errors_total. */
typedef enum kvg_accept_error {
    KVG_ACCEPT_ERR_DESCRIPTORS = 0, /* EMFILE, ENFILE: the process or system is out of fds */
    KVG_ACCEPT_ERR_MEMORY,          /* ENOBUFS, ENOMEM */
    KVG_ACCEPT_ERR_OTHER,
    KVG_ACCEPT_ERR_COUNT,
} kvg_accept_error;

/* Counters of the front that are not tied to a worker. Atomics, written by all threads. */
typedef struct kvg_front_stats {
    _Atomic uint64_t connections_total[KVG_PROTO_COUNT];
    _Atomic int64_t connections_open; /* front connections (not admin, not being refused) */
    _Atomic int64_t admin_connections_open;
    _Atomic uint64_t connections_refused[2]; /* [0] front over max_connections, [1] admin */
    _Atomic uint64_t admin_connections_evicted;
    _Atomic uint64_t accept_errors[KVG_ACCEPT_ERR_COUNT];
    _Atomic uint64_t tls_handshake_failures;
    _Atomic uint64_t requests_by_class[6]; /* 0: client gone, 1xx..5xx */
    _Atomic uint64_t protocol_errors;
    _Atomic uint64_t timeouts;
    _Atomic uint64_t send_timeouts;
} kvg_front_stats;

struct kvg_gateway {
    kvg_config cfg;
    int argc; /* the command line cfg came from, for reloads; argv NULL when embedded */
    char **argv;
    kvg_registry *registry;
    /* Token-exact models (model.h): the config's and the admin API's, loaded; the request
     * threads read its snapshots (kvg_model_registry_snapshots). */
    kvg_model_registry *models;
    kvg_offload *offload;       /* the pool making large bodies' token-exact keys (decide.c) */
    kvg_kv_consumer *kv_events; /* the engines' KV events into the index (kv_events.c) */
    kvg_tenants *tenants;
    kvg_policy_state *policy;
    kvg_router *router;       /* the prefix index and the decision metrics */
    kvg_redis *redis;         /* the shared prefix map and state; NULL without --redis */
    kvg_hash_batcher *hasher; /* GPU block-key hashing (hash.backend); NULL: the CPU */
    kvg_admin *admin;
    uint8_t secret[64]; /* the server secret: scope salts are HMACs under it */
    size_t secret_len;
    bool auth_open; /* single-tenant mode: no keys (set explicitly by the operator) */
    kvg_listener listeners[KVG_MAX_LISTENERS];
    size_t nlisteners;
    kvg_listener admin_listeners[KVG_MAX_LISTENERS];
    size_t nadmin_listeners;
    kvg_thread *threads; /* front threads */
    unsigned nthreads;
    unsigned nthreads_ready; /* initialised (kvg_thread_init) so far, for freeing */
    kvg_thread control;
    bool control_ready;
    _Atomic bool shutting_down;
    _Atomic bool not_ready;      /* SIGTERM's ready delay: /readyz 503 while still serving */
    _Atomic bool force_stop;     /* the shutdown deadline passed */
    _Atomic bool stop_requested; /* kvg_gateway_stop from another thread */
    _Atomic unsigned threads_exited;
    uint64_t shutdown_deadline_ns;
    int access_log_fd;        /* -1 when off */
    uint32_t max_connections; /* front connections at once (configured, or from the fd limit) */
    kvg_front_stats stats;
    kvg_budget body_budget;     /* request bodies held: received bytes and rewritten copies */
    kvg_budget response_budget; /* response bytes queued toward clients */
    struct event *sig_term, *sig_int, *sig_hup;
    struct event *shutdown_timer;
    struct event *ready_delay_timer;
    const char *shutdown_why; /* a static string: what began the shutdown */
};

/* ---- lifecycle.c ---- */
/** Set the limits derived from the configuration and the process: the front connection limit
 *  (limits.max_connections, or from nofile, the descriptor limit) and the memory budgets.
 *  Logs what it chose. Call once cfg and nthreads are final. */
void kvg_gateway_init_limits(kvg_gateway *gw, uint64_t nofile);
/** Called on the control thread when it is woken. */
void kvg_gateway_control_wakeup(kvg_gateway *gw);
/** Start a graceful shutdown (a second call forces it). Control thread only. */
void kvg_gateway_begin_shutdown(kvg_gateway *gw, const char *why);

/* ---- health.c ---- */
/* A front loop that has not turned for this long fails /healthz (liveness). Generous: a loop
 * busy with a large request for a moment must not get the gateway restarted. */
#define KVG_LIVENESS_STALL_MS 10000
/** /healthz's callback (kvg_admin_live_fn): every front thread's loop answered a ping within
 *  KVG_LIVENESS_STALL_MS (always true while shutting down). Any thread. */
bool kvg_gateway_live(void *gw, char *why, size_t why_len);

/* ---- tls_reload.c ---- */
/** Log what a listener's certificate says (subject, expiry). */
void kvg_gateway_tls_log_loaded(const kvg_listener *l, const kvg_tls_cert_info *info);
/** SIGHUP: build every TLS listener's context again from its certificate and key files under
 *  next's TLS settings, and put each that loads in force for new connections; a listener whose
 *  files or settings fail keeps its context, with an error in the log. Control thread. */
void kvg_gateway_tls_reload(kvg_gateway *gw, const kvg_config *next);
/** kvgate_tls_certificate_expiry_timestamp_seconds (registered with the admin module). */
void kvg_tls_stats_write(kvg_buf *out, void *gw);

/* ---- front_probes.c ---- */
/** The proxy handler with probes.front_healthz and probes.front_readyz answered before it. */
extern const kvg_handler kvg_front_probe_handler;

/* ---- hashing.c ---- */
/** Open the GPU hashing backend as hash.backend says: the device and its batcher, or the CPU
 *  (auto without a usable device: logged once). 0, or KVG_ECONFIG (cuda asked for and not
 *  usable), logged. */
int kvg_gateway_hash_setup(kvg_gateway *gw);
/** A front thread's completion sink (an eventfd on its loop); nothing without a batcher. */
int kvg_thread_hash_init(kvg_thread *t);
void kvg_thread_hash_done(kvg_thread *t);
/** kvgate_hash_* series (registered with the admin module). */
void kvg_hash_stats_write(kvg_buf *out, void *gw);

/* ---- access_log.c ---- */
/** Record a finished exchange: access log line and front counters (the exchanges'
 *  kvg_exchange_env.finished; ud is the thread). */
void kvg_thread_exchange_finished(void *thread, kvg_exchange *x);
/** Write the front counters in Prometheus text (registered with the admin module). */
void kvg_front_stats_write(kvg_buf *out, void *gw);

#endif
