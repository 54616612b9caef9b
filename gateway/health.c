/* SPDX-License-Identifier: Apache-2.0 */
/* Active health checks on the control thread: GET <health.path> on every worker each interval;
 * 2xx within the timeout is a success. The registry applies the fall/rise thresholds. And the
 * gateway's own liveness: the control thread pings every front thread's loop each second, and
 * /healthz fails when one has not answered for KVG_LIVENESS_STALL_MS. */
#include <errno.h>
#include <stdio.h>

#include "gateway_int.h"
#include "probe.h"

static struct event *tick_ev;
static kvg_link checks = {&checks, &checks};
static kvg_probe_spec spec;
static struct event *ping_ev;

/* One ping a second: a front loop wakes once for it (an eventfd write) and stamps its
 * heartbeat; cheap next to the traffic, and a loop stuck for the stall time stands out. */
static void ping_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_gateway *gw = arg;
    for (unsigned i = 0; i < gw->nthreads; i++)
        kvg_thread_notify(&gw->threads[i]);
}

bool kvg_gateway_live(void *arg, char *why, size_t why_len)
{
    kvg_gateway *gw = arg;
    /* Threads leave their loops one by one while draining: that is not a failure. */
    if (atomic_load(&gw->shutting_down))
        return true;
    uint64_t now = kvg_now_ns();
    for (unsigned i = 0; i < gw->nthreads; i++) {
        uint64_t beat = atomic_load(&gw->threads[i].heartbeat_ns);
        if (now > beat && now - beat > (uint64_t)KVG_LIVENESS_STALL_MS * 1000000) {
            snprintf(why, why_len, "the event loop of front thread %u has not turned for %.1f s", i,
                     (double)(now - beat) / 1e9);
            return false;
        }
    }
    return true;
}

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
    ping_ev = event_new(gw->control.base, -1, EV_PERSIST, ping_cb, gw);
    if (!tick_ev || !ping_ev)
        return -ENOMEM;
    uint64_t now = kvg_now_ns();
    for (unsigned i = 0; i < gw->nthreads; i++)
        atomic_store(&gw->threads[i].heartbeat_ns, now); /* before the threads start */
    struct timeval second = {1, 0};
    event_add(ping_ev, &second);
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
    if (ping_ev) {
        event_free(ping_ev);
        ping_ev = NULL;
    }
    /* Called after the control loop ended: free checks still in flight directly. */
    kvg_probe_free_all(&checks);
}
