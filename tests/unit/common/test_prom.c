/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/prom.c: the Prometheus text writer's exact bytes (headers, escaping,
 * values, histograms) and histogram observation from several threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prom.h"

/* The buffer's text, for assert_string_equal. */
static const char *text(kvg_buf *b)
{
    return b->data ? b->data : "";
}

static void test_header_and_types(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_header(&b, "kvgate_x_total", KVG_PROM_COUNTER, "Things that happened.");
    kvg_prom_put_header(&b, "kvgate_y", KVG_PROM_GAUGE, "Things now.");
    kvg_prom_put_header(&b, "kvgate_z_seconds", KVG_PROM_HISTOGRAM, "How long.");
    assert_string_equal(text(&b), "# HELP kvgate_x_total Things that happened.\n"
                                  "# TYPE kvgate_x_total counter\n"
                                  "# HELP kvgate_y Things now.\n"
                                  "# TYPE kvgate_y gauge\n"
                                  "# HELP kvgate_z_seconds How long.\n"
                                  "# TYPE kvgate_z_seconds histogram\n");
    assert_string_equal(kvg_prom_type_str(KVG_PROM_TYPE_COUNT), "untyped");
    assert_string_equal(kvg_prom_type_str((kvg_prom_type)-1), "untyped");
    kvg_buf_done(&b);
}

static void test_label_escaping(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"", ""},
        {"plain-name_1.2", "plain-name_1.2"},
        {"a\\b", "a\\\\b"},
        {"say \"hi\"", "say \\\"hi\\\""},
        {"two\nlines", "two\\nlines"},
        {"\\\"\n", "\\\\\\\"\\n"},
        {"\n\n", "\\n\\n"},
        /* Only those three: other controls and UTF-8 pass as they are. */
        {"tab\there\r", "tab\there\r"},
        {"caf\xc3\xa9 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xf0\x9f\x98\x80"},
        {"{}=,", "{}=,"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_prom_put_label_value(&b, cases[i].in);
        assert_string_equal(text(&b), cases[i].out);
        kvg_buf_done(&b);
    }
    /* In a sample: label values escaped, label names and the metric name as they are. */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_u64(&b, "kvgate_x_total", KVG_PROM_LABELS({"tenant", "a\"b\\c\nd"}), 3);
    assert_string_equal(text(&b), "kvgate_x_total{tenant=\"a\\\"b\\\\c\\nd\"} 3\n");
    kvg_buf_done(&b);
}

static void test_samples(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_u64(&b, "a", NULL, 0, 0);
    kvg_prom_put_u64(&b, "a", NULL, 0, UINT64_MAX);
    kvg_prom_put_u64(&b, "b", KVG_PROM_LABELS({"worker", "w1"}), 42);
    kvg_prom_put_u64(&b, "c", KVG_PROM_LABELS({"worker", "w1"}, {"code", "200"}), 7);
    kvg_prom_put_u64(&b, "d", KVG_PROM_LABELS({"policy", "cost"}, {"reason", "hit"}, {"x", ""}), 1);
    kvg_prom_put_i64(&b, "e", NULL, 0, 0);
    kvg_prom_put_i64(&b, "e", NULL, 0, -5);
    kvg_prom_put_i64(&b, "e", NULL, 0, INT64_MAX);
    kvg_prom_put_i64(&b, "e", NULL, 0, INT64_MIN);
    kvg_prom_put_i64(&b, "e", KVG_PROM_LABELS({"k", "v"}), -1);
    assert_string_equal(text(&b), "a 0\n"
                                  "a 18446744073709551615\n"
                                  "b{worker=\"w1\"} 42\n"
                                  "c{worker=\"w1\",code=\"200\"} 7\n"
                                  "d{policy=\"cost\",reason=\"hit\",x=\"\"} 1\n"
                                  "e 0\n"
                                  "e -5\n"
                                  "e 9223372036854775807\n"
                                  "e -9223372036854775808\n"
                                  "e{k=\"v\"} -1\n");
    kvg_buf_done(&b);
}

static void test_floats(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    /* printf's %.6g, as kvgate wrote floats before this writer existed. */
    static const double values[] = {0.0, 1.0, 0.09375, 1.0 / 3.0, 0.5f, 1e-7, 123456789.0, -2.5};
    for (size_t i = 0; i < KVG_ARRAY_LEN(values); i++)
        kvg_prom_put_f64(&b, "f", KVG_PROM_LABELS({"worker", "w"}), values[i]);
    kvg_prom_put_f64(&b, "f", NULL, 0, NAN);
    kvg_prom_put_f64(&b, "f", NULL, 0, INFINITY);
    kvg_prom_put_f64(&b, "f", NULL, 0, -INFINITY);
    assert_string_equal(text(&b), "f{worker=\"w\"} 0\n"
                                  "f{worker=\"w\"} 1\n"
                                  "f{worker=\"w\"} 0.09375\n"
                                  "f{worker=\"w\"} 0.333333\n"
                                  "f{worker=\"w\"} 0.5\n"
                                  "f{worker=\"w\"} 1e-07\n"
                                  "f{worker=\"w\"} 1.23457e+08\n"
                                  "f{worker=\"w\"} -2.5\n"
                                  "f NaN\n"
                                  "f +Inf\n"
                                  "f -Inf\n");
    kvg_buf_done(&b);
}

static void test_scalars(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_scalar_u64(&b, "kvgate_index_entries", KVG_PROM_GAUGE, "Entries.", 80);
    kvg_prom_put_scalar_i64(&b, "kvgate_connections_open", KVG_PROM_GAUGE, "Open now.", -1);
    kvg_prom_put_scalar_u64(&b, "kvgate_timeouts_total", KVG_PROM_COUNTER, "Timeouts.", 0);
    assert_string_equal(text(&b), "# HELP kvgate_index_entries Entries.\n"
                                  "# TYPE kvgate_index_entries gauge\n"
                                  "kvgate_index_entries 80\n"
                                  "# HELP kvgate_connections_open Open now.\n"
                                  "# TYPE kvgate_connections_open gauge\n"
                                  "kvgate_connections_open -1\n"
                                  "# HELP kvgate_timeouts_total Timeouts.\n"
                                  "# TYPE kvgate_timeouts_total counter\n"
                                  "kvgate_timeouts_total 0\n");
    kvg_buf_done(&b);
}

/* The per-worker latency layout (router/worker.c): le from 5 ms to 120 s, _sum in us. */
static const uint64_t latency_bounds[] = {
    5000000ull,     10000000ull,    25000000ull,    50000000ull,    100000000ull,
    250000000ull,   500000000ull,   1000000000ull,  2500000000ull,  5000000000ull,
    10000000000ull, 20000000000ull, 30000000000ull, 60000000000ull, 120000000000ull,
};
static const kvg_prom_buckets latency = {latency_bounds, KVG_ARRAY_LEN(latency_bounds), 1000};

/* The decision layout (router/route.c): le from 1 us to 100 ms, _sum in ns. */
static const uint64_t decision_bounds[] = {
    1000,   2500,    5000,    10000,   25000,    50000,    100000,    250000,
    500000, 1000000, 2500000, 5000000, 10000000, 25000000, 100000000,
};
static const kvg_prom_buckets decision = {decision_bounds, KVG_ARRAY_LEN(decision_bounds), 1};

static void test_histogram_latency(void **state)
{
    (void)state;
    kvg_prom_hist h;
    memset(&h, 0xa5, sizeof(h)); /* init must clear whatever was there */
    kvg_prom_hist_init(&h);
    kvg_prom_hist_observe(&h, &latency, 0);            /* first bucket */
    kvg_prom_hist_observe(&h, &latency, 5000000);      /* bounds are inclusive: first */
    kvg_prom_hist_observe(&h, &latency, 5000001);      /* second */
    kvg_prom_hist_observe(&h, &latency, 1500000000);   /* le 2.5 */
    kvg_prom_hist_observe(&h, &latency, 120000000000); /* the last finite bucket */
    kvg_prom_hist_observe(&h, &latency, 200000000499); /* +Inf; 499 ns round down */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_hist(&b, "kvgate_worker_ttfb_seconds", KVG_PROM_LABELS({"worker", "w\"1"}), &h,
                      &latency);
    assert_string_equal(text(&b),
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"0.005\"} 2\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"0.01\"} 3\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"0.025\"} 3\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"0.05\"} 3\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"0.1\"} 3\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"0.25\"} 3\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"0.5\"} 3\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"1\"} 3\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"2.5\"} 4\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"5\"} 4\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"10\"} 4\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"20\"} 4\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"30\"} 4\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"60\"} 4\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"120\"} 5\n"
                        "kvgate_worker_ttfb_seconds_bucket{worker=\"w\\\"1\",le=\"+Inf\"} 6\n"
                        "kvgate_worker_ttfb_seconds_sum{worker=\"w\\\"1\"} 321.510000\n"
                        "kvgate_worker_ttfb_seconds_count{worker=\"w\\\"1\"} 6\n");
    kvg_buf_done(&b);
}

static void test_histogram_decision(void **state)
{
    (void)state;
    static kvg_prom_hist h; /* static storage starts at zero without init */
    kvg_prom_hist_observe(&h, &decision, 999);
    kvg_prom_hist_observe(&h, &decision, 1001);
    kvg_prom_hist_observe(&h, &decision, 250000);
    kvg_prom_hist_observe(&h, &decision, 2000000001);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_hist(&b, "d", KVG_PROM_LABELS({"stage", "total"}), &h, &decision);
    assert_string_equal(text(&b), "d_bucket{stage=\"total\",le=\"1e-06\"} 1\n"
                                  "d_bucket{stage=\"total\",le=\"2.5e-06\"} 2\n"
                                  "d_bucket{stage=\"total\",le=\"5e-06\"} 2\n"
                                  "d_bucket{stage=\"total\",le=\"1e-05\"} 2\n"
                                  "d_bucket{stage=\"total\",le=\"2.5e-05\"} 2\n"
                                  "d_bucket{stage=\"total\",le=\"5e-05\"} 2\n"
                                  "d_bucket{stage=\"total\",le=\"0.0001\"} 2\n"
                                  "d_bucket{stage=\"total\",le=\"0.00025\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"0.0005\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"0.001\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"0.0025\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"0.005\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"0.01\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"0.025\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"0.1\"} 3\n"
                                  "d_bucket{stage=\"total\",le=\"+Inf\"} 4\n"
                                  "d_sum{stage=\"total\"} 2.000252001\n"
                                  "d_count{stage=\"total\"} 4\n");
    kvg_buf_done(&b);
}

/* No labels, whole seconds, millisecond sums, a layout with a single bound. */
static void test_histogram_shapes(void **state)
{
    (void)state;
    static const uint64_t one_bound[] = {1000000000};
    static const kvg_prom_buckets seconds = {one_bound, 1, 1000000000};
    static const kvg_prom_buckets millis = {one_bound, 1, 1000000};
    static const kvg_prom_buckets none = {NULL, 0, 1000};
    kvg_prom_hist h;
    kvg_prom_hist_init(&h);
    kvg_prom_hist_observe(&h, &seconds, 1499999999); /* rounds to 1 s */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_hist(&b, "s", NULL, 0, &h, &seconds);
    assert_string_equal(text(&b), "s_bucket{le=\"1\"} 0\n"
                                  "s_bucket{le=\"+Inf\"} 1\n"
                                  "s_sum 1\n"
                                  "s_count 1\n");
    kvg_buf_reset(&b);
    kvg_prom_hist_init(&h);
    kvg_prom_hist_observe(&h, &millis, 2500000); /* 2.5 ms: rounds half up to 3 */
    kvg_prom_hist_observe(&h, &millis, 1000000000);
    kvg_prom_put_hist(&b, "m", KVG_PROM_LABELS({"a", "1"}, {"b", "2"}), &h, &millis);
    assert_string_equal(text(&b), "m_bucket{a=\"1\",b=\"2\",le=\"1\"} 2\n"
                                  "m_bucket{a=\"1\",b=\"2\",le=\"+Inf\"} 2\n"
                                  "m_sum{a=\"1\",b=\"2\"} 1.003\n"
                                  "m_count{a=\"1\",b=\"2\"} 2\n");
    kvg_buf_reset(&b);
    kvg_prom_hist_init(&h);
    kvg_prom_hist_observe(&h, &none, 7000);
    kvg_prom_put_hist(&b, "n", NULL, 0, &h, &none);
    assert_string_equal(text(&b), "n_bucket{le=\"+Inf\"} 1\n"
                                  "n_sum 0.000007\n"
                                  "n_count 1\n");
    kvg_buf_done(&b);
}

#define OBSERVERS 4
#define OBSERVATIONS 100000

static kvg_prom_hist shared;

static void *observer(void *arg)
{
    uint64_t seed = (uintptr_t)arg;
    for (unsigned i = 0; i < OBSERVATIONS; i++)
        /* 1 us .. ~8.4 ms, whole microseconds so the sum is exact */
        kvg_prom_hist_observe(&shared, &latency, ((seed * 7919 + i) % 8400 + 1) * 1000);
    return NULL;
}

/* Observations from several threads at once are all counted, in the right buckets, and the sum
 * is exact: the adds are atomic. */
static void test_histogram_threads(void **state)
{
    (void)state;
    kvg_prom_hist_init(&shared);
    pthread_t t[OBSERVERS];
    for (uintptr_t i = 0; i < OBSERVERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, observer, (void *)i), 0);
    for (size_t i = 0; i < OBSERVERS; i++)
        pthread_join(t[i], NULL);
    uint64_t want_sum = 0, want_first = 0;
    for (uint64_t s = 0; s < OBSERVERS; s++)
        for (unsigned i = 0; i < OBSERVATIONS; i++) {
            uint64_t us = (s * 7919 + i) % 8400 + 1;
            want_sum += us;
            want_first += us <= 5000;
        }
    uint64_t total = 0;
    for (size_t i = 0; i <= KVG_PROM_BUCKETS_MAX; i++)
        total += atomic_load(&shared.buckets[i]);
    assert_int_equal(total, (uint64_t)OBSERVERS * OBSERVATIONS);
    assert_int_equal(atomic_load(&shared.buckets[0]), want_first);
    assert_int_equal(atomic_load(&shared.buckets[1]), total - want_first);
    assert_int_equal(atomic_load(&shared.sum), want_sum);

    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_hist(&b, "t", NULL, 0, &shared, &latency);
    char line[64];
    snprintf(line, sizeof(line), "t_count %u\n", OBSERVERS * OBSERVATIONS);
    assert_non_null(strstr(text(&b), line));
    snprintf(line, sizeof(line), "t_bucket{le=\"+Inf\"} %u\n", OBSERVERS * OBSERVATIONS);
    assert_non_null(strstr(text(&b), line));
    kvg_buf_done(&b);
}

/* A buffer that ran out of memory stays failed; the writer neither crashes nor clears it. */
static void test_failed_buffer(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "x");
    b.failed = true;
    kvg_prom_put_scalar_u64(&b, "a", KVG_PROM_GAUGE, "A.", 1);
    kvg_prom_put_hist(&b, "h", KVG_PROM_LABELS({"k", "v"}), &shared, &latency);
    assert_true(b.failed);
    assert_string_equal(text(&b), "x");
    kvg_buf_done(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_and_types),
        cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_samples),
        cmocka_unit_test(test_floats),
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_histogram_latency),
        cmocka_unit_test(test_histogram_decision),
        cmocka_unit_test(test_histogram_shapes),
        cmocka_unit_test(test_histogram_threads),
        cmocka_unit_test(test_failed_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
