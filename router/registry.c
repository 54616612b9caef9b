/* SPDX-License-Identifier: Apache-2.0 */
/* The worker registry: two layers of definitions (config, admin) merged into immutable
 * refcounted snapshots that are swapped in on every change. */
#include "router_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_INFLIGHT 1024
#define DEFAULT_FALL 3
#define DEFAULT_RISE 2

/* A layer of definitions from one source, sorted by name. Replaced wholesale on change so a
 * failed mutation leaves the old one untouched. */
typedef struct layer {
    worker_spec **specs;
    size_t n;
} layer;

struct kvg_registry {
    unsigned nthreads;
    uint32_t default_max_inflight;
    unsigned fall, rise;
    /* Serialises mutations (and so the publishes); guards the layers. Held while building a
     * snapshot, never by readers. */
    pthread_mutex_t write_lock;
    kvg_snapshot_slot snapshots; /* of kvg_worker_set */
    layer layers[KVG_WORKER_SOURCE_COUNT];
    registry_retry_stats retry; /* the retry budget, across all threads */
};

/* The published snapshot, for the writer: write_lock held. */
static kvg_worker_set *current(const kvg_registry *reg)
{
    return kvg_worker_set_of(kvg_snapshot_slot_current(&reg->snapshots));
}

/* ---- snapshots ------------------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void set_free(kvg_snapshot *snap)
{
    kvg_worker_set *set = kvg_worker_set_of(snap);
    for (size_t i = 0; i < set->count; i++)
        kvg_worker_unref(set->workers[i]);
    free(set);
}

int kvg_router_set_new(kvg_worker **workers, size_t n, kvg_worker_set **out)
{
    size_t nmodels = 0;
    for (size_t i = 0; i < n; i++)
        nmodels += workers[i]->spec->nmodels;
    kvg_worker_set *set =
        malloc(sizeof(*set) + n * sizeof(kvg_worker *) + nmodels * sizeof(const char *));
    if (!set)
        return -ENOMEM;
    kvg_snapshot_init(&set->snap, set_free);
    set->count = n;
    set->workers = (kvg_worker **)(void *)(set + 1);
    set->models = (const char **)(void *)(set->workers + n);
    if (n)
        memcpy(set->workers, workers, n * sizeof(*workers));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < workers[i]->spec->nmodels; j++)
            set->models[k++] = workers[i]->spec->models[j];
    if (k > 1)
        qsort(set->models, k, sizeof(*set->models), cmp_str);
    size_t d = 0;
    for (size_t i = 0; i < k; i++)
        if (d == 0 || strcmp(set->models[d - 1], set->models[i]) != 0)
            set->models[d++] = set->models[i];
    set->nmodels = d;
    *out = set;
    return 0;
}

kvg_worker_set *kvg_worker_set_ref(kvg_worker_set *set)
{
    kvg_snapshot_ref(&set->snap);
    return set;
}

void kvg_worker_set_unref(kvg_worker_set *set)
{
    if (set)
        kvg_snapshot_unref(&set->snap);
}

uint64_t kvg_worker_set_generation(const kvg_worker_set *set)
{
    return kvg_snapshot_generation(&set->snap);
}

size_t kvg_worker_set_count(const kvg_worker_set *set)
{
    return set->count;
}

kvg_worker *kvg_worker_set_at(const kvg_worker_set *set, size_t i)
{
    return i < set->count ? set->workers[i] : NULL;
}

kvg_worker *kvg_worker_set_find(const kvg_worker_set *set, const char *name)
{
    size_t lo = 0, hi = set->count;
    if (!name)
        return NULL;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(set->workers[mid]->spec->name, name);
        if (c == 0)
            return set->workers[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *const *kvg_worker_set_models(const kvg_worker_set *set, size_t *n)
{
    *n = set->nmodels;
    return set->models;
}

/* ---- layers ---------------------------------------------------------------------------------- */

/* memcpy that tolerates the NULL array of an empty layer. */
static void copy_specs(worker_spec **dst, worker_spec *const *src, size_t n)
{
    if (n)
        memcpy(dst, src, n * sizeof(*dst));
}

/* Index of name in the layer, or the insertion point with *found false. */
static size_t layer_search(const layer *l, const char *name, bool *found)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(l->specs[mid]->name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* A copy of l with spec inserted or replacing the entry of the same name. The new layer holds
 * the caller's reference to spec and shares the others' (taken by layer_commit). */
static int layer_with(const layer *l, worker_spec *spec, layer *out)
{
    bool found;
    size_t at = layer_search(l, spec->name, &found);
    size_t n = found ? l->n : l->n + 1;
    if (!found && l->n >= KVG_REGISTRY_WORKERS_MAX)
        return KVG_ELIMIT;
    worker_spec **specs = malloc(n * sizeof(*specs));
    if (!specs)
        return -ENOMEM;
    copy_specs(specs, l->specs, at);
    specs[at] = spec;
    size_t rest = found ? l->n - at - 1 : l->n - at;
    if (rest) /* l->specs may be NULL when empty: no pointer arithmetic on it then */
        copy_specs(specs + at + 1, l->specs + (l->n - rest), rest);
    out->specs = specs;
    out->n = n;
    return 0;
}

static int layer_without(const layer *l, size_t at, layer *out)
{
    size_t n = l->n - 1;
    worker_spec **specs = malloc((n ? n : 1) * sizeof(*specs));
    if (!specs)
        return -ENOMEM;
    copy_specs(specs, l->specs, at);
    copy_specs(specs + at, l->specs + at + 1, n - at);
    out->specs = specs;
    out->n = n;
    return 0;
}

/* Install next as the layer: specs present in both keep their one reference, specs that
 * only the old layer had are released. next's specs that are new already carry theirs. */
static void layer_commit(layer *cur, layer next)
{
    size_t k = 0;
    for (size_t i = 0; i < cur->n; i++) {
        while (k < next.n && strcmp(next.specs[k]->name, cur->specs[i]->name) < 0)
            k++;
        if (k == next.n || next.specs[k] != cur->specs[i])
            kvg_router_spec_unref(cur->specs[i]);
    }
    free(cur->specs);
    *cur = next;
}

static void layer_done(layer *l)
{
    for (size_t i = 0; i < l->n; i++)
        kvg_router_spec_unref(l->specs[i]);
    free(l->specs);
    l->specs = NULL;
    l->n = 0;
}

/* ---- building and publishing -------------------------------------------------------------- */

/* Merge the two layers into a snapshot: admin wins over config by name. A worker of the
 * current snapshot with an identical definition is kept, with its health and counters. */
static int build(kvg_registry *reg, const layer *admin, const layer *config, kvg_worker_set **out)
{
    size_t cap = admin->n + config->n;
    kvg_worker **ws = malloc((cap ? cap : 1) * sizeof(*ws));
    if (!ws)
        return -ENOMEM;
    const kvg_worker_set *cur = current(reg);
    size_t n = 0, i = 0, j = 0, o = 0;
    int rc = 0;
    while (i < admin->n || j < config->n) {
        worker_spec *spec;
        kvg_worker_source src;
        int c = i == admin->n    ? 1
                : j == config->n ? -1
                                 : strcmp(admin->specs[i]->name, config->specs[j]->name);
        if (c <= 0) {
            spec = admin->specs[i++];
            src = KVG_WORKER_SOURCE_ADMIN;
            if (c == 0)
                j++; /* hidden by the admin definition */
        } else {
            spec = config->specs[j++];
            src = KVG_WORKER_SOURCE_CONFIG;
        }
        /* Everything is sorted by name: walk the current snapshot alongside, so a change
         * costs linear time even with thousands of workers. */
        while (o < cur->count && strcmp(cur->workers[o]->spec->name, spec->name) < 0)
            o++;
        if (o < cur->count && kvg_router_spec_equal(cur->workers[o]->spec, spec)) {
            ws[n++] = kvg_worker_ref(cur->workers[o]);
            continue;
        }
        rc = kvg_router_worker_new(kvg_router_spec_ref(spec), src, reg->nthreads, reg->fall,
                                   reg->rise, &ws[n]);
        if (rc < 0)
            goto fail_workers;
        n++;
    }
    rc = kvg_router_set_new(ws, n, out);
    if (rc < 0)
        goto fail_workers;
    free(ws);
    return 0;

fail_workers:
    for (size_t k = 0; k < n; k++)
        kvg_worker_unref(ws[k]);
    free(ws);
    return rc;
}

/* Swap next in (taking the caller's reference), then settle what the change implies for
 * workers shared with the old snapshot (source) and those that left it (retired). */
static void publish(kvg_registry *reg, kvg_worker_set *next)
{
    const layer *admin = &reg->layers[KVG_WORKER_SOURCE_ADMIN];
    size_t a = 0;
    for (size_t i = 0; i < next->count; i++) {
        kvg_worker *w = next->workers[i];
        while (a < admin->n && strcmp(admin->specs[a]->name, w->spec->name) < 0)
            a++;
        bool is_admin = a < admin->n && strcmp(admin->specs[a]->name, w->spec->name) == 0;
        atomic_store_explicit(&w->source,
                              is_admin ? KVG_WORKER_SOURCE_ADMIN : KVG_WORKER_SOURCE_CONFIG,
                              memory_order_relaxed);
    }

    kvg_worker_set *old =
        kvg_worker_set_of(kvg_snapshot_slot_publish(&reg->snapshots, &next->snap));

    size_t k = 0;
    for (size_t i = 0; i < old->count; i++) {
        kvg_worker *w = old->workers[i];
        while (k < next->count && strcmp(next->workers[k]->spec->name, w->spec->name) < 0)
            k++;
        if (k == next->count || next->workers[k] != w)
            kvg_router_worker_set_retired(w);
    }
    kvg_worker_set_unref(old);
}

/* ---- public API --------------------------------------------------------------------------- */

int kvg_registry_new(const kvg_registry_config *cfg, kvg_registry **out)
{
    static const kvg_registry_config defaults = {0};
    int rc;
    if (!out)
        return -EINVAL;
    if (!cfg)
        cfg = &defaults;
    if (cfg->nthreads > REGISTRY_THREADS_MAX || cfg->health_fall > HEALTH_THRESHOLD_MAX ||
        cfg->health_rise > HEALTH_THRESHOLD_MAX)
        return -EINVAL;

    kvg_registry *reg = calloc(1, sizeof(*reg));
    if (!reg)
        return -ENOMEM;
    reg->nthreads = cfg->nthreads ? cfg->nthreads : 1;
    reg->default_max_inflight =
        cfg->default_max_inflight ? cfg->default_max_inflight : DEFAULT_MAX_INFLIGHT;
    reg->fall = cfg->health_fall ? cfg->health_fall : DEFAULT_FALL;
    reg->rise = cfg->health_rise ? cfg->health_rise : DEFAULT_RISE;

    kvg_worker_set *empty;
    rc = -pthread_mutex_init(&reg->write_lock, NULL);
    if (rc < 0)
        goto fail_reg;
    rc = kvg_router_set_new(NULL, 0, &empty);
    if (rc < 0)
        goto fail_write_lock;
    rc = kvg_snapshot_slot_init(&reg->snapshots, &empty->snap);
    if (rc < 0)
        goto fail_empty;
    *out = reg;
    return 0;

fail_empty:
    kvg_worker_set_unref(empty);
fail_write_lock:
    pthread_mutex_destroy(&reg->write_lock);
fail_reg:
    free(reg);
    return rc;
}

void kvg_registry_free(kvg_registry *reg)
{
    if (!reg)
        return;
    const kvg_worker_set *cur = current(reg);
    for (size_t i = 0; i < cur->count; i++)
        kvg_router_worker_set_retired(cur->workers[i]);
    kvg_snapshot_slot_done(&reg->snapshots);
    for (size_t i = 0; i < KVG_WORKER_SOURCE_COUNT; i++)
        layer_done(&reg->layers[i]);
    pthread_mutex_destroy(&reg->write_lock);
    free(reg);
}

int kvg_registry_put(kvg_registry *reg, const kvg_worker_def *def, kvg_worker_source source,
                     char *msg, size_t msg_len)
{
    worker_spec *spec;
    layer next;
    kvg_worker_set *set;
    if ((unsigned)source >= KVG_WORKER_SOURCE_COUNT)
        return -EINVAL;
    int rc = kvg_router_spec_new(def, reg->default_max_inflight, msg, msg_len, &spec);
    if (rc == KVG_ELIMIT)
        rc = KVG_EPARSE; /* the contract: any bad definition is a parse error */
    if (rc < 0)
        return rc;

    pthread_mutex_lock(&reg->write_lock);
    layer *cur = &reg->layers[source];
    rc = layer_with(cur, spec, &next);
    if (rc < 0) {
        if (rc == KVG_ELIMIT && msg && msg_len)
            snprintf(msg, msg_len, "too many workers (at most %d)", KVG_REGISTRY_WORKERS_MAX);
        goto fail_spec;
    }
    const layer *admin =
        source == KVG_WORKER_SOURCE_ADMIN ? &next : &reg->layers[KVG_WORKER_SOURCE_ADMIN];
    const layer *config =
        source == KVG_WORKER_SOURCE_CONFIG ? &next : &reg->layers[KVG_WORKER_SOURCE_CONFIG];
    rc = build(reg, admin, config, &set);
    if (rc < 0)
        goto fail_layer;

    kvg_worker *w = kvg_worker_set_find(set, spec->name);
    bool hidden = false;
    if (source == KVG_WORKER_SOURCE_CONFIG)
        layer_search(&reg->layers[KVG_WORKER_SOURCE_ADMIN], spec->name, &hidden);
    if (!hidden)
        atomic_store_explicit(&w->draining, false, memory_order_relaxed);
    layer_commit(cur, next);
    publish(reg, set);
    pthread_mutex_unlock(&reg->write_lock);
    return 0;

fail_layer:
    free(next.specs);
fail_spec:
    pthread_mutex_unlock(&reg->write_lock);
    kvg_router_spec_unref(spec);
    if (rc == -ENOMEM && msg && msg_len)
        snprintf(msg, msg_len, "out of memory");
    return rc;
}

int kvg_registry_remove(kvg_registry *reg, const char *name)
{
    layer next;
    kvg_worker_set *set;
    int rc;
    if (!name)
        return KVG_ENOTFOUND;
    pthread_mutex_lock(&reg->write_lock);
    layer *admin = &reg->layers[KVG_WORKER_SOURCE_ADMIN];
    layer *config = &reg->layers[KVG_WORKER_SOURCE_CONFIG];
    bool found;
    layer *cur = admin;
    size_t at = layer_search(admin, name, &found);
    if (!found) {
        cur = config;
        at = layer_search(config, name, &found);
    }
    if (!found) {
        rc = KVG_ENOTFOUND;
        goto out;
    }
    rc = layer_without(cur, at, &next);
    if (rc < 0)
        goto out;
    rc = build(reg, cur == admin ? &next : admin, cur == config ? &next : config, &set);
    if (rc < 0) {
        free(next.specs);
        goto out;
    }
    layer_commit(cur, next);
    publish(reg, set);
out:
    pthread_mutex_unlock(&reg->write_lock);
    return rc;
}

int kvg_registry_drain(kvg_registry *reg, const char *name)
{
    kvg_worker_set *set;
    int rc;
    pthread_mutex_lock(&reg->write_lock);
    kvg_worker *w = name ? kvg_worker_set_find(current(reg), name) : NULL;
    if (!w) {
        rc = KVG_ENOTFOUND;
        goto out;
    }
    /* Same workers, new generation: threads that cache per-generation candidate lists notice. */
    rc = build(reg, &reg->layers[KVG_WORKER_SOURCE_ADMIN], &reg->layers[KVG_WORKER_SOURCE_CONFIG],
               &set);
    if (rc < 0)
        goto out;
    atomic_store_explicit(&w->draining, true, memory_order_relaxed);
    publish(reg, set);
out:
    pthread_mutex_unlock(&reg->write_lock);
    return rc;
}

static int cmp_spec(const void *a, const void *b)
{
    return strcmp((*(worker_spec *const *)a)->name, (*(worker_spec *const *)b)->name);
}

/* Replace the whole layer of one source by defs: checked first, then one snapshot. */
static int replace_layer(kvg_registry *reg, kvg_worker_source source, const kvg_worker_def *defs,
                         size_t n, char *msg, size_t msg_len)
{
    char why[256];
    layer next = {0};
    kvg_worker_set *set;
    int rc;
    if (msg && msg_len)
        msg[0] = '\0';
    if (n > KVG_REGISTRY_WORKERS_MAX) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "too many workers (at most %d)", KVG_REGISTRY_WORKERS_MAX);
        return KVG_ELIMIT;
    }
    if (n && !defs)
        return -EINVAL;
    next.specs = malloc((n ? n : 1) * sizeof(*next.specs));
    if (!next.specs) {
        rc = -ENOMEM;
        goto fail;
    }
    for (; next.n < n; next.n++) {
        const kvg_worker_def *def = &defs[next.n];
        rc = kvg_router_spec_new(def, reg->default_max_inflight, why, sizeof(why),
                                 &next.specs[next.n]);
        if (rc < 0) {
            if (rc != -ENOMEM && msg && msg_len) {
                /* Name the worker by name when the name itself is sound. */
                if (kvg_worker_name_validate(def->name, NULL, 0) == 0)
                    snprintf(msg, msg_len, "worker \"%s\": %s", def->name, why);
                else
                    snprintf(msg, msg_len, "workers[%zu]: %s", next.n, why);
            }
            if (rc == KVG_ELIMIT)
                rc = KVG_EPARSE;
            goto fail;
        }
    }
    if (n > 1)
        qsort(next.specs, n, sizeof(*next.specs), cmp_spec);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(next.specs[i - 1]->name, next.specs[i]->name) == 0) {
            if (msg && msg_len)
                snprintf(msg, msg_len, "worker \"%s\": defined more than once",
                         next.specs[i]->name);
            rc = KVG_EPARSE;
            goto fail;
        }
    }

    pthread_mutex_lock(&reg->write_lock);
    const layer *admin =
        source == KVG_WORKER_SOURCE_ADMIN ? &next : &reg->layers[KVG_WORKER_SOURCE_ADMIN];
    const layer *config =
        source == KVG_WORKER_SOURCE_CONFIG ? &next : &reg->layers[KVG_WORKER_SOURCE_CONFIG];
    rc = build(reg, admin, config, &set);
    if (rc < 0) {
        pthread_mutex_unlock(&reg->write_lock);
        goto fail;
    }
    layer_done(&reg->layers[source]);
    reg->layers[source] = next;
    publish(reg, set);
    pthread_mutex_unlock(&reg->write_lock);
    return 0;

fail:
    if (rc == -ENOMEM && msg && msg_len)
        snprintf(msg, msg_len, "out of memory");
    layer_done(&next);
    return rc;
}

int kvg_registry_replace_config(kvg_registry *reg, const kvg_worker_def *defs, size_t n, char *msg,
                                size_t msg_len)
{
    return replace_layer(reg, KVG_WORKER_SOURCE_CONFIG, defs, n, msg, msg_len);
}

/* ---- the admin layer as JSON (state file) ------------------------------------------------- */

/* A spec as the definition it was made from (the models point into the spec). */
static kvg_worker_def spec_def(const worker_spec *s)
{
    return (kvg_worker_def){
        .name = s->name,
        .url = s->url,
        .models = (const char *const *)s->models,
        .nmodels = s->nmodels,
        .kv_blocks = s->kv_blocks,
        .max_inflight = s->max_inflight_defined,
        .no_cache_salt = s->no_cache_salt,
        .kv_events = s->kv_events,
        .kv_events_replay = s->kv_events_replay,
        .kv_events_stale_ms = s->kv_events_stale_ms,
    };
}

void kvg_registry_admin_to_json(kvg_registry *reg, kvg_buf *out)
{
    pthread_mutex_lock(&reg->write_lock);
    const layer *l = &reg->layers[KVG_WORKER_SOURCE_ADMIN];
    kvg_buf_putc(out, '[');
    for (size_t i = 0; i < l->n; i++) {
        kvg_worker_def def = spec_def(l->specs[i]);
        kvg_buf_puts(out, i ? ",\n" : "\n");
        kvg_fields_encode(&kvg_worker_fields, &def, KVG_SET_STATE, out);
    }
    kvg_buf_puts(out, l->n ? "\n]" : "]");
    pthread_mutex_unlock(&reg->write_lock);
}

/* Name a worker's message by its name when that is sound, else by its position. */
static void name_worker(const kvg_json *o, size_t i, const char *why, char *msg, size_t msg_len)
{
    const kvg_json *name = o->type == KVG_JSON_OBJECT ? kvg_json_get(o, "name") : NULL;
    const char *s =
        name && name->type == KVG_JSON_STRING && !memchr(name->u.str.ptr, '\0', name->u.str.len)
            ? name->u.str.ptr
            : NULL;
    if (s && kvg_worker_name_validate(s, NULL, 0) == 0)
        snprintf(msg, msg_len, "worker \"%s\": %s", s, why);
    else
        snprintf(msg, msg_len, "workers[%zu]: %s", i, why);
}

int kvg_registry_admin_from_json(kvg_registry *reg, const kvg_json *arr, char *msg, size_t msg_len)
{
    char why[200];
    int rc;
    if (msg && msg_len)
        msg[0] = '\0';
    if (!arr)
        return -EINVAL;
    if (arr->type != KVG_JSON_ARRAY) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "must be an array of worker objects");
        return KVG_EPARSE;
    }
    size_t n = arr->u.arr.count;
    if (n > KVG_REGISTRY_WORKERS_MAX) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "too many workers (at most %d)", KVG_REGISTRY_WORKERS_MAX);
        return KVG_ELIMIT;
    }
    /* The definitions borrow their strings from arr; their model lists come from the arena. */
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_worker_def *defs = malloc((n ? n : 1) * sizeof(*defs));
    kvg_fields_ctx c = {.from = KVG_SET_STATE, .arena = &arena, .msg = why, .msg_len = sizeof(why)};
    rc = defs ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const kvg_json *o = arr->u.arr.items[i];
        kvg_fields_defaults(&kvg_worker_fields, &defs[i]);
        rc = kvg_fields_decode(&kvg_worker_fields, &defs[i], o, "", &c);
        if (rc < 0 && rc != -ENOMEM && msg && msg_len)
            name_worker(o, i, why, msg, msg_len);
    }
    if (rc == 0)
        rc = replace_layer(reg, KVG_WORKER_SOURCE_ADMIN, defs, n, msg, msg_len);
    else if (rc == -ENOMEM && msg && msg_len)
        snprintf(msg, msg_len, "out of memory");
    free(defs);
    kvg_arena_done(&arena);
    return rc;
}

uint64_t kvg_registry_generation(const kvg_registry *reg)
{
    return kvg_snapshot_slot_generation(&reg->snapshots);
}

kvg_worker_set *kvg_registry_acquire(kvg_registry *reg)
{
    return kvg_worker_set_of(kvg_snapshot_slot_acquire(&reg->snapshots));
}

kvg_snapshot_slot *kvg_registry_snapshots(kvg_registry *reg)
{
    return &reg->snapshots;
}

/* ---- the retry budget ----------------------------------------------------------------------- */

registry_retry_stats *kvg_router_retry_stats(kvg_registry *reg)
{
    return &reg->retry;
}

bool kvg_registry_retry_acquire(kvg_registry *reg, const kvg_worker_set *set, uint32_t percent,
                                uint32_t min_concurrency)
{
    /* Requests in flight: what the workers of the snapshot hold, all threads together. A sum
     * over the fleet per retry is cheap next to the retry itself. */
    uint64_t requests = 0;
    for (size_t i = 0; i < set->count; i++)
        requests += atomic_load_explicit(&set->workers[i]->inflight, memory_order_relaxed);
    uint64_t cur = atomic_load_explicit(&reg->retry.active, memory_order_relaxed);
    do {
        if (!kvg_retry_budget_allows(cur, requests, percent, min_concurrency)) {
            atomic_fetch_add_explicit(&reg->retry.refused, 1, memory_order_relaxed);
            return false;
        }
    } while (!atomic_compare_exchange_weak_explicit(&reg->retry.active, &cur, cur + 1,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

void kvg_registry_retry_release(kvg_registry *reg)
{
    uint64_t cur = atomic_load_explicit(&reg->retry.active, memory_order_relaxed);
    do {
        if (cur == 0)
            return; /* a release without an acquire: never wrap */
    } while (!atomic_compare_exchange_weak_explicit(&reg->retry.active, &cur, cur - 1,
                                                    memory_order_relaxed, memory_order_relaxed));
}
