/* SPDX-License-Identifier: Apache-2.0 */
/* Configuration: embedded defaults, a strict JSON config file (unknown keys are errors), and
 * command-line flags that override both. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvg_config.h"

#define CONFIG_MAX_BYTES (16u << 20)

static char *xstrdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

static int set_str(char **dst, const char *s)
{
    char *c = xstrdup(s);
    if (s && !c)
        return -ENOMEM;
    free(*dst);
    *dst = c;
    return 0;
}

static int parse_listen(kvg_listener_config *l, const char *addr, char *err, size_t err_len)
{
    memset(l, 0, sizeof(*l));
    l->cleartext = true;
    if (strlen(addr) >= sizeof(l->address) ||
        kvg_parse_hostport(addr, l->host, sizeof(l->host), &l->port) < 0) {
        snprintf(err, err_len, "invalid listen address '%s' (want HOST:PORT)", addr);
        return KVG_ECONFIG;
    }
    snprintf(l->address, sizeof(l->address), "%s", addr);
    return 0;
}

static void listener_done(kvg_listener_config *l)
{
    free(l->tls_cert);
    free(l->tls_key);
    l->tls_cert = l->tls_key = NULL;
}

int kvg_config_init(kvg_config *cfg)
{
    char err[128];
    memset(cfg, 0, sizeof(*cfg));
    parse_listen(&cfg->listeners[0], "0.0.0.0:8080", err, sizeof(err));
    cfg->nlisteners = 1;
    parse_listen(&cfg->admin_listeners[0], "127.0.0.1:9090", err, sizeof(err));
    cfg->nadmin_listeners = 1;
    cfg->log_level = KVG_LOG_INFO;
    cfg->worker_header = true;
    cfg->tenant_metrics_max = 100;
    cfg->shutdown_timeout_ms = 30000;
    cfg->limits = (kvg_front_limits){
        .header_bytes = 64 * 1024,
        .body_bytes = 32u << 20,
        .streams_per_conn = 256,
        .header_timeout_ms = 10000,
        .idle_timeout_ms = 75000,
        .read_timeout_ms = 30000,
        .body_min_rate = 1024,
        .send_timeout_ms = 60000,
        .max_connections = 0,
        .body_budget_bytes = 1ull << 30,
        .tenant_body_share = 25,
        .response_budget_bytes = 1ull << 30,
    };
    cfg->admin_max_connections = 64;
    cfg->upstream = (kvg_upstream_config){
        .connect_timeout_ms = 3000,
        .response_timeout_ms = 300000,
        .read_timeout_ms = 300000,
        .max_idle_per_worker = 256,
        .idle_timeout_ms = 60000,
        .retries = 2,
        .max_inflight = 1024,
    };
    cfg->health = (kvg_health_config){
        .interval_ms = 2000,
        .timeout_ms = 1000,
        .fall = 3,
        .rise = 2,
        .path = "/health",
    };
    cfg->scrape = (kvg_scrape_config){.interval_ms = 0, .timeout_ms = 1000, .path = "/metrics"};
    if (set_str(&cfg->state_dir, "./kvgate-state") < 0 || set_str(&cfg->access_log, "-") < 0)
        return -ENOMEM;
    return 0;
}

static void workers_done(kvg_config *cfg)
{
    for (size_t i = 0; i < cfg->nworkers; i++) {
        kvg_config_worker *w = &cfg->workers[i];
        free(w->name);
        free(w->url);
        for (size_t j = 0; j < w->nmodels; j++)
            free(w->models[j]);
        free(w->models);
    }
    free(cfg->workers);
    cfg->workers = NULL;
    cfg->nworkers = 0;
}

void kvg_config_done(kvg_config *cfg)
{
    for (size_t i = 0; i < cfg->nlisteners; i++)
        listener_done(&cfg->listeners[i]);
    for (size_t i = 0; i < cfg->nadmin_listeners; i++)
        listener_done(&cfg->admin_listeners[i]);
    for (size_t i = 0; i < cfg->nadmin_tokens; i++)
        free(cfg->admin_tokens[i]);
    workers_done(cfg);
    free(cfg->path);
    free(cfg->secret);
    free(cfg->state_file);
    free(cfg->audit_log);
    free(cfg->state_dir);
    free(cfg->access_log);
    free(cfg->port_file);
    memset(cfg, 0, sizeof(*cfg));
}

/* ---- JSON file ------------------------------------------------------------------------------ */

typedef struct cfg_ctx {
    char *err;
    size_t err_len;
} cfg_ctx;

static int bad(cfg_ctx *c, const char *key, const char *what)
{
    snprintf(c->err, c->err_len, "%s: %s", key, what);
    return KVG_ECONFIG;
}

static int get_u32(cfg_ctx *c, const kvg_json *v, const char *key, uint32_t min, uint32_t max,
                   uint32_t *out)
{
    if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int)
        return bad(c, key, "must be an integer");
    if (v->u.num.ival < (int64_t)min || v->u.num.ival > (int64_t)max) {
        char msg[96];
        snprintf(msg, sizeof(msg), "must be between %u and %u", min, max);
        return bad(c, key, msg);
    }
    *out = (uint32_t)v->u.num.ival;
    return 0;
}

static int get_bool(cfg_ctx *c, const kvg_json *v, const char *key, bool *out)
{
    if (v->type != KVG_JSON_TRUE && v->type != KVG_JSON_FALSE)
        return bad(c, key, "must be true or false");
    *out = v->type == KVG_JSON_TRUE;
    return 0;
}

static int get_string(cfg_ctx *c, const kvg_json *v, const char *key, const char **out)
{
    if (v->type != KVG_JSON_STRING || v->u.str.len == 0 || strlen(v->u.str.ptr) != v->u.str.len)
        return bad(c, key, "must be a non-empty string");
    *out = v->u.str.ptr;
    return 0;
}

/* A field table entry: a key of an object and where its value goes. */
typedef struct u32_field {
    const char *key;
    uint32_t *dst;
    uint32_t min, max;
} u32_field;

static int apply_u32_fields(cfg_ctx *c, const kvg_json *obj, const char *section,
                            const u32_field *fields, size_t nfields)
{
    if (obj->type != KVG_JSON_OBJECT)
        return bad(c, section, "must be an object");
    for (size_t i = 0; i < obj->u.obj.count; i++) {
        const char *k = obj->u.obj.keys[i];
        char full[128];
        snprintf(full, sizeof(full), "%s.%s", section, k);
        size_t j;
        for (j = 0; j < nfields; j++)
            if (strcmp(fields[j].key, k) == 0)
                break;
        if (j == nfields)
            return bad(c, full, "unknown key");
        int rc =
            get_u32(c, obj->u.obj.values[i], full, fields[j].min, fields[j].max, fields[j].dst);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_listener(cfg_ctx *c, const kvg_json *v, const char *key, kvg_listener_config *l)
{
    const char *addr;
    if (v->type == KVG_JSON_STRING) {
        if (get_string(c, v, key, &addr) < 0)
            return KVG_ECONFIG;
        return parse_listen(l, addr, c->err, c->err_len);
    }
    if (v->type != KVG_JSON_OBJECT)
        return bad(c, key, "must be \"HOST:PORT\" or an object");
    const kvg_json *a = kvg_json_get(v, "address");
    if (!a)
        return bad(c, key, "needs \"address\"");
    if (get_string(c, a, key, &addr) < 0 || parse_listen(l, addr, c->err, c->err_len) < 0)
        return KVG_ECONFIG;
    for (size_t i = 0; i < v->u.obj.count; i++) {
        const char *k = v->u.obj.keys[i];
        const kvg_json *val = v->u.obj.values[i];
        const char *s;
        if (strcmp(k, "address") == 0)
            continue;
        if (strcmp(k, "tls_cert") == 0 || strcmp(k, "tls_key") == 0) {
            if (get_string(c, val, k, &s) < 0)
                return KVG_ECONFIG;
            if (set_str(k[4] == 'c' ? &l->tls_cert : &l->tls_key, s) < 0)
                return -ENOMEM;
        } else if (strcmp(k, "cleartext") == 0) {
            if (get_bool(c, val, k, &l->cleartext) < 0)
                return KVG_ECONFIG;
        } else {
            char full[128];
            snprintf(full, sizeof(full), "%s.%s", key, k);
            return bad(c, full, "unknown key");
        }
    }
    return 0;
}

static int load_listeners(cfg_ctx *c, const kvg_json *v, const char *key, kvg_listener_config *ls,
                          size_t *n)
{
    const kvg_json *const *items = (const kvg_json *const *)&v;
    size_t count = 1;
    if (v->type == KVG_JSON_ARRAY) {
        items = (const kvg_json *const *)v->u.arr.items;
        count = v->u.arr.count;
    }
    if (count == 0 || count > KVG_MAX_LISTENERS)
        return bad(c, key, "needs 1 to 16 listeners");
    for (size_t i = 0; i < *n; i++)
        listener_done(&ls[i]);
    *n = 0;
    for (size_t i = 0; i < count; i++) {
        int rc = load_listener(c, items[i], key, &ls[i]);
        *n = i + 1;
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* "scrape": {"interval_ms", "timeout_ms", "path"}: the engines' own load (gateway/scrape.c). */
static int load_scrape(cfg_ctx *c, kvg_config *cfg, const kvg_json *v)
{
    if (v->type != KVG_JSON_OBJECT)
        return bad(c, "scrape", "must be an object");
    kvg_scrape_config sc = cfg->scrape;
    u32_field f[] = {
        {"interval_ms", &sc.interval_ms, 0, 3600000},
        {"timeout_ms", &sc.timeout_ms, 10, 600000},
    };
    for (size_t i = 0; i < v->u.obj.count; i++) {
        const char *k = v->u.obj.keys[i];
        const kvg_json *val = v->u.obj.values[i];
        int rc;
        if (strcmp(k, "path") == 0) {
            const char *s;
            rc = get_string(c, val, "scrape.path", &s);
            if (rc == 0 && (s[0] != '/' || strlen(s) >= sizeof(sc.path) || strpbrk(s, " \r\n\t")))
                rc = bad(c, "scrape.path", "must be an absolute path without spaces");
            if (rc == 0)
                snprintf(sc.path, sizeof(sc.path), "%s", s);
        } else {
            size_t m;
            for (m = 0; m < KVG_ARRAY_LEN(f); m++)
                if (strcmp(f[m].key, k) == 0)
                    break;
            char full[96];
            snprintf(full, sizeof(full), "scrape.%s", k);
            rc = m == KVG_ARRAY_LEN(f) ? bad(c, full, "unknown key")
                                       : get_u32(c, val, full, f[m].min, f[m].max, f[m].dst);
        }
        if (rc < 0)
            return rc;
    }
    if (sc.interval_ms && sc.interval_ms < 50)
        return bad(c, "scrape.interval_ms", "must be 0 (off) or at least 50");
    cfg->scrape = sc;
    return 0;
}

/* The budgets are byte counts past 4 GiB on a large machine: in MiB in the file, so that the
 * u32 field table carries them too. */
static int load_limits(cfg_ctx *c, kvg_front_limits *lim, const kvg_json *v)
{
    uint32_t header_bytes = (uint32_t)lim->header_bytes;
    uint32_t body_bytes = (uint32_t)lim->body_bytes;
    uint32_t body_budget_mib = (uint32_t)(lim->body_budget_bytes >> 20);
    uint32_t response_budget_mib = (uint32_t)(lim->response_budget_bytes >> 20);
    u32_field f[] = {
        {"header_bytes", &header_bytes, 1024, 1u << 20},
        {"body_bytes", &body_bytes, 1024, 1u << 30},
        {"streams_per_conn", &lim->streams_per_conn, 1, 10000},
        {"header_timeout_ms", &lim->header_timeout_ms, 100, 3600000},
        {"idle_timeout_ms", &lim->idle_timeout_ms, 100, 86400000},
        {"read_timeout_ms", &lim->read_timeout_ms, 100, 3600000},
        {"body_min_rate", &lim->body_min_rate, 0, 1u << 30},
        {"send_timeout_ms", &lim->send_timeout_ms, 100, 86400000},
        {"max_connections", &lim->max_connections, 0, 10000000},
        {"body_budget_mib", &body_budget_mib, 1, 1u << 20},
        {"tenant_body_share", &lim->tenant_body_share, 1, 100},
        {"response_budget_mib", &response_budget_mib, 1, 1u << 20},
    };
    int rc = apply_u32_fields(c, v, "limits", f, KVG_ARRAY_LEN(f));
    lim->header_bytes = header_bytes;
    lim->body_bytes = body_bytes;
    lim->body_budget_bytes = (uint64_t)body_budget_mib << 20;
    lim->response_budget_bytes = (uint64_t)response_budget_mib << 20;
    return rc;
}

static int load_workers(cfg_ctx *c, kvg_config *cfg, const kvg_json *v)
{
    if (v->type != KVG_JSON_ARRAY)
        return bad(c, "workers", "must be an array of objects");
    if (v->u.arr.count > KVG_CONFIG_MAX_WORKERS)
        return bad(c, "workers", "too many workers");
    workers_done(cfg);
    if (v->u.arr.count == 0)
        return 0;
    cfg->workers = calloc(v->u.arr.count, sizeof(*cfg->workers));
    if (!cfg->workers)
        return -ENOMEM;
    for (size_t i = 0; i < v->u.arr.count; i++) {
        const kvg_json *w = v->u.arr.items[i];
        kvg_config_worker *cw = &cfg->workers[i];
        cfg->nworkers = i + 1;
        char key[64];
        snprintf(key, sizeof(key), "workers[%zu]", i);
        if (w->type != KVG_JSON_OBJECT)
            return bad(c, key, "must be an object");
        for (size_t j = 0; j < w->u.obj.count; j++) {
            const char *k = w->u.obj.keys[j];
            const kvg_json *val = w->u.obj.values[j];
            char full[128];
            snprintf(full, sizeof(full), "%s.%s", key, k);
            const char *s;
            if (strcmp(k, "name") == 0 || strcmp(k, "url") == 0) {
                if (get_string(c, val, full, &s) < 0)
                    return KVG_ECONFIG;
                if (set_str(k[0] == 'n' ? &cw->name : &cw->url, s) < 0)
                    return -ENOMEM;
            } else if (strcmp(k, "models") == 0) {
                if (val->type != KVG_JSON_ARRAY || val->u.arr.count > KVG_WORKER_MODELS_MAX)
                    return bad(c, full, "must be an array of at most 64 strings");
                cw->models = calloc(val->u.arr.count + 1, sizeof(char *));
                if (!cw->models)
                    return -ENOMEM;
                for (size_t m = 0; m < val->u.arr.count; m++) {
                    if (get_string(c, val->u.arr.items[m], full, &s) < 0)
                        return KVG_ECONFIG;
                    cw->models[m] = strdup(s);
                    if (!cw->models[m])
                        return -ENOMEM;
                    cw->nmodels = m + 1;
                }
            } else if (strcmp(k, "kv_blocks") == 0) {
                if (get_u32(c, val, full, 0, UINT32_MAX, &cw->kv_blocks) < 0)
                    return KVG_ECONFIG;
            } else if (strcmp(k, "max_inflight") == 0) {
                if (get_u32(c, val, full, 0, 1000000, &cw->max_inflight) < 0)
                    return KVG_ECONFIG;
            } else if (strcmp(k, "cache_salt") == 0) {
                bool inject;
                if (get_bool(c, val, full, &inject) < 0)
                    return KVG_ECONFIG;
                cw->no_cache_salt = !inject;
            } else {
                return bad(c, full, "unknown key");
            }
        }
        if (!cw->name || !cw->url)
            return bad(c, key, "needs \"name\" and \"url\"");
    }
    return 0;
}

static int load_admin(cfg_ctx *c, kvg_config *cfg, const kvg_json *v)
{
    if (v->type != KVG_JSON_OBJECT)
        return bad(c, "admin", "must be an object");
    for (size_t i = 0; i < v->u.obj.count; i++) {
        const char *k = v->u.obj.keys[i];
        const kvg_json *val = v->u.obj.values[i];
        if (strcmp(k, "listen") == 0) {
            int rc = load_listeners(c, val, "admin.listen", cfg->admin_listeners,
                                    &cfg->nadmin_listeners);
            if (rc < 0)
                return rc;
        } else if (strcmp(k, "max_connections") == 0) {
            int rc =
                get_u32(c, val, "admin.max_connections", 1, 100000, &cfg->admin_max_connections);
            if (rc < 0)
                return rc;
        } else if (strcmp(k, "tokens") == 0) {
            if (val->type != KVG_JSON_ARRAY || val->u.arr.count > KVG_MAX_ADMIN_TOKENS)
                return bad(c, "admin.tokens", "must be an array of at most 16 strings");
            for (size_t j = 0; j < cfg->nadmin_tokens; j++)
                free(cfg->admin_tokens[j]);
            cfg->nadmin_tokens = 0;
            for (size_t j = 0; j < val->u.arr.count; j++) {
                const char *s;
                if (get_string(c, val->u.arr.items[j], "admin.tokens", &s) < 0)
                    return KVG_ECONFIG;
                if (strlen(s) < 16)
                    return bad(c, "admin.tokens", "tokens must be at least 16 characters");
                if (!(cfg->admin_tokens[j] = strdup(s)))
                    return -ENOMEM;
                cfg->nadmin_tokens = j + 1;
            }
        } else {
            char full[64];
            snprintf(full, sizeof(full), "admin.%s", k);
            return bad(c, full, "unknown key");
        }
    }
    return 0;
}

static int apply_json(cfg_ctx *c, kvg_config *cfg, const kvg_json *root)
{
    if (root->type != KVG_JSON_OBJECT)
        return bad(c, "config", "must be a JSON object");
    for (size_t i = 0; i < root->u.obj.count; i++) {
        const char *k = root->u.obj.keys[i];
        const kvg_json *v = root->u.obj.values[i];
        const char *s;
        int rc = 0;
        if (strcmp(k, "listen") == 0) {
            rc = load_listeners(c, v, "listen", cfg->listeners, &cfg->nlisteners);
        } else if (strcmp(k, "admin") == 0) {
            rc = load_admin(c, cfg, v);
        } else if (strcmp(k, "state_dir") == 0 || strcmp(k, "access_log") == 0 ||
                   strcmp(k, "state_file") == 0 || strcmp(k, "audit_log") == 0) {
            rc = get_string(c, v, k, &s);
            char **dst = strcmp(k, "state_dir") == 0    ? &cfg->state_dir
                         : strcmp(k, "access_log") == 0 ? &cfg->access_log
                         : strcmp(k, "state_file") == 0 ? &cfg->state_file
                                                        : &cfg->audit_log;
            if (rc == 0)
                rc = set_str(dst, s);
        } else if (strcmp(k, "auth") == 0) {
            rc = get_string(c, v, k, &s);
            if (rc == 0 && strcmp(s, "keys") != 0 && strcmp(s, "open") != 0)
                rc = bad(c, k, "must be \"keys\" (the default) or \"open\"");
            if (rc == 0)
                cfg->auth_open = strcmp(s, "open") == 0;
        } else if (strcmp(k, "secret") == 0) {
            rc = get_string(c, v, k, &s);
            if (rc == 0 && strlen(s) < 32)
                rc = bad(c, k, "must be at least 32 characters");
            if (rc == 0)
                rc = set_str(&cfg->secret, s);
        } else if (strcmp(k, "index_max_entries") == 0) {
            rc = get_u32(c, v, k, 0, 1u << 30, &cfg->index_max_entries);
        } else if (strcmp(k, "index_default_capacity") == 0) {
            rc = get_u32(c, v, k, 0, 1u << 30, &cfg->index_default_capacity);
        } else if (strcmp(k, "tenant_metrics_max") == 0) {
            rc = get_u32(c, v, k, 0, 100000, &cfg->tenant_metrics_max);
        } else if (strcmp(k, "threads") == 0) {
            rc = get_u32(c, v, k, 0, 1024, &cfg->threads);
        } else if (strcmp(k, "log_level") == 0) {
            rc = get_string(c, v, k, &s);
            if (rc == 0 && kvg_log_level_parse(s, &cfg->log_level) < 0)
                rc = bad(c, k, "must be error, warn, info or debug");
        } else if (strcmp(k, "worker_header") == 0) {
            rc = get_bool(c, v, k, &cfg->worker_header);
        } else if (strcmp(k, "shutdown_timeout_ms") == 0) {
            rc = get_u32(c, v, k, 0, 3600000, &cfg->shutdown_timeout_ms);
        } else if (strcmp(k, "limits") == 0) {
            rc = load_limits(c, &cfg->limits, v);
        } else if (strcmp(k, "upstream") == 0) {
            u32_field f[] = {
                {"connect_timeout_ms", &cfg->upstream.connect_timeout_ms, 10, 600000},
                {"response_timeout_ms", &cfg->upstream.response_timeout_ms, 10, 86400000},
                {"read_timeout_ms", &cfg->upstream.read_timeout_ms, 10, 86400000},
                {"max_idle_per_worker", &cfg->upstream.max_idle_per_worker, 0, 100000},
                {"idle_timeout_ms", &cfg->upstream.idle_timeout_ms, 100, 86400000},
                {"retries", &cfg->upstream.retries, 0, 16},
                {"max_inflight", &cfg->upstream.max_inflight, 1, 1000000},
            };
            rc = apply_u32_fields(c, v, k, f, KVG_ARRAY_LEN(f));
        } else if (strcmp(k, "health") == 0) {
            /* path is the one string in the section; take it out before the numbers. */
            const kvg_json *p = kvg_json_get(v, "path");
            if (p) {
                rc = get_string(c, p, "health.path", &s);
                if (rc == 0 &&
                    (s[0] != '/' || strlen(s) >= sizeof(cfg->health.path) || strpbrk(s, " \r\n\t")))
                    rc = bad(c, "health.path", "must be an absolute path without spaces");
                if (rc == 0)
                    snprintf(cfg->health.path, sizeof(cfg->health.path), "%s", s);
            }
            u32_field f[] = {
                {"interval_ms", &cfg->health.interval_ms, 100, 3600000},
                {"timeout_ms", &cfg->health.timeout_ms, 10, 600000},
                {"fall", &cfg->health.fall, 1, 100},
                {"rise", &cfg->health.rise, 1, 100},
            };
            for (size_t j = 0; rc == 0 && j < v->u.obj.count; j++) {
                if (strcmp(v->u.obj.keys[j], "path") == 0)
                    continue;
                size_t m;
                for (m = 0; m < KVG_ARRAY_LEN(f); m++)
                    if (strcmp(f[m].key, v->u.obj.keys[j]) == 0)
                        break;
                char full[96];
                snprintf(full, sizeof(full), "health.%s", v->u.obj.keys[j]);
                rc = m == KVG_ARRAY_LEN(f)
                         ? bad(c, full, "unknown key")
                         : get_u32(c, v->u.obj.values[j], full, f[m].min, f[m].max, f[m].dst);
            }
            if (rc == 0 && v->type != KVG_JSON_OBJECT)
                rc = bad(c, k, "must be an object");
        } else if (strcmp(k, "scrape") == 0) {
            rc = load_scrape(c, cfg, v);
        } else if (strcmp(k, "workers") == 0) {
            rc = load_workers(c, cfg, v);
        } else {
            rc = bad(c, k, "unknown key");
        }
        if (rc < 0)
            return rc;
    }
    return 0;
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
    } else {
        cfg_ctx c = {err, err_len};
        char inner[256] = "";
        c.err = inner;
        c.err_len = sizeof(inner);
        rc = apply_json(&c, cfg, root);
        if (rc < 0)
            snprintf(err, err_len, "%s: %s", path, inner);
        else if (set_str(&cfg->path, path) < 0)
            rc = -ENOMEM;
    }
    kvg_arena_done(&a);
    kvg_buf_done(&b);
    return rc;
}

/* ---- flags --------------------------------------------------------------------------------- */

void kvg_config_usage(FILE *out)
{
    fprintf(out,
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
            "      --access-log PATH      JSON access log: a file, '-' for stdout, 'off'\n"
            "      --log-level LEVEL      error, warn, info (default) or debug\n"
            "      --port-file FILE       write the bound ports here once listening\n"
            "      --check-config         validate the configuration and exit\n"
            "  -h, --help                 this text\n"
            "  -V, --version              print the version\n\n"
            "Environment: KVGATE_ADMIN_TOKEN sets the admin bearer token, KVGATE_SECRET the\n"
            "server secret that cache salts derive from (replicas must share it).\n"
            "Signals: SIGTERM/SIGINT drain and exit, SIGHUP reloads the config file.\n");
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
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

/* --worker NAME=URL[,model=M]...[,kv_blocks=N][,max_inflight=N][,cache_salt=on|off]: a whole
 * worker definition on the command line, so a config file is never needed. URLs never contain
 * commas. */
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
    kvg_config_worker *ws = realloc(cfg->workers, (cfg->nworkers + 1) * sizeof(*ws));
    if (!ws)
        return -ENOMEM;
    cfg->workers = ws;
    kvg_config_worker *w = &ws[cfg->nworkers];
    memset(w, 0, sizeof(*w));
    cfg->nworkers++;
    w->name = strndup(arg, (size_t)(eq - arg));
    const char *url = eq + 1;
    const char *comma = strchr(url, ',');
    w->url = strndup(url, comma ? (size_t)(comma - url) : strlen(url));
    if (!w->name || !w->url)
        return -ENOMEM;
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
        val++;
        size_t vlen = len - klen - 1;
        uint64_t n;
        if (klen == 5 && memcmp(item, "model", 5) == 0 && vlen > 0) {
            if (w->nmodels >= KVG_WORKER_MODELS_MAX) {
                snprintf(err, err_len, "--worker %s: too many models", w->name);
                return KVG_ECONFIG;
            }
            char **m = realloc(w->models, (w->nmodels + 2) * sizeof(char *));
            if (!m)
                return -ENOMEM;
            w->models = m;
            if (!(m[w->nmodels] = strndup(val, vlen)))
                return -ENOMEM;
            w->nmodels++;
        } else if (klen == 9 && memcmp(item, "kv_blocks", 9) == 0 &&
                   kvg_parse_u64(val, vlen, &n) == 0 && n <= UINT32_MAX) {
            w->kv_blocks = (uint32_t)n;
        } else if (klen == 12 && memcmp(item, "max_inflight", 12) == 0 &&
                   kvg_parse_u64(val, vlen, &n) == 0 && n >= 1 && n <= 1000000) {
            w->max_inflight = (uint32_t)n;
        } else if (klen == 10 && memcmp(item, "cache_salt", 10) == 0 &&
                   ((vlen == 2 && memcmp(val, "on", 2) == 0) ||
                    (vlen == 3 && memcmp(val, "off", 3) == 0))) {
            w->no_cache_salt = vlen == 3;
        } else {
            snprintf(err, err_len,
                     "--worker %s: bad option '%.*s' (want model=NAME, kv_blocks=N, "
                     "max_inflight=N, cache_salt=on|off)",
                     w->name, (int)len, item);
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
        for (size_t i = 0; i < *n; i++)
            listener_done(&ls[i]);
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
        case OPT_STATE:
            rc = set_str(&cfg->state_dir, optarg);
            break;
        case OPT_THREADS: {
            uint64_t v;
            if (kvg_parse_u64(optarg, strlen(optarg), &v) < 0 || v > 1024) {
                snprintf(err, err_len, "--threads wants 0..1024, got '%s'", optarg);
                rc = KVG_ECONFIG;
            } else {
                cfg->threads = (unsigned)v;
            }
            break;
        }
        case OPT_WORKER:
            /* Flag workers replace the file's list, like every other flag overrides it. */
            if (!flag_workers) {
                workers_done(cfg);
                flag_workers = true;
            }
            rc = add_flag_worker(cfg, optarg, err, err_len);
            break;
        case OPT_ACCESS_LOG:
            rc = set_str(&cfg->access_log, optarg);
            break;
        case OPT_LOG_LEVEL:
            if (kvg_log_level_parse(optarg, &cfg->log_level) < 0) {
                snprintf(err, err_len, "--log-level wants error, warn, info or debug");
                rc = KVG_ECONFIG;
            }
            break;
        case OPT_PORT_FILE:
            rc = set_str(&cfg->port_file, optarg);
            break;
        case OPT_TLS_CERT:
            tls_cert = optarg;
            break;
        case OPT_AUTH:
            if (strcmp(optarg, "keys") != 0 && strcmp(optarg, "open") != 0) {
                snprintf(err, err_len, "--auth wants keys or open");
                rc = KVG_ECONFIG;
            } else {
                cfg->auth_open = strcmp(optarg, "open") == 0;
            }
            break;
        case OPT_TLS_KEY:
            tls_key = optarg;
            break;
        default:
            snprintf(err, err_len, "unknown or incomplete option '%s' (see --help)",
                     argv[optind - 1]);
            rc = KVG_ECONFIG;
            break;
        }
    }
    if (rc == 0 && optind < argc) {
        snprintf(err, err_len, "unexpected argument '%s'", argv[optind]);
        rc = KVG_ECONFIG;
    }
    if (rc == 0 && (tls_cert || tls_key)) {
        for (size_t i = 0; rc == 0 && i < cfg->nlisteners; i++) {
            if (set_str(&cfg->listeners[i].tls_cert, tls_cert) < 0 ||
                set_str(&cfg->listeners[i].tls_key, tls_key) < 0)
                rc = -ENOMEM;
        }
    }
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
        const kvg_config_worker *w = &cfg->workers[i];
        kvg_worker_def def = {
            .name = w->name,
            .url = w->url,
            .models = (const char *const *)w->models,
            .nmodels = w->nmodels,
            .kv_blocks = w->kv_blocks,
            .max_inflight = w->max_inflight,
            .no_cache_salt = w->no_cache_salt,
        };
        char msg[200];
        if (kvg_worker_def_validate(&def, msg, sizeof(msg)) < 0) {
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
    return 0;
}

kvg_worker_def *kvg_config_worker_defs(const kvg_config *cfg)
{
    kvg_worker_def *defs = calloc(cfg->nworkers ? cfg->nworkers : 1, sizeof(*defs));
    if (!defs)
        return NULL;
    for (size_t i = 0; i < cfg->nworkers; i++) {
        const kvg_config_worker *w = &cfg->workers[i];
        defs[i] = (kvg_worker_def){
            .name = w->name,
            .url = w->url,
            .models = (const char *const *)w->models,
            .nmodels = w->nmodels,
            .kv_blocks = w->kv_blocks,
            .max_inflight = w->max_inflight,
            .no_cache_salt = w->no_cache_salt,
        };
    }
    return defs;
}
