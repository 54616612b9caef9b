/* SPDX-License-Identifier: Apache-2.0 */
/* Upstream HTTP/1.1: one request at a time per connection, keep-alive pool per worker per
 * thread, response parsed with kvgate's own parser (h1_parse.c) and streamed to the caller as it
 * arrives, timers for connect, first byte and read gaps, and the retry/abort rules the proxy
 * depends on. */
#include "upstream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/dns.h>
#include <netdb.h>
#include <stdio.h>

#include "h1_parse.h"

/* Input we read ahead of the parser while the client is slow (backpressure bound). */
#define UPSTREAM_READ_HIGH (64u * 1024u)
/* A worker's head is small; bound it (and its trailers). */
#define UPSTREAM_MAX_HEAD (64u * 1024u)

struct kvg_upstream_pool {
    kvg_link link; /* in thread->pools */
    kvg_thread *thread;
    kvg_worker *worker; /* referenced while the pool exists */
    kvg_link idle;
    size_t nidle;
    size_t nactive;
};

struct kvg_upstream {
    kvg_link link; /* in pool->idle while idle */
    kvg_upstream_pool *pool;
    kvg_upstream_state state;
    kvg_sock sock; /* valid once sock_ready (after the address is known) */
    bool sock_ready;
    struct evbuffer *pending; /* the request, held while the address is being resolved */
    struct evdns_getaddrinfo_request *dns_req;
    struct event connect_ev; /* starts the connect outside the resolver's callback */
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int resolve_error;
    kvg_h1_scan scan; /* the response head being looked for */
    kvg_h1_body body; /* the response body's framing, once head_passed */
    const kvg_upstream_cbs *cbs;
    void *ud;
    bool reused;
    bool got_bytes;
    bool head_passed;
    bool paused;
    bool head_request; /* the request is a HEAD: the response has no body */
    bool keep_alive;   /* the response lets the connection be reused */
    kvg_arena arena;   /* the head of the current response, headers pointing into it */
    struct event timer;
    struct event close_ev;
};

static const char *const state_names[KVG_UPSTREAM_STATE_COUNT] = {
    "connecting", "waiting", "reading", "idle", "closed",
};

const char *kvg_upstream_state_str(kvg_upstream_state s)
{
    return s < KVG_UPSTREAM_STATE_COUNT ? state_names[s] : "?";
}

kvg_upstream_state kvg_upstream_state_of(const kvg_upstream *u)
{
    return u->state;
}

bool kvg_upstream_reused(const kvg_upstream *u)
{
    return u->reused;
}

/* ---- pools ----------------------------------------------------------------------------------- */

static kvg_upstream_pool *pool_get(kvg_thread *t, kvg_worker *w)
{
    void **slot = kvg_worker_thread_slot(w, t->index);
    if (*slot)
        return *slot;
    kvg_upstream_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->thread = t;
    p->worker = kvg_worker_ref(w);
    kvg_list_init(&p->idle);
    kvg_list_insert(&t->pools, &p->link);
    *slot = p;
    return p;
}

static void pool_maybe_free(kvg_upstream_pool *p, bool force)
{
    if (p->nidle || p->nactive)
        return;
    if (!force && !kvg_worker_retired(p->worker))
        return;
    *kvg_worker_thread_slot(p->worker, p->thread->index) = NULL;
    kvg_list_unlink(&p->link);
    kvg_worker_unref(p->worker);
    free(p);
}

/* ---- connection teardown ------------------------------------------------------------------ */

static void upstream_free(kvg_upstream *u)
{
    kvg_upstream_pool *p = u->pool;
    event_del(&u->timer);
    event_del(&u->close_ev);
    event_del(&u->connect_ev);
    if (u->dns_req) {
        /* The resolver calls back with EVUTIL_EAI_CANCEL; the callback ignores that. */
        struct evdns_getaddrinfo_request *req = u->dns_req;
        u->dns_req = NULL;
        evdns_getaddrinfo_cancel(req);
    }
    if (u->sock_ready)
        kvg_sock_done(&u->sock);
    if (u->pending)
        evbuffer_free(u->pending);
    kvg_arena_done(&u->arena);
    if (u->state == KVG_UPSTREAM_IDLE) {
        kvg_list_unlink(&u->link);
        p->nidle--;
    } else {
        p->nactive--;
    }
    free(u);
    pool_maybe_free(p, false);
}

static void close_cb(evutil_socket_t fd, short what, void *arg)
{
    upstream_free(arg);
}

/* Close soon: callers may be inside this connection's own callbacks. */
static void upstream_close(kvg_upstream *u)
{
    if (u->sock_ready)
        kvg_sock_stop(&u->sock);
    event_del(&u->timer);
    event_del(&u->connect_ev);
    u->cbs = NULL; /* no callback after this point */
    if (u->state == KVG_UPSTREAM_IDLE) {
        kvg_list_unlink(&u->link);
        u->pool->nidle--;
        u->pool->nactive++;
    }
    u->state = KVG_UPSTREAM_CLOSED;
    event_active(&u->close_ev, EV_READ, 0);
}

static void arm_timer(kvg_upstream *u, uint32_t ms)
{
    if (!ms) {
        event_del(&u->timer);
        return;
    }
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    event_add(&u->timer, &tv);
}

static const kvg_upstream_config *ucfg(kvg_upstream *u)
{
    return &u->pool->thread->gw->cfg.upstream;
}

/* Deliver the final outcome once, then close. */
static void fail_retryable(kvg_upstream *u, int err, bool connect_failed)
{
    const kvg_upstream_cbs *cbs = u->cbs;
    void *ud = u->ud;
    upstream_close(u);
    if (cbs)
        cbs->on_retryable(ud, err, connect_failed);
}

static void fail_error(kvg_upstream *u, int status, const char *msg)
{
    const kvg_upstream_cbs *cbs = u->cbs;
    void *ud = u->ud;
    upstream_close(u);
    if (cbs)
        cbs->on_error(ud, status, msg);
}

/* ---- the pool's idle connections ------------------------------------------------------------ */

static void idle_read_cb(kvg_sock *sock, void *arg)
{
    /* A worker never speaks first; bytes on an idle connection mean it is unusable. */
    upstream_close(arg);
}

static void idle_event_cb(kvg_sock *sock, int what, void *arg)
{
    upstream_close(arg);
}

static void release_to_pool(kvg_upstream *u)
{
    kvg_upstream_pool *p = u->pool;
    kvg_thread *t = p->thread;
    bool keep = u->keep_alive && !t->draining && !kvg_worker_retired(p->worker) &&
                p->nidle < ucfg(u)->max_idle_per_worker && evbuffer_get_length(u->sock.in) == 0;
    if (!keep) {
        upstream_close(u);
        return;
    }
    u->cbs = NULL;
    u->ud = NULL;
    u->state = KVG_UPSTREAM_IDLE;
    p->nactive--;
    p->nidle++;
    kvg_list_insert(&p->idle, &u->link); /* LIFO: the warmest connection is reused first */
    kvg_sock_set_callbacks(&u->sock, idle_read_cb, NULL, idle_event_cb, u);
    kvg_sock_read(&u->sock, true);
    arm_timer(u, ucfg(u)->idle_timeout_ms);
}

/* ---- response parsing ---------------------------------------------------------------------- */

static void complete(kvg_upstream *u)
{
    const kvg_upstream_cbs *cbs = u->cbs;
    void *ud = u->ud;
    event_del(&u->timer);
    release_to_pool(u);
    if (cbs)
        cbs->on_end(ud);
}

static void malformed(kvg_upstream *u, const char *why)
{
    kvg_log_warn("worker %s sent a malformed response: %s", kvg_worker_name(u->pool->worker), why);
    fail_error(u, 502, "the worker sent a malformed response");
}

/* Look for the response head; once it is all there, copy it into the connection's arena and
 * parse it in place. 1: a final head was passed on or an interim one dropped, 0: more input is
 * needed, or the response failed. */
static int read_head(kvg_upstream *u)
{
    /* Empty lines before a status line are skipped, as http-parser did. */
    if (u->scan.pos == 0 && !kvg_sock_skip_line_ends(&u->sock))
        return 0;
    size_t want = KVG_MIN(evbuffer_get_length(u->sock.in), (size_t)UPSTREAM_MAX_HEAD);
    bool oom;
    char *p = kvg_sock_contiguous(&u->sock, want, &oom);
    if (!p) {
        if (oom)
            fail_error(u, 503, "the gateway is out of memory for a worker response");
        return 0;
    }
    size_t end = kvg_h1_head_end(&u->scan, p, want);
    if (!end) {
        if (want >= UPSTREAM_MAX_HEAD)
            malformed(u, "response head too large");
        return 0;
    }
    kvg_arena_reset(&u->arena);
    kvg_header *headers = kvg_arena_alloc(&u->arena, u->scan.lines * sizeof(*headers));
    char *head = headers ? kvg_sock_take(&u->sock, end, &u->arena) : NULL;
    if (!head) {
        fail_error(u, 503, "the gateway is out of memory for a worker response");
        return 0;
    }
    kvg_h1_msg m;
    const char *why = "malformed head";
    int rc = kvg_h1_parse_response(head, end, &m, headers, u->scan.lines, &why);
    memset(&u->scan, 0, sizeof(u->scan));
    if (rc < 0) {
        malformed(u, why);
        return 0;
    }
    if (m.status == 101) {
        malformed(u, "a worker does not switch protocols (101)");
        return 0;
    }
    if (m.status < 200)
        return 1; /* 1xx interim responses are not passed on; the final one follows */
    kvg_h1_body_init_response(&u->body, &m, u->head_request, UPSTREAM_MAX_HEAD);
    u->keep_alive = m.keep_alive;
    u->head_passed = true;
    if (u->cbs)
        u->cbs->on_head(u->ud, m.status, m.headers, m.nheaders, m.content_length);
    return 1;
}

static void process_input(kvg_upstream *u)
{
    struct evbuffer *in = u->sock.in;
    while (!u->paused && u->state == KVG_UPSTREAM_READING) {
        if (!u->head_passed) {
            if (evbuffer_get_length(in) == 0 || !read_head(u))
                return;
            continue;
        }
        if (u->body.done) {
            complete(u);
            return;
        }
        struct evbuffer_iovec vec;
        if (evbuffer_get_length(in) == 0 || evbuffer_peek(in, -1, NULL, &vec, 1) < 1)
            return;
        size_t used, len;
        const char *data;
        const char *why = "malformed body";
        int rc = kvg_h1_body_feed(&u->body, vec.iov_base, vec.iov_len, &used, &data, &len, &why);
        if (len && u->cbs) {
            u->cbs->on_data(u->ud, data, len);
            if (u->state != KVG_UPSTREAM_READING)
                return; /* the caller aborted from a callback */
        }
        evbuffer_drain(in, used);
        kvg_sock_consumed(&u->sock);
        if (rc < 0) {
            malformed(u, why);
            return;
        }
    }
}

static void read_cb(kvg_sock *sock, void *arg)
{
    kvg_upstream *u = arg;
    if (u->state == KVG_UPSTREAM_WAITING) {
        u->state = KVG_UPSTREAM_READING;
        u->got_bytes = true;
    }
    if (u->state != KVG_UPSTREAM_READING)
        return;
    arm_timer(u, ucfg(u)->read_timeout_ms);
    process_input(u);
}

static void event_cb(kvg_sock *sock, int what, void *arg)
{
    kvg_upstream *u = arg;
    if (what & KVG_SOCK_CONNECTED) {
        u->state = KVG_UPSTREAM_WAITING;
        kvg_worker_health_observe(u->pool->worker, true);
        arm_timer(u, ucfg(u)->response_timeout_ms);
        return;
    }
    if (u->state == KVG_UPSTREAM_CONNECTING) {
        kvg_worker_health_observe(u->pool->worker, false);
        fail_retryable(u, sock->error ? -sock->error : -ECONNREFUSED, true);
        return;
    }
    if (u->state == KVG_UPSTREAM_WAITING) {
        /* Closed or reset before a single response byte: nothing reached the client. */
        fail_retryable(u, -ECONNRESET, false);
        return;
    }
    if (u->state == KVG_UPSTREAM_READING) {
        if (what & KVG_SOCK_EOF) {
            /* A close-delimited body ends here; anything else is a truncated response. */
            process_input(u);
            if (u->state != KVG_UPSTREAM_READING)
                return;
            if (u->head_passed && kvg_h1_body_eof(&u->body)) {
                complete(u);
                return;
            }
        }
        fail_error(u, 502, "the worker closed the connection mid-response");
        return;
    }
    upstream_close(u);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_upstream *u = arg;
    kvg_thread *t = u->pool->thread;
    switch (u->state) {
    case KVG_UPSTREAM_CONNECTING:
        t->gw->stats.timeouts++;
        kvg_worker_health_observe(u->pool->worker, false);
        fail_retryable(u, -ETIMEDOUT, true);
        break;
    case KVG_UPSTREAM_WAITING:
    case KVG_UPSTREAM_READING:
        t->gw->stats.timeouts++;
        fail_error(u, 504, "the worker did not respond in time");
        break;
    default:
        upstream_close(u); /* idle timeout */
        break;
    }
}

/* ---- requests -------------------------------------------------------------------------------- */

static void start_connect(kvg_upstream *u)
{
    kvg_thread *t = u->pool->thread;
    u->sock_ready = true; /* kvg_sock_done is safe on whatever connect leaves behind */
    int rc = kvg_sock_connect(&u->sock, t->base, (struct sockaddr *)&u->addr, u->addr_len);
    if (rc == -EMFILE || rc == -ENFILE || rc == -ENOBUFS || rc == -ENOMEM) {
        /* The gateway's own shortage says nothing about the worker: no health failure (a
         * descriptor flood would otherwise mark every worker down), no other worker tried. */
        fail_error(u, 503, "the gateway is out of descriptors or memory for a worker connection");
        return;
    }
    if (rc < 0) {
        kvg_worker_health_observe(u->pool->worker, false);
        fail_retryable(u, rc, true);
        return;
    }
    u->sock.read_high = UPSTREAM_READ_HIGH;
    kvg_sock_set_callbacks(&u->sock, read_cb, NULL, event_cb, u);
    kvg_sock_read(&u->sock, true);
    /* The request goes out as soon as the connection is up. */
    evbuffer_add_buffer(u->sock.out, u->pending);
}

static void connect_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_upstream *u = arg;
    if (u->state != KVG_UPSTREAM_CONNECTING)
        return;
    if (u->resolve_error) {
        kvg_log_warn("cannot resolve worker %s: %s", kvg_worker_name(u->pool->worker),
                     evutil_gai_strerror(u->resolve_error));
        kvg_worker_health_observe(u->pool->worker, false);
        fail_retryable(u, -EHOSTUNREACH, true);
        return;
    }
    start_connect(u);
}

static void resolved_cb(int result, struct evutil_addrinfo *res, void *arg)
{
    if (result == EVUTIL_EAI_CANCEL)
        return; /* the connection is being freed */
    kvg_upstream *u = arg;
    u->dns_req = NULL;
    if (result == 0 && res && res->ai_addrlen <= sizeof(u->addr)) {
        memcpy(&u->addr, res->ai_addr, res->ai_addrlen);
        u->addr_len = (socklen_t)res->ai_addrlen;
    } else {
        u->resolve_error = result ? result : EVUTIL_EAI_FAIL;
    }
    if (res)
        evutil_freeaddrinfo(res);
    /* The resolver may call back from inside evdns_getaddrinfo: continue from the loop. */
    event_active(&u->connect_ev, EV_WRITE, 0);
}

/* Find the worker's address: numeric hosts at once, names through the thread's resolver. */
static void resolve(kvg_upstream *u)
{
    kvg_worker *w = u->pool->worker;
    int len = (int)sizeof(u->addr);
    if (evutil_parse_sockaddr_port(kvg_worker_authority(w), (struct sockaddr *)&u->addr, &len) ==
        0) {
        u->addr_len = (socklen_t)len;
        event_active(&u->connect_ev, EV_WRITE, 0);
        return;
    }
    char port[8];
    snprintf(port, sizeof(port), "%u", kvg_worker_port(w));
    struct evutil_addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_protocol = IPPROTO_TCP};
    u->dns_req =
        evdns_getaddrinfo(u->pool->thread->dns, kvg_worker_host(w), port, &hints, resolved_cb, u);
}

static kvg_upstream *upstream_new(kvg_upstream_pool *p)
{
    kvg_thread *t = p->thread;
    kvg_upstream *u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->pool = p;
    u->state = KVG_UPSTREAM_CONNECTING;
    kvg_list_init(&u->link);
    kvg_arena_init(&u->arena, 2048);
    event_assign(&u->timer, t->base, -1, 0, timer_cb, u);
    event_assign(&u->close_ev, t->base, -1, 0, close_cb, u);
    event_assign(&u->connect_ev, t->base, -1, 0, connect_cb, u);
    u->pending = evbuffer_new();
    if (!u->pending) {
        kvg_arena_done(&u->arena);
        free(u);
        return NULL;
    }
    p->nactive++;
    return u;
}

int kvg_upstream_request(kvg_thread *t, kvg_worker *w, const char *head, size_t head_len,
                         struct evbuffer *body, const kvg_upstream_cbs *cbs, void *ud,
                         kvg_upstream **out)
{
    kvg_upstream_pool *p = pool_get(t, w);
    if (!p)
        return -ENOMEM;
    kvg_upstream *u = NULL;
    bool fresh = false;
    if (!kvg_list_empty(&p->idle)) {
        u = KVG_CONTAINER_OF(p->idle.next, kvg_upstream, link);
        kvg_list_unlink(&u->link);
        p->nidle--;
        p->nactive++;
        u->reused = true;
        u->state = KVG_UPSTREAM_WAITING;
    } else {
        u = upstream_new(p);
        if (!u) {
            pool_maybe_free(p, false);
            return -ENOMEM;
        }
        fresh = true;
    }
    u->cbs = cbs;
    u->ud = ud;
    u->got_bytes = u->head_passed = u->paused = u->keep_alive = false;
    u->head_request = head_len >= 5 && memcmp(head, "HEAD ", 5) == 0;
    memset(&u->scan, 0, sizeof(u->scan));
    memset(&u->body, 0, sizeof(u->body));
    kvg_arena_reset(&u->arena);
    struct evbuffer *o = fresh ? u->pending : u->sock.out;
    evbuffer_add(o, head, head_len);
    if (body && evbuffer_get_length(body))
        evbuffer_add_buffer_reference(o, body);
    if (fresh) {
        resolve(u);
        arm_timer(u, ucfg(u)->connect_timeout_ms);
    } else {
        kvg_sock_set_callbacks(&u->sock, read_cb, NULL, event_cb, u);
        kvg_sock_flush_soon(&u->sock);
        arm_timer(u, ucfg(u)->response_timeout_ms);
    }
    *out = u;
    return 0;
}

void kvg_upstream_pause(kvg_upstream *u, bool paused)
{
    if (u->state != KVG_UPSTREAM_READING && u->state != KVG_UPSTREAM_WAITING)
        return;
    if (u->paused == paused)
        return;
    u->paused = paused;
    if (!u->sock_ready)
        return;
    if (paused) {
        kvg_sock_read(&u->sock, false);
        /* A paused stream is the client's doing, not the worker's: no read timeout. */
        event_del(&u->timer);
        return;
    }
    kvg_sock_read(&u->sock, true);
    arm_timer(u, ucfg(u)->read_timeout_ms);
    process_input(u);
}

void kvg_upstream_abort(kvg_upstream *u)
{
    if (u->state == KVG_UPSTREAM_CLOSED)
        return;
    upstream_close(u);
}

void kvg_upstream_thread_refresh(kvg_thread *t)
{
    for (kvg_link *l = t->pools.next; l != &t->pools;) {
        kvg_upstream_pool *p = KVG_CONTAINER_OF(l, kvg_upstream_pool, link);
        l = l->next;
        if (!kvg_worker_retired(p->worker))
            continue;
        while (!kvg_list_empty(&p->idle))
            upstream_close(KVG_CONTAINER_OF(p->idle.next, kvg_upstream, link));
    }
}

void kvg_upstream_thread_close_all(kvg_thread *t)
{
    /* Thread exit: every exchange is gone, so only idle and closing connections remain. */
    for (kvg_link *l = t->pools.next; l != &t->pools; l = l->next) {
        kvg_upstream_pool *p = KVG_CONTAINER_OF(l, kvg_upstream_pool, link);
        while (!kvg_list_empty(&p->idle))
            upstream_close(KVG_CONTAINER_OF(p->idle.next, kvg_upstream, link));
    }
    /* Run the deferred closes, then drop the (now empty) pools. */
    event_base_loop(t->base, EVLOOP_NONBLOCK);
    while (!kvg_list_empty(&t->pools)) {
        kvg_upstream_pool *p = KVG_CONTAINER_OF(t->pools.next, kvg_upstream_pool, link);
        if (p->nidle || p->nactive) {
            kvg_log_warn("upstream pool for %s still has %zu connections at exit",
                         kvg_worker_name(p->worker), p->nactive + p->nidle);
            kvg_list_unlink(&p->link);
            continue;
        }
        pool_maybe_free(p, true);
    }
}
