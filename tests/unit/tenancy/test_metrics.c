/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the tenants' Prometheus series (tenancy/metrics.c): the exposition well
 * formed, and the counters a few tenants' requests give. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tenancy.h"
#include "tenancy_helpers.h"

typedef struct family {
    char name[96];
    char type[16];
} family;

/* Parse the exposition text like a scraper would: HELP then TYPE before each family's samples,
 * each family once, samples contiguous, counters named _total, label values quoted with only
 * \\, \" and \n escapes, values non-negative numbers. Returns the number of samples. */
static size_t check_exposition(const char *text, family *fams, size_t *nfams)
{
    size_t samples = 0;
    const family *current = NULL;
    *nfams = 0;
    const char *line = text;
    while (*line) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol);
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
                assert_string_not_equal(fams[i].name, name);
            assert_true(*nfams < 20);
            family *f = &fams[(*nfams)++];
            snprintf(f->name, sizeof(f->name), "%s", name);
            f->type[0] = '\0';
            assert_true(strlen(buf) > 8 + strlen(name));
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
        char *sp = strrchr(buf, ' ');
        assert_non_null(sp);
        char *end;
        double v = strtod(sp + 1, &end);
        assert_true(*end == '\0' && end != sp + 1);
        assert_true(v >= 0);
        *sp = '\0';
        char *brace = strchr(buf, '{');
        if (brace) {
            assert_true(sp[-1] == '}');
            sp[-1] = '\0';
            *brace = '\0';
            const char *p = brace + 1;
            while (*p) {
                const char *eq = strchr(p, '=');
                assert_non_null(eq);
                assert_true(eq[1] == '"');
                const char *q = eq + 2;
                while (*q && *q != '"') {
                    if (*q == '\\') {
                        q++;
                        assert_true(*q == '\\' || *q == '"' || *q == 'n');
                    }
                    q++;
                }
                assert_true(*q == '"');
                p = q + 1;
                if (*p == ',')
                    p++;
                else
                    assert_true(*p == '\0');
            }
        }
        assert_non_null(current);
        if (strcmp(current->type, "histogram") == 0) {
            size_t nl = strlen(current->name);
            assert_int_equal(strncmp(buf, current->name, nl), 0);
            assert_true(strcmp(buf + nl, "_bucket") == 0 || strcmp(buf + nl, "_sum") == 0 ||
                        strcmp(buf + nl, "_count") == 0);
        } else {
            assert_string_equal(buf, current->name);
        }
        assert_true(current->type[0] != '\0');
        if (strcmp(current->type, "counter") == 0)
            assert_non_null(strstr(current->name, "_total"));
        samples++;
    }
    return samples;
}

static void test_metrics(void **state)
{
    (void)state;
    kvg_tenants *ts = new_store();
    kvg_buf out;
    kvg_buf_init(&out);
    family fams[20];
    size_t nfams;
    kvg_tenants_write_metrics(ts, 10, &out);
    assert_int_equal(check_exposition(out.data, fams, &nfams), 1 + 3);
    assert_int_equal(nfams, 13); /* + prompt, cached, predicted, output tokens, ttft, itl */
    expect_line(out.data, "kvgate_tenants 0\n");
    expect_line(out.data, "kvgate_auth_failures_total{reason=\"unknown\"} 0\n");

    /* ordinals 0..4: a, b, other, c, d */
    const char *ids[] = {"a", "b", "other", "c", "d"};
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(put_simple(ts, ids[i]), 0);
    kvg_tenant_set *s = kvg_tenants_acquire(ts);
    kvg_tenant *a = kvg_tenant_set_find(s, "a");
    kvg_tenant *c = kvg_tenant_set_find(s, "c");
    kvg_tenant *d = kvg_tenant_set_find(s, "d");
    kvg_tenant *o = kvg_tenant_set_find(s, "other");
    kvg_tenant_record(a, 200, 100);
    kvg_tenant_record(a, 200, 50);
    kvg_tenant_record(a, 429, 0);
    kvg_tenant_record(a, 201, 0);  /* by class */
    kvg_tenant_record(a, 302, 0);  /* by class */
    kvg_tenant_record(a, 499, 7);  /* client left */
    kvg_tenant_record(a, 0, 0);    /* outside 100..599 */
    kvg_tenant_record(a, 1000, 0); /* outside 100..599 */
    kvg_tenant_record(a, -5, 0);   /* outside 100..599 */
    kvg_tenant_record_refusal(a, KVG_ADMIT_RATE);
    kvg_tenant_record_refusal(a, KVG_ADMIT_INFLIGHT);
    kvg_tenant_record_refusal(a, KVG_ADMIT_OK);         /* not a refusal: ignored */
    kvg_tenant_record_refusal(a, (kvg_admit_result)42); /* out of range: ignored */
    kvg_tenant_record(c, 200, 1);
    kvg_tenant_record(d, 200, 2);
    kvg_tenant_record(d, 503, 0);
    kvg_tenant_record(o, 200, 4);
    kvg_tenant_record_refusal(c, KVG_ADMIT_BYTES);
    kvg_tenant_record_refusal(d, KVG_ADMIT_BYTES);
    kvg_tenant_record_refusal(d, KVG_ADMIT_BUFFER);
    assert_true(kvg_tenant_buffer_charge(a, 1000, 0));
    assert_true(kvg_tenant_buffer_charge(c, 30, 0));
    assert_true(kvg_tenant_buffer_charge(d, 12, 0));
    assert_int_equal(kvg_tenant_admit(d, 0, 0, NULL), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(c, 0, 0, NULL), KVG_ADMIT_OK);
    assert_int_equal(kvg_tenant_admit(a, 0, 0, NULL), KVG_ADMIT_OK);
    kvg_tenant_record_ttft(a, 5000000);    /* 5 ms */
    kvg_tenant_record_ttft(c, 30000000);   /* 30 ms */
    kvg_tenant_record_ttft(d, 2000000000); /* 2 s */
    kvg_tenant_record_itl(d, 10000000, 3); /* three gaps of 10 ms */
    kvg_tenant_record_itl(c, 10000000, 0); /* none */
    kvg_tenant_record_output_tokens(c, 5);
    kvg_tenant_record_output_tokens(d, 7);
    kvg_tenant_record_output_tokens(d, -1); /* not reported: nothing */
    kvg_tenants_record_auth_failure(ts, "missing");
    kvg_tenants_record_auth_failure(ts, "unknown");
    kvg_tenants_record_auth_failure(ts, "unknown");
    kvg_tenants_record_auth_failure(ts, "malformed");
    kvg_tenants_record_auth_failure(ts, "bogus"); /* counted as unknown */
    kvg_tenants_record_auth_failure(ts, NULL);

    /* cap 3: a, b have labels ("other", ordinal 2, never does); c and d are summed */
    kvg_buf_reset(&out);
    kvg_tenants_write_metrics(ts, 3, &out);
    assert_false(out.failed);
    size_t n = check_exposition(out.data, fams, &nfams);
    assert_int_equal(nfams, 13);
    static const char *const order[] = {
        "kvgate_tenants",
        "kvgate_tenant_requests_total",
        "kvgate_tenant_rate_limited_total",
        "kvgate_tenant_prompt_bytes_total",
        "kvgate_tenant_inflight",
        "kvgate_tenant_buffered_bytes",
        "kvgate_tenant_prompt_tokens_total",
        "kvgate_tenant_cached_tokens_total",
        "kvgate_tenant_predicted_tokens_total",
        "kvgate_tenant_output_tokens_total",
        "kvgate_tenant_ttft_seconds",
        "kvgate_tenant_itl_seconds",
        "kvgate_auth_failures_total",
    };
    for (size_t i = 0; i < nfams; i++)
        assert_string_equal(fams[i].name, order[i]);
    assert_string_equal(fams[0].type, "gauge");
    assert_string_equal(fams[4].type, "gauge");
    static const char *const expect[] = {
        "kvgate_tenants 5\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"200\"} 2\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"429\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"499\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"2xx\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"3xx\"} 1\n",
        "kvgate_tenant_requests_total{tenant=\"a\",code=\"other\"} 3\n",
        "kvgate_tenant_requests_total{tenant=\"other\",code=\"200\"} 3\n",
        "kvgate_tenant_requests_total{tenant=\"other\",code=\"503\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"rate\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"bytes\"} 0\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"inflight\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"b\",reason=\"rate\"} 0\n",
        "kvgate_tenant_rate_limited_total{tenant=\"other\",reason=\"bytes\"} 2\n",
        "kvgate_tenant_prompt_bytes_total{tenant=\"a\"} 157\n",
        "kvgate_tenant_prompt_bytes_total{tenant=\"b\"} 0\n",
        "kvgate_tenant_prompt_bytes_total{tenant=\"other\"} 7\n",
        "kvgate_tenant_inflight{tenant=\"a\"} 1\n",
        "kvgate_tenant_inflight{tenant=\"other\"} 2\n",
        "kvgate_tenant_rate_limited_total{tenant=\"other\",reason=\"buffer\"} 1\n",
        "kvgate_tenant_rate_limited_total{tenant=\"a\",reason=\"buffer\"} 0\n",
        "kvgate_tenant_buffered_bytes{tenant=\"a\"} 1000\n",
        "kvgate_tenant_buffered_bytes{tenant=\"b\"} 0\n",
        "kvgate_tenant_buffered_bytes{tenant=\"other\"} 42\n",
        "kvgate_tenant_output_tokens_total{tenant=\"a\"} 0\n",
        "kvgate_tenant_output_tokens_total{tenant=\"other\"} 12\n",
        "kvgate_tenant_ttft_seconds_bucket{tenant=\"a\",le=\"0.01\"} 1\n",
        "kvgate_tenant_ttft_seconds_count{tenant=\"b\"} 0\n",
        "kvgate_tenant_ttft_seconds_bucket{tenant=\"other\",le=\"0.025\"} 0\n",
        "kvgate_tenant_ttft_seconds_bucket{tenant=\"other\",le=\"0.05\"} 1\n",
        "kvgate_tenant_ttft_seconds_bucket{tenant=\"other\",le=\"2.5\"} 2\n",
        "kvgate_tenant_ttft_seconds_count{tenant=\"other\"} 2\n",
        "kvgate_tenant_itl_seconds_bucket{tenant=\"other\",le=\"0.005\"} 0\n",
        "kvgate_tenant_itl_seconds_bucket{tenant=\"other\",le=\"0.01\"} 3\n",
        "kvgate_tenant_itl_seconds_count{tenant=\"other\"} 3\n",
        "kvgate_auth_failures_total{reason=\"missing\"} 1\n",
        "kvgate_auth_failures_total{reason=\"malformed\"} 1\n",
        "kvgate_auth_failures_total{reason=\"unknown\"} 4\n",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(expect); i++)
        expect_line(out.data, expect[i]);
    assert_null(strstr(out.data, "tenant=\"c\""));
    assert_null(strstr(out.data, "tenant=\"d\""));
    assert_null(strstr(out.data, "reason=\"ok\""));
    assert_null(strstr(out.data, "tenant=\"b\",code"));
    /* "other" comes once per series, after the labelled tenants */
    const char *first = strstr(out.data, "kvgate_tenant_inflight{tenant=\"other\"}");
    assert_null(strstr(first + 1, "kvgate_tenant_inflight{tenant=\"other\"}"));
    assert_true(first > strstr(out.data, "kvgate_tenant_inflight{tenant=\"b\"}"));
    /* 1 + a: 6 codes + b: 0 + other: 2 codes + 3 x 4 reasons + 3 bytes + 3 inflight
     * + 3 buffered + 3 x 3 usage counters + 3 output tokens + 3 ttft histograms (13 buckets,
     * +Inf, sum, count) + 3 itl histograms (14 buckets) + 3 auth */
    assert_int_equal(n, 1 + 6 + 2 + 12 + 3 + 3 + 3 + 9 + 3 + 3 * 16 + 3 * 17 + 3);

    /* a cap above every ordinal: no "other" series unless the tenant named so */
    kvg_buf_reset(&out);
    kvg_tenants_write_metrics(ts, 1000, &out);
    check_exposition(out.data, fams, &nfams);
    expect_line(out.data, "kvgate_tenant_inflight{tenant=\"c\"} 1\n");
    expect_line(out.data, "kvgate_tenant_requests_total{tenant=\"other\",code=\"200\"} 1\n");
    /* cap 0: everything is "other" */
    kvg_buf_reset(&out);
    kvg_tenants_write_metrics(ts, 0, &out);
    n = check_exposition(out.data, fams, &nfams);
    expect_line(out.data, "kvgate_tenant_inflight{tenant=\"other\"} 3\n");
    expect_line(out.data, "kvgate_tenant_prompt_bytes_total{tenant=\"other\"} 164\n");
    assert_null(strstr(out.data, "tenant=\"a\""));

    release_all(a);
    release_all(c);
    release_all(d);
    kvg_tenant_set_unref(s);
    kvg_buf_done(&out);
    kvg_tenants_free(ts);
}

const struct CMUnitTest metrics_tests[] = {
    cmocka_unit_test(test_metrics),
};
const size_t metrics_tests_count = KVG_ARRAY_LEN(metrics_tests);
