/* SPDX-License-Identifier: Apache-2.0 */
/* Active health checks on the control thread: GET <health.path> on every worker each interval;
 * 2xx within the timeout is a success. The registry applies the fall/rise thresholds. */
#include <errno.h>
#include <http_parser.h>
#include <stdlib.h>
#include <string.h>

#include <event2/bufferevent.h>
#include <event2/dns.h>

#include "server.h"

typedef struct health_check {
    kvg_gateway *gw;
    kvg_worker *worker; /* referenced */
    struct bufferevent *bev;
    http_parser parser;
    struct event timer;
    struct event close_ev;
    kvg_link link;
    bool done;
} health_check;

static struct event *tick_ev;
static kvg_link checks = {&checks, &checks};

static void **check_slot(kvg_gateway *gw, kvg_worker *w)
{
    /* The control thread owns the slot after the front threads' ones. */
    return kvg_worker_thread_slot(w, gw->nthreads);
}

static void check_free_cb(evutil_socket_t fd, short what, void *arg)
{
    health_check *hc = arg;
    event_del(&hc->timer);
    event_del(&hc->close_ev);
    kvg_list_unlink(&hc->link);
    if (hc->bev)
        bufferevent_free(hc->bev);
    *check_slot(hc->gw, hc->worker) = NULL;
    kvg_worker_unref(hc->worker);
    free(hc);
}

static void check_done(health_check *hc, bool ok, const char *why)
{
    if (hc->done)
        return;
    hc->done = true;
    if (hc->bev)
        bufferevent_disable(hc->bev, EV_READ | EV_WRITE);
    event_del(&hc->timer);
    kvg_worker *w = hc->worker;
    if (kvg_worker_health_observe(w, ok)) {
        if (ok)
            kvg_log_info("worker %s is up", kvg_worker_name(w));
        else
            kvg_log_warn("worker %s is down: %s", kvg_worker_name(w), why);
    } else if (!ok) {
        kvg_log_debug("health check of %s failed: %s", kvg_worker_name(w), why);
    }
    event_active(&hc->close_ev, EV_READ, 0);
}

static int on_headers_complete(http_parser *p)
{
    health_check *hc = p->data;
    if (p->status_code >= 100 && p->status_code < 200)
        return 0;
    bool ok = p->status_code >= 200 && p->status_code < 300;
    check_done(hc, ok, ok ? "" : "health endpoint answered an error status");
    return 1; /* no need for the body */
}

static const http_parser_settings settings = {.on_headers_complete = on_headers_complete};

static void read_cb(struct bufferevent *bev, void *arg)
{
    health_check *hc = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!hc->done && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec vec;
        if (evbuffer_peek(in, -1, NULL, &vec, 1) < 1)
            break;
        size_t n = http_parser_execute(&hc->parser, &settings, vec.iov_base, vec.iov_len);
        evbuffer_drain(in, n);
        if (!hc->done && HTTP_PARSER_ERRNO(&hc->parser) != HPE_OK)
            check_done(hc, false, "malformed response");
    }
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    health_check *hc = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    check_done(hc, false, (what & BEV_EVENT_EOF) ? "connection closed" : "connection failed");
}

static void timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    check_done(arg, false, "timed out");
}

static void start_check(kvg_gateway *gw, kvg_worker *w)
{
    void **slot = check_slot(gw, w);
    if (*slot)
        return; /* the previous check is still running */
    health_check *hc = calloc(1, sizeof(*hc));
    if (!hc)
        return;
    kvg_thread *t = &gw->control;
    hc->gw = gw;
    hc->worker = kvg_worker_ref(w);
    kvg_list_insert(&checks, &hc->link);
    *slot = hc;
    http_parser_init(&hc->parser, HTTP_RESPONSE);
    hc->parser.data = hc;
    event_assign(&hc->timer, t->base, -1, 0, timeout_cb, hc);
    event_assign(&hc->close_ev, t->base, -1, 0, check_free_cb, hc);
    struct timeval tv = {gw->cfg.health.timeout_ms / 1000,
                         (gw->cfg.health.timeout_ms % 1000) * 1000};
    event_add(&hc->timer, &tv);
    hc->bev = bufferevent_socket_new(t->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!hc->bev) {
        check_done(hc, false, "out of memory");
        return;
    }
    bufferevent_setcb(hc->bev, read_cb, NULL, event_cb, hc);
    evbuffer_add_printf(bufferevent_get_output(hc->bev),
                        "GET %s HTTP/1.1\r\nhost: %s\r\nuser-agent: kvgate-health/%s\r\n"
                        "connection: close\r\n\r\n",
                        gw->cfg.health.path, kvg_worker_authority(w), "1");
    bufferevent_enable(hc->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect_hostname(hc->bev, t->dns, AF_UNSPEC, kvg_worker_host(w),
                                            kvg_worker_port(w)) < 0)
        check_done(hc, false, "cannot connect");
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_gateway *gw = arg;
    if (atomic_load(&gw->shutting_down))
        return;
    kvg_worker_set *set = kvg_registry_acquire(gw->registry);
    for (size_t i = 0; i < kvg_worker_set_count(set); i++)
        start_check(gw, kvg_worker_set_at(set, i));
    kvg_worker_set_unref(set);
}

int kvg_health_start(kvg_gateway *gw)
{
    tick_ev = event_new(gw->control.base, -1, EV_PERSIST, tick_cb, gw);
    if (!tick_ev)
        return -ENOMEM;
    uint32_t ms = gw->cfg.health.interval_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(tick_ev, &tv);
    /* First round right away, so a dead worker from the config is found before traffic. */
    event_active(tick_ev, EV_TIMEOUT, 0);
    return 0;
}

void kvg_health_stop(kvg_gateway *gw)
{
    if (tick_ev) {
        event_free(tick_ev);
        tick_ev = NULL;
    }
    /* Called after the control loop ended: free checks still in flight directly. */
    while (!kvg_list_empty(&checks))
        check_free_cb(-1, 0, KVG_CONTAINER_OF(checks.next, health_check, link));
}
