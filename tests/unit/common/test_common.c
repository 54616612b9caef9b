/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/: JSON parser and writer, buffers, arena, small parsers, and the
 * Prometheus text writer (exact bytes, and histograms observed from several threads); its main
 * also runs the tests of test_snapshot.c and test_fields.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "common_parts.h"
#include "prom.h"
#include "test_parts.h"

static int parse(const char *text, kvg_arena *a, kvg_json **out)
{
    return kvg_json_parse(text, strlen(text), a, NULL, out, NULL);
}

static void test_json_valid(void **state)
{
    (void)state;
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *v;
    assert_int_equal(
        parse(" {\"a\": [1, -2.5e3, true, false, null], \"b\": \"x\\u00e9\\ud83d\\ude00\"} ", &a,
              &v),
        0);
    assert_int_equal(v->type, KVG_JSON_OBJECT);
    const kvg_json *arr = kvg_json_get(v, "a");
    assert_non_null(arr);
    assert_int_equal(arr->u.arr.count, 5);
    assert_true(arr->u.arr.items[0]->u.num.is_int);
    assert_int_equal(arr->u.arr.items[0]->u.num.ival, 1);
    assert_false(arr->u.arr.items[1]->u.num.is_int);
    assert_true(arr->u.arr.items[1]->u.num.value == -2500.0);
    assert_int_equal(arr->u.arr.items[2]->type, KVG_JSON_TRUE);
    const kvg_json *b = kvg_json_get(v, "b");
    assert_string_equal(b->u.str.ptr, "x\xc3\xa9\xf0\x9f\x98\x80");
    assert_int_equal(b->u.str.len, 7);
    assert_null(kvg_json_get(v, "c"));
    kvg_arena_done(&a);
}

static void test_json_invalid(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        " ",
        "{",
        "}",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "01",
        "1.",
        "-",
        "1e",
        "+1",
        "\"abc",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"a\x01\"",
        "tru",
        "nul",
        "[1 2]",
        "{1:2}",
        "\"\xff\"",
        "\"\xc0\x80\"",
        "\"\xed\xa0\x80\"",
        "1 2",
        "[]]",
        "\"\\",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(bad); i++) {
        kvg_arena a;
        kvg_arena_init(&a, 0);
        kvg_json *v = NULL;
        kvg_json_error err = {0};
        int rc = kvg_json_parse(bad[i], strlen(bad[i]), &a, NULL, &v, &err);
        if (rc != KVG_EPARSE)
            fail_msg("input %zu (%s) gave %d", i, bad[i], rc);
        assert_true(err.message[0] != '\0');
        kvg_arena_done(&a);
    }
}

static void test_json_depth_and_dups(void **state)
{
    (void)state;
    char deep[300];
    memset(deep, '[', 150);
    memset(deep + 150, ']', 150);
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *v;
    assert_int_equal(kvg_json_parse(deep, 300, &a, NULL, &v, NULL), KVG_ELIMIT);
    kvg_json_limits lim = {.max_depth = 200};
    assert_int_equal(kvg_json_parse(deep, 300, &a, &lim, &v, NULL), 0);
    const char *dup = "{\"k\":1,\"k\":2}";
    assert_int_equal(parse(dup, &a, &v), 0);
    assert_int_equal(kvg_json_get(v, "k")->u.num.ival, 2); /* last wins */
    kvg_json_limits strict = {.reject_duplicate_keys = true};
    kvg_json_error err;
    assert_int_equal(kvg_json_parse(dup, strlen(dup), &a, &strict, &v, &err), KVG_EPARSE);
    assert_int_equal(err.offset, 7);
    kvg_arena_done(&a);
}

static void test_json_roundtrip(void **state)
{
    (void)state;
    const char *in = "{\"s\":\"a\\\"b\\\\c\\n\\u0001\",\"n\":[0,-1,1.5,1e+300],\"o\":{},\"e\":[]}";
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_json *v;
    assert_int_equal(parse(in, &a, &v), 0);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_json_write(&b, v);
    assert_string_equal(b.data, "{\"s\":\"a\\\"b\\\\c\\n\\u0001\",\"n\":[0,-1,1.5,1."
                                "0000000000000001e+300],\"o\":{},\"e\":[]}");
    kvg_buf_done(&b);
    kvg_arena_done(&a);
}

/* Every allocation failure point of the parser returns -ENOMEM cleanly (ASan checks leaks). */
static void test_json_alloc_failures(void **state)
{
    (void)state;
    const char *in =
        "{\"a\":[1,2,{\"b\":\"\\u00e9xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}],\"c\":null}";
    bool succeeded = false;
    for (size_t limit = 1; limit < 4096 && !succeeded; limit += 16) {
        kvg_arena a;
        kvg_arena_init(&a, 0);
        a.limit = limit;
        kvg_json *v = NULL;
        int rc = parse(in, &a, &v);
        if (rc == 0)
            succeeded = true;
        else
            assert_int_equal(rc, -ENOMEM);
        kvg_arena_done(&a);
    }
    assert_true(succeeded);
}

static void test_buf_json_string(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_json_string(&b, "a\"\\\x01\xc3\xa9\xff", 7);
    assert_string_equal(b.data, "\"a\\\"\\\\\\u0001\xc3\xa9\xef\xbf\xbd\"");
    kvg_buf_reset(&b);
    for (int i = 0; i < 1000; i++)
        kvg_buf_printf(&b, "%d,", i);
    assert_int_equal(b.len, 3890);
    assert_false(b.failed);
    kvg_buf_done(&b);
}

static void test_hostport(void **state)
{
    (void)state;
    char host[64];
    uint16_t port;
    assert_int_equal(kvg_parse_hostport("127.0.0.1:8080", host, sizeof(host), &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 8080);
    assert_int_equal(kvg_parse_hostport("[::1]:0", host, sizeof(host), &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 0);
    assert_int_equal(kvg_parse_hostport("::1:80", host, sizeof(host), &port), KVG_EPARSE);
    assert_int_equal(kvg_parse_hostport("host:65536", host, sizeof(host), &port), KVG_EPARSE);
    assert_int_equal(kvg_parse_hostport("host:", host, sizeof(host), &port), KVG_EPARSE);
    assert_int_equal(kvg_parse_hostport(":80", host, sizeof(host), &port), KVG_EPARSE);
    uint64_t u;
    assert_int_equal(kvg_parse_u64("18446744073709551615", 20, &u), 0);
    assert_int_equal(kvg_parse_u64("18446744073709551616", 20, &u), KVG_EPARSE);
    assert_true(kvg_consttime_eq("abc", "abc", 3));
    assert_false(kvg_consttime_eq("abc", "abd", 3));
    /* Every length through the word and byte paths, a difference at every position and bit. */
    unsigned char ca[40], cb[40];
    for (size_t n = 0; n <= sizeof(ca); n++) {
        for (size_t i = 0; i < n; i++)
            ca[i] = cb[i] = (unsigned char)(i * 37 + n);
        assert_true(kvg_consttime_eq(ca, cb, n));
        for (size_t i = 0; i < n; i++)
            for (int bit = 0; bit < 8; bit++) {
                cb[i] ^= (unsigned char)(1u << bit);
                assert_false(kvg_consttime_eq(ca, cb, n));
                cb[i] ^= (unsigned char)(1u << bit);
            }
    }
    /* kvg_copy_lower: every byte value at every position of the word and byte paths. */
    for (size_t n = 1; n <= 19; n++)
        for (size_t at = 0; at < n; at++)
            for (unsigned c = 0; c < 256; c++) {
                char src[19], dst[19];
                for (size_t i = 0; i < n; i++)
                    src[i] = (char)("Content-TYPE-x@[`{Z"[i]);
                src[at] = (char)c;
                kvg_copy_lower(dst, src, n);
                for (size_t i = 0; i < n; i++) {
                    unsigned char b = (unsigned char)src[i];
                    unsigned char want = b >= 'A' && b <= 'Z' ? (unsigned char)(b + 32) : b;
                    assert_int_equal((unsigned char)dst[i], want);
                }
            }
    assert_string_equal(kvg_strerror(KVG_ELIMIT), "limit exceeded");
    assert_string_equal(kvg_strerror(-ENOMEM), strerror(ENOMEM));
}

/* kvg_read_file: whole files, the bound, what is not a regular file, a missing one. */
static void test_read_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvg-read-file-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/f", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    char big[10000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    big[5000] = '\0'; /* NUL bytes are data */
    assert_int_equal(fwrite(big, 1, sizeof(big), f), sizeof(big));
    fclose(f);
    char *data = NULL;
    size_t len = 0;
    assert_int_equal(kvg_read_file(path, sizeof(big), &data, &len), 0);
    assert_int_equal(len, sizeof(big));
    assert_memory_equal(data, big, sizeof(big));
    assert_int_equal(data[len], '\0');
    free(data);
    assert_int_equal(kvg_read_file(path, sizeof(big) - 1, &data, &len), KVG_ELIMIT);
    assert_null(data);
    assert_int_equal(kvg_read_file(dir, 100, &data, &len), -EISDIR);
    assert_int_equal(kvg_read_file("/dev/null", 100, &data, &len), -EISDIR);
    char fifo[128];
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(kvg_read_file(fifo, 100, &data, &len), -EISDIR); /* at once: no writer */
    unlink(fifo);
    unlink(path);
    assert_int_equal(kvg_read_file(path, 100, &data, &len), -ENOENT);
    f = fopen(path, "wb");
    fclose(f);
    assert_int_equal(kvg_read_file(path, 0, &data, &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(data[0], '\0');
    free(data);
    unlink(path);
    rmdir(dir);
}

static void test_fmt_and_arena_reset(void **state)
{
    (void)state;
    char buf[32];
    size_t n = kvg_fmt_u64(buf, 0);
    assert_int_equal(n, 1);
    assert_memory_equal(buf, "0", 1);
    n = kvg_fmt_u64(buf, UINT64_MAX);
    assert_int_equal(n, 20);
    assert_memory_equal(buf, "18446744073709551615", 20);
    kvg_fmt_hex64(buf, 0x0123456789abcdefULL);
    assert_memory_equal(buf, "0123456789abcdef", 16);
    /* Against snprintf: every power of ten and its neighbours, and pseudo-random values. */
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 2000; i++) {
        uint64_t v;
        if (i < 60) {
            v = 1;
            for (int k = 0; k < i / 3; k++)
                v *= 10;
            v += (uint64_t)(i % 3) - 1; /* 10^k - 1, 10^k, 10^k + 1 */
        } else {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            v = x >> (i % 64);
        }
        char want[32];
        int wn = snprintf(want, sizeof(want), "%llu", (unsigned long long)v);
        memset(buf, 'x', sizeof(buf));
        assert_int_equal(kvg_fmt_u64(buf, v), (size_t)wn);
        assert_memory_equal(buf, want, (size_t)wn);
        assert_int_equal(buf[wn], 'x');
        snprintf(want, sizeof(want), "%016llx", (unsigned long long)v);
        kvg_fmt_hex64(buf, v);
        assert_memory_equal(buf, want, 16);
    }
    static const uint8_t bytes[] = {0x00, 0x0f, 0xa5, 0xff};
    memset(buf, 'x', sizeof(buf));
    kvg_hex_encode(bytes, sizeof(bytes), buf);
    assert_memory_equal(buf, "000fa5ffx", 9); /* 8 digits, nothing past them */

    kvg_arena a;
    kvg_arena_init(&a, 1024);
    void *first = kvg_arena_alloc(&a, 100);
    kvg_arena_alloc(&a, 5000); /* a chunk of its own, linked after the first */
    kvg_arena_alloc(&a, 900);  /* still fits the first chunk */
    kvg_arena_alloc(&a, 900);  /* a second regular chunk, at the head */
    kvg_arena_reset(&a);
    assert_int_equal(a.total, 0);
    /* The first regular chunk is kept and reused from its start. */
    assert_ptr_equal(kvg_arena_alloc(&a, 16), first);
    kvg_arena_done(&a);
}

static void test_base64url(void **state)
{
    (void)state;
    /* RFC 4648 section 10 vectors, without padding, and the two url-safe characters. */
    static const char *const in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const want[] = {"", "Zg", "Zm8", "Zm9v", "Zm9vYg", "Zm9vYmE", "Zm9vYmFy"};
    char out[16];
    for (size_t i = 0; i < KVG_ARRAY_LEN(in); i++) {
        size_t n = kvg_base64url((const uint8_t *)in[i], strlen(in[i]), out);
        assert_string_equal(out, want[i]);
        assert_int_equal(n, strlen(want[i]));
    }
    const uint8_t odd[] = {0xfb, 0xff};
    kvg_base64url(odd, 2, out);
    assert_string_equal(out, "-_8");
}

/* kvg_copy copies exactly, at every length around its thresholds and every relative alignment,
 * and touches nothing outside the destination. */
static void test_copy(void **state)
{
    (void)state;
    enum { MAX = 9000, PAD = 80 };
    unsigned char *src = malloc(MAX + PAD), *dst = malloc(MAX + 2 * PAD);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < MAX + PAD; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 8));
    static const size_t lens[] = {0,    1,    15,   63,   64,   65,   127,
                                  2047, 2048, 2049, 2111, 4096, 8191, MAX};
    for (size_t li = 0; li < KVG_ARRAY_LEN(lens); li++) {
        for (size_t so = 0; so < 64; so += 7) {
            for (size_t dof = 0; dof < 64; dof += 5) {
                size_t n = lens[li];
                memset(dst, 0xa5, MAX + 2 * PAD);
                kvg_copy(dst + PAD + dof, src + so, n);
                assert_memory_equal(dst + PAD + dof, src + so, n);
                for (size_t i = 0; i < PAD + dof; i++)
                    assert_int_equal(dst[i], 0xa5);
                for (size_t i = PAD + dof + n; i < MAX + 2 * PAD; i++)
                    assert_int_equal(dst[i], 0xa5);
            }
        }
    }
    free(src);
    free(dst);
}

/* Header names are RFC 9110 tokens; every byte outside tchar makes a name invalid (the
 * "Content-Length : 5" smuggling case is a trailing space), and lowercasing checks as it goes. */
static void test_http_fields(void **state)
{
    (void)state;
    const char *tchars = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    for (unsigned c = 0; c < 256; c++) {
        char name[3] = {'X', (char)c, 'y'};
        bool want = c != 0 && strchr(tchars, (int)c) != NULL;
        assert_int_equal(kvg_http_token_valid(name, 3), want);
        assert_int_equal(kvg_http_token_lower(name, 3), want);
        if (want) {
            assert_int_equal(name[0], 'x');
            assert_int_equal((unsigned char)name[1], c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
        }
    }
    assert_false(kvg_http_token_valid("", 0));
    assert_false(kvg_http_token_lower((char[1]){0}, 0));
    assert_false(kvg_http_token_valid("content-length ", 15));
    assert_false(kvg_http_token_valid(" content-length", 15));
    assert_false(kvg_http_token_valid("content length", 14));
    assert_true(kvg_http_token_valid("content-length", 14));
    char mixed[] = "X-Kvgate-Worker";
    assert_true(kvg_http_token_lower(mixed, strlen(mixed)));
    assert_string_equal(mixed, "x-kvgate-worker");
}

/* ---- prom.h ------------------------------------------------------------------------------ */

/* The buffer's text, for assert_string_equal. */
static const char *buf_text(kvg_buf *b)
{
    return b->data ? b->data : "";
}

static void test_prom_header_and_types(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_header(&b, "kvgate_x_total", KVG_PROM_COUNTER, "Things that happened.");
    kvg_prom_put_header(&b, "kvgate_y", KVG_PROM_GAUGE, "Things now.");
    kvg_prom_put_header(&b, "kvgate_z_seconds", KVG_PROM_HISTOGRAM, "How long.");
    assert_string_equal(buf_text(&b), "# HELP kvgate_x_total Things that happened.\n"
                                      "# TYPE kvgate_x_total counter\n"
                                      "# HELP kvgate_y Things now.\n"
                                      "# TYPE kvgate_y gauge\n"
                                      "# HELP kvgate_z_seconds How long.\n"
                                      "# TYPE kvgate_z_seconds histogram\n");
    assert_string_equal(kvg_prom_type_str(KVG_PROM_TYPE_COUNT), "untyped");
    assert_string_equal(kvg_prom_type_str((kvg_prom_type)-1), "untyped");
    kvg_buf_done(&b);
}

static void test_prom_label_escaping(void **state)
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
        assert_string_equal(buf_text(&b), cases[i].out);
        kvg_buf_done(&b);
    }
    /* In a sample: label values escaped, label names and the metric name as they are. */
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_u64(&b, "kvgate_x_total", KVG_PROM_LABELS({"tenant", "a\"b\\c\nd"}), 3);
    assert_string_equal(buf_text(&b), "kvgate_x_total{tenant=\"a\\\"b\\\\c\\nd\"} 3\n");
    kvg_buf_done(&b);
}

static void test_prom_samples(void **state)
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
    assert_string_equal(buf_text(&b), "a 0\n"
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

static void test_prom_floats(void **state)
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
    assert_string_equal(buf_text(&b), "f{worker=\"w\"} 0\n"
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

static void test_prom_scalars(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_scalar_u64(&b, "kvgate_index_entries", KVG_PROM_GAUGE, "Entries.", 80);
    kvg_prom_put_scalar_i64(&b, "kvgate_connections_open", KVG_PROM_GAUGE, "Open now.", -1);
    kvg_prom_put_scalar_u64(&b, "kvgate_timeouts_total", KVG_PROM_COUNTER, "Timeouts.", 0);
    assert_string_equal(buf_text(&b), "# HELP kvgate_index_entries Entries.\n"
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

static void test_prom_by_label(void **state)
{
    (void)state;
    static const char *const kinds[3] = {"front", "ad\"min", "x"};
    _Atomic uint64_t counts[3];
    atomic_init(&counts[0], 0u);
    atomic_init(&counts[1], 12u);
    atomic_init(&counts[2], UINT64_MAX);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_by_label(&b, "kvgate_refused_total", KVG_PROM_COUNTER, "Refused.", "listener",
                          kinds, counts, 2);
    kvg_prom_put_by_label(&b, "kvgate_none", KVG_PROM_GAUGE, "Nothing.", "k", kinds, counts, 0);
    assert_string_equal(buf_text(&b), "# HELP kvgate_refused_total Refused.\n"
                                      "# TYPE kvgate_refused_total counter\n"
                                      "kvgate_refused_total{listener=\"front\"} 0\n"
                                      "kvgate_refused_total{listener=\"ad\\\"min\"} 12\n"
                                      "# HELP kvgate_none Nothing.\n"
                                      "# TYPE kvgate_none gauge\n");
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

static void test_prom_histogram_latency(void **state)
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
    assert_string_equal(buf_text(&b),
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

static void test_prom_histogram_decision(void **state)
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
    assert_string_equal(buf_text(&b), "d_bucket{stage=\"total\",le=\"1e-06\"} 1\n"
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
static void test_prom_histogram_shapes(void **state)
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
    assert_string_equal(buf_text(&b), "s_bucket{le=\"1\"} 0\n"
                                      "s_bucket{le=\"+Inf\"} 1\n"
                                      "s_sum 1\n"
                                      "s_count 1\n");
    kvg_buf_reset(&b);
    kvg_prom_hist_init(&h);
    kvg_prom_hist_observe(&h, &millis, 2500000); /* 2.5 ms: rounds half up to 3 */
    kvg_prom_hist_observe(&h, &millis, 1000000000);
    kvg_prom_put_hist(&b, "m", KVG_PROM_LABELS({"a", "1"}, {"b", "2"}), &h, &millis);
    assert_string_equal(buf_text(&b), "m_bucket{a=\"1\",b=\"2\",le=\"1\"} 2\n"
                                      "m_bucket{a=\"1\",b=\"2\",le=\"+Inf\"} 2\n"
                                      "m_sum{a=\"1\",b=\"2\"} 1.003\n"
                                      "m_count{a=\"1\",b=\"2\"} 2\n");
    kvg_buf_reset(&b);
    kvg_prom_hist_init(&h);
    kvg_prom_hist_observe(&h, &none, 7000);
    kvg_prom_put_hist(&b, "n", NULL, 0, &h, &none);
    assert_string_equal(buf_text(&b), "n_bucket{le=\"+Inf\"} 1\n"
                                      "n_sum 0.000007\n"
                                      "n_count 1\n");
    kvg_buf_done(&b);
}

#define OBSERVERS 4
#define OBSERVATIONS 100000

static kvg_prom_hist observed;

static void *prom_observer(void *arg)
{
    uint64_t seed = (uintptr_t)arg;
    for (unsigned i = 0; i < OBSERVATIONS; i++)
        /* 1 us .. ~8.4 ms, whole microseconds so the sum is exact */
        kvg_prom_hist_observe(&observed, &latency, ((seed * 7919 + i) % 8400 + 1) * 1000);
    return NULL;
}

/* Observations from several threads at once are all counted, in the right buckets, and the sum
 * is exact: the adds are atomic. */
static void test_prom_histogram_threads(void **state)
{
    (void)state;
    kvg_prom_hist_init(&observed);
    pthread_t t[OBSERVERS];
    for (uintptr_t i = 0; i < OBSERVERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, prom_observer, (void *)i), 0);
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
        total += atomic_load(&observed.buckets[i]);
    assert_int_equal(total, (uint64_t)OBSERVERS * OBSERVATIONS);
    assert_int_equal(atomic_load(&observed.buckets[0]), want_first);
    assert_int_equal(atomic_load(&observed.buckets[1]), total - want_first);
    assert_int_equal(atomic_load(&observed.sum), want_sum);

    kvg_buf b;
    kvg_buf_init(&b);
    kvg_prom_put_hist(&b, "t", NULL, 0, &observed, &latency);
    char line[64];
    snprintf(line, sizeof(line), "t_count %u\n", OBSERVERS * OBSERVATIONS);
    assert_non_null(strstr(buf_text(&b), line));
    snprintf(line, sizeof(line), "t_bucket{le=\"+Inf\"} %u\n", OBSERVERS * OBSERVATIONS);
    assert_non_null(strstr(buf_text(&b), line));
    kvg_buf_done(&b);
}

/* A buffer that ran out of memory stays failed; the writer neither crashes nor clears it. */
static void test_prom_failed_buffer(void **state)
{
    (void)state;
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "x");
    b.failed = true;
    kvg_prom_put_scalar_u64(&b, "a", KVG_PROM_GAUGE, "A.", 1);
    kvg_prom_put_hist(&b, "h", KVG_PROM_LABELS({"k", "v"}), &observed, &latency);
    assert_true(b.failed);
    assert_string_equal(buf_text(&b), "x");
    kvg_buf_done(&b);
}

/* A worker's and a tenant's model lists: empty admits all, a NULL model is admitted. */
static void test_models_admit(void **state)
{
    (void)state;
    const char *const two[] = {"a", "bb"};
    assert_true(kvg_models_admit(NULL, 0, "x"));
    assert_true(kvg_models_admit(two, 2, NULL));
    assert_true(kvg_models_admit(two, 2, "bb"));
    assert_false(kvg_models_admit(two, 2, "b"));
    assert_false(kvg_models_admit(two, 2, ""));
    assert_false(kvg_models_admit(two, 1, "bb"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_valid),
        cmocka_unit_test(test_json_invalid),
        cmocka_unit_test(test_json_depth_and_dups),
        cmocka_unit_test(test_json_roundtrip),
        cmocka_unit_test(test_json_alloc_failures),
        cmocka_unit_test(test_buf_json_string),
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_fmt_and_arena_reset),
        cmocka_unit_test(test_read_file),
        cmocka_unit_test(test_base64url),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_http_fields),
        cmocka_unit_test(test_models_admit),
        cmocka_unit_test(test_prom_header_and_types),
        cmocka_unit_test(test_prom_label_escaping),
        cmocka_unit_test(test_prom_samples),
        cmocka_unit_test(test_prom_floats),
        cmocka_unit_test(test_prom_scalars),
        cmocka_unit_test(test_prom_by_label),
        cmocka_unit_test(test_prom_histogram_latency),
        cmocka_unit_test(test_prom_histogram_decision),
        cmocka_unit_test(test_prom_histogram_shapes),
        cmocka_unit_test(test_prom_histogram_threads),
        cmocka_unit_test(test_prom_failed_buffer),
    };
    const test_part parts[] = {
        {tests, KVG_ARRAY_LEN(tests)},
        {snapshot_tests, snapshot_tests_count},
        {fields_tests, fields_tests_count},
    };
    return run_test_parts(parts, KVG_ARRAY_LEN(parts));
}
