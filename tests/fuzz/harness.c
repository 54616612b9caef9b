/* SPDX-License-Identifier: Apache-2.0 */
/* The fuzz harness: a real gateway thread (proxy handler, registry, upstream pool) whose event
 * loop the target turns by hand, a client on a socketpair, a fake worker on loopback. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>

#include <openssl/sha.h>

#include "conn.h"
#include "gateway_int.h"
#include "handlers.h"

static kvg_gateway gw;
static kvg_thread *thread;
static kvg_listener listener;
static struct evconnlistener *worker_listener;
static uint8_t *worker_response;
static size_t worker_response_len;
static int initialised;

/* ---- fake worker: answers every connection with the chosen bytes, then closes -------------- */

static void worker_write_cb(struct bufferevent *bev, void *arg);
static int answered; /* address used as a marker: the connection has its answer queued */
static void worker_event_cb(struct bufferevent *bev, short what, void *arg);

static void worker_read_cb(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    evbuffer_drain(in, evbuffer_get_length(in));
    if (arg == &answered)
        return;
    /* Answer once; from now on the write callback may end the connection. */
    bufferevent_setcb(bev, worker_read_cb, worker_write_cb, worker_event_cb, &answered);
    bufferevent_write(bev, worker_response, worker_response_len);
    bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
}

static void worker_event_cb(struct bufferevent *bev, short what, void *arg)
{
    bufferevent_free(bev);
}

static void worker_write_cb(struct bufferevent *bev, void *arg)
{
    /* Half-close after the response: that ends close-delimited bodies, and unlike close() it
     * cannot turn into a reset that destroys the response while request bytes are unread. */
    if (arg == &answered && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        shutdown(bufferevent_getfd(bev), SHUT_WR);
}

static void worker_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                             int salen, void *arg)
{
    struct bufferevent *bev = bufferevent_socket_new(thread->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        close(fd);
        return;
    }
    bufferevent_setcb(bev, worker_read_cb, worker_write_cb, worker_event_cb, bev);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

void harness_set_worker_response(const uint8_t *data, size_t len)
{
    free(worker_response);
    worker_response = malloc(len ? len : 1);
    if (len)
        memcpy(worker_response, data, len);
    worker_response_len = len;
}

void harness_init(void)
{
    if (initialised)
        return;
    initialised = 1;
    signal(SIGPIPE, SIG_IGN);
    kvg_log_set_level(getenv("HARNESS_VERBOSE") ? KVG_LOG_DEBUG : KVG_LOG_ERROR);
    if (kvg_config_init(&gw.cfg) < 0)
        abort();
    gw.cfg.limits.header_bytes = 8192;
    gw.cfg.limits.body_bytes = 65536;
    gw.cfg.limits.streams_per_conn = 16;
    gw.cfg.upstream.retries = 1;
    gw.access_log_fd = -1;
    gw.nthreads = 1;
    kvg_gateway_init_limits(&gw, 4096);
    kvg_registry_config rcfg = {.nthreads = 2};
    if (kvg_registry_new(&rcfg, &gw.registry) < 0)
        abort();
    /* Keys mode with one tenant whose key the corpus uses, so inputs get past authentication
     * (and inputs without it exercise the 401 path). */
    if (kvg_tenants_new(&gw.tenants) < 0 || kvg_policy_state_new(&gw.policy) < 0)
        abort();
    /* The prefix index, small: inputs that reach a worker record their keys in it. */
    kvg_index_config icfg = {.max_entries = 1u << 16, .default_capacity = 4096};
    if (kvg_router_new(&icfg, &gw.router) < 0)
        abort();
    static const char secret[] = "fuzz-secret-0123456789abcdef0123456789";
    memcpy(gw.secret, secret, sizeof(secret) - 1);
    gw.secret_len = sizeof(secret) - 1;
    kvg_tenant_def tdef = {.id = "fuzz", .sharing = KVG_SHARING_ISOLATED};
    bool created;
    if (kvg_tenants_put(gw.tenants, &tdef, &created, NULL, 0) < 0)
        abort();
    kvg_key_info key = {.id = "kfuzz00000000000"}; /* "k" + 15 of [a-z0-9] */
    SHA256((const unsigned char *)HARNESS_KEY, strlen(HARNESS_KEY), key.digest);
    if (kvg_tenants_key_restore(gw.tenants, "fuzz", &key) < 0)
        abort();
    gw.threads = calloc(1, sizeof(kvg_thread));
    thread = &gw.threads[0];
    if (kvg_thread_init(thread, &gw, 0, false) < 0)
        abort();
    listener.handler = &kvg_proxy_handler;
    listener.cfg.cleartext = true;

    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    worker_listener = evconnlistener_new_bind(thread->base, worker_accept_cb, NULL,
                                              LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 64,
                                              (struct sockaddr *)&sin, sizeof(sin));
    if (!worker_listener)
        abort();
    struct sockaddr_in bound;
    socklen_t bl = sizeof(bound);
    getsockname(evconnlistener_get_fd(worker_listener), (struct sockaddr *)&bound, &bl);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u", ntohs(bound.sin_port));
    static const char *const models[] = {"m"};
    kvg_worker_def def = {.name = "w1", .url = url, .models = models, .nmodels = 1};
    char msg[128];
    if (kvg_registry_put(gw.registry, &def, KVG_WORKER_SOURCE_CONFIG, msg, sizeof(msg)) < 0)
        abort();
    static const uint8_t ok[] = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                "content-length: 2\r\n\r\n{}";
    harness_set_worker_response(ok, sizeof(ok) - 1);
}

static void turn(int times)
{
    for (int i = 0; i < times; i++)
        event_base_loop(thread->base, EVLOOP_NONBLOCK);
}

void harness_run_client(const uint8_t *data, size_t len)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    /* Room for the whole input at once, so one write delivers it. */
    int sz = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(1234)};
    kvg_conn_accept(thread, &listener, sv[0], (struct sockaddr *)&peer, sizeof(peer));
    size_t off = 0;
    char sink[65536];
    /* Feed the input and let the gateway (and the fake worker, on loopback) work on it. */
    for (int round = 0; round < 200; round++) {
        if (off < len) {
            ssize_t w = write(sv[1], data + off, len - off);
            if (w > 0)
                off += (size_t)w;
        }
        turn(2);
        ssize_t got;
        while ((got = read(sv[1], sink, sizeof(sink))) > 0)
            if (getenv("HARNESS_VERBOSE"))
                fwrite(sink, 1, (size_t)got, stderr);
        if (thread->nconns == 0)
            break;
        if (off == len && round > 20)
            break;
    }
    /* The client goes away; the gateway must clean up whatever it was doing. */
    close(sv[1]);
    for (int round = 0; round < 1000 && thread->nconns > 0; round++)
        turn(1);
    turn(5);
    if (thread->nconns > 0) {
        fprintf(stderr, "connection not closed after the client left\n");
        abort();
    }
}
