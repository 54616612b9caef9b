/* SPDX-License-Identifier: Apache-2.0 */
/* Live mode's private interface: one request's state (live.c) and the two transports that carry
 * requests to the gateway, HTTP/2 over nghttp2 (live_h2.c) and HTTP/1.1 over evhttp
 * (live_h1.c). Everything runs on one event_base; nothing here is thread-safe. */
#ifndef KVG_REPLAY_LIVE_H
#define KVG_REPLAY_LIVE_H

#include <netinet/in.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "loadgen.h"
#include "replay.h"

#define LIVE_WORKER_NAME_MAX 63

typedef struct live_run live_run;
typedef struct live_h1 live_h1;
typedef struct live_h2 live_h2;

/* How a request ended. */
typedef enum live_outcome {
    LIVE_OK = 0,
    LIVE_STATUS,     /* a status other than 2xx */
    LIVE_TIMEOUT,    /* cfg.timeout_ms passed */
    LIVE_CONNECTION, /* connect failed, connection or stream closed or reset early */
    LIVE_PROTOCOL,   /* bad SSE, no [DONE], no usage */
    LIVE_TOKENS,     /* prompt_tokens differs from the trace's input_length */
    LIVE_OUTCOME_COUNT,
} live_outcome;

const char *live_outcome_str(live_outcome o);

/* One trace request on the wire. The array of them lives for the whole run, so transports may
 * keep pointers to them until the run ends. */
typedef struct live_req {
    live_run *run;
    size_t index; /* in the trace */
    const replay_request *r;
    const char *authorization; /* "Bearer KEY" or NULL (borrowed from the run) */
    kvg_buf body;              /* the JSON request, freed at the end */
    size_t body_sent;          /* HTTP/2: bytes handed to nghttp2 */
    uint64_t t_arrival_ns;     /* scheduled send time */
    uint64_t t_first_ns;       /* first generated text; 0 before */
    int status;                /* HTTP status; 0 before the head */
    char worker[LIVE_WORKER_NAME_MAX + 1];
    lg_sse sse;
    lg_stream stream;
    int stream_rc;  /* first error parsing the stream */
    kvg_buf detail; /* the start of an error body */
    bool sent, finished;
    struct event deadline;
    /* transport state */
    bool h2;
    void *conn;        /* the transport's connection, while in flight */
    int32_t stream_id; /* HTTP/2 */
    kvg_link link;     /* on its HTTP/2 connection's list, or the HTTP/1.1 pending queue */
} live_req;

/* What the transports need from the run. */
struct live_run {
    const replay_live_config *cfg;
    struct event_base *base;
    struct sockaddr_storage addr; /* the gateway, resolved once */
    socklen_t addrlen;
    char host[300]; /* Host / :authority */
    char path[1100];
    struct timeval timeout;
    live_h1 *h1;
    live_h2 *h2;
};

/** The response head arrived (status) — transports call these from their callbacks. */
void live_req_status(live_req *q, int status);
/** A response header: only x-kvgate-worker (or x-simworker-name) is kept. */
void live_req_header(live_req *q, const char *name, size_t nlen, const char *value, size_t vlen);
/** Response body bytes (the SSE stream, or an error body). */
void live_req_data(live_req *q, const char *data, size_t len);
/** The response ended: without a transport error outcome is LIVE_OK and the request's own
 *  checks (status, stream, usage, token count) decide; otherwise outcome and detail say what
 *  went wrong. A second call is ignored. */
void live_req_finish(live_req *q, live_outcome outcome, const char *detail);

/** HTTP/2: connections (cfg.connections) opened on first use, streams round robin over them; a
 *  connection that fails fails its streams and is replaced on the next send. 0 or -ENOMEM. */
int live_h2_new(live_run *run, live_h2 **out);
/** Send q (its body built); a local failure finishes q. */
void live_h2_send(live_h2 *h, live_req *q);
/** Reset q's stream (a timeout); the caller finishes q. */
void live_h2_cancel(live_h2 *h, live_req *q);
void live_h2_free(live_h2 *h);

/** HTTP/1.1: a pool of keep-alive connections, one request each at a time, opened as needed up
 *  to cfg.h1_max; past it requests wait in arrival order. 0 or -ENOMEM. */
int live_h1_new(live_run *run, live_h1 **out);
void live_h1_send(live_h1 *h, live_req *q);
/** Abort q (queued or in flight); the caller finishes q. */
void live_h1_cancel(live_h1 *h, live_req *q);
void live_h1_free(live_h1 *h);

#endif
