/* SPDX-License-Identifier: Apache-2.0 */
/* Live mode's HTTP/1.1 client: a pool of keep-alive connections driven by libevent's evhttp
 * client (the project's HTTP/1.1 client, as in kvgate-loadgen: no hand-written parser), one
 * request in flight on each. The pool grows as requests arrive while every connection is busy,
 * up to cfg.h1_max; past that, requests wait in arrival order for a free connection (their
 * TTFT, counted from the scheduled arrival, includes the wait).
 *
 * evhttp owns and frees a request after its completion callback, so a slot drops the pointer
 * there; waiting requests are started from a deferred event, never inside evhttp's callbacks. */
#include "live.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kvg_config.h"

#define MAX_HEADERS_BYTES (64u << 10)

typedef struct h1slot {
    live_h1 *h;
    struct evhttp_connection *evcon;
    live_req *q;                /* in flight, or NULL */
    struct evhttp_request *req; /* owned by evhttp; valid while q is */
    live_outcome err;           /* from the error callback; LIVE_OK when none */
    char errbuf[128];
    bool cancelling;
} h1slot;

struct live_h1 {
    live_run *run;
    h1slot *slots; /* cfg.h1_max of them, the first n opened */
    size_t n, cap;
    kvg_link pending; /* live_req.link, arrival order */
    struct event pump;
};

static void on_headers_done(h1slot *s, struct evhttp_request *req)
{
    live_req_status(s->q, evhttp_request_get_response_code(req));
    const struct evkeyvalq *hs = evhttp_request_get_input_headers(req);
    for (const struct evkeyval *kv = hs ? hs->tqh_first : NULL; kv; kv = kv->next.tqe_next)
        live_req_header(s->q, kv->key, strlen(kv->key), kv->value, strlen(kv->value));
}

static int on_headers(struct evhttp_request *req, void *arg)
{
    h1slot *s = arg;
    if (s->q)
        on_headers_done(s, req);
    return 0;
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    h1slot *s = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (!s->q) {
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    struct evbuffer_iovec vec[16];
    int nvec = evbuffer_peek(in, -1, NULL, vec, (int)KVG_ARRAY_LEN(vec));
    if (nvec > (int)KVG_ARRAY_LEN(vec)) {
        evbuffer_pullup(in, -1);
        nvec = evbuffer_peek(in, -1, NULL, vec, 1);
    }
    for (int i = 0; i < nvec; i++)
        live_req_data(s->q, vec[i].iov_base, vec[i].iov_len);
    /* evhttp drains what the chunk callback was shown. */
}

static void on_error(enum evhttp_request_error err, void *arg)
{
    h1slot *s = arg;
    int saved = errno;
    if (s->cancelling)
        return;
    s->err = err == EVREQ_HTTP_TIMEOUT ? LIVE_TIMEOUT : LIVE_CONNECTION;
    const char *what = err == EVREQ_HTTP_TIMEOUT          ? "no progress within --timeout-ms"
                       : err == EVREQ_HTTP_EOF            ? "connection closed early"
                       : err == EVREQ_HTTP_INVALID_HEADER ? "malformed response head"
                       : err == EVREQ_HTTP_DATA_TOO_LONG  ? "response too large or bad chunking"
                                                          : NULL;
    if (what)
        snprintf(s->errbuf, sizeof(s->errbuf), "HTTP/1.1: %s", what);
    else
        snprintf(s->errbuf, sizeof(s->errbuf), "HTTP/1.1: socket error: %s",
                 saved ? strerror(saved) : "unknown");
}

static void on_done(struct evhttp_request *req, void *arg)
{
    h1slot *s = arg;
    live_req *q = s->q;
    s->req = NULL;
    s->q = NULL;
    if (q) {
        if (!req || evhttp_request_get_response_code(req) == 0)
            live_req_finish(q, s->err != LIVE_OK ? s->err : LIVE_CONNECTION,
                            s->err != LIVE_OK ? s->errbuf : "HTTP/1.1: connect failed");
        else if (s->err != LIVE_OK)
            live_req_finish(q, s->err, s->errbuf);
        else
            live_req_finish(q, LIVE_OK, NULL);
    }
    event_active(&s->h->pump, EV_TIMEOUT, 1);
}

static int slot_open(live_h1 *h, h1slot *s)
{
    live_run *run = h->run;
    char addr[INET6_ADDRSTRLEN];
    uint16_t port;
    if (run->addr.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&run->addr;
        evutil_inet_ntop(AF_INET6, &a->sin6_addr, addr, sizeof(addr));
        port = ntohs(a->sin6_port);
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&run->addr;
        evutil_inet_ntop(AF_INET, &a->sin_addr, addr, sizeof(addr));
        port = ntohs(a->sin_port);
    }
    s->h = h;
    s->evcon = evhttp_connection_base_new(run->base, NULL, addr, port);
    if (!s->evcon)
        return -ENOMEM;
    evhttp_connection_set_timeout_tv(s->evcon, &run->timeout);
    evhttp_connection_set_retries(s->evcon, 0); /* a retried POST would be counted once */
    evhttp_connection_set_max_headers_size(s->evcon, MAX_HEADERS_BYTES);
    return 0;
}

static void start(h1slot *s, live_req *q)
{
    live_run *run = s->h->run;
    s->err = LIVE_OK;
    s->cancelling = false;
    struct evhttp_request *req = evhttp_request_new(on_done, s);
    if (!req) {
        live_req_finish(q, LIVE_CONNECTION, "out of memory");
        return;
    }
    evhttp_request_set_header_cb(req, on_headers);
    evhttp_request_set_chunked_cb(req, on_chunk);
    evhttp_request_set_error_cb(req, on_error);
    struct evkeyvalq *hs = evhttp_request_get_output_headers(req);
    int rc = evhttp_add_header(hs, "Host", run->host);
    rc |= evhttp_add_header(hs, "Content-Type", "application/json");
    rc |= evhttp_add_header(hs, "Accept", "text/event-stream");
    rc |= evhttp_add_header(hs, "User-Agent", "kvgate-replay/" KVG_VERSION);
    if (q->authorization)
        rc |= evhttp_add_header(hs, "Authorization", q->authorization);
    rc |= evbuffer_add(evhttp_request_get_output_buffer(req), q->body.data, q->body.len);
    if (rc != 0) {
        evhttp_request_free(req);
        live_req_finish(q, LIVE_CONNECTION, "out of memory");
        return;
    }
    kvg_buf_done(&q->body); /* evhttp has its copy */
    s->q = q;
    s->req = req;
    q->conn = s;
    if (evhttp_make_request(s->evcon, req, EVHTTP_REQ_POST, run->path) < 0) {
        /* As in kvgate-loadgen: libevent frees the request in some of these failures and not
         * in others, so it is left alone (a rare leak beats a double free). */
        s->q = NULL;
        s->req = NULL;
        live_req_finish(q, LIVE_CONNECTION, "HTTP/1.1: cannot open a connection");
    }
}

static void on_pump(evutil_socket_t fd, short what, void *arg)
{
    live_h1 *h = arg;
    (void)fd;
    (void)what;
    size_t i = 0;
    while (!kvg_list_empty(&h->pending)) {
        while (i < h->n && h->slots[i].q)
            i++;
        if (i == h->n) {
            if (h->n == h->cap)
                return;
            if (slot_open(h, &h->slots[h->n]) < 0) {
                live_req *q = KVG_CONTAINER_OF(h->pending.next, live_req, link);
                kvg_list_unlink(&q->link);
                live_req_finish(q, LIVE_CONNECTION, "cannot open an HTTP/1.1 connection");
                continue;
            }
            h->n++;
        }
        live_req *q = KVG_CONTAINER_OF(h->pending.next, live_req, link);
        kvg_list_unlink(&q->link);
        start(&h->slots[i], q);
    }
}

int live_h1_new(live_run *run, live_h1 **out)
{
    live_h1 *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->run = run;
    h->cap = run->cfg->h1_max ? run->cfg->h1_max : 1;
    h->slots = calloc(h->cap, sizeof(*h->slots));
    if (!h->slots) {
        free(h);
        return -ENOMEM;
    }
    kvg_list_init(&h->pending);
    event_assign(&h->pump, run->base, -1, 0, on_pump, h);
    *out = h;
    return 0;
}

void live_h1_send(live_h1 *h, live_req *q)
{
    kvg_list_insert(h->pending.prev, &q->link);
    on_pump(-1, 0, h);
}

void live_h1_cancel(live_h1 *h, live_req *q)
{
    (void)h;
    kvg_list_unlink(&q->link); /* still waiting: just leave the queue */
    h1slot *s = q->conn;
    if (!s || s->q != q || !s->req)
        return;
    s->cancelling = true;
    s->q = NULL;
    evhttp_cancel_request(s->req); /* frees it; the error callback sees `cancelling` */
    s->req = NULL;
    event_active(&h->pump, EV_TIMEOUT, 1);
}

void live_h1_free(live_h1 *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n; i++)
        if (h->slots[i].evcon)
            evhttp_connection_free(h->slots[i].evcon);
    event_del(&h->pump);
    free(h->slots);
    free(h);
}
