/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition of the simulated engine, with vLLM v1's metric names, labels and
 * histogram buckets, so scrapers written for vLLM read it unchanged. */
#include "simworker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* vLLM's bucket bounds (seconds) for the histograms we export. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double e2e_bounds[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                    5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

static const struct {
    const char *name;
    const char *help;
    const double *bounds;
    size_t n;
} hists[SIM_HIST_COUNT] = {
    [SIM_HIST_TTFT] = {"vllm:time_to_first_token_seconds",
                       "Histogram of time to first token in seconds.", ttft_bounds,
                       KVG_ARRAY_LEN(ttft_bounds)},
    [SIM_HIST_E2E] = {"vllm:e2e_request_latency_seconds",
                      "Histogram of e2e request latency in seconds.", e2e_bounds,
                      KVG_ARRAY_LEN(e2e_bounds)},
    [SIM_HIST_QUEUE] = {"vllm:request_queue_time_seconds",
                        "Histogram of time spent in WAITING phase for request.", e2e_bounds,
                        KVG_ARRAY_LEN(e2e_bounds)},
};

_Static_assert(KVG_ARRAY_LEN(ttft_bounds) <= SIM_HIST_MAX_BUCKETS, "ttft buckets");
_Static_assert(KVG_ARRAY_LEN(e2e_bounds) <= SIM_HIST_MAX_BUCKETS, "e2e buckets");

void sim_hist_init(sim_hist *h, sim_hist_kind kind)
{
    memset(h, 0, sizeof(*h));
    h->bounds = hists[kind].bounds;
    h->n_bounds = hists[kind].n;
}

void sim_hist_observe(sim_hist *h, double seconds)
{
    size_t i = 0;
    while (i < h->n_bounds && seconds > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += seconds;
    h->count++;
}

/* Label values are escaped as the exposition format requires (\\, \", \n). */
static void put_label_value(kvg_buf *out, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            kvg_buf_putc(out, '\\');
        if (*v == '\n') {
            kvg_buf_puts(out, "\\n");
            continue;
        }
        kvg_buf_putc(out, *v);
    }
}

static void header(kvg_buf *out, const char *family, const char *type, const char *help)
{
    kvg_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", family, help, family, type);
}

/* The shortest of %.15g/%.17g that reads back exactly, as Python's repr does for
 * prometheus_client. Integral values print without a fraction, which parsers accept. */
static void put_value(kvg_buf *out, double v)
{
    char s[40];
    snprintf(s, sizeof(s), "%.15g", v);
    if (strtod(s, NULL) != v)
        snprintf(s, sizeof(s), "%.17g", v);
    kvg_buf_puts(out, s);
}

static void sample(kvg_buf *out, const char *name, const char *lbl, const char *extra, double value)
{
    kvg_buf_printf(out, "%s{%s%s%s} ", name, lbl, extra && *extra ? "," : "", extra ? extra : "");
    put_value(out, value);
    kvg_buf_putc(out, '\n');
}

static void gauge(kvg_buf *out, const char *lbl, const char *name, const char *help, double v)
{
    header(out, name, "gauge", help);
    sample(out, name, lbl, NULL, v);
}

static void counter(kvg_buf *out, const char *lbl, const char *family, const char *help, uint64_t v)
{
    char name[128];
    snprintf(name, sizeof(name), "%s_total", family);
    header(out, family, "counter", help);
    sample(out, name, lbl, NULL, (double)v);
}

static void histogram(kvg_buf *out, const char *lbl, sim_hist_kind kind, const sim_hist *h)
{
    char name[128], le[64];
    header(out, hists[kind].name, "histogram", hists[kind].help);
    snprintf(name, sizeof(name), "%s_bucket", hists[kind].name);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        snprintf(le, sizeof(le), "le=\"%g\"", h->bounds[i]);
        sample(out, name, lbl, le, (double)cum);
    }
    cum += h->counts[h->n_bounds];
    sample(out, name, lbl, "le=\"+Inf\"", (double)cum);
    snprintf(name, sizeof(name), "%s_count", hists[kind].name);
    sample(out, name, lbl, NULL, (double)h->count);
    snprintf(name, sizeof(name), "%s_sum", hists[kind].name);
    sample(out, name, lbl, NULL, h->sum);
}

void sim_metrics_render(const sim_config *cfg, const sim_stats *st, kvg_buf *out)
{
    kvg_buf lb;
    kvg_buf_init(&lb);
    kvg_buf_puts(&lb, "engine=\"0\",model_name=\"");
    put_label_value(&lb, cfg->models[0]);
    kvg_buf_putc(&lb, '"');
    const char *lbl = lb.failed || !lb.data ? "engine=\"0\"" : lb.data;

    gauge(out, lbl, "vllm:num_requests_running", "Number of requests in model execution batches.",
          st->running);
    gauge(out, lbl, "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          st->waiting);
    gauge(out, lbl, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          st->blocks_total ? 1.0 - (double)st->blocks_free / st->blocks_total : 0.0);
    counter(out, lbl, "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.", st->prefix_queries);
    counter(out, lbl, "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.", st->prefix_hits);
    counter(out, lbl, "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            0);
    counter(out, lbl, "vllm:prompt_tokens", "Number of prefill tokens processed.",
            st->prompt_tokens);
    counter(out, lbl, "vllm:generation_tokens", "Number of generation tokens processed.",
            st->generation_tokens);

    header(out, "vllm:request_success", "counter", "Count of successfully processed requests.");
    static const char *const reasons[] = {"stop", "length", "abort"};
    for (size_t i = 0; i < KVG_ARRAY_LEN(reasons); i++) {
        char extra[64];
        uint64_t v = i == 0 ? st->finished_stop : i == 1 ? st->finished_length : st->finished_abort;
        snprintf(extra, sizeof(extra), "finished_reason=\"%s\"", reasons[i]);
        sample(out, "vllm:request_success_total", lbl, extra, (double)v);
    }
    for (int k = 0; k < SIM_HIST_COUNT; k++)
        histogram(out, lbl, (sim_hist_kind)k, &st->hist[k]);

    /* vLLM publishes its cache geometry as an info gauge; a router can read capacity here. */
    header(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    kvg_buf_printf(out,
                   "vllm:cache_config_info{block_size=\"%u\",cache_dtype=\"auto\","
                   "enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"%u\","
                   "prefix_caching_hash_algo=\"%s\"} 1\n",
                   cfg->block_tokens, cfg->kv_blocks,
                   cfg->exact ? sim_vllm_algo_str(sim_exact_algo(cfg->exact)) : "sha256");

    /* The simulator's own view, for tests and debugging (not vLLM names). */
    gauge(out, lbl, "kvgate_simworker_cached_blocks",
          "Blocks that hold a findable prefix hash (referenced or not).", st->blocks_cached);
    counter(out, lbl, "kvgate_simworker_evicted_blocks",
            "Cached blocks evicted (LRU) to make room.", st->evicted_blocks);
    counter(out, lbl, "kvgate_simworker_injected_errors", "Requests answered 500 by --error-rate.",
            st->http_errors_injected);
    counter(out, lbl, "kvgate_simworker_cut_streams",
            "Streams closed abruptly by --close-mid-stream-rate.", st->streams_cut);
    kvg_buf_done(&lb);
}
