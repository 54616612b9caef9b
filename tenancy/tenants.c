/* SPDX-License-Identifier: Apache-2.0 */
/* The tenant store: immutable refcounted snapshots with a key-digest index, swapped in on
 * every change (create, replace, remove). */
#include "tenancy_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- snapshots ------------------------------------------------------------------------------- */

/* The first 8 bytes of a SHA-256 digest are as good a hash as any. A client can grind keys
 * whose digests land in one bucket, but only stored digests are ever inserted, so probe runs
 * stay as short as the table's load (at most one half) makes them. */
static size_t digest_hash(const uint8_t *digest)
{
    uint64_t h;
    memcpy(&h, digest, sizeof(h));
    return (size_t)h;
}

static const uint8_t *slot_digest(const kvg_tenant_set *set, key_slot s)
{
    return set->tenants[s.tenant - 1]->keys[s.key].digest;
}

static void set_free(kvg_snapshot *snap)
{
    kvg_tenant_set *set = kvg_tenant_set_of(snap);
    for (size_t i = 0; i < set->count; i++)
        kvg_tenant_unref(set->tenants[i]);
    free(set);
}

int kvg_tenancy_set_new(kvg_tenant **tenants, size_t n, size_t *dup, kvg_tenant_set **out)
{
    size_t nkeys = 0;
    for (size_t i = 0; i < n; i++)
        nkeys += tenants[i]->nkeys;
    size_t cap = 8;
    while (cap < 2 * nkeys)
        cap *= 2;
    /* One allocation: the set, the tenant array, the index. */
    size_t tenants_size = (n * sizeof(kvg_tenant *) + 7) & ~(size_t)7;
    kvg_tenant_set *set = malloc(sizeof(*set) + tenants_size + cap * sizeof(key_slot));
    if (!set)
        return -ENOMEM;
    kvg_snapshot_init(&set->snap, set_free);
    set->count = n;
    set->tenants = (kvg_tenant **)(void *)(set + 1);
    set->index = (key_slot *)(void *)((char *)set->tenants + tenants_size);
    set->index_mask = cap - 1;
    if (n)
        memcpy(set->tenants, tenants, n * sizeof(*tenants));
    memset(set->index, 0, cap * sizeof(key_slot));
    for (size_t i = 0; i < n; i++) {
        const kvg_tenant *t = tenants[i];
        for (size_t k = 0; k < t->nkeys; k++) {
            size_t h = digest_hash(t->keys[k].digest) & set->index_mask;
            while (set->index[h].tenant) {
                /* Not secret-dependent timing that matters: these are the stored digests. */
                if (memcmp(slot_digest(set, set->index[h]), t->keys[k].digest,
                           KVG_KEY_DIGEST_LEN) == 0) {
                    if (dup)
                        *dup = i;
                    free(set);
                    return -EEXIST;
                }
                h = (h + 1) & set->index_mask;
            }
            set->index[h] = (key_slot){(uint32_t)(i + 1), (uint32_t)k};
        }
    }
    *out = set;
    return 0;
}

void kvg_tenant_set_unref(kvg_tenant_set *set)
{
    if (set)
        kvg_snapshot_unref(&set->snap);
}

uint64_t kvg_tenant_set_generation(const kvg_tenant_set *set)
{
    return kvg_snapshot_generation(&set->snap);
}

size_t kvg_tenant_set_count(const kvg_tenant_set *set)
{
    return set->count;
}

kvg_tenant *kvg_tenant_set_at(const kvg_tenant_set *set, size_t i)
{
    return i < set->count ? set->tenants[i] : NULL;
}

size_t kvg_tenancy_set_search(const kvg_tenant_set *set, const char *id, bool *found)
{
    size_t lo = 0, hi = set->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(set->tenants[mid]->spec->id, id);
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

kvg_tenant *kvg_tenant_set_find(const kvg_tenant_set *set, const char *id)
{
    bool found;
    if (!id)
        return NULL;
    size_t at = kvg_tenancy_set_search(set, id, &found);
    return found ? set->tenants[at] : NULL;
}

kvg_tenant *kvg_tenancy_set_lookup(const kvg_tenant_set *set, const uint8_t *digest, size_t *key)
{
    size_t h = digest_hash(digest) & set->index_mask;
    for (;;) {
        key_slot s = set->index[h];
        if (!s.tenant)
            return NULL;
        if (kvg_consttime_eq(slot_digest(set, s), digest, KVG_KEY_DIGEST_LEN)) {
            if (key)
                *key = s.key;
            return set->tenants[s.tenant - 1];
        }
        h = (h + 1) & set->index_mask;
    }
}

/* ---- changes --------------------------------------------------------------------------------- */

void kvg_tenancy_publish(kvg_tenants *ts, kvg_tenant_set *next)
{
    kvg_snapshot_unref(kvg_snapshot_slot_publish(&ts->snapshots, &next->snap));
}

int kvg_tenancy_commit(kvg_tenants *ts, commit_op op, size_t at, kvg_tenant *t)
{
    const kvg_tenant_set *cur = kvg_tenancy_current(ts);
    size_t n = op == COMMIT_INSERT   ? cur->count + 1
               : op == COMMIT_REMOVE ? cur->count - 1
                                     : cur->count;
    kvg_tenant **ts_new = malloc((n ? n : 1) * sizeof(*ts_new));
    if (!ts_new)
        return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < cur->count; i++) {
        if (i == at) {
            if (op == COMMIT_INSERT)
                ts_new[k++] = t;
            else if (op == COMMIT_REPLACE) {
                ts_new[k++] = t;
                continue;
            } else
                continue;
        }
        ts_new[k++] = cur->tenants[i];
    }
    if (op == COMMIT_INSERT && at == cur->count)
        ts_new[k++] = t;

    kvg_tenant_set *next;
    int rc = kvg_tenancy_set_new(ts_new, n, NULL, &next);
    if (rc < 0) {
        free(ts_new);
        return rc;
    }
    /* The new snapshot holds its own reference to every tenant it shares with the old one. */
    for (size_t i = 0; i < n; i++)
        if (ts_new[i] != t)
            kvg_tenant_ref(ts_new[i]);
    free(ts_new);
    kvg_tenancy_publish(ts, next);
    return 0;
}

/* ---- public API ------------------------------------------------------------------------------ */

int kvg_tenants_new(kvg_tenants **out)
{
    int rc;
    if (!out)
        return -EINVAL;
    kvg_tenants *ts = calloc(1, sizeof(*ts));
    if (!ts)
        return -ENOMEM;
    for (size_t i = 0; i < AUTH_REASON_COUNT; i++)
        atomic_init(&ts->auth_failures[i], 0u);
    kvg_tenant_set *empty;
    rc = -pthread_mutex_init(&ts->write_lock, NULL);
    if (rc < 0)
        goto fail_ts;
    rc = kvg_tenancy_set_new(NULL, 0, NULL, &empty);
    if (rc < 0)
        goto fail_write_lock;
    rc = kvg_snapshot_slot_init(&ts->snapshots, &empty->snap);
    if (rc < 0)
        goto fail_empty;
    *out = ts;
    return 0;

fail_empty:
    kvg_tenant_set_unref(empty);
fail_write_lock:
    pthread_mutex_destroy(&ts->write_lock);
fail_ts:
    free(ts);
    return rc;
}

void kvg_tenants_free(kvg_tenants *ts)
{
    if (!ts)
        return;
    kvg_snapshot_slot_done(&ts->snapshots);
    pthread_mutex_destroy(&ts->write_lock);
    free(ts);
}

int kvg_tenants_put(kvg_tenants *ts, const kvg_tenant_def *def, bool *created, char *msg,
                    size_t msg_len)
{
    tenant_spec *spec;
    tenant_runtime *rt;
    kvg_tenant *t;
    int rc = kvg_tenancy_spec_new(def, msg, msg_len, &spec);
    if (rc < 0)
        return rc;

    pthread_mutex_lock(&ts->write_lock);
    const kvg_tenant_set *cur = kvg_tenancy_current(ts);
    bool found;
    size_t at = kvg_tenancy_set_search(cur, spec->id, &found);
    if (found) {
        /* The same runtime and keys under the new definition. */
        const kvg_tenant *old = cur->tenants[at];
        rc = kvg_tenancy_tenant_new(spec, kvg_tenancy_runtime_ref(old->rt), old->keys, old->nkeys,
                                    &t);
        if (rc < 0)
            goto fail_unlock;
    } else {
        if (cur->count >= KVG_TENANTS_MAX) {
            rc = KVG_ELIMIT;
            if (msg && msg_len)
                snprintf(msg, msg_len, "too many tenants (at most %d)", KVG_TENANTS_MAX);
            goto fail_spec;
        }
        rc = kvg_tenancy_runtime_new(ts->next_ordinal, &rt);
        if (rc < 0)
            goto fail_spec;
        rc = kvg_tenancy_tenant_new(spec, rt, NULL, 0, &t);
        if (rc < 0)
            goto fail_unlock;
    }
    rc = kvg_tenancy_commit(ts, found ? COMMIT_REPLACE : COMMIT_INSERT, at, t);
    if (rc < 0)
        goto fail_tenant;
    if (!found)
        ts->next_ordinal++;
    pthread_mutex_unlock(&ts->write_lock);
    if (created)
        *created = !found;
    return 0;

fail_tenant:
    kvg_tenant_unref(t);
    goto fail_unlock;
fail_spec:
    kvg_tenancy_spec_unref(spec);
fail_unlock:
    pthread_mutex_unlock(&ts->write_lock);
    if (rc == -ENOMEM && msg && msg_len)
        snprintf(msg, msg_len, "out of memory");
    return rc;
}

int kvg_tenants_remove(kvg_tenants *ts, const char *id)
{
    bool found = false;
    int rc = KVG_ENOTFOUND;
    if (!id)
        return rc;
    pthread_mutex_lock(&ts->write_lock);
    size_t at = kvg_tenancy_set_search(kvg_tenancy_current(ts), id, &found);
    if (found)
        rc = kvg_tenancy_commit(ts, COMMIT_REMOVE, at, NULL);
    pthread_mutex_unlock(&ts->write_lock);
    return rc;
}

uint64_t kvg_tenants_generation(const kvg_tenants *ts)
{
    return kvg_snapshot_slot_generation(&ts->snapshots);
}

kvg_tenant_set *kvg_tenants_acquire(kvg_tenants *ts)
{
    return kvg_tenant_set_of(kvg_snapshot_slot_acquire(&ts->snapshots));
}

kvg_snapshot_slot *kvg_tenants_snapshots(kvg_tenants *ts)
{
    return &ts->snapshots;
}

void kvg_tenants_record_auth_failure(kvg_tenants *ts, const char *reason)
{
    /* The reasons are the gateway's own constants; anything else counts as "unknown" rather
     * than growing the label set. */
    size_t r = AUTH_UNKNOWN;
    for (size_t i = 0; reason && i < AUTH_REASON_COUNT; i++)
        if (strcmp(reason, kvg_tenancy_auth_reasons[i]) == 0)
            r = i;
    atomic_fetch_add_explicit(&ts->auth_failures[r], 1, memory_order_relaxed);
}
