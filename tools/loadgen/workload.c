/* SPDX-License-Identifier: Apache-2.0 */
/* Built-in workloads of kvgate-loadgen: shared-prefix, unique and multi-tenant chat requests.
 *
 * Every random draw comes from a counter-based generator keyed by (seed, stream, index), never
 * from state carried between calls, so request i is the same whatever the concurrency, the
 * order of completions or the number of requests before it. Adding a workload means adding one
 * entry to `workloads` below: an init that generates the shared texts once and an item
 * function that assembles request i from them. The multi-tenant workload keeps its system
 * prompts in `texts` and its documents in `docs`, picks the kind, tenant and conversation from
 * the index, and sets lg_item.tenant so the runner sends that tenant's key. */
#include "workload.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Shared-prefix workload: how many system prompts, and how long (in bytes, ~4 per token). */
#define SHARED_PROMPTS 8
#define SYSTEM_MIN_BYTES 1200 /* ~300 tokens */
#define SYSTEM_SPAN_BYTES 800 /* up to ~500 tokens */
#define USER_MIN_WORDS 6
#define USER_SPAN_WORDS 15

/* Independent random streams, so adding a draw to one never shifts another. */
enum {
    STREAM_SYSTEM = 1,      /* text of shared system prompt k */
    STREAM_PICK = 2,        /* which shared prompt request i uses */
    STREAM_USER = 3,        /* user message of request i */
    STREAM_UNIQUE = 4,      /* private system prompt of request i */
    STREAM_MT_PREAMBLE = 5, /* multi-tenant: preamble of group g */
    STREAM_MT_SYSTEM = 6,   /* tenant t's own part of its system prompt */
    STREAM_MT_DOC = 7,      /* document d of group g (index g * docs + d) */
    STREAM_MT_MIX = 8,      /* order of the kinds within block b of MT_MIX_BLOCK requests */
    STREAM_MT_TENANT = 9,   /* tenant (and document) of single and document request i */
    STREAM_MT_LANE = 10,    /* conversation depths of chat lane l */
    STREAM_MT_CONV = 11,    /* tenant of conversation c */
    STREAM_MT_TURN = 12,    /* user message of turn k of conversation c */
    STREAM_MT_DOCQ = 13,    /* question of document request i */
};

/* Multi-tenant workload (docs/loadgen.md has the reasoning behind the numbers). */
#define MT_PREAMBLE_MIN_BYTES 384 /* group preamble, ~100-160 tokens */
#define MT_PREAMBLE_SPAN_BYTES 256
#define MT_SYSTEM_MIN_BYTES 640 /* the tenant's own part, ~160-320 tokens */
#define MT_SYSTEM_SPAN_BYTES 640
#define MT_DOCS_PER_GROUP 4
#define MT_DOC_MIN_BYTES 2048 /* ~512-1536 tokens */
#define MT_DOC_SPAN_BYTES 4096
/* Kinds come in blocks of 20 requests, shuffled within the block: 3 single questions (15%),
 * 5 document questions (25%), 12 chat turns (60%: about a fifth open a conversation, the rest
 * are follow-ups). Chat-heavy, as assistant traffic is: the history a follow-up repeats is the
 * prefix that only affinity can reuse. */
#define MT_MIX_BLOCK 20
#define MT_MIX_SINGLE 3
#define MT_MIX_DOC 5
#define MT_MIX_CHAT 12
/* Chat turns are laid out in epochs of MT_LANES lanes x MT_SLOTS turn slots: chat turn j is
 * slot (j / MT_LANES) % MT_SLOTS of lane j % MT_LANES, so consecutive turns of one
 * conversation are MT_LANES chat turns (~100 requests) apart, long enough for the previous
 * answer to have arrived at any sensible concurrency. A lane holds conversations of
 * MT_DEPTH_MIN..MT_SLOTS turns back to back (the last one cut at the epoch's end). */
#define MT_LANES 60
#define MT_SLOTS 8
#define MT_DEPTH_MIN 3
#define MT_CHAT_MIN_WORDS 24
#define MT_CHAT_SPAN_WORDS 57
/* Zipf exponents: tenant popularity (tenant 0 most popular: 0.6 gives it ~21% of 8 tenants'
 * traffic, the last ~6%) and document popularity. */
#define MT_TENANT_ZIPF 0.6
#define MT_DOC_ZIPF 1.0

/* The simulated worker's generated text, copied from tools/simworker/tokenizer.c (the loadgen
 * must not depend on the worker): token k (k >= 1) is output_words[(k - 1) % 64]. The unit
 * tests check the copy against the worker's own function. */
static const char *const sim_output_words[] = {
    " the",  " of",   " and",  " to",   " in",   " is",   " that", " for",  " it",   " as",
    " was",  " with", " be",   " on",   " not",  " he",   " by",   " are",  " this", " from",
    " at",   " or",   " have", " an",   " they", " you",  " were", " her",  " all",  " she",
    " one",  " had",  " word", " but",  " we",   " can",  " said", " now",  " use",  " each",
    " when", " how",  " will", " up",   " out",  " then", " them", " so",   " some", " make",
    " like", " him",  " into", " time", " has",  " look", " two",  " more", " see",  " way",
    " been", " call", " who",  " oil",
};

typedef struct workload_ops {
    const char *name;
    const char *help;
    int (*init)(lg_workload *wl);
    int (*item)(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_item *out);
} workload_ops;

struct lg_workload {
    const workload_ops *ops;
    uint64_t seed;
    char **texts; /* shared texts (system prompts), owned */
    size_t *text_lens;
    size_t n_texts;
    uint32_t tenants;
    uint32_t max_tokens;
    /* multi-tenant only */
    uint32_t groups;
    char **docs; /* MT_DOCS_PER_GROUP per group, owned */
    size_t *doc_lens;
    size_t n_docs;
    double *tenant_cdf; /* cumulative Zipf weights, last = 1 */
    char *reply;        /* the assistant reply of every chat turn, owned */
    size_t reply_len;
};

/* ---- deterministic randomness ------------------------------------------------------------- */

/* SplitMix64's finaliser: a bijective mixer with good avalanche, the usual choice for
 * counter-based generators. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

typedef struct rng {
    uint64_t state;
} rng;

static rng rng_for(uint64_t seed, uint64_t stream, uint64_t index)
{
    rng r = {mix64(mix64(seed ^ 0x6b76676174656c67ull) ^ mix64(stream * 0x9e3779b97f4a7c15ull) ^
                   mix64(index + 0x632be59bd9b4e019ull))};
    return r;
}

static uint64_t rng_next(rng *r)
{
    r->state += 0x9e3779b97f4a7c15ull;
    return mix64(r->state);
}

/* Uniform in [0, n); the modulo bias is irrelevant for text generation. */
static uint32_t rng_below(rng *r, uint32_t n)
{
    return n ? (uint32_t)(rng_next(r) % n) : 0;
}

/* ---- text ---------------------------------------------------------------------------------- */

/* Plain English words: they tokenize like real prompts (a few bytes per token) in engines and
 * in the simulated worker, and keep the bodies readable when debugging. */
static const char *const words[] = {
    "the",     "model",     "request",   "answer",   "system",   "user",     "cache",    "prefix",
    "token",   "latency",   "worker",    "gateway",  "tenant",   "policy",   "document", "question",
    "context", "summary",   "report",    "customer", "account",  "order",    "shipping", "invoice",
    "refund",  "product",   "support",   "ticket",   "always",   "never",    "politely", "briefly",
    "clearly", "carefully", "exactly",   "explain",  "describe", "list",     "compare",  "check",
    "verify",  "quote",     "and",       "or",       "with",     "without",  "for",      "from",
    "about",   "when",      "if",        "before",   "after",    "because",  "unless",   "every",
    "each",    "some",      "many",      "few",      "one",      "two",      "three",    "data",
    "table",   "field",     "value",     "record",   "schema",   "query",    "error",    "warning",
    "status",  "result",    "detail",    "example",  "format",   "language", "tone",     "style",
    "rule",    "section",   "paragraph", "sentence", "is",       "are",      "was",      "be",
    "has",     "have",      "should",    "must",     "may",      "can",      "will",     "would",
    "could",   "might",     "safe",      "private",  "public",   "internal", "secure",   "fast",
    "slow",    "new",       "old",       "first",    "last",     "next",     "previous", "current",
    "time",    "date",      "price",     "cost",     "budget",   "limit",    "quota",    "team",
    "project", "release",   "version",   "feature",  "issue",    "change",   "weather",  "travel",
    "hotel",   "flight",    "recipe",    "garden",   "music",    "history",  "science",  "math",
    "physics", "chemistry", "biology",   "law",
};

#define N_WORDS ((uint32_t)KVG_ARRAY_LEN(words))

/* Sentences of random words until out holds at least min_bytes more bytes. */
static void append_sentences(kvg_buf *out, rng *r, size_t min_bytes)
{
    size_t start = out->len;
    while (out->len - start < min_bytes && !out->failed) {
        uint32_t n = 6 + rng_below(r, 10);
        for (uint32_t w = 0; w < n; w++) {
            const char *word = words[rng_below(r, N_WORDS)];
            if (out->len > 0)
                kvg_buf_putc(out, ' ');
            if (w == 0) {
                /* Capitalise the first word without touching the shared table. */
                char c = word[0];
                kvg_buf_putc(out, c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c);
                kvg_buf_puts(out, word + 1);
            } else
                kvg_buf_puts(out, word);
        }
        kvg_buf_putc(out, '.');
    }
}

static void append_words(kvg_buf *out, rng *r, uint32_t n)
{
    for (uint32_t w = 0; w < n; w++) {
        kvg_buf_putc(out, ' ');
        kvg_buf_puts(out, words[rng_below(r, N_WORDS)]);
    }
}

/* Copy a finished buffer into the arena; NULL on failure (of either). */
static char *buf_to_arena(kvg_buf *b, kvg_arena *arena)
{
    if (b->failed)
        return NULL;
    return kvg_arena_strndup(arena, b->data ? b->data : "", b->len);
}

static int arena_text(kvg_buf *b, kvg_arena *arena, lg_message *m, const char *role)
{
    char *s = buf_to_arena(b, arena);
    m->len = b->len;
    kvg_buf_done(b);
    if (!s)
        return -ENOMEM;
    m->role = role;
    m->content = s;
    return 0;
}

static int steal_text(kvg_buf *b, char **text, size_t *len)
{
    if (b->failed) {
        kvg_buf_done(b);
        return -ENOMEM;
    }
    *text = kvg_buf_steal(b, len);
    return 0;
}

/* "Question <index>:" and a few words from r, then '?': the varying tail of a user turn. */
static void append_question(kvg_buf *b, rng *r, uint64_t index)
{
    kvg_buf_printf(b, "Question %llu:", (unsigned long long)index);
    append_words(b, r, USER_MIN_WORDS + rng_below(r, USER_SPAN_WORDS));
    kvg_buf_putc(b, '?');
}

/* The short, always different user turn of request index. */
static int user_message(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_message *m)
{
    rng r = rng_for(wl->seed, STREAM_USER, index);
    kvg_buf b;
    kvg_buf_init(&b);
    append_question(&b, &r, index);
    return arena_text(&b, arena, m, "user");
}

static lg_message *messages_alloc(kvg_arena *arena, size_t n)
{
    return kvg_arena_alloc(arena, n * sizeof(lg_message));
}

/* ---- shared-prefix -------------------------------------------------------------------------- */

static int shared_prefix_init(lg_workload *wl)
{
    wl->texts = calloc(SHARED_PROMPTS, sizeof(*wl->texts));
    wl->text_lens = calloc(SHARED_PROMPTS, sizeof(*wl->text_lens));
    if (!wl->texts || !wl->text_lens)
        return -ENOMEM;
    wl->n_texts = SHARED_PROMPTS;
    for (size_t k = 0; k < SHARED_PROMPTS; k++) {
        rng r = rng_for(wl->seed, STREAM_SYSTEM, k);
        kvg_buf b;
        kvg_buf_init(&b);
        /* Distinct openings, so two prompts never share even their first block. */
        kvg_buf_printf(&b, "You are the %s %s assistant number %zu.", words[rng_below(&r, N_WORDS)],
                       words[rng_below(&r, N_WORDS)], k + 1);
        append_sentences(&b, &r, SYSTEM_MIN_BYTES + rng_below(&r, SYSTEM_SPAN_BYTES));
        if (steal_text(&b, &wl->texts[k], &wl->text_lens[k]) < 0)
            return -ENOMEM;
    }
    return 0;
}

static int shared_prefix_item(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_item *out)
{
    rng r = rng_for(wl->seed, STREAM_PICK, index);
    uint32_t k = rng_below(&r, (uint32_t)wl->n_texts);
    lg_message *m = messages_alloc(arena, 2);
    if (!m)
        return -ENOMEM;
    m[0].role = "system";
    m[0].content = wl->texts[k];
    m[0].len = wl->text_lens[k];
    int rc = user_message(wl, index, arena, &m[1]);
    if (rc < 0)
        return rc;
    out->messages = m;
    out->n_messages = 2;
    out->tenant = 0;
    out->prefix = k;
    return 0;
}

/* ---- unique --------------------------------------------------------------------------------- */

static int unique_init(lg_workload *wl)
{
    (void)wl;
    return 0;
}

static int unique_item(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_item *out)
{
    /* As long as a shared-prefix request, but its first tokens name the request, so not even
     * the first block can be found in any cache. */
    rng r = rng_for(wl->seed, STREAM_UNIQUE, index);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_printf(&b, "Session %llu-%llu. You are the %s %s assistant.",
                   (unsigned long long)wl->seed, (unsigned long long)index,
                   words[rng_below(&r, N_WORDS)], words[rng_below(&r, N_WORDS)]);
    append_sentences(&b, &r, SYSTEM_MIN_BYTES + rng_below(&r, SYSTEM_SPAN_BYTES));
    char *sys = buf_to_arena(&b, arena);
    size_t sys_len = b.len;
    kvg_buf_done(&b);
    lg_message *m = messages_alloc(arena, 2);
    if (!sys || !m)
        return -ENOMEM;
    m[0].role = "system";
    m[0].content = sys;
    m[0].len = sys_len;
    int rc = user_message(wl, index, arena, &m[1]);
    if (rc < 0)
        return rc;
    out->messages = m;
    out->n_messages = 2;
    out->tenant = 0;
    out->prefix = LG_NO_PREFIX;
    return 0;
}

/* ---- multi-tenant --------------------------------------------------------------------------- */

static double rng_unit(rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Index of the first cdf entry above a uniform draw. */
static uint32_t pick_cdf(rng *r, const double *cdf, uint32_t n)
{
    double u = rng_unit(r);
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (u < cdf[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static uint32_t pick_doc(rng *r)
{
    double cdf[MT_DOCS_PER_GROUP], sum = 0;
    for (uint32_t d = 0; d < MT_DOCS_PER_GROUP; d++)
        cdf[d] = sum += pow(d + 1.0, -MT_DOC_ZIPF);
    for (uint32_t d = 0; d < MT_DOCS_PER_GROUP; d++)
        cdf[d] /= sum;
    return pick_cdf(r, cdf, MT_DOCS_PER_GROUP);
}

static int multi_tenant_init(lg_workload *wl)
{
    uint32_t t_count = wl->tenants;
    wl->groups = (t_count + LG_MT_GROUP_SIZE - 1) / LG_MT_GROUP_SIZE;
    wl->texts = calloc(t_count, sizeof(*wl->texts));
    wl->text_lens = calloc(t_count, sizeof(*wl->text_lens));
    wl->docs = calloc((size_t)wl->groups * MT_DOCS_PER_GROUP, sizeof(*wl->docs));
    wl->doc_lens = calloc((size_t)wl->groups * MT_DOCS_PER_GROUP, sizeof(*wl->doc_lens));
    wl->tenant_cdf = calloc(t_count, sizeof(*wl->tenant_cdf));
    if (!wl->texts || !wl->text_lens || !wl->docs || !wl->doc_lens || !wl->tenant_cdf)
        return -ENOMEM;

    double sum = 0;
    for (uint32_t t = 0; t < t_count; t++)
        wl->tenant_cdf[t] = sum += pow(t + 1.0, -MT_TENANT_ZIPF);
    for (uint32_t t = 0; t < t_count; t++)
        wl->tenant_cdf[t] /= sum;
    wl->tenant_cdf[t_count - 1] = 1.0;

    /* System prompt of tenant t = its group's preamble (the company's rules, shared by the
     * group's tenants, so a group scope can share those blocks) + the tenant's own part. */
    for (uint32_t t = 0; t < t_count; t++) {
        uint32_t g = t / LG_MT_GROUP_SIZE;
        rng pr = rng_for(wl->seed, STREAM_MT_PREAMBLE, g);
        rng sr = rng_for(wl->seed, STREAM_MT_SYSTEM, t);
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_buf_printf(&b, "Organisation %u of seed %llu. Rules for every assistant:", g + 1,
                       (unsigned long long)wl->seed);
        append_sentences(&b, &pr, MT_PREAMBLE_MIN_BYTES + rng_below(&pr, MT_PREAMBLE_SPAN_BYTES));
        kvg_buf_printf(&b, "\n\nYou are the %s %s assistant of team %u.",
                       words[rng_below(&sr, N_WORDS)], words[rng_below(&sr, N_WORDS)], t + 1);
        append_sentences(&b, &sr, MT_SYSTEM_MIN_BYTES + rng_below(&sr, MT_SYSTEM_SPAN_BYTES));
        int rc = steal_text(&b, &wl->texts[t], &wl->text_lens[t]);
        if (rc < 0)
            return rc;
        wl->n_texts = t + 1;
    }
    for (uint32_t k = 0; k < wl->groups * MT_DOCS_PER_GROUP; k++) {
        rng r = rng_for(wl->seed, STREAM_MT_DOC, k);
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_buf_printf(&b, "Document %u.%u: the %s %s %s.", k / MT_DOCS_PER_GROUP + 1,
                       k % MT_DOCS_PER_GROUP + 1, words[rng_below(&r, N_WORDS)],
                       words[rng_below(&r, N_WORDS)], words[rng_below(&r, N_WORDS)]);
        append_sentences(&b, &r, MT_DOC_MIN_BYTES + rng_below(&r, MT_DOC_SPAN_BYTES));
        int rc = steal_text(&b, &wl->docs[k], &wl->doc_lens[k]);
        if (rc < 0)
            return rc;
        wl->n_docs = k + 1;
    }
    kvg_buf b;
    kvg_buf_init(&b);
    for (uint32_t k = 1; k <= wl->max_tokens; k++)
        kvg_buf_puts(&b, sim_output_words[(k - 1) % KVG_ARRAY_LEN(sim_output_words)]);
    return steal_text(&b, &wl->reply, &wl->reply_len);
}

/* Where chat turn j (the j-th chat request) falls: which conversation, which turn of it. */
typedef struct mt_turn {
    uint64_t conv; /* conversation id, unique within the seed */
    uint32_t turn; /* 0 = the opening question */
    uint32_t tenant;
} mt_turn;

static void mt_locate(const lg_workload *wl, uint64_t j, mt_turn *out)
{
    uint64_t epoch = j / (MT_LANES * MT_SLOTS);
    uint32_t r = (uint32_t)(j % (MT_LANES * MT_SLOTS));
    uint32_t slot = r / MT_LANES, lane = r % MT_LANES;
    uint64_t lane_id = epoch * MT_LANES + lane;
    rng lr = rng_for(wl->seed, STREAM_MT_LANE, lane_id);
    uint32_t start = 0;
    for (;;) {
        uint32_t depth = MT_DEPTH_MIN + rng_below(&lr, MT_SLOTS - MT_DEPTH_MIN + 1);
        if (start + depth > slot)
            break;
        start += depth;
    }
    out->conv = lane_id * MT_SLOTS + start;
    out->turn = slot - start;
    rng cr = rng_for(wl->seed, STREAM_MT_CONV, out->conv);
    out->tenant = pick_cdf(&cr, wl->tenant_cdf, wl->tenants);
}

/* User message of turn k of conversation conv. */
static int mt_turn_message(const lg_workload *wl, uint64_t conv, uint32_t k, kvg_arena *arena,
                           lg_message *m)
{
    rng r = rng_for(wl->seed, STREAM_MT_TURN, conv * MT_SLOTS + k);
    kvg_buf b;
    kvg_buf_init(&b);
    if (k == 0)
        kvg_buf_printf(&b, "Conversation %llu.", (unsigned long long)conv);
    else
        kvg_buf_puts(&b, "And");
    append_words(&b, &r, MT_CHAT_MIN_WORDS + rng_below(&r, MT_CHAT_SPAN_WORDS));
    kvg_buf_putc(&b, '?');
    return arena_text(&b, arena, m, "user");
}

static int mt_chat(const lg_workload *wl, uint64_t j, kvg_arena *arena, lg_item *out)
{
    mt_turn at;
    mt_locate(wl, j, &at);
    size_t n = 2 + 2 * (size_t)at.turn;
    lg_message *m = messages_alloc(arena, n);
    if (!m)
        return -ENOMEM;
    m[0].role = "system";
    m[0].content = wl->texts[at.tenant];
    m[0].len = wl->text_lens[at.tenant];
    for (uint32_t k = 0; k <= at.turn; k++) {
        int rc = mt_turn_message(wl, at.conv, k, arena, &m[1 + 2 * k]);
        if (rc < 0)
            return rc;
        if (k < at.turn) {
            m[2 + 2 * k].role = "assistant";
            m[2 + 2 * k].content = wl->reply;
            m[2 + 2 * k].len = wl->reply_len;
        }
    }
    out->messages = m;
    out->n_messages = n;
    out->tenant = at.tenant;
    out->prefix = at.tenant;
    return 0;
}

/* Finish an item of two messages whose user message (m[1]) is written: the tenant's system
 * prompt first. */
static int system_and_user(const lg_workload *wl, uint32_t tenant, lg_message *m, lg_item *out)
{
    m[0].role = "system";
    m[0].content = wl->texts[tenant];
    m[0].len = wl->text_lens[tenant];
    out->messages = m;
    out->n_messages = 2;
    out->tenant = tenant;
    out->prefix = tenant;
    return 0;
}

static int mt_document(const lg_workload *wl, uint64_t index, uint32_t tenant, kvg_arena *arena,
                       lg_item *out)
{
    rng r = rng_for(wl->seed, STREAM_MT_DOCQ, index);
    uint32_t doc = (tenant / LG_MT_GROUP_SIZE) * MT_DOCS_PER_GROUP + pick_doc(&r);
    lg_message *m = messages_alloc(arena, 2);
    if (!m)
        return -ENOMEM;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "Answer from this document only.\n\n");
    kvg_buf_append(&b, wl->docs[doc], wl->doc_lens[doc]);
    kvg_buf_puts(&b, "\n\n");
    append_question(&b, &r, index);
    int rc = arena_text(&b, arena, &m[1], "user");
    if (rc < 0)
        return rc;
    return system_and_user(wl, tenant, m, out);
}

static int multi_tenant_item(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_item *out)
{
    /* The kind of request index: position index % block in a per-block shuffle of the kinds,
     * which also numbers the block's chat turns, so the j-th chat turn is found without
     * counting the requests before it. */
    uint64_t block = index / MT_MIX_BLOCK;
    uint32_t pos = (uint32_t)(index % MT_MIX_BLOCK);
    uint32_t perm[MT_MIX_BLOCK];
    for (uint32_t k = 0; k < MT_MIX_BLOCK; k++)
        perm[k] = k;
    rng mr = rng_for(wl->seed, STREAM_MT_MIX, block);
    for (uint32_t k = MT_MIX_BLOCK - 1; k > 0; k--) {
        uint32_t o = rng_below(&mr, k + 1);
        uint32_t tmp = perm[k];
        perm[k] = perm[o];
        perm[o] = tmp;
    }
    uint32_t kind = perm[pos];
    if (kind >= MT_MIX_SINGLE + MT_MIX_DOC)
        return mt_chat(wl, block * MT_MIX_CHAT + (kind - MT_MIX_SINGLE - MT_MIX_DOC), arena, out);
    rng tr = rng_for(wl->seed, STREAM_MT_TENANT, index);
    uint32_t tenant = pick_cdf(&tr, wl->tenant_cdf, wl->tenants);
    if (kind >= MT_MIX_SINGLE)
        return mt_document(wl, index, tenant, arena, out);
    lg_message *m = messages_alloc(arena, 2);
    if (!m)
        return -ENOMEM;
    int rc = user_message(wl, index, arena, &m[1]);
    if (rc < 0)
        return rc;
    return system_and_user(wl, tenant, m, out);
}

/* ---- registry ------------------------------------------------------------------------------- */

static const workload_ops workloads[] = {
    {"shared-prefix",
     "8 system prompts of ~300-500 tokens; each request = one of them + a short unique question",
     shared_prefix_init, shared_prefix_item},
    {"unique", "same sizes as shared-prefix, but every prompt differs from its first token",
     unique_init, unique_item},
    {"multi-tenant",
     "--tenants tenants (Zipf), own system prompts, group documents (RAG) and multi-turn chats",
     multi_tenant_init, multi_tenant_item},
};

size_t lg_workload_count(void)
{
    return KVG_ARRAY_LEN(workloads);
}

const char *lg_workload_list_name(size_t i)
{
    return i < KVG_ARRAY_LEN(workloads) ? workloads[i].name : NULL;
}

const char *lg_workload_list_help(size_t i)
{
    return i < KVG_ARRAY_LEN(workloads) ? workloads[i].help : NULL;
}

void lg_workload_free(lg_workload *wl)
{
    if (!wl)
        return;
    for (size_t i = 0; i < wl->n_texts; i++)
        free(wl->texts[i]);
    free(wl->texts);
    free(wl->text_lens);
    for (size_t i = 0; i < wl->n_docs; i++)
        free(wl->docs[i]);
    free(wl->docs);
    free(wl->doc_lens);
    free(wl->tenant_cdf);
    free(wl->reply);
    free(wl);
}

int lg_workload_new(const char *name, uint64_t seed, lg_workload **out)
{
    return lg_workload_new_opts(name, seed, NULL, out);
}

int lg_workload_new_opts(const char *name, uint64_t seed, const lg_workload_opts *opts,
                         lg_workload **out)
{
    static const lg_workload_opts defaults = {0};
    if (!opts)
        opts = &defaults;
    const workload_ops *ops = NULL;
    for (size_t i = 0; i < KVG_ARRAY_LEN(workloads); i++)
        if (strcmp(workloads[i].name, name) == 0)
            ops = &workloads[i];
    if (!ops)
        return KVG_ENOTFOUND;
    if (opts->tenants > LG_MT_MAX_TENANTS)
        return -EINVAL;
    lg_workload *wl = calloc(1, sizeof(*wl));
    if (!wl)
        return -ENOMEM;
    wl->ops = ops;
    wl->seed = seed;
    wl->tenants = 1;
    wl->max_tokens = opts->max_tokens ? opts->max_tokens : LG_DEFAULT_MAX_TOKENS;
    if (ops->init == multi_tenant_init)
        wl->tenants = opts->tenants ? opts->tenants : LG_MT_DEFAULT_TENANTS;
    int rc = ops->init(wl);
    if (rc < 0) {
        lg_workload_free(wl);
        return rc;
    }
    *out = wl;
    return 0;
}

const char *lg_workload_name(const lg_workload *wl)
{
    return wl->ops->name;
}

uint32_t lg_workload_tenants(const lg_workload *wl)
{
    return wl->tenants;
}

uint32_t lg_workload_group(const lg_workload *wl, uint32_t tenant)
{
    return wl->ops->init == multi_tenant_init ? tenant / LG_MT_GROUP_SIZE : 0;
}

uint32_t lg_workload_prefixes(const lg_workload *wl)
{
    return (uint32_t)wl->n_texts;
}

int lg_workload_item(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_item *out)
{
    lg_item item;
    int rc = wl->ops->item(wl, index, arena, &item);
    if (rc == 0)
        *out = item;
    return rc;
}
