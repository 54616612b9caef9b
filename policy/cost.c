/* SPDX-License-Identifier: Apache-2.0 */
/* The prefix-aware choice: predicted time to first token under a bounded-load rule (cost), most
 * matched blocks (prefix_only), and rendezvous hashing for prefixes no worker holds. */
#include "policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const reason_names[KVG_POLICY_REASON_COUNT] = {
    [KVG_POLICY_REASON_LOAD] = "load",
    [KVG_POLICY_REASON_HIT] = "hit",
    [KVG_POLICY_REASON_COLD] = "cold",
};

const char *kvg_policy_reason_str(kvg_policy_reason r)
{
    return r < KVG_POLICY_REASON_COUNT ? reason_names[r] : "?";
}

#define mix64 kvg_policy_mix64

/* score = mix64(key ^ mix64(id_hash + 0x9e3779b97f4a7c15)), in unsigned 64-bit arithmetic.
 *
 * This exact formula is part of the wire contract between gateway replicas (and the trace
 * simulator): every replica must compute the same score for the same (key, worker), or a cold
 * prefix would land on different workers. Change it only with a flag day.
 *
 * The identity is mixed first (the golden-ratio increment keeps id_hash 0 away from mix64's fixed
 * point at 0), so that workers whose name hashes differ in a few bits still get unrelated
 * scores; the outer mix then makes the score of each worker an independent-looking function of
 * the key. The highest score wins: removing a worker moves only the keys it won, and adding one
 * takes about 1/n of the keys from the others (highest random weight, Thaler and Ravishankar
 * 1998). */
uint64_t kvg_policy_rendezvous_id(uint64_t id_hash)
{
    return mix64(id_hash + 0x9e3779b97f4a7c15ull);
}

uint64_t kvg_policy_rendezvous(uint64_t key, uint64_t id_hash)
{
    return mix64(key ^ kvg_policy_rendezvous_id(id_hash));
}

/* The score through a cached identity half (0: not cached; mix64 is 0 only at 0, and then the
 * recomputed value is that same 0). */
static inline uint64_t rendezvous_of(uint64_t key, const kvg_policy_candidate *c)
{
    return mix64(key ^ (c->id_mix ? c->id_mix : kvg_policy_rendezvous_id(c->id_hash)));
}

__extension__ typedef unsigned __int128 u128;

/* What every comparison needs; computed once per decision. */
typedef struct choice {
    const kvg_policy_config *cfg;
    kvg_policy_kind kind;
    uint32_t blocks;
    uint64_t key;
    uint64_t bound;  /* the bounded-load limit B */
    bool any_holder; /* some candidate holds at least one block */
    bool by_cost;    /* cost ranks by total cost: some holder, or turnover or pending priced */
    double pending_weight; /* us per pending block in this decision (pending_cost()) */
    double block_weight;   /* the request's block_weight, 1 when unset */
} choice;

/* The bound B = max(ceil((1 + load_factor) x (sum of inflight + 1) / n), least + load_slack):
 * the mean load after this request, stretched by the load factor, and never tighter than
 * load_slack requests above the least loaded candidate (with few requests in flight over many
 * workers the relative bound alone is 1 or 2, and one request on a holder puts it over).
 * load_factor is taken in millionths so the arithmetic is exact integers (1.1 x 50 / 11 must
 * give 5, where doubles give 5.000000000000001 and ceil makes it 6); the 128-bit product cannot
 * overflow (< 2^27 x (n x 2^32 + 1) <= 2^124). The least loaded candidate is always within it:
 * min <= floor(sum / n), and B >= ceil((sum + 1) / n) = floor(sum / n) + 1. */
static uint64_t load_bound(const kvg_policy_config *cfg, const kvg_policy_candidate *c, size_t n)
{
    uint64_t sum = 0, least = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        sum += c[i].inflight;
        least = KVG_MIN(least, (uint64_t)c[i].inflight);
    }
    double lf = cfg->load_factor;
    uint64_t ppm = 0;
    if (lf > 0) /* NaN and negatives: strict balance */
        ppm = lf >= 100 ? 100000000u : (uint64_t)llround(lf * 1e6);
    u128 num = (u128)(1000000u + ppm) * ((u128)sum + 1);
    u128 den = (u128)1000000u * n;
    u128 b = (num + den - 1) / den;
    if (b < least + cfg->load_slack)
        b = least + cfg->load_slack; /* both < 2^33 */
    return b > UINT64_MAX ? UINT64_MAX : (uint64_t)b;
}

static bool over_bound(const choice *ch, const kvg_policy_candidate *c)
{
    return (uint64_t)c->inflight + 1 > ch->bound;
}

/* Blocks the candidate holds, at most the request's: a stale index entry cannot make a
 * candidate look better than holding the whole request. */
static uint32_t held(const choice *ch, const kvg_policy_candidate *c)
{
    return KVG_MIN(c->matched, ch->blocks);
}

/* A scraped occupancy in [0, 1]; NaN (a bad scrape) counts as unknown, 0. */
static inline double kv_usage(const kvg_policy_candidate *c)
{
    double u = c->kv_usage;
    return u > 0 ? (u < 1 ? u : 1) : 0;
}

/* The two halves of the cost; score() and the sort keys both add them this way, so the totals
 * they compare are the same doubles. */
/* Blocks to prefill, as a price: the missing ones in full, and those held only on a CPU tier at
 * (1 - cpu_block_weight) of one, since loading a block back from host memory costs a fraction
 * of computing it (llm-d scores them 0.8 of a GPU block). */
static inline double to_prefill(const choice *ch, const kvg_policy_candidate *c)
{
    uint32_t h = held(ch, c);
    double missing = (double)(ch->blocks - h);
    if (c->matched_cpu) {
        double w = ch->cfg->cpu_block_weight;
        w = w > 0 ? (w < 1 ? w : 1) : 0; /* NaN: 0 */
        missing += (1 - w) * (double)KVG_MIN(c->matched_cpu, h);
    }
    return missing;
}

static inline double prefill_cost(const choice *ch, const kvg_policy_candidate *c)
{
    double turnover = c->turnover > 0 ? c->turnover : 0; /* NaN: unknown */
    return (ch->cfg->prefill_cost_per_block + ch->cfg->turnover_cost_per_block * turnover) *
           ch->block_weight * to_prefill(ch, c);
}

static inline double queue_cost(const choice *ch, const kvg_policy_candidate *c)
{
    const kvg_policy_config *cfg = ch->cfg;
    return cfg->queue_cost_per_request * (double)c->inflight +
           cfg->waiting_cost_per_request * (double)c->waiting + cfg->kv_usage_cost * kv_usage(c);
}

/* The wait behind the prefills this gateway has already sent the candidate. At full weight only
 * when every candidate holds as many of the request's blocks as every other (a cold request, or
 * one whose held part is common to all): then going where the queue of prefill work is shortest
 * costs no cache hit. Where candidates hold different amounts, pending_hit_weight of it: pricing
 * the wait at full weight there trades hit rate for the TTFT tail (docs/policies.md has the
 * measured trade). */
static inline double pending_cost(const choice *ch, const kvg_policy_candidate *c)
{
    return ch->pending_weight * (double)c->pending;
}

static void score(const choice *ch, const kvg_policy_candidate *c, kvg_policy_terms *t)
{
    t->index = c->index;
    t->prefill_cost = prefill_cost(ch, c);
    t->queue_cost = queue_cost(ch, c);
    t->pending_cost = pending_cost(ch, c);
    t->total = t->prefill_cost + t->queue_cost + t->pending_cost;
    t->over_bound = over_bound(ch, c);
    t->rendezvous = ch->blocks ? rendezvous_of(ch->key, c) : 0;
}

static int cmp_u64(uint64_t a, uint64_t b)
{
    return (a > b) - (a < b);
}

/* Negative when a ranks before b. A total order on the candidates' contents: after the policy's
 * keys come the identity and then every other field, so that two candidates compare equal only
 * when they are the same bytes. The ranking is therefore a function of the set of candidates,
 * whatever order the caller listed them in and whatever sort algorithm runs. */
static int compare(const choice *ch, const kvg_policy_candidate *a, const kvg_policy_candidate *b)
{
    int r;
    if (ch->kind == KVG_POLICY_COST) {
        if ((r = (int)over_bound(ch, a) - (int)over_bound(ch, b)) != 0)
            return r;
        if (ch->by_cost) {
            kvg_policy_terms ta, tb;
            score(ch, a, &ta);
            score(ch, b, &tb);
            if ((r = (ta.total > tb.total) - (ta.total < tb.total)) != 0)
                return r;
        }
    } else if ((r = cmp_u64(held(ch, b), held(ch, a))) != 0) { /* prefix_only: most first */
        return r;
    }
    if ((r = cmp_u64(rendezvous_of(ch->key, b), rendezvous_of(ch->key, a))) != 0)
        return r; /* highest score first */
    if ((r = cmp_u64(a->id_hash, b->id_hash)) != 0 || (r = cmp_u64(a->index, b->index)) != 0 ||
        (r = cmp_u64(a->inflight, b->inflight)) != 0 ||
        (r = cmp_u64(a->matched, b->matched)) != 0 || (r = cmp_u64(a->waiting, b->waiting)) != 0 ||
        (r = cmp_u64(a->pending, b->pending)) != 0 ||
        (r = cmp_u64(a->matched_cpu, b->matched_cpu)) != 0)
        return r;
    uint32_t ka, kb;
    memcpy(&ka, &a->kv_usage, sizeof(ka));
    memcpy(&kb, &b->kv_usage, sizeof(kb));
    return cmp_u64(ka, kb);
}

static void swap(kvg_policy_candidate *a, kvg_policy_candidate *b)
{
    kvg_policy_candidate t = *a;
    *a = *b;
    *b = t;
}

/* Move c[i] down the heap of the first n elements (the "largest" is the one ranked last). */
static void sift_down(const choice *ch, kvg_policy_candidate *c, size_t i, size_t n)
{
    for (;;) {
        size_t big = i, l = 2 * i + 1, r = l + 1;
        if (l < n && compare(ch, &c[l], &c[big]) > 0)
            big = l;
        if (r < n && compare(ch, &c[r], &c[big]) > 0)
            big = r;
        if (big == i)
            return;
        swap(&c[i], &c[big]);
        i = big;
    }
}

/* Heapsort: O(n log n) at worst, in place, no allocation (so no failure path in a void function
 * on the request path). It is not stable, and needs not be: compare() is a total order. */
static void sort(const choice *ch, kvg_policy_candidate *c, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(ch, c, i, n);
    for (size_t end = n; end-- > 1;) {
        swap(&c[0], &c[end]);
        sift_down(ch, c, 0, end);
    }
}

/* A candidate's sort key, computed once: comparing these is a few integer compares, where
 * compare() recomputes costs and rendezvous scores (a decision over 512 workers makes about
 * 9000 comparisons). The order is compare()'s: primary is over-bound then total cost (cost) or
 * most blocks held (prefix_only), then the rendezvous score; exact ties on both fall back to
 * compare() on the candidates themselves. */
typedef struct sort_key {
    uint64_t primary;    /* smaller ranks first */
    uint64_t rendezvous; /* larger ranks first */
    uint32_t pos;        /* the candidate's position in the input */
} sort_key;

/* A non-negative finite double's bits order like its value; anything else (NaN) goes last. */
static uint64_t cost_bits(double v)
{
    if (!(v >= 0))
        return v < 0 ? 0 : (UINT64_MAX >> 1);
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    return b >> 1; /* leave the top bit for the bound */
}

static int compare_keys(const choice *ch, const kvg_policy_candidate *c, const sort_key *a,
                        const sort_key *b)
{
    if (a->primary != b->primary)
        return a->primary < b->primary ? -1 : 1;
    if (a->rendezvous != b->rendezvous)
        return a->rendezvous > b->rendezvous ? -1 : 1;
    return compare(ch, &c[a->pos], &c[b->pos]);
}

static void sift_keys(const choice *ch, const kvg_policy_candidate *c, sort_key *k, size_t i,
                      size_t n)
{
    for (;;) {
        size_t big = i, l = 2 * i + 1, r = l + 1;
        if (l < n && compare_keys(ch, c, &k[l], &k[big]) > 0)
            big = l;
        if (r < n && compare_keys(ch, c, &k[r], &k[big]) > 0)
            big = r;
        if (big == i)
            return;
        sort_key t = k[i];
        k[i] = k[big];
        k[big] = t;
        i = big;
    }
}

/* Sort through precomputed keys; false when the scratch memory cannot be had (the caller then
 * sorts the candidates directly, slower but the same order). */
static bool sort_by_keys(const choice *ch, kvg_policy_candidate *c, size_t n, size_t top)
{
    sort_key stack_keys[64];
    kvg_policy_candidate stack_out[64];
    sort_key *k = n <= 64 ? stack_keys : malloc(n * sizeof(*k));
    kvg_policy_candidate *out = n <= 64 ? stack_out : malloc(n * sizeof(*out));
    if (!k || !out) {
        if (k != stack_keys)
            free(k);
        if (out != stack_out)
            free(out);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const kvg_policy_candidate *x = &c[i];
        uint64_t primary;
        if (ch->kind == KVG_POLICY_COST) {
            uint64_t cost = 0;
            if (ch->by_cost)
                cost = cost_bits(prefill_cost(ch, x) + queue_cost(ch, x) + pending_cost(ch, x));
            primary = (over_bound(ch, x) ? 1ull << 63 : 0) | cost;
        } else {
            primary = (uint64_t)(UINT32_MAX - held(ch, x));
        }
        k[i] = (sort_key){primary, rendezvous_of(ch->key, x), (uint32_t)i};
    }
    if (top >= n) {
        for (size_t i = n / 2; i-- > 0;)
            sift_keys(ch, c, k, i, n);
    } else {
        /* Only the first `top` places matter: keep the best `top` seen so far in a heap whose
         * root is the worst of them, so that most keys cost one comparison with the root
         * (O(n + top log top log(n / top)) on average); then sort those. The rest keep their
         * input order. */
        for (size_t i = top / 2; i-- > 0;)
            sift_keys(ch, c, k, i, top);
        for (size_t i = top; i < n; i++) {
            if (compare_keys(ch, c, &k[i], &k[0]) >= 0)
                continue;
            sort_key t = k[0];
            k[0] = k[i];
            k[i] = t;
            sift_keys(ch, c, k, 0, top);
        }
    }
    size_t sorted = KVG_MIN(top, n);
    for (size_t end = sorted; end-- > 1;) {
        sort_key t = k[0];
        k[0] = k[end];
        k[end] = t;
        sift_keys(ch, c, k, 0, end);
    }
    for (size_t i = 0; i < n; i++)
        out[i] = c[k[i].pos];
    memcpy(c, out, n * sizeof(*c));
    if (k != stack_keys) {
        free(k);
        free(out);
    }
    return true;
}

void kvg_policy_choose_top(const kvg_policy_config *cfg, const kvg_policy_request *req,
                           kvg_policy_candidate *cands, size_t n, size_t top, uint64_t rotation,
                           kvg_policy_terms *terms, kvg_policy_reason *reason)
{
    if (n == 0)
        return;
    if (top == 0 || top > n)
        top = n;
    choice ch = {.cfg = cfg, .kind = cfg->kind, .blocks = req->blocks, .key = req->cold_key};
    ch.block_weight = req->block_weight > 0 ? req->block_weight : 1; /* NaN: 1 */
    ch.bound = load_bound(cfg, cands, n);
    kvg_policy_reason why = KVG_POLICY_REASON_LOAD;
    bool prefix_aware = ch.kind == KVG_POLICY_COST || ch.kind == KVG_POLICY_PREFIX_ONLY;
    if (!prefix_aware || ch.blocks == 0) {
        /* No block, no key to agree on: load decides, with rotated ties. */
        kvg_policy_rank(prefix_aware ? KVG_POLICY_LEAST_LOADED : ch.kind, cands, n, rotation);
    } else {
        uint32_t most = 0, least = UINT32_MAX;
        bool pending = false;
        for (size_t i = 0; i < n; i++) {
            uint32_t h = held(&ch, &cands[i]);
            most = KVG_MAX(most, h);
            least = KVG_MIN(least, h);
            pending |= cands[i].pending > 0;
        }
        ch.any_holder = most > 0;
        ch.pending_weight =
            cfg->pending_cost_per_block * (most == least ? 1 : cfg->pending_hit_weight);
        /* Cold, and nothing known of turnover or pending work: rendezvous alone, so that
         * replicas agree. */
        ch.by_cost = ch.any_holder || (pending && ch.pending_weight > 0);
        for (size_t i = 0; i < n && !ch.by_cost; i++)
            ch.by_cost = cfg->turnover_cost_per_block > 0 && cands[i].turnover > 0;
        if (n > UINT32_MAX || !sort_by_keys(&ch, cands, n, top))
            sort(&ch, cands, n);
        why = held(&ch, &cands[0]) > 0 ? KVG_POLICY_REASON_HIT : KVG_POLICY_REASON_COLD;
    }
    if (terms) /* the ranked places only */
        for (size_t i = 0; i < top; i++)
            score(&ch, &cands[i], &terms[i]);
    if (reason)
        *reason = why;
}

void kvg_policy_choose(const kvg_policy_config *cfg, const kvg_policy_request *req,
                       kvg_policy_candidate *cands, size_t n, uint64_t rotation,
                       kvg_policy_terms *terms, kvg_policy_reason *reason)
{
    kvg_policy_choose_top(cfg, req, cands, n, n, rotation, terms, reason);
}
