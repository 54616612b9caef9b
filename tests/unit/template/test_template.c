/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of template/: each construct against Jinja2's output, syntax errors with their
 * positions, the constructs outside the subset named, every limit, vLLM's preprocessing, and a
 * failing allocator under compile and render. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "fail_alloc.h"
#include "template.h"

/* Generated from Jinja2 3.1.2 (Debian bookworm), configured as transformers'
 * _compile_jinja_template: each expected string is what it rendered for the template with CTX. */
static const char CTX[] = "{\"s\": \"Hello\", \"n\": 5, \"l\": [3, 1, 2], \"d\": {\"b\": 1, \"a\": "
                          "[1, 2]}, \"no\": null, \"m\": [{\"role\": \"user\", \"content\": \" hi "
                          "\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}";

struct jinja2_case {
    const char *what, *tpl, *want;
};
static const struct jinja2_case jinja2_cases[] = {
    {"trim_blocks drops the newline after a block tag", "a\n{% if true %}\nb\n{% endif %}\nc",
     "a\nb\nc"},
    {"lstrip_blocks strips blanks before a block tag", "  {% if true %}x{% endif %}\n  {{ s }}",
     "x  Hello"},
    {"whitespace control", "a  {%- if true -%}  b  {%- endif -%}  c {{- s -}} !", "abcHello!"},
    {"comments, with control", "x {#- c -#} y\n{# c #}\nz", "xy\nz"},
    {"{%+ keeps the blanks", "  {%+ if true %}x{% endif %}", "  x"},
    {"one trailing newline dropped", "end\n", "end"},
    {"string escapes", "{{ 'a\\tb\\n\\u00e9\\\\' }}|{{ \"q'\" }}",
     "a\tb\n\xc3"
     "\xa9"
     "\\|q'"},
    {"numbers",
     "{{ 10 / 4 }} {{ 10 // 4 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 0.1 + 0.2 }}",
     "2.5 2 -4 2 1024 0.30000000000000004"},
    {"Python str() of values",
     "{{ true }} {{ none }} {{ l }} {{ d }} {{ (1,) }} {{ 1e16 }} {{ 1.0 }}",
     "True None [3, 1, 2] {'b': 1, 'a': [1, 2]} (1,) 1e+16 1.0"},
    {"undefined prints empty", "[{{ nothing }}]", "[]"},
    {"and/or return operands", "{{ no or 'dflt' }} {{ s and n }}", "dflt 5"},
    {"inline if", "{{ 'y' if n > 3 else 'n' }}[{{ 'y' if no }}]", "y[]"},
    {"in / not in", "{{ 'ell' in s }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in s }}",
     "True True True True"},
    {"negative index and slices",
     "{{ l[-1] }} {{ l[::-1] }} {{ l[1:] }} {{ s[::-1] }} {{ s[1:3] }}",
     "2 [2, 1, 3] [1, 2] olleH el"},
    {"tests",
     "{{ nothing is defined }} {{ no is none }} {{ s is string }} {{ n is number }} {{ false is "
     "false }} {{ 0 is false }} {{ d is mapping }}",
     "False True True True True False True"},
    {"filters",
     "{{ l|length }} [{{ '  x '|trim }}] {{ l|first }} {{ l|last }} {{ s|upper }} {{ s|lower }} {{ "
     "l|join('-') }} {{ s|replace('l', 'L') }} {{ nothing|default('d') }} {{ '42'|int + 1 }} {{ "
     "n|string }}",
     "3 [x] 3 2 HELLO hello 3-1-2 HeLLo d 43 5"},
    {"tojson as transformers",
     "{{ d|tojson }} {{ '\xc3"
     "\xa9"
     "\"\\n'|tojson }}",
     "{\"b\": 1, \"a\": [1, 2]} \"\xc3"
     "\xa9"
     "\\\"\\n\""},
    {"tojson(indent=2)", "{{ d|tojson(indent=2) }}",
     "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}"},
    {"selectattr, map, join",
     "{{ m|selectattr('role', 'equalto', 'user')|map(attribute='content')|map('trim')|join(',') }}",
     "hi"},
    {"items and keys", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|list }}",
     "b=1;a=[1, 2];['b', 'a']"},
    {"string methods",
     "{{ s.startswith('He') }} {{ s.endswith('x') }} {{ 'a,b'.split(',') }} [{{ "
     "'\\nx\\n'.strip('\\n') }}] [{{ ' x'.lstrip() }}] [{{ 'x '.rstrip() }}]",
     "True False ['a', 'b'] [x] [x] [x]"},
    {"loop variables",
     "{% for x in l %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ "
     "loop.length }} {% endfor %}",
     "01TrueFalse3 12FalseFalse3 23FalseTrue3 "},
    {"for-else and loop filter",
     "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in l if x > 1 %}{{ x }}{% endfor %}",
     "empty 32"},
    {"break and continue",
     "{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% if x == 1 %}{% break %}{% "
     "endif %}{% endfor %}",
     "32"},
    {"set is scoped to the loop",
     "{% set x = 0 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}", "0"},
    {"namespace carries out of the loop",
     "{% set ns = namespace(x=0) %}{% for i in l %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}",
     "6"},
    {"block set", "{% set b %}<{{ s }}>{% endset %}{{ b }}", "<Hello>"},
    {"elif chain", "{% if no %}a{% elif n == 5 %}b{% else %}c{% endif %}", "b"},
    {"strftime_now", "{{ strftime_now('%d %b %Y') }}", "26 Jul 2024"},
    {"dict literal", "{{ {'output': s}|tojson }}", "{\"output\": \"Hello\"}"},
};

/* Each of these made Jinja2 raise (the exception named). */
static const struct jinja2_case jinja2_errors[] = {
    {"raise_exception (TemplateError)", "{{ raise_exception('no system here') }}", NULL},
    {"Undefined + str (UndefinedError)", "{{ nothing + 'x' }}", NULL},
    {"attribute of Undefined (UndefinedError)", "{{ nothing.attr }}", NULL},
    {"str + int (TypeError)", "{{ s + 1 }}", NULL},
    {"tojson of Undefined (TypeError)", "{{ nothing|tojson }}", NULL},
    {"iterating None (TypeError)", "{% for x in no %}{% endfor %}", NULL},
};

static kvg_json *parse_json(kvg_arena *a, const char *s)
{
    kvg_json *j = NULL;
    assert_int_equal(kvg_json_parse(s, strlen(s), a, NULL, &j, NULL), 0);
    return j;
}

/* Compile and render src with ctx (JSON text); returns the render's code, out holds the text
 * or err the message. */
static int render_with(const char *src, const char *ctx, const kvg_template_limits *lim,
                       kvg_buf *out, char *err, size_t errlen)
{
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_template *tpl;
    int rc = kvg_template_compile(src, strlen(src), lim, &tpl, err, errlen);
    if (rc == 0) {
        kvg_template_opts opts = {.limits = lim, .now_s = 1722000000};
        rc = kvg_template_render(tpl, parse_json(&a, ctx), &opts, out, err, errlen);
        kvg_template_free(tpl);
    }
    kvg_arena_done(&a);
    return rc;
}

static void test_jinja2_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(jinja2_cases) / sizeof(jinja2_cases[0]); i++) {
        const struct jinja2_case *c = &jinja2_cases[i];
        kvg_buf out;
        kvg_buf_init(&out);
        char err[256];
        int rc = render_with(c->tpl, CTX, NULL, &out, err, sizeof(err));
        if (rc != 0)
            fail_msg("%s: %s", c->what, err);
        if (strcmp(out.data ? out.data : "", c->want) != 0)
            fail_msg("%s:\n  got  [%s]\n  want [%s]", c->what, out.data ? out.data : "", c->want);
        kvg_buf_done(&out);
    }
}

static void test_jinja2_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(jinja2_errors) / sizeof(jinja2_errors[0]); i++) {
        kvg_buf out;
        kvg_buf_init(&out);
        kvg_buf_puts(&out, "kept");
        char err[256];
        int rc = render_with(jinja2_errors[i].tpl, CTX, NULL, &out, err, sizeof(err));
        if (rc == 0)
            fail_msg("%s: rendered [%s]", jinja2_errors[i].what, out.data);
        assert_int_equal(rc, KVG_EPARSE);
        assert_true(err[0] != '\0');
        assert_string_equal(out.data, "kept"); /* out is left as it was */
        kvg_buf_done(&out);
    }
    kvg_buf out;
    kvg_buf_init(&out);
    char err[256];
    assert_int_equal(
        render_with("{{ raise_exception('no system here') }}", CTX, NULL, &out, err, sizeof(err)),
        KVG_EPARSE);
    assert_string_equal(err, "raise_exception: no system here");
    kvg_buf_done(&out);
}

/* Syntax errors name line:column (1-based, in characters) and what was wrong. */
static void test_syntax_errors(void **state)
{
    (void)state;
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"{% if x %}a", "1:12: unexpected end of template, expected 'endif'"},
        {"ab\n  {{ x + }}", "2:10: unexpected end of print statement"},
        {"{% endif %}", "1:4: unexpected 'endif'"},
        {"x\n\n  {{ 'open }}", "3:6: unterminated string"},
        {"é{{ x ? }}", "1:7: unexpected character '?'"},
        {"{% for x of y %}{% endfor %}", "1:10: expected 'in' in a for loop"},
        {"{{ x", "1:1: unexpected end of template inside a tag"},
        {"{# never closed", "1:1: unterminated comment"},
        {"{{ '\\u12' }}", "1:8: truncated \\u escape in a string"},
        {"{{ 99999999999999999999 }}", "1:4: integer literal too large"},
        {"{% set x %}a", "1:13: unexpected end of template, expected 'endset'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvg_template *tpl;
        char err[256];
        int rc =
            kvg_template_compile(cases[i].src, strlen(cases[i].src), NULL, &tpl, err, sizeof(err));
        if (rc != KVG_EPARSE || strcmp(err, cases[i].want) != 0)
            fail_msg("%s: rc %d err [%s], want [%s]", cases[i].src, rc, err, cases[i].want);
    }
}

/* Valid Jinja2 outside the subset is refused at compile time, by name and position. */
static void test_unsupported(void **state)
{
    (void)state;
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"\n    {{ s|xyz }}", "2:10: unsupported filter 'xyz'"},
        {"{{ s is callable }}", "1:9: unsupported test 'callable'"},
        {"{{ s.format(1) }}", "1:6: unsupported method 'format'"},
        {"{{ cycler(1) }}", "1:4: unsupported function 'cycler'"},
        {"{% macro m() %}{% endmacro %}", "1:4: unsupported statement 'macro'"},
        {"{% include 'x' %}", "1:4: unsupported statement 'include'"},
        {"{% raw %}x{% endraw %}", "1:4: unsupported statement 'raw'"},
        {"{% for x in y recursive %}{% endfor %}", "1:15: unsupported recursive loop"},
        {"{% with a = 1 %}{% endwith %}", "1:4: unsupported statement 'with'"},
        {"{{ s|first.split() }}", "1:6: unsupported filter 'first.split'"},
        {"{% set a, b = 1, 2 %}", "1:9: unsupported assignment target"},
        {"{{ f(1)(2) }}", "1:4: unsupported function 'f'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvg_template *tpl;
        char err[256];
        int rc =
            kvg_template_compile(cases[i].src, strlen(cases[i].src), NULL, &tpl, err, sizeof(err));
        if (rc != KVG_EPARSE || strcmp(err, cases[i].want) != 0)
            fail_msg("%s: rc %d err [%s], want [%s]", cases[i].src, rc, err, cases[i].want);
    }
}

static void expect_limit(const char *src, const char *ctx, const kvg_template_limits *lim,
                         const char *words)
{
    kvg_buf out;
    kvg_buf_init(&out);
    char err[256] = "";
    int rc = render_with(src, ctx, lim, &out, err, sizeof(err));
    if (rc != KVG_ELIMIT || !strstr(err, words))
        fail_msg("%s: rc %d err [%s], want ELIMIT with [%s]", src, rc, err, words);
    assert_int_equal(out.len, 0);
    kvg_buf_done(&out);
}

static void test_limits(void **state)
{
    (void)state;
    kvg_template_limits lim = {.max_output = 100};
    expect_limit("{% for i in range(50) %}abc{% endfor %}", "{}", &lim, "output over the limit");
    lim = (kvg_template_limits){.max_loop = 10};
    expect_limit("{% for i in l %}{% for j in l %}{% endfor %}{% endfor %}", "{\"l\": [1,2,3,4]}",
                 &lim, "loop iterations");
    expect_limit("{{ range(11)|length }}", "{}", &lim, "over the loop limit");
    lim = (kvg_template_limits){.max_steps = 1000};
    expect_limit("{% for i in range(1000) %}{{ i }}{% endfor %}", "{}", &lim, "evaluation steps");
    lim = (kvg_template_limits){.max_string = 1000};
    expect_limit("{{ 'x' * 1001 }}", "{}", &lim, "a string over the limit");
    expect_limit("{% set ns = namespace(s='') %}{% for i in range(200) %}"
                 "{% set ns.s = ns.s + 'abcdefgh' %}{% endfor %}",
                 "{}", &lim, "a string over the limit");
    lim = (kvg_template_limits){.max_memory = 64 * 1024};
    expect_limit("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                 "{% set ns.l = ns.l + [i] %}{% endfor %}",
                 "{}", &lim, "scratch memory over the limit");
    /* Values nested past max_depth at render (built by the template itself). */
    lim = (kvg_template_limits){.max_depth = 16};
    expect_limit("{% set ns = namespace(v=1) %}{% for i in range(40) %}{% set ns.v = [ns.v] %}"
                 "{% endfor %}{{ ns.v|tojson }}",
                 "{}", &lim, "nested deeper");
    /* Compile: nesting and source size. */
    char deep[4096];
    size_t n = 0;
    for (int i = 0; i < 200; i++)
        deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 200; i++)
        deep[n++] = ')';
    deep[n] = '\0';
    char src[4200];
    snprintf(src, sizeof(src), "{{ %s }}", deep);
    kvg_template *tpl;
    char err[256];
    assert_int_equal(kvg_template_compile(src, strlen(src), NULL, &tpl, err, sizeof(err)),
                     KVG_ELIMIT);
    assert_non_null(strstr(err, "nested deeper than 128"));
    lim = (kvg_template_limits){.max_source = 10};
    assert_int_equal(kvg_template_compile("{{ 12345678 }}", 14, &lim, &tpl, err, sizeof(err)),
                     KVG_ELIMIT);
    /* A context that is not an object. */
    kvg_arena a;
    kvg_arena_init(&a, 0);
    assert_int_equal(kvg_template_compile("x", 1, NULL, &tpl, err, sizeof(err)), 0);
    kvg_buf out;
    kvg_buf_init(&out);
    assert_int_equal(kvg_template_render(tpl, parse_json(&a, "[1]"), NULL, &out, err, sizeof(err)),
                     KVG_ETYPE);
    /* Duplicate keys in the context: Python keeps one, kvgate refuses rather than guess. */
    assert_int_equal(kvg_template_render(tpl, parse_json(&a, "{\"a\": 1, \"a\": 2}"), NULL, &out,
                                         err, sizeof(err)),
                     KVG_EPARSE);
    kvg_buf_done(&out);
    kvg_template_free(tpl);
    kvg_arena_done(&a);
}

/* vLLM's preprocessing (vllm/entrypoints/chat_utils.py at 001eadcf: _parse_chat_message_content,
 * _postprocess_messages; the tools' model_dump()). */
static void test_prepare(void **state)
{
    (void)state;
    kvg_arena a;
    kvg_arena_init(&a, 0);
    const char *body =
        "{\"model\": \"m\", \"messages\": ["
        "{\"role\": \"system\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
        " {\"type\": \"text\", \"text\": \"b\"}, {\"type\": \"text\", \"text\": null}]},"
        "{\"role\": \"user\", \"content\": \"hi\", \"name\": \"bob\", \"extra\": 1},"
        "{\"role\": \"assistant\", \"content\": null, \"reasoning\": \"think\","
        " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\":"
        " {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1, \\\"a\\\": [true]}\"}},"
        " {\"function\": {\"name\": \"g\", \"arguments\": \"not json\"}}]},"
        "{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": []},"
        "{\"role\": \"tool\", \"content\": \"r\", \"tool_call_id\": \"c1\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"parameters\": {\"type\": "
        "\"object\"},"
        " \"name\": \"f\", \"strict\": true}}],"
        " \"chat_template_kwargs\": {\"enable_thinking\": false, \"messages\": 0}}";
    kvg_json *ctx;
    char err[256];
    kvg_template_vars vars = {.bos_token = "<s>"};
    assert_int_equal(kvg_template_prepare(parse_json(&a, body), &vars, &a, &ctx, err, sizeof(err)),
                     0);
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_json_write(&b, ctx);
    assert_string_equal(
        b.data,
        "{\"messages\":["
        "{\"role\":\"system\",\"content\":\"a\\nb\"},"
        "{\"role\":\"user\",\"content\":\"hi\",\"name\":\"bob\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "{\"x\":1,\"a\":[true]}}},"
        "{\"function\":{\"name\":\"g\",\"arguments\":{}}}],"
        "\"reasoning\":\"think\",\"reasoning_content\":\"think\"},"
        "{\"role\":\"assistant\",\"content\":\"x\"},"
        "{\"role\":\"tool\",\"content\":\"r\",\"tool_call_id\":\"c1\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":null,"
        "\"parameters\":{\"type\":\"object\"},\"strict\":true}}],"
        "\"documents\":null,\"add_generation_prompt\":true,\"continue_final_message\":false,"
        "\"bos_token\":\"<s>\",\"enable_thinking\":false}");
    /* The "openai" content format keeps text parts. */
    vars.openai_content = true;
    assert_int_equal(kvg_template_prepare(parse_json(&a, "{\"messages\": [{\"role\": \"user\","
                                                         " \"content\": \"hi\"}]}"),
                                          &vars, &a, &ctx, err, sizeof(err)),
                     0);
    kvg_buf_reset(&b);
    kvg_json_write(&b, kvg_json_get(ctx, "messages"));
    assert_string_equal(b.data, "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                                "\"hi\"}]}]");
    /* What token-exact mode does not cover is refused, named. */
    static const char *const refused[] = {
        ("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\","
         " \"image_url\": {\"url\": \"x\"}}]}]}"),
        "{\"messages\": [], \"continue_final_message\": true}",
        "{\"messages\": [], \"chat_template\": \"x\"}",
        "{\"messages\": [{\"content\": \"no role\"}]}",
        "{\"messages\": {}}",
        "{\"messages\": [], \"chat_template_kwargs\": {\"tokenize\": true}}",
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        assert_int_equal(
            kvg_template_prepare(parse_json(&a, refused[i]), &vars, &a, &ctx, err, sizeof(err)),
            KVG_EPARSE);
    kvg_buf_done(&b);
    kvg_arena_done(&a);
}

static void test_wants_parts(void **state)
{
    (void)state;
    kvg_template *tpl;
    char err[128];
    const char *a = "{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}"
                    "{% endfor %}";
    const char *b = "{% for m in messages %}{{ m.content }}{% endfor %}";
    assert_int_equal(kvg_template_compile(a, strlen(a), NULL, &tpl, err, sizeof(err)), 0);
    assert_true(kvg_template_wants_parts(tpl));
    kvg_template_free(tpl);
    assert_int_equal(kvg_template_compile(b, strlen(b), NULL, &tpl, err, sizeof(err)), 0);
    assert_false(kvg_template_wants_parts(tpl));
    kvg_template_free(tpl);
}

/* One compiled template rendered from several threads at once gives the same bytes. */
static const kvg_template *shared_tpl;
static const kvg_json *shared_ctx;
static const char *shared_want;

static void *render_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++) {
        kvg_buf out;
        kvg_buf_init(&out);
        char err[128];
        if (kvg_template_render(shared_tpl, shared_ctx, NULL, &out, err, sizeof(err)) != 0 ||
            strcmp(out.data, shared_want) != 0) {
            kvg_buf_done(&out);
            return (void *)1;
        }
        kvg_buf_done(&out);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    const struct jinja2_case *c = &jinja2_cases[sizeof(jinja2_cases) / sizeof(jinja2_cases[0]) - 5];
    kvg_arena a;
    kvg_arena_init(&a, 0);
    kvg_template *tpl;
    char err[128];
    assert_int_equal(kvg_template_compile(c->tpl, strlen(c->tpl), NULL, &tpl, err, sizeof(err)), 0);
    shared_tpl = tpl;
    shared_ctx = parse_json(&a, CTX);
    shared_want = c->want;
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, render_thread, NULL), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    kvg_template_free(tpl);
    kvg_arena_done(&a);
}

/* Every allocation of a compile and of a render made to fail in turn: a clean -ENOMEM (or,
 * for the context, the parse's), no leak (ASan), and the output left as it was. */
static void test_fail_alloc(void **state)
{
    (void)state;
    const char *src = jinja2_cases[17].tpl; /* selectattr|map|join */
    for (long n = 0;; n++) {
        kvg_template *tpl = NULL;
        char err[128];
        fail_alloc_nth(n);
        int rc = kvg_template_compile(src, strlen(src), NULL, &tpl, err, sizeof(err));
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_template_free(tpl);
            break;
        }
        if (rc == 0)
            kvg_template_free(tpl);
        else
            assert_int_equal(rc, -ENOMEM);
    }
    kvg_template *tpl;
    char err[128];
    const char *big = "{% set ns = namespace(x=[]) %}{% for m in m %}{{ m|tojson(indent=2) }}"
                      "{% set ns.x = ns.x + [m.content|trim] %}{% endfor %}{{ ns.x|join(',') }}"
                      "{% set b %}{{ d }}{% endset %}{{ b }}";
    assert_int_equal(kvg_template_compile(big, strlen(big), NULL, &tpl, err, sizeof(err)), 0);
    kvg_arena a;
    kvg_arena_init(&a, 0);
    const kvg_json *ctx = parse_json(&a, CTX);
    for (long n = 0;; n++) {
        kvg_buf out;
        kvg_buf_init(&out);
        kvg_buf_puts(&out, "pre");
        fail_alloc_nth(n);
        int rc = kvg_template_render(tpl, ctx, NULL, &out, err, sizeof(err));
        bool injected = fail_alloc_off();
        if (!injected) {
            assert_int_equal(rc, 0);
            kvg_buf_done(&out);
            break;
        }
        if (rc != 0) {
            assert_int_equal(rc, -ENOMEM);
            if (!out.failed)
                assert_string_equal(out.data, "pre");
        }
        kvg_buf_done(&out);
    }
    kvg_template_free(tpl);
    kvg_arena_done(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jinja2_cases),  cmocka_unit_test(test_jinja2_errors),
        cmocka_unit_test(test_syntax_errors), cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_limits),        cmocka_unit_test(test_prepare),
        cmocka_unit_test(test_wants_parts),   cmocka_unit_test(test_threads),
        cmocka_unit_test(test_fail_alloc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
