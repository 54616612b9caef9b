/* SPDX-License-Identifier: Apache-2.0 */
/* Private layout of the worker registry: worker objects, snapshots and their shared helpers. */
#ifndef KVG_ROUTER_INT_H
#define KVG_ROUTER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "prom.h"
#include "router.h"

/* HTTP status codes counted per worker: 0 (no status) .. 599. */
#define WORKER_CODES 600
/* The layout of the per-worker latency histograms (request duration, ttfb). */
extern const kvg_prom_buckets kvg_router_latency_buckets;

#define URL_MAX 1024
#define HOST_MAX 256
#define REGISTRY_THREADS_MAX 4096
#define HEALTH_THRESHOLD_MAX 1000

/* An immutable, validated copy of a kvg_worker_def with the URL already parsed. One
 * allocation: the strings and the model array follow the struct. Refcounted, so the
 * registry's definition lists and the worker built from an entry share it. */
typedef struct worker_spec {
    _Atomic size_t refs;
    const char *name;
    const char *url;
    const char *host;      /* without brackets */
    const char *authority; /* host:port, [v6]:port */
    const char **models;
    size_t nmodels;
    uint32_t kv_blocks;
    uint32_t max_inflight;         /* effective: the registry default is already applied */
    uint32_t max_inflight_defined; /* as defined: 0 = the registry default (for the state file) */
    uint16_t port;
    bool no_cache_salt;
    const char *kv_events, *kv_events_replay; /* NULL: none */
    uint32_t kv_events_stale_ms;
    uint64_t map_id; /* kvg_worker_map_id */
} worker_spec;

/* Health packed in one word so an observation is a single CAS: the top bit is set while
 * down, the low bits count the current streak (failures while up, successes while down). */
#define HEALTH_DOWN_BIT 0x80000000u
#define HEALTH_STREAK_MASK 0x7fffffffu

/* What requests finished on a worker add up, as one thread adds it: a worker has one copy per
 * gateway event loop and one shared by every other thread (kvg_prom_stripe, common/prom.h),
 * summed when read (worker_stats_sum). */
typedef struct worker_stats {
    _Atomic uint64_t codes[WORKER_CODES];
    kvg_prom_hist duration; /* kvg_router_latency_buckets */
    kvg_prom_hist ttfb;
    /* Prefix predictions against the engine's usage reports (kvg_worker_record_usage). */
    _Atomic uint64_t usage_predicted; /* tokens the index predicted cached */
    _Atomic uint64_t usage_cached;    /* tokens the engine reported cached */
    _Atomic uint64_t usage_prompt;    /* prompt tokens the engine reported */
    _Atomic uint64_t usage_unreported;
    _Atomic uint64_t usage_outcomes[KVG_USAGE_OUTCOME_COUNT];
    /* What users feel (router/metrics.c, common/prom_llm.h's layouts). */
    kvg_prom_hist ttft;
    kvg_prom_hist itl;
    _Atomic uint64_t output_tokens; /* usage.completion_tokens */
    _Atomic uint64_t retries;
} worker_stats;
/* Stripes are this far apart, so that no two share a cache line. */
#define WORKER_STATS_STRIDE ((sizeof(worker_stats) + 63) / 64 * 64)

struct kvg_worker {
    /* What every routing decision reads of every worker, together at the start (the struct is
     * 64-byte aligned): with hundreds of workers a second cache line each would be most of
     * the decision. The identity fields come from the spec's name, which never changes. */
    uint64_t id;
    _Atomic uint32_t health;
    _Atomic uint32_t inflight;
    _Atomic uint32_t pending; /* blocks still to prefill (kvg_worker_pending_add) */
    _Atomic bool draining;
    bool serves_all_models; /* spec->nmodels == 0 */
    uint64_t name_hash;     /* XXH3-64 of the name: the rendezvous identity, same on replicas */
    uint64_t rendezvous_id; /* kvg_policy_rendezvous_id(name_hash) */
    _Atomic uint64_t eject_until_ns; /* outlier ejection: out of routing while later than now
                                        (kept after it passes: when the last one ended) */
    worker_spec *spec;
    _Atomic size_t refs;
    unsigned fall, rise;
    unsigned nthreads;
    _Atomic int source;
    _Atomic bool retired;
    /* Passive outlier detection (kvg_worker_outlier_observe): both streaks in one word, so a
     * result is one CAS; the multiplier and count are written by the ejecting thread only (the
     * one whose CAS on eject_until_ns won). */
    _Atomic uint32_t outlier_streaks;
    _Atomic uint32_t eject_multiplier;
    _Atomic uint64_t ejections;
    /* The engine's own load, scraped (engine_metrics.c): engine_load_ns 0 = never. */
    _Atomic uint32_t engine_waiting;
    _Atomic uint32_t engine_kv_usage; /* float bits */
    _Atomic uint64_t engine_load_ns;
    _Atomic uint64_t scrape_errors;
    unsigned nstripes; /* nthreads + 1 */
    char *stats;       /* nstripes worker_stats, WORKER_STATS_STRIDE apart, after the slots */

    void *slots[]; /* nthreads per-thread slots for the gateway */
};
_Static_assert(offsetof(struct kvg_worker, spec) + sizeof(void *) <= 64,
               "the fields a routing decision reads fit in the first cache line");

/* The calling thread's stripe of w's stats (stripe 0 for a thread without one of its own). */
static inline worker_stats *worker_stripe(kvg_worker *w)
{
    unsigned i = kvg_prom_stripe < w->nstripes ? kvg_prom_stripe : 0;
    return (worker_stats *)(void *)(w->stats + (size_t)i * WORKER_STATS_STRIDE);
}

/* Stripe i of w's stats, for readers (i < w->nstripes). */
static inline worker_stats *worker_stats_at(const kvg_worker *w, unsigned i)
{
    return (worker_stats *)(void *)(w->stats + (size_t)i * WORKER_STATS_STRIDE);
}

/* Requests that retried and are still in flight (the retry budget), and budget refusals. */
typedef struct registry_retry_stats {
    _Atomic uint64_t active;
    _Atomic uint64_t refused;
} registry_retry_stats;
/** The registry's retry counters (registry.c), for the metrics. */
registry_retry_stats *kvg_router_retry_stats(kvg_registry *reg);

struct kvg_worker_set {
    kvg_snapshot snap; /* first: kvg_worker_set_of casts; refcount and generation */
    size_t count;
    kvg_worker **workers; /* sorted by name; one reference each */
    const char **models;  /* distinct, sorted; point into the workers' specs */
    size_t nmodels;
};
_Static_assert(offsetof(struct kvg_worker_set, snap) == 0,
               "a worker set is its snapshot header (kvg_worker_set_of)");

/** Validate def and build its spec (the registry default applied to max_inflight).
 *  0, KVG_EPARSE / KVG_ELIMIT with msg, or -ENOMEM. */
int kvg_router_spec_new(const kvg_worker_def *def, uint32_t default_max_inflight, char *msg,
                        size_t msg_len, worker_spec **out);
worker_spec *kvg_router_spec_ref(worker_spec *spec);
void kvg_router_spec_unref(worker_spec *spec);
/** True when two specs describe the same worker (same name, URL, models, capacity, limit and
 *  cache_salt switch). */
bool kvg_router_spec_equal(const worker_spec *a, const worker_spec *b);

/** Create a worker with one reference; takes the caller's reference to spec (dropped on
 *  failure too). */
int kvg_router_worker_new(worker_spec *spec, kvg_worker_source source, unsigned nthreads,
                          unsigned fall, unsigned rise, kvg_worker **out);
void kvg_router_worker_set_retired(kvg_worker *w);

/** Create a snapshot over workers (sorted by name), taking the caller's reference to each,
 *  with one reference and no generation until the registry publishes it. On failure the caller
 *  keeps its references. */
int kvg_router_set_new(kvg_worker **workers, size_t n, kvg_worker_set **out);

#endif
