/* SPDX-License-Identifier: Apache-2.0 */
/* Liveness, readiness and the Prometheus scrape endpoint. */
#include "admin_int.h"

#include <stdio.h>
#include <string.h>

#include "prom.h"

/* Liveness: answered on the control thread's loop, so an answer at all says that loop turns;
 * the gateway's callback says whether the front threads' loops do too. Nothing else (workers,
 * Redis) may fail it: an orchestrator restarts what fails liveness. */
void kvg_admin_healthz(admin_ctx *c)
{
    kvg_admin *admin = c->admin;
    pthread_mutex_lock(&admin->lock);
    kvg_admin_live_fn live = admin->live;
    void *ud = admin->live_ud;
    pthread_mutex_unlock(&admin->lock);
    char why[200] = "";
    if (live && !live(ud, why, sizeof(why))) {
        kvg_admin_json(c->resp, 503);
        kvg_buf_puts(&c->resp->body, "{\"status\":\"unhealthy\",\"reason\":");
        kvg_buf_json_string(&c->resp->body, why, strlen(why));
        kvg_buf_putc(&c->resp->body, '}');
        return;
    }
    kvg_admin_json(c->resp, 200);
    kvg_buf_puts(&c->resp->body, "{\"status\":\"ok\"}");
}

void kvg_admin_readyz(admin_ctx *c)
{
    kvg_admin *admin = c->admin;
    pthread_mutex_lock(&admin->lock);
    kvg_admin_ready_fn ready = admin->ready;
    void *ud = admin->ready_ud;
    pthread_mutex_unlock(&admin->lock);

    const char *reason = NULL;
    /* Not ready while shutting down (the ready delay included: load balancers take the
     * replica out while it still serves), and, unless the operator chose otherwise, while no
     * worker can take a request: a replica without workers answers every request with 503, so
     * a load balancer does better to send them to another replica. */
    if (ready && !ready(ud)) {
        reason = "gateway is not ready";
    } else if (!admin->ready_without_workers) {
        kvg_worker_set *set = kvg_registry_acquire(admin->reg);
        size_t n = kvg_worker_set_count(set);
        bool any = false;
        for (size_t i = 0; i < n && !any; i++) {
            kvg_worker *w = kvg_worker_set_at(set, i);
            any = kvg_worker_health_get(w) == KVG_WORKER_UP && !kvg_worker_draining(w);
        }
        kvg_worker_set_unref(set);
        if (n == 0)
            reason = "no workers registered";
        else if (!any)
            reason = "no worker is up and accepting requests";
    }
    /* What works less well than it should without stopping the gateway from serving. */
    char why[400] = "";
    char degraded[2][440];
    size_t ndegraded = 0;
    if (admin->redis && !kvg_redis_healthy(admin->redis, why, sizeof(why)))
        snprintf(degraded[ndegraded++], sizeof(degraded[0]), "redis degraded: %s", why);
    /* shared is set once at start-up, before the admin listener serves */
    if (admin->shared && !kvg_admin_shared_healthy(admin->shared, why, sizeof(why)))
        snprintf(degraded[ndegraded++], sizeof(degraded[0]), "state sync degraded: %s", why);
    kvg_buf *b = &c->resp->body;
    kvg_admin_json(c->resp, reason ? 503 : 200);
    kvg_buf_puts(b, reason ? "{\"status\":\"not ready\",\"reason\":" : "{\"status\":\"ready\"");
    if (reason)
        kvg_buf_json_string(b, reason, strlen(reason));
    for (size_t i = 0; i < ndegraded; i++) {
        kvg_buf_puts(b, i ? "," : ",\"degraded\":[");
        kvg_buf_json_string(b, degraded[i], strlen(degraded[i]));
    }
    if (ndegraded)
        kvg_buf_putc(b, ']');
    kvg_buf_putc(b, '}');
}

void kvg_admin_metrics(admin_ctx *c)
{
    kvg_admin *admin = c->admin;
    admin_writer writers[ADMIN_WRITERS_MAX];
    /* Copy, then call without the lock: a writer may take its own locks or be slow. */
    pthread_mutex_lock(&admin->lock);
    size_t n = admin->nwriters;
    memcpy(writers, admin->writers, n * sizeof(*writers));
    pthread_mutex_unlock(&admin->lock);

    kvg_admin_response *resp = c->resp;
    resp->status = 200;
    resp->content_type = CT_METRICS;
    kvg_buf_reset(&resp->body);
    kvg_registry_write_metrics(admin->reg, &resp->body);
    if (admin->tenants)
        kvg_tenants_write_metrics(admin->tenants, admin->tenant_label_cap, &resp->body);
    if (admin->router)
        kvg_router_write_metrics(admin->router, &resp->body);
    if (admin->redis)
        kvg_redis_write_metrics(admin->redis, &resp->body);
    if (admin->shared)
        kvg_admin_shared_write_metrics(admin->shared, &resp->body);
    if (admin->policy) {
        kvg_policy_config pc;
        kvg_policy_state_get(admin->policy, &pc);
        kvg_prom_put_header(&resp->body, "kvgate_policy_info", KVG_PROM_GAUGE,
                            "The routing policy in force (value 1).");
        kvg_prom_put_u64(&resp->body, "kvgate_policy_info",
                         KVG_PROM_LABELS({"policy", kvg_policy_kind_str(pc.kind)}), 1);
    }
    for (size_t i = 0; i < n; i++)
        writers[i].fn(&resp->body, writers[i].ud);
}
