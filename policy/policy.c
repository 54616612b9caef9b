/* SPDX-License-Identifier: Apache-2.0 */
/* Load-based, round-robin and random ranking of candidate workers (the prefix-aware kinds are in
 * cost.c). */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

const char *const kvg_policy_kind_names[KVG_POLICY_KIND_COUNT] = {
    [KVG_POLICY_LEAST_LOADED] = "least_loaded",
    [KVG_POLICY_ROUND_ROBIN] = "round_robin",
    [KVG_POLICY_RANDOM] = "random",
    [KVG_POLICY_COST] = "cost",
    [KVG_POLICY_PREFIX_ONLY] = "prefix_only",
};

const char *kvg_policy_kind_str(kvg_policy_kind k)
{
    return k < KVG_POLICY_KIND_COUNT ? kvg_policy_kind_names[k] : "?";
}

int kvg_policy_kind_parse(const char *name, kvg_policy_kind *out)
{
    for (int i = 0; i < KVG_POLICY_KIND_COUNT; i++) {
        if (strcmp(name, kvg_policy_kind_names[i]) == 0) {
            *out = (kvg_policy_kind)i;
            return 0;
        }
    }
    return KVG_EPARSE;
}

/* Rotate the array left by r so that ties, and round robin, start at a moving position. */
static void rotate(kvg_policy_candidate *c, size_t n, size_t r)
{
    if (n < 2 || (r %= n) == 0)
        return;
    kvg_policy_candidate tmp[64];
    while (r) {
        size_t k = KVG_MIN(r, KVG_ARRAY_LEN(tmp));
        memcpy(tmp, c, k * sizeof(*c));
        memmove(c, c + k, (n - k) * sizeof(*c));
        memcpy(c + n - k, tmp, k * sizeof(*c));
        r -= k;
    }
}

/* splitmix64 (Steele, Lea, Flood 2014): a counter in, well-mixed 64-bit words out. */
static uint64_t splitmix64(uint64_t *state)
{
    return kvg_policy_mix64(*state += 0x9e3779b97f4a7c15ull);
}

/* Fisher-Yates shuffle driven by splitmix64 seeded with the rotation counter: a pure function
 * of (rotation, n), so the same decision replays identically (trace simulator, tests), while
 * consecutive counters give unrelated orders. The modulo bias is below n / 2^64. */
static void shuffle(kvg_policy_candidate *c, size_t n, uint64_t rotation)
{
    uint64_t state = rotation;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(splitmix64(&state) % (i + 1));
        kvg_policy_candidate t = c[i];
        c[i] = c[j];
        c[j] = t;
    }
}

/* Stable sort by inflight. Short lists (workers serving one model, the usual case) take an
 * insertion sort; long ones (up to thousands of workers) a merge sort through a scratch buffer,
 * and the insertion sort when that buffer cannot be had: slower, the same order. */
static void insertion_sort_by_load(kvg_policy_candidate *c, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        kvg_policy_candidate x = c[i];
        size_t j = i;
        while (j > 0 && c[j - 1].inflight > x.inflight) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
}

static void sort_by_load(kvg_policy_candidate *c, size_t n)
{
    enum { RUN = 32 };
    kvg_policy_candidate *tmp = n > RUN ? malloc(n * sizeof(*c)) : NULL;
    if (!tmp) {
        insertion_sort_by_load(c, n);
        return;
    }
    for (size_t i = 0; i < n; i += RUN)
        insertion_sort_by_load(c + i, KVG_MIN(RUN, n - i));
    /* Bottom-up merges of sorted runs; "<=" takes the left element first on ties: stable. */
    kvg_policy_candidate *src = c, *dst = tmp;
    for (size_t w = RUN; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = KVG_MIN(lo + w, n), hi = KVG_MIN(lo + 2 * w, n);
            size_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                dst[o++] = src[a].inflight <= src[b].inflight ? src[a++] : src[b++];
            while (a < mid)
                dst[o++] = src[a++];
            while (b < hi)
                dst[o++] = src[b++];
        }
        kvg_policy_candidate *t = src;
        src = dst;
        dst = t;
    }
    if (src != c)
        memcpy(c, src, n * sizeof(*c));
    free(tmp);
}

void kvg_policy_rank(kvg_policy_kind kind, kvg_policy_candidate *cands, size_t n, uint64_t rotation)
{
    if (n == 0)
        return;
    if (kind == KVG_POLICY_ROUND_ROBIN) {
        rotate(cands, n, (size_t)(rotation % n));
        return;
    }
    if (kind == KVG_POLICY_RANDOM) {
        shuffle(cands, n, rotation);
        return;
    }
    sort_by_load(cands, n);
    /* Rotate each run of equal load on its own, so every member of a tie leads equally often. */
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && cands[j].inflight == cands[i].inflight)
            j++;
        rotate(cands + i, j - i, (size_t)(rotation % (j - i)));
        i = j;
    }
}
