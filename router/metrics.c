/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (format 0.0.4) of the registry's per-worker series. */
#include "router_int.h"

#include <stdio.h>

#include "prom_llm.h"

void kvg_worker_record_ttft(kvg_worker *w, uint64_t ttft_ns)
{
    kvg_prom_hist_observe(&worker_stripe(w)->ttft, &kvg_prom_ttft_buckets, ttft_ns);
}

void kvg_worker_record_itl(kvg_worker *w, uint64_t gap_ns, uint64_t n)
{
    worker_stats *st = worker_stripe(w);
    for (uint64_t i = 0; i < n; i++)
        kvg_prom_hist_observe(&st->itl, &kvg_prom_itl_buckets, gap_ns);
}

void kvg_worker_record_output_tokens(kvg_worker *w, int64_t tokens)
{
    if (tokens > 0)
        atomic_fetch_add_explicit(&worker_stripe(w)->output_tokens, (uint64_t)tokens,
                                  memory_order_relaxed);
}

/* The sum over w's stripes of the counter at offset in worker_stats. */
static uint64_t stats_sum(const kvg_worker *w, size_t offset)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < w->nstripes; i++)
        v += atomic_load_explicit(
            (_Atomic uint64_t *)(void *)((char *)worker_stats_at(w, i) + offset),
            memory_order_relaxed);
    return v;
}
#define STATS_SUM(w, field) stats_sum(w, offsetof(worker_stats, field))

/* One sample per worker of a gauge or counter without extra labels. */
static void put_simple(kvg_buf *out, const kvg_worker_set *set, const char *name,
                       kvg_prom_type type, const char *help, uint64_t (*value)(const kvg_worker *))
{
    kvg_prom_put_header(out, name, type, help);
    for (size_t i = 0; i < set->count; i++) {
        const kvg_worker *w = set->workers[i];
        kvg_prom_put_u64(out, name, KVG_PROM_LABELS({"worker", w->spec->name}), value(w));
    }
}

static uint64_t up_value(const kvg_worker *w)
{
    return kvg_worker_health_get(w) == KVG_WORKER_UP;
}

static uint64_t draining_value(const kvg_worker *w)
{
    return kvg_worker_draining(w);
}

static uint64_t inflight_value(const kvg_worker *w)
{
    return kvg_worker_inflight(w);
}

static uint64_t pending_value(const kvg_worker *w)
{
    return kvg_worker_pending(w);
}

static uint64_t max_inflight_value(const kvg_worker *w)
{
    return w->spec->max_inflight;
}

static uint64_t retries_value(const kvg_worker *w)
{
    return STATS_SUM(w, retries);
}

static uint64_t ejections_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->ejections, memory_order_relaxed);
}

static uint64_t usage_predicted_value(const kvg_worker *w)
{
    return STATS_SUM(w, usage_predicted);
}

static uint64_t usage_cached_value(const kvg_worker *w)
{
    return STATS_SUM(w, usage_cached);
}

static uint64_t usage_prompt_value(const kvg_worker *w)
{
    return STATS_SUM(w, usage_prompt);
}

static uint64_t usage_unreported_value(const kvg_worker *w)
{
    return STATS_SUM(w, usage_unreported);
}

static uint64_t scrape_errors_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->scrape_errors, memory_order_relaxed);
}

/* The last load scraped from each engine (however old: scrape errors say when it stopped);
 * workers never scraped have no sample. */
static void put_engine_load(kvg_buf *out, const kvg_worker_set *set)
{
    kvg_prom_put_header(
        out, "kvgate_worker_engine_waiting", KVG_PROM_GAUGE,
        "Requests waiting in the worker's engine (vllm:num_requests_waiting), as last "
        "scraped.");
    for (size_t i = 0; i < set->count; i++) {
        const kvg_worker *w = set->workers[i];
        uint32_t waiting;
        if (kvg_worker_engine_load(w, 0, 0, &waiting, NULL))
            kvg_prom_put_u64(out, "kvgate_worker_engine_waiting",
                             KVG_PROM_LABELS({"worker", w->spec->name}), waiting);
    }
    kvg_prom_put_header(out, "kvgate_worker_engine_kv_usage", KVG_PROM_GAUGE,
                        "Fraction (0..1) of the worker's engine KV cache in use "
                        "(vllm:kv_cache_usage_perc), as last scraped.");
    for (size_t i = 0; i < set->count; i++) {
        const kvg_worker *w = set->workers[i];
        float kv;
        if (kvg_worker_engine_load(w, 0, 0, NULL, &kv))
            kvg_prom_put_f64(out, "kvgate_worker_engine_kv_usage",
                             KVG_PROM_LABELS({"worker", w->spec->name}), (double)kv);
    }
}

static uint64_t output_tokens_value(const kvg_worker *w)
{
    return STATS_SUM(w, output_tokens);
}

/* The sum over w's stripes of the histogram at offset in worker_stats. */
static void hist_sum(const kvg_worker *w, size_t offset, kvg_prom_hist *out)
{
    kvg_prom_hist_init(out);
    for (unsigned i = 0; i < w->nstripes; i++)
        kvg_prom_hist_add(
            out,
            (const kvg_prom_hist *)(const void *)((const char *)worker_stats_at(w, i) + offset));
}

static void put_histogram_with(kvg_buf *out, const kvg_worker_set *set, const char *name,
                               const char *help, size_t offset, const kvg_prom_buckets *b)
{
    kvg_prom_put_header(out, name, KVG_PROM_HISTOGRAM, help);
    for (size_t i = 0; i < set->count; i++) {
        const kvg_worker *w = set->workers[i];
        kvg_prom_hist h;
        hist_sum(w, offset, &h);
        kvg_prom_put_hist(out, name, KVG_PROM_LABELS({"worker", w->spec->name}), &h, b);
    }
}

static void put_histogram(kvg_buf *out, const kvg_worker_set *set, const char *name,
                          const char *help, size_t offset)
{
    kvg_prom_put_header(out, name, KVG_PROM_HISTOGRAM, help);
    for (size_t i = 0; i < set->count; i++) {
        const kvg_worker *w = set->workers[i];
        kvg_prom_hist h;
        hist_sum(w, offset, &h);
        kvg_prom_put_hist(out, name, KVG_PROM_LABELS({"worker", w->spec->name}), &h,
                          &kvg_router_latency_buckets);
    }
}

void kvg_registry_write_metrics(kvg_registry *reg, kvg_buf *out)
{
    kvg_worker_set *set = kvg_registry_acquire(reg);

    put_simple(out, set, "kvgate_worker_up", KVG_PROM_GAUGE,
               "Whether the worker is up (1) or marked down by health checks (0).", up_value);
    put_simple(out, set, "kvgate_worker_draining", KVG_PROM_GAUGE,
               "Whether the worker is draining: listed, but given no new requests.",
               draining_value);
    put_simple(out, set, "kvgate_worker_inflight", KVG_PROM_GAUGE,
               "Requests this gateway has in flight to the worker.", inflight_value);
    put_simple(out, set, "kvgate_worker_pending_blocks", KVG_PROM_GAUGE,
               "Prompt blocks this gateway sent the worker that it has not started answering: "
               "prefill work queued ahead of the next request.",
               pending_value);
    put_simple(out, set, "kvgate_worker_max_inflight", KVG_PROM_GAUGE,
               "Most requests this gateway sends the worker at once.", max_inflight_value);

    kvg_prom_put_header(
        out, "kvgate_worker_requests_total", KVG_PROM_COUNTER,
        "Requests finished by the worker, by HTTP status sent to the client (0: the "
        "client went away before a status).");
    for (size_t i = 0; i < set->count; i++) {
        kvg_worker *w = set->workers[i];
        for (int code = 0; code < WORKER_CODES; code++) {
            uint64_t v = STATS_SUM(w, codes[code]);
            if (!v)
                continue;
            char label[12];
            snprintf(label, sizeof(label), "%d", code);
            kvg_prom_put_u64(out, "kvgate_worker_requests_total",
                             KVG_PROM_LABELS({"worker", w->spec->name}, {"code", label}), v);
        }
    }

    put_histogram(
        out, set, "kvgate_worker_request_duration_seconds",
        "Duration of requests finished on the worker, from arrival to the end of the response.",
        offsetof(worker_stats, duration));
    put_histogram(out, set, "kvgate_worker_ttfb_seconds",
                  "Time from the arrival of a request to the worker's response head (sent before "
                  "the first token by streaming engines: not the time to first token).",
                  offsetof(worker_stats, ttfb));
    put_histogram_with(out, set, "kvgate_worker_ttft_seconds",
                       "Time to first token: from the arrival of a completion or chat request to "
                       "the first SSE event with output (the first body byte of a non-streamed "
                       "200 answer).",
                       offsetof(worker_stats, ttft), &kvg_prom_ttft_buckets);
    put_histogram_with(out, set, "kvgate_worker_itl_seconds",
                       "Inter-token latency: time between consecutive SSE events with output of "
                       "a stream (events arriving in one read share the gap equally).",
                       offsetof(worker_stats, itl), &kvg_prom_itl_buckets);
    put_simple(out, set, "kvgate_worker_output_tokens_total", KVG_PROM_COUNTER,
               "Output tokens of answers from the worker (usage.completion_tokens).",
               output_tokens_value);
    put_simple(out, set, "kvgate_worker_retries_total", KVG_PROM_COUNTER,
               "Requests retried on another worker after a connect failure, a reset before "
               "any response byte, or a 502/503/504 held back from the client (upstream.retry_on).",
               retries_value);
    put_simple(out, set, "kvgate_worker_ejections_total", KVG_PROM_COUNTER,
               "Times passive outlier detection ejected the worker from routing (consecutive "
               "5xx answers or gateway failures; upstream.outlier).",
               ejections_value);
    kvg_prom_put_header(out, "kvgate_worker_ejected", KVG_PROM_GAUGE,
                        "Whether the worker is ejected by outlier detection now (1): listed, "
                        "maybe up, but given no new requests until its ejection ends.");
    uint64_t now = kvg_now_ns();
    for (size_t i = 0; i < set->count; i++) {
        const kvg_worker *w = set->workers[i];
        kvg_prom_put_u64(out, "kvgate_worker_ejected", KVG_PROM_LABELS({"worker", w->spec->name}),
                         kvg_worker_ejected(w, now));
    }
    registry_retry_stats *rs = kvg_router_retry_stats(reg);
    kvg_prom_put_scalar_u64(out, "kvgate_upstream_retries_active", KVG_PROM_GAUGE,
                            "Requests in flight that have retried on another worker: what the "
                            "retry budget bounds.",
                            atomic_load_explicit(&rs->active, memory_order_relaxed));
    kvg_prom_put_scalar_u64(out, "kvgate_upstream_retry_budget_exceeded_total", KVG_PROM_COUNTER,
                            "Retries not made because the retry budget was spent (the client got "
                            "the failure instead).",
                            atomic_load_explicit(&rs->refused, memory_order_relaxed));

    put_simple(out, set, "kvgate_worker_scrape_errors_total", KVG_PROM_COUNTER,
               "Failed scrapes of the worker engine's metrics (connect, timeout, status, "
               "oversized body, no vLLM load series).",
               scrape_errors_value);
    put_engine_load(out, set);

    put_simple(out, set, "kvgate_prefix_predicted_tokens_total", KVG_PROM_COUNTER,
               "Prompt tokens the prefix index predicted the worker had cached, over the "
               "requests whose response reported usage.",
               usage_predicted_value);
    put_simple(out, set, "kvgate_prefix_cached_tokens_total", KVG_PROM_COUNTER,
               "Prompt tokens the worker reported cached "
               "(usage.prompt_tokens_details.cached_tokens).",
               usage_cached_value);
    put_simple(out, set, "kvgate_prefix_prompt_tokens_total", KVG_PROM_COUNTER,
               "Prompt tokens the worker reported (usage.prompt_tokens).", usage_prompt_value);
    put_simple(out, set, "kvgate_prefix_unreported_total", KVG_PROM_COUNTER,
               "Answered requests whose response carried no usage with cached tokens.",
               usage_unreported_value);
    kvg_prom_put_header(
        out, "kvgate_prefix_predictions_total", KVG_PROM_COUNTER,
        "Requests by how the predicted prefix hit compared with the worker's report.");
    for (size_t i = 0; i < set->count; i++) {
        kvg_worker *w = set->workers[i];
        for (int o = 0; o < KVG_USAGE_OUTCOME_COUNT; o++)
            kvg_prom_put_u64(
                out, "kvgate_prefix_predictions_total",
                KVG_PROM_LABELS({"worker", w->spec->name}, {"outcome", kvg_usage_outcome_str(o)}),
                STATS_SUM(w, usage_outcomes[o]));
    }

    kvg_worker_set_unref(set);
}
