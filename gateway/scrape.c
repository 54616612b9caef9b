/* SPDX-License-Identifier: Apache-2.0 */
/* Scraping of the engines' own load on the control thread: GET <scrape.path> on every worker
 * that is up, each interval; the vLLM queue and KV cache series of the page are stored on the
 * worker for the routing policy (router/engine_metrics.c). The GET itself is gateway/probe.c,
 * shared with the health checks. */
#include <errno.h>

#include "gateway_int.h"
#include "probe.h"

/* A metrics page bigger than this is not read: the scrape fails (vLLM's is tens of KiB). */
#define SCRAPE_BODY_MAX (1u << 20)

static struct event *tick_ev;
static kvg_link scrapes = {&scrapes, &scrapes};
static kvg_probe_spec spec;

/* Store the load or count the failure. */
static void scrape_done(kvg_gateway *gw, kvg_worker *w, const char *why, const char *body,
                        size_t len)
{
    if (!why) {
        kvg_engine_load load;
        if (kvg_engine_metrics_parse(body, len, &load) < 0 ||
            (!load.have_waiting && !load.have_kv_usage))
            why = "no vllm:num_requests_waiting or vllm:kv_cache_usage_perc in the page";
        else
            kvg_worker_set_engine_load(w, load.waiting, load.kv_usage, kvg_now_ns());
    }
    if (why) {
        kvg_worker_record_scrape_error(w);
        kvg_log_debug("scrape of %s failed: %s", kvg_worker_name(w), why);
    }
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
        /* The control thread's second slot, after the front threads' ones and the health
         * check's (main.c sizes the registry's slots for both). */
        if (kvg_worker_health_get(w) == KVG_WORKER_UP)
            kvg_probe_start(gw, w, gw->nthreads + 1, &spec, &scrapes);
    }
    kvg_worker_set_unref(set);
}

int kvg_scrape_start(kvg_gateway *gw)
{
    uint32_t ms = gw->cfg.scrape.interval_ms;
    if (!ms)
        return 0;
    spec = (kvg_probe_spec){
        .path = gw->cfg.scrape.path,
        /* text/plain asks prometheus_client for format 0.0.4 rather than OpenMetrics. */
        .headers = "user-agent: kvgate-scrape/1\r\naccept: text/plain\r\n",
        .timeout_ms = gw->cfg.scrape.timeout_ms,
        .body_max = SCRAPE_BODY_MAX,
        .error_status_msg = "metrics endpoint answered an error status",
        .too_large_msg = "metrics page over 1 MiB",
        .done = scrape_done,
    };
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
    kvg_probe_free_all(&scrapes);
}

uint64_t kvg_scrape_max_age_ns(const kvg_gateway *gw)
{
    /* Three intervals: a load survives two missed scrapes, then counts as unknown. */
    return (uint64_t)gw->cfg.scrape.interval_ms * 3 * 1000000u;
}
