/* SPDX-License-Identifier: Apache-2.0 */
/* Routing decisions: block keys from the prefix stream, a lookup in the prefix index for every
 * eligible worker, the policy's ranking; and the metrics of the decisions taken. */
#include "redis_int.h"
#include "router_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

/* Decision latency buckets (upper bounds, ns): a decision takes microseconds; the top buckets
 * catch a pathological body or a stalled lock. The sum in nanoseconds: decisions are short. */
static const uint64_t route_bounds_ns[] = {
    1000,   2500,    5000,    10000,   25000,    50000,    100000,    250000,
    500000, 1000000, 2500000, 5000000, 10000000, 25000000, 100000000,
};
static const kvg_prom_buckets route_buckets = {
    .bounds_ns = route_bounds_ns,
    .count = KVG_ARRAY_LEN(route_bounds_ns),
    .sum_unit_ns = 1,
};

/* What decisions add up, as one thread adds it: one copy per stripe (kvg_prom_stripe, taken
 * modulo ROUTE_STRIPES), ROUTE_STATS_STRIDE apart, summed by kvg_router_write_metrics. Every
 * decision of every event loop adds 13 counts here. */
typedef struct route_stats {
    kvg_prom_hist stages[KVG_ROUTE_STAGE_COUNT]; /* route_buckets */
    _Atomic uint64_t blocks_hashed;
    _Atomic uint64_t blocks_matched;
    _Atomic uint64_t decisions[KVG_POLICY_KIND_COUNT][KVG_POLICY_REASON_COUNT];
    _Atomic uint64_t record_failures;
    _Atomic uint64_t modes[KVG_ROUTE_MODE_COUNT];
} route_stats;
#define ROUTE_STRIPES 16u
#define ROUTE_STATS_STRIDE ((sizeof(route_stats) + 63) / 64 * 64)

struct kvg_router {
    kvg_prefix_index *index;
    /* The registry generation whose workers the index lists: a decision that sees a newer
     * snapshot brings the index up to date (under sync_lock, rarely). */
    pthread_mutex_t sync_lock;
    _Atomic uint64_t synced_generation;
    void *stats_mem; /* ROUTE_STRIPES route_stats from the first 64-byte boundary in it */
    char *stats;
};

static route_stats *stats_at(const kvg_router *rt, unsigned i)
{
    return (route_stats *)(void *)(rt->stats + (size_t)i * ROUTE_STATS_STRIDE);
}

/* The calling thread's stripe. */
static route_stats *my_stats(kvg_router *rt)
{
    return stats_at(rt, kvg_prom_stripe % ROUTE_STRIPES);
}

static const char *const stage_names[KVG_ROUTE_STAGE_COUNT] = {
    [KVG_ROUTE_STAGE_PARSE] = "parse",   [KVG_ROUTE_STAGE_HASH] = "hash",
    [KVG_ROUTE_STAGE_LOOKUP] = "lookup", [KVG_ROUTE_STAGE_CHOOSE] = "choose",
    [KVG_ROUTE_STAGE_TOTAL] = "total",
};

const char *kvg_route_stage_str(kvg_route_stage s)
{
    return (unsigned)s < KVG_ROUTE_STAGE_COUNT ? stage_names[s] : "?";
}

int kvg_router_new(const kvg_index_config *cfg, kvg_router **out)
{
    kvg_router *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return -ENOMEM;
    /* Zero bytes are zero counts. */
    rt->stats_mem = calloc(1, ROUTE_STRIPES * ROUTE_STATS_STRIDE + 63);
    if (!rt->stats_mem) {
        free(rt);
        return -ENOMEM;
    }
    rt->stats = (char *)(((uintptr_t)rt->stats_mem + 63) & ~(uintptr_t)63);
    int rc = kvg_index_new(cfg, &rt->index);
    if (rc < 0)
        goto fail_rt;
    rc = -pthread_mutex_init(&rt->sync_lock, NULL);
    if (rc < 0)
        goto fail_index;
    *out = rt;
    return 0;
fail_index:
    kvg_index_free(rt->index);
fail_rt:
    free(rt->stats_mem);
    free(rt);
    return rc;
}

void kvg_router_free(kvg_router *rt)
{
    if (!rt)
        return;
    pthread_mutex_destroy(&rt->sync_lock);
    kvg_index_free(rt->index);
    free(rt->stats_mem);
    free(rt);
}

kvg_prefix_index *kvg_router_index(kvg_router *rt)
{
    return rt->index;
}

/* Give the index the snapshot's workers (ids, names, capacities) when the snapshot is newer
 * than what it has. A failure (memory) leaves the old list: retried by the next decision. */
static void sync_index(kvg_router *rt, kvg_worker_set *set)
{
    uint64_t gen = kvg_worker_set_generation(set);
    if (atomic_load_explicit(&rt->synced_generation, memory_order_acquire) >= gen)
        return;
    pthread_mutex_lock(&rt->sync_lock);
    if (atomic_load_explicit(&rt->synced_generation, memory_order_relaxed) < gen) {
        size_t n = kvg_worker_set_count(set);
        kvg_index_worker *ws = calloc(n ? n : 1, sizeof(*ws));
        if (ws) {
            for (size_t i = 0; i < n; i++) {
                kvg_worker *w = kvg_worker_set_at(set, i);
                ws[i] = (kvg_index_worker){kvg_worker_id(w), kvg_worker_name(w),
                                           kvg_worker_kv_blocks(w)};
            }
            if (kvg_index_set_workers(rt->index, ws, n) == 0)
                atomic_store_explicit(&rt->synced_generation, gen, memory_order_release);
            free(ws);
        }
    }
    pthread_mutex_unlock(&rt->sync_lock);
}

void kvg_router_sync_workers(kvg_router *rt, kvg_worker_set *set)
{
    sync_index(rt, set);
}

static uint64_t lap(const kvg_route_request *req, uint64_t *t)
{
    if (!req->clock_ns)
        return 0;
    uint64_t now = req->clock_ns();
    uint64_t d = now - *t;
    *t = now;
    return d;
}

/* The chain's root: what every key of the chain depends on besides the text (scope salt,
 * model, unit, block size), so that all the keys one call to the shared prefix map touches
 * share a Cluster hash slot. */
static uint64_t root_of(const kvg_hash_job *job)
{
    /* Each part seeds the next; the lengths come first, so no two roots run together. */
    uint64_t head[4] = {job->salt_len, job->model_len, (uint64_t)job->unit, job->block_size};
    uint64_t h = XXH3_64bits(head, sizeof(head));
    h = XXH3_64bits_withSeed(job->salt_len ? job->salt : "", job->salt_len, h);
    return XXH3_64bits_withSeed(job->model_len ? job->model : "", job->model_len, h);
}

static const char *const mode_names[KVG_ROUTE_MODE_COUNT] = {
    [KVG_ROUTE_MODE_BYTES] = "bytes",
    [KVG_ROUTE_MODE_TOKEN_EXACT] = "token_exact",
    [KVG_ROUTE_MODE_EXACT_FALLBACK] = "token_exact_fallback",
};

const char *kvg_route_mode_str(kvg_route_mode m)
{
    return (unsigned)m < KVG_ROUTE_MODE_COUNT ? mode_names[m] : "?";
}

/* Token-exact keys: the engine's own block hashes, computed here at once on this thread (vLLM's
 * chain is sequential within a request: nothing for the batcher). The job is left holding the
 * keys, already hashed (mode tells the caller not to hash it). 0: keys in; 1: the request is
 * not one the mode covers (byte mode follows, the reason in out->exact_error); -ENOMEM. */
static int prepare_exact(const kvg_route_request *req, kvg_arena *arena, kvg_route_decision *out,
                         kvg_hash_job *job)
{
    kvg_model_keys_out k;
    char err[200];
    int rc = 0;
    if (req->exact_keys)
        k = *req->exact_keys;
    else if (req->exact_error) {
        rc = KVG_EPARSE;
        snprintf(err, sizeof(err), "%s", req->exact_error);
    } else
        rc = kvg_model_keys(req->model, req->model_input, req->raw_body, req->raw_len, req->salt,
                            req->policy->max_blocks, arena, &k, err, sizeof(err));
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0) {
        out->mode = KVG_ROUTE_MODE_EXACT_FALLBACK;
        out->exact_error = kvg_arena_strdup(arena, err[0] ? err : kvg_strerror(rc));
        return out->exact_error ? 1 : -ENOMEM;
    }
    uint32_t bs = kvg_model_block_size(req->model);
    *job = (kvg_hash_job){.unit = KVG_HASH_TOKENS,
                          .block_size = bs,
                          .len = k.ntokens,
                          .max_blocks = k.nkeys,
                          .keys = k.keys,
                          .nkeys = k.nkeys};
    out->mode = KVG_ROUTE_MODE_TOKEN_EXACT;
    memcpy(out->first_hashes, k.first_hashes, sizeof(out->first_hashes));
    out->unit = KVG_HASH_TOKENS;
    out->block_size = bs;
    out->stream_units = k.ntokens;
    out->root = kvg_model_root(req->model);
    out->hash_backend = "cpu";
    return 0;
}

int kvg_router_prepare_job(kvg_router *rt, kvg_worker_set *set, const kvg_route_request *req,
                           kvg_arena *arena, kvg_route_decision *out, kvg_hash_job *job)
{
    const kvg_policy_config *pc = req->policy;
    const kvg_body_info *body = req->body;
    memset(out, 0, sizeof(*out));
    uint64_t t0 = !req->clock_ns ? 0 : req->start_ns ? req->start_ns : req->clock_ns();
    sync_index(rt, set);

    if (req->model) {
        int rc = prepare_exact(req, arena, out, job);
        if (rc <= 0) { /* token-exact keys (0), or out of memory */
            out->start_ns = t0;
            out->lookup_start_ns = t0;
            return rc;
        }
    }

    /* Block keys: the job, hashed by the caller (at once, or by the batcher). */
    const kvg_prefix_stream *ps = &body->prefix;
    *job = (kvg_hash_job){
        .salt = req->salt,
        .salt_len = req->salt ? strlen(req->salt) : 0,
        .model = body->model,
        .model_len = body->model ? body->model_len : 0,
        .unit = ps->is_tokens ? KVG_HASH_TOKENS : KVG_HASH_BYTES,
        .data = ps->is_tokens ? (const void *)ps->tokens : (const void *)ps->text,
        .len = ps->is_tokens ? ps->ntokens : ps->text_len,
        .block_size = ps->is_tokens ? pc->block_tokens : pc->block_bytes,
    };
    size_t full = job->block_size ? job->len / job->block_size : 0;
    job->max_blocks = (uint32_t)KVG_MIN(full, (size_t)pc->max_blocks);
    if (job->max_blocks) {
        job->keys = kvg_arena_alloc(arena, job->max_blocks * sizeof(uint64_t));
        if (!job->keys)
            return -ENOMEM;
    }
    out->unit = job->unit;
    out->block_size = job->block_size;
    out->stream_units = job->len;
    out->root = root_of(job);
    out->hash_backend = "cpu";
    out->start_ns = t0;
    out->lookup_start_ns = t0; /* until the keys are in: the hash stage's start */
    return 0;
}

int kvg_router_prepare_workers(kvg_worker_set *set, const kvg_route_request *req, kvg_arena *arena,
                               kvg_route_decision *d, const kvg_hash_job *job, int hashed)
{
    uint64_t t = d->lookup_start_ns;
    d->keys = job->keys;
    d->nkeys = hashed < 0 ? 0 : job->nkeys; /* a job refused: route by load (settings are
                                             * validated, so only an out-of-range block size) */
    d->stage_ns[KVG_ROUTE_STAGE_HASH] = lap(req, &t);
    /* Eligible workers: one pass over the snapshot, reading the fields each worker keeps in its
     * first cache line for this loop. */
    size_t n = kvg_worker_set_count(set);
    d->eligible = kvg_arena_alloc(arena, (n ? n : 1) * sizeof(*d->eligible));
    d->pcs = kvg_arena_alloc(arena, (n ? n : 1) * sizeof(*d->pcs));
    d->matched = kvg_arena_alloc(arena, (n ? n : 1) * sizeof(*d->matched));
    if (!d->eligible || !d->pcs || !d->matched)
        return -ENOMEM;
    const char *model = req->body->model;
    bool scraped = req->now_ns && req->engine_load_max_age_ns;
    /* Ejected workers (outlier detection) are out, unless no other worker is in: then they are
     * eligible after all (a second pass), as a sick answer beats none - like Envoy's panic
     * threshold, for the case max_ejection_percent cannot rule out (threads ejecting at once,
     * the others down or draining). */
    uint64_t eject_now = req->now_ns;
    size_t m = 0;
again:
    for (size_t i = 0; i < n; i++) {
        kvg_worker *w = set->workers[i];
        if (!w->serves_all_models && model && !kvg_worker_serves(w, model))
            continue;
        d->serving++;
        if ((atomic_load_explicit(&w->health, memory_order_relaxed) & HEALTH_DOWN_BIT) ||
            atomic_load_explicit(&w->draining, memory_order_relaxed))
            continue;
        if (eject_now &&
            atomic_load_explicit(&w->eject_until_ns, memory_order_relaxed) > eject_now) {
            d->ejected++;
            continue;
        }
        d->eligible[m] = w;
        d->matched[m] = 0;
        d->pcs[m] = (kvg_policy_candidate){
            .index = (uint32_t)m,
            .inflight = atomic_load_explicit(&w->inflight, memory_order_relaxed),
            .pending = atomic_load_explicit(&w->pending, memory_order_relaxed),
            .id_hash = w->name_hash,
            .id_mix = w->rendezvous_id,
        };
        /* The engine's own queue and cache, when scraped recently enough; else unknown (0). */
        if (scraped)
            kvg_worker_engine_load(w, req->now_ns, req->engine_load_max_age_ns, &d->pcs[m].waiting,
                                   &d->pcs[m].kv_usage);
        m++;
    }
    if (m == 0 && d->ejected) {
        d->serving = d->ejected = 0;
        eject_now = 0;
        goto again;
    }
    d->neligible = m;
    d->lookup_start_ns = t;
    return 0;
}

int kvg_router_prepare(kvg_router *rt, kvg_worker_set *set, const kvg_route_request *req,
                       kvg_arena *arena, kvg_route_decision *out)
{
    kvg_hash_job job;
    int rc = kvg_router_prepare_job(rt, set, req, arena, out, &job);
    if (rc < 0)
        return rc;
    int hashed = out->mode == KVG_ROUTE_MODE_TOKEN_EXACT ? 0 : kvg_hash_batch(&job, 1);
    return kvg_router_prepare_workers(set, req, arena, out, &job, hashed);
}

void kvg_router_fallback(kvg_router *rt, kvg_route_decision *d)
{
    size_t m = d->neligible;
    if (m && d->nkeys) {
        /* The ids, then the GPU depths (the blocks held only on a CPU tier are priced below
         * those on the GPU: cpu_block_weight). */
        uint64_t stack[64 + 32];
        uint64_t *ids = m <= 64 ? stack : malloc(m * sizeof(*ids) + m * sizeof(uint32_t));
        if (ids) {
            uint32_t *gpu = (uint32_t *)(void *)(ids + m);
            for (size_t i = 0; i < m; i++)
                ids[i] = d->eligible[i]->id;
            if (kvg_index_match_tiers(rt->index, d->keys, d->nkeys, ids, m, d->matched, gpu))
                for (size_t i = 0; i < m; i++)
                    d->pcs[i].matched_cpu = d->matched[i] - gpu[i];
            if (ids != stack)
                free(ids);
        } else {
            memset(d->matched, 0, m * sizeof(*d->matched)); /* memory: route by load */
        }
    } else {
        memset(d->matched, 0, m * sizeof(*d->matched));
    }
    d->fell_back = d->lookup_op != NULL || d->lookup_cb != NULL;
    d->lookup_op = NULL;
}

/* Workers whose engines' events flow are answered by the embedded index, not by the shared
 * map: every replica subscribes to every engine and applies its events to its own index, so
 * the events never go through Redis (N replicas do not multiply them, a replica's death hands
 * nothing on), and the map in Redis, written by decisions only, would over-predict them
 * (docs/kv-events.md, "Replicated gateways"). Only workers with an event endpoint pay a look at
 * their source. */
static void events_from_index(kvg_router *rt, kvg_route_decision *d)
{
    for (size_t i = 0; i < d->neligible; i++) {
        kvg_worker *w = d->eligible[i];
        if (!w->spec->kv_events ||
            kvg_index_get_source(rt->index, w->id) != KVG_INDEX_SOURCE_EVENTS)
            continue;
        uint64_t id = w->id;
        uint32_t gpu;
        if (kvg_index_match_tiers(rt->index, d->keys, d->nkeys, &id, 1, &d->matched[i], &gpu))
            d->pcs[i].matched_cpu = d->matched[i] - gpu;
    }
}

static void lookup_done(void *ud, int status, const uint32_t *matched, size_t n)
{
    kvg_route_decision *d = ud;
    d->lookup_op = NULL;
    if (status == 0) {
        memcpy(d->matched, matched, n * sizeof(*matched));
        d->shared = true;
        events_from_index(d->lookup_rt, d);
    }
    d->lookup_cb(d->lookup_ud, d, status);
}

int kvg_router_lookup(kvg_router *rt, kvg_redis_client *c, kvg_route_decision *d,
                      kvg_route_lookup_cb *cb, void *ud)
{
    size_t m = d->neligible;
    if (!c || !m || !d->nkeys) {
        kvg_router_fallback(rt, d);
        return 1;
    }
    uint64_t stack[64];
    uint64_t *ids = m <= 64 ? stack : malloc(m * sizeof(*ids));
    if (!ids)
        return -ENOMEM;
    for (size_t i = 0; i < m; i++)
        ids[i] = d->eligible[i]->spec->map_id;
    d->lookup_cb = cb;
    d->lookup_ud = ud;
    d->lookup_rt = rt;
    int rc = kvg_map_lookup(c, d->root, d->keys, d->nkeys, ids, m, lookup_done, d, &d->lookup_op);
    if (ids != stack)
        free(ids);
    if (rc < 0)
        d->lookup_op = NULL;
    return rc;
}

void kvg_router_lookup_cancel(kvg_route_decision *d, bool timed_out)
{
    if (!d->lookup_op)
        return;
    if (timed_out)
        redis_lookup_timed_out(d->lookup_op);
    else
        kvg_redis_op_cancel(d->lookup_op);
    d->lookup_op = NULL;
}

/* The candidates' turnover, from the embedded index: it learns every record, Redis or not.
 * Scratch from the decision's arena; without it turnover stays unknown (0) and the cost ignores
 * it. */
static void fill_turnover(kvg_router *rt, kvg_arena *arena, kvg_route_decision *d)
{
    size_t m = d->neligible;
    uint64_t *ids = kvg_arena_alloc(arena, m * sizeof(*ids));
    float *out = kvg_arena_alloc(arena, m * sizeof(*out));
    if (!ids || !out)
        return;
    for (size_t i = 0; i < m; i++)
        ids[i] = d->eligible[i]->id;
    kvg_index_turnover(rt->index, ids, m, out);
    for (size_t i = 0; i < m; i++)
        d->pcs[i].turnover = out[i];
}

int kvg_router_choose(kvg_router *rt, const kvg_route_request *req, kvg_arena *arena,
                      kvg_route_decision *d)
{
    const kvg_policy_config *pc = req->policy;
    uint64_t t0 = d->start_ns, t = req->clock_ns ? req->clock_ns() : 0;
    if (req->clock_ns)
        d->stage_ns[KVG_ROUTE_STAGE_LOOKUP] = t - d->lookup_start_ns;
    size_t m = d->neligible;
    for (size_t i = 0; i < m; i++)
        d->pcs[i].matched = d->matched[i];
    if (pc->turnover_cost_per_block > 0 && m && d->nkeys)
        fill_turnover(rt, arena, d);
    size_t ranked = req->rank_limit && req->rank_limit < m ? req->rank_limit : m;
    kvg_policy_terms *terms = kvg_arena_alloc(arena, (ranked ? ranked : 1) * sizeof(*terms));
    if (!terms)
        return -ENOMEM;
    /* The per-block prices are for block_tokens tokens; an engine's block may hold more or
     * fewer (docs/policies.md, "Block sizes"). */
    kvg_policy_request preq = {.blocks = d->nkeys, .block_weight = 1};
    if (d->mode == KVG_ROUTE_MODE_TOKEN_EXACT && pc->block_tokens)
        preq.block_weight = (double)d->block_size / pc->block_tokens;
    if (d->nkeys) {
        uint32_t cold = KVG_MIN(pc->cold_blocks ? pc->cold_blocks : 1, d->nkeys);
        preq.cold_key = d->keys[cold - 1];
    }
    d->block_weight = preq.block_weight;
    kvg_policy_choose_top(pc, &preq, d->pcs, m, req->rank_limit, req->rotation, terms, &d->reason);
    /* Only the ranked places are candidates: past them the order means nothing. */
    d->cands = kvg_arena_alloc(arena, (ranked ? ranked : 1) * sizeof(*d->cands));
    if (!d->cands)
        return -ENOMEM;
    for (size_t i = 0; i < ranked; i++) {
        const kvg_policy_candidate *c = &d->pcs[i];
        d->cands[i] = (kvg_route_candidate){
            .worker = d->eligible[c->index],
            .matched = c->matched,
            .inflight = c->inflight,
            .pending = c->pending,
            .waiting = c->waiting,
            .kv_usage = c->kv_usage,
            .terms = terms[i],
        };
    }
    d->ncands = ranked;
    d->policy = pc->kind;
    d->stage_ns[KVG_ROUTE_STAGE_CHOOSE] = lap(req, &t);
    d->stage_ns[KVG_ROUTE_STAGE_TOTAL] = req->clock_ns ? t - t0 : 0;
    return 0;
}

int kvg_router_decide(kvg_router *rt, kvg_worker_set *set, const kvg_route_request *req,
                      kvg_arena *arena, kvg_route_decision *out)
{
    int rc = kvg_router_prepare(rt, set, req, arena, out);
    if (rc < 0)
        return rc;
    kvg_router_fallback(rt, out);
    return kvg_router_choose(rt, req, arena, out);
}

void kvg_router_count(kvg_router *rt, const kvg_route_decision *d)
{
    route_stats *st = my_stats(rt);
    for (int s = 0; s < KVG_ROUTE_STAGE_COUNT; s++)
        kvg_prom_hist_observe(&st->stages[s], &route_buckets, d->stage_ns[s]);
    atomic_fetch_add_explicit(&st->blocks_hashed, d->nkeys, memory_order_relaxed);
    if ((unsigned)d->policy < KVG_POLICY_KIND_COUNT &&
        (unsigned)d->reason < KVG_POLICY_REASON_COUNT)
        atomic_fetch_add_explicit(&st->decisions[d->policy][d->reason], 1, memory_order_relaxed);
    if ((unsigned)d->mode < KVG_ROUTE_MODE_COUNT)
        atomic_fetch_add_explicit(&st->modes[d->mode], 1, memory_order_relaxed);
}

void kvg_router_speculate(kvg_router *rt, const kvg_worker *w, const kvg_route_decision *d)
{
    /* Speculative indexing (docs/kv-events.md, "Sources"). For a worker whose KV events flow,
     * the decision's keys go into the index as the attempt is made, as speculative entries,
     * rather than at its 200: a burst of the same prefix arriving before the first one's head
     * (a prefill under load takes seconds; the head comes after the engine took the request)
     * then keeps its affinity, where recording at the head would send the whole burst by
     * rendezvous and load before any entry exists. Speculative entries cost little when wrong:
     * they go after the TTL unless the engine's BlockStored confirms them (an attempt that
     * fails leaves its guess to expire). A model worker (no events) is still recorded at its
     * 200 only: its entries are permanent, and a request that fails must not leave them. Per
     * attempt, not per decision: when the best candidate is full or fails, the worker that
     * gets the request is the one to hold its blocks. A worker without an event endpoint is
     * never an events source: the look at the index's lock is only for those that have one
     * (not a shared cache line per request for all). */
    if (!d->nkeys || !w->spec->kv_events)
        return;
    uint64_t id = kvg_worker_id(w);
    if (kvg_index_get_source(rt->index, id) == KVG_INDEX_SOURCE_EVENTS &&
        kvg_index_record(rt->index, id, d->keys, d->nkeys) < 0)
        atomic_fetch_add_explicit(&my_stats(rt)->record_failures, 1, memory_order_relaxed);
}

int kvg_router_record(kvg_router *rt, kvg_redis_client *c, const kvg_worker *w,
                      const kvg_route_decision *d, uint32_t matched)
{
    if (!d->nkeys)
        return 0;
    atomic_fetch_add_explicit(&my_stats(rt)->blocks_matched, matched, memory_order_relaxed);
    /* The embedded index learns whatever answered the lookup: a fallback starts warm. */
    int rc = kvg_index_record(rt->index, kvg_worker_id(w), d->keys, d->nkeys);
    if (rc < 0)
        atomic_fetch_add_explicit(&my_stats(rt)->record_failures, 1, memory_order_relaxed);
    if (c) {
        uint32_t capacity =
            w->spec->kv_blocks ? w->spec->kv_blocks : kvg_index_default_capacity(rt->index);
        kvg_map_record(c, d->root, w->spec->map_id, capacity, d->keys, d->nkeys);
    }
    return rc;
}

uint64_t kvg_route_predicted_tokens(const kvg_route_decision *d, uint32_t matched,
                                    int64_t prompt_tokens)
{
    if (prompt_tokens <= 0 || !d->stream_units || !matched)
        return 0;
    double units = (double)matched * d->block_size;
    double frac = units >= (double)d->stream_units ? 1.0 : units / (double)d->stream_units;
    return (uint64_t)((double)prompt_tokens * frac + 0.5);
}

uint32_t kvg_route_pending_units(const kvg_route_decision *d, uint32_t missing)
{
    double w = d->block_weight > 0 ? d->block_weight : 1; /* unset (no decision taken): 1 */
    double units = ceil((double)missing * w);
    return units < (double)UINT32_MAX ? (uint32_t)units : UINT32_MAX;
}

/* The sum over the stripes of the counter at offset in route_stats. */
static uint64_t stats_sum(const kvg_router *rt, size_t offset)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < ROUTE_STRIPES; i++)
        v += atomic_load_explicit((_Atomic uint64_t *)(void *)((char *)stats_at(rt, i) + offset),
                                  memory_order_relaxed);
    return v;
}
#define SUM(rt, field) stats_sum(rt, offsetof(route_stats, field))

void kvg_router_write_metrics(kvg_router *rt, kvg_buf *out)
{
    kvg_index_write_metrics(rt->index, out);

    const char *name = "kvgate_route_decision_seconds";
    kvg_prom_put_header(
        out, name, KVG_PROM_HISTOGRAM,
        "Time to take a routing decision, by stage: parse (body scan and prefix stream), "
        "hash (block keys), lookup (prefix index), choose (policy), total (hash to "
        "choose).");
    for (int s = 0; s < KVG_ROUTE_STAGE_COUNT; s++) {
        kvg_prom_hist h;
        kvg_prom_hist_init(&h);
        for (unsigned i = 0; i < ROUTE_STRIPES; i++)
            kvg_prom_hist_add(&h, &stats_at(rt, i)->stages[s]);
        kvg_prom_put_hist(out, name, KVG_PROM_LABELS({"stage", stage_names[s]}), &h,
                          &route_buckets);
    }

    kvg_prom_put_header(
        out, "kvgate_route_blocks_total", KVG_PROM_COUNTER,
        "Block keys of routed requests: hashed (looked up), and matched: the leading blocks "
        "the worker that answered 200 was predicted to hold.");
    kvg_prom_put_u64(out, "kvgate_route_blocks_total", KVG_PROM_LABELS({"kind", "hashed"}),
                     SUM(rt, blocks_hashed));
    kvg_prom_put_u64(out, "kvgate_route_blocks_total", KVG_PROM_LABELS({"kind", "matched"}),
                     SUM(rt, blocks_matched));

    kvg_prom_put_header(
        out, "kvgate_route_decisions_total", KVG_PROM_COUNTER,
        "Routing decisions by policy and by why the chosen worker won (hit: it holds a "
        "prefix; cold: no worker does, placed by turnover and load or by rendezvous; load: "
        "load alone).");
    for (int k = 0; k < KVG_POLICY_KIND_COUNT; k++)
        for (int r = 0; r < KVG_POLICY_REASON_COUNT; r++) {
            uint64_t v = SUM(rt, decisions[k][r]);
            if (v)
                kvg_prom_put_u64(
                    out, "kvgate_route_decisions_total",
                    KVG_PROM_LABELS({"policy", kvg_policy_kind_str((kvg_policy_kind)k)},
                                    {"reason", kvg_policy_reason_str((kvg_policy_reason)r)}),
                    v);
        }
    kvg_prom_put_header(out, "kvgate_route_key_mode_total", KVG_PROM_COUNTER,
                        "Routing decisions by how their block keys were made: bytes (the "
                        "canonical prefix stream), token_exact (the engine's own block hashes, "
                        "for models defined with a tokenizer), token_exact_fallback (such a "
                        "model, but a request token-exact mode does not cover: bytes).");
    for (int m = 0; m < KVG_ROUTE_MODE_COUNT; m++)
        kvg_prom_put_u64(out, "kvgate_route_key_mode_total",
                         KVG_PROM_LABELS({"mode", mode_names[m]}), SUM(rt, modes[m]));
    kvg_prom_put_scalar_u64(out, "kvgate_route_record_failures_total", KVG_PROM_COUNTER,
                            "Answered requests whose blocks could not be recorded in the prefix "
                            "index (the worker had left it, or memory ran out).",
                            SUM(rt, record_failures));
}
