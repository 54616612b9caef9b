/* SPDX-License-Identifier: Apache-2.0 */
/* Admin API entry point: lifecycle, routing of a request to its handler, error bodies. */
#include "admin_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_MAX_LEN 2048
#define WORKERS_PATH "/admin/v1/workers"

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

void kvg_admin_error(kvg_admin_response *resp, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : KVG_MIN((size_t)n, sizeof(msg) - 1);
    kvg_admin_json(resp, status);
    kvg_buf_puts(&resp->body, "{\"error\":{\"message\":");
    /* escaping replaces any UTF-8 sequence the truncation may have cut */
    kvg_buf_json_string(&resp->body, msg, len);
    kvg_buf_printf(&resp->body, ",\"type\":\"%s\",\"code\":%d}}", error_type(status), status);
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
    kvg_buf_done(&resp->body);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int kvg_admin_new(const kvg_admin_config *cfg, kvg_registry *reg, kvg_admin **out)
{
    int rc;
    if (!cfg || !reg || !out)
        return -EINVAL;
    kvg_admin *admin = calloc(1, sizeof(*admin));
    if (!admin)
        return -ENOMEM;
    admin->reg = reg;
    rc = kvg_admin_digest_tokens(cfg->tokens, cfg->ntokens, &admin->digests);
    if (rc < 0)
        goto fail_admin;
    admin->ndigests = cfg->ntokens;
    rc = -pthread_mutex_init(&admin->lock, NULL);
    if (rc < 0)
        goto fail_digests;
    *out = admin;
    return 0;

fail_digests:
    kvg_admin_free_digests(admin->digests, admin->ndigests);
fail_admin:
    free(admin);
    return rc;
}

void kvg_admin_free(kvg_admin *admin)
{
    if (!admin)
        return;
    kvg_admin_free_digests(admin->digests, admin->ndigests);
    pthread_mutex_destroy(&admin->lock);
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
};

static bool path_is(const char *p, size_t len, const char *lit)
{
    return len == strlen(lit) && memcmp(p, lit, len) == 0;
}

/* Match the path (query already cut off); for worker routes, the name segment. */
static route match(const char *p, size_t len, const char **name, size_t *name_len)
{
    static const char prefix[] = WORKERS_PATH "/";
    if (path_is(p, len, "/healthz"))
        return ROUTE_HEALTHZ;
    if (path_is(p, len, "/readyz"))
        return ROUTE_READYZ;
    if (path_is(p, len, "/metrics"))
        return ROUTE_METRICS;
    if (path_is(p, len, WORKERS_PATH))
        return ROUTE_WORKERS;
    if (len <= sizeof(prefix) - 1 || memcmp(p, prefix, sizeof(prefix) - 1) != 0)
        return ROUTE_NONE;
    const char *seg = p + sizeof(prefix) - 1;
    const char *end = p + len;
    const char *slash = memchr(seg, '/', (size_t)(end - seg));
    *name = seg;
    *name_len = (size_t)((slash ? slash : end) - seg);
    if (!slash)
        return ROUTE_WORKER;
    if (*name_len && path_is(slash, (size_t)(end - slash), "/drain"))
        return ROUTE_WORKER_DRAIN;
    return ROUTE_NONE;
}

static bool method_allowed(route r, const char *method)
{
    switch (r) {
    case ROUTE_WORKER:
        return strcmp(method, "GET") == 0 || strcmp(method, "PUT") == 0 ||
               strcmp(method, "DELETE") == 0;
    case ROUTE_WORKER_DRAIN:
        return strcmp(method, "POST") == 0;
    default:
        return strcmp(method, "GET") == 0;
    }
}

static void dispatch(admin_ctx *c, route r, const char *name)
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
    default:
        kvg_admin_error(c->resp, 404, "not found");
        break;
    }
}

static void handle(admin_ctx *c)
{
    const kvg_admin_request *req = c->req;
    kvg_admin_response *resp = c->resp;
    if (!req->method || !req->path) {
        kvg_admin_error(resp, 400, "malformed request");
        return;
    }
    const char *q = strchr(req->path, '?');
    size_t plen = q ? (size_t)(q - req->path) : strlen(req->path);
    const char *seg = NULL;
    size_t seg_len = 0;
    route r = plen > PATH_MAX_LEN ? ROUTE_NONE : match(req->path, plen, &seg, &seg_len);

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
    if (req->body_len > KVG_ADMIN_BODY_MAX) {
        kvg_admin_error(resp, 413, "request body larger than %d bytes", KVG_ADMIN_BODY_MAX);
        return;
    }
    if (req->body_len && !req->body) {
        kvg_admin_error(resp, 400, "malformed request");
        return;
    }

    char name[KVG_WORKER_NAME_MAX + 1];
    if (r == ROUTE_WORKER || r == ROUTE_WORKER_DRAIN) {
        char why[128];
        if (seg_len == 0) {
            kvg_admin_error(resp, 404, "no such endpoint");
            return;
        }
        if (seg_len > KVG_WORKER_NAME_MAX) {
            kvg_admin_error(resp, 400, "name: longer than %d characters", KVG_WORKER_NAME_MAX);
            return;
        }
        memcpy(name, seg, seg_len);
        name[seg_len] = '\0';
        if (kvg_worker_name_validate(name, why, sizeof(why)) < 0) {
            kvg_admin_error(resp, 400, "%s", why);
            return;
        }
    }
    dispatch(c, r, name);
}

void kvg_admin_handle(kvg_admin *admin, const kvg_admin_request *req, kvg_admin_response *resp)
{
    char remote[64];
    resp->status = 500;
    resp->content_type = CT_JSON;
    resp->allow = NULL;
    resp->www_authenticate = NULL;
    kvg_buf_init(&resp->body);
    admin_ctx c = {
        .admin = admin,
        .req = req,
        .resp = resp,
        .remote = kvg_admin_log_safe(req->remote, remote, sizeof(remote)),
    };
    handle(&c);
    if (resp->body.failed) {
        /* Out of memory while writing the body: send a short error instead of half a body. */
        kvg_buf_done(&resp->body);
        resp->status = 500;
        resp->content_type = CT_JSON;
        resp->allow = NULL;
        resp->www_authenticate = NULL;
        kvg_buf_puts(&resp->body, "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"code\":500}}");
        if (resp->body.failed)
            kvg_buf_done(&resp->body);
    }
}
