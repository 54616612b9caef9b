/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the registry's Prometheus series (router/metrics.c): the exposition well formed
 * (families, types, help, histogram suffixes) and the values a few workers give. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prom.h"
#include "router.h"
#include "router_helpers.h"

typedef struct family {
    char name[96];
    char type[16];
    bool help;
} family;

/* Base family of a sample name: strips the histogram suffixes when the family is one. */
static const family *family_of(const family *fams, size_t n, const char *sample)
{
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(fams[i].name);
        if (strncmp(sample, fams[i].name, l) != 0)
            continue;
        const char *rest = sample + l;
        if (*rest == '\0')
            return &fams[i];
        if (strcmp(fams[i].type, "histogram") == 0 &&
            (strcmp(rest, "_bucket") == 0 || strcmp(rest, "_sum") == 0 ||
             strcmp(rest, "_count") == 0))
            return &fams[i];
    }
    return NULL;
}

/* Parse the exposition text; checks the format rules and returns sample values by exact
 * "name{labels}" in lookup. Returns the number of samples. */
static size_t check_exposition(const char *text, family *fams, size_t *nfams)
{
    size_t samples = 0;
    *nfams = 0;
    const char *line = text;
    const family *current = NULL;
    double last_le = -1, last_cum = -1;
    char last_hist_series[1024] = "";
    while (*line) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol); /* every line ends with \n */
        char buf[512];
        size_t len = (size_t)(eol - line);
        assert_true(len > 0 && len < sizeof(buf));
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = eol + 1;

        if (strncmp(buf, "# HELP ", 7) == 0) {
            char name[96];
            assert_int_equal(sscanf(buf + 7, "%95s", name), 1);
            for (size_t i = 0; i < *nfams; i++)
                assert_string_not_equal(fams[i].name, name); /* each family once */
            assert_true(*nfams < 32);
            family *f = &fams[(*nfams)++];
            snprintf(f->name, sizeof(f->name), "%s", name);
            f->type[0] = '\0';
            f->help = true;
            assert_true(strlen(buf) > 8 + strlen(name)); /* non-empty help text */
            current = f;
            continue;
        }
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            char name[96], type[16];
            assert_int_equal(sscanf(buf + 7, "%95s %15s", name, type), 2);
            assert_non_null(current);
            assert_string_equal(name, current->name);
            assert_true(strcmp(type, "gauge") == 0 || strcmp(type, "counter") == 0 ||
                        strcmp(type, "histogram") == 0);
            snprintf(((family *)current)->type, sizeof(current->type), "%s", type);
            continue;
        }
        assert_true(buf[0] != '#');
        /* sample: name{labels} value; the retry budget's two series (kvgate_upstream_*) are the
         * registry's, not a worker's: no labels. */
        char *brace = strchr(buf, '{');
        char *close = strrchr(buf, '}');
        if (!brace && strncmp(buf, "kvgate_upstream_", 16) == 0) {
            char *sp = strchr(buf, ' ');
            assert_non_null(sp);
            *sp = '\0';
            assert_ptr_equal(family_of(fams, *nfams, buf), current);
            continue;
        }
        assert_non_null(brace);
        assert_non_null(close);
        assert_true(close[1] == ' ');
        *brace = '\0';
        const family *f = family_of(fams, *nfams, buf);
        assert_non_null(f);
        assert_ptr_equal(f, current); /* samples of a family are contiguous, after its TYPE */
        assert_true(f->type[0] != '\0');
        if (strcmp(f->type, "counter") == 0)
            assert_true(strstr(f->name, "_total") != NULL);
        char *end;
        double v = strtod(close + 2, &end);
        assert_true(*end == '\0' && end != close + 2);
        assert_true(v >= 0);
        /* labels: k="v" pairs, comma separated */
        *close = '\0';
        const char *p = brace + 1;
        bool has_worker = false;
        double le = -2;
        while (*p) {
            const char *eq = strchr(p, '=');
            assert_non_null(eq);
            assert_true(eq[1] == '"');
            if (strncmp(p, "worker", (size_t)(eq - p)) == 0)
                has_worker = true;
            bool is_le = strncmp(p, "le", (size_t)(eq - p)) == 0 && eq - p == 2;
            const char *q = eq + 2;
            while (*q && *q != '"') {
                if (*q == '\\')
                    q++;
                q++;
            }
            assert_true(*q == '"');
            if (is_le)
                le = strncmp(eq + 2, "+Inf", 4) == 0 ? 1e300 : strtod(eq + 2, NULL);
            p = q + 1;
            if (*p == ',')
                p++;
        }
        assert_true(has_worker);
        size_t blen = strlen(buf);
        if (blen > 7 && strcmp(buf + blen - 7, "_bucket") == 0) {
            assert_true(le > -2);
            char series[1024];
            /* the series without le: the worker label comes first */
            snprintf(series, sizeof(series), "%s%.*s", buf,
                     (int)(strstr(brace + 1, ",le=") - (brace + 1)), brace + 1);
            if (strcmp(series, last_hist_series) != 0) {
                snprintf(last_hist_series, sizeof(last_hist_series), "%s", series);
                last_le = -1;
                last_cum = -1;
            }
            assert_true(le > last_le);  /* le increasing */
            assert_true(v >= last_cum); /* cumulative counts never decrease */
            last_le = le;
            last_cum = v;
        } else if (blen > 6 && strcmp(buf + blen - 6, "_count") == 0) {
            assert_true(last_le == 1e300); /* +Inf bucket came last */
            assert_true(v == last_cum);    /* _count equals the +Inf bucket */
        }
        samples++;
    }
    for (size_t i = 0; i < *nfams; i++) {
        assert_true(fams[i].help);
        assert_true(fams[i].type[0] != '\0');
    }
    return samples;
}

static void expect_text(const char *text, const char *line)
{
    if (!strstr(text, line))
        fail_msg("missing %s", line);
}

static void test_metrics_format(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(1);
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_registry_write_metrics(reg, &out);
    family fams[32];
    size_t nfams;
    assert_int_equal(check_exposition(out.data, fams, &nfams), 0);
    /* + five prefix-prediction, three engine-load, four outlier and retry-budget, ttft,
     * itl and output-token families */
    assert_int_equal(nfams, 24);

    assert_int_equal(put(reg, "w1", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    assert_int_equal(put(reg, "w2", "http://h:2", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s = kvg_registry_acquire(reg);
    kvg_worker *w1 = kvg_worker_set_find(s, "w1");
    kvg_worker *w2 = kvg_worker_set_find(s, "w2");
    kvg_worker_record(w1, 200, 3000000, 1000000);    /* 3 ms, ttfb 1 ms */
    kvg_worker_record(w1, 200, 700000000, 50000000); /* 0.7 s, ttfb 50 ms */
    kvg_worker_record(w1, 503, 200000000000ull, 0);  /* 200 s: above every bound, no ttfb */
    kvg_worker_record(w1, 0, 1000000000, 0);         /* client went away */
    kvg_worker_record(w1, 700, 1000, 0);             /* out of range: not counted by code */
    kvg_worker_record_retry(w2);
    kvg_worker_record_retry(w2);
    assert_true(kvg_worker_inflight_try_acquire(w2));
    /* pending: added and taken off per request, saturating at both ends */
    kvg_worker_pending_add(w1, 40);
    kvg_worker_pending_add(w1, 2);
    kvg_worker_pending_done(w1, 30);
    assert_int_equal(kvg_worker_pending(w1), 12);
    kvg_worker_pending_add(w2, UINT32_MAX - 1);
    kvg_worker_pending_add(w2, 5);
    assert_int_equal(kvg_worker_pending(w2), UINT32_MAX);
    kvg_worker_pending_done(w2, UINT32_MAX - 7);
    kvg_worker_pending_done(w2, 100); /* more than is left: 0, not a wrap */
    assert_int_equal(kvg_worker_pending(w2), 0);
    for (int i = 0; i < 3; i++)
        kvg_worker_health_observe(w2, false);
    kvg_registry_drain(reg, "w2");
    kvg_worker_record_usage(w1, 30, 100, 40);   /* predicted 30 of 100, engine says 40 */
    kvg_worker_record_usage(w1, 0, 50, 16);     /* an unpredicted hit */
    kvg_worker_record_usage(w2, 10, 100, -1);   /* no report: unreported, nothing else */
    kvg_worker_set_engine_load(w1, 2, 0.5f, 1); /* scraped: w1 only */
    kvg_worker_record_ttft(w1, 80000000);       /* 80 ms */
    kvg_worker_record_itl(w1, 20000000, 4);     /* four gaps of 20 ms */
    kvg_worker_record_output_tokens(w1, 5);
    kvg_worker_record_output_tokens(w2, -1); /* not reported: nothing */

    kvg_buf_reset(&out);
    kvg_registry_write_metrics(reg, &out);
    assert_false(out.failed);
    size_t n = check_exposition(out.data, fams, &nfams);
    assert_int_equal(nfams, 24);
    /* 9 gauges/counters x 2 workers + 3 code series + 2 histograms x 2 workers x 18 lines
     * + ttft (16 lines) and itl (17 lines) x 2 workers + output tokens x 2 workers
     * + 2 engine-load gauges x 1 worker + 4 usage counters x 2 workers + 4 prediction
     * outcomes x 2 workers (the retry budget's two unlabelled samples are not counted) */
    assert_int_equal(n, 18 + 3 + 2 * 2 * 18 + 2 * (16 + 17) + 2 + 2 + 4 * 2 + 4 * 2);
    expect_text(out.data, "kvgate_worker_ejected{worker=\"w1\"} 0\n");
    expect_text(out.data, "kvgate_worker_ejections_total{worker=\"w2\"} 0\n");
    expect_text(out.data, "kvgate_upstream_retry_budget_exceeded_total 0\n");
    expect_text(out.data, "kvgate_worker_ttft_seconds_bucket{worker=\"w1\",le=\"0.05\"} 0\n");
    expect_text(out.data, "kvgate_worker_ttft_seconds_bucket{worker=\"w1\",le=\"0.1\"} 1\n");
    expect_text(out.data, "kvgate_worker_ttft_seconds_sum{worker=\"w1\"} 0.080000\n");
    expect_text(out.data, "kvgate_worker_itl_seconds_bucket{worker=\"w1\",le=\"0.02\"} 4\n");
    expect_text(out.data, "kvgate_worker_itl_seconds_count{worker=\"w1\"} 4\n");
    expect_text(out.data, "kvgate_worker_ttft_seconds_count{worker=\"w2\"} 0\n");
    expect_text(out.data, "kvgate_worker_output_tokens_total{worker=\"w1\"} 5\n");
    expect_text(out.data, "kvgate_worker_output_tokens_total{worker=\"w2\"} 0\n");
    expect_text(out.data, "kvgate_worker_engine_waiting{worker=\"w1\"} 2\n");
    expect_text(out.data, "kvgate_worker_engine_kv_usage{worker=\"w1\"} 0.5\n");
    expect_text(out.data, "kvgate_prefix_predicted_tokens_total{worker=\"w1\"} 30\n");
    expect_text(out.data, "kvgate_prefix_cached_tokens_total{worker=\"w1\"} 56\n");
    expect_text(out.data, "kvgate_prefix_prompt_tokens_total{worker=\"w1\"} 150\n");
    expect_text(out.data, "kvgate_prefix_prompt_tokens_total{worker=\"w2\"} 0\n");
    expect_text(out.data, "kvgate_prefix_unreported_total{worker=\"w2\"} 1\n");
    expect_text(out.data,
                "kvgate_prefix_predictions_total{worker=\"w1\",outcome=\"hit_predicted\"} 1\n");
    expect_text(out.data,
                "kvgate_prefix_predictions_total{worker=\"w1\",outcome=\"hit_unpredicted\"} 1\n");

    static const char *const expect[] = {
        "# TYPE kvgate_worker_up gauge\n",
        "kvgate_worker_up{worker=\"w1\"} 1\n",
        "kvgate_worker_up{worker=\"w2\"} 0\n",
        "kvgate_worker_draining{worker=\"w2\"} 1\n",
        "kvgate_worker_draining{worker=\"w1\"} 0\n",
        "kvgate_worker_inflight{worker=\"w2\"} 1\n",
        "# TYPE kvgate_worker_pending_blocks gauge\n",
        "kvgate_worker_pending_blocks{worker=\"w1\"} 12\n",
        "kvgate_worker_pending_blocks{worker=\"w2\"} 0\n",
        "kvgate_worker_max_inflight{worker=\"w1\"} 1024\n",
        "# TYPE kvgate_worker_requests_total counter\n",
        "kvgate_worker_requests_total{worker=\"w1\",code=\"0\"} 1\n",
        "kvgate_worker_requests_total{worker=\"w1\",code=\"200\"} 2\n",
        "kvgate_worker_requests_total{worker=\"w1\",code=\"503\"} 1\n",
        "# TYPE kvgate_worker_request_duration_seconds histogram\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"0.005\"} 2\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"0.5\"} 2\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"1\"} 4\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"120\"} 4\n",
        "kvgate_worker_request_duration_seconds_bucket{worker=\"w1\",le=\"+Inf\"} 5\n",
        "kvgate_worker_request_duration_seconds_sum{worker=\"w1\"} 201.703001\n",
        "kvgate_worker_request_duration_seconds_count{worker=\"w1\"} 5\n",
        "kvgate_worker_request_duration_seconds_count{worker=\"w2\"} 0\n",
        "kvgate_worker_ttfb_seconds_bucket{worker=\"w1\",le=\"0.005\"} 1\n",
        "kvgate_worker_ttfb_seconds_bucket{worker=\"w1\",le=\"0.05\"} 2\n",
        "kvgate_worker_ttfb_seconds_sum{worker=\"w1\"} 0.051000\n",
        "kvgate_worker_ttfb_seconds_count{worker=\"w1\"} 2\n",
        "# TYPE kvgate_worker_retries_total counter\n",
        "kvgate_worker_retries_total{worker=\"w2\"} 2\n",
        "kvgate_worker_retries_total{worker=\"w1\"} 0\n",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(expect); i++)
        if (!strstr(out.data, expect[i]))
            fail_msg("missing line %s in:\n%s", expect[i], out.data);
    assert_null(strstr(out.data, "code=\"700\""));
    kvg_worker_inflight_release(w2);
    kvg_worker_set_unref(s);
    kvg_buf_done(&out);
    kvg_registry_free(reg);
}

/* Threads adding to one worker through their own stripes (and two of them through the shared
 * stripe 0, one because its stripe is beyond the worker's): nothing lost, all of it read. */
typedef struct striped_adder {
    kvg_worker *w;
    unsigned stripe;
} striped_adder;

#define STRIPED_ADDS 20000

static void expect_sample(const char *text, const char *series, unsigned long v)
{
    char line[200];
    snprintf(line, sizeof(line), "%s %lu\n", series, v);
    if (!strstr(text, line))
        fail_msg("missing line %s in:\n%s", line, text);
}

static void *add_striped(void *arg)
{
    striped_adder *a = arg;
    kvg_prom_stripe_set(a->stripe);
    for (int i = 0; i < STRIPED_ADDS; i++) {
        kvg_worker_record(a->w, 200, 3000000, 1000000);
        kvg_worker_record_usage(a->w, 2, 10, 4);
        kvg_worker_record_ttft(a->w, 80000000);
        kvg_worker_record_output_tokens(a->w, 3);
    }
    kvg_worker_record_retry(a->w);
    return NULL;
}

static void test_metrics_sum_stripes(void **state)
{
    (void)state;
    kvg_registry *reg = new_registry(3); /* three event loops: stripes 0 (shared) to 3 */
    assert_int_equal(put(reg, "w1", "http://h:1", KVG_WORKER_SOURCE_ADMIN), 0);
    kvg_worker_set *s = kvg_registry_acquire(reg);
    kvg_worker *w = kvg_worker_set_find(s, "w1");
    striped_adder adders[] = {{w, 0}, {w, 1}, {w, 3}, {w, 9}, {w, 2}};
    pthread_t tids[KVG_ARRAY_LEN(adders)];
    for (size_t i = 0; i < KVG_ARRAY_LEN(adders); i++)
        assert_int_equal(pthread_create(&tids[i], NULL, add_striped, &adders[i]), 0);
    for (size_t i = 0; i < KVG_ARRAY_LEN(adders); i++)
        assert_int_equal(pthread_join(tids[i], NULL), 0);
    kvg_buf out;
    kvg_buf_init(&out);
    kvg_registry_write_metrics(reg, &out);
    assert_false(out.failed);
    const unsigned long n = STRIPED_ADDS * KVG_ARRAY_LEN(adders);
    static const char *const series[] = {
        "kvgate_worker_requests_total{worker=\"w1\",code=\"200\"}",
        "kvgate_worker_request_duration_seconds_count{worker=\"w1\"}",
        "kvgate_worker_ttfb_seconds_count{worker=\"w1\"}",
        "kvgate_worker_ttft_seconds_count{worker=\"w1\"}",
        "kvgate_prefix_predictions_total{worker=\"w1\",outcome=\"hit_predicted\"}",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(series); i++)
        expect_sample(out.data, series[i], n);
    expect_sample(out.data, "kvgate_prefix_prompt_tokens_total{worker=\"w1\"}", n * 10);
    expect_sample(out.data, "kvgate_worker_output_tokens_total{worker=\"w1\"}", n * 3);
    expect_sample(out.data, "kvgate_worker_retries_total{worker=\"w1\"}", KVG_ARRAY_LEN(adders));
    /* the sum of 3 ms observations, in the histogram's resolution */
    char line[160];
    snprintf(line, sizeof(line), "kvgate_worker_request_duration_seconds_sum{worker=\"w1\"} %lu.",
             n * 3 / 1000);
    assert_non_null(strstr(out.data, line));
    kvg_prom_stripe_set(0);
    kvg_worker_set_unref(s);
    kvg_buf_done(&out);
    kvg_registry_free(reg);
}

const struct CMUnitTest metrics_tests[] = {
    cmocka_unit_test(test_metrics_format),
    cmocka_unit_test(test_metrics_sum_stripes),
};
const size_t metrics_tests_count = KVG_ARRAY_LEN(metrics_tests);
