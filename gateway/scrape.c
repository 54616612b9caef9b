/* SPDX-License-Identifier: Apache-2.0 */
/* Scraping of the engines' own load on the control thread: GET <scrape.path> on every worker
 * that is up, each interval; the vLLM queue and KV cache series of the page are stored on the
 * worker for the routing policy (router/engine_metrics.c). Built like the health checks. */
#include <errno.h>
#include <http_parser.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <event2/bufferevent.h>
#include <event2/dns.h>

#include "server.h"

/* A metrics page bigger than this is not read: the scrape fails (vLLM's is tens of KiB). */
#define SCRAPE_BODY_MAX (1u << 20)

typedef struct scrape {
    kvg_gateway *gw;
    kvg_worker *worker; /* referenced */
    struct bufferevent *bev;
    http_parser parser;
    struct event timer;
    struct event close_ev;
    kvg_link link;
    kvg_buf body;
    bool done;
} scrape;

static struct event *tick_ev;
static kvg_link scrapes = {&scrapes, &scrapes};

static void **scrape_slot(kvg_gateway *gw, kvg_worker *w)
{
    /* The control thread's second slot, after the front threads' ones and the health check's
     * (main.c sizes the registry's slots for both). */
    return kvg_worker_thread_slot(w, gw->nthreads + 1);
}

static void scrape_free_cb(evutil_socket_t fd, short what, void *arg)
{
    scrape *s = arg;
    event_del(&s->timer);
    event_del(&s->close_ev);
    kvg_list_unlink(&s->link);
    if (s->bev)
        bufferevent_free(s->bev);
    void **slot = scrape_slot(s->gw, s->worker);
    if (slot)
        *slot = NULL;
    kvg_worker_unref(s->worker);
    kvg_buf_done(&s->body);
    free(s);
}

/* The end of one scrape: store the load or count the failure, then free it from a deferred
 * event (this runs inside the bufferevent's and the parser's callbacks). */
static void scrape_done(scrape *s, const char *why)
{
    if (s->done)
        return;
    s->done = true;
    if (s->bev)
        bufferevent_disable(s->bev, EV_READ | EV_WRITE);
    event_del(&s->timer);
    kvg_worker *w = s->worker;
    if (!why) {
        kvg_engine_load load;
        if (kvg_engine_metrics_parse(s->body.data, s->body.len, &load) < 0 ||
            (!load.have_waiting && !load.have_kv_usage))
            why = "no vllm:num_requests_waiting or vllm:kv_cache_usage_perc in the page";
        else
            kvg_worker_set_engine_load(w, load.waiting, load.kv_usage, kvg_now_ns());
    }
    if (why) {
        kvg_worker_record_scrape_error(w);
        kvg_log_debug("scrape of %s failed: %s", kvg_worker_name(w), why);
    }
    event_active(&s->close_ev, EV_READ, 0);
}

static int on_headers_complete(http_parser *p)
{
    scrape *s = p->data;
    if (p->status_code >= 100 && p->status_code < 200)
        return 0;
    if (p->status_code < 200 || p->status_code >= 300) {
        scrape_done(s, "metrics endpoint answered an error status");
        return 1;
    }
    if (p->content_length != ULLONG_MAX && p->content_length > SCRAPE_BODY_MAX) {
        scrape_done(s, "metrics page over 1 MiB");
        return 1;
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    scrape *s = p->data;
    if (s->done)
        return -1;
    if (len > SCRAPE_BODY_MAX - s->body.len) {
        scrape_done(s, "metrics page over 1 MiB");
        return -1;
    }
    kvg_buf_append(&s->body, at, len);
    if (s->body.failed) {
        scrape_done(s, "out of memory");
        return -1;
    }
    return 0;
}

static int on_message_complete(http_parser *p)
{
    scrape *s = p->data;
    scrape_done(s, NULL);
    return 1; /* one response per connection */
}

static const http_parser_settings settings = {
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void read_cb(struct bufferevent *bev, void *arg)
{
    scrape *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!s->done && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec vec;
        if (evbuffer_peek(in, -1, NULL, &vec, 1) < 1)
            break;
        size_t n = http_parser_execute(&s->parser, &settings, vec.iov_base, vec.iov_len);
        evbuffer_drain(in, n);
        if (!s->done && HTTP_PARSER_ERRNO(&s->parser) != HPE_OK)
            scrape_done(s, "malformed response");
    }
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    scrape *s = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if ((what & BEV_EVENT_EOF) && !s->done) {
        read_cb(bev, s);
        /* A body delimited by the end of the connection completes here. */
        if (!s->done)
            http_parser_execute(&s->parser, &settings, NULL, 0);
    }
    scrape_done(s, (what & BEV_EVENT_EOF) ? "connection closed before the end of the page"
                                          : "connection failed");
}

static void timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    scrape_done(arg, "timed out");
}

static void start_scrape(kvg_gateway *gw, kvg_worker *w)
{
    void **slot = scrape_slot(gw, w);
    if (!slot || *slot)
        return; /* the previous scrape is still running */
    scrape *s = calloc(1, sizeof(*s));
    if (!s)
        return;
    kvg_thread *t = &gw->control;
    s->gw = gw;
    s->worker = kvg_worker_ref(w);
    kvg_buf_init(&s->body);
    kvg_list_insert(&scrapes, &s->link);
    *slot = s;
    http_parser_init(&s->parser, HTTP_RESPONSE);
    s->parser.data = s;
    event_assign(&s->timer, t->base, -1, 0, timeout_cb, s);
    event_assign(&s->close_ev, t->base, -1, 0, scrape_free_cb, s);
    uint32_t ms = gw->cfg.scrape.timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(&s->timer, &tv);
    s->bev = bufferevent_socket_new(t->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!s->bev) {
        scrape_done(s, "out of memory");
        return;
    }
    bufferevent_setcb(s->bev, read_cb, NULL, event_cb, s);
    /* text/plain asks prometheus_client for format 0.0.4 rather than OpenMetrics. */
    evbuffer_add_printf(bufferevent_get_output(s->bev),
                        "GET %s HTTP/1.1\r\nhost: %s\r\nuser-agent: kvgate-scrape/1\r\n"
                        "accept: text/plain\r\nconnection: close\r\n\r\n",
                        gw->cfg.scrape.path, kvg_worker_authority(w));
    bufferevent_enable(s->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect_hostname(s->bev, t->dns, AF_UNSPEC, kvg_worker_host(w),
                                            kvg_worker_port(w)) < 0)
        scrape_done(s, "cannot connect");
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_gateway *gw = arg;
    if (atomic_load(&gw->shutting_down))
        return;
    kvg_worker_set *set = kvg_registry_acquire(gw->registry);
    for (size_t i = 0; i < kvg_worker_set_count(set); i++) {
        kvg_worker *w = kvg_worker_set_at(set, i);
        /* A worker marked down gets no requests: its load does not matter until it is up. */
        if (kvg_worker_health_get(w) == KVG_WORKER_UP)
            start_scrape(gw, w);
    }
    kvg_worker_set_unref(set);
}

int kvg_scrape_start(kvg_gateway *gw)
{
    uint32_t ms = gw->cfg.scrape.interval_ms;
    if (!ms)
        return 0;
    tick_ev = event_new(gw->control.base, -1, EV_PERSIST, tick_cb, gw);
    if (!tick_ev)
        return -ENOMEM;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(tick_ev, &tv);
    event_active(tick_ev, EV_TIMEOUT, 0);
    return 0;
}

void kvg_scrape_stop(kvg_gateway *gw)
{
    (void)gw;
    if (tick_ev) {
        event_free(tick_ev);
        tick_ev = NULL;
    }
    /* Called after the control loop ended too: free scrapes still in flight directly. */
    while (!kvg_list_empty(&scrapes))
        scrape_free_cb(-1, 0, KVG_CONTAINER_OF(scrapes.next, scrape, link));
}

uint64_t kvg_scrape_max_age_ns(const kvg_gateway *gw)
{
    /* Three intervals: a load survives two missed scrapes, then counts as unknown. */
    return (uint64_t)gw->cfg.scrape.interval_ms * 3 * 1000000u;
}
