/* SPDX-License-Identifier: Apache-2.0 */
/* The kvgate trace format: one request a line, with its tenant, turned into block keys by the
 * gateway's own code - the body scanner's canonical prefix stream, the tenant's scope salt, the
 * router's hashing job - so the replay sees the keys kvgate would route on. */
#include "trace_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "router.h"
#include "tenancy.h"

/* Salts need a server secret; any fixed one keeps scopes apart, which is all a replay needs
 * (salts differ by scope and agree within one, as under any secret). */
static const char replay_secret[] = "kvgate-replay: a fixed secret that keeps scopes apart";

#define SCOPE_MAX (KVG_TENANT_GROUP_MAX + 16)

struct kvgate_reader {
    bool shared_scope;
    kvg_policy_config pc;
    kvg_registry *reg;
    kvg_worker_set *set; /* empty: prepare_job needs one, hashing does not look at it */
    kvg_router *rt;
    kvg_salt_cache salts;
    bool salts_init;
    /* Tenants by name: open addressing, slots hold a tenant index (0: empty). */
    uint32_t *slots;
    size_t nslots;
    char **scopes; /* by tenant index, as the trace's names */
    size_t scopecap;
};

int kvgate_reader_new(const replay_read_options *opt, kvgate_reader **out)
{
    kvgate_reader *k = calloc(1, sizeof(*k));
    if (!k)
        return -ENOMEM;
    k->shared_scope = opt->shared_scope;
    kvg_policy_config_init(&k->pc);
    kvg_salt_cache_init(&k->salts, (const uint8_t *)replay_secret, sizeof(replay_secret) - 1);
    k->salts_init = true;
    kvg_registry_config rc_cfg = {.nthreads = 1};
    int rc = kvg_registry_new(&rc_cfg, &k->reg);
    if (rc == 0)
        rc = kvg_router_new(NULL, &k->rt);
    if (rc == 0) {
        k->set = kvg_registry_acquire(k->reg);
        k->nslots = 64;
        k->slots = calloc(k->nslots, sizeof(*k->slots));
        if (!k->slots)
            rc = -ENOMEM;
    }
    if (rc < 0) {
        kvgate_reader_free(k);
        return rc;
    }
    *out = k;
    return 0;
}

void kvgate_reader_free(kvgate_reader *k)
{
    if (!k)
        return;
    for (size_t i = 0; i < k->scopecap; i++)
        free(k->scopes[i]);
    free(k->scopes);
    free(k->slots);
    if (k->set)
        kvg_worker_set_unref(k->set);
    kvg_router_free(k->rt);
    kvg_registry_free(k->reg);
    if (k->salts_init)
        kvg_salt_cache_done(&k->salts);
    free(k);
}

static size_t slot_of(const kvgate_reader *k, const trace_builder *b, const char *name)
{
    size_t mask = k->nslots - 1, i = (size_t)XXH3_64bits(name, strlen(name)) & mask;
    while (k->slots[i] && strcmp(b->t.tenants[k->slots[i]], name) != 0)
        i = (i + 1) & mask;
    return i;
}

/* The tenant's index, or 0 when it is new. */
static uint32_t tenant_find(const kvgate_reader *k, const trace_builder *b, const char *name)
{
    return k->slots[slot_of(k, b, name)];
}

/* A new tenant with its scope: its index, or 0 on memory failure. */
static uint32_t tenant_add(kvgate_reader *k, trace_builder *b, const char *name, const char *scope)
{
    if (b->t.ntenants >= UINT32_MAX / 2)
        return 0;
    if (2 * (b->t.ntenants + 1) > k->nslots) {
        size_t nn = k->nslots * 2;
        uint32_t *ns = calloc(nn, sizeof(*ns)), *old = k->slots;
        if (!ns)
            return 0;
        size_t oldn = k->nslots;
        k->slots = ns;
        k->nslots = nn;
        for (size_t i = 0; i < oldn; i++)
            if (old[i])
                k->slots[slot_of(k, b, b->t.tenants[old[i]])] = old[i];
        free(old);
    }
    if (b->t.ntenants == b->tenantcap) {
        size_t nc = b->tenantcap * 2;
        char **p = realloc(b->t.tenants, nc * sizeof(*p));
        if (!p)
            return 0;
        b->t.tenants = p;
        b->tenantcap = nc;
    }
    if (b->t.ntenants >= k->scopecap) {
        size_t nc = b->tenantcap;
        char **p = realloc(k->scopes, nc * sizeof(*p));
        if (!p)
            return 0;
        memset(p + k->scopecap, 0, (nc - k->scopecap) * sizeof(*p));
        k->scopes = p;
        k->scopecap = nc;
    }
    uint32_t idx = (uint32_t)b->t.ntenants;
    char *n = strdup(name), *s = strdup(scope);
    if (!n || !s) {
        free(n);
        free(s);
        return 0;
    }
    b->t.tenants[idx] = n;
    k->scopes[idx] = s;
    b->t.ntenants++;
    k->slots[slot_of(k, b, name)] = idx;
    return idx;
}

/* A string member or NULL; a present non-string is an error. */
static int get_string(const kvg_json *root, const char *key, const char **out, line_error *le)
{
    const kvg_json *v = kvg_json_get(root, key);
    *out = NULL;
    if (!v)
        return 0;
    if (v->type != KVG_JSON_STRING || strlen(v->u.str.ptr) != v->u.str.len) {
        *le = (line_error){.field = key, .why = "expected a string"};
        return KVG_EPARSE;
    }
    *out = v->u.str.ptr;
    return 0;
}

/* The line's tenant (NULL: none) and its scope id ("tenant:<id>", "group:<name>", "global"),
 * as tenancy/ names them. */
static int scope_of(const kvgate_reader *k, const kvg_json *root, const char **tenant, char *scope,
                    line_error *le)
{
    const char *sharing_s, *group;
    if (get_string(root, "tenant", tenant, le) || get_string(root, "sharing", &sharing_s, le) ||
        get_string(root, "group", &group, le))
        return KVG_EPARSE;
    if (*tenant && kvg_tenant_id_validate(*tenant, "tenant", le->buf, sizeof(le->buf)) < 0) {
        le->field = NULL;
        le->why = le->buf;
        return KVG_EPARSE;
    }
    kvg_sharing sharing = KVG_SHARING_ISOLATED;
    if (sharing_s && kvg_sharing_parse(sharing_s, &sharing) < 0) {
        *le = (line_error){.field = "sharing",
                           .why = "expected \"isolated\", \"group\" or \"global\""};
        return KVG_EPARSE;
    }
    if ((sharing_s || group) && !*tenant) {
        *le = (line_error){.field = sharing_s ? "sharing" : "group", .why = "needs a tenant"};
        return KVG_EPARSE;
    }
    if ((sharing == KVG_SHARING_GROUP) != (group != NULL)) {
        *le = (line_error){.field = "group",
                           .why = group ? "only with \"sharing\": \"group\"" : "missing"};
        return KVG_EPARSE;
    }
    if (group && kvg_tenant_id_validate(group, "group", le->buf, sizeof(le->buf)) < 0) {
        le->field = NULL;
        le->why = le->buf;
        return KVG_EPARSE;
    }
    /* No tenant is the gateway's open mode: the global scope. */
    if (k->shared_scope || !*tenant || sharing == KVG_SHARING_GLOBAL)
        snprintf(scope, SCOPE_MAX, "global");
    else if (sharing == KVG_SHARING_GROUP)
        snprintf(scope, SCOPE_MAX, "group:%s", group);
    else
        snprintf(scope, SCOPE_MAX, "tenant:%s", *tenant);
    return 0;
}

int kvgate_parse_line(kvgate_reader *k, const char *line, size_t len, kvg_arena *arena,
                      double time_scale, trace_builder *b, replay_request *r, line_error *le)
{
    const kvg_json *root;
    uint64_t arrival_us;
    int rc = trace_line_open(line, len, arena, time_scale, &root, &arrival_us, le);
    if (rc < 0)
        return rc;
    uint64_t output_length;
    const char *why = trace_get_uint(root, "output_length", UINT32_MAX, &output_length);
    if (why) {
        *le = (line_error){.field = "output_length", .why = why};
        return KVG_EPARSE;
    }
    const char *tenant;
    char scope[SCOPE_MAX];
    if (scope_of(k, root, &tenant, scope, le) < 0)
        return KVG_EPARSE;
    uint32_t tidx = tenant ? tenant_find(k, b, tenant) : 0;
    if (tidx && strcmp(k->scopes[tidx], scope) != 0) {
        snprintf(le->buf, sizeof(le->buf), "tenant \"%s\" was in scope \"%s\" on an earlier line",
                 tenant, k->scopes[tidx]);
        le->field = "sharing";
        le->why = le->buf;
        return KVG_EPARSE;
    }

    /* The request: a chat ("messages") or a completion ("prompt"), scanned as the gateway
     * scans the body of that path. */
    bool chat = kvg_json_get(root, "messages") != NULL;
    if (chat == (kvg_json_get(root, "prompt") != NULL)) {
        *le = (line_error){.field = chat ? "messages" : "prompt",
                           .why = chat ? "only one of \"prompt\" and \"messages\""
                                       : "missing (or \"messages\")"};
        return KVG_EPARSE;
    }
    kvg_body_info info;
    kvg_body_plan plan;
    kvg_json_error err = {0};
    rc = kvg_body_scan_plan(line, len, chat ? KVG_BODY_API_CHAT : KVG_BODY_API_COMPLETIONS, NULL,
                            arena, &plan, &info, &err);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0) {
        snprintf(le->buf, sizeof(le->buf), "%s", err.message);
        le->field = rc == KVG_ETYPE ? NULL : "request";
        le->why = le->buf;
        return KVG_EPARSE;
    }
    char salt[KVG_SALT_LEN + 1];
    rc = kvg_salt_cache_get(&k->salts, scope, salt);
    if (rc < 0)
        return rc == -ENOMEM ? rc : -EIO;

    /* The block keys: the router's hashing job for this body and salt, hashed on the CPU. */
    kvg_route_request rq = {.body = &info, .salt = salt, .policy = &k->pc};
    kvg_route_decision d;
    kvg_hash_job job;
    rc = kvg_router_prepare_job(k->rt, k->set, &rq, arena, &d, &job);
    if (rc < 0)
        return rc;
    job.nkeys = 0;
    if (job.max_blocks && kvg_hash_batch(&job, 1) < 0)
        return -EINVAL; /* the defaults' block sizes are valid: not reached */
    const kvg_prefix_stream *ps = &info.prefix;
    uint64_t tokens, block_tokens;
    if (ps->is_tokens) {
        tokens = ps->ntokens;
        block_tokens = k->pc.block_tokens;
    } else {
        tokens = (ps->text_len + REPLAY_TEXT_BYTES_PER_TOKEN - 1) / REPLAY_TEXT_BYTES_PER_TOKEN;
        block_tokens = KVG_MAX(k->pc.block_bytes / REPLAY_TEXT_BYTES_PER_TOKEN, 1u);
    }
    if (tokens > UINT32_MAX) {
        *le = (line_error){.field = chat ? "messages" : "prompt", .why = "too long"};
        return KVG_EPARSE;
    }
    uint64_t *keys;
    if (trace_pool_reserve(b, job.nkeys, &keys) < 0)
        return -ENOMEM;
    if (tenant && !tidx && !(tidx = tenant_add(k, b, tenant, scope)))
        return -ENOMEM;
    if (job.nkeys)
        memcpy(keys, job.keys, job.nkeys * sizeof(*keys));
    *r = (replay_request){
        .arrival_us = arrival_us,
        .input_tokens = (uint32_t)tokens,
        .output_tokens = (uint32_t)output_length,
        .block_tokens = (uint32_t)block_tokens,
        .tenant = tidx,
    };
    trace_pool_commit(b, r, job.nkeys);
    return 0;
}
