/* SPDX-License-Identifier: Apache-2.0 */
/* The decision step of an exchange: where a request goes, decided at once (the embedded index)
 * or later on the exchange's own loop (the GPU's block keys from the hashing batcher; a large
 * body's token-exact keys from the offload pool; a Redis
 * lookup, within redis.lookup_timeout_ms, else the embedded index answers). The one place a
 * request may wait for routing (docs/architecture.md, "The decision step"). */
#ifndef KVG_GATEWAY_DECIDE_H
#define KVG_GATEWAY_DECIDE_H

#include <event2/event.h>
#include <event2/event_struct.h>
#include <stdbool.h>

#include "exchange.h"
#include "hash_batcher.h"
#include "policy.h"
#include "router.h"

typedef struct kvg_decide kvg_decide;

/** The decision is made: rc 0 and d filled (ranked candidates), or -ENOMEM. Called on the
 *  exchange's loop, once, and only when kvg_decide_start returned 0 (pending). */
typedef void kvg_decide_done_fn(kvg_decide *s, int rc);

/* Embedded in the handler's per-request state; lives until done or kvg_decide_cancel. */
struct kvg_decide {
    kvg_exchange *x;
    kvg_route_decision *d;
    kvg_route_request rq; /* rq.policy points at policy: the thread's may change meanwhile */
    kvg_policy_config policy;
    kvg_worker_set *set; /* referenced while the decision is under way: d borrows from it */
    kvg_decide_done_fn *done;
    kvg_hash_job job;             /* the request's block keys (keys in x's arena) */
    kvg_hash_ticket *hash_ticket; /* while the batcher hashes them (hash.backend cuda) */
    struct exact_job *exact_job;  /* while a pool thread makes a large body's token-exact keys */
    struct event deadline;        /* redis.lookup_timeout_ms after the lookup went out */
    bool deadline_set;
    bool pending;
};

/** Decide where x goes: block keys, the lookup, the choice, into d (from x's arena). rq is
 *  copied, its policy too; set (the thread's snapshot) is referenced for as long as it takes.
 *  Returns 1 when decided at once (done is not called), 0 when pending (done comes later), or
 *  -ENOMEM (nothing pending). */
int kvg_decide_start(kvg_decide *s, kvg_exchange *x, kvg_worker_set *set,
                     const kvg_route_request *rq, kvg_route_decision *d, kvg_decide_done_fn *done);
/** Stop a pending decision (the exchange is going away): done is not called. Idempotent; a
 *  no-op once decided. */
void kvg_decide_cancel(kvg_decide *s);

#endif
