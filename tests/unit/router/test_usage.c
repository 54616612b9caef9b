/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the usage reader: whole bodies, SSE streams, every split point, bytes that look
 * like usage but are not, the count of SSE events that carry output, and the same state as the
 * byte-at-a-time reader it replaced (usage_reference.c, the oracle) on generated inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "router.h"
#include "usage_reference.h"

static void scan_all(const char *s, int64_t *prompt, int64_t *cached)
{
    kvg_usage_scan u;
    kvg_usage_scan_init(&u);
    kvg_usage_scan_feed(&u, s, strlen(s));
    *prompt = u.value[KVG_USAGE_PROMPT_TOKENS];
    *cached = u.value[KVG_USAGE_CACHED_TOKENS];
}

/* Every split into two chunks, and byte by byte, gives the same values as one feed. */
static void check_splits(const char *s, int64_t prompt, int64_t cached)
{
    size_t n = strlen(s);
    for (size_t cut = 0; cut <= n; cut++) {
        kvg_usage_scan u;
        kvg_usage_scan_init(&u);
        kvg_usage_scan_feed(&u, s, cut);
        kvg_usage_scan_feed(&u, s + cut, n - cut);
        assert_int_equal(u.value[KVG_USAGE_PROMPT_TOKENS], prompt);
        assert_int_equal(u.value[KVG_USAGE_CACHED_TOKENS], cached);
    }
    kvg_usage_scan u;
    kvg_usage_scan_init(&u);
    for (size_t i = 0; i < n; i++)
        kvg_usage_scan_feed(&u, s + i, 1);
    assert_int_equal(u.value[KVG_USAGE_PROMPT_TOKENS], prompt);
    assert_int_equal(u.value[KVG_USAGE_CACHED_TOKENS], cached);
}

static void test_body(void **state)
{
    (void)state;
    const char *body =
        "{\"id\":\"cmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,"
        "\"message\":{\"role\":\"assistant\",\"content\":\" the of\"}}],\"usage\":{"
        "\"prompt_tokens\":1234,\"total_tokens\":1250,\"completion_tokens\":16,"
        "\"prompt_tokens_details\":{\"cached_tokens\":1216}}}";
    int64_t p, c;
    scan_all(body, &p, &c);
    assert_int_equal(p, 1234);
    assert_int_equal(c, 1216);
    check_splits(body, 1234, 1216);
    /* Whitespace around the colon, as pretty printers write it. */
    check_splits("{\"usage\": {\"prompt_tokens\" :\n 7, \"prompt_tokens_details\": "
                 "{ \"cached_tokens\":\t0 } } }",
                 7, 0);
}

static void test_stream(void **state)
{
    (void)state;
    const char *sse =
        "data: {\"choices\":[{\"delta\":{\"content\":\" the\"}}],\"usage\":null}\n\n"
        "data: {\"choices\":[{\"delta\":{\"content\":\" of\"}}],\"usage\":null}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,"
        "\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n"
        "data: [DONE]\n\n";
    check_splits(sse, 40, 32);
    /* Continuous usage stats: every chunk has usage; the last wins. */
    check_splits("data: {\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":"
                 "{\"cached_tokens\":16}}}\n\ndata: {\"usage\":{\"prompt_tokens\":40,"
                 "\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
                 40, 32);
}

static void test_not_usage(void **state)
{
    (void)state;
    /* No report, null (prefix caching off), strings, near-miss keys. */
    check_splits("{\"choices\":[]}", -1, -1);
    check_splits("{\"usage\":{\"prompt_tokens\":12,\"prompt_tokens_details\":null}}", 12, -1);
    check_splits("{\"usage\":{\"prompt_tokens\":12,\"prompt_tokens_details\":"
                 "{\"cached_tokens\":null}}}",
                 12, -1);
    check_splits("{\"content\":\"prompt_tokens cached_tokens: 5\",\"x\":\"\\\"cached_tokens\"}", -1,
                 -1);
    check_splits("{\"prompt_tokens_total\":3,\"xprompt_tokens\":4,\"cached_tokens\":\"9\"}", -1,
                 -1);
    check_splits("{\"\"prompt_tokens\":5}", 5, -1);
    check_splits("{\"prompt_tokens\":-5,\"cached_tokens\":1e3,\"x\":1.5}", -1, -1);
    /* A number too long to be a token count is ignored; the reader carries on after it. */
    check_splits("{\"prompt_tokens\":1234567890123456789012,\"cached_tokens\":3}", -1, 3);
}

/* Scan s in one feed, in two at every split point, and byte by byte: the same output events and
 * completion tokens each time. */
static void check_events(const char *s, uint64_t events, int64_t completion)
{
    size_t n = strlen(s);
    for (size_t cut = 0; cut <= n; cut++) {
        kvg_usage_scan u;
        kvg_usage_scan_init(&u);
        kvg_usage_scan_feed(&u, s, cut);
        uint64_t mid = u.output_events;
        kvg_usage_scan_feed(&u, s + cut, n - cut);
        assert_true(mid <= u.output_events);
        assert_int_equal(u.output_events, events);
        assert_int_equal(u.value[KVG_USAGE_COMPLETION_TOKENS], completion);
    }
    kvg_usage_scan u;
    kvg_usage_scan_init(&u);
    for (size_t i = 0; i < n; i++)
        kvg_usage_scan_feed(&u, s + i, 1);
    assert_int_equal(u.output_events, events);
    assert_int_equal(u.value[KVG_USAGE_COMPLETION_TOKENS], completion);
}

/* A chat stream as vLLM sends it: a role-only first chunk, content deltas, a last delta with the
 * finish reason and empty content, the usage chunk, [DONE]. */
static const char chat_stream[] =
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
    "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
    "\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" the\"}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\" of\"},"
    "\"logprobs\":{\"content\":[{\"token\":\"x\"}]}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},"
    "\"finish_reason\":\"stop\"}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"total_tokens\":42,"
    "\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n"
    "data: [DONE]\n\n";

/* A Responses API stream (OpenAI's event names, as vLLM sends them): created, two text deltas,
 * an empty delta, the done events that repeat the whole text, completed with usage. Every split
 * gives two output events and the usage numbers; the chat keys do not count here. */
static const char responses_stream[] =
    "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":"
    "\"resp_1\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n"
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
    "\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hel\"}\n\n"
    "event: response.output_text.delta\r\ndata: {\"type\":\"response.output_text.delta\","
    "\"delta\":\"lo\"}\r\n\r\n"
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
    "\"delta\":\"\"}\n\n"
    "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\","
    "\"text\":\"Hello\"}\n\n"
    "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{"
    "\"id\":\"resp_1\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":"
    "\"output_text\",\"text\":\"Hello\"}]}],\"usage\":{\"input_tokens\":120,"
    "\"input_tokens_details\":{\"cached_tokens\":96},\"output_tokens\":2,"
    "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":122}}}\n\n";

static void test_responses(void **state)
{
    (void)state;
    size_t n = strlen(responses_stream);
    for (size_t cut = 0; cut <= n; cut++) {
        kvg_usage_scan u;
        kvg_usage_scan_init_responses(&u);
        kvg_usage_scan_feed(&u, responses_stream, cut);
        kvg_usage_scan_feed(&u, responses_stream + cut, n - cut);
        assert_int_equal(u.output_events, 2);
        assert_int_equal(u.value[KVG_USAGE_PROMPT_TOKENS], 120);
        assert_int_equal(u.value[KVG_USAGE_CACHED_TOKENS], 96);
        assert_int_equal(u.value[KVG_USAGE_COMPLETION_TOKENS], 2);
    }
    /* The chat reader would count the done and completed events (their "text") and find no
     * usage: the API decides the keys. */
    kvg_usage_scan u;
    kvg_usage_scan_init(&u);
    kvg_usage_scan_feed(&u, responses_stream, n);
    assert_int_equal(u.output_events, 2); /* output_text.done and completed, not the deltas */
    assert_int_equal(u.value[KVG_USAGE_PROMPT_TOKENS], -1);
    assert_int_equal(u.value[KVG_USAGE_COMPLETION_TOKENS], -1);
    /* A chat stream read as a Responses one: its "delta" is an object, never output. */
    kvg_usage_scan_init_responses(&u);
    kvg_usage_scan_feed(&u, chat_stream, strlen(chat_stream));
    assert_int_equal(u.output_events, 0);
    assert_int_equal(u.value[KVG_USAGE_CACHED_TOKENS], 32);
    /* A non-streamed answer: the numbers, no events. */
    const char *body = "{\"id\":\"resp_2\",\"object\":\"response\",\"output\":[],\"usage\":{"
                       "\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":0},"
                       "\"output_tokens\":5,\"total_tokens\":15}}";
    kvg_usage_scan_init_responses(&u);
    kvg_usage_scan_feed(&u, body, strlen(body));
    assert_int_equal(u.value[KVG_USAGE_PROMPT_TOKENS], 10);
    assert_int_equal(u.value[KVG_USAGE_CACHED_TOKENS], 0);
    assert_int_equal(u.value[KVG_USAGE_COMPLETION_TOKENS], 5);
    assert_int_equal(u.output_events, 0);
}

static void test_output_events(void **state)
{
    (void)state;
    check_events(chat_stream, 2, 2);
    check_splits(chat_stream, 40, 32);
    /* /v1/completions: "text" deltas; the last one empty with its finish reason. */
    check_events(
        "data: {\"choices\":[{\"index\":0,\"text\":\" a\",\"logprobs\":null,"
        "\"finish_reason\":null}]}\n\n"
        "data: {\"choices\":[{\"index\":0,\"text\":\" b\"}]}\n\n"
        "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
        2, 3);
    /* CRLF and CR line ends, comments, multi-line data, whitespace around values. */
    check_events(": ping\r\n\r\ndata: {\"delta\": {\"content\" : \"x\"}}\r\n\r\n"
                 "data: {\"delta\":\r\ndata: {\"content\":\"y\"}}\r\rdata: [DONE]\r\r",
                 2, -1);
    /* Tool calls: a non-empty array is output, an empty one or null is not. */
    check_events("data: {\"delta\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]}}\n\n"
                 "data: {\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"t\",\"function\":"
                 "{\"name\":\"f\",\"arguments\":\"\"}}]}}\n\n"
                 "data: {\"delta\":{\"tool_calls\": [ {\"index\":0,\"function\":{\"arguments\":"
                 "\"{}\"}}]}}\n\n"
                 "data: {\"delta\":{\"tool_calls\":null,\"content\":null}}\n\n",
                 2, -1);
    /* Reasoning models stream their reasoning before the answer: output too. */
    check_events("data: {\"delta\":{\"reasoning_content\":\"hm\",\"content\":null}}\n\n", 1, -1);
    /* Several output values in one event (n > 1) make one event; an event counts at its blank
     * line, so one cut short does not count. */
    check_events("data: {\"choices\":[{\"text\":\"a\"},{\"text\":\"b\"}]}\n\n"
                 "data: {\"choices\":[{\"text\":\"c\"}]}\n",
                 1, -1);
    /* Keys inside strings are not keys; near-miss keys are not output. */
    check_events("data: {\"x\":\"\\\"content\\\":\\\"y\\\"\",\"contents\":\"z\","
                 "\"text_offset\":[1],\"content\":5,\"text\":[\"a\"]}\n\n",
                 0, -1);
    /* A JSON answer has no events, whatever it holds. */
    check_events("{\"choices\":[{\"message\":{\"content\":\"hi\"}}],\"usage\":"
                 "{\"completion_tokens\":1}}",
                 0, 1);
    check_events("\n\n\r\n\r\n\r\r", 0, -1);
}

/* The block scan and the value fast path (long enough inputs that they run): a key at every
 * offset in a 16-byte block, escapes and backslashes at every split, numbers of 18 and 19
 * digits, CR and LF next to keys. */
static void test_block_scan(void **state)
{
    (void)state;
    char buf[256];
    for (int pad = 0; pad < 40; pad++) {
        snprintf(buf, sizeof(buf),
                 "%.*s{\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":42,\"x\":\"0123456789"
                 "abcdefghij\"}}\n\ndata: {\"delta\":{\"content\":\"y\"}}\n\n",
                 pad, "0123456789abcdefghijklmnopqrstuvwxyz0123456789");
        check_events(buf, 1, 42);
        check_splits(buf, 7, -1);
    }
    /* Escaped quotes: a key's text inside a string is no key, wherever the chunk ends. */
    check_events(
        "data: {\"id\":\"chatcmpl-0123456789abcdef\",\"x\":\"say \\\"content\\\":\\\"hi\\\" "
        "and \\\"text\\\": \\\"\\\"\",\"content\":\"\"}\n\n",
        0, -1);
    /* A backslash that ends the string (escaped itself), then the next key. */
    check_events(
        "data: {\"id\":\"chatcmpl-0123456789abcdef\",\"content\":\"a\\\\\",\"text\":\"\\\\\"}"
        "\n\ndata: {\"id\":\"chatcmpl-0123456789abcdef\",\"content\":\"\\\\\"}\n\n",
        2, -1);
    /* The longest number read, and one digit more. */
    check_splits("{\"id\":\"chatcmpl-0123456789abcdef\",\"prompt_tokens\":123456789012345678,"
                 "\"cached_tokens\":1234567890123456789,\"x\":\"0123456789abcdef\"}",
                 123456789012345678, -1);
    /* A number ended by a line end, a value after whitespace, CR LF split by the chunks. */
    check_events("data: {\"id\":\"chatcmpl-0123456789abcdef\",\"completion_tokens\":5\r\n\r\n"
                 "data: {\"id\":\"chatcmpl-0123456789abcdef\",\"content\": \"z\"}\r\n\r\n",
                 1, 5);
    /* tool_calls whose first element is a string: the quote after '[' starts a key race. */
    check_events(
        "data: {\"id\":\"chatcmpl-0123456789abcdef\",\"tool_calls\":[\"content\":\"\"]}\n\n"
        "data: {\"id\":\"chatcmpl-0123456789abcdef\",\"tool_calls\":[\"text\":[]]}\n\n",
        2, -1);
}

/* ---- against the oracle --------------------------------------------------------------------- */

/* The whole scan state, not only what the gateway reads (value[], output_events): equal states
 * stay equal whatever follows, so a difference shows at the chunk where it starts. (The number
 * so far is left stale outside a number: usage.c reads whole numbers without it.) */
static void same_state(const kvg_usage_scan *a, const kvg_usage_scan *b)
{
    for (int f = 0; f < KVG_USAGE_FIELD_COUNT; f++)
        assert_int_equal(a->value[f], b->value[f]);
    assert_int_equal(a->output_events, b->output_events);
    assert_int_equal(a->event_output, b->event_output);
    assert_int_equal(a->line_started, b->line_started);
    assert_int_equal(a->after_cr, b->after_cr);
    assert_int_equal(a->state, b->state);
    assert_int_equal(a->alive, b->alive);
    assert_int_equal(a->matched, b->matched);
    assert_int_equal(a->keyset, b->keyset);
    if (a->state != 0) /* the key: only read after one */
        assert_int_equal(a->field, b->field);
    if (a->state == 3) { /* the number so far: only read in one (ST_DIGITS) */
        assert_int_equal(a->ndigits, b->ndigits);
        assert_int_equal(a->acc, b->acc);
    }
}

static void init_both(kvg_usage_scan *u, kvg_usage_scan *r, bool responses)
{
    if (responses) {
        kvg_usage_scan_init_responses(u);
        kvg_usage_ref_init_responses(r);
    } else {
        kvg_usage_scan_init(u);
        kvg_usage_ref_init(r);
    }
}

/* s (n bytes) cut at the offsets in cuts (ascending, < n), compared after every chunk; then a
 * blank line, which counts the event in progress. */
static void diff_chunks(const char *s, size_t n, const size_t *cuts, size_t ncuts, bool responses)
{
    kvg_usage_scan u, r;
    init_both(&u, &r, responses);
    size_t at = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t to = i < ncuts ? cuts[i] : n;
        kvg_usage_scan_feed(&u, s + at, to - at);
        kvg_usage_ref_feed(&r, s + at, to - at);
        same_state(&u, &r);
        at = to;
    }
    kvg_usage_scan_feed(&u, "\n\n", 2);
    kvg_usage_ref_feed(&r, "\n\n", 2);
    same_state(&u, &r);
}

/* One feed, two at every cut, byte by byte: both key sets. */
static void diff_all_splits(const char *s, size_t n)
{
    for (int responses = 0; responses < 2; responses++) {
        diff_chunks(s, n, NULL, 0, responses);
        for (size_t cut = 1; cut < n; cut++)
            diff_chunks(s, n, &cut, 1, responses);
        kvg_usage_scan u, r;
        init_both(&u, &r, responses);
        for (size_t i = 0; i < n; i++) {
            kvg_usage_scan_feed(&u, s + i, 1);
            kvg_usage_ref_feed(&r, s + i, 1);
            same_state(&u, &r);
        }
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)((rng_state >> 11) % n);
}

/* Pieces of responses, well and badly formed: the keys of both sets, whole and cut short, near
 * misses, escapes, values of every kind, SSE framing with every line end, and filler long enough
 * for the block scan's windows. */
static const char *const pieces[] = {
    "\"prompt_tokens\"",
    "\"cached_tokens\"",
    "\"completion_tokens\"",
    "\"content\"",
    "\"text\"",
    "\"reasoning_content\"",
    "\"tool_calls\"",
    "\"input_tokens\"",
    "\"output_tokens\"",
    "\"delta\"",
    "\"prompt_tokens_details\"",
    "\"contents\"",
    "\"tex",
    "\"completion_tok",
    "\"reasoning_",
    "\"cached",
    "\"c",
    "\"",
    "\"\"",
    "\\",
    "\\\"",
    "\\\\",
    "\\\"content\\\"",
    ":",
    " : ",
    ": ",
    "\t",
    " ",
    "0",
    "7",
    "12345",
    "1234567890123456789012",
    "-1",
    "1e3",
    "1.5",
    "null",
    "\"\"",
    "\"x\"",
    "\" the\"",
    "[]",
    "[ ]",
    "[{",
    "[\n]",
    "{",
    "}",
    "]",
    ",",
    "\n",
    "\r",
    "\r\n",
    "\n\n",
    "\r\n\r\n",
    "\r\r",
    "data: ",
    "data: [DONE]\n\n",
    ": ping\n\n",
    "event: response.output_text.delta\n",
    "{\"id\":\"chatcmpl-f692e19aaffb71efd14d820d456afa22\",\"object\":\"chat.completion.chunk\"",
    ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}",
    "\"logprobs\":null,\"finish_reason\":null}]}",
    "abcdefghijklmnopqrstuvwxyz0123456789",
    "\xff\xfe",
    "\0",
};

static void test_differential(void **state)
{
    (void)state;
    static const char *const fixed[] = {
        /* An escaped quote, a backslash and a key at every chunk boundary. */
        "{\"x\":\"a\\\"content\\\":\\\"b\\\\\",\"content\":\"\\\"y\",\"prompt_tokens\":5}\n\n",
        "{\"content\":\"\\\\\"}\n\n{\"content\":\"\\\\\\\"\"}\n\ndata: {\"text\":\"\\\\\"}\r\n\r\n",
        /* A key ends exactly at the window: the scanner compares whole keys only when 32 bytes
         * from the quote are in the chunk. */
        "0123456789abcdefghijklmnopqrstu\"completion_tokens\":77,\"cached_tokens\":3}",
        "0123456789abcdef\"completion_tokens\"",
        "0123456789abcde\"completion_tokens\"\r\n",
        /* CR at a 16-byte block's end, LF at the next block's start. */
        "data: {\"text\":\"\r\n\r\ndata: {\"text\":\"a\"}\r\r\n\n\r\r\n\"text\":\"b\"}\r\n\r\n",
        /* Unbalanced quotes: the old reader never tracked strings, neither does the new one. */
        "{\"x\":\"abc \"content\":\"y\"}\n\n\"\"\"\"content\":\"\"}\n\n\"tool_calls\":[1]\n\n",
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        diff_all_splits(fixed[i], strlen(fixed[i]));
    /* The captured streams above. */
    diff_all_splits(chat_stream, strlen(chat_stream));
    diff_all_splits(responses_stream, strlen(responses_stream));

    char buf[512];
    for (int round = 0; round < 1500; round++) {
        size_t n = 0;
        while (n < 200) {
            if (rnd(8) == 0) {
                buf[n++] = (char)rnd(256);
                continue;
            }
            const char *piece = pieces[rnd(sizeof(pieces) / sizeof(pieces[0]))];
            size_t len = piece[0] ? strlen(piece) : 1;
            memcpy(buf + n, piece, len);
            n += len;
        }
        diff_all_splits(buf, n);
        /* Many chunks at once. */
        size_t cuts[16], ncuts = 0, at = 0;
        while (ncuts < 16 && (at += 1 + rnd(40)) < n)
            cuts[ncuts++] = at;
        diff_chunks(buf, n, cuts, ncuts, round & 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_body),         cmocka_unit_test(test_stream),
        cmocka_unit_test(test_not_usage),    cmocka_unit_test(test_output_events),
        cmocka_unit_test(test_responses),    cmocka_unit_test(test_block_scan),
        cmocka_unit_test(test_differential),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
