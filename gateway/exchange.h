/* SPDX-License-Identifier: Apache-2.0 */
/* One request and its response on a front connection, independent of HTTP/1.1 or HTTP/2:
 * the contract between the protocol fronts (h1.c, h2.c) and the handlers (proxy, admin). */
#ifndef KVG_GATEWAY_EXCHANGE_H
#define KVG_GATEWAY_EXCHANGE_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "config.h"

typedef struct kvg_exchange kvg_exchange;
typedef struct kvg_thread kvg_thread;

/* The life of an exchange's response. The two holds on the exchange (the front's and the
 * handler's) are apart: front_done, handler_done. */
typedef enum kvg_exchange_resp {
    KVG_RESP_NONE = 0,  /* no head yet */
    KVG_RESP_STREAMING, /* the head is out; body bytes may follow */
    KVG_RESP_ENDED,     /* complete: kvg_exchange_end */
    KVG_RESP_RESET,     /* cut short: reset by the handler, the client gone, a timeout */
    KVG_RESP_COUNT,
} kvg_exchange_resp;

const char *kvg_exchange_resp_str(kvg_exchange_resp r);
typedef struct kvg_tenant kvg_tenant;

/* A process-wide bound on bytes held for requests or responses. used moves with atomic adds;
 * a charge that would pass limit is refused (request bodies) or pauses the producer
 * (responses). */
typedef struct kvg_budget {
    _Atomic uint64_t used;
    uint64_t limit;
    _Atomic uint64_t refused[2]; /* [0] the gateway's budget, [1] a tenant's share of it */
} kvg_budget;

/* Exchanges kept for reuse by one thread (kvg_exchange_new, kvg_exchange_free), with their two
 * evbuffers and their arena's first chunk: an HTTP/1.1 request otherwise made three callocs
 * (glibc's calloc skips its per-thread cache) and as many frees. */
typedef struct kvg_exchange_pool {
    kvg_exchange *head;
    unsigned n;
} kvg_exchange_pool;

/** Free the exchanges a pool keeps. */
void kvg_exchange_pool_drain(kvg_exchange_pool *p);

/* What an exchange needs from the thread it runs on, given at kvg_exchange_init so that the
 * exchange calls up into nothing: the loop its timers use, the limits, the budgets and
 * counters it charges, and two hooks. One per thread, shared by its exchanges; it must
 * outlive them. */
typedef struct kvg_exchange_env {
    struct event_base *base;
    const kvg_front_limits *limits;
    kvg_budget *body_budget;
    kvg_budget *response_budget;
    _Atomic uint64_t *timeouts;      /* front timeouts (408s, send timeouts) */
    _Atomic uint64_t *send_timeouts; /* responses aborted by the send timeout */
    /** Write a fresh request id (NUL-terminated, at most len bytes) into buf. */
    void (*request_id)(void *ud, char *buf, size_t len);
    /** Both sides are done with x, which is freed right after: log and count it. */
    void (*finished)(void *ud, kvg_exchange *x);
    void *ud;
    kvg_exchange_pool *pool; /* the thread's; NULL: every exchange is allocated and freed */
} kvg_exchange_env;

typedef struct kvg_header {
    const char *name; /* lowercase */
    size_t name_len;
    const char *value;
    size_t value_len;
} kvg_header;

/* What a handler implements. Callbacks run on the connection's thread. After the handler calls
 * kvg_exchange_detach, none of them is called again. */
typedef struct kvg_handler {
    /* The request head is complete (method, path, headers). Either respond at once, or call
     * kvg_exchange_read_body to receive the body. */
    void (*on_head)(kvg_exchange *x);
    /* The whole body is in x->body. */
    void (*on_body)(kvg_exchange *x);
    /* Output toward the client fell below the low-water mark after the handler saw
     * kvg_exchange_output_full() return true. Optional. */
    void (*on_writable)(kvg_exchange *x);
    /* The client went away, the stream was reset, or a timeout fired. The handler releases
     * what it holds for x and calls kvg_exchange_detach. Responding is no longer possible.
     * Not delivered once the handler ended or reset the response: it detaches on its own. */
    void (*on_abort)(kvg_exchange *x);
    void *data;
} kvg_handler;

typedef enum kvg_exchange_proto {
    KVG_PROTO_HTTP1 = 0,
    KVG_PROTO_HTTP2,
    KVG_PROTO_COUNT,
} kvg_exchange_proto;

const char *kvg_exchange_proto_str(kvg_exchange_proto p);

/* Hooks the protocol front implements; handlers never call these directly. */
typedef struct kvg_exchange_ops {
    void (*read_body)(kvg_exchange *x); /* start receiving the body (h1: 100-continue) */
    void (*send_head)(kvg_exchange *x); /* x->status, x->resp_headers are set */
    void (*send_data)(kvg_exchange *x); /* x->out has new bytes */
    void (*send_end)(kvg_exchange *x);  /* no more bytes after x->out */
    void (*reset)(kvg_exchange *x);     /* abort the response mid-way */
    size_t (*pending)(kvg_exchange *x); /* bytes queued toward the client */
    void (*release)(kvg_exchange *x);   /* both sides are done: the front frees x */
    /* Bytes of x's response that have left toward the client so far (a count that only
     * grows): the send timeout compares it across its period. */
    uint64_t (*progress)(kvg_exchange *x);
    /* The response made no progress for limits.send_timeout_ms; the handler has had on_abort.
     * End the stream (h2: RST_STREAM, or close the connection when its socket is what is
     * stuck; h1: close). */
    void (*abort_stalled)(kvg_exchange *x);
} kvg_exchange_ops;

struct kvg_exchange {
    /* --- request, filled by the front before on_head; arena-backed, read-only after --- */
    kvg_arena arena;
    kvg_exchange_proto proto;
    const char *method;
    const char *path;      /* including any query */
    const char *authority; /* Host or :authority, may be NULL */
    const char *scheme;    /* "http" or "https" */
    kvg_header *headers;
    size_t nheaders;
    int64_t content_length; /* -1 when not given */
    bool expect_continue;
    bool tls;
    char remote[64]; /* peer address for logs */
    char request_id[72];
    uint64_t start_ns; /* monotonic, first byte of the request head (the access log's wall time
                        * is derived from it when the line is written: one clock read less) */

    /* --- body, filled by the front after kvg_exchange_read_body --- */
    struct evbuffer *body;
    const char *body_bytes; /* kvg_exchange_body_bytes' answer, once asked for */
    size_t body_limit;
    bool body_complete;
    bool body_budgeted;     /* counted in the body budget (front listeners; not admin ones) */
    kvg_tenant *body_owner; /* referenced: whose share of the body budget the body counts in */
    uint64_t body_charged;  /* bytes counted in the body budget (and the owner's share) */
    uint64_t rate_start_ns; /* the minimum upload rate's current window */
    uint64_t rate_bytes;    /* body bytes that arrived in it */

    /* --- response --- */
    int status; /* 0 until a head is sent */
    kvg_header *resp_headers;
    size_t resp_nheaders;
    int64_t resp_content_length; /* -1: streamed */
    struct evbuffer *out;        /* bytes not yet handed to the front */
    kvg_exchange_resp resp;      /* where the response is */
    bool abort_delivered;        /* the handler got on_abort (or reset the response itself) */
    bool client_gone;            /* the client left before the response ended (logged 499) */
    bool front_done;             /* the protocol side has finished with x */
    bool handler_done;           /* the handler detached */
    bool want_writable;
    uint64_t bytes_in;
    uint64_t bytes_out;
    uint64_t first_byte_ns;  /* monotonic time the response head went out */
    struct event send_timer; /* armed while the handler waits for the client (output full) */
    bool send_timer_set;     /* send_timer assigned (on first use: most responses never wait) */
    uint64_t send_mark;      /* ops->progress() when the send timer was last armed */
    size_t out_charged;      /* response bytes counted in the response budget */

    /* --- for the access log and metrics, set by handlers --- */
    const char *worker_name; /* arena copy */
    const char *tenant;      /* arena copy, or NULL */
    const char *model;       /* the body's "model" (arena copy), or NULL */
    unsigned tries;          /* workers a request was sent to (0: none) */
    unsigned retries;
    const char *error_type; /* static string for errors the gateway generated */
    const char *error_code; /* static: the next error's "code" (kvg_exchange_set_error_code) */
    /* What the user felt (proxy.c, completions and chat 200 answers only). */
    uint64_t ttft_ns;        /* time to first token after start_ns; 0: no output seen */
    uint64_t output_events;  /* SSE events with output (0 for a JSON answer) */
    uint64_t output_span_ns; /* from the first output event to the last */
    int64_t output_tokens;   /* usage.completion_tokens, when have_output_tokens */
    bool have_output_tokens;

    /* --- binding --- */
    const kvg_exchange_ops *ops;
    void *proto_data; /* the front's per-stream state */
    const kvg_handler *handler;
    void *handler_state; /* the handler's per-request state */
    const kvg_exchange_env *env;
    kvg_thread *thread; /* for the handlers; the exchange itself never looks inside */
};

/** True once a response head went out (the response may have been cut since). */
static inline bool kvg_exchange_head_sent(const kvg_exchange *x)
{
    return x->status != 0;
}

/** Set up x for a new request on thread t, whose env x uses (the front calls this). */
int kvg_exchange_init(kvg_exchange *x, const kvg_exchange_env *env, kvg_thread *t,
                      kvg_exchange_proto proto, const kvg_exchange_ops *ops, void *proto_data);
/** Free what x owns (the front calls this from its release hook). */
void kvg_exchange_done(kvg_exchange *x);
/** A new exchange, set up as kvg_exchange_init does: from env's pool when it has one, else
 *  allocated. NULL when out of memory. */
kvg_exchange *kvg_exchange_new(const kvg_exchange_env *env, kvg_thread *t, kvg_exchange_proto proto,
                               const kvg_exchange_ops *ops, void *proto_data);
/** The end of an exchange from kvg_exchange_new: back to its pool (emptied) or freed. */
void kvg_exchange_free(kvg_exchange *x);

/** Value of a request header (case-insensitive name), or NULL. *len receives its length. */
const char *kvg_exchange_header(const kvg_exchange *x, const char *name, size_t *len);

/** Adopt the client's x-request-id when it is a sane token (printable ASCII, no quotes or
 *  backslashes, short enough), or generate one. The fronts call this once the head is in. */
void kvg_exchange_set_request_id(kvg_exchange *x);
/** Ask the front to receive the request body into x->body; on_body follows. */
void kvg_exchange_read_body(kvg_exchange *x);
/** Append request body bytes to x->body (the fronts' body callbacks). Copies with kvg_copy:
 *  evbuffer_add's memcpy is 20x slower for half the alignments on AMD EPYC (common/copy.c).
 *  Bytes past what is charged already are charged to the body budget first
 *  (kvg_exchange_body_charge), and the body must keep limits.body_min_rate over each window of
 *  limits.read_timeout_ms. 0, -ENOMEM, -ENOBUFS or KVG_ELIMIT (the budget, as for
 *  kvg_exchange_body_charge), -ETIMEDOUT (too slow): the front answers with
 *  kvg_exchange_send_body_error and reads no more of the body. */
int kvg_exchange_body_append(kvg_exchange *x, const void *data, size_t len);
/** The tenant whose share of the request-body budget x's body counts against (referenced
 *  until x is freed; NULL: none). Set it before kvg_exchange_read_body. */
void kvg_exchange_set_body_owner(kvg_exchange *x, kvg_tenant *t);
/** Count n more bytes of request body held for x in the gateway's body budget
 *  (limits.body_budget_mib) and in its owner's share of it (limits.tenant_body_share percent);
 *  both are given back when x is freed. 0; -ENOBUFS when the gateway's budget is spent (503),
 *  KVG_ELIMIT when the owner's share is (429); a refusal counts nothing, and is counted in
 *  kvgate_buffer_refusals_total (and the tenant's rate-limited counter). */
int kvg_exchange_body_charge(kvg_exchange *x, uint64_t n);
/** Answer a request whose body kvg_exchange_body_append or kvg_exchange_body_charge refused:
 *  503 with Retry-After (budget, memory), 429 with Retry-After (the tenant's share), 408 (too
 *  slow). Ends the response. */
void kvg_exchange_send_body_error(kvg_exchange *x, int rc);
/** The whole request body as one contiguous run of *len bytes ("" when empty): x->body's own
 *  bytes when they sit in one chain, else a copy in x->arena (made with kvg_copy, where
 *  evbuffer_pullup would use memcpy), made once: later calls return the same bytes. NULL when
 *  out of memory. Call once the body is complete. */
const char *kvg_exchange_body_bytes(kvg_exchange *x, size_t *len);
/** Add a response header (copied into the arena) before kvg_exchange_respond. */
int kvg_exchange_add_header(kvg_exchange *x, const char *name, size_t name_len, const char *value,
                            size_t value_len);
/** Send the response head. content_length -1 streams the body (chunked on HTTP/1.1). */
void kvg_exchange_respond(kvg_exchange *x, int status, int64_t content_length);
/** Queue body bytes (copied). */
void kvg_exchange_write(kvg_exchange *x, const void *data, size_t len);
/** The response is complete. */
void kvg_exchange_end(kvg_exchange *x);
/** Abort a response already under way (h2: RST_STREAM, h1: close the connection). */
void kvg_exchange_reset(kvg_exchange *x);
/** True when more than the high-water mark is queued toward the client, or more than the
 *  low-water mark while the responses of all exchanges together hold more than
 *  limits.response_budget_mib; the handler should stop producing until on_writable. While it waits,
 * the send timeout runs: a response that moves no byte toward the client for limits.send_timeout_ms
 * is aborted (on_abort, then the stream is reset or the connection closed) and logged with error
 * "send_timeout". */
bool kvg_exchange_output_full(kvg_exchange *x);
/** The handler is finished with x (after end, reset or on_abort); x may be freed now. */
void kvg_exchange_detach(kvg_exchange *x);

/** A complete JSON error response in the OpenAI shape:
 *  {"error":{"message":..,"type":..,"param":null,"code":..}}, code a string as OpenAI's API
 *  writes it: the one set by kvg_exchange_set_error_code, else the one docs/api.md lists for
 *  the status and type (kvg_error_code). Adds Retry-After when retry_after_s > 0. Ends the
 *  response. */
void kvg_exchange_send_error(kvg_exchange *x, int status, const char *type, const char *fmt, ...)
    KVG_PRINTF(4, 5);
void kvg_exchange_send_error_retry(kvg_exchange *x, int status, const char *type,
                                   unsigned retry_after_s, const char *message);
/** The "code" of the error x sends next, where status and type leave it open (a 404 for an
 *  unknown path is "unknown_url", one for a model "model_not_found"). code: a static string. */
static inline void kvg_exchange_set_error_code(kvg_exchange *x, const char *code)
{
    x->error_code = code;
}
/** The code an error of this status and type carries unless the handler chose one. */
const char *kvg_error_code(int status, const char *type);
/** A complete response with a body (copied). */
void kvg_exchange_send_body(kvg_exchange *x, int status, const char *content_type, const void *body,
                            size_t len);

/* Front helpers: deliver events to the handler, at most once, never after detach. */
void kvg_exchange_deliver_head(kvg_exchange *x);
void kvg_exchange_deliver_body(kvg_exchange *x);
void kvg_exchange_deliver_writable(kvg_exchange *x);
void kvg_exchange_deliver_abort(kvg_exchange *x);
/** The front is finished with x; frees it through ops->release once the handler detached. */
void kvg_exchange_front_finish(kvg_exchange *x);

#define KVG_EXCHANGE_HIGH_WATER (256u * 1024u)
#define KVG_EXCHANGE_LOW_WATER (64u * 1024u)

#endif
