/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the engine-load parser (vLLM's Prometheus page) and the per-worker storage of
 * the scraped load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fail_alloc.h"
#include "router.h"

static kvg_engine_load parse(const char *s)
{
    kvg_engine_load l;
    memset(&l, 0xa5, sizeof(l));
    assert_int_equal(kvg_engine_metrics_parse(s, strlen(s), &l), 0);
    return l;
}

/* A page as vLLM v1 writes it (abridged), two data-parallel engines. */
static const char vllm_page[] =
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    "python_gc_objects_collected_total{generation=\"0\"} 12345.0\n"
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 4.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} 7.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 3.0\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} 2.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} "
    "0.4123\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} "
    "0.8765\n"
    "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of tokens.\n"
    "# TYPE vllm:prefix_cache_queries_total counter\n"
    "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 123456.0\n"
    "vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"x\"} 99.0\n"
    "vllm:request_queue_time_seconds_bucket{engine=\"0\",le=\"0.3\",model_name=\"m\"} 9.0\n";

static void test_vllm_page(void **state)
{
    (void)state;
    kvg_engine_load l = parse(vllm_page);
    assert_true(l.have_waiting);
    assert_true(l.have_kv_usage);
    assert_int_equal(l.waiting, 5);
    assert_float_equal(l.kv_usage, 0.8765, 1e-6);
    /* CRLF line ends, no trailing line feed. */
    l = parse("vllm:num_requests_waiting 4\r\nvllm:kv_cache_usage_perc 0.25\r\n");
    assert_int_equal(l.waiting, 4);
    assert_float_equal(l.kv_usage, 0.25, 1e-6);
    l = parse("vllm:num_requests_waiting 4");
    assert_true(l.have_waiting);
    assert_int_equal(l.waiting, 4);
    assert_false(l.have_kv_usage);
    assert_true(l.kv_usage == 0.0f);
}

static void test_forms(void **state)
{
    (void)state;
    /* Without labels, with a timestamp, leading blanks, tabs, exponents. */
    kvg_engine_load l = parse("vllm:num_requests_waiting 1 1712345678000\n"
                              "  vllm:num_requests_waiting\t2e0\t1712345678000\n"
                              "vllm:num_requests_waiting {} 3.0\n"
                              "vllm:num_requests_waiting{a=\"b\"}4\n"
                              "vllm:kv_cache_usage_perc{} 5e-1\n");
    assert_int_equal(l.waiting, 10);
    assert_float_equal(l.kv_usage, 0.5, 1e-6);
    /* Labels with spaces, braces, escaped quotes and backslashes, a '#' and a newline escape. */
    l = parse("vllm:num_requests_waiting{model_name=\"a } b {\",x=\"say \\\"hi\\\" }\"} 6\n"
              "vllm:num_requests_waiting{p=\"C:\\\\dir\\\\\",q=\"# 9\\n\"} 1\n"
              "vllm:kv_cache_usage_perc{m=\"} 0.99\"} 0.5\n");
    assert_int_equal(l.waiting, 7);
    assert_float_equal(l.kv_usage, 0.5, 1e-6);
    /* Rounding of fractional queue lengths (an average across engines is not an integer). */
    assert_int_equal(parse("vllm:num_requests_waiting 2.4\nvllm:num_requests_waiting 0.2").waiting,
                     3);
}

static void test_special_values(void **state)
{
    (void)state;
    kvg_engine_load l = parse("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc NaN\n");
    assert_false(l.have_waiting);
    assert_false(l.have_kv_usage);
    assert_int_equal(l.waiting, 0);
    l = parse("vllm:num_requests_waiting +Inf\nvllm:kv_cache_usage_perc +Inf\n");
    assert_int_equal(l.waiting, UINT32_MAX);
    assert_true(l.kv_usage == 1.0f);
    l = parse("vllm:num_requests_waiting 1e300\nvllm:num_requests_waiting 1e300\n");
    assert_int_equal(l.waiting, UINT32_MAX);
    l = parse("vllm:num_requests_waiting -Inf\nvllm:num_requests_waiting -3\n"
              "vllm:kv_cache_usage_perc -0.5\n");
    assert_true(l.have_waiting);
    assert_int_equal(l.waiting, 0);
    assert_true(l.have_kv_usage);
    assert_true(l.kv_usage == 0.0f);
    /* A percentage (v0-style 0..100) is clamped, not trusted. */
    assert_true(parse("vllm:kv_cache_usage_perc 87.5\n").kv_usage == 1.0f);
    /* NaN next to a number: the number counts. */
    l = parse("vllm:kv_cache_usage_perc{e=\"0\"} NaN\nvllm:kv_cache_usage_perc{e=\"1\"} 0.3\n");
    assert_true(l.have_kv_usage);
    assert_float_equal(l.kv_usage, 0.3, 1e-6);
}

static void test_missing_and_other_metrics(void **state)
{
    (void)state;
    kvg_engine_load l = parse("");
    assert_false(l.have_waiting);
    assert_false(l.have_kv_usage);
    assert_int_equal(l.waiting, 0);
    l = parse("# vllm:num_requests_waiting 5\n"
              "#vllm:num_requests_waiting 5\n"
              "vllm:num_requests_waiting_total 5\n"
              "xvllm:num_requests_waiting 5\n"
              "vllm:num_requests_waitin 5\n"
              "vllm:gpu_cache_usage_perc 0.5\n"
              "sglang:num_queue_reqs 5\n");
    assert_false(l.have_waiting);
    assert_false(l.have_kv_usage);
    assert_int_equal(kvg_engine_metrics_parse(NULL, 0, &l), 0);
    assert_false(l.have_waiting);
    assert_int_equal(kvg_engine_metrics_parse(NULL, 1, &l), -EINVAL);
    assert_int_equal(kvg_engine_metrics_parse("", 0, NULL), -EINVAL);
}

static void test_malformed(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "vllm:num_requests_waiting\n",
        "vllm:num_requests_waiting \n",
        "vllm:num_requests_waiting{\n",
        "vllm:num_requests_waiting{a=\"b\" 5\n",
        "vllm:num_requests_waiting{a=\"b} 5\n",
        "vllm:num_requests_waiting{a=\"b\\\"} 5\n",
        "vllm:num_requests_waiting{a=\"b\\",
        "vllm:num_requests_waiting 5x\n",
        "vllm:num_requests_waiting 0x\n",
        "vllm:num_requests_waiting 1..2\n",
        "vllm:num_requests_waiting --1\n",
        "vllm:num_requests_waiting \"5\"\n",
        "vllm:num_requests_waiting=5\n",
        "vllm:num_requests_waiting-5\n",
        /* a 65-digit value: longer than any number an exporter writes */
        ("vllm:num_requests_waiting 123456789012345678901234567890123456789012345678901234567890"
         "12345\n"),
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvg_engine_load l = parse(bad[i]);
        if (l.have_waiting)
            fail_msg("accepted: %s", bad[i]);
    }
    /* A NUL inside the value, and a bad line among good ones. */
    static const char nul[] = "vllm:num_requests_waiting 1\0002\nvllm:num_requests_waiting 4\n"
                              "vllm:num_requests_waiting{x=\"\n"
                              "vllm:num_requests_waiting 1\n";
    kvg_engine_load l;
    assert_int_equal(kvg_engine_metrics_parse(nul, sizeof(nul) - 1, &l), 0);
    assert_int_equal(l.waiting, 5);
}

/* A line longer than the limit is skipped whatever it holds; one at the limit is read. */
static void test_long_lines(void **state)
{
    (void)state;
    size_t n = KVG_ENGINE_METRICS_LINE_MAX + 64;
    char *page = malloc(n * 2 + 64);
    assert_non_null(page);
    const char *head = "vllm:num_requests_waiting{pad=\"";
    const char *tail = "\"} 7";
    size_t hl = strlen(head), tl = strlen(tail);
    /* exactly LINE_MAX bytes */
    size_t pad = KVG_ENGINE_METRICS_LINE_MAX - hl - tl;
    char *p = page;
    memcpy(p, head, hl);
    memset(p + hl, 'x', pad);
    memcpy(p + hl + pad, tail, tl);
    p += hl + pad + tl;
    *p++ = '\n';
    kvg_engine_load l;
    assert_int_equal(kvg_engine_metrics_parse(page, (size_t)(p - page), &l), 0);
    assert_int_equal(l.waiting, 7);
    /* one byte more */
    memcpy(p, head, hl);
    memset(p + hl, 'x', pad + 1);
    memcpy(p + hl + pad + 1, tail, tl);
    char *end = p + hl + pad + 1 + tl;
    assert_int_equal(kvg_engine_metrics_parse(p, (size_t)(end - p), &l), 0);
    assert_false(l.have_waiting);
    assert_int_equal(kvg_engine_metrics_parse(page, (size_t)(end - page), &l), 0);
    assert_int_equal(l.waiting, 7);
    free(page);
}

/* Random bytes and random mixes of the page's pieces never crash (ASan builds check reads). */
static void test_garbage(void **state)
{
    (void)state;
    static const char *const pieces[] = {
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "{",
        "}",
        "\"",
        "\\",
        " ",
        "\n",
        "\r",
        "\t",
        "#",
        "=",
        ",",
        "1",
        "NaN",
        "+Inf",
        "-",
        "e",
        ".",
        "a=\"b\"",
        "\0",
    };
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char buf[256];
    for (int round = 0; round < 20000; round++) {
        size_t n = 0;
        while (n < sizeof(buf) - 32) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if (round & 1) {
                buf[n++] = (char)(x >> 24);
            } else {
                const char *s = pieces[(x >> 20) % (sizeof(pieces) / sizeof(pieces[0]))];
                size_t sl = *s ? strlen(s) : 1;
                memcpy(buf + n, s, sl);
                n += sl;
            }
            if ((x & 31) == 0)
                break;
        }
        char *copy = malloc(n ? n : 1); /* exact size, so ASan sees any overread */
        assert_non_null(copy);
        memcpy(copy, buf, n);
        kvg_engine_load l;
        assert_int_equal(kvg_engine_metrics_parse(copy, n, &l), 0);
        assert_true(l.kv_usage >= 0.0f && l.kv_usage <= 1.0f);
        free(copy);
    }
}

/* The parser allocates nothing: it works with every allocation failing. */
static void test_no_allocation(void **state)
{
    (void)state;
    fail_alloc_nth(0);
    kvg_engine_load l;
    int rc = kvg_engine_metrics_parse(vllm_page, sizeof(vllm_page) - 1, &l);
    assert_false(fail_alloc_off());
    assert_int_equal(rc, 0);
    assert_int_equal(l.waiting, 5);
}

static void test_worker_storage(void **state)
{
    (void)state;
    kvg_registry *reg;
    assert_int_equal(kvg_registry_new(NULL, &reg), 0);
    kvg_worker_def def = {.name = "w1", .url = "http://127.0.0.1:1"};
    assert_int_equal(kvg_registry_put(reg, &def, KVG_WORKER_SOURCE_CONFIG, NULL, 0), 0);
    kvg_worker_set *set = kvg_registry_acquire(reg);
    kvg_worker *w = kvg_worker_set_find(set, "w1");
    assert_non_null(w);

    uint32_t waiting = 77;
    float kv = 0.5f;
    assert_false(kvg_worker_engine_load(w, 1000, 1000000, &waiting, &kv));
    assert_int_equal(waiting, 77); /* untouched */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_registry_write_metrics(reg, &b);
    assert_non_null(b.data);
    assert_null(strstr(b.data, "kvgate_worker_engine_waiting{"));
    assert_non_null(strstr(b.data, "kvgate_worker_scrape_errors_total{worker=\"w1\"} 0\n"));
    kvg_buf_done(&b);

    kvg_worker_set_engine_load(w, 3, 0.25f, 5000);
    assert_true(kvg_worker_engine_load(w, 6000, 1000, &waiting, &kv));
    assert_int_equal(waiting, 3);
    assert_true(kv == 0.25f);
    assert_false(kvg_worker_engine_load(w, 6001, 1000, &waiting, &kv));
    assert_true(kvg_worker_engine_load(w, 4000, 10, NULL, NULL)); /* stamped after now */
    kvg_worker_set_engine_load(w, 9, 3.0f, 7000);
    assert_true(kvg_worker_engine_load(w, 7000, 1, &waiting, &kv));
    assert_int_equal(waiting, 9);
    assert_true(kv == 1.0f);
    kvg_worker_set_engine_load(w, 0, -1.0f, 8000);
    assert_true(kvg_worker_engine_load(w, 8000, 1, &waiting, &kv));
    assert_true(kv == 0.0f);
    kvg_worker_set_engine_load(w, 4, 0.125f, 9000);
    kvg_worker_record_scrape_error(w);
    kvg_worker_record_scrape_error(w);

    kvg_buf_init(&b);
    kvg_registry_write_metrics(reg, &b);
    assert_non_null(b.data);
    assert_non_null(strstr(b.data, "kvgate_worker_engine_waiting{worker=\"w1\"} 4\n"));
    assert_non_null(strstr(b.data, "kvgate_worker_engine_kv_usage{worker=\"w1\"} 0.125\n"));
    assert_non_null(strstr(b.data, "kvgate_worker_scrape_errors_total{worker=\"w1\"} 2\n"));
    kvg_buf_done(&b);
    kvg_worker_set_unref(set);
    kvg_registry_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_page),      cmocka_unit_test(test_forms),
        cmocka_unit_test(test_special_values), cmocka_unit_test(test_missing_and_other_metrics),
        cmocka_unit_test(test_malformed),      cmocka_unit_test(test_long_lines),
        cmocka_unit_test(test_garbage),        cmocka_unit_test(test_no_allocation),
        cmocka_unit_test(test_worker_storage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
