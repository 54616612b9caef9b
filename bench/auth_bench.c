/* SPDX-License-Identifier: Apache-2.0 */
/* Whether authenticating a bearer key (kvg_tenant_set_authenticate: length and the public
 * "kvg-" prefix, SHA-256 of the key, a probe of the digest index, a constant-time compare) takes
 * the same time whatever the number of tenants and however much of a guess matches a real key.
 * Run by bench/auth; prints ns per lookup (median of rounds, with the spread) and the ratio to a
 * baseline measured in the same run: a wrong key of the right shape against a single tenant.
 * White-box at the end: the index probes a miss makes (tenancy_int.h), the one step whose cost
 * depends on the stored digests. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tenancy.h"
#include "tenancy_int.h"

#define GUESSES 1024 /* distinct guesses per case, cycled: lookups touch the whole index */
#define ITERS (GUESSES * 8)
#define ROUNDS 31
#define BIG_TENANTS 10000

enum { C_SHORT, C_MATCH0, C_MATCH4, C_MATCH20, C_MATCH46, C_HIT, C_COUNT };
static const char *const case_names[C_COUNT] = {
    "real key less 1 char", "0 chars match",  "4 chars (kvg-)",
    "20 chars match",       "46 of 47 match", "the real key",
};

typedef struct store {
    const char *name;
    kvg_tenants *ts;
    kvg_tenant_set *set;
    char (*keys)[KVG_KEY_LEN + 1]; /* the real keys, one per tenant */
    size_t nkeys;
    char (*guess[C_COUNT])[KVG_KEY_LEN + 1];
} store;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* A guess with the first `keep` characters of key and random ones after, the first of which
 * differs from the key's (so exactly `keep` leading characters match). */
static void make_guess(char *out, const char *key, size_t keep)
{
    memcpy(out, key, KVG_KEY_LEN + 1);
    for (size_t i = keep; i < KVG_KEY_LEN; i++)
        out[i] = b64url[rng() % 64];
    if (keep < KVG_KEY_LEN && out[keep] == key[keep])
        out[keep] = out[keep] == 'A' ? 'B' : 'A';
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int store_init(store *s, const char *name, size_t ntenants)
{
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->keys = calloc(ntenants, sizeof(*s->keys));
    if (!s->keys || kvg_tenants_new(&s->ts) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < ntenants; i++) {
        char id[32], key_id[KVG_KEY_ID_LEN + 1], msg[128];
        snprintf(id, sizeof(id), "tenant-%05zu", i);
        kvg_tenant_def def = {.id = id, .sharing = KVG_SHARING_ISOLATED};
        if (kvg_tenants_put(s->ts, &def, NULL, msg, sizeof(msg)) < 0 ||
            kvg_tenants_key_create(s->ts, id, s->keys[i], key_id) < 0) {
            fprintf(stderr, "auth_bench: cannot create tenant %s: %s\n", id, msg);
            return -1;
        }
    }
    s->nkeys = ntenants;
    s->set = kvg_tenants_acquire(s->ts);
    for (int c = 0; c < C_COUNT; c++) {
        s->guess[c] = calloc(GUESSES, sizeof(*s->guess[c]));
        if (!s->guess[c])
            return -ENOMEM;
        for (size_t g = 0; g < GUESSES; g++) {
            const char *key = s->keys[(g * 7919) % s->nkeys];
            static const size_t keep[C_COUNT] = {KVG_KEY_LEN, 0, 4, 20, 46, KVG_KEY_LEN};
            make_guess(s->guess[c][g], key, keep[c]);
        }
    }
    /* A real key less its last character: refused on the length, which is public (every key
     * has 47 characters). */
    for (size_t g = 0; g < GUESSES; g++)
        s->guess[C_SHORT][g][KVG_KEY_LEN - 1] = '\0';
    return 0;
}

static void store_done(store *s)
{
    for (int c = 0; c < C_COUNT; c++)
        free(s->guess[c]);
    kvg_tenant_set_unref(s->set);
    kvg_tenants_free(s->ts);
    free(s->keys);
}

static uint64_t sink;

/* A measured line: a set of guesses against one store, timed once per round. */
typedef struct cell {
    store *s;
    const char *label;
    char (*guess)[KVG_KEY_LEN + 1];
    size_t nguess;
    bool hits;     /* every guess is a real key */
    bool sha_only; /* time SHA-256 of the guesses alone */
    uint64_t ns[ROUNDS];
} cell;

/* One batch: ns per lookup. Checks the answers, so a case that does not do what it says fails
 * the run instead of printing a figure. */
static uint64_t batch(cell *c)
{
    size_t found = 0;
    uint64_t t0 = kvg_now_ns();
    for (unsigned i = 0; i < ITERS; i++) {
        const char *k = c->guess[i % c->nguess];
        if (c->sha_only) {
            uint8_t d[KVG_KEY_DIGEST_LEN];
            kvg_tenancy_sha256(k, KVG_KEY_LEN, d);
            sink += d[0];
            continue;
        }
        kvg_tenant *t = kvg_tenant_set_authenticate(c->s->set, k, strlen(k));
        found += t != NULL;
        sink += (uintptr_t)t;
    }
    uint64_t ns = (kvg_now_ns() - t0) / ITERS;
    if (!c->sha_only && found != (c->hits ? ITERS : 0)) {
        fprintf(stderr, "auth_bench: %s on %s found %zu of %u\n", c->label, c->s->name, found,
                ITERS);
        exit(1);
    }
    return ns;
}

/* Index slots a miss with this digest compares before it meets an empty one. */
static unsigned probes(const kvg_tenant_set *set, const uint8_t *digest)
{
    uint64_t h;
    memcpy(&h, digest, sizeof(h));
    size_t at = (size_t)h & set->index_mask;
    unsigned n = 0;
    while (set->index[at].tenant) {
        n++;
        at = (at + 1) & set->index_mask;
    }
    return n;
}

#define MAX_PROBES 3
#define PER_PROBE 512

/* "kvg-" guesses against s sorted by the number of stored digests each is compared with. */
static void split_by_probes(store *s, char (*by[MAX_PROBES + 1])[KVG_KEY_LEN + 1],
                            size_t have[MAX_PROBES + 1])
{
    for (unsigned tries = 0; tries < 2000000; tries++) {
        char g[KVG_KEY_LEN + 1];
        uint8_t d[KVG_KEY_DIGEST_LEN];
        make_guess(g, s->keys[tries % s->nkeys], 4);
        if (kvg_tenancy_sha256(g, KVG_KEY_LEN, d) < 0)
            exit(1);
        unsigned p = probes(s->set, d);
        if (p <= MAX_PROBES && have[p] < PER_PROBE)
            memcpy(by[p][have[p]++], g, sizeof(g));
    }
}

static void print_cell(const cell *c, double base)
{
    uint64_t t[ROUNDS];
    memcpy(t, c->ns, sizeof(t));
    qsort(t, ROUNDS, sizeof(t[0]), cmp_u64);
    printf(" %6" PRIu64 " [%4" PRIu64 "..%4" PRIu64 "] x%.2f", t[ROUNDS / 2], t[ROUNDS / 4],
           t[3 * ROUNDS / 4], (double)t[ROUNDS / 2] / base);
}

static uint64_t median(const cell *c)
{
    uint64_t t[ROUNDS];
    memcpy(t, c->ns, sizeof(t));
    qsort(t, ROUNDS, sizeof(t[0]), cmp_u64);
    return t[ROUNDS / 2];
}

int main(void)
{
    static store st[2];
    if (store_init(&st[0], "1 tenant", 1) < 0 ||
        store_init(&st[1], "10000 tenants", BIG_TENANTS) < 0)
        return 1;
    cell cells[2 * C_COUNT + MAX_PROBES + 2];
    size_t n = 0;
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < C_COUNT; c++)
            cells[n++] = (cell){.s = &st[k],
                                .label = case_names[c],
                                .guess = st[k].guess[c],
                                .nguess = GUESSES,
                                .hits = c == C_HIT};
    const size_t split_at = n;
    char(*by[MAX_PROBES + 1])[KVG_KEY_LEN + 1];
    size_t have[MAX_PROBES + 1] = {0};
    for (int p = 0; p <= MAX_PROBES; p++)
        if (!(by[p] = calloc(PER_PROBE, sizeof(*by[p]))))
            return 1;
    split_by_probes(&st[1], by, have);
    static const char *const probe_labels[MAX_PROBES + 1] = {"0 compared", "1 compared",
                                                             "2 compared", "3 compared"};
    for (int p = 0; p <= MAX_PROBES; p++)
        if (have[p] >= 16)
            cells[n++] =
                (cell){.s = &st[1], .label = probe_labels[p], .guess = by[p], .nguess = have[p]};
    const size_t sha_at = n;
    cells[n++] = (cell){.s = &st[0],
                        .label = "SHA-256 alone",
                        .guess = st[0].guess[C_MATCH4],
                        .nguess = GUESSES,
                        .sha_only = true};

    for (int r = 0; r < ROUNDS; r++) {
        /* Interleaved, in an order that changes every round, so that drift on a noisy machine
         * spreads over every line instead of landing on one. */
        size_t order[KVG_ARRAY_LEN(cells)];
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = (size_t)(rng() % (i + 1)), tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
        for (size_t i = 0; i < n; i++)
            cells[order[i]].ns[r] = batch(&cells[order[i]]);
    }

    double base = (double)median(&cells[C_MATCH4]);
    printf("kvg_tenant_set_authenticate, ns per lookup: median of %d interleaved rounds of %u "
           "lookups (%d distinct guesses per line) [25th..75th percentile] x ratio to the "
           "baseline\n",
           ROUNDS, ITERS, GUESSES);
    printf("baseline: a 47-character \"kvg-\" guess against 1 tenant = %.0f ns; SHA-256 of the "
           "47 bytes alone = %" PRIu64 " ns\n\n",
           base, median(&cells[sha_at]));
    printf("%-22s %-28s %-28s\n", "guess", st[0].name, st[1].name);
    for (int c = 0; c < C_COUNT; c++) {
        printf("%-22s", case_names[c]);
        print_cell(&cells[c], base);
        print_cell(&cells[C_COUNT + c], base);
        printf("\n");
    }
    printf("\n\"kvg-\" misses on %s by stored digests compared (index %zu slots, %zu keys; "
           "white-box, tenancy_int.h):\n",
           st[1].name, st[1].set->index_mask + 1, st[1].nkeys);
    for (size_t i = split_at; i < sha_at; i++) {
        printf("  %-20s", cells[i].label);
        print_cell(&cells[i], base);
        printf("  (%zu guesses)\n", cells[i].nguess);
    }
    for (int p = 0; p <= MAX_PROBES; p++)
        free(by[p]);
    store_done(&st[0]);
    store_done(&st[1]);
    return sink == 42 ? 2 : 0; /* keeps the results alive */
}
