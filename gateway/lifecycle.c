/* SPDX-License-Identifier: Apache-2.0 */
/* The limits a gateway derives at start, and the shutdown sequence, run on the control thread:
 * drain every front thread, wait for them up to the deadline, then force the rest closed and
 * stop the control loop. */
#include "gateway_int.h"
#include "probe.h"

/* The front connection limit: configured, or half of what the descriptors leave after a
 * reserve for the admin listener, the threads' own descriptors, probes and files, since every
 * front connection may hold a connection to a worker as well. */
static uint32_t front_connection_limit(const kvg_gateway *gw, uint64_t nofile)
{
    uint64_t reserve =
        64 + gw->cfg.admin_max_connections + 8ull * (gw->nthreads + 1) * (gw->cfg.nlisteners + 1);
    uint64_t usable = nofile > 2 * reserve ? (nofile - reserve) / 2 : nofile / 4;
    if (usable < 1)
        usable = 1;
    uint64_t limit = gw->cfg.limits.max_connections ? gw->cfg.limits.max_connections : usable;
    if (gw->cfg.limits.max_connections && limit > usable)
        kvg_log_warn("limits.max_connections %llu is more than the descriptor limit %llu "
                     "leaves room for (about %llu): accepts may fail for want of descriptors "
                     "before it is reached",
                     (unsigned long long)limit, (unsigned long long)nofile,
                     (unsigned long long)usable);
    limit = KVG_MIN(limit, (uint64_t)UINT32_MAX);
    kvg_log_info("front connections limited to %llu (%s)", (unsigned long long)limit,
                 gw->cfg.limits.max_connections ? "limits.max_connections"
                                                : "from the descriptor limit");
    return (uint32_t)limit;
}

void kvg_gateway_init_limits(kvg_gateway *gw, uint64_t nofile)
{
    gw->max_connections = front_connection_limit(gw, nofile);
    gw->body_budget.limit = gw->cfg.limits.body_budget_bytes;
    gw->response_budget.limit = gw->cfg.limits.response_budget_bytes;
}

static void stop_control(kvg_gateway *gw)
{
    kvg_thread_close_listeners(&gw->control);
    kvg_thread_force_close(&gw->control);
    kvg_health_stop(gw);
    kvg_scrape_stop(gw);
    event_base_loopexit(gw->control.base, NULL);
}

void kvg_gateway_control_wakeup(kvg_gateway *gw)
{
    if (atomic_load(&gw->stop_requested) && !atomic_load(&gw->shutting_down) &&
        !atomic_load(&gw->not_ready)) /* not again during the ready delay */
        kvg_gateway_begin_shutdown(gw, "stop requested");
    if (atomic_load(&gw->shutting_down) && atomic_load(&gw->threads_exited) == gw->nthreads)
        stop_control(gw);
}

static void shutdown_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_gateway *gw = arg;
    kvg_log_warn("shutdown deadline reached: closing the remaining connections");
    atomic_store(&gw->force_stop, true);
    kvg_gateway_notify_all(gw);
}

/* Close the listeners (every thread, on its own loop) and let what is in flight finish, up to
 * the deadline. */
static void start_drain(kvg_gateway *gw, const char *why)
{
    kvg_log_info("%s: draining (up to %u ms)", why, gw->cfg.shutdown_timeout_ms);
    atomic_store(&gw->shutting_down, true);
    kvg_gateway_notify_all(gw);
    gw->shutdown_timer = evtimer_new(gw->control.base, shutdown_deadline_cb, gw);
    uint32_t ms = gw->cfg.shutdown_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (gw->shutdown_timer)
        evtimer_add(gw->shutdown_timer, &tv);
    kvg_gateway_control_wakeup(gw);
}

static void ready_delay_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_gateway *gw = arg;
    if (!atomic_load(&gw->shutting_down))
        start_drain(gw, gw->shutdown_why);
}

void kvg_gateway_begin_shutdown(kvg_gateway *gw, const char *why)
{
    if (atomic_load(&gw->shutting_down) || atomic_load(&gw->not_ready)) {
        if (!atomic_load(&gw->shutting_down)) /* a second signal during the ready delay */
            start_drain(gw, why);
        kvg_log_warn("%s again: stopping now", why);
        shutdown_deadline_cb(-1, 0, gw);
        return;
    }
    /* Orchestrators and load balancers learn that a replica goes from its readiness probe,
     * a few seconds after it changes: until they have, requests keep coming, and a closed
     * listener would refuse them. So first answer /readyz with 503 while serving as before,
     * then close the listeners and drain. */
    uint32_t delay = gw->cfg.shutdown_ready_delay_ms;
    atomic_store(&gw->not_ready, true);
    gw->shutdown_why = why;
    if (delay > 0)
        gw->ready_delay_timer = evtimer_new(gw->control.base, ready_delay_cb, gw);
    if (!gw->ready_delay_timer) {
        start_drain(gw, why);
        return;
    }
    kvg_log_info("%s: not ready; still serving for %u ms (shutdown_ready_delay_ms), then "
                 "draining",
                 why, delay);
    struct timeval tv = {delay / 1000, (delay % 1000) * 1000};
    evtimer_add(gw->ready_delay_timer, &tv);
}
