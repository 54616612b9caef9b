/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway's configuration: embedded defaults, the JSON config file, command-line flags. */
#ifndef KVG_GATEWAY_CONFIG_H
#define KVG_GATEWAY_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "model.h"
#include "router.h"

#define KVG_MAX_LISTENERS 16
#define KVG_MAX_ADMIN_TOKENS 16
#define KVG_CONFIG_MAX_WORKERS 4096

typedef struct kvg_listener_config {
    char address[280]; /* host:port as written */
    char host[256];
    uint16_t port;
    char *tls_cert; /* PEM paths; both or neither */
    char *tls_key;
    bool cleartext; /* accept cleartext h1/h2 as well as TLS (default true) */
} kvg_listener_config;

typedef struct kvg_front_limits {
    size_t header_bytes;        /* request line + headers; 431 past it */
    size_t body_bytes;          /* request body; 413 past it */
    uint32_t streams_per_conn;  /* HTTP/2 concurrent streams */
    uint32_t header_timeout_ms; /* complete a request head within this */
    uint32_t idle_timeout_ms;   /* keep-alive connection with nothing in flight */
    uint32_t read_timeout_ms;   /* gap between request body bytes */
    uint32_t body_min_rate;     /* bytes/s a body must average over each read_timeout_ms */
    uint32_t send_timeout_ms;   /* a response that moves no byte toward the client this long */
    uint32_t max_connections;   /* front connections at once, all threads; 0: from the fd limit */
    uint64_t body_budget_bytes; /* request bodies held at once, all requests together */
    uint32_t tenant_body_share; /* percent of body_budget_bytes one tenant may hold */
    uint64_t response_budget_bytes; /* response bytes queued toward clients, all together */
} kvg_front_limits;

/* upstream.outlier: passive outlier detection (router.h, kvg_outlier_config), as written. */
typedef struct kvg_outlier_settings {
    uint32_t consecutive_5xx;             /* 0 = off */
    uint32_t consecutive_gateway_failure; /* 0 = off */
    uint32_t base_ejection_ms;
    uint32_t max_ejection_ms;
    uint32_t max_ejection_percent;
} kvg_outlier_settings;

/* upstream.retry_on: what a retry on another worker may follow, as bits. KVG_RETRY_ON_SET
 * marks a list read from the file; without it the default list applies. */
#define KVG_RETRY_ON_CONNECT_FAILURE (1u << 0)
#define KVG_RETRY_ON_RESET (1u << 1)
#define KVG_RETRY_ON_502 (1u << 2)
#define KVG_RETRY_ON_503 (1u << 3)
#define KVG_RETRY_ON_504 (1u << 4)
#define KVG_RETRY_ON_SET (1u << 31)
#define KVG_RETRY_ON_DEFAULT                                                                       \
    (KVG_RETRY_ON_CONNECT_FAILURE | KVG_RETRY_ON_RESET | KVG_RETRY_ON_502 | KVG_RETRY_ON_503)

typedef struct kvg_upstream_config {
    uint32_t connect_timeout_ms;
    uint32_t response_timeout_ms; /* request sent -> first response byte: 504 past it */
    uint32_t read_timeout_ms;     /* gap between response bytes */
    uint32_t max_idle_per_worker; /* pooled keep-alive connections per worker per thread */
    uint32_t idle_timeout_ms;     /* pooled connection unused this long is closed */
    uint32_t retries;             /* further workers tried after a failure in retry_on */
    uint32_t max_inflight;        /* default per-worker limit of requests in flight */
    uint32_t retry_on;            /* KVG_RETRY_ON_* bits (kvg_config_retry_on) */
    /* The retry budget: retries of 5xx in flight per 100 requests in flight, and how many are
     * allowed whatever the share. */
    uint32_t retry_budget_percent;
    uint32_t retry_budget_min_concurrency;
    kvg_outlier_settings outlier;
} kvg_upstream_config;

/** The effective retry_on bits (the default list when the file set none). */
static inline uint32_t kvg_config_retry_on(const kvg_upstream_config *u)
{
    return (u->retry_on & KVG_RETRY_ON_SET) ? u->retry_on : KVG_RETRY_ON_DEFAULT;
}

/** The router's outlier settings from the configuration's. */
static inline kvg_outlier_config kvg_config_outlier(const kvg_upstream_config *u)
{
    return (kvg_outlier_config){
        .consecutive_5xx = u->outlier.consecutive_5xx,
        .consecutive_gateway_failure = u->outlier.consecutive_gateway_failure,
        .base_ejection_ns = (uint64_t)u->outlier.base_ejection_ms * 1000000u,
        .max_ejection_ns = (uint64_t)u->outlier.max_ejection_ms * 1000000u,
        .max_ejection_percent = u->outlier.max_ejection_percent,
    };
}

typedef struct kvg_health_config {
    uint32_t interval_ms;
    uint32_t timeout_ms;
    uint32_t fall;
    uint32_t rise;
    char path[128];
} kvg_health_config;

/* Scraping of the engines' own load (gateway/scrape.c). */
typedef struct kvg_scrape_config {
    uint32_t interval_ms; /* 0 = off (the default) */
    uint32_t timeout_ms;
    char path[128];
} kvg_scrape_config;

/* Redis, for replicated gateways (docs/redis.md). url NULL: the embedded index and the state
 * file, as a single gateway. Read at start; a reload does not change them. */
typedef struct kvg_redis_settings {
    char *url;                     /* redis://... or redis-sentinel://... (the --redis flag) */
    char *prefix;                  /* starts every key and channel */
    uint32_t lookup_timeout_ms;    /* a decision waits this long for Redis, then falls back */
    uint32_t connect_timeout_ms;   /* a connection, handshake included */
    uint32_t command_timeout_ms;   /* a connection whose oldest command waits this long goes */
    uint32_t max_inflight;         /* commands in flight per connection */
    uint32_t reconnect_max_ms;     /* reconnect backoff ceiling */
    uint32_t topology_interval_ms; /* the primary / slot map re-checked this often */
    uint32_t entry_ttl_s;          /* a worker's map entries outlive its last record this long */
    uint32_t startup_timeout_ms;   /* at start, wait this long for Redis, then refuse to start */
    uint32_t sync_interval_ms;     /* the shared state's version is checked this often */
} kvg_redis_settings;

/* Block-key hashing (gpu_hash/, docs/hashing.md): which backend, and the batcher's settings
 * when it is the GPU. Read at start; a reload does not change them. */
typedef enum kvg_hash_backend_choice {
    KVG_HASH_BACKEND_AUTO = 0, /* the GPU when one is usable, else the CPU (logged once) */
    KVG_HASH_BACKEND_CPU,
    KVG_HASH_BACKEND_CUDA,    /* the GPU, or refuse to start */
    KVG_HASH_BACKEND_STANDIN, /* the batcher with the CPU stand-in for the GPU (tests) */
    KVG_HASH_BACKEND_CHOICE_COUNT,
} kvg_hash_backend_choice;

typedef struct kvg_hash_settings {
    int backend;                /* kvg_hash_backend_choice (the --hash-backend flag) */
    uint32_t batch_deadline_us; /* a batch closes this long after its first job */
    uint32_t max_batch_jobs;    /* or at this many jobs */
    uint32_t batch_mib;         /* pinned input buffer per batch slot */
    uint32_t crossover_bytes;   /* jobs with less prompt data hash on the CPU; 0 = measured */
    uint32_t max_queued;        /* jobs queued for the GPU at most; past it, the CPU */
    uint32_t device;            /* CUDA device ordinal */
    /* Token-exact keys (models defined with a tokenizer) of bodies this large or larger are
     * made on the offload pool's exact_threads threads, not on the event loop; 0 = always. */
    uint32_t exact_offload_bytes;
    uint32_t exact_threads; /* 0 = half the gateway's threads, at least 1 */
} kvg_hash_settings;

/* TLS settings of every TLS listener, front and admin (docs/security.md). Checked by
 * kvg_tls_settings_check at start, by --check-config and at every reload. */
typedef enum kvg_tls_min_version {
    KVG_TLS_MIN_1_2 = 0,
    KVG_TLS_MIN_1_3,
    KVG_TLS_MIN_COUNT,
} kvg_tls_min_version;

typedef struct kvg_tls_settings {
    int min_version;    /* kvg_tls_min_version */
    char *ciphers;      /* TLS 1.2 cipher list (OpenSSL syntax) */
    char *ciphersuites; /* TLS 1.3 suites (OpenSSL syntax) */
} kvg_tls_settings;

/* Readiness and the optional probe paths on the front listeners (admin/probes.c). */
typedef struct kvg_probes_config {
    bool ready_requires_worker; /* /readyz is 503 while no worker is up (default true) */
    char *front_healthz;        /* path answering /healthz on the front listeners; NULL: off */
    char *front_readyz;         /* path answering /readyz on the front listeners; NULL: off */
} kvg_probes_config;

/* A worker of the config file or of --worker: the registry's definition (router.h), with its
 * strings in the config's arena. */
typedef kvg_worker_def kvg_config_worker;

/* Strings and lists of the config (file, flags) live in its arena, or in static storage for the
 * defaults: kvg_config_done frees them all at once. */
typedef struct kvg_config {
    kvg_arena arena;
    char *path;       /* the config file, or NULL when running on defaults */
    bool auth_open;   /* "auth": "open": no API keys (a single-tenant deployment) */
    char *secret;     /* server secret (or KVGATE_SECRET; else generated in the state dir) */
    char *state_file; /* NULL: <state_dir>/state.json */
    char *audit_log;  /* NULL: <state_dir>/audit.log; "off" for none */
    uint32_t tenant_metrics_max;     /* tenants with a metrics label of their own */
    uint32_t index_max_entries;      /* prefix index entries at most; 0 = the index default */
    uint32_t index_default_capacity; /* index blocks for a worker without kv_blocks; 0 = default */
    uint32_t
        index_speculative_ttl_ms; /* a decision's entries on an events-fed worker; 0 = default */
    kvg_listener_config listeners[KVG_MAX_LISTENERS];
    size_t nlisteners;
    kvg_listener_config admin_listeners[KVG_MAX_LISTENERS];
    size_t nadmin_listeners;
    char **admin_tokens; /* at most KVG_MAX_ADMIN_TOKENS */
    size_t nadmin_tokens;
    char **metrics_tokens; /* admin.metrics_tokens: GET /metrics only */
    size_t nmetrics_tokens;
    uint32_t admin_max_connections; /* admin connections at once (the oldest idle one makes room) */
    char *state_dir;
    unsigned threads; /* 0 = one per core */
    kvg_log_level log_level;
    char *access_log;   /* path, "-" for stdout, "off" */
    bool worker_header; /* x-kvgate-worker response header */
    uint32_t shutdown_timeout_ms;
    uint32_t shutdown_ready_delay_ms; /* SIGTERM: /readyz 503, still serving, for this long */
    kvg_tls_settings tls;
    kvg_probes_config probes;
    char *port_file; /* write bound ports here once listening (tests, supervisors) */
    kvg_front_limits limits;
    kvg_upstream_config upstream;
    kvg_health_config health;
    kvg_scrape_config scrape;
    kvg_redis_settings redis;
    kvg_hash_settings hash;
    kvg_config_worker *workers;
    size_t nworkers;
    /* "models": token-exact definitions (model.h), strings in the arena; at most
     * KVG_MODELS_MAX. Loaded at start (a file that does not load stops the start) and on
     * every reload (one that does not load keeps the running models). */
    kvg_model_def *models;
    size_t nmodels;
    char **passthrough_paths; /* more POST paths forwarded to a worker serving the body's model */
    size_t npassthrough_paths;
} kvg_config;

/* The config file's fields, section by section (top level, admin, limits, upstream, health,
 * scrape, listeners; workers through kvg_worker_fields), with their ranges and defaults:
 * kvg_config_init stores the defaults, the file and the flags decode through it.
 * docs/configuration.md has the table. */
extern const kvg_fields kvg_config_fields;

/** Fill cfg with the embedded defaults (the table's; free with _done). 0 or -ENOMEM. */
int kvg_config_init(kvg_config *cfg);
void kvg_config_done(kvg_config *cfg);
/** Merge a JSON config file over cfg. Unknown keys, wrong types and bad values fail with a
 *  message naming the key in err. Returns 0, KVG_ECONFIG or -errno (unreadable). */
int kvg_config_load_file(kvg_config *cfg, const char *path, char *err, size_t err_len);
/** Apply argv flags over cfg (flags win over the file). Sets *action to what main should do.
 *  Returns 0 or KVG_ECONFIG with err. */
typedef enum kvg_config_action {
    KVG_ACTION_RUN = 0,
    KVG_ACTION_HELP,
    KVG_ACTION_VERSION,
    KVG_ACTION_CHECK,
    KVG_ACTION_COUNT,
} kvg_config_action;
int kvg_config_parse_args(kvg_config *cfg, int argc, char **argv, kvg_config_action *action,
                          char *err, size_t err_len);
/** Check cross-field rules after everything is merged (TLS pairs, worker and model
 *  definitions; model files are not read here). */
int kvg_config_validate(const kvg_config *cfg, char *err, size_t err_len);
/** Worker definitions of cfg as registry input (pointers into cfg; caller frees the array). */
kvg_worker_def *kvg_config_worker_defs(const kvg_config *cfg);
void kvg_config_usage(FILE *out);

#endif
