/* SPDX-License-Identifier: Apache-2.0 */
/* Routing policies: pure functions that rank candidate workers from a snapshot of their
 * state. No I/O, no clocks, no globals: the caller passes everything in. */
#ifndef KVG_POLICY_H
#define KVG_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef enum kvg_policy_kind {
    KVG_POLICY_LEAST_LOADED = 0, /* fewest requests in flight, ties by round robin */
    KVG_POLICY_ROUND_ROBIN,
    KVG_POLICY_RANDOM, /* a permutation drawn from the rotation counter */
    KVG_POLICY_KIND_COUNT,
} kvg_policy_kind;

const char *kvg_policy_kind_str(kvg_policy_kind k);
/** Parse a policy name; 0 or KVG_EPARSE (-10000). */
int kvg_policy_kind_parse(const char *name, kvg_policy_kind *out);

/* One eligible worker as the policy sees it. */
typedef struct kvg_policy_candidate {
    uint32_t index;    /* caller's identifier, returned in the ranking */
    uint32_t inflight; /* requests in flight to it */
} kvg_policy_candidate;

/** Rank candidates best first, in place. rotation is a counter the caller advances once per
 *  decision (for example an atomic per-gateway counter): it rotates ties, and is the whole
 *  order for round robin. Deterministic: the same inputs give the same order. */
void kvg_policy_rank(kvg_policy_kind kind, kvg_policy_candidate *cands, size_t n,
                     uint64_t rotation);

/* ---- the operator's policy settings ---------------------------------------------------------- */

/* What PUT /admin/v1/policy sets. More fields (cost weights, block size, load bound) come with
 * prefix-aware routing; readers copy the whole struct. */
typedef struct kvg_policy_config {
    kvg_policy_kind kind;
} kvg_policy_config;

/** Defaults: least_loaded. */
void kvg_policy_config_init(kvg_policy_config *cfg);
/** Apply a JSON object over cfg: fields present replace, fields omitted keep their value;
 *  unknown fields, wrong types and bad values fail with a message naming the field and leave
 *  cfg unchanged. 0 or KVG_EPARSE. */
int kvg_policy_config_apply_json(kvg_policy_config *cfg, const kvg_json *obj, char *msg,
                                 size_t msg_len);
/** Serialise cfg as a JSON object (every field). */
void kvg_policy_config_to_json(const kvg_policy_config *cfg, kvg_buf *out);

/* The current settings, shared by the admin API (writer) and every gateway thread (readers). */
typedef struct kvg_policy_state kvg_policy_state;
int kvg_policy_state_new(kvg_policy_state **out);
void kvg_policy_state_free(kvg_policy_state *st);
/** Copy the current settings out. Thread-safe. */
void kvg_policy_state_get(kvg_policy_state *st, kvg_policy_config *out);
/** Replace the settings. Thread-safe. */
void kvg_policy_state_set(kvg_policy_state *st, const kvg_policy_config *cfg);
/** Incremented by every set: readers cache a copy and refresh when it moves. */
uint64_t kvg_policy_state_generation(const kvg_policy_state *st);

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

#endif
