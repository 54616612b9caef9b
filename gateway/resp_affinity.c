/* SPDX-License-Identifier: Apache-2.0 */
/* The bounded response id -> worker map and the scanner that finds a response's id in an
 * answer (resp_affinity.h). */
#include "resp_affinity.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "router.h"

/* Direct-mapped: an id has one slot, chosen by its hash. A lookup is one compare; a newer id
 * that hashes to a taken slot replaces the older one, which keeps the map bounded without an
 * eviction list. The table is static: the ids of one process, whatever its gateways. */
/* The key of an entry: scope, 0x1F, id. */
#define KEY_MAX (KVG_RESP_SCOPE_MAX + 1 + KVG_RESP_ID_MAX)

typedef struct slot {
    char key[KEY_MAX + 1];
    char worker[KVG_WORKER_NAME_MAX + 1];
} slot;

static slot table[KVG_RESP_AFFINITY_SLOTS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(const char *id, size_t len)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)id[i];
        h *= 1099511628211ULL;
    }
    return (size_t)(h % KVG_RESP_AFFINITY_SLOTS);
}

/* The entry key of (scope, id) into key: its length, or 0 when they cannot be kept. */
static size_t make_key(const char *scope, const char *id, size_t len, char *key)
{
    size_t sl = strlen(scope);
    if (len == 0 || len > KVG_RESP_ID_MAX || memchr(id, '\0', len) || sl > KVG_RESP_SCOPE_MAX)
        return 0;
    memcpy(key, scope, sl);
    key[sl] = 0x1f;
    memcpy(key + sl + 1, id, len);
    key[sl + 1 + len] = '\0';
    return sl + 1 + len;
}

void kvg_resp_affinity_learn(const char *scope, const char *id, size_t len, const char *worker)
{
    char key[KEY_MAX + 1];
    size_t kl = make_key(scope, id, len, key), wl = strlen(worker);
    if (!kl || wl == 0 || wl > KVG_WORKER_NAME_MAX)
        return;
    slot *s = &table[slot_of(key, kl)];
    pthread_mutex_lock(&table_lock);
    memcpy(s->key, key, kl + 1);
    memcpy(s->worker, worker, wl + 1);
    pthread_mutex_unlock(&table_lock);
}

bool kvg_resp_affinity_find(const char *scope, const char *id, size_t len, char *out,
                            size_t out_len)
{
    char key[KEY_MAX + 1];
    size_t kl = make_key(scope, id, len, key);
    if (!kl || out_len == 0)
        return false;
    const slot *s = &table[slot_of(key, kl)];
    bool found = false;
    pthread_mutex_lock(&table_lock);
    size_t wl = strlen(s->worker);
    if (strcmp(s->key, key) == 0 && wl < out_len) {
        memcpy(out, s->worker, wl + 1);
        found = true;
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

/* The id after `"id"` at key (within [key, end)): 1 with [*s, *e) when complete, 0 when the
 * bytes so far are a prefix of one (more may come), -1 when this is not an id. */
static int id_at(const char *key, const char *end, const char **s, const char **e)
{
    const char *p = key + 4;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if (p == end)
        return 0;
    if (*p++ != ':')
        return -1;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    static const char want[] = "\"resp_";
    for (size_t i = 0; i < sizeof(want) - 1; i++, p++) {
        if (p == end)
            return 0;
        if (*p != want[i])
            return -1;
    }
    const char *q = p - 5; /* the id starts at "resp_" */
    while (p < end && id_char(*p))
        p++;
    if (p == end)
        return 0;
    if (*p != '"' || (size_t)(p - q) > KVG_RESP_ID_MAX)
        return -1;
    *s = q;
    *e = p;
    return 1;
}

bool kvg_resp_id_scan_feed(kvg_resp_id_scan *s, const char *data, size_t len, const char **id,
                           size_t *id_len)
{
    if (s->done)
        return false;
    size_t take = len < sizeof(s->buf) - s->len ? len : sizeof(s->buf) - s->len;
    memcpy(s->buf + s->len, data, take);
    s->len += take;
    const char *end = s->buf + s->len;
    for (const char *k = s->buf; k + 4 <= end; k++) {
        k = memchr(k, '"', (size_t)(end - k));
        if (!k || k + 4 > end)
            break;
        if (memcmp(k, "\"id\"", 4) != 0)
            continue;
        const char *a = NULL, *b = NULL;
        int rc = id_at(k, end, &a, &b);
        if (rc > 0) {
            *id = a;
            *id_len = (size_t)(b - a);
            s->done = true;
            return true;
        }
        (void)rc; /* 0: an id still arriving, found by the next call; -1: not one */
    }
    /* The id comes early in an answer; a buffer full without one ends the search. */
    if (s->len == sizeof(s->buf))
        s->done = true;
    return false;
}
