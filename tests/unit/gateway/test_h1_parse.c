/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for gateway/h1_parse.c, with libhttp-parser (what the fronts used before) as the
 * oracle: generated requests and responses, valid and not, pipelined, fed whole and split at
 * every offset, must get the same verdict, fields and body bytes from both, except where
 * h1_parse.c is deliberately stricter. Those differences (listed at the top of h1_parse.c) are
 * generated on purpose below, each tagged, and must be refused by kvgate and accepted by
 * http-parser:
 *   D_FOLD     obs-fold                         D_NAME_WS  whitespace before the colon
 *   D_VERSION  HTTP/2.0, HTTP/0.9               D_SPACES   two spaces in the request line
 *   D_EXT_CTL  a control in a chunk extension   D_CR       CR not followed by LF after data
 *   D_TE       Transfer-Encoding with an empty element, chunked before its end, a coding
 *              that is a prefix of chunked or not a bare token, or an HTAB after its first
 *              byte
 *   D_TRAILER  a Content-Length or Transfer-Encoding trailer
 *   D_TARGET   a tab or a byte >= 0x80 in the target
 *   D_STATUS   a status code not of 3 digits, 100-999
 *   D_REASON   a control in the reason phrase
 *   D_CTL_FIRST a control as a value's first byte (http-parser checks the others only)
 *   D_NOBODY   a 1xx, 204 or 304 response that declares a body (http-parser reads it)
 *   D_CONN     a Connection list kvgate reads as malformed: it closes (a verdict of keep-alive
 *              only, checked by check_same in h1_oracle.h) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h1_parse.h"

#include "h1_oracle.h"

typedef enum verdict {
    SAME = 0, /* both parsers agree (accept or refuse) */
    STRICTER, /* a deliberate difference: kvgate refuses, http-parser accepts */
} verdict;

static size_t g_cases, g_stricter;

/* Both parsers over the input whole and split at every offset. */
static void differential(const char *in, size_t len, bool request, verdict v)
{
    result *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    assert_true(a && b);
    for (size_t split = 0; split <= len; split++) {
        memset(a, 0, sizeof(*a));
        memset(b, 0, sizeof(*b));
        run_oracle(in, len, split, request, a);
        run_kvgate(in, len, split, request, b);
        if (v == STRICTER) {
            if (a->error || !b->error) {
                fprintf(stderr,
                        "expected a deliberate difference at split %zu: http-parser "
                        "error=%d, kvgate error=%d\n",
                        split, a->error, b->error);
                dump(in, len);
                fail();
            }
        } else if (!refused_at_head_end(in, len, request, a, b)) {
            check_same(in, len, split, a, b);
        }
        g_cases++;
    }
    g_stricter += v == STRICTER;
    free(a);
    free(b);
}

static void diff_str(const char *s, bool request, verdict v)
{
    differential(s, strlen(s), request, v);
}

/* ---- generated messages ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

typedef struct gen {
    char buf[32768];
    size_t len;
} gen;

static void put(gen *g, const char *s)
{
    size_t n = strlen(s);
    assert_true(g->len + n < sizeof(g->buf));
    memcpy(g->buf + g->len, s, n);
    g->len += n;
}

static void putf(gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void putf(gen *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g->buf + g->len, sizeof(g->buf) - g->len, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && g->len + (size_t)n < sizeof(g->buf));
    g->len += (size_t)n;
}

static const char *eol(bool lf)
{
    return lf ? "\n" : "\r\n";
}

static const char *const names[] = {"Host",         "X-Foo",      "content-type", "Accept",
                                    "X-Request-Id", "user-agent", "X-Dup",        "Authorization"};
static const char *const values[] = {"x",          "  spaced  ", "a, b, c",    "",
                                     "\tTabbed\t", "Bearer k",   "v\xc3\xa9t", "1"};
static const char *const ows_[] = {"", " ", "\t", "  ", " \t "};

static void gen_headers(gen *g, bool lf)
{
    int n = (int)rnd(6);
    for (int i = 0; i < n; i++)
        putf(g, "%s:%s%s%s%s", names[rnd(8)], ows_[rnd(5)], values[rnd(8)], ows_[rnd(5)], eol(lf));
}

static void gen_body_bytes(gen *g, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = (char)('a' + rnd(26));
        g->buf[g->len++] = c;
    }
}

/* A chunked body, with extensions and trailers now and then. Only the trailers may end lines
 * in a bare LF (both parsers refuse one after a size line or a chunk's data). */
static void gen_chunked(gen *g, bool lf)
{
    bool trailer_lf = lf;
    lf = false;
    int n = (int)rnd(4);
    for (int i = 0; i < n; i++) {
        size_t size = 1 + rnd(40);
        if (rnd(4) == 0)
            put(g, "00");
        if (rnd(2))
            putf(g, "%zx", size);
        else
            putf(g, "%zX", size);
        if (rnd(3) == 0)
            put(g, rnd(2) ? ";name=value" : "; a=\"b c\";d");
        put(g, eol(lf));
        gen_body_bytes(g, size);
        put(g, eol(lf));
    }
    put(g, "0");
    if (rnd(4) == 0)
        put(g, ";last");
    put(g, eol(lf));
    if (rnd(3) == 0)
        putf(g, "X-Trailer: t%sOther:  v %s", eol(trailer_lf), eol(trailer_lf));
    put(g, eol(trailer_lf));
}

static const char *const methods_[] = {"GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"};
static const char *const targets[] = {"/", "/v1/chat/completions", "/a?b=c&d=%20e", "/x#frag",
                                      "http://h:8/p?q"};

static void gen_request(gen *g)
{
    bool lf = rnd(5) == 0;
    int minor = (int)rnd(2);
    putf(g, "%s %s HTTP/1.%d%s", methods_[rnd(6)], targets[rnd(5)], minor, eol(lf));
    gen_headers(g, lf);
    if (rnd(3) == 0)
        putf(g, "Connection: %s%s", rnd(2) ? "close" : "Keep-Alive", eol(lf));
    switch (rnd(3)) {
    case 0:
        put(g, eol(lf));
        break;
    case 1: {
        size_t n = rnd(50);
        putf(g, "Content-Length: %zu%s%s", n, eol(lf), eol(lf));
        gen_body_bytes(g, n);
        break;
    }
    default:
        putf(g, "Transfer-Encoding: %s%s%s", rnd(2) ? "chunked" : "gzip, chunked", eol(lf),
             eol(lf));
        gen_chunked(g, lf);
        break;
    }
}

static void gen_response(gen *g, bool last)
{
    bool lf = rnd(5) == 0;
    static const int statuses[] = {200, 201, 404, 500, 503};
    if (rnd(6) == 0) /* an interim response first */
        putf(g, "HTTP/1.1 100 Continue%s%s", eol(lf), eol(lf));
    putf(g, "HTTP/1.%u %d %s%s", rnd(2), statuses[rnd(5)], rnd(4) ? "Some Reason" : "", eol(lf));
    gen_headers(g, lf);
    switch (rnd(last ? 3 : 2)) {
    case 0: {
        size_t n = rnd(60);
        putf(g, "Content-Length: %zu%s%s", n, eol(lf), eol(lf));
        gen_body_bytes(g, n);
        break;
    }
    case 1:
        putf(g, "Transfer-Encoding: chunked%s%s", eol(lf), eol(lf));
        gen_chunked(g, lf);
        break;
    default: /* close-delimited: only as the last one */
        put(g, eol(lf));
        gen_body_bytes(g, rnd(30));
        break;
    }
}

static void test_generated_valid(void **state)
{
    (void)state;
    gen *g = malloc(sizeof(*g));
    assert_non_null(g);
    for (int i = 0; i < 300; i++) {
        g->len = 0;
        if (rnd(4) == 0)
            put(g, "\r\n"); /* empty lines before a message are skipped */
        int n = 1 + (int)rnd(3);
        for (int k = 0; k < n; k++)
            gen_request(g);
        differential(g->buf, g->len, true, SAME);
        g->len = 0;
        n = 1 + (int)rnd(3);
        for (int k = 0; k < n; k++)
            gen_response(g, k == n - 1);
        differential(g->buf, g->len, false, SAME);
    }
    free(g);
}

/* One byte of a valid message replaced: http-parser's refusals must be kvgate's too, and what
 * both accept must parse the same. Where only kvgate refuses, the byte is one of the
 * deliberate differences' (whitespace or a control where the grammar has none), or makes a
 * message that http-parser's lenient build accepts and h1_parse.c's list rules out; those are
 * counted, not failed. */
static void test_generated_mutations(void **state)
{
    (void)state;
    static const char bytes[] = {' ',    '\t',   '\r', '\n', '\0', ':', ';', '0', 'f', 'x',
                                 '\x7f', '\x80', ',',  '/',  '.',  'G', 'H', '1', '2', '9'};
    gen *g = malloc(sizeof(*g));
    result *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    assert_true(g && a && b);
    size_t only_kvgate = 0;
    /* H1_PARSE_SEED=n runs another sequence (longer runs by hand). */
    const char *seed = getenv("H1_PARSE_SEED");
    if (seed)
        rng_state ^= strtoull(seed, NULL, 10) * 0x2545f4914f6cdd1dull;
    for (int i = 0; i < 6000; i++) {
        bool request = i % 2 == 0;
        g->len = 0;
        if (request)
            gen_request(g);
        else
            gen_response(g, true);
        g->buf[rnd((uint32_t)g->len)] = bytes[rnd(sizeof(bytes))];
        size_t split = rnd((uint32_t)g->len + 1);
        memset(a, 0, sizeof(*a));
        memset(b, 0, sizeof(*b));
        run_oracle(g->buf, g->len, split, request, a);
        run_kvgate(g->buf, g->len, split, request, b);
        if (b->error && !a->error) {
            only_kvgate++;
            if (getenv("H1_PARSE_SHOW"))
                dump(g->buf, g->len);
            continue;
        }
        if (refused_at_head_end(g->buf, g->len, request, a, b))
            continue;
        if (a->error && !b->error) {
            fprintf(stderr, "http-parser refuses what kvgate accepts (split %zu)\n", split);
            dump(g->buf, g->len);
            fail();
        }
        if (!a->error)
            check_same(g->buf, g->len, split, a, b);
    }
    print_message("# %zu of 6000 mutations refused by kvgate only\n", only_kvgate);
    free(a);
    free(b);
    free(g);
}

/* Hand-written cases, each message whole and split at every offset. */
static void test_cases(void **state)
{
    (void)state;
    /* Agreed refusals. */
    static const char *const both_refuse_req[] = {
        "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
        "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0ffffffffffffffff\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\nab",
        "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\nab",
        "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 1\t\r\n\r\nx",
        "POST / HTTP/1.1\r\nTransfer-Encoding-X: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, c, chunked\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunke, chunked\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\t\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip,\tchunked\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\t;a\r\nx\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encodingx: gzip\r\nContent-Length: 1\r\n\r\nx",
        "GET / HTTP/1.1\r\nX: a\x01z\r\n\r\n",
        "GET / HTTP/1.1\r\nX: a\x7fz\r\n\r\n",
        "GET / HTTP/1.1\r\nX: a\0z\r\n\r\n",
        "G@T / HTTP/1.1\r\n\r\n",
        "FOO / HTTP/1.1\r\n\r\n",
        "get / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        "GET / HTTP/1.1\r\n: empty name\r\n\r\n",
        "GET / HTTP/1.1\r\nX@Y: v\r\n\r\n",
        "GET / HTTP/1.1x\r\n\r\n",
        "GET / HTTP/1.1\rX\n\r\n",
        "GET\r\n\r\n",
        "GET /\x01 HTTP/1.1\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n;x\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked,\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(both_refuse_req) / sizeof(both_refuse_req[0]); i++)
        diff_str(both_refuse_req[i], true, SAME);
    differential("GET / HTTP/1.1\r\nX: a\0z\r\n\r\n", 25, true, SAME);
    /* Agreed acceptances at the edges. */
    static const char *const both_accept_req[] = {
        "GET / HTTP/1.1\r\n\r\n",
        "\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
        "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n",
        "GET / HTTP/1.1\nHost: x\n\n",
        "GET / HTTP/1.1\r\nX:\r\nY: \t \r\n\r\n",
        "GET / HTTP/1.1\r\nX: caf\xc3\xa9\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\n\r\n",
        "M-SEARCH * HTTP/1.1\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length:  007 \r\n\r\n1234567",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b;c\r\nhello\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 ;a\r\nhello\r\n0\r\nT: v\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        "1\r\nx\r\n0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        "fffff\r\n",
    };
    for (size_t i = 0; i < sizeof(both_accept_req) / sizeof(both_accept_req[0]); i++)
        diff_str(both_accept_req[i], true, SAME);
    static const char *const both_resp[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
        "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\n\r\n",
        "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\nuntil close",
        "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nclose-delimited",
        "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTPS/1.1 200 OK\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(both_resp) / sizeof(both_resp[0]); i++)
        diff_str(both_resp[i], false, SAME);

    /* The deliberate differences: kvgate refuses, http-parser accepts. */
    static const char *const stricter_req[] = {
        /* D_FOLD */ "GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
        /* D_NAME_WS */ "GET / HTTP/1.1\r\nContent-Length : 0\r\n\r\n",
        /* D_NAME_WS */ "GET / HTTP/1.1\r\nX Y: v\r\n\r\n",
        /* D_VERSION */ "GET / HTTP/2.0\r\n\r\n",
        /* D_VERSION */ "GET / HTTP/1.2\r\n\r\n",
        /* D_VERSION */ "GET /\r\n\r\n",
        /* D_VERSION */ "GET / HTTX/1.1\r\n\r\n",
        /* D_SPACES */ "GET  / HTTP/1.1\r\n\r\n",
        /* D_TARGET */ "GET /a\tb HTTP/1.1\r\n\r\n",
        /* D_TARGET */ "GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n",
        /* D_EXT_CTL */
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;\x01\r\nx\r\n0\r\n\r\n",
        /* D_CR */ "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxAB0\r\n\r\n",
        /* D_CR */ "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\rXx\r\n0\r\n\r\n",
        /* D_TE */
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip;q=1, chunked\r\n\r\n0\r\n\r\n",
        /* D_TRAILER */
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 5\r\n\r\n",
        /* D_TRAILER */
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nTransfer-encoding: x\r\n\r\n",
        /* D_TE */
        ("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
         "0\r\n\r\n"),
    };
    for (size_t i = 0; i < sizeof(stricter_req) / sizeof(stricter_req[0]); i++)
        diff_str(stricter_req[i], true, STRICTER);
    static const char *const stricter_resp[] = {
        /* D_FOLD */ "HTTP/1.1 200 OK\r\nX: a\r\n\tb\r\nContent-Length: 0\r\n\r\n",
        /* D_VERSION */ "HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        /* D_STATUS */ "HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n",
        /* D_STATUS */ "HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",
        /* D_CTL_FIRST */ "HTTP/1.1 200 OK\r\nX: \x01\r\nContent-Length: 0\r\n\r\n",
        /* D_TE */ "HTTP/1.1 200 OK\r\nTransfer-Encoding: ,chunked\r\n\r\n0\r\n\r\n",
        /* D_TE */ "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nxyz",
        /* D_NOBODY */ "HTTP/1.1 204 No\r\nContent-Length: 2\r\n\r\nok",
        /* D_NOBODY */ "HTTP/1.1 304 No\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        /* D_NOBODY */ "HTTP/1.1 100 Continue\r\nContent-Length: 1\r\n\r\nx",
        /* D_REASON */ "HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(stricter_resp) / sizeof(stricter_resp[0]); i++)
        diff_str(stricter_resp[i], false, STRICTER);
}

/* Sizes at the edges: the largest chunk size, a chunk past the caller's limit. */
static void test_limits(void **state)
{
    (void)state;
    char head[] = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    kvg_h1_scan s = {0};
    size_t end = kvg_h1_head_end(&s, head, strlen(head));
    assert_int_equal(end, strlen(head));
    kvg_header hd[4];
    kvg_h1_msg m;
    const char *why;
    assert_int_equal(kvg_h1_parse_request(head, end, &m, hd, s.lines, &why), 0);
    kvg_h1_body b;
    kvg_h1_body_init_request(&b, &m, 10, 100);
    size_t used, dl;
    const char *data;
    assert_int_equal(kvg_h1_body_feed(&b, "b\r\n", 3, &used, &data, &dl, &why), -E2BIG);
    kvg_h1_body_init_request(&b, &m, 10, 100);
    assert_int_equal(kvg_h1_body_feed(&b, "a\r\n", 3, &used, &data, &dl, &why), 0);
    kvg_h1_body_init_request(&b, &m, 0, 100);
    assert_int_equal(kvg_h1_body_feed(&b, "fffffffffffffff\r\n", 17, &used, &data, &dl, &why), 0);
    kvg_h1_body_init_request(&b, &m, 0, 100); /* http-parser's bound: 2^60 - 1 on refused */
    assert_int_equal(kvg_h1_body_feed(&b, "ffffffffffffffff\r\n", 18, &used, &data, &dl, &why),
                     -EBADMSG);
    kvg_h1_body_init_request(&b, &m, 0, 100);
    assert_int_equal(kvg_h1_body_feed(&b, "1ffffffffffffffff\r\n", 19, &used, &data, &dl, &why),
                     -EBADMSG);
    /* Trailers past the caller's bound. */
    kvg_h1_body_init_request(&b, &m, 0, 8);
    assert_int_equal(kvg_h1_body_feed(&b, "0\r\nX: 123456789\r\n\r\n", 20, &used, &data, &dl, &why),
                     -EMSGSIZE);
    /* A size line past KVG_H1_MAX_CHUNK_LINE. */
    static char line[6000];
    memset(line, '0', sizeof(line));
    kvg_h1_body_init_request(&b, &m, 0, 100);
    assert_int_equal(kvg_h1_body_feed(&b, line, sizeof(line), &used, &data, &dl, &why), -EBADMSG);
    /* More header lines than the caller's array. */
    char many[] = "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n";
    assert_int_equal(kvg_h1_parse_request(many, strlen(many), &m, hd, 1, &why), -EBADMSG);
    /* A version the front answers 505. */
    char v2[] = "GET / HTTP/2.0\r\n\r\n";
    assert_int_equal(kvg_h1_parse_request(v2, strlen(v2), &m, hd, 4, &why), -EPROTONOSUPPORT);
}

/* Names lowercased and values NUL-terminated in place, pointing into the buffer. */
static void test_in_place(void **state)
{
    (void)state;
    char buf[] = "POST /p?q HTTP/1.1\r\nHost: Ex\r\nX-Mixed-Case:  v w \t\r\n\r\n";
    kvg_h1_scan s = {0};
    size_t end = kvg_h1_head_end(&s, buf, strlen(buf));
    kvg_header hd[4];
    kvg_h1_msg m;
    const char *why;
    assert_int_equal(kvg_h1_parse_request(buf, end, &m, hd, s.lines, &why), 0);
    assert_string_equal(m.method, "POST");
    assert_string_equal(m.target, "/p?q");
    assert_int_equal(m.nheaders, 2);
    assert_string_equal(hd[1].name, "x-mixed-case");
    assert_string_equal(hd[1].value, "v w");
    assert_int_equal(hd[1].value_len, 3);
    assert_true(hd[1].value > buf && hd[1].value < buf + sizeof(buf));
    /* Connection lists: plain ones as http-parser reads them, malformed ones as close. */
    static const struct {
        const char *head;
        bool keep_alive;
    } conn[] = {
        {"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", true},
        {"GET / HTTP/1.0\r\nConnection: foo, keep-alive\r\n\r\n", true},
        {"GET / HTTP/1.0\r\nConnection: ,keep-alive\r\n\r\n", false},
        {"GET / HTTP/1.1\r\nConnection: keep-alive,\r\n\r\n", false},
        {"GET / HTTP/1.1\r\nConnection: keep-alive\t\r\n\r\n", false},
        {"GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n", true},
        {"GET / HTTP/1.1\r\nConnection: x, close\r\n\r\n", false},
    };
    for (size_t i = 0; i < sizeof(conn) / sizeof(conn[0]); i++) {
        char h[128];
        snprintf(h, sizeof(h), "%s", conn[i].head);
        kvg_h1_scan cs = {0};
        size_t ce = kvg_h1_head_end(&cs, h, strlen(h));
        assert_int_equal(kvg_h1_parse_request(h, ce, &m, hd, cs.lines, &why), 0);
        assert_int_equal(m.keep_alive, conn[i].keep_alive);
    }
    /* Absolute form. */
    const char *a, *p;
    size_t al, pl;
    bool slash;
    const char *t = "HTTP://user@h:8?x";
    assert_int_equal(kvg_h1_absolute_form(t, strlen(t), &a, &al, &p, &pl, &slash), 0);
    assert_int_equal(al, 3);
    assert_memory_equal(a, "h:8", 3);
    assert_true(slash);
    assert_memory_equal(p, "?x", pl);
    assert_int_equal(kvg_h1_absolute_form("ftp://h/", 8, &a, &al, &p, &pl, &slash), -EINVAL);
    assert_int_equal(kvg_h1_absolute_form("http:///p", 9, &a, &al, &p, &pl, &slash), -EINVAL);
}

static void test_summary(void **state)
{
    (void)state;
    print_message("# %zu parses compared, %zu deliberate differences checked\n", g_cases,
                  g_stricter);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_place),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_generated_valid),
        cmocka_unit_test(test_generated_mutations),
        cmocka_unit_test(test_summary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
