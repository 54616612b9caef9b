/* SPDX-License-Identifier: Apache-2.0 */
/* Built-in workloads of kvgate-loadgen: shared-prefix and unique chat requests.
 *
 * Every random draw comes from a counter-based generator keyed by (seed, stream, index), never
 * from state carried between calls, so request i is the same whatever the concurrency, the
 * order of completions or the number of requests before it. Adding a workload means adding one
 * entry to `workloads` below: an init that generates the shared texts once and an item
 * function that assembles request i from them. A multi-tenant workload (per-tenant system
 * prompts, group-shared documents, multi-turn chats whose history grows) keeps its prompts and
 * documents in `texts`, picks the tenant and the conversation from the index, and sets
 * lg_item.tenant so the runner sends that tenant's key. */
#include "workload.h"

#include <errno.h>
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
    STREAM_SYSTEM = 1, /* text of shared system prompt k */
    STREAM_PICK = 2,   /* which shared prompt request i uses */
    STREAM_USER = 3,   /* user message of request i */
    STREAM_UNIQUE = 4, /* private system prompt of request i */
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

/* The short, always different user turn of request index. */
static int user_message(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_message *m)
{
    rng r = rng_for(wl->seed, STREAM_USER, index);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_printf(&b, "Question %llu:", (unsigned long long)index);
    append_words(&b, &r, USER_MIN_WORDS + rng_below(&r, USER_SPAN_WORDS));
    kvg_buf_putc(&b, '?');
    char *s = buf_to_arena(&b, arena);
    size_t len = b.len;
    kvg_buf_done(&b);
    if (!s)
        return -ENOMEM;
    m->role = "user";
    m->content = s;
    m->len = len;
    return 0;
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
        if (b.failed) {
            kvg_buf_done(&b);
            return -ENOMEM;
        }
        wl->texts[k] = kvg_buf_steal(&b, &wl->text_lens[k]);
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

/* ---- registry ------------------------------------------------------------------------------- */

static const workload_ops workloads[] = {
    {"shared-prefix",
     "8 system prompts of ~300-500 tokens; each request = one of them + a short unique question",
     shared_prefix_init, shared_prefix_item},
    {"unique", "same sizes as shared-prefix, but every prompt differs from its first token",
     unique_init, unique_item},
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
    free(wl);
}

int lg_workload_new(const char *name, uint64_t seed, lg_workload **out)
{
    const workload_ops *ops = NULL;
    for (size_t i = 0; i < KVG_ARRAY_LEN(workloads); i++)
        if (strcmp(workloads[i].name, name) == 0)
            ops = &workloads[i];
    if (!ops)
        return KVG_ENOTFOUND;
    lg_workload *wl = calloc(1, sizeof(*wl));
    if (!wl)
        return -ENOMEM;
    wl->ops = ops;
    wl->seed = seed;
    wl->tenants = 1;
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
