/* SPDX-License-Identifier: Apache-2.0 */
/* Bearer-token authentication of admin requests: tokens kept as SHA-256 digests and compared
 * in constant time, so neither content nor length leaks through timing. */
#include "admin_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#define REALM "Bearer realm=\"kvgate-admin\""

/* The one place OpenSSL errors leave this module: a failed digest is reported as -ENOMEM
 * (the only way EVP_Digest of SHA-256 fails in practice) with the error queue cleared. */
static int sha256(const void *data, size_t len, unsigned char out[ADMIN_DIGEST_LEN])
{
    unsigned int n = 0;
    if (EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) != 1 || n != ADMIN_DIGEST_LEN) {
        ERR_clear_error();
        return -ENOMEM;
    }
    return 0;
}

/* A token must be sendable in a header as-is: visible ASCII, no spaces. */
static bool token_ok(const char *t)
{
    if (!t || !*t)
        return false;
    for (; *t; t++)
        if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f)
            return false;
    return true;
}

void kvg_admin_free_digests(unsigned char (*digests)[ADMIN_DIGEST_LEN], size_t n)
{
    if (!digests)
        return;
    OPENSSL_cleanse(digests, n * ADMIN_DIGEST_LEN);
    free(digests);
}

int kvg_admin_digest_tokens(const char *const *tokens, size_t n,
                            unsigned char (**out)[ADMIN_DIGEST_LEN])
{
    if (n == 0 || n > ADMIN_TOKENS_MAX || !tokens)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!token_ok(tokens[i]))
            return -EINVAL;
    unsigned char(*d)[ADMIN_DIGEST_LEN] = malloc(n * ADMIN_DIGEST_LEN);
    if (!d)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = sha256(tokens[i], strlen(tokens[i]), d[i]);
        if (rc < 0) {
            kvg_admin_free_digests(d, n);
            return rc;
        }
    }
    *out = d;
    return 0;
}

int kvg_admin_set_metrics_tokens(kvg_admin *admin, const char *const *tokens, size_t ntokens)
{
    return kvg_admin_replace_digests(admin, &admin->metrics_digests, &admin->nmetrics_digests,
                                     tokens, ntokens);
}

/* GET /metrics (any query): what a metrics token may do. */
static bool metrics_request(const kvg_admin_request *req)
{
    if (!req->method || !req->path || strcmp(req->method, "GET") != 0)
        return false;
    size_t n = strcspn(req->path, "?");
    return n == 8 && memcmp(req->path, "/metrics", 8) == 0;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* Why the header is not acceptable, or NULL when it carries an accepted token. */
static const char *check(admin_ctx *c, bool *internal, bool *bad_token, bool *forbidden)
{
    const char *h = c->req->authorization;
    if (!h || !*h)
        return "missing Authorization header (expected: Bearer <token>)";
    size_t slen = strcspn(h, " \t");
    if (!kvg_strcaseeq(h, slen, "Bearer"))
        return "Authorization scheme must be Bearer";
    const char *t = h + slen;
    while (is_space(*t))
        t++;
    size_t tlen = strlen(t);
    while (tlen && is_space(t[tlen - 1]))
        tlen--;
    if (tlen == 0)
        return "missing bearer token";

    unsigned char d[ADMIN_DIGEST_LEN];
    if (sha256(t, tlen, d) < 0) {
        *internal = true;
        return "could not check the token";
    }
    /* Compare with every accepted token, without stopping at a match. */
    bool match = false, metrics_match = false;
    kvg_admin *admin = c->admin;
    pthread_mutex_lock(&admin->lock);
    for (size_t i = 0; i < admin->ndigests; i++)
        match |= kvg_consttime_eq(d, admin->digests[i], ADMIN_DIGEST_LEN);
    for (size_t i = 0; i < admin->nmetrics_digests; i++)
        metrics_match |= kvg_consttime_eq(d, admin->metrics_digests[i], ADMIN_DIGEST_LEN);
    pthread_mutex_unlock(&admin->lock);
    if (match) {
        /* Name the token for the audit log: a prefix of its digest, which the operator can
         * compute from the token and which reveals nothing usable about it. */
        static const char hex[] = "0123456789abcdef";
        for (size_t i = 0; i < ADMIN_TOKEN_ID_LEN / 2; i++) {
            c->token_id[2 * i] = hex[d[i] >> 4];
            c->token_id[2 * i + 1] = hex[d[i] & 15];
        }
        c->token_id[ADMIN_TOKEN_ID_LEN] = '\0';
    }
    OPENSSL_cleanse(d, sizeof(d));
    if (match)
        return NULL;
    if (metrics_match) {
        if (metrics_request(c->req))
            return NULL;
        *forbidden = true;
        return "the metrics token grants GET /metrics only";
    }
    *bad_token = true;
    return "invalid admin token";
}

bool kvg_admin_authorize(admin_ctx *c)
{
    bool internal = false, bad_token = false, forbidden = false;
    const char *why = check(c, &internal, &bad_token, &forbidden);
    if (!why)
        return true;
    char m[16], p[128];
    /* The header itself is never logged: it may hold a real token with a typo. */
    kvg_log_warn("admin: remote=%s %s %s: authentication failed: %s", c->remote,
                 kvg_admin_log_safe(c->req->method, m, sizeof(m)),
                 kvg_admin_log_safe(c->req->path, p, sizeof(p)), why);
    if (internal || forbidden) {
        kvg_admin_error(c->resp, internal ? 500 : 403, "%s", why);
        return false;
    }
    kvg_admin_error(c->resp, 401, "%s", why);
    c->resp->www_authenticate = bad_token ? REALM ", error=\"invalid_token\"" : REALM;
    return false;
}
