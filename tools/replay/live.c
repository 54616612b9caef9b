/* SPDX-License-Identifier: Apache-2.0 */
/* Live mode: sends a trace's requests through a running gateway at their arrival times (open
 * loop), reads what the workers report, and turns it into a report row (docs/replay.md). */
#include "live.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/http.h>

#define MAX_SSE_EVENT (1u << 20)
#define DETAIL_MAX 160
#define PROGRESS_S 10
#define MAX_NAMES 1024 /* distinct worker names counted; more are "(other)" */

static const char *const outcome_names[LIVE_OUTCOME_COUNT] = {
    "ok", "status", "timeout", "connection", "protocol", "tokens",
};

const char *live_outcome_str(live_outcome o)
{
    return o < LIVE_OUTCOME_COUNT ? outcome_names[o] : "?";
}

static const char *const http_names[REPLAY_LIVE_HTTP_COUNT] = {"2", "1.1", "mixed"};

const char *replay_live_http_str(replay_live_http h)
{
    return h < REPLAY_LIVE_HTTP_COUNT ? http_names[h] : "?";
}

int replay_live_http_parse(const char *s, replay_live_http *out)
{
    for (int i = 0; i < REPLAY_LIVE_HTTP_COUNT; i++) {
        if (strcmp(s, http_names[i]) == 0) {
            *out = (replay_live_http)i;
            return 0;
        }
    }
    return KVG_ECONFIG;
}

/* The whole run: what live.h shares with the transports, and the bookkeeping around it. */
typedef struct run_state {
    live_run run;
    const replay_trace *t;
    live_req *reqs;
    char **auth;     /* "Bearer KEY" per key */
    size_t next;     /* next request to send */
    size_t finished; /* requests ended */
    uint64_t t0_ns;
    struct event *tick;     /* sends the requests that are due */
    struct event *progress; /* a line on stderr now and then */
    struct event *sigint;
    bool interrupted;
    /* results */
    replay_live_errors *errs;
    uint64_t hit_blocks, hit_tokens;
    double *ttft_ms;
    size_t nttft;
    char *names[MAX_NAMES];
    uint64_t counts[MAX_NAMES + 1]; /* the last one: "(other)" and unnamed */
    size_t nnames;
} run_state;

static run_state *state_of(live_run *run)
{
    return (run_state *)(void *)((char *)run - offsetof(run_state, run));
}

/* ---- URL and reachability ----------------------------------------------------------------- */

static int parse_url(live_run *run, const char *url)
{
    int rc = KVG_ECONFIG;
    struct evhttp_uri *u = evhttp_uri_parse_with_flags(url, 0);
    const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL;
    const char *host = u ? evhttp_uri_get_host(u) : NULL;
    int port = u ? evhttp_uri_get_port(u) : -1;
    if (!u || !scheme || strcmp(scheme, "http") != 0 || !host || !host[0] || strlen(host) > 255 ||
        port == 0 || port > 65535) {
        fprintf(stderr, "kvgate-replay: --live %s: expected http://HOST[:PORT][/PATH]\n", url);
        goto out;
    }
    if (port < 0)
        port = 80;
    char bare[256];
    size_t hl = strlen(host);
    if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']')
        snprintf(bare, sizeof(bare), "%.*s", (int)(hl - 2), host + 1);
    else
        snprintf(bare, sizeof(bare), "%s", host);
    snprintf(run->host, sizeof(run->host), strchr(bare, ':') ? "[%s]:%d" : "%s:%d", bare, port);
    /* /v1/completions under the URL's path; a path ending in /v1 is the OpenAI base URL. */
    const char *p = evhttp_uri_get_path(u);
    size_t n = p ? strlen(p) : 0;
    while (n > 0 && p[n - 1] == '/')
        n--;
    bool v1 = n >= 3 && memcmp(p + n - 3, "/v1", 3) == 0;
    if (n > 1000) {
        fprintf(stderr, "kvgate-replay: --live %s: path too long\n", url);
        goto out;
    }
    snprintf(run->path, sizeof(run->path), "%.*s%s", (int)n, n ? p : "",
             v1 ? "/completions" : "/v1/completions");
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    char service[8];
    snprintf(service, sizeof(service), "%d", port);
    int gai = getaddrinfo(bare, service, &hints, &res);
    if (gai != 0 || !res) {
        fprintf(stderr, "kvgate-replay: --live %s: cannot resolve %s: %s\n", url, bare,
                gai_strerror(gai));
        goto out;
    }
    memcpy(&run->addr, res->ai_addr, res->ai_addrlen);
    run->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    rc = 0;
out:
    if (u)
        evhttp_uri_free(u);
    return rc;
}

/* One blocking connect before the run, so a dead gateway is one clear line, not a trace's worth
 * of connection errors. */
static int probe(const live_run *run, const char *url)
{
    int fd = socket(run->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (const struct sockaddr *)&run->addr, run->addrlen) < 0) {
        fprintf(stderr, "kvgate-replay: --live %s: cannot connect to %s: %s\n", url, run->host,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return KVG_ECONFIG;
    }
    close(fd);
    return 0;
}

/* ---- one request --------------------------------------------------------------------------- */

void live_req_status(live_req *q, int status)
{
    q->status = status;
}

void live_req_header(live_req *q, const char *name, size_t nlen, const char *value, size_t vlen)
{
    bool gw = nlen == 15 && strncasecmp(name, "x-kvgate-worker", 15) == 0;
    bool sim = nlen == 16 && strncasecmp(name, "x-simworker-name", 16) == 0;
    if (!gw && !(sim && !q->worker[0]))
        return;
    size_t n = 0;
    for (; n < vlen && n < LIVE_WORKER_NAME_MAX; n++) {
        unsigned char c = (unsigned char)value[n];
        q->worker[n] = c > 0x20 && c < 0x7f ? (char)c : '?';
    }
    q->worker[n] = '\0';
}

static int on_event(void *arg, const char *data, size_t len)
{
    live_req *q = arg;
    int rc = lg_stream_event(&q->stream, data, len);
    if (rc == 1 && !q->t_first_ns)
        q->t_first_ns = kvg_now_ns();
    return rc < 0 ? rc : 0;
}

void live_req_data(live_req *q, const char *data, size_t len)
{
    if (q->finished)
        return;
    if (q->status < 200 || q->status >= 300) {
        if (q->detail.len < DETAIL_MAX)
            kvg_buf_append(&q->detail, data, KVG_MIN(len, DETAIL_MAX - q->detail.len));
        return;
    }
    if (q->stream_rc == 0)
        q->stream_rc = lg_sse_feed(&q->sse, data, len, on_event, q);
}

static void count_worker(run_state *s, const char *name)
{
    for (size_t i = 0; i < s->nnames; i++) {
        if (strcmp(s->names[i], name) == 0) {
            s->counts[i]++;
            return;
        }
    }
    if (name[0] && s->nnames < MAX_NAMES && (s->names[s->nnames] = strdup(name))) {
        s->counts[s->nnames++]++;
        return;
    }
    s->counts[MAX_NAMES]++;
}

static void note_error(run_state *s, live_req *q, live_outcome o, const char *detail)
{
    replay_live_errors *e = s->errs;
    switch (o) {
    case LIVE_STATUS:
        e->status++;
        break;
    case LIVE_TIMEOUT:
        e->timeout++;
        break;
    case LIVE_CONNECTION:
        e->connection++;
        break;
    case LIVE_PROTOCOL:
        e->protocol++;
        break;
    case LIVE_TOKENS:
        e->tokens++;
        break;
    default:
        break;
    }
    if (!e->first[0])
        snprintf(e->first, sizeof(e->first), "request %zu: %s: %.150s", q->index,
                 live_outcome_str(o), detail ? detail : "");
}

void live_req_finish(live_req *q, live_outcome outcome, const char *detail)
{
    if (q->finished || !q->sent)
        return;
    q->finished = true;
    run_state *s = state_of(q->run);
    event_del(&q->deadline);
    char buf[DETAIL_MAX + 64];
    if (outcome == LIVE_OK) {
        const lg_usage *u = &q->stream.usage;
        if (q->status < 200 || q->status >= 300) {
            outcome = LIVE_STATUS;
            snprintf(buf, sizeof(buf), "HTTP %d %.*s", q->status, (int)q->detail.len,
                     q->detail.data ? q->detail.data : "");
            detail = buf;
        } else if (q->stream_rc < 0) {
            outcome = LIVE_PROTOCOL;
            detail = q->stream_rc == KVG_EPROTO ? "error event in the stream"
                                                : "malformed event in the stream";
        } else if (!q->stream.done) {
            outcome = LIVE_PROTOCOL;
            detail = "stream ended without data: [DONE]";
        } else if (!u->present || !u->cached_present) {
            outcome = LIVE_PROTOCOL;
            detail = "no usage.prompt_tokens_details.cached_tokens in the stream";
        } else if (u->prompt_tokens != q->r->input_tokens) {
            outcome = LIVE_TOKENS;
            snprintf(buf, sizeof(buf), "prompt_tokens %llu, the trace says %u",
                     (unsigned long long)u->prompt_tokens, q->r->input_tokens);
            detail = buf;
        }
    }
    if (outcome == LIVE_OK) {
        uint64_t cached = q->stream.usage.cached_tokens;
        s->hit_tokens += cached;
        s->hit_blocks += cached / REPLAY_BLOCK_TOKENS;
        if (q->t_first_ns)
            s->ttft_ms[s->nttft++] = (double)(q->t_first_ns - q->t_arrival_ns) / 1e6;
        count_worker(s, q->worker);
    } else {
        note_error(s, q, outcome, detail);
    }
    kvg_log_debug("replay: live request %zu: %s, status %d, worker %s", q->index,
                  live_outcome_str(outcome), q->status, q->worker);
    kvg_buf_done(&q->body);
    kvg_buf_done(&q->detail);
    lg_sse_done(&q->sse);
    q->conn = NULL;
    if (++s->finished == s->t->n)
        event_base_loopbreak(s->run.base);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    live_req *q = arg;
    (void)fd;
    (void)what;
    if (q->h2)
        live_h2_cancel(q->run->h2, q);
    else
        live_h1_cancel(q->run->h1, q);
    live_req_finish(q, LIVE_TIMEOUT, "no complete response within --timeout-ms");
}

static void build_body(live_req *q, const replay_live_config *cfg)
{
    uint32_t max_tokens = q->r->output_tokens;
    if (cfg->max_tokens && max_tokens > cfg->max_tokens)
        max_tokens = cfg->max_tokens;
    if (max_tokens < 1)
        max_tokens = 1;
    kvg_buf *b = &q->body;
    if (kvg_buf_reserve(b, (size_t)q->r->input_tokens * 5 + 256) < 0)
        return;
    kvg_buf_puts(b, "{\"model\":");
    kvg_buf_json_string(b, cfg->model, strlen(cfg->model));
    kvg_buf_puts(b, ",\"prompt\":\"");
    replay_live_text(b, q->r);
    kvg_buf_printf(b,
                   "\",\"max_tokens\":%u,\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true}}",
                   max_tokens);
}

static void send_one(run_state *s, live_req *q)
{
    const replay_live_config *cfg = s->run.cfg;
    q->sent = true;
    q->t_arrival_ns = s->t0_ns + q->r->arrival_us * 1000;
    q->h2 = cfg->http == REPLAY_LIVE_H2 || (cfg->http == REPLAY_LIVE_MIXED && q->index % 2 == 0);
    evtimer_add(&q->deadline, &s->run.timeout);
    build_body(q, cfg);
    if (q->body.failed) {
        live_req_finish(q, LIVE_CONNECTION, "out of memory building the body");
        return;
    }
    if (q->h2)
        live_h2_send(s->run.h2, q);
    else
        live_h1_send(s->run.h1, q);
}

/* Send everything due, then sleep until the next arrival. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    run_state *s = arg;
    (void)fd;
    (void)what;
    uint64_t now = kvg_now_ns();
    while (s->next < s->t->n && !s->interrupted) {
        live_req *q = &s->reqs[s->next];
        uint64_t due = s->t0_ns + q->r->arrival_us * 1000;
        if (due > now) {
            uint64_t wait = due - now;
            struct timeval tv = {.tv_sec = (time_t)(wait / 1000000000u),
                                 .tv_usec = (suseconds_t)(wait % 1000000000u / 1000u)};
            evtimer_add(s->tick, &tv);
            return;
        }
        s->next++;
        send_one(s, q);
    }
}

static void on_progress(evutil_socket_t fd, short what, void *arg)
{
    run_state *s = arg;
    (void)fd;
    (void)what;
    const replay_live_errors *e = s->errs;
    fprintf(stderr, "kvgate-replay: live: %.0f s: sent %zu/%zu, done %zu, errors %llu\n",
            (double)(kvg_now_ns() - s->t0_ns) / 1e9, s->next, s->t->n, s->finished,
            (unsigned long long)(e->status + e->timeout + e->connection + e->protocol + e->tokens));
}

static void on_sigint(evutil_socket_t fd, short what, void *arg)
{
    run_state *s = arg;
    (void)fd;
    (void)what;
    /* Stop sending; what is in flight is cancelled and counted as timeouts. */
    s->interrupted = true;
    fprintf(stderr, "kvgate-replay: live: interrupted\n");
    for (size_t i = 0; i < s->next; i++) {
        live_req *q = &s->reqs[i];
        if (!q->finished)
            on_deadline(-1, 0, q);
    }
    event_base_loopbreak(s->run.base);
}

/* ---- results ------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);
    return v[rank ? rank - 1 : 0];
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int fill_row(run_state *s, replay_row *out)
{
    /* Workers ordered by name; their counts follow their names. */
    size_t order[MAX_NAMES];
    char *sorted[MAX_NAMES];
    memcpy(sorted, s->names, s->nnames * sizeof(*sorted));
    qsort(sorted, s->nnames, sizeof(*sorted), cmp_name);
    for (size_t i = 0; i < s->nnames; i++)
        for (size_t j = 0; j < s->nnames; j++)
            if (s->names[j] == sorted[i])
                order[i] = j;
    bool other = s->counts[MAX_NAMES] > 0;
    unsigned nw = (unsigned)s->nnames + (other ? 1u : 0u);
    uint64_t *per = calloc(nw ? nw : 1, sizeof(*per));
    if (!per)
        return -ENOMEM;
    uint64_t max = 0, sum = 0;
    for (unsigned i = 0; i < nw; i++) {
        per[i] = i < s->nnames ? s->counts[order[i]] : s->counts[MAX_NAMES];
        max = KVG_MAX(max, per[i]);
        sum += per[i];
    }
    qsort(s->ttft_ms, s->nttft, sizeof(double), cmp_double);
    double total = 0;
    for (size_t i = 0; i < s->nttft; i++)
        total += s->ttft_ms[i];
    *out = (replay_row){
        .policy = true,
        .live = true,
        .requests = s->t->n,
        .blocks = s->t->blocks,
        .hit_blocks = s->hit_blocks,
        .tokens = s->t->tokens,
        .hit_tokens = s->hit_tokens,
        .ttft_p50_ms = percentile(s->ttft_ms, s->nttft, 50),
        .ttft_p99_ms = percentile(s->ttft_ms, s->nttft, 99),
        .ttft_mean_ms = s->nttft ? total / (double)s->nttft : 0,
        .imbalance = sum ? (double)max * nw / (double)sum : 0,
        .per_worker = per,
        .nworkers = nw,
        .seconds = (double)(kvg_now_ns() - s->t0_ns) / 1e9,
    };
    snprintf(out->name, sizeof(out->name), "live");
    return 0;
}

/* ---- the run ------------------------------------------------------------------------------- */

static void raise_fd_limit(size_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
}

int replay_live_run(const replay_trace *t, const replay_live_config *cfg, replay_row *out,
                    replay_live_errors *errs)
{
    run_state *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->run.cfg = cfg;
    s->t = t;
    s->errs = errs;
    memset(errs, 0, sizeof(*errs));
    s->run.timeout.tv_sec = cfg->timeout_ms / 1000;
    s->run.timeout.tv_usec = (suseconds_t)(cfg->timeout_ms % 1000) * 1000;
    int rc = parse_url(&s->run, cfg->url);
    if (rc == 0)
        rc = probe(&s->run, cfg->url);
    if (rc < 0)
        goto fail_state;
    rc = -ENOMEM;
    s->reqs = calloc(t->n ? t->n : 1, sizeof(*s->reqs));
    s->ttft_ms = calloc(t->n ? t->n : 1, sizeof(*s->ttft_ms));
    s->auth = calloc(cfg->nkeys ? cfg->nkeys : 1, sizeof(*s->auth));
    if (!s->reqs || !s->ttft_ms || !s->auth)
        goto fail_state;
    for (size_t i = 0; i < cfg->nkeys; i++) {
        size_t n = strlen(cfg->keys[i]) + 8;
        if (!(s->auth[i] = malloc(n)))
            goto fail_state;
        snprintf(s->auth[i], n, "Bearer %s", cfg->keys[i]);
    }
    raise_fd_limit((size_t)cfg->h1_max + cfg->connections + 64);
    s->run.base = event_base_new();
    if (!s->run.base)
        goto fail_state;
    s->tick = evtimer_new(s->run.base, on_tick, s);
    s->progress = event_new(s->run.base, -1, EV_PERSIST, on_progress, s);
    s->sigint = evsignal_new(s->run.base, SIGINT, on_sigint, s);
    if (!s->tick || !s->progress || !s->sigint)
        goto fail_base;
    if (cfg->http != REPLAY_LIVE_H1 && (rc = live_h2_new(&s->run, &s->run.h2)) < 0)
        goto fail_base;
    if (cfg->http != REPLAY_LIVE_H2 && (rc = live_h1_new(&s->run, &s->run.h1)) < 0)
        goto fail_transports;
    for (size_t i = 0; i < t->n; i++) {
        live_req *q = &s->reqs[i];
        q->run = &s->run;
        q->index = i;
        q->r = &t->reqs[i];
        if (cfg->nkeys) {
            uint32_t b = KVG_MIN(cfg->tenant_block, q->r->nblocks ? q->r->nblocks - 1 : 0);
            uint64_t key = q->r->nblocks ? q->r->keys[b] : 0;
            uint32_t tenant = cfg->tenants ? (uint32_t)(key % cfg->tenants) : 0;
            q->authorization = s->auth[tenant % cfg->nkeys];
        }
        kvg_buf_init(&q->body);
        kvg_buf_init(&q->detail);
        lg_sse_init(&q->sse, MAX_SSE_EVENT);
        kvg_list_init(&q->link);
        evtimer_assign(&q->deadline, s->run.base, on_deadline, q);
    }
    struct timeval every = {.tv_sec = PROGRESS_S};
    if (!cfg->quiet)
        event_add(s->progress, &every);
    event_add(s->sigint, NULL);
    s->t0_ns = kvg_now_ns();
    rc = 0;
    if (t->n) {
        on_tick(-1, 0, s);
        if (event_base_dispatch(s->run.base) < 0)
            rc = -EIO;
    }
    if (rc == 0)
        rc = fill_row(s, out);
    if (rc == 0 && s->interrupted) {
        errs->unsent = t->n - s->next;
        if (!errs->first[0])
            snprintf(errs->first, sizeof(errs->first), "interrupted");
    }

    for (size_t i = 0; i < t->n; i++) {
        live_req *q = &s->reqs[i];
        event_del(&q->deadline);
        kvg_buf_done(&q->body);
        kvg_buf_done(&q->detail);
        lg_sse_done(&q->sse);
    }
fail_transports:
    live_h1_free(s->run.h1);
    live_h2_free(s->run.h2);
fail_base:
    if (s->sigint)
        event_free(s->sigint);
    if (s->progress)
        event_free(s->progress);
    if (s->tick)
        event_free(s->tick);
    event_base_free(s->run.base);
fail_state:
    for (size_t i = 0; s->auth && i < cfg->nkeys; i++)
        free(s->auth[i]);
    for (size_t i = 0; i < s->nnames; i++)
        free(s->names[i]);
    free(s->auth);
    free(s->ttft_ms);
    free(s->reqs);
    free(s);
    return rc;
}
