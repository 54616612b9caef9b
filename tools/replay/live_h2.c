/* SPDX-License-Identifier: Apache-2.0 */
/* Live mode's HTTP/2 client: a few cleartext connections (prior knowledge) to the gateway, each
 * an nghttp2 client session over a libevent bufferevent, carrying many concurrent streams.
 *
 * The session is driven the way nghttp2's libevent client example does it: bytes read are
 * handed to nghttp2_session_mem_recv, and nghttp2_session_mem_send's output is written to the
 * bufferevent while its output buffer is below a high-water mark (the write callback resumes
 * once it drains), so a large prompt leaves as fast as the gateway takes it and no faster.
 * Streams beyond the gateway's SETTINGS_MAX_CONCURRENT_STREAMS wait inside nghttp2. A failed
 * connection fails its streams (connection errors) and is freed from a deferred event, never
 * inside its own callback; the next request opens a new one in its place. */
#include "live.h"

#include <errno.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <nghttp2/nghttp2.h>

#define OUT_HIGH_WATER (1u << 20)

typedef struct h2conn {
    live_h2 *h;
    struct bufferevent *bev;
    nghttp2_session *session;
    kvg_link streams; /* live_req.link of the requests on it */
    bool dead;
    kvg_link dead_link; /* on live_h2.dead once dead, freed by the reaper */
} h2conn;

struct live_h2 {
    live_run *run;
    h2conn **conns; /* cfg.connections slots; NULL until first use or after a failure */
    size_t n, next;
    kvg_link dead;
    struct event reap;
};

static void conn_fail(h2conn *c, const char *why);

static void conn_free(h2conn *c)
{
    if (!c)
        return;
    if (c->session)
        nghttp2_session_del(c->session);
    if (c->bev)
        bufferevent_free(c->bev);
    free(c);
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    live_h2 *h = arg;
    (void)fd;
    (void)what;
    while (!kvg_list_empty(&h->dead)) {
        h2conn *c = KVG_CONTAINER_OF(h->dead.next, h2conn, dead_link);
        kvg_list_unlink(&c->dead_link);
        conn_free(c);
    }
}

/* Write what nghttp2 has, up to the high-water mark. */
static void conn_flush(h2conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    while (!c->dead && evbuffer_get_length(out) < OUT_HIGH_WATER) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(c->session, &data);
        if (n < 0) {
            conn_fail(c, nghttp2_strerror((int)n));
            return;
        }
        if (n == 0)
            break;
        if (bufferevent_write(c->bev, data, (size_t)n) < 0) {
            conn_fail(c, "out of memory");
            return;
        }
    }
    if (!c->dead && !nghttp2_session_want_read(c->session) &&
        !nghttp2_session_want_write(c->session) && evbuffer_get_length(out) == 0)
        conn_fail(c, "the gateway ended the HTTP/2 session");
}

static void conn_fail(h2conn *c, const char *why)
{
    if (c->dead)
        return;
    c->dead = true;
    live_h2 *h = c->h;
    for (size_t i = 0; i < h->n; i++)
        if (h->conns[i] == c)
            h->conns[i] = NULL;
    char buf[160];
    snprintf(buf, sizeof(buf), "HTTP/2 connection: %s", why);
    while (!kvg_list_empty(&c->streams)) {
        live_req *q = KVG_CONTAINER_OF(c->streams.next, live_req, link);
        kvg_list_unlink(&q->link);
        live_req_finish(q, LIVE_CONNECTION, buf);
    }
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    kvg_list_insert(&h->dead, &c->dead_link);
    event_active(&h->reap, EV_TIMEOUT, 1);
}

/* ---- nghttp2 callbacks ---------------------------------------------------------------------- */

static ssize_t read_body(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *source, void *user_data)
{
    live_req *q = source->ptr;
    (void)session;
    (void)stream_id;
    (void)user_data;
    if (q->finished)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* timed out: reset the stream */
    size_t n = KVG_MIN(length, q->body.len - q->body_sent);
    memcpy(buf, q->body.data + q->body_sent, n);
    q->body_sent += n;
    if (q->body_sent == q->body.len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data)
{
    (void)flags;
    (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    live_req *q = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!q || q->finished)
        return 0;
    if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
        int status = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            status = status * 10 + (value[i] - '0');
        if (status >= 200 || !q->status) /* 1xx heads are followed by the real one */
            live_req_status(q, status);
        return 0;
    }
    live_req_header(q, (const char *)name, namelen, (const char *)value, valuelen);
    return 0;
}

static int on_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
                   size_t len, void *user_data)
{
    (void)flags;
    (void)user_data;
    live_req *q = nghttp2_session_get_stream_user_data(session, stream_id);
    if (q)
        live_req_data(q, (const char *)data, len);
    return 0;
}

static int on_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                    void *user_data)
{
    (void)user_data;
    live_req *q = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!q)
        return 0;
    kvg_list_unlink(&q->link);
    if (error_code == NGHTTP2_NO_ERROR) {
        live_req_finish(q, LIVE_OK, NULL);
    } else {
        char buf[96];
        snprintf(buf, sizeof(buf), "stream reset: %s", nghttp2_http2_strerror(error_code));
        live_req_finish(q, LIVE_CONNECTION, buf);
    }
    return 0;
}

/* ---- bufferevent callbacks ------------------------------------------------------------------ */

static void on_read(struct bufferevent *bev, void *arg)
{
    h2conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    const unsigned char *data = evbuffer_pullup(in, -1);
    ssize_t n = nghttp2_session_mem_recv(c->session, data, len);
    if (n < 0) {
        conn_fail(c, nghttp2_strerror((int)n));
        return;
    }
    evbuffer_drain(in, (size_t)n);
    conn_flush(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    (void)bev;
    conn_flush(arg);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    h2conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return;
    }
    char buf[128];
    if (what & BEV_EVENT_EOF)
        snprintf(buf, sizeof(buf), "closed by the gateway");
    else
        snprintf(buf, sizeof(buf), "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    conn_fail(c, buf);
}

static int conn_new(live_h2 *h, h2conn **out)
{
    live_run *run = h->run;
    h2conn *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->h = h;
    kvg_list_init(&c->streams);
    kvg_list_init(&c->dead_link);
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        goto fail;
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
    int rc = nghttp2_session_client_new(&c->session, cbs, c);
    nghttp2_session_callbacks_del(cbs);
    if (rc != 0)
        goto fail;
    /* Big windows: an SSE stream never waits for our WINDOW_UPDATEs. */
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 24},
    };
    if (nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, KVG_ARRAY_LEN(iv)) != 0 ||
        nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, 1 << 28) != 0)
        goto fail;
    c->bev = bufferevent_socket_new(run->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev)
        goto fail;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&run->addr, (int)run->addrlen) < 0)
        goto fail;
    *out = c;
    return 0;
fail:
    conn_free(c);
    return -ENOMEM;
}

/* ---- the interface -------------------------------------------------------------------------- */

int live_h2_new(live_run *run, live_h2 **out)
{
    live_h2 *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->run = run;
    h->n = run->cfg->connections ? run->cfg->connections : 1;
    h->conns = calloc(h->n, sizeof(*h->conns));
    if (!h->conns) {
        free(h);
        return -ENOMEM;
    }
    kvg_list_init(&h->dead);
    event_assign(&h->reap, run->base, -1, 0, on_reap, h);
    *out = h;
    return 0;
}

void live_h2_send(live_h2 *h, live_req *q)
{
    size_t slot = h->next++ % h->n;
    if (!h->conns[slot] && conn_new(h, &h->conns[slot]) < 0) {
        live_req_finish(q, LIVE_CONNECTION, "cannot open an HTTP/2 connection");
        return;
    }
    h2conn *c = h->conns[slot];
    char clen[24];
    snprintf(clen, sizeof(clen), "%zu", q->body.len);
#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}
    nghttp2_nv hdrs[] = {
        NV(":method", "POST"),
        NV(":scheme", "http"),
        NV(":authority", h->run->host),
        NV(":path", h->run->path),
        NV("content-type", "application/json"),
        NV("accept", "text/event-stream"),
        NV("content-length", clen),
        NV("authorization", q->authorization ? q->authorization : ""),
    };
#undef NV
    size_t nh = KVG_ARRAY_LEN(hdrs) - (q->authorization ? 0 : 1);
    nghttp2_data_provider dp = {.source.ptr = q, .read_callback = read_body};
    int32_t id = nghttp2_submit_request(c->session, NULL, hdrs, nh, &dp, q);
    if (id < 0) {
        live_req_finish(q, LIVE_CONNECTION, nghttp2_strerror(id));
        return;
    }
    q->stream_id = id;
    q->conn = c;
    kvg_list_insert(c->streams.prev, &q->link);
    conn_flush(c);
}

void live_h2_cancel(live_h2 *h, live_req *q)
{
    (void)h;
    h2conn *c = q->conn;
    kvg_list_unlink(&q->link);
    if (!c || c->dead)
        return;
    nghttp2_session_set_stream_user_data(c->session, q->stream_id, NULL);
    nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, q->stream_id, NGHTTP2_CANCEL);
    conn_flush(c);
}

void live_h2_free(live_h2 *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n; i++)
        conn_free(h->conns[i]);
    on_reap(-1, 0, h);
    event_del(&h->reap);
    free(h->conns);
    free(h);
}
