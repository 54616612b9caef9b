/* SPDX-License-Identifier: Apache-2.0 */
/* Active health checks on the control thread: GET <health.path> on every worker each interval;
 * 2xx within the timeout is a success. The registry applies the fall/rise thresholds. */
#include <errno.h>

#include "gateway_int.h"
#include "probe.h"

static struct event *tick_ev;
static kvg_link checks = {&checks, &checks};
static kvg_probe_spec spec;

static void check_done(kvg_gateway *gw, kvg_worker *w, const char *why, const char *body,
                       size_t len)
{
    bool ok = why == NULL;
    if (kvg_worker_health_observe(w, ok)) {
        if (ok)
            kvg_log_info("worker %s is up", kvg_worker_name(w));
        else
            kvg_log_warn("worker %s is down: %s", kvg_worker_name(w), why);
    } else if (!ok) {
        kvg_log_debug("health check of %s failed: %s", kvg_worker_name(w), why);
    }
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_gateway *gw = arg;
    if (atomic_load(&gw->shutting_down))
        return;
    kvg_worker_set *set = kvg_registry_acquire(gw->registry);
    /* The control thread owns the slot after the front threads' ones. */
    for (size_t i = 0; i < kvg_worker_set_count(set); i++)
        kvg_probe_start(gw, kvg_worker_set_at(set, i), gw->nthreads, &spec, &checks);
    kvg_worker_set_unref(set);
}

int kvg_health_start(kvg_gateway *gw)
{
    spec = (kvg_probe_spec){
        .path = gw->cfg.health.path,
        .headers = "user-agent: kvgate-health/1\r\n",
        .timeout_ms = gw->cfg.health.timeout_ms,
        .body_max = 0,
        .error_status_msg = "health endpoint answered an error status",
        .done = check_done,
    };
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
    kvg_probe_free_all(&checks);
}
