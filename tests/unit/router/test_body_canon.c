/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the canonical prefix stream (router/body_canon.c, docs/canonical.md): exact
 * bytes for completions, chat and responses, spellings, type errors with field paths, bounds,
 * allocation failures, an escape at every position of a long prompt. */
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

/* ---- the canonical prefix stream (kvg_body_scan) ----------------------------------------------
 */

#define RS "\x1e"
#define US "\x1f"
#define GS "\x1d"
#define FS "\x1c"

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
        {KVG_BODY_API_RESPONSES, "{\"input\":[{\"type\":\"message\",\"content\":[{\"type\":"
                                 "\"input_image\",\"image_url\":\"\\u0041\"}],\"role\":\"u\"}],"
                                 "\"instructions\":\"s\",\"tools\":[]}"},
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

/* ---- responses (docs/canonical.md, RESPONSES) ---- */

#define TOOLS_F RS "tools" US "[{\"type\":\"function\",\"name\":\"f\"}]" GS
#define CALL_C1                                                                                    \
    RS "assistant" US US                                                                           \
       "tool_calls=[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get\","          \
       "\"arguments\":\"{\\\"a\\\":1}\"}}]" GS

static void test_scan_responses(void **state)
{
    (void)state;
    const kvg_body_api R = KVG_BODY_API_RESPONSES;
    static const text_case cases[] = {
        {"{\"input\":\"hi\"}", RS "user" US "hi" GS, 0},
        {"{\"input\":null,\"instructions\":null,\"tools\":null}", NULL, 0},
        {"{\"model\":\"m\"}", NULL, 0},
        /* tools, then instructions, then input, whatever the member order */
        {"{\"input\":\"q\",\"instructions\":\"s\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}"
         "]}",
         TOOLS_F RS "system" US "s" GS RS "user" US "q" GS, 0},
        {"{\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"instructions\":"
         "\"s\"}",
         TOOLS_F RS "system" US "s" GS RS "user" US "q" GS, 0},
        {"{\"instructions\":\"s\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"input\":"
         "\"q\"}",
         TOOLS_F RS "system" US "s" GS RS "user" US "q" GS, 0},
        {"{\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"input\":\"q\",\"instructions\":"
         "\"s\"}",
         TOOLS_F RS "system" US "s" GS RS "user" US "q" GS, 0},
        {"{\"instructions\":\"s\\u00e9\",\"input\":\"q\"}",
         RS "system" US "s\xc3\xa9" GS RS "user" US "q" GS, 0},
        /* message items: chat's frames; text parts joined with a newline as chat's */
        {"{\"input\":[{\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"text\":\"b\","
         "\"type\":\"output_text\"},{\"type\":\"refusal\",\"refusal\":\"no\"},{\"type\":"
         "\"input_image\",\"image_url\":\"http://x\",\"detail\":\"auto\"},{\"type\":\"input_text\","
         "\"text\":\"c\"}],\"type\":\"message\",\"role\":\"user\",\"id\":\"m1\"}]}",
         RS "user" US "a\nb\nno" FS "image:d97939f939e715b1c86562d5fa9734a4" FS "c" GS, 0},
        /* a message item has no name or tool_calls: they are ignored */
        {"{\"input\":[{\"role\":\"assistant\",\"name\":\"x\",\"tool_calls\":[1],\"content\":null}]"
         "}",
         RS "assistant" US GS, 0},
        /* input_image by file_id when its url is null; input_file by the first of its refs */
        {"{\"input\":[{\"role\":\"u\",\"content\":[{\"type\":\"input_image\",\"image_url\":null,"
         "\"file_id\":\"http://x\"},{\"type\":\"input_file\",\"file_url\":\"u\",\"file_id\":"
         "\"http://x\"}]}]}",
         RS "u" US FS "image:d97939f939e715b1c86562d5fa9734a4" FS FS
            "file:d97939f939e715b1c86562d5fa9734a4" FS GS,
         0},
        /* function calls and their outputs: chat's assistant tool call and tool message */
        {"{\"input\":[{\"arguments\":\"{\\\"a\\\":1}\",\"name\":\"get\",\"call_id\":\"c1\","
         "\"type\":\"function_call\",\"id\":\"fc\",\"status\":\"completed\"},{\"output\":\"42\","
         "\"call_id\":\"c1\",\"type\":\"function_call_output\"}]}",
         CALL_C1 RS "tool" US "42" US "tool_call_id=c1" GS, 0},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":[{\"type\":"
         "\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},{\"type\":"
         "\"function_call_output\",\"call_id\":\"d\"}]}",
         RS "tool" US "a\nb" US "tool_call_id=c" GS RS "tool" US US "tool_call_id=d" GS, 0},
        /* other items: their canonical JSON */
        {"{\"input\":[{ \"type\" : \"reasoning\" , \"summary\" : [ ] , \"id\":\"r\\u0031\"}]}",
         RS "item" US "{\"type\":\"reasoning\",\"summary\":[],\"id\":\"r1\"}" GS, 0},
        /* chat's members mean nothing here */
        {"{\"messages\":5,\"prompt\":{},\"input\":\"x\"}", RS "user" US "x" GS, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_text(cases[i].body, R, cases[i].want, cases[i].want_len);
    /* The same conversation as a chat request gives the same stream. */
    static const char *const pairs[][2] = {
        {"{\"instructions\":\"s\",\"input\":\"q\",\"tools\":[]}",
         "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
         "\"q\"}],\"tools\":[]}"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"get\","
         "\"arguments\":"
         "\"{\\\"a\\\":1}\"},{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":"
         "\"42\"}]}",
         "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
         "\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
         "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}]}"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
         "{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
         "{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}}]}]}"},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        result a, b;
        assert_int_equal(scan(&a, pairs[i][0], R), 0);
        assert_int_equal(scan(&b, pairs[i][1], KVG_BODY_API_CHAT), 0);
        assert_true(a.info.prefix.text_len > 0);
        assert_int_equal(a.info.prefix.text_len, b.info.prefix.text_len);
        assert_memory_equal(a.info.prefix.text, b.info.prefix.text, a.info.prefix.text_len);
        done(&a);
        done(&b);
    }
    /* instructions are prompt bytes here (not for chat) */
    result r;
    assert_int_equal(scan(&r, "{\"instructions\":\"abc\",\"input\":\"x\"}", R), 0);
    assert_int_equal(r.info.prompt_bytes, 8);
    assert_null(r.info.previous_response_id);
    done(&r);
    /* previous_response_id, decoded, for the gateway's response affinity; not in the stream */
    assert_int_equal(scan(&r, "{\"previous_response_id\":\"resp_\\u0041\",\"input\":\"x\"}", R), 0);
    assert_int_equal(r.info.previous_response_id_len, 6);
    assert_string_equal(r.info.previous_response_id, "resp_A");
    assert_int_equal(r.info.prefix.text_len, strlen(RS "user" US "x" GS));
    done(&r);
    assert_int_equal(scan(&r, "{\"previous_response_id\":null}", R), 0);
    assert_null(r.info.previous_response_id);
    done(&r);
    assert_int_equal(scan(&r, "{\"previous_response_id\":\"resp_1\"}", KVG_BODY_API_CHAT), 0);
    assert_null(r.info.previous_response_id);
    done(&r);
}

static void test_scan_responses_types(void **state)
{
    (void)state;
    const kvg_body_api R = KVG_BODY_API_RESPONSES;
    const scan_bad_case cases[] = {
        {R, "{\"input\":5}", KVG_ETYPE, 9,
         "input: must be a string, an array or null, not a number"},
        {R, "{\"input\":[]}", KVG_ETYPE, 9, "input: must not be empty"},
        {R, "{\"input\":\"a\",\"input\":\"b\"}", KVG_ETYPE, 21, "input: appears more than once"},
        {R, "{\"instructions\":1}", KVG_ETYPE, 16,
         "instructions: must be a string or null, not a number"},
        {R, "{\"instructions\":\"a\",\"instructions\":\"b\"}", KVG_ETYPE, 35,
         "instructions: appears more than once"},
        {R, "{\"input\":[{\"role\":\"u\"},7]}", KVG_ETYPE, 23,
         "input[1]: must be an object, not a number"},
        {R, "{\"input\":[{\"content\":\"x\"}]}", KVG_ETYPE, 10, "input[0].role: missing"},
        {R, "{\"input\":[{\"role\":\"u\",\"content\":1}]}", KVG_ETYPE, 32,
         "input[0].content: must be a string, an array or null, not a number"},
        {R, "{\"input\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}]}",
         KVG_ETYPE, 41, "input[0].content[0].type: unknown part type"},
        {R, "{\"input\":[{\"role\":\"u\",\"content\":[{\"type\":\"input_text\"}]}]}", KVG_ETYPE, 33,
         "input[0].content[0].text: missing"},
        {R,
         "{\"input\":[{\"role\":\"u\",\"content\":[{\"type\":\"input_image\",\"detail\":\"auto\"}]}"
         "]}",
         KVG_ETYPE, 33, "input[0].content[0]: input_image needs image_url or file_id"},
        {R,
         "{\"input\":[{\"role\":\"u\",\"content\":[{\"type\":\"input_image\",\"image_url\":5}]}]}",
         KVG_ETYPE, 67, "input[0].content[0].image_url: must be a string or null, not a number"},
        {R,
         "{\"input\":[{\"role\":\"u\",\"content\":[{\"type\":\"input_file\",\"file_url\":null}]}]}",
         KVG_ETYPE, 33, "input[0].content[0]: input_file needs file_id, file_data or file_url"},
        {R, "{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
         KVG_ETYPE, 10, "input[0].call_id: missing"},
        {R,
         "{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}"
         "}]}",
         KVG_ETYPE, 71, "input[0].arguments: must be a string, not an object"},
        {R, "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":5}]}",
         KVG_ETYPE, 64, "input[0].output: must be a string, an array or null, not a number"},
        {R, "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"call_id\":\"d\"}]}",
         KVG_ETYPE, 65, "input[0].call_id: appears more than once"},
        {R, "{\"input\":[{\"type\":7}]}", KVG_ETYPE, 18,
         "input[0].type: must be a string, not a number"},
        {R, "{\"previous_response_id\":1}", KVG_ETYPE, 24,
         "previous_response_id: must be a string or null, not a number"},
        {R, "{\"previous_response_id\":\"a\",\"previous_response_id\":\"a\"}", KVG_ETYPE, 51,
         "previous_response_id: appears more than once"},
        {R, "{\"input\":[{\"type\":\"message\",\"role\":\"u\",\"type\":\"message\"}]}", KVG_ETYPE,
         46, "input[0].type: appears more than once"},
        /* the other APIs do not read input and instructions */
        {KVG_BODY_API_CHAT, "{\"messages\":[{\"role\":\"u\"}],\"input\":5,\"instructions\":1}", 0,
         0, NULL},
        {KVG_BODY_API_COMPLETIONS, "{\"input\":[],\"instructions\":{}}", 0, 0, NULL},
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

/* Items whose frames outgrow their JSON most (docs/canonical.md): within 2 len + 64. */
static void test_scan_responses_bounds(void **state)
{
    (void)state;
    static const char *const items[] = {
        "{\"type\":\"function_call\",\"call_id\":\"\",\"name\":\"\",\"arguments\":\"\"}",
        "{\"type\":\"\"}",
        "{\"role\":\"\",\"content\":[{\"type\":\"input_image\",\"file_id\":\"\"}]}",
        ("{\"role\":\"\",\"content\":[{\"type\":\"input_file\",\"file_id\":\"\"},{\"type\":"
         "\"input_file\",\"file_id\":\"\"}]}"),
        "{\"type\":\"function_call_output\",\"call_id\":\"\",\"output\":\"\"}",
    };
    for (size_t k = 0; k < sizeof(items) / sizeof(items[0]); k++) {
        kvg_buf b;
        kvg_buf_init(&b);
        kvg_buf_puts(&b, "{\"instructions\":\"\",\"input\":[");
        for (int i = 0; i < 2000; i++)
            kvg_buf_printf(&b, "%s%s", i ? "," : "", items[k]);
        kvg_buf_puts(&b, "],\"tools\":[]}");
        result r;
        assert_int_equal(scan(&r, b.data, KVG_BODY_API_RESPONSES), 0);
        assert_true(r.info.prefix.text_len <= 2 * b.len + 64);
        assert_true(r.info.prefix.text_len >= 2000 * 3);
        done(&r);
        kvg_buf_done(&b);
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

const struct CMUnitTest body_canon_tests[] = {
    cmocka_unit_test(test_stream_every_position), cmocka_unit_test(test_scan_completions),
    cmocka_unit_test(test_scan_tokens),           cmocka_unit_test(test_scan_chat),
    cmocka_unit_test(test_scan_spellings),        cmocka_unit_test(test_scan_types),
    cmocka_unit_test(test_scan_bounds),           cmocka_unit_test(test_scan_alloc_failures),
    cmocka_unit_test(test_scan_responses),        cmocka_unit_test(test_scan_responses_types),
    cmocka_unit_test(test_scan_responses_bounds),
};
const size_t body_canon_tests_count = KVG_ARRAY_LEN(body_canon_tests);
