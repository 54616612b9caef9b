/* SPDX-License-Identifier: Apache-2.0 */
/* The router driver: the gateway's own decision steps (prepare, embedded-index match, choose,
 * record) on a registry of simulated workers, with the trace's chain keys as the block keys. */
#include "replay.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "router.h"

struct replay_router {
    kvg_policy_config pc;
    kvg_registry *reg;
    kvg_router *rt;
    kvg_worker_set *set;
    kvg_worker **workers; /* by simulated index (w000, w001, ... sort as they are numbered) */
    unsigned n;
    uint64_t rotation;
    kvg_arena arena;
};

int replay_router_new(const kvg_policy_config *pc, unsigned nworkers, uint32_t capacity,
                      replay_router **out)
{
    replay_router *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    /* The settings count in the gateway's blocks (block_tokens tokens each); a trace block is
     * REPLAY_BLOCK_TOKENS tokens, so the per-block settings scale by their ratio: a trace block
     * costs as much prefill (and turnover, and queued prefill) as the gateway blocks it spans, and
     * max_blocks and cold_blocks cover as many tokens as they do in the gateway. */
    double ratio = (double)REPLAY_BLOCK_TOKENS / (pc->block_tokens ? pc->block_tokens : 1);
    r->pc = *pc;
    r->pc.prefill_cost_per_block = pc->prefill_cost_per_block * ratio;
    r->pc.turnover_cost_per_block = pc->turnover_cost_per_block * ratio;
    r->pc.pending_cost_per_block = pc->pending_cost_per_block * ratio;
    r->pc.max_blocks = (uint32_t)KVG_MAX(1.0, floor(pc->max_blocks / ratio));
    r->pc.cold_blocks = (uint32_t)KVG_MAX(1.0, ceil(pc->cold_blocks / ratio));
    r->n = nworkers;
    kvg_arena_init(&r->arena, 0);
    /* No limit of the gateway's own: the simulated engines queue what they cannot run. */
    kvg_registry_config rc_cfg = {.nthreads = 1, .default_max_inflight = UINT32_MAX};
    kvg_index_config ic = {.max_entries = 0};
    int rc = kvg_registry_new(&rc_cfg, &r->reg);
    if (rc < 0)
        goto fail;
    rc = kvg_router_new(&ic, &r->rt);
    if (rc < 0)
        goto fail;
    for (unsigned i = 0; i < nworkers; i++) {
        char name[16], url[64], msg[256];
        snprintf(name, sizeof(name), "w%03u", i);
        snprintf(url, sizeof(url), "http://127.0.0.1:%u", 20000 + i);
        kvg_worker_def def = {.name = name, .url = url, .kv_blocks = capacity};
        rc = kvg_registry_put(r->reg, &def, KVG_WORKER_SOURCE_CONFIG, msg, sizeof(msg));
        if (rc < 0) {
            fprintf(stderr, "kvgate-replay: worker %s: %s\n", name, msg);
            goto fail;
        }
    }
    r->set = kvg_registry_acquire(r->reg);
    r->workers = calloc(nworkers ? nworkers : 1, sizeof(*r->workers));
    if (!r->workers || kvg_worker_set_count(r->set) != nworkers) {
        rc = -ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < nworkers; i++)
        r->workers[i] = kvg_worker_set_at(r->set, i);
    *out = r;
    return 0;
fail:
    replay_router_free(r);
    return rc;
}

void replay_router_free(replay_router *r)
{
    if (!r)
        return;
    free(r->workers);
    if (r->set)
        kvg_worker_set_unref(r->set);
    kvg_router_free(r->rt);
    kvg_registry_free(r->reg);
    kvg_arena_done(&r->arena);
    free(r);
}

static unsigned worker_index(const replay_router *r, const kvg_worker *w)
{
    for (unsigned i = 0; i < r->n; i++)
        if (r->workers[i] == w)
            return i;
    return 0; /* not reached: candidates come from r->set */
}

/* The blocks a request still has to prefill on the chosen worker, as the gateway counts them:
 * its keys past those the index matched. */
static uint32_t missing(const replay_router *r, const replay_request *req, uint32_t matched)
{
    uint32_t n = KVG_MIN(req->nblocks, r->pc.max_blocks);
    return n - KVG_MIN(matched, n);
}

int replay_router_decide(replay_router *r, const replay_request *req, unsigned *worker,
                         uint32_t *matched)
{
    /* An empty body: the keys are the trace's own, given to the hashing step as its result
     * (the gateway's keys come from hashing the prompt; a trace has only the hash ids). */
    kvg_body_info info = {.prefix = {.is_tokens = true}};
    kvg_route_request rq = {
        .body = &info,
        .policy = &r->pc,
        .rotation = r->rotation++,
        .rank_limit = 1,
    };
    kvg_arena_reset(&r->arena);
    kvg_route_decision d;
    kvg_hash_job job;
    int rc = kvg_router_prepare_job(r->rt, r->set, &rq, &r->arena, &d, &job);
    if (rc < 0)
        return rc;
    job.keys = req->keys;
    job.nkeys = KVG_MIN(req->nblocks, r->pc.max_blocks);
    rc = kvg_router_prepare_workers(r->set, &rq, &r->arena, &d, &job, 0);
    if (rc < 0)
        return rc;
    kvg_router_fallback(r->rt, &d);
    rc = kvg_router_choose(r->rt, &rq, &r->arena, &d);
    if (rc < 0)
        return rc;
    if (!d.ncands)
        return -EINVAL; /* every worker is up and serves every model: not reached */
    kvg_worker *w = d.cands[0].worker;
    kvg_worker_inflight_try_acquire(w);
    *worker = worker_index(r, w);
    *matched = d.cands[0].matched;
    kvg_worker_pending_add(w, missing(r, req, *matched));
    return 0;
}

void replay_router_first_token(replay_router *r, unsigned worker, const replay_request *req,
                               uint32_t matched)
{
    kvg_worker_pending_done(r->workers[worker], missing(r, req, matched));
}

void replay_router_record(replay_router *r, unsigned worker, const replay_request *req,
                          uint32_t matched)
{
    /* What kvg_router_record reads of a decision: its keys. */
    kvg_route_decision d = {
        .keys = req->keys,
        .nkeys = KVG_MIN(req->nblocks, r->pc.max_blocks),
    };
    kvg_router_record(r->rt, NULL, r->workers[worker], &d, matched);
}

void replay_router_done(replay_router *r, unsigned worker)
{
    kvg_worker_inflight_release(r->workers[worker]);
}
