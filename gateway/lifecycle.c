/* SPDX-License-Identifier: Apache-2.0 */
/* The shutdown sequence, run on the control thread: drain every front thread, wait for them up
 * to the deadline, then force the rest closed and stop the control loop. */
#include "server.h"

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

void kvg_gateway_begin_shutdown(kvg_gateway *gw, const char *why)
{
    if (atomic_load(&gw->shutting_down)) {
        kvg_log_warn("%s again: stopping now", why);
        shutdown_deadline_cb(-1, 0, gw);
        return;
    }
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
