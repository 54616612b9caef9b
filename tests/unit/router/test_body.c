/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the request-body rewriter: salt removal and injection in every placement and
 * spelling, model/stream/prompt extraction, the same acceptance and error offsets as the JSON
 * parser, depth, allocation failures, a seeded mutation run against the parser, and the
 * canonical prefix stream of kvg_body_scan (docs/canonical.md) with its type errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fail_alloc.h"
#include "router.h"

#define SALT "s4lt_0123456789-ABCDEFGHIJKLMNOPQRSTUVWXYZabc"

/* ---- helpers --------------------------------------------------------------------------------- */

typedef struct result {
    int rc;
    kvg_buf out;
    kvg_body_info info;
    kvg_json_error err;
    kvg_arena arena;
} result;

static void run(result *r, const char *body, size_t len, const char *salt)
{
    kvg_arena_init(&r->arena, 0);
    kvg_buf_init(&r->out);
    memset(&r->info, 0xAB, sizeof(r->info));
    memset(&r->err, 0, sizeof(r->err));
    r->rc = kvg_body_rewrite(body, len, salt, &r->arena, &r->out, &r->info, &r->err);
}

static void done(result *r)
{
    kvg_buf_done(&r->out);
    kvg_arena_done(&r->arena);
}

/* The tree of text, serialised compactly (member order and duplicates kept). */
static void canonical(const char *text, size_t len, kvg_buf *b)
{
    kvg_arena a;
    kvg_json *v;
    kvg_json_error err;
    kvg_arena_init(&a, 0);
    int rc = kvg_json_parse(text, len, &a, NULL, &v, &err);
    if (rc != 0)
        fail_msg("output does not parse: %s at %zu: %.*s", err.message, err.offset, (int)len, text);
    kvg_json_write(b, v);
    kvg_arena_done(&a);
}

/* What the output must mean: the input's tree without its top-level cache_salt members, plus
 * the salt as the last member. */
static void expected_tree(const char *text, size_t len, const char *salt, kvg_buf *b,
                          unsigned *removed)
{
    kvg_arena a;
    kvg_json *v;
    kvg_arena_init(&a, 0);
    assert_int_equal(kvg_json_parse(text, len, &a, NULL, &v, NULL), 0);
    assert_int_equal(v->type, KVG_JSON_OBJECT);
    size_t n = v->u.obj.count, k = 0;
    char **keys = kvg_arena_alloc(&a, (n + 1) * sizeof(char *));
    size_t *lens = kvg_arena_alloc(&a, (n + 1) * sizeof(size_t));
    kvg_json **vals = kvg_arena_alloc(&a, (n + 1) * sizeof(kvg_json *));
    assert_true(keys && lens && vals);
    *removed = 0;
    for (size_t i = 0; i < n; i++) {
        if (v->u.obj.key_lens[i] == 10 && memcmp(v->u.obj.keys[i], "cache_salt", 10) == 0) {
            (*removed)++;
            continue;
        }
        keys[k] = v->u.obj.keys[i];
        lens[k] = v->u.obj.key_lens[i];
        vals[k++] = v->u.obj.values[i];
    }
    kvg_json salt_v = {.type = KVG_JSON_STRING};
    if (salt) {
        salt_v.u.str.ptr = (char *)salt;
        salt_v.u.str.len = strlen(salt);
        keys[k] = "cache_salt";
        lens[k] = 10;
        vals[k++] = &salt_v;
    }
    v->u.obj.keys = keys;
    v->u.obj.key_lens = lens;
    v->u.obj.values = vals;
    v->u.obj.count = k;
    kvg_json_write(b, v);
    kvg_arena_done(&a);
}

/* Rewrite an accepted body and check the output's meaning, the removal count, and that
 * rewriting the output again changes nothing but the salt. */
static void check_semantics(const char *body, size_t len, const char *salt)
{
    result r;
    run(&r, body, len, salt);
    if (r.rc != 0)
        fail_msg("rejected (%d: %s at %zu): %.*s", r.rc, r.err.message, r.err.offset, (int)len,
                 body);
    kvg_buf got, want;
    unsigned removed;
    kvg_buf_init(&got);
    kvg_buf_init(&want);
    canonical(r.out.data, r.out.len, &got);
    expected_tree(body, len, salt, &want, &removed);
    if (strcmp(got.data, want.data) != 0)
        fail_msg("body %.*s\n got  %s\n want %s", (int)len, body, got.data, want.data);
    assert_int_equal(r.info.cache_salts_removed, removed);

    /* Idempotence: the output rewritten with the same salt is the same bytes. */
    result again;
    run(&again, r.out.data, r.out.len, salt);
    assert_int_equal(again.rc, 0);
    assert_int_equal(again.info.cache_salts_removed, salt ? 1 : 0);
    if (again.out.len != r.out.len || memcmp(again.out.data, r.out.data, r.out.len) != 0)
        fail_msg("not idempotent: %s\n -> %s", r.out.data, again.out.data);
    done(&again);
    kvg_buf_done(&got);
    kvg_buf_done(&want);
    done(&r);
}

/* ---- placements ------------------------------------------------------------------------------ */

typedef struct placement {
    const char *in;
    const char *out_salted;   /* with SALT injected ("%" stands for it) */
    const char *out_unsalted; /* with salt NULL */
    unsigned removed;
} placement;

static const placement placements[] = {
    {"{}", "{\"cache_salt\":%}", "{}", 0},
    {"{ }", "{ \"cache_salt\":%}", "{ }", 0},
    {" {}\n", " {\"cache_salt\":%}\n", " {}\n", 0},
    {"{\"a\":1}", "{\"a\":1,\"cache_salt\":%}", "{\"a\":1}", 0},
    {"{ \"a\" : 1 }", "{ \"a\" : 1,\"cache_salt\":% }", "{ \"a\" : 1 }", 0},
    /* only */
    {"{\"cache_salt\":\"x\"}", "{\"cache_salt\":%}", "{}", 1},
    {"{ \"cache_salt\" : \"x\" }", "{ \"cache_salt\":% }", "{  }", 1},
    /* first, middle, last */
    {"{\"cache_salt\":\"x\",\"a\":1}", "{\"a\":1,\"cache_salt\":%}", "{\"a\":1}", 1},
    {"{\"a\":1,\"cache_salt\":\"x\",\"b\":2}", "{\"a\":1,\"b\":2,\"cache_salt\":%}",
     "{\"a\":1,\"b\":2}", 1},
    {"{\"a\":1,\"cache_salt\":\"x\"}", "{\"a\":1,\"cache_salt\":%}", "{\"a\":1}", 1},
    {"{\n  \"cache_salt\": \"x\",\n  \"a\": 1\n}", "{\n  \"a\": 1,\"cache_salt\":%\n}",
     "{\n  \"a\": 1\n}", 1},
    {"{\n  \"a\": 1,\n  \"cache_salt\": \"x\",\n  \"b\": 2\n}",
     "{\n  \"a\": 1,\n  \"b\": 2,\"cache_salt\":%\n}", "{\n  \"a\": 1,\n  \"b\": 2\n}", 1},
    {"{\n  \"a\": 1,\n  \"cache_salt\": \"x\"\n}", "{\n  \"a\": 1,\"cache_salt\":%\n}",
     "{\n  \"a\": 1\n}", 1},
    /* duplicated: adjacent, apart, everywhere */
    {"{\"cache_salt\":1,\"cache_salt\":2}", "{\"cache_salt\":%}", "{}", 2},
    {"{\"cache_salt\":1,\"cache_salt\":2,\"a\":3}", "{\"a\":3,\"cache_salt\":%}", "{\"a\":3}", 2},
    {"{\"a\":1,\"cache_salt\":2,\"cache_salt\":3}", "{\"a\":1,\"cache_salt\":%}", "{\"a\":1}", 2},
    {"{\"cache_salt\":1,\"a\":2,\"cache_salt\":3,\"b\":4,\"cache_salt\":5}",
     "{\"a\":2,\"b\":4,\"cache_salt\":%}", "{\"a\":2,\"b\":4}", 3},
    /* escaped spellings of the key */
    {"{\"\\u0063ache_salt\":\"x\",\"a\":1}", "{\"a\":1,\"cache_salt\":%}", "{\"a\":1}", 1},
    {"{\"a\":1,\"cache\\u005fsalt\":\"x\"}", "{\"a\":1,\"cache_salt\":%}", "{\"a\":1}", 1},
    {"{\"\\u0063\\u0061\\u0063\\u0068\\u0065\\u005F\\u0073\\u0061\\u006c\\u0074\":1}",
     "{\"cache_salt\":%}", "{}", 1},
    /* not cache_salt: other keys that merely look alike */
    {"{\"cache_salt \":1}", "{\"cache_salt \":1,\"cache_salt\":%}", "{\"cache_salt \":1}", 0},
    {"{\"Cache_salt\":1}", "{\"Cache_salt\":1,\"cache_salt\":%}", "{\"Cache_salt\":1}", 0},
    /* ("cache_salt\u0000" is refused: test_control_keys) */
    {"{\"cache\\/salt\":1}", "{\"cache\\/salt\":1,\"cache_salt\":%}", "{\"cache\\/salt\":1}", 0},
    /* any value type, nested ones untouched */
    {"{\"cache_salt\":{\"cache_salt\":[1,{\"a\":\"}\"}]},\"b\":null}",
     "{\"b\":null,\"cache_salt\":%}", "{\"b\":null}", 1},
    {"{\"cache_salt\":[],\"a\":{\"cache_salt\":\"keep\"}}",
     "{\"a\":{\"cache_salt\":\"keep\"},\"cache_salt\":%}", "{\"a\":{\"cache_salt\":\"keep\"}}", 1},
    {"{\"cache_salt\":null,\"x\":[{\"cache_salt\":1}]}",
     "{\"x\":[{\"cache_salt\":1}],\"cache_salt\":%}", "{\"x\":[{\"cache_salt\":1}]}", 1},
    {"{\"cache_salt\":true,\"a\":-1.5e3}", "{\"a\":-1.5e3,\"cache_salt\":%}", "{\"a\":-1.5e3}", 1},
    {"{\"cache_salt\":12345678901234567890123}", "{\"cache_salt\":%}", "{}", 1},
    /* a value that spells the key is just a value */
    {"{\"a\":\"cache_salt\"}", "{\"a\":\"cache_salt\",\"cache_salt\":%}", "{\"a\":\"cache_salt\"}",
     0},
};

/* Replace "%" in pattern by the JSON string of SALT. */
static void expand(const char *pattern, char *buf, size_t len)
{
    const char *pct = strchr(pattern, '%');
    if (!pct)
        snprintf(buf, len, "%s", pattern);
    else
        snprintf(buf, len, "%.*s\"%s\"%s", (int)(pct - pattern), pattern, SALT, pct + 1);
}

static void test_placements(void **state)
{
    (void)state;
    for (size_t i = 0; i < KVG_ARRAY_LEN(placements); i++) {
        const placement *c = &placements[i];
        char want[512];
        result r;
        run(&r, c->in, strlen(c->in), SALT);
        if (r.rc != 0)
            fail_msg("case %zu rejected: %s", i, r.err.message);
        expand(c->out_salted, want, sizeof(want));
        if (strcmp(r.out.data, want) != 0)
            fail_msg("case %zu: %s\n got  %s\n want %s", i, c->in, r.out.data, want);
        assert_int_equal(r.info.cache_salts_removed, c->removed);
        done(&r);

        run(&r, c->in, strlen(c->in), NULL);
        assert_int_equal(r.rc, 0);
        if (strcmp(r.out.data, c->out_unsalted) != 0)
            fail_msg("case %zu unsalted: %s\n got  %s\n want %s", i, c->in, r.out.data,
                     c->out_unsalted);
        assert_int_equal(r.info.cache_salts_removed, c->removed);
        done(&r);

        check_semantics(c->in, strlen(c->in), SALT);
        check_semantics(c->in, strlen(c->in), NULL);
    }
}

static void test_salt_is_escaped_and_output_appended(void **state)
{
    (void)state;
    /* A salt is base64url in practice; anything else is still written as a JSON string. */
    result r;
    run(&r, "{}", 2, "a\"b\\c\n");
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out.data, "{\"cache_salt\":\"a\\\"b\\\\c\\n\"}");
    done(&r);
    check_semantics("{\"cache_salt\":1}", 16, "q\"\x01");

    /* The output is appended to what the buffer holds. */
    kvg_arena a;
    kvg_buf out;
    kvg_arena_init(&a, 0);
    kvg_buf_init(&out);
    kvg_buf_puts(&out, "HEAD ");
    assert_int_equal(kvg_body_rewrite("{\"a\":1}", 7, "s", &a, &out, NULL, NULL), 0);
    assert_string_equal(out.data, "HEAD {\"a\":1,\"cache_salt\":\"s\"}");
    kvg_buf_done(&out);
    kvg_arena_done(&a);
}

/* ---- model, stream, prompt ------------------------------------------------------------------- */

static void test_info(void **state)
{
    (void)state;
    result r;
    const char *b = "{\"model\":\"llama-3\",\"stream\":true,\"prompt\":\"hello\",\"max_tokens\":5}";
    run(&r, b, strlen(b), SALT);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.info.model, "llama-3");
    assert_int_equal(r.info.model_len, 7);
    assert_true(r.info.stream);
    assert_int_equal(r.info.prompt_bytes, 7);
    assert_int_equal(r.info.cache_salts_removed, 0);
    done(&r);

    /* Escaped key and value; null model; stream false and null. */
    b = "{\"\\u006dodel\":\"a\\/b\\u00e9\\ud83d\\ude00\",\"stre\\u0061m\":false}";
    run(&r, b, strlen(b), NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.info.model, "a/b\xc3\xa9\xf0\x9f\x98\x80");
    assert_int_equal(r.info.model_len, 9);
    assert_false(r.info.stream);
    done(&r);
    b = "{\"model\":null,\"stream\":null}";
    run(&r, b, strlen(b), NULL);
    assert_int_equal(r.rc, 0);
    assert_null(r.info.model);
    assert_int_equal(r.info.model_len, 0);
    assert_false(r.info.stream);
    done(&r);
    run(&r, "{}", 2, NULL);
    assert_int_equal(r.rc, 0);
    assert_null(r.info.model);
    assert_false(r.info.stream);
    assert_int_equal(r.info.prompt_bytes, 0);
    done(&r);
    b = "{\"model\":\"\"}";
    run(&r, b, strlen(b), NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.info.model, "");
    done(&r);

    /* prompt bytes: raw value lengths of prompt, messages, input and tools, however spelled;
     * nested ones and other keys do not count. */
    b = "{\"messages\": [{\"role\":\"user\",\"content\":\"hi\"}] ,\"tools\":[],"
        "\"input\":\"\\u0041\",\"pr\\u006fmpt\":[1,2,3],\"x\":{\"prompt\":\"no\"},"
        "\"instructions\":\"no\"}";
    run(&r, b, strlen(b), SALT);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.info.prompt_bytes, strlen("[{\"role\":\"user\",\"content\":\"hi\"}]") +
                                              strlen("[]") + strlen("\"\\u0041\"") +
                                              strlen("[1,2,3]"));
    done(&r);
}

typedef struct bad_case {
    const char *body;
    int rc;
    size_t offset;
    const char *msg; /* expected message prefix */
} bad_case;

static void test_types(void **state)
{
    (void)state;
    static const bad_case cases[] = {
        {"{\"model\":1}", KVG_ETYPE, 9, "model: must be a string or null, not a number"},
        {"{\"model\":true}", KVG_ETYPE, 9, "model: must be a string or null, not a boolean"},
        {"{\"model\":[\"m\"]}", KVG_ETYPE, 9, "model: must be a string or null, not an array"},
        {"{\"model\":{}}", KVG_ETYPE, 9, "model: must be a string or null, not an object"},
        {"{\"m\\u006fdel\": -0}", KVG_ETYPE, 15, "model: must be"},
        {"{\"model\":\"a\\u0000b\"}", KVG_ETYPE, 9, "model: must not contain NUL"},
        {"{\"model\":\"a\",\"model\":\"b\"}", KVG_ETYPE, 21, "model: appears more than once"},
        {"{\"model\":\"a\",\"\\u006dodel\":null}", KVG_ETYPE, 26, "model: appears more than once"},
        {"{\"stream\":1}", KVG_ETYPE, 10, "stream: must be a boolean or null, not a number"},
        {"{\"stream\":\"true\"}", KVG_ETYPE, 10, "stream: must be a boolean or null, not a string"},
        {"{\"stream\":[]}", KVG_ETYPE, 10, "stream: must be a boolean or null, not an array"},
        {"{\"stream\":true,\"stream\":false}", KVG_ETYPE, 24, "stream: appears more than once"},
        /* the first type error is the one reported */
        {"{\"stream\":0,\"model\":0}", KVG_ETYPE, 10, "stream:"},
        /* not an object at the top */
        {"[]", KVG_ETYPE, 0, "body: must be a JSON object"},
        {" \"{}\" ", KVG_ETYPE, 1, "body: must be a JSON object"},
        {"null", KVG_ETYPE, 0, "body: must be a JSON object"},
        {"12", KVG_ETYPE, 0, "body: must be a JSON object"},
        /* a body that is also invalid JSON gets the parse error */
        {"{\"model\":1,}", KVG_EPARSE, 11, "expected string key"},
        {"{\"stream\":\"x\"", KVG_EPARSE, 13, "unterminated object"},
        {"[1,]", KVG_EPARSE, 3, "unexpected character"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++) {
        const bad_case *c = &cases[i];
        result r;
        run(&r, c->body, strlen(c->body), SALT);
        if (r.rc != c->rc || r.err.offset != c->offset ||
            strncmp(r.err.message, c->msg, strlen(c->msg)) != 0)
            fail_msg("case %zu %s: got %d at %zu '%s', want %d at %zu '%s'", i, c->body, r.rc,
                     r.err.offset, r.err.message, c->rc, c->offset, c->msg);
        done(&r);
    }
    /* Nested and non-top-level model and stream members are not looked at. */
    const char *nested_members = "{\"x\":{\"model\":1,\"stream\":\"y\"},\"y\":[{\"model\":[]}]}";
    check_semantics(nested_members, strlen(nested_members), SALT);
}

/* ---- invalid JSON -----------------------------------------------------------------------------
 */

/* Rejections compared with common/json.c's parser: same code, same offset. */
static const bad_case invalid[] = {
    {"", KVG_EPARSE, 0, "unexpected end of input"},
    {"   ", KVG_EPARSE, 3, "unexpected end of input"},
    {"{", KVG_EPARSE, 1, "expected string key in object"},
    {"{\"a\"", KVG_EPARSE, 4, "expected ':' after object key"},
    {"{\"a\":", KVG_EPARSE, 5, "unexpected end of input"},
    {"{\"a\":1", KVG_EPARSE, 6, "unterminated object"},
    {"{\"a\" 1}", KVG_EPARSE, 5, "expected ':' after object key"},
    {"{\"a\":1 \"b\":2}", KVG_EPARSE, 7, "expected ',' or '}' in object"},
    {"{\"a\":1,}", KVG_EPARSE, 7, "expected string key in object"},
    {"{,}", KVG_EPARSE, 1, "expected string key in object"},
    {"{a:1}", KVG_EPARSE, 1, "expected string key in object"},
    {"{'a':1}", KVG_EPARSE, 1, "expected string key in object"},
    {"{\"a\":1}}", KVG_EPARSE, 7, "trailing characters after JSON value"},
    {"{\"a\":1} x", KVG_EPARSE, 8, "trailing characters after JSON value"},
    {"{}{}", KVG_EPARSE, 2, "trailing characters after JSON value"},
    {"{\"a\":[1,2}", KVG_EPARSE, 9, "expected ',' or ']' in array"},
    {"{\"a\":[1,]}", KVG_EPARSE, 8, "unexpected character"},
    {"{\"a\":[1", KVG_EPARSE, 7, "unterminated array"},
    {"{\"a\":{\"b\":1]}", KVG_EPARSE, 11, "expected ',' or '}' in object"},
    {"{\"a\":tru}", KVG_EPARSE, 5, "invalid literal"},
    {"{\"a\":nul", KVG_EPARSE, 5, "invalid literal"},
    {"{\"a\":True}", KVG_EPARSE, 5, "unexpected character"},
    {"{\"a\":NaN}", KVG_EPARSE, 5, "unexpected character"},
    {"{\"a\":Infinity}", KVG_EPARSE, 5, "unexpected character"},
    {"{\"a\":-Infinity}", KVG_EPARSE, 6, "invalid number"},
    {"{\"a\":01}", KVG_EPARSE, 6, "expected ',' or '}' in object"},
    {"{\"a\":-}", KVG_EPARSE, 6, "invalid number"},
    {"{\"a\":-", KVG_EPARSE, 6, "truncated number"},
    {"{\"a\":+1}", KVG_EPARSE, 5, "unexpected character"},
    {"{\"a\":.5}", KVG_EPARSE, 5, "unexpected character"},
    {"{\"a\":1.}", KVG_EPARSE, 7, "digit expected after decimal point"},
    {"{\"a\":1.e5}", KVG_EPARSE, 7, "digit expected after decimal point"},
    {"{\"a\":1e}", KVG_EPARSE, 7, "digit expected in exponent"},
    {"{\"a\":1e+}", KVG_EPARSE, 8, "digit expected in exponent"},
    {"{\"a\":0x10}", KVG_EPARSE, 6, "expected ',' or '}' in object"},
    {"{\"a\":\"x}", KVG_EPARSE, 8, "unterminated string"},
    {"{\"a\":\"x\\", KVG_EPARSE, 7, "unterminated string"},
    {"{\"a\":\"\t\"}", KVG_EPARSE, 6, "control character in string"},
    {"{\"a\":\"\n\"}", KVG_EPARSE, 6, "control character in string"},
    {"{\"a\":\"\\x\"}", KVG_EPARSE, 7, "invalid escape in string"},
    {"{\"a\":\"\\'\"}", KVG_EPARSE, 7, "invalid escape in string"},
    {"{\"a\":\"\\u12\"}", KVG_EPARSE, 8, "bad hex digit in \\u escape"},
    {"{\"a\":\"\\u12", KVG_EPARSE, 10, "unterminated string"},
    {"{\"a\":\"\\u1\"", KVG_EPARSE, 8, "truncated \\u escape"},
    /* escapes are checked after the string's end is found, as the parser does */
    {"{\"a\":\"\\x\n\"}", KVG_EPARSE, 8, "control character in string"},
    {"{\"a\":\"\\\xc3\xa9\"}", KVG_EPARSE, 8, "invalid UTF-8 in string"},
    {"{\"a\":\"\\uD800\\u12\"}", KVG_EPARSE, 12, "unpaired surrogate in \\u escape"},
    {"{\"a\":\"\\uD800\"}", KVG_EPARSE, 12, "unpaired surrogate in \\u escape"},
    {"{\"a\":\"\\uDC00\"}", KVG_EPARSE, 12, "unpaired surrogate in \\u escape"},
    {"{\"a\":\"\\uD800\\n\"}", KVG_EPARSE, 12, "unpaired surrogate in \\u escape"},
    {"{\"a\":\"\\uD800\\uD800\"}", KVG_EPARSE, 18, "unpaired surrogate in \\u escape"},
    {"{\"a\":\"\\uD800\\u0041\"}", KVG_EPARSE, 18, "unpaired surrogate in \\u escape"},
    {"{\"a\":\"\\uD800\\uZZZZ\"}", KVG_EPARSE, 14, "bad hex digit in \\u escape"},
    {"{\"a\":\"\xff\"}", KVG_EPARSE, 6, "invalid UTF-8 in string"},
    {"{\"a\":\"\xc0\xaf\"}", KVG_EPARSE, 6, "invalid UTF-8 in string"},         /* overlong */
    {"{\"a\":\"\xe0\x80\xaf\"}", KVG_EPARSE, 6, "invalid UTF-8 in string"},     /* overlong */
    {"{\"a\":\"\xed\xa0\x80\"}", KVG_EPARSE, 6, "invalid UTF-8 in string"},     /* surrogate */
    {"{\"a\":\"\xf4\x90\x80\x80\"}", KVG_EPARSE, 6, "invalid UTF-8 in string"}, /* > U+10FFFF */
    {"{\"a\":\"\xe2\x82\"}", KVG_EPARSE, 6, "invalid UTF-8 in string"},         /* truncated */
    {"{\"a\":\"\x80\"}", KVG_EPARSE, 6, "invalid UTF-8 in string"},             /* lone cont. */
    {"{\"a\":\"0123456789abcdef\xf8\"}", KVG_EPARSE, 22, "invalid UTF-8 in string"},
    {"{\"\xff\":1}", KVG_EPARSE, 2, "invalid UTF-8 in string"},
    {"\xef\xbb\xbf{}", KVG_EPARSE, 0, "unexpected character"}, /* a BOM is not JSON */
    {"{\"a\":1,\"b\"\x0b:2}", KVG_EPARSE, 10, "expected ':' after object key"},
    {"{\"a\":\x0c 1}", KVG_EPARSE, 5, "unexpected character"},
    {"{\"cache_salt\":}", KVG_EPARSE, 14, "unexpected character"},
    {"{\"cache_salt\":1,}", KVG_EPARSE, 16, "expected string key in object"},
    {"{\"model\":\"m", KVG_EPARSE, 11, "unterminated string"},
    {"{\"model\":\"\\q\"}", KVG_EPARSE, 11, "invalid escape in string"},
    {"{\"stream\":tru}", KVG_EPARSE, 10, "invalid literal"},
};

static void test_invalid(void **state)
{
    (void)state;
    for (size_t i = 0; i < KVG_ARRAY_LEN(invalid); i++) {
        const bad_case *c = &invalid[i];
        size_t len = strlen(c->body);
        result r;
        run(&r, c->body, len, SALT);
        if (r.rc != c->rc || r.err.offset != c->offset ||
            strncmp(r.err.message, c->msg, strlen(c->msg)) != 0)
            fail_msg("case %zu %s: got %d at %zu '%s', want %d at %zu '%s'", i, c->body, r.rc,
                     r.err.offset, r.err.message, c->rc, c->offset, c->msg);
        done(&r);

        /* The JSON parser agrees, to the byte. */
        kvg_arena a;
        kvg_json *v;
        kvg_json_error err = {0};
        kvg_arena_init(&a, 0);
        int prc = kvg_json_parse(c->body, len, &a, NULL, &v, &err);
        if (prc != c->rc || err.offset != c->offset)
            fail_msg("case %zu %s: parser says %d at %zu '%s'", i, c->body, prc, err.offset,
                     err.message);
        kvg_arena_done(&a);
    }

    /* NUL bytes outside strings (inside one they are control characters, tested above). */
    result r;
    run(&r, "{\"a\":1}\0", 8, SALT);
    assert_int_equal(r.rc, KVG_EPARSE);
    assert_int_equal(r.err.offset, 7);
    done(&r);
    run(&r, "\0{}", 3, SALT);
    assert_int_equal(r.rc, KVG_EPARSE);
    assert_int_equal(r.err.offset, 0);
    done(&r);
    run(&r, "{\"a\":\"\0\"}", 9, SALT);
    assert_int_equal(r.rc, KVG_EPARSE);
    assert_string_equal(r.err.message, "control character in string");
    done(&r);
    run(&r, NULL, 0, SALT);
    assert_int_equal(r.rc, KVG_EPARSE);
    done(&r);
}

/* ---- depth ------------------------------------------------------------------------------------
 */

/* "{"a":" + n-1 nested arrays (+ a scalar inside when scalar) + closers: depth n or n+1. */
static char *nested(unsigned arrays, bool scalar, size_t *len)
{
    size_t cap = 16 + 2 * (size_t)arrays + 2;
    char *s = malloc(cap);
    if (!s)
        abort();
    size_t n = 5;
    memcpy(s, "{\"a\":", 5);
    for (unsigned i = 0; i < arrays; i++)
        s[n++] = '[';
    if (scalar)
        s[n++] = '7';
    for (unsigned i = 0; i < arrays; i++)
        s[n++] = ']';
    s[n++] = '}';
    s[n] = '\0';
    *len = n;
    return s;
}

static void test_depth(void **state)
{
    (void)state;
    /* The object is depth 1, its member values depth 2: 63 arrays reach 64. */
    size_t len;
    char *s = nested(63, false, &len);
    result r;
    run(&r, s, len, SALT);
    assert_int_equal(r.rc, 0);
    done(&r);
    free(s);

    s = nested(62, true, &len); /* the scalar is at 64 */
    run(&r, s, len, SALT);
    assert_int_equal(r.rc, 0);
    done(&r);
    free(s);

    s = nested(63, true, &len); /* the scalar is at 65 */
    run(&r, s, len, SALT);
    assert_int_equal(r.rc, KVG_ELIMIT);
    assert_int_equal(r.err.offset, 5 + 63);
    assert_string_equal(r.err.message, "nesting too deep");
    done(&r);
    free(s);

    s = nested(64, false, &len);
    run(&r, s, len, SALT);
    assert_int_equal(r.rc, KVG_ELIMIT);
    done(&r);
    free(s);

    /* Far too deep: no recursion, so no stack to exhaust. */
    s = nested(1000000, true, &len);
    run(&r, s, len, SALT);
    assert_int_equal(r.rc, KVG_ELIMIT);
    assert_int_equal(r.err.offset, 5 + 63);
    done(&r);
    free(s);

    /* Objects count like arrays; a non-object body too. */
    char buf[1024];
    size_t n = 0;
    for (int i = 0; i < 64; i++)
        n += (size_t)sprintf(buf + n, "{\"k\":");
    n += (size_t)sprintf(buf + n, "{}");
    for (int i = 0; i < 64; i++)
        buf[n++] = '}';
    run(&r, buf, n, SALT); /* the innermost {} is at 65 */
    assert_int_equal(r.rc, KVG_ELIMIT);
    done(&r);
    run(&r, buf + 5, n - 6, SALT); /* 64: fine */
    assert_int_equal(r.rc, 0);
    done(&r);
    memset(buf, '[', 65);
    memset(buf + 65, ']', 65);
    run(&r, buf, 130, SALT);
    assert_int_equal(r.rc, KVG_ELIMIT);
    done(&r);
    run(&r, buf + 1, 128, SALT);
    assert_int_equal(r.rc, KVG_ETYPE);
    done(&r);
}

/* ---- allocation failures ------------------------------------------------------------------ */

static void test_alloc_failures(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"m\\u00e9\",\"cache_salt\":1,\"prompt\":\"p\",\"x\":[1,{}]}";
    bool injected = true;
    for (long n = 0; injected; n++) {
        kvg_arena a;
        kvg_buf out;
        kvg_body_info info;
        kvg_json_error err;
        kvg_arena_init(&a, 0);
        kvg_buf_init(&out);
        fail_alloc_nth(n);
        int rc = kvg_body_rewrite(b, strlen(b), SALT, &a, &out, &info, &err);
        injected = fail_alloc_off();
        if (injected) {
            assert_int_equal(rc, -ENOMEM);
            assert_string_equal(err.message, "out of memory");
        } else {
            assert_int_equal(rc, 0);
            assert_string_equal(info.model, "m\xc3\xa9");
        }
        kvg_buf_done(&out);
        kvg_arena_done(&a);
    }

    /* An arena limit counts like a failed allocation. */
    kvg_arena a;
    kvg_buf out;
    kvg_arena_init(&a, 0);
    a.limit = 16;
    kvg_buf_init(&out);
    char big[64];
    snprintf(big, sizeof(big), "{\"model\":\"%040d\"}", 0);
    assert_int_equal(kvg_body_rewrite(big, strlen(big), NULL, &a, &out, NULL, NULL), -ENOMEM);
    kvg_buf_done(&out);
    kvg_arena_done(&a);

    /* A buffer that already failed stays failed. */
    kvg_arena_init(&a, 0);
    kvg_buf_init(&out);
    out.failed = true;
    assert_int_equal(kvg_body_rewrite("{}", 2, NULL, &a, &out, NULL, NULL), -ENOMEM);
    kvg_buf_done(&out);
    kvg_arena_done(&a);
}

/* ---- seeded mutation run against the JSON parser -------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    /* xorshift64*: deterministic, so a failure reproduces. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static const char *const fragments[] = {
    "\"cache_salt\"",
    "\"\\u0063ache_salt\"",
    "\"model\"",
    "\"stream\"",
    "\"prompt\"",
    "\"messages\"",
    "\"a\"",
    "\"\\ud83d\\ude00\"",
    "\"\\u00e9\"",
    "\"\xc3\xa9\"",
    "\"\\\"\"",
    "\"x\\\\\"",
    "true",
    "false",
    "null",
    "0",
    "-1.5e+10",
    "123456789012345678901234567890",
    "[]",
    "{}",
    "[1,2]",
    "{\"cache_salt\":1}",
    ",",
    ":",
    "{",
    "}",
    "[",
    "]",
    " ",
    "\n",
    "\"\\uD800\"",
    "\"\\uDC00\"",
    "\xff",
    "\xed\xa0\x80",
    "\"\\x\"",
    "tru",
    "-",
    "1.",
    "\"",
};

/* A random body: mostly object-shaped token soup, so that both valid and invalid ones appear. */
static size_t random_body(char *buf, size_t cap)
{
    size_t n = 0;
    buf[n++] = '{';
    unsigned members = (unsigned)(rnd() % 6);
    for (unsigned m = 0; m < members; m++) {
        const char *parts[4];
        parts[0] = fragments[rnd() % 7];
        parts[1] = ":";
        parts[2] = fragments[7 + rnd() % 14];
        parts[3] = m + 1 < members ? "," : "";
        for (int k = 0; k < 4; k++) {
            size_t l = strlen(parts[k]);
            if (n + l + 2 >= cap)
                break;
            memcpy(buf + n, parts[k], l);
            n += l;
        }
    }
    buf[n++] = '}';
    /* A few mutations: replace, insert or delete a fragment or a byte. */
    unsigned muts = (unsigned)(rnd() % 3);
    for (unsigned i = 0; i < muts && n > 0; i++) {
        size_t at = (size_t)(rnd() % n);
        switch (rnd() % 3) {
        case 0:
            buf[at] = (char)(rnd() & 0xff);
            break;
        case 1:
            memmove(buf + at, buf + at + 1, n - at - 1);
            n--;
            break;
        default: {
            const char *f = fragments[rnd() % KVG_ARRAY_LEN(fragments)];
            size_t l = strlen(f);
            if (n + l < cap) {
                memmove(buf + at + l, buf + at, n - at);
                memcpy(buf + at, f, l);
                n += l;
            }
            break;
        }
        }
    }
    return n;
}

static void test_mutations_agree_with_parser(void **state)
{
    (void)state;
    char buf[1024];
    unsigned accepted = 0, rejected = 0;
    for (int iter = 0; iter < 200000; iter++) {
        size_t len = random_body(buf, sizeof(buf));
        result r;
        run(&r, buf, len, SALT);
        kvg_arena a;
        kvg_json *v;
        kvg_json_error err = {0};
        kvg_arena_init(&a, 0);
        int prc = kvg_json_parse(buf, len, &a, NULL, &v, &err);
        kvg_arena_done(&a);
        if (r.rc == KVG_ETYPE) {
            if (prc != 0)
                fail_msg("iteration %d: type error on a body the parser rejects: %.*s", iter,
                         (int)len, buf);
        } else if (r.rc != prc || (prc != 0 && r.err.offset != err.offset)) {
            fail_msg("iteration %d: rewriter %d at %zu (%s), parser %d at %zu (%s): %.*s", iter,
                     r.rc, r.err.offset, r.err.message, prc, err.offset, err.message, (int)len,
                     buf);
        }
        done(&r);
        if (prc == 0 && r.rc == 0) {
            accepted++;
            check_semantics(buf, len, SALT);
            if (iter % 4 == 0)
                check_semantics(buf, len, NULL);
        } else {
            rejected++;
        }
    }
    /* The generator must exercise both sides. */
    assert_true(accepted > 10000);
    assert_true(rejected > 10000);
}

/* ---- the canonical prefix stream (kvg_body_scan) ----------------------------------------------
 */

#define RS "\x1e"
#define US "\x1f"
#define GS "\x1d"
#define FS "\x1c"

static int scan(result *r, const char *body, kvg_body_api api)
{
    kvg_arena_init(&r->arena, 0);
    kvg_buf_init(&r->out);
    memset(&r->info, 0xAB, sizeof(r->info));
    memset(&r->err, 0, sizeof(r->err));
    r->rc = kvg_body_scan(body, strlen(body), api, SALT, &r->arena, &r->out, &r->info, &r->err);
    return r->rc;
}

typedef struct text_case {
    const char *body;
    const char *want; /* NULL: empty stream */
    size_t want_len;  /* for wants holding NUL; 0: strlen */
} text_case;

static void check_text(const char *body, kvg_body_api api, const char *want, size_t want_len)
{
    result r;
    if (scan(&r, body, api) != 0)
        fail_msg("rejected (%s at %zu): %s", r.err.message, r.err.offset, body);
    size_t n = want ? (want_len ? want_len : strlen(want)) : 0;
    assert_false(r.info.prefix.is_tokens);
    if (r.info.prefix.text_len != n || (n && memcmp(r.info.prefix.text, want, n) != 0))
        fail_msg("body %s\n got  %.*s (%zu bytes)\n want %.*s (%zu bytes)", body,
                 (int)r.info.prefix.text_len, (const char *)r.info.prefix.text,
                 r.info.prefix.text_len, (int)n, want ? want : "", n);
    /* The forwarded body is what kvg_body_rewrite makes of it. */
    result plain;
    run(&plain, body, strlen(body), SALT);
    assert_int_equal(plain.rc, 0);
    assert_int_equal(plain.out.len, r.out.len);
    assert_memory_equal(plain.out.data, r.out.data, r.out.len);
    /* Scanning the output again gives the same stream. */
    result again;
    assert_int_equal(scan(&again, r.out.data, api), 0);
    assert_int_equal(again.info.prefix.text_len, n);
    if (n)
        assert_memory_equal(again.info.prefix.text, want, n);
    done(&again);
    done(&plain);
    done(&r);
}

/* ---- control characters in keys ------------------------------------------------------------- */

typedef struct key_case {
    kvg_body_api api;
    const char *body;
    const char *key; /* the bad key as spelled in the body, quotes included: gives the offset */
    const char *msg; /* the whole message */
} key_case;

/* Every path into the body (kvg_body_scan, its plan, and kvg_body_rewrite for OTHER) refuses it
 * with the same error. */
static void check_key_case(const key_case *c)
{
    size_t len = strlen(c->body), want_off = (size_t)(strstr(c->body, c->key) - c->body);
    for (int how = 0; how < 3; how++) {
        if (how == 2 && c->api != KVG_BODY_API_OTHER)
            break;
        kvg_arena a;
        kvg_buf out;
        kvg_body_plan plan;
        kvg_json_error err = {0};
        kvg_arena_init(&a, 0);
        kvg_buf_init(&out);
        int rc = how == 0   ? kvg_body_scan(c->body, len, c->api, SALT, &a, &out, NULL, &err)
                 : how == 1 ? kvg_body_scan_plan(c->body, len, c->api, NULL, &a, &plan, NULL, &err)
                            : kvg_body_rewrite(c->body, len, SALT, &a, &out, NULL, &err);
        if (rc != KVG_ETYPE || err.offset != want_off || strcmp(err.message, c->msg) != 0)
            fail_msg("%s (api %s, way %d): rc %d \"%s\" at %zu, want \"%s\" at %zu", c->body,
                     kvg_body_api_str(c->api), how, rc, err.message, err.offset, c->msg, want_off);
        kvg_buf_done(&out);
        kvg_arena_done(&a);
    }
}

/* A key holding a control character (Unicode Cc), however spelled and wherever it is, is a
 * type error that names it and the object holding it; other keys, escaped or not, pass. */
static void test_control_keys(void **state)
{
    (void)state;
    const kvg_body_api O = KVG_BODY_API_OTHER, C = KVG_BODY_API_COMPLETIONS, H = KVG_BODY_API_CHAT;
    static const char top_msg[] = "body: key \"cache_salt\\u0000x\" holds a control character";
    const key_case cases[] = {
        /* the smuggled salt of issue 9, in every API */
        {O, "{\"model\":\"m\",\"cache_salt\\u0000x\":\"attacker\",\"prompt\":\"p\"}",
         "\"cache_salt\\u0000x\"", top_msg},
        {C, "{\"model\":\"m\",\"cache_salt\\u0000x\":\"attacker\",\"prompt\":\"p\"}",
         "\"cache_salt\\u0000x\"", top_msg},
        {H, "{\"model\":\"m\",\"messages\":[{\"role\":\"u\"}],\"cache_salt\\u0000x\":\"a\"}",
         "\"cache_salt\\u0000x\"", top_msg},
        /* each class: C0 as \u and as short escapes, DEL, C1, raw DEL and raw C1 */
        {O, "{\"a\\u001f\":1}", "\"a\\u001f\"", "body: key \"a\\u001f\" holds a control character"},
        {O, "{\"a\\n\":1}", "\"a\\n\"", "body: key \"a\\n\" holds a control character"},
        {O, "{\"\\t\":1}", "\"\\t\"", "body: key \"\\t\" holds a control character"},
        {O, "{\"ok\":1,\"a\\u007F\":1}", "\"a\\u007F\"",
         "body: key \"a\\u007F\" holds a control character"},
        {O, "{\"a\\u0080\":1}", "\"a\\u0080\"", "body: key \"a\\u0080\" holds a control character"},
        {O, "{\"a\\u009f\":1}", "\"a\\u009f\"", "body: key \"a\\u009f\" holds a control character"},
        {O, "{\"a\x7f\":1}", "\"a\x7f\"", "body: key \"a\\u007f\" holds a control character"},
        {O, "{\"a\xc2\x85z\":1}", "\"a\xc2\x85z\"",
         "body: key \"a\\u0085z\" holds a control character"},
        {O, "{\"\xc3\xa9\xf0\x9f\x98\x80\\u0001\":1}", "\"\xc3\xa9",
         "body: key \"\\u00e9\\ud83d\\ude00\\u0001\" holds a control character"},
        /* a long key or path is cut, never inside an escape */
        {O, "{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\\u0000\":1}", "\"aaaa",
         "body: key \"aaaaaaaaaaaaaaaaaaaaaaaa...\" holds a control character"},
        {O, "{\"aaaaaaaaaaaaaaaaaaaaaa\\u0000\":1}", "\"aaaa",
         "body: key \"aaaaaaaaaaaaaaaaaaaaaa...\" holds a control character"},
        {O, "{\"aaaaaaaaaaaaaaaaaaaa\\u0000\":1}", "\"aaaa",
         "body: key \"aaaaaaaaaaaaaaaaaaaa\\u0000\" holds a control character"},
        {O, "{\"x\":{\"abcdefghijklmnopqrstuvwxyz\":{\"b\":[{\"\\u0000\":1}]}}}", "\"\\u0000\"",
         "x.abcdefghijklmnopqrstuvwxyz....: key \"\\u0000\" holds a control character"},
        {H,
         "{\"tools\":[{\"type\":\"function\",\"function\":{\"parameters\":{\"properties\":"
         "{\"q\\u0000\":{}}}}}]}",
         "\"q\\u0000\"",
         "tools[0].function.parameters....: key \"q\\u0000\" holds a control character"},
        /* every level, and each scanner that reads keys */
        {O, "{\"x\":{\"y\":[0,{\"k\\u0000\":1}]}}", "\"k\\u0000\"",
         "x.y[1]: key \"k\\u0000\" holds a control character"},
        {O, "{\"messages\":[{\"role\":\"u\",\"x\\u0000\":1}]}", "\"x\\u0000\"",
         "messages[0]: key \"x\\u0000\" holds a control character"},
        {H, "{\"messages\":[{\"role\":\"u\"},{\"role\":\"u\"},{\"role\":\"u\",\"x\\u0000\":1}]}",
         "\"x\\u0000\"", "messages[2]: key \"x\\u0000\" holds a control character"},
        {H,
         "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
         "{\"type\":\"text\",\"text\":\"b\",\"\\u0000\":1}]}]}",
         "\"\\u0000\"", "messages[0].content[1]: key \"\\u0000\" holds a control character"},
        {H,
         "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
         "{\"url\":\"u\",\"d\\u0085\":1}}]}]}",
         "\"d\\u0085\"",
         "messages[0].content[0].image_url: key \"d\\u0085\" holds a control character"},
        {H,
         "{\"messages\":[{\"role\":\"u\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
         "\"\\u0000\":1}}]}]}",
         "\"\\u0000\"",
         "messages[0].tool_calls[0].fun...: key \"\\u0000\" holds a control character"},
        {H, "{\"messages\":[{\"role\":\"u\",\"metadata\":{\"a\":{\"b\\u0000\":1}}}]}",
         "\"b\\u0000\"", "messages[0].metadata.a: key \"b\\u0000\" holds a control character"},
        {C, "{\"prompt\":[{\"a\\u0000\":1}]}", "\"a\\u0000\"",
         "prompt[0]: key \"a\\u0000\" holds a control character"},
        /* the first type error in the body is the one reported */
        {O, "{\"a\\u0000\":1,\"model\":1}", "\"a\\u0000\"",
         "body: key \"a\\u0000\" holds a control character"},
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(cases); i++)
        check_key_case(&cases[i]);

    result r;
    /* ... and a type error before the key wins; a parse error anywhere wins over both */
    scan(&r, "{\"model\":1,\"a\\u0000\":1}", O);
    assert_int_equal(r.rc, KVG_ETYPE);
    assert_string_equal(r.err.message, "model: must be a string or null, not a number");
    done(&r);
    scan(&r, "{\"a\\u0000\":1,}", O);
    assert_int_equal(r.rc, KVG_EPARSE);
    assert_int_equal(r.err.offset, 13);
    done(&r);

    /* Harmless keys: escaped spellings of plain characters, the neighbours of the control
     * ranges, NBSP raw and escaped, an astral character; cache_salt spelled with an escape is
     * still found and removed. Control characters in values are not this rule's concern. */
    static const char *const fine[] = {
        "{\"\\u0063ache_salt\":\"mine\",\"a\\u0020b\":1}",
        "{\"\\u007e\":1,\"\\u00a0\":2,\"\xc2\xa0\":3,\"\xc2\xbf\":4,\"\\ud83d\\ude00\":5}",
        "{\"\\u2028\":1,\"\\ufeff\":2,\"x\":{\"\\\"\\\\\\/\":3}}",
        "{\"a\":\"\\u0000\\u007f\x7f\xc2\x85\\n\",\"b\":[\"\\u0085\"]}",
    };
    for (size_t i = 0; i < KVG_ARRAY_LEN(fine); i++) {
        assert_int_equal(scan(&r, fine[i], H), 0);
        done(&r);
        check_semantics(fine[i], strlen(fine[i]), SALT);
    }
    run(&r, fine[0], strlen(fine[0]), SALT);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.info.cache_salts_removed, 1);
    char want[128];
    expand("{\"a\\u0020b\":1,\"cache_salt\":%}", want, sizeof(want));
    assert_string_equal(r.out.data, want);
    done(&r);
}

/* Keys go through the block scanner too: a control character at any position of a key that
 * spans several blocks is found there, raw or escaped, in the body's first key or a nested
 * one, and a harmless character there passes. */
static void test_control_keys_every_position(void **state)
{
    (void)state;
    static const struct {
        const char *ins;
        bool bad;
    } inserts[] = {{"\x7f", true},     {"\xc2\x80", true}, {"\xc2\x9f", true},
                   {"\\u0000", true},  {"\\r", true},      {"\xc2\xa0", false},
                   {"\\u00a0", false}, {"~", false},       {"\xe6\x97\xa5", false}};
    char body[320], key[256];
    for (size_t k = 0; k < KVG_ARRAY_LEN(inserts); k++) {
        for (size_t at = 0; at <= 70; at++) {
            for (int nested = 0; nested < 2; nested++) {
                snprintf(key, sizeof(key), "%.*s%s%.*s", (int)at,
                         "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz",
                         inserts[k].ins, (int)(70 - at),
                         "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGHIJKLMNOPQRSTU"
                         "VWXYZ");
                snprintf(body, sizeof(body), nested ? "{\"m\":[{\"%s\":1}]}" : "{\"%s\":1}", key);
                result r;
                scan(&r, body, KVG_BODY_API_CHAT);
                if (r.rc != (inserts[k].bad ? KVG_ETYPE : 0) ||
                    (inserts[k].bad && r.err.offset != (nested ? 7u : 1u)))
                    fail_msg("%s: rc %d (%s at %zu)", body, r.rc, r.err.message, r.err.offset);
                done(&r);
            }
        }
    }
}

static void test_scan_completions(void **state)
{
    (void)state;
    static const text_case cases[] = {
        {"{\"prompt\":\"Say hi\"}", "Say hi", 0},
        {"{\"prompt\":\"a\\u00e9\\n\\\"\\/\\ud83d\\ude00\"}", "a\xc3\xa9\n\"/\xf0\x9f\x98\x80", 0},
        {"{\"prompt\":\"nul\\u0000byte\"}", "nul\0byte", 8},
        {"{\"prompt\":\"\"}", NULL, 0},
        {"{\"prompt\":null}", NULL, 0},
        {"{\"model\":\"m\"}", NULL, 0},
        /* the batch goes to one worker, routed by its first prompt */
        {"{\"prompt\":[\"first\",\"second\"]}", "first", 0},
        {"{ \"prompt\" : [ \"f\\u0069rst\" , \"x\" ] }", "first", 0},
        /* chat members mean nothing here */
        {"{\"messages\":5,\"tools\":{},\"prompt\":\"p\"}", "p", 0},
        {"{\"pr\\u006fmpt\":\"escaped key\"}", "escaped key", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_text(cases[i].body, KVG_BODY_API_COMPLETIONS, cases[i].want, cases[i].want_len);
}

static void check_tokens(const char *body, const uint32_t *want, size_t n)
{
    result r;
    if (scan(&r, body, KVG_BODY_API_COMPLETIONS) != 0)
        fail_msg("rejected (%s at %zu): %s", r.err.message, r.err.offset, body);
    assert_true(r.info.prefix.is_tokens);
    assert_int_equal(r.info.prefix.ntokens, n);
    assert_memory_equal(r.info.prefix.tokens, want, n * sizeof(uint32_t));
    assert_int_equal(r.info.prefix.text_len, 0);
    done(&r);
}

static void test_scan_tokens(void **state)
{
    (void)state;
    static const uint32_t a[] = {1, 2, 4294967295u, 0, 0};
    check_tokens("{\"prompt\":[1,2,4294967295,0,-0]}", a, 5);
    check_tokens("{\"prompt\":[ 1 ,\n2,\t4294967295 , 0,-0 ] }", a, 5);
    static const uint32_t b[] = {5, 6};
    check_tokens("{\"prompt\":[[5,6],[7],[8,9,10]]}", b, 2);
    check_tokens("{\"prompt\":[[5,6]]}", b, 2);
    static const uint32_t c[] = {42};
    check_tokens("{\"prompt\":[42]}", c, 1);
}

static void test_scan_chat(void **state)
{
    (void)state;
    static const text_case cases[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", RS "user" US "hi" GS, 0},
        /* name, null content, tool calls as canonical JSON, a tool answer */
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
         "{\"role\":\"user\",\"name\":\"bob\",\"content\":\"Hi \\\"you\\\"\\n\"},"
         "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
         "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}}]},"
         "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}]}",
         RS "system" US "Be brief." GS RS "user" US "name=bob" US "Hi \"you\"\n" GS RS
            "assistant" US US "tool_calls=[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
            "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}}]" GS RS "tool" US "42" US
            "tool_call_id=c1" GS,
         0},
        /* tools go first whatever the member order; whitespace goes, numbers stay as written */
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}], \"tools\" : [ {\"type\":"
         "\"function\", \"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\","
         "\"properties\":{ }}}} , 1.5e2, -0, true, null, [ ] ]}",
         RS "tools" US "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":"
            "{\"type\":\"object\",\"properties\":{}}}},1.5e2,-0,true,null,[]]" GS RS "user" US
            "q" GS,
         0},
        {"{\"tools\":[],\"messages\":[{\"role\":\"u\"}]}", RS "tools" US "[]" GS RS "u" US GS, 0},
        /* strings in canonical JSON: escapes decoded, re-escaped minimally */
        {"{\"tools\":[{\"a\\u0062\":\"\\u0022\\/\\u0001\\b\\u00e9\\ud83d\\ude00\\u001F\\\\\"}]}",
         RS "tools" US "[{\"ab\":\"\\\"/\\u0001\\b\xc3\xa9\xf0\x9f\x98\x80\\u001f\\\\\"}]" GS, 0},
        /* parts: text parts joined by a newline, media as digests */
        {"{\"messages\":[{\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"text\":\"b\","
         "\"type\":\"text\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x\","
         "\"detail\":\"low\"}},{\"type\":\"text\",\"text\":\"c\"}],\"role\":\"user\"}]}",
         RS "user" US "a\nb" FS "image:d97939f939e715b1c86562d5fa9734a4" FS "c" GS, 0},
        {"{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":"
         "{\"format\":\"wav\",\"data\":\"AAAA\"}},{\"type\":\"file\",\"file\":{\"filename\":\"a\","
         "\"file_id\":\"file-1\",\"file_data\":\"zz\"}},{\"type\":\"file\",\"file\":{\"file_data\":"
         "\"data:x\"}},{\"video_url\":{\"url\":\"http:\\/\\/v\"},\"type\":\"video_url\"}]}]}",
         RS "u" US FS "input_audio:4a304154487284efd582166935acd8a2" FS FS
            "file:159d83a9268eb8646b16108b366954b4" FS FS
            "file:59c3eec0f5d2519036a0cea7dc80e444" FS FS
            "video_url:1df6a81184d8308a1aaf7af767e1c446" FS GS,
         0},
        /* the digest is of the decoded reference */
        {"{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
         "{\"url\":\"\\u0022\\/\"}}]}]}",
         RS "u" US FS "image:3dde18eeb84af755342722d5a13c144c" FS GS, 0},
        /* members in any order, escaped keys, ignored members */
        {"{\"messages\":[{\"content\":\"c\",\"tool_call_id\":\"t\",\"name\":\"n\",\"role\":\"r\","
         "\"reasoning_content\":\"ignored\"}]}",
         RS "r" US "name=n" US "c" US "tool_call_id=t" GS, 0},
        {"{\"tools\":null,\"messages\":[{\"\\u0072ole\":\"u\",\"c\\u006fntent\":\"x\\u0041\","
         "\"name\":null,\"tool_calls\":null,\"tool_call_id\":null}]}",
         RS "u" US "xA" GS, 0},
        {"{\"messages\":[{\"role\":\"u\",\"content\":[]},{\"role\":\"\",\"content\":[{\"type\":"
         "\"t\\u0065xt\",\"t\\u0065xt\":\"\"},{\"type\":\"text\",\"text\":\"\"}]}]}",
         RS "u" US GS RS US "\n" GS, 0},
        {"{\"model\":\"m\"}", NULL, 0},
        /* completions members mean nothing here */
        {"{\"prompt\":5,\"messages\":[{\"role\":\"u\"}]}", RS "u" US GS, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_text(cases[i].body, KVG_BODY_API_CHAT, cases[i].want, cases[i].want_len);
}

/* Whitespace and the spelling of escapes do not change the stream. */
static void test_scan_spellings(void **state)
{
    (void)state;
    static const char *const same[] = {
        "{\"tools\":[{\"n\":\"\xc3\xa9/\"}],\"messages\":[{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"A\\n\"}]}]}",
        " {\n  \"tools\" : [ { \"n\" : \"\\u00e9\\/\" } ] ,\n  \"messages\" : [\n    {\n      "
        "\"role\" : \"user\" ,\n      \"content\" : [ { \"type\" : \"text\" , \"text\" : "
        "\"\\u0041\\u000a\" } ]\n    }\n  ]\n}\n",
        "{\"messages\":[{\"content\":[{\"text\":\"\\u0041\\u000A\",\"type\":\"\\u0074ext\"}],"
        "\"r\\u006fle\":\"\\u0075ser\"}],\"t\\u006fols\":[{\"\\u006e\":\"\\u00E9/\"}]}",
    };
    const char *want = RS "tools" US "[{\"n\":\"\xc3\xa9/\"}]" GS RS "user" US "A\n" GS;
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
        check_text(same[i], KVG_BODY_API_CHAT, want, 0);
}

typedef struct scan_bad_case {
    kvg_body_api api;
    const char *body;
    int rc;
    size_t offset;
    const char *msg; /* the whole message */
} scan_bad_case;

static void test_scan_types(void **state)
{
    (void)state;
    const kvg_body_api C = KVG_BODY_API_COMPLETIONS, H = KVG_BODY_API_CHAT;
    static const char tok[] = "must be a token id (an integer from 0 to 4294967295)";
    char m1[96], m2[96], m3[96], m4[96];
    snprintf(m1, sizeof(m1), "prompt[1]: %s", tok);
    snprintf(m2, sizeof(m2), "prompt[2]: %s, not a string", tok);
    snprintf(m3, sizeof(m3), "prompt[0][1]: %s", tok);
    snprintf(m4, sizeof(m4), "prompt[1]: %s, not an array", tok);
    const scan_bad_case cases[] = {
        {C, "{\"prompt\":1}", KVG_ETYPE, 10, "prompt: must be a string or an array, not a number"},
        {C, "{\"prompt\":{}}", KVG_ETYPE, 10,
         "prompt: must be a string or an array, not an object"},
        {C, "{\"prompt\":[]}", KVG_ETYPE, 10, "prompt: must not be empty"},
        {C, "{\"prompt\":[ ]}", KVG_ETYPE, 10, "prompt: must not be empty"},
        {C, "{\"prompt\":[1,2.0]}", KVG_ETYPE, 13, m1},
        {C, "{\"prompt\":[1,1e2]}", KVG_ETYPE, 13, m1},
        {C, "{\"prompt\":[1,-1]}", KVG_ETYPE, 13, m1},
        {C, "{\"prompt\":[1,4294967296]}", KVG_ETYPE, 13, m1},
        {C, "{\"prompt\":[1,99999999999999999999999]}", KVG_ETYPE, 13, m1},
        {C, "{\"prompt\":[1,2,\"x\"]}", KVG_ETYPE, 15, m2},
        {C, "{\"prompt\":[\"a\",\"b\",\"c\",7]}", KVG_ETYPE, 23,
         "prompt[3]: must be a string, not a number"},
        {C, "{\"prompt\":[null]}", KVG_ETYPE, 11,
         "prompt[0]: must be a string, a token id or an array of token ids, not null"},
        {C, "{\"prompt\":[[1,0.5]]}", KVG_ETYPE, 14, m3},
        {C, "{\"prompt\":[[1],[]]}", KVG_ETYPE, 15, "prompt[1]: must not be empty"},
        {C, "{\"prompt\":[[1],\"x\"]}", KVG_ETYPE, 15,
         "prompt[1]: must be an array of token ids, not a string"},
        {C, "{\"prompt\":[1,[2]]}", KVG_ETYPE, 13, m4},
        {C, "{\"prompt\":\"a\",\"pr\\u006fmpt\":\"a\"}", KVG_ETYPE, 28,
         "prompt: appears more than once"},
        /* a type error is reported only for valid JSON */
        {C, "{\"prompt\":1,}", KVG_EPARSE, 12, "expected string key in object"},
        {C, "{\"prompt\":[1,2.0}", KVG_EPARSE, 16, "expected ',' or ']' in array"},
        {C, "{\"prompt\":[1,\"\\x\"]}", KVG_EPARSE, 15, "invalid escape in string"},
        {H, "{\"messages\":{}}", KVG_ETYPE, 12, "messages: must be an array, not an object"},
        {H, "{\"messages\":null}", KVG_ETYPE, 12, "messages: must be an array, not null"},
        {H, "{\"messages\":[]}", KVG_ETYPE, 12, "messages: must not be empty"},
        {H, "{\"messages\":[{\"role\":\"u\"}],\"messages\":[{\"role\":\"u\"}]}", KVG_ETYPE, 38,
         "messages: appears more than once"},
        {H, "{\"messages\":[{\"role\":\"u\"},{\"role\":\"u\"},7]}", KVG_ETYPE, 39,
         "messages[2]: must be an object, not a number"},
        {H, "{\"messages\":[{\"content\":\"x\"}]}", KVG_ETYPE, 13, "messages[0].role: missing"},
        {H, "{\"messages\":[{\"role\":1}]}", KVG_ETYPE, 21,
         "messages[0].role: must be a string, not a number"},
        {H, "{\"messages\":[{\"role\":\"a\",\"r\\u006fle\":\"b\"}]}", KVG_ETYPE, 37,
         "messages[0].role: appears more than once"},
        {H, "{\"messages\":[{\"role\":\"a\",\"content\":1}]}", KVG_ETYPE, 35,
         "messages[0].content: must be a string, an array or null, not a number"},
        {H, "{\"messages\":[{\"role\":\"a\",\"content\":\"x\",\"content\":\"y\"}]}", KVG_ETYPE, 49,
         "messages[0].content: appears more than once"},
        {H, "{\"messages\":[{\"role\":\"a\",\"name\":1}]}", KVG_ETYPE, 32,
         "messages[0].name: must be a string or null, not a number"},
        {H, "{\"messages\":[{\"role\":\"a\",\"tool_call_id\":[]}]}", KVG_ETYPE, 40,
         "messages[0].tool_call_id: must be a string or null, not an array"},
        {H, "{\"messages\":[{\"role\":\"a\",\"tool_calls\":{}}]}", KVG_ETYPE, 38,
         "messages[0].tool_calls: must be an array or null, not an object"},
        {H, "{\"messages\":[{\"role\":\"a\",\"content\":[\"x\"]}]}", KVG_ETYPE, 36,
         "messages[0].content[0]: must be an object, not a string"},
        {H, "{\"messages\":[{\"role\":\"a\",\"content\":[{\"text\":\"x\"}]}]}", KVG_ETYPE, 36,
         "messages[0].content[0].type: missing"},
        {H, "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":1}]}]}", KVG_ETYPE, 44,
         "messages[0].content[0].type: must be a string, not a number"},
        {H,
         "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"text\",\"text\":\"\"},"
         "{\"type\":\"refusal\"}]}]}",
         KVG_ETYPE, 70, "messages[0].content[1].type: unknown part type"},
        {H, "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"text\"}]}]}", KVG_ETYPE, 36,
         "messages[0].content[0].text: missing"},
        {H, "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"text\",\"text\":null}]}]}",
         KVG_ETYPE, 58, "messages[0].content[0].text: must be a string, not null"},
        {H,
         "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"text\",\"text\":\"\","
         "\"text\":\"\"}]}]}",
         KVG_ETYPE, 68, "messages[0].content[0].text: appears more than once"},
        {H,
         "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
         "\"http://x\"}]}]}",
         KVG_ETYPE, 68, "messages[0].content[0].image_url: must be an object, not a string"},
        {H,
         "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
         "{}}]}]}",
         KVG_ETYPE, 68, "messages[0].content[0].image_url.url: missing"},
        {H,
         "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
         "{\"url\":1}}]}]}",
         KVG_ETYPE, 75, "messages[0].content[0].image_url.url: must be a string, not a number"},
        {H,
         "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"file\",\"file\":{\"filename\":"
         "\"f\"}}]}]}",
         KVG_ETYPE, 58, "messages[0].content[0].file: needs file_id or file_data"},
        {H,
         "{\"messages\":[{\"role\":\"a\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":"
         "{\"data\":\"\",\"data\":\"\"}}]}]}",
         KVG_ETYPE, 90, "messages[0].content[0].input_audio.data: appears more than once"},
        {H, "{\"tools\":{}}", KVG_ETYPE, 9, "tools: must be an array or null, not an object"},
        {H, "{\"tools\":[],\"tools\":[]}", KVG_ETYPE, 20, "tools: appears more than once"},
        {H, "{\"messages\":[{\"role\":\"a\"}],\"tools\":[1,]}", KVG_EPARSE, 38,
         "unexpected character"},
        /* the first type error is reported */
        {H, "{\"messages\":[{\"role\":1},{\"role\":2}],\"tools\":5}", KVG_ETYPE, 21,
         "messages[0].role: must be a string, not a number"},
        /* ... but the API says which members are checked at all */
        {KVG_BODY_API_OTHER, "{\"messages\":5,\"prompt\":{},\"tools\":1}", 0, 0, NULL},
        {C, "{\"messages\":5,\"tools\":1}", 0, 0, NULL},
        {H, "{\"prompt\":{},\"prompt\":[]}", 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const scan_bad_case *c = &cases[i];
        result r;
        scan(&r, c->body, c->api);
        if (r.rc != c->rc ||
            (c->msg && (strcmp(r.err.message, c->msg) != 0 || r.err.offset != c->offset)))
            fail_msg("%s: rc %d (want %d), \"%s\" at %zu (want \"%s\" at %zu)", c->body, r.rc,
                     c->rc, r.err.message, r.err.offset, c->msg ? c->msg : "", c->offset);
        done(&r);
    }
}

/* Bodies that stretch the bound on the stream: media parts (the stream is longer than their
 * JSON), token ids (4 bytes for 2), and escape-heavy strings. */
static void test_scan_bounds(void **state)
{
    (void)state;
    static const char *const parts[] = {
        "{\"type\":\"file\",\"file\":{\"file_id\":\"\"}}",
        "{\"type\":\"video_url\",\"video_url\":{\"url\":\"\"}}",
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"\"}}",
        "{\"type\":\"text\",\"text\":\"\"}",
    };
    for (size_t k = 0; k < sizeof(parts) / sizeof(parts[0]); k++) {
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_buf_puts(&b, "{\"messages\":[{\"role\":\"\",\"content\":[");
        for (int i = 0; i < 2000; i++)
            kvg_buf_printf(&b, "%s%s", i ? "," : "", parts[k]);
        kvg_buf_puts(&b, "]}]}");
        result r;
        assert_int_equal(scan(&r, b.data, KVG_BODY_API_CHAT), 0);
        assert_true(r.info.prefix.text_len <= b.len + b.len / 8 + 64);
        assert_true(r.info.prefix.text_len >= 2000);
        done(&r);
        kvg_buf_done(&b);
    }
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, "{\"prompt\":[0");
    for (int i = 1; i < 100000; i++)
        kvg_buf_puts(&b, ",0");
    kvg_buf_puts(&b, "]}");
    result r;
    assert_int_equal(scan(&r, b.data, KVG_BODY_API_COMPLETIONS), 0);
    assert_int_equal(r.info.prefix.ntokens, 100000);
    done(&r);
    kvg_buf_reset(&b);
    kvg_buf_puts(&b, "{\"tools\":[\"");
    for (int i = 0; i < 10000; i++)
        kvg_buf_puts(&b, "\\u0001\\\"\\/");
    kvg_buf_puts(&b, "\"],\"messages\":[{\"role\":\"\\u0000\"}]}");
    assert_int_equal(scan(&r, b.data, KVG_BODY_API_CHAT), 0);
    assert_true(r.info.prefix.text_len <= b.len);
    done(&r);
    kvg_buf_done(&b);
}

static void test_scan_alloc_failures(void **state)
{
    (void)state;
    /* Members out of order and tools after the messages (the scratch buffer), an escaped
     * media reference (its decoded copy), token ids. */
    static const struct {
        kvg_body_api api;
        const char *body;
    } bodies[] = {
        {KVG_BODY_API_CHAT, "{\"messages\":[{\"content\":[{\"type\":\"image_url\",\"image_url\":{"
                            "\"url\":\"\\u0041\"}}],"
                            "\"role\":\"u\"}],\"tools\":[{\"a\":1}]}"},
        {KVG_BODY_API_COMPLETIONS, "{\"prompt\":[[1,2],[3]]}"},
        {KVG_BODY_API_COMPLETIONS, "{\"prompt\":\"p\\u00e9\"}"},
    };
    for (size_t k = 0; k < sizeof(bodies) / sizeof(bodies[0]); k++) {
        const char *b = bodies[k].body;
        bool injected = true;
        size_t failures = 0;
        for (long n = 0; injected; n++) {
            kvg_arena a;
            kvg_buf out;
            kvg_body_info info;
            kvg_json_error err;
            kvg_arena_init(&a, 0);
            kvg_buf_init(&out);
            fail_alloc_nth(n);
            int rc = kvg_body_scan(b, strlen(b), bodies[k].api, SALT, &a, &out, &info, &err);
            injected = fail_alloc_off();
            if (injected) {
                assert_int_equal(rc, -ENOMEM);
                assert_string_equal(err.message, "out of memory");
                failures++;
            } else {
                assert_int_equal(rc, 0);
                assert_true(info.prefix.text_len > 0 || info.prefix.ntokens > 0);
            }
            kvg_buf_done(&out);
            kvg_arena_done(&a);
        }
        assert_true(failures >= 2); /* the output and the stream at least */
    }

    /* An arena limit counts like a failed allocation: the stream is bounded by the body. */
    kvg_arena a;
    kvg_buf out;
    kvg_arena_init(&a, 0);
    a.limit = 64;
    kvg_buf_init(&out);
    const char *b =
        "{\"messages\":[{\"role\":\"u\",\"content\":\"0123456789012345678901234567\"}]}";
    assert_int_equal(kvg_body_scan(b, strlen(b), KVG_BODY_API_CHAT, NULL, &a, &out, NULL, NULL),
                     -ENOMEM);
    kvg_buf_done(&out);
    kvg_arena_done(&a);
}

static void test_scan_api(void **state)
{
    (void)state;
    assert_string_equal(kvg_body_api_str(KVG_BODY_API_OTHER), "other");
    assert_string_equal(kvg_body_api_str(KVG_BODY_API_COMPLETIONS), "completions");
    assert_string_equal(kvg_body_api_str(KVG_BODY_API_CHAT), "chat");
    assert_string_equal(kvg_body_api_str(KVG_BODY_API_COUNT), "unknown");
    /* OTHER: no stream, the rewriter's output */
    result r;
    const char *b = "{\"prompt\":\"p\",\"messages\":[{\"role\":\"u\"}]}";
    assert_int_equal(scan(&r, b, KVG_BODY_API_OTHER), 0);
    assert_false(r.info.prefix.is_tokens);
    assert_int_equal(r.info.prefix.text_len, 0);
    assert_int_equal(r.info.prefix.ntokens, 0);
    done(&r);
    kvg_arena a;
    kvg_buf out;
    kvg_arena_init(&a, 0);
    kvg_buf_init(&out);
    assert_int_equal(kvg_body_scan("{}", 2, KVG_BODY_API_COUNT, NULL, &a, &out, NULL, NULL),
                     -EINVAL);
    kvg_buf_done(&out);
    kvg_arena_done(&a);
}

/* Long strings go through the 64-byte fast path: a special byte at any position of a
 * 300-byte string must be seen there (a control character rejected at its offset, an escape
 * or a multi-byte character accepted and kept), wherever it falls in the blocks. */
static void test_long_strings_every_position(void **state)
{
    (void)state;
    kvg_arena a;
    kvg_buf out;
    char body[400];
    static const char *const inserts[] = {"\x01", "\\n", "\xc3\xa9", "\\\"", "\\u00e9"};
    for (size_t kind = 0; kind < sizeof(inserts) / sizeof(inserts[0]); kind++) {
        for (size_t pos = 0; pos < 300; pos++) {
            const char *ins = inserts[kind];
            size_t ilen = strlen(ins);
            size_t n = 0;
            memcpy(body, "{\"k\":\"", 6);
            n = 6;
            memset(body + n, 'x', pos);
            n += pos;
            memcpy(body + n, ins, ilen);
            n += ilen;
            memset(body + n, 'y', 300 - pos);
            n += 300 - pos;
            memcpy(body + n, "\"}", 2);
            n += 2;
            kvg_arena_init(&a, 0);
            kvg_buf_init(&out);
            kvg_json_error err = {0};
            int rc = kvg_body_rewrite(body, n, NULL, &a, &out, NULL, &err);
            if (kind == 0) {
                assert_int_equal(rc, KVG_EPARSE);
                assert_int_equal(err.offset, 6 + pos);
            } else {
                assert_int_equal(rc, 0);
                assert_int_equal(out.len, n);
                assert_memory_equal(out.data, body, n);
            }
            kvg_buf_done(&out);
            kvg_arena_done(&a);
        }
    }
}

/* The prefix stream of a long prompt with one escape or multi-byte character at every position,
 * across the 16-, 64-byte and wide (AVX2) steps of the scanner: decoded while scanned, it must
 * be the plain runs around the decoded character, byte for byte. */
static void test_stream_every_position(void **state)
{
    (void)state;
    static const struct {
        const char *raw, *decoded;
    } inserts[] = {
        {"\\n", "\n"},
        {"\xc3\xa9", "\xc3\xa9"},
        {"\\\"", "\""},
        {"\\u00e9", "\xc3\xa9"},
        {"\\ud83d\\ude00", "\xf0\x9f\x98\x80"},
        {"\\/", "/"},
    };
    enum { LEN = 700 };
    char body[LEN + 64], want[LEN + 8];
    for (size_t kind = 0; kind < sizeof(inserts) / sizeof(inserts[0]); kind++) {
        size_t rlen = strlen(inserts[kind].raw), dlen = strlen(inserts[kind].decoded);
        for (size_t pos = 0; pos <= LEN; pos += pos < 140 ? 1 : 13) {
            size_t n = 0, w = 0;
            memcpy(body, "{\"prompt\":\"", 11), n = 11;
            for (size_t i = 0; i < pos; i++)
                body[n++] = want[w++] = (char)('a' + i % 23);
            memcpy(body + n, inserts[kind].raw, rlen), n += rlen;
            memcpy(want + w, inserts[kind].decoded, dlen), w += dlen;
            for (size_t i = pos; i < LEN; i++)
                body[n++] = want[w++] = (char)('A' + i % 19);
            memcpy(body + n, "\"}", 3);
            check_text(body, KVG_BODY_API_COMPLETIONS, want, w);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_long_strings_every_position),
        cmocka_unit_test(test_stream_every_position),
        cmocka_unit_test(test_salt_is_escaped_and_output_appended),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_mutations_agree_with_parser),
        cmocka_unit_test(test_scan_completions),
        cmocka_unit_test(test_scan_tokens),
        cmocka_unit_test(test_scan_chat),
        cmocka_unit_test(test_scan_spellings),
        cmocka_unit_test(test_scan_types),
        cmocka_unit_test(test_scan_bounds),
        cmocka_unit_test(test_scan_alloc_failures),
        cmocka_unit_test(test_scan_api),
        cmocka_unit_test(test_control_keys),
        cmocka_unit_test(test_control_keys_every_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
