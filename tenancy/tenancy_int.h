/* SPDX-License-Identifier: Apache-2.0 */
/* Private layout of the tenant store: definitions, runtime state, tenant objects, snapshots. */
#ifndef KVG_TENANCY_INT_H
#define KVG_TENANCY_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy.h"
#include "prom.h"
#include "tenancy.h"

/*
 * How the pieces fit (the worker registry's snapshot design, one level deeper):
 *
 *   kvg_tenants --slot--> kvg_tenant_set (immutable; sorted tenants + key digest index;
 *                                 |         published through common/snapshot.h)
 *                                 | one reference each
 *                                 v
 *                            kvg_tenant (immutable: spec + keys; refcounted)
 *                             |        \
 *                 tenant_spec (immutable  tenant_runtime (mutable, thread-safe: buckets,
 *                 definition, refcounted)  in-flight count, counters, ordinal; refcounted)
 *
 * Every change builds new kvg_tenant objects for the tenants it touches and a new snapshot.
 * A tenant object never changes after it is published, so readers need no locks for ids,
 * models, limits or keys. What must survive a change lives in tenant_runtime, which the new
 * tenant object shares with the one it replaces: kvg_tenants_put on an existing id makes a new
 * object {new spec, same runtime, same keys}; a key change makes {same spec, same runtime,
 * new keys}. A request that holds the old object admits and releases against the same runtime,
 * so in-flight counts stay exact across changes, with the limits of the definition it saw.
 * Removing a tenant drops it from the snapshot; a later put of the same id starts a new
 * runtime (fresh buckets and counters, a new ordinal).
 */

/* Longest model name a tenant may list (the router's KVG_MODEL_NAME_MAX). */
#define TENANT_MODEL_NAME_MAX KVG_TENANT_MODEL_NAME_MAX
/* Default burst of the prompt-bytes bucket when only a rate is set. */
#define TENANT_BYTES_BURST_MIN (1024.0 * 1024.0)
/* Retry-After is capped so that a client never waits longer than this for a retry. */
#define TENANT_RETRY_AFTER_MAX 3600u

/* Status codes with a series of their own; others are counted by class ("2xx") or, outside
 * 100..599, as "other". Compact on purpose: 100k tenants x 600 codes would be 480 MB. */
#define TENANT_TRACKED_CODES 14
#define TENANT_CODE_CLASSES 5 /* 1xx .. 5xx */
#define TENANT_CODE_SLOTS (TENANT_TRACKED_CODES + TENANT_CODE_CLASSES + 1)
extern const int kvg_tenancy_tracked_codes[TENANT_TRACKED_CODES];
/** Counter slot of an HTTP status. */
size_t kvg_tenancy_code_slot(int status);
/** Label value of a counter slot: "200", "4xx", "other". */
const char *kvg_tenancy_code_label(size_t slot);

/* Authentication failure reasons of kvg_tenants_record_auth_failure. */
typedef enum auth_reason {
    AUTH_MISSING = 0,
    AUTH_MALFORMED,
    AUTH_UNKNOWN,
    AUTH_REASON_COUNT,
} auth_reason;
extern const char *const kvg_tenancy_auth_reasons[AUTH_REASON_COUNT];

/* A validated copy of a kvg_tenant_def. One allocation: strings and the model array follow
 * the struct. */
typedef struct tenant_spec {
    _Atomic size_t refs;
    const char *id;
    kvg_sharing sharing;
    const char *group; /* NULL unless GROUP */
    const char *scope; /* "tenant:<id>", "group:<group>", "global" */
    const char **models;
    size_t nmodels;
    kvg_tenant_limits limits; /* as defined: what the admin API and the state file show */
    double burst;             /* effective request burst (the default applied) */
    double bytes_burst;       /* effective prompt-bytes burst */
} tenant_spec;

/* What a tenant accumulates while it serves; shared by every object of one tenant id. */
typedef struct tenant_runtime {
    _Atomic size_t refs;
    uint64_t ordinal;
    /* Guards the two buckets and makes check-and-take of the in-flight slot atomic with them.
     * Held for a few arithmetic operations, never across a call out of the module. */
    pthread_mutex_t lock;
    kvg_bucket requests;
    kvg_bucket bytes;
    _Atomic uint32_t
        inflight; /* incremented under lock (or by CAS without rates); released without it */
    _Atomic uint64_t buffered; /* request-body bytes the gateway holds for the tenant */
    _Atomic uint64_t codes[TENANT_CODE_SLOTS];
    _Atomic uint64_t refusals[KVG_ADMIT_RESULT_COUNT];
    _Atomic uint64_t prompt_bytes;
    /* The engines' usage reports for the tenant's answered requests. */
    _Atomic uint64_t usage_prompt;
    _Atomic uint64_t usage_cached;
    _Atomic uint64_t usage_predicted;
    /* What the tenant's users feel (tenancy/metrics.c, common/prom_llm.h's layouts). */
    kvg_prom_hist ttft;
    kvg_prom_hist itl;
    _Atomic uint64_t output_tokens; /* usage.completion_tokens */
} tenant_runtime;

struct kvg_tenant {
    _Atomic size_t refs;
    tenant_spec *spec;
    tenant_runtime *rt;
    size_t nkeys;
    kvg_key_info keys[]; /* in creation order */
};

/* One entry of a snapshot's key index (open addressing, linear probing): the key is
 * tenants[tenant - 1]->keys[key]; tenant 0 marks an empty slot. 8 bytes, so 100k tenants with
 * a few keys each stay within a few MB. */
typedef struct key_slot {
    uint32_t tenant;
    uint32_t key;
} key_slot;

struct kvg_tenant_set {
    kvg_snapshot snap; /* first: kvg_tenant_set_of casts; refcount and generation */
    size_t count;
    kvg_tenant **tenants; /* sorted by id; one reference each */
    key_slot *index;      /* index_mask + 1 slots, at most half full */
    size_t index_mask;
};
_Static_assert(offsetof(struct kvg_tenant_set, snap) == 0,
               "a tenant set is its snapshot header (kvg_tenant_set_of)");

struct kvg_tenants {
    /* Serialises changes (and so the publishes); held while a snapshot is built, never by
     * readers. */
    pthread_mutex_t write_lock;
    kvg_snapshot_slot snapshots; /* of kvg_tenant_set */
    uint64_t next_ordinal;       /* under write_lock */
    _Atomic uint64_t auth_failures[AUTH_REASON_COUNT];
};

/* ---- tenant.c -------------------------------------------------------------------------------- */

/** Validate def and build its spec. 0, KVG_EPARSE / KVG_ELIMIT with msg, or -ENOMEM. */
int kvg_tenancy_spec_new(const kvg_tenant_def *def, char *msg, size_t msg_len, tenant_spec **out);
tenant_spec *kvg_tenancy_spec_ref(tenant_spec *spec);
void kvg_tenancy_spec_unref(tenant_spec *spec);

int kvg_tenancy_runtime_new(uint64_t ordinal, tenant_runtime **out);
tenant_runtime *kvg_tenancy_runtime_ref(tenant_runtime *rt);
void kvg_tenancy_runtime_unref(tenant_runtime *rt);

/** A tenant object with one reference over spec and rt (taking the caller's reference to each,
 *  dropped on failure too; rt may be NULL for the caller to fill in before publishing) with a
 *  copy of keys[0..nkeys). 0 or -ENOMEM. */
int kvg_tenancy_tenant_new(tenant_spec *spec, tenant_runtime *rt, const kvg_key_info *keys,
                           size_t nkeys, kvg_tenant **out);

/* ---- tenants.c ------------------------------------------------------------------------------- */

/** A snapshot over tenants[0..n) (sorted by id, distinct), taking the caller's reference to
 *  each on success only; one reference, no generation until published. Builds the key index:
 *  -EEXIST when two keys share a digest (*dup, when not NULL, gets the position of a tenant
 *  holding it), -ENOMEM. */
int kvg_tenancy_set_new(kvg_tenant **tenants, size_t n, size_t *dup, kvg_tenant_set **out);
/** Position of id in the set, or its insertion point with *found false. */
size_t kvg_tenancy_set_search(const kvg_tenant_set *set, const char *id, bool *found);
/** The tenant holding a key with this digest, or NULL; *key gets its position. Compares the
 *  digests in constant time. */
kvg_tenant *kvg_tenancy_set_lookup(const kvg_tenant_set *set, const uint8_t *digest, size_t *key);

typedef enum commit_op {
    COMMIT_REPLACE = 0, /* tenants[at] becomes t */
    COMMIT_INSERT,      /* t goes in at position at */
    COMMIT_REMOVE,      /* tenants[at] leaves; t is NULL */
} commit_op;

/** With write_lock held: publish a copy of the current snapshot changed by op. Takes the
 *  caller's reference to t on success only. 0, -EEXIST (a key digest would appear twice),
 *  -ENOMEM. */
int kvg_tenancy_commit(kvg_tenants *ts, commit_op op, size_t at, kvg_tenant *t);
/** With write_lock held: swap next in (taking the caller's reference). */
void kvg_tenancy_publish(kvg_tenants *ts, kvg_tenant_set *next);
/** With write_lock held: the published snapshot, borrowed. */
static inline kvg_tenant_set *kvg_tenancy_current(const kvg_tenants *ts)
{
    return kvg_tenant_set_of(kvg_snapshot_slot_current(&ts->snapshots));
}

/* ---- keys.c ---------------------------------------------------------------------------------- */

/** SHA-256 of data. 0 or KVG_ETLS. */
int kvg_tenancy_sha256(const void *data, size_t len, uint8_t out[KVG_KEY_DIGEST_LEN]);
/** Check a key id: "k" + 15 characters of [a-z0-9]. */
bool kvg_tenancy_key_id_valid(const char *id);

#endif
