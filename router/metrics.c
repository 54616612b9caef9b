/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (format 0.0.4) of the registry's per-worker series. */
#include "router_int.h"

#include <string.h>

/* Label values escape backslash, double quote and line feed; nothing else. */
void kvg_router_put_label_value(kvg_buf *out, const char *v)
{
    const char *run = v;
    for (const char *p = v; *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        if (!esc)
            continue;
        kvg_buf_append(out, run, (size_t)(p - run));
        kvg_buf_puts(out, esc);
        run = p + 1;
    }
    kvg_buf_puts(out, run);
}

void kvg_router_put_header(kvg_buf *out, const char *name, const char *type, const char *help)
{
    /* help strings are constants without backslashes or line feeds, so need no escaping */
    kvg_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{worker="..." */
static void put_series(kvg_buf *out, const char *name, const kvg_worker *w)
{
    kvg_buf_puts(out, name);
    kvg_buf_puts(out, "{worker=\"");
    kvg_router_put_label_value(out, w->spec->name);
    kvg_buf_putc(out, '"');
}

/* One sample per worker of a gauge or counter without extra labels. */
static void put_simple(kvg_buf *out, const kvg_worker_set *set, const char *name, const char *type,
                       const char *help, uint64_t (*value)(const kvg_worker *))
{
    kvg_router_put_header(out, name, type, help);
    for (size_t i = 0; i < set->count; i++) {
        put_series(out, name, set->workers[i]);
        kvg_buf_printf(out, "} %llu\n", (unsigned long long)value(set->workers[i]));
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

static uint64_t max_inflight_value(const kvg_worker *w)
{
    return w->spec->max_inflight;
}

static uint64_t retries_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->retries, memory_order_relaxed);
}

static uint64_t usage_predicted_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->usage_predicted, memory_order_relaxed);
}

static uint64_t usage_cached_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->usage_cached, memory_order_relaxed);
}

static uint64_t usage_prompt_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->usage_prompt, memory_order_relaxed);
}

static uint64_t usage_unreported_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->usage_unreported, memory_order_relaxed);
}

static uint64_t scrape_errors_value(const kvg_worker *w)
{
    return atomic_load_explicit(&((kvg_worker *)w)->scrape_errors, memory_order_relaxed);
}

/* The last load scraped from each engine (however old: scrape errors say when it stopped);
 * workers never scraped have no sample. */
static void put_engine_load(kvg_buf *out, const kvg_worker_set *set)
{
    kvg_router_put_header(
        out, "kvgate_worker_engine_waiting", "gauge",
        "Requests waiting in the worker's engine (vllm:num_requests_waiting), as last "
        "scraped.");
    for (size_t i = 0; i < set->count; i++) {
        uint32_t waiting;
        if (kvg_worker_engine_load(set->workers[i], 0, 0, &waiting, NULL)) {
            put_series(out, "kvgate_worker_engine_waiting", set->workers[i]);
            kvg_buf_printf(out, "} %u\n", waiting);
        }
    }
    kvg_router_put_header(out, "kvgate_worker_engine_kv_usage", "gauge",
                          "Fraction (0..1) of the worker's engine KV cache in use "
                          "(vllm:kv_cache_usage_perc), as last scraped.");
    for (size_t i = 0; i < set->count; i++) {
        float kv;
        if (kvg_worker_engine_load(set->workers[i], 0, 0, NULL, &kv)) {
            put_series(out, "kvgate_worker_engine_kv_usage", set->workers[i]);
            kvg_buf_printf(out, "} %.6g\n", (double)kv);
        }
    }
}

static void put_histogram(kvg_buf *out, const kvg_worker_set *set, const char *name,
                          const char *help, size_t offset)
{
    kvg_router_put_header(out, name, "histogram", help);
    size_t nlen = strlen(name);
    char series[128];
    for (size_t i = 0; i < set->count; i++) {
        kvg_worker *w = set->workers[i];
        worker_hist *h = (worker_hist *)(void *)((char *)w + offset);
        /* Read each bucket once; cumulating the copy keeps the le series monotonic even
         * while other threads record. */
        uint64_t cum = 0;
        memcpy(series, name, nlen);
        memcpy(series + nlen, "_bucket", sizeof("_bucket"));
        for (size_t b = 0; b <= HIST_BUCKETS; b++) {
            cum += atomic_load_explicit(&h->buckets[b], memory_order_relaxed);
            put_series(out, series, w);
            kvg_buf_printf(out, ",le=\"%s\"} %llu\n",
                           b < HIST_BUCKETS ? kvg_router_hist_le[b] : "+Inf",
                           (unsigned long long)cum);
        }
        uint64_t sum_us = atomic_load_explicit(&h->sum_us, memory_order_relaxed);
        memcpy(series + nlen, "_sum", sizeof("_sum"));
        put_series(out, series, w);
        kvg_buf_printf(out, "} %llu.%06llu\n", (unsigned long long)(sum_us / 1000000),
                       (unsigned long long)(sum_us % 1000000));
        memcpy(series + nlen, "_count", sizeof("_count"));
        put_series(out, series, w);
        kvg_buf_printf(out, "} %llu\n", (unsigned long long)cum);
    }
}

void kvg_registry_write_metrics(kvg_registry *reg, kvg_buf *out)
{
    kvg_worker_set *set = kvg_registry_acquire(reg);

    put_simple(out, set, "kvgate_worker_up", "gauge",
               "Whether the worker is up (1) or marked down by health checks (0).", up_value);
    put_simple(out, set, "kvgate_worker_draining", "gauge",
               "Whether the worker is draining: listed, but given no new requests.",
               draining_value);
    put_simple(out, set, "kvgate_worker_inflight", "gauge",
               "Requests this gateway has in flight to the worker.", inflight_value);
    put_simple(out, set, "kvgate_worker_max_inflight", "gauge",
               "Most requests this gateway sends the worker at once.", max_inflight_value);

    kvg_router_put_header(
        out, "kvgate_worker_requests_total", "counter",
        "Requests finished by the worker, by HTTP status sent to the client (0: the "
        "client went away before a status).");
    for (size_t i = 0; i < set->count; i++) {
        kvg_worker *w = set->workers[i];
        for (int code = 0; code < WORKER_CODES; code++) {
            uint64_t v = atomic_load_explicit(&w->codes[code], memory_order_relaxed);
            if (!v)
                continue;
            put_series(out, "kvgate_worker_requests_total", w);
            kvg_buf_printf(out, ",code=\"%d\"} %llu\n", code, (unsigned long long)v);
        }
    }

    put_histogram(
        out, set, "kvgate_worker_request_duration_seconds",
        "Duration of requests finished on the worker, from arrival to the end of the response.",
        offsetof(kvg_worker, duration));
    put_histogram(out, set, "kvgate_worker_ttfb_seconds",
                  "Time from the arrival of a request to the first response byte from the worker.",
                  offsetof(kvg_worker, ttfb));
    put_simple(out, set, "kvgate_worker_retries_total", "counter",
               "Requests retried on another worker after a connect failure or a reset before "
               "any response byte from this one.",
               retries_value);

    put_simple(out, set, "kvgate_worker_scrape_errors_total", "counter",
               "Failed scrapes of the worker engine's metrics (connect, timeout, status, "
               "oversized body, no vLLM load series).",
               scrape_errors_value);
    put_engine_load(out, set);

    put_simple(out, set, "kvgate_prefix_predicted_tokens_total", "counter",
               "Prompt tokens the prefix index predicted the worker had cached, over the "
               "requests whose response reported usage.",
               usage_predicted_value);
    put_simple(out, set, "kvgate_prefix_cached_tokens_total", "counter",
               "Prompt tokens the worker reported cached "
               "(usage.prompt_tokens_details.cached_tokens).",
               usage_cached_value);
    put_simple(out, set, "kvgate_prefix_prompt_tokens_total", "counter",
               "Prompt tokens the worker reported (usage.prompt_tokens).", usage_prompt_value);
    put_simple(out, set, "kvgate_prefix_unreported_total", "counter",
               "Answered requests whose response carried no usage with cached tokens.",
               usage_unreported_value);
    kvg_router_put_header(
        out, "kvgate_prefix_predictions_total", "counter",
        "Requests by how the predicted prefix hit compared with the worker's report.");
    for (size_t i = 0; i < set->count; i++) {
        kvg_worker *w = set->workers[i];
        for (int o = 0; o < KVG_USAGE_OUTCOME_COUNT; o++) {
            put_series(out, "kvgate_prefix_predictions_total", w);
            kvg_buf_printf(out, ",outcome=\"%s\"} %llu\n", kvg_usage_outcome_str(o),
                           (unsigned long long)atomic_load_explicit(&w->usage_outcomes[o],
                                                                    memory_order_relaxed));
        }
    }

    kvg_worker_set_unref(set);
}
