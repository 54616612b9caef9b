/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the request-body rewriter (router/body.c): salt removal and injection in every
 * placement and spelling, model/stream/prompt extraction and their types, allocation failures,
 * the APIs; its main also runs the tests of the lexer and of the canonical prefix stream. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "body_helpers.h"
#include "fail_alloc.h"
#include "router.h"
#include "test_parts.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements),
        cmocka_unit_test(test_salt_is_escaped_and_output_appended),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_scan_api),
    };
    const test_part parts[] = {
        {tests, KVG_ARRAY_LEN(tests)},
        {body_lex_tests, body_lex_tests_count},
        {body_canon_tests, body_canon_tests_count},
    };
    return run_test_parts(parts, KVG_ARRAY_LEN(parts));
}
