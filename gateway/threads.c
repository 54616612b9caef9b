/* SPDX-License-Identifier: Apache-2.0 */
/* Gateway threads: one event loop each with its own SO_REUSEPORT listener sockets, woken by an
 * eventfd for registry changes and shutdown; the per-thread worker snapshot and request ids. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/dns.h>

#include "conn.h"
#include "block_cache.h"
#include "prom.h"
#include "gateway_int.h"
#include "upstream.h"

static void notify_cb(evutil_socket_t fd, short what, void *arg);

static void thread_request_id(void *t, char *buf, size_t len)
{
    kvg_thread_request_id(t, buf, len);
}
static void accept_resume_cb(evutil_socket_t fd, short what, void *arg);

void kvg_thread_notify(kvg_thread *t)
{
    uint64_t one = 1;
    ssize_t n = write(t->notify_fd, &one, sizeof(one));
    (void)n; /* EAGAIN means a wake-up is already pending */
}

void kvg_gateway_notify_all(kvg_gateway *gw)
{
    for (unsigned i = 0; i < gw->nthreads; i++)
        kvg_thread_notify(&gw->threads[i]);
}

int kvg_thread_init(kvg_thread *t, kvg_gateway *gw, unsigned index, bool is_control)
{
    memset(t, 0, sizeof(*t));
    t->index = index;
    t->rotation = index; /* the loops' round robins start apart */
    t->gw = gw;
    t->is_control = is_control;
    t->notify_fd = -1;
    kvg_list_init(&t->conns);
    kvg_list_init(&t->pools);
    /* Bound to what the gateway has created so far (tests build threads with a registry only);
     * a refresher is only called when its store exists. */
    kvg_snapshot_cache_init(&t->workers,
                            gw->registry ? kvg_registry_snapshots(gw->registry) : NULL);
    kvg_snapshot_cache_init(&t->tenants, gw->tenants ? kvg_tenants_snapshots(gw->tenants) : NULL);
    kvg_snapshot_cache_init(&t->policy, gw->policy ? kvg_policy_state_snapshots(gw->policy) : NULL);
    kvg_snapshot_cache_init(&t->models,
                            gw->models ? kvg_model_registry_snapshots(gw->models) : NULL);
    struct event_config *ec = event_config_new();
    if (!ec)
        return -ENOMEM;
    /* Nothing outside this thread touches its base: cross-thread wake-ups go through the
     * eventfd, so libevent's internal locking is pure overhead. */
    event_config_set_flag(ec, EVENT_BASE_FLAG_NOLOCK);
    t->base = event_base_new_with_config(ec);
    event_config_free(ec);
    if (!t->base)
        return -ENOMEM;
    /* Async name resolution for workers given by host name; numeric hosts never query. */
    t->dns = evdns_base_new(t->base,
                            EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    if (!t->dns) {
        t->dns = evdns_base_new(t->base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
        if (t->dns)
            evdns_base_load_hosts(t->dns, NULL);
    }
    if (!t->dns)
        goto fail;
    t->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->notify_fd < 0)
        goto fail;
    t->notify_ev = event_new(t->base, t->notify_fd, EV_READ | EV_PERSIST, notify_cb, t);
    if (!t->notify_ev || event_add(t->notify_ev, NULL) < 0)
        goto fail;
    t->accept_resume_ev = evtimer_new(t->base, accept_resume_cb, t);
    if (!t->accept_resume_ev)
        goto fail;
    kvg_salt_cache_init(&t->salts, t->gw->secret, t->gw->secret_len);
    /* Front threads ask the shared prefix map; the control thread routes nothing. */
    if (gw->redis && !is_control && kvg_redis_client_new(gw->redis, t->base, &t->redis) < 0)
        goto fail;
    t->hash_fd = -1;
    if (!is_control && kvg_thread_hash_init(t) < 0)
        goto fail;
    t->exchange_env = (kvg_exchange_env){
        .base = t->base,
        .limits = &gw->cfg.limits,
        .body_budget = &gw->body_budget,
        .response_budget = &gw->response_budget,
        .timeouts = &gw->stats.timeouts,
        .send_timeouts = &gw->stats.send_timeouts,
        .request_id = thread_request_id,
        .finished = kvg_thread_exchange_finished,
        .ud = t,
        .pool = &t->exchange_pool,
    };
    uint64_t seed[2];
    kvg_random_bytes(seed, sizeof(seed));
    t->rng = seed[0] | 1;
    return 0;
fail:
    kvg_thread_done(t);
    return -ENOMEM;
}

void kvg_thread_done(kvg_thread *t)
{
    for (size_t i = 0; i < t->nlisteners; i++)
        if (t->listeners[i])
            evconnlistener_free(t->listeners[i]);
    t->nlisteners = 0;
    kvg_snapshot_cache_done(&t->workers);
    kvg_snapshot_cache_done(&t->tenants);
    kvg_snapshot_cache_done(&t->policy);
    kvg_snapshot_cache_done(&t->models);
    kvg_buf_done(&t->scratch);
    kvg_exchange_pool_drain(&t->exchange_pool);
    kvg_salt_cache_done(&t->salts);
    kvg_thread_hash_done(t);         /* its event is on t->base */
    kvg_redis_client_free(t->redis); /* its events are on t->base */
    t->redis = NULL;
    if (t->notify_ev)
        event_free(t->notify_ev);
    t->notify_ev = NULL;
    if (t->accept_resume_ev)
        event_free(t->accept_resume_ev);
    t->accept_resume_ev = NULL;
    if (t->notify_fd >= 0)
        close(t->notify_fd);
    t->notify_fd = -1;
    if (t->dns)
        evdns_base_free(t->dns, 0);
    t->dns = NULL;
    if (t->base)
        event_base_free(t->base);
    t->base = NULL;
}

/* ---- listening sockets -------------------------------------------------------------------- */

int kvg_listen_socket(const char *host, uint16_t port, bool reuseport, evutil_socket_t *out,
                      uint16_t *bound_port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[8];
    snprintf(portstr, sizeof(portstr), "%u", port);
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0)
        return gai == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
    int rc = -EADDRNOTAVAIL;
    evutil_socket_t fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (reuseport)
            setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 4096) < 0) {
            rc = -errno;
            close(fd);
            fd = -1;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            if (ss.ss_family == AF_INET)
                *bound_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            else
                *bound_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
        rc = 0;
        break;
    }
    freeaddrinfo(res);
    if (rc == 0)
        *out = fd;
    return rc;
}

/* The listener callback needs both the listener and the thread; a small binding object. */
typedef struct listener_binding {
    kvg_thread *thread;
    kvg_listener *listener;
} listener_binding;

/* How long the listeners of a thread stay off after an accept failed for want of descriptors
 * or memory (nginx's accept back-off): the pending connection stays in the kernel's backlog. */
#define ACCEPT_PAUSE_MS 500

static void bound_accept_cb(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa,
                            int salen, void *arg)
{
    listener_binding *b = arg;
    kvg_thread *t = b->thread;
    if (t->accept_failures) {
        kvg_log_info("thread %u accepts again after %llu failed accepts", t->index,
                     (unsigned long long)t->accept_failures);
        t->accept_failures = 0;
    }
    kvg_conn_accept(t, b->listener, fd, sa, salen);
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_thread *t = arg;
    t->accept_paused = false;
    for (size_t i = 0; i < t->nlisteners; i++)
        if (t->listeners[i])
            evconnlistener_enable(t->listeners[i]);
}

static void accept_error_cb(struct evconnlistener *lev, void *arg)
{
    listener_binding *b = arg;
    kvg_thread *t = b->thread;
    int err = EVUTIL_SOCKET_ERROR();
    kvg_accept_error kind = err == EMFILE || err == ENFILE    ? KVG_ACCEPT_ERR_DESCRIPTORS
                            : err == ENOBUFS || err == ENOMEM ? KVG_ACCEPT_ERR_MEMORY
                                                              : KVG_ACCEPT_ERR_OTHER;
    t->gw->stats.accept_errors[kind]++;
    if (kind == KVG_ACCEPT_ERR_OTHER) {
        /* ECONNABORTED and the like concern one connection: the listener goes on. */
        kvg_log_debug("accept failed: %s", evutil_socket_error_to_string(err));
        return;
    }
    /* Out of descriptors the listening socket stays readable and every accept fails at once:
     * without a pause the loop spins at 100% CPU writing this line millions of times. Stop
     * accepting on this thread for a while; log once per episode. */
    if (t->accept_failures++ == 0)
        kvg_log_warn("thread %u cannot accept: %s; pausing accepts for %u ms at a time until "
                     "they succeed (limits.max_connections keeps the front below the "
                     "descriptor limit)",
                     t->index, evutil_socket_error_to_string(err), ACCEPT_PAUSE_MS);
    if (t->accept_paused || !t->accept_resume_ev)
        return;
    t->accept_paused = true;
    for (size_t i = 0; i < t->nlisteners; i++)
        if (t->listeners[i])
            evconnlistener_disable(t->listeners[i]);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    evtimer_add(t->accept_resume_ev, &tv);
}

int kvg_thread_add_listener(kvg_thread *t, kvg_listener *l, evutil_socket_t fd)
{
    if (t->nlisteners >= KVG_ARRAY_LEN(t->listeners))
        return -ENOSPC;
    listener_binding *b = calloc(1, sizeof(*b));
    if (!b)
        return -ENOMEM;
    b->thread = t;
    b->listener = l;
    struct evconnlistener *lev =
        /* Backlog 0: the socket listens already (kvg_listen_socket, 4096); -1 would make
         * libevent call listen() again with 128, and bursts past that lose SYNs. */
        evconnlistener_new(t->base, bound_accept_cb, b, LEV_OPT_CLOSE_ON_FREE, 0, fd);
    if (!lev) {
        free(b);
        return -ENOMEM;
    }
    evconnlistener_set_error_cb(lev, accept_error_cb);
    t->listeners[t->nlisteners] = lev;
    t->bindings[t->nlisteners] = b;
    t->nlisteners++;
    return 0;
}

void kvg_thread_close_listeners(kvg_thread *t)
{
    if (t->accept_resume_ev)
        evtimer_del(t->accept_resume_ev);
    t->accept_paused = false;
    for (size_t i = 0; i < t->nlisteners; i++) {
        if (t->listeners[i])
            evconnlistener_free(t->listeners[i]);
        free(t->bindings[i]);
        t->listeners[i] = NULL;
        t->bindings[i] = NULL;
    }
    t->nlisteners = 0;
}

/* ---- shutdown ----------------------------------------------------------------------------- */

void kvg_thread_start_drain(kvg_thread *t)
{
    if (t->draining)
        return;
    t->draining = true;
    kvg_thread_close_listeners(t);
    /* Walk a snapshot of the list: drain hooks may close (deferred) but never free now. */
    for (kvg_link *l = t->conns.next; l != &t->conns; l = l->next) {
        kvg_conn *c = KVG_CONTAINER_OF(l, kvg_conn, link);
        if (!c->proto_known)
            kvg_conn_close(c);
        else if (c->proto_drain)
            c->proto_drain(c);
    }
    if (t->nconns == 0)
        event_base_loopexit(t->base, NULL);
}

void kvg_thread_force_close(kvg_thread *t)
{
    for (kvg_link *l = t->conns.next; l != &t->conns; l = l->next)
        kvg_conn_close(KVG_CONTAINER_OF(l, kvg_conn, link));
    if (t->nconns == 0)
        event_base_loopexit(t->base, NULL);
}

static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_thread *t = arg;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
    atomic_store(&t->heartbeat_ns, kvg_now_ns()); /* the loop turns (health.c pings it) */
    kvg_gateway *gw = t->gw;
    if (t->is_control) {
        kvg_gateway_control_wakeup(gw);
        return;
    }
    if (atomic_load(&gw->force_stop))
        kvg_thread_force_close(t);
    else if (atomic_load(&gw->shutting_down))
        kvg_thread_start_drain(t);
    /* A registry change: pick up the new snapshot and drop pools of retired workers. */
    kvg_thread_workers(t);
}

/* ---- per-thread helpers -------------------------------------------------------------------- */

/* Each costs a relaxed load and a compare per request while nothing changes. */

kvg_worker_set *kvg_thread_workers(kvg_thread *t)
{
    if (kvg_snapshot_cache_refresh(&t->workers))
        kvg_upstream_thread_refresh(t);
    return kvg_worker_set_of(kvg_snapshot_cache_get(&t->workers));
}

kvg_tenant_set *kvg_thread_tenants(kvg_thread *t)
{
    kvg_snapshot_cache_refresh(&t->tenants);
    return kvg_tenant_set_of(kvg_snapshot_cache_get(&t->tenants));
}

const kvg_policy_config *kvg_thread_policy(kvg_thread *t)
{
    kvg_snapshot_cache_refresh(&t->policy);
    return kvg_policy_config_of(kvg_snapshot_cache_get(&t->policy));
}

kvg_model_set *kvg_thread_models(kvg_thread *t)
{
    if (!t->gw->models)
        return NULL;
    kvg_snapshot_cache_refresh(&t->models);
    return kvg_model_set_of(kvg_snapshot_cache_get(&t->models));
}

void kvg_thread_request_id(kvg_thread *t, char *buf, size_t len)
{
    /* xorshift64*: request ids need to be unique, not secret. */
    uint64_t out[2];
    for (int i = 0; i < 2; i++) {
        t->rng ^= t->rng >> 12;
        t->rng ^= t->rng << 25;
        t->rng ^= t->rng >> 27;
        out[i] = t->rng * 0x2545F4914F6CDD1DULL;
    }
    if (len < 33) {
        buf[0] = '\0';
        return;
    }
    kvg_fmt_hex64(buf, out[0]);
    kvg_fmt_hex64(buf + 16, out[1]);
    buf[32] = '\0';
}

static void *thread_main(void *arg)
{
    kvg_thread *t = arg;
    kvg_arena_thread_cache();          /* each request's arena is made and freed here */
    kvg_block_cache_thread();          /* and its evbuffer chains and HTTP/2 streams */
    kvg_prom_stripe_set(t->index + 1); /* counts on a worker's shared lines: its own copy */
    event_base_dispatch(t->base);
    /* Whatever is left (forced stop) goes now, on the owning thread. */
    kvg_thread_close_listeners(t);
    while (!kvg_list_empty(&t->conns)) {
        kvg_thread_force_close(t);
        event_base_loop(t->base, EVLOOP_NONBLOCK | EVLOOP_ONCE);
    }
    kvg_upstream_thread_close_all(t);
    atomic_fetch_add(&t->gw->threads_exited, 1);
    kvg_thread_notify(&t->gw->control);
    return NULL;
}

int kvg_thread_spawn(kvg_thread *t)
{
    int rc = pthread_create(&t->tid, NULL, thread_main, t);
    return rc ? -rc : 0;
}
