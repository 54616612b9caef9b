/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate admin's HTTP side: the admin URL, the token, and one blocking HTTP/1.1 exchange (plain
 * socket, a deadline on the whole of it, http_parser for the answer) with its report. */
#include "cli_int.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <http_parser.h>

#define RESPONSE_MAX (256u * 1024 * 1024) /* /metrics of a large fleet fits */

int kvg_cli_find_token(const kvg_cli *c, char *out, size_t out_len)
{
    const char *t = c->token;
    if (!t || !*t)
        t = getenv("KVGATE_ADMIN_TOKEN");
    if (t && *t) {
        if (strlen(t) >= out_len)
            return kvg_cli_usage_error("the admin token is longer than %zu bytes", out_len - 1);
        snprintf(out, out_len, "%s", t);
        return 0;
    }
    char path[4200];
    snprintf(path, sizeof(path), "%s/admin-token", c->state_dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr,
                "kvgate admin: no admin token: pass --token, set KVGATE_ADMIN_TOKEN, or run "
                "where %s is readable (--state DIR): %s\n",
                path, strerror(errno));
        return KVG_CLI_EXIT_USAGE;
    }
    char *ok = fgets(out, (int)out_len, f);
    fclose(f);
    if (ok)
        out[strcspn(out, "\r\n")] = '\0';
    if (!ok || !*out) {
        fprintf(stderr, "kvgate admin: %s is empty\n", path);
        return KVG_CLI_EXIT_USAGE;
    }
    return 0;
}

typedef struct response {
    int status;
    kvg_buf body;
    bool complete;
    bool too_large;
} response;

static int on_body(http_parser *p, const char *at, size_t len)
{
    response *r = p->data;
    if (r->body.len + len > RESPONSE_MAX) {
        r->too_large = true;
        return 1;
    }
    kvg_buf_append(&r->body, at, len);
    return r->body.failed ? 1 : 0;
}

static int on_complete(http_parser *p)
{
    response *r = p->data;
    r->status = (int)p->status_code;
    r->complete = true;
    return 0;
}

/* Milliseconds left before the deadline (monotonic ns), at least 0. */
static int ms_left(uint64_t deadline)
{
    uint64_t now = kvg_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* Wait until fd is ready for events; 0, -ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int n = poll(&pfd, 1, ms_left(deadline));
        if (n > 0)
            return 0;
        if (n == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

static int connect_to(const char *host, uint16_t port, uint64_t deadline, int *out)
{
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        fprintf(stderr, "kvgate admin: cannot resolve %s: %s\n", host, gai_strerror(gai));
        return -EHOSTUNREACH;
    }
    int rc = -ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
            rc = -errno;
            close(fd);
            continue;
        }
        rc = wait_fd(fd, POLLOUT, deadline);
        int err = 0;
        socklen_t elen = sizeof(err);
        if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err)
            rc = -err;
        if (rc == 0) {
            *out = fd;
            break;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

static int send_all(int fd, const char *p, size_t len, uint64_t deadline)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int rc = wait_fd(fd, POLLOUT, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Read the answer until it is complete or the server closes. 0, -ETIMEDOUT, -EPROTO, -EFBIG. */
static int read_response(int fd, uint64_t deadline, response *r)
{
    static const http_parser_settings settings = {.on_body = on_body,
                                                  .on_message_complete = on_complete};
    http_parser parser;
    http_parser_init(&parser, HTTP_RESPONSE);
    parser.data = r;
    char buf[16384];
    while (!r->complete) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc < 0)
                return rc;
            continue;
        }
        if (n < 0)
            return -errno;
        /* n == 0: the end, which completes a body delimited by the close */
        size_t used = http_parser_execute(&parser, &settings, buf, (size_t)n);
        if (r->too_large)
            return -EFBIG;
        if (r->body.failed)
            return -ENOMEM;
        if (HTTP_PARSER_ERRNO(&parser) != HPE_OK || used != (size_t)n)
            return -EPROTO;
        if (n == 0)
            return r->complete ? 0 : -EPROTO;
    }
    return 0;
}

static int call(const kvg_cli *c, const kvg_cli_target *t, const char *token, response *r)
{
    uint64_t deadline = kvg_now_ns() + (uint64_t)(c->timeout_s * 1e9);
    int fd = -1;
    int rc = connect_to(t->host, t->port, deadline, &fd);
    if (rc < 0) {
        if (rc != -EHOSTUNREACH)
            fprintf(stderr, "kvgate admin: cannot connect to %s: %s\n", t->authority,
                    kvg_strerror(rc));
        return rc;
    }
    kvg_buf req;
    kvg_buf_init(&req);
    kvg_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kvgate-admin\r\n", c->method,
                   c->path.data, t->authority);
    if (token)
        kvg_buf_printf(&req, "Authorization: Bearer %s\r\n", token);
    if (c->body.len)
        kvg_buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                       c->body.len);
    else if (strcmp(c->method, "GET") != 0)
        kvg_buf_puts(&req, "Content-Length: 0\r\n");
    kvg_buf_puts(&req, "Accept: application/json\r\nConnection: close\r\n\r\n");
    if (c->body.len)
        kvg_buf_append(&req, c->body.data, c->body.len);
    rc = req.failed ? -ENOMEM : send_all(fd, req.data, req.len, deadline);
    /* the request holds the token: leave no copy behind */
    if (req.data)
        memset(req.data, 0, req.cap);
    kvg_buf_done(&req);
    if (rc == 0)
        rc = read_response(fd, deadline, r);
    close(fd);
    if (rc < 0)
        fprintf(stderr, "kvgate admin: %s %s on %s: %s\n", c->method, c->path.data, t->authority,
                rc == -ETIMEDOUT ? "no answer in time (--timeout)"
                : rc == -EPROTO  ? "not an HTTP answer"
                : rc == -EFBIG   ? "answer too large"
                                 : kvg_strerror(rc));
    return rc;
}

/* The URL: http://host[:port][/]; https is curl's business. */
int kvg_cli_parse_url(const char *url, kvg_cli_target *t)
{
    if (strncmp(url, "https://", 8) == 0)
        return kvg_cli_usage_error("--url: https is not supported by kvgate admin; use curl with "
                                   "--cacert for a TLS admin listener");
    if (strncmp(url, "http://", 7) != 0)
        return kvg_cli_usage_error("--url: expected http://host:port, got \"%s\"", url);
    char hp[300];
    const char *rest = url + 7;
    size_t len = strcspn(rest, "/");
    if (rest[len] && strcmp(rest + len, "/") != 0)
        return kvg_cli_usage_error("--url: no path allowed, got \"%s\"", url);
    if (len == 0 || len >= sizeof(hp) - 4)
        return kvg_cli_usage_error("--url: expected http://host:port, got \"%s\"", url);
    memcpy(hp, rest, len);
    hp[len] = '\0';
    /* no port: HTTP's 80 */
    bool has_port = hp[len - 1] != ']' && strrchr(hp, ':') &&
                    (hp[0] != '[' || strrchr(hp, ':') > strchr(hp, ']'));
    if (!has_port)
        strcat(hp, ":80");
    if (kvg_parse_hostport(hp, t->host, sizeof(t->host), &t->port) < 0 || t->port == 0)
        return kvg_cli_usage_error("--url: expected http://host:port, got \"%s\"", url);
    snprintf(t->authority, sizeof(t->authority), "%s", hp);
    return 0;
}

/* "message" of an OpenAI-shaped error body, or NULL. */
static const char *error_message(const kvg_buf *body, kvg_arena *arena)
{
    kvg_json *root;
    if (!body->len || kvg_json_parse(body->data, body->len, arena, NULL, &root, NULL) < 0)
        return NULL;
    const kvg_json *m = kvg_json_get(kvg_json_get(root, "error"), "message");
    if (!m)
        m = kvg_json_get(root, "reason"); /* /readyz */
    return m && m->type == KVG_JSON_STRING ? m->u.str.ptr : NULL;
}

static int report(const kvg_cli *c, const response *r)
{
    bool ok = r->status >= 200 && r->status < 300;
    if (ok) {
        if (r->body.len)
            kvg_cli_print_answer(stdout, c, r->body.data, r->body.len);
        return fflush(stdout) == 0 ? KVG_CLI_EXIT_OK : KVG_CLI_EXIT_FAIL;
    }
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    const char *msg = error_message(&r->body, &arena);
    if (msg)
        fprintf(stderr, "kvgate admin: %d: %s\n", r->status, msg);
    else
        fprintf(stderr, "kvgate admin: %d: %.*s\n", r->status, (int)KVG_MIN(r->body.len, 4096),
                r->body.len ? r->body.data : "");
    kvg_arena_done(&arena);
    return KVG_CLI_EXIT_FAIL;
}

int kvg_cli_send(const kvg_cli *c, const kvg_cli_target *t, const char *token)
{
    response r = {.status = 0};
    kvg_buf_init(&r.body);
    int rc = call(c, t, token, &r) < 0 ? KVG_CLI_EXIT_FAIL : report(c, &r);
    kvg_buf_done(&r.body);
    return rc;
}
