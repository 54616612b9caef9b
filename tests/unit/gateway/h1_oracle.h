/* SPDX-License-Identifier: Apache-2.0 */
/* The differential harness shared by test_h1_parse.c and tests/fuzz/fuzz_h1_parse.c: the same
 * input through libhttp-parser (the oracle) and through h1_parse.c driven as the fronts drive
 * it, and the comparison. Static functions, included once per program; it uses cmocka's
 * assert_non_null, assert_true and fail, which the fuzzer defines as aborts. */
#ifndef KVG_TEST_H1_ORACLE_H
#define KVG_TEST_H1_ORACLE_H

#include <errno.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h1_parse.h"

/* ---- what a parser saw ----------------------------------------------------------------------- */

#define MAX_MSGS 8
#define MAX_TEXT 8192
#define MAX_BODY 65536

typedef struct rec {
    char method[16];
    char url[512];
    int minor, status;
    char headers[MAX_TEXT]; /* "name=value\n" per header, names lowercased, values trimmed */
    size_t hlen;
    char body[MAX_BODY];
    size_t blen;
    bool keep_alive;
} rec;

typedef struct result {
    rec msgs[MAX_MSGS];
    int n;        /* complete messages */
    bool error;   /* the parser refused the input */
    bool in_head; /* kvgate: the input ended inside a head */
} result;

static void add(char *dst, size_t *len, size_t cap, const char *s, size_t n)
{
    if (n && *len + n < cap) {
        memcpy(dst + *len, s, n);
        *len += n;
        dst[*len] = '\0';
    }
}

/* ---- the oracle: http-parser --------------------------------------------------------------- */

typedef struct oracle {
    result *r;
    rec cur;
    char field[MAX_TEXT], value[MAX_TEXT];
    size_t flen, vlen;
    bool in_value, head_done;
    size_t urllen;
} oracle;

static void o_push(oracle *o)
{
    for (size_t i = 0; i < o->flen; i++)
        if (o->field[i] >= 'A' && o->field[i] <= 'Z')
            o->field[i] = (char)(o->field[i] | 0x20);
    size_t v = o->vlen;
    while (v && (o->value[v - 1] == ' ' || o->value[v - 1] == '\t'))
        v--;
    add(o->cur.headers, &o->cur.hlen, MAX_TEXT, o->field, o->flen);
    add(o->cur.headers, &o->cur.hlen, MAX_TEXT, "=", 1);
    add(o->cur.headers, &o->cur.hlen, MAX_TEXT, o->value, v);
    add(o->cur.headers, &o->cur.hlen, MAX_TEXT, "\n", 1);
    o->flen = o->vlen = 0;
    o->in_value = false;
}

static int o_begin(http_parser *p)
{
    oracle *o = p->data;
    memset(&o->cur, 0, sizeof(o->cur));
    o->flen = o->vlen = o->urllen = 0;
    o->in_value = o->head_done = false;
    return 0;
}

static int o_url(http_parser *p, const char *at, size_t len)
{
    oracle *o = p->data;
    add(o->cur.url, &o->urllen, sizeof(o->cur.url), at, len);
    return 0;
}

static int o_field(http_parser *p, const char *at, size_t len)
{
    oracle *o = p->data;
    if (o->head_done)
        return 0; /* trailers are dropped */
    if (o->in_value)
        o_push(o);
    if (o->flen + len < MAX_TEXT) {
        memcpy(o->field + o->flen, at, len);
        o->flen += len;
    }
    return 0;
}

static int o_value(http_parser *p, const char *at, size_t len)
{
    oracle *o = p->data;
    if (o->head_done)
        return 0;
    o->in_value = true;
    if (o->vlen + len < MAX_TEXT) {
        memcpy(o->value + o->vlen, at, len);
        o->vlen += len;
    }
    return 0;
}

static int o_headers_complete(http_parser *p)
{
    oracle *o = p->data;
    if (o->in_value || o->flen)
        o_push(o);
    o->head_done = true;
    if (p->type == HTTP_REQUEST)
        snprintf(o->cur.method, sizeof(o->cur.method), "%s",
                 http_method_str((enum http_method)p->method));
    o->cur.minor = p->http_minor;
    o->cur.status = (int)p->status_code;
    o->cur.keep_alive = http_should_keep_alive(p) != 0;
    return 0;
}

static int o_body(http_parser *p, const char *at, size_t len)
{
    oracle *o = p->data;
    add(o->cur.body, &o->cur.blen, MAX_BODY, at, len);
    return 0;
}

static int o_complete(http_parser *p)
{
    oracle *o = p->data;
    if (o->r->n < MAX_MSGS)
        o->r->msgs[o->r->n++] = o->cur;
    return 0;
}

static const http_parser_settings o_settings = {
    .on_message_begin = o_begin,
    .on_url = o_url,
    .on_header_field = o_field,
    .on_header_value = o_value,
    .on_headers_complete = o_headers_complete,
    .on_body = o_body,
    .on_message_complete = o_complete,
};

static void run_oracle(const char *in, size_t len, size_t split, bool request, result *r)
{
    oracle *o = calloc(1, sizeof(*o));
    assert_non_null(o);
    http_parser p;
    http_parser_init(&p, request ? HTTP_REQUEST : HTTP_RESPONSE);
    p.data = o;
    o->r = r;
    size_t cuts[2] = {split, len};
    size_t pos = 0;
    for (int k = 0; k < 2 && !r->error; k++) {
        if (cuts[k] == pos)
            continue; /* no input is what says end of input to http-parser */
        size_t n = http_parser_execute(&p, &o_settings, in + pos, cuts[k] - pos);
        if (HTTP_PARSER_ERRNO(&p) != HPE_OK || n != cuts[k] - pos)
            r->error = true;
        pos = cuts[k];
    }
    if (!request && !r->error) {
        http_parser_execute(&p, &o_settings, NULL, 0);
        if (HTTP_PARSER_ERRNO(&p) != HPE_OK)
            r->error = true;
    }
    free(o);
}

/* ---- kvgate's parser, driven as the fronts drive it ------------------------------------------ */

static void record_head(rec *m, const kvg_h1_msg *h)
{
    memset(m, 0, sizeof(*m));
    if (h->method)
        snprintf(m->method, sizeof(m->method), "%s", h->method);
    if (h->target)
        snprintf(m->url, sizeof(m->url), "%s", h->target);
    m->minor = h->minor;
    m->status = h->status;
    for (size_t i = 0; i < h->nheaders; i++) {
        add(m->headers, &m->hlen, MAX_TEXT, h->headers[i].name, h->headers[i].name_len);
        add(m->headers, &m->hlen, MAX_TEXT, "=", 1);
        add(m->headers, &m->hlen, MAX_TEXT, h->headers[i].value, h->headers[i].value_len);
        add(m->headers, &m->hlen, MAX_TEXT, "\n", 1);
    }
}

static void run_kvgate(const char *in, size_t len, size_t split, bool request, result *r)
{
    enum { START, HEAD, BODY } st = START;
    kvg_h1_scan scan = {0};
    kvg_h1_body body;
    rec *cur = calloc(1, sizeof(*cur));
    char *head = malloc(len + 1);
    assert_true(cur && head);
    size_t cuts[2] = {split, len};
    size_t pos = 0;
    for (int k = 0; k < 2 && !r->error; k++) {
        size_t avail = cuts[k];
        for (;;) {
            if (st == START) {
                while (pos < avail && (in[pos] == '\r' || in[pos] == '\n'))
                    pos++;
                if (pos == avail)
                    break;
                st = HEAD;
                memset(&scan, 0, sizeof(scan));
            }
            if (st == HEAD) {
                size_t end = kvg_h1_head_end(&scan, in + pos, avail - pos);
                if (!end) {
                    if (avail - pos > 80 * 1024)
                        r->error = true;
                    break;
                }
                memcpy(head, in + pos, end);
                head[end] = '\0';
                kvg_header *hd = calloc(scan.lines, sizeof(*hd));
                assert_non_null(hd);
                kvg_h1_msg m;
                const char *why = NULL;
                int rc = request ? kvg_h1_parse_request(head, end, &m, hd, scan.lines, &why)
                                 : kvg_h1_parse_response(head, end, &m, hd, scan.lines, &why);
                if (rc == 0 && request) {
                    kvg_h1_body_init_request(&body, &m, 0, 8192);
                    /* The front refuses a target that is not origin, absolute or "*" form, as
                     * http-parser's URL parser did (h1.c answers 400). */
                    const char *a, *pp;
                    size_t al, pl;
                    bool sl;
                    if (m.target[0] != '/' && strcmp(m.target, "*") != 0 &&
                        kvg_h1_absolute_form(m.target, m.target_len, &a, &al, &pp, &pl, &sl) < 0) {
                        rc = -EBADMSG;
                        why = "target";
                    }
                    if (strcmp(m.method, "CONNECT") == 0) {
                        rc = -EBADMSG; /* h1.c: 405; http-parser: authority form only */
                        why = "CONNECT";
                    }
                } else if (rc == 0) {
                    kvg_h1_body_init_response(&body, &m, false, 8192);
                }
                if (rc < 0)
                    assert_non_null(why);
                if (rc == 0)
                    record_head(cur, &m);
                cur->keep_alive = m.keep_alive;
                free(hd);
                if (rc < 0) {
                    r->error = true;
                    break;
                }
                pos += end;
                st = BODY;
            }
            if (st == BODY) {
                size_t used, dl;
                const char *data, *why = NULL;
                int rc = kvg_h1_body_feed(&body, in + pos, avail - pos, &used, &data, &dl, &why);
                add(cur->body, &cur->blen, MAX_BODY, data, dl);
                pos += used;
                if (rc < 0) {
                    assert_non_null(why);
                    r->error = true;
                    break;
                }
                if (rc == 1) {
                    if (r->n < MAX_MSGS)
                        r->msgs[r->n++] = *cur;
                    st = START;
                    continue;
                }
                if (pos == avail)
                    break;
            }
        }
    }
    r->in_head = st == HEAD;
    if (!request && !r->error) {
        if (st == BODY && kvg_h1_body_eof(&body)) {
            if (r->n < MAX_MSGS)
                r->msgs[r->n++] = *cur;
        } else if (st != START) {
            r->error = true; /* cut short */
        }
    }
    free(head);
    free(cur);
}

/* ---- comparison ------------------------------------------------------------------------------ */

static void dump(const char *in, size_t len)
{
    fprintf(stderr, "input (%zu bytes): \"", len);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c == '\r')
            fputs("\\r", stderr);
        else if (c == '\n')
            fputs("\\n", stderr);
        else if (c < 0x20 || c >= 0x7f)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputs("\"\n", stderr);
}

static void run_kvgate(const char *in, size_t len, size_t split, bool request, result *r);

/* kvgate finds an error in a head once the head is complete (its empty line), where
 * http-parser stops at the first bad byte; and a head that http-parser's lenient build ends at
 * "\n\r<any byte>" (D_CR) is still open for kvgate. Either way kvgate refuses the head once an
 * empty line ends it. True when that explains the difference. */
static bool refused_at_head_end(const char *in, size_t len, bool request, const result *a,
                                const result *b)
{
    if (b->error || !b->in_head || !(a->error || a->n > b->n))
        return false;
    char *more = malloc(len + 4);
    result *c = calloc(1, sizeof(*c));
    assert_true(more && c);
    memcpy(more, in, len);
    memcpy(more + len, "\r\n\r\n", 4);
    run_kvgate(more, len + 4, len + 4, request, c);
    bool refused = c->error;
    free(c);
    free(more);
    return refused;
}

static void check_same(const char *in, size_t len, size_t split, const result *a, const result *b)
{
    bool same = a->error == b->error && a->n == b->n;
    for (int i = 0; same && i < a->n; i++) {
        const rec *x = &a->msgs[i], *y = &b->msgs[i];
        same = strcmp(x->method, y->method) == 0 && strcmp(x->url, y->url) == 0 &&
               x->minor == y->minor && x->status == y->status && x->hlen == y->hlen &&
               memcmp(x->headers, y->headers, x->hlen) == 0 && x->blen == y->blen &&
               memcmp(x->body, y->body, x->blen) == 0 &&
               (x->keep_alive == y->keep_alive ||
                /* D_CONN: kvgate closes after a Connection list it reads as malformed */
                (x->keep_alive && !y->keep_alive && strstr(y->headers, "connection=")));
        if (!same)
            fprintf(stderr,
                    "message %d differs: [%s %s 1.%d %d ka=%d body %zu]\n%s vs [%s %s "
                    "1.%d %d ka=%d body %zu]\n%s\n",
                    i, x->method, x->url, x->minor, x->status, x->keep_alive, x->blen, x->headers,
                    y->method, y->url, y->minor, y->status, y->keep_alive, y->blen, y->headers);
    }
    if (!same) {
        fprintf(stderr, "split at %zu: http-parser error=%d n=%d, kvgate error=%d n=%d\n", split,
                a->error, a->n, b->error, b->n);
        dump(in, len);
        fail();
    }
}

#endif
