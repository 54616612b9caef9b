/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for the upstream state machine and its pool: a gateway thread driven by hand and
 * a scripted worker on a loopback socket, so every transition is observed directly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway_int.h"
#include "upstream.h"

/* ---- environment: one thread, one registry, one scripted worker ------------------------------ */

typedef struct env {
    kvg_gateway gw;
    kvg_thread *t;
    int listen_fd;
    uint16_t port;
    kvg_worker *worker;
} env;

typedef struct outcome {
    int retryable;
    bool connect_failed;
    int head_status;
    int64_t content_length;
    kvg_buf body;
    int ended;
    int error_status;
    char header_names[512];
} outcome;

static void cb_retryable(void *ud, int err, bool connect_failed)
{
    outcome *o = ud;
    o->retryable++;
    o->connect_failed = connect_failed;
}

static void cb_head(void *ud, int status, const kvg_header *h, size_t n, int64_t cl)
{
    outcome *o = ud;
    o->head_status = status;
    o->content_length = cl;
    for (size_t i = 0; i < n; i++) {
        strncat(o->header_names, h[i].name, sizeof(o->header_names) - strlen(o->header_names) - 2);
        strcat(o->header_names, ",");
    }
}

static void cb_data(void *ud, const char *d, size_t len)
{
    kvg_buf_append(&((outcome *)ud)->body, d, len);
}

static void cb_end(void *ud)
{
    ((outcome *)ud)->ended++;
}

static void cb_error(void *ud, int status, const char *msg)
{
    ((outcome *)ud)->error_status = status;
}

static const kvg_upstream_cbs cbs = {cb_retryable, cb_head, cb_data, cb_end, cb_error};

static int setup(void **state)
{
    env *e = calloc(1, sizeof(*e));
    signal(SIGPIPE, SIG_IGN);
    kvg_log_set_level(KVG_LOG_ERROR);
    assert_int_equal(kvg_config_init(&e->gw.cfg), 0);
    e->gw.cfg.upstream.response_timeout_ms = 300;
    e->gw.cfg.upstream.read_timeout_ms = 300;
    e->gw.cfg.upstream.connect_timeout_ms = 300;
    e->gw.access_log_fd = -1;
    e->gw.nthreads = 1;
    kvg_registry_config rc = {.nthreads = 1};
    assert_int_equal(kvg_registry_new(&rc, &e->gw.registry), 0);
    e->gw.threads = calloc(1, sizeof(kvg_thread));
    e->t = &e->gw.threads[0];
    assert_int_equal(kvg_thread_init(e->t, &e->gw, 0, false), 0);
    assert_int_equal(kvg_listen_socket("127.0.0.1", 0, false, &e->listen_fd, &e->port), 0);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u", e->port);
    kvg_worker_def def = {.name = "w", .url = url};
    assert_int_equal(kvg_registry_put(e->gw.registry, &def, KVG_WORKER_SOURCE_CONFIG, NULL, 0), 0);
    kvg_worker_set *set = kvg_registry_acquire(e->gw.registry);
    e->worker = kvg_worker_ref(kvg_worker_set_at(set, 0));
    kvg_worker_set_unref(set);
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    env *e = *state;
    kvg_upstream_thread_close_all(e->t);
    kvg_worker_unref(e->worker);
    close(e->listen_fd);
    kvg_thread_done(e->t);
    free(e->gw.threads);
    kvg_registry_free(e->gw.registry);
    kvg_config_done(&e->gw.cfg);
    free(e);
    return 0;
}

static void spin(env *e, int turns)
{
    for (int i = 0; i < turns; i++) {
        event_base_loop(e->t->base, EVLOOP_NONBLOCK);
        usleep(200);
    }
}

/* Accept the gateway's connection (waiting for it), read the request head. */
static int worker_accept(env *e)
{
    for (int i = 0; i < 500; i++) {
        int fd = accept4(e->listen_fd, NULL, NULL, SOCK_NONBLOCK);
        if (fd >= 0)
            return fd;
        spin(e, 1);
    }
    fail_msg("the gateway never connected");
    return -1;
}

static void worker_read_request(env *e, int fd)
{
    char buf[8192];
    size_t got = 0;
    for (int i = 0; i < 500; i++) {
        ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n > 0)
            got += (size_t)n;
        buf[got] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end && strlen(end + 4) >= 2) /* the test bodies are "{}" */
            return;
        spin(e, 1);
    }
    fail_msg("no complete request arrived");
}

static void worker_send(int fd, const char *s)
{
    assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

static kvg_upstream *send_request(env *e, outcome *o)
{
    static const char head[] = "POST /v1/completions HTTP/1.1\r\nhost: w\r\n"
                               "content-length: 2\r\n\r\n";
    struct evbuffer *body = evbuffer_new();
    evbuffer_add(body, "{}", 2);
    kvg_buf_init(&o->body);
    kvg_upstream *u = NULL;
    assert_int_equal(
        kvg_upstream_request(e->t, e->worker, head, sizeof(head) - 1, body, &cbs, o, &u), 0);
    evbuffer_free(body); /* the connection holds its own reference to the body's bytes */
    return u;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_content_length_then_reuse(void **state)
{
    env *e = *state;
    outcome o = {0};
    kvg_upstream *u = send_request(e, &o);
    assert_int_equal(kvg_upstream_state_of(u), KVG_UPSTREAM_CONNECTING);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    worker_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n"
                    "X-A: 1\r\n\r\nhello");
    for (int i = 0; i < 200 && !o.ended; i++)
        spin(e, 1);
    assert_int_equal(o.ended, 1);
    assert_int_equal(o.head_status, 200);
    assert_int_equal(o.content_length, 5);
    assert_string_equal(o.body.data, "hello");
    assert_non_null(strstr(o.header_names, "x-a,"));
    /* The connection went back to the pool: the next request reuses it, no new accept. */
    outcome o2 = {0};
    u = send_request(e, &o2);
    assert_true(kvg_upstream_reused(u));
    assert_int_equal(kvg_upstream_state_of(u), KVG_UPSTREAM_WAITING);
    worker_read_request(e, fd);
    worker_send(
        fd,
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
    for (int i = 0; i < 200 && !o2.ended; i++)
        spin(e, 1);
    assert_int_equal(o2.ended, 1);
    assert_int_equal(o2.content_length, -1);
    assert_string_equal(o2.body.data, "abcde");
    close(fd);
    kvg_buf_done(&o.body);
    kvg_buf_done(&o2.body);
}

static void test_close_delimited(void **state)
{
    env *e = *state;
    outcome o = {0};
    send_request(e, &o);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    worker_send(fd, "HTTP/1.0 200 OK\r\n\r\nuntil close");
    spin(e, 20);
    assert_int_equal(o.ended, 0); /* no end without the close */
    close(fd);
    for (int i = 0; i < 200 && !o.ended; i++)
        spin(e, 1);
    assert_int_equal(o.ended, 1);
    assert_string_equal(o.body.data, "until close");
    kvg_buf_done(&o.body);
}

static void test_reset_before_response_is_retryable(void **state)
{
    env *e = *state;
    outcome o = {0};
    send_request(e, &o);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    close(fd);
    for (int i = 0; i < 200 && !o.retryable; i++)
        spin(e, 1);
    assert_int_equal(o.retryable, 1);
    assert_false(o.connect_failed);
    assert_int_equal(o.head_status, 0);
    kvg_buf_done(&o.body);
}

static void test_connect_refused_is_retryable(void **state)
{
    env *e = *state;
    /* Nothing listens on the port once the socket is closed. */
    close(e->listen_fd);
    e->listen_fd = -1;
    outcome o = {0};
    send_request(e, &o);
    for (int i = 0; i < 500 && !o.retryable; i++)
        spin(e, 1);
    assert_int_equal(o.retryable, 1);
    assert_true(o.connect_failed);
    kvg_buf_done(&o.body);
}

static void test_truncated_response_is_an_error(void **state)
{
    env *e = *state;
    outcome o = {0};
    send_request(e, &o);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    worker_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly some");
    spin(e, 20);
    close(fd);
    for (int i = 0; i < 200 && !o.error_status; i++)
        spin(e, 1);
    assert_int_equal(o.head_status, 200);
    assert_int_equal(o.error_status, 502);
    assert_int_equal(o.ended, 0);
    assert_int_equal(o.retryable, 0); /* bytes reached the caller: never retried */
    kvg_buf_done(&o.body);
}

static void test_malformed_response_is_an_error(void **state)
{
    env *e = *state;
    outcome o = {0};
    send_request(e, &o);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    worker_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab");
    for (int i = 0; i < 200 && !o.error_status; i++)
        spin(e, 1);
    assert_int_equal(o.error_status, 502);
    close(fd);
    kvg_buf_done(&o.body);
}

static void test_response_timeout(void **state)
{
    env *e = *state;
    outcome o = {0};
    send_request(e, &o);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    /* Say nothing: after response_timeout_ms (300) the request fails with 504. */
    for (int i = 0; i < 3000 && !o.error_status; i++)
        spin(e, 1);
    assert_int_equal(o.error_status, 504);
    close(fd);
    kvg_buf_done(&o.body);
}

static void test_pause_withholds_data(void **state)
{
    env *e = *state;
    outcome o = {0};
    kvg_upstream *u = send_request(e, &o);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    worker_send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nfirs\r\n");
    for (int i = 0; i < 200 && o.body.len < 4; i++)
        spin(e, 1);
    assert_int_equal(o.body.len, 4);
    kvg_upstream_pause(u, true);
    worker_send(fd, "6\r\nsecond\r\n0\r\n\r\n");
    spin(e, 50);
    assert_int_equal(o.body.len, 4); /* nothing while paused */
    assert_int_equal(o.ended, 0);
    kvg_upstream_pause(u, false);
    for (int i = 0; i < 200 && !o.ended; i++)
        spin(e, 1);
    assert_string_equal(o.body.data, "firssecond");
    close(fd);
    kvg_buf_done(&o.body);
}

static void test_abort_stops_callbacks(void **state)
{
    env *e = *state;
    outcome o = {0};
    kvg_upstream *u = send_request(e, &o);
    int fd = worker_accept(e);
    worker_read_request(e, fd);
    kvg_upstream_abort(u);
    worker_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    spin(e, 50);
    assert_int_equal(o.head_status, 0);
    assert_int_equal(o.ended + o.retryable + o.error_status, 0);
    /* The worker sees its connection closed: that is how it learns to stop. */
    char c;
    ssize_t n = -1;
    for (int i = 0; i < 200 && n != 0; i++) {
        n = read(fd, &c, 1);
        spin(e, 1);
    }
    assert_int_equal(n, 0);
    close(fd);
    kvg_buf_done(&o.body);
}

static void test_state_names(void **state)
{
    (void)state;
    for (int s = 0; s < KVG_UPSTREAM_STATE_COUNT; s++)
        assert_string_not_equal(kvg_upstream_state_str((kvg_upstream_state)s), "?");
    assert_string_equal(kvg_upstream_state_str(KVG_UPSTREAM_STATE_COUNT), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_content_length_then_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_delimited, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reset_before_response_is_retryable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_refused_is_retryable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_response_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_response_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_response_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_withholds_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_stops_callbacks, setup, teardown),
        cmocka_unit_test(test_state_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
