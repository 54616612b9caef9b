/* SPDX-License-Identifier: Apache-2.0 */
/* Configuration: embedded defaults, a strict JSON config file (unknown keys are errors), and
 * command-line flags that override both, all through one field table per section. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvg_config.h"

#define CONFIG_MAX_BYTES (16u << 20)

static int set_str(kvg_config *cfg, char **dst, const char *s)
{
    char *c = s ? kvg_arena_strdup(&cfg->arena, s) : NULL;
    if (s && !c)
        return -ENOMEM;
    *dst = c;
    return 0;
}

/* The context of a decode into cfg, from the file or from a flag: strings are copied into the
 * config's arena, as the file's JSON tree goes once it is read and argv is not the config's. */
static kvg_fields_ctx config_ctx(kvg_config *cfg, unsigned from, char *msg, size_t msg_len)
{
    return (kvg_fields_ctx){
        .from = from, .arena = &cfg->arena, .copy_strings = true, .msg = msg, .msg_len = msg_len};
}

/* Host and port of a listener's address (already copied into l->address). */
static int listen_address(kvg_listener_config *l, const char *path, kvg_fields_ctx *c)
{
    if (kvg_parse_hostport(l->address, l->host, sizeof(l->host), &l->port) < 0)
        return kvg_fields_fail(c, KVG_FIELD_INVALID, path,
                               "invalid listen address '%s' (want HOST:PORT)", l->address);
    return 0;
}

static int parse_listen(kvg_listener_config *l, const char *addr, char *err, size_t err_len)
{
    kvg_fields_ctx c = {.msg = err, .msg_len = err_len};
    memset(l, 0, sizeof(*l));
    l->cleartext = true;
    if (strlen(addr) >= sizeof(l->address))
        return kvg_fields_fail(&c, KVG_FIELD_RANGE, NULL,
                               "invalid listen address '%.64s...' (want HOST:PORT)", addr);
    snprintf(l->address, sizeof(l->address), "%s", addr);
    return listen_address(l, NULL, &c) < 0 ? KVG_ECONFIG : 0;
}

/* ---- the file's sections ------------------------------------------------------------------ */

static const kvg_field listener_fields[] = {
    {.name = "address",
     .type = KVG_FIELD_CHARS,
     .set_in = KVG_SET_CONFIG,
     .required_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_listener_config, address),
     .max = sizeof(((kvg_listener_config *)0)->address) - 1},
    {.name = "tls_cert",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_listener_config, tls_cert)},
    {.name = "tls_key",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_listener_config, tls_key)},
    {.name = "cleartext",
     .type = KVG_FIELD_BOOL,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_listener_config, cleartext),
     .def.b = true},
};

static const kvg_fields listener_table = {"listener", listener_fields,
                                          KVG_ARRAY_LEN(listener_fields), NULL};

/* One listener: "HOST:PORT" or {"address": "HOST:PORT", "tls_cert", "tls_key", "cleartext"}. */
static int decode_listener(kvg_listener_config *l, const kvg_json *v, const char *path,
                           kvg_fields_ctx *c)
{
    memset(l, 0, sizeof(*l));
    kvg_fields_defaults(&listener_table, l);
    if (v->type == KVG_JSON_STRING) {
        const char *s;
        int rc = kvg_fields_get_string(c, v, path, &s);
        if (rc < 0)
            return rc;
        if (v->u.str.len >= sizeof(l->address))
            return kvg_fields_fail(c, KVG_FIELD_RANGE, path, "longer than %zu bytes",
                                   sizeof(l->address) - 1);
        memcpy(l->address, s, v->u.str.len + 1);
    } else if (v->type != KVG_JSON_OBJECT) {
        return kvg_fields_fail(c, KVG_FIELD_MISTYPED, path,
                               "must be \"HOST:PORT\" or an object, not %s",
                               kvg_json_type_str(v->type));
    } else {
        int rc = kvg_fields_decode(&listener_table, l, v, path, c);
        if (rc < 0)
            return rc;
    }
    return listen_address(l, path, c);
}

/* "listen": one listener or an array of 1..16; replaces the listeners before it. */
static int decode_listeners(kvg_listener_config *ls, size_t *n, const kvg_json *v, const char *path,
                            kvg_fields_ctx *c)
{
    char ipath[64];
    const kvg_json *const *items = (const kvg_json *const *)&v;
    size_t count = 1;
    if (v->type == KVG_JSON_ARRAY) {
        items = (const kvg_json *const *)v->u.arr.items;
        count = v->u.arr.count;
    }
    if (count == 0 || count > KVG_MAX_LISTENERS)
        return kvg_fields_fail(c, KVG_FIELD_RANGE, path, "needs 1 to %d listeners",
                               KVG_MAX_LISTENERS);
    for (size_t i = 0; i < count; i++) {
        if (v->type == KVG_JSON_ARRAY)
            snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
        else
            snprintf(ipath, sizeof(ipath), "%s", path);
        int rc = decode_listener(&ls[i], items[i], ipath, c);
        if (rc < 0)
            return rc;
    }
    *n = count;
    return 0;
}

static int decode_front_listeners(void *target, const kvg_json *v, const char *path,
                                  kvg_fields_ctx *c)
{
    kvg_config *cfg = target;
    return decode_listeners(cfg->listeners, &cfg->nlisteners, v, path, c);
}

static int decode_admin_listeners(void *target, const kvg_json *v, const char *path,
                                  kvg_fields_ctx *c)
{
    kvg_config *cfg = target;
    return decode_listeners(cfg->admin_listeners, &cfg->nadmin_listeners, v, path, c);
}

/* "listen" of the top level and of "admin": listeners decoded by hand (a string or objects). */
#define LISTEN_FIELD(decoder)                                                                      \
    {                                                                                              \
        .name = "listen", .type = KVG_FIELD_CUSTOM, .set_in = KVG_SET_CONFIG, .decode = (decoder)  \
    }

static int check_token(const void *value, char *why, size_t len)
{
    if (strlen(value) >= 16)
        return 0;
    snprintf(why, len, "tokens must be at least 16 characters");
    return KVG_EPARSE;
}

/* The admin section's members live in kvg_config itself (the object is at offset 0). */
static const kvg_field admin_fields[] = {
    LISTEN_FIELD(decode_admin_listeners),
    {.name = "tokens",
     .type = KVG_FIELD_STRINGS,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_config, admin_tokens),
     .count_offset = offsetof(kvg_config, nadmin_tokens),
     .max = KVG_MAX_ADMIN_TOKENS,
     .check = check_token},
    {.name = "metrics_tokens",
     .type = KVG_FIELD_STRINGS,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_config, metrics_tokens),
     .count_offset = offsetof(kvg_config, nmetrics_tokens),
     .max = KVG_MAX_ADMIN_TOKENS,
     .check = check_token},
    {.name = "max_connections",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_config, admin_max_connections),
     .min = 1,
     .max = 100000,
     .def.u = 64},
};

static const kvg_fields admin_table = {"admin", admin_fields, KVG_ARRAY_LEN(admin_fields), NULL};

#define U32_FIELD(st, field, lo, hi, dflt)                                                         \
    {                                                                                              \
        .name = #field, .type = KVG_FIELD_U32, .set_in = KVG_SET_CONFIG,                           \
        .offset = offsetof(st, field), .min = (lo), .max = (hi), .def.u = (dflt)                   \
    }

/* The budgets are byte counts past 4 GiB on a large machine: MiB in the file (1 to 1048576, 1024
 * by default), bytes inside. */
#define BUDGET_FIELD(budget)                                                                       \
    {                                                                                              \
        .name = #budget "_mib", .type = KVG_FIELD_U64, .set_in = KVG_SET_CONFIG,                   \
        .offset = offsetof(kvg_front_limits, budget##_bytes), .min = 1, .max = 1u << 20,           \
        .shift = 20, .def.u = 1024                                                                 \
    }

static const kvg_field limits_fields[] = {
    {.name = "header_bytes",
     .type = KVG_FIELD_SIZE,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_front_limits, header_bytes),
     .min = 1024,
     .max = 1u << 20,
     .def.u = 64 * 1024},
    {.name = "body_bytes",
     .type = KVG_FIELD_SIZE,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_front_limits, body_bytes),
     .min = 1024,
     .max = 1u << 30,
     .def.u = 32u << 20},
    U32_FIELD(kvg_front_limits, streams_per_conn, 1, 10000, 256),
    U32_FIELD(kvg_front_limits, header_timeout_ms, 100, 3600000, 10000),
    U32_FIELD(kvg_front_limits, idle_timeout_ms, 100, 86400000, 75000),
    U32_FIELD(kvg_front_limits, read_timeout_ms, 100, 3600000, 30000),
    U32_FIELD(kvg_front_limits, body_min_rate, 0, 1u << 30, 1024),
    U32_FIELD(kvg_front_limits, send_timeout_ms, 100, 86400000, 60000),
    U32_FIELD(kvg_front_limits, max_connections, 0, 10000000, 0),
    BUDGET_FIELD(body_budget),
    U32_FIELD(kvg_front_limits, tenant_body_share, 1, 100, 25),
    BUDGET_FIELD(response_budget),
};

static const kvg_fields limits_table = {"limits", limits_fields, KVG_ARRAY_LEN(limits_fields),
                                        NULL};

/* upstream.retry_on: names of what a retry may follow, as in docs/configuration.md. */
static const struct {
    const char *name;
    uint32_t bit;
} retry_on_names[] = {
    {"connect-failure", KVG_RETRY_ON_CONNECT_FAILURE},
    {"reset", KVG_RETRY_ON_RESET},
    {"502", KVG_RETRY_ON_502},
    {"503", KVG_RETRY_ON_503},
    {"504", KVG_RETRY_ON_504},
};

static int decode_retry_on(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    kvg_upstream_config *u = target;
    if (v->type != KVG_JSON_ARRAY)
        return kvg_fields_fail(c, KVG_FIELD_MISTYPED, path, "must be an array of strings, not %s",
                               kvg_json_type_str(v->type));
    uint32_t mask = KVG_RETRY_ON_SET;
    for (size_t i = 0; i < v->u.arr.count; i++) {
        const kvg_json *item = v->u.arr.items[i];
        size_t k = KVG_ARRAY_LEN(retry_on_names);
        if (item->type == KVG_JSON_STRING)
            for (k = 0; k < KVG_ARRAY_LEN(retry_on_names); k++)
                if (strcmp(item->u.str.ptr, retry_on_names[k].name) == 0)
                    break;
        if (k == KVG_ARRAY_LEN(retry_on_names)) {
            char ipath[64];
            snprintf(ipath, sizeof(ipath), "%s[%zu]", path ? path : "retry_on", i);
            return kvg_fields_fail(c, KVG_FIELD_INVALID, ipath,
                                   "must be one of \"connect-failure\", \"reset\", \"502\", "
                                   "\"503\", \"504\"");
        }
        mask |= retry_on_names[k].bit;
    }
    u->retry_on = mask;
    return 0;
}

static int check_outlier(const void *target, char *why, size_t len)
{
    const kvg_outlier_settings *o = target;
    if (o->max_ejection_ms >= o->base_ejection_ms)
        return 0;
    snprintf(why, len, "max_ejection_ms: must be at least base_ejection_ms");
    return KVG_EPARSE;
}

/* Envoy's names and defaults (consecutive_5xx, consecutive_gateway_failure, base and max
 * ejection time), but max_ejection_percent 50 rather than 10: a model served by a handful of
 * workers is the common fleet, and 10% of four workers would eject only the first. */
static const kvg_field outlier_fields[] = {
    U32_FIELD(kvg_outlier_settings, consecutive_5xx, 0, 1000, 5),
    U32_FIELD(kvg_outlier_settings, consecutive_gateway_failure, 0, 1000, 5),
    U32_FIELD(kvg_outlier_settings, base_ejection_ms, 1, 86400000, 30000),
    U32_FIELD(kvg_outlier_settings, max_ejection_ms, 1, 86400000, 300000),
    U32_FIELD(kvg_outlier_settings, max_ejection_percent, 0, 100, 50),
};

static const kvg_fields outlier_table = {"outlier", outlier_fields, KVG_ARRAY_LEN(outlier_fields),
                                         check_outlier};

static const kvg_field upstream_fields[] = {
    U32_FIELD(kvg_upstream_config, connect_timeout_ms, 10, 600000, 3000),
    U32_FIELD(kvg_upstream_config, response_timeout_ms, 10, 86400000, 300000),
    U32_FIELD(kvg_upstream_config, read_timeout_ms, 10, 86400000, 300000),
    U32_FIELD(kvg_upstream_config, max_idle_per_worker, 0, 100000, 256),
    U32_FIELD(kvg_upstream_config, idle_timeout_ms, 100, 86400000, 60000),
    U32_FIELD(kvg_upstream_config, retries, 0, 16, 2),
    U32_FIELD(kvg_upstream_config, max_inflight, 1, 1000000, 1024),
    {.name = "retry_on",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_CONFIG,
     .decode = decode_retry_on},
    U32_FIELD(kvg_upstream_config, retry_budget_percent, 0, 100, 20),
    U32_FIELD(kvg_upstream_config, retry_budget_min_concurrency, 0, 100000, 3),
    {.name = "outlier",
     .type = KVG_FIELD_OBJECT,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_upstream_config, outlier),
     .object = &outlier_table},
};

static const kvg_fields upstream_table = {"upstream", upstream_fields,
                                          KVG_ARRAY_LEN(upstream_fields), NULL};

static int check_http_path(const void *value, char *why, size_t len)
{
    const char *s = value;
    if (s[0] == '/' && !strpbrk(s, " \r\n\t"))
        return 0;
    snprintf(why, len, "must be an absolute path without spaces");
    return KVG_EPARSE;
}

/* The path of an HTTP check, in a char array of the section's struct. */
#define PATH_FIELD(st, dflt)                                                                       \
    {                                                                                              \
        .name = "path", .type = KVG_FIELD_CHARS, .set_in = KVG_SET_CONFIG,                         \
        .offset = offsetof(st, path), .max = sizeof(((st *)0)->path) - 1, .def.s = (dflt),         \
        .check = check_http_path                                                                   \
    }

static const kvg_field health_fields[] = {
    PATH_FIELD(kvg_health_config, "/health"),
    U32_FIELD(kvg_health_config, interval_ms, 100, 3600000, 2000),
    U32_FIELD(kvg_health_config, timeout_ms, 10, 600000, 1000),
    U32_FIELD(kvg_health_config, fall, 1, 100, 3),
    U32_FIELD(kvg_health_config, rise, 1, 100, 2),
};

static const kvg_fields health_table = {"health", health_fields, KVG_ARRAY_LEN(health_fields),
                                        NULL};

/* Scraping is off (0) or every 50 ms at the most often. */
static int check_scrape(const void *target, char *why, size_t len)
{
    const kvg_scrape_config *sc = target;
    if (sc->interval_ms == 0 || sc->interval_ms >= 50)
        return 0;
    snprintf(why, len, "interval_ms: must be 0 (off) or at least 50");
    return KVG_EPARSE;
}

static const kvg_field scrape_fields[] = {
    PATH_FIELD(kvg_scrape_config, "/metrics"),
    U32_FIELD(kvg_scrape_config, interval_ms, 0, 3600000, 0),
    U32_FIELD(kvg_scrape_config, timeout_ms, 10, 600000, 1000),
};

static const kvg_fields scrape_table = {"scrape", scrape_fields, KVG_ARRAY_LEN(scrape_fields),
                                        check_scrape};

/* The URL is parsed when the file is read, so that --check-config and start-up refuse a bad
 * one with the parser's own message. */
static int check_redis(const void *target, char *why, size_t len)
{
    const kvg_redis_settings *rs = target;
    if (!rs->url)
        return 0;
    kvg_redis_url u;
    char msg[200];
    if (kvg_redis_url_parse(rs->url, &u, msg, sizeof(msg)) == 0)
        return 0;
    snprintf(why, len, "url: %s", msg);
    return KVG_EPARSE;
}

static const kvg_field redis_fields[] = {
    {.name = "url",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG | KVG_SET_FLAG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_redis_settings, url)},
    {.name = "prefix",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_redis_settings, prefix),
     .max = 64,
     .def.s = "kvg"},
    U32_FIELD(kvg_redis_settings, lookup_timeout_ms, 1, 10000, 5),
    U32_FIELD(kvg_redis_settings, connect_timeout_ms, 10, 60000, 1000),
    U32_FIELD(kvg_redis_settings, command_timeout_ms, 10, 60000, 1000),
    U32_FIELD(kvg_redis_settings, max_inflight, 1, 1000000, 1024),
    U32_FIELD(kvg_redis_settings, reconnect_max_ms, 50, 600000, 2000),
    U32_FIELD(kvg_redis_settings, topology_interval_ms, 100, 600000, 1000),
    U32_FIELD(kvg_redis_settings, entry_ttl_s, 1, 31536000, 86400),
    U32_FIELD(kvg_redis_settings, startup_timeout_ms, 0, 3600000, 10000),
    U32_FIELD(kvg_redis_settings, sync_interval_ms, 100, 600000, 1000),
};

static const kvg_fields redis_table = {"redis", redis_fields, KVG_ARRAY_LEN(redis_fields),
                                       check_redis};

static const char *const hash_backend_keywords[KVG_HASH_BACKEND_CHOICE_COUNT] = {"auto", "cpu",
                                                                                 "cuda", "standin"};

static const kvg_field hash_fields[] = {
    {.name = "backend",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_CONFIG | KVG_SET_FLAG,
     .offset = offsetof(kvg_hash_settings, backend),
     .keywords = hash_backend_keywords,
     .nkeywords = KVG_HASH_BACKEND_CHOICE_COUNT,
     .def.u = KVG_HASH_BACKEND_AUTO},
    U32_FIELD(kvg_hash_settings, batch_deadline_us, 1, 100000, 50),
    U32_FIELD(kvg_hash_settings, max_batch_jobs, 1, 65536, 4096),
    U32_FIELD(kvg_hash_settings, batch_mib, 1, 4096, 64),
    U32_FIELD(kvg_hash_settings, crossover_bytes, 0, 1u << 30, 0),
    U32_FIELD(kvg_hash_settings, max_queued, 1, 1u << 24, 65536),
    U32_FIELD(kvg_hash_settings, device, 0, 1024, 0),
    U32_FIELD(kvg_hash_settings, exact_offload_bytes, 0, 1u << 30, 16384),
    U32_FIELD(kvg_hash_settings, exact_threads, 0, 64, 0),
};

static const kvg_fields hash_table = {"hash", hash_fields, KVG_ARRAY_LEN(hash_fields), NULL};

static const char *const tls_version_keywords[KVG_TLS_MIN_COUNT] = {"1.2", "1.3"};

/* TLS 1.2 suites that RFC 9113 (HTTP/2) accepts: AEAD with ephemeral keys only. TLS 1.3's
 * are OpenSSL's default, all of them AEAD. The strings are checked against OpenSSL by
 * kvg_tls_settings_check (gateway/tls.c), which names what it refuses. */
static const kvg_field tls_fields[] = {
    {.name = "min_version",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_tls_settings, min_version),
     .keywords = tls_version_keywords,
     .nkeywords = KVG_TLS_MIN_COUNT,
     .def.u = KVG_TLS_MIN_1_2},
    {.name = "ciphers",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_tls_settings, ciphers),
     .max = 4096,
     .def.s = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20"},
    {.name = "ciphersuites",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_tls_settings, ciphersuites),
     .max = 4096,
     .def.s = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256"},
};

static const kvg_fields tls_table = {"tls", tls_fields, KVG_ARRAY_LEN(tls_fields), NULL};

static int check_probe_path(const void *value, char *why, size_t len)
{
    const char *s = value;
    if (strlen(s) < 128 && s[0] == '/' && !strpbrk(s, " \r\n\t?"))
        return 0;
    snprintf(why, len, "must be an absolute path without spaces or '?', at most 127 bytes");
    return KVG_EPARSE;
}

static const kvg_field probes_fields[] = {
    {.name = "ready_requires_worker",
     .type = KVG_FIELD_BOOL,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_probes_config, ready_requires_worker),
     .def.b = true},
    {.name = "front_healthz",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_probes_config, front_healthz),
     .check = check_probe_path},
    {.name = "front_readyz",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .flags = KVG_FIELD_NONEMPTY,
     .offset = offsetof(kvg_probes_config, front_readyz),
     .check = check_probe_path},
};

/* The two front paths must differ: one path cannot answer both probes. */
static int check_probes(const void *target, char *why, size_t len)
{
    const kvg_probes_config *p = target;
    if (p->front_healthz && p->front_readyz && strcmp(p->front_healthz, p->front_readyz) == 0) {
        snprintf(why, len, "front_readyz: must differ from front_healthz");
        return KVG_EPARSE;
    }
    return 0;
}

static const kvg_fields probes_table = {"probes", probes_fields, KVG_ARRAY_LEN(probes_fields),
                                        check_probes};

/* An array of resource objects, each through the resource's table (defaults, then the object),
 * into the config's arena: *out and *count on success. what names one item in the message of too
 * many ("workers", "models"). */
static int decode_defs(kvg_config *cfg, const kvg_json *v, const char *path, kvg_fields_ctx *c,
                       const kvg_fields *table, size_t elem, size_t max, const char *what,
                       void **out, size_t *count)
{
    char ipath[64];
    if (v->type != KVG_JSON_ARRAY)
        return kvg_fields_fail(c, KVG_FIELD_MISTYPED, path, "must be an array of objects, not %s",
                               kvg_json_type_str(v->type));
    size_t n = v->u.arr.count;
    if (n > max)
        return kvg_fields_fail(c, KVG_FIELD_RANGE, path, "more than %zu %s", max, what);
    char *defs = kvg_arena_alloc(&cfg->arena, (n ? n : 1) * elem);
    if (!defs)
        return kvg_fields_fail(c, KVG_FIELD_NOMEM, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
        kvg_fields_defaults(table, defs + i * elem);
        int rc = kvg_fields_decode(table, defs + i * elem, v->u.arr.items[i], ipath, c);
        if (rc < 0)
            return rc;
    }
    *out = defs;
    *count = n;
    return 0;
}

/* "workers": replaces the workers before it; each through the worker's table. */
static int decode_workers(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    kvg_config *cfg = target;
    void *defs = NULL; /* -O3 cannot see that decode_defs sets it whenever it returns 0 */
    int rc = decode_defs(cfg, v, path, c, &kvg_worker_fields, sizeof(kvg_worker_def),
                         KVG_CONFIG_MAX_WORKERS, "workers", &defs, &cfg->nworkers);
    if (rc == 0)
        cfg->workers = defs;
    return rc;
}

/* "models": replaces the models before it; each through the model's table, so that a field
 * reads and fails the same as in the admin API and the state file. */
static int decode_models(void *target, const kvg_json *v, const char *path, kvg_fields_ctx *c)
{
    kvg_config *cfg = target;
    void *defs = NULL; /* -O3 cannot see that decode_defs sets it whenever it returns 0 */
    int rc = decode_defs(cfg, v, path, c, &kvg_model_fields, sizeof(kvg_model_def), KVG_MODELS_MAX,
                         "models", &defs, &cfg->nmodels);
    if (rc == 0)
        cfg->models = defs;
    return rc;
}

static const char *const auth_keywords[] = {"keys", "open"};
static const char *const level_keywords[KVG_LOG_LEVEL_COUNT] = {"error", "warn", "info", "debug"};

#define STRING_FIELD(field, where, dflt)                                                           \
    {                                                                                              \
        .name = #field, .type = KVG_FIELD_STRING, .set_in = (where), .flags = KVG_FIELD_NONEMPTY,  \
        .offset = offsetof(kvg_config, field), .def.s = (dflt)                                     \
    }

/* A section of the file: its struct in kvg_config, its table <section>_table. */
#define SECTION(section)                                                                           \
    {                                                                                              \
        .name = #section, .type = KVG_FIELD_OBJECT, .set_in = KVG_SET_CONFIG,                      \
        .offset = offsetof(kvg_config, section), .object = &section##_table                        \
    }

/* A passthrough path: absolute, no query, not one the gateway answers itself. */
static int check_passthrough_path(const void *value, char *why, size_t len)
{
    const char *p = value;
    static const char *const own[] = {"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                                      "/v1/models", "/v1/responses"};
    if (p[0] != '/' || strlen(p) > 256 || strpbrk(p, "?# \t") ||
        strncmp(p, "/v1/models/", 11) == 0 || strncmp(p, "/v1/responses/", 14) == 0) {
        snprintf(why, len,
                 "must be a path of at most 256 characters starting with /, without "
                 "query, fragment or blanks, and not under /v1/models/ or /v1/responses/");
        return KVG_EPARSE;
    }
    for (size_t i = 0; i < KVG_ARRAY_LEN(own); i++)
        if (strcmp(p, own[i]) == 0) {
            snprintf(why, len, "%s is routed by the gateway already", p);
            return KVG_EPARSE;
        }
    return 0;
}

/* What passthrough_paths holds unless the file says otherwise: the other POST paths of vLLM's
 * OpenAI-compatible server that take a model (docs/api.md). */
static const char *const default_passthrough[] = {
    "/v1/rerank",
    "/v2/rerank",
    "/rerank",
    "/v1/score",
    "/score",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
};

static const kvg_field config_fields[] = {
    LISTEN_FIELD(decode_front_listeners),
    {.name = "admin",
     .type = KVG_FIELD_OBJECT,
     .set_in = KVG_SET_CONFIG,
     .offset = 0,
     .object = &admin_table},
    {.name = "auth",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_CONFIG | KVG_SET_FLAG,
     .flags = KVG_FIELD_AS_BOOL,
     .offset = offsetof(kvg_config, auth_open),
     .keywords = auth_keywords,
     .nkeywords = 2},
    {.name = "secret",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_config, secret),
     .min = 32},
    STRING_FIELD(state_dir, KVG_SET_CONFIG | KVG_SET_FLAG, "./kvgate-state"),
    STRING_FIELD(state_file, KVG_SET_CONFIG, NULL),
    STRING_FIELD(audit_log, KVG_SET_CONFIG, NULL),
    STRING_FIELD(access_log, KVG_SET_CONFIG | KVG_SET_FLAG, "-"),
    STRING_FIELD(port_file, KVG_SET_FLAG, NULL),
    U32_FIELD(kvg_config, tenant_metrics_max, 0, 100000, 100),
    U32_FIELD(kvg_config, index_max_entries, 0, 1u << 30, 0),
    U32_FIELD(kvg_config, index_default_capacity, 0, 1u << 30, 0),
    U32_FIELD(kvg_config, index_speculative_ttl_ms, 0, 600000, 0),
    {.name = "threads",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_CONFIG | KVG_SET_FLAG,
     .offset = offsetof(kvg_config, threads),
     .max = 1024},
    {.name = "log_level",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_CONFIG | KVG_SET_FLAG,
     .offset = offsetof(kvg_config, log_level),
     .keywords = level_keywords,
     .nkeywords = KVG_LOG_LEVEL_COUNT,
     .def.u = KVG_LOG_INFO},
    {.name = "worker_header",
     .type = KVG_FIELD_BOOL,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_config, worker_header),
     .def.b = true},
    U32_FIELD(kvg_config, shutdown_timeout_ms, 0, 3600000, 30000),
    U32_FIELD(kvg_config, shutdown_ready_delay_ms, 0, 3600000, 0),
    SECTION(tls),
    SECTION(probes),
    SECTION(limits),
    SECTION(upstream),
    SECTION(health),
    SECTION(scrape),
    {.name = "redis",
     .type = KVG_FIELD_OBJECT,
     .set_in = KVG_SET_CONFIG | KVG_SET_FLAG,
     .offset = offsetof(kvg_config, redis),
     .object = &redis_table},
    {.name = "hash",
     .type = KVG_FIELD_OBJECT,
     .set_in = KVG_SET_CONFIG | KVG_SET_FLAG,
     .offset = offsetof(kvg_config, hash),
     .object = &hash_table},
    {.name = "workers",
     .type = KVG_FIELD_CUSTOM,
     .set_in = KVG_SET_CONFIG,
     .decode = decode_workers},
    {.name = "models", .type = KVG_FIELD_CUSTOM, .set_in = KVG_SET_CONFIG, .decode = decode_models},
    {.name = "passthrough_paths",
     .type = KVG_FIELD_STRINGS,
     .set_in = KVG_SET_CONFIG,
     .offset = offsetof(kvg_config, passthrough_paths),
     .count_offset = offsetof(kvg_config, npassthrough_paths),
     .max = 64,
     .check = check_passthrough_path},
};

const kvg_fields kvg_config_fields = {"config", config_fields, KVG_ARRAY_LEN(config_fields), NULL};

_Static_assert(sizeof(unsigned) == sizeof(uint32_t), "threads is a u32 field");
_Static_assert(sizeof(kvg_log_level) == sizeof(int), "log_level is an enum field");

/* ---- defaults, the file ------------------------------------------------------------------- */

int kvg_config_init(kvg_config *cfg)
{
    char err[128];
    memset(cfg, 0, sizeof(*cfg));
    kvg_arena_init(&cfg->arena, 4096);
    kvg_fields_defaults(&kvg_config_fields, cfg);
    parse_listen(&cfg->listeners[0], "0.0.0.0:8080", err, sizeof(err));
    cfg->nlisteners = 1;
    parse_listen(&cfg->admin_listeners[0], "127.0.0.1:9090", err, sizeof(err));
    cfg->nadmin_listeners = 1;
    size_t n = KVG_ARRAY_LEN(default_passthrough);
    cfg->passthrough_paths = kvg_arena_alloc(&cfg->arena, n * sizeof(char *));
    if (!cfg->passthrough_paths)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (!(cfg->passthrough_paths[i] = kvg_arena_strdup(&cfg->arena, default_passthrough[i])))
            return -ENOMEM;
    cfg->npassthrough_paths = n;
    return 0;
}

void kvg_config_done(kvg_config *cfg)
{
    kvg_arena_done(&cfg->arena);
    memset(cfg, 0, sizeof(*cfg));
}

int kvg_config_load_file(kvg_config *cfg, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, err_len, "cannot open %s: %s", path, strerror(e));
        return -e;
    }
    kvg_buf b;
    kvg_buf_init(&b);
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0 && b.len <= CONFIG_MAX_BYTES)
        kvg_buf_append(&b, chunk, n);
    bool read_err = ferror(f);
    fclose(f);
    if (read_err || b.failed || b.len > CONFIG_MAX_BYTES) {
        snprintf(err, err_len, "cannot read %s (or larger than 16 MiB)", path);
        kvg_buf_done(&b);
        return KVG_ECONFIG;
    }
    kvg_arena a;
    kvg_arena_init(&a, 65536);
    kvg_json *root;
    kvg_json_error jerr = {0};
    kvg_json_limits lim = {.reject_duplicate_keys = true};
    int rc = kvg_json_parse(b.data ? b.data : "", b.len, &a, &lim, &root, &jerr);
    if (rc < 0) {
        snprintf(err, err_len, "%s: invalid JSON at byte %zu: %s", path, jerr.offset, jerr.message);
        rc = KVG_ECONFIG;
    } else if (root->type != KVG_JSON_OBJECT) {
        snprintf(err, err_len, "%s: must be a JSON object", path);
        rc = KVG_ECONFIG;
    } else {
        char inner[256] = "";
        kvg_fields_ctx c = config_ctx(cfg, KVG_SET_CONFIG, inner, sizeof(inner));
        rc = kvg_fields_decode(&kvg_config_fields, cfg, root, "", &c);
        if (rc < 0) {
            snprintf(err, err_len, "%s: %s", path, inner);
            rc = rc == -ENOMEM ? -ENOMEM : KVG_ECONFIG;
        } else if (set_str(cfg, &cfg->path, path) < 0) {
            rc = -ENOMEM;
        }
    }
    kvg_arena_done(&a);
    kvg_buf_done(&b);
    return rc;
}

/* ---- flags --------------------------------------------------------------------------------- */

void kvg_config_usage(FILE *out)
{
    fprintf(
        out,
        "Usage: kvgate [OPTIONS]\n"
        "Prefix-cache-aware HTTP/2 gateway for OpenAI-compatible inference workers.\n\n"
        "  -c, --config FILE          JSON config file (flags override it)\n"
        "      --listen HOST:PORT     front listener (repeatable; default 0.0.0.0:8080)\n"
        "      --tls-cert FILE        certificate chain (PEM) for the --listen listeners\n"
        "      --tls-key FILE         private key (PEM) for the --listen listeners\n"
        "      --admin-listen HOST:PORT  admin listener (default 127.0.0.1:9090)\n"
        "      --state DIR            state directory (default ./kvgate-state)\n"
        "      --threads N            event-loop threads (default: one per core)\n"
        "      --worker NAME=URL[,model=M]...[,kv_blocks=N][,max_inflight=N][,cache_salt=off]\n"
        "                             add a worker, e.g. w1=http://127.0.0.1:8001,model=m\n"
        "                             (repeatable; without model= it serves every model;\n"
        "                             cache_salt=off for engines without that field)\n"
        "      --auth keys|open       require API keys (default) or serve anyone (one\n"
        "                             tenant; only for single-tenant deployments)\n"
        "      --redis URL            share the prefix map and the state with other\n"
        "                             replicas: redis://[[user]:password@]host:port[/db]\n"
        "                             or redis-sentinel://host:port[,host:port...]/master\n"
        "      --hash-backend B       block-key hashing: auto (default: the GPU when one is\n"
        "                             usable, else the CPU), cpu, or cuda (or refuse to start)\n"
        "      --access-log PATH      JSON access log: a file, '-' for stdout, 'off'\n"
        "      --log-level LEVEL      error, warn, info (default) or debug\n"
        "      --port-file FILE       write the bound ports here once listening\n"
        "      --check-config         validate the configuration and exit\n"
        "  -h, --help                 this text\n"
        "  -V, --version              print the version\n\n"
        "Environment: KVGATE_ADMIN_TOKEN sets the admin bearer token, KVGATE_SECRET the\n"
        "server secret that cache salts derive from (replicas must share it),\n"
        "KVGATE_METRICS_TOKEN a bearer token that reads GET /metrics and nothing else.\n"
        "Signals: SIGTERM/SIGINT drain and exit (after shutdown_ready_delay_ms), SIGHUP\n"
        "reloads the config file and the TLS certificates.\n");
}

enum {
    OPT_LISTEN = 256,
    OPT_ADMIN_LISTEN,
    OPT_STATE,
    OPT_THREADS,
    OPT_WORKER,
    OPT_ACCESS_LOG,
    OPT_LOG_LEVEL,
    OPT_PORT_FILE,
    OPT_CHECK,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_AUTH,
    OPT_REDIS,
    OPT_HASH_BACKEND,
};

static const struct option long_opts[] = {
    {"config", required_argument, NULL, 'c'},
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"admin-listen", required_argument, NULL, OPT_ADMIN_LISTEN},
    {"state", required_argument, NULL, OPT_STATE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"worker", required_argument, NULL, OPT_WORKER},
    {"access-log", required_argument, NULL, OPT_ACCESS_LOG},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"port-file", required_argument, NULL, OPT_PORT_FILE},
    {"check-config", no_argument, NULL, OPT_CHECK},
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
    {"auth", required_argument, NULL, OPT_AUTH},
    {"redis", required_argument, NULL, OPT_REDIS},
    {"hash-backend", required_argument, NULL, OPT_HASH_BACKEND},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

/* A flag that sets a field of the file's table: the same checks and messages, named by the
 * flag ("--threads: must be an integer in 0..1024, not string"). */
static int flag_set(kvg_config *cfg, const char *flag, const char *field, const char *value,
                    char *err, size_t err_len)
{
    char msg[256];
    kvg_fields_ctx c = config_ctx(cfg, KVG_SET_FLAG, msg, sizeof(msg));
    int rc = kvg_fields_set_text(&kvg_config_fields, cfg, field, strlen(field), value,
                                 strlen(value), "", &c);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0) {
        size_t n = strlen(field);
        const char *rest = strncmp(msg, field, n) == 0 && msg[n] == ':' ? msg + n : msg;
        snprintf(err, err_len, "%s%s%s", flag, rest == msg ? ": " : "", rest);
        return KVG_ECONFIG;
    }
    return 0;
}

/* --worker NAME=URL[,model=M]...[,kv_blocks=N][,max_inflight=N][,cache_salt=on|off]: a whole
 * worker definition on the command line, so a config file is never needed. URLs never contain
 * commas. The items go through the worker's field table. */
static int add_flag_worker(kvg_config *cfg, const char *arg, char *err, size_t err_len)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1]) {
        snprintf(err, err_len, "--worker wants NAME=URL[,model=M][,kv_blocks=N], got '%s'", arg);
        return KVG_ECONFIG;
    }
    if (cfg->nworkers >= KVG_CONFIG_MAX_WORKERS) {
        snprintf(err, err_len, "too many workers");
        return KVG_ECONFIG;
    }
    /* The array grows by copying, in the arena: a command line holds a few workers. */
    kvg_worker_def *ws = kvg_arena_alloc(&cfg->arena, (cfg->nworkers + 1) * sizeof(*ws));
    if (!ws)
        return -ENOMEM;
    if (cfg->nworkers)
        memcpy(ws, cfg->workers, cfg->nworkers * sizeof(*ws));
    kvg_worker_def *w = &ws[cfg->nworkers];
    kvg_fields_defaults(&kvg_worker_fields, w);
    const char *url = eq + 1;
    const char *comma = strchr(url, ',');
    w->name = kvg_arena_strndup(&cfg->arena, arg, (size_t)(eq - arg));
    w->url = kvg_arena_strndup(&cfg->arena, url, comma ? (size_t)(comma - url) : strlen(url));
    if (!w->name || !w->url)
        return -ENOMEM;
    cfg->workers = ws;
    cfg->nworkers++;
    char msg[256];
    kvg_fields_ctx c = config_ctx(cfg, KVG_SET_FLAG, msg, sizeof(msg));
    /* Items set once, as members of a JSON object are: a repeat is the walker's
     * "appears more than once", not a silent last-one-wins. List items (model=) append. */
    const kvg_field *seen[32];
    size_t nseen = 0;
    while (comma) {
        const char *item = comma + 1;
        comma = strchr(item, ',');
        size_t len = comma ? (size_t)(comma - item) : strlen(item);
        const char *val = memchr(item, '=', len);
        if (!val) {
            snprintf(err, err_len, "--worker %s: '%.*s' is not KEY=VALUE", w->name, (int)len, item);
            return KVG_ECONFIG;
        }
        size_t klen = (size_t)(val - item);
        const kvg_field *f = kvg_fields_find(&kvg_worker_fields, item, klen);
        if (f && f->type != KVG_FIELD_STRINGS) {
            for (size_t i = 0; i < nseen; i++) {
                if (seen[i] == f) {
                    snprintf(err, err_len, "--worker %s (%.*s): %s: appears more than once",
                             w->name, (int)len, item, f->name);
                    return KVG_ECONFIG;
                }
            }
            if (nseen < KVG_ARRAY_LEN(seen))
                seen[nseen++] = f;
        }
        int rc =
            kvg_fields_set_text(&kvg_worker_fields, w, item, klen, val + 1, len - klen - 1, "", &c);
        if (rc == -ENOMEM)
            return rc;
        if (rc < 0) {
            snprintf(err, err_len, "--worker %s (%.*s): %s", w->name, (int)len, item, msg);
            return KVG_ECONFIG;
        }
    }
    return 0;
}

/* The first --listen (or --admin-listen) replaces the file's list; later ones add to it. */
static int add_flag_listener(kvg_listener_config *ls, size_t *n, bool *given, const char *flag,
                             const char *addr, char *err, size_t err_len)
{
    if (!*given) {
        *n = 0;
        *given = true;
    }
    if (*n >= KVG_MAX_LISTENERS) {
        snprintf(err, err_len, "too many %s flags", flag);
        return KVG_ECONFIG;
    }
    int rc = parse_listen(&ls[*n], addr, err, err_len);
    if (rc == 0)
        (*n)++;
    return rc;
}

/* Flags that set one top-level field of the config file, decoded through its table (so with
 * the file's checks and messages, named by the flag). */
static const struct {
    int opt;
    const char *flag, *field;
} field_flags[] = {
    {OPT_STATE, "--state", "state_dir"},
    {OPT_THREADS, "--threads", "threads"},
    {OPT_ACCESS_LOG, "--access-log", "access_log"},
    {OPT_LOG_LEVEL, "--log-level", "log_level"},
    {OPT_PORT_FILE, "--port-file", "port_file"},
    {OPT_AUTH, "--auth", "auth"},
    {OPT_REDIS, "--redis", "redis.url"},
    {OPT_HASH_BACKEND, "--hash-backend", "hash.backend"},
};

int kvg_config_parse_args(kvg_config *cfg, int argc, char **argv, kvg_config_action *action,
                          char *err, size_t err_len)
{
    *action = KVG_ACTION_RUN;
    /* First pass: the config file, so that every other flag can override it. */
    optind = 1;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:hV", long_opts, NULL)) != -1) {
        if (opt == 'c') {
            int rc = kvg_config_load_file(cfg, optarg, err, err_len);
            if (rc < 0)
                return KVG_ECONFIG;
        }
    }
    optind = 1;
    bool listen_given = false, admin_given = false, flag_workers = false;
    char *tls_cert = NULL, *tls_key = NULL;
    int rc = 0;
    while (rc == 0 && (opt = getopt_long(argc, argv, "c:hV", long_opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            break;
        case 'h':
            *action = KVG_ACTION_HELP;
            break;
        case 'V':
            *action = KVG_ACTION_VERSION;
            break;
        case OPT_CHECK:
            *action = KVG_ACTION_CHECK;
            break;
        case OPT_LISTEN:
            rc = add_flag_listener(cfg->listeners, &cfg->nlisteners, &listen_given, "--listen",
                                   optarg, err, err_len);
            break;
        case OPT_ADMIN_LISTEN:
            rc = add_flag_listener(cfg->admin_listeners, &cfg->nadmin_listeners, &admin_given,
                                   "--admin-listen", optarg, err, err_len);
            break;
        case OPT_WORKER:
            /* Flag workers replace the file's list, like every other flag overrides it. */
            if (!flag_workers) {
                cfg->workers = NULL;
                cfg->nworkers = 0;
                flag_workers = true;
            }
            rc = add_flag_worker(cfg, optarg, err, err_len);
            break;
        case OPT_TLS_CERT:
            tls_cert = optarg;
            break;
        case OPT_TLS_KEY:
            tls_key = optarg;
            break;
        default: {
            size_t i = 0;
            while (i < KVG_ARRAY_LEN(field_flags) && field_flags[i].opt != opt)
                i++;
            if (i < KVG_ARRAY_LEN(field_flags)) {
                rc = flag_set(cfg, field_flags[i].flag, field_flags[i].field, optarg, err, err_len);
                break;
            }
            snprintf(err, err_len, "unknown or incomplete option '%s' (see --help)",
                     argv[optind - 1]);
            rc = KVG_ECONFIG;
            break;
        }
        }
    }
    if (rc == 0 && optind < argc) {
        snprintf(err, err_len, "unexpected argument '%s'", argv[optind]);
        rc = KVG_ECONFIG;
    }
    if (rc == 0 && (tls_cert || tls_key)) {
        for (size_t i = 0; rc == 0 && i < cfg->nlisteners; i++) {
            if (set_str(cfg, &cfg->listeners[i].tls_cert, tls_cert) < 0 ||
                set_str(cfg, &cfg->listeners[i].tls_key, tls_key) < 0)
                rc = -ENOMEM;
        }
    }
    if (rc == -ENOMEM)
        snprintf(err, err_len, "out of memory");
    return rc < 0 ? KVG_ECONFIG : 0;
}

int kvg_config_validate(const kvg_config *cfg, char *err, size_t err_len)
{
    /* A body the budget cannot hold (with the rewritten copy the forwarding makes) could
     * never be served. */
    if (cfg->limits.body_budget_bytes < 2 * (uint64_t)cfg->limits.body_bytes) {
        snprintf(err, err_len,
                 "limits.body_budget_mib must hold one body of limits.body_bytes "
                 "twice (the body and its rewritten copy)");
        return KVG_ECONFIG;
    }
    /* The section's check runs when the file is read; --redis sets the URL alone. */
    char why[240];
    if (check_redis(&cfg->redis, why, sizeof(why)) < 0) {
        snprintf(err, err_len, "redis.%s", why);
        return KVG_ECONFIG;
    }
    const kvg_listener_config *groups[2] = {cfg->listeners, cfg->admin_listeners};
    size_t counts[2] = {cfg->nlisteners, cfg->nadmin_listeners};
    for (int g = 0; g < 2; g++) {
        for (size_t i = 0; i < counts[g]; i++) {
            const kvg_listener_config *l = &groups[g][i];
            if (!l->tls_cert != !l->tls_key) {
                snprintf(err, err_len, "listener %s: tls_cert and tls_key go together", l->address);
                return KVG_ECONFIG;
            }
            if (!l->cleartext && !l->tls_cert) {
                snprintf(err, err_len, "listener %s: cleartext off needs TLS", l->address);
                return KVG_ECONFIG;
            }
        }
    }
    for (size_t i = 0; i < cfg->nworkers; i++) {
        const kvg_worker_def *w = &cfg->workers[i];
        char msg[200];
        if (kvg_worker_def_validate(w, msg, sizeof(msg)) < 0) {
            snprintf(err, err_len, "worker '%s': %s", w->name, msg);
            return KVG_ECONFIG;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(cfg->workers[j].name, w->name) == 0) {
                snprintf(err, err_len, "worker '%s' is defined twice", w->name);
                return KVG_ECONFIG;
            }
        }
    }
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const kvg_model_def *m = &cfg->models[i];
        char msg[200];
        if (kvg_model_def_validate(m, msg, sizeof(msg)) < 0) {
            snprintf(err, err_len, "models[%zu]: %s", i, msg);
            return KVG_ECONFIG;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(cfg->models[j].name, m->name) == 0) {
                snprintf(err, err_len, "model '%s' is defined twice", m->name);
                return KVG_ECONFIG;
            }
        }
    }
    return 0;
}

kvg_worker_def *kvg_config_worker_defs(const kvg_config *cfg)
{
    kvg_worker_def *defs = calloc(cfg->nworkers ? cfg->nworkers : 1, sizeof(*defs));
    if (defs && cfg->nworkers)
        memcpy(defs, cfg->workers, cfg->nworkers * sizeof(*defs));
    return defs;
}
