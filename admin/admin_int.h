/* SPDX-License-Identifier: Apache-2.0 */
/* Private state of the admin API and the helpers its route files share. */
#ifndef KVG_ADMIN_INT_H
#define KVG_ADMIN_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "admin.h"

#define ADMIN_TOKENS_MAX 64
#define ADMIN_WRITERS_MAX 64
#define ADMIN_DIGEST_LEN 32 /* SHA-256 */

#define CT_JSON "application/json"
#define CT_METRICS "text/plain; version=0.0.4; charset=utf-8"

typedef struct admin_shared admin_shared;

typedef struct admin_writer {
    kvg_admin_metrics_fn fn;
    void *ud;
} admin_writer;

struct kvg_admin {
    kvg_registry *reg;
    kvg_model_registry *models; /* NULL: no model routes, no "models" state section */
    kvg_tenants *tenants;       /* NULL: no tenant routes */
    kvg_policy_state *policy;   /* NULL: no policy routes */
    char *state_path;           /* NULL: changes are not persisted */
    char *audit_path;           /* NULL: audit lines only in the error log */
    size_t tenant_label_cap;
    kvg_router *router; /* NULL: no route explain */
    kvg_redis *redis;   /* NULL: a gateway on its own */
    uint64_t engine_load_max_age_ns;
    uint8_t secret[64]; /* copy of the server secret, for explained scope salts */
    size_t secret_len;
    /* Serialises changes, from the change to its state-file write and audit line, so that a
     * slower change never writes an older state over a newer one. Taken before lock. */
    pthread_mutex_t change_lock;
    /* Guards everything below; held only for copies, never across callbacks. */
    pthread_mutex_t lock;
    unsigned char (*digests)[ADMIN_DIGEST_LEN];
    size_t ndigests;
    /* Tokens that grant GET /metrics and nothing else (kvg_admin_set_metrics_tokens). */
    unsigned char (*metrics_digests)[ADMIN_DIGEST_LEN];
    size_t nmetrics_digests;
    admin_writer writers[ADMIN_WRITERS_MAX];
    size_t nwriters;
    kvg_admin_ready_fn ready;
    void *ready_ud;
    bool ready_without_workers; /* set at creation */
    kvg_admin_live_fn live;
    void *live_ud;
    kvg_admin_worker_fn worker_extra; /* kvg_admin_set_worker_extra */
    void *worker_extra_ud;
    /* The state shared through Redis (shared.c), NULL without one or before
     * kvg_admin_share_state. What it holds of the state is guarded by change_lock. */
    admin_shared *shared;
    uint32_t redis_sync_interval_ms;
    uint32_t redis_timeout_ms;
};

#define ADMIN_DETAIL_MAX 256
#define ADMIN_TOKEN_ID_LEN 8 /* hex digits of a token's SHA-256 that name it in the audit log */
#define ADMIN_TARGET_MAX 160 /* the audit target as the path has it: room for any valid one */

/* What one request is about, for handlers and the audit log. */
typedef struct admin_ctx {
    kvg_admin *admin;
    const kvg_admin_request *req;
    kvg_admin_response *resp;
    const char *remote; /* sanitised, never NULL */
    /* For a change: the audit action ("tenant.put", ...), NULL for reads; its target (id,
     * name, "tenant/key id") and detail (what it did or why it failed). Never key material. */
    const char *action;
    char target[ADMIN_TARGET_MAX];
    char detail[ADMIN_DETAIL_MAX];
    /* The names in the path, validated: the worker's name or the tenant's id, the key id. */
    char name[KVG_MAX(KVG_WORKER_NAME_MAX, KVG_TENANT_ID_MAX) + 1];
    /* A model's name ({model}), percent-decoded: model names hold slashes ("Qwen/Qwen3-8B"). */
    char model[KVG_MODEL_DEF_NAME_MAX + 1];
    char key_id[KVG_KEY_ID_LEN + 1];
    /* The request's body as its route takes it (NULL for routes that ignore it), parsed into
     * arena, which lives as long as the request and which handlers may use for their own
     * work (bounded by ADMIN_BODY_ARENA_MAX). */
    const kvg_json *body;
    kvg_arena arena;
    /* Set by kvg_admin_commit when another replica changed the shared state first: the newer
     * state is in memory, and the change is to be made again on top of it. */
    bool again;
    /* Which admin token authenticated the request (kvg_admin_authorize): the first
     * ADMIN_TOKEN_ID_LEN hex digits of its SHA-256, never the token; "" before. */
    char token_id[ADMIN_TOKEN_ID_LEN + 1];
    /* For a change whose request passed its checks: the resource (the worker, the tenant with
     * its key ids, the policy) as its GET shows it, before and after the change ("null" when
     * it does not exist), for the audit line; empty when not taken. */
    kvg_buf before, after;
} admin_ctx;

/* A request body parsed into a tree (from the arena, which the caller frees). */
#define ADMIN_BODY_DEPTH_MAX 16
#define ADMIN_BODY_ARENA_MAX (16u * 1024 * 1024)

/** Fill resp with the OpenAI error shape {"error":{"message","type","code"}}; the type is
 *  derived from the status. */
void kvg_admin_error(kvg_admin_response *resp, int status, const char *fmt, ...) KVG_PRINTF(3, 4);
/** kvg_admin_error for a request: also keeps the message as the audit line's detail. */
void kvg_admin_fail(admin_ctx *c, int status, const char *fmt, ...) KVG_PRINTF(3, 4);
/** Set the audit line's detail of a successful change. */
void kvg_admin_detail(admin_ctx *c, const char *fmt, ...) KVG_PRINTF(2, 3);
/** Start a JSON response with the given status (body empty). */
void kvg_admin_json(kvg_admin_response *resp, int status);
/** Copy s into buf for a log line: at most len-1 bytes, anything but printable ASCII as '?'. */
const char *kvg_admin_log_safe(const char *s, char *buf, size_t len);

/** Digest every token into a new array; 0, -EINVAL (bad token or count) or -ENOMEM. */
int kvg_admin_digest_tokens(const char *const *tokens, size_t n,
                            unsigned char (**out)[ADMIN_DIGEST_LEN]);
/** Wipe and free a digest array from kvg_admin_digest_tokens; NULL is a no-op. */
void kvg_admin_free_digests(unsigned char (*digests)[ADMIN_DIGEST_LEN], size_t n);
/** Put the digests of tokens (none when ntokens is 0) in *slot and *nslot under admin->lock,
 *  freeing the ones they replace: the admin tokens and the metrics tokens are swapped alike.
 *  0, -EINVAL (a bad token) or -ENOMEM; on error nothing changes. */
int kvg_admin_replace_digests(kvg_admin *admin, unsigned char (**slot)[ADMIN_DIGEST_LEN],
                              size_t *nslot, const char *const *tokens, size_t ntokens);
/** Check the Authorization header; true when it carries an accepted token. Otherwise resp
 *  holds the 401 (or 500) to send. */
bool kvg_admin_authorize(admin_ctx *c);

/** Parse the request body as one JSON object (duplicate keys rejected, nesting bounded) into
 *  c->arena. An empty body is {} when empty_ok, an error otherwise. Returns the object, or NULL
 *  after answering 400 (413 past the arena's bound, 500 when out of memory) through
 *  kvg_admin_fail. */
const kvg_json *kvg_admin_parse_body(admin_ctx *c, bool empty_ok);
/** Decode c->body over target through a resource's field table (KVG_SET_ADMIN; strings
 *  borrowed from the tree, lists from c->arena). False after answering 400 with the walker's
 *  message (500 when out of memory). */
bool kvg_admin_decode(admin_ctx *c, const kvg_fields *table, void *target);
/** True when v is a JSON string without NUL characters; otherwise writes
 *  "<field>: must be a string" (or the NUL complaint) to msg. */
bool kvg_admin_c_string(const kvg_json *v, const char *field, char *msg, size_t msg_len);
/** True when key (of length len, from a parsed object) is exactly lit. */
bool kvg_admin_key_is(const char *key, size_t len, const char *lit);

/* The largest state document read: the state file, or the document from Redis. 100000 tenants
 * with 16 keys each stay well below this. */
#define ADMIN_STATE_MAX (1024u * 1024 * 1024)

/** Append the whole state (tenants, admin workers, policy) as the state file has it: the
 *  document the file and Redis hold. The caller holds change_lock. */
void kvg_admin_state_doc(kvg_admin *admin, kvg_buf *out);
/** Apply a document of kvg_admin_state_doc's format; the caller holds change_lock. replace
 *  false (the state file at start-up): the sections present are restored. replace true (a
 *  document from Redis): the state becomes exactly the document's (the policy starts from the
 *  defaults; an absent section is an empty one), keeping the runtime state of tenants and
 *  workers that stay; applying the same document twice changes nothing. Sections are checked
 *  and applied one at a time (policy, tenants, workers): on an error the ones before stay.
 *  0, KVG_EPARSE (msg names the section and the field), KVG_ELIMIT (also for a document
 *  longer than ADMIN_STATE_MAX, refused before it is parsed) or -ENOMEM. */
int kvg_admin_apply_doc(kvg_admin *admin, const char *text, size_t len, bool replace, char *msg,
                        size_t msg_len);
/** Write a document to the state file (atomically, fsync); 0 when there is no state file,
 *  otherwise 0 or a negative code with the reason in why. */
int kvg_admin_write_state_file(kvg_admin *admin, const char *doc, size_t len, char *why,
                               size_t why_len);
/** Write the whole state to the state file; the caller holds change_lock. 0 when there is no
 *  state file; otherwise 0 or a negative code, with the reason in why. */
int kvg_admin_save_state(kvg_admin *admin, char *why, size_t why_len);
/** Store the state after a change was applied in memory; the caller holds change_lock. With a
 *  shared state, kvg_admin_shared_commit; otherwise kvg_admin_save_state. 0; -EAGAIN (shared:
 *  another replica changed the state first, which is now in memory: make the change again);
 *  another negative code with why, *undone telling whether the change was taken back (shared:
 *  memory is the last state Redis had) or stays applied in memory (the state file). */
int kvg_admin_store(kvg_admin *admin, bool *undone, char *why, size_t why_len);
/** Store after a change that was applied (kvg_admin_store): -EAGAIN sets c->again; a change
 *  taken back answers 503 ("the change was not applied: ..."), one kept but not saved 500
 *  ("the change is applied but could not be saved: ..."), and logs an error. True when
 *  stored (or nothing to store). */
bool kvg_admin_commit(admin_ctx *c);

/* ---- the shared state in Redis (shared.c) ---- */

/* Attempts of one change against a shared state that other replicas keep changing. */
#define ADMIN_CHANGE_ATTEMPTS 16

/** Commit the state in memory to Redis: a compare-and-set against the version this replica
 *  last had (which also publishes the new version), then the state file as a local backup
 *  (its failure only logged). 0; -EAGAIN with the newer document applied (a conflict); another
 *  negative code with why and the change taken back (*undone true: memory is the last state
 *  Redis had). The caller holds change_lock. */
int kvg_admin_shared_commit(kvg_admin *admin, bool *undone, char *why, size_t why_len);
/** Before a change: bring the state up to the version Redis has (one round trip when it is
 *  current), so that a change sees what other replicas committed. 0, or a negative code with
 *  why. The caller holds change_lock. */
int kvg_admin_shared_refresh(kvg_admin *admin, char *why, size_t why_len);
/** Stop the sync thread and free the shared state; NULL is a no-op. */
void kvg_admin_shared_free(admin_shared *s);
/** Append the shared state's series (kvgate_state_*). */
void kvg_admin_shared_write_metrics(admin_shared *s, kvg_buf *out);
/** False when the shared state is degraded, with one line saying why. */
bool kvg_admin_shared_healthy(admin_shared *s, char *why, size_t len);
/** The verifier of a server secret: HMAC-SHA256(secret, "kvgate server secret verifier v1")
 *  in lowercase hex, into out (65 bytes). 0 or KVG_ETLS. */
int kvg_admin_secret_verifier(const uint8_t *secret, size_t len, char out[65]);
/** The tail of a put: rc and msg are the module's answer. A refusal answers 400 with msg (409
 *  for KVG_ELIMIT: a limit is full; 500 for -ENOMEM); success is saved (kvg_admin_commit). True
 *  when the caller is to set the audit detail and write the answer. */
bool kvg_admin_applied(admin_ctx *c, int rc, const char *msg);
/** The tail of a change to the object named in the path (c->name), kind "worker" or "tenant":
 *  rc is the module's answer. KVG_ENOTFOUND answers 404 ('worker "x" not found'), another error
 *  500 ("could not <verb> worker: ..."); success is saved (kvg_admin_commit) and gets detail as
 *  the audit line's. True when the caller is to write the answer. */
bool kvg_admin_changed(admin_ctx *c, int rc, const char *kind, const char *verb,
                       const char *detail);
/** Write the audit line of a change attempt from c (action, target, token id, detail, the
 *  resource before and after) and the response status: to the audit log when set, and at info
 *  level (there without before and after, which can be long). */
void kvg_admin_audit(admin_ctx *c);
/** Append to out the resource a change route acts on (c->action: worker.*, model.*, tenant.*,
 *  key.*, policy.*) as its GET answers it, or "null" when it does not exist. The caller holds
 *  change_lock. */
void kvg_admin_audit_resource(admin_ctx *c, kvg_buf *out);

/* Route handlers (admin.c's table has their paths and methods): the method, the names in
 * the path (c->name, c->key_id) and the body the route takes (c->body) are checked. */
void kvg_admin_healthz(admin_ctx *c);
void kvg_admin_readyz(admin_ctx *c);
void kvg_admin_metrics(admin_ctx *c);
void kvg_admin_workers_list(admin_ctx *c);
void kvg_admin_worker_get(admin_ctx *c);
void kvg_admin_worker_put(admin_ctx *c);
void kvg_admin_worker_delete(admin_ctx *c);
void kvg_admin_worker_drain(admin_ctx *c);
void kvg_admin_models_list(admin_ctx *c);
void kvg_admin_model_get(admin_ctx *c);
void kvg_admin_model_put(admin_ctx *c);
void kvg_admin_model_delete(admin_ctx *c);
void kvg_admin_tenants_list(admin_ctx *c);
void kvg_admin_tenant_get(admin_ctx *c);
void kvg_admin_tenant_put(admin_ctx *c);
void kvg_admin_tenant_delete(admin_ctx *c);
void kvg_admin_key_create(admin_ctx *c);
void kvg_admin_key_delete(admin_ctx *c);
void kvg_admin_policy_get(admin_ctx *c);
void kvg_admin_policy_put(admin_ctx *c);
void kvg_admin_route_explain(admin_ctx *c);

#endif
