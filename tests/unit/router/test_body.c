/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the request-body rewriter: salt removal and injection in every placement and
 * spelling, model/stream/prompt extraction, the same acceptance and error offsets as the JSON
 * parser, depth, allocation failures, and a seeded mutation run against the parser. */
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
    {"{\"cache_salt\\u0000\":1}", "{\"cache_salt\\u0000\":1,\"cache_salt\":%}",
     "{\"cache_salt\\u0000\":1}", 0},
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_salt_is_escaped_and_output_appended),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_mutations_agree_with_parser),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
