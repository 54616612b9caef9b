/* SPDX-License-Identifier: Apache-2.0 */
/* A whole gateway in process (gateway.h): built from a configuration, run on a thread, asked
 * for a model list and the admin health check over real sockets, stopped and freed; and one
 * that cannot bind frees what it built. Under ASan this is the leak check of the life cycle. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway.h"

static char state_dir[] = "/tmp/kvg-test-gateway-XXXXXX";

static void embedded_config(kvg_config *cfg)
{
    char err[256];
    assert_int_equal(kvg_config_init(cfg), 0);
    const char *argv[] = {"kvgate",      "--listen",     "127.0.0.1:0", "--admin-listen",
                          "127.0.0.1:0", "--threads",    "1",           "--auth",
                          "open",        "--access-log", "off",         "--log-level",
                          "warn",        "--state",      state_dir};
    kvg_config_action action;
    assert_int_equal(kvg_config_parse_args(cfg, (int)(sizeof(argv) / sizeof(argv[0])),
                                           (char **)argv, &action, err, sizeof(err)),
                     0);
    assert_int_equal(kvg_config_validate(cfg, err, sizeof(err)), 0);
}

static void *run_thread(void *gw)
{
    return (void *)(intptr_t)kvg_gateway_run(gw);
}

/* One HTTP/1.1 request on a fresh connection; the whole answer (the server closes). */
static void request(uint16_t port, const char *req, char *out, size_t out_len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t got = 0;
    ssize_t n;
    while (got + 1 < out_len && (n = recv(fd, out + got, out_len - 1 - got, 0)) > 0)
        got += (size_t)n;
    out[got] = '\0';
    close(fd);
}

static void test_run_serve_stop(void **state)
{
    (void)state;
    kvg_config cfg;
    embedded_config(&cfg);
    kvg_gateway *gw;
    assert_int_equal(kvg_gateway_new(&cfg, 0, NULL, &gw), 0);
    uint16_t front = kvg_gateway_port(gw, false, 0), admin = kvg_gateway_port(gw, true, 0);
    assert_true(front > 0 && admin > 0 && front != admin);
    assert_int_equal(kvg_gateway_port(gw, false, 1), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_thread, gw), 0);

    char buf[4096];
    request(front, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", buf,
            sizeof(buf));
    assert_non_null(strstr(buf, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(buf, "{\"object\":\"list\",\"data\":[]}"));
    request(admin, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", buf,
            sizeof(buf));
    assert_non_null(strstr(buf, "HTTP/1.1 200 OK\r\n"));
    /* No worker: a completion is a clean 503, not a hang. */
    request(front,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            "Content-Length: 27\r\n\r\n{\"model\":\"m\",\"prompt\":\"hi\"}",
            buf, sizeof(buf));
    assert_non_null(strstr(buf, "HTTP/1.1 503 "));

    kvg_gateway_stop(gw);
    void *rc;
    assert_int_equal(pthread_join(th, &rc), 0);
    assert_int_equal((intptr_t)rc, 0);
    kvg_gateway_free(gw);
}

static void test_bind_failure_frees(void **state)
{
    (void)state;
    /* Hold a port, then ask for it without SO_REUSEPORT: the build fails at the listener. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t len = sizeof(sin);
    getsockname(fd, (struct sockaddr *)&sin, &len);
    kvg_config cfg;
    embedded_config(&cfg);
    snprintf(cfg.listeners[0].address, sizeof(cfg.listeners[0].address), "127.0.0.1:%u",
             ntohs(sin.sin_port));
    cfg.listeners[0].port = ntohs(sin.sin_port);
    kvg_gateway *gw = NULL;
    assert_true(kvg_gateway_new(&cfg, 0, NULL, &gw) < 0);
    assert_null(gw);
    kvg_gateway_free(NULL);
    close(fd);
}

int main(void)
{
    if (!mkdtemp(state_dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_serve_stop),
        cmocka_unit_test(test_bind_failure_frees),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", state_dir);
    if (system(cmd) != 0)
        rc = 1;
    return rc;
}
