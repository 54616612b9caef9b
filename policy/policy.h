/* SPDX-License-Identifier: Apache-2.0 */
/* Routing policies: pure functions that rank candidate workers from a snapshot of their
 * state. No I/O, no clocks, no globals: the caller passes everything in. */
#ifndef KVG_POLICY_H
#define KVG_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "fields.h"
#include "snapshot.h"

typedef enum kvg_policy_kind {
    KVG_POLICY_LEAST_LOADED = 0, /* fewest requests in flight, ties by round robin */
    KVG_POLICY_ROUND_ROBIN,
    KVG_POLICY_RANDOM,      /* a permutation drawn from the rotation counter */
    KVG_POLICY_COST,        /* lowest predicted time to first token under the load bound */
    KVG_POLICY_PREFIX_ONLY, /* most matched blocks; cold prefixes by rendezvous; no load rule */
    KVG_POLICY_KIND_COUNT,
} kvg_policy_kind;

/* Every kind's name, by value: what kvg_policy_kind_str says and the settings' "policy" field
 * takes. */
extern const char *const kvg_policy_kind_names[KVG_POLICY_KIND_COUNT];
const char *kvg_policy_kind_str(kvg_policy_kind k);
/** Parse a policy name; 0 or KVG_EPARSE (-10000). */
int kvg_policy_kind_parse(const char *name, kvg_policy_kind *out);

/* One eligible worker as the policy sees it. Fields after inflight are 0 when unknown. */
typedef struct kvg_policy_candidate {
    uint32_t index;       /* caller's identifier, returned in the ranking */
    uint32_t inflight;    /* requests in flight to it (this gateway) */
    uint32_t matched;     /* leading blocks of the request it holds (prefix index) */
    uint32_t matched_cpu; /* of matched, blocks held only on a CPU (or other offloading) tier,
                             known from the engine's KV events; 0 = all on the GPU (or unknown).
                             Here, in what was padding: the struct stays 48 bytes (ranking 512
                             candidates moves them) */
    uint64_t id_hash;     /* stable hash of the worker's name: its rendezvous identity */
    uint64_t id_mix;      /* kvg_policy_rendezvous_id(id_hash) when the caller has it cached; 0 =
                             computed here (the same value either way) */
    uint32_t waiting;     /* the engine's vllm:num_requests_waiting, scraped; 0 = unknown */
    float kv_usage;   /* the engine's vllm:kv_cache_usage_perc in [0, 1], scraped; 0 = unknown */
    float turnover;   /* blocks newly cached on it lately over its capacity; 0 = unknown */
    uint32_t pending; /* blocks it has still to prefill for requests this gateway sent it */
} kvg_policy_candidate;

/** Rank candidates best first, in place, by load alone (least_loaded, round_robin, random; the
 *  prefix-aware kinds rank as least_loaded here). rotation is a counter the caller advances
 *  once per decision (for example an atomic per-gateway counter): it rotates ties, and is the
 *  whole order for round robin. Deterministic: the same inputs give the same order. */
void kvg_policy_rank(kvg_policy_kind kind, kvg_policy_candidate *cands, size_t n,
                     uint64_t rotation);

/* ---- the operator's policy settings ---------------------------------------------------------- */

/* What PUT /admin/v1/policy sets (docs/admin-api.md has the defaults and their reasons).
 * Readers copy the whole struct. */
typedef struct kvg_policy_config {
    kvg_policy_kind kind;
    uint32_t block_bytes;  /* canonical text bytes per block key (default 64, ~16 tokens) */
    uint32_t block_tokens; /* token ids per block key for token prompts (default 16) */
    uint32_t max_blocks;   /* block keys per request at most: the rest is not matched (4096) */
    uint32_t cold_blocks;  /* leading blocks whose key places a cold prefix (rendezvous; 4) */
    double load_factor;    /* bounded load: no worker above (1 + load_factor) x mean (2.0) */
    uint32_t load_slack;   /* ... unless within this many requests of the least loaded (4) */
    double prefill_cost_per_block;   /* predicted us to prefill one missing block (200) */
    double queue_cost_per_request;   /* predicted us each request in flight adds (1000) */
    double waiting_cost_per_request; /* us per request waiting in the engine, scraped (5000) */
    double kv_usage_cost;            /* us at a full engine KV cache, scraped (0: off) */
    double turnover_cost_per_block;  /* us per missing block at turnover 1 (50; 0: off) */
    double pending_cost_per_block;   /* us per block the worker has still to prefill for this
                                        gateway (200; 0: off) */
    double pending_hit_weight;       /* share of that term where candidates hold different
                                        amounts of the prefix (0..1; 0) */
    double cpu_block_weight;         /* what a block held only on a CPU tier is worth against
                                        one on the GPU (0..1; 0.8): it costs (1 - weight) x
                                        prefill_cost_per_block (cost policy) */
} kvg_policy_config;

/* The settings' fields, for the admin API, the state file and kvgate admin: policy (a kind's
 * name), the integer and number settings above with their ranges and defaults. */
extern const kvg_fields kvg_policy_fields;

/** Defaults: cost, with the values above (the table's defaults). */
void kvg_policy_config_init(kvg_policy_config *cfg);
/** Apply a JSON object over cfg: fields present replace, fields omitted keep their value;
 *  unknown fields, wrong types and bad values fail with a message naming the field and leave
 *  cfg unchanged. 0 or KVG_EPARSE. */
int kvg_policy_config_apply_json(kvg_policy_config *cfg, const kvg_json *obj, char *msg,
                                 size_t msg_len);
/** Serialise cfg as a JSON object (every field). */
void kvg_policy_config_to_json(const kvg_policy_config *cfg, kvg_buf *out);

/* The current settings, shared by the admin API (writer) and every gateway thread (readers):
 * each set publishes an immutable, refcounted kvg_policy_settings (common/snapshot.h). */
typedef struct kvg_policy_state kvg_policy_state;
/** The settings as published: never changed once published; freed with the last reference. */
typedef struct kvg_policy_settings {
    kvg_snapshot snap; /* refcount and generation */
    kvg_policy_config cfg;
} kvg_policy_settings;
_Static_assert(offsetof(kvg_policy_settings, snap) == 0,
               "settings are their snapshot header (kvg_policy_config_of)");

/** A state holding the defaults (kvg_policy_config_init) as generation 1. 0 or -ENOMEM. */
int kvg_policy_state_new(kvg_policy_state **out);
/** Free the state; settings objects threads still hold stay valid. NULL is a no-op. */
void kvg_policy_state_free(kvg_policy_state *st);
/** Copy the current settings out. Thread-safe; takes a mutex for a pointer load and a
 *  refcount increment, so hot paths read through a kvg_snapshot_cache instead. */
void kvg_policy_state_get(kvg_policy_state *st, kvg_policy_config *out);
/** Publish a copy of cfg as the settings, one generation up. Thread-safe (concurrent sets:
 *  the last one wins). 0, or -ENOMEM with the settings unchanged. */
int kvg_policy_state_set(kvg_policy_state *st, const kvg_policy_config *cfg);
/** Incremented by every set; a relaxed atomic load. A thread that reads it and then acquires
 *  (or gets) finds at least those settings. */
uint64_t kvg_policy_state_generation(const kvg_policy_state *st);
/** The slot the settings are published in, for a thread's kvg_snapshot_cache; its objects are
 *  kvg_policy_settings (kvg_policy_config_of). Lives as long as the state. */
kvg_snapshot_slot *kvg_policy_state_snapshots(kvg_policy_state *st);
/** The settings of a snapshot of kvg_policy_state_snapshots' slot, borrowed from it. */
static inline const kvg_policy_config *kvg_policy_config_of(const kvg_snapshot *snap)
{
    return &((const kvg_policy_settings *)(const void *)snap)->cfg;
}

/* ---- prefix-aware choice ------------------------------------------------------------------- */

/* The request as the choice sees it. */
typedef struct kvg_policy_request {
    uint32_t blocks;   /* full blocks (block keys) of the request, after max_blocks */
    uint64_t cold_key; /* key of block min(cold_blocks, blocks) - 1; unused when blocks is 0 */
    /* What one of its blocks weighs against the block the per-block prices are set for
     * (prefill_cost_per_block and turnover_cost_per_block price block_tokens tokens, or
     * block_bytes bytes taken as that many): the engine's block size over block_tokens for
     * token-exact keys (4 for an engine with 64-token blocks, 1/16 for one with 1-token pages),
     * 1 otherwise. 0, negative or NaN: 1. */
    double block_weight;
} kvg_policy_request;

/* Why the first candidate won. */
typedef enum kvg_policy_reason {
    KVG_POLICY_REASON_LOAD = 0, /* load-only policy, or a request without a full block */
    KVG_POLICY_REASON_HIT,      /* the first holds >= 1 block: lowest cost (cost) or most blocks */
    KVG_POLICY_REASON_COLD,     /* the first holds no block: it computes the whole prefix. Either
                                 * no worker holds any (rendezvous on cold_key) or, under cost, the
                                 * holders cost more (busy or over the bound) than a cold start */
    KVG_POLICY_REASON_COUNT,
} kvg_policy_reason;

const char *kvg_policy_reason_str(kvg_policy_reason r);

/* Every term of one candidate's score, for /admin/v1/route/explain. */
typedef struct kvg_policy_terms {
    uint32_t index;      /* the candidate's caller identifier */
    double prefill_cost; /* (prefill_cost_per_block + turnover terms) x block_weight x (blocks -
                            matched + (1 - cpu_block_weight) x matched_cpu) */
    double queue_cost;   /* queue_cost_per_request x inflight + waiting + kv_usage terms */
    double pending_cost; /* pending_cost_per_block x pending, times pending_hit_weight unless
                            every candidate holds the same number of blocks */
    double total;        /* prefill_cost + queue_cost + pending_cost */
    bool over_bound;     /* inflight + 1 > the bounded-load limit */
    uint64_t rendezvous; /* rendezvous score of (cold_key, id_hash) */
} kvg_policy_terms;

/** Rank candidates best first, in place, under cfg->kind (every kind, load-only ones included,
 *  which ignore req and rank as kvg_policy_rank does, reason LOAD). cost: candidates within the
 *  load bound first, by lowest total cost; when no candidate holds a block and neither turnover
 *  nor pending work is priced, by highest rendezvous score on req->cold_key; over-bound candidates
 * after, the same way. prefix_only: most matched first, cold by rendezvous, no bound. Ties break by
 * rendezvous score, so replicas agree; the prefix-aware order depends only on the set of
 * candidates, not on their order in the array, and rotation is unused. With req->blocks 0 the
 * prefix-aware kinds rank as least_loaded (reason LOAD). matched is counted up to req->blocks. The
 * bound is max(ceil((1 + load_factor) x (sum of inflight + 1) / n), least inflight + load_slack),
 *  load_factor at 1e-6 resolution; the least loaded candidate is always within it. terms, when not
 * NULL, receives n entries in the ranked order, computed for every kind (rendezvous 0 when
 * req->blocks is 0); *reason (may be NULL) says why the first one won. n 0 writes nothing. cfg
 * holds valid settings (what kvg_policy_config_apply_json accepts). Pure and deterministic; O(n log
 * n); the prefix-aware kinds allocate scratch above 64 candidates (and sort in place, slower,
 * without it). */
void kvg_policy_choose(const kvg_policy_config *cfg, const kvg_policy_request *req,
                       kvg_policy_candidate *cands, size_t n, uint64_t rotation,
                       kvg_policy_terms *terms, kvg_policy_reason *reason);
/** kvg_policy_choose when only the first `top` places are wanted (the gateway tries a few
 *  workers, never hundreds): those places are exactly kvg_policy_choose's, the candidates after
 *  them are in no particular order (load-only kinds and requests without a block still rank
 *  all), and terms receives the first min(top, n) places only. top 0 or above n ranks all. */
void kvg_policy_choose_top(const kvg_policy_config *cfg, const kvg_policy_request *req,
                           kvg_policy_candidate *cands, size_t n, size_t top, uint64_t rotation,
                           kvg_policy_terms *terms, kvg_policy_reason *reason);
/** The splitmix64 finaliser (Steele, Lea, Flood 2014; Stafford's "Mix13" constants): a
 *  bijection on 64-bit words in which every input bit flips every output bit with probability
 *  ~1/2. Rendezvous scores and the random policy's shuffle both use it. */
static inline uint64_t kvg_policy_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/** The rendezvous score of a key for a worker identity: mix(key ^ mix(id_hash +
 *  0x9e3779b97f4a7c15)) with mix the splitmix64 finaliser (cost.c). Replicas must agree on it. */
uint64_t kvg_policy_rendezvous(uint64_t key, uint64_t id_hash);
/** The identity half of the score, mix(id_hash + 0x9e3779b97f4a7c15): a worker's constant, which
 *  callers may cache in kvg_policy_candidate.id_mix. */
uint64_t kvg_policy_rendezvous_id(uint64_t id_hash);

/* ---- rate limits --------------------------------------------------------------------------- */

/* A token bucket. Zero-initialised means full at its first use. */
typedef struct kvg_bucket {
    double tokens;
    uint64_t last_ns;
    bool primed;
} kvg_bucket;

/** Refill b at rate tokens per second up to burst for the time since its last use (now_ns is a
 *  monotonic clock; time going backwards refills nothing), then take cost tokens when there are
 *  enough. Returns true when taken; otherwise b keeps its refill and *wait_s (may be NULL) gets
 *  the seconds until cost tokens will be there (infinity when cost > burst). Pure: the caller
 *  serialises access to b. rate, burst and cost are finite and >= 0. rate 0 refills nothing:
 *  the bucket is a one-off allowance of burst tokens (wait infinity once spent); callers for
 *  whom a rate of 0 means "unlimited" skip the bucket. Tokens above burst (a lowered burst)
 *  are cut to burst. */
bool kvg_policy_bucket_take(kvg_bucket *b, double rate, double burst, uint64_t now_ns, double cost,
                            double *wait_s);
/** Put back cost tokens taken by kvg_policy_bucket_take (capped at burst), for all-or-nothing
 *  admission over several buckets. */
void kvg_policy_bucket_give(kvg_bucket *b, double burst, double cost);

/* ---- sharing scopes ------------------------------------------------------------------------ */

#define KVG_SALT_LEN 43 /* base64url of 32 bytes, no padding */

/** The cache salt of a sharing scope: HMAC-SHA256(secret, scope), base64url without padding,
 *  NUL-terminated in out (KVG_SALT_LEN + 1 bytes). The same secret and scope give the same salt
 *  on every gateway replica; without the secret a salt reveals nothing about its scope.
 *  0, KVG_ETLS (OpenSSL failure) or -EINVAL (scope NULL, secret NULL with a length). */
int kvg_policy_scope_salt(const uint8_t *secret, size_t secret_len, const char *scope, char *out);

/* A memo of scope salts for one thread (the HMAC costs ~2 us a request; a gateway sees few
 * scopes): 64 direct-mapped entries keyed by the scope id. Not thread-safe. */
#define KVG_SALT_CACHE_SLOTS 64
typedef struct kvg_salt_cache_entry {
    char *scope; /* NULL: empty */
    char salt[KVG_SALT_LEN + 1];
} kvg_salt_cache_entry;

typedef struct kvg_salt_cache {
    const uint8_t *secret; /* borrowed: outlives the cache */
    size_t secret_len;
    kvg_salt_cache_entry e[KVG_SALT_CACHE_SLOTS];
} kvg_salt_cache;

/** An empty cache for salts under secret (kept by reference). */
void kvg_salt_cache_init(kvg_salt_cache *c, const uint8_t *secret, size_t secret_len);
/** Free the entries and wipe the salts. */
void kvg_salt_cache_done(kvg_salt_cache *c);
/** kvg_policy_scope_salt under the cache's secret, from the memo when the scope is there. Same
 *  results and errors; a scope that cannot be memoised (memory) is computed every time. */
int kvg_salt_cache_get(kvg_salt_cache *c, const char *scope, char *out);

#endif
