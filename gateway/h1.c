/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP/1.1 front: parses requests with kvgate's own parser (h1_parse.c: the head found and
 * parsed in place in one copy, the body framed without callbacks), one exchange at a time per
 * connection, keep-alive, 100-continue, chunked or length-delimited responses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "conn.h"
#include "gateway_int.h"
#include "h1_parse.h"

/* limits.header_bytes bounds the request target, names and values (431); the whole head, with
 * its method, version, separators and line ends, may take this much more (http-parser's hard
 * backstop was header_bytes + 4096, gateway.c). */
#define H1_HEAD_SLACK 4096u

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
    h1_state state;
    kvg_exchange *x;
    kvg_h1_scan scan;       /* the head being looked for */
    kvg_h1_body body;       /* the request body's framing */
    int minor;              /* HTTP/1.<minor> of the current request */
    uint64_t head_start_ns; /* a head that took more than one read: when it started */
    bool paused_for_head;   /* a head was parsed: the handler gets it before the body is read */
    bool message_complete;  /* the framer saw the end of the request */
    bool body_wanted;       /* the handler asked for the body */
    bool discard_body;      /* the handler answered early: drop the body */
    bool keep_alive;
    bool head_request;
    bool chunked_response;
    bool response_complete;
    bool close_after; /* no keep-alive after this response */
    bool continue_sent;
    bool upgrade;
    bool reused; /* a request was answered: the next head's deadline starts at its first byte */
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
        if (h->minor >= 1) {
            h->chunked_response = true;
            kvg_buf_append(b, "transfer-encoding: chunked\r\n", 28);
        } else {
            h->close_after = true; /* HTTP/1.0: the end of the body is the end of the connection */
        }
    }
    if (h->close_after)
        kvg_buf_append(b, "connection: close\r\n\r\n", 21);
    else if (h->minor == 0)
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
    kvg_exchange_free(x);
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
    memset(&h->scan, 0, sizeof(h->scan));
    memset(&h->body, 0, sizeof(h->body));
    h->head_start_ns = 0;
    h->paused_for_head = h->message_complete = h->body_wanted = h->discard_body = false;
    h->head_request = h->chunked_response = h->response_complete = false;
    h->continue_sent = false;
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
        kvg_exchange *x =
            kvg_exchange_new(&c->thread->exchange_env, c->thread, KVG_PROTO_HTTP1, &h1_ops, h);
        if (!x) {
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

static int ensure_exchange(h1_conn *h)
{
    if (h->x)
        return 0;
    kvg_conn *c = h->conn;
    kvg_exchange *x =
        kvg_exchange_new(&c->thread->exchange_env, c->thread, KVG_PROTO_HTTP1, &h1_ops, h);
    if (!x)
        return -1;
    x->handler = c->listener->handler;
    x->tls = c->tls;
    x->scheme = c->tls ? "https" : "http";
    x->body_limit = c->thread->gw->cfg.limits.body_bytes;
    /* The operator's admin requests are not held to the budget the front can exhaust. */
    x->body_budgeted = !c->listener->is_admin;
    _Static_assert(sizeof(x->remote) == sizeof(c->remote), "one address size");
    memcpy(x->remote, c->remote, sizeof(x->remote));
    if (h->head_start_ns) { /* the request started at its first byte, not when its head ended */
        x->start_ns = h->head_start_ns;
    }
    h->x = x;
    return 0;
}

/* RFC 9112 3.2.2: a server must accept the absolute form (http://host/path), which clients
 * talking to a proxy send. Its authority replaces Host; the path is what is routed. */
static int absolute_form(kvg_exchange *x)
{
    const char *auth, *path;
    size_t auth_len, path_len;
    bool slash;
    if (kvg_h1_absolute_form(x->path, strlen(x->path), &auth, &auth_len, &path, &path_len, &slash) <
        0)
        return -1;
    const char *authority = kvg_arena_strndup(&x->arena, auth, auth_len);
    char *p = kvg_arena_alloc(&x->arena, path_len + 2);
    if (!authority || !p)
        return -1;
    size_t n = 0;
    if (slash)
        p[n++] = '/';
    memcpy(p + n, path, path_len);
    p[n + path_len] = '\0';
    x->authority = authority;
    x->path = p;
    return 0;
}

static size_t head_limit(h1_conn *h)
{
    return h->conn->thread->gw->cfg.limits.header_bytes + H1_HEAD_SLACK;
}

/* The bytes limits.header_bytes counts, as the front counted them with http-parser: the target,
 * the names and the values. */
static size_t head_content(const kvg_h1_msg *m)
{
    size_t n = m->target_len;
    for (size_t i = 0; i < m->nheaders; i++)
        n += m->headers[i].name_len + m->headers[i].value_len;
    return n;
}

/* What used to be http-parser's on_headers_complete: the request head is parsed into x. 0, or
 * -1 after answering an error. */
static int h1_take_head(h1_conn *h, const kvg_h1_msg *m)
{
    kvg_exchange *x = h->x;
    x->method = m->method;
    x->path = m->target;
    x->headers = m->headers;
    x->nheaders = m->nheaders;
    x->authority = kvg_exchange_header(x, "host", NULL);
    if (m->content_length >= 0)
        x->content_length = m->content_length;
    else if (!m->chunked)
        x->content_length = 0; /* a request without either has no body (RFC 9112 6.3) */
    size_t elen;
    const char *expect = kvg_exchange_header(x, "expect", &elen);
    if (expect) {
        if (!kvg_strcaseeq(expect, elen, "100-continue")) {
            h1_fail(h, 417, "unsupported Expect header", 0);
            return -1;
        }
        x->expect_continue = true;
    }
    h->minor = m->minor;
    h->keep_alive = m->keep_alive;
    h->head_request = strcmp(m->method, "HEAD") == 0;
    h->upgrade = m->upgrade;
    if (strcmp(m->method, "CONNECT") == 0) {
        h1_fail(h, 405, "CONNECT is not supported", 0);
        return -1;
    }
    kvg_exchange_set_request_id(x);
    if (x->path[0] != '/' && !(strcmp(m->method, "OPTIONS") == 0 && strcmp(x->path, "*") == 0) &&
        absolute_form(x) < 0) {
        h1_fail(h, 400, "request target must be an absolute path or an absolute URI", 0);
        return -1;
    }
    if (x->content_length > 0 && (uint64_t)x->content_length > x->body_limit) {
        h1_fail(h, 413, "request body too large", 0);
        return -1;
    }
    /* Chunks that cannot fit under the body limit are refused at their size line: waiting for
     * their bytes would hold the connection until the read timeout for a body that is refused
     * anyway. Trailers are held to the head's limit, as they were with http-parser. */
    kvg_h1_body_init_request(&h->body, m, x->body_limit,
                             h->conn->thread->gw->cfg.limits.header_bytes);
    h->state = H1_BODY;
    h->paused_for_head = true;
    kvg_conn_set_timer(h->conn, h->conn->thread->gw->cfg.limits.read_timeout_ms);
    return 0;
}

/* Look for the request head in the input; once it is all there, copy it into the exchange's
 * arena once and parse it there in place. 1: a head was taken (paused_for_head), 0: more input
 * is needed, or the request failed and was answered. */
static int h1_read_head(h1_conn *h)
{
    kvg_conn *c = h->conn;
    if (h->state == H1_IDLE) {
        /* Empty lines before a request line are ignored (RFC 9112 2.2), as http-parser did. */
        if (!kvg_sock_skip_line_ends(&c->sock))
            return 0;
        h->state = H1_HEAD;
        /* The first head keeps the deadline of the connect (conn.c): a fresh one here would
         * let a client spend a header timeout on the TLS handshake, another before its first
         * byte and a third on the head. */
        if (h->reused)
            kvg_conn_set_timer(c, c->thread->gw->cfg.limits.header_timeout_ms);
    }
    size_t limit = head_limit(h);
    size_t want = KVG_MIN(evbuffer_get_length(c->sock.in), limit);
    bool oom;
    char *p = kvg_sock_contiguous(&c->sock, want, &oom);
    if (!p) {
        if (oom)
            kvg_conn_close(c);
        return 0;
    }
    size_t end = kvg_h1_head_end(&h->scan, p, want);
    if (!end) {
        if (want >= limit) {
            h1_fail(h, 431, "request header fields too large", 0);
            return 0;
        }
        if (!h->head_start_ns)
            h->head_start_ns = kvg_sock_clock_ns();
        return 0;
    }
    if (ensure_exchange(h) < 0) {
        kvg_conn_close(c);
        return 0;
    }
    kvg_exchange *x = h->x;
    kvg_header *headers = kvg_arena_alloc(&x->arena, h->scan.lines * sizeof(*headers));
    char *head = headers ? kvg_sock_take(&c->sock, end, &x->arena) : NULL;
    if (!head) {
        h1_fail(h, 431, "request header fields too large", 0);
        return 0;
    }
    kvg_h1_msg m;
    const char *why = "malformed request";
    int rc = kvg_h1_parse_request(head, end, &m, headers, h->scan.lines, &why);
    if (rc < 0) {
        /* For the access log: what the request line gave, if it was valid. */
        x->method = m.target ? m.method : "-";
        x->path = m.target ? m.target : "-";
        h1_fail(h, rc == -EPROTONOSUPPORT ? 505 : 400, why, 0);
        return 0;
    }
    if (head_content(&m) > c->thread->gw->cfg.limits.header_bytes) {
        x->method = m.method;
        x->path = m.target;
        h1_fail(h, 431, "request header fields too large", 0);
        return 0;
    }
    return h1_take_head(h, &m) == 0;
}

/* The request body is complete: the parser's on_message_complete, as it was. */
static void h1_message_complete(h1_conn *h)
{
    h->message_complete = true;
    h->state = H1_WAIT;
    kvg_conn_set_timer(h->conn, 0);
}

/* Frame the next span of the request body and hand it over. 1: go on, 0: stop (more input is
 * needed, or the request failed and was answered). */
static int h1_read_body(h1_conn *h)
{
    kvg_conn *c = h->conn;
    struct evbuffer *in = c->sock.in;
    struct evbuffer_iovec v;
    if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
        return 0;
    size_t used, len;
    const char *data;
    const char *why = "malformed request body";
    int rc = kvg_h1_body_feed(&h->body, v.iov_base, v.iov_len, &used, &data, &len, &why);
    kvg_exchange *x = h->x;
    if (len && x) {
        x->bytes_in += len;
        if (x->bytes_in > x->body_limit) {
            evbuffer_drain(in, used);
            kvg_sock_consumed(&c->sock);
            h1_fail(h, 413, "request body too large", 0);
            return 0;
        }
        int brc = h->discard_body ? 0 : kvg_exchange_body_append(x, data, len);
        if (brc < 0) {
            evbuffer_drain(in, used);
            kvg_sock_consumed(&c->sock);
            h1_fail(h, 503, NULL, brc);
            return 0;
        }
        kvg_conn_set_timer(c, c->thread->gw->cfg.limits.read_timeout_ms);
    }
    evbuffer_drain(in, used);
    kvg_sock_consumed(&c->sock);
    if (rc < 0) {
        h1_fail(h, rc == -E2BIG ? 413 : rc == -EMSGSIZE ? 431 : 400, why, 0);
        return 0;
    }
    if (rc == 1)
        h1_message_complete(h);
    return 1;
}

/* Run the request state machine over buffered input until it waits or fails. */
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
        if (h->state == H1_BODY && h->body.done) {
            h1_message_complete(h);
            continue;
        }
        if (evbuffer_get_length(in) == 0)
            return;
        if (!(h->state == H1_BODY ? h1_read_body(h) : h1_read_head(h)))
            return;
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
    h->minor = 1;
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
