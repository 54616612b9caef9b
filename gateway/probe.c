/* SPDX-License-Identifier: Apache-2.0 */
/* One GET to a worker on the control thread, for health checks and engine-load scrapes: connect
 * (async DNS), send, parse the response with http_parser, keep the body up to a limit, and call
 * back once with the outcome. */
#include <errno.h>
#include <http_parser.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <event2/bufferevent.h>
#include <event2/dns.h>

#include "gateway_int.h"
#include "probe.h"

struct kvg_probe {
    kvg_gateway *gw;
    kvg_worker *worker; /* referenced */
    unsigned slot;      /* the worker's thread slot that points at this probe */
    const kvg_probe_spec *spec;
    struct bufferevent *bev;
    http_parser parser;
    struct event timer;
    struct event close_ev;
    kvg_link link;
    kvg_buf body;
    bool done;
    bool connected; /* the TCP connect finished */
};

static void probe_free_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_probe *p = arg;
    event_del(&p->timer);
    event_del(&p->close_ev);
    kvg_list_unlink(&p->link);
    if (p->bev)
        bufferevent_free(p->bev);
    void **slot = kvg_worker_thread_slot(p->worker, p->slot);
    if (slot)
        *slot = NULL;
    kvg_worker_unref(p->worker);
    kvg_buf_done(&p->body);
    free(p);
}

/* The end of one probe: tell the owner, then free it from a deferred event (this runs inside
 * the bufferevent's and the parser's callbacks). */
static void probe_done(kvg_probe *p, const char *why)
{
    if (p->done)
        return;
    p->done = true;
    if (p->bev)
        bufferevent_disable(p->bev, EV_READ | EV_WRITE);
    event_del(&p->timer);
    p->spec->done(p->gw, p->worker, why, p->body.data, p->body.len);
    event_active(&p->close_ev, EV_READ, 0);
}

/* A probe that could not open its socket for the gateway's own shortage of descriptors or
 * memory: that says nothing about the worker, so it ends without an outcome (the next round
 * tries again) rather than counting against the worker's health. */
static bool local_shortage(int err)
{
    return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

static void probe_abandon(kvg_probe *p, int err)
{
    if (p->done)
        return;
    p->done = true;
    kvg_log_debug("probe of %s not sent: %s", kvg_worker_name(p->worker), strerror(err));
    if (p->bev)
        bufferevent_disable(p->bev, EV_READ | EV_WRITE);
    event_del(&p->timer);
    event_active(&p->close_ev, EV_READ, 0);
}

static int on_headers_complete(http_parser *hp)
{
    kvg_probe *p = hp->data;
    if (hp->status_code >= 100 && hp->status_code < 200)
        return 0;
    if (hp->status_code < 200 || hp->status_code >= 300) {
        probe_done(p, p->spec->error_status_msg);
        return 1;
    }
    if (!p->spec->body_max) {
        probe_done(p, NULL); /* the status is all this probe wants */
        return 1;
    }
    if (hp->content_length != ULLONG_MAX && hp->content_length > p->spec->body_max) {
        probe_done(p, p->spec->too_large_msg);
        return 1;
    }
    return 0;
}

static int on_body(http_parser *hp, const char *at, size_t len)
{
    kvg_probe *p = hp->data;
    if (p->done)
        return -1;
    if (len > p->spec->body_max - p->body.len) {
        probe_done(p, p->spec->too_large_msg);
        return -1;
    }
    kvg_buf_append(&p->body, at, len);
    if (p->body.failed) {
        probe_done(p, "out of memory");
        return -1;
    }
    return 0;
}

static int on_message_complete(http_parser *hp)
{
    if (hp->status_code < 200)
        return 0; /* a 100 Continue ends before the real answer: parse on */
    probe_done(hp->data, NULL);
    return 1; /* one response per connection */
}

static const http_parser_settings settings = {
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void read_cb(struct bufferevent *bev, void *arg)
{
    kvg_probe *p = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!p->done && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec vec;
        if (evbuffer_peek(in, -1, NULL, &vec, 1) < 1)
            break;
        size_t n = http_parser_execute(&p->parser, &settings, vec.iov_base, vec.iov_len);
        evbuffer_drain(in, n);
        if (!p->done && HTTP_PARSER_ERRNO(&p->parser) != HPE_OK)
            probe_done(p, "malformed response");
    }
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    kvg_probe *p = arg;
    if (what & BEV_EVENT_CONNECTED) {
        p->connected = true;
        return;
    }
    int err = EVUTIL_SOCKET_ERROR();
    if ((what & BEV_EVENT_ERROR) && !p->connected && local_shortage(err)) {
        probe_abandon(p, err);
        return;
    }
    if ((what & BEV_EVENT_EOF) && !p->done) {
        read_cb(bev, p);
        /* A body delimited by the end of the connection completes here. */
        if (!p->done)
            http_parser_execute(&p->parser, &settings, NULL, 0);
    }
    probe_done(p, (what & BEV_EVENT_EOF) ? "connection closed before the end of the response"
                                         : "connection failed");
}

static void timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    probe_done(arg, "timed out");
}

void kvg_probe_start(kvg_gateway *gw, kvg_worker *w, unsigned slot, const kvg_probe_spec *spec,
                     kvg_link *list)
{
    void **sp = kvg_worker_thread_slot(w, slot);
    if (!sp || *sp)
        return; /* the previous probe of this kind is still running */
    kvg_probe *p = calloc(1, sizeof(*p));
    if (!p)
        return;
    kvg_thread *t = &gw->control;
    p->gw = gw;
    p->worker = kvg_worker_ref(w);
    p->slot = slot;
    p->spec = spec;
    kvg_buf_init(&p->body);
    kvg_list_insert(list, &p->link);
    *sp = p;
    http_parser_init(&p->parser, HTTP_RESPONSE);
    p->parser.data = p;
    event_assign(&p->timer, t->base, -1, 0, timeout_cb, p);
    event_assign(&p->close_ev, t->base, -1, 0, probe_free_cb, p);
    struct timeval tv = {spec->timeout_ms / 1000, (spec->timeout_ms % 1000) * 1000};
    event_add(&p->timer, &tv);
    p->bev = bufferevent_socket_new(t->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!p->bev) {
        probe_done(p, "out of memory");
        return;
    }
    bufferevent_setcb(p->bev, read_cb, NULL, event_cb, p);
    evbuffer_add_printf(bufferevent_get_output(p->bev),
                        "GET %s HTTP/1.1\r\nhost: %s\r\n%sconnection: close\r\n\r\n", spec->path,
                        kvg_worker_authority(w), spec->headers ? spec->headers : "");
    bufferevent_enable(p->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect_hostname(p->bev, t->dns, AF_UNSPEC, kvg_worker_host(w),
                                            kvg_worker_port(w)) < 0) {
        int err = EVUTIL_SOCKET_ERROR();
        if (local_shortage(err))
            probe_abandon(p, err);
        else
            probe_done(p, "cannot connect");
    }
}

void kvg_probe_free_all(kvg_link *list)
{
    while (!kvg_list_empty(list))
        probe_free_cb(-1, 0, KVG_CONTAINER_OF(list->next, kvg_probe, link));
}
