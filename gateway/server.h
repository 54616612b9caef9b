/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway process: its threads (one event loop each), listeners and front connections. */
#ifndef KVG_GATEWAY_SERVER_H
#define KVG_GATEWAY_SERVER_H

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <event2/listener.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "admin.h"
#include "config.h"
#include "exchange.h"
#include "policy.h"
#include "router.h"
#include "sock.h"
#include "tenancy.h"

typedef struct kvg_gateway kvg_gateway;
typedef struct kvg_listener kvg_listener;
typedef struct kvg_upstream_pool kvg_upstream_pool;

/* Intrusive doubly linked list (h2o/Linux style). */
typedef struct kvg_link {
    struct kvg_link *prev, *next;
} kvg_link;

static inline void kvg_list_init(kvg_link *head)
{
    head->prev = head->next = head;
}
static inline bool kvg_list_empty(const kvg_link *head)
{
    return head->next == head;
}
static inline void kvg_list_insert(kvg_link *head, kvg_link *n)
{
    n->next = head->next;
    n->prev = head;
    head->next->prev = n;
    head->next = n;
}
static inline void kvg_list_unlink(kvg_link *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* A listening address, shared read-only by all threads serving it. */
struct kvg_listener {
    kvg_listener_config cfg;
    SSL_CTX *ssl_ctx;           /* NULL without TLS */
    const kvg_handler *handler; /* proxy or admin */
    bool is_admin;
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

/* A process-wide bound on bytes held for requests or responses. used moves with atomic adds;
 * a charge that would pass limit is refused (request bodies) or pauses the producer
 * (responses). */
typedef struct kvg_budget {
    _Atomic uint64_t used;
    uint64_t limit;
    _Atomic uint64_t refused[2]; /* [0] the gateway's budget, [1] a tenant's share of it */
} kvg_budget;

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
    size_t nrefusing;               /* connections being refused politely (over a limit) */
    struct event *accept_resume_ev; /* re-enables the listeners after an accept failure */
    bool accept_paused;             /* listeners disabled until accept_resume_ev */
    uint64_t accept_failures;       /* in the current episode of failures (for the log) */
    kvg_link pools;                 /* upstream pools of this thread */
    /* The snapshots this thread routes (kvg_worker_set), authenticates (kvg_tenant_set) and
     * decides (kvg_policy_settings) with, re-acquired when their generation moves. */
    kvg_snapshot_cache workers;
    kvg_snapshot_cache tenants;
    kvg_snapshot_cache policy;
    uint64_t rng;         /* xorshift state for request ids */
    kvg_buf scratch;      /* reused to compose heads without an allocation per request */
    kvg_salt_cache salts; /* the scopes' cache salts this thread has computed */
    bool draining;        /* shutdown: no new requests, close when idle */
    bool stopped;
};

struct kvg_gateway {
    kvg_config cfg;
    kvg_registry *registry;
    kvg_tenants *tenants;
    kvg_policy_state *policy;
    kvg_router *router; /* the prefix index and the decision metrics */
    kvg_admin *admin;
    uint8_t secret[64]; /* the server secret: scope salts are HMACs under it */
    size_t secret_len;
    bool auth_open; /* single-tenant mode: no keys (set explicitly by the operator) */
    kvg_listener listeners[KVG_MAX_LISTENERS];
    size_t nlisteners;
    kvg_listener admin_listeners[KVG_MAX_LISTENERS];
    size_t nadmin_listeners;
    kvg_thread *threads; /* [0] is the control thread when no front threads exist */
    unsigned nthreads;   /* front threads */
    kvg_thread control;
    _Atomic bool shutting_down;
    _Atomic bool force_stop; /* the shutdown deadline passed */
    _Atomic unsigned threads_exited;
    _Atomic uint64_t rotation; /* policy tie-break counter */
    uint64_t shutdown_deadline_ns;
    int access_log_fd;        /* -1 when off */
    uint32_t max_connections; /* front connections at once (configured, or from the fd limit) */
    kvg_front_stats stats;
    kvg_budget body_budget;     /* request bodies held: received bytes and rewritten copies */
    kvg_budget response_budget; /* response bytes queued toward clients */
    struct event *sig_term, *sig_int, *sig_hup;
    struct event *shutdown_timer;
};

/* A front connection, before and after the protocol is known. */
struct kvg_conn {
    kvg_thread *thread;
    kvg_listener *listener;
    kvg_link link;
    evutil_socket_t fd;
    kvg_sock sock; /* valid once sock_ready */
    bool sock_ready;
    struct event peek_ev;  /* waits for the first bytes to pick the protocol */
    struct event timer_ev; /* header/idle timeout of the connection */
    struct event close_ev; /* deferred free */
    kvg_exchange_proto proto;
    bool proto_known;
    bool tls;
    bool closing;
    bool lingering;       /* only output left to flush: kvg_conn_linger */
    uint64_t linger_mark; /* sock.bytes_written when the linger timer was armed */
    bool counted;         /* in connections_open or admin_connections_open */
    bool refusing;        /* over a limit: a canned refusal, then close (conn.c) */
    char remote[64];
    void *proto_state; /* h1 or h2 state */
    void (*proto_free)(kvg_conn *c);
    void (*proto_drain)(kvg_conn *c);   /* shutdown: finish in-flight, take nothing new */
    void (*proto_timeout)(kvg_conn *c); /* the connection timer fired */
    bool (*proto_busy)(kvg_conn *c);    /* a request is being served (not idle, not in a head) */
};

/* ---- threads (threads.c) ---- */
int kvg_thread_init(kvg_thread *t, kvg_gateway *gw, unsigned index, bool is_control);
void kvg_thread_done(kvg_thread *t);
int kvg_thread_spawn(kvg_thread *t);
/** Wake t's loop (any thread may call this). */
void kvg_thread_notify(kvg_thread *t);
void kvg_gateway_notify_all(kvg_gateway *gw);
/** Bind and listen; SO_REUSEPORT lets every thread own a socket on the same port. */
int kvg_listen_socket(const char *host, uint16_t port, bool reuseport, evutil_socket_t *out,
                      uint16_t *bound_port);
int kvg_thread_add_listener(kvg_thread *t, kvg_listener *l, evutil_socket_t fd);
void kvg_thread_close_listeners(kvg_thread *t);
void kvg_thread_start_drain(kvg_thread *t);
void kvg_thread_force_close(kvg_thread *t);
/** Set the limits derived from the configuration and the process (lifecycle.c): the front
 *  connection limit (limits.max_connections, or from nofile, the descriptor limit) and the
 *  memory budgets. Logs what it chose. Call once cfg and nthreads are final. */
void kvg_gateway_init_limits(kvg_gateway *gw, uint64_t nofile);
/** Called on the control thread when it is woken (lifecycle.c). */
void kvg_gateway_control_wakeup(kvg_gateway *gw);
/** Start a graceful shutdown (a second call forces it). Control thread only. */
void kvg_gateway_begin_shutdown(kvg_gateway *gw, const char *why);

/** Accept a new socket on t for listener l (takes ownership of fd). */
void kvg_conn_accept(kvg_thread *t, kvg_listener *l, evutil_socket_t fd, const struct sockaddr *sa,
                     int salen);
/** Close c soon (deferred: safe inside c's own callbacks). */
void kvg_conn_close(kvg_conn *c);
/** (Re)arm the connection timer; ms 0 disarms. */
void kvg_conn_set_timer(kvg_conn *c, uint32_t ms);
/** c ends once its output is out (a last response, a GOAWAY), with nothing else to wait for:
 *  close it when the client takes none of that output for limits.send_timeout_ms, or it
 *  would hold a descriptor and the queued bytes for as long as the client never reads. The
 *  protocol's own timer hook is not called again. */
void kvg_conn_linger(kvg_conn *c);

/* Protocol fronts: take over a connection whose socket is ready. */
int kvg_h1_start(kvg_conn *c);
int kvg_h2_start(kvg_conn *c);

/** Build the TLS context of a listener (ALPN h2, http/1.1). 0 or KVG_ETLS with err. */
int kvg_tls_ctx_new(const kvg_listener_config *cfg, SSL_CTX **out, char *err, size_t err_len);
/** Selected ALPN protocol of a finished handshake is "h2". */
bool kvg_tls_is_h2(SSL *ssl);

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
/** Record a finished exchange: access log line and front counters. */
void kvg_thread_exchange_finished(kvg_thread *t, kvg_exchange *x);

/** The handlers. */
extern const kvg_handler kvg_proxy_handler;
extern const kvg_handler kvg_admin_handler;

/** Write the front counters in Prometheus text (registered with the admin module). */
void kvg_front_stats_write(kvg_buf *out, void *gw);

/** Thread-level housekeeping after a registry change: drop pools of retired workers. */
void kvg_upstream_thread_refresh(kvg_thread *t);
/** Close every pooled connection of the thread (shutdown). */
void kvg_upstream_thread_close_all(kvg_thread *t);

/* One GET to a worker on the control thread (gateway/probe.c), shared by health checks and
 * engine-load scrapes. */
typedef struct kvg_probe kvg_probe;
typedef struct kvg_probe_spec {
    const char *path;
    const char *headers;          /* extra request header lines, each ending "\r\n"; or NULL */
    uint32_t timeout_ms;          /* connect to the end of the response */
    size_t body_max;              /* 0: done at a 2xx head; else keep the body up to this */
    const char *error_status_msg; /* why, for a non-2xx status */
    const char *too_large_msg;    /* why, for a body over body_max */
    /** Called once: why is NULL for a 2xx response (with its body when body_max > 0), else
     *  the reason it failed. Runs inside the probe's callbacks; body is borrowed. */
    void (*done)(kvg_gateway *gw, kvg_worker *w, const char *why, const char *body, size_t len);
} kvg_probe_spec;

/** Start one probe of w unless the previous one using the same thread slot of w is still
 *  running; spec must outlive it; list collects the probes in flight (kvg_probe_free_all). On
 *  memory failure nothing starts (the next round tries again). */
void kvg_probe_start(kvg_gateway *gw, kvg_worker *w, unsigned slot, const kvg_probe_spec *spec,
                     kvg_link *list);
/** Free every probe of list without calling back (shutdown). */
void kvg_probe_free_all(kvg_link *list);

/** Start periodic health checks on the control thread. */
int kvg_health_start(kvg_gateway *gw);
void kvg_health_stop(kvg_gateway *gw);

/** Start scraping the engines' load on the control thread (gateway/scrape.c); nothing when
 *  scrape.interval_ms is 0. 0 or -ENOMEM. */
int kvg_scrape_start(kvg_gateway *gw);
/** Stop it and free the scrapes in flight. Safe when never started, and more than once. */
void kvg_scrape_stop(kvg_gateway *gw);
/** How old a scraped load may be and still count for routing: 3 x scrape.interval_ms; 0 when
 *  scraping is off (kvg_route_request.engine_load_max_age_ns). */
uint64_t kvg_scrape_max_age_ns(const kvg_gateway *gw);

#endif
