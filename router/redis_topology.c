/* SPDX-License-Identifier: Apache-2.0 */
/* The topology thread: finds out with blocking calls, off every event loop, which server is the
 * primary (or, for a cluster, which primary owns which slot) and publishes it, resolved to
 * numeric addresses, as a snapshot; the standalone checks, and the connections every mode's
 * checks and kvg_redis_connect_blocking make. Sentinel and Cluster: redis_sentinel.c,
 * redis_cluster.c. */
#include "redis_topology_int.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

/* kvg_redis_refresh_topology comes in bursts (every client that sees MOVED asks): at most one
 * check per this much time for them. */
#define REFRESH_MIN_NS (100ull * 1000000)
/* A failed check is tried again after this, doubling up to the check interval. */
#define RETRY_FIRST_MS 100u

/* ---- blocking connections -------------------------------------------------------------------- */

static struct timeval tv_of(uint32_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (long)(ms % 1000) * 1000};
}

void topo_name(const char *host, long long port, char *out, size_t len)
{
    snprintf(out, len, strchr(host, ':') ? "[%s]:%lld" : "%s:%lld", host, port);
}

void topo_reply_error(const redisReply *reply, const char *what, char *msg, size_t msg_len)
{
    if (reply && reply->type == REDIS_REPLY_ERROR)
        snprintf(msg, msg_len, "%s: %.*s", what, (int)KVG_MIN(reply->len, 200), reply->str);
    else
        snprintf(msg, msg_len, "%s: unexpected reply", what);
}

/* The failure of a command on c as a message: hiredis says "Resource temporarily unavailable"
 * for a read that timed out, which reads like a bug. err is errno right after the call. */
static void io_error(const redisContext *c, int err, const char *where, const char *what, char *msg,
                     size_t msg_len)
{
    if (c->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK))
        snprintf(msg, msg_len, "%s: %s: no answer in time", where, what);
    else
        snprintf(msg, msg_len, "%s: %s: %s", where, what, c->errstr);
}

/* One command of the handshake, which must answer +OK. */
static int handshake_step(redisContext *c, redisReply *reply, const char *where, const char *what,
                          char *msg, size_t msg_len)
{
    int err = errno;
    bool ok = reply && reply->type == REDIS_REPLY_STATUS;
    if (!reply) {
        io_error(c, err, where, what, msg, msg_len);
    } else if (!ok) {
        char head[320];
        snprintf(head, sizeof(head), "%s: %s", where, what);
        topo_reply_error(reply, head, msg, msg_len);
    }
    if (reply)
        freeReplyObject(reply);
    return ok ? 0 : reply ? KVG_EPROTO : -EIO;
}

/* AUTH with the URL's credentials and SELECT db on a connection just made. */
static int handshake(redisContext *c, const kvg_redis_url *url, uint32_t db, const char *where,
                     char *msg, size_t msg_len)
{
    int rc = 0;
    if (url->password[0]) {
        redisReply *reply = url->user[0] ? redisCommand(c, "AUTH %s %s", url->user, url->password)
                                         : redisCommand(c, "AUTH %s", url->password);
        rc = handshake_step(c, reply, where, "AUTH", msg, msg_len);
    }
    if (rc == 0 && db)
        rc = handshake_step(c, redisCommand(c, "SELECT %u", db), where, "SELECT", msg, msg_len);
    return rc;
}

/* A TCP connection with timeout_ms for the connect and every command. */
static int connect_tcp(const char *host, uint16_t port, uint32_t timeout_ms, redisContext **out,
                       const char *where, char *msg, size_t msg_len)
{
    redisContext *c = redisConnectWithTimeout(host, port, tv_of(timeout_ms));
    if (!c) {
        snprintf(msg, msg_len, "%s: out of memory", where);
        return -ENOMEM;
    }
    if (c->err) {
        int err = errno;
        snprintf(msg, msg_len, "%s: %s", where, c->errstr);
        int rc = c->err == REDIS_ERR_IO && err ? -err : -ECONNREFUSED;
        redisFree(c);
        return rc == -EINPROGRESS ? -ETIMEDOUT : rc;
    }
    redisSetTimeout(c, tv_of(timeout_ms));
    redisEnableKeepAlive(c);
    *out = c;
    return 0;
}

int redis_connect_handshake(const kvg_redis_url *url, const char *host, uint16_t port, uint32_t db,
                            uint32_t timeout_ms, struct redisContext **out, char *msg,
                            size_t msg_len)
{
    char where[300];
    topo_name(host, port, where, sizeof(where));
    redisContext *c = NULL;
    int rc = connect_tcp(host, port, timeout_ms, &c, where, msg, msg_len);
    if (rc < 0)
        return rc;
    if ((rc = handshake(c, url, db, where, msg, msg_len)) < 0) {
        redisFree(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* ---- the thread's connections ---------------------------------------------------------------- */

int topo_resolve(const char *host, uint16_t port, redis_node *out, size_t max, size_t *n, char *msg,
                 size_t msg_len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(msg, msg_len, "%.200s: %s", host, rc ? gai_strerror(rc) : "no address");
        return -EHOSTUNREACH;
    }
    size_t k = 0;
    for (struct addrinfo *ai = res; ai && k < max; ai = ai->ai_next) {
        redis_node *node = &out[k];
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, node->host, sizeof(node->host), NULL, 0,
                        NI_NUMERICHOST) != 0)
            continue;
        bool seen = false;
        for (size_t j = 0; j < k && !seen; j++)
            seen = strcmp(out[j].host, node->host) == 0;
        if (seen)
            continue;
        node->port = port;
        topo_name(node->host, port, node->name, sizeof(node->name));
        k++;
    }
    freeaddrinfo(res);
    if (k == 0) {
        snprintf(msg, msg_len, "%.200s: no usable address", host);
        return -EHOSTUNREACH;
    }
    *n = k;
    return 0;
}

void topo_close(kvg_redis *r, topo_conn slot)
{
    struct redis_topo *tp = r->topo;
    if (!tp->conn[slot])
        return;
    /* Off the list before the socket closes: kvg_redis_free must never shut down a descriptor
     * number that has been reused. */
    pthread_mutex_lock(&r->lock);
    tp->fds[slot] = -1;
    pthread_mutex_unlock(&r->lock);
    redisFree(tp->conn[slot]);
    tp->conn[slot] = NULL;
}

int topo_connect(kvg_redis *r, topo_conn slot, const redis_node *node, bool auth, char *msg,
                 size_t msg_len)
{
    struct redis_topo *tp = r->topo;
    topo_close(r, slot);
    pthread_mutex_lock(&r->lock);
    bool stop = r->stop;
    pthread_mutex_unlock(&r->lock);
    if (stop) {
        snprintf(msg, msg_len, "%s: shutting down", node->name);
        return -ECANCELED;
    }
    redisContext *c = NULL;
    int rc = connect_tcp(node->host, node->port, r->cfg.connect_timeout_ms, &c, node->name, msg,
                         msg_len);
    if (rc < 0)
        return rc;
    /* On the list before the handshake: AUTH to a stalled server must not hold up
     * kvg_redis_free. */
    pthread_mutex_lock(&r->lock);
    stop = r->stop;
    if (!stop)
        tp->fds[slot] = c->fd;
    pthread_mutex_unlock(&r->lock);
    if (stop) {
        redisFree(c);
        snprintf(msg, msg_len, "%s: shutting down", node->name);
        return -ECANCELED;
    }
    tp->conn[slot] = c;
    tp->conn_node[slot] = *node;
    if (auth && (rc = handshake(c, &r->url, 0, node->name, msg, msg_len)) < 0) {
        topo_close(r, slot);
        return rc;
    }
    redisSetTimeout(c, tv_of(r->cfg.command_timeout_ms));
    return 0;
}

int topo_connect_host(kvg_redis *r, topo_conn slot, const char *host, uint16_t port, bool auth,
                      redis_node *node, char *msg, size_t msg_len)
{
    struct redis_topo *tp = r->topo;
    redis_node addrs[TOPO_ADDRS_MAX];
    size_t n;
    int rc = topo_resolve(host, port, addrs, TOPO_ADDRS_MAX, &n, msg, msg_len);
    if (rc < 0)
        return rc;
    if (tp->conn[slot]) {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(addrs[i].name, tp->conn_node[slot].name) == 0) {
                *node = addrs[i];
                return 0;
            }
        }
    }
    /* "localhost" is often ::1 first while the server listens on 127.0.0.1 alone. */
    for (size_t i = 0; i < n; i++) {
        if ((rc = topo_connect(r, slot, &addrs[i], auth, msg, msg_len)) == 0) {
            *node = addrs[i];
            return 0;
        }
        if (rc == -ECANCELED || rc == KVG_EPROTO)
            break;
    }
    return rc;
}

static redisReply *vcommand(kvg_redis *r, topo_conn slot, char *msg, size_t msg_len,
                            const char *fmt, va_list ap)
{
    struct redis_topo *tp = r->topo;
    redisContext *c = tp->conn[slot];
    redisReply *reply = redisvCommand(c, fmt, ap);
    int err = errno;
    if (!reply) {
        char what[40];
        snprintf(what, sizeof(what), "%.*s", (int)strcspn(fmt, " "), fmt);
        io_error(c, err, tp->conn_node[slot].name, what, msg, msg_len);
        topo_close(r, slot);
    }
    return reply;
}

redisReply *topo_command(kvg_redis *r, topo_conn slot, char *msg, size_t msg_len, const char *fmt,
                         ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *reply = vcommand(r, slot, msg, msg_len, fmt, ap);
    va_end(ap);
    return reply;
}

int topo_ask(kvg_redis *r, topo_conn slot, const char *host, uint16_t port, bool auth,
             redis_node *node, redisReply **out, char *msg, size_t msg_len, const char *fmt, ...)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        bool kept = r->topo->conn[slot] != NULL;
        int rc = topo_connect_host(r, slot, host, port, auth, node, msg, msg_len);
        if (rc < 0)
            return rc;
        va_list ap;
        va_start(ap, fmt);
        redisReply *reply = vcommand(r, slot, msg, msg_len, fmt, ap);
        va_end(ap);
        if (reply) {
            *out = reply;
            return 0;
        }
        if (!kept)
            break;
    }
    return -EIO;
}

redis_topology *topo_alloc(kvg_redis_mode mode, size_t nnodes, bool slots)
{
    size_t slot_bytes = slots ? REDIS_SLOTS * sizeof(uint16_t) : 0;
    redis_topology *t = calloc(1, sizeof(*t) + nnodes * sizeof(redis_node) + slot_bytes);
    if (!t)
        return NULL;
    kvg_snapshot_init(&t->snap, redis_topology_free);
    t->mode = mode;
    t->nodes = (redis_node *)(void *)(t + 1);
    if (slots) {
        t->slots = (uint16_t *)(void *)(t->nodes + nnodes);
        for (size_t i = 0; i < REDIS_SLOTS; i++)
            t->slots[i] = REDIS_NO_NODE;
    }
    return t;
}

void redis_topology_free(kvg_snapshot *snap)
{
    free(snap);
}

const char *topo_role(const redisReply *reply, char *primary, size_t primary_len)
{
    if (primary_len)
        primary[0] = '\0';
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 1 ||
        reply->element[0]->type != REDIS_REPLY_STRING)
        return NULL;
    const char *role = reply->element[0]->str;
    static const char *const known[] = {"master", "slave", "sentinel"};
    for (size_t i = 0; i < KVG_ARRAY_LEN(known); i++) {
        if (strcmp(role, known[i]) != 0)
            continue;
        if (i == 1 && reply->elements >= 3 && reply->element[1]->type == REDIS_REPLY_STRING &&
            reply->element[2]->type == REDIS_REPLY_INTEGER)
            topo_name(reply->element[1]->str, reply->element[2]->integer, primary, primary_len);
        return known[i];
    }
    return NULL;
}

const char *topo_read_role(redisReply *reply, const redis_node *node, char *primary,
                           size_t primary_len, char *msg, size_t msg_len)
{
    const char *role = topo_role(reply, primary, primary_len);
    if (!role) {
        char what[120];
        snprintf(what, sizeof(what), "%s: ROLE", node->name);
        topo_reply_error(reply, what, msg, msg_len);
    }
    freeReplyObject(reply);
    return role;
}

/* ---- standalone ------------------------------------------------------------------------------ */

/* One check of a redis:// server: it must be a primary; one that says cluster_enabled:1 turns
 * the checks into Cluster checks. */
static int check_standalone(kvg_redis *r, redis_topology **out, char *msg, size_t msg_len)
{
    struct redis_topo *tp = r->topo;
    const kvg_redis_seed *seed = &r->url.seeds[0];
    redis_node node;
    redisReply *role_reply;
    int rc = topo_ask(r, TOPO_NODE, seed->host, seed->port, true, &node, &role_reply, msg, msg_len,
                      "ROLE");
    if (rc < 0)
        return rc;
    char primary[96];
    const char *role = topo_read_role(role_reply, &node, primary, sizeof(primary), msg, msg_len);
    if (!role)
        return KVG_EPROTO;
    if (strcmp(role, "sentinel") == 0) {
        snprintf(msg, msg_len,
                 "%s is a Sentinel: use redis-sentinel://%s/<master name> to find its primary",
                 node.name, node.name);
        return KVG_ECONFIG;
    }
    redisReply *info = topo_command(r, TOPO_NODE, msg, msg_len, "INFO cluster");
    if (!info)
        return -EIO;
    bool ok = info->type == REDIS_REPLY_STRING;
    bool cluster = ok && strstr(info->str, "cluster_enabled:1") != NULL;
    if (!ok) {
        char what[120];
        snprintf(what, sizeof(what), "%s: INFO cluster", node.name);
        topo_reply_error(info, what, msg, msg_len);
    }
    freeReplyObject(info);
    if (!ok)
        return KVG_EPROTO;
    if (cluster) {
        kvg_log_info("redis %s: %s is a cluster node: reading the slot map", r->url_redacted,
                     node.name);
        tp->mode = KVG_REDIS_CLUSTER;
        return topo_check_cluster(r, out, msg, msg_len);
    }
    if (strcmp(role, "master") != 0) {
        snprintf(msg, msg_len, "%s is a replica: writes would fail with READONLY (its primary: %s)",
                 node.name, primary[0] ? primary : "unknown");
        return KVG_ECONFIG;
    }
    redis_topology *t = topo_alloc(KVG_REDIS_STANDALONE, 1, false);
    if (!t)
        return -ENOMEM;
    t->nodes[0] = node;
    t->nnodes = 1;
    *out = t;
    return 0;
}

/* ---- publishing --------------------------------------------------------------------------------
 */

static bool same_servers(const redis_topology *a, const redis_topology *b)
{
    if (a->nnodes != b->nnodes)
        return false;
    for (size_t i = 0; i < a->nnodes; i++)
        if (strcmp(a->nodes[i].name, b->nodes[i].name) != 0)
            return false;
    if (!a->slots != !b->slots)
        return false;
    return !a->slots || memcmp(a->slots, b->slots, REDIS_SLOTS * sizeof(*a->slots)) == 0;
}

/* A copy of the current topology with error set: the nodes stay as they were (clients keep
 * trying them) while the check says what went wrong. */
static redis_topology *with_error(const redis_topology *cur, const char *error)
{
    redis_topology *t = topo_alloc(cur->mode, cur->nnodes, cur->slots != NULL);
    if (!t)
        return NULL;
    t->nnodes = cur->nnodes;
    if (cur->nnodes)
        memcpy(t->nodes, cur->nodes, cur->nnodes * sizeof(redis_node));
    if (cur->slots)
        memcpy(t->slots, cur->slots, REDIS_SLOTS * sizeof(uint16_t));
    snprintf(t->error, sizeof(t->error), "%s", error);
    return t;
}

/* Publish t (taking the caller's reference) unless it says what the current one says. */
static void publish(kvg_redis *r, redis_topology *t)
{
    redis_topology *cur = (redis_topology *)(void *)kvg_snapshot_slot_current(&r->topology);
    bool same = same_servers(cur, t);
    if (same && cur->mode == t->mode && strcmp(cur->error, t->error) == 0) {
        kvg_snapshot_unref(&t->snap);
        return;
    }
    if (t->error[0]) {
        kvg_log_warn("redis %s: %s", r->url_redacted, t->error);
    } else if (!same || cur->error[0]) {
        if (t->mode == KVG_REDIS_CLUSTER)
            kvg_log_info("redis %s: cluster of %zu primaries (%s%s)", r->url_redacted, t->nnodes,
                         t->nnodes ? t->nodes[0].name : "", t->nnodes > 1 ? ", ..." : "");
        else
            kvg_log_info("redis %s: %s primary %s", r->url_redacted, kvg_redis_mode_str(t->mode),
                         t->nnodes ? t->nodes[0].name : "(none)");
    }
    if (!same && cur->nnodes)
        atomic_fetch_add_explicit(&r->topology_changes, 1, memory_order_relaxed);
    kvg_snapshot_unref(kvg_snapshot_slot_publish(&r->topology, &t->snap));
}

/* One check in the current mode, published. True when it succeeded. */
static bool check(kvg_redis *r)
{
    struct redis_topo *tp = r->topo;
    char msg[256] = "";
    redis_topology *t = NULL;
    tp->retry_soon = false;
    int rc;
    switch (tp->mode) {
    case KVG_REDIS_SENTINEL:
        rc = topo_check_sentinel(r, &t, msg, sizeof(msg));
        break;
    case KVG_REDIS_CLUSTER:
        rc = topo_check_cluster(r, &t, msg, sizeof(msg));
        break;
    default:
        rc = check_standalone(r, &t, msg, sizeof(msg));
        break;
    }
    pthread_mutex_lock(&r->lock);
    bool stopping = r->stop;
    pthread_mutex_unlock(&r->lock);
    if (stopping) {
        /* Cut short by kvg_redis_free: what it found says nothing about the server. */
        if (t)
            redis_topology_free(&t->snap);
        return false;
    }
    if (rc < 0) {
        if (!msg[0])
            snprintf(msg, sizeof(msg), "%s", kvg_strerror(rc));
        redis_topology *cur = redis_topology_acquire(r);
        t = with_error(cur, msg);
        kvg_snapshot_unref(&cur->snap);
    } else {
        snprintf(msg, sizeof(msg), "%s", t->error);
    }
    if (t)
        publish(r, t);
    tp->failures = rc < 0 ? tp->failures + 1 : 0;
    pthread_mutex_lock(&r->lock);
    if (rc == 0) {
        r->reached = true;
        r->found_mode = tp->mode;
    }
    snprintf(r->last_error, sizeof(r->last_error), "%s", msg);
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    return rc == 0;
}

/* ---- the thread --------------------------------------------------------------------------------
 */

/* Sleep until deadline_ns, kvg_redis_refresh_topology or kvg_redis_free (the eventfd), or news on
 * a Sentinel's channel. */
static void wait_events(kvg_redis *r, uint64_t deadline_ns)
{
    struct redis_topo *tp = r->topo;
    uint64_t now = kvg_now_ns();
    if (now >= deadline_ns)
        return;
    struct pollfd pfd[2] = {{.fd = tp->wake_fd, .events = POLLIN}, {.fd = -1}};
    if (tp->conn[TOPO_SUB])
        pfd[1] = (struct pollfd){.fd = tp->conn[TOPO_SUB]->fd, .events = POLLIN};
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    int n = poll(pfd, 2, (int)KVG_MIN(ms, 60000));
    if (n <= 0)
        return;
    if (pfd[0].revents) {
        uint64_t v;
        ssize_t got = read(tp->wake_fd, &v, sizeof(v));
        (void)got; /* EAGAIN: another read took it; either way it is drained */
    }
    if (pfd[1].revents)
        topo_sentinel_read(r);
}

static void *topology_main(void *arg)
{
    kvg_redis *r = arg;
    struct redis_topo *tp = r->topo;
    const uint64_t interval_ns = (uint64_t)r->cfg.topology_interval_ms * 1000000;
    uint64_t last = 0, next = 0; /* the first check at once */
    for (;;) {
        pthread_mutex_lock(&r->lock);
        bool stop = r->stop, refresh = r->refresh;
        pthread_mutex_unlock(&r->lock);
        if (stop)
            break;
        uint64_t now = kvg_now_ns();
        if (tp->check_now)
            next = now;
        else if (refresh && next > last + REFRESH_MIN_NS)
            next = last + REFRESH_MIN_NS;
        if (now < next) {
            wait_events(r, next);
            continue;
        }
        pthread_mutex_lock(&r->lock);
        r->refresh = false;
        pthread_mutex_unlock(&r->lock);
        tp->check_now = false;
        last = now;
        bool ok = check(r);
        uint64_t delay = interval_ns;
        if (!ok || tp->retry_soon) {
            /* Soon after a failure (a failover settles in a second or two), then less often. */
            unsigned shift = tp->failures ? KVG_MIN(tp->failures - 1, 10u) : 0;
            delay = KVG_MIN(interval_ns, (uint64_t)RETRY_FIRST_MS * 1000000 << shift);
        }
        next = last + delay;
    }
    for (int i = 0; i < TOPO_CONN_COUNT; i++)
        topo_close(r, (topo_conn)i);
    return NULL;
}

void redis_topology_wake(kvg_redis *r)
{
    if (!r->topo)
        return;
    uint64_t one = 1;
    ssize_t n = write(r->topo->wake_fd, &one, sizeof(one));
    (void)n; /* EAGAIN: the counter is full, so the thread is awake anyway */
}

int redis_topology_start(kvg_redis *r)
{
    struct redis_topo *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return -ENOMEM;
    for (int i = 0; i < TOPO_CONN_COUNT; i++)
        tp->fds[i] = -1;
    for (size_t i = 0; i < KVG_REDIS_SEEDS_MAX; i++)
        tp->sentinel_order[i] = (uint8_t)i;
    tp->mode = r->url.mode;
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->wake_fd < 0) {
        int rc = -errno;
        free(tp);
        return rc;
    }
    r->topo = tp;
    int rc = -pthread_create(&r->thread, NULL, topology_main, r);
    if (rc < 0) {
        close(tp->wake_fd);
        free(tp);
        r->topo = NULL;
        return rc;
    }
    r->thread_started = true;
    return 0;
}

void redis_topology_stop(kvg_redis *r)
{
    struct redis_topo *tp = r->topo;
    if (!tp)
        return;
    if (r->thread_started) {
        pthread_mutex_lock(&r->lock);
        r->stop = true;
        /* A call blocked on a stalled server returns now rather than at its timeout. */
        for (int i = 0; i < TOPO_CONN_COUNT; i++)
            if (tp->fds[i] >= 0)
                shutdown(tp->fds[i], SHUT_RDWR);
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
        redis_topology_wake(r);
        pthread_join(r->thread, NULL);
        r->thread_started = false;
    }
    close(tp->wake_fd);
    free(tp);
    r->topo = NULL;
}
