/* SPDX-License-Identifier: Apache-2.0 */
/* The topology thread: finds out with blocking calls, off every event loop, which server is the
 * primary and publishes it (resolved to a numeric address) as a snapshot; and the blocking
 * connections with their handshake. */
#include "redis_int.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <hiredis/hiredis.h>

/* ---- hash slots ---------------------------------------------------------------------------- */

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), the Cluster specification's key hash. */
static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

uint16_t redis_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) & (REDIS_SLOTS - 1);
    }
    return crc16(key, len) & (REDIS_SLOTS - 1);
}

/* ---- blocking connections -------------------------------------------------------------------- */

static struct timeval tv_of(uint32_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (long)(ms % 1000) * 1000};
}

/* A reply that is not what was asked for, as a message. */
static void reply_error(const redisReply *reply, const char *what, char *msg, size_t msg_len)
{
    if (reply && reply->type == REDIS_REPLY_ERROR)
        snprintf(msg, msg_len, "%s: %.*s", what, (int)KVG_MIN(reply->len, 200), reply->str);
    else
        snprintf(msg, msg_len, "%s: unexpected reply", what);
}

int redis_connect_handshake(const kvg_redis_url *url, const char *host, uint16_t port, uint32_t db,
                            uint32_t timeout_ms, struct redisContext **out, char *msg,
                            size_t msg_len)
{
    char where[300];
    snprintf(where, sizeof(where), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
    redisContext *c = redisConnectWithTimeout(host, port, tv_of(timeout_ms));
    if (!c) {
        snprintf(msg, msg_len, "%s: out of memory", where);
        return -ENOMEM;
    }
    if (c->err) {
        snprintf(msg, msg_len, "%s: %s", where, c->errstr);
        int rc = c->err == REDIS_ERR_IO && errno ? -errno : -ECONNREFUSED;
        redisFree(c);
        return rc == -EINPROGRESS ? -ETIMEDOUT : rc;
    }
    redisSetTimeout(c, tv_of(timeout_ms));
    redisEnableKeepAlive(c);
    if (url->password[0]) {
        redisReply *reply = url->user[0] ? redisCommand(c, "AUTH %s %s", url->user, url->password)
                                         : redisCommand(c, "AUTH %s", url->password);
        bool ok = reply && reply->type == REDIS_REPLY_STATUS;
        if (!ok) {
            if (reply)
                reply_error(reply, "AUTH", msg, msg_len);
            else
                snprintf(msg, msg_len, "%s: AUTH: %s", where, c->errstr);
        }
        if (reply)
            freeReplyObject(reply);
        if (!ok) {
            redisFree(c);
            return KVG_EPROTO;
        }
    }
    if (db) {
        redisReply *reply = redisCommand(c, "SELECT %u", db);
        bool ok = reply && reply->type == REDIS_REPLY_STATUS;
        if (!ok) {
            if (reply)
                reply_error(reply, "SELECT", msg, msg_len);
            else
                snprintf(msg, msg_len, "%s: SELECT: %s", where, c->errstr);
        }
        if (reply)
            freeReplyObject(reply);
        if (!ok) {
            redisFree(c);
            return KVG_EPROTO;
        }
    }
    *out = c;
    return 0;
}

void redis_topology_free(kvg_snapshot *snap)
{
    free(snap);
}

/* ---- discovery --------------------------------------------------------------------------------
 */

/* host (a name or an address) resolved to a numeric address into node. Blocks (DNS). */
static int resolve(const char *host, uint16_t port, redis_node *node, char *msg, size_t msg_len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(msg, msg_len, "%.200s: %s", host, gai_strerror(rc));
        return -EHOSTUNREACH;
    }
    rc = getnameinfo(res->ai_addr, res->ai_addrlen, node->host, sizeof(node->host), NULL, 0,
                     NI_NUMERICHOST);
    freeaddrinfo(res);
    if (rc != 0) {
        snprintf(msg, msg_len, "%.200s: %s", host, gai_strerror(rc));
        return -EHOSTUNREACH;
    }
    node->port = port;
    snprintf(node->name, sizeof(node->name), strchr(node->host, ':') ? "[%s]:%u" : "%s:%u",
             node->host, port);
    return 0;
}

/* One check of a standalone server: resolve, connect, PING. On success *t is a new topology. */
static int check_standalone(kvg_redis *r, redis_topology **t, char *msg, size_t msg_len)
{
    redis_node node;
    int rc = resolve(r->url.seeds[0].host, r->url.seeds[0].port, &node, msg, msg_len);
    if (rc < 0)
        return rc;
    redisContext *c;
    rc = redis_connect_handshake(&r->url, node.host, node.port, 0, r->cfg.connect_timeout_ms, &c,
                                 msg, msg_len);
    if (rc < 0)
        return rc;
    redisReply *reply = redisCommand(c, "PING");
    bool ok = reply && reply->type == REDIS_REPLY_STATUS;
    if (!ok) {
        if (reply)
            reply_error(reply, "PING", msg, msg_len);
        else
            snprintf(msg, msg_len, "%s: PING: %s", node.name, c->errstr);
    }
    if (reply)
        freeReplyObject(reply);
    redisFree(c);
    if (!ok)
        return KVG_EPROTO;
    redis_topology *nt = calloc(1, sizeof(*nt) + sizeof(redis_node));
    if (!nt)
        return -ENOMEM;
    kvg_snapshot_init(&nt->snap, redis_topology_free);
    nt->mode = KVG_REDIS_STANDALONE;
    nt->nodes = (redis_node *)(void *)(nt + 1);
    nt->nodes[0] = node;
    nt->nnodes = 1;
    *t = nt;
    return 0;
}

static bool same_topology(const redis_topology *a, const redis_topology *b)
{
    if (a->mode != b->mode || a->nnodes != b->nnodes || strcmp(a->error, b->error) != 0)
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
    size_t slots = cur->slots ? REDIS_SLOTS * sizeof(uint16_t) : 0;
    redis_topology *t = calloc(1, sizeof(*t) + cur->nnodes * sizeof(redis_node) + slots);
    if (!t)
        return NULL;
    kvg_snapshot_init(&t->snap, redis_topology_free);
    t->mode = cur->mode;
    t->nnodes = cur->nnodes;
    t->nodes = (redis_node *)(void *)(t + 1);
    if (cur->nnodes)
        memcpy(t->nodes, cur->nodes, cur->nnodes * sizeof(redis_node));
    if (slots) {
        t->slots = (uint16_t *)(void *)(t->nodes + cur->nnodes);
        memcpy(t->slots, cur->slots, slots);
    }
    snprintf(t->error, sizeof(t->error), "%s", error);
    return t;
}

/* Publish t (taking the caller's reference) unless it says what the current one says. */
static void publish(kvg_redis *r, redis_topology *t)
{
    redis_topology *cur = (redis_topology *)(void *)kvg_snapshot_slot_current(&r->topology);
    if (same_topology(cur, t)) {
        kvg_snapshot_unref(&t->snap);
        return;
    }
    bool nodes_changed = cur->nnodes != t->nnodes ||
                         (t->nnodes && strcmp(cur->nodes[0].name, t->nodes[0].name) != 0);
    if (t->error[0])
        kvg_log_warn("redis %s: %s", r->url_redacted, t->error);
    else if (nodes_changed || cur->error[0])
        kvg_log_info("redis %s: %s primary %s", r->url_redacted, kvg_redis_mode_str(t->mode),
                     t->nnodes ? t->nodes[0].name : "(none)");
    if (nodes_changed && cur->nnodes)
        atomic_fetch_add_explicit(&r->topology_changes, 1, memory_order_relaxed);
    kvg_snapshot_unref(kvg_snapshot_slot_publish(&r->topology, &t->snap));
}

static void check(kvg_redis *r)
{
    char msg[256] = "";
    redis_topology *t = NULL;
    int rc = check_standalone(r, &t, msg, sizeof(msg));
    if (rc < 0) {
        redis_topology *cur = redis_topology_acquire(r);
        t = with_error(cur, msg[0] ? msg : kvg_strerror(rc));
        kvg_snapshot_unref(&cur->snap);
    }
    kvg_redis_mode mode = t ? t->mode : r->url.mode;
    if (t)
        publish(r, t); /* takes t */
    pthread_mutex_lock(&r->lock);
    if (rc == 0) {
        r->reached = true;
        r->found_mode = mode;
        r->last_error[0] = '\0';
    } else {
        snprintf(r->last_error, sizeof(r->last_error), "%s", msg[0] ? msg : kvg_strerror(rc));
    }
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

static void *topology_main(void *arg)
{
    kvg_redis *r = arg;
    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        r->refresh = false;
        pthread_mutex_unlock(&r->lock);
        check(r);
        pthread_mutex_lock(&r->lock);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        uint32_t ms = r->cfg.topology_interval_ms;
        until.tv_sec += ms / 1000;
        until.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!r->stop && !r->refresh)
            if (pthread_cond_timedwait(&r->cond, &r->lock, &until) == ETIMEDOUT)
                break;
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

int redis_topology_start(kvg_redis *r)
{
    int rc = -pthread_create(&r->thread, NULL, topology_main, r);
    if (rc == 0)
        r->thread_started = true;
    return rc;
}

void redis_topology_stop(kvg_redis *r)
{
    if (!r->thread_started)
        return;
    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    r->thread_started = false;
}
