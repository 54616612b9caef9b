/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP/1.1 front: parses requests with http-parser (Debian's libhttp-parser, the nodejs parser:
 * requests and responses, chunked, smuggling checks, long fuzzed), one exchange at a time per
 * connection, keep-alive, 100-continue, chunked or length-delimited responses. */
#include <errno.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "conn.h"
#include "gateway_int.h"

typedef enum h1_state {
    H1_IDLE = 0, /* between requests */
    H1_HEAD,     /* inside a request head */
    H1_BODY,     /* request head delivered, body being read (or discarded) */
    H1_WAIT,     /* request complete; the response is under way */
    H1_CLOSING,  /* flushing the last bytes, then close */
    H1_STATE_COUNT,
} h1_state;

typedef struct h1_conn {
    kvg_conn *conn;
    http_parser parser;
    h1_state state;
    kvg_exchange *x;
    kvg_buf url;
    kvg_buf field;
    kvg_buf value;
    bool in_value;
    size_t head_bytes;
    size_t nheaders, cap_headers;
    kvg_header *headers;   /* in x->arena */
    bool paused_for_head;  /* parser paused at end of head, waiting for the handler */
    bool message_complete; /* parser saw the end of the request */
    bool body_wanted;      /* the handler asked for the body */
    bool discard_body;     /* the handler answered early: drop the body */
    bool keep_alive;
    bool head_request;
    bool chunked_response;
    bool response_complete;
    bool close_after; /* no keep-alive after this response */
    bool continue_sent;
    bool upgrade;
    bool reused; /* a request was answered: the next head's deadline starts at its first byte */
    int pending_error; /* status of an error found inside a parser callback */
    const char *pending_error_msg;
    int pending_body_rc;     /* kvg_exchange_body_append's refusal, answered by its own rules */
    struct event process_ev; /* re-run the parse loop outside callbacks */
} h1_conn;

static const char *h1_state_str(h1_state st)
{
    static const char *const names[H1_STATE_COUNT] = {"idle", "head", "body", "wait", "closing"};
    return (unsigned)st < H1_STATE_COUNT ? names[st] : "?";
}

static void h1_process(h1_conn *h);
static void h1_finish_exchange(h1_conn *h);

static const char *reason_phrase(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 204:
        return "No Content";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return status < 300   ? "OK"
               : status < 400 ? "Redirect"
               : status < 500 ? "Error"
                              : "Server Error";
    }
}

/* ---- exchange ops --------------------------------------------------------------------------- */

static struct evbuffer *h1_output(h1_conn *h)
{
    return h->conn->sock.out;
}

static void op_read_body(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    if (h->body_wanted || h->discard_body)
        return;
    h->body_wanted = true;
    if (x->expect_continue && !h->continue_sent && !h->message_complete) {
        evbuffer_add(h1_output(h), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        kvg_sock_flush_soon(&h->conn->sock);
        h->continue_sent = true;
    }
    event_active(&h->process_ev, EV_READ, 0);
}

static void op_send_head(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    /* Answering before the body was read: either drop the rest of the body or close, since the
     * client may still be sending it (or waiting for a 100 we will not send). */
    if (!h->message_complete && !h->body_wanted) {
        if (x->expect_continue && !h->continue_sent)
            h->close_after = true;
        else
            h->discard_body = true;
    }
    if (h->conn->thread->draining || !h->keep_alive || h->upgrade)
        h->close_after = true;
    /* The head is composed in the thread's scratch buffer and added to the output once. */
    kvg_buf *b = &h->conn->thread->scratch;
    char num[24];
    int st = x->status >= 100 && x->status <= 999 ? x->status : 500;
    kvg_buf_reset(b);
    kvg_buf_append(b, "HTTP/1.1 ", 9);
    kvg_buf_append(b, num, kvg_fmt_u64(num, (uint64_t)st));
    kvg_buf_putc(b, ' ');
    kvg_buf_puts(b, reason_phrase(st));
    kvg_buf_append(b, "\r\n", 2);
    for (size_t i = 0; i < x->resp_nheaders; i++) {
        kvg_header *hd = &x->resp_headers[i];
        kvg_buf_append(b, hd->name, hd->name_len);
        kvg_buf_append(b, ": ", 2);
        kvg_buf_append(b, hd->value, hd->value_len);
        kvg_buf_append(b, "\r\n", 2);
    }
    bool no_body = h->head_request || x->status == 204 || x->status == 304 || x->status < 200;
    if (x->resp_content_length >= 0) {
        if (x->status != 204 && x->status != 304) {
            kvg_buf_append(b, "content-length: ", 16);
            kvg_buf_append(b, num, kvg_fmt_u64(num, (uint64_t)x->resp_content_length));
            kvg_buf_append(b, "\r\n", 2);
        }
    } else if (!no_body) {
        if (h->parser.http_major == 1 && h->parser.http_minor >= 1) {
            h->chunked_response = true;
            kvg_buf_append(b, "transfer-encoding: chunked\r\n", 28);
        } else {
            h->close_after = true; /* HTTP/1.0: the end of the body is the end of the connection */
        }
    }
    if (h->close_after)
        kvg_buf_append(b, "connection: close\r\n\r\n", 21);
    else if (h->parser.http_minor == 0)
        kvg_buf_append(b, "connection: keep-alive\r\n\r\n", 26);
    else
        kvg_buf_append(b, "\r\n", 2);
    if (b->failed) {
        /* Out of memory: a dropped connection beats a wrong response. The close is deferred,
         * so the caller may go on using x until then. */
        kvg_buf_done(b);
        kvg_conn_close(h->conn);
        return;
    }
    evbuffer_add(h1_output(h), b->data, b->len);
    kvg_sock_flush_soon(&h->conn->sock);
}

static void op_send_data(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    size_t len = evbuffer_get_length(x->out);
    if (len == 0)
        return;
    if (h->head_request) {
        evbuffer_drain(x->out, len);
        return;
    }
    struct evbuffer *out = h1_output(h);
    if (h->chunked_response)
        evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add_buffer(out, x->out);
    if (h->chunked_response)
        evbuffer_add(out, "\r\n", 2);
    kvg_sock_flush_soon(&h->conn->sock);
}

static void op_send_end(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    op_send_data(x);
    if (h->chunked_response && !h->head_request) {
        evbuffer_add(h1_output(h), "0\r\n\r\n", 5);
        kvg_sock_flush_soon(&h->conn->sock);
    }
    h->response_complete = true;
    /* The whole response is queued in order; the connection can move to the next request
     * while the bytes drain (unless the request body is still arriving). */
    if (h->message_complete || h->close_after)
        h1_finish_exchange(h);
}

static void op_reset(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    kvg_conn *c = h->conn;
    /* With chunked or Content-Length framing a cut shows (no terminating chunk, too few
     * bytes), so the client first gets what is already queued for it: the head and the events
     * the worker produced before it failed. Closing at once would discard them, and a client
     * whose socket was behind would see no response at all. */
    bool framed = h->chunked_response || (kvg_exchange_head_sent(x) && x->resp_content_length >= 0);
    /* The client must see a broken response, not a short one that looks complete: drop the
     * connection without the terminating chunk. */
    h->close_after = true;
    h->x = NULL;
    h->state = H1_CLOSING;
    kvg_exchange_front_finish(x);
    if (!framed || evbuffer_get_length(h1_output(h)) == 0) {
        kvg_conn_close(c);
        return;
    }
    /* write_cb closes once the output is flushed; a client that stops reading is dropped at
     * the idle timeout (h1_timeout closes in H1_CLOSING). */
    kvg_sock_read(&c->sock, false);
    c->sock.drain_notify = true;
    kvg_sock_flush_soon(&c->sock);
    kvg_conn_linger(c);
}

static size_t op_pending(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    return evbuffer_get_length(h1_output(h));
}

static void op_release(kvg_exchange *x)
{
    kvg_exchange_done(x);
    free(x);
}

static uint64_t op_progress(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    return h->conn->sock.bytes_written;
}

static void op_abort_stalled(kvg_exchange *x)
{
    h1_conn *h = x->proto_data;
    kvg_conn_close(h->conn); /* the stream is the connection */
}

static const kvg_exchange_ops h1_ops = {
    .read_body = op_read_body,
    .send_head = op_send_head,
    .send_data = op_send_data,
    .send_end = op_send_end,
    .reset = op_reset,
    .pending = op_pending,
    .release = op_release,
    .progress = op_progress,
    .abort_stalled = op_abort_stalled,
};

/* ---- request lifecycle ---------------------------------------------------------------------- */

static void h1_reset_request_state(h1_conn *h)
{
    kvg_buf_reset(&h->url);
    kvg_buf_reset(&h->field);
    kvg_buf_reset(&h->value);
    h->in_value = false;
    h->head_bytes = 0;
    h->nheaders = h->cap_headers = 0;
    h->headers = NULL;
    h->paused_for_head = h->message_complete = h->body_wanted = h->discard_body = false;
    h->head_request = h->chunked_response = h->response_complete = false;
    h->continue_sent = false;
    h->pending_error = 0;
    h->pending_body_rc = 0;
}

/* The front is done with the current exchange: the response is fully queued. */
static void h1_finish_exchange(h1_conn *h)
{
    kvg_exchange *x = h->x;
    if (!x)
        return;
    h->x = NULL;
    kvg_exchange_front_finish(x);
    kvg_conn *c = h->conn;
    if (h->close_after || c->thread->draining) {
        h->state = H1_CLOSING;
        kvg_sock_read(&c->sock, false);
        c->sock.drain_notify = true; /* write_cb closes once the last byte is out */
        if (evbuffer_get_length(h1_output(h)) == 0)
            kvg_conn_close(c);
        else
            kvg_conn_linger(c);
        return;
    }
    h->state = H1_IDLE;
    h->reused = true;
    h1_reset_request_state(h);
    http_parser_pause(&h->parser, 0);
    kvg_conn_set_timer(c, c->thread->gw->cfg.limits.idle_timeout_ms);
    /* Pipelined requests may already be buffered. */
    event_active(&h->process_ev, EV_READ, 0);
}

/* Errors found before a handler took the request: answer and close. A refused body append
 * (body_rc) is answered by kvg_exchange_send_body_error, status and msg otherwise. */
static void h1_fail(h1_conn *h, int status, const char *msg, int body_rc)
{
    kvg_conn *c = h->conn;
    if (!body_rc) /* a refusal by a budget or the upload rate is no protocol error */
        c->thread->gw->stats.protocol_errors++;
    h->close_after = true;
    if (!h->x) {
        /* No exchange yet (garbage before a request line): build one for the error response so
         * it is logged like any other. */
        kvg_exchange *x = calloc(1, sizeof(*x));
        if (!x || kvg_exchange_init(x, &c->thread->exchange_env, c->thread, KVG_PROTO_HTTP1,
                                    &h1_ops, h) < 0) {
            free(x);
            kvg_conn_close(c);
            return;
        }
        snprintf(x->remote, sizeof(x->remote), "%s", c->remote);
        x->method = "-";
        x->path = "-";
        kvg_thread_request_id(c->thread, x->request_id, sizeof(x->request_id));
        h->x = x;
    }
    kvg_exchange *x = h->x;
    if (kvg_exchange_head_sent(x)) {
        op_reset(x);
        return;
    }
    /* A handler that was working on it is told the request is gone. */
    kvg_exchange_deliver_abort(x);
    h->message_complete = true; /* nothing more will be read */
    if (body_rc)
        kvg_exchange_send_body_error(x, body_rc);
    else
        kvg_exchange_send_error(x, status, "invalid_request_error", "%s", msg);
    if (h->x == x)
        h1_finish_exchange(h);
}

static int cb_message_begin(http_parser *p)
{
    h1_conn *h = p->data;
    h->state = H1_HEAD;
    /* The first head keeps the deadline of the connect (conn.c): a fresh one here would let a
     * client spend a header timeout on the TLS handshake, another before its first byte and a
     * third on the head. */
    if (h->reused)
        kvg_conn_set_timer(h->conn, h->conn->thread->gw->cfg.limits.header_timeout_ms);
    return 0;
}

static int count_head(h1_conn *h, size_t len)
{
    h->head_bytes += len;
    if (h->head_bytes > h->conn->thread->gw->cfg.limits.header_bytes) {
        h->pending_error = 431;
        h->pending_error_msg = "request header fields too large";
        return -1;
    }
    return 0;
}

static int cb_url(http_parser *p, const char *at, size_t len)
{
    h1_conn *h = p->data;
    if (count_head(h, len) < 0)
        return -1;
    kvg_buf_append(&h->url, at, len);
    return 0;
}

static int push_header(h1_conn *h)
{
    kvg_exchange *x = h->x;
    if (h->nheaders == h->cap_headers) {
        size_t cap = h->cap_headers ? h->cap_headers * 2 : 16;
        kvg_header *nh = kvg_arena_alloc(&x->arena, cap * sizeof(*nh));
        if (!nh)
            return -1;
        if (h->nheaders)
            memcpy(nh, h->headers, h->nheaders * sizeof(*nh));
        h->headers = nh;
        h->cap_headers = cap;
    }
    char *name = kvg_arena_strndup(&x->arena, h->field.data ? h->field.data : "", h->field.len);
    char *value = kvg_arena_strndup(&x->arena, h->value.data ? h->value.data : "", h->value.len);
    if (!name || !value)
        return -1;
    /* Debian's http-parser is built lenient: it lets spaces into a name and still matches
     * "Content-Length :" as a framing header, while the name kept here would not match the
     * hop-by-hop filter and would be forwarded next to the gateway's own length (request
     * smuggling). RFC 9112 5.1: 400. Only names that pass reach the handler, so only they can
     * reach a worker's head. (Values: http-parser refuses every control but tab in them,
     * lenient build or not.) */
    if (!kvg_http_token_lower(name, h->field.len)) {
        h->pending_error = 400;
        h->pending_error_msg = "invalid header field name: only RFC 9110 token characters, "
                               "and no whitespace before the colon";
        return -1;
    }
    /* Optional whitespace around values is not part of them (RFC 9110 5.5). */
    size_t vlen = h->value.len;
    while (vlen && (value[vlen - 1] == ' ' || value[vlen - 1] == '\t'))
        value[--vlen] = '\0';
    h->headers[h->nheaders++] = (kvg_header){name, h->field.len, value, vlen};
    kvg_buf_reset(&h->field);
    kvg_buf_reset(&h->value);
    return 0;
}

static int ensure_exchange(h1_conn *h)
{
    if (h->x)
        return 0;
    kvg_conn *c = h->conn;
    kvg_exchange *x = calloc(1, sizeof(*x));
    if (!x || kvg_exchange_init(x, &c->thread->exchange_env, c->thread, KVG_PROTO_HTTP1, &h1_ops,
                                h) < 0) {
        free(x);
        return -1;
    }
    x->handler = c->listener->handler;
    x->tls = c->tls;
    x->scheme = c->tls ? "https" : "http";
    x->body_limit = c->thread->gw->cfg.limits.body_bytes;
    /* The operator's admin requests are not held to the budget the front can exhaust. */
    x->body_budgeted = !c->listener->is_admin;
    snprintf(x->remote, sizeof(x->remote), "%s", c->remote);
    h->x = x;
    return 0;
}

static int cb_header_field(http_parser *p, const char *at, size_t len)
{
    h1_conn *h = p->data;
    if (count_head(h, len) < 0)
        return -1;
    if (ensure_exchange(h) < 0)
        return -1;
    if (h->in_value) {
        if (push_header(h) < 0)
            return -1;
        h->in_value = false;
    }
    kvg_buf_append(&h->field, at, len);
    return 0;
}

static int cb_header_value(http_parser *p, const char *at, size_t len)
{
    h1_conn *h = p->data;
    if (count_head(h, len) < 0)
        return -1;
    h->in_value = true;
    kvg_buf_append(&h->value, at, len);
    return 0;
}

/* RFC 9112 3.2.2: a server must accept the absolute form (http://host/path), which clients
 * talking to a proxy send. Its authority replaces Host; the path is what is routed. */
static int absolute_form(kvg_exchange *x)
{
    struct http_parser_url u;
    http_parser_url_init(&u);
    if (http_parser_parse_url(x->path, strlen(x->path), 0, &u) != 0 ||
        !(u.field_set & (1 << UF_SCHEMA)) || !(u.field_set & (1 << UF_HOST)))
        return -1;
    const char *scheme = x->path + u.field_data[UF_SCHEMA].off;
    size_t slen = u.field_data[UF_SCHEMA].len;
    if (!kvg_strcaseeq(scheme, slen, "http") && !kvg_strcaseeq(scheme, slen, "https"))
        return -1;
    /* The authority runs from the host to the start of the path (port included). */
    size_t a_off = u.field_data[UF_HOST].off;
    if (a_off > 0 && x->path[a_off - 1] == '[')
        a_off--;
    size_t a_end = (u.field_set & (1 << UF_PATH))    ? u.field_data[UF_PATH].off
                   : (u.field_set & (1 << UF_QUERY)) ? u.field_data[UF_QUERY].off - 1u
                                                     : strlen(x->path);
    const char *authority = kvg_arena_strndup(&x->arena, x->path + a_off, a_end - a_off);
    const char *path;
    if (u.field_set & (1 << UF_PATH))
        path = kvg_arena_strdup(&x->arena, x->path + u.field_data[UF_PATH].off);
    else if (u.field_set & (1 << UF_QUERY)) {
        const char *q = x->path + u.field_data[UF_QUERY].off - 1; /* from the '?' */
        char *p = kvg_arena_alloc(&x->arena, strlen(q) + 2);
        if (p) {
            p[0] = '/';
            strcpy(p + 1, q);
        }
        path = p;
    } else {
        path = "/";
    }
    if (!authority || !path)
        return -1;
    x->authority = authority;
    x->path = path;
    return 0;
}

static int cb_headers_complete(http_parser *p)
{
    h1_conn *h = p->data;
    if (ensure_exchange(h) < 0)
        return -1;
    if (h->in_value && push_header(h) < 0)
        return -1;
    h->in_value = false;
    if (h->url.failed || h->field.failed || h->value.failed)
        return -1;
    kvg_exchange *x = h->x;
    x->method = http_method_str((enum http_method)p->method);
    x->path = kvg_arena_strndup(&x->arena, h->url.data ? h->url.data : "", h->url.len);
    x->headers = h->headers;
    x->nheaders = h->nheaders;
    if (!x->path)
        return -1;
    x->authority = kvg_exchange_header(x, "host", NULL);
    if (p->flags & F_CONTENTLENGTH)
        x->content_length = (int64_t)p->content_length;
    else if (!(p->flags & F_CHUNKED))
        x->content_length = 0; /* a request without either has no body (RFC 9112 6.3) */
    size_t elen;
    const char *expect = kvg_exchange_header(x, "expect", &elen);
    if (expect) {
        if (!kvg_strcaseeq(expect, elen, "100-continue")) {
            h->pending_error = 417;
            h->pending_error_msg = "unsupported Expect header";
            return -1;
        }
        x->expect_continue = true;
    }
    h->keep_alive = http_should_keep_alive(p) != 0;
    h->head_request = p->method == HTTP_HEAD;
    h->upgrade = p->upgrade;
    if (p->method == HTTP_CONNECT) {
        h->pending_error = 405;
        h->pending_error_msg = "CONNECT is not supported";
        return -1;
    }
    kvg_exchange_set_request_id(x);
    if (x->path[0] != '/' && !(p->method == HTTP_OPTIONS && strcmp(x->path, "*") == 0) &&
        absolute_form(x) < 0) {
        h->pending_error = 400;
        h->pending_error_msg = "request target must be an absolute path or an absolute URI";
        return -1;
    }
    if (x->content_length > 0 && (uint64_t)x->content_length > x->body_limit) {
        h->pending_error = 413;
        h->pending_error_msg = "request body too large";
        return -1;
    }
    h->state = H1_BODY;
    h->paused_for_head = true;
    kvg_conn_set_timer(h->conn, h->conn->thread->gw->cfg.limits.read_timeout_ms);
    http_parser_pause(p, 1);
    return 0;
}

static int cb_body(http_parser *p, const char *at, size_t len)
{
    h1_conn *h = p->data;
    kvg_exchange *x = h->x;
    if (!x)
        return 0;
    x->bytes_in += len;
    if (x->bytes_in > x->body_limit) {
        h->pending_error = 413;
        h->pending_error_msg = "request body too large";
        return -1;
    }
    int rc = h->discard_body ? 0 : kvg_exchange_body_append(x, at, len);
    if (rc < 0) {
        h->pending_error = 503;
        h->pending_body_rc = rc;
        return -1;
    }
    kvg_conn_set_timer(h->conn, h->conn->thread->gw->cfg.limits.read_timeout_ms);
    return 0;
}

/* p->content_length is the size of the chunk that starts. One that cannot fit under the body
 * limit is refused now: waiting for its bytes would hold the connection until the read
 * timeout for a body that is refused anyway. */
static int cb_chunk_header(http_parser *p)
{
    h1_conn *h = p->data;
    kvg_exchange *x = h->x;
    if (x && p->content_length > x->body_limit - KVG_MIN(x->bytes_in, x->body_limit)) {
        h->pending_error = 413;
        h->pending_error_msg = "request body too large";
        return -1;
    }
    return 0;
}

static int cb_message_complete(http_parser *p)
{
    h1_conn *h = p->data;
    h->message_complete = true;
    h->state = H1_WAIT;
    kvg_conn_set_timer(h->conn, 0);
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings h1_settings = {
    .on_message_begin = cb_message_begin,
    .on_url = cb_url,
    .on_header_field = cb_header_field,
    .on_header_value = cb_header_value,
    .on_headers_complete = cb_headers_complete,
    .on_body = cb_body,
    .on_chunk_header = cb_chunk_header,
    .on_message_complete = cb_message_complete,
};

/* Feed buffered input to the parser until it pauses, errs or runs out. */
static void h1_process(h1_conn *h)
{
    kvg_conn *c = h->conn;
    struct evbuffer *in = c->sock.in;
    for (;;) {
        if (c->closing || h->state == H1_CLOSING)
            return;
        if (h->paused_for_head) {
            h->paused_for_head = false;
            kvg_exchange_deliver_head(h->x);
            if (!h->x || c->closing)
                return;
            if (!h->body_wanted && !h->discard_body && !kvg_exchange_head_sent(h->x))
                return; /* the handler decides later; op_read_body resumes us */
            http_parser_pause(&h->parser, 0);
        }
        if (h->state == H1_BODY && !h->body_wanted && !h->discard_body)
            return;
        if (h->message_complete) {
            if (h->x && !h->x->body_complete && h->body_wanted) {
                kvg_exchange *x = h->x;
                kvg_exchange_deliver_body(x);
            } else if (h->x && h->response_complete) {
                h1_finish_exchange(h);
            }
            return; /* resumed by h1_finish_exchange */
        }
        size_t avail = evbuffer_get_length(in);
        if (avail == 0)
            return;
        struct evbuffer_iovec vec;
        if (evbuffer_peek(in, -1, NULL, &vec, 1) < 1)
            return;
        size_t n = http_parser_execute(&h->parser, &h1_settings, vec.iov_base, vec.iov_len);
        evbuffer_drain(in, n);
        kvg_sock_consumed(&c->sock);
        enum http_errno err = HTTP_PARSER_ERRNO(&h->parser);
        if (err == HPE_PAUSED)
            continue;
        if (err != HPE_OK) {
            int status = h->pending_error ? h->pending_error : 400;
            const char *msg = h->pending_error_msg;
            if (!h->pending_error) {
                if (err == HPE_HEADER_OVERFLOW) {
                    status = 431;
                    msg = "request header fields too large";
                } else {
                    msg = http_errno_description(err);
                }
            }
            h1_fail(h, status, msg, h->pending_body_rc);
            return;
        }
    }
}

static void process_cb(evutil_socket_t fd, short what, void *arg)
{
    h1_process(arg);
}

static void read_cb(kvg_sock *sock, void *arg)
{
    h1_conn *h = ((kvg_conn *)arg)->proto_state;
    h1_process(h);
}

static void write_cb(kvg_sock *sock, void *arg)
{
    kvg_conn *c = arg;
    h1_conn *h = c->proto_state;
    if (h->state == H1_CLOSING) {
        if (evbuffer_get_length(h1_output(h)) == 0)
            kvg_conn_close(c);
        return;
    }
    if (h->x)
        kvg_exchange_deliver_writable(h->x);
}

static void event_cb(kvg_sock *sock, int what, void *arg)
{
    kvg_conn *c = arg;
    h1_conn *h = c->proto_state;
    /* EOF counts as the client giving up, as nginx treats it: a half-closed HTTP/1.1
     * connection is almost always a client that is gone, and its upstream work is wasted. */
    if (h->x) {
        kvg_exchange *x = h->x;
        h->x = NULL;
        kvg_exchange_front_finish(x);
    }
    kvg_conn_close(c);
}

static void h1_free(kvg_conn *c)
{
    h1_conn *h = c->proto_state;
    if (!h)
        return;
    if (h->x) {
        kvg_log_debug("connection from %s closed in state %s, response %s", c->remote,
                      h1_state_str(h->state), kvg_exchange_resp_str(h->x->resp));
        kvg_exchange *x = h->x;
        h->x = NULL;
        kvg_exchange_front_finish(x);
    }
    event_del(&h->process_ev);
    kvg_buf_done(&h->url);
    kvg_buf_done(&h->field);
    kvg_buf_done(&h->value);
    free(h);
    c->proto_state = NULL;
}

static void h1_drain(kvg_conn *c)
{
    h1_conn *h = c->proto_state;
    /* Idle keep-alive connections go now; busy ones close after their response. */
    if (!h->x && (h->state == H1_IDLE))
        kvg_conn_close(c);
    else
        h->close_after = true;
}

static void h1_timeout(h1_conn *h)
{
    kvg_conn *c = h->conn;
    if (h->state == H1_HEAD || (h->state == H1_BODY && h->x && !kvg_exchange_head_sent(h->x))) {
        c->thread->gw->stats.timeouts++;
        h1_fail(h, 408, "timed out reading the request", 0);
        return;
    }
    kvg_conn_close(c);
}

static void timer_hook(kvg_conn *c)
{
    h1_timeout(c->proto_state);
}

static bool busy_hook(kvg_conn *c)
{
    h1_conn *h = c->proto_state;
    return h->x && (h->state == H1_BODY || h->state == H1_WAIT);
}

int kvg_h1_start(kvg_conn *c)
{
    h1_conn *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->conn = c;
    http_parser_init(&h->parser, HTTP_REQUEST);
    h->parser.data = h;
    kvg_buf_init(&h->url);
    kvg_buf_init(&h->field);
    kvg_buf_init(&h->value);
    event_assign(&h->process_ev, c->thread->base, -1, 0, process_cb, h);
    c->proto = KVG_PROTO_HTTP1;
    c->proto_known = true;
    c->proto_state = h;
    c->proto_free = h1_free;
    c->proto_drain = h1_drain;
    c->proto_timeout = timer_hook; /* the connect's header deadline runs on (conn.c) */
    c->proto_busy = busy_hook;
    const kvg_front_limits *lim = &c->thread->gw->cfg.limits;
    /* Bound what a pipelining client can park in our input buffer. */
    c->sock.read_high = lim->header_bytes + 65536;
    c->sock.write_low = KVG_EXCHANGE_LOW_WATER;
    kvg_sock_set_callbacks(&c->sock, read_cb, write_cb, event_cb, c);
    kvg_sock_read(&c->sock, true);
    if (!c->listener->is_admin) /* the front's series: admin connections are not traffic */
        c->thread->gw->stats.connections_total[KVG_PROTO_HTTP1]++;
    event_active(&h->process_ev, EV_READ, 0);
    return 0;
}
