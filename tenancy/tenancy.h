/* SPDX-License-Identifier: Apache-2.0 */
/* Tenants and their API keys: who may call, which models, how fast, how much at once, and which
 * cache-sharing scope they belong to; immutable snapshots read lock-free by every gateway
 * thread; the state file that makes admin changes survive a restart. */
#ifndef KVG_TENANCY_H
#define KVG_TENANCY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "fields.h"
#include "snapshot.h"

typedef struct kvg_tenants kvg_tenants;       /* the store: current snapshot + changes */
typedef struct kvg_tenant_set kvg_tenant_set; /* one immutable snapshot */
typedef struct kvg_tenant kvg_tenant;         /* refcounted; definition + runtime state */

#define KVG_TENANT_ID_MAX 64
#define KVG_TENANT_GROUP_MAX 64
#define KVG_TENANT_MODELS_MAX 64
#define KVG_TENANT_KEYS_MAX 16
#define KVG_TENANTS_MAX 100000
/* Longest model name in a tenant's list (the router's KVG_MODEL_NAME_MAX); printable ASCII. */
#define KVG_TENANT_MODEL_NAME_MAX 256
/* Keys: "kvg-" + base64url(32 random bytes) = 47 characters. */
#define KVG_KEY_PREFIX "kvg-"
#define KVG_KEY_LEN 47
#define KVG_KEY_ID_LEN 16 /* "k" + 15 characters of [a-z0-9] */
#define KVG_KEY_DIGEST_LEN 32

typedef enum kvg_sharing {
    KVG_SHARING_ISOLATED = 0, /* the tenant alone */
    KVG_SHARING_GROUP,        /* tenants that agreed to share, by group name */
    KVG_SHARING_GLOBAL,       /* everyone with global sharing */
    KVG_SHARING_COUNT,
} kvg_sharing;

const char *kvg_sharing_str(kvg_sharing s);
/** Parse "isolated" | "group" | "global"; 0 or KVG_EPARSE. */
int kvg_sharing_parse(const char *s, kvg_sharing *out);

/* Limits; 0 means unlimited for each. */
typedef struct kvg_tenant_limits {
    double rps;                /* requests per second (token bucket refill) */
    double burst;              /* bucket size in requests; 0 with rps > 0 means max(1, rps) */
    double prompt_bytes_per_s; /* request body bytes per second */
    double prompt_bytes_burst; /* 0 with a rate means max(rate, 1 MiB) */
    uint32_t max_inflight;     /* requests in flight at once */
} kvg_tenant_limits;

/* A tenant as the operator defines it. Borrowed by the functions below, which copy it. */
typedef struct kvg_tenant_def {
    const char *id; /* [A-Za-z0-9._-], 1..KVG_TENANT_ID_MAX */
    kvg_sharing sharing;
    const char *group; /* required for KVG_SHARING_GROUP, NULL otherwise; same charset as ids */
    const char *const *models; /* allowed models; empty = all */
    size_t nmodels;
    kvg_tenant_limits limits;
} kvg_tenant_def;

/* A key as stored: never the key itself. */
typedef struct kvg_key_info {
    char id[KVG_KEY_ID_LEN + 1];
    uint8_t digest[KVG_KEY_DIGEST_LEN]; /* SHA-256 of the whole key string */
    uint64_t created_wall_ns;
} kvg_key_info;

/** An empty store. 0 or -ENOMEM. */
int kvg_tenants_new(kvg_tenants **out);
/** Free the store; snapshots acquired earlier stay valid until unreffed. NULL is a no-op. */
void kvg_tenants_free(kvg_tenants *ts);

/** Check an id (also used for group names): [A-Za-z0-9._-], 1..KVG_TENANT_ID_MAX characters,
 *  not "." or ".." (ids are admin URL path segments). 0, or KVG_EPARSE with "<what>: ..." in msg
 *  (msg may be NULL; what NULL means "id"). */
int kvg_tenant_id_validate(const char *id, const char *what, char *msg, size_t msg_len);
/** Check a definition; 0 or KVG_EPARSE/KVG_ELIMIT with a message naming the field ("id: ...",
 *  "group: ...", "models[2]: ...", "rate.rps: ..."). Limits must be finite and >= 0; a burst
 *  is 0 (the default) or at least 1; group is required with KVG_SHARING_GROUP and refused
 *  otherwise. */
int kvg_tenant_def_validate(const kvg_tenant_def *def, char *msg, size_t msg_len);

/* The fields of a tenant definition (kvg_tenant_def), for every entry point that defines one:
 * id, sharing (isolated by default), group, models (key=value item "model"), rate {rps, burst,
 * prompt_bytes_per_s, prompt_bytes_burst: numbers in 0..1e15; in key=value text by their own
 * names}, max_inflight. Types and ranges are checked by the walker (common/fields.h),
 * kvg_tenant_def_validate checks the values. docs/admin-api.md has the table. */
extern const kvg_fields kvg_tenant_fields;

/* Changes. Each publishes a new snapshot; all are thread-safe (serialised internally). */

/** Create or replace a tenant. Keys and runtime state (rate buckets, in-flight count, counters)
 *  are kept when the tenant exists. *created tells which (created may be NULL). 0, KVG_EPARSE,
 *  KVG_ELIMIT (a models list too long, or KVG_TENANTS_MAX tenants already), -ENOMEM. */
int kvg_tenants_put(kvg_tenants *ts, const kvg_tenant_def *def, bool *created, char *msg,
                    size_t msg_len);
/** Remove a tenant and its keys. 0 or KVG_ENOTFOUND. Requests in flight keep their tenant. */
int kvg_tenants_remove(kvg_tenants *ts, const char *id);
/** Generate a key for a tenant: 256 random bits, returned once in key (KVG_KEY_LEN + 1 bytes)
 *  with its id (KVG_KEY_ID_LEN + 1 bytes); only its SHA-256 digest is kept. 0, KVG_ENOTFOUND,
 *  KVG_ELIMIT (KVG_TENANT_KEYS_MAX keys already), -errno from the random source, -ENOMEM,
 *  KVG_ETLS (the digest failed). key and key_id are written on success only. */
int kvg_tenants_key_create(kvg_tenants *ts, const char *tenant_id, char *key, char *key_id);
/** Add a key by its digest (restoring the state file). 0, KVG_ENOTFOUND, KVG_EPARSE (bad id),
 *  KVG_ELIMIT, -EEXIST (the id or the digest is in use). */
int kvg_tenants_key_restore(kvg_tenants *ts, const char *tenant_id, const kvg_key_info *key);
/** Delete a key. 0 or KVG_ENOTFOUND (no such tenant or key). */
int kvg_tenants_key_delete(kvg_tenants *ts, const char *tenant_id, const char *key_id);

/* Snapshots (common/snapshot.h). */
/** Incremented by every published change; a relaxed atomic load. A thread that reads it and
 *  then acquires finds at least that snapshot. */
uint64_t kvg_tenants_generation(const kvg_tenants *ts);
/** The current snapshot, referenced; release with kvg_tenant_set_unref. Never NULL. Takes a
 *  mutex for a pointer load and an increment: hot paths use a kvg_snapshot_cache. */
kvg_tenant_set *kvg_tenants_acquire(kvg_tenants *ts);
/** The slot the snapshots are published in, for a thread's kvg_snapshot_cache; its objects are
 *  tenant sets (kvg_tenant_set_of). Lives as long as the store. */
kvg_snapshot_slot *kvg_tenants_snapshots(kvg_tenants *ts);
/** The tenant set a snapshot of kvg_tenants_snapshots' slot is (its header comes first). */
static inline kvg_tenant_set *kvg_tenant_set_of(kvg_snapshot *snap)
{
    return (kvg_tenant_set *)(void *)snap;
}
void kvg_tenant_set_unref(kvg_tenant_set *set);
uint64_t kvg_tenant_set_generation(const kvg_tenant_set *set);
size_t kvg_tenant_set_count(const kvg_tenant_set *set);
/** i-th tenant, sorted by id; borrowed. */
kvg_tenant *kvg_tenant_set_at(const kvg_tenant_set *set, size_t i);
kvg_tenant *kvg_tenant_set_find(const kvg_tenant_set *set, const char *id);
/** The tenant owning this key, or NULL. The key's SHA-256 is looked up in a hash index and the
 *  digests compared in constant time; nothing about the key is logged or kept. Borrowed. */
kvg_tenant *kvg_tenant_set_authenticate(const kvg_tenant_set *set, const char *key, size_t len);

/* Tenants. Thread-safe. */
kvg_tenant *kvg_tenant_ref(kvg_tenant *t);
void kvg_tenant_unref(kvg_tenant *t);
const char *kvg_tenant_id(const kvg_tenant *t);
kvg_sharing kvg_tenant_sharing(const kvg_tenant *t);
const char *kvg_tenant_group(const kvg_tenant *t); /* NULL unless GROUP */
size_t kvg_tenant_model_count(const kvg_tenant *t);
const char *kvg_tenant_model(const kvg_tenant *t, size_t i);
/** True when the tenant may use model (no list = all; model NULL = allowed). */
bool kvg_tenant_allows_model(const kvg_tenant *t, const char *model);
const kvg_tenant_limits *kvg_tenant_limits_of(const kvg_tenant *t);
size_t kvg_tenant_key_count(const kvg_tenant *t);
const kvg_key_info *kvg_tenant_key(const kvg_tenant *t, size_t i);
/** The cache-sharing scope id: "tenant:<id>", "group:<name>" or "global". Stable for as long as
 *  the definition's sharing and group stay the same. */
const char *kvg_tenant_scope(const kvg_tenant *t);
/** Position in creation order since the process started (0-based): the per-tenant metrics give
 *  the first N tenants a label of their own and count the rest as "other". Numbered per store
 *  (the gateway has one); replacing a tenant keeps its ordinal, removing and creating it again
 *  gives it a new one; kvg_tenants_from_json numbers the tenants it adds in id order. */
uint64_t kvg_tenant_ordinal(const kvg_tenant *t);

/* Admission. */
typedef enum kvg_admit_result {
    KVG_ADMIT_OK = 0,
    KVG_ADMIT_RATE,     /* requests per second exceeded */
    KVG_ADMIT_BYTES,    /* prompt bytes per second exceeded */
    KVG_ADMIT_INFLIGHT, /* max_inflight reached */
    KVG_ADMIT_BUFFER,   /* its share of the gateway's request-body budget is held already */
    KVG_ADMIT_RESULT_COUNT,
} kvg_admit_result;

const char *kvg_admit_result_str(kvg_admit_result r);

/** Try to admit one request of prompt_bytes at monotonic time now_ns: takes a token from each
 *  bucket and an in-flight slot, all or nothing. On refusal *retry_after_s is when a retry can
 *  succeed (at least 1 second, rounded up, at most 3600; for INFLIGHT, 1; may be NULL).
 *  Checked in the order in-flight, requests, prompt bytes under the tenant's lock, so the first
 *  limit that refuses is the result and a refusal takes nothing. A prompt larger than the bytes
 *  burst is charged the whole burst (admitted when the bucket is full) instead of never.
 *  Thread-safe. */
kvg_admit_result kvg_tenant_admit(kvg_tenant *t, uint64_t now_ns, uint64_t prompt_bytes,
                                  unsigned *retry_after_s);
/* The request-rate bucket, as OpenAI's x-ratelimit-*-requests headers describe it. */
typedef struct kvg_rate_state {
    double limit;     /* the bucket's size (burst), requests */
    double remaining; /* requests it holds now */
    double reset_s;   /* seconds until it is full again */
} kvg_rate_state;

/** The tenant's request-rate bucket at now_ns (refilled to then): false, out untouched, when
 *  the tenant has no requests-per-second limit. Thread-safe. */
bool kvg_tenant_rate_state(kvg_tenant *t, uint64_t now_ns, kvg_rate_state *out);
/** Give back the in-flight slot of an admitted request. */
void kvg_tenant_release(kvg_tenant *t);
uint32_t kvg_tenant_inflight(const kvg_tenant *t);
/** Count bytes of request body the gateway holds for the tenant, unless that would take its
 *  total past cap (0: no cap): one tenant may not hold the whole body budget. True when
 *  counted; a refusal counts nothing (the caller records it with KVG_ADMIT_BUFFER).
 *  Thread-safe, lock-free. */
bool kvg_tenant_buffer_charge(kvg_tenant *t, uint64_t bytes, uint64_t cap);
/** Give back bytes counted by kvg_tenant_buffer_charge. */
void kvg_tenant_buffer_release(kvg_tenant *t, uint64_t bytes);
/** Request-body bytes held for the tenant now. */
uint64_t kvg_tenant_buffered(const kvg_tenant *t);

/* Per-tenant counters (metrics). */
/** Count one finished request of the tenant with the status sent (499: the client left). */
void kvg_tenant_record(kvg_tenant *t, int status, uint64_t prompt_bytes);
/** Count the engine's usage report of one answered request of the tenant: prompt and cached
 *  tokens (-1 when not reported: nothing is counted) and the tokens the router predicted
 *  cached. */
void kvg_tenant_record_usage(kvg_tenant *t, uint64_t predicted_tokens, int64_t prompt_tokens,
                             int64_t cached_tokens);
/** Count one answer's time to first token (see kvg_worker_record_ttft). Thread-safe. */
void kvg_tenant_record_ttft(kvg_tenant *t, uint64_t ttft_ns);
/** Count n gaps of gap_ns between consecutive output events of a stream. Thread-safe. */
void kvg_tenant_record_itl(kvg_tenant *t, uint64_t gap_ns, uint64_t n);
/** Count the output tokens of one answer (usage.completion_tokens; negative: nothing). */
void kvg_tenant_record_output_tokens(kvg_tenant *t, int64_t tokens);
/** Count a refusal by the admission check. */
void kvg_tenant_record_refusal(kvg_tenant *t, kvg_admit_result why);
/** Count an authentication failure (no tenant is known): reason "missing", "malformed" or
 *  "unknown". Process-wide. */
void kvg_tenants_record_auth_failure(kvg_tenants *ts, const char *reason);
/** Prometheus series: kvgate_tenant_requests_total{tenant,code}, kvgate_tenant_rate_limited_total
 *  {tenant,reason}, kvgate_tenant_prompt_bytes_total{tenant}, kvgate_tenant_inflight{tenant},
 *  kvgate_tenant_buffered_bytes{tenant},
 *  kvgate_tenants (gauge), kvgate_auth_failures_total{reason}. Tenants past the first
 *  label_cap (by ordinal) are summed under tenant="other". */
void kvg_tenants_write_metrics(kvg_tenants *ts, size_t label_cap, kvg_buf *out);

/* Persistence. */
/** Serialise every tenant with its key digests (hex) as a JSON array into out (appended), one
 *  tenant per line, sorted by id. The format is described in docs/state.md. */
void kvg_tenants_to_json(kvg_tenants *ts, kvg_buf *out);
/** Replace the store's content by a JSON array written by kvg_tenants_to_json (all or nothing):
 *  every tenant is validated (unknown or repeated fields, duplicate ids or key digests are
 *  errors; msg names the tenant and the field) and the result is published as one snapshot.
 *  Tenants already in the store keep their runtime state, as with kvg_tenants_put; tenants
 *  absent from arr are removed. 0, KVG_EPARSE with msg, -ENOMEM. */
int kvg_tenants_from_json(kvg_tenants *ts, const kvg_json *arr, char *msg, size_t msg_len);

/** Write data to path atomically: a temporary file in the same folder
 *  ("<path>.tmp.<pid>.<n>", so concurrent writers never share one), fsync, rename, fsync of
 *  the folder; mode applies to the new file exactly (the umask does not narrow it). 0 or
 *  -errno (-ENOENT: the folder does not exist); on failure before the rename path is
 *  untouched and the temporary file removed. */
int kvg_state_write_file(const char *path, const void *data, size_t len, unsigned mode);
/** Read a whole file (at most max bytes), appending it to out. 0, -ENOENT, -EFBIG, -ENOMEM,
 *  -errno; on failure out is as it was. */
int kvg_state_read_file(const char *path, size_t max, kvg_buf *out);

#endif
