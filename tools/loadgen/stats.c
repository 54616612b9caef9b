/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-loadgen's statistics: outcomes, latency samples, percentiles and per-worker counts. */
#include "loadgen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *lg_outcome_str(lg_outcome o)
{
    static const char *const names[LG_OUTCOME_COUNT] = {
        "ok",         "http_status", "timeout",      "connection", "too_large",   "bad_headers",
        "incomplete", "bad_body",    "stream_error", "cancelled",  "local_error",
    };
    return o < LG_OUTCOME_COUNT ? names[o] : "?";
}

static void samples_done(lg_samples *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

static void samples_add(lg_samples *s, uint64_t v)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        if (cap > LG_MAX_SAMPLES)
            cap = LG_MAX_SAMPLES;
        uint64_t *p = cap > s->cap ? realloc(s->v, cap * sizeof(*p)) : NULL;
        if (!p) {
            s->dropped++;
            return;
        }
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    s->sorted = false;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void samples_sort(lg_samples *s)
{
    if (!s->sorted && s->n > 1)
        qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
    s->sorted = true;
}

uint64_t lg_percentile(const uint64_t *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    if (p <= 0)
        return sorted[0];
    /* Nearest rank: ceil(p/100 * n), computed so 99% of 100 is exactly rank 99. */
    double r = ceil(p / 100.0 * (double)n - 1e-9);
    size_t rank = r < 1 ? 1 : (size_t)r;
    if (rank > n)
        rank = n;
    return sorted[rank - 1];
}

void lg_stats_init(lg_stats *s)
{
    memset(s, 0, sizeof(*s));
    strcpy(s->other.name, "(other)");
    strcpy(s->unnamed.name, "(none)");
}

void lg_stats_done(lg_stats *s)
{
    samples_done(&s->latency);
    samples_done(&s->ttft);
}

void lg_stats_finish(lg_stats *s)
{
    samples_sort(&s->latency);
    samples_sort(&s->ttft);
}

static lg_worker_stat *worker_slot(lg_stats *s, const char *name)
{
    if (!name[0])
        return &s->unnamed;
    for (size_t i = 0; i < s->n_workers; i++)
        if (strcmp(s->workers[i].name, name) == 0)
            return &s->workers[i];
    if (s->n_workers == LG_MAX_WORKERS)
        return &s->other;
    lg_worker_stat *w = &s->workers[s->n_workers++];
    memset(w, 0, sizeof(*w));
    snprintf(w->name, sizeof(w->name), "%s", name);
    return w;
}

/* Keep the first error for the report, reduced to one printable line. */
static void keep_first_error(lg_stats *s, const lg_result *r)
{
    if (s->first_error[0])
        return;
    char *out = s->first_error;
    size_t cap = sizeof(s->first_error);
    int n = r->status ? snprintf(out, cap, "%s %d", lg_outcome_str(r->outcome), r->status)
                      : snprintf(out, cap, "%s", lg_outcome_str(r->outcome));
    size_t len = n < 0 ? 0 : KVG_MIN((size_t)n, cap - 1);
    if (r->detail && r->detail_len && len + 2 < cap) {
        out[len++] = ':';
        out[len++] = ' ';
        for (size_t i = 0; i < r->detail_len && len + 1 < cap; i++) {
            unsigned char c = (unsigned char)r->detail[i];
            out[len++] = c >= 0x20 && c < 0x7f ? (char)c : ' ';
        }
    }
    out[len] = '\0';
}

uint32_t lg_url_connections(size_t i, size_t n_urls, uint64_t slots)
{
    if (n_urls == 0 || i >= n_urls)
        return 0;
    return (uint32_t)(slots / n_urls + (i < slots % n_urls ? 1 : 0));
}

void lg_stats_add(lg_stats *s, const lg_result *r)
{
    s->requests++;
    if (r->url < LG_MAX_URLS) {
        s->url_requests[r->url]++;
        if (r->outcome == LG_OK)
            s->url_ok[r->url]++;
    }
    s->by_outcome[r->outcome < LG_OUTCOME_COUNT ? r->outcome : LG_LOCAL_ERROR]++;
    if (r->status > 0 && r->status < (int)KVG_ARRAY_LEN(s->by_status))
        s->by_status[r->status]++;
    if (r->status > 0) {
        lg_worker_stat *w = worker_slot(s, r->worker);
        w->requests++;
        if (r->outcome == LG_OK)
            w->ok++;
        if (r->usage.present) {
            w->prompt_tokens += r->usage.prompt_tokens;
            w->cached_tokens += r->usage.cached_tokens;
        }
    }
    if (r->usage.present) {
        s->prompt_tokens += r->usage.prompt_tokens;
        s->cached_tokens += r->usage.cached_tokens;
        s->completion_tokens += r->usage.completion_tokens;
        if (!r->usage.cached_present)
            s->cached_missing++;
    }
    if (r->outcome != LG_OK) {
        keep_first_error(s, r);
        return;
    }
    if (!r->usage.present)
        s->usage_missing++;
    samples_add(&s->latency, r->latency_us);
    if (r->has_ttft)
        samples_add(&s->ttft, r->ttft_us);
}
