/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-loadgen's runner: a pool of keep-alive HTTP/1.1 connections, one request in flight on
 * each, driven by libevent's evhttp client.
 *
 * Why evhttp is adequate for a client load generator: it is already a project dependency
 * (libevent_extra, Debian 12), it runs on the same event_base as our timers and signals, and it
 * does what this tool needs without a hand-written HTTP parser (STYLE forbids an unfuzzed one):
 * persistent HTTP/1.1 connections that reconnect by themselves when the server closes them,
 * chunked decoding, delivery of the body as it arrives (evhttp_request_set_chunked_cb, which is
 * what time to first token is measured on), limits on header and body size, and I/O timeouts.
 * One event loop with one request per connection keeps the client's own cost per request to a
 * few microseconds, far below what a gateway and its workers spend, so the numbers describe
 * the server. What it lacks is HTTP/2: this tool measures the HTTP/1.1 front that the OpenAI
 * SDKs and curl use; h2load covers h2.
 *
 * With several --url, connection i goes to URL i mod n for the whole run: what a plain L4
 * (TCP) balancer in front of gateway replicas does, spreading connections and leaving each
 * connection's requests on the replica it reached.
 *
 * Lifetimes follow libevent's rules: evhttp owns and frees each request after its completion
 * callback, so a slot never keeps the pointer past that; the next request of a slot is started
 * from a deferred event, never from inside evhttp's callbacks. */
#include "loadgen.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kvg_config.h"

#define MAX_HEADERS_BYTES (64u << 10)
#define MAX_SSE_EVENT_BYTES (1u << 20) /* one SSE line or event */
#define DETAIL_MAX 200                 /* bytes of an error body kept for the report */
#define HOST_MAX 256
#define PATH_MAX_LEN 1024
#define FD_HEADROOM 64

typedef enum slot_state {
    SLOT_IDLE = 0, /* no request; waiting for its kick */
    SLOT_BUSY,     /* a request is in evhttp's hands */
    SLOT_STATE_COUNT,
} slot_state;

static const char *slot_state_str(slot_state s)
{
    static const char *const names[SLOT_STATE_COUNT] = {"idle", "busy"};
    return s < SLOT_STATE_COUNT ? names[s] : "?";
}

typedef struct runner runner;

/* Where one --url's connections go: resolved once, so reconnects never block on DNS. */
typedef struct target {
    char addr[NI_MAXHOST]; /* numeric */
    uint16_t port;
    char host_header[HOST_MAX + 16];
    char path[PATH_MAX_LEN];
} target;

/* One connection of the pool and the request on it. */
typedef struct slot {
    runner *r;
    size_t id;
    slot_state state;
    size_t url; /* index of its target: every request of the slot goes there */
    struct evhttp_connection *evcon;
    struct evhttp_request *req; /* owned by evhttp; valid only while BUSY */
    struct event deadline;      /* --timeout-ms for the whole request */
    struct event kick;          /* deferred start of the next request */
    kvg_arena arena;            /* the workload item of the current request */
    kvg_buf request_body;
    kvg_buf body;      /* non-streaming body, or the start of an error body */
    size_t body_bytes; /* everything received, streams included */
    lg_sse sse;
    lg_stream stream;
    lg_usage usage; /* of a non-streaming response */
    int stream_rc;  /* first error parsing the stream, 0 when none */
    uint64_t t_start, t_first;
    int status;
    char worker[LG_WORKER_NAME_MAX + 1];
    lg_outcome transport; /* set by evhttp's error callback; LG_OK when none */
    const char *transport_detail;
    char errbuf[96];
    bool cancelling; /* we called evhttp_cancel_request: ignore its error callback */
    bool too_large;
} slot;

struct runner {
    const lg_config *cfg;
    const lg_workload *wl;
    lg_stats *stats;
    struct event_base *base;
    slot *slots;
    size_t n_slots;
    size_t busy;
    uint64_t next_index;
    bool stopping; /* no new requests */
    bool interrupted;
    struct event *stop_timer;
    struct event *sig_int;
    struct event *sig_term;
    uint64_t t_begin, t_last;
    struct timeval timeout;
    lg_body_opts body_opts;
    target *targets; /* one per --url */
    size_t n_targets;
    char **authorization; /* "Bearer KEY" per API key */
    size_t n_authorization;
};

/* ---- URL ------------------------------------------------------------------------------------ */

/* Requests go to the base URL's path + /v1/chat/completions, unless the URL already names the
 * endpoint or ends in /v1 (the OpenAI SDKs' base_url convention). */
static int build_path(const char *upath, char *out, size_t cap)
{
    static const char endpoint[] = "/chat/completions";
    const char *p = upath ? upath : "";
    size_t n = strlen(p);
    while (n > 0 && p[n - 1] == '/')
        n--;
    const char *suffix = "/v1/chat/completions";
    if (n >= strlen(endpoint) && memcmp(p + n - strlen(endpoint), endpoint, strlen(endpoint)) == 0)
        suffix = "";
    else if (n >= 3 && memcmp(p + n - 3, "/v1", 3) == 0)
        suffix = endpoint;
    int w = snprintf(out, cap, "%.*s%s", (int)n, p, suffix);
    return w < 0 || (size_t)w >= cap ? KVG_ECONFIG : 0;
}

static int parse_url(target *t, const char *url)
{
    int rc = KVG_ECONFIG;
    struct evhttp_uri *u = evhttp_uri_parse_with_flags(url, 0);
    if (!u) {
        fprintf(stderr, "kvgate-loadgen: --url %s: not a URL\n", url);
        return KVG_ECONFIG;
    }
    const char *scheme = evhttp_uri_get_scheme(u);
    const char *host = evhttp_uri_get_host(u);
    int port = evhttp_uri_get_port(u);
    if (!scheme || strcmp(scheme, "http") != 0) {
        fprintf(stderr,
                "kvgate-loadgen: --url %s: only http:// is supported (TLS: use a "
                "cleartext listener or a local proxy)\n",
                url);
        goto out;
    }
    if (!host || !host[0] || strlen(host) > HOST_MAX) {
        fprintf(stderr, "kvgate-loadgen: --url %s: needs a host\n", url);
        goto out;
    }
    if (port == 0 || port > 65535) {
        fprintf(stderr, "kvgate-loadgen: --url %s: bad port\n", url);
        goto out;
    }
    t->port = (uint16_t)(port < 0 ? 80 : port);
    /* evhttp keeps an IPv6 literal's brackets on some versions and not on others. */
    char bare[HOST_MAX + 1];
    size_t hl = strlen(host);
    if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']')
        snprintf(bare, sizeof(bare), "%.*s", (int)(hl - 2), host + 1);
    else
        snprintf(bare, sizeof(bare), "%s", host);
    bool v6 = strchr(bare, ':') != NULL;
    if (port < 0)
        snprintf(t->host_header, sizeof(t->host_header), v6 ? "[%s]" : "%s", bare);
    else
        snprintf(t->host_header, sizeof(t->host_header), v6 ? "[%s]:%d" : "%s:%d", bare, port);
    if (build_path(evhttp_uri_get_path(u), t->path, sizeof(t->path)) < 0) {
        fprintf(stderr, "kvgate-loadgen: --url %s: path too long\n", url);
        goto out;
    }

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    char service[8];
    snprintf(service, sizeof(service), "%u", (unsigned)t->port);
    int gai = getaddrinfo(bare, service, &hints, &res);
    if (gai != 0 || !res) {
        fprintf(stderr, "kvgate-loadgen: --url %s: cannot resolve %s: %s\n", url, bare,
                gai_strerror(gai));
        goto out;
    }
    gai = getnameinfo(res->ai_addr, res->ai_addrlen, t->addr, sizeof(t->addr), NULL, 0,
                      NI_NUMERICHOST);
    freeaddrinfo(res);
    if (gai != 0) {
        fprintf(stderr, "kvgate-loadgen: --url %s: %s\n", url, gai_strerror(gai));
        goto out;
    }
    rc = 0;
out:
    evhttp_uri_free(u);
    return rc;
}

/* ---- one request ---------------------------------------------------------------------------- */

static void kick(slot *s)
{
    event_active(&s->kick, EV_TIMEOUT, 1);
}

static void keep_worker_name(slot *s, struct evhttp_request *req)
{
    const struct evkeyvalq *h = evhttp_request_get_input_headers(req);
    const char *name = h ? evhttp_find_header(h, "x-kvgate-worker") : NULL;
    if (!name && h)
        name = evhttp_find_header(h, "x-simworker-name");
    if (!name)
        return;
    size_t n = 0;
    for (; name[n] && n < LG_WORKER_NAME_MAX; n++) {
        unsigned char c = (unsigned char)name[n];
        s->worker[n] = c > 0x20 && c < 0x7f ? (char)c : '?';
    }
    s->worker[n] = '\0';
}

/* Record the finished request and free the slot for the next one. */
static void finish(slot *s, lg_outcome outcome, const char *detail, size_t detail_len)
{
    runner *r = s->r;
    if (s->state != SLOT_BUSY)
        return;
    uint64_t now = kvg_now_ns();
    lg_result res = {
        .outcome = outcome,
        .status = s->status,
        .latency_us = (now - s->t_start) / 1000,
        .ttft_us = s->t_first ? (s->t_first - s->t_start) / 1000 : 0,
        .has_ttft = s->t_first != 0 && outcome == LG_OK,
        .usage = r->cfg->stream ? s->stream.usage : s->usage,
        .detail = detail,
        .detail_len = detail_len,
        .url = s->url,
    };
    memcpy(res.worker, s->worker, sizeof(res.worker));
    lg_stats_add(r->stats, &res);
    kvg_log_debug("loadgen: slot %zu %s -> %s, status %d, %llu us", s->id, slot_state_str(s->state),
                  lg_outcome_str(outcome), s->status, (unsigned long long)res.latency_us);

    evtimer_del(&s->deadline);
    s->req = NULL;
    s->state = SLOT_IDLE;
    r->busy--;
    r->t_last = now;
    kick(s);
}

static void cancel(slot *s, lg_outcome outcome, const char *why)
{
    if (s->state != SLOT_BUSY || !s->req)
        return;
    s->cancelling = true;
    evhttp_cancel_request(s->req); /* frees it; its error callback sees `cancelling` */
    s->req = NULL;
    finish(s, outcome, why, strlen(why));
}

static int on_headers(struct evhttp_request *req, void *arg)
{
    slot *s = arg;
    s->status = evhttp_request_get_response_code(req);
    keep_worker_name(s, req);
    return 0;
}

static int on_sse_event(void *arg, const char *data, size_t len)
{
    slot *s = arg;
    int rc = lg_stream_event(&s->stream, data, len);
    if (rc == 1 && !s->t_first)
        s->t_first = kvg_now_ns();
    return rc < 0 ? rc : 0;
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    slot *s = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t avail = evbuffer_get_length(in);
    s->body_bytes += avail;
    if (s->body_bytes > s->r->cfg->max_response_bytes)
        s->too_large = true; /* evhttp's own limit ends the request; keep nothing more */
    bool ok = s->status >= 200 && s->status < 300;
    bool parse_stream = s->r->cfg->stream && ok && !s->too_large && s->stream_rc == 0;
    /* evhttp drains the input after this callback; read it in place. */
    struct evbuffer_iovec vec[16];
    int nvec = evbuffer_peek(in, -1, NULL, vec, (int)KVG_ARRAY_LEN(vec));
    if (nvec > (int)KVG_ARRAY_LEN(vec)) {
        evbuffer_pullup(in, -1);
        nvec = evbuffer_peek(in, -1, NULL, vec, 1);
    }
    for (int i = 0; i < nvec && nvec > 0; i++) {
        const char *p = vec[i].iov_base;
        size_t n = vec[i].iov_len;
        if (parse_stream) {
            s->stream_rc = lg_sse_feed(&s->sse, p, n, on_sse_event, s);
            parse_stream = s->stream_rc == 0;
        } else if (!ok && s->body.len < DETAIL_MAX) {
            /* Error bodies are kept only as far as the report shows them. */
            kvg_buf_append(&s->body, p, KVG_MIN(n, DETAIL_MAX - s->body.len));
        } else if (ok && !s->r->cfg->stream && !s->too_large) {
            kvg_buf_append(&s->body, p, n);
        }
    }
}

static void on_error(enum evhttp_request_error err, void *arg)
{
    slot *s = arg;
    int saved = errno; /* evhttp restores the socket error before calling us */
    if (s->cancelling)
        return;
    kvg_log_debug("loadgen: slot %zu: evhttp error %d after status %d, %zu bytes", s->id, (int)err,
                  s->status, s->body_bytes);
    switch (err) {
    case EVREQ_HTTP_TIMEOUT:
        s->transport = LG_TIMEOUT;
        s->transport_detail = "no progress on the connection within --timeout-ms";
        break;
    case EVREQ_HTTP_INVALID_HEADER:
        s->transport = LG_BAD_HEADERS;
        s->transport_detail = "malformed status line or headers";
        break;
    case EVREQ_HTTP_DATA_TOO_LONG:
        /* evhttp reports oversized headers, bodies and broken chunk framing alike. */
        s->transport = s->status ? LG_TOO_LARGE : LG_BAD_HEADERS;
        s->transport_detail = s->status ? "body over --max-response-bytes, or bad chunk framing"
                                        : "headers over 64 KiB";
        break;
    case EVREQ_HTTP_EOF:
        s->transport = LG_CONNECTION;
        s->transport_detail =
            s->status ? "connection closed mid-response" : "connection closed before a response";
        break;
    case EVREQ_HTTP_BUFFER_ERROR:
    case EVREQ_HTTP_REQUEST_CANCEL:
    default:
        s->transport = LG_CONNECTION;
        snprintf(s->errbuf, sizeof(s->errbuf), "socket error: %s",
                 saved ? strerror(saved) : "unknown");
        s->transport_detail = s->errbuf;
        break;
    }
}

static const char *stream_error_text(int rc)
{
    switch (rc) {
    case KVG_ELIMIT:
        return "an SSE event passed 1 MiB";
    case KVG_EPARSE:
        return "an SSE event is not JSON";
    case KVG_EPROTO:
        return "error event, or data after [DONE]";
    case KVG_ETYPE:
        return "malformed usage in a chunk";
    default:
        return kvg_strerror(rc);
    }
}

static void on_done(struct evhttp_request *req, void *arg)
{
    slot *s = arg;
    s->req = NULL; /* evhttp frees it when this returns */
    if (!req || evhttp_request_get_response_code(req) == 0) {
        /* No error callback: evhttp gave up connecting (it reports that only this way). */
        lg_outcome o = s->transport != LG_OK ? s->transport : LG_CONNECTION;
        const char *why = s->transport_detail ? s->transport_detail : "connect failed";
        finish(s, o, why, strlen(why));
        return;
    }
    s->status = evhttp_request_get_response_code(req);
    if (!s->worker[0])
        keep_worker_name(s, req);
    if (s->body.failed) {
        finish(s, LG_LOCAL_ERROR, "out of memory", 13);
        return;
    }
    if (s->status < 200 || s->status >= 300) {
        finish(s, LG_HTTP_STATUS, s->body.data, s->body.len);
        return;
    }
    if (s->too_large) {
        finish(s, LG_TOO_LARGE, "response over --max-response-bytes", 34);
        return;
    }
    if (s->r->cfg->stream) {
        if (s->stream_rc == -ENOMEM)
            finish(s, LG_LOCAL_ERROR, "out of memory", 13);
        else if (s->stream_rc < 0) {
            const char *why = stream_error_text(s->stream_rc);
            finish(s, s->stream_rc == KVG_EPROTO ? LG_STREAM_ERROR : LG_BAD_BODY, why, strlen(why));
        } else if (!s->stream.done)
            finish(s, LG_INCOMPLETE, "stream ended without data: [DONE]", 33);
        else
            finish(s, LG_OK, NULL, 0);
        return;
    }
    int rc = lg_response_parse(s->body.data, s->body.len, &s->usage);
    if (rc == -ENOMEM)
        finish(s, LG_LOCAL_ERROR, "out of memory", 13);
    else if (rc < 0)
        finish(s, LG_BAD_BODY, s->body.data, KVG_MIN(s->body.len, (size_t)DETAIL_MAX));
    else
        finish(s, LG_OK, NULL, 0);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    cancel(arg, LG_TIMEOUT, "no complete response within --timeout-ms");
}

/* Reset the slot's per-request state for request index and send it. */
static void start(slot *s, uint64_t index)
{
    runner *r = s->r;
    kvg_arena_done(&s->arena);
    kvg_arena_init(&s->arena, 0);
    kvg_buf_reset(&s->request_body);
    kvg_buf_reset(&s->body);
    lg_sse_done(&s->sse);
    memset(&s->stream, 0, sizeof(s->stream));
    memset(&s->usage, 0, sizeof(s->usage));
    s->stream_rc = 0;
    s->body_bytes = 0;
    s->t_first = 0;
    s->status = 0;
    s->worker[0] = '\0';
    s->transport = LG_OK;
    s->transport_detail = NULL;
    s->cancelling = false;
    s->too_large = false;
    s->state = SLOT_BUSY;
    r->busy++;
    s->t_start = kvg_now_ns();

    lg_item item;
    int rc = lg_workload_item(r->wl, index, &s->arena, &item);
    if (rc == 0) {
        lg_body_build(&s->request_body, &item, &r->body_opts);
        if (s->request_body.failed)
            rc = -ENOMEM;
    }
    struct evhttp_request *req = rc == 0 ? evhttp_request_new(on_done, s) : NULL;
    if (!req) {
        finish(s, LG_LOCAL_ERROR, "out of memory", 13);
        return;
    }
    evhttp_request_set_header_cb(req, on_headers);
    evhttp_request_set_chunked_cb(req, on_chunk);
    evhttp_request_set_error_cb(req, on_error);
    const target *t = &r->targets[s->url];
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    rc = evhttp_add_header(h, "Host", t->host_header);
    rc |= evhttp_add_header(h, "Content-Type", "application/json");
    rc |= evhttp_add_header(h, "Accept", r->cfg->stream ? "text/event-stream" : "application/json");
    rc |= evhttp_add_header(h, "User-Agent", "kvgate-loadgen/" KVG_VERSION);
    if (r->n_authorization)
        rc |= evhttp_add_header(h, "Authorization",
                                r->authorization[item.tenant % r->n_authorization]);
    rc |= evbuffer_add(evhttp_request_get_output_buffer(req), s->request_body.data,
                       s->request_body.len);
    if (rc != 0) {
        evhttp_request_free(req);
        finish(s, LG_LOCAL_ERROR, "out of memory", 13);
        return;
    }
    s->req = req;
    evtimer_add(&s->deadline, &r->timeout);
    if (evhttp_make_request(s->evcon, req, EVHTTP_REQ_POST, t->path) < 0) {
        /* Only a socket that cannot be created (descriptors exhausted) or a failed strdup
         * gets here; libevent has freed the request in the second case and not in the first,
         * so it is left alone: a rare leak beats a double free. */
        s->req = NULL;
        finish(s, LG_CONNECTION, "cannot open a connection", 24);
    }
}

static bool more_to_send(const runner *r)
{
    if (r->stopping)
        return false;
    return r->cfg->requests == 0 || r->next_index < r->cfg->requests;
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    slot *s = arg;
    runner *r = s->r;
    (void)fd;
    (void)what;
    if (s->state == SLOT_IDLE && more_to_send(r))
        start(s, r->next_index++);
    if (r->busy == 0 && !more_to_send(r))
        event_base_loopexit(r->base, NULL);
}

/* ---- stopping ------------------------------------------------------------------------------- */

static void on_stop_timer(evutil_socket_t fd, short what, void *arg)
{
    runner *r = arg;
    (void)fd;
    (void)what;
    r->stopping = true; /* requests in flight finish; their slots' kicks end the loop */
    if (r->busy == 0)
        event_base_loopexit(r->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    runner *r = arg;
    (void)what;
    kvg_log_info("loadgen: signal %d, cancelling %zu requests in flight", (int)sig, r->busy);
    r->stopping = true;
    r->interrupted = true;
    for (size_t i = 0; i < r->n_slots; i++)
        cancel(&r->slots[i], LG_CANCELLED, "interrupted");
    event_base_loopexit(r->base, NULL);
}

/* ---- setup ---------------------------------------------------------------------------------- */

/* Each connection needs a descriptor; a low soft limit would fail connects mid-run. */
static void raise_fd_limit(size_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        kvg_log_warn("loadgen: cannot raise the descriptor limit to %zu: %s", want,
                     strerror(errno));
}

static int slots_init(runner *r)
{
    const lg_config *cfg = r->cfg;
    size_t n = cfg->concurrency;
    if (cfg->requests && cfg->requests < n)
        n = (size_t)cfg->requests;
    r->slots = calloc(n, sizeof(*r->slots));
    if (!r->slots)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        slot *s = &r->slots[i];
        s->r = r;
        s->id = i;
        s->url = i % r->n_targets; /* connections round robin over the URLs, as an L4 balancer */
        kvg_arena_init(&s->arena, 0);
        kvg_buf_init(&s->request_body);
        kvg_buf_init(&s->body);
        lg_sse_init(&s->sse, MAX_SSE_EVENT_BYTES);
        evtimer_assign(&s->deadline, r->base, on_deadline, s);
        event_assign(&s->kick, r->base, -1, 0, on_kick, s);
        r->n_slots = i + 1;
        const target *t = &r->targets[s->url];
        s->evcon = evhttp_connection_base_new(r->base, NULL, t->addr, t->port);
        if (!s->evcon)
            return -ENOMEM;
        evhttp_connection_set_timeout_tv(s->evcon, &r->timeout);
        evhttp_connection_set_retries(s->evcon, 0); /* a retried POST would be counted once */
        evhttp_connection_set_max_headers_size(s->evcon, MAX_HEADERS_BYTES);
        evhttp_connection_set_max_body_size(s->evcon, (ev_ssize_t)cfg->max_response_bytes);
    }
    return 0;
}

static void slots_done(runner *r)
{
    for (size_t i = 0; i < r->n_slots; i++) {
        slot *s = &r->slots[i];
        if (s->evcon)
            evhttp_connection_free(s->evcon); /* frees a request still queued, if any */
        event_del(&s->deadline);
        event_del(&s->kick);
        kvg_arena_done(&s->arena);
        kvg_buf_done(&s->request_body);
        kvg_buf_done(&s->body);
        lg_sse_done(&s->sse);
    }
    free(r->slots);
}

int lg_run(const lg_config *cfg, const lg_workload *wl, lg_stats *stats, uint64_t *elapsed_ns,
           bool *interrupted)
{
    runner r;
    memset(&r, 0, sizeof(r));
    r.cfg = cfg;
    r.wl = wl;
    r.stats = stats;
    r.body_opts =
        (lg_body_opts){.model = cfg->model, .max_tokens = cfg->max_tokens, .stream = cfg->stream};
    r.timeout.tv_sec = cfg->timeout_ms / 1000;
    r.timeout.tv_usec = (long)(cfg->timeout_ms % 1000) * 1000;
    if (cfg->n_urls == 0 || cfg->n_urls > LG_MAX_URLS) {
        fprintf(stderr, "kvgate-loadgen: give 1 to %d --url\n", LG_MAX_URLS);
        return KVG_ECONFIG;
    }
    r.targets = calloc(cfg->n_urls, sizeof(*r.targets));
    if (!r.targets)
        return -ENOMEM;
    r.n_targets = cfg->n_urls;
    int rc = 0;
    for (size_t i = 0; i < cfg->n_urls && rc == 0; i++)
        rc = parse_url(&r.targets[i], cfg->urls[i]);
    if (rc < 0)
        goto fail_base;
    if (cfg->n_api_keys) {
        r.authorization = calloc(cfg->n_api_keys, sizeof(*r.authorization));
        if (!r.authorization) {
            rc = -ENOMEM;
            goto fail_base;
        }
        r.n_authorization = cfg->n_api_keys;
        for (size_t i = 0; i < cfg->n_api_keys; i++) {
            size_t n = strlen(cfg->api_keys[i]) + 8;
            r.authorization[i] = malloc(n);
            if (!r.authorization[i]) {
                rc = -ENOMEM;
                goto fail_base;
            }
            snprintf(r.authorization[i], n, "Bearer %s", cfg->api_keys[i]);
        }
    }
    raise_fd_limit((size_t)cfg->concurrency + FD_HEADROOM);

    rc = -ENOMEM;
    r.base = event_base_new();
    if (!r.base)
        goto fail_base;
    r.sig_int = evsignal_new(r.base, SIGINT, on_signal, &r);
    r.sig_term = evsignal_new(r.base, SIGTERM, on_signal, &r);
    r.stop_timer = evtimer_new(r.base, on_stop_timer, &r);
    if (!r.sig_int || !r.sig_term || !r.stop_timer || evsignal_add(r.sig_int, NULL) < 0 ||
        evsignal_add(r.sig_term, NULL) < 0)
        goto fail_events;
    rc = slots_init(&r);
    if (rc < 0)
        goto fail_slots;
    if (cfg->duration_s > 0) {
        struct timeval tv = {.tv_sec = (time_t)cfg->duration_s};
        tv.tv_usec = (long)((cfg->duration_s - (double)tv.tv_sec) * 1e6);
        evtimer_add(r.stop_timer, &tv);
    }
    r.t_begin = r.t_last = kvg_now_ns();
    for (size_t i = 0; i < r.n_slots; i++)
        kick(&r.slots[i]);
    if (event_base_dispatch(r.base) < 0) {
        rc = -EIO;
        goto fail_slots;
    }
    *elapsed_ns = r.t_last - r.t_begin;
    *interrupted = r.interrupted;
    rc = 0;

fail_slots:
    slots_done(&r);
fail_events:
    if (r.stop_timer)
        event_free(r.stop_timer);
    if (r.sig_term)
        event_free(r.sig_term);
    if (r.sig_int)
        event_free(r.sig_int);
    event_base_free(r.base);
fail_base:
    for (size_t i = 0; i < r.n_authorization; i++)
        free(r.authorization[i]);
    free(r.authorization);
    free(r.targets);
    return rc;
}
