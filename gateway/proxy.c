/* SPDX-License-Identifier: Apache-2.0 */
/* The front handler for the OpenAI API: reads the body, picks a worker through policy/,
 * forwards over the upstream pool, streams the answer back with backpressure both ways, and
 * retries another worker when a connection fails before any response byte or a worker answers
 * 502/503/504 before anything reached the client (upstream.retry_on, under a retry budget);
 * every attempt's result feeds the worker's passive outlier detection. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decide.h"
#include "gateway_int.h"
#include "sock.h"
#include "policy.h"
#include "handlers.h"
#include "probe.h"
#include "resp_affinity.h"
#include "tenancy.h"
#include "upstream.h"

/* Workers a request may be offered to, best first: an attempt per connect failure (retries is
 * at most 16) plus skips of workers at max_inflight. Only these places are ranked; ranking all
 * costs microseconds per decision with hundreds of workers (bench/route). */
#define PROXY_MAX_CANDIDATES 16

typedef struct proxy_req {
    kvg_exchange *x;
    kvg_worker *cands[PROXY_MAX_CANDIDATES]; /* ranked, referenced */
    size_t ncands;
    size_t next;
    kvg_worker *worker; /* current attempt, one of cands */
    bool inflight_held;
    uint32_t pending_held; /* blocks added to worker's pending count (kvg_worker_pending_add) */
    bool stale_retry_used; /* one free retry after a pooled connection turned out dead */
    bool retry_held;       /* holds a place in the retry budget until the request ends */
    kvg_upstream *up;
    int status; /* status passed to the client */
    uint64_t ttfb_ns;
    kvg_tenant *tenant; /* referenced; NULL in open mode */
    bool admitted;      /* holds one of the tenant's in-flight slots */
    kvg_body_info info;
    kvg_body_api api;          /* completions, chat or other: where the prompt is */
    kvg_decide decide;         /* where the request goes, possibly after a Redis lookup */
    kvg_route_decision route;  /* valid once a worker is tried */
    uint64_t parse_ns;         /* the body scan, for the decision's stage timings */
    uint32_t attempt_matched;  /* blocks the current worker was predicted to hold */
    kvg_usage_scan usage;      /* the engine's usage report, read from a 200 response */
    kvg_body_plan plan;        /* the body with the scope's cache_salt, as pieces */
    struct evbuffer *salted;   /* the body with the scope's cache_salt (and no client salt) */
    struct evbuffer *unsalted; /* the body without any cache_salt, for workers that take none */
    bool verbatim;             /* a multipart body: forwarded as it came, routed by load */
    char salt[KVG_SALT_LEN + 1];

    /* Time to first token and between output events (time_output). */
    bool body_started;        /* a body byte of the 200 answer arrived */
    bool sse;                 /* the answer is an event stream: TTFT is its first output */
    uint64_t events_seen;     /* usage.output_events already timed */
    uint64_t first_output_ns; /* monotonic */
    uint64_t last_output_ns;
    const char *pin;           /* the worker that holds the response this request needs */
    kvg_resp_id_scan *id_scan; /* a /v1/responses answer: looking for its id (arena) */
    bool by_id;                /* /v1/responses/{id}[/cancel]: any body forwarded as it came */
} proxy_req;

typedef enum proxy_route {
    ROUTE_NONE = 0,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_RESPONSES,   /* POST /v1/responses: prefix-aware like chat */
    ROUTE_RESPONSE_ID, /* GET, DELETE /v1/responses/{id}, POST .../{id}/cancel: to its worker */
    ROUTE_EMBEDDINGS,
    ROUTE_MODELS,
    ROUTE_MODEL,       /* GET /v1/models/{id} */
    ROUTE_PASSTHROUGH, /* a configured passthrough path: by model, no prefix */
    ROUTE_COUNT,
} proxy_route;

static void try_next(proxy_req *r);
static void forward(proxy_req *r);
static void decided(kvg_decide *s, int rc);
static struct evbuffer *body_for(proxy_req *r, kvg_worker *w, int *rc);

static size_t path_len(const char *path)
{
    const char *q = strchr(path, '?');
    return q ? (size_t)(q - path) : strlen(path);
}

#define RESPONSE_PREFIX "/v1/responses/"
#define RESPONSE_PREFIX_LEN (sizeof(RESPONSE_PREFIX) - 1)

#define MODEL_PREFIX "/v1/models/"
#define MODEL_PREFIX_LEN (sizeof(MODEL_PREFIX) - 1)

static proxy_route classify(const kvg_config *cfg, const char *path)
{
    size_t n = path_len(path);
    static const struct {
        const char *path;
        proxy_route route;
    } routes[] = {
        {"/v1/completions", ROUTE_COMPLETIONS}, {"/v1/chat/completions", ROUTE_CHAT},
        {"/v1/responses", ROUTE_RESPONSES},     {"/v1/embeddings", ROUTE_EMBEDDINGS},
        {"/v1/models", ROUTE_MODELS},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(routes); i++)
        if (strlen(routes[i].path) == n && memcmp(routes[i].path, path, n) == 0)
            return routes[i].route;
    if (n > MODEL_PREFIX_LEN && memcmp(path, MODEL_PREFIX, MODEL_PREFIX_LEN) == 0)
        return ROUTE_MODEL;
    if (n > RESPONSE_PREFIX_LEN && memcmp(path, RESPONSE_PREFIX, RESPONSE_PREFIX_LEN) == 0)
        return ROUTE_RESPONSE_ID;
    for (size_t i = 0; i < cfg->npassthrough_paths; i++)
        if (strlen(cfg->passthrough_paths[i]) == n &&
            memcmp(cfg->passthrough_paths[i], path, n) == 0)
            return ROUTE_PASSTHROUGH;
    return ROUTE_NONE;
}

/* ---- finishing ------------------------------------------------------------------------------- */

/* The worker has started answering (or the attempt ended): its prefill of this prompt is no
 * longer queued ahead of other requests. */
static void release_pending(proxy_req *r)
{
    if (r->pending_held && r->worker) {
        kvg_worker_pending_done(r->worker, r->pending_held);
        r->pending_held = 0;
    }
}

static void release_worker(proxy_req *r)
{
    release_pending(r);
    if (r->inflight_held && r->worker) {
        kvg_worker_inflight_release(r->worker);
        r->inflight_held = false;
    }
}

static void release_retry(proxy_req *r)
{
    if (r->retry_held) {
        kvg_registry_retry_release(r->x->thread->gw->registry);
        r->retry_held = false;
    }
}

/* Feed the current attempt's result to the worker's outlier detection (all threads share the
 * worker's streaks). Only what the worker did counts: the gateway's own refusals (503
 * overloaded, no healthy worker, out of descriptors) never reach here. */
static void observe(proxy_req *r, kvg_outlier_result res)
{
    if (!r->worker)
        return;
    kvg_thread *t = r->x->thread;
    kvg_outlier_config oc = kvg_config_outlier(&t->gw->cfg.upstream);
    uint64_t len;
    if (kvg_worker_outlier_observe(r->worker, kvg_thread_workers(t), res, kvg_sock_clock_ns(), &oc,
                                   &len))
        kvg_log_warn("worker %s ejected for %llu ms by outlier detection (last: %s)",
                     kvg_worker_name(r->worker), (unsigned long long)(len / 1000000),
                     kvg_outlier_result_str(res));
}

typedef enum retry_verdict {
    RETRY_YES = 0,
    RETRY_NO,     /* not in retry_on, past upstream.retries, or no candidate left */
    RETRY_BUDGET, /* the retry budget is spent */
} retry_verdict;

/* May the request go to another worker after this attempt ended with kind (a KVG_RETRY_ON_*
 * bit)? Asks, in order: retry_on, the retry limit, a candidate left, and for a worker's 5xx the
 * retry budget (one place per request, taken at its first such retry and held until it ends). A
 * budget refusal is logged and counted (kvgate_upstream_retry_budget_exceeded_total).
 * Connect failures and resets before the first byte stay outside the budget, as before it
 * existed: the worker did no work for them (a refused connect) or none it could finish, and
 * upstream.retries bounds them; the storm a budget prevents is of requests that sick workers
 * answer, and then answer again. */
static retry_verdict may_retry(proxy_req *r, uint32_t kind, const char *what)
{
    kvg_exchange *x = r->x;
    kvg_gateway *gw = x->thread->gw;
    const kvg_upstream_config *uc = &gw->cfg.upstream;
    if (!(kvg_config_retry_on(uc) & kind) || x->retries >= uc->retries || r->next >= r->ncands)
        return RETRY_NO;
    if (r->retry_held || !(kind & (KVG_RETRY_ON_502 | KVG_RETRY_ON_503 | KVG_RETRY_ON_504)))
        return RETRY_YES;
    if (!kvg_registry_retry_acquire(gw->registry, kvg_thread_workers(x->thread),
                                    uc->retry_budget_percent, uc->retry_budget_min_concurrency)) {
        kvg_log_warn("request %s: worker %s %s; no retry: the retry budget is spent", x->request_id,
                     kvg_worker_name(r->worker), what);
        return RETRY_BUDGET;
    }
    r->retry_held = true;
    return RETRY_YES;
}

/* Compare the prediction with what the engine reported, for a completed 200 answer. */
static void record_usage(proxy_req *r)
{
    if (r->api == KVG_BODY_API_OTHER)
        return;
    int64_t prompt = r->usage.value[KVG_USAGE_PROMPT_TOKENS];
    int64_t cached = r->usage.value[KVG_USAGE_CACHED_TOKENS];
    uint64_t predicted = kvg_route_predicted_tokens(&r->route, r->attempt_matched, prompt);
    kvg_worker_record_usage(r->worker, predicted, prompt, cached);
    int64_t completion = r->usage.value[KVG_USAGE_COMPLETION_TOKENS];
    kvg_worker_record_output_tokens(r->worker, completion);
    if (r->tenant) {
        kvg_tenant_record_usage(r->tenant, predicted, prompt, cached);
        kvg_tenant_record_output_tokens(r->tenant, completion);
    }
    if (completion >= 0) {
        r->x->output_tokens = completion;
        r->x->have_output_tokens = true;
    }
}

static void finish(proxy_req *r, int status)
{
    kvg_exchange *x = r->x;
    kvg_decide_cancel(&r->decide);
    release_worker(r);
    release_retry(r);
    if (r->worker) {
        uint64_t now = kvg_sock_clock_ns();
        kvg_worker_record(r->worker, status, now - x->start_ns, r->ttfb_ns);
        if (status == 200 && r->status == 200)
            record_usage(r);
    }
    for (size_t i = 0; i < r->ncands; i++)
        kvg_worker_unref(r->cands[i]);
    r->ncands = 0;
    if (r->tenant) {
        if (r->admitted)
            kvg_tenant_release(r->tenant);
        /* Prompt bytes count for admitted requests only: a refused one (400, 403, 429) never
         * reached a worker. */
        kvg_tenant_record(r->tenant, status, r->admitted ? r->info.prompt_bytes : 0);
        kvg_tenant_unref(r->tenant);
        r->tenant = NULL;
    }
    /* An upstream still sending them holds its own references to the bytes. */
    if (r->salted)
        evbuffer_free(r->salted);
    if (r->unsalted)
        evbuffer_free(r->unsalted);
    r->salted = r->unsalted = NULL;
    x->handler_state = NULL; /* r lives in x's arena and goes with it */
    kvg_exchange_detach(x);
}

static void fail(proxy_req *r, int status, const char *type, const char *msg)
{
    kvg_exchange_send_error(r->x, status, type, "%s", msg);
    finish(r, status);
}

/* ---- upstream callbacks ---------------------------------------------------------------------- */

/* The x-kvgate- namespace is the gateway's: what it says there in either direction is its own
 * (x-kvgate-worker on responses), never a client's or a worker's. */
static bool gateway_namespace(const kvg_header *h)
{
    return h->name_len >= 9 && memcmp(h->name, "x-kvgate-", 9) == 0; /* names are lowercase */
}

/* A header name as the filters below compare it: names are lowercase on both sides, so a
 * length check and a memcmp; the lengths are in the tables because a loop over an array of
 * strings calls strlen for each (~650 instructions a request, callgrind 2026-12-02). */
typedef struct header_name {
    const char *s;
    size_t n;
} header_name;

#define NAME(lit)                                                                                  \
    {                                                                                              \
        lit, sizeof(lit) - 1                                                                       \
    }

static bool named_in(const kvg_header *h, const header_name *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (h->name_len == names[i].n && memcmp(h->name, names[i].s, names[i].n) == 0)
            return true;
    return false;
}

/* Response headers not passed to the client: hop-by-hop ones, and ours that the gateway sets. */
static bool hop_by_hop(const kvg_header *h)
{
    static const header_name names[] = {
        NAME("connection"),
        NAME("keep-alive"),
        NAME("proxy-connection"),
        NAME("transfer-encoding"),
        NAME("te"),
        NAME("trailer"),
        NAME("upgrade"),
        NAME("content-length"),
        NAME("x-request-id"),
    };
    return named_in(h, names, KVG_ARRAY_LEN(names)) || gateway_namespace(h);
}

/* Whether a head has a Connection header at all: most have none, and then no header is named
 * by one (the check below is per header over all headers). */
static bool has_connection(const kvg_header *all, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (kvg_strcaseeq(all[i].name, all[i].name_len, "connection"))
            return true;
    return false;
}

/* Headers named in the Connection header are hop-by-hop too (RFC 9110 7.6.1). */
static bool named_by_connection(const kvg_header *h, const kvg_header *all, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!kvg_strcaseeq(all[i].name, all[i].name_len, "connection"))
            continue;
        const char *v = all[i].value, *end = v + all[i].value_len;
        while (v < end) {
            while (v < end && (*v == ' ' || *v == '\t' || *v == ','))
                v++;
            const char *tok = v;
            while (v < end && *v != ',' && *v != ' ' && *v != '\t')
                v++;
            if (v > tok && kvg_strncaseeq(tok, (size_t)(v - tok), h->name, h->name_len))
                return true;
        }
    }
    return false;
}

/* A 502/503/504 from the worker before anything reached the client: hold its head back, drop
 * the connection (and with it the error body) and try the next candidate. True when retrying. */
static bool retry_error_head(proxy_req *r, int status)
{
    uint32_t kind = status == 502   ? KVG_RETRY_ON_502
                    : status == 503 ? KVG_RETRY_ON_503
                    : status == 504 ? KVG_RETRY_ON_504
                                    : 0;
    if (!kind || kvg_exchange_head_sent(r->x))
        return false;
    char what[32];
    snprintf(what, sizeof(what), "answered %d", status);
    if (may_retry(r, kind, what) != RETRY_YES)
        return false;
    observe(r, KVG_OUTLIER_GATEWAY_ERROR);
    /* Closing is simpler than reading the body to its end for the pool, and an error body is
     * no reason to keep a connection to a sick worker. */
    kvg_upstream_abort(r->up);
    r->up = NULL;
    release_worker(r);
    kvg_worker_record_retry(r->worker);
    kvg_log_info("request %s: worker %s %s, trying another", r->x->request_id,
                 kvg_worker_name(r->worker), what);
    r->x->retries++;
    try_next(r);
    return true;
}

static void up_head(void *ud, int status, const kvg_header *hdrs, size_t n, int64_t content_length)
{
    proxy_req *r = ud;
    kvg_exchange *x = r->x;
    if (retry_error_head(r, status))
        return;
    bool conn = has_connection(hdrs, n);
    for (size_t i = 0; i < n; i++) {
        if (hop_by_hop(&hdrs[i]) || (conn && named_by_connection(&hdrs[i], hdrs, n)))
            continue;
        kvg_exchange_add_header(x, hdrs[i].name, hdrs[i].name_len, hdrs[i].value,
                                hdrs[i].value_len);
    }
    if (x->thread->gw->cfg.worker_header) {
        const char *name = kvg_worker_name(r->worker);
        kvg_exchange_add_header(x, "x-kvgate-worker", 15, name, strlen(name));
    }
    kvg_exchange_add_header(x, "x-request-id", 12, x->request_id, strlen(x->request_id));
    r->status = status;
    r->ttfb_ns = kvg_sock_clock_ns() - x->start_ns;
    /* An error answer computed nothing; a 200's prompt is computed by its first body byte
     * (up_data): vLLM streams its head before the first token. */
    if (status != 200)
        release_pending(r);
    /* The engine took the request: it holds the prompt's blocks from now on (it computes them
     * before its first token). */
    if (status == 200)
        kvg_router_record(x->thread->gw->router, x->thread->redis, r->worker, &r->route,
                          r->attempt_matched);
    kvg_exchange_respond(x, status, content_length);
}

static bool has_content_type(const kvg_exchange *x)
{
    for (size_t i = 0; i < x->resp_nheaders; i++)
        if (kvg_strcaseeq(x->resp_headers[i].name, x->resp_headers[i].name_len, "content-type"))
            return true;
    return false;
}

static bool is_event_stream(const kvg_exchange *x)
{
    static const char sse[] = "text/event-stream";
    for (size_t i = 0; i < x->resp_nheaders; i++) {
        const kvg_header *h = &x->resp_headers[i];
        if (kvg_strcaseeq(h->name, h->name_len, "content-type"))
            return h->value_len >= sizeof(sse) - 1 &&
                   kvg_strncaseeq(h->value, sizeof(sse) - 1, sse, sizeof(sse) - 1);
    }
    return false;
}

/* Time to first token and the gaps between output events (the usage scanner counts the events),
 * on the exchange's own thread. A stream's events that arrive in one read share the time since
 * the previous output event equally; those that arrive with the first one count gaps of 0. */
static void time_output(proxy_req *r)
{
    kvg_exchange *x = r->x;
    uint64_t n;
    if (!r->body_started) {
        r->body_started = true;
        /* The content type says; a worker that sends none streams what was asked for. */
        r->sse = is_event_stream(x) || (r->info.stream && !has_content_type(x));
    }
    if (r->sse) {
        n = r->usage.output_events - r->events_seen;
        r->events_seen = r->usage.output_events;
    } else {
        n = x->ttft_ns == 0; /* a JSON answer: its first byte is the first token */
    }
    if (n == 0)
        return;
    uint64_t now = kvg_sock_clock_ns(), gap = 0, events = n;
    if (x->ttft_ns == 0) {
        x->ttft_ns = now > x->start_ns ? now - x->start_ns : 1;
        r->first_output_ns = now;
        kvg_worker_record_ttft(r->worker, x->ttft_ns);
        if (r->tenant)
            kvg_tenant_record_ttft(r->tenant, x->ttft_ns);
        n--; /* the gaps: one per event after the first */
    } else {
        gap = (now - r->last_output_ns) / n;
    }
    r->last_output_ns = now;
    if (!r->sse)
        return;
    x->output_events += events;
    x->output_span_ns = now - r->first_output_ns;
    if (n) {
        kvg_worker_record_itl(r->worker, gap, n);
        if (r->tenant)
            kvg_tenant_record_itl(r->tenant, gap, n);
    }
}

/* The request's sharing scope, which keys the response affinity as it salts the cache. */
static const char *scope_of(const proxy_req *r)
{
    return r->tenant ? kvg_tenant_scope(r->tenant) : "global";
}

/* A /v1/responses answer: remember which worker made the response it names (its first
 * "id":"resp_..."), for the requests that will need it (resp_affinity.h). */
static void learn_response_id(proxy_req *r, const char *data, size_t len)
{
    if (!r->id_scan) {
        r->id_scan = kvg_arena_alloc(&r->x->arena, sizeof(*r->id_scan));
        if (!r->id_scan)
            return; /* affinity is an optimisation: without memory, the normal rule */
        memset(r->id_scan, 0, sizeof(*r->id_scan));
    }
    const char *id;
    size_t n;
    if (r->worker && kvg_resp_id_scan_feed(r->id_scan, data, len, &id, &n))
        kvg_resp_affinity_learn(scope_of(r), id, n, kvg_worker_name(r->worker));
}

/* The worker remembered for response id [id, id + n) in the request's scope, as its pin
 * (arena); none when unknown. */
static void pin_response(proxy_req *r, const char *id, size_t n)
{
    char name[KVG_WORKER_NAME_MAX + 1];
    if (kvg_resp_affinity_find(scope_of(r), id, n, name, sizeof(name)))
        r->pin = kvg_arena_strdup(&r->x->arena, name);
}

/* Put the pinned worker first among the candidates, when it is one (healthy, serving the
 * model, not draining); else the decision stands. */
static void apply_pin(proxy_req *r)
{
    kvg_route_decision *d = &r->route;
    for (size_t i = 0; r->pin && i < d->ncands; i++) {
        if (strcmp(kvg_worker_name(d->cands[i].worker), r->pin) != 0)
            continue;
        kvg_route_candidate c = d->cands[i];
        memmove(d->cands + 1, d->cands, i * sizeof(c));
        d->cands[0] = c;
        return;
    }
}

static void up_data(void *ud, const char *data, size_t len)
{
    proxy_req *r = ud;
    release_pending(r);
    if (r->status == 200 && r->api != KVG_BODY_API_OTHER) {
        kvg_usage_scan_feed(&r->usage, data, len);
        time_output(r);
    }
    if (r->status == 200 && r->api == KVG_BODY_API_RESPONSES)
        learn_response_id(r, data, len);
    kvg_exchange_write(r->x, data, len);
    /* Backpressure: a slow client stops us reading the worker, which stops the worker. */
    if (r->up && kvg_exchange_output_full(r->x))
        kvg_upstream_pause(r->up, true);
}

static void up_end(void *ud)
{
    proxy_req *r = ud;
    r->up = NULL;
    observe(r, kvg_outlier_result_of_status(r->status));
    kvg_exchange_end(r->x);
    finish(r, r->status);
}

static void up_error(void *ud, int status, const char *msg)
{
    proxy_req *r = ud;
    r->up = NULL;
    kvg_log_warn("request %s to worker %s failed: %s", r->x->request_id, kvg_worker_name(r->worker),
                 msg);
    /* 503 here is the gateway's own shortage (descriptors, memory), not the worker's doing;
     * 502 (broken, truncated) and 504 (timeout) are the worker's. */
    if (status != 503)
        observe(r, KVG_OUTLIER_LOCAL_FAILURE);
    if (kvg_exchange_head_sent(r->x)) {
        /* Bytes already went out: the client must see a broken stream, not a clean end. */
        kvg_exchange_reset(r->x);
        finish(r, r->status);
        return;
    }
    fail(r, status, status == 504 ? "timeout" : "upstream_error", msg);
}

static void up_retryable(void *ud, int err, bool connect_failed)
{
    proxy_req *r = ud;
    bool was_reused = r->up && kvg_upstream_reused(r->up);
    const char *what = connect_failed ? "unreachable" : "closed the connection";
    r->up = NULL;
    release_worker(r);
    /* A pooled connection the worker had already closed says nothing about the worker: try it
     * again once on a fresh connection before moving on (not a retry: no budget, no count). */
    if (was_reused && !r->stale_retry_used) {
        r->stale_retry_used = true;
        r->next--;
        kvg_log_info("request %s: pooled connection to worker %s %s (%s), trying a new one",
                     r->x->request_id, kvg_worker_name(r->worker), what, kvg_strerror(err));
        try_next(r);
        return;
    }
    observe(r, KVG_OUTLIER_LOCAL_FAILURE);
    retry_verdict v =
        may_retry(r, connect_failed ? KVG_RETRY_ON_CONNECT_FAILURE : KVG_RETRY_ON_RESET, what);
    if (v != RETRY_YES) {
        kvg_log_warn("request %s: worker %s %s (%s), no retry", r->x->request_id,
                     kvg_worker_name(r->worker), what, kvg_strerror(err));
        fail(r, 502, "upstream_error",
             v == RETRY_BUDGET ? "the worker failed and the retry budget is spent"
             : r->x->retries   ? "no worker could be reached"
             : connect_failed  ? "the worker could not be reached"
                               : "the worker closed the connection before answering");
        return;
    }
    kvg_worker_record_retry(r->worker);
    kvg_log_info("request %s: worker %s %s (%s), trying another", r->x->request_id,
                 kvg_worker_name(r->worker), what, kvg_strerror(err));
    r->x->retries++;
    try_next(r);
}

static const kvg_upstream_cbs upstream_cbs = {
    .on_retryable = up_retryable,
    .on_head = up_head,
    .on_data = up_data,
    .on_end = up_end,
    .on_error = up_error,
};

/* ---- forwarding ------------------------------------------------------------------------------ */

static bool forwardable(const kvg_header *h)
{
    static const header_name drop[] = {
        NAME("host"),
        NAME("content-length"),
        NAME("transfer-encoding"),
        NAME("connection"),
        NAME("keep-alive"),
        NAME("proxy-connection"),
        NAME("te"),
        NAME("trailer"),
        NAME("upgrade"),
        NAME("expect"),
        NAME("authorization"),
        NAME("x-request-id"),
        NAME("x-forwarded-for"),
        NAME("x-forwarded-proto"),
        NAME("http2-settings"),
    };
    return !named_in(h, drop, KVG_ARRAY_LEN(drop)) && !gateway_namespace(h);
}

/* The request head for worker w, composed into the thread's scratch buffer (one copy into the
 * socket's output later; no allocation once the buffer has grown). */
static void build_head(proxy_req *r, kvg_worker *w, struct evbuffer *body, kvg_buf *b)
{
    kvg_exchange *x = r->x;
    char num[24];
    kvg_buf_reset(b);
    kvg_buf_puts(b, x->method);
    kvg_buf_putc(b, ' ');
    kvg_buf_append(b, x->path, path_len(x->path));
    kvg_buf_append(b, " HTTP/1.1\r\nhost: ", 17);
    kvg_buf_puts(b, kvg_worker_authority(w));
    kvg_buf_append(b, "\r\ncontent-length: ", 18);
    kvg_buf_append(b, num, kvg_fmt_u64(num, evbuffer_get_length(body)));
    kvg_buf_append(b, "\r\n", 2);
    bool conn = has_connection(x->headers, x->nheaders);
    for (size_t i = 0; i < x->nheaders; i++) {
        const kvg_header *h = &x->headers[i];
        if (!forwardable(h) || (conn && named_by_connection(h, x->headers, x->nheaders)))
            continue;
        kvg_buf_append(b, h->name, h->name_len);
        kvg_buf_append(b, ": ", 2);
        kvg_buf_append(b, h->value, h->value_len);
        kvg_buf_append(b, "\r\n", 2);
    }
    /* The client's address, without its port, appended to any chain it brought. */
    const char *ip = x->remote;
    const char *colon = strrchr(ip, ':');
    size_t ip_len = colon ? (size_t)(colon - ip) : strlen(ip);
    size_t xff_len;
    const char *xff = kvg_exchange_header(x, "x-forwarded-for", &xff_len);
    kvg_buf_append(b, "x-forwarded-for: ", 17);
    if (xff) {
        kvg_buf_append(b, xff, xff_len);
        kvg_buf_append(b, ", ", 2);
    }
    kvg_buf_append(b, ip, ip_len);
    kvg_buf_append(b, "\r\nx-forwarded-proto: ", 21);
    kvg_buf_puts(b, x->scheme);
    kvg_buf_append(b, "\r\nx-request-id: ", 16);
    kvg_buf_puts(b, x->request_id);
    kvg_buf_append(b, "\r\n\r\n", 4);
}

static void try_next(proxy_req *r)
{
    kvg_exchange *x = r->x;
    bool any_full = false;
    while (r->next < r->ncands) {
        kvg_worker *w = r->cands[r->next++];
        if (!kvg_worker_inflight_try_acquire(w)) {
            any_full = true;
            continue;
        }
        r->worker = w;
        r->inflight_held = true;
        r->attempt_matched = r->route.cands[r->next - 1].matched;
        r->pending_held = kvg_route_pending_units(
            &r->route, r->route.nkeys - KVG_MIN(r->attempt_matched, r->route.nkeys));
        kvg_worker_pending_add(w, r->pending_held);
        kvg_router_speculate(x->thread->gw->router, w, &r->route);
        x->worker_name = kvg_arena_strdup(&x->arena, kvg_worker_name(w));
        int rc = 0;
        struct evbuffer *body = body_for(r, w, &rc);
        if (!body) {
            release_worker(r);
            r->worker = NULL; /* refused by the gateway: nothing to count against w */
            if (rc == -ENOMEM) {
                fail(r, 500, "internal_error", "out of memory");
            } else {
                kvg_exchange_send_body_error(x, rc);
                finish(r, x->status);
            }
            return;
        }
        kvg_buf *head = &x->thread->scratch;
        build_head(r, w, body, head);
        if (head->failed) {
            kvg_buf_done(head); /* clears the sticky failure for the next request */
            fail(r, 500, "internal_error", "out of memory");
            return;
        }
        rc = kvg_upstream_request(x->thread, w, head->data, head->len, body, &upstream_cbs, r,
                                  &r->up);
        if (rc >= 0)
            x->tries++;
        if (rc < 0) {
            fail(r, 500, "internal_error", "cannot start the upstream request");
            return;
        }
        return;
    }
    if (x->retries > 0) {
        fail(r, 502, "upstream_error", "no worker could be reached");
        return;
    }
    if (any_full) {
        kvg_exchange_send_error_retry(x, 503, "overloaded", 1,
                                      "every worker for this model is at its in-flight limit");
        finish(r, 503);
        return;
    }
    fail(r, 503, "service_unavailable", "no healthy worker is available");
}

/* Scan the client's body for salt (NULL: no salt) into a plan of the rewritten body (pieces in
 * the exchange's arena). 0, or the error with err filled. */
static int scan_body(proxy_req *r, kvg_body_api api, const char *salt, kvg_body_plan *plan,
                     kvg_body_info *info, kvg_json_error *err)
{
    kvg_exchange *x = r->x;
    size_t len;
    const char *data = kvg_exchange_body_bytes(x, &len);
    if (!data)
        return -ENOMEM;
    return kvg_body_scan_plan(data, len, api, salt, &x->arena, plan, info, err);
}

/* The rewritten body in a new evbuffer that owns the bytes: the copy the forwarding needs,
 * made once the worker is chosen, and counted in the body budget like the body it copies. The
 * pieces are copied straight into one chain reserved at the plan's length (one allocation,
 * where a growing kvg_buf handed over by reference made four). NULL with *rc: -ENOMEM, or the
 * budget's refusal. */
static struct evbuffer *plan_buffer(proxy_req *r, const kvg_body_plan *plan, int *rc)
{
    /* The first copy was counted with the body (on_head, on_body); a second one (a retry on a
     * worker that takes no salt) is counted now. */
    if ((r->salted || r->unsalted) && (*rc = kvg_exchange_body_charge(r->x, plan->len)) < 0)
        return NULL;
    *rc = -ENOMEM;
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return NULL;
    struct evbuffer_iovec v;
    if (plan->len > 0) {
        if (evbuffer_reserve_space(b, (ev_ssize_t)plan->len, &v, 1) != 1 || v.iov_len < plan->len) {
            evbuffer_free(b);
            return NULL;
        }
        v.iov_len = plan->len;
        if (kvg_body_plan_copy(plan, v.iov_base) < 0 || evbuffer_commit_space(b, &v, 1) < 0) {
            evbuffer_free(b);
            return NULL;
        }
    }
    return b;
}

/* The body worker w gets: with the scope's salt, or - for engines without the field - none.
 * Either way the client's own cache_salt is gone. NULL with *rc as plan_buffer's. */
static struct evbuffer *body_for(proxy_req *r, kvg_worker *w, int *rc)
{
    *rc = -ENOMEM;
    if (kvg_worker_injects_salt(w) || r->verbatim) {
        if (!r->salted)
            r->salted = plan_buffer(r, &r->plan, rc);
        return r->salted;
    }
    if (!r->unsalted) {
        kvg_json_error err;
        kvg_body_info info;
        kvg_body_plan plan;
        if (scan_body(r, KVG_BODY_API_OTHER, NULL, &plan, &info, &err) == 0)
            r->unsalted = plan_buffer(r, &plan, rc);
    }
    return r->unsalted;
}

/* A multipart/form-data body (vLLM's audio endpoints): no JSON to read a model from. */
static bool multipart(kvg_exchange *x)
{
    size_t len;
    const char *ct = kvg_exchange_header(x, "content-type", &len);
    return ct && len >= 10 && kvg_strncaseeq(ct, 10, "multipart/", 10);
}

/* The plan of a body forwarded as it came: one piece, the body itself; no model, no prefix, so
 * the decision goes by load among every worker. Its bytes count as the tenant's prompt bytes.
 * 0 or -ENOMEM. */
static int verbatim_plan(proxy_req *r)
{
    size_t len;
    const char *data = kvg_exchange_body_bytes(r->x, &len);
    kvg_body_piece *piece = kvg_arena_alloc(&r->x->arena, sizeof(*piece));
    if (!data || !piece)
        return -ENOMEM;
    *piece = (kvg_body_piece){data, len};
    r->plan = (kvg_body_plan){.pieces = piece, .npieces = 1, .cap = 1, .len = len};
    memset(&r->info, 0, sizeof(r->info));
    r->info.prompt_bytes = len;
    r->verbatim = true;
    return 0;
}

/* A duration as OpenAI's x-ratelimit-reset-* headers write it: "250ms", "1.5s", "6m0s". */
static int format_reset(char *out, size_t len, double s)
{
    if (!(s > 0))
        return snprintf(out, len, "0s");
    if (s < 1)
        return snprintf(out, len, "%ums", (unsigned)ceil(s * 1000));
    if (s < 60)
        return snprintf(out, len, "%gs", ceil(s * 1000) / 1000);
    double m = floor(s / 60);
    return snprintf(out, len, "%.0fm%gs", m, ceil((s - m * 60) * 1000) / 1000);
}

/* x-ratelimit-{limit,remaining,reset}-requests for a tenant with a requests-per-second limit,
 * as OpenAI sends them, on every answer to an admitted or refused request. limit is the
 * bucket's burst, remaining what it holds after this request, reset the time until it is full
 * again. */
static void add_rate_headers(kvg_exchange *x, kvg_tenant *t, uint64_t now_ns)
{
    kvg_rate_state rs;
    if (!kvg_tenant_rate_state(t, now_ns, &rs))
        return;
    char v[48];
    int n = snprintf(v, sizeof(v), "%.0f", floor(rs.limit));
    kvg_exchange_add_header(x, "x-ratelimit-limit-requests", 26, v, (size_t)n);
    n = snprintf(v, sizeof(v), "%.0f", floor(rs.remaining));
    kvg_exchange_add_header(x, "x-ratelimit-remaining-requests", 30, v, (size_t)n);
    n = format_reset(v, sizeof(v), rs.reset_s);
    kvg_exchange_add_header(x, "x-ratelimit-reset-requests", 26, v, (size_t)n);
}

static void on_body(kvg_exchange *x)
{
    proxy_req *r = x->handler_state;
    kvg_gateway *gw = x->thread->gw;
    /* The scope decides the salt: tenants that share a scope share cache, no one else. */
    const char *scope = r->tenant ? kvg_tenant_scope(r->tenant) : "global";
    if (kvg_salt_cache_get(&x->thread->salts, scope, r->salt) < 0) {
        fail(r, 500, "internal_error", "cannot compute the cache salt");
        return;
    }
    int rc;
    kvg_json_error err = {0};
    uint64_t parse_start = kvg_now_ns();
    if (r->by_id || (r->api == KVG_BODY_API_OTHER && multipart(x)))
        rc = verbatim_plan(r);
    else
        rc = scan_body(r, r->api, r->salt, &r->plan, &r->info, &err);
    uint64_t parsed_at = kvg_now_ns(), parse_ns = parsed_at - parse_start;
    /* Count the rewritten copy the forwarding will make, where on_head could not (no
     * Content-Length), before any work for a worker is done. */
    uint64_t held = x->body_charged, need = evbuffer_get_length(x->body) + r->plan.len;
    if (rc == 0 && need > held && (rc = kvg_exchange_body_charge(x, need - held)) < 0) {
        kvg_exchange_send_body_error(x, rc);
        finish(r, x->status);
        return;
    }
    if (rc < 0) {
        if (rc == -ENOMEM)
            kvg_exchange_send_error(x, 500, "internal_error", "out of memory");
        else if (rc == KVG_ETYPE)
            kvg_exchange_send_error(x, 400, "invalid_request_error", "%s", err.message);
        else
            kvg_exchange_send_error(x, 400, "invalid_request_error",
                                    "the request body is not a valid JSON object: %s at byte %zu",
                                    err.message, err.offset);
        finish(r, rc == -ENOMEM ? 500 : 400);
        return;
    }
    if (r->info.previous_response_id)
        pin_response(r, r->info.previous_response_id, r->info.previous_response_id_len);
    const char *model = r->info.model;
    x->model = model; /* in x's arena, for the access log */
    if (r->tenant && !kvg_tenant_allows_model(r->tenant, model)) {
        kvg_exchange_send_error(x, 403, "permission_error",
                                "The model `%s` is not allowed for this API key.",
                                model ? model : "(none)");
        finish(r, 403);
        return;
    }
    if (r->tenant) {
        unsigned retry_after = 1;
        kvg_admit_result why =
            kvg_tenant_admit(r->tenant, parsed_at, r->info.prompt_bytes, &retry_after);
        add_rate_headers(x, r->tenant, parsed_at);
        if (why != KVG_ADMIT_OK) {
            kvg_tenant_record_refusal(r->tenant, why);
            char msg[160];
            snprintf(msg, sizeof(msg), "rate limit reached (%s); retry after %u s",
                     kvg_admit_result_str(why), retry_after);
            kvg_exchange_send_error_retry(x, 429, "rate_limit_error", retry_after, msg);
            finish(r, 429);
            return;
        }
        r->admitted = true;
    }
    kvg_worker_set *set = kvg_thread_workers(x->thread);
    kvg_route_request rq = {
        .body = &r->info,
        .salt = r->salt,
        .policy = kvg_thread_policy(x->thread),
        .rotation = x->thread->rotation++,
        /* The attempts never go further; a pinned worker must be found wherever it ranks. */
        .rank_limit = r->pin ? 0 : PROXY_MAX_CANDIDATES,
        .clock_ns = kvg_now_ns,
        .start_ns = parsed_at, /* the hash stage: from the end of the parse */
        .now_ns = parsed_at,   /* for the age of scraped load: microseconds do not matter */
        .engine_load_max_age_ns = kvg_scrape_max_age_ns(gw),
    };
    /* Token-exact mode: the model's definition, for the completions and chat APIs. */
    kvg_model_set *models =
        model && (r->api == KVG_BODY_API_CHAT || r->api == KVG_BODY_API_COMPLETIONS)
            ? kvg_thread_models(x->thread)
            : NULL;
    if (models && (rq.model = kvg_model_set_find(models, model, r->info.model_len))) {
        rq.model_input =
            r->api == KVG_BODY_API_CHAT ? KVG_MODEL_INPUT_CHAT : KVG_MODEL_INPUT_COMPLETIONS;
        rq.raw_body = kvg_exchange_body_bytes(x, &rq.raw_len);
    }
    r->parse_ns = parse_ns;
    rc = kvg_decide_start(&r->decide, x, set, &rq, &r->route, decided);
    if (rc == 1)
        forward(r);
    else if (rc < 0)
        fail(r, 500, "internal_error", "out of memory");
}

/* The decision is made: answer what it rules out, then try the best worker. */
static void forward(proxy_req *r)
{
    kvg_exchange *x = r->x;
    kvg_gateway *gw = x->thread->gw;
    r->route.stage_ns[KVG_ROUTE_STAGE_PARSE] = r->parse_ns;
    if (r->route.serving == 0) {
        kvg_worker_set *set = kvg_thread_workers(x->thread);
        const char *model = r->info.model;
        if (model && kvg_worker_set_count(set) > 0) {
            kvg_exchange_send_error(x, 404, "not_found_error", "The model `%s` does not exist.",
                                    model);
            finish(r, 404);
        } else {
            fail(r, 503, "service_unavailable", "no worker is configured");
        }
        return;
    }
    apply_pin(r);
    kvg_router_count(gw->router, &r->route);
    /* References for the attempts we may make: the best few are all a retry budget needs. */
    size_t take = KVG_MIN(r->route.ncands, (size_t)PROXY_MAX_CANDIDATES);
    for (size_t i = 0; i < take; i++)
        r->cands[r->ncands++] = kvg_worker_ref(r->route.cands[i].worker);
    try_next(r);
}

static void decided(kvg_decide *s, int rc)
{
    proxy_req *r = KVG_CONTAINER_OF(s, proxy_req, decide);
    if (rc < 0)
        fail(r, 500, "internal_error", "out of memory");
    else
        forward(r);
}

/* Authenticate the request; NULL after answering 401 (open mode never gets here). Returns a
 * referenced tenant. The key is never logged, echoed or kept. */
static kvg_tenant *authenticate(kvg_exchange *x)
{
    kvg_gateway *gw = x->thread->gw;
    size_t len;
    const char *v = kvg_exchange_header(x, "authorization", &len);
    const char *why = "unknown";
    kvg_tenant *t = NULL;
    if (!v) {
        why = "missing";
    } else if (len < 7 || !kvg_strncaseeq(v, 6, "bearer", 6) || (v[6] != ' ' && v[6] != '\t')) {
        why = "malformed";
    } else {
        const char *key = v + 7;
        size_t klen = len - 7;
        while (klen && (*key == ' ' || *key == '\t'))
            key++, klen--;
        t = kvg_tenant_set_authenticate(kvg_thread_tenants(x->thread), key, klen);
    }
    if (t) {
        x->tenant = kvg_arena_strdup(&x->arena, kvg_tenant_id(t));
        return kvg_tenant_ref(t);
    }
    kvg_tenants_record_auth_failure(gw->tenants, why);
    kvg_exchange_add_header(x, "www-authenticate", 16, "Bearer", 6);
    kvg_exchange_send_error(x, 401, "invalid_request_error",
                            strcmp(why, "missing") == 0
                                ? "You didn't provide an API key: send Authorization: Bearer <key>."
                                : "Incorrect API key provided.");
    return NULL;
}

static void send_models(kvg_exchange *x, const kvg_tenant *t)
{
    kvg_worker_set *set = kvg_thread_workers(x->thread);
    size_t n;
    const char *const *models = kvg_worker_set_models(set, &n);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"object\":\"list\",\"data\":[");
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        if (t && !kvg_tenant_allows_model(t, models[i]))
            continue; /* a tenant sees only what it may use */
        if (!first)
            kvg_buf_putc(&b, ',');
        first = false;
        kvg_buf_puts(&b, "{\"id\":");
        kvg_buf_json_string(&b, models[i], strlen(models[i]));
        kvg_buf_puts(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"kvgate\"}");
    }
    kvg_buf_puts(&b, "]}");
    kvg_exchange_send_body(x, 200, "application/json", b.data, b.len);
    kvg_buf_done(&b);
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The model id of GET /v1/models/{id}: the rest of the path, percent-decoded (a model name may
 * hold slashes, "org/name", which clients send as they are or as %2F). NULL when it is not one:
 * a bad escape or an escaped NUL. In the exchange's arena. */
static const char *model_id_of(kvg_exchange *x)
{
    const char *p = x->path + MODEL_PREFIX_LEN;
    size_t n = path_len(x->path) - MODEL_PREFIX_LEN;
    char *id = kvg_arena_alloc(&x->arena, n + 1);
    if (!id)
        return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            id[m++] = p[i];
            continue;
        }
        int hi = i + 2 < n ? hex_value(p[i + 1]) : -1, lo = hi >= 0 ? hex_value(p[i + 2]) : -1;
        if (lo < 0 || (hi | lo) == 0)
            return NULL;
        id[m++] = (char)(hi * 16 + lo);
        i += 2;
    }
    id[m] = '\0';
    return id;
}

/* GET /v1/models/{id}: the model as /v1/models lists it, when a worker serves it (and the
 * tenant may use it); else 404 model_not_found, as OpenAI answers. */
static void send_model(kvg_exchange *x, const kvg_tenant *t)
{
    const char *id = model_id_of(x);
    kvg_worker_set *set = kvg_thread_workers(x->thread);
    size_t n;
    const char *const *models = kvg_worker_set_models(set, &n);
    for (size_t i = 0; id && i < n; i++) {
        if (strcmp(models[i], id) != 0 || (t && !kvg_tenant_allows_model(t, id)))
            continue;
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_buf_puts(&b, "{\"id\":");
        kvg_buf_json_string(&b, id, strlen(id));
        kvg_buf_puts(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"kvgate\"}");
        if (b.failed)
            kvg_exchange_send_error(x, 500, "internal_error", "out of memory");
        else
            kvg_exchange_send_body(x, 200, "application/json", b.data, b.len);
        kvg_buf_done(&b);
        return;
    }
    size_t raw = path_len(x->path) - MODEL_PREFIX_LEN;
    kvg_exchange_send_error(x, 404, "not_found_error", "The model `%.*s` does not exist.",
                            (int)KVG_MIN(raw, 200), x->path + MODEL_PREFIX_LEN);
}

static void on_head(kvg_exchange *x)
{
    proxy_route route = classify(&x->thread->gw->cfg, x->path);
    bool is_get = strcmp(x->method, "GET") == 0 || strcmp(x->method, "HEAD") == 0;
    switch (route) {
    case ROUTE_NONE:
        kvg_exchange_set_error_code(x, "unknown_url");
        kvg_exchange_send_error(x, 404, "not_found_error", "no route for %s %.*s", x->method,
                                (int)KVG_MIN(path_len(x->path), 200), x->path);
        kvg_exchange_detach(x);
        return;
    case ROUTE_MODELS:
    case ROUTE_MODEL:
        if (!is_get) {
            kvg_exchange_send_error(x, 405, "invalid_request_error", "use GET for %.*s",
                                    (int)KVG_MIN(path_len(x->path), 200), x->path);
        } else if (x->thread->gw->auth_open) {
            route == ROUTE_MODELS ? send_models(x, NULL) : send_model(x, NULL);
        } else {
            kvg_tenant *t = authenticate(x);
            if (t) {
                route == ROUTE_MODELS ? send_models(x, t) : send_model(x, t);
                kvg_tenant_unref(t);
            }
        }
        kvg_exchange_detach(x);
        return;
    default:
        break;
    }
    const char *id = NULL;
    size_t id_len = 0;
    if (route == ROUTE_RESPONSE_ID) {
        /* {id}, {id}/cancel: GET and DELETE the first, POST the second. */
        id = x->path + RESPONSE_PREFIX_LEN;
        size_t rest = path_len(x->path) - RESPONSE_PREFIX_LEN;
        const char *slash = memchr(id, '/', rest);
        id_len = slash ? (size_t)(slash - id) : rest;
        bool cancel = slash && rest - id_len == 7 && memcmp(slash, "/cancel", 7) == 0;
        const char *want = cancel ? "POST" : slash ? NULL : "GET or DELETE";
        bool ok = cancel ? strcmp(x->method, "POST") == 0
                         : strcmp(x->method, "GET") == 0 || strcmp(x->method, "DELETE") == 0;
        if (!want || id_len == 0) {
            kvg_exchange_set_error_code(x, "unknown_url");
            kvg_exchange_send_error(x, 404, "not_found_error", "no route for %s %.*s", x->method,
                                    (int)KVG_MIN(path_len(x->path), 200), x->path);
            kvg_exchange_detach(x);
            return;
        }
        if (!ok) {
            kvg_exchange_send_error(x, 405, "invalid_request_error", "use %s for %.*s", want,
                                    (int)KVG_MIN(path_len(x->path), 200), x->path);
            kvg_exchange_detach(x);
            return;
        }
    } else if (strcmp(x->method, "POST") != 0) {
        kvg_exchange_send_error(x, 405, "invalid_request_error", "use POST for %.*s",
                                (int)path_len(x->path), x->path);
        kvg_exchange_detach(x);
        return;
    }
    proxy_req *r = kvg_arena_alloc(&x->arena, sizeof(*r));
    if (r)
        memset(r, 0, sizeof(*r));
    if (!r) {
        kvg_exchange_send_error(x, 500, "internal_error", "out of memory");
        kvg_exchange_detach(x);
        return;
    }
    r->x = x;
    r->api = route == ROUTE_COMPLETIONS ? KVG_BODY_API_COMPLETIONS
             : route == ROUTE_CHAT      ? KVG_BODY_API_CHAT
             : route == ROUTE_RESPONSES ? KVG_BODY_API_RESPONSES
                                        : KVG_BODY_API_OTHER;
    if (r->api == KVG_BODY_API_RESPONSES)
        kvg_usage_scan_init_responses(&r->usage);
    else
        kvg_usage_scan_init(&r->usage);
    /* Authenticate before reading a byte of the body: an unknown caller costs nothing more. */
    if (!x->thread->gw->auth_open) {
        r->tenant = authenticate(x);
        if (!r->tenant) {
            kvg_exchange_detach(x);
            return;
        }
    }
    if (id) { /* the tenant's scope keys the affinity */
        r->by_id = true;
        pin_response(r, id, id_len);
    }
    x->handler_state = r;
    /* The body and its rewritten copy are held until the answer ends: count both in the
     * gateway's budget and the tenant's share before a byte is read, when the length is known,
     * so that a refusal costs the client no upload. */
    kvg_exchange_set_body_owner(x, r->tenant);
    if (x->content_length > 0) {
        /* The copy may be longer by the salt member the rewrite adds (58 bytes): a margin
         * saves a second charge in on_body. */
        int rc = kvg_exchange_body_charge(x, 2 * (uint64_t)x->content_length + 128);
        if (rc < 0) {
            kvg_exchange_send_body_error(x, rc);
            finish(r, x->status);
            return;
        }
    }
    kvg_exchange_read_body(x);
}

static void on_writable(kvg_exchange *x)
{
    proxy_req *r = x->handler_state;
    if (r && r->up)
        kvg_upstream_pause(r->up, false);
}

static void on_abort(kvg_exchange *x)
{
    proxy_req *r = x->handler_state;
    if (!r) {
        kvg_exchange_detach(x);
        return;
    }
    if (r->up) {
        /* The client is gone: stop the worker's work too (it sees the connection close). */
        kvg_upstream_abort(r->up);
        r->up = NULL;
    }
    finish(r, 499);
}

const kvg_handler kvg_proxy_handler = {
    .on_head = on_head,
    .on_body = on_body,
    .on_writable = on_writable,
    .on_abort = on_abort,
};
