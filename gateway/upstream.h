/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP/1.1 client connections to workers, pooled per worker per thread. */
#ifndef KVG_GATEWAY_UPSTREAM_H
#define KVG_GATEWAY_UPSTREAM_H

#include <event2/buffer.h>

#include "gateway_int.h"
#include "sock.h"

typedef struct kvg_upstream_pool kvg_upstream_pool;

typedef struct kvg_upstream kvg_upstream;

/* What the caller learns about its request. After on_retryable, on_end or on_error the
 * connection is gone (or back in the pool) and the caller must not touch it again. */
typedef struct kvg_upstream_cbs {
    /* No response byte arrived and the request may go to another worker: connect refused or
     * timed out, or the connection was reset or closed before responding. */
    void (*on_retryable)(void *ud, int err, bool connect_failed);
    void (*on_head)(void *ud, int status, const kvg_header *headers, size_t n,
                    int64_t content_length);
    void (*on_data)(void *ud, const char *data, size_t len);
    void (*on_end)(void *ud);
    /* The exchange failed after the request was under way. status is the answer to give if
     * no response head was passed on yet (502 broken response, 504 timeout). */
    void (*on_error)(void *ud, int status, const char *msg);
} kvg_upstream_cbs;

typedef enum kvg_upstream_state {
    KVG_UPSTREAM_CONNECTING = 0, /* TCP connect (and DNS) in progress; request queued */
    KVG_UPSTREAM_WAITING,        /* request written or being written; no response byte yet */
    KVG_UPSTREAM_READING,        /* response under way */
    KVG_UPSTREAM_IDLE,           /* in the pool */
    KVG_UPSTREAM_CLOSED,         /* being freed */
    KVG_UPSTREAM_STATE_COUNT,
} kvg_upstream_state;

const char *kvg_upstream_state_str(kvg_upstream_state s);

/** Thread-level housekeeping after a registry change: drop pools of retired workers. */
void kvg_upstream_thread_refresh(kvg_thread *t);
/** Close every pooled connection of the thread (shutdown). */
void kvg_upstream_thread_close_all(kvg_thread *t);

/** Send a request to w over a pooled or new connection on thread t. head is the request line
 *  and headers (copied); body is referenced, not copied, and must stay unchanged until a
 *  final callback. Returns 0 with *out, or a negative errno (nothing was sent, no callback). */
int kvg_upstream_request(kvg_thread *t, kvg_worker *w, const char *head, size_t head_len,
                         struct evbuffer *body, const kvg_upstream_cbs *cbs, void *ud,
                         kvg_upstream **out);
/** Stop (true) or resume (false) reading the response: backpressure from a slow client. */
void kvg_upstream_pause(kvg_upstream *u, bool paused);
/** The caller gives up (client gone): the connection is closed, no callback follows. */
void kvg_upstream_abort(kvg_upstream *u);
kvg_upstream_state kvg_upstream_state_of(const kvg_upstream *u);
/** True when the request went out on a connection reused from the pool. */
bool kvg_upstream_reused(const kvg_upstream *u);

#endif
