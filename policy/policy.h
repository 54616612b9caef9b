/* SPDX-License-Identifier: Apache-2.0 */
/* Routing policies: pure functions that rank candidate workers from a snapshot of their
 * state. No I/O, no clocks, no globals: the caller passes everything in. */
#ifndef KVG_POLICY_H
#define KVG_POLICY_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvg_policy_kind {
    KVG_POLICY_LEAST_LOADED = 0, /* fewest requests in flight, ties by round robin */
    KVG_POLICY_ROUND_ROBIN,
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

#endif
