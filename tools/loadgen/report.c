/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-loadgen's summary: one screen of text, or the same figures as one JSON object. */
#include "loadgen.h"

#include <string.h>

#include "kvg_config.h"

static double ms(uint64_t us)
{
    return (double)us / 1000.0;
}

static double ratio(uint64_t part, uint64_t whole)
{
    return whole ? (double)part / (double)whole : 0.0;
}

static uint64_t failed(const lg_stats *s)
{
    return s->requests - s->by_outcome[LG_OK];
}

static double elapsed_s(const lg_report_meta *m)
{
    return (double)m->elapsed_ns / 1e9;
}

/* The URLs of the run: meta's list, or its one url when it gives none. */
static size_t n_urls(const lg_report_meta *m)
{
    return m->urls && m->n_urls ? KVG_MIN(m->n_urls, (size_t)LG_MAX_URLS) : 1;
}

static const char *url_at(const lg_report_meta *m, size_t i)
{
    return m->urls && m->n_urls ? m->urls[i] : m->url;
}

/* Connections the runner opened: one per request when there are fewer requests than
 * --concurrency (the runner's rule), else --concurrency. */
static uint64_t connections(const lg_report_meta *m)
{
    if (m->requests_planned && m->requests_planned < m->concurrency)
        return m->requests_planned;
    return m->concurrency;
}

static double per_second(uint64_t n, const lg_report_meta *m)
{
    double e = elapsed_s(m);
    return e > 0 ? (double)n / e : 0.0;
}

/* ---- text ---------------------------------------------------------------------------------- */

static void text_percentiles(kvg_buf *out, const char *label, const lg_samples *v)
{
    kvg_buf_printf(out, "  %-12s", label);
    if (v->n == 0) {
        kvg_buf_puts(out, " -\n");
        return;
    }
    kvg_buf_printf(out, " p50 %.2f   p90 %.2f   p99 %.2f   max %.2f",
                   ms(lg_percentile(v->v, v->n, 50)), ms(lg_percentile(v->v, v->n, 90)),
                   ms(lg_percentile(v->v, v->n, 99)), ms(v->v[v->n - 1]));
    if (v->dropped)
        kvg_buf_printf(out, "   (%zu samples, %llu not kept)", v->n,
                       (unsigned long long)v->dropped);
    kvg_buf_putc(out, '\n');
}

static void text_errors(kvg_buf *out, const lg_stats *s)
{
    kvg_buf_printf(out, "  %-12s", "errors");
    if (failed(s) == 0) {
        kvg_buf_puts(out, " none\n");
        return;
    }
    const char *sep = " ";
    for (size_t st = 0; st < KVG_ARRAY_LEN(s->by_status); st++) {
        if (s->by_status[st] == 0 || (st >= 200 && st < 300))
            continue;
        kvg_buf_printf(out, "%sHTTP %zu x%llu", sep, st, (unsigned long long)s->by_status[st]);
        sep = ", ";
    }
    /* Non-2xx statuses are listed above; a 2xx with a broken body counts under its outcome. */
    for (int o = LG_OK + 1; o < LG_OUTCOME_COUNT; o++) {
        if (o == LG_HTTP_STATUS || s->by_outcome[o] == 0)
            continue;
        kvg_buf_printf(out, "%s%s x%llu", sep, lg_outcome_str((lg_outcome)o),
                       (unsigned long long)s->by_outcome[o]);
        sep = ", ";
    }
    kvg_buf_putc(out, '\n');
    if (s->first_error[0])
        kvg_buf_printf(out, "  %-12s %s\n", "first error", s->first_error);
}

static void text_worker(kvg_buf *out, const lg_worker_stat *w, uint64_t total)
{
    kvg_buf_printf(out, "  %-12s %-16s %9llu %6.1f%% %9llu %12llu %12llu %7.1f%%\n", "", w->name,
                   (unsigned long long)w->requests, 100.0 * ratio(w->requests, total),
                   (unsigned long long)w->ok, (unsigned long long)w->prompt_tokens,
                   (unsigned long long)w->cached_tokens,
                   100.0 * ratio(w->cached_tokens, w->prompt_tokens));
}

static void text_urls(kvg_buf *out, const lg_stats *s, const lg_report_meta *m)
{
    size_t n = n_urls(m);
    kvg_buf_printf(out, "  %-12s %-32s %11s %9s %7s %9s\n", "urls", "url", "connections",
                   "requests", "share", "ok");
    for (size_t i = 0; i < n; i++)
        kvg_buf_printf(
            out, "  %-12s %-32s %11u %9llu %6.1f%% %9llu\n", "", url_at(m, i),
            lg_url_connections(i, n, connections(m)), (unsigned long long)s->url_requests[i],
            100.0 * ratio(s->url_requests[i], s->requests), (unsigned long long)s->url_ok[i]);
}

void lg_report_text(kvg_buf *out, const lg_stats *s, const lg_report_meta *m)
{
    kvg_buf_printf(out, "kvgate-loadgen %s: %s", KVG_VERSION, url_at(m, 0));
    if (n_urls(m) > 1)
        kvg_buf_printf(out, " and %zu more URLs", n_urls(m) - 1);
    kvg_buf_printf(out, "  model %s  workload %s  seed %llu\n", m->model, m->workload,
                   (unsigned long long)m->seed);
    kvg_buf_printf(out, "  %-12s", "load");
    if (m->requests_planned)
        kvg_buf_printf(out, " %llu requests", (unsigned long long)m->requests_planned);
    if (m->requests_planned && m->duration_planned_s > 0)
        kvg_buf_puts(out, " or");
    if (m->duration_planned_s > 0)
        kvg_buf_printf(out, " %.1f s", m->duration_planned_s);
    kvg_buf_printf(out, ", concurrency %u, %s, max_tokens %u", m->concurrency,
                   m->stream ? "streaming" : "non-streaming", m->max_tokens);
    if (m->tenants > 1)
        kvg_buf_printf(out, ", %u tenants over %zu API keys", m->tenants, m->n_api_keys);
    kvg_buf_printf(out, "%s\n", m->interrupted ? "  (INTERRUPTED)" : "");
    kvg_buf_printf(out, "  %-12s %llu finished, %llu ok, %llu failed in %.2f s: %.1f req/s\n",
                   "requests", (unsigned long long)s->requests,
                   (unsigned long long)s->by_outcome[LG_OK], (unsigned long long)failed(s),
                   elapsed_s(m), per_second(s->requests, m));
    if (n_urls(m) > 1)
        text_urls(out, s, m);
    text_errors(out, s);
    text_percentiles(out, "latency ms", &s->latency);
    if (m->stream)
        text_percentiles(out, "ttft ms", &s->ttft);
    kvg_buf_printf(out, "  %-12s prompt %llu   cached %llu (%.1f%%)   completion %llu\n", "tokens",
                   (unsigned long long)s->prompt_tokens, (unsigned long long)s->cached_tokens,
                   100.0 * ratio(s->cached_tokens, s->prompt_tokens),
                   (unsigned long long)s->completion_tokens);
    if (s->usage_missing || s->cached_missing)
        kvg_buf_printf(
            out, "  %-12s %llu successes without usage, %llu usages without cached_tokens\n",
            "usage", (unsigned long long)s->usage_missing, (unsigned long long)s->cached_missing);
    uint64_t answered = 0;
    for (size_t i = 0; i < s->n_workers; i++)
        answered += s->workers[i].requests;
    answered += s->other.requests + s->unnamed.requests;
    if (answered == 0) {
        kvg_buf_printf(out, "  %-12s none answered\n", "workers");
        return;
    }
    kvg_buf_printf(out, "  %-12s %-16s %9s %7s %9s %12s %12s %8s\n", "workers", "name", "requests",
                   "share", "ok", "prompt tok", "cached tok", "cached");
    for (size_t i = 0; i < s->n_workers; i++)
        text_worker(out, &s->workers[i], answered);
    if (s->other.requests)
        text_worker(out, &s->other, answered);
    if (s->unnamed.requests)
        text_worker(out, &s->unnamed, answered);
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static void json_str(kvg_buf *out, const char *s)
{
    kvg_buf_json_string(out, s, strlen(s));
}

static void json_percentiles(kvg_buf *out, const lg_samples *v)
{
    if (v->n == 0) {
        kvg_buf_puts(out, "null");
        return;
    }
    /* The mean of the kept samples: what a run's TTFT is compared by across policies. */
    double sum = 0;
    for (size_t i = 0; i < v->n; i++)
        sum += (double)v->v[i];
    kvg_buf_printf(out,
                   "{\"mean\":%.3f,\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f,"
                   "\"samples\":%zu,\"dropped\":%llu}",
                   sum / (double)v->n / 1000.0, ms(lg_percentile(v->v, v->n, 50)),
                   ms(lg_percentile(v->v, v->n, 90)), ms(lg_percentile(v->v, v->n, 99)),
                   ms(v->v[v->n - 1]), v->n, (unsigned long long)v->dropped);
}

static void json_worker(kvg_buf *out, const lg_worker_stat *w, bool first)
{
    kvg_buf_puts(out, first ? "{\"name\":" : ",{\"name\":");
    json_str(out, w->name);
    kvg_buf_printf(out,
                   ",\"requests\":%llu,\"ok\":%llu,\"prompt_tokens\":%llu,\"cached_tokens\":%llu,"
                   "\"cached_ratio\":%.4f}",
                   (unsigned long long)w->requests, (unsigned long long)w->ok,
                   (unsigned long long)w->prompt_tokens, (unsigned long long)w->cached_tokens,
                   ratio(w->cached_tokens, w->prompt_tokens));
}

void lg_report_json(kvg_buf *out, const lg_stats *s, const lg_report_meta *m)
{
    kvg_buf_puts(out, "{\"tool\":\"kvgate-loadgen\",\"version\":");
    json_str(out, KVG_VERSION);
    kvg_buf_puts(out, ",\"url\":");
    json_str(out, url_at(m, 0));
    kvg_buf_puts(out, ",\"urls\":[");
    for (size_t i = 0; i < n_urls(m); i++) {
        kvg_buf_puts(out, i ? ",{\"url\":" : "{\"url\":");
        json_str(out, url_at(m, i));
        kvg_buf_printf(out, ",\"connections\":%u,\"requests\":%llu,\"ok\":%llu}",
                       lg_url_connections(i, n_urls(m), connections(m)),
                       (unsigned long long)s->url_requests[i], (unsigned long long)s->url_ok[i]);
    }
    kvg_buf_putc(out, ']');
    kvg_buf_puts(out, ",\"model\":");
    json_str(out, m->model);
    kvg_buf_puts(out, ",\"workload\":");
    json_str(out, m->workload);
    kvg_buf_printf(out,
                   ",\"seed\":%llu,\"tenants\":%u,\"api_keys\":%zu,\"concurrency\":%u,\"stream\":%"
                   "s,\"max_tokens\":%u,"
                   "\"requests_planned\":%llu,\"duration_planned_s\":%.3f,\"interrupted\":%s",
                   (unsigned long long)m->seed, m->tenants, m->n_api_keys, m->concurrency,
                   m->stream ? "true" : "false", m->max_tokens,
                   (unsigned long long)m->requests_planned, m->duration_planned_s,
                   m->interrupted ? "true" : "false");
    kvg_buf_printf(out,
                   ",\"requests\":%llu,\"ok\":%llu,\"failed\":%llu,\"elapsed_s\":%.3f,"
                   "\"throughput_rps\":%.2f,\"goodput_rps\":%.2f",
                   (unsigned long long)s->requests, (unsigned long long)s->by_outcome[LG_OK],
                   (unsigned long long)failed(s), elapsed_s(m), per_second(s->requests, m),
                   per_second(s->by_outcome[LG_OK], m));
    kvg_buf_puts(out, ",\"status\":{");
    const char *sep = "";
    for (size_t st = 0; st < KVG_ARRAY_LEN(s->by_status); st++) {
        if (s->by_status[st] == 0)
            continue;
        kvg_buf_printf(out, "%s\"%zu\":%llu", sep, st, (unsigned long long)s->by_status[st]);
        sep = ",";
    }
    kvg_buf_puts(out, "},\"errors\":{");
    sep = "";
    for (int o = LG_OK + 1; o < LG_OUTCOME_COUNT; o++) {
        if (s->by_outcome[o] == 0)
            continue;
        kvg_buf_printf(out, "%s\"%s\":%llu", sep, lg_outcome_str((lg_outcome)o),
                       (unsigned long long)s->by_outcome[o]);
        sep = ",";
    }
    kvg_buf_puts(out, "},\"first_error\":");
    if (s->first_error[0])
        json_str(out, s->first_error);
    else
        kvg_buf_puts(out, "null");
    kvg_buf_puts(out, ",\"latency_ms\":");
    json_percentiles(out, &s->latency);
    kvg_buf_puts(out, ",\"ttft_ms\":");
    json_percentiles(out, &s->ttft);
    kvg_buf_printf(out,
                   ",\"tokens\":{\"prompt\":%llu,\"cached\":%llu,\"completion\":%llu,"
                   "\"cached_ratio\":%.4f},\"usage_missing\":%llu,\"cached_missing\":%llu",
                   (unsigned long long)s->prompt_tokens, (unsigned long long)s->cached_tokens,
                   (unsigned long long)s->completion_tokens,
                   ratio(s->cached_tokens, s->prompt_tokens), (unsigned long long)s->usage_missing,
                   (unsigned long long)s->cached_missing);
    kvg_buf_puts(out, ",\"workers\":[");
    bool first = true;
    for (size_t i = 0; i < s->n_workers; i++, first = false)
        json_worker(out, &s->workers[i], first);
    if (s->other.requests) {
        json_worker(out, &s->other, first);
        first = false;
    }
    if (s->unnamed.requests)
        json_worker(out, &s->unnamed, first);
    kvg_buf_puts(out, "]}\n");
}
