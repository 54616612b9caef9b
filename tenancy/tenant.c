/* SPDX-License-Identifier: Apache-2.0 */
/* Tenant definitions (validation), tenant objects and their accessors, admission against the
 * rate and in-flight limits, and the per-tenant counters. */
#include "tenancy_int.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sharing_names[KVG_SHARING_COUNT] = {
    [KVG_SHARING_ISOLATED] = "isolated",
    [KVG_SHARING_GROUP] = "group",
    [KVG_SHARING_GLOBAL] = "global",
};

static const char *const admit_names[KVG_ADMIT_RESULT_COUNT] = {
    [KVG_ADMIT_OK] = "ok",         [KVG_ADMIT_RATE] = "rate",
    [KVG_ADMIT_BYTES] = "bytes",   [KVG_ADMIT_INFLIGHT] = "inflight",
    [KVG_ADMIT_BUFFER] = "buffer",
};

const int kvg_tenancy_tracked_codes[TENANT_TRACKED_CODES] = {
    200, 400, 401, 403, 404, 408, 413, 422, 429, 499, 500, 502, 503, 504,
};

static const char *const tracked_labels[TENANT_TRACKED_CODES] = {
    "200", "400", "401", "403", "404", "408", "413",
    "422", "429", "499", "500", "502", "503", "504",
};

static const char *const class_labels[TENANT_CODE_CLASSES] = {"1xx", "2xx", "3xx", "4xx", "5xx"};

const char *kvg_sharing_str(kvg_sharing s)
{
    return (unsigned)s < KVG_SHARING_COUNT ? sharing_names[s] : "?";
}

int kvg_sharing_parse(const char *s, kvg_sharing *out)
{
    for (int i = 0; s && i < KVG_SHARING_COUNT; i++) {
        if (strcmp(s, sharing_names[i]) == 0) {
            *out = (kvg_sharing)i;
            return 0;
        }
    }
    return KVG_EPARSE;
}

const char *kvg_admit_result_str(kvg_admit_result r)
{
    return (unsigned)r < KVG_ADMIT_RESULT_COUNT ? admit_names[r] : "?";
}

size_t kvg_tenancy_code_slot(int status)
{
    for (size_t i = 0; i < TENANT_TRACKED_CODES; i++)
        if (kvg_tenancy_tracked_codes[i] == status)
            return i;
    if (status >= 100 && status <= 599)
        return TENANT_TRACKED_CODES + (size_t)(status / 100 - 1);
    return TENANT_CODE_SLOTS - 1;
}

const char *kvg_tenancy_code_label(size_t slot)
{
    if (slot < TENANT_TRACKED_CODES)
        return tracked_labels[slot];
    if (slot < TENANT_TRACKED_CODES + TENANT_CODE_CLASSES)
        return class_labels[slot - TENANT_TRACKED_CODES];
    return "other";
}

/* ---- validation ------------------------------------------------------------------------------ */

static int bad(char *msg, size_t msg_len, int rc, const char *fmt, ...) KVG_PRINTF(4, 5);

static int bad(char *msg, size_t msg_len, int rc, const char *fmt, ...)
{
    if (msg && msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Render one byte for a message without letting control bytes into logs. */
static const char *show_char(unsigned char c, char buf[8])
{
    if (c > 0x20 && c < 0x7f)
        snprintf(buf, 8, "'%c'", c);
    else
        snprintf(buf, 8, "0x%02x", c);
    return buf;
}

static bool id_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

int kvg_tenant_id_validate(const char *id, const char *what, char *msg, size_t msg_len)
{
    char cb[8];
    if (!what)
        what = "id";
    if (!id)
        return bad(msg, msg_len, KVG_EPARSE, "%s: missing", what);
    /* Ids and group names share the limit (KVG_TENANT_GROUP_MAX == KVG_TENANT_ID_MAX). */
    size_t len = strnlen(id, KVG_TENANT_ID_MAX + 1);
    if (len == 0)
        return bad(msg, msg_len, KVG_EPARSE, "%s: must not be empty", what);
    if (len > KVG_TENANT_ID_MAX)
        return bad(msg, msg_len, KVG_EPARSE, "%s: longer than %d characters", what,
                   KVG_TENANT_ID_MAX);
    for (size_t i = 0; i < len; i++)
        if (!id_char((unsigned char)id[i]))
            return bad(msg, msg_len, KVG_EPARSE,
                       "%s: invalid character %s (allowed: A-Z a-z 0-9 . _ -)", what,
                       show_char((unsigned char)id[i], cb));
    /* Ids are path segments of the admin API, where these two would be normalised. */
    if (strcmp(id, ".") == 0 || strcmp(id, "..") == 0)
        return bad(msg, msg_len, KVG_EPARSE, "%s: \".\" and \"..\" are reserved", what);
    return 0;
}

static int validate_models(const char *const *models, size_t n, char *msg, size_t msg_len)
{
    if (n > KVG_TENANT_MODELS_MAX)
        return bad(msg, msg_len, KVG_ELIMIT, "models: more than %d models", KVG_TENANT_MODELS_MAX);
    if (n && !models)
        return bad(msg, msg_len, KVG_EPARSE, "models: missing");
    for (size_t i = 0; i < n; i++) {
        const char *m = models[i];
        if (!m)
            return bad(msg, msg_len, KVG_EPARSE, "models[%zu]: missing", i);
        size_t len = strnlen(m, TENANT_MODEL_NAME_MAX + 1);
        if (len == 0)
            return bad(msg, msg_len, KVG_EPARSE, "models[%zu]: must not be empty", i);
        if (len > TENANT_MODEL_NAME_MAX)
            return bad(msg, msg_len, KVG_ELIMIT, "models[%zu]: longer than %d bytes", i,
                       TENANT_MODEL_NAME_MAX);
        for (size_t k = 0; k < len; k++)
            if ((unsigned char)m[k] < 0x20 || (unsigned char)m[k] > 0x7e)
                return bad(msg, msg_len, KVG_EPARSE, "models[%zu]: must be printable ASCII", i);
        /* n <= 64, so the quadratic check is cheap. */
        for (size_t j = 0; j < i; j++)
            if (strcmp(models[j], m) == 0)
                return bad(msg, msg_len, KVG_EPARSE, "models[%zu]: duplicate of models[%zu]", i, j);
    }
    return 0;
}

/* A limit is a finite number >= 0 (NaN fails every comparison, so !(v >= 0) catches it). */
static int validate_limit(double v, const char *field, char *msg, size_t msg_len)
{
    if (!(v >= 0) || !isfinite(v))
        return bad(msg, msg_len, KVG_EPARSE, "%s: must be a finite number >= 0", field);
    return 0;
}

/* A burst below one request (or byte) could never admit anything: 0 picks the default. */
static int validate_burst(double v, const char *field, char *msg, size_t msg_len)
{
    int rc = validate_limit(v, field, msg, msg_len);
    if (rc == 0 && v > 0 && v < 1)
        rc = bad(msg, msg_len, KVG_EPARSE, "%s: must be 0 (the default) or at least 1", field);
    return rc;
}

int kvg_tenant_def_validate(const kvg_tenant_def *def, char *msg, size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (!def)
        return bad(msg, msg_len, KVG_EPARSE, "definition missing");
    int rc = kvg_tenant_id_validate(def->id, "id", msg, msg_len);
    if (rc < 0)
        return rc;
    if ((unsigned)def->sharing >= KVG_SHARING_COUNT)
        return bad(msg, msg_len, KVG_EPARSE, "sharing: must be isolated, group or global");
    if (def->sharing == KVG_SHARING_GROUP) {
        if (!def->group)
            return bad(msg, msg_len, KVG_EPARSE, "group: required when sharing is \"group\"");
        rc = kvg_tenant_id_validate(def->group, "group", msg, msg_len);
        if (rc < 0)
            return rc;
    } else if (def->group) {
        return bad(msg, msg_len, KVG_EPARSE, "group: only allowed when sharing is \"group\"");
    }
    rc = validate_models(def->models, def->nmodels, msg, msg_len);
    if (rc == 0)
        rc = validate_limit(def->limits.rps, "rate.rps", msg, msg_len);
    if (rc == 0)
        rc = validate_burst(def->limits.burst, "rate.burst", msg, msg_len);
    if (rc == 0)
        rc =
            validate_limit(def->limits.prompt_bytes_per_s, "rate.prompt_bytes_per_s", msg, msg_len);
    if (rc == 0)
        rc =
            validate_burst(def->limits.prompt_bytes_burst, "rate.prompt_bytes_burst", msg, msg_len);
    return rc;
}

/* ---- the definition's fields ---------------------------------------------------------------- */

/* Rates and bursts above this are typos, not limits. */
#define RATE_MAX 1e15

#define RATE_FIELD(field)                                                                          \
    {                                                                                              \
        .name = #field, .type = KVG_FIELD_DOUBLE, .set_in = KVG_SET_ANY,                           \
        .offset = offsetof(kvg_tenant_limits, field), .dmax = RATE_MAX                             \
    }

static const kvg_field rate_fields[] = {
    RATE_FIELD(rps),
    RATE_FIELD(burst),
    RATE_FIELD(prompt_bytes_per_s),
    RATE_FIELD(prompt_bytes_burst),
};

static const kvg_fields rate_table = {"rate", rate_fields, KVG_ARRAY_LEN(rate_fields), NULL};

/* One table for every place a tenant is defined: the state file, PUT /admin/v1/tenants/{id} and
 * `kvgate admin tenants put`. The id is the path in the admin API (a body may repeat it) and
 * positional in kvgate admin; sharing defaults to isolated except in the state file, which
 * always writes it. What the values may be beyond their type and range (characters of ids and
 * groups, group with sharing, distinct models, bursts of at least 1) is
 * kvg_tenant_def_validate's. */
static const kvg_field tenant_fields[] = {
    {.name = "id",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_STATE | KVG_SET_ADMIN,
     .required_in = KVG_SET_STATE,
     .offset = offsetof(kvg_tenant_def, id)},
    {.name = "sharing",
     .type = KVG_FIELD_ENUM,
     .set_in = KVG_SET_ANY,
     .required_in = KVG_SET_STATE,
     .offset = offsetof(kvg_tenant_def, sharing),
     .keywords = sharing_names,
     .nkeywords = KVG_SHARING_COUNT,
     .def.u = KVG_SHARING_ISOLATED},
    /* null reads as absent: the state file allowed it before this table. */
    {.name = "group",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_NULLABLE,
     .offset = offsetof(kvg_tenant_def, group)},
    {.name = "models",
     .type = KVG_FIELD_STRINGS,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_tenant_def, models),
     .count_offset = offsetof(kvg_tenant_def, nmodels),
     .max = KVG_TENANT_MODELS_MAX,
     .item = "model"},
    {.name = "rate",
     .type = KVG_FIELD_OBJECT,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_FLATTEN,
     .offset = offsetof(kvg_tenant_def, limits),
     .object = &rate_table},
    {.name = "max_inflight",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_tenant_def, limits.max_inflight)},
};

const kvg_fields kvg_tenant_fields = {"tenant", tenant_fields, KVG_ARRAY_LEN(tenant_fields), NULL};

/* ---- specs ----------------------------------------------------------------------------------- */

int kvg_tenancy_spec_new(const kvg_tenant_def *def, char *msg, size_t msg_len, tenant_spec **out)
{
    int rc = kvg_tenant_def_validate(def, msg, msg_len);
    if (rc < 0)
        return rc;

    char scope[KVG_TENANT_ID_MAX + 16];
    if (def->sharing == KVG_SHARING_ISOLATED)
        snprintf(scope, sizeof(scope), "tenant:%s", def->id);
    else if (def->sharing == KVG_SHARING_GROUP)
        snprintf(scope, sizeof(scope), "group:%s", def->group);
    else
        snprintf(scope, sizeof(scope), "global");
    size_t id_len = strlen(def->id) + 1;
    size_t group_len = def->group ? strlen(def->group) + 1 : 0;
    size_t scope_len = strlen(scope) + 1;
    size_t size =
        sizeof(tenant_spec) + def->nmodels * sizeof(char *) + id_len + group_len + scope_len;
    for (size_t i = 0; i < def->nmodels; i++)
        size += strlen(def->models[i]) + 1;

    tenant_spec *s = malloc(size);
    if (!s)
        return bad(msg, msg_len, -ENOMEM, "out of memory");
    atomic_init(&s->refs, 1);
    s->models = (const char **)(void *)(s + 1);
    char *p = (char *)(s->models + def->nmodels);
#define SPEC_COPY(dst, src, n)                                                                     \
    do {                                                                                           \
        memcpy(p, (src), (n));                                                                     \
        (dst) = p;                                                                                 \
        p += (n);                                                                                  \
    } while (0)
    SPEC_COPY(s->id, def->id, id_len);
    s->group = NULL;
    if (def->group)
        SPEC_COPY(s->group, def->group, group_len);
    SPEC_COPY(s->scope, scope, scope_len);
    for (size_t i = 0; i < def->nmodels; i++)
        SPEC_COPY(s->models[i], def->models[i], strlen(def->models[i]) + 1);
#undef SPEC_COPY
    s->nmodels = def->nmodels;
    s->sharing = def->sharing;
    s->limits = def->limits;
    const kvg_tenant_limits *l = &def->limits;
    s->burst = l->burst > 0 ? l->burst : KVG_MAX(1.0, l->rps);
    s->bytes_burst = l->prompt_bytes_burst > 0
                         ? l->prompt_bytes_burst
                         : KVG_MAX(l->prompt_bytes_per_s, TENANT_BYTES_BURST_MIN);
    *out = s;
    return 0;
}

tenant_spec *kvg_tenancy_spec_ref(tenant_spec *spec)
{
    atomic_fetch_add_explicit(&spec->refs, 1, memory_order_relaxed);
    return spec;
}

void kvg_tenancy_spec_unref(tenant_spec *spec)
{
    if (spec && atomic_fetch_sub_explicit(&spec->refs, 1, memory_order_acq_rel) == 1)
        free(spec);
}

/* ---- runtime state --------------------------------------------------------------------------- */

int kvg_tenancy_runtime_new(uint64_t ordinal, tenant_runtime **out)
{
    tenant_runtime *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return -ENOMEM;
    int rc = -pthread_mutex_init(&rt->lock, NULL);
    if (rc < 0) {
        free(rt);
        return rc;
    }
    atomic_init(&rt->refs, 1);
    rt->ordinal = ordinal;
    atomic_init(&rt->inflight, 0u);
    for (size_t i = 0; i < TENANT_CODE_SLOTS; i++)
        atomic_init(&rt->codes[i], 0u);
    for (size_t i = 0; i < KVG_ADMIT_RESULT_COUNT; i++)
        atomic_init(&rt->refusals[i], 0u);
    atomic_init(&rt->prompt_bytes, 0u);
    atomic_init(&rt->usage_prompt, 0u);
    atomic_init(&rt->usage_cached, 0u);
    atomic_init(&rt->usage_predicted, 0u);
    kvg_prom_hist_init(&rt->ttft);
    kvg_prom_hist_init(&rt->itl);
    atomic_init(&rt->output_tokens, 0u);
    *out = rt;
    return 0;
}

tenant_runtime *kvg_tenancy_runtime_ref(tenant_runtime *rt)
{
    atomic_fetch_add_explicit(&rt->refs, 1, memory_order_relaxed);
    return rt;
}

void kvg_tenancy_runtime_unref(tenant_runtime *rt)
{
    if (!rt || atomic_fetch_sub_explicit(&rt->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_destroy(&rt->lock);
    free(rt);
}

/* ---- tenant objects -------------------------------------------------------------------------- */

int kvg_tenancy_tenant_new(tenant_spec *spec, tenant_runtime *rt, const kvg_key_info *keys,
                           size_t nkeys, kvg_tenant **out)
{
    kvg_tenant *t = malloc(sizeof(*t) + nkeys * sizeof(kvg_key_info));
    if (!t) {
        kvg_tenancy_spec_unref(spec);
        kvg_tenancy_runtime_unref(rt);
        return -ENOMEM;
    }
    atomic_init(&t->refs, 1);
    t->spec = spec;
    t->rt = rt;
    t->nkeys = nkeys;
    if (nkeys)
        memcpy(t->keys, keys, nkeys * sizeof(kvg_key_info));
    *out = t;
    return 0;
}

kvg_tenant *kvg_tenant_ref(kvg_tenant *t)
{
    atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

void kvg_tenant_unref(kvg_tenant *t)
{
    if (!t)
        return;
    /* acq_rel rather than a separate fence: ThreadSanitizer understands it. */
    if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
        return;
    kvg_tenancy_spec_unref(t->spec);
    kvg_tenancy_runtime_unref(t->rt);
    free(t);
}

const char *kvg_tenant_id(const kvg_tenant *t)
{
    return t->spec->id;
}

kvg_sharing kvg_tenant_sharing(const kvg_tenant *t)
{
    return t->spec->sharing;
}

const char *kvg_tenant_group(const kvg_tenant *t)
{
    return t->spec->group;
}

size_t kvg_tenant_model_count(const kvg_tenant *t)
{
    return t->spec->nmodels;
}

const char *kvg_tenant_model(const kvg_tenant *t, size_t i)
{
    return i < t->spec->nmodels ? t->spec->models[i] : NULL;
}

bool kvg_tenant_allows_model(const kvg_tenant *t, const char *model)
{
    return kvg_models_admit((const char *const *)t->spec->models, t->spec->nmodels, model);
}

const kvg_tenant_limits *kvg_tenant_limits_of(const kvg_tenant *t)
{
    return &t->spec->limits;
}

size_t kvg_tenant_key_count(const kvg_tenant *t)
{
    return t->nkeys;
}

const kvg_key_info *kvg_tenant_key(const kvg_tenant *t, size_t i)
{
    return i < t->nkeys ? &t->keys[i] : NULL;
}

const char *kvg_tenant_scope(const kvg_tenant *t)
{
    return t->spec->scope;
}

uint64_t kvg_tenant_ordinal(const kvg_tenant *t)
{
    return t->rt->ordinal;
}

/* ---- admission ------------------------------------------------------------------------------- */

static unsigned retry_after(double wait_s)
{
    if (!(wait_s < TENANT_RETRY_AFTER_MAX)) /* also infinity and NaN */
        return TENANT_RETRY_AFTER_MAX;
    double s = ceil(wait_s);
    return s < 1 ? 1u : (unsigned)s;
}

/*
 * Order: in-flight slot, request bucket, bytes bucket, all under the tenant's lock.
 * - The in-flight check comes first because it is the cheapest and its refusal must not cost
 *   the client rate tokens: a client waiting for a slot keeps its rate budget.
 * - A request token taken before the bytes bucket refuses is given back while the lock is
 *   still held, so no other thread ever sees the transient state: all or nothing, and no
 *   spurious refusals of concurrent requests.
 * - The slot is counted under the same lock, so the check and the increment cannot be split
 *   by another admission; releases only lower the count and need no lock.
 * A prompt larger than the bytes burst is charged the whole burst: it is admitted when the
 *   bucket is full (and empties it) rather than refused forever.
 */
kvg_admit_result kvg_tenant_admit(kvg_tenant *t, uint64_t now_ns, uint64_t prompt_bytes,
                                  unsigned *retry_after_s)
{
    const tenant_spec *s = t->spec;
    tenant_runtime *rt = t->rt;
    kvg_admit_result r = KVG_ADMIT_OK;
    double wait = 1;
    bool took_request = false;

    /* Without a rate, the in-flight count alone decides: a compare-and-swap, not the tenant's
     * lock, which every request of the tenant took on every thread (a shared cache line that
     * bounces between cores once two loops serve one tenant). */
    if (!(s->limits.rps > 0) && !(s->limits.prompt_bytes_per_s > 0)) {
        uint32_t n = atomic_load_explicit(&rt->inflight, memory_order_relaxed);
        do {
            if (s->limits.max_inflight && n >= s->limits.max_inflight) {
                if (retry_after_s)
                    *retry_after_s = 1;
                return KVG_ADMIT_INFLIGHT;
            }
        } while (!atomic_compare_exchange_weak_explicit(
            &rt->inflight, &n, n + 1, memory_order_relaxed, memory_order_relaxed));
        return KVG_ADMIT_OK;
    }

    pthread_mutex_lock(&rt->lock);
    if (s->limits.max_inflight &&
        atomic_load_explicit(&rt->inflight, memory_order_relaxed) >= s->limits.max_inflight) {
        r = KVG_ADMIT_INFLIGHT;
        goto out;
    }
    if (s->limits.rps > 0) {
        if (!kvg_policy_bucket_take(&rt->requests, s->limits.rps, s->burst, now_ns, 1, &wait)) {
            r = KVG_ADMIT_RATE;
            goto out;
        }
        took_request = true;
    }
    if (s->limits.prompt_bytes_per_s > 0) {
        double cost = KVG_MIN((double)prompt_bytes, s->bytes_burst);
        if (!kvg_policy_bucket_take(&rt->bytes, s->limits.prompt_bytes_per_s, s->bytes_burst,
                                    now_ns, cost, &wait)) {
            if (took_request)
                kvg_policy_bucket_give(&rt->requests, s->burst, 1);
            r = KVG_ADMIT_BYTES;
            goto out;
        }
    }
    atomic_fetch_add_explicit(&rt->inflight, 1, memory_order_relaxed);
out:
    pthread_mutex_unlock(&rt->lock);
    if (r != KVG_ADMIT_OK && retry_after_s)
        *retry_after_s = r == KVG_ADMIT_INFLIGHT ? 1u : retry_after(wait);
    return r;
}

bool kvg_tenant_rate_state(kvg_tenant *t, uint64_t now_ns, kvg_rate_state *out)
{
    const tenant_spec *s = t->spec;
    if (!(s->limits.rps > 0))
        return false;
    pthread_mutex_lock(&t->rt->lock);
    /* Taking nothing refills the bucket to now and changes nothing else. */
    kvg_policy_bucket_take(&t->rt->requests, s->limits.rps, s->burst, now_ns, 0, NULL);
    double tokens = t->rt->requests.tokens;
    pthread_mutex_unlock(&t->rt->lock);
    out->limit = s->burst;
    out->remaining = tokens < 0 ? 0 : tokens;
    out->reset_s = tokens >= s->burst ? 0 : (s->burst - tokens) / s->limits.rps;
    return true;
}

void kvg_tenant_release(kvg_tenant *t)
{
    /* A release without an admission is a caller bug; never wrap below zero, which would make
     * the tenant look full forever. */
    uint32_t cur = atomic_load_explicit(&t->rt->inflight, memory_order_relaxed);
    do {
        if (cur == 0)
            return;
    } while (!atomic_compare_exchange_weak_explicit(&t->rt->inflight, &cur, cur - 1,
                                                    memory_order_relaxed, memory_order_relaxed));
}

uint32_t kvg_tenant_inflight(const kvg_tenant *t)
{
    return atomic_load_explicit(&t->rt->inflight, memory_order_relaxed);
}

bool kvg_tenant_buffer_charge(kvg_tenant *t, uint64_t bytes, uint64_t cap)
{
    uint64_t cur = atomic_load_explicit(&t->rt->buffered, memory_order_relaxed);
    do {
        if (cur + bytes < cur || (cap && cur + bytes > cap))
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&t->rt->buffered, &cur, cur + bytes,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

void kvg_tenant_buffer_release(kvg_tenant *t, uint64_t bytes)
{
    /* Never below zero: a double release is a caller bug that must not make room for ever. */
    uint64_t cur = atomic_load_explicit(&t->rt->buffered, memory_order_relaxed);
    do {
        if (bytes > cur)
            bytes = cur;
    } while (!atomic_compare_exchange_weak_explicit(&t->rt->buffered, &cur, cur - bytes,
                                                    memory_order_relaxed, memory_order_relaxed));
}

uint64_t kvg_tenant_buffered(const kvg_tenant *t)
{
    return atomic_load_explicit(&t->rt->buffered, memory_order_relaxed);
}

/* ---- counters -------------------------------------------------------------------------------- */

void kvg_tenant_record(kvg_tenant *t, int status, uint64_t prompt_bytes)
{
    atomic_fetch_add_explicit(&t->rt->codes[kvg_tenancy_code_slot(status)], 1,
                              memory_order_relaxed);
    if (prompt_bytes)
        atomic_fetch_add_explicit(&t->rt->prompt_bytes, prompt_bytes, memory_order_relaxed);
}

void kvg_tenant_record_usage(kvg_tenant *t, uint64_t predicted_tokens, int64_t prompt_tokens,
                             int64_t cached_tokens)
{
    if (prompt_tokens < 0 || cached_tokens < 0)
        return;
    atomic_fetch_add_explicit(&t->rt->usage_prompt, (uint64_t)prompt_tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->rt->usage_cached, (uint64_t)cached_tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->rt->usage_predicted, predicted_tokens, memory_order_relaxed);
}

void kvg_tenant_record_refusal(kvg_tenant *t, kvg_admit_result why)
{
    if ((unsigned)why >= KVG_ADMIT_RESULT_COUNT || why == KVG_ADMIT_OK)
        return;
    atomic_fetch_add_explicit(&t->rt->refusals[why], 1, memory_order_relaxed);
}
