/* SPDX-License-Identifier: Apache-2.0 */
/* HTTP/1.1 endpoints of the simulated worker and the lifecycle of each request on them.
 *
 * Why libevent's evhttp: it is on Debian 12 (libevent_extra, already a project dependency),
 * runs on the same event_base as the engine's timers, and gives what a vLLM stand-in needs
 * without a hand-written parser (STYLE forbids an unfuzzed one): HTTP/1.1 keep-alive,
 * pipelining, chunked replies sent as they are produced (evhttp_send_reply_start/chunk/end),
 * limits on header and body size, idle timeouts, and 100-continue. libhttp-parser would only
 * parse; connection handling, writing and keep-alive would all be ours to write and fuzz.
 *
 * evhttp's one gap: while a request is being answered it stops reading the socket, so a
 * client that goes away is noticed only when a write fails. We watch each deferred request's
 * socket for EV_CLOSED (EPOLLRDHUP) ourselves, so a disconnect cancels the request at once,
 * in the queue or in prefill, freeing its blocks and timers as vLLM aborts. */
#include "simworker.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>

#include "kvg_config.h"

#define LISTEN_BACKLOG 1024
#define MAX_HEADERS_BYTES (64u << 10)
#define WRITE_STALL_S 300 /* a client may pause reading a stream this long */
#define ACCEPT_RETRY_MS 100

/* Named random streams (see sim_rand): each kind of draw has its own. */
enum { RAND_ERROR = 1, RAND_CUT = 2, RAND_ID = 3 };

typedef enum req_state {
    REQ_NEW = 0, /* being dispatched */
    REQ_DELAYED, /* --slow-headers-ms: waiting before anything is answered */
    REQ_RUNNING, /* sequences in the engine */
    REQ_CUTTING, /* --close-mid-stream-rate: first chunk queued, connection about to drop */
    REQ_STATE_COUNT,
} req_state;

static const char *req_state_str(req_state s)
{
    static const char *const names[REQ_STATE_COUNT] = {"new", "delayed", "running", "cutting"};
    return s < REQ_STATE_COUNT ? names[s] : "?";
}

typedef struct http_req http_req;

/* One prompt of a request, as one engine sequence. */
typedef struct slot {
    http_req *owner;
    size_t index;
    sim_seq *seq; /* NULL once finished or cancelled */
    sim_choice choice;
    bool done;
} slot;

struct http_req {
    sim_server *srv;
    http_req *prev, *next;
    struct evhttp_request *evreq; /* NULL once handed back to libevent */
    struct evhttp_connection *evcon;
    req_state state;
    struct event watch; /* EV_CLOSED on the client socket while the answer is deferred */
    bool watching;
    struct event timer; /* slow-headers delay, then the deferred cut */
    sim_request req;
    bool parsed;
    char id[48];
    uint64_t created;
    uint64_t start_ns;
    bool streaming;       /* response headers are out, SSE events follow */
    bool cut_after_first; /* drawn by --close-mid-stream-rate */
    slot *slots;
    size_t n_slots;
    size_t n_done;
    char *block_hashes; /* x-simworker-block-hashes (token-exact mode), heap, NULL when none */
};

struct sim_server {
    struct event_base *base;
    const sim_config *cfg;
    sim_engine *eng;
    sim_kvev_pub *events; /* borrowed; NULL: no /kv_events routes */
    struct evhttp *http;
    struct evconnlistener *listener; /* owned by http once bound */
    struct event accept_retry;
    uint16_t port;
    bool early_close; /* the backend supports EV_CLOSED */
    http_req *reqs;   /* every request with an http_req, for shutdown */
    uint64_t n_requests;
    uint64_t n_error_draws;
    uint64_t n_cut_draws;
};

/* ---- request objects ------------------------------------------------------------------------ */

static void on_timer(evutil_socket_t fd, short what, void *arg);
static void on_client_gone(evutil_socket_t fd, short what, void *arg);
static void on_conn_close(struct evhttp_connection *evcon, void *arg);

static http_req *req_new(sim_server *srv, struct evhttp_request *evreq)
{
    http_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->srv = srv;
    r->evreq = evreq;
    r->evcon = evhttp_request_get_connection(evreq);
    r->start_ns = kvg_now_ns();
    event_assign(&r->timer, srv->base, -1, 0, on_timer, r);
    r->next = srv->reqs;
    if (srv->reqs)
        srv->reqs->prev = r;
    srv->reqs = r;
    return r;
}

static void cancel_seqs(http_req *r)
{
    for (size_t i = 0; i < r->n_slots; i++) {
        if (r->slots[i].seq) {
            sim_engine_cancel(r->srv->eng, r->slots[i].seq);
            r->slots[i].seq = NULL;
        }
    }
}

/* Stop noticing the client: after this, closing the connection does not call us back. */
static void detach(http_req *r)
{
    if (r->watching) {
        event_del(&r->watch);
        r->watching = false;
    }
    if (r->evcon)
        evhttp_connection_set_closecb(r->evcon, NULL, NULL);
}

static void req_free(http_req *r)
{
    sim_server *srv = r->srv;
    detach(r);
    cancel_seqs(r);
    event_del(&r->timer);
    if (r->prev)
        r->prev->next = r->next;
    else
        srv->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    if (r->parsed)
        sim_request_done(&r->req);
    free(r->block_hashes);
    free(r->slots);
    free(r);
}

/* The answer will come later: learn about the client leaving until then. */
static void defer(http_req *r)
{
    evhttp_connection_set_closecb(r->evcon, on_conn_close, r);
    if (r->srv->early_close && !r->watching) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(r->evcon);
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd >= 0) {
            event_assign(&r->watch, r->srv->base, fd, EV_CLOSED, on_client_gone, r);
            r->watching = event_add(&r->watch, NULL) == 0;
        }
    }
}

/* ---- replies -------------------------------------------------------------------------------- */

static void add_headers(http_req *r, const char *content_type)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->evreq);
    if (content_type)
        evhttp_add_header(h, "Content-Type", content_type);
    evhttp_add_header(h, "x-simworker-name", r->srv->cfg->name);
    if (r->block_hashes)
        evhttp_add_header(h, "x-simworker-block-hashes", r->block_hashes);
}

/* Token-exact mode: the first prompt's block keys, in the 64-bit form of vLLM's KV events, go
 * out in a header so that tests (and the gateway's KV-event work) can see the worker's names
 * for its blocks. Best effort: without memory the header is left out. */
static void set_block_hashes(http_req *r, const sim_hash *keys, size_t n)
{
    kvg_buf b;
    kvg_buf_init(&b);
    sim_exact_hash_header(r->srv->cfg->exact, keys, n, &b);
    kvg_buf_putc(&b, '\0');
    free(r->block_hashes);
    r->block_hashes = b.failed ? NULL : kvg_buf_steal(&b, NULL);
    kvg_buf_done(&b);
}

/* /tokenize runs no sequence: the keys are computed here, by the engine's own function. */
static void tokenize_block_hashes(http_req *r)
{
    const sim_config *cfg = r->srv->cfg;
    if (!cfg->exact || r->req.n_prompts == 0)
        return;
    const sim_prompt *p = &r->req.prompts[0];
    size_t n = KVG_MIN(p->n / cfg->block_tokens, (size_t)SIM_BLOCK_HASH_HEADER_MAX);
    if (n == 0)
        return;
    sim_hash *keys = malloc(n * sizeof(*keys));
    if (keys &&
        sim_exact_block_keys(cfg->exact, p->tokens, n * cfg->block_tokens, cfg->block_tokens,
                             r->req.cache_salt, r->req.cache_salt_len, keys) == 0)
        set_block_hashes(r, keys, n);
    free(keys);
}

static void log_done(http_req *r, int code)
{
    if (!kvg_log_enabled(KVG_LOG_DEBUG))
        return;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(r->evreq);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    kvg_log_debug("simworker: %d %s %.3f ms", code, path ? path : "?",
                  (double)(kvg_now_ns() - r->start_ns) / 1e6);
}

/* Send a complete response and free the request. */
static void reply(http_req *r, int code, const char *content_type, const void *body, size_t len)
{
    detach(r);
    if (r->evreq) {
        struct evbuffer *buf = evbuffer_new();
        add_headers(r, content_type);
        log_done(r, code);
        if (buf && len)
            evbuffer_add(buf, body, len);
        evhttp_send_reply(r->evreq, code, NULL, buf);
        if (buf)
            evbuffer_free(buf);
        r->evreq = NULL;
    }
    req_free(r);
}

static void reply_buf(http_req *r, int code, const char *content_type, kvg_buf *b)
{
    if (b->failed) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"InternalServerError\",\"param\":null,\"code\":500}}";
        reply(r, 500, "application/json", oom, sizeof(oom) - 1);
        return;
    }
    reply(r, code, content_type, b->data, b->len);
}

static void reply_error(http_req *r, int status, const char *type, const char *message)
{
    sim_error err = {.status = status, .type = type};
    snprintf(err.message, sizeof(err.message), "%s", message);
    kvg_buf b;
    kvg_buf_init(&b);
    sim_respond_error(&b, &err);
    reply_buf(r, status, "application/json", &b);
    kvg_buf_done(&b);
}

/* FastAPI's bodies for routing errors, which is what vLLM returns. */
static void reply_detail(http_req *r, int status, const char *detail, const char *allow)
{
    char body[96];
    int n = snprintf(body, sizeof(body), "{\"detail\":\"%s\"}", detail);
    if (allow && r->evreq)
        evhttp_add_header(evhttp_request_get_output_headers(r->evreq), "Allow", allow);
    reply(r, status, "application/json", body, (size_t)n);
}

/* One SSE event as one HTTP chunk, written as soon as the loop runs. */
static void send_event(http_req *r, kvg_buf *ev,
                       void (*flushed)(struct evhttp_connection *, void *))
{
    if (!r->evreq || ev->failed || !ev->len)
        return;
    struct evbuffer *buf = evbuffer_new();
    if (!buf)
        return;
    evbuffer_add(buf, ev->data, ev->len);
    if (flushed)
        evhttp_send_reply_chunk_with_cb(r->evreq, buf, flushed, r);
    else
        evhttp_send_reply_chunk(r->evreq, buf);
    evbuffer_free(buf);
}

static void end_stream(http_req *r)
{
    detach(r);
    if (r->evreq) {
        log_done(r, 200);
        evhttp_send_reply_end(r->evreq);
        r->evreq = NULL;
    }
    req_free(r);
}

/* ---- client gone, cuts, delays -------------------------------------------------------------- */

/* Drop the connection now: the request's sequences are cancelled and the socket closed
 * without finishing the reply. evhttp frees the request it still holds. */
static void drop_connection(http_req *r)
{
    struct evhttp_connection *evcon = r->evcon;
    detach(r);
    r->evreq = NULL;
    req_free(r);
    if (evcon)
        evhttp_connection_free(evcon);
}

static void on_client_gone(evutil_socket_t fd, short what, void *arg)
{
    http_req *r = arg;
    (void)fd;
    (void)what;
    r->watching = false;
    kvg_log_debug("simworker: client closed a %s request; cancelling it", req_state_str(r->state));
    drop_connection(r);
}

/* evhttp is freeing the connection (a write failed, a timeout, or shutdown). */
static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    http_req *r = arg;
    (void)evcon;
    kvg_log_debug("simworker: connection lost for a %s request; cancelling it",
                  req_state_str(r->state));
    /* A request evhttp detached from the failed connection is ours to free; one still
     * attached goes with the connection. */
    if (r->evreq && !evhttp_request_get_connection(r->evreq))
        evhttp_request_free(r->evreq);
    r->evreq = NULL;
    r->evcon = NULL; /* being freed: detach() must not touch it */
    req_free(r);
}

static void on_cut_flushed(struct evhttp_connection *evcon, void *arg)
{
    http_req *r = arg;
    (void)evcon;
    /* Not from inside evhttp's write callback: close from a fresh loop turn. */
    struct timeval now = {0, 0};
    event_add(&r->timer, &now);
}

static void dispatch(http_req *r);

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    http_req *r = arg;
    (void)fd;
    (void)what;
    if (r->state == REQ_DELAYED) {
        detach(r);
        r->state = REQ_NEW;
        dispatch(r);
    } else if (r->state == REQ_CUTTING) {
        kvg_log_debug("simworker: cutting stream %s after its first chunk", r->id);
        drop_connection(r);
    }
}

/* ---- inference ------------------------------------------------------------------------------ */

static bool all_done(const http_req *r)
{
    return r->n_done == r->n_slots;
}

static void finish_nonstream(http_req *r)
{
    kvg_buf b;
    kvg_buf_init(&b);
    sim_choice choices[SIM_MAX_BATCH];
    for (size_t i = 0; i < r->n_slots; i++)
        choices[i] = r->slots[i].choice;
    if (r->req.ep == SIM_EP_EMBEDDINGS)
        sim_respond_embeddings(&b, &r->req, r->id, r->created, choices, r->n_slots);
    else
        sim_respond_completion(&b, &r->req, r->id, r->created, choices, r->n_slots);
    reply_buf(r, 200, "application/json", &b);
    kvg_buf_done(&b);
}

static void finish_stream(http_req *r)
{
    kvg_buf ev;
    kvg_buf_init(&ev);
    if (r->req.include_usage) {
        sim_choice choices[SIM_MAX_BATCH];
        for (size_t i = 0; i < r->n_slots; i++)
            choices[i] = r->slots[i].choice;
        sim_respond_usage_chunk(&ev, &r->req, r->id, r->created, choices, r->n_slots);
        send_event(r, &ev, NULL);
        kvg_buf_reset(&ev);
    }
    kvg_buf_puts(&ev, "data: [DONE]\n\n");
    send_event(r, &ev, NULL);
    kvg_buf_done(&ev);
    end_stream(r);
}

/* Engine progress of one sequence (called from the engine's timers). */
static void on_seq(void *arg, sim_seq *seq, uint32_t generated, bool finished)
{
    slot *s = arg;
    http_req *r = s->owner;
    s->choice.prompt_tokens = sim_seq_prompt_tokens(seq);
    s->choice.cached_tokens = sim_seq_cached_tokens(seq);
    s->choice.generated = generated;
    if (finished) {
        s->seq = NULL; /* the engine frees it when we return */
        s->done = true;
        r->n_done++;
    }
    if (r->state == REQ_CUTTING)
        return;
    if (!r->streaming) {
        if (all_done(r))
            finish_nonstream(r);
        return;
    }
    kvg_buf ev;
    kvg_buf_init(&ev);
    if (generated == 1 && r->req.ep == SIM_EP_CHAT) {
        sim_respond_chunk(&ev, &r->req, r->id, r->created, s->index, 0, false);
        send_event(r, &ev, NULL);
        kvg_buf_reset(&ev);
    }
    sim_respond_chunk(&ev, &r->req, r->id, r->created, s->index, generated, finished);
    if (r->cut_after_first) {
        /* Abort like a crashing engine: the request is cancelled now, the connection drops
         * once this first content chunk has reached the socket. */
        r->state = REQ_CUTTING;
        sim_engine_count_fault(r->srv->eng, true);
        if (!finished)
            sim_engine_cancel(r->srv->eng, seq); /* takes effect when we return */
        s->seq = NULL;
        cancel_seqs(r);
        send_event(r, &ev, on_cut_flushed);
        kvg_buf_done(&ev);
        return;
    }
    send_event(r, &ev, NULL);
    kvg_buf_done(&ev);
    if (all_done(r))
        finish_stream(r);
}

/* Ids are reproducible for a (seed, name) pair yet differ between workers, so logs of a
 * fleet of workers started with the same seed do not collide. */
static void new_id(http_req *r, const char *prefix)
{
    sim_server *srv = r->srv;
    uint64_t n = srv->n_requests++;
    uint64_t seed = srv->cfg->seed;
    for (const char *c = srv->cfg->name; *c; c++)
        seed = (seed ^ (unsigned char)*c) * 1099511628211ull;
    snprintf(r->id, sizeof(r->id), "%s-%016llx%016llx", prefix,
             (unsigned long long)sim_rand(seed, RAND_ID, 2 * n),
             (unsigned long long)sim_rand(seed, RAND_ID, 2 * n + 1));
}

static void inference(http_req *r, sim_endpoint ep)
{
    sim_server *srv = r->srv;
    const sim_config *cfg = srv->cfg;
    struct evbuffer *in = evhttp_request_get_input_buffer(r->evreq);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    sim_error err = {0};
    if (!body) {
        reply_error(r, 500, "InternalServerError", "out of memory");
        return;
    }
    int rc = sim_request_parse(cfg, ep, body, len, &r->req, &err);
    if (rc == KVG_EPARSE) {
        kvg_buf b;
        kvg_buf_init(&b);
        sim_respond_error(&b, &err);
        reply_buf(r, err.status, "application/json", &b);
        kvg_buf_done(&b);
        return;
    }
    if (rc < 0) {
        reply_error(r, 500, "InternalServerError", kvg_strerror(rc));
        return;
    }
    r->parsed = true;
    if (ep == SIM_EP_TOKENIZE) {
        tokenize_block_hashes(r);
        kvg_buf b;
        kvg_buf_init(&b);
        sim_respond_tokenize(&b, cfg, &r->req);
        reply_buf(r, 200, "application/json", &b);
        kvg_buf_done(&b);
        return;
    }
    if (cfg->error_rate > 0 &&
        sim_rand_unit(cfg->seed, RAND_ERROR, srv->n_error_draws++) < cfg->error_rate) {
        sim_engine_count_fault(srv->eng, false);
        reply_error(r, 500, "InternalServerError",
                    "Simulated engine failure (kvgate-simworker --error-rate)");
        return;
    }
    if (sim_engine_waiting_room(srv->eng) < r->req.n_prompts) {
        reply_error(r, 503, "ServiceUnavailableError",
                    "The server is overloaded: too many requests are waiting");
        return;
    }
    new_id(r, ep == SIM_EP_CHAT ? "chatcmpl" : ep == SIM_EP_EMBEDDINGS ? "embd" : "cmpl");
    r->created = kvg_wall_ns() / 1000000000u;
    r->slots = calloc(r->req.n_prompts, sizeof(*r->slots));
    if (!r->slots) {
        reply_error(r, 500, "InternalServerError", "out of memory");
        return;
    }
    r->n_slots = r->req.n_prompts;
    for (size_t i = 0; i < r->n_slots; i++) {
        slot *s = &r->slots[i];
        s->owner = r;
        s->index = i;
        s->choice.prompt_tokens = (uint32_t)r->req.prompts[i].n;
        rc = sim_engine_submit(srv->eng, r->req.prompts[i].tokens, r->req.prompts[i].n,
                               r->req.max_tokens, r->req.cache_salt, r->req.cache_salt_len, on_seq,
                               s, &s->seq);
        if (rc < 0) {
            /* Submissions never call back, so undoing the earlier ones is enough. */
            cancel_seqs(r);
            if (rc == KVG_ELIMIT)
                reply_error(r, 503, "ServiceUnavailableError",
                            "The server is overloaded: too many requests are waiting");
            else
                reply_error(r, 500, "InternalServerError", kvg_strerror(rc));
            return;
        }
        if (i == 0 && cfg->exact) {
            const sim_hash *keys;
            uint32_t nk = sim_seq_prompt_keys(s->seq, &keys);
            if (nk)
                set_block_hashes(r, keys, nk);
        }
    }
    r->state = REQ_RUNNING;
    if (r->req.stream && ep != SIM_EP_EMBEDDINGS) {
        /* Like vLLM (a Starlette StreamingResponse) the headers go out before queueing and
         * prefill, so time to first byte is not time to first token. */
        r->cut_after_first =
            cfg->close_mid_stream_rate > 0 &&
            sim_rand_unit(cfg->seed, RAND_CUT, srv->n_cut_draws++) < cfg->close_mid_stream_rate;
        add_headers(r, "text/event-stream; charset=utf-8");
        evhttp_send_reply_start(r->evreq, 200, NULL);
        r->streaming = true;
    }
    defer(r);
}

/* ---- routing -------------------------------------------------------------------------------- */

typedef enum route_kind {
    ROUTE_HEALTH = 0,
    ROUTE_MODELS,
    ROUTE_METRICS,
    ROUTE_VERSION,
    ROUTE_INFER,
    ROUTE_RESET,
    ROUTE_KV_PAUSE,
    ROUTE_KV_RESUME,
    ROUTE_KIND_COUNT,
} route_kind;

static const struct route {
    const char *path;
    route_kind kind;
    sim_endpoint ep;
    bool post; /* POST only; otherwise GET and HEAD */
} routes[] = {
    {"/health", ROUTE_HEALTH, SIM_EP_COUNT, false},
    {"/ping", ROUTE_HEALTH, SIM_EP_COUNT, false},
    {"/v1/models", ROUTE_MODELS, SIM_EP_COUNT, false},
    {"/metrics", ROUTE_METRICS, SIM_EP_COUNT, false},
    {"/version", ROUTE_VERSION, SIM_EP_COUNT, false},
    {"/v1/completions", ROUTE_INFER, SIM_EP_COMPLETIONS, true},
    {"/v1/chat/completions", ROUTE_INFER, SIM_EP_CHAT, true},
    {"/v1/embeddings", ROUTE_INFER, SIM_EP_EMBEDDINGS, true},
    {"/tokenize", ROUTE_INFER, SIM_EP_TOKENIZE, true},
    {"/reset_prefix_cache", ROUTE_RESET, SIM_EP_COUNT, true},
    /* Test controls, not vLLM's: the event stream stops and resumes, HTTP goes on. */
    {"/kv_events/pause", ROUTE_KV_PAUSE, SIM_EP_COUNT, true},
    {"/kv_events/resume", ROUTE_KV_RESUME, SIM_EP_COUNT, true},
};

static void dispatch(http_req *r)
{
    sim_server *srv = r->srv;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(r->evreq);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!path || !*path)
        path = "/";
    enum evhttp_cmd_type cmd = evhttp_request_get_command(r->evreq);
    const struct route *rt = NULL;
    for (size_t i = 0; i < KVG_ARRAY_LEN(routes); i++)
        if (strcmp(path, routes[i].path) == 0)
            rt = &routes[i];
    if (!rt) {
        reply_detail(r, 404, "Not Found", NULL);
        return;
    }
    bool ok = rt->post ? cmd == EVHTTP_REQ_POST : (cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD);
    if (!ok) {
        reply_detail(r, 405, "Method Not Allowed", rt->post ? "POST" : "GET, HEAD");
        return;
    }
    kvg_buf b;
    kvg_buf_init(&b);
    switch (rt->kind) {
    case ROUTE_HEALTH:
        reply(r, 200, NULL, NULL, 0);
        break;
    case ROUTE_MODELS:
        sim_respond_models(&b, srv->cfg, kvg_wall_ns() / 1000000000u);
        reply_buf(r, 200, "application/json", &b);
        break;
    case ROUTE_METRICS:
        sim_metrics_render(srv->cfg, sim_engine_stats(srv->eng), &b);
        reply_buf(r, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
        break;
    case ROUTE_VERSION:
        kvg_buf_puts(&b, "{\"version\":\"kvgate-simworker " KVG_VERSION "\"}");
        reply_buf(r, 200, "application/json", &b);
        break;
    case ROUTE_INFER:
        inference(r, rt->ep);
        break;
    case ROUTE_RESET:
        /* vLLM (VLLM_SERVER_DEV_MODE) answers an empty 200; it cannot reset while requests
         * hold blocks, which we report rather than ignore. */
        if (sim_engine_reset_prefix_cache(srv->eng) == 0)
            reply(r, 200, NULL, NULL, 0);
        else
            reply_error(r, 409, "ConflictError",
                        "cannot reset the prefix cache while requests hold KV blocks");
        break;
    case ROUTE_KV_PAUSE:
    case ROUTE_KV_RESUME:
        if (!srv->events) {
            reply_detail(r, 404, "Not Found", NULL);
            break;
        }
        sim_kvev_pub_pause(srv->events, rt->kind == ROUTE_KV_PAUSE);
        uint64_t next = 0;
        bool paused = sim_kvev_pub_paused(srv->events, &next);
        kvg_buf_printf(&b, "{\"paused\":%s,\"next_sequence\":%llu}", paused ? "true" : "false",
                       (unsigned long long)next);
        reply_buf(r, 200, "application/json", &b);
        break;
    case ROUTE_KIND_COUNT:
        break;
    }
    kvg_buf_done(&b);
}

static void on_request(struct evhttp_request *evreq, void *arg)
{
    sim_server *srv = arg;
    http_req *r = req_new(srv, evreq);
    if (!r) {
        evhttp_send_error(evreq, 503, "out of memory");
        return;
    }
    if (!r->evcon) {
        reply(r, 500, NULL, NULL, 0);
        return;
    }
    /* evhttp has one timeout for reading and writing; reads (idle keep-alive) use the
     * configured one, writes get longer so a stream under backpressure is not dropped. */
    struct bufferevent *bev = evhttp_connection_get_bufferevent(r->evcon);
    if (bev) {
        struct timeval rd = {.tv_sec = (time_t)srv->cfg->keep_alive_s},
                       wr = {.tv_sec = WRITE_STALL_S};
        bufferevent_set_timeouts(bev, &rd, &wr);
        /* vLLM's server (asyncio) writes with TCP_NODELAY; without it each small SSE event
         * waits for the client's delayed ACK of the previous one. evhttp gives no hook at
         * accept, so this is set (idempotently) per request. */
        int one = 1;
        evutil_socket_t fd = bufferevent_getfd(bev);
        if (fd >= 0)
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    if (srv->cfg->slow_headers_ms) {
        struct timeval tv = {.tv_sec = (time_t)(srv->cfg->slow_headers_ms / 1000),
                             .tv_usec = (suseconds_t)(srv->cfg->slow_headers_ms % 1000) * 1000};
        r->state = REQ_DELAYED;
        defer(r);
        event_add(&r->timer, &tv);
        return;
    }
    dispatch(r);
}

/* ---- listener ------------------------------------------------------------------------------- */

static void on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
    sim_server *srv = arg;
    (void)fd;
    (void)what;
    evconnlistener_enable(srv->listener);
}

/* Out of descriptors: pause accepting briefly instead of spinning on a ready listener. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
    sim_server *srv = arg;
    int err = EVUTIL_SOCKET_ERROR();
    kvg_log_warn("simworker: accept failed: %s; pausing %d ms", strerror(err), ACCEPT_RETRY_MS);
    evconnlistener_disable(lev);
    struct timeval tv = {0, ACCEPT_RETRY_MS * 1000};
    event_add(&srv->accept_retry, &tv);
}

static int write_port_file(const char *path, uint16_t port)
{
    char tmp[4096];
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    char line[16];
    int len = snprintf(line, sizeof(line), "%u\n", (unsigned)port);
    int rc = 0;
    if (write(fd, line, (size_t)len) != len)
        rc = errno ? -errno : -EIO;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0)
        unlink(tmp);
    return rc;
}

static int bind_listener(sim_server *srv)
{
    const sim_config *cfg = srv->cfg;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)cfg->listen_port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(cfg->listen_host, port, &hints, &ai);
    if (gai != 0) {
        kvg_log_error("simworker: cannot resolve %s: %s", cfg->listen_host, gai_strerror(gai));
        return KVG_ECONFIG;
    }
    int rc = -EADDRNOTAVAIL;
    for (struct addrinfo *p = ai; p && !srv->listener; p = p->ai_next) {
        srv->listener = evconnlistener_new_bind(srv->base, NULL, NULL,
                                                LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE |
                                                    LEV_OPT_CLOSE_ON_EXEC,
                                                LISTEN_BACKLOG, p->ai_addr, (int)p->ai_addrlen);
        if (!srv->listener)
            rc = errno ? -errno : -EADDRNOTAVAIL;
    }
    freeaddrinfo(ai);
    if (!srv->listener)
        return rc;
    evconnlistener_set_error_cb(srv->listener, on_accept_error);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evconnlistener_get_fd(srv->listener), (struct sockaddr *)&ss, &sl) < 0) {
        rc = -errno;
        goto fail_listener;
    }
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    if (!evhttp_bind_listener(srv->http, srv->listener)) {
        rc = -ENOMEM;
        goto fail_listener;
    }
    return 0;

fail_listener:
    evconnlistener_free(srv->listener);
    srv->listener = NULL;
    return rc;
}

int sim_server_new(struct event_base *base, const sim_config *cfg, sim_engine *eng,
                   sim_server **out)
{
    sim_server *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return -ENOMEM;
    int rc = -ENOMEM;
    srv->base = base;
    srv->cfg = cfg;
    srv->eng = eng;
    srv->early_close = (event_base_get_features(base) & EV_FEATURE_EARLY_CLOSE) != 0;
    event_assign(&srv->accept_retry, base, -1, 0, on_accept_retry, srv);
    srv->http = evhttp_new(base);
    if (!srv->http)
        goto fail_srv;
    evhttp_set_gencb(srv->http, on_request, srv);
    /* Let every method through to on_request so wrong ones get vLLM's JSON 405. */
    evhttp_set_allowed_methods(srv->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                              EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                              EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_max_headers_size(srv->http, MAX_HEADERS_BYTES);
    evhttp_set_max_body_size(srv->http, (ev_ssize_t)cfg->max_body_bytes);
    evhttp_set_timeout(srv->http, (int)cfg->keep_alive_s);
    evhttp_set_default_content_type(srv->http, NULL);
    /* Read (and drop) an oversized body before answering 413, so a client that sends its
     * whole body before reading sees the 413 rather than a reset. */
    evhttp_set_flags(srv->http, EVHTTP_SERVER_LINGERING_CLOSE);
    rc = bind_listener(srv);
    if (rc < 0)
        goto fail_http;
    if (cfg->port_file) {
        rc = write_port_file(cfg->port_file, srv->port);
        if (rc < 0) {
            kvg_log_error("simworker: cannot write port file %s: %s", cfg->port_file,
                          kvg_strerror(rc));
            goto fail_http;
        }
    }
    *out = srv;
    return 0;

fail_http:
    evhttp_free(srv->http);
fail_srv:
    free(srv);
    return rc;
}

void sim_server_set_events(sim_server *srv, sim_kvev_pub *events)
{
    srv->events = events;
}

uint16_t sim_server_port(const sim_server *srv)
{
    return srv->port;
}

void sim_server_free(sim_server *srv)
{
    if (!srv)
        return;
    /* Our requests first (their sequences leave the engine), then evhttp closes every
     * connection and frees the libevent requests it still holds. */
    while (srv->reqs) {
        http_req *r = srv->reqs;
        r->evreq = NULL;
        req_free(r);
    }
    event_del(&srv->accept_retry);
    evhttp_free(srv->http);
    free(srv);
}
