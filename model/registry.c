/* SPDX-License-Identifier: Apache-2.0 */
/* The model registry: two layers of definitions (config, admin) whose loaded models are merged
 * into immutable refcounted snapshots, each with a hash table for the per-request lookup. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "model_int.h"

/*
 * An entry is one definition with what became of it: its loaded model, or (admin layer only)
 * the reason it could not be loaded. Entries are immutable and refcounted: the layers and the
 * snapshots share them, so that an unchanged definition keeps its model across every change
 * (a tokenizer.json is ~10 MB and ~100 ms to load; a reload must not read it again).
 *
 * Why an admin definition may stay without a model: the state file (and the shared state in
 * Redis) is the operator's record of what they defined. A model whose file is missing on this
 * host at start-up, or on a replica that applies another's document, is kept as a definition,
 * logged, and left out of the snapshots (its requests are routed in byte mode, or by the config
 * model of that name when there is one); it is written back to the state unchanged, and loaded
 * again at the next reload (SIGHUP) or when the operator puts it again. A definition the admin
 * API puts is loaded first and refused if it cannot be: only restored ones are kept unloaded.
 */
typedef struct entry {
    _Atomic size_t refs;
    kvg_model *model; /* owned; NULL: not loaded (error says why) */
    kvg_model_def def;
    char *strings; /* def's strings, one block (the model's own when loaded) */
    char *error;   /* owned; NULL when loaded */
} entry;

typedef struct layer {
    entry **entries; /* sorted by name, one reference each */
    size_t n;
} layer;

struct kvg_model_set {
    kvg_snapshot snap; /* first: a set is its snapshot */
    size_t count;
    entry **entries;          /* loaded ones, sorted by name, one reference each */
    kvg_model_source *source; /* of each */
    uint32_t *slots;          /* open addressing: index + 1, 0 empty; mask + 1 of them */
    uint32_t mask;
};
_Static_assert(offsetof(kvg_model_set, snap) == 0, "a model set is its snapshot");

struct kvg_model_registry {
    /* Serialises the publishes and guards the layers; never held across a file load. */
    pthread_mutex_t write_lock;
    kvg_snapshot_slot snapshots;
    layer layers[KVG_MODEL_SOURCE_COUNT];
};

/* ---- entries --------------------------------------------------------------------------------- */

static entry *entry_ref(entry *e)
{
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    return e;
}

static void entry_unref(entry *e)
{
    if (!e || atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1)
        return;
    kvg_model_free(e->model);
    free(e->strings);
    free(e->error);
    free(e);
}

static bool str_eq(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

static bool def_equal(const kvg_model_def *a, const kvg_model_def *b)
{
    return str_eq(a->name, b->name) && str_eq(a->tokenizer, b->tokenizer) &&
           str_eq(a->tokenizer_config, b->tokenizer_config) &&
           str_eq(a->chat_template, b->chat_template) && a->hash_algo == b->hash_algo &&
           str_eq(a->hash_seed, b->hash_seed) && a->block_size == b->block_size &&
           a->token_cache_mib == b->token_cache_mib;
}

/* A loaded model as an entry (taking m). */
static int entry_loaded(kvg_model *m, entry **out)
{
    entry *e = calloc(1, sizeof(*e));
    if (!e) {
        kvg_model_free(m);
        return -ENOMEM;
    }
    atomic_init(&e->refs, 1);
    e->model = m;
    kvg_model_get_def(m, &e->def);
    *out = e;
    return 0;
}

/* A definition kept without a model: copies of its strings, and why. */
static int entry_failed(const kvg_model_def *def, const char *why, entry **out)
{
    const char *src[] = {def->name, def->tokenizer, def->tokenizer_config, def->chat_template,
                         def->hash_seed};
    size_t total = 0;
    for (size_t i = 0; i < KVG_ARRAY_LEN(src); i++)
        total += src[i] ? strlen(src[i]) + 1 : 0;
    entry *e = calloc(1, sizeof(*e));
    char *s = malloc(total ? total : 1);
    char *err = strdup(why && why[0] ? why : "not loaded");
    if (!e || !s || !err) {
        free(e);
        free(s);
        free(err);
        return -ENOMEM;
    }
    atomic_init(&e->refs, 1);
    e->strings = s;
    e->error = err;
    e->def = *def;
    const char **dst[] = {&e->def.name, &e->def.tokenizer, &e->def.tokenizer_config,
                          &e->def.chat_template, &e->def.hash_seed};
    for (size_t i = 0; i < KVG_ARRAY_LEN(src); i++) {
        if (!src[i]) {
            *dst[i] = NULL;
            continue;
        }
        size_t n = strlen(src[i]) + 1;
        memcpy(s, src[i], n);
        *dst[i] = s;
        s += n;
    }
    *out = e;
    return 0;
}

/* ---- snapshots ------------------------------------------------------------------------------- */

static void set_free(kvg_snapshot *snap)
{
    kvg_model_set *set = kvg_model_set_of(snap);
    for (size_t i = 0; i < set->count; i++)
        entry_unref(set->entries[i]);
    free(set);
}

static uint64_t name_hash(const char *name, size_t len)
{
    return XXH3_64bits(name, len);
}

/* A set over the loaded entries of both layers (sorted by name each), the admin one hiding a
 * config one of the same name. */
static int set_build(const layer *admin, const layer *config, kvg_model_set **out)
{
    size_t cap = 0;
    for (size_t i = 0; i < admin->n; i++)
        cap += admin->entries[i]->model != NULL;
    for (size_t i = 0; i < config->n; i++)
        cap += config->entries[i]->model != NULL;
    uint32_t nslots = 8;
    while (nslots < 2 * cap)
        nslots <<= 1;
    kvg_model_set *set = calloc(1, sizeof(*set) + cap * (sizeof(entry *) + sizeof(int)) +
                                       nslots * sizeof(uint32_t) + 8);
    if (!set)
        return -ENOMEM;
    kvg_snapshot_init(&set->snap, set_free);
    set->entries = (entry **)(void *)(set + 1);
    set->source = (kvg_model_source *)(void *)(set->entries + cap);
    set->slots = (uint32_t *)(void *)(((uintptr_t)(set->source + cap) + 7) & ~(uintptr_t)7);
    set->mask = nslots - 1;
    _Static_assert(sizeof(kvg_model_source) == sizeof(int), "sources are int-sized");

    size_t a = 0, c = 0, n = 0;
    while (a < admin->n || c < config->n) {
        entry *ea = a < admin->n ? admin->entries[a] : NULL;
        entry *ec = c < config->n ? config->entries[c] : NULL;
        int cmp = !ea ? 1 : !ec ? -1 : strcmp(ea->def.name, ec->def.name);
        entry *pick = NULL;
        kvg_model_source src = KVG_MODEL_SOURCE_ADMIN;
        if (cmp < 0) {
            pick = ea->model ? ea : NULL;
            a++;
        } else if (cmp > 0) {
            pick = ec->model ? ec : NULL;
            src = KVG_MODEL_SOURCE_CONFIG;
            c++;
        } else {
            /* same name: the admin's, unless it is not loaded */
            pick = ea->model ? ea : ec->model ? ec : NULL;
            src = ea->model ? KVG_MODEL_SOURCE_ADMIN : KVG_MODEL_SOURCE_CONFIG;
            a++;
            c++;
        }
        if (!pick)
            continue;
        set->entries[n] = entry_ref(pick);
        set->source[n] = src;
        n++;
    }
    set->count = n;
    for (size_t i = 0; i < n; i++) {
        const kvg_model *m = set->entries[i]->model;
        uint32_t s = (uint32_t)name_hash(m->name, m->name_len) & set->mask;
        while (set->slots[s])
            s = (s + 1) & set->mask;
        set->slots[s] = (uint32_t)i + 1;
    }
    *out = set;
    return 0;
}

kvg_model_set *kvg_model_set_ref(kvg_model_set *set)
{
    kvg_snapshot_ref(&set->snap);
    return set;
}

void kvg_model_set_unref(kvg_model_set *set)
{
    if (set)
        kvg_snapshot_unref(&set->snap);
}

size_t kvg_model_set_count(const kvg_model_set *set)
{
    return set->count;
}

const kvg_model *kvg_model_set_at(const kvg_model_set *set, size_t i, kvg_model_source *source)
{
    if (i >= set->count)
        return NULL;
    if (source)
        *source = set->source[i];
    return set->entries[i]->model;
}

const kvg_model *kvg_model_set_find(const kvg_model_set *set, const char *name, size_t len)
{
    if (!set || !set->count || !name)
        return NULL;
    uint32_t s = (uint32_t)name_hash(name, len) & set->mask;
    /* At most half the slots are used: the probe ends at an empty one. */
    for (uint32_t idx; (idx = set->slots[s]) != 0; s = (s + 1) & set->mask) {
        const kvg_model *m = set->entries[idx - 1]->model;
        if (m->name_len == len && memcmp(m->name, name, len) == 0)
            return m;
    }
    return NULL;
}

/* ---- layers ---------------------------------------------------------------------------------- */

static size_t layer_search(const layer *l, const char *name, bool *found)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(l->entries[mid]->def.name, name);
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

static void layer_done(layer *l)
{
    for (size_t i = 0; i < l->n; i++)
        entry_unref(l->entries[i]);
    free(l->entries);
    *l = (layer){0};
}

/* A copy of l (new references) with e put in at its name (taking the caller's reference);
 * remove: without the entry at index at instead. */
static int layer_copy_with(const layer *l, entry *e, layer *out)
{
    bool found;
    size_t at = layer_search(l, e->def.name, &found);
    size_t n = found ? l->n : l->n + 1;
    if (!found && l->n >= KVG_MODELS_MAX)
        return KVG_ELIMIT;
    entry **v = malloc(n * sizeof(*v));
    if (!v)
        return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (i == at) {
            v[k++] = e;
            if (found)
                continue; /* replaced */
        }
        v[k++] = entry_ref(l->entries[i]);
    }
    if (at == l->n)
        v[k++] = e;
    *out = (layer){v, n};
    return 0;
}

static int layer_copy_without(const layer *l, size_t at, layer *out)
{
    entry **v = malloc((l->n > 1 ? l->n - 1 : 1) * sizeof(*v));
    if (!v)
        return -ENOMEM;
    for (size_t i = 0, k = 0; i < l->n; i++)
        if (i != at)
            v[k++] = entry_ref(l->entries[i]);
    *out = (layer){v, l->n - 1};
    return 0;
}

/* A loaded entry of either layer with exactly def, with a new reference; NULL when none.
 * write_lock held. */
static entry *find_loaded(kvg_model_registry *reg, const kvg_model_def *def)
{
    for (size_t s = 0; s < KVG_MODEL_SOURCE_COUNT; s++) {
        bool found;
        const layer *l = &reg->layers[s];
        size_t at = layer_search(l, def->name, &found);
        if (found && l->entries[at]->model && def_equal(&l->entries[at]->def, def))
            return entry_ref(l->entries[at]);
    }
    return NULL;
}

/* Replace the layer of source by next (taken) and publish the snapshot of the result. On
 * error next is freed and nothing changes. write_lock held. */
static int commit(kvg_model_registry *reg, kvg_model_source source, layer *next)
{
    const layer *admin =
        source == KVG_MODEL_SOURCE_ADMIN ? next : &reg->layers[KVG_MODEL_SOURCE_ADMIN];
    const layer *config =
        source == KVG_MODEL_SOURCE_CONFIG ? next : &reg->layers[KVG_MODEL_SOURCE_CONFIG];
    kvg_model_set *set;
    int rc = set_build(admin, config, &set);
    if (rc < 0) {
        layer_done(next);
        return rc;
    }
    layer_done(&reg->layers[source]);
    reg->layers[source] = *next;
    *next = (layer){0};
    kvg_snapshot_unref(kvg_snapshot_slot_publish(&reg->snapshots, &set->snap));
    return 0;
}

/* ---- public API ------------------------------------------------------------------------------ */

int kvg_model_registry_new(kvg_model_registry **out)
{
    static const layer empty = {0};
    kvg_model_registry *reg = calloc(1, sizeof(*reg));
    if (!reg)
        return -ENOMEM;
    int rc = -pthread_mutex_init(&reg->write_lock, NULL);
    if (rc < 0)
        goto fail_reg;
    kvg_model_set *set;
    rc = set_build(&empty, &empty, &set);
    if (rc < 0)
        goto fail_lock;
    rc = kvg_snapshot_slot_init(&reg->snapshots, &set->snap);
    if (rc < 0)
        goto fail_set;
    *out = reg;
    return 0;

fail_set:
    kvg_model_set_unref(set);
fail_lock:
    pthread_mutex_destroy(&reg->write_lock);
fail_reg:
    free(reg);
    return rc;
}

void kvg_model_registry_free(kvg_model_registry *reg)
{
    if (!reg)
        return;
    kvg_snapshot_slot_done(&reg->snapshots);
    for (size_t i = 0; i < KVG_MODEL_SOURCE_COUNT; i++)
        layer_done(&reg->layers[i]);
    pthread_mutex_destroy(&reg->write_lock);
    free(reg);
}

/* Each file def names must be a regular file, checked before the load opens it: open() of a
 * FIFO waits for a writer, and a definition naming one (or a device) would hold the admin
 * API's thread for good. A file that is missing is left to the load, which says so. */
static int check_files(const kvg_model_def *def, char *msg, size_t msg_len)
{
    const char *paths[] = {def->tokenizer, def->tokenizer_config, def->chat_template};
    const char *names[] = {"tokenizer", "tokenizer_config", "chat_template"};
    for (size_t i = 0; i < KVG_ARRAY_LEN(paths); i++) {
        struct stat st;
        if (!paths[i] || stat(paths[i], &st) != 0 || S_ISREG(st.st_mode))
            continue;
        if (msg && msg_len)
            snprintf(msg, msg_len, "%s %s: not a regular file", names[i], paths[i]);
        return KVG_EPARSE;
    }
    return 0;
}

/* The entry for def: the loaded one of an identical definition, else a new load (outside the
 * lock). 0 and *out; the load's error with msg otherwise. */
static int obtain(kvg_model_registry *reg, const kvg_model_def *def, entry **out, char *msg,
                  size_t msg_len)
{
    int rc = kvg_model_def_validate(def, msg, msg_len); /* a name to look up, first */
    if (rc < 0)
        return rc == KVG_ELIMIT ? KVG_EPARSE : rc; /* a bad definition, not a full registry */
    pthread_mutex_lock(&reg->write_lock);
    entry *e = find_loaded(reg, def);
    pthread_mutex_unlock(&reg->write_lock);
    if (e) {
        *out = e;
        return 0;
    }
    kvg_model *m;
    rc = check_files(def, msg, msg_len);
    if (rc == 0)
        rc = kvg_model_load(def, &m, msg, msg_len);
    if (rc < 0)
        return rc;
    return entry_loaded(m, out);
}

int kvg_model_registry_put(kvg_model_registry *reg, const kvg_model_def *def,
                           kvg_model_source source, char *msg, size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (!reg || !def || (unsigned)source >= KVG_MODEL_SOURCE_COUNT)
        return -EINVAL;
    entry *e;
    int rc = obtain(reg, def, &e, msg, msg_len);
    if (rc < 0)
        return rc;
    layer next;
    pthread_mutex_lock(&reg->write_lock);
    rc = layer_copy_with(&reg->layers[source], e, &next);
    if (rc < 0) {
        pthread_mutex_unlock(&reg->write_lock);
        entry_unref(e);
        if (msg && msg_len && rc == KVG_ELIMIT)
            snprintf(msg, msg_len, "too many models (at most %d)", KVG_MODELS_MAX);
        else if (msg && msg_len)
            snprintf(msg, msg_len, "out of memory");
        return rc;
    }
    rc = commit(reg, source, &next);
    pthread_mutex_unlock(&reg->write_lock);
    if (rc < 0 && msg && msg_len)
        snprintf(msg, msg_len, "out of memory");
    return rc;
}

int kvg_model_registry_remove(kvg_model_registry *reg, const char *name)
{
    if (!reg || !name)
        return KVG_ENOTFOUND;
    pthread_mutex_lock(&reg->write_lock);
    int rc = KVG_ENOTFOUND;
    for (size_t s = KVG_MODEL_SOURCE_COUNT; s-- > 0;) { /* the admin's first, as workers */
        bool found;
        size_t at = layer_search(&reg->layers[s], name, &found);
        if (!found)
            continue;
        layer next;
        rc = layer_copy_without(&reg->layers[s], at, &next);
        if (rc == 0)
            rc = commit(reg, (kvg_model_source)s, &next);
        break;
    }
    pthread_mutex_unlock(&reg->write_lock);
    return rc;
}

/* Whether a name can be shown in a message (the definition's rule for names). */
static bool name_sound(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > KVG_MODEL_DEF_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return false;
    return true;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp((*(entry *const *)a)->def.name, (*(entry *const *)b)->def.name);
}

/* Sort a new layer and refuse a name given twice. */
static int layer_sort(layer *l, char *msg, size_t msg_len)
{
    if (l->n > 1)
        qsort(l->entries, l->n, sizeof(*l->entries), cmp_entry);
    for (size_t i = 1; i < l->n; i++) {
        if (strcmp(l->entries[i - 1]->def.name, l->entries[i]->def.name) == 0) {
            if (msg && msg_len)
                snprintf(msg, msg_len, "model \"%s\": defined more than once",
                         l->entries[i]->def.name);
            return KVG_EPARSE;
        }
    }
    return 0;
}

/* Retry the admin definitions that are not loaded (a reload: their files may be back). What
 * loads replaces its entry if that is still the one in the layer; what does not is logged. */
static void retry_failed(kvg_model_registry *reg)
{
    pthread_mutex_lock(&reg->write_lock);
    const layer *l = &reg->layers[KVG_MODEL_SOURCE_ADMIN];
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        n += l->entries[i]->model == NULL;
    entry **failed = n ? malloc(n * sizeof(*failed)) : NULL;
    n = 0;
    for (size_t i = 0; failed && i < l->n; i++)
        if (!l->entries[i]->model)
            failed[n++] = entry_ref(l->entries[i]);
    pthread_mutex_unlock(&reg->write_lock);
    for (size_t i = 0; i < n; i++) {
        char why[512];
        kvg_model *m;
        entry *e = NULL;
        int rc = check_files(&failed[i]->def, why, sizeof(why));
        if (rc == 0)
            rc = kvg_model_load(&failed[i]->def, &m, why, sizeof(why));
        if (rc == 0)
            rc = entry_loaded(m, &e);
        if (rc < 0) {
            kvg_log_error("model \"%s\" (admin) still not loaded: %s", failed[i]->def.name,
                          rc == -ENOMEM ? kvg_strerror(rc) : why);
            entry_unref(failed[i]);
            continue;
        }
        pthread_mutex_lock(&reg->write_lock);
        bool found;
        layer *admin = &reg->layers[KVG_MODEL_SOURCE_ADMIN];
        size_t at = layer_search(admin, failed[i]->def.name, &found);
        layer next;
        if (found && admin->entries[at] == failed[i]) {
            rc = layer_copy_with(admin, entry_ref(e), &next);
            if (rc < 0)
                entry_unref(e); /* the reference the layer did not take */
            else
                rc = commit(reg, KVG_MODEL_SOURCE_ADMIN, &next);
            if (rc == 0)
                kvg_log_info("model \"%s\" (admin) loaded", e->def.name);
        }
        pthread_mutex_unlock(&reg->write_lock);
        entry_unref(e);
        entry_unref(failed[i]);
    }
    free(failed);
}

int kvg_model_registry_replace_config(kvg_model_registry *reg, const kvg_model_def *defs, size_t n,
                                      char *msg, size_t msg_len)
{
    char why[512];
    if (msg && msg_len)
        msg[0] = '\0';
    if (!reg || (n && !defs))
        return -EINVAL;
    if (n > KVG_MODELS_MAX) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "too many models (at most %d)", KVG_MODELS_MAX);
        return KVG_ELIMIT;
    }
    layer next = {malloc((n ? n : 1) * sizeof(entry *)), 0};
    if (!next.entries)
        return -ENOMEM;
    int rc = 0;
    for (; next.n < n; next.n++) {
        const kvg_model_def *def = &defs[next.n];
        rc = obtain(reg, def, &next.entries[next.n], why, sizeof(why));
        if (rc < 0) {
            if (msg && msg_len) {
                if (rc == -ENOMEM)
                    snprintf(msg, msg_len, "out of memory");
                else if (name_sound(def->name))
                    snprintf(msg, msg_len, "model \"%s\": %s", def->name, why);
                else
                    snprintf(msg, msg_len, "models[%zu]: %s", next.n, why);
            }
            goto fail;
        }
    }
    rc = layer_sort(&next, msg, msg_len);
    if (rc < 0)
        goto fail;
    pthread_mutex_lock(&reg->write_lock);
    rc = commit(reg, KVG_MODEL_SOURCE_CONFIG, &next);
    pthread_mutex_unlock(&reg->write_lock);
    if (rc < 0) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "out of memory");
        return rc;
    }
    retry_failed(reg);
    return 0;
fail:
    layer_done(&next);
    return rc;
}

/* ---- the admin layer as JSON ----------------------------------------------------------------- */

void kvg_model_registry_admin_to_json(kvg_model_registry *reg, kvg_buf *out)
{
    pthread_mutex_lock(&reg->write_lock);
    const layer *l = &reg->layers[KVG_MODEL_SOURCE_ADMIN];
    kvg_buf_putc(out, '[');
    for (size_t i = 0; i < l->n; i++) {
        kvg_buf_puts(out, i ? ",\n" : "\n");
        kvg_fields_encode(&kvg_model_fields, &l->entries[i]->def, KVG_SET_STATE, out);
    }
    kvg_buf_puts(out, l->n ? "\n]" : "]");
    pthread_mutex_unlock(&reg->write_lock);
}

/* Name a model's message by its name when that is sound, else by its position. */
static void name_model(const kvg_json *o, size_t i, const char *why, char *msg, size_t msg_len)
{
    const kvg_json *name = o->type == KVG_JSON_OBJECT ? kvg_json_get(o, "name") : NULL;
    const char *s =
        name && name->type == KVG_JSON_STRING && strlen(name->u.str.ptr) == name->u.str.len
            ? name->u.str.ptr
            : NULL;
    if (name_sound(s))
        snprintf(msg, msg_len, "model \"%s\": %s", s, why);
    else
        snprintf(msg, msg_len, "models[%zu]: %s", i, why);
}

int kvg_model_registry_admin_from_json(kvg_model_registry *reg, const kvg_json *arr, char *msg,
                                       size_t msg_len)
{
    char why[512];
    if (msg && msg_len)
        msg[0] = '\0';
    if (!reg || !arr)
        return -EINVAL;
    if (arr->type != KVG_JSON_ARRAY) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "must be an array of model objects");
        return KVG_EPARSE;
    }
    size_t n = arr->u.arr.count;
    if (n > KVG_MODELS_MAX) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "too many models (at most %d)", KVG_MODELS_MAX);
        return KVG_ELIMIT;
    }
    /* Every definition is decoded and checked before anything is loaded: a bad document
     * changes nothing. The strings stay in arr, which outlives this call. */
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    kvg_model_def *defs = malloc((n ? n : 1) * sizeof(*defs));
    layer next = {malloc((n ? n : 1) * sizeof(entry *)), 0};
    kvg_fields_ctx c = {.from = KVG_SET_STATE, .arena = &arena, .msg = why, .msg_len = sizeof(why)};
    int rc = defs && next.entries ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const kvg_json *o = arr->u.arr.items[i];
        kvg_fields_defaults(&kvg_model_fields, &defs[i]);
        rc = kvg_fields_decode(&kvg_model_fields, &defs[i], o, "", &c);
        if (rc == 0)
            rc = kvg_model_def_validate(&defs[i], why, sizeof(why));
        if (rc < 0 && rc != -ENOMEM && msg && msg_len)
            name_model(o, i, why, msg, msg_len);
        if (rc == KVG_ELIMIT)
            rc = KVG_EPARSE;
    }
    /* Then loaded (an identical definition keeps its model); one that does not load is kept
     * as a definition (see the top of the file), and the first such is named in msg. */
    size_t failures = 0;
    while (rc == 0 && next.n < n) {
        const kvg_model_def *def = &defs[next.n];
        rc = obtain(reg, def, &next.entries[next.n], why, sizeof(why));
        if (rc < 0 && rc != -ENOMEM) {
            kvg_log_error("model \"%s\" not loaded, kept as defined: %s", def->name, why);
            if (!failures++ && msg && msg_len)
                snprintf(msg, msg_len, "model \"%s\" not loaded: %s", def->name, why);
            rc = entry_failed(def, why, &next.entries[next.n]);
        }
        if (rc == 0)
            next.n++;
    }
    if (rc == 0)
        rc = layer_sort(&next, msg, msg_len);
    if (rc == 0) {
        pthread_mutex_lock(&reg->write_lock);
        rc = commit(reg, KVG_MODEL_SOURCE_ADMIN, &next);
        pthread_mutex_unlock(&reg->write_lock);
    }
    if (rc == -ENOMEM && msg && msg_len)
        snprintf(msg, msg_len, "out of memory");
    layer_done(&next);
    free(defs);
    kvg_arena_done(&arena);
    return rc;
}

kvg_snapshot_slot *kvg_model_registry_snapshots(kvg_model_registry *reg)
{
    return &reg->snapshots;
}

kvg_model_set *kvg_model_registry_acquire(kvg_model_registry *reg)
{
    return kvg_model_set_of(kvg_snapshot_slot_acquire(&reg->snapshots));
}
