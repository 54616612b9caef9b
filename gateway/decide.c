/* SPDX-License-Identifier: Apache-2.0 */
/* The decision step: prepare, a lookup that may be answered later by Redis (with a deadline and
 * the embedded index behind it), choose. */
#include "decide.h"

#include <errno.h>
#include <stdatomic.h>
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

/* Once the keys are in: the lookup, then the choice now (1, or a negative errno) or once
 * Redis answers (0: pending, s->set referenced). When 1 or negative, s->set may still hold a
 * reference (a hash that was pending): the caller settles. */
static int lookup_and_choose(kvg_decide *s, kvg_worker_set *set)
{
    kvg_thread *t = s->x->thread;
    kvg_router *rt = t->gw->router;
    kvg_route_decision *d = s->d;
    int rc = kvg_router_lookup(rt, t->redis, d, lookup_cb, s);
    if (rc == 0) {
        /* Pending on Redis: d borrows the snapshot's workers until the answer. */
        if (!s->set)
            s->set = kvg_worker_set_ref(set);
        s->pending = true;
        uint64_t ms = t->gw->cfg.redis.lookup_timeout_ms;
        struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (long)(ms % 1000) * 1000};
        evtimer_assign(&s->deadline, t->base, deadline_cb, s);
        s->deadline_set = evtimer_add(&s->deadline, &tv) == 0;
        if (s->deadline_set)
            return 0;
        /* No timer: do not wait at all. */
        kvg_router_lookup_cancel(d, true);
        rc = -1;
    }
    if (rc < 0)
        kvg_router_fallback(rt, d); /* Redis cannot take it now: the embedded index answers */
    rc = choose(s);
    return rc < 0 ? rc : 1;
}

/* The batcher hashed the keys (its device, or its CPU fallback): the rest of the decision, now
 * or after Redis. */
static void hash_done(void *ud, int status, const uint64_t *keys, uint32_t nkeys, kvg_hash_ran ran)
{
    kvg_decide *s = ud;
    s->hash_ticket = NULL;
    int hashed = 0;
    if (status == 0 && nkeys <= s->job.max_blocks) {
        if (nkeys)
            memcpy(s->job.keys, keys, nkeys * sizeof(*keys));
        s->job.nkeys = nkeys;
        s->d->hash_backend = ran == KVG_HASH_RAN_DEVICE
                                 ? kvg_hash_batcher_device(s->x->thread->gw->hasher)
                                 : kvg_hash_ran_str(ran);
    } else {
        /* Memory ran out: route by load. (Not the CPU here: the job's salt was borrowed from the
         * thread's salt cache at submit and may be gone.) */
        hashed = status < 0 ? status : -EIO;
    }
    int rc = kvg_router_prepare_workers(s->set, &s->rq, &s->x->arena, s->d, &s->job, hashed);
    if (rc == 0) {
        rc = lookup_and_choose(s, s->set);
        if (rc == 0)
            return; /* now pending on Redis */
    }
    kvg_worker_set *set = settle(s);
    s->done(s, rc < 0 ? rc : 0);
    kvg_worker_set_unref(set);
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
    int rc = kvg_router_prepare_job(rt, set, &s->rq, &x->arena, d, &s->job);
    if (rc < 0)
        return rc;
    int hashed = 1;
    if (t->hash_sink && s->job.max_blocks) {
        /* The batcher: at once on this CPU (1) below the crossover, else later on this loop. */
        hashed = kvg_hash_submit(t->hash_sink, &s->job, hash_done, s, &s->hash_ticket);
        if (hashed == 0) {
            s->set = kvg_worker_set_ref(set);
            s->pending = true;
            return 0;
        }
        hashed = hashed == 1 ? 0 : kvg_hash_batch(&s->job, 1);
    } else {
        hashed = kvg_hash_batch(&s->job, 1);
        if (s->job.max_blocks)
            atomic_fetch_add_explicit(&t->gw->hash_cpu_jobs, 1, memory_order_relaxed);
    }
    rc = kvg_router_prepare_workers(set, &s->rq, &x->arena, d, &s->job, hashed);
    if (rc < 0)
        return rc;
    rc = lookup_and_choose(s, set);
    if (rc != 0 && s->set)
        kvg_worker_set_unref(settle(s));
    return rc;
}

void kvg_decide_cancel(kvg_decide *s)
{
    if (!s->pending)
        return;
    if (s->hash_ticket) {
        kvg_hash_cancel(s->hash_ticket);
        s->hash_ticket = NULL;
    }
    kvg_router_lookup_cancel(s->d, false);
    kvg_worker_set_unref(settle(s));
}
