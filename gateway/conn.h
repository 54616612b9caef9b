/* SPDX-License-Identifier: Apache-2.0 */
/* A connection on a listener, before and after its protocol is known (conn.c), and the
 * protocol fronts that take it over (h1.c, h2.c). */
#ifndef KVG_GATEWAY_CONN_H
#define KVG_GATEWAY_CONN_H

#include <event2/event.h>
#include <event2/event_struct.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "exchange.h"
#include "sock.h"

typedef struct kvg_conn kvg_conn;
typedef struct kvg_listener kvg_listener;

struct kvg_conn {
    kvg_thread *thread;
    kvg_listener *listener;
    kvg_link link;
    evutil_socket_t fd;
    kvg_sock sock; /* valid once sock_ready */
    bool sock_ready;
    struct event peek_ev;       /* waits for the first bytes to pick the protocol */
    struct event timer_ev;      /* header/idle timeout of the connection (kvg_conn_set_timer) */
    uint64_t timer_deadline_ns; /* when the current timeout expires (monotonic); 0: none */
    uint64_t timer_armed_ns;    /* the deadline timer_ev is armed for; 0: not armed */
    struct event close_ev;      /* deferred free */
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

#endif
