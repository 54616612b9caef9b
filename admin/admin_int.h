/* SPDX-License-Identifier: Apache-2.0 */
/* Private state of the admin API and the helpers its route files share. */
#ifndef KVG_ADMIN_INT_H
#define KVG_ADMIN_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "admin.h"

#define ADMIN_TOKENS_MAX 64
#define ADMIN_WRITERS_MAX 64
#define ADMIN_DIGEST_LEN 32 /* SHA-256 */

#define CT_JSON "application/json"
#define CT_METRICS "text/plain; version=0.0.4; charset=utf-8"

typedef struct admin_writer {
    kvg_admin_metrics_fn fn;
    void *ud;
} admin_writer;

struct kvg_admin {
    kvg_registry *reg;
    /* Guards everything below; held only for copies, never across callbacks. */
    pthread_mutex_t lock;
    unsigned char (*digests)[ADMIN_DIGEST_LEN];
    size_t ndigests;
    admin_writer writers[ADMIN_WRITERS_MAX];
    size_t nwriters;
    kvg_admin_ready_fn ready;
    void *ready_ud;
};

/* What one request is about, for handlers and the audit log. */
typedef struct admin_ctx {
    kvg_admin *admin;
    const kvg_admin_request *req;
    kvg_admin_response *resp;
    const char *remote; /* sanitised, never NULL */
} admin_ctx;

/** Fill resp with the OpenAI error shape {"error":{"message","type","code"}}; the type is
 *  derived from the status. */
void kvg_admin_error(kvg_admin_response *resp, int status, const char *fmt, ...) KVG_PRINTF(3, 4);
/** Start a JSON response with the given status (body empty). */
void kvg_admin_json(kvg_admin_response *resp, int status);
/** Copy s into buf for a log line: at most len-1 bytes, anything but printable ASCII as '?'. */
const char *kvg_admin_log_safe(const char *s, char *buf, size_t len);

/** Digest every token into a new array; 0, -EINVAL (bad token or count) or -ENOMEM. */
int kvg_admin_digest_tokens(const char *const *tokens, size_t n,
                            unsigned char (**out)[ADMIN_DIGEST_LEN]);
/** Wipe and free a digest array from kvg_admin_digest_tokens; NULL is a no-op. */
void kvg_admin_free_digests(unsigned char (*digests)[ADMIN_DIGEST_LEN], size_t n);
/** Check the Authorization header; true when it carries an accepted token. Otherwise resp
 *  holds the 401 (or 500) to send. */
bool kvg_admin_authorize(admin_ctx *c);

/* Route handlers: the method is already checked. name is validated, NUL-terminated. */
void kvg_admin_healthz(admin_ctx *c);
void kvg_admin_readyz(admin_ctx *c);
void kvg_admin_metrics(admin_ctx *c);
void kvg_admin_workers_list(admin_ctx *c);
void kvg_admin_worker_get(admin_ctx *c, const char *name);
void kvg_admin_worker_put(admin_ctx *c, const char *name);
void kvg_admin_worker_delete(admin_ctx *c, const char *name);
void kvg_admin_worker_drain(admin_ctx *c, const char *name);

#endif
