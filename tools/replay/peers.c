/* SPDX-License-Identifier: Apache-2.0 */
/* Other routers' published policies, re-implemented on the simulation's views of the workers.
 * docs/policies.md gives each one's formula, defaults and source, and what the block-level
 * trace changes in it; the constants below are those defaults. */
#include "replay.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Texts are matched by routers that do not tokenize at this estimate (SGLang, llm-d, AIBrix). */
#define CHARS_PER_TOKEN 4u

/* SGLang router, cache_aware (sgl-router's CLI defaults). */
#define SGL_CACHE_THRESHOLD 0.3
#define SGL_BALANCE_ABS 64u
#define SGL_BALANCE_REL 1.5
#define SGL_MAX_TREE_CHARS (1u << 26) /* per worker ("tenant") of the tree */

/* NVIDIA Dynamo KV router: logit = overlap_weight x prefill blocks + decode blocks. */
#define DYN_OVERLAP_WEIGHT 1.0

/* llm-d inference scheduler's default profile: weights of the three scorers; the approximate
 * prefix index matches at most 256 blocks of 16 tokens and holds per server as many blocks as
 * the server's cache (auto-tuned). */
#define LLMD_W_PREFIX 3.0
#define LLMD_W_QUEUE 2.0
#define LLMD_W_KV 2.0
#define LLMD_MAX_PREFIX_TOKENS (256u * 16u)

/* AIBrix prefix-cache router (code defaults): imbalance over 8 running requests, mean + 1
 * standard deviation, one table of 200,000 blocks of 128 characters for all pods. */
#define AIB_IMBALANCE_ABS 8u
#define AIB_STDDEV_FACTOR 1.0
#define AIB_TABLE_TOKENS (200000u * 128u / CHARS_PER_TOKEN)

/* Consistent hashing with bounded load (Mirrokni, Thorup, Zadimoghaddam 2018), as SGLang's
 * prefix_hash policy applies it: 160 points per worker, load factor 1.25. */
#define CH_VNODES 160u
#define CH_LOAD_FACTOR 1.25

typedef struct ring_point {
    uint64_t hash;
    unsigned worker;
} ring_point;

struct replay_peer_router {
    replay_peer kind;
    unsigned n;
    replay_cache **index;     /* per worker: SGLang's tree, llm-d's LRU indexer, Dynamo's
                               * active blocks */
    replay_cache *table;      /* AIBrix: one table of (block, pod) entries */
    uint64_t *active_prefill; /* Dynamo: prefill tokens routed and not yet done, per worker */
    uint32_t *charged;        /* Dynamo: each request's charge to active_prefill */
    ring_point *ring;         /* consistent hashing */
    size_t nring;
};

static uint32_t blocks_of_tokens(uint64_t tokens)
{
    uint64_t b = tokens / REPLAY_BLOCK_TOKENS;
    return b > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)b;
}

static int cmp_point(const void *a, const void *b)
{
    const ring_point *x = a, *y = b;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

int replay_peer_new(replay_peer kind, unsigned nworkers, uint32_t capacity, size_t nrequests,
                    replay_peer_router **out)
{
    if (!nworkers || nworkers > REPLAY_MAX_WORKERS)
        return -EINVAL;
    replay_peer_router *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->kind = kind;
    p->n = nworkers;
    int rc = 0;
    uint32_t per_worker = 0;
    switch (kind) {
    case REPLAY_PEER_SGLANG:
        per_worker = blocks_of_tokens(SGL_MAX_TREE_CHARS / CHARS_PER_TOKEN);
        break;
    case REPLAY_PEER_LLMD:
        per_worker = capacity;
        break;
    case REPLAY_PEER_DYNAMO:
        /* Active blocks: what the engine runs (at most its capacity) and what waits for it. */
        per_worker = capacity > UINT32_MAX / 8 ? UINT32_MAX / 2 : capacity * 4 + 4096;
        p->active_prefill = calloc(nworkers, sizeof(*p->active_prefill));
        p->charged = calloc(nrequests ? nrequests : 1, sizeof(*p->charged));
        if (!p->active_prefill || !p->charged)
            rc = -ENOMEM;
        break;
    case REPLAY_PEER_AIBRIX:
        rc = replay_cache_new(blocks_of_tokens(AIB_TABLE_TOKENS), &p->table);
        break;
    case REPLAY_PEER_CHWBL:
        p->nring = (size_t)nworkers * CH_VNODES;
        p->ring = malloc(p->nring * sizeof(*p->ring));
        if (!p->ring) {
            rc = -ENOMEM;
            break;
        }
        for (unsigned w = 0; w < nworkers; w++)
            for (unsigned v = 0; v < CH_VNODES; v++)
                p->ring[(size_t)w * CH_VNODES + v] = (ring_point){
                    .hash = kvg_policy_mix64(((uint64_t)w << 32 | v) + 0x9e3779b97f4a7c15ull),
                    .worker = w,
                };
        qsort(p->ring, p->nring, sizeof(*p->ring), cmp_point);
        break;
    default:
        rc = -EINVAL;
    }
    if (rc == 0 && per_worker) {
        p->index = calloc(nworkers, sizeof(*p->index));
        rc = p->index ? 0 : -ENOMEM;
        for (unsigned w = 0; rc == 0 && w < nworkers; w++)
            rc = replay_cache_new(per_worker, &p->index[w]);
    }
    if (rc < 0) {
        replay_peer_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void replay_peer_free(replay_peer_router *p)
{
    if (!p)
        return;
    for (unsigned w = 0; p->index && w < p->n; w++)
        replay_cache_free(p->index[w]);
    free(p->index);
    replay_cache_free(p->table);
    free(p->active_prefill);
    free(p->charged);
    free(p->ring);
    free(p);
}

/* A routing history records a request: its blocks become the most recent (pin, then unpin). */
static void remember(replay_cache *c, const uint64_t *keys, uint32_t n)
{
    replay_cache_pin(c, keys, n);
    replay_cache_unpin(c, keys, n);
}

static uint64_t tokens_of(const replay_request *r, uint32_t blocks)
{
    uint64_t t = 0;
    for (uint32_t i = 0; i < blocks; i++)
        t += replay_block_tokens(r, i);
    return t;
}

/* Where a router breaks a tie arbitrarily (a hash map's order, a shuffle), the k-th of n tied
 * candidates for request id: deterministic, and not always the lowest-numbered worker. */
static unsigned tie_pick(uint32_t id, unsigned n)
{
    return n ? (unsigned)(kvg_policy_mix64(id + 0x5bd1e995u) % n) : 0;
}

/* The workers with the highest value offered so far, every tie kept (offer -x for the lowest x;
 * integers offered are exact in a double). */
typedef struct best_of {
    double value;
    unsigned n;
    unsigned tied[REPLAY_MAX_WORKERS];
} best_of;

static void best_init(best_of *b)
{
    b->value = -INFINITY;
    b->n = 0;
}

static void best_offer(best_of *b, unsigned w, double value)
{
    if (value > b->value) {
        b->value = value;
        b->n = 0;
    }
    if (value == b->value && b->n < KVG_ARRAY_LEN(b->tied))
        b->tied[b->n++] = w;
}

/* One of the tied best for request id (tie_pick). */
static unsigned best_pick(const best_of *b, uint32_t id)
{
    return b->tied[tie_pick(id, b->n)];
}

/* ---- SGLang: cache_aware ------------------------------------------------------------------- */

static unsigned sglang(replay_peer_router *p, const replay_request *r, uint32_t id,
                       const replay_engine_view *v, uint32_t *predicted)
{
    uint32_t max = 0, min = UINT32_MAX;
    unsigned argmin = 0;
    for (unsigned w = 0; w < p->n; w++) {
        max = KVG_MAX(max, v[w].inflight);
        if (v[w].inflight < min) {
            min = v[w].inflight;
            argmin = w;
        }
    }
    unsigned pick;
    if (max - min > SGL_BALANCE_ABS && (double)max > (double)min * SGL_BALANCE_REL) {
        pick = argmin; /* shortest queue; the tree still learns the request */
    } else {
        /* The tree's longest match over every worker, and a worker that holds it. */
        best_of b;
        best_init(&b);
        for (unsigned w = 0; w < p->n; w++)
            best_offer(&b, w, replay_cache_match(p->index[w], r->keys, r->nblocks));
        uint32_t matched = (uint32_t)b.value;
        double rate = r->input_tokens ? (double)tokens_of(r, matched) / r->input_tokens : 0;
        if (!matched || rate <= SGL_CACHE_THRESHOLD) {
            /* The smallest tree: the most room for new text. */
            best_init(&b);
            for (unsigned w = 0; w < p->n; w++)
                best_offer(&b, w, -(double)replay_cache_held(p->index[w]));
        }
        pick = best_pick(&b, id);
    }
    *predicted = replay_cache_match(p->index[pick], r->keys, r->nblocks);
    remember(p->index[pick], r->keys, r->nblocks);
    return pick;
}

/* ---- NVIDIA Dynamo: KV router --------------------------------------------------------------- */

static unsigned dynamo(replay_peer_router *p, const replay_request *r, uint32_t id,
                       const replay_engine_view *v, uint32_t *predicted)
{
    best_of b;
    best_init(&b);
    uint32_t overlap[REPLAY_MAX_WORKERS];
    uint64_t fresh[REPLAY_MAX_WORKERS];
    for (unsigned w = 0; w < p->n; w++) {
        /* The overlap is what the engine's KV events say it holds. */
        overlap[w] = replay_cache_match(v[w].cache, r->keys, r->nblocks);
        fresh[w] = r->input_tokens - KVG_MIN(tokens_of(r, overlap[w]), (uint64_t)r->input_tokens);
        double prefill_blocks =
            (double)(p->active_prefill[w] + fresh[w]) / (double)REPLAY_BLOCK_TOKENS;
        /* Decode blocks: the worker's active blocks with this request's new ones. */
        uint32_t active_hit = 0;
        for (uint32_t i = 0; i < r->nblocks; i++)
            active_hit += replay_cache_match(p->index[w], &r->keys[i], 1);
        double decode_blocks =
            (double)replay_cache_pinned(p->index[w]) + (double)(r->nblocks - active_hit);
        best_offer(&b, w, -(DYN_OVERLAP_WEIGHT * prefill_blocks + decode_blocks));
    }
    unsigned pick = best_pick(&b, id);
    p->charged[id] = (uint32_t)KVG_MIN(fresh[pick], (uint64_t)UINT32_MAX);
    p->active_prefill[pick] += p->charged[id];
    replay_cache_pin(p->index[pick], r->keys, r->nblocks);
    *predicted = overlap[pick];
    return pick;
}

/* ---- llm-d: prefix 3 + queue 2 + KV utilisation 2, max score ------------------------------- */

static unsigned llmd(replay_peer_router *p, const replay_request *r, uint32_t id,
                     const replay_engine_view *v, uint32_t *predicted)
{
    uint32_t limit = 0; /* blocks within the index's 4096 matched tokens */
    while (limit < r->nblocks && tokens_of(r, limit + 1) <= LLMD_MAX_PREFIX_TOKENS)
        limit++;
    uint32_t qmax = 0, qmin = UINT32_MAX;
    for (unsigned w = 0; w < p->n; w++) {
        qmax = KVG_MAX(qmax, v[w].waiting);
        qmin = KVG_MIN(qmin, v[w].waiting);
    }
    best_of b;
    best_init(&b);
    for (unsigned w = 0; w < p->n; w++) {
        uint32_t m = replay_cache_match(p->index[w], r->keys, limit);
        double prefix = limit ? (double)m / limit : 0;
        double queue = qmax == qmin ? 1.0 : (double)(qmax - v[w].waiting) / (double)(qmax - qmin);
        double kv =
            v[w].capacity ? 1.0 - (double)replay_cache_pinned(v[w].cache) / v[w].capacity : 0;
        best_offer(&b, w, LLMD_W_PREFIX * prefix + LLMD_W_QUEUE * queue + LLMD_W_KV * kv);
    }
    unsigned pick = best_pick(&b, id);
    *predicted = replay_cache_match(p->index[pick], r->keys, limit);
    remember(p->index[pick], r->keys, limit);
    return pick;
}

/* ---- AIBrix: prefix-cache ------------------------------------------------------------------ */

/* The table's key of block key on worker w. */
static uint64_t pod_key(uint64_t key, unsigned w)
{
    return kvg_policy_mix64(key ^ ((uint64_t)(w + 1) * 0x9e3779b97f4a7c15ull));
}

static uint32_t aibrix_match(const replay_peer_router *p, const replay_request *r, unsigned w)
{
    uint32_t m = 0;
    while (m < r->nblocks) {
        uint64_t k = pod_key(r->keys[m], w);
        if (!replay_cache_match(p->table, &k, 1))
            break;
        m++;
    }
    return m;
}

static unsigned least_running(const replay_engine_view *v, unsigned n, uint32_t id)
{
    best_of b;
    best_init(&b);
    for (unsigned w = 0; w < n; w++)
        best_offer(&b, w, -(double)v[w].inflight);
    return best_pick(&b, id);
}

static unsigned aibrix(replay_peer_router *p, const replay_request *r, uint32_t id,
                       const replay_engine_view *v, uint32_t *predicted)
{
    uint32_t max = 0, min = UINT32_MAX;
    double sum = 0, sq = 0;
    for (unsigned w = 0; w < p->n; w++) {
        max = KVG_MAX(max, v[w].inflight);
        min = KVG_MIN(min, v[w].inflight);
        sum += v[w].inflight;
        sq += (double)v[w].inflight * v[w].inflight;
    }
    unsigned pick = p->n;
    if (max - min <= AIB_IMBALANCE_ABS) {
        double mean = sum / p->n;
        double sd = sqrt(KVG_MAX(0.0, sq / p->n - mean * mean));
        /* Highest match first, fewer running requests among equal matches, within the bound. */
        uint32_t best = 0, best_load = UINT32_MAX;
        for (unsigned w = 0; w < p->n; w++) {
            uint32_t m = aibrix_match(p, r, w);
            if (!m || (double)v[w].inflight > mean + AIB_STDDEV_FACTOR * sd)
                continue;
            if (m > best || (m == best && v[w].inflight < best_load)) {
                best = m;
                best_load = v[w].inflight;
                pick = w;
            }
        }
    }
    if (pick == p->n)
        pick = least_running(v, p->n, id);
    *predicted = aibrix_match(p, r, pick);
    for (uint32_t i = 0; i < r->nblocks; i++) {
        uint64_t k = pod_key(r->keys[i], pick);
        remember(p->table, &k, 1);
    }
    return pick;
}

/* ---- consistent hashing with bounded load -------------------------------------------------- */

static unsigned chwbl(const replay_peer_router *p, const replay_request *r, uint32_t id,
                      const replay_engine_view *v)
{
    uint64_t total = 0;
    for (unsigned w = 0; w < p->n; w++)
        total += v[w].inflight;
    double bound = ceil(CH_LOAD_FACTOR * (double)(total + 1) / p->n);
    uint64_t h = kvg_policy_mix64(r->nblocks ? r->keys[0] : 0x100000000ull + id);
    size_t lo = 0, hi = p->nring; /* the first point at or after h, wrapping */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->ring[mid].hash < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = 0; i < p->nring; i++) {
        unsigned w = p->ring[(lo + i) % p->nring].worker;
        if ((double)v[w].inflight + 1 <= bound)
            return w;
    }
    return p->ring[lo % p->nring].worker; /* not reached: some worker is at or below the mean */
}

int replay_peer_decide(replay_peer_router *p, const replay_request *req, uint32_t id,
                       const replay_engine_view *views, unsigned *worker, uint32_t *predicted)
{
    *predicted = 0;
    switch (p->kind) {
    case REPLAY_PEER_SGLANG:
        *worker = sglang(p, req, id, views, predicted);
        return 0;
    case REPLAY_PEER_DYNAMO:
        *worker = dynamo(p, req, id, views, predicted);
        return 0;
    case REPLAY_PEER_LLMD:
        *worker = llmd(p, req, id, views, predicted);
        return 0;
    case REPLAY_PEER_AIBRIX:
        *worker = aibrix(p, req, id, views, predicted);
        return 0;
    case REPLAY_PEER_CHWBL:
        *worker = chwbl(p, req, id, views);
        return 0;
    default:
        return -EINVAL;
    }
}

void replay_peer_first_token(replay_peer_router *p, unsigned worker, const replay_request *req,
                             uint32_t id)
{
    (void)req;
    if (p->kind == REPLAY_PEER_DYNAMO) {
        p->active_prefill[worker] -= p->charged[id];
        p->charged[id] = 0;
    }
}

void replay_peer_done(replay_peer_router *p, unsigned worker, const replay_request *req,
                      uint32_t id)
{
    (void)id;
    if (p->kind == REPLAY_PEER_DYNAMO)
        replay_cache_unpin(p->index[worker], req->keys, req->nblocks);
}
