/* SPDX-License-Identifier: Apache-2.0 */
/* Admin API entry point: lifecycle, routing of a request to its handler, error bodies, and
 * the serialisation and audit of changes. */
#include "admin_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#define PATH_MAX_LEN 2048
#define TENANT_LABEL_CAP_DEFAULT 100

/* ---- responses ------------------------------------------------------------------------------ */

static const char *error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

void kvg_admin_json(kvg_admin_response *resp, int status)
{
    resp->status = status;
    resp->content_type = CT_JSON;
    kvg_buf_reset(&resp->body);
}

static void verror(kvg_admin_response *resp, char *detail, int status, const char *fmt, va_list ap)
    KVG_PRINTF(4, 0);

static void verror(kvg_admin_response *resp, char *detail, int status, const char *fmt, va_list ap)
{
    char msg[512];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t len = n < 0 ? 0 : KVG_MIN((size_t)n, sizeof(msg) - 1);
    kvg_admin_json(resp, status);
    kvg_buf_puts(&resp->body, "{\"error\":{\"message\":");
    /* escaping replaces any UTF-8 sequence the truncation may have cut */
    kvg_buf_json_string(&resp->body, msg, len);
    kvg_buf_printf(&resp->body, ",\"type\":\"%s\",\"code\":%d}}", error_type(status), status);
    if (detail)
        snprintf(detail, ADMIN_DETAIL_MAX, "%.*s", (int)KVG_MIN(len, ADMIN_DETAIL_MAX - 1), msg);
}

void kvg_admin_error(kvg_admin_response *resp, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(resp, NULL, status, fmt, ap);
    va_end(ap);
}

void kvg_admin_fail(admin_ctx *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(c->resp, c->detail, status, fmt, ap);
    va_end(ap);
}

void kvg_admin_detail(admin_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->detail, sizeof(c->detail), fmt, ap);
    va_end(ap);
}

const char *kvg_admin_log_safe(const char *s, char *buf, size_t len)
{
    size_t i = 0;
    if (!s)
        s = "-";
    for (; s[i] && i + 1 < len; i++)
        buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    buf[i] = '\0';
    return buf;
}

void kvg_admin_response_done(kvg_admin_response *resp)
{
    if (!resp)
        return;
    /* The key-creation answer carries a key: leave no copy of it in freed memory. */
    if (resp->cache_control && resp->body.data)
        OPENSSL_cleanse(resp->body.data, resp->body.cap);
    kvg_buf_done(&resp->body);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int kvg_admin_new(const kvg_admin_config *cfg, kvg_registry *reg, kvg_admin **out)
{
    int rc;
    if (!cfg || !reg || !out || cfg->secret_len > sizeof(((kvg_admin *)0)->secret))
        return -EINVAL;
    kvg_admin *admin = calloc(1, sizeof(*admin));
    if (!admin)
        return -ENOMEM;
    admin->reg = reg;
    admin->tenants = cfg->tenants;
    admin->policy = cfg->policy;
    admin->tenant_label_cap =
        cfg->tenant_label_cap ? cfg->tenant_label_cap : TENANT_LABEL_CAP_DEFAULT;
    admin->router = cfg->router;
    admin->ready_without_workers = cfg->ready_without_workers;
    admin->models = cfg->models;
    admin->redis = cfg->redis;
    admin->engine_load_max_age_ns = cfg->engine_load_max_age_ns;
    admin->redis_sync_interval_ms =
        cfg->redis_sync_interval_ms ? cfg->redis_sync_interval_ms : 1000;
    admin->redis_timeout_ms = cfg->redis_timeout_ms ? cfg->redis_timeout_ms : 1000;
    if (cfg->secret_len)
        memcpy(admin->secret, cfg->secret, cfg->secret_len);
    admin->secret_len = cfg->secret_len;
    rc = kvg_admin_digest_tokens(cfg->tokens, cfg->ntokens, &admin->digests);
    if (rc < 0)
        goto fail_admin;
    admin->ndigests = cfg->ntokens;
    rc = -ENOMEM;
    if (cfg->state_path && !(admin->state_path = strdup(cfg->state_path)))
        goto fail_paths;
    if (cfg->audit_path && !(admin->audit_path = strdup(cfg->audit_path)))
        goto fail_paths;
    if (admin->audit_path) {
        /* Fail at start-up rather than at the first change. */
        int fd = open(admin->audit_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
            rc = -errno;
            goto fail_paths;
        }
        close(fd);
    }
    rc = -pthread_mutex_init(&admin->lock, NULL);
    if (rc < 0)
        goto fail_paths;
    rc = -pthread_mutex_init(&admin->change_lock, NULL);
    if (rc < 0)
        goto fail_lock;
    *out = admin;
    return 0;

fail_lock:
    pthread_mutex_destroy(&admin->lock);
fail_paths:
    free(admin->audit_path);
    free(admin->state_path);
    kvg_admin_free_digests(admin->digests, admin->ndigests);
fail_admin:
    free(admin);
    return rc;
}

void kvg_admin_free(kvg_admin *admin)
{
    if (!admin)
        return;
    kvg_admin_shared_free(admin->shared); /* its thread applies changes: first */
    OPENSSL_cleanse(admin->secret, sizeof(admin->secret));
    kvg_admin_free_digests(admin->digests, admin->ndigests);
    kvg_admin_free_digests(admin->metrics_digests, admin->nmetrics_digests);
    pthread_mutex_destroy(&admin->change_lock);
    pthread_mutex_destroy(&admin->lock);
    free(admin->audit_path);
    free(admin->state_path);
    free(admin);
}

int kvg_admin_replace_digests(kvg_admin *admin, unsigned char (**slot)[ADMIN_DIGEST_LEN],
                              size_t *nslot, const char *const *tokens, size_t ntokens)
{
    unsigned char(*digests)[ADMIN_DIGEST_LEN] = NULL;
    if (ntokens > 0) {
        int rc = kvg_admin_digest_tokens(tokens, ntokens, &digests);
        if (rc < 0)
            return rc;
    }
    pthread_mutex_lock(&admin->lock);
    unsigned char(*old)[ADMIN_DIGEST_LEN] = *slot;
    size_t nold = *nslot;
    *slot = digests;
    *nslot = ntokens;
    pthread_mutex_unlock(&admin->lock);
    kvg_admin_free_digests(old, nold);
    return 0;
}

int kvg_admin_set_tokens(kvg_admin *admin, const char *const *tokens, size_t ntokens)
{
    if (ntokens == 0)
        return -EINVAL; /* the admin API always has a token (metrics tokens may be none) */
    return kvg_admin_replace_digests(admin, &admin->digests, &admin->ndigests, tokens, ntokens);
}

int kvg_admin_add_metrics(kvg_admin *admin, kvg_admin_metrics_fn fn, void *ud)
{
    int rc = 0;
    if (!fn)
        return -EINVAL;
    pthread_mutex_lock(&admin->lock);
    if (admin->nwriters == ADMIN_WRITERS_MAX)
        rc = KVG_ELIMIT;
    else
        admin->writers[admin->nwriters++] = (admin_writer){.fn = fn, .ud = ud};
    pthread_mutex_unlock(&admin->lock);
    return rc;
}

void kvg_admin_set_live(kvg_admin *admin, kvg_admin_live_fn fn, void *ud)
{
    pthread_mutex_lock(&admin->lock);
    admin->live = fn;
    admin->live_ud = ud;
    pthread_mutex_unlock(&admin->lock);
}

void kvg_admin_set_ready(kvg_admin *admin, kvg_admin_ready_fn fn, void *ud)
{
    pthread_mutex_lock(&admin->lock);
    admin->ready = fn;
    admin->ready_ud = ud;
    pthread_mutex_unlock(&admin->lock);
}

/* ---- routing ------------------------------------------------------------------------------ */

/* What a route needs: a token (all but the probes), and the parts of the gateway its handler
 * uses; where the admin was made without one, the route does not exist (404). */
enum {
    NEED_AUTH = 1u << 0,
    NEED_TENANTS = 1u << 1,
    NEED_POLICY = 1u << 2,
    NEED_ROUTER = 1u << 3,
    NEED_MODELS = 1u << 4,
};

/* What a route does with the request body. */
typedef enum admin_body {
    BODY_NONE = 0, /* not looked at */
    BODY_OBJECT,   /* a JSON object, required (c->body) */
    BODY_EMPTY,    /* none, or {}: anything else is a 400 naming the field */
    BODY_COUNT,
} admin_body;

typedef struct admin_route {
    const char *pattern;
    const char *method;
    void (*handler)(admin_ctx *c);
    const char *action; /* the audit action of a change; NULL for a read */
    unsigned needs;     /* NEED_* */
    admin_body body;
} admin_route;

/*
 * Every route, one row per method. A pattern is literal segments and parameters: {name} a
 * worker's name, {id} a tenant's id, {key} a key id; a parameter matches any non-empty segment,
 * checked once the request is authenticated. What follows from the rows: a path that matches
 * some row's pattern exists (a row whose needs the admin lacks does not count), its other
 * methods answer 405 with the Allow header listing the pattern's methods in table order, a row
 * with an audit action is a change (serialised, saved, audited), and every route that needs the
 * tenant store answers "Cache-Control: no-store" (a tenant's routes hand out keys). A row takes
 * two lines, aligned, so that the table reads by its columns (clang-format would fill them).
 */
/* clang-format off */
static const admin_route routes[] = {
    {"/healthz",                          "GET",    kvg_admin_healthz,
     NULL,            0,                                     BODY_NONE},
    {"/readyz",                           "GET",    kvg_admin_readyz,
     NULL,            0,                                     BODY_NONE},
    {"/metrics",                          "GET",    kvg_admin_metrics,
     NULL,            NEED_AUTH,                             BODY_NONE},
    {"/admin/v1/workers",                 "GET",    kvg_admin_workers_list,
     NULL,            NEED_AUTH,                             BODY_NONE},
    {"/admin/v1/workers/{name}",          "GET",    kvg_admin_worker_get,
     NULL,            NEED_AUTH,                             BODY_NONE},
    {"/admin/v1/workers/{name}",          "PUT",    kvg_admin_worker_put,
     "worker.put",    NEED_AUTH,                             BODY_OBJECT},
    {"/admin/v1/workers/{name}",          "DELETE", kvg_admin_worker_delete,
     "worker.delete", NEED_AUTH,                             BODY_NONE},
    {"/admin/v1/workers/{name}/drain",    "POST",   kvg_admin_worker_drain,
     "worker.drain",  NEED_AUTH,                             BODY_NONE},
    {"/admin/v1/models",                  "GET",    kvg_admin_models_list,
     NULL,            NEED_AUTH | NEED_MODELS,               BODY_NONE},
    {"/admin/v1/models/{model}",          "GET",    kvg_admin_model_get,
     NULL,            NEED_AUTH | NEED_MODELS,               BODY_NONE},
    {"/admin/v1/models/{model}",          "PUT",    kvg_admin_model_put,
     "model.put",     NEED_AUTH | NEED_MODELS,               BODY_OBJECT},
    {"/admin/v1/models/{model}",          "DELETE", kvg_admin_model_delete,
     "model.delete",  NEED_AUTH | NEED_MODELS,               BODY_NONE},
    {"/admin/v1/tenants",                 "GET",    kvg_admin_tenants_list,
     NULL,            NEED_AUTH | NEED_TENANTS,              BODY_NONE},
    {"/admin/v1/tenants/{id}",            "GET",    kvg_admin_tenant_get,
     NULL,            NEED_AUTH | NEED_TENANTS,              BODY_NONE},
    {"/admin/v1/tenants/{id}",            "PUT",    kvg_admin_tenant_put,
     "tenant.put",    NEED_AUTH | NEED_TENANTS,              BODY_OBJECT},
    {"/admin/v1/tenants/{id}",            "DELETE", kvg_admin_tenant_delete,
     "tenant.delete", NEED_AUTH | NEED_TENANTS,              BODY_NONE},
    {"/admin/v1/tenants/{id}/keys",       "POST",   kvg_admin_key_create,
     "key.create",    NEED_AUTH | NEED_TENANTS,              BODY_EMPTY},
    {"/admin/v1/tenants/{id}/keys/{key}", "DELETE", kvg_admin_key_delete,
     "key.delete",    NEED_AUTH | NEED_TENANTS,              BODY_NONE},
    {"/admin/v1/policy",                  "GET",    kvg_admin_policy_get,
     NULL,            NEED_AUTH | NEED_POLICY,               BODY_NONE},
    {"/admin/v1/policy",                  "PUT",    kvg_admin_policy_put,
     "policy.put",    NEED_AUTH | NEED_POLICY,               BODY_OBJECT},
    {"/admin/v1/route/explain",           "POST",   kvg_admin_route_explain,
     NULL,            NEED_AUTH | NEED_POLICY | NEED_ROUTER, BODY_OBJECT},
};
/* clang-format on */

#define ROUTE_COUNT KVG_ARRAY_LEN(routes)
#define ROUTE_PARAMS_MAX 2
#define ALLOW_MAX 32

/* The Allow header of each row's pattern, built once from the rows. */
static char route_allow[ROUTE_COUNT][ALLOW_MAX];
static pthread_once_t allow_once = PTHREAD_ONCE_INIT;

static void build_allow(void)
{
    for (size_t i = 0; i < ROUTE_COUNT; i++) {
        size_t o = 0;
        for (size_t j = 0; j < ROUTE_COUNT; j++) {
            if (strcmp(routes[j].pattern, routes[i].pattern) != 0)
                continue;
            int n = snprintf(route_allow[i] + o, ALLOW_MAX - o, "%s%s", o ? ", " : "",
                             routes[j].method);
            assert(n > 0 && (size_t)n < ALLOW_MAX - o); /* the table's methods fit */
            o += (size_t)n;
        }
    }
}

/* A piece of the path between slashes, and the pattern's parameter it stands for. */
typedef struct seg {
    const char *p;
    size_t len;
    const char *param; /* where "{name}", "{id}" or "{key}" starts in the pattern */
} seg;

static bool param_is(seg s, const char *lit)
{
    return strncmp(s.param, lit, strlen(lit)) == 0;
}

/* Match the path (query already cut off) against a pattern; params receive its parameters. */
static bool match(const char *pattern, const char *p, size_t len, seg *params, size_t *nparams)
{
    const char *end = p + len;
    *nparams = 0;
    while (*pattern) {
        /* Both are at a '/' here: patterns are absolute, and a segment ends at one. */
        if (p == end || *p != '/')
            return false;
        pattern++;
        p++;
        const char *pend = strchrnul(pattern, '/');
        const char *slash = memchr(p, '/', (size_t)(end - p));
        size_t n = (size_t)((slash ? slash : end) - p), plen = (size_t)(pend - pattern);
        if (*pattern == '{') {
            if (n == 0 || *nparams == ROUTE_PARAMS_MAX)
                return false;
            params[(*nparams)++] = (seg){p, n, pattern};
        } else if (n != plen || memcmp(p, pattern, n) != 0) {
            return false;
        }
        pattern = pend;
        p += n;
    }
    return p == end;
}

/* The first row whose pattern the path matches, among those the admin can serve; NULL when
 * the path does not exist here. */
static const admin_route *find_path(const kvg_admin *admin, const char *path, size_t len,
                                    seg *params, size_t *nparams)
{
    unsigned have = NEED_AUTH | (admin->tenants ? NEED_TENANTS : 0) |
                    (admin->policy ? NEED_POLICY : 0) | (admin->router ? NEED_ROUTER : 0) |
                    (admin->models ? NEED_MODELS : 0);
    if (len > PATH_MAX_LEN)
        return NULL;
    for (size_t i = 0; i < ROUTE_COUNT; i++)
        if ((routes[i].needs & ~have) == 0 && match(routes[i].pattern, path, len, params, nparams))
            return &routes[i];
    return NULL;
}

/* The row of the path's pattern for this method, or NULL. */
static const admin_route *find_method(const admin_route *r, const char *method)
{
    for (size_t i = (size_t)(r - routes); i < ROUTE_COUNT; i++)
        if (strcmp(routes[i].pattern, r->pattern) == 0 && strcmp(routes[i].method, method) == 0)
            return &routes[i];
    return NULL;
}

/* Copy a validated worker name ({name}) or tenant id ({id}) from the path into out
 * (NUL-terminated); false after answering. */
static bool take_name(admin_ctx *c, seg s, char *out)
{
    char why[160];
    bool worker = param_is(s, "{name}");
    const char *what = worker ? "name" : "id";
    size_t max = worker ? KVG_WORKER_NAME_MAX : KVG_TENANT_ID_MAX;
    if (s.len > max) {
        kvg_admin_fail(c, 400, "%s: longer than %zu characters", what, max);
        return false;
    }
    memcpy(out, s.p, s.len);
    out[s.len] = '\0';
    int rc = worker ? kvg_worker_name_validate(out, why, sizeof(why))
                    : kvg_tenant_id_validate(out, what, why, sizeof(why));
    if (rc < 0) {
        kvg_admin_fail(c, 400, "%s", why);
        return false;
    }
    return true;
}

static int hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* A model's name ({model}) from the path: percent-decoded, since model names hold slashes
 * ("Qwen/Qwen3-8B", sent as "Qwen%2FQwen3-8B"), then checked by the definition's rule
 * (1..256 bytes, no control characters); false after answering. */
static bool take_model_name(admin_ctx *c, seg s, char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < s.len; i++) {
        char ch = s.p[i];
        if (ch == '%') {
            int d1 = i + 1 < s.len ? hex_digit(s.p[i + 1]) : -1;
            int d2 = i + 2 < s.len ? hex_digit(s.p[i + 2]) : -1;
            if (d1 < 0 || d2 < 0) {
                kvg_admin_fail(c, 400, "name: invalid percent-encoding in the path");
                return false;
            }
            ch = (char)(d1 << 4 | d2);
            i += 2;
        }
        if (n == KVG_MODEL_DEF_NAME_MAX) {
            kvg_admin_fail(c, 400, "name: longer than %d bytes", KVG_MODEL_DEF_NAME_MAX);
            return false;
        }
        if ((unsigned char)ch < 0x20 || ch == 0x7f) {
            kvg_admin_fail(c, 400, "name: must not contain control characters");
            return false;
        }
        out[n++] = ch;
    }
    out[n] = '\0';
    return true;
}

/* Key ids are generated ("k" + 15 of [a-z0-9]); anything else in the path is not one. */
static bool take_key_id(admin_ctx *c, seg s, char *out)
{
    if (s.len > KVG_KEY_ID_LEN) {
        kvg_admin_fail(c, 400, "key id: longer than %d characters", KVG_KEY_ID_LEN);
        return false;
    }
    for (size_t i = 0; i < s.len; i++) {
        char ch = s.p[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'))) {
            kvg_admin_fail(c, 400, "key id: invalid character; key ids are [a-z0-9]");
            return false;
        }
    }
    memcpy(out, s.p, s.len);
    out[s.len] = '\0';
    return true;
}

/* The audit target: the path's parameters as given (validated or not), "tenant/key id" for a
 * key; a route without any is named by its last segment ("policy"). */
static void set_target(admin_ctx *c, const admin_route *r, const seg *params, size_t n)
{
    if (n == 0)
        snprintf(c->target, sizeof(c->target), "%s", strrchr(r->pattern, '/') + 1);
    else if (n == 1)
        snprintf(c->target, sizeof(c->target), "%.*s", (int)KVG_MIN(params[0].len, 128),
                 params[0].p);
    else
        snprintf(c->target, sizeof(c->target), "%.*s/%.*s", (int)KVG_MIN(params[0].len, 96),
                 params[0].p, (int)KVG_MIN(params[1].len, 32), params[1].p);
}

/* A key-creation body carries nothing (absent or {}): a table without fields, so that a member
 * is named as any unknown field is. */
static const kvg_fields no_fields = {"nothing", NULL, 0, NULL};

/* Everything between the method check and the handler: the body's size, the names in the path,
 * the body as the route takes it. Answers itself when it returns false. */
static bool check_request(admin_ctx *c, const admin_route *r, const seg *params, size_t n)
{
    const kvg_admin_request *req = c->req;
    if (req->body_len > KVG_ADMIN_BODY_MAX) {
        kvg_admin_fail(c, 413, "request body larger than %d bytes", KVG_ADMIN_BODY_MAX);
        return false;
    }
    if (req->body_len && !req->body) {
        kvg_admin_fail(c, 400, "malformed request");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        bool ok = param_is(params[i], "{key}")     ? take_key_id(c, params[i], c->key_id)
                  : param_is(params[i], "{model}") ? take_model_name(c, params[i], c->model)
                                                   : take_name(c, params[i], c->name);
        if (!ok)
            return false;
    }
    switch (r->body) {
    case BODY_OBJECT:
        c->body = kvg_admin_parse_body(c, false);
        return c->body != NULL;
    case BODY_EMPTY:
        c->body = kvg_admin_parse_body(c, true);
        return c->body && kvg_admin_decode(c, &no_fields, NULL);
    default:
        return true;
    }
}

/* One attempt of a change: the resource as it is before, for the audit line, then the
 * change. */
static void run_change(admin_ctx *c, const admin_route *r)
{
    kvg_buf_reset(&c->before);
    kvg_admin_audit_resource(c, &c->before);
    r->handler(c);
}

/* A change to a shared state: made on the latest state Redis has, and made again on top of
 * whatever another replica committed in between (each attempt's handler starts from the
 * state in memory, which the conflict replaced), so that no replica's edit is lost. A key
 * creation thus answers with the key that was finally committed. */
static void run_shared_change(admin_ctx *c, const admin_route *r)
{
    char why[320], target[ADMIN_TARGET_MAX];
    kvg_admin *admin = c->admin;
    if (kvg_admin_shared_refresh(admin, why, sizeof(why)) < 0) {
        kvg_log_error("admin: %s not applied: %s", c->action, why);
        kvg_admin_fail(c, 503, "the change was not applied: %s", why);
        return;
    }
    memcpy(target, c->target, sizeof(target));
    for (unsigned attempt = 1;; attempt++) {
        c->again = false;
        run_change(c, r);
        if (!c->again)
            return;
        if (attempt == ADMIN_CHANGE_ATTEMPTS) {
            kvg_log_warn("admin: %s not applied: the shared state changed under it %u times",
                         c->action, attempt);
            kvg_admin_fail(c, 503,
                           "the change was not applied: other replicas kept changing the shared "
                           "state (%u attempts); try again",
                           attempt);
            return;
        }
        memcpy(c->target, target, sizeof(target));
        c->detail[0] = '\0';
        kvg_admin_json(c->resp, 500);
        /* Two replicas that collided would collide again in step: part them a little. */
        uint32_t jitter = 0;
        kvg_random_bytes(&jitter, sizeof(jitter));
        usleep((useconds_t)(jitter % (500u * KVG_MIN(attempt, 8u))));
    }
}

static void handle(admin_ctx *c)
{
    const kvg_admin_request *req = c->req;
    kvg_admin_response *resp = c->resp;
    kvg_admin *admin = c->admin;
    if (!req->method || !req->path) {
        kvg_admin_error(resp, 400, "malformed request");
        return;
    }
    const char *q = strchr(req->path, '?');
    size_t plen = q ? (size_t)(q - req->path) : strlen(req->path);
    seg params[ROUTE_PARAMS_MAX];
    size_t nparams = 0;
    const admin_route *path = find_path(admin, req->path, plen, params, &nparams);

    /* Probes answer anyone: orchestrators call them without credentials. */
    if ((!path || (path->needs & NEED_AUTH)) && !kvg_admin_authorize(c))
        return;
    if (plen > PATH_MAX_LEN) {
        kvg_admin_error(resp, 414, "path longer than %d bytes", PATH_MAX_LEN);
        return;
    }
    if (!path) {
        kvg_admin_error(resp, 404, "no such endpoint");
        return;
    }
    const admin_route *r = find_method(path, req->method);
    if (!r) {
        char m[16];
        pthread_once(&allow_once, build_allow);
        resp->allow = route_allow[path - routes];
        kvg_admin_error(resp, 405, "method %s not allowed here; allowed: %s",
                        kvg_admin_log_safe(req->method, m, sizeof(m)), resp->allow);
        return;
    }

    /* A change: serialised with every other one up to its audit line (kvg_admin_handle writes
     * it), which names the target as the path does, validated or not. */
    c->action = r->action;
    set_target(c, r, params, nparams);
    if (c->action)
        pthread_mutex_lock(&admin->change_lock);
    if (check_request(c, r, params, nparams)) {
        if (c->action && admin->shared)
            run_shared_change(c, r);
        else if (c->action)
            run_change(c, r);
        else
            r->handler(c);
        /* after only where before was taken: not when the shared state could not be read */
        if (c->action && (c->before.len || c->before.failed))
            kvg_admin_audit_resource(c, &c->after);
    }
    if (r->needs & NEED_TENANTS)
        resp->cache_control = "no-store";
}

static void response_init(kvg_admin_response *resp)
{
    resp->status = 500;
    resp->content_type = CT_JSON;
    resp->allow = NULL;
    resp->www_authenticate = NULL;
    resp->cache_control = NULL;
    kvg_buf_init(&resp->body);
}

bool kvg_admin_preauthorize(kvg_admin *admin, const kvg_admin_request *req,
                            kvg_admin_response *resp)
{
    /* What handle() does up to its authentication, on the same route table. */
    if (!req->method || !req->path)
        return true; /* handle() answers 400 */
    const char *q = strchr(req->path, '?');
    size_t plen = q ? (size_t)(q - req->path) : strlen(req->path);
    seg params[ROUTE_PARAMS_MAX];
    size_t nparams;
    const admin_route *path = find_path(admin, req->path, plen, params, &nparams);
    if (path && !(path->needs & NEED_AUTH))
        return true;
    char remote[64];
    kvg_admin_response out;
    response_init(&out);
    admin_ctx c = {
        .admin = admin,
        .req = req,
        .resp = &out,
        .remote = kvg_admin_log_safe(req->remote, remote, sizeof(remote)),
    };
    if (kvg_admin_authorize(&c)) {
        kvg_admin_response_done(&out);
        return true;
    }
    *resp = out;
    return false;
}

void kvg_admin_handle(kvg_admin *admin, const kvg_admin_request *req, kvg_admin_response *resp)
{
    char remote[64];
    response_init(resp);
    admin_ctx c = {
        .admin = admin,
        .req = req,
        .resp = resp,
        .remote = kvg_admin_log_safe(req->remote, remote, sizeof(remote)),
    };
    kvg_arena_init(&c.arena, 0);
    handle(&c);
    kvg_arena_done(&c.arena);
    if (resp->body.failed) {
        /* Out of memory while writing the body: send a short error instead of half a body. */
        if (resp->body.data)
            OPENSSL_cleanse(resp->body.data, resp->body.cap);
        kvg_buf_done(&resp->body);
        resp->status = 500;
        resp->content_type = CT_JSON;
        resp->allow = NULL;
        resp->www_authenticate = NULL;
        kvg_buf_puts(&resp->body, "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"code\":500}}");
        if (resp->body.failed)
            kvg_buf_done(&resp->body);
        snprintf(c.detail, sizeof(c.detail), "out of memory");
    }
    if (c.action) {
        kvg_admin_audit(&c);
        pthread_mutex_unlock(&admin->change_lock);
    }
    kvg_buf_done(&c.before);
    kvg_buf_done(&c.after);
}
