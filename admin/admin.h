/* SPDX-License-Identifier: Apache-2.0 */
/* The admin API as a request -> response function: authentication, routing of admin paths,
 * validation, JSON in and out, Prometheus text, the state file and the audit log. The gateway
 * owns the sockets. */
#ifndef KVG_ADMIN_H
#define KVG_ADMIN_H

#include <stdbool.h>
#include <stddef.h>

#include "common.h"
#include "model.h"
#include "policy.h"
#include "router.h"
#include "tenancy.h"

typedef struct kvg_admin kvg_admin;

/* Largest request body the admin API accepts (bytes); the gateway may stop reading there. */
#define KVG_ADMIN_BODY_MAX (1024 * 1024)

typedef struct kvg_admin_config {
    /* Accepted bearer tokens (borrowed only during kvg_admin_new, copied). At least one. */
    const char *const *tokens;
    size_t ntokens;
    /* Tenants and keys (borrowed; must outlive the admin). NULL: the tenant and key routes
     * answer 404 and the state file has no tenants. */
    kvg_tenants *tenants;
    /* The routing policy settings (borrowed; must outlive the admin). NULL: the policy routes
     * answer 404 and the state file has no policy. */
    kvg_policy_state *policy;
    /* The state file (copied): every change is written to it, atomically, before the answer.
     * NULL: changes are not persisted. */
    const char *state_path;
    /* The audit log (copied): one JSON line per change, appended. NULL: audit lines only in
     * the error log. */
    const char *audit_path;
    /* Tenants with a label of their own in /metrics; the rest count as "other". 0 = 100. */
    size_t tenant_label_cap;
    /* The router (borrowed; must outlive the admin): its index and decision series join
     * /metrics, and POST /admin/v1/route/explain asks it. NULL: explain answers 404. */
    kvg_router *router;
    /* How old the engines' scraped load may be for route explain to use it (the gateway's
     * 3 x scrape.interval_ms); 0 = scraping off: explain shows waiting 0. */
    uint64_t engine_load_max_age_ns;
    /* Redis (borrowed; must outlive the admin), when the gateway shares its state and prefix
     * map with other replicas: its series join /metrics, and /readyz names what is degraded
     * (a degraded Redis does not make the gateway unready: decisions fall back). Once
     * kvg_admin_share_state has run, tenants, key digests, admin workers and the policy live
     * in Redis (docs/redis.md#shared-state). NULL: none. */
    kvg_redis *redis;
    /* With redis: the shared state's version is checked this often besides pub/sub
     * (redis.sync_interval_ms); 0 = 1000. */
    uint32_t redis_sync_interval_ms;
    /* With redis: connect and command timeout of the shared state's blocking connections
     * (redis.command_timeout_ms); 0 = 1000. */
    uint32_t redis_timeout_ms;
    /* The server secret (borrowed), for the scope salt of an explained request. */
    const uint8_t *secret;
    size_t secret_len;
    /* /readyz answers 200 while no worker is up (probes.ready_requires_worker false) */
    bool ready_without_workers;
    /* Token-exact models (borrowed; must outlive the admin). NULL: no model routes, and no
     * "models" section in the state. */
    kvg_model_registry *models;
} kvg_admin_config;

typedef struct kvg_admin_request {
    const char *method;        /* "GET", "PUT", ... */
    const char *path;          /* path with optional query, e.g. "/admin/v1/workers" */
    const char *authorization; /* value of the Authorization header, or NULL */
    const char *body;          /* may be NULL when body_len is 0 */
    size_t body_len;
    const char *remote; /* peer address for the audit log, or NULL */
} kvg_admin_request;

typedef struct kvg_admin_response {
    int status;
    const char *content_type; /* static string, never NULL */
    kvg_buf body;             /* owned by the response; free with kvg_admin_response_done */
    /* Extra response headers to send when non-NULL (static strings): */
    const char *allow;            /* 405: value of the Allow header */
    const char *www_authenticate; /* 401: value of the WWW-Authenticate header */
    const char *cache_control;    /* value of the Cache-Control header ("no-store" for tenant
                                     and key responses: one of them carries a new API key) */
} kvg_admin_response;

/** Writes extra Prometheus series into out (for example the gateway's front counters). */
typedef void (*kvg_admin_metrics_fn)(kvg_buf *out, void *ud);
/** True when the gateway can take traffic (listeners open, not shutting down). */
typedef bool (*kvg_admin_ready_fn)(void *ud);
/** True when the gateway's event loops turn; false with why filled (for /healthz). */
typedef bool (*kvg_admin_live_fn)(void *ud, char *why, size_t why_len);
/** Append members (each starting with ',') to a worker's object in the workers API; called on
 *  admin threads, possibly several at once. */
typedef void (*kvg_admin_worker_fn)(kvg_buf *out, const kvg_worker *w, void *ud);

/** Create the admin handler over reg (borrowed; must outlive the admin). When audit_path is set
 *  the file is opened once here (created 0600 if missing) so that a bad path fails start-up.
 *  Returns 0, -EINVAL (no tokens), -ENOMEM or -errno (audit log not writable). */
int kvg_admin_new(const kvg_admin_config *cfg, kvg_registry *reg, kvg_admin **out);
void kvg_admin_free(kvg_admin *admin);
/** Restore tenants (with their key digests), admin-defined workers and the policy settings
 *  from the state file, for the gateway to call once at start-up before serving. A missing
 *  file (or no state_path) is a fresh start: returns 0 and changes nothing. Otherwise the file
 *  must be a JSON object {"version": 1, "tenants": [...], "workers": [...], "policy": {...}}
 *  (a section may be absent: nothing to restore there). Returns 0, KVG_EPARSE (msg names the
 *  section and the field), -ENOMEM, -EFBIG or -errno (msg says which file); on error what was
 *  restored before the bad section stays, and the gateway is expected to refuse to start. */
int kvg_admin_load_state(kvg_admin *admin, char *msg, size_t msg_len);
/** With a Redis (cfg.redis), share the state with the other replicas from now on; without
 *  one, returns 0 at once. For the gateway to call once at start-up, after
 *  kvg_admin_load_state and before serving: checks that this gateway's server secret is the
 *  one the replicas sharing the Redis use (a verifier, an HMAC of a fixed label, is kept
 *  there; set when absent), then replaces the state with the document Redis holds or, when
 *  it holds none (a fresh or wiped Redis), stores this gateway's state there (of several
 *  replicas starting at once exactly one does); then starts the sync thread that applies the
 *  other replicas' changes (stopped by kvg_admin_free). Blocks for a few round trips (each
 *  bounded by redis_timeout_ms). Returns 0; KVG_ECONFIG when the secret differs (msg says what
 *  to do; neither the secret nor the verifier is ever written anywhere); KVG_EPARSE when the
 *  document in Redis cannot be applied (msg names the section and the field); -ETIMEDOUT,
 *  -ECONNREFUSED, -ENOTCONN, KVG_EPROTO (Redis: msg says which); -ENOMEM or -errno. */
int kvg_admin_share_state(kvg_admin *admin, char *msg, size_t msg_len);
/** Replace the accepted tokens (config reload). 0, -EINVAL or -ENOMEM (old tokens kept).
 *  Tokens must be non-empty, without spaces or control characters; at most 64. Only their
 *  SHA-256 digests are kept. */
int kvg_admin_set_tokens(kvg_admin *admin, const char *const *tokens, size_t ntokens);
/** Replace the tokens that grant GET /metrics only (for a Prometheus that should not hold the
 *  admin token); admin tokens keep working for /metrics. ntokens 0 removes them. Elsewhere a
 *  metrics token gets 403. 0, -EINVAL or -ENOMEM (old tokens kept); the rules of
 *  kvg_admin_set_tokens. Only digests are kept. */
int kvg_admin_set_metrics_tokens(kvg_admin *admin, const char *const *tokens, size_t ntokens);
/** Register an extra metrics writer, called on every /metrics scrape in registration order
 *  (outside the admin's lock, possibly from several threads at once). 0, -EINVAL (fn NULL),
 *  KVG_ELIMIT (more than 64 writers) or -ENOMEM. */
int kvg_admin_add_metrics(kvg_admin *admin, kvg_admin_metrics_fn fn, void *ud);
/** Set the readiness probe used by /readyz (besides "at least one worker up"). */
void kvg_admin_set_ready(kvg_admin *admin, kvg_admin_ready_fn fn, void *ud);
/** Set the liveness probe used by /healthz (503 with its reason when it says false). */
void kvg_admin_set_live(kvg_admin *admin, kvg_admin_live_fn fn, void *ud);
/** Set what adds to each worker's object in the workers API (the KV-event consumer's state,
 *  which lives in gateway/); NULL fn: nothing. */
void kvg_admin_set_worker_extra(kvg_admin *admin, kvg_admin_worker_fn fn, void *ud);

/** Handle one admin request. Always fills resp (status, content type, body, extra headers);
 *  the caller sends it and then calls kvg_admin_response_done. Reads never block. A change
 *  (PUT, POST, DELETE) is serialised with every other change, and writes the state file (with
 *  fsync) and its audit line before it returns; with a shared state it first commits to Redis
 *  (a few round trips, each bounded by redis_timeout_ms; on a conflict with another replica
 *  the change is made again on top of the newer state): call it from a thread that may block
 *  for a few milliseconds, not from one serving traffic. Thread-safe: requests may be handled on
 * several threads at once, and concurrently with kvg_admin_set_tokens, kvg_admin_add_metrics and
 *  kvg_admin_set_ready. Request bodies over KVG_ADMIN_BODY_MAX get 413. */
void kvg_admin_handle(kvg_admin *admin, const kvg_admin_request *req, kvg_admin_response *resp);
/** Check req's credentials before its body is read: true when kvg_admin_handle would go past
 *  authentication (an accepted token, or /healthz and /readyz, which answer anyone); req's
 *  body is not looked at. false when it would answer 401 (403: a metrics token on another path;
 *  500: the digest failing): resp
 *  then holds that answer, to send and free with kvg_admin_response_done. Lets a front refuse
 *  a stranger's body unread instead of buffering up to KVG_ADMIN_BODY_MAX for it. */
bool kvg_admin_preauthorize(kvg_admin *admin, const kvg_admin_request *req,
                            kvg_admin_response *resp);
/** Free the response body (wiped first when it may hold a new API key). NULL is a no-op. */
void kvg_admin_response_done(kvg_admin_response *resp);

#endif
