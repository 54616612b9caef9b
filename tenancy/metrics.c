/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (format 0.0.4) of the per-tenant and authentication counters. */
#include "tenancy_int.h"

#include <string.h>

#include "prom.h"
#include "prom_llm.h"

/*
 * Series (one per tenant of the current snapshot; a removed tenant's series disappear):
 *   kvgate_tenants                                 gauge    tenants defined
 *   kvgate_tenant_requests_total{tenant,code}      counter  finished requests by status: codes
 *       200 400 401 403 404 408 413 422 429 499 500 502 503 504 by themselves, other statuses
 *       by class ("1xx".."5xx"), anything outside 100..599 as "other"; only non-zero series
 *   kvgate_tenant_rate_limited_total{tenant,reason} counter refusals by the admission check,
 *       reason "rate", "bytes", "inflight" or "buffer" (all four always present)
 *   kvgate_tenant_prompt_bytes_total{tenant}       counter  prompt bytes of admitted requests
 *   kvgate_tenant_inflight{tenant}                 gauge    admitted requests not yet released
 *   kvgate_tenant_buffered_bytes{tenant}           gauge    request-body bytes held for it
 *   kvgate_tenant_prompt_tokens_total{tenant}      counter  prompt tokens the engines reported
 *   kvgate_tenant_cached_tokens_total{tenant}      counter  of which cached, as reported
 *   kvgate_tenant_predicted_tokens_total{tenant}   counter  of which the router predicted cached
 *   kvgate_tenant_output_tokens_total{tenant}      counter  completion tokens the engines reported
 *   kvgate_tenant_ttft_seconds{tenant}             histogram time to first token
 *   kvgate_tenant_itl_seconds{tenant}              histogram time between output events
 *   kvgate_auth_failures_total{reason}             counter  "missing", "malformed", "unknown"
 * Label cardinality: tenants with an ordinal below label_cap get a label of their own; the rest
 * are summed under tenant="other", which follows the labelled tenants. A tenant whose id is
 * "other" is always counted there, so the series never repeats.
 */

const char *const kvg_tenancy_auth_reasons[AUTH_REASON_COUNT] = {
    [AUTH_MISSING] = "missing",
    [AUTH_MALFORMED] = "malformed",
    [AUTH_UNKNOWN] = "unknown",
};

void kvg_tenant_record_ttft(kvg_tenant *t, uint64_t ttft_ns)
{
    kvg_prom_hist_observe(&t->rt->ttft, &kvg_prom_ttft_buckets, ttft_ns);
}

void kvg_tenant_record_itl(kvg_tenant *t, uint64_t gap_ns, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        kvg_prom_hist_observe(&t->rt->itl, &kvg_prom_itl_buckets, gap_ns);
}

void kvg_tenant_record_output_tokens(kvg_tenant *t, int64_t tokens)
{
    if (tokens > 0)
        atomic_fetch_add_explicit(&t->rt->output_tokens, (uint64_t)tokens, memory_order_relaxed);
}

/* The counters of one label value: a tenant's, or the sum of the capped ones. */
typedef struct tenant_counts {
    uint64_t codes[TENANT_CODE_SLOTS];
    uint64_t refusals[KVG_ADMIT_RESULT_COUNT];
    uint64_t prompt_bytes;
    uint64_t inflight;
    uint64_t buffered;
    uint64_t usage[3]; /* prompt, cached, predicted tokens */
    uint64_t output_tokens;
    kvg_prom_hist ttft, itl;
} tenant_counts;

static void read_counts(const tenant_runtime *rt, tenant_counts *c)
{
    tenant_runtime *r = (tenant_runtime *)rt;
    for (size_t i = 0; i < TENANT_CODE_SLOTS; i++)
        c->codes[i] = atomic_load_explicit(&r->codes[i], memory_order_relaxed);
    for (size_t i = 0; i < KVG_ADMIT_RESULT_COUNT; i++)
        c->refusals[i] = atomic_load_explicit(&r->refusals[i], memory_order_relaxed);
    c->prompt_bytes = atomic_load_explicit(&r->prompt_bytes, memory_order_relaxed);
    c->inflight = atomic_load_explicit(&r->inflight, memory_order_relaxed);
    c->buffered = atomic_load_explicit(&r->buffered, memory_order_relaxed);
    c->usage[0] = atomic_load_explicit(&r->usage_prompt, memory_order_relaxed);
    c->usage[1] = atomic_load_explicit(&r->usage_cached, memory_order_relaxed);
    c->usage[2] = atomic_load_explicit(&r->usage_predicted, memory_order_relaxed);
    c->output_tokens = atomic_load_explicit(&r->output_tokens, memory_order_relaxed);
    kvg_prom_hist_init(&c->ttft);
    kvg_prom_hist_init(&c->itl);
    kvg_prom_hist_add(&c->ttft, &r->ttft);
    kvg_prom_hist_add(&c->itl, &r->itl);
}

static void add_counts(tenant_counts *sum, const tenant_counts *c)
{
    for (size_t i = 0; i < TENANT_CODE_SLOTS; i++)
        sum->codes[i] += c->codes[i];
    for (size_t i = 0; i < KVG_ADMIT_RESULT_COUNT; i++)
        sum->refusals[i] += c->refusals[i];
    sum->prompt_bytes += c->prompt_bytes;
    sum->inflight += c->inflight;
    sum->buffered += c->buffered;
    for (size_t i = 0; i < 3; i++)
        sum->usage[i] += c->usage[i];
    sum->output_tokens += c->output_tokens;
    kvg_prom_hist_add(&sum->ttft, &c->ttft);
    kvg_prom_hist_add(&sum->itl, &c->itl);
}

typedef enum family {
    FAM_REQUESTS = 0,
    FAM_REFUSALS,
    FAM_PROMPT_BYTES,
    FAM_INFLIGHT,
    FAM_BUFFERED,
    FAM_PROMPT_TOKENS,
    FAM_CACHED_TOKENS,
    FAM_PREDICTED_TOKENS,
    FAM_OUTPUT_TOKENS,
    FAM_TTFT,
    FAM_ITL,
    FAM_COUNT,
} family;

static void put_counts(kvg_buf *out, family f, const char *tenant, const tenant_counts *c)
{
    switch (f) {
    case FAM_REQUESTS:
        for (size_t i = 0; i < TENANT_CODE_SLOTS; i++) {
            if (!c->codes[i])
                continue;
            kvg_prom_put_u64(
                out, "kvgate_tenant_requests_total",
                KVG_PROM_LABELS({"tenant", tenant}, {"code", kvg_tenancy_code_label(i)}),
                c->codes[i]);
        }
        break;
    case FAM_REFUSALS:
        for (size_t i = KVG_ADMIT_OK + 1; i < KVG_ADMIT_RESULT_COUNT; i++)
            kvg_prom_put_u64(out, "kvgate_tenant_rate_limited_total",
                             KVG_PROM_LABELS({"tenant", tenant},
                                             {"reason", kvg_admit_result_str((kvg_admit_result)i)}),
                             c->refusals[i]);
        break;
    case FAM_PROMPT_BYTES:
        kvg_prom_put_u64(out, "kvgate_tenant_prompt_bytes_total",
                         KVG_PROM_LABELS({"tenant", tenant}), c->prompt_bytes);
        break;
    case FAM_INFLIGHT:
        kvg_prom_put_u64(out, "kvgate_tenant_inflight", KVG_PROM_LABELS({"tenant", tenant}),
                         c->inflight);
        break;
    case FAM_BUFFERED:
        kvg_prom_put_u64(out, "kvgate_tenant_buffered_bytes", KVG_PROM_LABELS({"tenant", tenant}),
                         c->buffered);
        break;
    case FAM_PROMPT_TOKENS:
    case FAM_CACHED_TOKENS:
    case FAM_PREDICTED_TOKENS: {
        static const char *const names[] = {"kvgate_tenant_prompt_tokens_total",
                                            "kvgate_tenant_cached_tokens_total",
                                            "kvgate_tenant_predicted_tokens_total"};
        size_t k = (size_t)(f - FAM_PROMPT_TOKENS);
        kvg_prom_put_u64(out, names[k], KVG_PROM_LABELS({"tenant", tenant}), c->usage[k]);
        break;
    }
    case FAM_OUTPUT_TOKENS:
        kvg_prom_put_u64(out, "kvgate_tenant_output_tokens_total",
                         KVG_PROM_LABELS({"tenant", tenant}), c->output_tokens);
        break;
    case FAM_TTFT:
        kvg_prom_put_hist(out, "kvgate_tenant_ttft_seconds", KVG_PROM_LABELS({"tenant", tenant}),
                          &c->ttft, &kvg_prom_ttft_buckets);
        break;
    case FAM_ITL:
        kvg_prom_put_hist(out, "kvgate_tenant_itl_seconds", KVG_PROM_LABELS({"tenant", tenant}),
                          &c->itl, &kvg_prom_itl_buckets);
        break;
    case FAM_COUNT:
        break;
    }
}

static bool labelled(const kvg_tenant *t, size_t label_cap)
{
    return t->rt->ordinal < label_cap && strcmp(t->spec->id, "other") != 0;
}

void kvg_tenants_write_metrics(kvg_tenants *ts, size_t label_cap, kvg_buf *out)
{
    static const struct {
        const char *name;
        kvg_prom_type type;
        const char *help;
    } fams[FAM_COUNT] = {
        [FAM_REQUESTS] = {"kvgate_tenant_requests_total", KVG_PROM_COUNTER,
                          "Requests of the tenant finished, by HTTP status sent to the client "
                          "(499: the client went away; other statuses by class)."},
        [FAM_REFUSALS] = {"kvgate_tenant_rate_limited_total", KVG_PROM_COUNTER,
                          "Requests of the tenant refused with 429 by its limits, by reason "
                          "(rate, bytes, inflight, buffer: its share of the body budget)."},
        [FAM_PROMPT_BYTES] = {"kvgate_tenant_prompt_bytes_total", KVG_PROM_COUNTER,
                              "Prompt bytes of the tenant's finished requests."},
        [FAM_INFLIGHT] = {"kvgate_tenant_inflight", KVG_PROM_GAUGE,
                          "Requests of the tenant admitted and not yet finished."},
        [FAM_BUFFERED] = {"kvgate_tenant_buffered_bytes", KVG_PROM_GAUGE,
                          "Request-body bytes the gateway holds for the tenant now (received "
                          "and rewritten), against its share of limits.body_budget_mib."},
        [FAM_PROMPT_TOKENS] = {"kvgate_tenant_prompt_tokens_total", KVG_PROM_COUNTER,
                               "Prompt tokens of the tenant's answered requests, as the "
                               "engines reported them (usage.prompt_tokens)."},
        [FAM_CACHED_TOKENS] = {"kvgate_tenant_cached_tokens_total", KVG_PROM_COUNTER,
                               "Of those, tokens the engines reported served from their prefix "
                               "cache (usage.prompt_tokens_details.cached_tokens)."},
        [FAM_PREDICTED_TOKENS] = {"kvgate_tenant_predicted_tokens_total", KVG_PROM_COUNTER,
                                  "Of those, tokens the router predicted cached on the worker "
                                  "it chose."},
        [FAM_OUTPUT_TOKENS] = {"kvgate_tenant_output_tokens_total", KVG_PROM_COUNTER,
                               "Output tokens of the tenant's answers, as the engines reported "
                               "them (usage.completion_tokens)."},
        [FAM_TTFT] = {"kvgate_tenant_ttft_seconds", KVG_PROM_HISTOGRAM,
                      "Time to first token of the tenant's completion and chat requests: to the "
                      "first SSE event with output, or the first body byte of a JSON answer."},
        [FAM_ITL] = {"kvgate_tenant_itl_seconds", KVG_PROM_HISTOGRAM,
                     "Time between consecutive SSE events with output of the tenant's streams."},
    };
    kvg_tenant_set *set = kvg_tenants_acquire(ts);

    kvg_prom_put_scalar_u64(out, "kvgate_tenants", KVG_PROM_GAUGE, "Tenants defined.", set->count);

    /* The capped tenants' sum, read once so every family shows the same moment's sum. */
    tenant_counts other = {0}, c;
    kvg_prom_hist_init(&other.ttft);
    kvg_prom_hist_init(&other.itl);
    bool any_other = false;
    for (size_t i = 0; i < set->count; i++) {
        const kvg_tenant *t = set->tenants[i];
        if (labelled(t, label_cap))
            continue;
        read_counts(t->rt, &c);
        add_counts(&other, &c);
        any_other = true;
    }
    for (int f = 0; f < FAM_COUNT; f++) {
        kvg_prom_put_header(out, fams[f].name, fams[f].type, fams[f].help);
        for (size_t i = 0; i < set->count; i++) {
            const kvg_tenant *t = set->tenants[i];
            if (!labelled(t, label_cap))
                continue;
            read_counts(t->rt, &c);
            put_counts(out, (family)f, t->spec->id, &c);
        }
        if (any_other)
            put_counts(out, (family)f, "other", &other);
    }

    kvg_prom_put_by_label(out, "kvgate_auth_failures_total", KVG_PROM_COUNTER,
                          "Requests refused with 401 before any tenant was known, by reason "
                          "(missing, malformed, unknown key).",
                          "reason", kvg_tenancy_auth_reasons, ts->auth_failures, AUTH_REASON_COUNT);
    kvg_tenant_set_unref(set);
}
