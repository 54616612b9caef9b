/* SPDX-License-Identifier: Apache-2.0 */
/* The simulation in virtual time: engines with a KV cache, a running limit and a waiting queue,
 * fed by the router driver; and the two references, the ceiling and the pooled LRU. */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { EV_FIRST_TOKEN = 0, EV_DONE };

typedef struct engine {
    replay_cache *cache;
    uint32_t inflight; /* routed here and not finished */
    uint32_t running;
    uint64_t busy_us;         /* time spent prefilling: the model's one exclusive resource */
    uint64_t prefill_free_us; /* prefills run one at a time: when the current one ends */
    uint32_t *queue;          /* waiting requests, FIFO ring */
    size_t qhead, qlen, qcap;
} engine;

typedef struct req_state {
    unsigned worker;
    uint32_t predicted; /* matched blocks the router saw on the chosen worker */
    uint32_t hits;      /* leading blocks the engine held when it admitted the request */
    uint64_t start_us;  /* its prefill began */
    uint64_t first_token_us;
} req_state;

typedef struct sim {
    const replay_trace *t;
    const replay_engine_config *ec;
    replay_router *router;    /* kvgate's policies */
    replay_peer_router *peer; /* or a peer's */
    replay_engine_view *views;
    engine *engines;
    req_state *rs;
    replay_heap heap;
    replay_row *row;
    double *ttft_ms, *queue_ms;
    size_t nttft;
} sim;

static int queue_push(engine *e, uint32_t req)
{
    if (e->qlen == e->qcap) {
        size_t nc = e->qcap ? e->qcap * 2 : 64;
        uint32_t *q = malloc(nc * sizeof(*q));
        if (!q)
            return -ENOMEM;
        for (size_t i = 0; i < e->qlen; i++)
            q[i] = e->queue[(e->qhead + i) % e->qcap];
        free(e->queue);
        e->queue = q;
        e->qhead = 0;
        e->qcap = nc;
    }
    e->queue[(e->qhead + e->qlen++) % e->qcap] = req;
    return 0;
}

/* Admit waiting requests in order while they fit (vLLM's FCFS: the head blocks the rest). An
 * idle engine takes its head even when it does not fit: the blocks beyond the capacity are
 * computed and not kept. */
static int admit(sim *s, unsigned w, uint64_t now)
{
    engine *e = &s->engines[w];
    while (e->qlen && e->running < s->ec->max_running) {
        uint32_t id = e->queue[e->qhead];
        const replay_request *r = &s->t->reqs[id];
        if (e->running && !replay_cache_fits(e->cache, r->keys, r->nblocks))
            break;
        e->qhead = (e->qhead + 1) % e->qcap;
        e->qlen--;
        req_state *st = &s->rs[id];
        st->hits = replay_cache_match(e->cache, r->keys, r->nblocks);
        replay_cache_pin(e->cache, r->keys, r->nblocks);
        e->running++;
        uint64_t cached = 0;
        for (uint32_t i = 0; i < st->hits; i++)
            cached += replay_block_tokens(r, i);
        uint64_t uncached = r->input_tokens - KVG_MIN(cached, (uint64_t)r->input_tokens);
        uint64_t start = KVG_MAX(now, e->prefill_free_us);
        uint64_t first = start + (uint64_t)((double)uncached * s->ec->prefill_us + 0.5);
        e->prefill_free_us = first;
        e->busy_us += first - start;
        st->start_us = start;
        st->first_token_us = first;
        s->row->hit_blocks += st->hits;
        s->row->hit_tokens += cached;
        if (replay_heap_push(&s->heap, first, id, EV_FIRST_TOKEN) < 0)
            return -ENOMEM;
    }
    return 0;
}

static int handle(sim *s, const replay_event *ev)
{
    const replay_request *r = &s->t->reqs[ev->req];
    req_state *st = &s->rs[ev->req];
    engine *e = &s->engines[st->worker];
    if (ev->kind == EV_FIRST_TOKEN) {
        s->queue_ms[s->nttft] = (double)(st->start_us - r->arrival_us) / 1000.0;
        s->ttft_ms[s->nttft++] = (double)(ev->time_us - r->arrival_us) / 1000.0;
        if (s->peer) {
            replay_peer_first_token(s->peer, st->worker, r, ev->req);
        } else {
            replay_router_first_token(s->router, st->worker, r, st->predicted);
            if (!s->ec->record_at_decision)
                replay_router_record(s->router, st->worker, r, st->predicted);
        }
        uint32_t decode = r->output_tokens ? r->output_tokens - 1 : 0;
        uint64_t done = ev->time_us + (uint64_t)((double)decode * s->ec->decode_us + 0.5);
        return replay_heap_push(&s->heap, done, ev->req, EV_DONE);
    }
    replay_cache_unpin(e->cache, r->keys, r->nblocks);
    e->running--;
    e->inflight--;
    if (s->peer)
        replay_peer_done(s->peer, st->worker, r, ev->req);
    else
        replay_router_done(s->router, st->worker);
    return admit(s, st->worker, ev->time_us);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest rank: the smallest value with at least p of the values at or below it. */
static double percentile(const double *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t rank = (size_t)(p * (double)n + 0.999999999);
    if (rank < 1)
        rank = 1;
    return v[KVG_MIN(rank, n) - 1];
}

/* max / mean of n values; 0 when they are all 0. */
static double max_over_mean(const uint64_t *v, unsigned n)
{
    uint64_t max = 0, sum = 0;
    for (unsigned i = 0; i < n; i++) {
        sum += v[i];
        max = KVG_MAX(max, v[i]);
    }
    return sum ? (double)max * n / (double)sum : 0;
}

static double mean(const double *v, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    return n ? sum / (double)n : 0;
}

static int decide(sim *s, const replay_request *r, uint32_t id, unsigned *w, uint32_t *predicted)
{
    if (!s->peer) {
        int rc = replay_router_decide(s->router, r, w, predicted);
        if (rc == 0 && s->ec->record_at_decision)
            replay_router_record(s->router, *w, r, *predicted);
        return rc;
    }
    for (unsigned i = 0; i < s->ec->workers; i++) {
        const engine *e = &s->engines[i];
        s->views[i] = (replay_engine_view){
            .inflight = e->inflight,
            .running = e->running,
            .waiting = (uint32_t)e->qlen,
            .cache = e->cache,
            .capacity = s->ec->capacity,
        };
    }
    return replay_peer_decide(s->peer, r, id, s->views, w, predicted);
}

static int run(sim *s)
{
    const replay_trace *t = s->t;
    replay_row *row = s->row;
    for (unsigned w = 0; w < s->ec->workers; w++) {
        int rc = replay_cache_new(s->ec->capacity, &s->engines[w].cache);
        if (rc < 0)
            return rc;
    }
    for (size_t i = 0; i < t->n; i++) {
        const replay_request *r = &t->reqs[i];
        /* What happened up to the arrival comes first (completions free slots and load). */
        const replay_event *top;
        while ((top = replay_heap_top(&s->heap)) && top->time_us <= r->arrival_us) {
            replay_event ev;
            replay_heap_pop(&s->heap, &ev);
            int rc = handle(s, &ev);
            if (rc < 0)
                return rc;
        }
        unsigned w;
        int rc = decide(s, r, (uint32_t)i, &w, &s->rs[i].predicted);
        if (rc < 0)
            return rc;
        s->engines[w].inflight++;
        s->rs[i].worker = w;
        row->per_worker[w]++;
        row->predicted_blocks += s->rs[i].predicted;
        rc = queue_push(&s->engines[w], (uint32_t)i);
        if (rc < 0)
            return rc;
        rc = admit(s, w, r->arrival_us);
        if (rc < 0)
            return rc;
    }
    replay_event ev;
    while (replay_heap_pop(&s->heap, &ev)) {
        int rc = handle(s, &ev);
        if (rc < 0)
            return rc;
    }
    qsort(s->ttft_ms, s->nttft, sizeof(*s->ttft_ms), cmp_double);
    qsort(s->queue_ms, s->nttft, sizeof(*s->queue_ms), cmp_double);
    row->ttft_mean_ms = mean(s->ttft_ms, s->nttft);
    row->ttft_p50_ms = percentile(s->ttft_ms, s->nttft, 0.50);
    row->ttft_p99_ms = percentile(s->ttft_ms, s->nttft, 0.99);
    row->has_queue = true;
    row->queue_mean_ms = mean(s->queue_ms, s->nttft);
    row->queue_p99_ms = percentile(s->queue_ms, s->nttft, 0.99);
    for (unsigned w = 0; w < s->ec->workers; w++)
        row->busy_us[w] = s->engines[w].busy_us;
    row->imbalance = max_over_mean(row->per_worker, row->nworkers);
    row->busy_imbalance = max_over_mean(row->busy_us, row->nworkers);
    return 0;
}

static void row_start(replay_row *row, const replay_trace *t, const char *name)
{
    memset(row, 0, sizeof(*row));
    snprintf(row->name, sizeof(row->name), "%s", name);
    row->requests = t->n;
    row->blocks = t->blocks;
    row->tokens = t->tokens;
}

int replay_simulate(const replay_trace *t, const replay_engine_config *ec, const replay_policy *p,
                    replay_row *out)
{
    uint64_t t0 = kvg_now_ns();
    replay_row row;
    row_start(&row, t, p->name);
    row.policy = true;
    row.capacity = ec->capacity;
    row.nworkers = ec->workers;
    sim s = {.t = t, .ec = ec, .row = &row};
    replay_heap_init(&s.heap);
    row.per_worker = calloc(ec->workers, sizeof(*row.per_worker));
    row.busy_us = calloc(ec->workers, sizeof(*row.busy_us));
    s.engines = calloc(ec->workers, sizeof(*s.engines));
    s.rs = calloc(t->n ? t->n : 1, sizeof(*s.rs));
    s.ttft_ms = malloc((t->n ? t->n : 1) * sizeof(*s.ttft_ms));
    s.queue_ms = malloc((t->n ? t->n : 1) * sizeof(*s.queue_ms));
    s.views = calloc(ec->workers, sizeof(*s.views));
    int rc = -ENOMEM;
    if (row.per_worker && row.busy_us && s.engines && s.rs && s.ttft_ms && s.queue_ms && s.views)
        rc = p->peer ? replay_peer_new(p->peer, ec->workers, ec->capacity, t->n, &s.peer)
                     : replay_router_new(&p->cfg, ec->workers, ec->capacity, &s.router);
    if (rc == 0)
        rc = run(&s);
    replay_router_free(s.router);
    replay_peer_free(s.peer);
    free(s.views);
    for (unsigned w = 0; s.engines && w < ec->workers; w++) {
        replay_cache_free(s.engines[w].cache);
        free(s.engines[w].queue);
    }
    free(s.engines);
    free(s.rs);
    free(s.ttft_ms);
    free(s.queue_ms);
    replay_heap_done(&s.heap);
    if (rc < 0) {
        replay_row_done(&row);
        return rc;
    }
    row.seconds = (double)(kvg_now_ns() - t0) / 1e9;
    *out = row;
    return 0;
}

/* Each request in arrival order: its leading blocks held count as hits, then it is pinned and
 * unpinned at once (held as the most recent, its first block the most recent of all). */
static int lru_pass(const replay_trace *t, uint64_t capacity, replay_row *row)
{
    if (capacity > UINT32_MAX)
        return -EINVAL;
    replay_cache *c;
    int rc = replay_cache_new((uint32_t)capacity, &c);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < t->n; i++) {
        const replay_request *r = &t->reqs[i];
        uint32_t hits = replay_cache_match(c, r->keys, r->nblocks);
        row->hit_blocks += hits;
        for (uint32_t b = 0; b < hits; b++)
            row->hit_tokens += replay_block_tokens(r, b);
        replay_cache_pin(c, r->keys, r->nblocks);
        replay_cache_unpin(c, r->keys, r->nblocks);
    }
    row->capacity = capacity;
    replay_cache_free(c);
    return 0;
}

int replay_ceiling(const replay_trace *t, replay_row *out, uint64_t *distinct)
{
    uint64_t t0 = kvg_now_ns();
    replay_row row;
    row_start(&row, t, "ceiling");
    /* A cache as large as the trace never evicts: it is the set of blocks seen. */
    int rc = lru_pass(t, t->blocks, &row);
    if (rc < 0)
        return rc;
    row.capacity = 0;
    row.seconds = (double)(kvg_now_ns() - t0) / 1e9;
    *distinct = row.blocks - row.hit_blocks;
    *out = row;
    return 0;
}

int replay_pooled_lru(const replay_trace *t, uint64_t capacity, replay_row *out)
{
    uint64_t t0 = kvg_now_ns();
    replay_row row;
    row_start(&row, t, "pooled_lru");
    int rc = lru_pass(t, capacity, &row);
    if (rc < 0)
        return rc;
    row.seconds = (double)(kvg_now_ns() - t0) / 1e9;
    *out = row;
    return 0;
}

void replay_row_done(replay_row *row)
{
    free(row->per_worker);
    free(row->busy_us);
    row->per_worker = NULL;
    row->busy_us = NULL;
}
