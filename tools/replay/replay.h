/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-replay's parts: the trace, the block cache the simulated engines and the reference
 * caches share, the event heap, the router driver, the simulation and its report. */
#ifndef KVG_REPLAY_H
#define KVG_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "policy.h"

/* Most simulated workers (--workers, --worker-counts; the peers' scratch is sized by it). */
#define REPLAY_MAX_WORKERS 1024

/* Tokens per hash id in the Mooncake traces. */
#define REPLAY_BLOCK_TOKENS 512u
/* The longest trace line read (bytes, line feed included); a longer one is a bad line. */
#define REPLAY_LINE_MAX ((size_t)64 << 20)
/* Canonical text bytes per token in the kvgate format's text prompts: the gateway's own
 * estimate (a block_bytes of 64 is ~16 tokens, policy.h), for prefill time and token counts. */
#define REPLAY_TEXT_BYTES_PER_TOKEN 4u

/* ---- the trace (trace.c) ------------------------------------------------------------------ */

typedef struct replay_request {
    uint64_t arrival_us; /* timestamp (ms) x time_scale, in virtual microseconds */
    uint32_t input_tokens;
    uint32_t output_tokens;
    uint32_t nblocks;      /* block keys: Mooncake hash ids, or the gateway's full blocks */
    uint32_t block_tokens; /* tokens a full block holds: 512 (Mooncake), the gateway's block
                              size (kvgate format; text: block_bytes / 4) */
    uint32_t tenant;       /* index in replay_trace.tenants; 0 (none) in Mooncake traces */
    uint64_t *keys;        /* block keys (trace-owned), nblocks of them */
} replay_request;

/* What a trace file holds (docs/replay.md). AUTO: the first non-blank line decides (hash_ids:
 * Mooncake, else kvgate). */
typedef enum replay_format {
    REPLAY_FORMAT_AUTO = 0,
    REPLAY_FORMAT_MOONCAKE,
    REPLAY_FORMAT_KVGATE,
    REPLAY_FORMAT_COUNT,
} replay_format;

const char *replay_format_str(replay_format f);

/* How a trace is read. */
typedef struct replay_read_options {
    double time_scale;    /* multiplies the timestamps */
    bool skip;            /* a bad line is skipped with a warning (else the read fails) */
    replay_format format; /* AUTO: detected */
    bool shared_scope;    /* kvgate format: every tenant in the "global" scope */
} replay_read_options;

typedef struct replay_trace {
    replay_request *reqs; /* sorted by arrival (stable) */
    size_t n;
    uint64_t blocks; /* sum of nblocks */
    uint64_t tokens; /* sum of input_tokens */
    size_t skipped;  /* bad lines skipped (--on-error skip) */
    replay_format format;
    char **tenants; /* names by index; tenants[0] is "" (no tenant); ntenants >= 1 */
    size_t ntenants;
    uint64_t *keypool;
} replay_trace;

/** The chain key of a hash id after the key of the block before it (prev 0 for the first):
 *  XXH3 of (prev, id), so equal id prefixes give equal keys. */
uint64_t replay_chain_key(uint64_t prev, uint64_t id);
/** Read a JSON-lines trace, Mooncake ({"timestamp", "input_length", "output_length",
 *  "hash_ids"} per line) or kvgate (requests with tenants, keys from the gateway's own
 *  canonical stream and block hashing: trace_kvgate.c); blank lines ignored; lines at most
 *  REPLAY_LINE_MAX bytes. A bad line: with skip, a warning naming the line goes to stderr and
 *  the line is left out; without, "FILE:LINE: what" goes to stderr and the read fails.
 *  0, KVG_EPARSE, -errno, -ENOMEM; *out written on success only (release: replay_trace_done). */
int replay_trace_read(const char *path, const replay_read_options *opt, replay_trace *out);
void replay_trace_done(replay_trace *t);
/** Tokens of block i of r: the input's block_tokens slice i (the last one may be short). */
static inline uint32_t replay_block_tokens(const replay_request *r, uint32_t i)
{
    uint64_t start = (uint64_t)i * r->block_tokens;
    if (r->input_tokens <= start)
        return 0;
    uint64_t left = r->input_tokens - start;
    return left < r->block_tokens ? (uint32_t)left : r->block_tokens;
}

/* ---- block cache (cache.c) ---------------------------------------------------------------- */

/* capacity blocks, each held (pinned: a running sequence uses it) or free in an LRU list. */
typedef struct replay_cache replay_cache;

int replay_cache_new(uint32_t capacity, replay_cache **out);
void replay_cache_free(replay_cache *c);
/** Leading blocks of keys held (pinned or not): the prefix cache hit. */
uint32_t replay_cache_match(const replay_cache *c, const uint64_t *keys, uint32_t n);
/** Whether pinning keys fits: the pinned blocks after it would be at most the capacity. */
bool replay_cache_fits(const replay_cache *c, const uint64_t *keys, uint32_t n);
/** Pin keys in order: held ones gain a reference, missing ones are inserted in the place of the
 *  least recently used free block; when none is free, a missing block is not stored. */
void replay_cache_pin(replay_cache *c, const uint64_t *keys, uint32_t n);
/** Drop the references of a pin; blocks left unreferenced become the most recently used, keys[0]
 *  the most recent of all (engines evict a sequence's tail first). Keys not held are ignored. */
void replay_cache_unpin(replay_cache *c, const uint64_t *keys, uint32_t n);
uint32_t replay_cache_held(const replay_cache *c);
/** Held blocks with a reference (used by running sequences). */
uint32_t replay_cache_pinned(const replay_cache *c);

/* ---- event heap (heap.c) ------------------------------------------------------------------- */

typedef struct replay_event {
    uint64_t time_us;
    uint64_t seq; /* insertion order: equal times pop first in, first out */
    uint32_t req;
    uint32_t kind;
} replay_event;

typedef struct replay_heap {
    replay_event *ev;
    size_t n, cap;
    uint64_t next_seq;
} replay_heap;

void replay_heap_init(replay_heap *h);
void replay_heap_done(replay_heap *h);
int replay_heap_push(replay_heap *h, uint64_t time_us, uint32_t req, uint32_t kind);
/** Pop the earliest event into *out; false when empty. */
bool replay_heap_pop(replay_heap *h, replay_event *out);
/** The earliest event, or NULL. */
static inline const replay_event *replay_heap_top(const replay_heap *h)
{
    return h->n ? &h->ev[0] : NULL;
}

/* ---- router driver (driver.c) ------------------------------------------------------------- */

/* A router and a registry of nworkers simulated workers (w000, w001, ...), each with capacity
 * blocks in the index; decisions run through the router's own steps. */
typedef struct replay_router replay_router;

int replay_router_new(const kvg_policy_config *pc, unsigned nworkers, uint32_t capacity,
                      replay_router **out);
void replay_router_free(replay_router *r);
/** Decide where req goes now: the worker's index and its predicted matched blocks. The worker's
 *  in-flight count (what the policy reads) goes up by one. 0 or -ENOMEM. */
int replay_router_decide(replay_router *r, const replay_request *req, unsigned *worker,
                         uint32_t *matched);
/** The worker produced req's first token: the index learns its blocks. */
void replay_router_record(replay_router *r, unsigned worker, const replay_request *req,
                          uint32_t matched);
/** The worker finished req: its in-flight count goes down by one. */
/** The request's first token: its missing blocks leave the worker's pending count. */
void replay_router_first_token(replay_router *r, unsigned worker, const replay_request *req,
                               uint32_t matched);
void replay_router_done(replay_router *r, unsigned worker);

/* ---- peer policies (peers.c) --------------------------------------------------------------- */

typedef enum replay_peer {
    REPLAY_PEER_NONE = 0,
    REPLAY_PEER_SGLANG, /* "sglang": SGLang router's cache_aware */
    REPLAY_PEER_DYNAMO, /* "dynamo": NVIDIA Dynamo's KV router, events on, temperature 0 */
    REPLAY_PEER_LLMD,   /* "llmd": llm-d's default scorers, prefix 3 + queue 2 + KV use 2 */
    REPLAY_PEER_AIBRIX, /* "aibrix": AIBrix's prefix-cache router */
    REPLAY_PEER_CHWBL,  /* "chwbl": consistent hashing with bounded load on the first block */
} replay_peer;

/* What a router can know of a simulated worker when it decides (docs/policies.md says which
 * peer reads which). */
typedef struct replay_engine_view {
    uint32_t inflight;         /* routed there and not finished (the router's own count) */
    uint32_t running, waiting; /* the engine's running sequences and waiting queue */
    const replay_cache *cache; /* the engine's cache: what its KV events say it holds */
    uint32_t capacity;         /* blocks */
} replay_engine_view;

typedef struct replay_peer_router replay_peer_router;

/** A peer's state for one simulation of nworkers (1..REPLAY_MAX_WORKERS) workers of capacity
 *  blocks each, for a trace of nrequests requests. 0, -EINVAL, -ENOMEM. */
int replay_peer_new(replay_peer kind, unsigned nworkers, uint32_t capacity, size_t nrequests,
                    replay_peer_router **out);
void replay_peer_free(replay_peer_router *p);
/** Decide where request id (req) goes from the workers' views: the worker, and the leading
 *  blocks the peer believes that worker holds. 0 or -ENOMEM. */
int replay_peer_decide(replay_peer_router *p, const replay_request *req, uint32_t id,
                       const replay_engine_view *views, unsigned *worker, uint32_t *predicted);
/** Request id's first token came on worker (its prefill is over). */
void replay_peer_first_token(replay_peer_router *p, unsigned worker, const replay_request *req,
                             uint32_t id);
/** Request id finished on worker. */
void replay_peer_done(replay_peer_router *p, unsigned worker, const replay_request *req,
                      uint32_t id);

/* ---- simulation and reports (sim.c, min.c, report.c) ------------------------------------- */

typedef struct replay_engine_config {
    unsigned workers;
    uint32_t capacity;       /* blocks per worker */
    uint32_t max_running;    /* sequences running at once per worker */
    double prefill_us;       /* per uncached prompt token; prefills run one at a time */
    double decode_us;        /* per output token after the first, per sequence */
    bool record_at_decision; /* kvgate's index learns a request's blocks when it is routed (the
                              * gateway records at the worker's 200 head, which vLLM sends for a
                              * stream when it takes the request), else at its first token */
} replay_engine_config;

/* One row of the report. */
typedef struct replay_row {
    char name[32];
    bool policy;       /* a simulated policy (else a reference: ceiling, pooled LRU, MIN) */
    bool live;         /* measured through a gateway (live mode): policy too, nothing predicted */
    uint64_t capacity; /* blocks: per worker (policy), pooled (LRU, MIN), 0 (ceiling) */
    uint64_t requests, blocks, hit_blocks, tokens, hit_tokens;
    uint64_t predicted_blocks; /* policy: blocks the chosen worker was predicted to hold */
    double ttft_p50_ms, ttft_p99_ms, ttft_mean_ms;
    bool has_queue; /* simulated: the queueing and busy-time figures below are known */
    double queue_mean_ms, queue_p99_ms; /* arrival to the start of its prefill */
    double imbalance;                   /* max / mean requests per worker */
    double busy_imbalance;              /* max / mean busy (prefill) time per worker */
    uint64_t *per_worker;               /* requests per worker (owned), nworkers of them */
    uint64_t *busy_us; /* per worker: time spent prefilling (owned; NULL: unknown). Decode steps
                        * are batched and cost no more for one sequence more in the engine
                        * model, so prefill is the work a worker does alone */
    unsigned nworkers;
    double seconds; /* wall-clock time of the replay */
} replay_row;

/* A policy to replay: one of kvgate's own (peer REPLAY_PEER_NONE: the real router under kind's
 * defaults) or a re-implementation of another router's published policy (peers.c). */

typedef struct replay_policy {
    char name[32]; /* as given to --policies and printed in the report */
    replay_peer peer;
    kvg_policy_config cfg; /* peer NONE: the settings (kvg_policy_config_init with the kind) */
} replay_policy;

/** The policy named name (a kvgate policy kind or a peer's name). 0 or -EINVAL. */
int replay_policy_parse(const char *name, replay_policy *out);
/** Every policy, kvgate's first, into out (at most cap); the count. */
size_t replay_policy_all(replay_policy *out, size_t cap);

/** Replay the trace on simulated engines under the policy. 0, -ENOMEM. */
int replay_simulate(const replay_trace *t, const replay_engine_config *ec, const replay_policy *p,
                    replay_row *out);
/** The infinite cache: every block seen before is a hit (leading run). Also the count of
 *  distinct blocks. 0, -ENOMEM. */
int replay_ceiling(const replay_trace *t, replay_row *out, uint64_t *distinct);
/** One LRU of capacity blocks, fed every request in arrival order (pin then unpin). */
int replay_pooled_lru(const replay_trace *t, uint64_t capacity, replay_row *out);
/** Belady's MIN (min.c): the pooled LRU's access sequence (each request's blocks in order,
 *  requests in arrival order), capacity and hits, with the block used farthest ahead evicted;
 *  an accessed block that would itself be that one is not kept. 0, -ENOMEM. */
int replay_min(const replay_trace *t, uint64_t capacity, replay_row *out);
void replay_row_done(replay_row *row);
/** a / b, 0 when b is 0: the report's rates. */
static inline double replay_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0;
}

/** Per-worker capacity that makes the pooled capacity fraction of the distinct blocks:
 *  floor(fraction x distinct / workers), at least 1, at most UINT32_MAX / 2. */
uint32_t replay_capacity_for(uint64_t distinct, double fraction, unsigned workers);

/** Every row of one configuration (run.c): the policies, then the ceiling, the pooled LRU and MIN
 *  on workers x capacity, into rows (npolicies + REPLAY_REFERENCE_ROWS of them, each to be
 *  released with replay_row_done, also on failure). ec->capacity 0 takes
 *  replay_capacity_for(distinct, fraction, ec->workers) and writes it back. *distinct gets the
 *  trace's distinct blocks. 0, -ENOMEM. */
#define REPLAY_REFERENCE_ROWS 3
int replay_run(const replay_trace *t, replay_engine_config *ec, double fraction,
               const replay_policy *policies, size_t npolicies, replay_row *rows,
               uint64_t *distinct);

typedef struct replay_report {
    const char *trace;
    const replay_trace *t;
    const replay_engine_config *ec;
    uint64_t distinct_blocks;
    const replay_row *rows;
    size_t nrows;
    const struct replay_live_errors *live; /* live mode's errors; NULL offline */
} replay_report;

void replay_report_text(const replay_report *rep, FILE *f);
void replay_report_json(const replay_report *rep, FILE *f);
/** A header line, then one line per row: name, kind, workers, capacity and the JSON report's
 *  counts and rates (the policy-only columns empty for references). */
void replay_report_csv(const replay_report *rep, FILE *f);

/* ---- sweeps (sweep.c), their progress line (progress.c) and chart (svg.c) ------------------ */

/* One configuration of a sweep: every row of replay_run at workers x fraction. */
typedef struct replay_sweep_point {
    unsigned workers;
    double fraction;
    uint32_t capacity; /* blocks per worker, replay_capacity_for */
    replay_row *rows;  /* nrows of them (owned) */
} replay_sweep_point;

typedef struct replay_sweep {
    const char *trace;
    const replay_trace *t;
    uint64_t distinct_blocks;
    replay_sweep_point *points; /* worker counts in the given order, each with every fraction in
                                   the given order */
    size_t npoints;
    size_t nrows; /* per point: the policies, then REPLAY_REFERENCE_ROWS */
    double seconds;
} replay_sweep;

/* Called after each point (done of total), from the sweep's thread. */
typedef void replay_progress_fn(void *ud, size_t done, size_t total,
                                const replay_sweep_point *last);

/** Run replay_run at every worker count x capacity fraction, with base's other engine settings
 *  (its workers and capacity are ignored). progress may be NULL. 0, -ENOMEM, -EINVAL (no
 *  fraction or no worker count); *out written on success (release: replay_sweep_done). */
int replay_sweep_run(const replay_trace *t, const replay_engine_config *base,
                     const double *fractions, size_t nfractions, const unsigned *workers,
                     size_t nworkers, const replay_policy *policies, size_t npolicies,
                     replay_progress_fn *progress, void *ud, replay_sweep *out);
void replay_sweep_done(replay_sweep *s);
/** One line per point and row: workers, fraction, capacity (per worker), row, block_hit,
 *  token_hit, ttft_p99 (ms) and imbalance (policies only). Text table, JSON (an object with
 *  the trace's totals and "rows") or CSV (a header line). */
void replay_sweep_text(const replay_sweep *s, FILE *f);
void replay_sweep_json(const replay_sweep *s, FILE *f);
void replay_sweep_csv(const replay_sweep *s, FILE *f);

/** A progress line on stderr ("\r", rewritten in place) when stderr is a terminal: the state
 *  of a replay_progress_fn. Nothing at all when it is not one. */
typedef struct replay_progress {
    bool tty;
    uint64_t start_ns;
} replay_progress;

void replay_progress_init(replay_progress *p);
replay_progress_fn replay_progress_update;
/** Clear the line (a terminal only). */
void replay_progress_end(replay_progress *p);

/** Write an SVG chart of the sweep (svg.c): block hit rate against the pooled capacity as a
 *  fraction of the distinct blocks (log axis), one panel per worker count, one polyline per
 *  row (policies, ceiling, pooled LRU, MIN), axes with ticks, a legend, and a title naming
 *  the trace. 0, or -EIO when writing fails. */
int replay_svg_write(const replay_sweep *s, FILE *f);

/* ---- slices (trace.c) ---------------------------------------------------------------------- */

/** Keep requests [first, first + count) of the trace in arrival order (count 0: all from first
 *  on), their arrivals moved so the slice starts at 0, the totals recomputed. KVG_ECONFIG when
 *  first is past the end. */
int replay_trace_slice(replay_trace *t, size_t first, size_t count);

/* ---- live mode (live.c, live_text.c, live_h1.c, live_h2.c; docs/replay.md "Live mode") ---- */

typedef enum replay_live_http {
    REPLAY_LIVE_H2 = 0, /* every request over HTTP/2 (prior knowledge, cleartext) */
    REPLAY_LIVE_H1,     /* every request over HTTP/1.1 */
    REPLAY_LIVE_MIXED,  /* even requests over HTTP/2, odd ones over HTTP/1.1 */
    REPLAY_LIVE_HTTP_COUNT,
} replay_live_http;

/** "2", "1.1", "mixed"; replay_live_http_parse is its inverse (0 or KVG_ECONFIG). */
const char *replay_live_http_str(replay_live_http h);
int replay_live_http_parse(const char *s, replay_live_http *out);

typedef struct replay_live_config {
    const char *url; /* http://host:port[/prefix] of the gateway (borrowed) */
    replay_live_http http;
    uint32_t connections;    /* HTTP/2 connections (streams spread round robin) */
    uint32_t h1_max;         /* HTTP/1.1 connections at most (one request each at a time) */
    uint32_t tenants;        /* tenant = chain key of block tenant_block mod tenants */
    uint32_t tenant_block;   /* 0: the first block (or the last one, when fewer) */
    const char *const *keys; /* API keys (borrowed); tenant t sends keys[t % nkeys]; may be 0 */
    size_t nkeys;
    const char *model;
    uint32_t max_tokens; /* cap of the trace's output_length (0: none); at least 1 is asked */
    uint32_t timeout_ms; /* per request, from its send to its last byte */
    bool quiet;          /* no progress lines on stderr */
} replay_live_config;

/* Errors of a live run, by kind. */
typedef struct replay_live_errors {
    uint64_t status;     /* a response other than 2xx */
    uint64_t timeout;    /* no end within timeout_ms */
    uint64_t connection; /* connect failed, connection or stream closed early, stream reset */
    uint64_t protocol;   /* a 2xx stream without [DONE], a bad event, or usage missing */
    uint64_t tokens;     /* usage.prompt_tokens differs from the trace's input_length */
    uint64_t unsent;     /* not sent: the run was interrupted (SIGINT) */
    char first[200];     /* the first error's description */
} replay_live_errors;

/** Send every request of t through the gateway at its arrival (t's timestamps, already scaled,
 *  counted from the start of the run; open loop) as a streaming /v1/completions request whose
 *  prompt is the pseudo-text of its blocks, and fill *out (name "live") with what the workers
 *  reported: hit blocks = cached_tokens / 512, hit tokens = cached_tokens, TTFT from the
 *  scheduled arrival to the first generated text, requests per worker by x-kvgate-worker
 *  (workers ordered by name). The row owns its per_worker array (replay_row_done). Errors are
 *  counted in *errs, never fatal. Returns 0 (also when requests failed), KVG_ECONFIG for a bad
 *  URL or a gateway that refuses connections (said on stderr), -ENOMEM. */
int replay_live_run(const replay_trace *t, const replay_live_config *cfg, replay_row *out,
                    replay_live_errors *errs);

/** Append the pseudo-text of r's prompt to out: input_tokens tokens of 5 bytes (" " and four
 *  lowercase letters), token j of block i drawn from (chain key i, j), so equal key prefixes
 *  give equal text, a short block is the start of the full block with its key, and the
 *  simworker's tokenizer cuts the concatenation exactly at block boundaries. Tokens past the
 *  last hash id's block (a trace whose input outruns its ids) draw from the last key. Check
 *  out->failed. */
void replay_live_text(kvg_buf *out, const replay_request *r);

/* ---- live mode's command line (live_cli.c) -------------------------------------------------- */

/* getopt_long values of the live and slice flags: main's table includes REPLAY_LIVE_OPTIONS and
 * hands any value >= REPLAY_LIVE_OPT_BASE to replay_live_option. */
#define REPLAY_LIVE_OPT_BASE 1000
/* clang-format off */
#define REPLAY_LIVE_OPTIONS \
    {"live", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 0}, \
    {"http", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 1}, \
    {"connections", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 2}, \
    {"h1-connections", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 3}, \
    {"tenants", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 4}, \
    {"tenant-block", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 5}, \
    {"api-key", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 6}, \
    {"api-keys", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 7}, \
    {"model", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 8}, \
    {"max-tokens", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 9}, \
    {"timeout-ms", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 10}, \
    {"first", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 11}, \
    {"requests", required_argument, NULL, REPLAY_LIVE_OPT_BASE + 12}, \
    {"quiet", no_argument, NULL, REPLAY_LIVE_OPT_BASE + 13}
/* clang-format on */

/* The help text of those flags. */
extern const char replay_live_usage[];

typedef struct replay_live_options {
    replay_live_config cfg; /* cfg.url NULL: offline only */
    size_t first, count;    /* the slice (count 0: to the end) */
    char **keys;            /* owned: --api-key and the lines of --api-keys */
    size_t nkeys;
} replay_live_options;

void replay_live_options_init(replay_live_options *o);
void replay_live_options_done(replay_live_options *o);
/** Take one flag (opt from REPLAY_LIVE_OPTIONS). A bad value or an unreadable key file is said
 *  on stderr: KVG_ECONFIG; -ENOMEM. */
int replay_live_option(replay_live_options *o, int opt, const char *arg);

#endif
