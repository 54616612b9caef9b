/* SPDX-License-Identifier: Apache-2.0 */
/* The decision step: prepare, a lookup that may be answered later by Redis (with a deadline and
 * the embedded index behind it), choose. */
#include "decide.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
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

/* From the block keys on: prepare (keys, root), hash (at once, or the batcher: pending), the
 * lookup and the choice. 1 decided, 0 pending, or -ENOMEM; the caller settles when not 0. */
static int keys_and_rest(kvg_decide *s, kvg_worker_set *set)
{
    kvg_exchange *x = s->x;
    kvg_thread *t = x->thread;
    kvg_router *rt = t->gw->router;
    kvg_route_decision *d = s->d;
    int rc = kvg_router_prepare_job(rt, set, &s->rq, &x->arena, d, &s->job);
    if (rc < 0)
        return rc;
    int hashed = 1;
    if (d->mode == KVG_ROUTE_MODE_TOKEN_EXACT) {
        hashed = 0; /* the engine's hashes, made by prepare (or by the pool) */
    } else if (t->hash_sink && s->job.max_blocks) {
        /* The batcher: at once on this CPU (1) below the crossover, else later on this loop. */
        hashed = kvg_hash_submit(t->hash_sink, &s->job, hash_done, s, &s->hash_ticket);
        if (hashed == 0) {
            if (!s->set)
                s->set = kvg_worker_set_ref(set);
            s->pending = true;
            return 0;
        }
        hashed = hashed == 1 ? 0 : kvg_hash_batch(&s->job, 1);
    } else {
        hashed = kvg_hash_batch(&s->job, 1);
        if (s->job.max_blocks)
            atomic_fetch_add_explicit(&t->hash_cpu_jobs, 1, memory_order_relaxed);
    }
    rc = kvg_router_prepare_workers(set, &s->rq, &x->arena, d, &s->job, hashed);
    if (rc < 0)
        return rc;
    return lookup_and_choose(s, set);
}

/* ---- token-exact keys off the loop ---------------------------------------------------------
 * A large body's keys (rendering, tokenizing, hashing: ~8 us a KB, 4 ms for 512 KB,
 * bench/route --exact) would stall every other connection of the loop. The job owns copies of
 * what it reads (the body, the salt) and a reference to the model's snapshot, so that an
 * exchange that goes meanwhile only has to cancel it. */
typedef struct exact_job exact_job;
struct exact_job {
    kvg_offload_job base;
    kvg_decide *s;
    kvg_model_set *models; /* keeps model alive */
    const kvg_model *model;
    kvg_model_input input;
    char *body;
    size_t len;
    char *salt;
    size_t max_blocks;
    kvg_arena arena;
    kvg_model_keys_out keys;
    int rc;
    char err[200];
};

static void exact_run(kvg_offload_job *oj)
{
    exact_job *j = (exact_job *)oj;
    j->rc = kvg_model_keys(j->model, j->input, j->body, j->len, j->salt, j->max_blocks, &j->arena,
                           &j->keys, j->err, sizeof(j->err));
}

static void exact_free(exact_job *j)
{
    kvg_arena_done(&j->arena);
    kvg_model_set_unref(j->models);
    free(j->body);
    free(j->salt);
    free(j);
}

static void exact_discard(kvg_offload_job *oj)
{
    exact_free((exact_job *)oj);
}

static void exact_done(kvg_offload_job *oj)
{
    exact_job *j = (exact_job *)oj;
    kvg_decide *s = j->s;
    s->exact_job = NULL;
    kvg_arena *arena = &s->x->arena;
    kvg_model_keys_out keys = j->keys;
    int rc = 0;
    /* The keys into the exchange's arena; the job goes now. */
    if (j->rc == 0 && keys.nkeys) {
        keys.keys = kvg_arena_alloc(arena, keys.nkeys * sizeof(*keys.keys));
        if (keys.keys)
            memcpy(keys.keys, j->keys.keys, keys.nkeys * sizeof(*keys.keys));
        else
            rc = -ENOMEM;
    }
    if (j->rc == 0) {
        s->rq.exact_keys = &keys;
    } else if (j->rc == -ENOMEM) {
        rc = -ENOMEM;
    } else {
        s->rq.exact_error = kvg_arena_strdup(arena, j->err[0] ? j->err : kvg_strerror(j->rc));
        if (!s->rq.exact_error)
            rc = -ENOMEM;
    }
    exact_free(j);
    if (rc == 0)
        rc = keys_and_rest(s, s->set);
    s->rq.exact_keys = NULL; /* pointed at this frame */
    if (rc == 0)
        return; /* now pending on Redis */
    kvg_worker_set *set = settle(s);
    s->done(s, rc < 0 ? rc : 0);
    kvg_worker_set_unref(set);
}

/* Hand a large token-exact body to the pool: 0 (pending), or negative (not handed: the loop
 * does it). */
static int exact_offload(kvg_decide *s, kvg_worker_set *set)
{
    kvg_thread *t = s->x->thread;
    const kvg_route_request *rq = &s->rq;
    exact_job *j = calloc(1, sizeof(*j));
    if (!j)
        return -ENOMEM;
    j->base.run = exact_run;
    j->base.done = exact_done;
    j->base.discard = exact_discard;
    j->s = s;
    j->models = kvg_model_set_ref(kvg_thread_models(t));
    j->model = rq->model;
    j->input = rq->model_input;
    j->len = rq->raw_len;
    j->body = malloc(rq->raw_len ? rq->raw_len : 1);
    j->salt = rq->salt ? strdup(rq->salt) : NULL;
    j->max_blocks = rq->policy->max_blocks;
    kvg_arena_init(&j->arena, 0);
    if (!j->body || (rq->salt && !j->salt)) {
        exact_free(j);
        return -ENOMEM;
    }
    memcpy(j->body, rq->raw_body, rq->raw_len);
    if (kvg_offload_submit(t->offload_sink, &j->base) < 0) {
        exact_free(j); /* the queue is full: this loop does it */
        return -EBUSY;
    }
    s->exact_job = j;
    s->set = kvg_worker_set_ref(set);
    s->pending = true;
    return 0;
}

int kvg_decide_start(kvg_decide *s, kvg_exchange *x, kvg_worker_set *set,
                     const kvg_route_request *rq, kvg_route_decision *d, kvg_decide_done_fn *done)
{
    kvg_thread *t = x->thread;
    memset(s, 0, sizeof(*s));
    s->x = x;
    s->d = d;
    s->rq = *rq;
    s->policy = *rq->policy;
    s->rq.policy = &s->policy;
    s->done = done;
    if (rq->model && !rq->exact_keys && !rq->exact_error && t->offload_sink &&
        rq->raw_len >= t->gw->cfg.hash.exact_offload_bytes) {
        int rc = exact_offload(s, set);
        if (rc == 0)
            return 0;
        if (rc == -ENOMEM)
            return rc;
    }
    int rc = keys_and_rest(s, set);
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
    if (s->exact_job) {
        kvg_offload_cancel(&s->exact_job->base); /* the pool's thread may be on it: it frees it */
        s->exact_job = NULL;
    }
    kvg_router_lookup_cancel(s->d, false);
    kvg_worker_set_unref(settle(s));
}
