/* SPDX-License-Identifier: Apache-2.0 */
/* The gateway's Redis: configuration, the blocking connections of the shared state, health
 * for /readyz and the metrics every client and the topology thread count into. */
#include "redis_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#define DEFAULT_CONNECT_TIMEOUT_MS 1000
#define DEFAULT_COMMAND_TIMEOUT_MS 1000
#define DEFAULT_MAX_INFLIGHT 1024
#define DEFAULT_RECONNECT_MAX_MS 2000
#define DEFAULT_TOPOLOGY_INTERVAL_MS 1000
#define DEFAULT_ENTRY_TTL_MS (24ull * 3600 * 1000)
#define PREFIX_MAX 64

static const uint64_t rtt_bounds_ns[] = {
    25000,   50000,   100000,   250000,   500000,    1000000,
    2500000, 5000000, 10000000, 25000000, 100000000, 1000000000,
};
const kvg_prom_buckets redis_rtt_buckets = {
    .bounds_ns = rtt_bounds_ns,
    .count = KVG_ARRAY_LEN(rtt_bounds_ns),
    .sum_unit_ns = 1000, /* the sum in microseconds */
};

static const char *const conn_state_names[REDIS_CONN_STATE_COUNT] = {
    [REDIS_CONN_CONNECTING] = "connecting",
    [REDIS_CONN_READY] = "ready",
    [REDIS_CONN_BACKOFF] = "backoff",
};

const char *redis_conn_state_str(redis_conn_state s)
{
    return (unsigned)s < REDIS_CONN_STATE_COUNT ? conn_state_names[s] : "?";
}

static const char *const outcome_names[REDIS_MAP_OUTCOME_COUNT] = {
    [REDIS_MAP_OK] = "ok",
    [REDIS_MAP_TIMEOUT] = "timeout",
    [REDIS_MAP_UNAVAILABLE] = "unavailable",
    [REDIS_MAP_BUSY] = "busy",
    [REDIS_MAP_LOST] = "lost",
    [REDIS_MAP_ERROR] = "error",
};

const char *redis_map_outcome_str(redis_map_outcome o)
{
    return (unsigned)o < REDIS_MAP_OUTCOME_COUNT ? outcome_names[o] : "?";
}

static const char *const drop_names[REDIS_DROP_REASON_COUNT] = {
    [REDIS_DROP_NOT_CONNECTED] = "not_connected",
    [REDIS_DROP_BUSY] = "busy",
    [REDIS_DROP_CONNECTION_LOST] = "connection_lost",
};

static bool prefix_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > PREFIX_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':'))
            return false;
    }
    return true;
}

int kvg_redis_new(const kvg_redis_config *cfg, kvg_redis **out, char *msg, size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (!cfg || !cfg->url || !out)
        return -EINVAL;
    const char *prefix = cfg->prefix ? cfg->prefix : "kvg";
    if (!prefix_ok(prefix)) {
        if (msg)
            snprintf(msg, msg_len, "redis prefix: must be 1..%d characters of [A-Za-z0-9._:-]",
                     PREFIX_MAX);
        return -EINVAL;
    }
    kvg_redis *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    int rc = kvg_redis_url_parse(cfg->url, &r->url, msg, msg_len);
    if (rc < 0)
        goto fail_r;
    rc = -ENOMEM;
    r->cfg = *cfg;
    r->url_copy = strdup(cfg->url);
    r->prefix = strdup(prefix);
    if (!r->url_copy || !r->prefix)
        goto fail_strings;
    r->cfg.url = r->url_copy;
    r->cfg.prefix = r->prefix;
#define DEFAULT(field, value)                                                                      \
    if (!r->cfg.field)                                                                             \
        r->cfg.field = value;
    DEFAULT(connect_timeout_ms, DEFAULT_CONNECT_TIMEOUT_MS)
    DEFAULT(command_timeout_ms, DEFAULT_COMMAND_TIMEOUT_MS)
    DEFAULT(max_inflight, DEFAULT_MAX_INFLIGHT)
    DEFAULT(reconnect_max_ms, DEFAULT_RECONNECT_MAX_MS)
    DEFAULT(topology_interval_ms, DEFAULT_TOPOLOGY_INTERVAL_MS)
    DEFAULT(entry_ttl_ms, DEFAULT_ENTRY_TTL_MS)
#undef DEFAULT
    kvg_redis_url_format(&r->url, true, r->url_redacted, sizeof(r->url_redacted));
    r->found_mode = r->url.mode;
    kvg_prom_hist_init(&r->lookup_rtt);
    kvg_prom_hist_init(&r->record_rtt);

    redis_topology *empty = calloc(1, sizeof(*empty));
    if (!empty)
        goto fail_strings;
    kvg_snapshot_init(&empty->snap, redis_topology_free);
    empty->mode = r->url.mode;
    snprintf(empty->error, sizeof(empty->error), "not checked yet");
    if ((rc = kvg_snapshot_slot_init(&r->topology, &empty->snap)) < 0) {
        free(empty);
        goto fail_strings;
    }
    if ((rc = -pthread_mutex_init(&r->lock, NULL)) < 0)
        goto fail_slot;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = -pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc < 0)
        goto fail_lock;
    if ((rc = redis_topology_start(r)) < 0)
        goto fail_cond;
    *out = r;
    return 0;
fail_cond:
    pthread_cond_destroy(&r->cond);
fail_lock:
    pthread_mutex_destroy(&r->lock);
fail_slot:
    kvg_snapshot_slot_done(&r->topology);
fail_strings:
    free(r->url_copy);
    free(r->prefix);
fail_r:
    free(r);
    return rc;
}

void kvg_redis_free(kvg_redis *r)
{
    if (!r)
        return;
    redis_topology_stop(r);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    kvg_snapshot_slot_done(&r->topology);
    explicit_bzero(&r->url, sizeof(r->url)); /* the password */
    explicit_bzero(r->url_copy, strlen(r->url_copy));
    free(r->url_copy);
    free(r->prefix);
    free(r);
}

/* An absolute CLOCK_MONOTONIC deadline ms from now, for pthread_cond_timedwait. */
static struct timespec deadline_in(uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

int kvg_redis_wait_topology(kvg_redis *r, uint32_t timeout_ms, char *msg, size_t msg_len)
{
    struct timespec until = deadline_in(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    while (!r->reached && !r->stop) {
        if (pthread_cond_timedwait(&r->cond, &r->lock, &until) == ETIMEDOUT)
            break;
    }
    if (!r->reached) {
        rc = -ETIMEDOUT;
        if (msg)
            snprintf(msg, msg_len, "%s: %s", r->url_redacted,
                     r->last_error[0] ? r->last_error : "no answer");
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

void kvg_redis_refresh_topology(kvg_redis *r)
{
    pthread_mutex_lock(&r->lock);
    r->refresh = true;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    redis_topology_wake(r);
}

kvg_redis_mode kvg_redis_mode_of(kvg_redis *r)
{
    pthread_mutex_lock(&r->lock);
    kvg_redis_mode m = r->found_mode;
    pthread_mutex_unlock(&r->lock);
    return m;
}

const char *kvg_redis_prefix(const kvg_redis *r)
{
    return r->prefix;
}

redis_topology *redis_topology_acquire(kvg_redis *r)
{
    return (redis_topology *)(void *)kvg_snapshot_slot_acquire(&r->topology);
}

bool kvg_redis_healthy(kvg_redis *r, char *why, size_t len)
{
    if (len)
        why[0] = '\0';
    redis_topology *t = redis_topology_acquire(r);
    bool ok = true;
    if (t->nnodes == 0) {
        ok = false;
        snprintf(why, len, "no primary known (%s)", t->error[0] ? t->error : "not checked yet");
    } else if (t->error[0]) {
        ok = false;
        snprintf(why, len, "%s", t->error);
    } else {
        int64_t connecting = atomic_load(&r->conns[REDIS_CONN_CONNECTING]);
        int64_t backoff = atomic_load(&r->conns[REDIS_CONN_BACKOFF]);
        if (connecting + backoff > 0) {
            ok = false;
            snprintf(why, len, "%lld of the gateway's connections are not ready",
                     (long long)(connecting + backoff));
        }
    }
    kvg_snapshot_unref(&t->snap);
    return ok;
}

int kvg_redis_connect_blocking(kvg_redis *r, const char *slot_key, size_t slot_key_len,
                               uint32_t timeout_ms, struct redisContext **out, char *msg,
                               size_t msg_len)
{
    int rc = kvg_redis_wait_topology(r, timeout_ms, msg, msg_len);
    if (rc < 0)
        return rc;
    redis_topology *t = redis_topology_acquire(r);
    size_t node = 0;
    if (t->mode == KVG_REDIS_CLUSTER && t->slots && slot_key) {
        uint16_t s = t->slots[redis_key_slot(slot_key, slot_key_len)];
        node = s == REDIS_NO_NODE ? t->nnodes : s;
    }
    if (node >= t->nnodes) {
        if (msg)
            snprintf(msg, msg_len, "%s: no primary owns the slot", r->url_redacted);
        kvg_snapshot_unref(&t->snap);
        kvg_redis_refresh_topology(r);
        return -ENOTCONN;
    }
    redis_node n = t->nodes[node];
    uint32_t db = t->mode == KVG_REDIS_CLUSTER ? 0 : r->url.db;
    kvg_snapshot_unref(&t->snap);
    return redis_connect_handshake(&r->url, n.host, n.port, db, timeout_ms, out, msg, msg_len);
}

void kvg_redis_write_metrics(kvg_redis *r, kvg_buf *out)
{
    kvg_prom_put_header(out, "kvgate_redis_connections", KVG_PROM_GAUGE,
                        "Connections of the gateway's event loops to Redis primaries, by state.");
    for (int s = 0; s < REDIS_CONN_STATE_COUNT; s++) {
        int64_t v = atomic_load_explicit(&r->conns[s], memory_order_relaxed);
        kvg_prom_put_u64(out, "kvgate_redis_connections",
                         KVG_PROM_LABELS({"state", conn_state_names[s]}), v > 0 ? (uint64_t)v : 0);
    }
    kvg_prom_put_scalar_u64(out, "kvgate_redis_reconnects_total", KVG_PROM_COUNTER,
                            "Connections to Redis made again after one failed or was dropped.",
                            atomic_load(&r->reconnects));
    static const char *const redirect_names[2] = {"moved", "ask"};
    kvg_prom_put_by_label(out, "kvgate_redis_redirects_total", KVG_PROM_COUNTER,
                          "Cluster redirections followed (moved: the slot has a new owner; ask: "
                          "it is being migrated).",
                          "kind", redirect_names, r->redirects, 2);
    kvg_prom_put_scalar_u64(out, "kvgate_redis_topology_changes_total", KVG_PROM_COUNTER,
                            "Changes of the primaries (a failover, a new slot map) the topology "
                            "thread found.",
                            atomic_load(&r->topology_changes));
    kvg_prom_put_by_label(out, "kvgate_redis_commands_dropped_total", KVG_PROM_COUNTER,
                          "Commands not sent (no ready connection, too many in flight) or not "
                          "answered (the connection went).",
                          "reason", drop_names, r->dropped, REDIS_DROP_REASON_COUNT);
    kvg_prom_put_by_label(out, "kvgate_redis_lookups_total", KVG_PROM_COUNTER,
                          "Prefix map lookups by outcome; all but ok fell back to the embedded "
                          "index.",
                          "outcome", outcome_names, r->lookups, REDIS_MAP_OUTCOME_COUNT);
    kvg_prom_put_by_label(out, "kvgate_redis_records_total", KVG_PROM_COUNTER,
                          "Prefix map records by outcome (the embedded index records every one "
                          "anyway; records are never waited for, so none times out).",
                          "outcome", outcome_names, r->records, REDIS_MAP_OUTCOME_COUNT);
    kvg_prom_put_header(out, "kvgate_redis_lookup_seconds", KVG_PROM_HISTOGRAM,
                        "Round trip of the prefix map lookups Redis answered.");
    kvg_prom_put_hist(out, "kvgate_redis_lookup_seconds", NULL, 0, &r->lookup_rtt,
                      &redis_rtt_buckets);
    kvg_prom_put_header(out, "kvgate_redis_record_seconds", KVG_PROM_HISTOGRAM,
                        "Round trip of the prefix map records Redis answered.");
    kvg_prom_put_hist(out, "kvgate_redis_record_seconds", NULL, 0, &r->record_rtt,
                      &redis_rtt_buckets);
}
