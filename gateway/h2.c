/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP/2 front on nghttp2 (ssize_t callback API of 1.52): many exchanges per connection, flow
 * control coupled to the handlers through the exchange's output buffer, zero-copy DATA frames,
 * deferred flushing so that nghttp2 is never re-entered from its own callbacks. */
#include <errno.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "block_cache.h"
#include "conn.h"
#include "gateway_int.h"

/* Stop handing nghttp2 output to the socket buffer past this (the libevent example's value). */
#define H2_OUTPUT_THRESHOLD (64u * 1024u)
#define H2_STREAM_WINDOW (1u << 20)
#define H2_CONN_WINDOW (16u << 20)

typedef struct h2_conn h2_conn;

/* The request side of a stream. The response side is its exchange's (kvg_exchange_resp). */
typedef enum h2s_state {
    H2S_HEAD = 0, /* its header block is arriving */
    H2S_BODY,     /* the head is in; DATA may follow */
    H2S_COMPLETE, /* END_STREAM received: the whole request is in */
    H2S_CLOSED,   /* nghttp2 closed the stream; nothing more happens to it */
    H2S_STATE_COUNT,
} h2s_state;

static const char *h2s_state_str(h2s_state st)
{
    static const char *const names[H2S_STATE_COUNT] = {"head", "body", "complete", "closed"};
    return (unsigned)st < H2S_STATE_COUNT ? names[st] : "?";
}

typedef struct h2_stream {
    kvg_exchange x; /* first: the exchange ops recover the stream from it */
    h2_conn *h;
    int32_t id;
    kvg_link link;
    size_t head_bytes;
    bool head_too_large;
    h2s_state state;
    bool body_wanted;
    bool body_delivered;
    bool in_head_delivery;
    bool data_deferred; /* nghttp2 is waiting for resume_data */
    bool response_submitted;
    size_t buffered;     /* body bytes this stream holds, counted in the connection total */
    uint64_t bytes_sent; /* response body bytes handed to the socket (the send timeout's view) */
    struct event body_timer;
} h2_stream;

struct h2_conn {
    kvg_conn *conn;
    nghttp2_session *session;
    kvg_link streams;
    size_t nstreams;
    struct event flush_ev;
    bool flush_pending;
    bool goaway;
    h2_stream *in_head;   /* the stream whose header block is being received, if any */
    bool head_done;       /* a request head was complete on this connection */
    bool head_timer;      /* the connection timer is the deadline of an open header block */
    size_t body_buffered; /* request body bytes held by this connection's open streams */
};

static void h2_schedule_flush(h2_conn *h)
{
    if (h->flush_pending || h->conn->closing)
        return;
    h->flush_pending = true;
    event_active(&h->flush_ev, EV_WRITE, 0);
}

static h2_stream *stream_of(kvg_exchange *x)
{
    return (h2_stream *)(void *)x; /* x is the first member */
}

/* ---- exchange ops --------------------------------------------------------------------------- */

static void op_read_body(kvg_exchange *x)
{
    h2_stream *s = stream_of(x);
    if (s->body_wanted)
        return;
    s->body_wanted = true;
    /* Complete already and not inside on_head: deliver now. Inside on_head the caller of
     * deliver_head does it right after, so the handler never runs nested in itself. */
    if (s->state == H2S_COMPLETE && !s->in_head_delivery && !s->body_delivered) {
        s->body_delivered = true;
        kvg_exchange_deliver_body(x);
    }
}

static ssize_t data_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf,
                            size_t length, uint32_t *data_flags, nghttp2_data_source *source,
                            void *user_data)
{
    h2_stream *s = source->ptr;
    size_t avail = evbuffer_get_length(s->x.out);
    if (avail == 0) {
        if (s->x.resp == KVG_RESP_ENDED) {
            *data_flags |= NGHTTP2_DATA_FLAG_EOF;
            return 0;
        }
        s->data_deferred = true;
        return NGHTTP2_ERR_DEFERRED;
    }
    size_t n = KVG_MIN(avail, length);
    *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (s->x.resp == KVG_RESP_ENDED && n == avail)
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* The head is handed to nghttp2 without copies: names and values live in x's arena (or are
 * literals) until x is freed, which is after the stream closed, and nghttp2 reads them when it
 * packs the frame. x-request-id is unique per response: indexing it in the client's HPACK
 * table would only evict useful entries (NO_INDEX). Before: two snprintf and a copy of the
 * whole header block per response (callgrind, 2026-12-02). */
static void op_send_head(kvg_exchange *x)
{
    h2_stream *s = stream_of(x);
    h2_conn *h = s->h;
    if (s->state == H2S_CLOSED)
        return;
    size_t n = x->resp_nheaders + 2;
    nghttp2_nv *nva = kvg_arena_alloc(&x->arena, n * sizeof(*nva));
    char *status = kvg_arena_alloc(&x->arena, 4 + 24);
    if (!nva || !status) {
        nghttp2_submit_rst_stream(h->session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
        h2_schedule_flush(h);
        return;
    }
    const uint8_t keep = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE;
    unsigned code = (unsigned)((x->status % 1000 + 1000) % 1000);
    status[0] = (char)('0' + code / 100);
    status[1] = (char)('0' + code / 10 % 10);
    status[2] = (char)('0' + code % 10);
    status[3] = '\0';
    size_t k = 0;
    nva[k++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status, 7, 3, keep};
    for (size_t i = 0; i < x->resp_nheaders; i++) {
        kvg_header *hd = &x->resp_headers[i];
        uint8_t flags = keep;
        if (hd->name_len == 12 && memcmp(hd->name, "x-request-id", 12) == 0)
            flags |= NGHTTP2_NV_FLAG_NO_INDEX;
        nva[k++] = (nghttp2_nv){(uint8_t *)hd->name, (uint8_t *)hd->value, hd->name_len,
                                hd->value_len, flags};
    }
    if (x->resp_content_length >= 0) {
        char *clen = status + 4;
        size_t m = kvg_fmt_u64(clen, (uint64_t)x->resp_content_length);
        nva[k++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clen, 14, m, keep};
    }
    nghttp2_data_provider prd = {.source.ptr = s, .read_callback = data_read_cb};
    bool head = strcmp(x->method, "HEAD") == 0;
    int rv = nghttp2_submit_response(h->session, s->id, nva, k, head ? NULL : &prd);
    if (rv != 0) {
        kvg_log_debug("h2 submit_response on stream %d: %s", s->id, nghttp2_strerror(rv));
        nghttp2_submit_rst_stream(h->session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
    }
    s->response_submitted = true;
    h2_schedule_flush(h);
}

static void resume(h2_stream *s)
{
    if (s->state == H2S_CLOSED)
        return;
    if (strcmp(s->x.method, "HEAD") == 0) {
        evbuffer_drain(s->x.out, evbuffer_get_length(s->x.out));
        return;
    }
    if (s->data_deferred) {
        s->data_deferred = false;
        nghttp2_session_resume_data(s->h->session, s->id);
    }
    h2_schedule_flush(s->h);
}

static void op_send_data(kvg_exchange *x)
{
    resume(stream_of(x));
}

static void op_send_end(kvg_exchange *x)
{
    h2_stream *s = stream_of(x);
    resume(s);
}

static void op_reset(kvg_exchange *x)
{
    h2_stream *s = stream_of(x);
    if (s->state == H2S_CLOSED)
        return;
    nghttp2_submit_rst_stream(s->h->session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
    h2_schedule_flush(s->h);
}

static size_t op_pending(kvg_exchange *x)
{
    return evbuffer_get_length(x->out);
}

static void op_release(kvg_exchange *x)
{
    h2_stream *s = stream_of(x);
    event_del(&s->body_timer);
    kvg_exchange_done(x);
    kvg_block_free(s);
}

static uint64_t op_progress(kvg_exchange *x)
{
    return stream_of(x)->bytes_sent;
}

/* A stream whose client stopped reading. When the connection's socket is what is stuck, every
 * stream of it is, and a RST_STREAM could not even be sent: close the connection. Otherwise
 * the client holds this stream's flow-control window shut: reset the stream alone. */
static void op_abort_stalled(kvg_exchange *x)
{
    h2_stream *s = stream_of(x);
    kvg_conn *c = s->h->conn;
    if (evbuffer_get_length(c->sock.out) > 0) {
        kvg_conn_close(c);
        return;
    }
    if (s->state == H2S_CLOSED)
        return;
    nghttp2_submit_rst_stream(s->h->session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    h2_schedule_flush(s->h);
}

static const kvg_exchange_ops h2_ops = {
    .read_body = op_read_body,
    .send_head = op_send_head,
    .send_data = op_send_data,
    .send_end = op_send_end,
    .reset = op_reset,
    .pending = op_pending,
    .release = op_release,
    .progress = op_progress,
    .abort_stalled = op_abort_stalled,
};

/* ---- stream lifecycle ------------------------------------------------------------------------ */

static void stream_finish(h2_stream *s)
{
    h2_conn *h = s->h;
    if (s->state == H2S_CLOSED)
        return;
    kvg_log_debug("h2 stream %d of %s closed: request %s, response %s", s->id, h->conn->remote,
                  h2s_state_str(s->state), kvg_exchange_resp_str(s->x.resp));
    s->state = H2S_CLOSED;
    kvg_list_unlink(&s->link);
    h->nstreams--;
    if (h->in_head == s) {
        h->in_head = NULL;
        h->head_timer = false;
    }
    h->body_buffered -= s->buffered;
    s->buffered = 0;
    event_del(&s->body_timer);
    if (h->nstreams == 0 && !h->conn->closing)
        kvg_conn_set_timer(h->conn, h->conn->thread->gw->cfg.limits.idle_timeout_ms);
    kvg_exchange_front_finish(&s->x);
}

static void body_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    h2_stream *s = arg;
    h2_conn *h = s->h;
    if (s->state >= H2S_COMPLETE)
        return;
    h->conn->thread->gw->stats.timeouts++;
    kvg_exchange_deliver_abort(&s->x);
    if (!kvg_exchange_head_sent(&s->x))
        kvg_exchange_send_error(&s->x, 408, "invalid_request_error",
                                "timed out reading the request body");
    else
        nghttp2_submit_rst_stream(h->session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR);
    h2_schedule_flush(h);
}

static void arm_body_timer(h2_stream *s)
{
    uint32_t ms = s->h->conn->thread->gw->cfg.limits.read_timeout_ms;
    if (!ms)
        return;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    event_add(&s->body_timer, &tv);
}

static void deliver_body_if_ready(h2_stream *s)
{
    if (s->state == H2S_COMPLETE && s->body_wanted && !s->body_delivered) {
        s->body_delivered = true;
        kvg_exchange_deliver_body(&s->x);
    }
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    h2_conn *h = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    kvg_conn *c = h->conn;
    h2_stream *s = kvg_block_malloc(sizeof(*s)); /* a stream per request: kept per thread */
    if (!s)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    memset(s, 0, sizeof(*s));
    if (kvg_exchange_init(&s->x, &c->thread->exchange_env, c->thread, KVG_PROTO_HTTP2, &h2_ops, s) <
        0) {
        kvg_block_free(s);
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    s->h = h;
    s->id = frame->hd.stream_id;
    s->x.handler = c->listener->handler;
    s->x.tls = c->tls;
    s->x.scheme = c->tls ? "https" : "http";
    s->x.body_limit = c->thread->gw->cfg.limits.body_bytes;
    s->x.body_budgeted = !c->listener->is_admin;
    _Static_assert(sizeof(s->x.remote) == sizeof(c->remote), "one address size");
    memcpy(s->x.remote, c->remote, sizeof(s->x.remote));
    event_assign(&s->body_timer, c->thread->base, -1, 0, body_timeout_cb, s);
    kvg_list_insert(&h->streams, &s->link);
    h->nstreams++;
    h->in_head = s; /* read_cb times it if it is still open once the input is read */
    nghttp2_session_set_stream_user_data(session, s->id, s);
    return 0;
}

static int push_header(h2_stream *s, const uint8_t *name, size_t namelen, const uint8_t *value,
                       size_t valuelen)
{
    kvg_exchange *x = &s->x;
    size_t n = x->nheaders;
    if ((n & (n - 1)) == 0) {
        size_t cap = n ? n * 2 : 16;
        kvg_header *hs = kvg_arena_alloc(&x->arena, cap * sizeof(*hs));
        if (!hs)
            return -ENOMEM;
        if (n)
            memcpy(hs, x->headers, n * sizeof(*hs));
        x->headers = hs;
    }
    char *nm = kvg_arena_strndup(&x->arena, (const char *)name, namelen);
    char *val = kvg_arena_strndup(&x->arena, (const char *)value, valuelen);
    if (!nm || !val)
        return -ENOMEM;
    x->headers[n] = (kvg_header){nm, namelen, val, valuelen};
    x->nheaders = n + 1;
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data)
{
    h2_stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!s || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* trailers: not used by any OpenAI endpoint; ignored */
    s->head_bytes += namelen + valuelen + 32; /* RFC 9113 6.5.2 accounting */
    if (s->head_bytes > s->h->conn->thread->gw->cfg.limits.header_bytes) {
        s->head_too_large = true;
        return 0;
    }
    kvg_exchange *x = &s->x;
    if (namelen > 0 && name[0] == ':') {
        char *v = kvg_arena_strndup(&x->arena, (const char *)value, valuelen);
        if (!v)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        if (namelen == 7 && memcmp(name, ":method", 7) == 0)
            x->method = v;
        else if (namelen == 5 && memcmp(name, ":path", 5) == 0)
            x->path = v;
        else if (namelen == 10 && memcmp(name, ":authority", 10) == 0)
            x->authority = v;
        return 0;
    }
    if (push_header(s, name, namelen, value, valuelen) < 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return 0;
}

static void request_head_done(h2_stream *s, bool end_stream)
{
    kvg_exchange *x = &s->x;
    s->h->in_head = NULL;
    s->h->head_done = true;
    s->h->head_timer = false;
    kvg_conn_set_timer(s->h->conn, 0); /* streams are open: their own timers run */
    if (!x->method)
        x->method = "GET";
    if (!x->path)
        x->path = "/";
    if (!x->authority)
        x->authority = kvg_exchange_header(x, "host", NULL);
    size_t len;
    const char *cl = kvg_exchange_header(x, "content-length", &len);
    uint64_t v;
    if (cl && kvg_parse_u64(cl, len, &v) == 0 && v <= INT64_MAX)
        x->content_length = (int64_t)v;
    else if (end_stream)
        x->content_length = 0;
    kvg_exchange_set_request_id(x);
    s->state = end_stream ? H2S_COMPLETE : H2S_BODY;
    /* The answers below come from the front itself: the handler never sees this request, so
     * it will never detach, and an exchange with a handler attached is only released once it
     * has. Drop the handler (as h1_fail does for requests it answers itself) or the stream
     * leaks. */
    if (s->head_too_large ||
        (x->content_length > 0 && (uint64_t)x->content_length > x->body_limit) ||
        s->h->conn->thread->draining)
        x->handler = NULL;
    if (s->head_too_large) {
        kvg_exchange_send_error(x, 431, "invalid_request_error", "request header fields too large");
        return;
    }
    if (x->content_length > 0 && (uint64_t)x->content_length > x->body_limit) {
        kvg_exchange_send_error(x, 413, "invalid_request_error", "request body too large");
        return;
    }
    if (s->h->conn->thread->draining) {
        kvg_exchange_send_error_retry(x, 503, "service_unavailable", 1,
                                      "the gateway is shutting down");
        return;
    }
    if (!end_stream)
        arm_body_timer(s);
    s->in_head_delivery = true;
    kvg_exchange_deliver_head(x);
    s->in_head_delivery = false;
    deliver_body_if_ready(s);
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    h2_stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!s)
        return 0;
    bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    switch (frame->hd.type) {
    case NGHTTP2_HEADERS:
        if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
            request_head_done(s, end_stream);
            return 0;
        }
        break;
    case NGHTTP2_DATA:
        break;
    default:
        return 0;
    }
    if (end_stream && s->state < H2S_COMPLETE) {
        s->state = H2S_COMPLETE;
        event_del(&s->body_timer);
        deliver_body_if_ready(s);
    }
    return 0;
}

static int on_data_chunk_recv(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                              const uint8_t *data, size_t len, void *user_data)
{
    h2_stream *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!s)
        return 0;
    kvg_exchange *x = &s->x;
    x->bytes_in += len;
    if (x->bytes_in > x->body_limit) {
        /* The 413 goes out first; on_frame_send then resets the rest of the upload. */
        if (!kvg_exchange_head_sent(x)) {
            kvg_exchange_deliver_abort(x);
            kvg_exchange_send_error(x, 413, "invalid_request_error", "request body too large");
        }
        return 0;
    }
    if (kvg_exchange_head_sent(x))
        return 0; /* answered early: the rest of the upload is dropped */
    /* One connection's streams may hold at most two maximal bodies at once; without this,
     * streams_per_conn x body_bytes (8 GiB by default) could be pinned by a single client. */
    if (s->h->body_buffered + len > 2 * (size_t)x->body_limit) {
        kvg_exchange_deliver_abort(x);
        kvg_exchange_send_error_retry(x, 503, "overloaded", 1,
                                      "too many request body bytes in flight on this connection");
        return 0;
    }
    int rc = kvg_exchange_body_append(x, data, len);
    if (rc < 0) {
        /* As on HTTP/1.1: the stream gets its answer (503 budget or memory, 429 the tenant's
         * share, 408 too slow); on_frame_send then resets the rest of the upload. */
        kvg_exchange_deliver_abort(x);
        kvg_exchange_send_body_error(x, rc);
        return 0;
    }
    s->buffered += len;
    s->h->body_buffered += len;
    arm_body_timer(s);
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                           void *user_data)
{
    h2_stream *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!s)
        return 0;
    nghttp2_session_set_stream_user_data(session, stream_id, NULL);
    stream_finish(s);
    return 0;
}

/* A response that ended while the request body is still open (an early error): stop the upload
 * with RST_STREAM(NO_ERROR), as RFC 9113 8.1 allows, so the stream does not linger. */
static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    if ((frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) ||
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    h2_stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (s && s->state < H2S_COMPLETE)
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR);
    return 0;
}

static ssize_t send_cb(nghttp2_session *session, const uint8_t *data, size_t length, int flags,
                       void *user_data)
{
    h2_conn *h = user_data;
    struct evbuffer *out = h->conn->sock.out;
    if (evbuffer_get_length(out) >= H2_OUTPUT_THRESHOLD)
        return NGHTTP2_ERR_WOULDBLOCK;
    evbuffer_add(out, data, length);
    return (ssize_t)length;
}

static int send_data_cb(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *source, void *user_data)
{
    h2_conn *h = user_data;
    h2_stream *s = source->ptr;
    struct evbuffer *out = h->conn->sock.out;
    if (evbuffer_get_length(out) >= H2_OUTPUT_THRESHOLD)
        return NGHTTP2_ERR_WOULDBLOCK;
    evbuffer_add(out, framehd, 9);
    s->bytes_sent += length;
    /* No padding callback is set, so padlen is always 0; handled anyway for completeness. */
    if (frame->data.padlen > 0) {
        uint8_t pad = (uint8_t)(frame->data.padlen - 1);
        evbuffer_add(out, &pad, 1);
    }
    evbuffer_remove_buffer(s->x.out, out, length);
    if (frame->data.padlen > 1) {
        static const uint8_t zeros[256];
        evbuffer_add(out, zeros, frame->data.padlen - 1);
    }
    return 0;
}

static void deliver_writables(h2_conn *h)
{
    for (kvg_link *l = h->streams.next; l != &h->streams;) {
        h2_stream *s = KVG_CONTAINER_OF(l, h2_stream, link);
        l = l->next; /* the handler may finish s */
        if (s->x.want_writable && evbuffer_get_length(s->x.out) < KVG_EXCHANGE_LOW_WATER)
            kvg_exchange_deliver_writable(&s->x);
    }
}

/* Send what nghttp2 has queued, straight to the socket; close when neither side wants more.
 * Never called from inside an nghttp2 callback. */
static void h2_flush(h2_conn *h)
{
    kvg_conn *c = h->conn;
    h->flush_pending = false;
    if (c->closing)
        return;
    /* nghttp2 stops at the output threshold (WOULDBLOCK); when the socket takes it all at once
     * there is room again, so go round until the socket pushes back or nothing is left. */
    for (int round = 0; round < 16; round++) {
        int rv = nghttp2_session_send(h->session);
        if (rv != 0) {
            kvg_log_debug("h2 send to %s: %s", c->remote, nghttp2_strerror(rv));
            kvg_conn_close(c);
            return;
        }
        kvg_sock_flush(&c->sock);
        if (evbuffer_get_length(c->sock.out) > 0 || !nghttp2_session_want_write(h->session))
            break;
    }
    deliver_writables(h);
    if (evbuffer_get_length(c->sock.out) > 0)
        return; /* write_cb comes back when the socket drains */
    if (h->goaway ||
        (!nghttp2_session_want_read(h->session) && !nghttp2_session_want_write(h->session)))
        kvg_conn_close(c);
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    h2_flush(arg);
}

static void read_cb(kvg_sock *sock, void *arg)
{
    kvg_conn *c = arg;
    h2_conn *h = c->proto_state;
    struct evbuffer *in = sock->in;
    while (evbuffer_get_length(in) > 0 && !c->closing) {
        struct evbuffer_iovec vec;
        if (evbuffer_peek(in, -1, NULL, &vec, 1) < 1)
            break;
        ssize_t rv = nghttp2_session_mem_recv(h->session, vec.iov_base, vec.iov_len);
        if (rv < 0) {
            /* Garbage instead of the preface, or a fatal protocol error. nghttp2 has queued a
             * GOAWAY where the protocol asks for one; send it and go. */
            c->thread->gw->stats.protocol_errors++;
            kvg_log_debug("h2 from %s: %s", c->remote, nghttp2_strerror((int)rv));
            nghttp2_session_send(h->session);
            h->goaway = true;
            kvg_sock_read(sock, false);
            evbuffer_drain(in, evbuffer_get_length(in));
            sock->drain_notify = true; /* write_cb closes once the GOAWAY is out */
            kvg_sock_flush_soon(sock);
            if (evbuffer_get_length(sock->out) == 0)
                kvg_conn_close(c);
            else
                kvg_conn_linger(c);
            return;
        }
        evbuffer_drain(in, (size_t)rv);
    }
    /* While a header block is open the client may send nothing else on the connection, so one
     * that never ends would hold it for good. The first head runs on the connect's deadline
     * (conn.c), a later one gets the header timeout. Armed here rather than at every HEADERS
     * frame, so that a block that arrives whole costs no timer. */
    if (h->in_head && h->head_done && !h->head_timer && !c->closing) {
        h->head_timer = true;
        kvg_conn_set_timer(c, c->thread->gw->cfg.limits.header_timeout_ms);
    }
    kvg_sock_consumed(sock);
    h2_flush(h);
}

static void write_cb(kvg_sock *sock, void *arg)
{
    kvg_conn *c = arg;
    h2_conn *h = c->proto_state;
    if (h->goaway) {
        if (evbuffer_get_length(sock->out) == 0)
            kvg_conn_close(c);
        return;
    }
    h2_flush(h);
}

static void event_cb(kvg_sock *sock, int what, void *arg)
{
    kvg_conn_close(arg);
}

static void h2_free(kvg_conn *c)
{
    h2_conn *h = c->proto_state;
    if (!h)
        return;
    /* nghttp2_session_del calls no callbacks: finish every stream here. */
    while (!kvg_list_empty(&h->streams)) {
        h2_stream *s = KVG_CONTAINER_OF(h->streams.next, h2_stream, link);
        stream_finish(s);
    }
    event_del(&h->flush_ev);
    nghttp2_session_del(h->session);
    free(h);
    c->proto_state = NULL;
}

static void h2_drain(kvg_conn *c)
{
    h2_conn *h = c->proto_state;
    /* GOAWAY with the last stream we took: the client retries the rest elsewhere. */
    nghttp2_submit_goaway(h->session, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->session), NGHTTP2_NO_ERROR,
                          NULL, 0);
    if (h->nstreams == 0) {
        h->goaway = true;
        kvg_conn_linger(c);
    }
    h2_schedule_flush(h);
}

static void h2_timeout(kvg_conn *c)
{
    h2_conn *h = c->proto_state;
    if (h->in_head)
        c->thread->gw->stats.timeouts++; /* a header block begun and never finished */
    else if (h->nstreams > 0)
        return;
    nghttp2_submit_goaway(h->session, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->session), NGHTTP2_NO_ERROR,
                          NULL, 0);
    h->goaway = true;
    kvg_conn_linger(c);
    h2_schedule_flush(h);
}

static bool h2_busy(kvg_conn *c)
{
    h2_conn *h = c->proto_state;
    return h->nstreams > 0;
}

int kvg_h2_start(kvg_conn *c)
{
    h2_conn *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->conn = c;
    kvg_list_init(&h->streams);
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0) {
        free(h);
        return -ENOMEM;
    }
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_callbacks_set_send_data_callback(cbs, send_data_cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    nghttp2_option *opt = NULL;
    nghttp2_option_new(&opt);
    if (opt) {
        /* Bound the header table the peer can make us keep, and the total header block. */
        nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
        nghttp2_option_set_max_send_header_block_length(opt, 64 * 1024);
    }
    int rv = nghttp2_session_server_new3(&h->session, cbs, h, opt, kvg_block_cache_nghttp2_mem());
    nghttp2_session_callbacks_del(cbs);
    nghttp2_option_del(opt);
    if (rv != 0) {
        free(h);
        return -ENOMEM;
    }
    const kvg_front_limits *lim = &c->thread->gw->cfg.limits;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, lim->streams_per_conn},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_STREAM_WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)lim->header_bytes},
    };
    nghttp2_submit_settings(h->session, NGHTTP2_FLAG_NONE, iv, KVG_ARRAY_LEN(iv));
    nghttp2_session_set_local_window_size(h->session, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW);
    event_assign(&h->flush_ev, c->thread->base, -1, 0, flush_cb, h);
    c->proto = KVG_PROTO_HTTP2;
    c->proto_known = true;
    c->proto_state = h;
    c->proto_free = h2_free;
    c->proto_drain = h2_drain;
    c->proto_timeout = h2_timeout;
    c->proto_busy = h2_busy;
    c->sock.write_low = H2_OUTPUT_THRESHOLD / 2;
    c->sock.read_high = 256 * 1024;
    kvg_sock_set_callbacks(&c->sock, read_cb, write_cb, event_cb, c);
    kvg_sock_read(&c->sock, true);
    if (!c->listener->is_admin) /* the front's series: admin connections are not traffic */
        c->thread->gw->stats.connections_total[KVG_PROTO_HTTP2]++;
    /* The connect's header deadline (conn.c) runs on: the preface and the first request head
     * must be in within it; then the idle timeout applies between requests. */
    h2_schedule_flush(h);
    /* TLS may have decrypted the client's first bytes already. */
    if (evbuffer_get_length(c->sock.in) > 0)
        read_cb(&c->sock, c);
    return 0;
}
