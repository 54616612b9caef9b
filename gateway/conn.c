/* SPDX-License-Identifier: Apache-2.0 */
/* Front connections: accept, pick the protocol from the first bytes (TLS, HTTP/2 preface or
 * HTTP/1.1) without consuming them, TLS handshake and ALPN, timers, deferred close. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>

#include <arpa/inet.h>
#include <stdio.h>

#include "conn.h"
#include "gateway_int.h"
#include "tls.h"

static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define H2_PREFACE_LEN 24

/* How long a refused connection may take to send its first bytes and then to close after
 * the refusal; it holds a descriptor that long. */
#define REFUSE_LINGER_MS 2000
/* Connections being refused at once per thread; past it, a refused one is closed at once. */
#define REFUSING_MAX 64

static void close_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_conn *c = arg;
    kvg_thread *t = c->thread;
    if (c->proto_free)
        c->proto_free(c);
    event_del(&c->peek_ev);
    event_del(&c->timer_ev);
    if (c->sock_ready)
        kvg_sock_done(&c->sock); /* closes the fd and frees the SSL */
    else if (c->fd >= 0)
        close(c->fd);
    kvg_list_unlink(&c->link);
    t->nconns--;
    if (c->refusing)
        t->nrefusing--;
    if (c->counted) {
        if (c->listener->is_admin)
            t->gw->stats.admin_connections_open--;
        else
            t->gw->stats.connections_open--;
    }
    free(c);
    if (t->draining && t->nconns == 0)
        event_base_loopexit(t->base, NULL);
}

void kvg_conn_close(kvg_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    if (c->sock_ready)
        kvg_sock_stop(&c->sock);
    event_active(&c->close_ev, EV_READ, 0);
}

/*
 * The connection's timer moves several times per request (the header timeout when a request
 * starts, the read timeout with its body, off while the worker answers, the idle timeout after
 * it), and each event_add or event_del of a timer is a heap operation in libevent (~1,200
 * instructions a request, callgrind 2026-12-02). So the timer is lazy: the deadline lives in
 * the connection, and the libevent timer is only moved when the new deadline is earlier than
 * the one it is armed for. When it fires before the deadline (which moved later since), it is
 * armed again for what is left; a connection serving a request every second then re-arms once
 * per header timeout instead of four times per request. Deadlines are read on the coarse
 * monotonic clock (updated each kernel tick: a memory read, where the precise clock is an
 * rdtsc and a conversion that already cost 1.7% of the gateway's CPU under load, perf
 * 2026-12-02); a timeout may so fire up to TIMER_SLACK_NS early.
 */
#define TIMER_SLACK_NS 10000000u

static uint64_t coarse_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void arm_timer(kvg_conn *c, uint64_t now, uint64_t deadline)
{
    uint64_t left = deadline > now ? deadline - now : 0;
    struct timeval tv = {.tv_sec = (time_t)(left / 1000000000u),
                         .tv_usec = (suseconds_t)(left % 1000000000u / 1000u)};
    event_add(&c->timer_ev, &tv);
    c->timer_armed_ns = deadline;
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_conn *c = arg;
    c->timer_armed_ns = 0;
    if (c->closing || c->timer_deadline_ns == 0)
        return;
    uint64_t now = coarse_now_ns();
    /* Early: the deadline moved since the timer was armed (kvg_conn_set_timer). */
    if (now + TIMER_SLACK_NS < c->timer_deadline_ns) {
        arm_timer(c, now, c->timer_deadline_ns);
        return;
    }
    c->timer_deadline_ns = 0;
    if (c->refusing) { /* the refusal had its time: not a timeout of a served client */
        kvg_conn_close(c);
        return;
    }
    if (c->lingering) {
        if (c->sock_ready && c->sock.bytes_written != c->linger_mark) {
            kvg_conn_linger(c); /* the client reads, however slowly */
            return;
        }
        c->thread->gw->stats.timeouts++;
        c->thread->gw->stats.send_timeouts++;
        kvg_conn_close(c);
        return;
    }
    if (c->proto_timeout) {
        c->proto_timeout(c);
        return;
    }
    /* Still choosing a protocol or in the TLS handshake: a slow or silent client. A handshake
     * cut here failed as surely as one the client abandoned: count it with them, so that a
     * handshake slowloris shows where operators look for TLS trouble. */
    c->thread->gw->stats.timeouts++;
    if (c->tls)
        c->thread->gw->stats.tls_handshake_failures++;
    kvg_conn_close(c);
}

void kvg_conn_set_timer(kvg_conn *c, uint32_t ms)
{
    if (ms == 0) {
        c->timer_deadline_ns = 0; /* the armed timer, if any, finds nothing to do */
        return;
    }
    uint64_t now = coarse_now_ns();
    c->timer_deadline_ns = now + (uint64_t)ms * 1000000u;
    if (c->timer_armed_ns == 0 || c->timer_armed_ns > c->timer_deadline_ns)
        arm_timer(c, now, c->timer_deadline_ns);
}

void kvg_conn_linger(kvg_conn *c)
{
    c->lingering = true;
    c->linger_mark = c->sock_ready ? c->sock.bytes_written : 0;
    kvg_conn_set_timer(c, c->thread->gw->cfg.limits.send_timeout_ms);
}

static void start_proto(kvg_conn *c, bool h2)
{
    int rc = h2 ? kvg_h2_start(c) : kvg_h1_start(c);
    if (rc < 0) {
        kvg_log_error("cannot start %s on connection from %s: %s", h2 ? "HTTP/2" : "HTTP/1.1",
                      c->remote, kvg_strerror(rc));
        kvg_conn_close(c);
    }
}

static void tls_event_cb(kvg_sock *sock, int what, void *arg)
{
    kvg_conn *c = arg;
    if (what & KVG_SOCK_CONNECTED) {
        start_proto(c, kvg_tls_is_h2(kvg_sock_ssl(sock)));
        return;
    }
    /* The handshake failed or the client left during it. */
    unsigned long e = ERR_peek_last_error();
    if (e) {
        char buf[160];
        ERR_error_string_n(e, buf, sizeof(buf));
        kvg_log_debug("TLS handshake with %s failed: %s", c->remote, buf);
        ERR_clear_error();
    }
    c->thread->gw->stats.tls_handshake_failures++;
    kvg_conn_close(c);
}

/* What the first bytes of a connection say, read without consuming them. */
typedef enum first_bytes {
    FIRST_NONE = 0,   /* nothing yet */
    FIRST_GONE,       /* the client closed or reset */
    FIRST_TLS,        /* a TLS record */
    FIRST_H2_PARTIAL, /* a prefix of the HTTP/2 preface (or of "PRI ..." in HTTP/1.1) */
    FIRST_H2,         /* the HTTP/2 preface */
    FIRST_H1,         /* anything else */
    FIRST_COUNT,
} first_bytes;

static first_bytes peek_first_bytes(evutil_socket_t fd)
{
    unsigned char buf[H2_PREFACE_LEN];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return FIRST_NONE;
    if (n <= 0)
        return FIRST_GONE;
    if (buf[0] == 0x16)
        return FIRST_TLS;
    if (memcmp(buf, h2_preface, (size_t)n) != 0)
        return FIRST_H1;
    return n < H2_PREFACE_LEN ? FIRST_H2_PARTIAL : FIRST_H2;
}

static void peek_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_conn *c = arg;
    kvg_listener *l = c->listener;
    first_bytes first = peek_first_bytes(fd);
    if (first == FIRST_NONE) {
        event_add(&c->peek_ev, NULL);
        return;
    }
    if (first == FIRST_GONE) {
        kvg_conn_close(c);
        return;
    }
    if (first == FIRST_TLS && l->has_tls) {
        SSL *ssl = kvg_tls_slot_ssl_new(&l->tls); /* the context in force (reloads swap it) */
        if (!ssl) {
            kvg_conn_close(c);
            return;
        }
        c->sock_ready = true; /* the sock owns fd and ssl from here, even on failure */
        if (kvg_sock_init(&c->sock, c->thread->base, fd, ssl) < 0) {
            kvg_conn_close(c);
            return;
        }
        c->tls = true;
        kvg_sock_set_callbacks(&c->sock, NULL, NULL, tls_event_cb, c);
        return;
    }
    if (!l->cfg.cleartext) {
        kvg_conn_close(c); /* a TLS-only listener */
        return;
    }
    if (first == FIRST_H2_PARTIAL) {
        event_add(&c->peek_ev, NULL); /* wait for the rest of the preface */
        return;
    }
    c->sock_ready = true;
    if (kvg_sock_init(&c->sock, c->thread->base, fd, NULL) < 0) {
        kvg_conn_close(c);
        return;
    }
    start_proto(c, first == FIRST_H2);
}

static void format_addr(const struct sockaddr *sa, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
        snprintf(buf, len, "%s:%u", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
        snprintf(buf, len, "[%s]:%u", host, port);
    } else {
        snprintf(buf, len, "unix");
    }
}

/* ---- refusing politely ------------------------------------------------------------------- */

/* Over a connection limit, a client gets an answer it understands rather than a reset: HTTP/1.1
 * a 503 with Retry-After, HTTP/2 a GOAWAY that says no stream was processed (safe to retry
 * elsewhere). TLS is closed: an answer would cost a handshake, which is what the limit saves.
 * No protocol state is built for it; the bytes are canned. */
#define REFUSE_BODY                                                                                \
    "{\"error\":{\"message\":\"the gateway is at its connection limit\",\"type\":\"overloaded\","  \
    "\"param\":null,\"code\":503}}"
#define REFUSE_BODY_LEN "106"
_Static_assert(sizeof(REFUSE_BODY) - 1 == 106, "REFUSE_BODY_LEN is the body's length");
static const char refuse_h1[] = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: "
                                "application/json\r\nretry-after: 1\r\nconnection: close\r\n"
                                "content-length: " REFUSE_BODY_LEN "\r\n\r\n" REFUSE_BODY;
/* An empty SETTINGS frame (the server preface), then GOAWAY(last stream 0, NO_ERROR). */
static const unsigned char refuse_h2[] = {
    0,   0,   0,   4,   0,   0,   0,   0,   0, /* SETTINGS */
    0,   0,   24,  7,   0,   0,   0,   0,   0,   0,   0,
    0,   0,   0,   0,   0,   0,   'c', 'o', 'n', 'n', 'e', /* GOAWAY */
    'c', 't', 'i', 'o', 'n', ' ', 'l', 'i', 'm', 'i', 't',
};

static void refuse_drain_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_conn *c = arg;
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n > 0)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        kvg_conn_close(c); /* the client closed too (or reset) */
        return;
    }
}

static void refuse_peek_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_conn *c = arg;
    first_bytes first = peek_first_bytes(fd);
    if (first == FIRST_NONE || first == FIRST_H2_PARTIAL) {
        event_add(&c->peek_ev, NULL);
        return;
    }
    if (first == FIRST_GONE || first == FIRST_TLS) {
        kvg_conn_close(c);
        return;
    }
    bool h2 = first == FIRST_H2;
    ssize_t w = h2 ? send(fd, refuse_h2, sizeof(refuse_h2), MSG_NOSIGNAL | MSG_DONTWAIT)
                   : send(fd, refuse_h1, sizeof(refuse_h1) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w; /* a full socket buffer this early means a client not worth waiting for */
    /* Closing with unread input would send a reset, which can destroy the answer before the
     * client reads it: half-close, then read until the client closes or the timer fires. */
    shutdown(fd, SHUT_WR);
    event_del(&c->peek_ev);
    event_assign(&c->peek_ev, c->thread->base, fd, EV_READ | EV_PERSIST, refuse_drain_cb, c);
    event_add(&c->peek_ev, NULL);
}

/* The admin listener is for the operator: when it is full, the oldest connection that serves
 * nothing (idle, or still sending its head, as a slowloris does) makes room. True when one
 * was closed. */
static bool evict_admin_idle(kvg_thread *t)
{
    for (kvg_link *l = t->conns.prev; l != &t->conns; l = l->prev) {
        kvg_conn *c = KVG_CONTAINER_OF(l, kvg_conn, link);
        if (!c->listener->is_admin || !c->counted || c->closing)
            continue;
        if (c->proto_busy && c->proto_busy(c))
            continue;
        kvg_log_info("admin connections at the limit: closing the oldest idle one (%s)", c->remote);
        t->gw->stats.admin_connections_evicted++;
        kvg_conn_close(c);
        return true;
    }
    return false;
}

/* Whether a new connection on l may be served; counts it when so. */
static bool admit(kvg_thread *t, kvg_listener *l)
{
    kvg_gateway *gw = t->gw;
    if (l->is_admin) {
        /* The control thread alone serves admin listeners: no race on the count. */
        if ((uint64_t)atomic_load(&gw->stats.admin_connections_open) >=
                gw->cfg.admin_max_connections &&
            !evict_admin_idle(t))
            return false;
        gw->stats.admin_connections_open++;
        return true;
    }
    int64_t open = atomic_fetch_add(&gw->stats.connections_open, 1);
    if (open < (int64_t)gw->max_connections)
        return true;
    gw->stats.connections_open--;
    return false;
}

void kvg_conn_accept(kvg_thread *t, kvg_listener *l, evutil_socket_t fd, const struct sockaddr *sa,
                     int salen)
{
    if (t->draining) {
        close(fd);
        return;
    }
    bool admitted = admit(t, l);
    if (!admitted) {
        t->gw->stats.connections_refused[l->is_admin ? 1 : 0]++;
        if (t->nrefusing >= REFUSING_MAX) {
            close(fd);
            return;
        }
    }
    kvg_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        if (admitted) {
            if (l->is_admin)
                t->gw->stats.admin_connections_open--;
            else
                t->gw->stats.connections_open--;
        }
        close(fd);
        return;
    }
    c->thread = t;
    c->listener = l;
    c->fd = fd;
    c->counted = admitted;
    c->refusing = !admitted;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    format_addr(sa, c->remote, sizeof(c->remote));
    event_assign(&c->peek_ev, t->base, fd, EV_READ, admitted ? peek_cb : refuse_peek_cb, c);
    event_assign(&c->timer_ev, t->base, -1, 0, timer_cb, c);
    event_assign(&c->close_ev, t->base, -1, 0, close_cb, c);
    kvg_list_insert(&t->conns, &c->link);
    t->nconns++;
    if (c->refusing)
        t->nrefusing++;
    kvg_conn_set_timer(c, admitted ? t->gw->cfg.limits.header_timeout_ms : REFUSE_LINGER_MS);
    event_add(&c->peek_ev, NULL);
}
