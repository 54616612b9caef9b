/* SPDX-License-Identifier: Apache-2.0 */
/* The decision step: prepare, a lookup that may be answered later by Redis (with a deadline and
 * the embedded index behind it), choose. */
#include "decide.h"

#include <errno.h>
#include <string.h>

#include "gateway_int.h"

/* Nothing pending any more; the snapshot reference is handed to the caller, who drops it once
 * done has taken what it needs from d (references to the chosen workers). */
static kvg_worker_set *settle(kvg_decide *s)
{
    if (s->deadline_set) {
        event_del(&s->deadline);
        s->deadline_set = false;
    }
    s->pending = false;
    kvg_worker_set *set = s->set;
    s->set = NULL;
    return set;
}

static int choose(kvg_decide *s)
{
    return kvg_router_choose(s->x->thread->gw->router, &s->rq, &s->x->arena, s->d);
}

/* Finish a pending decision: choose, tell the caller (who may free s), then let the snapshot
 * go. */
static void complete(kvg_decide *s)
{
    int rc = choose(s);
    kvg_worker_set *set = settle(s);
    s->done(s, rc);
    kvg_worker_set_unref(set);
}

/* Redis answered (status 0) or failed: either way the decision completes now. */
static void lookup_cb(void *ud, kvg_route_decision *d, int status)
{
    kvg_decide *s = ud;
    if (status < 0)
        kvg_router_fallback(s->x->thread->gw->router, d);
    complete(s);
}

/* Redis is late: the embedded index answers, and the request goes on without it. */
static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_decide *s = arg;
    s->deadline_set = false;
    kvg_router_lookup_cancel(s->d, true);
    kvg_router_fallback(s->x->thread->gw->router, s->d);
    complete(s);
}

int kvg_decide_start(kvg_decide *s, kvg_exchange *x, kvg_worker_set *set,
                     const kvg_route_request *rq, kvg_route_decision *d, kvg_decide_done_fn *done)
{
    kvg_thread *t = x->thread;
    kvg_router *rt = t->gw->router;
    memset(s, 0, sizeof(*s));
    s->x = x;
    s->d = d;
    s->rq = *rq;
    s->policy = *rq->policy;
    s->rq.policy = &s->policy;
    s->done = done;
    int rc = kvg_router_prepare(rt, set, &s->rq, &x->arena, d);
    if (rc < 0)
        return rc;
    rc = kvg_router_lookup(rt, t->redis, d, lookup_cb, s);
    if (rc == 0) {
        /* Pending on Redis: d borrows the snapshot's workers until the answer. */
        s->set = kvg_worker_set_ref(set);
        s->pending = true;
        uint64_t ms = t->gw->cfg.redis.lookup_timeout_ms;
        struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (long)(ms % 1000) * 1000};
        evtimer_assign(&s->deadline, t->base, deadline_cb, s);
        s->deadline_set = evtimer_add(&s->deadline, &tv) == 0;
        if (!s->deadline_set) { /* no timer: do not wait at all */
            kvg_router_lookup_cancel(d, true);
            kvg_router_fallback(rt, d);
            rc = choose(s);
            kvg_worker_set_unref(settle(s));
            return rc < 0 ? rc : 1;
        }
        return 0;
    }
    if (rc < 0)
        kvg_router_fallback(rt, d); /* Redis cannot take it now: the embedded index answers */
    rc = choose(s);
    return rc < 0 ? rc : 1;
}

void kvg_decide_cancel(kvg_decide *s)
{
    if (!s->pending)
        return;
    kvg_router_lookup_cancel(s->d, false);
    kvg_worker_set_unref(settle(s));
}
