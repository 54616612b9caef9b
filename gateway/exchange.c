/* SPDX-License-Identifier: Apache-2.0 */
/* Protocol-independent half of an exchange: header lookup, response helpers, the two-sided
 * lifetime (front and handler each release their hold), and error bodies. */
#include "exchange.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sock.h"
#include "tenancy.h"

/* Bodies of unknown length are charged ahead by at least this much, so that most chunks of
 * an upload cost no atomic operation. */
#define BODY_CHARGE_STEP ((uint64_t)16 * 1024)
/* A response's charge is moved in steps at least this large: SSE events are small and many,
 * and an atomic add for each would be most of their cost. */
#define OUTPUT_CHARGE_STEP (16u * 1024u)

int kvg_exchange_body_charge(kvg_exchange *x, uint64_t n)
{
    kvg_budget *b = x->env->body_budget;
    uint64_t used = atomic_fetch_add_explicit(&b->used, n, memory_order_relaxed);
    if (used + n > b->limit) {
        atomic_fetch_sub_explicit(&b->used, n, memory_order_relaxed);
        b->refused[0]++;
        return -ENOBUFS;
    }
    if (x->body_owner) {
        uint64_t share = b->limit / 100 * x->env->limits->tenant_body_share;
        if (!kvg_tenant_buffer_charge(x->body_owner, n, share)) {
            atomic_fetch_sub_explicit(&b->used, n, memory_order_relaxed);
            b->refused[1]++;
            kvg_tenant_record_refusal(x->body_owner, KVG_ADMIT_BUFFER);
            return KVG_ELIMIT;
        }
    }
    x->body_charged += n;
    return 0;
}

void kvg_exchange_set_body_owner(kvg_exchange *x, kvg_tenant *t)
{
    /* Only before anything is charged: the charge and its release must meet the same owner. */
    if (x->body_owner || x->body_charged || !t)
        return;
    x->body_owner = kvg_tenant_ref(t);
}

/* The minimum upload rate, checked as bytes arrive: once a window of read_timeout_ms has
 * passed, the bytes in it must average body_min_rate. The gap timer alone lets a client hold
 * a nearly complete body forever by sending a byte just before each timeout. */
static bool body_rate_ok(kvg_exchange *x, size_t len)
{
    const kvg_front_limits *lim = x->env->limits;
    if (!lim->body_min_rate)
        return true;
    uint64_t now = kvg_sock_clock_ns();
    if (!x->rate_start_ns)
        x->rate_start_ns = x->start_ns;
    uint64_t elapsed = now - x->rate_start_ns;
    if (elapsed >= (uint64_t)lim->read_timeout_ms * 1000000u) {
        if ((double)x->rate_bytes * 1e9 < (double)lim->body_min_rate * (double)elapsed)
            return false;
        x->rate_start_ns = now;
        x->rate_bytes = 0;
    }
    x->rate_bytes += len;
    return true;
}

int kvg_exchange_body_append(kvg_exchange *x, const void *data, size_t len)
{
    if (!len)
        return 0;
    if (!body_rate_ok(x, len))
        return -ETIMEDOUT;
    uint64_t held = evbuffer_get_length(x->body) + (uint64_t)len;
    if (x->body_budgeted && held > x->body_charged) {
        /* What arrived, rounded up to a step while the body limit leaves room for one. */
        uint64_t need = held - x->body_charged;
        uint64_t room = x->body_limit > x->body_charged ? x->body_limit - x->body_charged : 0;
        int rc = kvg_exchange_body_charge(x, KVG_MAX(need, KVG_MIN(BODY_CHARGE_STEP, room)));
        if (rc < 0)
            return rc;
    }
    struct evbuffer_iovec v; /* one vector: libevent guarantees it len contiguous bytes */
    if (evbuffer_reserve_space(x->body, (ev_ssize_t)len, &v, 1) != 1)
        return -ENOMEM;
    kvg_copy(v.iov_base, data, len);
    v.iov_len = len;
    return evbuffer_commit_space(x->body, &v, 1) < 0 ? -ENOMEM : 0;
}

const char *kvg_exchange_body_bytes(kvg_exchange *x, size_t *len)
{
    size_t n = evbuffer_get_length(x->body);
    *len = n;
    if (x->body_bytes)
        return x->body_bytes;
    if (!n)
        return "";
    struct evbuffer_iovec one;
    /* An explicit length: with -1, evbuffer_peek stops counting at the vectors it was given. */
    int chains = evbuffer_peek(x->body, (ev_ssize_t)n, NULL, &one, 1);
    if (chains == 1)
        return x->body_bytes = one.iov_base;
    struct evbuffer_iovec *vs = kvg_arena_alloc(&x->arena, (size_t)chains * sizeof(*vs));
    char *copy = kvg_arena_alloc(&x->arena, n);
    if (chains < 1 || !vs || !copy ||
        evbuffer_peek(x->body, (ev_ssize_t)n, NULL, vs, chains) != chains)
        return NULL;
    size_t at = 0;
    for (int i = 0; i < chains; i++) {
        kvg_copy(copy + at, vs[i].iov_base, vs[i].iov_len);
        at += vs[i].iov_len;
    }
    return x->body_bytes = copy;
}

const char *kvg_exchange_resp_str(kvg_exchange_resp r)
{
    static const char *const names[KVG_RESP_COUNT] = {"none", "streaming", "ended", "reset"};
    return (unsigned)r < KVG_RESP_COUNT ? names[r] : "?";
}

const char *kvg_exchange_proto_str(kvg_exchange_proto p)
{
    static const char *const names[KVG_PROTO_COUNT] = {"HTTP/1.1", "HTTP/2"};
    return p < KVG_PROTO_COUNT ? names[p] : "?";
}

/* The client has not taken a byte of this response for a whole period while the handler
 * waits for it: a reader that stopped (or never reads) would otherwise hold the worker's slot
 * and the upstream connection forever, since a paused upstream has no read timeout (nginx's
 * send_timeout). Progress of any size restarts the period. */
static void send_timeout_cb(evutil_socket_t fd, short what, void *arg);

static void arm_send_timer(kvg_exchange *x)
{
    if (!x->send_timer_set) {
        event_assign(&x->send_timer, x->env->base, -1, 0, send_timeout_cb, x);
        x->send_timer_set = true;
    }
    x->send_mark = x->ops->progress(x);
    uint32_t ms = x->env->limits->send_timeout_ms;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    event_add(&x->send_timer, &tv);
}

static void send_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_exchange *x = arg;
    if (x->resp == KVG_RESP_RESET || x->front_done || x->handler_done || !x->want_writable)
        return;
    const kvg_exchange_env *env = x->env;
    if (x->ops->progress(x) != x->send_mark) {
        arm_send_timer(x);
        return;
    }
    (*env->send_timeouts)++;
    (*env->timeouts)++;
    x->error_type = "send_timeout";
    kvg_log_info("request %s: the client took no response byte for %u ms; aborting it",
                 x->request_id, env->limits->send_timeout_ms);
    kvg_exchange_deliver_abort(x); /* frees the worker's slot and cancels its request now */
    x->resp = KVG_RESP_RESET;
    x->ops->abort_stalled(x);
}

/* The fields a new exchange starts with, besides its buffers and arena. */
static void setup(kvg_exchange *x, const kvg_exchange_env *env, kvg_thread *t,
                  kvg_exchange_proto proto, const kvg_exchange_ops *ops, void *proto_data)
{
    x->env = env;
    x->proto = proto;
    x->ops = ops;
    x->proto_data = proto_data;
    x->thread = t;
    x->content_length = -1;
    x->resp_content_length = -1;
    x->scheme = "http";
    x->start_ns = kvg_sock_clock_ns();
}

int kvg_exchange_init(kvg_exchange *x, const kvg_exchange_env *env, kvg_thread *t,
                      kvg_exchange_proto proto, const kvg_exchange_ops *ops, void *proto_data)
{
    memset(x, 0, sizeof(*x));
    kvg_arena_init(&x->arena, 4096);
    setup(x, env, t, proto, ops, proto_data);
    x->body = evbuffer_new();
    x->out = evbuffer_new();
    if (!x->body || !x->out) {
        kvg_exchange_done(x);
        return -ENOMEM;
    }
    return 0;
}

/* What x holds besides its buffers and its arena: timers, budget charges, the body's owner. */
static void release_holds(kvg_exchange *x)
{
    if (x->send_timer_set)
        event_del(&x->send_timer);
    x->send_timer_set = false;
    if (x->body_charged) {
        atomic_fetch_sub_explicit(&x->env->body_budget->used, x->body_charged,
                                  memory_order_relaxed);
        if (x->body_owner)
            kvg_tenant_buffer_release(x->body_owner, x->body_charged);
        x->body_charged = 0;
    }
    if (x->out_charged) {
        atomic_fetch_sub_explicit(&x->env->response_budget->used, x->out_charged,
                                  memory_order_relaxed);
        x->out_charged = 0;
    }
    if (x->body_owner)
        kvg_tenant_unref(x->body_owner);
    x->body_owner = NULL;
}

void kvg_exchange_done(kvg_exchange *x)
{
    release_holds(x);
    if (x->body)
        evbuffer_free(x->body);
    if (x->out)
        evbuffer_free(x->out);
    x->body = x->out = NULL;
    kvg_arena_done(&x->arena);
}

#define POOL_MAX 256u /* exchanges a thread keeps: its busiest moment's HTTP/1.1 connections */

kvg_exchange *kvg_exchange_new(const kvg_exchange_env *env, kvg_thread *t, kvg_exchange_proto proto,
                               const kvg_exchange_ops *ops, void *proto_data)
{
    kvg_exchange_pool *p = env->pool;
    if (p && p->head) {
        kvg_exchange *x = p->head;
        p->head = x->proto_data;
        p->n--;
        struct evbuffer *body = x->body, *out = x->out;
        kvg_arena arena = x->arena; /* reset when pooled: one chunk kept */
        memset(x, 0, sizeof(*x));
        x->body = body;
        x->out = out;
        x->arena = arena;
        x->arena.limit = 0;
        setup(x, env, t, proto, ops, proto_data);
        return x;
    }
    kvg_exchange *x = calloc(1, sizeof(*x));
    if (!x || kvg_exchange_init(x, env, t, proto, ops, proto_data) < 0) {
        free(x);
        return NULL;
    }
    return x;
}

void kvg_exchange_free(kvg_exchange *x)
{
    kvg_exchange_pool *p = x->env ? x->env->pool : NULL;
    if (!p || p->n >= POOL_MAX || !x->body || !x->out) {
        kvg_exchange_done(x);
        free(x);
        return;
    }
    release_holds(x);
    evbuffer_drain(x->body, evbuffer_get_length(x->body));
    evbuffer_drain(x->out, evbuffer_get_length(x->out));
    kvg_arena_reset(&x->arena);
    x->proto_data = p->head;
    p->head = x;
    p->n++;
}

void kvg_exchange_pool_drain(kvg_exchange_pool *p)
{
    while (p->head) {
        kvg_exchange *x = p->head;
        p->head = x->proto_data;
        kvg_exchange_done(x);
        free(x);
    }
    p->n = 0;
}

const char *kvg_exchange_header(const kvg_exchange *x, const char *name, size_t *len)
{
    size_t name_len = strlen(name);
    for (size_t i = 0; i < x->nheaders; i++) {
        if (kvg_strncaseeq(x->headers[i].name, x->headers[i].name_len, name, name_len)) {
            if (len)
                *len = x->headers[i].value_len;
            return x->headers[i].value;
        }
    }
    return NULL;
}

void kvg_exchange_set_request_id(kvg_exchange *x)
{
    size_t len;
    const char *id = kvg_exchange_header(x, "x-request-id", &len);
    bool ok = id && len > 0 && len < sizeof(x->request_id);
    for (size_t i = 0; ok && i < len; i++)
        ok = id[i] > 0x20 && id[i] < 0x7f && id[i] != '"' && id[i] != '\\';
    if (ok) {
        memcpy(x->request_id, id, len);
        x->request_id[len] = '\0';
    } else {
        x->env->request_id(x->env->ud, x->request_id, sizeof(x->request_id));
    }
}

void kvg_exchange_read_body(kvg_exchange *x)
{
    if (x->resp == KVG_RESP_RESET || x->front_done)
        return;
    x->ops->read_body(x);
}

int kvg_exchange_add_header(kvg_exchange *x, const char *name, size_t name_len, const char *value,
                            size_t value_len)
{
    if (kvg_exchange_head_sent(x))
        return -EINVAL;
    /* Grow the array in the arena by doubling; old arrays stay in the arena until the end. */
    size_t n = x->resp_nheaders;
    if ((n & (n - 1)) == 0) {
        size_t cap = n ? n * 2 : 8;
        kvg_header *h = kvg_arena_alloc(&x->arena, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        if (n)
            memcpy(h, x->resp_headers, n * sizeof(*h));
        x->resp_headers = h;
    }
    kvg_header *h = &x->resp_headers[n];
    /* Name and value in one allocation, each NUL-terminated. */
    if (name_len > SIZE_MAX / 2 || value_len > SIZE_MAX / 2)
        return -ENOMEM;
    char *nm = kvg_arena_alloc(&x->arena, name_len + value_len + 2);
    if (!nm)
        return -ENOMEM;
    char *val = nm + name_len + 1;
    kvg_copy_lower(nm, name, name_len);
    nm[name_len] = '\0';
    kvg_copy(val, value, value_len);
    val[value_len] = '\0';
    *h = (kvg_header){nm, name_len, val, value_len};
    x->resp_nheaders = n + 1;
    return 0;
}

void kvg_exchange_respond(kvg_exchange *x, int status, int64_t content_length)
{
    if (x->resp != KVG_RESP_NONE || x->front_done)
        return;
    x->status = status;
    x->resp_content_length = content_length;
    x->resp = KVG_RESP_STREAMING;
    x->first_byte_ns = kvg_sock_clock_ns();
    x->ops->send_head(x);
}

void kvg_exchange_write(kvg_exchange *x, const void *data, size_t len)
{
    if (x->resp != KVG_RESP_STREAMING || x->front_done || len == 0)
        return;
    evbuffer_add(x->out, data, len);
    x->bytes_out += len;
    x->ops->send_data(x);
}

void kvg_exchange_end(kvg_exchange *x)
{
    if (x->resp != KVG_RESP_STREAMING || x->front_done)
        return;
    x->resp = KVG_RESP_ENDED;
    x->ops->send_end(x);
}

void kvg_exchange_reset(kvg_exchange *x)
{
    if (x->resp == KVG_RESP_RESET || x->front_done)
        return;
    x->resp = KVG_RESP_RESET;
    x->abort_delivered = true; /* the handler asked for it: no on_abort back */
    x->ops->reset(x);
}

/* Move x's share of the response budget to what it has queued now, in steps. */
static void charge_output(kvg_exchange *x, size_t pending)
{
    size_t was = x->out_charged;
    _Atomic uint64_t *used = &x->env->response_budget->used;
    if (pending >= was + OUTPUT_CHARGE_STEP) {
        atomic_fetch_add_explicit(used, pending - was, memory_order_relaxed);
        x->out_charged = pending;
    } else if (was >= pending + OUTPUT_CHARGE_STEP || (pending == 0 && was)) {
        atomic_fetch_sub_explicit(used, was - pending, memory_order_relaxed);
        x->out_charged = pending;
    }
}

bool kvg_exchange_output_full(kvg_exchange *x)
{
    if (x->resp == KVG_RESP_RESET || x->front_done)
        return false;
    size_t pending = x->ops->pending(x);
    charge_output(x, pending);
    const kvg_budget *rb = x->env->response_budget;
    /* Past the response budget every response keeps only the low-water mark queued: the
     * producers slow to their clients' pace instead of memory growing with the clients that
     * read slowly. */
    if (pending > KVG_EXCHANGE_HIGH_WATER ||
        (pending > KVG_EXCHANGE_LOW_WATER &&
         atomic_load_explicit(&rb->used, memory_order_relaxed) > rb->limit)) {
        if (!x->want_writable) {
            x->want_writable = true;
            arm_send_timer(x);
        }
        return true;
    }
    return false;
}

static void maybe_release(kvg_exchange *x)
{
    if (x->front_done && x->handler_done) {
        x->env->finished(x->env->ud, x);
        x->ops->release(x);
    }
}

void kvg_exchange_detach(kvg_exchange *x)
{
    if (x->handler_done)
        return;
    x->handler_done = true;
    maybe_release(x);
}

void kvg_exchange_front_finish(kvg_exchange *x)
{
    if (x->front_done)
        return;
    x->front_done = true;
    if (!x->handler)
        x->handler_done = true;
    /* A handler still attached learns that the client is gone before x can go, unless it
     * finished the response itself (end or reset) and is about to detach anyway. Its detach
     * then releases x, possibly before on_abort returns: x must not be touched after it. */
    if (!x->handler_done && !x->abort_delivered && x->resp != KVG_RESP_ENDED) {
        x->client_gone = true;
        x->resp = KVG_RESP_RESET;
        x->abort_delivered = true;
        x->handler->on_abort(x);
        return;
    }
    maybe_release(x);
}

void kvg_exchange_deliver_head(kvg_exchange *x)
{
    if (x->handler && !x->handler_done && !x->abort_delivered)
        x->handler->on_head(x);
}

void kvg_exchange_deliver_body(kvg_exchange *x)
{
    x->body_complete = true;
    if (x->handler && !x->handler_done && !x->abort_delivered)
        x->handler->on_body(x);
}

void kvg_exchange_deliver_writable(kvg_exchange *x)
{
    if (!x->want_writable || x->handler_done || x->abort_delivered || !x->handler)
        return;
    x->want_writable = false;
    if (x->send_timer_set)
        event_del(&x->send_timer);
    charge_output(x, x->ops->pending(x));
    if (x->handler->on_writable)
        x->handler->on_writable(x);
}

void kvg_exchange_deliver_abort(kvg_exchange *x)
{
    if (x->abort_delivered || x->handler_done || !x->handler)
        return;
    x->abort_delivered = true;
    x->handler->on_abort(x);
}

void kvg_exchange_send_body(kvg_exchange *x, int status, const char *content_type, const void *body,
                            size_t len)
{
    if (x->resp != KVG_RESP_NONE || x->front_done)
        return;
    if (content_type)
        kvg_exchange_add_header(x, "content-type", 12, content_type, strlen(content_type));
    kvg_exchange_respond(x, status, (int64_t)len);
    kvg_exchange_write(x, body, len);
    kvg_exchange_end(x);
}

const char *kvg_error_code(int status, const char *type)
{
    /* By type first (each of these has one meaning), then by status for the generic ones. */
    static const struct {
        const char *type, *code;
    } by_type[] = {
        {"permission_error", "model_not_allowed"},
        {"not_found_error", "model_not_found"},
        {"rate_limit_error", "rate_limit_exceeded"},
        {"overloaded", "overloaded"},
        {"service_unavailable", "service_unavailable"},
        {"upstream_error", "upstream_error"},
        {"timeout", "upstream_timeout"},
        {"internal_error", "internal_error"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(by_type); i++)
        if (strcmp(type, by_type[i].type) == 0)
            return by_type[i].code;
    switch (status) {
    case 401:
        return "invalid_api_key";
    case 404:
        return "unknown_url";
    case 405:
        return "method_not_allowed";
    case 408:
        return "request_timeout";
    case 413:
        return "request_too_large";
    case 431:
        return "headers_too_large";
    case 505:
        return "http_version_not_supported";
    default:
        return status >= 500 ? "server_error" : "invalid_request";
    }
}

void kvg_exchange_send_error_retry(kvg_exchange *x, int status, const char *type,
                                   unsigned retry_after_s, const char *message)
{
    if (kvg_exchange_head_sent(x)) {
        /* Too late for a status: the only honest signal left is to cut the stream. */
        kvg_exchange_reset(x);
        return;
    }
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"error\":{\"message\":");
    kvg_buf_json_string(&b, message, strlen(message));
    kvg_buf_puts(&b, ",\"type\":");
    kvg_buf_json_string(&b, type, strlen(type));
    const char *code = x->error_code ? x->error_code : kvg_error_code(status, type);
    kvg_buf_puts(&b, ",\"param\":null,\"code\":");
    kvg_buf_json_string(&b, code, strlen(code));
    kvg_buf_puts(&b, "}}");
    x->error_type = type;
    /* Proxied responses carry the request id (proxy.c up_head); the gateway's own errors must
     * too, since a 502/503/504 is exactly the answer whose access-log line a client needs to
     * find. */
    if (x->request_id[0])
        kvg_exchange_add_header(x, "x-request-id", 12, x->request_id, strlen(x->request_id));
    if (retry_after_s) {
        char ra[16];
        int n = snprintf(ra, sizeof(ra), "%u", retry_after_s);
        kvg_exchange_add_header(x, "retry-after", 11, ra, (size_t)n);
    }
    if (b.failed)
        kvg_exchange_reset(x);
    else
        kvg_exchange_send_body(x, status, "application/json", b.data, b.len);
    kvg_buf_done(&b);
}

void kvg_exchange_send_body_error(kvg_exchange *x, int rc)
{
    switch (rc) {
    case -ENOBUFS:
        kvg_exchange_send_error_retry(x, 503, "overloaded", 1,
                                      "the gateway holds as many request bodies as its memory "
                                      "budget allows; retry shortly");
        break;
    case KVG_ELIMIT:
        kvg_exchange_send_error_retry(x, 429, "rate_limit_error", 1,
                                      "this API key's requests hold their whole share of the "
                                      "gateway's request-body budget; retry shortly");
        break;
    case -ETIMEDOUT:
        (*x->env->timeouts)++;
        kvg_exchange_send_error(x, 408, "invalid_request_error",
                                "the request body arrives too slowly (under %u bytes/s)",
                                x->env->limits->body_min_rate);
        break;
    default:
        kvg_exchange_send_error_retry(x, 503, "internal_error", 1,
                                      "out of memory for the request body");
        break;
    }
}

void kvg_exchange_send_error(kvg_exchange *x, int status, const char *type, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvg_exchange_send_error_retry(x, status, type, 0, msg);
}
