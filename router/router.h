/* SPDX-License-Identifier: Apache-2.0 */
/* Router: everything between a request's body and the worker it goes to, in six parts: the
 * worker registry (the workers kvgate routes to with their definitions, health, load and
 * counters, as immutable refcounted snapshots every gateway thread reads without locks); the
 * engines' own load scraped from their metrics; the request-body scanner (validation, the
 * cache_salt rewrite and the canonical prefix stream); the engine's usage report read from
 * responses; the embedded prefix index (which worker holds which block keys, with an LRU per
 * worker); and routing decisions with their metrics. */
#ifndef KVG_ROUTER_H
#define KVG_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "fields.h"
#include "gpu_hash.h"
#include "model.h"
#include "policy.h"
#include "snapshot.h"

typedef struct kvg_registry kvg_registry;
typedef struct kvg_worker kvg_worker;
typedef struct kvg_worker_set kvg_worker_set;

#define KVG_WORKER_NAME_MAX 64
#define KVG_WORKER_MODELS_MAX 64
/* kv_events_stale_ms when a definition leaves it out: five of newer vLLM's idle heartbeats. */
#define KVG_WORKER_KV_EVENTS_STALE_MS_DEFAULT 5000
#define KVG_MODEL_NAME_MAX 256
/* Most workers one source (config, admin) may define; the admin API is peer input. */
#define KVG_REGISTRY_WORKERS_MAX 4096

/* Where a worker definition came from: the config file (replaced on reload) or the admin API
 * (kept across reloads; overrides a config worker of the same name). */
typedef enum kvg_worker_source {
    KVG_WORKER_SOURCE_CONFIG = 0,
    KVG_WORKER_SOURCE_ADMIN,
    KVG_WORKER_SOURCE_COUNT,
} kvg_worker_source;

const char *kvg_worker_source_str(kvg_worker_source s);

/* Health as seen by active checks and by failed connects. */
typedef enum kvg_worker_health {
    KVG_WORKER_UP = 0,
    KVG_WORKER_DOWN,
    KVG_WORKER_HEALTH_COUNT,
} kvg_worker_health;

const char *kvg_worker_health_str(kvg_worker_health h);

/* A worker as the operator defines it. Borrowed by kvg_registry_put, which copies it. */
typedef struct kvg_worker_def {
    const char *name;          /* [A-Za-z0-9._-], 1..KVG_WORKER_NAME_MAX */
    const char *url;           /* http://host:port (optional trailing '/'), no other path */
    const char *const *models; /* empty = serves every model */
    size_t nmodels;
    uint32_t kv_blocks;    /* engine KV capacity in blocks; 0 = unknown */
    uint32_t max_inflight; /* requests in flight this gateway sends it; 0 = registry default */
    bool no_cache_salt;    /* the engine has no "cache_salt" request field: inject none (see
                              kvg_worker_injects_salt); false, the default, injects */
    const char *kv_events; /* the engine's KV-event publisher (vLLM's --kv-events-config
                              endpoint), "tcp://host:port" or "ipc://path"; NULL = none */
    const char *kv_events_replay; /* its replay endpoint; NULL = none (gaps are not recovered) */
    uint32_t kv_events_stale_ms;  /* silence after which a publisher that sends idle heartbeats
                                     is stale (the index falls back to the model for it); 0 =
                                     only a lost connection makes it stale. Default 5000 */
} kvg_worker_def;

typedef struct kvg_registry_config {
    unsigned nthreads;             /* gateway threads: sizes the per-thread slots of each worker;
                                      0 = 1, at most 4096 */
    uint32_t default_max_inflight; /* 0 = 1024 */
    unsigned health_fall;          /* consecutive failures that mark a worker down; 0 = 3 */
    unsigned health_rise;          /* consecutive successes that mark it up again; 0 = 2 */
} kvg_registry_config;

/** Create an empty registry. cfg may be NULL for the defaults. Returns 0, -ENOMEM or -EINVAL
 *  (out of range: nthreads > 4096, health_fall or health_rise > 1000). */
int kvg_registry_new(const kvg_registry_config *cfg, kvg_registry **out);
/** Free the registry; snapshots acquired earlier stay valid until unreffed. NULL is a no-op. */
void kvg_registry_free(kvg_registry *reg);

/** Check a worker name alone (for example a name taken from an admin URL path): 0, or
 *  KVG_EPARSE/KVG_ELIMIT with a message starting "name: " written to msg (may be NULL). */
int kvg_worker_name_validate(const char *name, char *msg, size_t msg_len);
/** Check a definition without changing anything: 0, or KVG_EPARSE/KVG_ELIMIT with a message
 *  naming the bad field written to msg (may be NULL). */
int kvg_worker_def_validate(const kvg_worker_def *def, char *msg, size_t msg_len);
/* The fields of a worker definition (kvg_worker_def), for every entry point that defines one:
 * name, url, models (key=value item "model"), kv_blocks and max_inflight (integers, 0 = unknown
 * and the gateway default), cache_salt (true by default; the struct holds no_cache_salt),
 * kv_events and kv_events_replay (ZeroMQ endpoints, docs/kv-events.md), kv_events_stale_ms. Types
 * and ranges are checked by the walker (common/fields.h); kvg_worker_def_validate checks the
 * values. docs/configuration.md has the table. */
extern const kvg_fields kvg_worker_fields;

/** Add or replace a worker; a new snapshot is published. Replacing with an identical
 *  definition keeps the worker object (and its health and counters); a changed definition
 *  (any field, no_cache_salt included) creates a fresh worker that starts up. Either way the worker
 * is no longer draining (unless an ADMIN worker of that name hides this CONFIG one). Thread-safe
 * (serialised internally). Returns 0, KVG_EPARSE (bad definition, see msg), KVG_ELIMIT (the source
 *  already has KVG_REGISTRY_WORKERS_MAX workers) or -ENOMEM. */
int kvg_registry_put(kvg_registry *reg, const kvg_worker_def *def, kvg_worker_source source,
                     char *msg, size_t msg_len);
/** Remove a worker by name; KVG_ENOTFOUND if absent. Requests in flight keep their worker.
 *  Removing an ADMIN worker that hides a CONFIG worker of the same name brings the CONFIG
 *  one back (as after a reload); removing a CONFIG worker lasts until the next reload. */
int kvg_registry_remove(kvg_registry *reg, const char *name);
/** Stop sending new requests to a worker (it stays listed, draining). KVG_ENOTFOUND if absent. */
int kvg_registry_drain(kvg_registry *reg, const char *name);
/** Replace every CONFIG-sourced worker by defs (a reload). ADMIN workers are untouched and win
 *  over a config worker of the same name. All or nothing: on error nothing changes and msg
 *  names the bad worker. Returns 0, KVG_EPARSE (bad or duplicate definition), KVG_ELIMIT
 *  (more than KVG_REGISTRY_WORKERS_MAX) or -ENOMEM. */
int kvg_registry_replace_config(kvg_registry *reg, const kvg_worker_def *defs, size_t n, char *msg,
                                size_t msg_len);

/** Append the ADMIN-sourced worker definitions as a JSON array, sorted by name, one object per
 *  worker: {"name","url","models":[...],"kv_blocks","max_inflight","cache_salt":bool}, every
 *  field present; max_inflight as defined (0 = the registry default, which may change), not the
 *  effective limit. For the state file; kvg_registry_admin_from_json reads it back. On memory
 *  failure out is marked failed. Thread-safe. */
void kvg_registry_admin_to_json(kvg_registry *reg, kvg_buf *out);
/** Replace every ADMIN-sourced worker by the definitions in arr, a JSON array as written by
 *  kvg_registry_admin_to_json ("name" and "url" required; "models" default [], "kv_blocks" and
 *  "max_inflight" integers in 0..4294967295 default 0, "cache_salt" boolean default true).
 *  Unknown, repeated or mistyped fields, bad values and duplicate names are errors. All or
 *  nothing, published as one snapshot; CONFIG workers are untouched (and hidden by ADMIN ones
 *  of the same name); workers whose definition is unchanged keep their state. Returns 0,
 *  KVG_EPARSE with msg naming the worker and the field ('worker "w1": kv_blocks: ...',
 *  'workers[3]: name: ...'), KVG_ELIMIT (more than KVG_REGISTRY_WORKERS_MAX), -EINVAL (arr
 *  NULL) or -ENOMEM. */
int kvg_registry_admin_from_json(kvg_registry *reg, const kvg_json *arr, char *msg, size_t msg_len);

/** Generation number, incremented by every published change. A relaxed atomic read: threads
 *  poll it to notice a new snapshot cheaply. A thread that reads it and then acquires finds at
 *  least that snapshot (common/snapshot.h). */
uint64_t kvg_registry_generation(const kvg_registry *reg);
/** The current snapshot, referenced; release with kvg_worker_set_unref. Never NULL.
 *  Holds an internal mutex for a pointer load and a refcount increment only; hot paths cache
 *  the snapshot and acquire again when kvg_registry_generation changes. */
kvg_worker_set *kvg_registry_acquire(kvg_registry *reg);
/** The slot the snapshots are published in, for a thread's kvg_snapshot_cache; its objects are
 *  worker sets (kvg_worker_set_of). Lives as long as the registry. */
kvg_snapshot_slot *kvg_registry_snapshots(kvg_registry *reg);
/** The worker set a snapshot of kvg_registry_snapshots' slot is (its header comes first). */
static inline kvg_worker_set *kvg_worker_set_of(kvg_snapshot *snap)
{
    return (kvg_worker_set *)(void *)snap;
}

/** Take one more reference to a snapshot (a request that keeps it past its thread's next
 *  refresh); returns set. */
kvg_worker_set *kvg_worker_set_ref(kvg_worker_set *set);
void kvg_worker_set_unref(kvg_worker_set *set);
uint64_t kvg_worker_set_generation(const kvg_worker_set *set);
size_t kvg_worker_set_count(const kvg_worker_set *set);
/** i-th worker (sorted by name), borrowed from the snapshot. */
kvg_worker *kvg_worker_set_at(const kvg_worker_set *set, size_t i);
/** Worker by name, borrowed; NULL if absent. */
kvg_worker *kvg_worker_set_find(const kvg_worker_set *set, const char *name);
/** Distinct model names served by the workers of the set, sorted; *n receives the count.
 *  Workers that list no models (they serve any) add none. Borrowed from the snapshot. */
const char *const *kvg_worker_set_models(const kvg_worker_set *set, size_t *n);

/* Workers: refcounted; a snapshot holds one reference to each of its workers. Everything
 * below is thread-safe. */
kvg_worker *kvg_worker_ref(kvg_worker *w);
void kvg_worker_unref(kvg_worker *w);
/** Process-unique id, never reused. */
uint64_t kvg_worker_id(const kvg_worker *w);
/** The worker's name in the shared prefix map: a hash of its whole definition, the same on
 *  every replica that defines it alike; a changed definition is a new worker there too. */
uint64_t kvg_worker_map_id(const kvg_worker *w);
const char *kvg_worker_name(const kvg_worker *w);
const char *kvg_worker_url(const kvg_worker *w);
/** Host (name or address, without brackets) and port parsed from the URL. */
const char *kvg_worker_host(const kvg_worker *w);
uint16_t kvg_worker_port(const kvg_worker *w);
/** Value for the Host header: "host:port" ("[v6]:port" for IPv6 literals). */
const char *kvg_worker_authority(const kvg_worker *w);
size_t kvg_worker_model_count(const kvg_worker *w);
const char *kvg_worker_model(const kvg_worker *w, size_t i);
/** The worker's KV-event endpoint and replay endpoint as defined; NULL when none. */
const char *kvg_worker_kv_events(const kvg_worker *w);
const char *kvg_worker_kv_events_replay(const kvg_worker *w);
/** The definition's kv_events_stale_ms (docs/kv-events.md, "Subscribing"). */
uint32_t kvg_worker_kv_events_stale_ms(const kvg_worker *w);
/** True when the worker lists model, or lists no models at all. model NULL matches any. */
bool kvg_worker_serves(const kvg_worker *w, const char *model);
uint32_t kvg_worker_kv_blocks(const kvg_worker *w);
uint32_t kvg_worker_max_inflight(const kvg_worker *w);
kvg_worker_source kvg_worker_source_of(const kvg_worker *w);
/** True when requests forwarded to this worker carry the scope salt as "cache_salt" (the
 *  default); false for a worker defined with no_cache_salt, for engines that reject or ignore
 *  the field. Either way the gateway removes every client-supplied cache_salt (pass salt NULL
 *  to kvg_body_rewrite for such a worker). When false the engine itself will share its cached
 *  prefixes across tenants: isolation on that worker rests on routing alone. */
bool kvg_worker_injects_salt(const kvg_worker *w);

kvg_worker_health kvg_worker_health_get(const kvg_worker *w);
bool kvg_worker_draining(const kvg_worker *w);
/** True once the worker has left the registry (removed or replaced). Threads drop pooled
 *  connections of retired workers. */
bool kvg_worker_retired(const kvg_worker *w);
/** Feed one health observation (active check or connect result). Applies the fall/rise
 *  thresholds; returns true when this observation changed the health state. */
bool kvg_worker_health_observe(kvg_worker *w, bool ok);

/** Requests this gateway has in flight to the worker (all threads). */
uint32_t kvg_worker_inflight(const kvg_worker *w);
/** Reserve an in-flight slot if under max_inflight; false when full. */
bool kvg_worker_inflight_try_acquire(kvg_worker *w);
void kvg_worker_inflight_release(kvg_worker *w);
/** Blocks the worker has still to prefill for requests this gateway sent it (all threads): a
 *  request adds its missing blocks when it is sent and takes them off when the first byte of
 *  its answer arrives (or it ends first). Saturates at 0 and UINT32_MAX. */
uint32_t kvg_worker_pending(const kvg_worker *w);
void kvg_worker_pending_add(kvg_worker *w, uint32_t blocks);
void kvg_worker_pending_done(kvg_worker *w, uint32_t blocks);

/** Count one finished request: HTTP status sent to the client (0 when the client went away
 *  before a status), total duration and time to first response byte (0 if none). */
void kvg_worker_record(kvg_worker *w, int status, uint64_t duration_ns, uint64_t ttfb_ns);
/* How one request's prediction compared with the engine's report. */
typedef enum kvg_usage_outcome {
    KVG_USAGE_HIT_PREDICTED = 0,  /* predicted cached tokens, and the engine had some */
    KVG_USAGE_HIT_UNPREDICTED,    /* predicted none, the engine had some */
    KVG_USAGE_MISS_PREDICTED_HIT, /* predicted some, the engine had none */
    KVG_USAGE_MISS_PREDICTED,     /* predicted none, and none */
    KVG_USAGE_OUTCOME_COUNT,
} kvg_usage_outcome;

const char *kvg_usage_outcome_str(kvg_usage_outcome o);
kvg_usage_outcome kvg_usage_outcome_of(uint64_t predicted_tokens, uint64_t cached_tokens);

/** Count one answered request's prefix prediction against the engine's usage report: tokens the
 *  router predicted cached, and the prompt and cached tokens the engine reported (-1 when the
 *  response carried no such number: counted as unreported, nothing else). */
void kvg_worker_record_usage(kvg_worker *w, uint64_t predicted_tokens, int64_t prompt_tokens,
                             int64_t cached_tokens);

/** Count one retry away from this worker (connect failure, reset, or a 502/503/504 held back
 *  before anything reached the client). */
void kvg_worker_record_retry(kvg_worker *w);
/** Count one answer's time to first token, ttft_ns after the request arrived (the first SSE event
 *  with output; the first body byte of a JSON answer). Thread-safe (relaxed atomics). */
void kvg_worker_record_ttft(kvg_worker *w, uint64_t ttft_ns);
/** Count n gaps of gap_ns between consecutive output events of a stream. Thread-safe. */
void kvg_worker_record_itl(kvg_worker *w, uint64_t gap_ns, uint64_t n);
/** Count the output tokens of one answer (usage.completion_tokens); a negative count (not
 *  reported) counts nothing. Thread-safe. */
void kvg_worker_record_output_tokens(kvg_worker *w, int64_t tokens);

/* ---- passive outlier detection and the retry budget (docs/configuration.md, upstream) ------- */

/* What one attempt on a worker came to, as outlier detection counts it. */
typedef enum kvg_outlier_result {
    KVG_OUTLIER_SUCCESS = 0,   /* an answer below 500, complete */
    KVG_OUTLIER_5XX,           /* the worker answered 500..599 other than 502, 503, 504 */
    KVG_OUTLIER_GATEWAY_ERROR, /* the worker answered 502, 503 or 504 */
    KVG_OUTLIER_LOCAL_FAILURE, /* connect failure or timeout, reset or close before or during the
                                  answer, response timeout, malformed response */
    KVG_OUTLIER_RESULT_COUNT,
} kvg_outlier_result;

const char *kvg_outlier_result_str(kvg_outlier_result r);
/** The result of a complete answer with this status (what the worker itself sent). */
kvg_outlier_result kvg_outlier_result_of_status(int status);

/* Outlier detection settings, as Envoy's consecutive_5xx / consecutive_gateway_failure
 * detectors: a streak of failures ejects a worker from routing for base x (its ejections so
 * far), capped at max. */
typedef struct kvg_outlier_config {
    uint32_t consecutive_5xx;             /* every 5xx and local failure; 0 = this detector off */
    uint32_t consecutive_gateway_failure; /* 502/503/504 and local failures; 0 = off */
    uint64_t base_ejection_ns;
    uint64_t max_ejection_ns;
    uint32_t max_ejection_percent; /* of a model's workers ejected at once (one always may be,
                                      the last never is) */
} kvg_outlier_config;

/* Streaks as one word: the 5xx streak in the low 16 bits, the gateway-failure one above;
 * each saturates at 0xffff. */
#define KVG_OUTLIER_STREAK_MAX 0xffffu
#define KVG_OUTLIER_5XX_STREAK(word) ((word)&0xffffu)
#define KVG_OUTLIER_GATEWAY_STREAK(word) ((word) >> 16)

/** Pure: the streak word after one result. *trip (may be NULL) is set when a streak reached its
 *  threshold; the streaks then restart from 0 (the returned word). A success clears both; a
 *  non-gateway 5xx clears the gateway streak (as Envoy). */
uint32_t kvg_outlier_step(uint32_t streaks, kvg_outlier_result r, const kvg_outlier_config *cfg,
                          bool *trip);
/** Pure: how long the multiplier-th ejection lasts: base x multiplier, at most max (and at
 *  least base); multiplier 0 counts as 1. */
uint64_t kvg_outlier_ejection_ns(const kvg_outlier_config *cfg, uint32_t multiplier);
/** Pure: may one more of a group of peers workers (the candidate included) be ejected while
 *  ejected others of them already are? Never the last one (ejected + 1 >= peers: no); the first
 *  one always (as Envoy: at least one host); else while (ejected + 1) x 100 <= percent x peers. */
bool kvg_outlier_may_eject(size_t peers, size_t ejected, uint32_t max_percent);
/** Pure: may one more retry start with retries_active retries and requests_active requests in
 *  flight? Yes under max(min_concurrency, requests_active x percent / 100). */
bool kvg_retry_budget_allows(uint64_t retries_active, uint64_t requests_active, uint32_t percent,
                             uint32_t min_concurrency);

/** Feed one attempt's result into the worker's streaks (lock-free, any thread). When a streak
 *  trips and the worker is not ejected yet, eject it until now_ns + kvg_outlier_ejection_ns -
 *  unless set (the snapshot the request was routed on; NULL: no such check) shows that too
 *  many of the workers of one of its models are ejected already (kvg_outlier_may_eject).
 *  The multiplier restarts at 1 when the worker stayed in for max_ejection since its last
 *  ejection ended. Returns true when this call ejected it, with the length in *for_ns (may be
 *  NULL). */
bool kvg_worker_outlier_observe(kvg_worker *w, const kvg_worker_set *set, kvg_outlier_result r,
                                uint64_t now_ns, const kvg_outlier_config *cfg, uint64_t *for_ns);
/** True while the worker is ejected at now_ns (its deadline is later). */
bool kvg_worker_ejected(const kvg_worker *w, uint64_t now_ns);

typedef struct kvg_worker_outlier_state {
    bool ejected;
    uint64_t remaining_ns; /* of the current ejection; 0 when not ejected */
    uint32_t consecutive_5xx;
    uint32_t consecutive_gateway_failures;
    uint32_t multiplier; /* what the last ejection was multiplied by */
    uint64_t ejections;  /* since the worker was defined */
} kvg_worker_outlier_state;

/** The worker's outlier state at now_ns, for the admin API and metrics. */
void kvg_worker_outlier_get(const kvg_worker *w, uint64_t now_ns, kvg_worker_outlier_state *out);

/** Take a place in the retry budget (kvg_retry_budget_allows over the registry's retries in
 *  flight and the requests in flight to set's workers); false, counted as a refusal, when the
 *  budget is spent. Pair a true with kvg_registry_retry_release. */
bool kvg_registry_retry_acquire(kvg_registry *reg, const kvg_worker_set *set, uint32_t percent,
                                uint32_t min_concurrency);
void kvg_registry_retry_release(kvg_registry *reg);

/** Per-thread opaque slot the gateway uses for its connection pool to this worker.
 *  Slot t may only be touched by thread t. Starts NULL; must be NULL again before the
 *  worker's last reference goes (the owner of the slot holds a worker reference). */
void **kvg_worker_thread_slot(kvg_worker *w, unsigned thread);

/* ---- the engines' own load (scraped from their /metrics) ------------------------------------ */

/* Lines longer than this (bytes, without the line feed) are skipped by the parser. */
#define KVG_ENGINE_METRICS_LINE_MAX 4096

/* What an engine's Prometheus page says about its load. */
typedef struct kvg_engine_load {
    uint32_t waiting;   /* sum of vllm:num_requests_waiting over its label sets (saturates) */
    float kv_usage;     /* max of vllm:kv_cache_usage_perc over its label sets, in [0, 1] */
    bool have_waiting;  /* at least one sample of each was read (NaN samples do not count) */
    bool have_kv_usage; /* false: the value above is 0 */
} kvg_engine_load;

/** Read vllm:num_requests_waiting and vllm:kv_cache_usage_perc out of a Prometheus text page
 *  (format 0.0.4: "name[{labels}] value [timestamp]" lines; '#' lines and every other metric
 *  ignored). Label values may hold spaces, braces and escaped quotes. Negative samples count
 *  as 0, NaN samples are ignored, +Inf saturates; malformed samples and lines longer than
 *  KVG_ENGINE_METRICS_LINE_MAX are skipped. Linear in len, no allocation, any bytes accepted.
 *  Returns 0 (*out written; see its have_ flags) or -EINVAL (out NULL, or text NULL with
 *  len > 0). */
int kvg_engine_metrics_parse(const char *text, size_t len, kvg_engine_load *out);

/** Store the load last scraped from the worker's engine, taken at now_ns (kvg_now_ns()).
 *  kv_usage is clamped to [0, 1]. Thread-safe: three relaxed atomics published by the time
 *  stamp, so a reader racing a writer may pair one scrape's waiting with the next one's
 *  kv_usage - harmless for a routing hint. */
void kvg_worker_set_engine_load(kvg_worker *w, uint32_t waiting, float kv_usage, uint64_t now_ns);
/** The load last stored by kvg_worker_set_engine_load, when it is at most max_age_ns old at
 *  now_ns (a time stamp later than now_ns counts as fresh). False, outputs untouched, when
 *  never stored or older. waiting and kv_usage may be NULL. Thread-safe. */
bool kvg_worker_engine_load(const kvg_worker *w, uint64_t now_ns, uint64_t max_age_ns,
                            uint32_t *waiting, float *kv_usage);
/** Count one failed scrape of the worker's metrics (kvgate_worker_scrape_errors_total). */
void kvg_worker_record_scrape_error(kvg_worker *w);

/** Append the registry's Prometheus series (kvgate_worker_up, kvgate_worker_inflight,
 *  kvgate_worker_requests_total{worker,code}, kvgate_worker_request_duration_seconds,
 *  kvgate_worker_ttfb_seconds, kvgate_worker_retries_total, kvgate_worker_scrape_errors_total,
 *  kvgate_worker_engine_waiting and kvgate_worker_engine_kv_usage for workers scraped at least
 *  once), with HELP and TYPE lines. */
void kvg_registry_write_metrics(kvg_registry *reg, kvg_buf *out);

/* ---- request bodies -------------------------------------------------------------------------- */

/* Which OpenAI API a body is for: it decides where the prompt is (see docs/canonical.md). */
typedef enum kvg_body_api {
    KVG_BODY_API_OTHER = 0,   /* no prefix stream is produced (embeddings, unknown paths) */
    KVG_BODY_API_COMPLETIONS, /* /v1/completions: "prompt" */
    KVG_BODY_API_CHAT,        /* /v1/chat/completions: "messages", "tools" */
    KVG_BODY_API_RESPONSES,   /* /v1/responses: "tools", "instructions", "input" */
    KVG_BODY_API_COUNT,
} kvg_body_api;

const char *kvg_body_api_str(kvg_body_api api);

/* The canonical prefix stream of a request (docs/canonical.md): what block keys are cut from.
 * Text for string prompts and chats, token ids when the prompt is given as ids. Both empty
 * when the body has no prompt (or the API is KVG_BODY_API_OTHER); text may be NULL when
 * text_len is 0. Bounded by the body: text_len <= len + len / 8 + 64 (2 len + 64 for
 * KVG_BODY_API_RESPONSES), ntokens <= len / 2 + 1. */
typedef struct kvg_prefix_stream {
    bool is_tokens;
    const unsigned char *text; /* !is_tokens: canonical bytes (arena), text_len of them */
    size_t text_len;
    const uint32_t *tokens; /* is_tokens: token ids (arena), ntokens of them */
    size_t ntokens;
} kvg_prefix_stream;

/* What the gateway needs to know about an OpenAI request body, found in the same single pass
 * that rewrites it. */
typedef struct kvg_body_info {
    const char *model; /* top-level "model" (decoded, arena copy), NULL if absent/null */
    size_t model_len;
    bool stream;           /* top-level "stream": true */
    uint64_t prompt_bytes; /* raw JSON bytes of "prompt", "messages", "input" and "tools" (and
                              "instructions" for KVG_BODY_API_RESPONSES) */
    unsigned cache_salts_removed; /* top-level "cache_salt" members dropped */
    kvg_prefix_stream prefix;     /* filled by kvg_body_scan for completions, chat, responses */
    /* KVG_BODY_API_RESPONSES: top-level "previous_response_id" (decoded, arena copy; it may
     * hold NUL bytes, hence the length), NULL if absent or null. */
    const char *previous_response_id;
    size_t previous_response_id_len;
} kvg_body_info;

/** Validate a request body (exactly one JSON object; strict RFC 8259: UTF-8, no trailing
 *  garbage, nesting depth at most 64 - the acceptance, error codes and error offsets of
 *  kvg_json_parse with default limits) and append it to out with every top-level "cache_salt"
 *  member removed - whatever its value, however often it appears, however its key is spelled
 *  with escapes ("\u0063ache_salt") - and, when salt is not NULL, "cache_salt":"<salt>" added
 *  as the last member (salt is written as a JSON string, escaped if need be). Everything else
 *  is copied byte for byte, whitespace included; cache_salt members nested deeper are kept.
 *  Fills info, when not NULL (strings from arena). Top-level "model" must be a string without
 *  NUL characters or null, "stream" a boolean or null, and each may appear at most once (a
 *  repeated one would let the gateway and the engine read different values); no key at any
 *  level may hold a control character (Unicode Cc, raw or escaped: "cache_salt\u0000x" is
 *  refused, message "<path>: key \"<spelling>\" holds a control character", path "body" at
 *  the top level); a body that is valid JSON but not an object is a type error too. Returns 0,
 *  KVG_EPARSE, KVG_ETYPE (only for valid JSON, the first in the body: the message starts with
 *  the field or path, "model: ", "stream: ", "body: ", "x.y[1]: "), KVG_ELIMIT (too deep),
 *  -ENOMEM (arena or out), -EINVAL (body NULL, len > 0); on error err (may be NULL) has the
 *  byte offset and a message, and what was appended to out is unspecified. */
int kvg_body_rewrite(const char *body, size_t len, const char *salt, kvg_arena *arena, kvg_buf *out,
                     kvg_body_info *info, kvg_json_error *err);

/** kvg_body_rewrite, plus - in the same pass - the canonical prefix stream of a completions or
 *  chat body into info->prefix (docs/canonical.md) and the type checks that needs: "prompt"
 *  (string, array of strings, array of token ids, array of token-id arrays; null or absent:
 *  empty stream), "messages" (non-empty array of objects with a string "role" and "content" a
 *  string, null or an array of parts), "tools" (array or null); each at most once, and so are
 *  the members of a message or part that the stream reads. A type error is KVG_ETYPE with a
 *  message starting with the field path ("prompt: ", "messages[2].content: ",
 *  "messages[0].content[1].type: "), reported only for valid JSON. The stream is allocated from
 *  arena (-ENOMEM when it fails). -EINVAL for an api out of range. For KVG_BODY_API_RESPONSES:
 *  "tools" as for chat, "instructions" (string or null), "input" (string, non-empty array of
 *  items, or null), "previous_response_id" (string or null, into info), with paths
 *  "instructions: ", "input[2].content[0].type: ". For
 *  KVG_BODY_API_OTHER it is exactly kvg_body_rewrite. */
int kvg_body_scan(const char *body, size_t len, kvg_body_api api, const char *salt,
                  kvg_arena *arena, kvg_buf *out, kvg_body_info *info, kvg_json_error *err);

/* The rewritten body as a plan: runs of the original body and the bytes kvgate adds, in order.
 * The pieces point into the body and into the arena; kvg_body_plan_write joins them. */
typedef struct kvg_body_piece {
    const char *data;
    size_t len;
} kvg_body_piece;

typedef struct kvg_body_plan {
    kvg_body_piece *pieces; /* from the arena */
    size_t npieces, cap;
    size_t len; /* the rewritten body's length */
} kvg_body_plan;

/** kvg_body_scan without the copy: the same checks, errors and info, and the rewritten body as
 *  a plan (valid while body and arena are), so that a routing decision does not pay for the
 *  copy the forwarding needs and an explanation pays for none. */
int kvg_body_scan_plan(const char *body, size_t len, kvg_body_api api, const char *salt,
                       kvg_arena *arena, kvg_body_plan *plan, kvg_body_info *info,
                       kvg_json_error *err);
/** Append the rewritten body of a plan to out. 0 or -ENOMEM. */
int kvg_body_plan_write(const kvg_body_plan *plan, kvg_buf *out);
/** Copy the rewritten body of a plan into dst, which has room for plan->len bytes (no NUL).
 *  0, or -EINVAL when the pieces do not add up to plan->len (nothing to send then). */
int kvg_body_plan_copy(const kvg_body_plan *plan, char *dst);

/* ---- the engine's usage report ------------------------------------------------------------- */

typedef enum kvg_usage_field {
    KVG_USAGE_PROMPT_TOKENS = 0, /* usage.prompt_tokens */
    KVG_USAGE_CACHED_TOKENS,     /* usage.prompt_tokens_details.cached_tokens */
    KVG_USAGE_COMPLETION_TOKENS, /* usage.completion_tokens */
    KVG_USAGE_FIELD_COUNT,
} kvg_usage_field;

/* Keys the scanner matches: the numeric fields above and the four that carry output (chat and
 * completions), and the Responses API's two numbers and its "delta". */
#define KVG_USAGE_SCAN_KEYS (KVG_USAGE_FIELD_COUNT + 7)

/* An incremental reader of a response (body or SSE stream) passing through: the usage numbers,
 * and the SSE events that carry output. Embedded; no allocation. */
typedef struct kvg_usage_scan {
    int64_t value[KVG_USAGE_FIELD_COUNT]; /* last value seen; -1 = none */
    uint64_t acc;
    uint64_t output_events; /* SSE events seen so far that carried output */
    uint16_t alive;         /* keys whose first `matched` bytes are the last bytes seen; 0: idle */
    uint16_t keyset;        /* the keys of the response's API */
    uint8_t matched;
    uint8_t state, field, ndigits;
    bool line_started; /* the current line has a byte that is not CR or LF */
    bool after_cr;     /* the last byte was CR (a CRLF's LF ends no second line) */
    bool event_output; /* the current event carries output */
} kvg_usage_scan;

/** Ready s for a chat or completions response. */
void kvg_usage_scan_init(kvg_usage_scan *s);
/** Ready s for a Responses API response (/v1/responses): "input_tokens", "cached_tokens" (of
 *  input_tokens_details) and "output_tokens" give the three fields, and an event carries output
 *  when it has a non-empty string "delta" (response.output_text.delta and the other *.delta
 *  events); "content", "text" and the rest do not count, since the *.done and
 *  response.completed events repeat the whole text. */
void kvg_usage_scan_init_responses(kvg_usage_scan *s);
/** Feed the next bytes of the response. Looks for "prompt_tokens", "cached_tokens" and
 *  "completion_tokens" keys with integer values anywhere in the bytes, across chunk boundaries;
 *  the last occurrence of each wins (a stream's final usage chunk). Counts in output_events the
 *  SSE events (ended by a blank line: LF, CRLF or CR line ends) that carry output: a non-empty
 *  string value of "content", "text" or "reasoning_content" (chat and completions deltas), or a
 *  non-empty "tool_calls" array. A role-only chunk ("content":"" or null), a usage chunk and
 *  [DONE] carry none. A body without blank lines (a JSON answer) has no events. Never fails;
 *  garbage leaves the values as they were. The result does not depend on how the bytes are
 *  split across calls. */
void kvg_usage_scan_feed(kvg_usage_scan *s, const char *data, size_t len);

/* ---- the prefix index (embedded backend) -------------------------------------------------- */

/* For each worker, which block keys it is believed to hold, with each worker's KV capacity
 * modelled by LRU eviction. Safe for every gateway thread at once: lookups share a read lock,
 * recording and worker changes take it exclusively. Memory: about 28 bytes per entry (32 when
 * max_entries is not a power of two), allocated as entries are recorded, never more than for
 * max_entries. */
typedef struct kvg_prefix_index kvg_prefix_index;

typedef struct kvg_index_config {
    uint64_t max_entries;        /* (worker, key) entries in the whole index; 0 = 1 << 24, at
                                    most 1 << 30 (above (1 << 28) - 1: taken as that) */
    uint32_t default_capacity;   /* blocks for a worker whose capacity is 0 (unknown); 0 = 65536 */
    uint32_t speculative_ttl_ms; /* how long a speculative entry (the gateway's record for a
                                    worker whose events flow) lives unless a BlockStored
                                    confirms it; 0 = 5000 (docs/kv-events.md, "Sources") */
    uint64_t (*clock_ms)(void *arg); /* milliseconds for the TTL; NULL = CLOCK_MONOTONIC (tests
                                        and the simulator pass their own) */
    void *clock_arg;
} kvg_index_config;

/* A worker as the index knows it. */
typedef struct kvg_index_worker {
    uint64_t id;       /* kvg_worker_id: a worker replaced by a new definition starts empty */
    const char *name;  /* for metrics; copied */
    uint32_t capacity; /* blocks it can hold; 0 = the default */
} kvg_index_worker;

/** Create an empty index; cfg NULL for defaults. 0, -ENOMEM, -EINVAL (max_entries too big,
 *  out NULL). */
int kvg_index_new(const kvg_index_config *cfg, kvg_prefix_index **out);
/** Free the index. NULL is a no-op. */
void kvg_index_free(kvg_prefix_index *idx);
/** Make the index's worker list exactly ws: workers not listed lose every entry; listed ones
 *  keep theirs (a lowered capacity evicts down to it at once, counted as evictions); names are
 *  copied (NULL = ""). All or nothing. Thread-safe. 0, -ENOMEM, -EINVAL (an id listed twice,
 *  ws NULL with n > 0, more than 1 << 24 workers). */
int kvg_index_set_workers(kvg_prefix_index *idx, const kvg_index_worker *ws, size_t n);
/** For each of the nworkers worker ids, the number of leading keys (keys[0], keys[1], ...
 *  without a gap) that worker holds, into matched[]. keys is a chain (key i a function of keys
 *  0..i, as block keys are): what a worker holds of a chain is then a prefix of it, and the
 *  depth is found by bisection; for key lists that are not chains the answer is only bounded
 *  by the leading run and the held keys. Unknown ids match 0; an id may be listed twice. Read-only:
 * it does not refresh recency. Cannot fail: allocates nothing for up to 64 ids, and above that
 * falls back to slower stack batches when memory is short. Thread-safe. */
void kvg_index_match(kvg_prefix_index *idx, const uint64_t *keys, size_t nkeys,
                     const uint64_t *worker_ids, size_t nworkers, uint32_t *matched);
/** kvg_index_match, and how many of each worker's matched leading keys it holds on its GPU (the
 *  rest are held only on a CPU or other offloading tier, known from the engines' events): true
 *  when that differs from matched for some worker, the GPU depths then written to
 *  matched_gpu[] (each <= matched); false when every matched key is on the GPU, and
 *  matched_gpu[] is then not written (the GPU depths are matched[]). matched_gpu NULL: not asked
 *  (false). Costs nothing more than kvg_index_match while no engine reported another tier;
 *  otherwise a bisection per worker holding one. */
bool kvg_index_match_tiers(kvg_prefix_index *idx, const uint64_t *keys, size_t nkeys,
                           const uint64_t *worker_ids, size_t nworkers, uint32_t *matched,
                           uint32_t *matched_gpu);
/** Record that the worker now holds keys[0..nkeys): each becomes its most recently used entry,
 *  keys[0] the most recent of all (engines evict a sequence's tail before its head); the
 *  least recently used entries beyond the worker's capacity are evicted. When the index holds
 *  max_entries, a new entry takes the place of the worker's own least recent one (none: the
 *  rest is not recorded). The new entries are model entries (on the GPU), or, for a worker
 *  whose source is KVG_INDEX_SOURCE_EVENTS, speculative ones that go after the speculative TTL
 *  unless a BlockStored confirms them; entries already held keep what they are (a record only
 *  refreshes their recency, not a speculative entry's deadline). Also sweeps a bounded number
 *  of passed deadlines (kvg_index_expire). 0, KVG_ENOTFOUND (unknown worker), -EINVAL (keys
 *  NULL, nkeys > 0), -ENOMEM (the keys from the tail down to the failure stay recorded; the
 *  index is consistent and usable). Keys already held cost no allocation. Thread-safe. */
int kvg_index_record(kvg_prefix_index *idx, uint64_t worker_id, const uint64_t *keys, size_t nkeys);

/** For each of the n worker ids, how fast its entries turn over: the entries added to it lately
 *  (each entry added anywhere ages the count by exp(-1 / the workers' total capacity)) over its
 *  capacity; 0 for an unknown id. Read-only; thread-safe. */
void kvg_index_turnover(kvg_prefix_index *idx, const uint64_t *worker_ids, size_t n, float *out);

typedef struct kvg_index_stats {
    uint64_t entries;   /* (worker, key) entries held */
    uint64_t capacity;  /* sum of the workers' capacities, capped by max_entries */
    uint64_t evictions; /* entries evicted for capacity (a worker's or max_entries), since start;
                           entries of a removed worker are not counted */
    uint64_t inserts;   /* entries added, since start */
    uint32_t workers;
    uint64_t speculative;    /* speculative entries now */
    uint64_t spec_inserted;  /* since start: speculative entries made (recorded, or a guess
                                given a deadline when its worker's events began) */
    uint64_t spec_confirmed; /* ... confirmed by a BlockStored before their deadline */
    uint64_t spec_expired;   /* ... gone at their deadline */
    uint64_t spec_dropped;   /* ... gone otherwise (evicted, removed, cleared, worker left) */
    uint64_t cpu_entries;    /* entries held on a CPU or other offloading tier (too) */
} kvg_index_stats;

void kvg_index_stats_get(kvg_prefix_index *idx, kvg_index_stats *out);
/** The capacity given to a worker whose capacity is 0 (kvg_index_config.default_capacity). */
uint32_t kvg_index_default_capacity(const kvg_prefix_index *idx);
/** Entries held by one worker; 0 for an unknown id. */
uint64_t kvg_index_worker_entries(kvg_prefix_index *idx, uint64_t worker_id);
/** Append kvgate_index_entries, kvgate_index_capacity_entries, kvgate_index_evictions_total,
 *  kvgate_index_inserts_total, kvgate_index_speculative_entries,
 *  kvgate_index_speculative_total{outcome}, kvgate_index_cpu_entries,
 *  kvgate_index_worker_entries{worker} and kvgate_index_worker_source{worker,source} with HELP
 *  and TYPE. */
void kvg_index_write_metrics(kvg_prefix_index *idx, kvg_buf *out);

/* ---- Redis: the shared prefix map of replicated gateways ----------------------------------- */

/*
 * With a Redis URL the prefix map lives in Redis, shared by every gateway replica (the
 * embedded index goes on learning beside it, for the decisions Redis cannot answer in time).
 * Three parts, docs/redis.md has the whole picture:
 *  - kvg_redis, one per gateway: the URL, and a topology thread that finds out with blocking
 *    calls, off every event loop, which server is the primary (standalone, or the one the
 *    Sentinels name) or which primary owns which slot (Cluster), and publishes that as a
 *    snapshot. Event loops only ever connect to addresses it has resolved.
 *  - kvg_redis_client, one per event loop: a connection per primary carrying the prefix map's
 *    lookups and records asynchronously (hiredis on the loop, through its libevent adapter).
 *    Commands in flight are bounded; a connection whose oldest command goes unanswered too
 *    long is dropped; reconnects back off.
 *  - blocking connections for the shared state (admin/), on threads allowed to block.
 */
typedef struct kvg_redis kvg_redis;
typedef struct kvg_redis_client kvg_redis_client;
typedef struct kvg_redis_op kvg_redis_op;
struct event_base;
struct redisContext;

typedef enum kvg_redis_mode {
    KVG_REDIS_STANDALONE = 0, /* redis://: one server */
    KVG_REDIS_SENTINEL,       /* redis-sentinel://: the primary the Sentinels name */
    KVG_REDIS_CLUSTER,        /* redis:// to a node that says cluster_enabled:1 */
    KVG_REDIS_MODE_COUNT,
} kvg_redis_mode;

const char *kvg_redis_mode_str(kvg_redis_mode m);

#define KVG_REDIS_SEEDS_MAX 16
#define KVG_REDIS_HOST_MAX 256

typedef struct kvg_redis_seed {
    char host[KVG_REDIS_HOST_MAX]; /* name or address, IPv6 without brackets */
    uint16_t port;
} kvg_redis_seed;

/* A parsed Redis URL. */
typedef struct kvg_redis_url {
    kvg_redis_mode mode; /* STANDALONE (redis://) or SENTINEL (redis-sentinel://) */
    char user[128];      /* "" = none: AUTH with the password alone */
    char password[256];  /* "" = no AUTH */
    kvg_redis_seed seeds[KVG_REDIS_SEEDS_MAX];
    size_t nseeds;    /* redis://: 1; redis-sentinel://: the Sentinels */
    uint32_t db;      /* redis://host/N (standalone only; a cluster has db 0 alone) */
    char master[128]; /* redis-sentinel://: the name the Sentinels know the primary by */
} kvg_redis_url;

/** Parse redis://[[user]:password@]host[:port][/db] (port 6379, db 0..65535) or
 *  redis-sentinel://[[user]:password@]host[:port][,host[:port]...]/master-name (port 26379,
 *  1..KVG_REDIS_SEEDS_MAX Sentinels; the credentials are the primary's). Hosts are names,
 *  IPv4 addresses or bracketed IPv6 addresses; user and password are percent-decoded.
 *  Returns 0, or KVG_EPARSE with a message naming what is wrong written to msg (may be NULL);
 *  out is written on success only. */
int kvg_redis_url_parse(const char *url, kvg_redis_url *out, char *msg, size_t msg_len);
/** Write u back as a URL (always NUL-terminated, truncated to len), its password as "***"
 *  when redact: for logs, /readyz and metrics. */
void kvg_redis_url_format(const kvg_redis_url *u, bool redact, char *out, size_t len);

typedef struct kvg_redis_config {
    const char *url;               /* required (copied) */
    const char *prefix;            /* starts every key and channel (copied); NULL = "kvg" */
    uint32_t connect_timeout_ms;   /* a connection (TCP and the handshake); 0 = 1000 */
    uint32_t command_timeout_ms;   /* a connection whose oldest command is unanswered this long
                                      is dropped and made again; 0 = 1000 */
    uint32_t max_inflight;         /* commands in flight per connection; past it a command is
                                      refused at once (-EBUSY); 0 = 1024 */
    uint32_t reconnect_max_ms;     /* reconnect backoff: 50 ms doubling to this, jittered; 0 =
                                      2000 */
    uint32_t topology_interval_ms; /* the topology thread checks this often (Sentinel's answer,
                                      the slot map, the primary's role); 0 = 1000 */
    uint64_t entry_ttl_ms;         /* a worker's map entries expire this long after its last
                                      record (so do a removed worker's); 0 = 24 h */
} kvg_redis_config;

/** Parse the URL and start the topology thread; nothing is waited for (see
 *  kvg_redis_wait_topology). 0, KVG_EPARSE (the URL, see msg), -EINVAL (cfg or url NULL, a
 *  value out of range) or -ENOMEM / -errno (thread creation). */
int kvg_redis_new(const kvg_redis_config *cfg, kvg_redis **out, char *msg, size_t msg_len);
/** Stop the topology thread and free. Every client must have been freed first. NULL: no-op. */
void kvg_redis_free(kvg_redis *r);
/** Wait until the topology thread has reached a primary (and, for Cluster, read the slot
 *  map), at most timeout_ms. 0, or -ETIMEDOUT with the last error ("127.0.0.1:6379: Connection
 *  refused") in msg. Any thread except an event loop's. */
int kvg_redis_wait_topology(kvg_redis *r, uint32_t timeout_ms, char *msg, size_t msg_len);
/** Ask the topology thread to check again now (a redirect, a lost primary). Coalesced with
 *  other requests; returns at once. Any thread. */
void kvg_redis_refresh_topology(kvg_redis *r);
/** The mode found (SENTINEL and STANDALONE as the URL says; CLUSTER once a node said so). */
kvg_redis_mode kvg_redis_mode_of(kvg_redis *r);
/** The key prefix (config prefix, default "kvg"). */
const char *kvg_redis_prefix(const kvg_redis *r);
/** False when Redis is degraded (no primary known, or no client connected to every primary
 *  it needs), with one line saying why in why ("no connection to 127.0.0.1:6379: Connection
 *  refused"); true and why "" when all is well. For /readyz's detail: a degraded Redis does
 *  not make the gateway unready (decisions fall back). Thread-safe. */
bool kvg_redis_healthy(kvg_redis *r, char *why, size_t len);
/** Append the client's series: kvgate_redis_connections{state}, kvgate_redis_reconnects_total,
 *  kvgate_redis_redirects_total{kind}, kvgate_redis_topology_changes_total,
 *  kvgate_redis_commands_dropped_total{reason}, and the prefix map's
 *  kvgate_redis_lookup_seconds, kvgate_redis_record_seconds (round trips),
 *  kvgate_redis_lookups_total{outcome}, kvgate_redis_records_total{outcome}. */
void kvg_redis_write_metrics(kvg_redis *r, kvg_buf *out);

/** A blocking connection to the primary that owns slot_key's hash slot (any primary when
 *  slot_key is NULL), authenticated and on the URL's db, with timeout_ms as its connect and
 *  command timeout: for the shared state, on threads that may block. Waits for the topology
 *  up to timeout_ms. 0 and *out (the caller frees it with redisFree), or -ETIMEDOUT /
 *  -ECONNREFUSED / KVG_EPROTO (AUTH or SELECT refused) / -ENOMEM with msg. Any thread except
 *  an event loop's. */
int kvg_redis_connect_blocking(kvg_redis *r, const char *slot_key, size_t slot_key_len,
                               uint32_t timeout_ms, struct redisContext **out, char *msg,
                               size_t msg_len);

/** A client on base (an event loop that must outlive it), used only from that loop's thread.
 *  It connects to the primaries in the background. 0, -ENOMEM. */
int kvg_redis_client_new(kvg_redis *r, struct event_base *base, kvg_redis_client **out);
/** Close the client's connections; callbacks of operations still pending are not called.
 *  From the loop's thread. NULL: no-op. */
void kvg_redis_client_free(kvg_redis_client *c);

/* The prefix map's operations: the same questions as kvg_index_match and kvg_index_record,
 * answered by scripts in Redis in one round trip each. root names the chain's root (scope,
 * model, block size: kvg_route_plan.root), a worker is named by kvg_worker_map_id. */

/** Called once with the answer: status 0 and matched[i] for map_ids[i] (borrowed: copy what
 *  you keep), or a negative code and matched NULL: -ENOTCONN (no ready connection),
 *  -EBUSY (too many commands in flight), -ECONNRESET (the connection went while waiting),
 *  -ETIMEDOUT (the connection was dropped for not answering), KVG_EPROTO (an error reply or a
 *  malformed one). Runs on the client's loop. */
typedef void kvg_map_lookup_cb(void *ud, int status, const uint32_t *matched, size_t n);

/** Ask for each worker's matched depth of keys (a chain, as for kvg_index_match). 0 and *op
 *  (the handle kvg_redis_op_cancel takes, valid until cb runs or the op is cancelled), with cb
 *  called later, never from inside this call; or a negative code as cb would get, cb never
 *  called. From the client's loop. */
int kvg_map_lookup(kvg_redis_client *c, uint64_t root, const uint64_t *keys, size_t nkeys,
                   const uint64_t *map_ids, size_t nworkers, kvg_map_lookup_cb *cb, void *ud,
                   kvg_redis_op **op);
/** Forget a pending operation: its callback will not be called. The command may still run in
 *  Redis; its slot in the bound on commands in flight is freed by its reply. */
void kvg_redis_op_cancel(kvg_redis_op *op);
/** Record that worker map_id now holds keys (most recent first, LRU capacity blocks, as
 *  kvg_index_record), without waiting for the answer (counted in the metrics). 0, or -ENOTCONN,
 *  -EBUSY (not sent). From the client's loop. */
int kvg_map_record(kvg_redis_client *c, uint64_t root, uint64_t map_id, uint32_t capacity,
                   const uint64_t *keys, size_t nkeys);

/* ---- routing decisions ------------------------------------------------------------------------
 */

/* The router: the prefix index and the decision metrics, shared by every gateway thread. */
typedef struct kvg_router kvg_router;

/** Create a router with an empty index (cfg NULL: index defaults). 0, -ENOMEM, -EINVAL. */
int kvg_router_new(const kvg_index_config *cfg, kvg_router **out);
/** NULL is a no-op. */
void kvg_router_free(kvg_router *rt);
kvg_prefix_index *kvg_router_index(kvg_router *rt);
/** Bring the index's worker list up to set (decisions do it themselves; the KV-event consumer
 *  calls it so that a new worker's events are not refused before its first request). */
void kvg_router_sync_workers(kvg_router *rt, kvg_worker_set *set);

/* Stages of a decision, timed for kvgate_route_decision_seconds{stage}. */
typedef enum kvg_route_stage {
    KVG_ROUTE_STAGE_PARSE = 0, /* the body scan (timed by the caller) */
    KVG_ROUTE_STAGE_HASH,
    KVG_ROUTE_STAGE_LOOKUP,
    KVG_ROUTE_STAGE_CHOOSE,
    KVG_ROUTE_STAGE_TOTAL,
    KVG_ROUTE_STAGE_COUNT,
} kvg_route_stage;

const char *kvg_route_stage_str(kvg_route_stage s);

typedef struct kvg_route_request {
    const kvg_body_info *body;       /* model and prefix stream, from kvg_body_scan */
    const char *salt;                /* the scope salt; NULL = none */
    const kvg_policy_config *policy; /* settings (kind, block sizes, weights) */
    uint64_t rotation;               /* advanced once per decision by the caller */
    size_t rank_limit;               /* rank only the best this many (0: all; see
                                        kvg_policy_choose_top) */
    uint64_t (*clock_ns)(void);      /* for stage timings; NULL = none (simulation, tests) */
    uint64_t start_ns;               /* with clock_ns: when the decision began, if the caller
                                        just read the clock (0: read it) */
    uint64_t now_ns;                 /* kvg_now_ns() for the age of scraped engine load and for
                                        outlier ejections; 0 = do not use scraped load, ignore
                                        ejections */
    uint64_t engine_load_max_age_ns; /* scraped load older than this is ignored; 0 = ignore
                                        scraped load (scraping off) */
    /* Token-exact mode (model/model.h): the request's model when the operator defined it with
     * a tokenizer, else NULL (byte mode). The keys are then the engine's own block hashes of
     * raw_body (the body as the client sent it; the scope salt is hashed as the cache_salt the
     * gateway injects), and a request the mode does not cover falls back to byte mode. */
    const kvg_model *model;
    kvg_model_input model_input;
    const char *raw_body;
    size_t raw_len;
    /* With model: the keys kvg_model_keys already made (off the loop, for a large body), or
     * the reason it refused the request (exact_error); both NULL: prepare makes them. */
    const kvg_model_keys_out *exact_keys;
    const char *exact_error;
} kvg_route_request;

/* How a decision's keys were made. */
typedef enum kvg_route_mode {
    KVG_ROUTE_MODE_BYTES = 0,      /* from the canonical prefix stream (docs/canonical.md) */
    KVG_ROUTE_MODE_TOKEN_EXACT,    /* the engine's block hashes (docs/hashing.md) */
    KVG_ROUTE_MODE_EXACT_FALLBACK, /* a token-exact model, but a request the mode does not
                                      cover: byte mode */
    KVG_ROUTE_MODE_COUNT,
} kvg_route_mode;

const char *kvg_route_mode_str(kvg_route_mode m);

/* One eligible worker, in ranked order. */
typedef struct kvg_route_candidate {
    kvg_worker *worker; /* borrowed from the snapshot given to kvg_router_decide */
    uint32_t matched;   /* leading blocks it holds */
    uint32_t inflight;  /* as the policy saw it */
    uint32_t pending;   /* blocks it has still to prefill for this gateway, as the policy saw */
    uint32_t waiting;   /* the engine's scraped queue as the policy saw it; 0 = unknown */
    float kv_usage;     /* the engine's scraped KV cache usage, 0..1; 0 = unknown */
    kvg_policy_terms terms;
} kvg_route_candidate;

typedef struct kvg_route_decision kvg_route_decision;

/** A Redis lookup's end (kvg_router_lookup): status 0 when Redis answered (the matches are in
 *  place: kvg_router_choose next), else the lookup failed (kvg_router_fallback, then choose).
 *  Runs on the client's loop. */
typedef void kvg_route_lookup_cb(void *ud, kvg_route_decision *d, int status);

struct kvg_route_decision {
    kvg_route_candidate *cands; /* eligible workers (serve the model, up, not draining, not
                                   ejected), best
                                   first, at most rank_limit of them; from the arena */
    size_t ncands;
    size_t serving; /* workers serving the model, eligible or not */
    size_t ejected; /* of those, skipped as ejected by outlier detection (when every other one
                       was ineligible too, the ejected ones are eligible after all: counted 0) */
    uint64_t *keys; /* the request's block keys (arena), nkeys of them */
    uint32_t nkeys;
    kvg_hash_unit unit;
    uint32_t block_size; /* bytes or tokens per block */
    double block_weight; /* one block against the policy's priced block (block_tokens tokens):
                            block_size / block_tokens in token-exact mode, else 1 */
    size_t stream_units; /* length of the prefix stream, in bytes or tokens */
    uint64_t root;       /* the chain's root: scope salt, model, unit and block size (the shared
                            prefix map's hash tag) */
    kvg_policy_kind policy;
    kvg_policy_reason reason;
    kvg_route_mode mode;
    const char *exact_error;       /* KVG_ROUTE_MODE_EXACT_FALLBACK: why (arena) */
    kvg_vllm_hash first_hashes[2]; /* token-exact: the first blocks' digests, min(nkeys, 2) */
    bool shared;                   /* the matches came from the shared prefix map (Redis) */
    bool fell_back;           /* a Redis lookup failed or was late: the embedded index answered */
    const char *hash_backend; /* what hashed the keys: "cpu" (at once), the GPU's name, or
                                 "fallback" (the CPU after a device error) */
    uint64_t stage_ns[KVG_ROUTE_STAGE_COUNT]; /* 0 without a clock; PARSE is the caller's */

    /* Between kvg_router_prepare and kvg_router_choose (arena): the eligible workers, borrowed
     * from the set given to prepare, which must stay referenced until choose; their policy
     * candidates; their matches, which the lookup fills. */
    kvg_worker **eligible;
    size_t neligible;
    kvg_policy_candidate *pcs;
    uint32_t *matched;
    uint64_t start_ns, lookup_start_ns; /* req->clock_ns at prepare's start and end */
    kvg_redis_op *lookup_op;            /* a pending Redis lookup */
    kvg_route_lookup_cb *lookup_cb;
    void *lookup_ud;
    kvg_router *lookup_rt; /* the router the pending lookup answers for */
};

/** Decide where a request goes at once, on the embedded index: kvg_router_prepare,
 *  kvg_router_match_local, kvg_router_choose. Pure apart from the index read (and, when set is
 *  newer than the index's worker list, bringing that list up to date). Nothing is counted:
 *  kvg_router_count does that for decisions really taken. 0 or -ENOMEM (arena); *out written
 *  on success. */
int kvg_router_decide(kvg_router *rt, kvg_worker_set *set, const kvg_route_request *req,
                      kvg_arena *arena, kvg_route_decision *out);

/* A decision in three steps, so that the lookup may wait for Redis on the caller's loop
 * (docs/architecture.md, "The decision step"): prepare, lookup (at once on the embedded index;
 * later from Redis, or the embedded index's answer when Redis fails or is late), choose. */

/** Step 1: block keys, root, eligible workers. 0 or -ENOMEM; *out written (all of it). The
 *  two halves below with kvg_hash_batch between them. */
int kvg_router_prepare(kvg_router *rt, kvg_worker_set *set, const kvg_route_request *req,
                       kvg_arena *arena, kvg_route_decision *out);
/** Step 1a: the hashing job of the request (its keys array from the arena, not yet filled),
 *  the chain's root and the stream's size into *out (all of it written). 0 or -ENOMEM. The
 *  job borrows from req's body and salt. */
int kvg_router_prepare_job(kvg_router *rt, kvg_worker_set *set, const kvg_route_request *req,
                           kvg_arena *arena, kvg_route_decision *out, kvg_hash_job *job);
/** Step 1b, once the job is hashed (hashed: kvg_hash_batch's result, at once or from the
 *  batcher; negative: no keys, the request is routed by load): the keys into out, the hash
 *  stage's time, the eligible workers. 0 or -ENOMEM. */
int kvg_router_prepare_workers(kvg_worker_set *set, const kvg_route_request *req, kvg_arena *arena,
                               kvg_route_decision *out, const kvg_hash_job *job, int hashed);
/** Step 2: each eligible worker's match. Without a client, or with nothing to match (no keys,
 *  no eligible worker), the embedded index answers now: returns 1. With one, the lookup goes
 *  to Redis and 0 is returned: cb(ud, d, status) comes later on the client's loop, unless
 *  kvg_router_lookup_cancel is called first. A negative code (Redis cannot take it now: not
 *  connected, too many in flight) means nothing is pending: kvg_router_fallback, then choose. */
int kvg_router_lookup(kvg_router *rt, kvg_redis_client *c, kvg_route_decision *d,
                      kvg_route_lookup_cb *cb, void *ud);
/** Stop waiting for a pending lookup (its deadline passed: timed_out, counted as a timeout;
 *  or the request went). cb will not be called. No-op when nothing is pending. */
void kvg_router_lookup_cancel(kvg_route_decision *d, bool timed_out);
/** The embedded index's matches, for a lookup Redis did not answer (sets fell_back). */
void kvg_router_fallback(kvg_router *rt, kvg_route_decision *d);
/** Step 3: rank the eligible workers under the policy. 0 or -ENOMEM. */
int kvg_router_choose(kvg_router *rt, const kvg_route_request *req, kvg_arena *arena,
                      kvg_route_decision *d);

/** Count a decision in the metrics (stage histograms, blocks, decisions by policy and reason).
 *  Call it once per decision really taken, before its first attempt. */
void kvg_router_count(kvg_router *rt, const kvg_route_decision *d);
/** An attempt of the decision goes to w: when w's index source is KVG_INDEX_SOURCE_EVENTS,
 *  record the decision's keys for it at once as speculative entries (docs/kv-events.md,
 *  "Sources"); for any other worker nothing (it is recorded at its 200). Call it at each
 *  attempt, before the request is sent. */
void kvg_router_speculate(kvg_router *rt, const kvg_worker *w, const kvg_route_decision *d);
/** The worker answered 200: it now holds the decision's blocks; matched is how many of them
 *  it was predicted to hold (its candidate's matched, counted in kvgate_route_blocks_total).
 *  Recorded in the embedded index, and in Redis too when c is not NULL (sent, not waited
 *  for). 0, KVG_ENOTFOUND (the worker left the index meanwhile), -ENOMEM. */
int kvg_router_record(kvg_router *rt, kvg_redis_client *c, const kvg_worker *w,
                      const kvg_route_decision *d, uint32_t matched);
/** Prompt tokens predicted cached on a worker that matched `matched` blocks, in the engine's
 *  units: prompt_tokens x (matched x block_size / stream_units), at most prompt_tokens. */
uint64_t kvg_route_predicted_tokens(const kvg_route_decision *d, uint32_t matched,
                                    int64_t prompt_tokens);
/** The prefill work of `missing` blocks of the decision in the policy's priced blocks (the
 *  unit of a worker's pending count, kvg_worker_pending_add): missing x block_weight, rounded
 *  up, at most UINT32_MAX. */
uint32_t kvg_route_pending_units(const kvg_route_decision *d, uint32_t missing);
/** Append the index's and the decisions' Prometheus series. */
void kvg_router_write_metrics(kvg_router *rt, kvg_buf *out);

/* ---- vLLM KV-cache events: the decoder and the index's side ------------------------------- */

/* One msgpack payload of vLLM's KV-event publisher (a KVEventBatch: timestamp, events, data
 * parallel rank), decoded without allocating per event: the decoder keeps its arrays from one
 * batch to the next. The wire format, what is accepted and what is refused: docs/kv-events.md. */

typedef enum kvg_kv_event_kind {
    KVG_KV_BLOCK_STORED = 0,
    KVG_KV_BLOCK_REMOVED,
    KVG_KV_ALL_BLOCKS_CLEARED,
    KVG_KV_EVENT_KIND_COUNT
} kvg_kv_event_kind;

/** "BlockStored", "BlockRemoved", "AllBlocksCleared" (vLLM's tags); "?" out of range. */
const char *kvg_kv_event_kind_str(kvg_kv_event_kind k);

/* The cache tier an event is about. */
typedef enum kvg_kv_medium {
    KVG_KV_MEDIUM_ABSENT = 0, /* field missing or nil (vLLM before mediums: the GPU) */
    KVG_KV_MEDIUM_GPU,        /* "GPU" */
    KVG_KV_MEDIUM_CPU,        /* "CPU" */
    KVG_KV_MEDIUM_OTHER,      /* any other string (e.g. a connector's disk tier) */
    KVG_KV_MEDIUM_COUNT
} kvg_kv_medium;

/** "absent", "GPU", "CPU", "other"; "?" out of range. */
const char *kvg_kv_medium_str(kvg_kv_medium m);

typedef struct kvg_kv_event {
    kvg_kv_event_kind kind;
    kvg_kv_medium medium;
    bool has_parent;        /* BlockStored: parent_block_hash was not nil */
    bool has_lora_id;       /* BlockStored: lora_id was not nil */
    uint32_t nhashes;       /* block_hashes (0 for AllBlocksCleared) */
    const uint64_t *hashes; /* in the event's order (a BlockStored's: chain order, parent
                               first); a negative integer is taken modulo 2^64, a byte string
                               as vLLM turns one into an int: its last 8 bytes, big-endian */
    uint64_t parent;        /* when has_parent */
    uint64_t ntokens;       /* BlockStored: token_ids counted (not kept) */
    uint32_t block_size;    /* BlockStored */
    int64_t lora_id;        /* when has_lora_id */
} kvg_kv_event;

typedef struct kvg_kv_batch {
    double ts;        /* the engine's clock (seconds since the epoch) */
    bool has_dp_rank; /* data_parallel_rank present and not nil */
    int64_t dp_rank;
    size_t nevents;
    const kvg_kv_event *events; /* owned by the decoder: valid until its next decode or free */
    size_t nhashes;             /* block hashes of all events together */
} kvg_kv_batch;

/* Bounds on one payload; 0 takes the default. */
typedef struct kvg_kv_limits {
    uint32_t max_events;       /* events in one batch; default 65536 */
    uint32_t max_hashes;       /* block hashes in one event; default 1 << 20 */
    uint32_t max_total_hashes; /* block hashes in one batch; default 1 << 22 */
    uint32_t max_depth;        /* nesting of the unknown fields that are skipped; default 32 */
} kvg_kv_limits;

typedef struct kvg_kv_decoder kvg_kv_decoder;

/** A decoder with limits (NULL: the defaults). 0, -ENOMEM, -EINVAL (out NULL). */
int kvg_kv_decoder_new(const kvg_kv_limits *limits, kvg_kv_decoder **out);
/** Free a decoder and the last batch it decoded. NULL is a no-op. */
void kvg_kv_decoder_free(kvg_kv_decoder *d);
/** Decode one payload (the third frame of a publisher's message) into *out; the batch points
 *  into the decoder, valid until its next decode. Borrows data. Strict: anything that is not a
 *  batch as vLLM encodes one (array or map form, docs/kv-events.md) is refused, with the first
 *  bad element named in kvg_kv_decoder_error. 0, KVG_EPARSE (malformed, truncated, a wrong type,
 *  trailing bytes), KVG_ELIMIT (a bound of the limits), -ENOMEM; *out untouched on error.
 *  Allocates only when a batch is larger than every earlier one. Not thread-safe: one decoder
 *  per thread. */
int kvg_kv_decode(kvg_kv_decoder *d, const void *data, size_t len, kvg_kv_batch *out);
/** What the last failed decode found, e.g. "events[3][1][7]: not an integer"; "" after a
 *  success. Never NULL; valid until the next decode. */
const char *kvg_kv_decoder_error(const kvg_kv_decoder *d);

/** Forget that the worker holds keys[0..nkeys) on any tier: each (key, worker) entry held is
 *  dropped; keys it does not hold are skipped (a BlockRemoved of one tier: apply_events). Not
 * counted as evictions. Written to *removed (NULL allowed): the entries dropped. 0, KVG_ENOTFOUND
 * (unknown worker), -EINVAL (keys NULL with nkeys > 0). Allocates nothing. Thread-safe (the write
 * lock, released every few hundred keys as kvg_index_record does). */
int kvg_index_remove(kvg_prefix_index *idx, uint64_t worker_id, const uint64_t *keys, size_t nkeys,
                     uint64_t *removed);
/** Drop every entry of the worker (vLLM's AllBlocksCleared, an engine restart); the worker
 *  stays listed with its capacity. Not counted as evictions. 0, KVG_ENOTFOUND. Allocates
 *  nothing; one hold of the write lock, O(the worker's entries). Thread-safe. */
int kvg_index_clear_worker(kvg_prefix_index *idx, uint64_t worker_id);

/* Where the index learns what a worker holds (docs/kv-events.md, "Sources"). */
typedef enum kvg_index_source {
    /* No events: the gateway's own records after its decisions, bounded by the worker's
     * capacity with LRU eviction (the model). The default for every worker. */
    KVG_INDEX_SOURCE_MODEL = 0,
    /* The engine's events arrive and are the truth: BlockStored/BlockRemoved/AllBlocksCleared
     * define the entries; the gateway's records after a decision are speculative entries that
     * expire after the index's speculative TTL unless a BlockStored confirms them. */
    KVG_INDEX_SOURCE_EVENTS,
    /* The worker has events configured but they stopped arriving (the consumer's staleness
     * rule): the index falls back to the model for it, as KVG_INDEX_SOURCE_MODEL, keeping what
     * the events had said, until events arrive again. */
    KVG_INDEX_SOURCE_EVENTS_STALE,
    KVG_INDEX_SOURCE_COUNT
} kvg_index_source;

/** Set how the worker's entries are learned from now on. Leaving KVG_INDEX_SOURCE_EVENTS, its
 *  speculative entries become model entries (the fallback keeps what the gateway routed
 *  there); entering it, its model entries that no BlockStored confirmed become speculative with
 *  a fresh TTL (without the memory for their deadlines they are dropped at once: the index then
 *  knows less, never more). Between model and events_stale nothing changes but the source.
 *  O(the worker's entries) under one hold of the write lock; never fails for memory.
 *  Thread-safe. 0, KVG_ENOTFOUND (unknown worker), -EINVAL (src out of range). A worker that
 *  leaves and comes back (kvg_index_set_workers without it, then with it) starts at
 *  KVG_INDEX_SOURCE_MODEL. */
int kvg_index_set_source(kvg_prefix_index *idx, uint64_t worker_id, kvg_index_source src);
/** Drop the speculative entries whose deadline is at or before now_ms (0: the index's clock,
 *  kvg_index_config.clock_ms); the number dropped. Meant for the KV-event consumer's every
 *  poll: a read hold when nothing is due; else the write lock, let go every few hundred
 *  entries. Allocates nothing. Thread-safe. */
uint64_t kvg_index_expire(kvg_prefix_index *idx, uint64_t now_ms);
/** The worker's source; KVG_INDEX_SOURCE_MODEL for an unknown id. Thread-safe. */
kvg_index_source kvg_index_get_source(kvg_prefix_index *idx, uint64_t worker_id);
/** "model", "events", "events_stale" (for the workers API and metrics); "unknown" out of range. */
const char *kvg_index_source_name(kvg_index_source src);

/* What kvg_index_apply_events did. */
typedef struct kvg_index_apply_stats {
    uint64_t stored;  /* keys of BlockStored events recorded */
    uint64_t removed; /* (entry, tier) holdings dropped by BlockRemoved events */
    uint64_t cleared; /* AllBlocksCleared events applied */
    uint64_t skipped; /* always 0: every tier is kept since tiers came (issue 17); the field
                         stays for the callers that count it */
} kvg_index_apply_stats;

/** Apply a decoded batch of one worker's events, in order: BlockStored records its keys as
 *  kvg_index_record does (hashes[0] most recent; capacity evicts LRU) on its tier, confirming
 *  speculative and model entries; BlockRemoved drops the keys' tier (the entry goes with its
 *  last tier); AllBlocksCleared as kvg_index_clear_worker. Tiers: medium GPU or absent is the
 *  GPU, CPU and any other medium the CPU tier (docs/kv-events.md, "Sources"). st may be NULL. 0,
 * KVG_ENOTFOUND (unknown worker, or it left the index meanwhile: the events before stay applied),
 * -ENOMEM (as kvg_index_record: the events before and part of that one applied; the index stays
 * consistent). Thread-safe: takes the write lock once per batch, released every few hundred keys so
 * lookups go on. */
int kvg_index_apply_events(kvg_prefix_index *idx, uint64_t worker_id, const kvg_kv_batch *batch,
                           kvg_index_apply_stats *st);

#endif
