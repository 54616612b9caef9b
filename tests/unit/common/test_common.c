/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/: JSON parser and writer, buffers, arena, small parsers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

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
    assert_string_equal(kvg_strerror(KVG_ELIMIT), "limit exceeded");
    assert_string_equal(kvg_strerror(-ENOMEM), strerror(ENOMEM));
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
        cmocka_unit_test(test_base64url),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_http_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
