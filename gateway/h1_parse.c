/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate's HTTP/1.1 parser: the head found with memchr and parsed in one pass in place, the body
 * framed by a small state machine (RFC 9112). Fuzzed through fuzz_h1_request/fuzz_h1_response
 * and checked against libhttp-parser by tests/unit/gateway/test_h1_parse.c.
 *
 * Deliberate differences from Debian's http-parser 2.9.4 (built non-strict), each stricter
 * (tests/unit/gateway/test_h1_parse.c generates each one, tagged D_*):
 *  1. obs-fold (a header line starting with SP or HTAB) is refused (D_FOLD).
 *  2. Header names must be tokens, with no whitespace before the colon (D_NAME_WS; http-parser
 *     lets spaces into names; h1.c and upstream.c refused such names after it anyway).
 *  3. Only HTTP/1.0 and HTTP/1.1, spelled exactly (D_VERSION; http-parser takes any
 *     HTTP/d.d, does not check the letters of "HTTP" and takes HTTP/0.9 request lines). The
 *     front answers another HTTP/d.d with 505.
 *  4. The request line is method SP target SP version: one space each (D_SPACES); the target
 *     is visible ASCII only, no tab, form feed or bytes >= 0x80 (D_TARGET).
 *  5. The status code is 3 digits, 100-999 (D_STATUS); the reason phrase has no control but
 *     HTAB (D_REASON).
 *  6. No control but HTAB in a value's first byte either (D_CTL_FIRST: http-parser checks
 *     the other bytes only).
 *  7. CR must be followed by LF everywhere (D_CR: http-parser's non-strict build takes any
 *     byte after the CR ending a head, a chunk-size line or a trailer, and any two bytes
 *     after a chunk's data). Size lines and the line after a chunk's data end in CRLF, as
 *     http-parser requires too; only head and trailer lines may end in a bare LF.
 *  8. Chunk sizes: SP only between the digits and the extensions (http-parser refuses an
 *     HTAB too); extensions at most KVG_H1_MAX_CHUNK_LINE bytes per size line with no
 *     control but HTAB (D_EXT_CTL); trailers bounded by the caller's max_trailer, name:value
 *     lines, none of them Content-Length or Transfer-Encoding (D_TRAILER, RFC 9110 6.5.1;
 *     http-parser checks a Content-Length trailer's digits and lets a valid one through).
 *  9. 1xx, 204 and 304 responses have no body (RFC 9112 6.3); one that declares one anyway
 *     (Transfer-Encoding, or a Content-Length other than 0) is refused (D_NOBODY), where
 *     http-parser reads that body and so frames the connection differently. 101 is refused
 *     by upstream.c (a worker never switches protocols).
 * 10. Transfer-Encoding (all its fields as one list) is refused, in responses too (D_TE), with
 *     an empty element (http-parser reads "chunked," and ",chunked" as not chunked), with
 *     chunked before its end (http-parser takes chunked twice from two fields), with a coding
 *     that is a proper prefix of "chunked" (it misreads the list after "c,") or not a bare
 *     token (transfer parameters included: none is in use), or with an HTAB after the
 *     value's first byte (it takes only SP there, and refuses such a Content-Length too).
 * 11. A Connection list that is not plain tokens, commas and spaces (an empty element, an
 *     HTAB, a byte outside a token) reads as close (D_CONN: http-parser misreads some, e.g.
 *     ",keep-alive"); the connection closes after the response, where it might have been
 *     kept alive.
 * 12. Errors in a head are found once the whole head is there (its empty line), not at the
 *     first bad byte: a client that never ends a bad head meets the head timeout (408) or
 *     the size limit (431), as one that never ends a good one does.
 * Identical to http-parser: the methods it knows, and only those; any two Content-Length
 * headers are refused, even equal ones; Content-Length with Transfer-Encoding is refused
 * (requests and responses); a request whose Transfer-Encoding does not end in chunked is
 * refused, a response's is read until close; a name that merely starts with
 * "transfer-encoding" counts as a Transfer-Encoding that is not chunked (its prefix match);
 * bare LF line ends are accepted in heads; CR and LF before a message are skipped. */
#include "h1_parse.h"

#include <errno.h>
#include <string.h>

/* A size line (digits, whitespace and extensions) longer than this is refused. */
#define KVG_H1_MAX_CHUNK_LINE 4096

/* Field value bytes (RFC 9110 5.5): HTAB, SP, VCHAR, obs-text; no other control, no DEL. */
static inline bool value_char(unsigned char c)
{
    return c >= 0x20 ? c != 0x7f : c == '\t';
}

/* Eight bytes at a time: true when none is below 0x20 or DEL (no control; an HTAB makes it
 * false too, and the byte loop then takes it). Exact as a yes/no: a borrow only starts at a
 * byte that answers it. */
static inline bool value_block_ok(const char *p)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t x;
    memcpy(&x, p, sizeof(x));
    uint64_t ctl = (x - ones * 0x20) & ~x & high;
    uint64_t y = x ^ (ones * 0x7f);
    uint64_t del = (y - ones) & ~y & high;
    return (ctl | del) == 0;
}

static inline bool ows(char c)
{
    return c == ' ' || c == '\t';
}

size_t kvg_h1_head_end(kvg_h1_scan *s, const char *buf, size_t len)
{
    size_t i = s->pos;
    while (i < len) {
        const char *nl = memchr(buf + i, '\n', len - i);
        if (!nl) {
            s->pos = len;
            return 0;
        }
        size_t j = (size_t)(nl - buf);
        /* The '\n' at j is counted once the byte after it is known. */
        if (j + 1 >= len || (buf[j + 1] == '\r' && j + 2 >= len)) {
            s->pos = j;
            return 0;
        }
        s->lines++;
        if (buf[j + 1] == '\n')
            return j + 2;
        if (buf[j + 1] == '\r' && buf[j + 2] == '\n')
            return j + 3;
        i = j + 1;
    }
    s->pos = i;
    return 0;
}

/* The methods http-parser knows (http_parser.h's HTTP_METHOD_MAP), and only those: a gateway
 * that took any token would be laxer than the parser it replaced. */
static const char *const methods[] = {
    "DELETE",     "GET",      "HEAD",       "POST",     "PUT",    "CONNECT",   "OPTIONS",
    "TRACE",      "COPY",     "LOCK",       "MKCOL",    "MOVE",   "PROPFIND",  "PROPPATCH",
    "SEARCH",     "UNLOCK",   "BIND",       "REBIND",   "UNBIND", "ACL",       "REPORT",
    "MKACTIVITY", "CHECKOUT", "MERGE",      "M-SEARCH", "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE",
    "PATCH",      "PURGE",    "MKCALENDAR", "LINK",     "UNLINK", "SOURCE",
};

static const char *find_method(const char *s, size_t len)
{
    /* The two that nearly every request uses first. */
    if (len == 4 && memcmp(s, "POST", 4) == 0)
        return "POST";
    if (len == 3 && memcmp(s, "GET", 3) == 0)
        return "GET";
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        if (strlen(methods[i]) == len && memcmp(methods[i], s, len) == 0)
            return methods[i];
    return NULL;
}

/* [p, *next) is one line; returns its end without the CR (if any) before the LF. */
static char *line_end(char *p, char *end, char **next)
{
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) { /* cannot happen after kvg_h1_head_end; treat as the end */
        *next = end;
        return end;
    }
    *next = nl + 1;
    return nl > p && nl[-1] == '\r' ? nl - 1 : nl;
}

/* "HTTP/1.0" or "HTTP/1.1" at p (8 bytes available): the minor version, -EPROTONOSUPPORT for
 * another HTTP/d.d, -EBADMSG for anything else. */
static int parse_version(const char *p, size_t avail)
{
    if (avail < 8 || memcmp(p, "HTTP/", 5) != 0 || p[6] != '.')
        return -EBADMSG;
    if (p[5] < '0' || p[5] > '9' || p[7] < '0' || p[7] > '9')
        return -EBADMSG;
    if (p[5] != '1' || (p[7] != '0' && p[7] != '1'))
        return -EPROTONOSUPPORT;
    return p[7] - '0';
}

/* Comma-separated tokens of Connection. A list that is not plainly tokens separated by commas
 * and spaces (an empty element, a byte outside a token, an HTAB: http-parser misreads such
 * lists) reads as close: closing is always safe, keeping alive what http-parser closed is not. */
static void connection_tokens(kvg_h1_msg *m, const char *v, size_t len)
{
    size_t i = 0;
    for (;;) {
        size_t s = i;
        while (i < len && v[i] != ',')
            i++;
        size_t e = i;
        while (s < e && v[s] == ' ')
            s++;
        while (e > s && v[e - 1] == ' ')
            e--;
        bool token = e > s;
        for (size_t k = s; k < e; k++)
            if (!kvg_tchar_lower[(unsigned char)v[k]])
                token = false;
        if (!token)
            m->conn_close = true;
        else if (kvg_strncaseeq(v + s, e - s, "close", 5))
            m->conn_close = true;
        else if (kvg_strncaseeq(v + s, e - s, "keep-alive", 10))
            m->conn_keep_alive = true;
        else if (kvg_strncaseeq(v + s, e - s, "upgrade", 7))
            m->conn_upgrade = true;
        if (i >= len)
            break;
        i++; /* the comma */
    }
}

/* Transfer-Encoding: several fields make one list (RFC 9110 5.3); m->chunked says whether
 * the final coding so far is chunked. Returns false for a list that kvgate refuses in requests
 * and responses alike: an empty element (",chunked", "chunked,": http-parser reads neither as
 * chunked), or chunked followed by anything (applied twice, or not the final coding). */
static bool transfer_codings(kvg_h1_msg *m, const char *v, size_t len)
{
    bool ok = true;
    size_t i = 0;
    m->has_te = true;
    for (;;) {
        size_t s = i;
        while (i < len && v[i] != ',')
            i++;
        size_t e = i;
        while (s < e && ows(v[s]))
            s++;
        while (e > s && ows(v[e - 1]))
            e--;
        if (e == s || m->chunked)
            ok = false;
        /* Each coding a bare token: no parameters (none is in use), nothing http-parser's
         * matcher could misread. */
        for (size_t k = s; k < e; k++)
            if (!kvg_tchar_lower[(unsigned char)v[k]])
                ok = false;
        /* No coding is a proper prefix of chunked ("c", "chunke"); http-parser 2.9.4 misreads
         * the rest of the list after one, and so refused such requests. */
        if (e - s < 7 && kvg_strncaseeq(v + s, e - s, "chunked", e - s))
            ok = false;
        m->chunked = kvg_strncaseeq(v + s, e - s, "chunked", 7);
        if (i >= len)
            break;
        i++; /* the comma */
    }
    return ok;
}

/* The header lines from p to the end of the head. */
static int parse_headers(char *p, char *end, kvg_h1_msg *m, kvg_header *headers, size_t max,
                         bool request, const char **why)
{
    bool te_ok = true;
    m->nheaders = 0;
    m->headers = headers;
    /* Each line is read once: the value's scan stops at its first byte that is not a value
     * byte, which must be the line's end (LF, or CR LF), so the line ends are not searched
     * again (kvg_h1_head_end found them once; a memchr per line cost ~40 instructions a
     * header). The head ends with an empty line, so every scan below stops inside it. */
    for (;;) {
        if (*p == '\n' || (*p == '\r' && p[1] == '\n'))
            break; /* the empty line */
        if (ows(*p)) {
            *why = "obsolete line folding in a header";
            return -EBADMSG;
        }
        char *name = p;
        while (kvg_tchar_lower[(unsigned char)*p]) {
            *p = (char)kvg_tchar_lower[(unsigned char)*p];
            p++;
        }
        if (*p != ':' || p == name) {
            *why = "invalid header field name: only RFC 9110 token characters, and no "
                   "whitespace before the colon";
            return -EBADMSG;
        }
        size_t name_len = (size_t)(p - name);
        *p++ = '\0';
        while (ows(*p))
            p++;
        char *value = p;
        while (end - p >= 8 && value_block_ok(p))
            p += 8;
        while (value_char((unsigned char)*p))
            p++;
        char *e = p, *next;
        if (*p == '\n') {
            next = p + 1;
        } else if (*p == '\r' && p[1] == '\n') {
            next = p + 2;
        } else {
            *why = "invalid character in a header value";
            return -EBADMSG;
        }
        /* http-parser 2.9.4 takes only SP around the digits of a Content-Length and the
         * codings of a Transfer-Encoding: with an HTAB after the value's first byte it refused
         * the length and read the codings as not chunked. Both refused here. */
        if (((name_len == 14 && memcmp(name, "content-length", 14) == 0) ||
             (name_len == 17 && memcmp(name, "transfer-encoding", 17) == 0)) &&
            memchr(value, '\t', (size_t)(e - value))) {
            *why = "HTAB in a Content-Length or Transfer-Encoding value";
            return -EBADMSG;
        }
        bool conn_tab = name_len == 10 && memchr(value, '\t', (size_t)(e - value)) &&
                        memcmp(name, "connection", 10) == 0;
        while (p > value && ows(p[-1]))
            p--;
        size_t value_len = (size_t)(p - value);
        *p = '\0'; /* over OWS, CR or LF: the value ends here */
        if (m->nheaders == max) {
            *why = "too many header fields";
            return -EBADMSG;
        }
        headers[m->nheaders++] = (kvg_header){name, name_len, value, value_len};
        /* The framing and connection headers, found by length first. */
        switch (name_len) {
        case 14:
            if (memcmp(name, "content-length", 14) == 0) {
                if (m->content_length >= 0) {
                    *why = "duplicate Content-Length";
                    return -EBADMSG;
                }
                if (value_len == 0) {
                    *why = "invalid Content-Length";
                    return -EBADMSG;
                }
                uint64_t n = 0;
                for (size_t i = 0; i < value_len; i++) {
                    unsigned d = (unsigned char)value[i] - '0';
                    if (d > 9 || n > ((uint64_t)INT64_MAX - d) / 10) {
                        *why = "invalid Content-Length";
                        return -EBADMSG;
                    }
                    n = n * 10 + d;
                }
                m->content_length = (int64_t)n;
            }
            break;
        case 17:
            if (memcmp(name, "transfer-encoding", 17) == 0)
                te_ok &= transfer_codings(m, value, value_len);
            break;
        case 10:
            if (memcmp(name, "connection", 10) == 0) {
                connection_tokens(m, value, value_len);
                m->conn_close |= conn_tab;
            }
            break;
        case 7:
            if (memcmp(name, "upgrade", 7) == 0)
                m->has_upgrade = true;
            break;
        default:
            /* http-parser 2.9.4 flags Transfer-Encoding once a name starts with it
             * ("Transfer-Encoding-X"), and so refused such requests (not chunked) and framed
             * such responses until close. Kept: the front refuses what it refused. */
            if (name_len > 17 && memcmp(name, "transfer-encoding", 17) == 0)
                m->has_te = true;
            break;
        }
        p = next;
    }
    if (m->has_te && m->content_length >= 0) {
        *why = "Content-Length together with Transfer-Encoding";
        return -EBADMSG;
    }
    if (!te_ok) {
        *why = "invalid Transfer-Encoding";
        return -EBADMSG;
    }
    if (request && m->has_te && !m->chunked) {
        *why = "request has invalid transfer-encoding";
        return -EBADMSG;
    }
    m->keep_alive = m->minor == 1 ? !m->conn_close : m->conn_keep_alive && !m->conn_close;
    return 0;
}

static void msg_init(kvg_h1_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->content_length = -1;
}

int kvg_h1_parse_request(char *buf, size_t len, kvg_h1_msg *m, kvg_header *headers, size_t max,
                         const char **why)
{
    msg_init(m);
    char *end = buf + len;
    char *next;
    char *e = line_end(buf, end, &next);
    char *p = buf;
    while (p < e && kvg_tchar_lower[(unsigned char)*p])
        p++;
    m->method = find_method(buf, (size_t)(p - buf));
    if (!m->method || p == e || *p != ' ') {
        *why = "invalid HTTP method";
        return -EBADMSG;
    }
    m->method_len = (size_t)(p - buf);
    char *t = ++p;
    while (p < e && (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f)
        p++;
    if (p == t || p == e || *p != ' ') {
        *why = "invalid URL";
        return -EBADMSG;
    }
    m->target = t;
    m->target_len = (size_t)(p - t);
    *p++ = '\0';
    int minor = parse_version(p, (size_t)(e - p));
    if (minor < 0 || e - p != 8) {
        *why = minor == -EPROTONOSUPPORT ? "HTTP version not supported" : "invalid HTTP version";
        return minor == -EPROTONOSUPPORT && e - p == 8 ? -EPROTONOSUPPORT : -EBADMSG;
    }
    m->minor = minor;
    int rc = parse_headers(next, end, m, headers, max, true, why);
    if (rc < 0)
        return rc;
    if ((m->has_upgrade && m->conn_upgrade) || strcmp(m->method, "CONNECT") == 0)
        m->upgrade = true;
    return 0;
}

int kvg_h1_parse_response(char *buf, size_t len, kvg_h1_msg *m, kvg_header *headers, size_t max,
                          const char **why)
{
    msg_init(m);
    char *end = buf + len;
    char *next;
    char *e = line_end(buf, end, &next);
    int minor = parse_version(buf, (size_t)(e - buf));
    if (minor < 0) {
        *why = "invalid HTTP version";
        return -EBADMSG;
    }
    m->minor = minor;
    char *p = buf + 8;
    if (e - p < 4 || p[0] != ' ' || p[1] < '1' || p[1] > '9' || p[2] < '0' || p[2] > '9' ||
        p[3] < '0' || p[3] > '9' || (e - p > 4 && p[4] != ' ')) {
        *why = "invalid HTTP status code";
        return -EBADMSG;
    }
    m->status = (p[1] - '0') * 100 + (p[2] - '0') * 10 + (p[3] - '0');
    p += e - p > 4 ? 5 : 4;
    m->reason = p;
    for (; p < e; p++)
        if (!value_char((unsigned char)*p)) {
            *why = "invalid character in the reason phrase";
            return -EBADMSG;
        }
    m->reason_len = (size_t)(p - m->reason);
    *p = '\0';
    int rc = parse_headers(next, end, m, headers, max, false, why);
    if (rc == 0 && (m->status < 200 || m->status == 204 || m->status == 304) &&
        (m->has_te || m->content_length > 0)) {
        *why = "a 1xx, 204 or 304 response that declares a body";
        return -EBADMSG;
    }
    return rc;
}

/* ---- bodies ---------------------------------------------------------------------------------- */

enum {
    CS_SIZE = 0, /* chunk-size hex digits */
    CS_SIZE_WS,  /* spaces after the digits */
    CS_EXT,      /* chunk extensions, ignored */
    CS_SIZE_LF,  /* CR seen, LF next */
    CS_DATA,     /* chunk data */
    CS_DATA_CR,  /* CRLF after the data */
    CS_DATA_LF,  /* CR seen after the data, LF next */
    CS_TR_START, /* start of a trailer line, or the empty line */
    CS_TR_NAME,  /* trailer name */
    CS_TR_VALUE, /* trailer value */
    CS_TR_LF,    /* CR seen in a trailer line, LF next */
    CS_END_LF,   /* CR of the last empty line seen, LF next */
    CS_STATE_COUNT,
};

static const char *const mode_names[KVG_H1_BODY_MODE_COUNT] = {"none", "length", "chunked",
                                                               "close"};

const char *kvg_h1_body_mode_str(kvg_h1_body_mode m)
{
    return (unsigned)m < KVG_H1_BODY_MODE_COUNT ? mode_names[m] : "?";
}

static void body_set(kvg_h1_body *b, kvg_h1_body_mode mode, uint64_t left)
{
    memset(b, 0, sizeof(*b));
    b->mode = mode;
    b->left = left;
    b->done = mode == KVG_H1_BODY_NONE;
}

void kvg_h1_body_init_request(kvg_h1_body *b, const kvg_h1_msg *m, uint64_t max, size_t max_trailer)
{
    if (m->chunked)
        body_set(b, KVG_H1_BODY_CHUNKED, 0);
    else if (m->content_length > 0)
        body_set(b, KVG_H1_BODY_LENGTH, (uint64_t)m->content_length);
    else
        body_set(b, KVG_H1_BODY_NONE, 0); /* neither: no body (RFC 9112 6.3) */
    b->max = max;
    b->max_trailer = max_trailer;
}

void kvg_h1_body_init_response(kvg_h1_body *b, kvg_h1_msg *m, bool head_request, size_t max_trailer)
{
    if (head_request || m->status < 200 || m->status == 204 || m->status == 304)
        body_set(b, KVG_H1_BODY_NONE, 0);
    else if (m->chunked)
        body_set(b, KVG_H1_BODY_CHUNKED, 0);
    else if (m->content_length >= 0)
        body_set(b, m->content_length ? KVG_H1_BODY_LENGTH : KVG_H1_BODY_NONE,
                 (uint64_t)m->content_length);
    else {
        body_set(b, KVG_H1_BODY_CLOSE, 0);
        m->keep_alive = false;
    }
    b->max_trailer = max_trailer;
}

bool kvg_h1_body_eof(kvg_h1_body *b)
{
    if (b->mode == KVG_H1_BODY_CLOSE)
        b->done = true;
    return b->done;
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Match a trailer name against content-length (bit 0) and transfer-encoding (bit 1). */
static void trailer_name_byte(kvg_h1_body *b, unsigned char c)
{
    static const char cl[] = "content-length", te[] = "transfer-encoding";
    unsigned char l = kvg_tchar_lower[c];
    if (b->line >= sizeof(cl) - 1 || cl[b->line] != l)
        b->framing &= ~1u;
    if (b->line >= sizeof(te) - 1 || te[b->line] != l)
        b->framing &= ~2u;
    b->line++;
}

/* One step of the chunked coding's framing (everything but the data). */
static int chunk_byte(kvg_h1_body *b, unsigned char c, const char **why)
{
    switch (b->state) {
    case CS_SIZE: {
        int d = hexval(c);
        if (d >= 0) {
            /* http-parser's bound: sizes from 2^60 - 1 on are refused */
            if (b->left > (UINT64_MAX - 16) / 16) {
                *why = "invalid chunk size";
                return -EBADMSG;
            }
            b->left = b->left << 4 | (unsigned)d;
            b->size_digits = true;
            break;
        }
        if (!b->size_digits) {
            *why = "invalid chunk size";
            return -EBADMSG;
        }
        if (c == ' ') /* BWS before the extensions; SP only, as http-parser takes it */
            b->state = CS_SIZE_WS;
        else if (c == ';')
            b->state = CS_EXT;
        else if (c == '\r')
            b->state = CS_SIZE_LF;
        else {
            *why = "invalid chunk size";
            return -EBADMSG;
        }
        break;
    }
    case CS_SIZE_WS:
        if (c == ';')
            b->state = CS_EXT;
        else if (c == '\r')
            b->state = CS_SIZE_LF;
        else if (c != ' ') {
            *why = "invalid chunk size";
            return -EBADMSG;
        }
        break;
    case CS_EXT:
        if (c == '\r')
            b->state = CS_SIZE_LF;
        else if (!value_char(c)) {
            *why = "invalid character in a chunk extension";
            return -EBADMSG;
        }
        break;
    case CS_SIZE_LF:
        if (c != '\n') {
            *why = "CR not followed by LF in a chunk size line";
            return -EBADMSG;
        }
        goto size_done;
    case CS_DATA_CR:
        if (c == '\r')
            b->state = CS_DATA_LF;
        else {
            *why = "chunk data not followed by CRLF";
            return -EBADMSG;
        }
        break;
    case CS_DATA_LF:
        if (c != '\n') {
            *why = "chunk data not followed by CRLF";
            return -EBADMSG;
        }
        b->state = CS_SIZE;
        break;
    case CS_TR_START:
        if (c == '\r')
            b->state = CS_END_LF;
        else if (c == '\n')
            b->done = true;
        else if (kvg_tchar_lower[c]) {
            b->state = CS_TR_NAME;
            b->line = 0;
            b->framing = 3;
            trailer_name_byte(b, c);
        } else {
            *why = "invalid trailer";
            return -EBADMSG;
        }
        break;
    case CS_TR_NAME:
        if (c == ':') {
            /* Framing fields have no place in trailers (RFC 9110 6.5.1). */
            if ((b->framing & 1 && b->line == 14) || (b->framing & 2 && b->line == 17)) {
                *why = "Content-Length or Transfer-Encoding in trailers";
                return -EBADMSG;
            }
            b->state = CS_TR_VALUE;
        } else if (kvg_tchar_lower[c]) {
            trailer_name_byte(b, c);
        } else {
            *why = "invalid trailer";
            return -EBADMSG;
        }
        break;
    case CS_TR_VALUE:
        if (c == '\r')
            b->state = CS_TR_LF;
        else if (c == '\n')
            b->state = CS_TR_START;
        else if (!value_char(c)) {
            *why = "invalid trailer";
            return -EBADMSG;
        }
        break;
    case CS_TR_LF:
        if (c != '\n') {
            *why = "invalid trailer";
            return -EBADMSG;
        }
        b->state = CS_TR_START;
        break;
    case CS_END_LF:
        if (c != '\n') {
            *why = "invalid trailer";
            return -EBADMSG;
        }
        b->done = true;
        break;
    default:
        *why = "invalid chunked state";
        return -EBADMSG;
    }
    return 0;

size_done:
    b->size_digits = false;
    b->line = 0;
    if (b->left == 0) {
        b->state = CS_TR_START;
        return 0;
    }
    if (b->max && b->left > b->max - (b->total < b->max ? b->total : b->max)) {
        *why = "request body too large";
        return -E2BIG;
    }
    b->state = CS_DATA;
    return 0;
}

int kvg_h1_body_feed(kvg_h1_body *b, const char *in, size_t len, size_t *used, const char **data,
                     size_t *data_len, const char **why)
{
    *used = 0;
    *data = NULL;
    *data_len = 0;
    if (b->done)
        return 1;
    switch (b->mode) {
    case KVG_H1_BODY_NONE:
        b->done = true;
        return 1;
    case KVG_H1_BODY_CLOSE:
        *data = in;
        *data_len = *used = len;
        b->total += len;
        return 0;
    case KVG_H1_BODY_LENGTH: {
        size_t n = len < b->left ? len : (size_t)b->left;
        *data = in;
        *data_len = *used = n;
        b->left -= n;
        b->total += n;
        b->done = b->left == 0;
        return b->done;
    }
    case KVG_H1_BODY_CHUNKED:
    default:
        break;
    }
    size_t i = 0;
    while (i < len && !b->done) {
        if (b->state == CS_DATA) {
            size_t n = len - i < b->left ? len - i : (size_t)b->left;
            *data = in + i;
            *data_len = n;
            b->left -= n;
            b->total += n;
            i += n;
            if (b->left == 0)
                b->state = CS_DATA_CR;
            break; /* one span per call */
        }
        if (b->state <= CS_SIZE_LF) {
            if (++b->line > KVG_H1_MAX_CHUNK_LINE) {
                *used = i;
                *why = "chunk size line too long";
                return -EBADMSG;
            }
        } else if (b->state >= CS_TR_START) {
            if (++b->trailer > b->max_trailer) {
                *used = i;
                *why = "trailers too large";
                return -EMSGSIZE;
            }
        }
        int rc = chunk_byte(b, (unsigned char)in[i], why);
        if (rc < 0) {
            *used = i;
            return rc;
        }
        i++;
    }
    *used = i;
    return b->done;
}

/* ---- request targets ------------------------------------------------------------------------- */

int kvg_h1_absolute_form(const char *target, size_t len, const char **authority,
                         size_t *authority_len, const char **path, size_t *path_len,
                         bool *path_slash)
{
    size_t i = 0;
    while (i < len && target[i] != ':')
        i++;
    if (!kvg_strncaseeq(target, i, "http", 4) && !kvg_strncaseeq(target, i, "https", 5))
        return -EINVAL;
    if (len - i < 3 || memcmp(target + i, "://", 3) != 0)
        return -EINVAL;
    size_t a = i + 3;
    size_t ae = a;
    while (ae < len && target[ae] != '/' && target[ae] != '?' && target[ae] != '#')
        ae++;
    /* userinfo@ is not part of the authority that replaces Host */
    for (size_t k = ae; k > a; k--)
        if (target[k - 1] == '@') {
            a = k;
            break;
        }
    if (ae == a)
        return -EINVAL;
    *authority = target + a;
    *authority_len = ae - a;
    *path_slash = ae == len || target[ae] != '/';
    if (ae < len && target[ae] == '#')
        ae = len; /* a fragment alone: the path is "/" */
    *path = target + ae;
    *path_len = len - ae;
    return 0;
}
