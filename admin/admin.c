/* SPDX-License-Identifier: Apache-2.0 */
/* Admin API entry point: lifecycle, routing of a request to its handler, error bodies, and
 * the serialisation and audit of changes. */
#include "admin_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#define PATH_MAX_LEN 2048
#define WORKERS_PATH "/admin/v1/workers"
#define TENANTS_PATH "/admin/v1/tenants"
#define POLICY_PATH "/admin/v1/policy"
#define EXPLAIN_PATH "/admin/v1/route/explain"
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
    admin->engine_load_max_age_ns = cfg->engine_load_max_age_ns;
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
    OPENSSL_cleanse(admin->secret, sizeof(admin->secret));
    kvg_admin_free_digests(admin->digests, admin->ndigests);
    pthread_mutex_destroy(&admin->change_lock);
    pthread_mutex_destroy(&admin->lock);
    free(admin->audit_path);
    free(admin->state_path);
    free(admin);
}

int kvg_admin_set_tokens(kvg_admin *admin, const char *const *tokens, size_t ntokens)
{
    unsigned char(*digests)[ADMIN_DIGEST_LEN];
    int rc = kvg_admin_digest_tokens(tokens, ntokens, &digests);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&admin->lock);
    unsigned char(*old)[ADMIN_DIGEST_LEN] = admin->digests;
    size_t nold = admin->ndigests;
    admin->digests = digests;
    admin->ndigests = ntokens;
    pthread_mutex_unlock(&admin->lock);
    kvg_admin_free_digests(old, nold);
    return 0;
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

void kvg_admin_set_ready(kvg_admin *admin, kvg_admin_ready_fn fn, void *ud)
{
    pthread_mutex_lock(&admin->lock);
    admin->ready = fn;
    admin->ready_ud = ud;
    pthread_mutex_unlock(&admin->lock);
}

/* ---- routing ------------------------------------------------------------------------------ */

typedef enum route {
    ROUTE_NONE = 0,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
    ROUTE_METRICS,
    ROUTE_WORKERS,
    ROUTE_WORKER,
    ROUTE_WORKER_DRAIN,
    ROUTE_TENANTS,
    ROUTE_TENANT,
    ROUTE_TENANT_KEYS,
    ROUTE_TENANT_KEY,
    ROUTE_POLICY,
    ROUTE_EXPLAIN,
    ROUTE_COUNT,
} route;

/* Methods each route accepts, as the Allow header spells them. */
static const char *const route_allow[ROUTE_COUNT] = {
    [ROUTE_HEALTHZ] = "GET",
    [ROUTE_READYZ] = "GET",
    [ROUTE_METRICS] = "GET",
    [ROUTE_WORKERS] = "GET",
    [ROUTE_WORKER] = "GET, PUT, DELETE",
    [ROUTE_WORKER_DRAIN] = "POST",
    [ROUTE_TENANTS] = "GET",
    [ROUTE_TENANT] = "GET, PUT, DELETE",
    [ROUTE_TENANT_KEYS] = "POST",
    [ROUTE_TENANT_KEY] = "DELETE",
    [ROUTE_POLICY] = "GET, PUT",
    [ROUTE_EXPLAIN] = "POST",
};

/* A piece of the path between slashes. */
typedef struct seg {
    const char *p;
    size_t len;
} seg;

static bool path_is(const char *p, size_t len, const char *lit)
{
    return len == strlen(lit) && memcmp(p, lit, len) == 0;
}

/* Split what follows "<collection>/" into at most max segments; false when there are more. */
static bool split(const char *p, const char *end, seg *segs, size_t max, size_t *n)
{
    *n = 0;
    for (;;) {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        if (*n == max)
            return false;
        segs[(*n)++] = (seg){p, (size_t)((slash ? slash : end) - p)};
        if (!slash)
            return true;
        p = slash + 1;
    }
}

static bool has_prefix(const char *p, size_t len, const char *prefix, size_t plen)
{
    return len > plen && memcmp(p, prefix, plen) == 0;
}

/* Match the path (query already cut off); segs receive the names in it (id, key id). */
static route match(const char *p, size_t len, seg segs[2])
{
    static const char workers[] = WORKERS_PATH "/";
    static const char tenants[] = TENANTS_PATH "/";
    const char *end = p + len;
    seg s[3];
    size_t n;
    if (path_is(p, len, "/healthz"))
        return ROUTE_HEALTHZ;
    if (path_is(p, len, "/readyz"))
        return ROUTE_READYZ;
    if (path_is(p, len, "/metrics"))
        return ROUTE_METRICS;
    if (path_is(p, len, WORKERS_PATH))
        return ROUTE_WORKERS;
    if (path_is(p, len, TENANTS_PATH))
        return ROUTE_TENANTS;
    if (path_is(p, len, POLICY_PATH))
        return ROUTE_POLICY;
    if (path_is(p, len, EXPLAIN_PATH))
        return ROUTE_EXPLAIN;
    if (has_prefix(p, len, workers, sizeof(workers) - 1)) {
        if (!split(p + sizeof(workers) - 1, end, s, 2, &n))
            return ROUTE_NONE;
        segs[0] = s[0];
        if (n == 1)
            return ROUTE_WORKER; /* an empty name answers 404 once authenticated */
        if (s[0].len && path_is(s[1].p, s[1].len, "drain"))
            return ROUTE_WORKER_DRAIN;
        return ROUTE_NONE;
    }
    if (has_prefix(p, len, tenants, sizeof(tenants) - 1)) {
        if (!split(p + sizeof(tenants) - 1, end, s, 3, &n))
            return ROUTE_NONE;
        segs[0] = s[0];
        if (n == 1)
            return ROUTE_TENANT;
        if (!s[0].len || !path_is(s[1].p, s[1].len, "keys"))
            return ROUTE_NONE;
        if (n == 2)
            return ROUTE_TENANT_KEYS;
        segs[1] = s[2];
        return s[2].len ? ROUTE_TENANT_KEY : ROUTE_NONE;
    }
    return ROUTE_NONE;
}

static bool method_allowed(route r, const char *method)
{
    switch (r) {
    case ROUTE_WORKER:
    case ROUTE_TENANT:
        return strcmp(method, "GET") == 0 || strcmp(method, "PUT") == 0 ||
               strcmp(method, "DELETE") == 0;
    case ROUTE_WORKER_DRAIN:
    case ROUTE_TENANT_KEYS:
    case ROUTE_EXPLAIN:
        return strcmp(method, "POST") == 0;
    case ROUTE_TENANT_KEY:
        return strcmp(method, "DELETE") == 0;
    case ROUTE_POLICY:
        return strcmp(method, "GET") == 0 || strcmp(method, "PUT") == 0;
    default:
        return strcmp(method, "GET") == 0;
    }
}

/* The audit action of a request that changes something, or NULL for a read. */
static const char *change_action(route r, const char *method)
{
    bool put = strcmp(method, "PUT") == 0, del = strcmp(method, "DELETE") == 0;
    switch (r) {
    case ROUTE_WORKER:
        return put ? "worker.put" : del ? "worker.delete" : NULL;
    case ROUTE_WORKER_DRAIN:
        return "worker.drain";
    case ROUTE_TENANT:
        return put ? "tenant.put" : del ? "tenant.delete" : NULL;
    case ROUTE_TENANT_KEYS:
        return "key.create";
    case ROUTE_TENANT_KEY:
        return "key.delete";
    case ROUTE_POLICY:
        return put ? "policy.put" : NULL;
    default:
        return NULL;
    }
}

static bool is_tenant_route(route r)
{
    return r == ROUTE_TENANTS || r == ROUTE_TENANT || r == ROUTE_TENANT_KEYS ||
           r == ROUTE_TENANT_KEY;
}

static void dispatch(admin_ctx *c, route r, const char *name, const char *key_id)
{
    const char *m = c->req->method;
    switch (r) {
    case ROUTE_HEALTHZ:
        kvg_admin_healthz(c);
        break;
    case ROUTE_READYZ:
        kvg_admin_readyz(c);
        break;
    case ROUTE_METRICS:
        kvg_admin_metrics(c);
        break;
    case ROUTE_WORKERS:
        kvg_admin_workers_list(c);
        break;
    case ROUTE_WORKER:
        if (strcmp(m, "GET") == 0)
            kvg_admin_worker_get(c, name);
        else if (strcmp(m, "PUT") == 0)
            kvg_admin_worker_put(c, name);
        else
            kvg_admin_worker_delete(c, name);
        break;
    case ROUTE_WORKER_DRAIN:
        kvg_admin_worker_drain(c, name);
        break;
    case ROUTE_TENANTS:
        kvg_admin_tenants_list(c);
        break;
    case ROUTE_TENANT:
        if (strcmp(m, "GET") == 0)
            kvg_admin_tenant_get(c, name);
        else if (strcmp(m, "PUT") == 0)
            kvg_admin_tenant_put(c, name);
        else
            kvg_admin_tenant_delete(c, name);
        break;
    case ROUTE_TENANT_KEYS:
        kvg_admin_key_create(c, name);
        break;
    case ROUTE_TENANT_KEY:
        kvg_admin_key_delete(c, name, key_id);
        break;
    case ROUTE_POLICY:
        if (strcmp(m, "GET") == 0)
            kvg_admin_policy_get(c);
        else
            kvg_admin_policy_put(c);
        break;
    case ROUTE_EXPLAIN:
        kvg_admin_route_explain(c);
        break;
    default:
        kvg_admin_fail(c, 404, "not found");
        break;
    }
}

/* Copy a validated worker name (worker) or tenant id from the path into out (NUL-terminated);
 * false after answering. */
static bool take_name(admin_ctx *c, seg s, bool worker, char *out)
{
    char why[160];
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

/* Everything between authentication and the handler; answers itself when it returns false. */
static bool check_request(admin_ctx *c, route r, const seg segs[2], char *name, char *key_id)
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
    switch (r) {
    case ROUTE_WORKER:
    case ROUTE_WORKER_DRAIN:
        if (segs[0].len == 0) {
            kvg_admin_fail(c, 404, "no such endpoint");
            return false;
        }
        return take_name(c, segs[0], true, name);
    case ROUTE_TENANT:
    case ROUTE_TENANT_KEYS:
    case ROUTE_TENANT_KEY:
        if (segs[0].len == 0) {
            kvg_admin_fail(c, 404, "no such endpoint");
            return false;
        }
        if (!take_name(c, segs[0], false, name))
            return false;
        return r != ROUTE_TENANT_KEY || take_key_id(c, segs[1], key_id);
    default:
        return true;
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
    seg segs[2] = {{"", 0}, {"", 0}};
    route r = plen > PATH_MAX_LEN ? ROUTE_NONE : match(req->path, plen, segs);
    /* Without a tenant store or policy state, those paths do not exist. */
    if ((is_tenant_route(r) && !admin->tenants) || (r == ROUTE_POLICY && !admin->policy) ||
        (r == ROUTE_EXPLAIN && (!admin->router || !admin->policy)))
        r = ROUTE_NONE;

    /* Probes answer anyone: orchestrators call them without credentials. */
    bool open = r == ROUTE_HEALTHZ || r == ROUTE_READYZ;
    if (!open && !kvg_admin_authorize(c))
        return;
    if (plen > PATH_MAX_LEN) {
        kvg_admin_error(resp, 414, "path longer than %d bytes", PATH_MAX_LEN);
        return;
    }
    if (r == ROUTE_NONE) {
        kvg_admin_error(resp, 404, "no such endpoint");
        return;
    }
    if (!method_allowed(r, req->method)) {
        char m[16];
        kvg_admin_error(resp, 405, "method %s not allowed here; allowed: %s",
                        kvg_admin_log_safe(req->method, m, sizeof(m)), route_allow[r]);
        resp->allow = route_allow[r];
        return;
    }

    /* A change: serialised with every other one up to its audit line (kvg_admin_handle writes
     * it), which names the target as the path does, validated or not. */
    c->action = change_action(r, req->method);
    if (r == ROUTE_POLICY)
        snprintf(c->target, sizeof(c->target), "policy");
    else if (r == ROUTE_TENANT_KEY)
        snprintf(c->target, sizeof(c->target), "%.*s/%.*s", (int)KVG_MIN(segs[0].len, 96),
                 segs[0].p, (int)KVG_MIN(segs[1].len, 32), segs[1].p);
    else
        snprintf(c->target, sizeof(c->target), "%.*s", (int)KVG_MIN(segs[0].len, 128), segs[0].p);
    if (c->action)
        pthread_mutex_lock(&admin->change_lock);

    char name[KVG_MAX(KVG_WORKER_NAME_MAX, KVG_TENANT_ID_MAX) + 1];
    char key_id[KVG_KEY_ID_LEN + 1];
    if (check_request(c, r, segs, name, key_id))
        dispatch(c, r, name, key_id);
    if (is_tenant_route(r))
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
    seg segs[2] = {{"", 0}, {"", 0}};
    route r = plen > PATH_MAX_LEN ? ROUTE_NONE : match(req->path, plen, segs);
    if (r == ROUTE_HEALTHZ || r == ROUTE_READYZ)
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
    handle(&c);
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
}
