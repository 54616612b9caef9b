/* SPDX-License-Identifier: Apache-2.0 */
/* Worker definitions (validation, URL parsing) and worker objects: identity, health, load
 * and the per-worker request counters, all safe to touch from any thread. */
#include "router_int.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Latency buckets for LLM traffic: short requests and cache hits at the low end, long
 * generations (minutes) at the top. The sum in microseconds: a nanosecond sum would wrap within
 * months on a busy worker. Defined here, where they are observed, so that observing folds them
 * into constants. */
static const uint64_t latency_bounds_ns[] = {
    5000000ull,     10000000ull,    25000000ull,    50000000ull,    100000000ull,
    250000000ull,   500000000ull,   1000000000ull,  2500000000ull,  5000000000ull,
    10000000000ull, 20000000000ull, 30000000000ull, 60000000000ull, 120000000000ull,
};
const kvg_prom_buckets kvg_router_latency_buckets = {
    .bounds_ns = latency_bounds_ns,
    .count = KVG_ARRAY_LEN(latency_bounds_ns),
    .sum_unit_ns = 1000,
};

static _Atomic uint64_t next_worker_id = 1;

static const char *const source_names[KVG_WORKER_SOURCE_COUNT] = {
    [KVG_WORKER_SOURCE_CONFIG] = "config",
    [KVG_WORKER_SOURCE_ADMIN] = "admin",
};

static const char *const health_names[KVG_WORKER_HEALTH_COUNT] = {
    [KVG_WORKER_UP] = "up",
    [KVG_WORKER_DOWN] = "down",
};

const char *kvg_worker_source_str(kvg_worker_source s)
{
    return (unsigned)s < KVG_WORKER_SOURCE_COUNT ? source_names[s] : "?";
}

const char *kvg_worker_health_str(kvg_worker_health h)
{
    return (unsigned)h < KVG_WORKER_HEALTH_COUNT ? health_names[h] : "?";
}

/* ---- validation ----------------------------------------------------------------------------- */

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

static bool name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

int kvg_worker_name_validate(const char *name, char *msg, size_t msg_len)
{
    char cb[8];
    if (!name)
        return bad(msg, msg_len, KVG_EPARSE, "name: missing");
    size_t len = strnlen(name, KVG_WORKER_NAME_MAX + 1);
    if (len == 0)
        return bad(msg, msg_len, KVG_EPARSE, "name: must not be empty");
    if (len > KVG_WORKER_NAME_MAX)
        return bad(msg, msg_len, KVG_ELIMIT, "name: longer than %d characters",
                   KVG_WORKER_NAME_MAX);
    for (size_t i = 0; i < len; i++)
        if (!name_char((unsigned char)name[i]))
            return bad(msg, msg_len, KVG_EPARSE,
                       "name: invalid character %s (allowed: A-Z a-z 0-9 . _ -)",
                       show_char((unsigned char)name[i], cb));
    /* The name is a path segment of the admin API, where these two would be normalised. */
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return bad(msg, msg_len, KVG_EPARSE, "name: \".\" and \"..\" are reserved");
    return 0;
}

typedef struct parsed_url {
    char host[HOST_MAX];
    uint16_t port;
    bool v6;
} parsed_url;

static bool host_char(unsigned char c)
{
    return name_char(c);
}

/* A DNS name or an IPv4 literal; labels separated by single dots. */
static int validate_host(const char *h, size_t len, char *msg, size_t msg_len)
{
    char cb[8];
    if (len == 0)
        return bad(msg, msg_len, KVG_EPARSE, "url: missing host");
    if (len > 253)
        return bad(msg, msg_len, KVG_ELIMIT, "url: host longer than 253 characters");
    bool numeric = true;
    size_t label = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)h[i];
        if (!host_char(c))
            return bad(msg, msg_len, KVG_EPARSE, "url: invalid character %s in host",
                       show_char(c, cb));
        if (c == '.') {
            if (label == 0)
                return bad(msg, msg_len, KVG_EPARSE, "url: empty label in host");
            label = 0;
            continue;
        }
        if (++label > 63)
            return bad(msg, msg_len, KVG_EPARSE, "url: host label longer than 63 characters");
        if (c < '0' || c > '9')
            numeric = false;
    }
    if (label == 0)
        return bad(msg, msg_len, KVG_EPARSE, "url: empty label in host");
    if (numeric) {
        char tmp[HOST_MAX];
        struct in_addr a4;
        memcpy(tmp, h, len);
        tmp[len] = '\0';
        if (inet_pton(AF_INET, tmp, &a4) != 1)
            return bad(msg, msg_len, KVG_EPARSE, "url: invalid IPv4 address");
    }
    return 0;
}

static int parse_port(const char *p, size_t len, uint16_t *out, char *msg, size_t msg_len)
{
    uint64_t v;
    if (len == 0)
        return bad(msg, msg_len, KVG_EPARSE, "url: missing port (expected http://host:port)");
    if (len > 5 || kvg_parse_u64(p, len, &v) < 0 || v == 0 || v > 65535)
        return bad(msg, msg_len, KVG_EPARSE, "url: port must be a number in 1..65535");
    *out = (uint16_t)v;
    return 0;
}

static int parse_url(const char *url, parsed_url *pu, char *msg, size_t msg_len)
{
    static const char scheme[] = "http://";
    if (!url)
        return bad(msg, msg_len, KVG_EPARSE, "url: missing");
    size_t len = strnlen(url, URL_MAX + 1);
    if (len > URL_MAX)
        return bad(msg, msg_len, KVG_ELIMIT, "url: longer than %d bytes", URL_MAX);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)url[i];
        if (c <= 0x20 || c >= 0x7f)
            return bad(msg, msg_len, KVG_EPARSE,
                       "url: must be ASCII without spaces or control characters");
    }
    if (len >= 8 && kvg_strcaseeq(url, 8, "https://"))
        return bad(msg, msg_len, KVG_EPARSE,
                   "url: https is not supported; workers are reached over cleartext HTTP "
                   "(http://host:port)");
    if (len < sizeof(scheme) - 1 || !kvg_strcaseeq(url, sizeof(scheme) - 1, scheme))
        return bad(msg, msg_len, KVG_EPARSE, "url: must look like http://host:port");
    const char *a = url + sizeof(scheme) - 1;
    const char *end = url + len;
    if (memchr(a, '?', (size_t)(end - a)) || memchr(a, '#', (size_t)(end - a)))
        return bad(msg, msg_len, KVG_EPARSE, "url: query and fragment are not allowed");
    const char *slash = memchr(a, '/', (size_t)(end - a));
    const char *aend = slash ? slash : end;
    if (slash && slash + 1 != end)
        return bad(msg, msg_len, KVG_EPARSE,
                   "url: a path is not allowed (only an optional trailing '/')");
    if (memchr(a, '@', (size_t)(aend - a)))
        return bad(msg, msg_len, KVG_EPARSE, "url: user information is not allowed");
    if (a == aend)
        return bad(msg, msg_len, KVG_EPARSE, "url: missing host");

    const char *port;
    if (*a == '[') {
        const char *close = memchr(a, ']', (size_t)(aend - a));
        if (!close)
            return bad(msg, msg_len, KVG_EPARSE, "url: unterminated IPv6 address");
        size_t hlen = (size_t)(close - a - 1);
        struct in6_addr a6;
        if (hlen == 0 || hlen >= sizeof(pu->host))
            return bad(msg, msg_len, KVG_EPARSE, "url: invalid IPv6 address");
        memcpy(pu->host, a + 1, hlen);
        pu->host[hlen] = '\0';
        if (inet_pton(AF_INET6, pu->host, &a6) != 1)
            return bad(msg, msg_len, KVG_EPARSE, "url: invalid IPv6 address");
        if (close + 1 == aend || close[1] != ':')
            return bad(msg, msg_len, KVG_EPARSE,
                       "url: missing port (expected http://[address]:port)");
        port = close + 2;
        pu->v6 = true;
    } else {
        const char *colon = NULL;
        for (const char *p = a; p < aend; p++)
            if (*p == ':')
                colon = p;
        if (!colon)
            return bad(msg, msg_len, KVG_EPARSE, "url: missing port (expected http://host:port)");
        if (memchr(a, ':', (size_t)(colon - a)))
            return bad(msg, msg_len, KVG_EPARSE, "url: IPv6 addresses need brackets");
        size_t hlen = (size_t)(colon - a);
        int rc = validate_host(a, hlen, msg, msg_len);
        if (rc < 0)
            return rc;
        memcpy(pu->host, a, hlen);
        pu->host[hlen] = '\0';
        port = colon + 1;
        pu->v6 = false;
    }
    return parse_port(port, (size_t)(aend - port), &pu->port, msg, msg_len);
}

static int validate_models(const char *const *models, size_t n, char *msg, size_t msg_len)
{
    if (n > KVG_WORKER_MODELS_MAX)
        return bad(msg, msg_len, KVG_ELIMIT, "models: more than %d models", KVG_WORKER_MODELS_MAX);
    if (n && !models)
        return bad(msg, msg_len, KVG_EPARSE, "models: missing");
    for (size_t i = 0; i < n; i++) {
        const char *m = models[i];
        if (!m)
            return bad(msg, msg_len, KVG_EPARSE, "models[%zu]: missing", i);
        size_t len = strnlen(m, KVG_MODEL_NAME_MAX + 1);
        if (len == 0)
            return bad(msg, msg_len, KVG_EPARSE, "models[%zu]: must not be empty", i);
        if (len > KVG_MODEL_NAME_MAX)
            return bad(msg, msg_len, KVG_ELIMIT, "models[%zu]: longer than %d bytes", i,
                       KVG_MODEL_NAME_MAX);
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

static int validate(const kvg_worker_def *def, parsed_url *pu, char *msg, size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (!def)
        return bad(msg, msg_len, KVG_EPARSE, "definition missing");
    int rc = kvg_worker_name_validate(def->name, msg, msg_len);
    if (rc == 0)
        rc = parse_url(def->url, pu, msg, msg_len);
    if (rc == 0)
        rc = validate_models(def->models, def->nmodels, msg, msg_len);
    return rc;
}

int kvg_worker_def_validate(const kvg_worker_def *def, char *msg, size_t msg_len)
{
    parsed_url pu;
    return validate(def, &pu, msg, msg_len);
}

/* ---- the definition's fields ---------------------------------------------------------------- */

/* One table for every place a worker is defined: the config file's "workers", --worker NAME=URL,
 * the state file's admin workers, PUT /admin/v1/workers/{name} and `kvgate admin workers put`.
 * The name and the URL are positional on the command lines (NAME=URL, put NAME URL) and the
 * name is the path in the admin API, where a body may repeat it. What the values may be beyond
 * their type (a name's characters, the URL's form, distinct models) is
 * kvg_worker_def_validate's, which every entry point reaches before a worker is used. */
/* A ZeroMQ endpoint the gateway connects to: tcp://host:port or ipc://path, printable ASCII. */
static int check_endpoint(const void *value, char *why, size_t len)
{
    const char *v = value;
    bool scheme = strncmp(v, "tcp://", 6) == 0 || strncmp(v, "ipc://", 6) == 0;
    bool printable = true;
    for (const char *p = v; *p; p++)
        printable &= *p > 0x20 && *p < 0x7f;
    if (scheme && printable && v[6] != '\0')
        return 0;
    snprintf(why, len, "must be a ZeroMQ endpoint: tcp://host:port or ipc://path");
    return KVG_EPARSE;
}

static const kvg_field worker_fields[] = {
    {.name = "name",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG | KVG_SET_STATE | KVG_SET_ADMIN,
     .required_in = KVG_SET_CONFIG | KVG_SET_STATE,
     .offset = offsetof(kvg_worker_def, name)},
    {.name = "url",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_CONFIG | KVG_SET_STATE | KVG_SET_ADMIN | KVG_SET_CLI,
     .required_in = KVG_SET_CONFIG | KVG_SET_STATE | KVG_SET_ADMIN,
     .offset = offsetof(kvg_worker_def, url)},
    {.name = "models",
     .type = KVG_FIELD_STRINGS,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_worker_def, models),
     .count_offset = offsetof(kvg_worker_def, nmodels),
     .max = KVG_WORKER_MODELS_MAX,
     .item = "model"},
    {.name = "kv_blocks",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_worker_def, kv_blocks)},
    /* 0 = the gateway's default (upstream.max_inflight). */
    {.name = "max_inflight",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_ANY,
     .offset = offsetof(kvg_worker_def, max_inflight)},
    {.name = "cache_salt",
     .type = KVG_FIELD_BOOL,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_NEGATE,
     .offset = offsetof(kvg_worker_def, no_cache_salt),
     .def.b = true},
    {.name = "kv_events",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_NULLABLE | KVG_FIELD_NONEMPTY,
     .max = 512,
     .offset = offsetof(kvg_worker_def, kv_events),
     .check = check_endpoint},
    {.name = "kv_events_replay",
     .type = KVG_FIELD_STRING,
     .set_in = KVG_SET_ANY,
     .flags = KVG_FIELD_NULLABLE | KVG_FIELD_NONEMPTY,
     .max = 512,
     .offset = offsetof(kvg_worker_def, kv_events_replay),
     .check = check_endpoint},
    /* The consumer's staleness rule (gateway/kv_events.c): 5 idle heartbeats of newer vLLM. */
    {.name = "kv_events_stale_ms",
     .type = KVG_FIELD_U32,
     .set_in = KVG_SET_ANY,
     .max = 86400000,
     .offset = offsetof(kvg_worker_def, kv_events_stale_ms),
     .def.u = KVG_WORKER_KV_EVENTS_STALE_MS_DEFAULT},
};

const kvg_fields kvg_worker_fields = {"worker", worker_fields, KVG_ARRAY_LEN(worker_fields), NULL};

/* ---- specs ----------------------------------------------------------------------------------- */

/* The worker's name in the shared prefix map: what identifies the engine and its cache (name,
 * URL, models, capacity, whether it is sent the salt), each field with its length so that no
 * two definitions run together. max_inflight is left out: a new limit leaves the cache as it
 * is. */
static uint64_t map_id_of(const worker_spec *s)
{
    /* Each field seeds the hash of the next; counts and lengths are hashed with them. */
    uint64_t head[4] = {s->nmodels, s->kv_blocks, s->no_cache_salt, strlen(s->name)};
    uint64_t h = XXH3_64bits(head, sizeof(head));
    h = XXH3_64bits_withSeed(s->name, strlen(s->name), h);
    h = XXH3_64bits_withSeed(s->url, strlen(s->url) + 1, h); /* with its NUL: a separator */
    for (size_t i = 0; i < s->nmodels; i++)
        h = XXH3_64bits_withSeed(s->models[i], strlen(s->models[i]) + 1, h);
    return h;
}

int kvg_router_spec_new(const kvg_worker_def *def, uint32_t default_max_inflight, char *msg,
                        size_t msg_len, worker_spec **out)
{
    parsed_url pu = {.v6 = false};
    int rc = validate(def, &pu, msg, msg_len);
    if (rc < 0)
        return rc;

    size_t name_len = strlen(def->name) + 1;
    size_t url_len = strlen(def->url) + 1;
    size_t host_len = strlen(pu.host) + 1;
    char authority[HOST_MAX + 16];
    int alen = snprintf(authority, sizeof(authority), pu.v6 ? "[%s]:%u" : "%s:%u", pu.host,
                        (unsigned)pu.port);
    size_t auth_len = (size_t)alen + 1;
    size_t ev_len = def->kv_events ? strlen(def->kv_events) + 1 : 0;
    size_t replay_len = def->kv_events_replay ? strlen(def->kv_events_replay) + 1 : 0;
    size_t size = sizeof(worker_spec) + def->nmodels * sizeof(char *) + name_len + url_len +
                  host_len + auth_len + ev_len + replay_len;
    for (size_t i = 0; i < def->nmodels; i++)
        size += strlen(def->models[i]) + 1;

    worker_spec *s = malloc(size);
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
    SPEC_COPY(s->name, def->name, name_len);
    SPEC_COPY(s->url, def->url, url_len);
    SPEC_COPY(s->host, pu.host, host_len);
    SPEC_COPY(s->authority, authority, auth_len);
    for (size_t i = 0; i < def->nmodels; i++)
        SPEC_COPY(s->models[i], def->models[i], strlen(def->models[i]) + 1);
    s->kv_events = s->kv_events_replay = NULL;
    if (ev_len)
        SPEC_COPY(s->kv_events, def->kv_events, ev_len);
    if (replay_len)
        SPEC_COPY(s->kv_events_replay, def->kv_events_replay, replay_len);
#undef SPEC_COPY
    s->nmodels = def->nmodels;
    s->kv_blocks = def->kv_blocks;
    s->max_inflight = def->max_inflight ? def->max_inflight : default_max_inflight;
    s->max_inflight_defined = def->max_inflight;
    s->port = pu.port;
    s->no_cache_salt = def->no_cache_salt;
    s->kv_events_stale_ms = def->kv_events_stale_ms;
    s->map_id = map_id_of(s);
    *out = s;
    return 0;
}

worker_spec *kvg_router_spec_ref(worker_spec *spec)
{
    atomic_fetch_add_explicit(&spec->refs, 1, memory_order_relaxed);
    return spec;
}

void kvg_router_spec_unref(worker_spec *spec)
{
    if (spec && atomic_fetch_sub_explicit(&spec->refs, 1, memory_order_acq_rel) == 1)
        free(spec);
}

static bool str_eq(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

bool kvg_router_spec_equal(const worker_spec *a, const worker_spec *b)
{
    if (strcmp(a->name, b->name) != 0 || strcmp(a->url, b->url) != 0 ||
        a->kv_blocks != b->kv_blocks || a->max_inflight != b->max_inflight ||
        a->nmodels != b->nmodels || a->no_cache_salt != b->no_cache_salt ||
        !str_eq(a->kv_events, b->kv_events) || !str_eq(a->kv_events_replay, b->kv_events_replay) ||
        a->kv_events_stale_ms != b->kv_events_stale_ms)
        return false;
    for (size_t i = 0; i < a->nmodels; i++)
        if (strcmp(a->models[i], b->models[i]) != 0)
            return false;
    return true;
}

/* ---- worker objects ------------------------------------------------------------------------- */

int kvg_router_worker_new(worker_spec *spec, kvg_worker_source source, unsigned nthreads,
                          unsigned fall, unsigned rise, kvg_worker **out)
{
    size_t head = (sizeof(kvg_worker) + (size_t)nthreads * sizeof(void *) + 63) / 64 * 64;
    size_t size = head + ((size_t)nthreads + 1) * WORKER_STATS_STRIDE;
    kvg_worker *w = aligned_alloc(64, size);
    if (!w) {
        kvg_router_spec_unref(spec);
        return -ENOMEM;
    }
    memset(w, 0, size);
    atomic_init(&w->refs, 1);
    w->id = atomic_fetch_add_explicit(&next_worker_id, 1, memory_order_relaxed);
    w->spec = spec;
    w->serves_all_models = spec->nmodels == 0;
    w->name_hash = XXH3_64bits(spec->name, strlen(spec->name));
    w->rendezvous_id = kvg_policy_rendezvous_id(w->name_hash);
    w->fall = fall;
    w->rise = rise;
    w->nthreads = nthreads;
    atomic_init(&w->source, (int)source);
    atomic_init(&w->draining, false);
    atomic_init(&w->retired, false);
    atomic_init(&w->health, 0u);
    atomic_init(&w->inflight, 0u);
    atomic_init(&w->pending, 0u);
    atomic_init(&w->eject_until_ns, 0u);
    atomic_init(&w->outlier_streaks, 0u);
    atomic_init(&w->eject_multiplier, 0u);
    atomic_init(&w->ejections, 0u);
    /* The stats stripes: zero bytes are zero counts (the memset above). */
    w->nstripes = nthreads + 1;
    w->stats = (char *)w + head;
    *out = w;
    return 0;
}

void kvg_router_worker_set_retired(kvg_worker *w)
{
    atomic_store_explicit(&w->retired, true, memory_order_release);
}

kvg_worker *kvg_worker_ref(kvg_worker *w)
{
    atomic_fetch_add_explicit(&w->refs, 1, memory_order_relaxed);
    return w;
}

void kvg_worker_unref(kvg_worker *w)
{
    if (!w)
        return;
    /* acq_rel rather than a separate fence: ThreadSanitizer understands it. */
    if (atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) != 1)
        return;
    kvg_router_spec_unref(w->spec);
    free(w);
}

uint64_t kvg_worker_id(const kvg_worker *w)
{
    return w->id;
}

uint64_t kvg_worker_map_id(const kvg_worker *w)
{
    return w->spec->map_id;
}

const char *kvg_worker_name(const kvg_worker *w)
{
    return w->spec->name;
}

const char *kvg_worker_url(const kvg_worker *w)
{
    return w->spec->url;
}

const char *kvg_worker_host(const kvg_worker *w)
{
    return w->spec->host;
}

uint16_t kvg_worker_port(const kvg_worker *w)
{
    return w->spec->port;
}

const char *kvg_worker_authority(const kvg_worker *w)
{
    return w->spec->authority;
}

size_t kvg_worker_model_count(const kvg_worker *w)
{
    return w->spec->nmodels;
}

const char *kvg_worker_model(const kvg_worker *w, size_t i)
{
    return i < w->spec->nmodels ? w->spec->models[i] : NULL;
}

const char *kvg_worker_kv_events(const kvg_worker *w)
{
    return w->spec->kv_events;
}

const char *kvg_worker_kv_events_replay(const kvg_worker *w)
{
    return w->spec->kv_events_replay;
}

uint32_t kvg_worker_kv_events_stale_ms(const kvg_worker *w)
{
    return w->spec->kv_events_stale_ms;
}

bool kvg_worker_serves(const kvg_worker *w, const char *model)
{
    return kvg_models_admit((const char *const *)w->spec->models, w->spec->nmodels, model);
}

uint32_t kvg_worker_kv_blocks(const kvg_worker *w)
{
    return w->spec->kv_blocks;
}

uint32_t kvg_worker_max_inflight(const kvg_worker *w)
{
    return w->spec->max_inflight;
}

bool kvg_worker_injects_salt(const kvg_worker *w)
{
    return !w->spec->no_cache_salt;
}

kvg_worker_source kvg_worker_source_of(const kvg_worker *w)
{
    return (kvg_worker_source)atomic_load_explicit(&w->source, memory_order_relaxed);
}

kvg_worker_health kvg_worker_health_get(const kvg_worker *w)
{
    uint32_t h = atomic_load_explicit(&w->health, memory_order_relaxed);
    return (h & HEALTH_DOWN_BIT) ? KVG_WORKER_DOWN : KVG_WORKER_UP;
}

bool kvg_worker_draining(const kvg_worker *w)
{
    return atomic_load_explicit(&w->draining, memory_order_relaxed);
}

bool kvg_worker_retired(const kvg_worker *w)
{
    return atomic_load_explicit(&w->retired, memory_order_acquire);
}

bool kvg_worker_health_observe(kvg_worker *w, bool ok)
{
    uint32_t old = atomic_load_explicit(&w->health, memory_order_relaxed);
    uint32_t next;
    bool changed;
    do {
        uint32_t streak = (old & HEALTH_STREAK_MASK) + 1;
        changed = false;
        if (!(old & HEALTH_DOWN_BIT)) {
            if (ok)
                next = 0;
            else if (streak >= w->fall) {
                next = HEALTH_DOWN_BIT;
                changed = true;
            } else
                next = streak;
        } else {
            if (!ok)
                next = HEALTH_DOWN_BIT;
            else if (streak >= w->rise) {
                next = 0;
                changed = true;
            } else
                next = HEALTH_DOWN_BIT | streak;
        }
    } while (!atomic_compare_exchange_weak_explicit(&w->health, &old, next, memory_order_relaxed,
                                                    memory_order_relaxed));
    return changed;
}

uint32_t kvg_worker_inflight(const kvg_worker *w)
{
    return atomic_load_explicit(&w->inflight, memory_order_relaxed);
}

bool kvg_worker_inflight_try_acquire(kvg_worker *w)
{
    uint32_t cur = atomic_load_explicit(&w->inflight, memory_order_relaxed);
    do {
        if (cur >= w->spec->max_inflight)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&w->inflight, &cur, cur + 1,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

void kvg_worker_inflight_release(kvg_worker *w)
{
    /* A release without an acquire is a caller bug; never wrap below zero, which would make
     * the worker look full forever. */
    uint32_t cur = atomic_load_explicit(&w->inflight, memory_order_relaxed);
    do {
        if (cur == 0)
            return;
    } while (!atomic_compare_exchange_weak_explicit(&w->inflight, &cur, cur - 1,
                                                    memory_order_relaxed, memory_order_relaxed));
}

void kvg_worker_pending_add(kvg_worker *w, uint32_t blocks)
{
    uint32_t cur = atomic_load_explicit(&w->pending, memory_order_relaxed);
    uint32_t next;
    do {
        next = blocks > UINT32_MAX - cur ? UINT32_MAX : cur + blocks;
    } while (!atomic_compare_exchange_weak_explicit(&w->pending, &cur, next, memory_order_relaxed,
                                                    memory_order_relaxed));
}

void kvg_worker_pending_done(kvg_worker *w, uint32_t blocks)
{
    uint32_t cur = atomic_load_explicit(&w->pending, memory_order_relaxed);
    uint32_t next;
    do {
        next = blocks > cur ? 0 : cur - blocks;
    } while (!atomic_compare_exchange_weak_explicit(&w->pending, &cur, next, memory_order_relaxed,
                                                    memory_order_relaxed));
}

uint32_t kvg_worker_pending(const kvg_worker *w)
{
    return atomic_load_explicit(&w->pending, memory_order_relaxed);
}

void kvg_worker_record(kvg_worker *w, int status, uint64_t duration_ns, uint64_t ttfb_ns)
{
    /* The status comes from an upstream peer; one outside the table is not counted by code. */
    worker_stats *st = worker_stripe(w);
    if (status >= 0 && status < WORKER_CODES)
        atomic_fetch_add_explicit(&st->codes[status], 1, memory_order_relaxed);
    kvg_prom_hist_observe(&st->duration, &kvg_router_latency_buckets, duration_ns);
    if (ttfb_ns)
        kvg_prom_hist_observe(&st->ttfb, &kvg_router_latency_buckets, ttfb_ns);
}

static const char *const outcome_names[KVG_USAGE_OUTCOME_COUNT] = {
    [KVG_USAGE_HIT_PREDICTED] = "hit_predicted",
    [KVG_USAGE_HIT_UNPREDICTED] = "hit_unpredicted",
    [KVG_USAGE_MISS_PREDICTED_HIT] = "miss_predicted_hit",
    [KVG_USAGE_MISS_PREDICTED] = "miss_predicted",
};

const char *kvg_usage_outcome_str(kvg_usage_outcome o)
{
    return (unsigned)o < KVG_USAGE_OUTCOME_COUNT ? outcome_names[o] : "?";
}

kvg_usage_outcome kvg_usage_outcome_of(uint64_t predicted_tokens, uint64_t cached_tokens)
{
    if (cached_tokens)
        return predicted_tokens ? KVG_USAGE_HIT_PREDICTED : KVG_USAGE_HIT_UNPREDICTED;
    return predicted_tokens ? KVG_USAGE_MISS_PREDICTED_HIT : KVG_USAGE_MISS_PREDICTED;
}

void kvg_worker_record_usage(kvg_worker *w, uint64_t predicted_tokens, int64_t prompt_tokens,
                             int64_t cached_tokens)
{
    worker_stats *st = worker_stripe(w);
    if (prompt_tokens < 0 || cached_tokens < 0) {
        atomic_fetch_add_explicit(&st->usage_unreported, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&st->usage_predicted, predicted_tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->usage_cached, (uint64_t)cached_tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->usage_prompt, (uint64_t)prompt_tokens, memory_order_relaxed);
    kvg_usage_outcome o = kvg_usage_outcome_of(predicted_tokens, (uint64_t)cached_tokens);
    atomic_fetch_add_explicit(&st->usage_outcomes[o], 1, memory_order_relaxed);
}

void kvg_worker_record_retry(kvg_worker *w)
{
    atomic_fetch_add_explicit(&worker_stripe(w)->retries, 1, memory_order_relaxed);
}

/* ---- passive outlier detection -------------------------------------------------------------- */

static const char *const outlier_result_names[KVG_OUTLIER_RESULT_COUNT] = {
    [KVG_OUTLIER_SUCCESS] = "success",
    [KVG_OUTLIER_5XX] = "5xx",
    [KVG_OUTLIER_GATEWAY_ERROR] = "gateway_error",
    [KVG_OUTLIER_LOCAL_FAILURE] = "local_failure",
};

const char *kvg_outlier_result_str(kvg_outlier_result r)
{
    return (unsigned)r < KVG_OUTLIER_RESULT_COUNT ? outlier_result_names[r] : "?";
}

kvg_outlier_result kvg_outlier_result_of_status(int status)
{
    if (status == 502 || status == 503 || status == 504)
        return KVG_OUTLIER_GATEWAY_ERROR;
    return status >= 500 && status <= 599 ? KVG_OUTLIER_5XX : KVG_OUTLIER_SUCCESS;
}

static uint32_t streak_inc(uint32_t v)
{
    return v < KVG_OUTLIER_STREAK_MAX ? v + 1 : v;
}

uint32_t kvg_outlier_step(uint32_t streaks, kvg_outlier_result r, const kvg_outlier_config *cfg,
                          bool *trip)
{
    uint32_t s5 = KVG_OUTLIER_5XX_STREAK(streaks), gw = KVG_OUTLIER_GATEWAY_STREAK(streaks);
    bool tripped = false;
    switch (r) {
    case KVG_OUTLIER_SUCCESS:
        s5 = gw = 0;
        break;
    case KVG_OUTLIER_5XX:
        /* A 500 is the engine's own error, not a gateway failure: that streak ends. */
        s5 = streak_inc(s5);
        gw = 0;
        break;
    default: /* gateway errors and local failures count in both, as Envoy maps them */
        s5 = streak_inc(s5);
        gw = streak_inc(gw);
        break;
    }
    if ((cfg->consecutive_5xx && s5 >= cfg->consecutive_5xx) ||
        (cfg->consecutive_gateway_failure && gw >= cfg->consecutive_gateway_failure)) {
        tripped = true;
        s5 = gw = 0;
    }
    if (trip)
        *trip = tripped;
    return s5 | gw << 16;
}

uint64_t kvg_outlier_ejection_ns(const kvg_outlier_config *cfg, uint32_t multiplier)
{
    uint64_t base = cfg->base_ejection_ns, max = KVG_MAX(cfg->max_ejection_ns, base);
    uint64_t m = multiplier ? multiplier : 1;
    if (base && m > max / base)
        return max;
    return KVG_MIN(base * m, max);
}

bool kvg_outlier_may_eject(size_t peers, size_t ejected, uint32_t max_percent)
{
    if (ejected + 1 >= peers)
        return false; /* the last worker of a group stays, however sick: better than none */
    if (ejected == 0)
        return true;
    return (uint64_t)(ejected + 1) * 100 <= (uint64_t)max_percent * peers;
}

bool kvg_retry_budget_allows(uint64_t retries_active, uint64_t requests_active, uint32_t percent,
                             uint32_t min_concurrency)
{
    uint64_t limit = requests_active * percent / 100;
    return retries_active < KVG_MAX(limit, (uint64_t)min_concurrency);
}

bool kvg_worker_ejected(const kvg_worker *w, uint64_t now_ns)
{
    return atomic_load_explicit(&w->eject_until_ns, memory_order_relaxed) > now_ns;
}

/* May w be ejected in group model (NULL: all workers) of set at now? */
static bool group_allows(const kvg_worker_set *set, const kvg_worker *w, const char *model,
                         uint64_t now, uint32_t percent)
{
    size_t peers = 0, ejected = 0;
    for (size_t i = 0; i < set->count; i++) {
        const kvg_worker *o = set->workers[i];
        if (!o->serves_all_models && model && !kvg_worker_serves(o, model))
            continue;
        peers++;
        if (o != w && kvg_worker_ejected(o, now))
            ejected++;
    }
    return kvg_outlier_may_eject(peers, ejected, percent);
}

/* The share is per model: every model w serves (all of the set's when it lists none). Ejections
 * are rare, so the scan over the snapshot is cheap enough. */
static bool set_allows(const kvg_worker_set *set, const kvg_worker *w, uint64_t now,
                       uint32_t percent)
{
    const char *const *models =
        w->spec->nmodels ? (const char *const *)w->spec->models : (const char *const *)set->models;
    size_t n = w->spec->nmodels ? w->spec->nmodels : set->nmodels;
    if (n == 0)
        return group_allows(set, w, NULL, now, percent);
    for (size_t i = 0; i < n; i++)
        if (!group_allows(set, w, models[i], now, percent))
            return false;
    return true;
}

bool kvg_worker_outlier_observe(kvg_worker *w, const kvg_worker_set *set, kvg_outlier_result r,
                                uint64_t now_ns, const kvg_outlier_config *cfg, uint64_t *for_ns)
{
    uint32_t old = atomic_load_explicit(&w->outlier_streaks, memory_order_relaxed), next;
    bool trip;
    do {
        next = kvg_outlier_step(old, r, cfg, &trip);
        if (next == old && !trip)
            break;
    } while (!atomic_compare_exchange_weak_explicit(&w->outlier_streaks, &old, next,
                                                    memory_order_relaxed, memory_order_relaxed));
    if (!trip)
        return false;
    uint64_t until = atomic_load_explicit(&w->eject_until_ns, memory_order_relaxed);
    if (until > now_ns)
        return false; /* answers of requests sent before the ejection: already out */
    if (set && !set_allows(set, w, now_ns, cfg->max_ejection_percent))
        return false;
    uint32_t mult = atomic_load_explicit(&w->eject_multiplier, memory_order_relaxed);
    /* A worker that stayed in for the longest ejection since its last one starts over. */
    if (until && now_ns - until >= cfg->max_ejection_ns)
        mult = 0;
    if (mult < UINT32_MAX)
        mult++;
    uint64_t len = kvg_outlier_ejection_ns(cfg, mult);
    if (!atomic_compare_exchange_strong_explicit(&w->eject_until_ns, &until, now_ns + len,
                                                 memory_order_relaxed, memory_order_relaxed))
        return false; /* another thread ejected it first */
    atomic_store_explicit(&w->eject_multiplier, mult, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->ejections, 1, memory_order_relaxed);
    if (for_ns)
        *for_ns = len;
    return true;
}

void kvg_worker_outlier_get(const kvg_worker *w, uint64_t now_ns, kvg_worker_outlier_state *out)
{
    uint64_t until = atomic_load_explicit(&w->eject_until_ns, memory_order_relaxed);
    uint32_t s = atomic_load_explicit(&w->outlier_streaks, memory_order_relaxed);
    *out = (kvg_worker_outlier_state){
        .ejected = until > now_ns,
        .remaining_ns = until > now_ns ? until - now_ns : 0,
        .consecutive_5xx = KVG_OUTLIER_5XX_STREAK(s),
        .consecutive_gateway_failures = KVG_OUTLIER_GATEWAY_STREAK(s),
        .multiplier = atomic_load_explicit(&w->eject_multiplier, memory_order_relaxed),
        .ejections = atomic_load_explicit(&w->ejections, memory_order_relaxed),
    };
}

void **kvg_worker_thread_slot(kvg_worker *w, unsigned thread)
{
    if (thread >= w->nthreads)
        return NULL;
    return &w->slots[thread];
}
