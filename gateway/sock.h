/* SPDX-License-Identifier: Apache-2.0 */
/* Non-blocking socket with input and output evbuffers, plaintext or TLS, built for a proxy's
 * hot path: writes go out as soon as the current callback returns (no wait for writability),
 * the write event is armed only after EAGAIN, and reads fill buffers without FIONREAD. */
#ifndef KVG_GATEWAY_SOCK_H
#define KVG_GATEWAY_SOCK_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "common.h"

typedef struct kvg_sock kvg_sock;

/* What kvg_sock_event_fn reports. */
enum {
    KVG_SOCK_CONNECTED = 1, /* connect finished, or the TLS handshake did */
    KVG_SOCK_EOF = 2,       /* the peer closed (input may still hold bytes: read them first) */
    KVG_SOCK_ERROR = 4,     /* reset, refused, TLS failure; s->error has the errno */
};

typedef void (*kvg_sock_fn)(kvg_sock *s, void *ud);
typedef void (*kvg_sock_event_fn)(kvg_sock *s, int what, void *ud);

struct kvg_sock {
    evutil_socket_t fd;
    SSL *ssl;
    struct evbuffer *in;
    struct evbuffer *out;
    size_t read_high;  /* stop reading while this much input waits (0: no limit) */
    size_t write_low;  /* write_fn fires when a write from the loop brings output down to this */
    bool drain_notify; /* write_fn also fires whenever output becomes empty (close after send) */
    int error;         /* errno of the failure (ECONNRESET, ...), or EPROTO for TLS */
    uint64_t bytes_written; /* bytes handed to the kernel (or to TLS) so far */
    /* private */
    struct event_base *base;
    struct event rev, wev, flush_ev;
    kvg_sock_fn read_fn;
    kvg_sock_fn write_fn;
    kvg_sock_event_fn event_fn;
    void *ud;
    bool want_read; /* the owner wants input */
    bool rev_added;
    bool wev_added;
    bool connecting;
    bool handshaking;
    bool read_wants_write; /* TLS: SSL_read asked for writability */
    bool write_wants_read; /* TLS: SSL_write asked for readability */
    bool eof;
    bool failed;
    bool stopped;      /* no more callbacks */
    bool blocked;      /* output hit EAGAIN since the last write_fn */
    bool bulk;         /* the last read was large: read into the input buffer in place */
    bool pend_queued;  /* in the thread's list of writes to make when the callback returns */
    bool flush_active; /* flush_ev is active (a flush asked for outside socket callbacks) */
    kvg_sock *pend_next;
};

/** Adopt a connected non-blocking fd (ssl NULL for plaintext; with ssl, the handshake runs as
 *  a server and ends with KVG_SOCK_CONNECTED). Takes ownership of fd and ssl. 0 or -ENOMEM. */
int kvg_sock_init(kvg_sock *s, struct event_base *base, evutil_socket_t fd, SSL *ssl);
/** Start a non-blocking connect to sa; KVG_SOCK_CONNECTED or KVG_SOCK_ERROR follows. Output
 *  queued before then goes out once connected. 0 or -errno (nothing to clean but _done). */
int kvg_sock_connect(kvg_sock *s, struct event_base *base, const struct sockaddr *sa,
                     socklen_t salen);
/** Close the fd, free the buffers and the SSL. Safe on a zeroed or half-initialised sock. */
void kvg_sock_done(kvg_sock *s);

void kvg_sock_set_callbacks(kvg_sock *s, kvg_sock_fn read_fn, kvg_sock_fn write_fn,
                            kvg_sock_event_fn event_fn, void *ud);
/** Start or stop delivering input (backpressure). Stopping does not lose buffered input. */
void kvg_sock_read(kvg_sock *s, bool on);
/** The owner consumed input: resume reading if read_high had paused it. */
void kvg_sock_consumed(kvg_sock *s);
/** Send what out holds once the current callback returns; several calls cost one write. */
void kvg_sock_flush_soon(kvg_sock *s);
/** Send what out holds now, as far as the socket takes it. */
void kvg_sock_flush(kvg_sock *s);
/* Reading an HTTP/1.1 head out of the input (the front's requests, the workers' responses). */
/** Drop the CR and LF bytes at the start of the input (empty lines before a message, RFC 9112
 *  2.2). True when other bytes follow them, false when the input is empty. */
bool kvg_sock_skip_line_ends(kvg_sock *s);
/** The first want bytes of the input (want <= its length) as one run: in place when they sit
 *  in one chain, else pulled together (rare: a head split across reads). NULL when the input
 *  is empty or out of memory (*oom tells which). */
char *kvg_sock_contiguous(kvg_sock *s, size_t want, bool *oom);
/** Move the first n bytes of the input into a NUL-terminated copy in arena a (the input is
 *  drained of them). NULL when out of memory (the input is left as it was). */
char *kvg_sock_take(kvg_sock *s, size_t n, kvg_arena *a);

/** The time (kvg_now_ns) of the socket event being handled: read once per socket callback, on
 *  its first call, and the same for every call until that callback returns, so that what one
 *  read brings (a request's arrival, a response's head, its first token) is stamped once, at
 *  the read, however long the callback's other work takes. Outside socket callbacks, the clock.
 *  Each monotonic clock read costs ~25 ns in a KVM guest: 13 per proxied request were 1.3% of
 *  the gateway's CPU (perf, 2026-12-02). Durations inside a callback (the decision's stages)
 *  read the clock itself. */
uint64_t kvg_sock_clock_ns(void);

/** No callback from now on; events are removed. Buffers stay until kvg_sock_done. */
void kvg_sock_stop(kvg_sock *s);
/** The TLS session, or NULL. */
static inline SSL *kvg_sock_ssl(const kvg_sock *s)
{
    return s->ssl;
}

#endif
