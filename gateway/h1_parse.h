/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate's HTTP/1.1 message parser: a head parser over a contiguous buffer and a body framer,
 * used by the client front (h1.c) and the worker client (upstream.c). */
#ifndef KVG_GATEWAY_H1_PARSE_H
#define KVG_GATEWAY_H1_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exchange.h"

/* The head is found first (kvg_h1_head_end, resumable across reads), then parsed in one pass
 * over a mutable copy: names are lowercased in place, and every name, value, the target and the
 * reason are NUL-terminated in place, so kvg_header entries point into the copy. The grammar is
 * RFC 9112's, stricter than Debian's (lenient) http-parser in the ways h1_parse.c lists; a line
 * may end in CRLF or a bare LF, as http-parser accepts. */

/** Where kvg_h1_head_end is in a head that is still arriving. Zero it before a new head. */
typedef struct kvg_h1_scan {
    size_t pos;   /* where the next scan starts */
    size_t lines; /* non-empty lines ended so far: bounds the number of headers */
} kvg_h1_scan;

/** Length of the head at buf (through the empty line that ends it), or 0 while it is not all
 *  there; call again with the same scan and a longer buf (same prefix). buf must not start with
 *  CR or LF (the caller skips the empty lines a peer may send between messages). After a
 *  non-zero answer, s->lines bounds the headers that kvg_h1_parse_* may find. */
size_t kvg_h1_head_end(kvg_h1_scan *s, const char *buf, size_t len);

/** A parsed head. Pointers point into the caller's buffer or static strings. */
typedef struct kvg_h1_msg {
    const char *method; /* request: the method, a static string (as http_method_str names it) */
    size_t method_len;
    char *target; /* request: the request target, NUL-terminated in place */
    size_t target_len;
    int status; /* response: 100-999 */
    const char *reason;
    size_t reason_len;
    int minor; /* HTTP/1.<minor>: 0 or 1 */
    kvg_header *headers;
    size_t nheaders;
    int64_t content_length; /* -1 when absent */
    bool chunked;           /* Transfer-Encoding's final coding is chunked */
    bool has_te;            /* a Transfer-Encoding header is present */
    bool conn_close;        /* Connection: close */
    bool conn_keep_alive;   /* Connection: keep-alive */
    bool conn_upgrade;      /* Connection: upgrade */
    bool has_upgrade;       /* an Upgrade header is present */
    bool keep_alive;        /* the connection persists after this message (framing aside) */
    bool upgrade;           /* request: Upgrade with Connection: upgrade, or CONNECT */
} kvg_h1_msg;

/** Parse the request head buf[0, len) found by kvg_h1_head_end, in place (see above). headers
 *  has room for max entries (s->lines is enough). Returns 0 with *m filled, or -EBADMSG
 *  (malformed: 400), -EPROTONOSUPPORT (a version other than HTTP/1.0 and 1.1: 505); *why then
 *  says why in a few words. Framing errors of requests (Content-Length with Transfer-Encoding,
 *  a Transfer-Encoding not ending in chunked, duplicate Content-Length) are -EBADMSG. */
int kvg_h1_parse_request(char *buf, size_t len, kvg_h1_msg *m, kvg_header *headers, size_t max,
                         const char **why);
/** Parse a response head, as kvg_h1_parse_request. Errors are -EBADMSG (any version other than
 *  HTTP/1.0 and 1.1 included). */
int kvg_h1_parse_response(char *buf, size_t len, kvg_h1_msg *m, kvg_header *headers, size_t max,
                          const char **why);

typedef enum kvg_h1_body_mode {
    KVG_H1_BODY_NONE = 0, /* no body: complete at once */
    KVG_H1_BODY_LENGTH,   /* Content-Length bytes */
    KVG_H1_BODY_CHUNKED,  /* chunked coding, trailers read and dropped */
    KVG_H1_BODY_CLOSE,    /* response: until the connection closes */
    KVG_H1_BODY_MODE_COUNT,
} kvg_h1_body_mode;

const char *kvg_h1_body_mode_str(kvg_h1_body_mode m);

/** The body framer of one message. */
typedef struct kvg_h1_body {
    kvg_h1_body_mode mode;
    int state;          /* chunked: where in the coding */
    bool done;          /* the message is complete */
    uint64_t left;      /* LENGTH: bytes left; CHUNKED: bytes left in the chunk */
    uint64_t total;     /* body bytes delivered so far */
    uint64_t max;       /* CHUNKED: a chunk that would take total past it is refused; 0: none */
    size_t line;        /* CHUNKED: bytes of the current size line */
    size_t trailer;     /* CHUNKED: trailer bytes so far */
    size_t max_trailer; /* CHUNKED: trailer bytes allowed */
    bool size_digits;   /* CHUNKED: the size line has a digit */
    unsigned framing;   /* CHUNKED: the trailer name may still be a framing field's */
} kvg_h1_body;

/** Frame a request body from its head (kvg_h1_parse_request succeeded). max bounds chunk sizes
 *  (-E2BIG from kvg_h1_body_feed past it; 0: none), max_trailer the trailer bytes. */
void kvg_h1_body_init_request(kvg_h1_body *b, const kvg_h1_msg *m, uint64_t max,
                              size_t max_trailer);
/** Frame a response body (RFC 9112 6.3): none for 1xx, 204, 304 and answers to HEAD; chunked,
 *  Content-Length, or until close. Also clears m->keep_alive for a close-delimited body. */
void kvg_h1_body_init_response(kvg_h1_body *b, kvg_h1_msg *m, bool head_request,
                               size_t max_trailer);

/** Feed input in[0, len) to the framer. *used: bytes consumed; *data, *data_len: body bytes
 *  found (a span of in; at most one per call; deliver it before dropping in). Returns 1 when
 *  the message is complete (bytes after *used belong to the next one), 0 when more is needed or
 *  the call stopped after a span (call again with the rest), or -EBADMSG (malformed chunked
 *  coding), -E2BIG (a chunk past b->max), -EMSGSIZE (trailers past max_trailer); *why then
 *  says why. */
int kvg_h1_body_feed(kvg_h1_body *b, const char *in, size_t len, size_t *used, const char **data,
                     size_t *data_len, const char **why);
/** The peer closed the connection: true when that completes the message (a close-delimited
 *  body, or one already complete). */
bool kvg_h1_body_eof(kvg_h1_body *b);

/** Split an absolute-form request target (RFC 9112 3.2.2: http or https, case-insensitive)
 *  into its authority (host and port; userinfo dropped) and the origin-form path (with the
 *  query; "/" when empty). Returns 0 with the spans (pointing into target, except a path of
 *  "/" or one that starts with '?', for which *path_slash is set: prepend '/'), or -EINVAL. */
int kvg_h1_absolute_form(const char *target, size_t len, const char **authority,
                         size_t *authority_len, const char **path, size_t *path_len,
                         bool *path_slash);

#endif
