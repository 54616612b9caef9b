/* SPDX-License-Identifier: Apache-2.0 */
/* POST /admin/v1/route/explain: the decision the gateway would take for a request, with every
 * term, without sending it anywhere or counting it. */
#include "admin_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The API a request body is for: the "path" given, else guessed from its members. */
static int pick_api(admin_ctx *c, const kvg_json *path, const kvg_json *req, kvg_body_api *api)
{
    if (path) {
        char why[160];
        if (!kvg_admin_c_string(path, "path", why, sizeof(why))) {
            kvg_admin_fail(c, 400, "%s", why);
            return -1;
        }
        if (strcmp(path->u.str.ptr, "/v1/chat/completions") == 0) {
            *api = KVG_BODY_API_CHAT;
        } else if (strcmp(path->u.str.ptr, "/v1/completions") == 0) {
            *api = KVG_BODY_API_COMPLETIONS;
        } else if (strcmp(path->u.str.ptr, "/v1/responses") == 0) {
            *api = KVG_BODY_API_RESPONSES;
        } else {
            kvg_admin_fail(c, 400,
                           "path: must be \"/v1/chat/completions\", \"/v1/completions\" or "
                           "\"/v1/responses\"");
            return -1;
        }
        return 0;
    }
    *api = kvg_json_get(req, "messages") ? KVG_BODY_API_CHAT
           : kvg_json_get(req, "input")  ? KVG_BODY_API_RESPONSES
                                         : KVG_BODY_API_COMPLETIONS;
    return 0;
}

static void put_candidate(kvg_buf *b, const kvg_route_candidate *rc)
{
    const char *name = kvg_worker_name(rc->worker);
    char hex[17];
    kvg_fmt_hex64(hex, rc->terms.rendezvous);
    hex[16] = '\0';
    kvg_buf_puts(b, "{\"worker\":");
    kvg_buf_json_string(b, name, strlen(name));
    kvg_buf_printf(b,
                   ",\"matched_blocks\":%u,\"inflight\":%u,\"pending_blocks\":%u,"
                   "\"waiting\":%u,\"kv_usage\":%.4f,\"prefill_cost\":%.3f,\"queue_cost\":%.3f,"
                   "\"pending_cost\":%.3f,\"total_cost\":%.3f,\"over_bound\":%s,"
                   "\"rendezvous\":\"%s\"}",
                   rc->matched, rc->inflight, rc->pending, rc->waiting, (double)rc->kv_usage,
                   rc->terms.prefill_cost, rc->terms.queue_cost, rc->terms.pending_cost,
                   rc->terms.total, rc->terms.over_bound ? "true" : "false", hex);
}

static void respond(admin_ctx *c, const kvg_route_decision *d, const kvg_body_info *info,
                    kvg_body_api api, const char *tenant, const char *scope)
{
    kvg_admin_json(c->resp, 200);
    kvg_buf *b = &c->resp->body;
    const char *policy = kvg_policy_kind_str(d->policy);
    kvg_buf_puts(b, "{\"policy\":");
    kvg_buf_json_string(b, policy, strlen(policy));
    const char *reason = kvg_policy_reason_str(d->reason);
    kvg_buf_puts(b, ",\"reason\":");
    kvg_buf_json_string(b, reason, strlen(reason));
    kvg_buf_puts(b, ",\"chosen\":");
    if (d->ncands) {
        const char *name = kvg_worker_name(d->cands[0].worker);
        kvg_buf_json_string(b, name, strlen(name));
    } else {
        kvg_buf_puts(b, "null");
    }
    kvg_buf_puts(b, ",\"tenant\":");
    if (tenant)
        kvg_buf_json_string(b, tenant, strlen(tenant));
    else
        kvg_buf_puts(b, "null");
    kvg_buf_puts(b, ",\"scope\":");
    kvg_buf_json_string(b, scope, strlen(scope));
    kvg_buf_puts(b, ",\"api\":");
    kvg_buf_json_string(b, kvg_body_api_str(api), strlen(kvg_body_api_str(api)));
    kvg_buf_puts(b, ",\"model\":");
    if (info->model)
        kvg_buf_json_string(b, info->model, info->model_len);
    else
        kvg_buf_puts(b, "null");
    /* How the keys were made; token-exact: the engine's hashes of the first blocks, whole and
     * in the 64-bit form its KV events carry, so that an operator can compare with the engine. */
    kvg_buf_printf(b, ",\"mode\":\"%s\"", kvg_route_mode_str(d->mode));
    if (d->mode == KVG_ROUTE_MODE_EXACT_FALLBACK) {
        kvg_buf_puts(b, ",\"token_exact_error\":");
        kvg_buf_json_string(b, d->exact_error, strlen(d->exact_error));
    }
    if (d->mode == KVG_ROUTE_MODE_TOKEN_EXACT) {
        kvg_buf_puts(b, ",\"first_block_hashes\":[");
        for (uint32_t i = 0; i < d->nkeys && i < KVG_ARRAY_LEN(d->first_hashes); i++) {
            char hex[2 * KVG_VLLM_HASH_MAX];
            kvg_hex_encode(d->first_hashes[i].bytes, d->first_hashes[i].len, hex);
            kvg_buf_printf(b, "%s{\"digest\":\"%.*s\",\"event\":%" PRIu64 "}", i ? "," : "",
                           2 * d->first_hashes[i].len, hex, d->keys[i]);
        }
        kvg_buf_putc(b, ']');
    }
    kvg_buf_printf(b,
                   ",\"prefix\":{\"unit\":\"%s\",\"length\":%zu,\"block_size\":%u,\"blocks\":%u}"
                   ",\"hash_backend\":\"%s\",\"serving\":%zu,\"ejected\":%zu,\"candidates\":[",
                   kvg_hash_unit_str(d->unit), d->stream_units, d->block_size, d->nkeys,
                   d->hash_backend ? d->hash_backend : "cpu", d->serving, d->ejected);
    for (size_t i = 0; i < d->ncands; i++) {
        if (i)
            kvg_buf_putc(b, ',');
        put_candidate(b, &d->cands[i]);
    }
    kvg_buf_puts(b, "],\"timing_us\":{");
    for (int s = 0; s < KVG_ROUTE_STAGE_COUNT; s++)
        kvg_buf_printf(b, "%s\"%s\":%.3f", s ? "," : "", kvg_route_stage_str((kvg_route_stage)s),
                       (double)d->stage_ns[s] / 1000.0);
    kvg_buf_puts(b, "}}");
}

void kvg_admin_route_explain(admin_ctx *c)
{
    kvg_admin *admin = c->admin;
    kvg_arena *arena = &c->arena;
    kvg_buf body;
    kvg_buf_init(&body);
    kvg_tenant_set *ts = NULL;
    kvg_worker_set *set = NULL;
    kvg_model_set *models = NULL;

    const kvg_json *root = c->body;
    const kvg_json *tenant = NULL, *req = NULL, *path = NULL;
    for (size_t i = 0; i < root->u.obj.count; i++) { /* parse_body gave an object */
        const char *k = root->u.obj.keys[i];
        size_t klen = root->u.obj.key_lens[i];
        const kvg_json *v = root->u.obj.values[i];
        if (kvg_admin_key_is(k, klen, "tenant"))
            tenant = v;
        else if (kvg_admin_key_is(k, klen, "request"))
            req = v;
        else if (kvg_admin_key_is(k, klen, "path"))
            path = v;
        else {
            kvg_admin_fail(c, 400, "%s: unknown field (expected tenant, request, path)",
                           kvg_admin_log_safe(k, (char[72]){0}, 72));
            goto out;
        }
    }
    if (!req || req->type != KVG_JSON_OBJECT) {
        kvg_admin_fail(c, 400, "request: required, the body of an OpenAI request (an object)");
        goto out;
    }
    char why[160];
    if (tenant && tenant->type != KVG_JSON_NULL &&
        !kvg_admin_c_string(tenant, "tenant", why, sizeof(why))) {
        kvg_admin_fail(c, 400, "%s", why);
        goto out;
    }
    kvg_body_api api;
    if (pick_api(c, path, req, &api) < 0)
        goto out;

    /* The scope as the front resolves it: the tenant's, or "global" without one (open mode). */
    const char *tenant_id = tenant && tenant->type == KVG_JSON_STRING ? tenant->u.str.ptr : NULL;
    char scope[KVG_TENANT_ID_MAX + 64] = "global";
    if (tenant_id) {
        if (!admin->tenants) {
            kvg_admin_fail(c, 404, "tenant \"%s\": this gateway has no tenants",
                           kvg_admin_log_safe(tenant_id, (char[72]){0}, 72));
            goto out;
        }
        ts = kvg_tenants_acquire(admin->tenants);
        kvg_tenant *t = kvg_tenant_set_find(ts, tenant_id);
        if (!t) {
            kvg_admin_fail(c, 404, "tenant \"%s\" not found",
                           kvg_admin_log_safe(tenant_id, (char[72]){0}, 72));
            goto out;
        }
        snprintf(scope, sizeof(scope), "%s", kvg_tenant_scope(t));
    }
    char salt[KVG_SALT_LEN + 1];
    if (kvg_policy_scope_salt(admin->secret, admin->secret_len, scope, salt) < 0) {
        kvg_admin_fail(c, 500, "cannot compute the scope salt");
        goto out;
    }

    /* The request as the front would see it, through the same scanner. */
    kvg_json_write(&body, req);
    kvg_body_info info;
    kvg_json_error err = {0};
    uint64_t t0 = kvg_now_ns();
    kvg_body_plan plan; /* the forwarded body is not needed here */
    int rc = kvg_body_scan_plan(body.data ? body.data : "", body.len, api, salt, arena, &plan,
                                &info, &err);
    uint64_t parse_ns = kvg_now_ns() - t0;
    if (rc < 0 || body.failed) {
        if (rc == KVG_ETYPE)
            kvg_admin_fail(c, 400, "request.%s", err.message);
        else if (rc == -ENOMEM && arena->over_limit)
            kvg_admin_fail(c, 413, "request: too large to explain (more than %u MiB of work)",
                           ADMIN_BODY_ARENA_MAX >> 20);
        else
            kvg_admin_fail(c, rc == -ENOMEM || body.failed ? 500 : 400, "request: %s",
                           rc == -ENOMEM || body.failed ? "out of memory" : err.message);
        goto out;
    }
    kvg_policy_config pc;
    kvg_policy_state_get(admin->policy, &pc);
    set = kvg_registry_acquire(admin->reg);
    kvg_route_request rq = {
        .body = &info,
        .salt = salt,
        .policy = &pc,
        .rotation = 0,
        .clock_ns = kvg_now_ns,
        .now_ns = kvg_now_ns(),
        .engine_load_max_age_ns = admin->engine_load_max_age_ns,
    };
    if (info.model && admin->models &&
        (api == KVG_BODY_API_CHAT || api == KVG_BODY_API_COMPLETIONS)) {
        models = kvg_model_registry_acquire(admin->models);
        rq.model = kvg_model_set_find(models, info.model, info.model_len);
        rq.model_input =
            api == KVG_BODY_API_CHAT ? KVG_MODEL_INPUT_CHAT : KVG_MODEL_INPUT_COMPLETIONS;
        rq.raw_body = body.data ? body.data : "";
        rq.raw_len = body.len;
    }
    kvg_route_decision d;
    if (kvg_router_decide(admin->router, set, &rq, arena, &d) < 0) {
        if (arena->over_limit)
            kvg_admin_fail(c, 413, "request: too large to explain (more than %u MiB of work)",
                           ADMIN_BODY_ARENA_MAX >> 20);
        else
            kvg_admin_fail(c, 500, "out of memory");
        goto out;
    }
    d.stage_ns[KVG_ROUTE_STAGE_PARSE] = parse_ns;
    respond(c, &d, &info, api, tenant_id, scope);
out:
    if (models)
        kvg_model_set_unref(models);
    if (set)
        kvg_worker_set_unref(set);
    if (ts)
        kvg_tenant_set_unref(ts);
    kvg_buf_done(&body);
}
