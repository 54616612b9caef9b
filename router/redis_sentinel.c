/* SPDX-License-Identifier: Apache-2.0 */
/* Sentinel checks of the topology thread: the primary the Sentinels name, confirmed by its own
 * ROLE, and a subscription to +switch-master so that a failover is noticed when it happens
 * rather than at the next check (the Sentinel client guidelines, redis.io). */
#include "redis_topology_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#define SWITCH_CHANNEL "+switch-master"

/* Append "; part" (or "part" to an empty msg), truncating. */
static void append_error(char *msg, size_t msg_len, const char *part)
{
    size_t n = strlen(msg);
    if (n + 1 < msg_len)
        snprintf(msg + n, msg_len - n, "%s%s", n ? "; " : "", part);
}

/* The message of a +switch-master: "<master> <old ip> <old port> <new ip> <new port>". */
bool redis_sentinel_is_switch(const redisReply *m, const char *master)
{
    if (m->type != REDIS_REPLY_ARRAY || m->elements != 3 ||
        m->element[0]->type != REDIS_REPLY_STRING || strcmp(m->element[0]->str, "message") != 0 ||
        m->element[2]->type != REDIS_REPLY_STRING)
        return false; /* subscribe confirmations, pongs */
    const char *text = m->element[2]->str;
    size_t name_len = strcspn(text, " ");
    /* Another master the same Sentinels watch, or not our name at all. */
    return name_len == strlen(master) && memcmp(text, master, name_len) == 0;
}

static void on_message(kvg_redis *r, const redisReply *m)
{
    if (!redis_sentinel_is_switch(m, r->url.master))
        return;
    kvg_log_info("redis %s: Sentinel: +switch-master %.200s", r->url_redacted, m->element[2]->str);
    r->topo->check_now = true;
}

/* The replies the subscription's reader holds, without reading the socket. */
static void drain(kvg_redis *r)
{
    struct redis_topo *tp = r->topo;
    while (tp->conn[TOPO_SUB]) {
        void *reply = NULL;
        if (redisGetReplyFromReader(tp->conn[TOPO_SUB], &reply) != REDIS_OK) {
            kvg_log_warn("redis %s: Sentinel %s: subscription: %s", r->url_redacted,
                         tp->conn_node[TOPO_SUB].name, tp->conn[TOPO_SUB]->errstr);
            topo_close(r, TOPO_SUB);
            tp->check_now = true;
            return;
        }
        if (!reply)
            return;
        on_message(r, reply);
        freeReplyObject(reply);
    }
}

void topo_sentinel_read(kvg_redis *r)
{
    struct redis_topo *tp = r->topo;
    if (!tp->conn[TOPO_SUB])
        return;
    if (redisBufferRead(tp->conn[TOPO_SUB]) != REDIS_OK) {
        /* Messages may have been lost with it: check now, which subscribes again. */
        kvg_log_warn("redis %s: Sentinel %s: subscription lost: %s", r->url_redacted,
                     tp->conn_node[TOPO_SUB].name, tp->conn[TOPO_SUB]->errstr);
        topo_close(r, TOPO_SUB);
        tp->check_now = true;
        return;
    }
    drain(r);
}

/* Subscribe to +switch-master on the Sentinel seed. Best effort: without it, a failover is
 * noticed at the next periodic check. */
static bool subscribe(kvg_redis *r, const kvg_redis_seed *seed)
{
    char msg[256];
    redis_node node;
    if (topo_connect_host(r, TOPO_SUB, seed->host, seed->port, false, &node, msg, sizeof(msg)) <
        0) {
        kvg_log_debug("redis %s: Sentinel subscription: %s", r->url_redacted, msg);
        return false;
    }
    redisReply *reply = topo_command(r, TOPO_SUB, msg, sizeof(msg), "SUBSCRIBE %s", SWITCH_CHANNEL);
    bool ok = reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == 3 &&
              reply->element[0]->type == REDIS_REPLY_STRING &&
              strcmp(reply->element[0]->str, "subscribe") == 0;
    if (reply && !ok)
        topo_reply_error(reply, "SUBSCRIBE", msg, sizeof(msg));
    if (reply)
        freeReplyObject(reply);
    if (!ok) {
        kvg_log_debug("redis %s: Sentinel %s: %s", r->url_redacted, node.name, msg);
        topo_close(r, TOPO_SUB);
        return false;
    }
    kvg_log_debug("redis %s: subscribed to %s on Sentinel %s", r->url_redacted, SWITCH_CHANNEL,
                  node.name);
    drain(r);
    return true;
}

int redis_sentinel_parse_addr(const redisReply *reply, const char *who, const char *master,
                              char *host, size_t host_len, uint16_t *port, char *msg,
                              size_t msg_len)
{
    if (reply->type == REDIS_REPLY_NIL) {
        snprintf(msg, msg_len, "%s does not know master '%s'", who, master);
        return -ENOENT;
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING) {
        char what[120];
        snprintf(what, sizeof(what), "%s: SENTINEL get-master-addr-by-name", who);
        topo_reply_error(reply, what, msg, msg_len);
        return KVG_EPROTO;
    }
    const redisReply *h = reply->element[0], *p = reply->element[1];
    /* Found by fuzz_redis_reply: the strings were read as C strings, so "10.0.0.1\0junk" came
     * out as 10.0.0.1, and strtoul took " 6379" and "+6379". Both strings are now read whole:
     * the port in decimal digits alone, the address an address or a name (it goes into
     * getaddrinfo and, when that fails, into log lines: no control bytes or spaces). */
    uint64_t n = 0;
    if (h->len >= host_len || !redis_host_valid(h->str, h->len) || p->len > 5 ||
        kvg_parse_u64(p->str, p->len, &n) < 0 || n == 0 || n > 65535) {
        snprintf(msg, msg_len, "%s: SENTINEL get-master-addr-by-name: bad address", who);
        return KVG_EPROTO;
    }
    memcpy(host, h->str, h->len + 1);
    *port = (uint16_t)n;
    return 0;
}

/* SENTINEL get-master-addr-by-name on the Sentinel seed: 0 and host, port; or a negative code
 * with msg. The connection is kept for the next check when the seed answered. */
static int ask_one(kvg_redis *r, const kvg_redis_seed *seed, char *host, size_t host_len,
                   uint16_t *port, char *msg, size_t msg_len)
{
    redis_node node;
    redisReply *reply;
    int rc = topo_ask(r, TOPO_SENTINEL, seed->host, seed->port, false, &node, &reply, msg, msg_len,
                      "SENTINEL get-master-addr-by-name %s", r->url.master);
    if (rc < 0)
        return rc;
    rc = redis_sentinel_parse_addr(reply, node.name, r->url.master, host, host_len, port, msg,
                                   msg_len);
    freeReplyObject(reply);
    if (rc < 0)
        topo_close(r, TOPO_SENTINEL); /* ask the next one on a connection of its own */
    return rc;
}

int topo_check_sentinel(kvg_redis *r, redis_topology **out, char *msg, size_t msg_len)
{
    struct redis_topo *tp = r->topo;
    char host[KVG_REDIS_HOST_MAX];
    uint16_t port = 0;
    size_t i;
    int rc = -ENOENT;
    snprintf(msg, msg_len, "no Sentinel named the primary of '%s': ", r->url.master);
    size_t head = strlen(msg);
    for (i = 0; i < r->url.nseeds; i++) {
        char one[256];
        const kvg_redis_seed *seed = &r->url.seeds[tp->sentinel_order[i]];
        if ((rc = ask_one(r, seed, host, sizeof(host), &port, one, sizeof(one))) == 0)
            break;
        if (rc == -ECANCELED)
            return rc;
        append_error(msg + head, msg_len - head, one);
    }
    if (rc < 0)
        return rc;
    /* The one that answered is asked first next time. */
    uint8_t answered = tp->sentinel_order[i];
    memmove(tp->sentinel_order + 1, tp->sentinel_order, i);
    tp->sentinel_order[0] = answered;
    const kvg_redis_seed *seed = &r->url.seeds[answered];
    char named_by[KVG_REDIS_HOST_MAX + 8];
    topo_name(seed->host, seed->port, named_by, sizeof(named_by));

    if (!tp->conn[TOPO_SUB] && subscribe(r, seed)) {
        /* Asked again now that a switch cannot go unnoticed: one that happened between the
         * answer and the subscription would otherwise wait for the next check. */
        char again[KVG_REDIS_HOST_MAX];
        uint16_t again_port;
        char ignored[256];
        if (ask_one(r, seed, again, sizeof(again), &again_port, ignored, sizeof(ignored)) == 0) {
            memcpy(host, again, sizeof(host));
            port = again_port;
        }
    }

    redis_node node;
    redisReply *reply;
    if ((rc = topo_ask(r, TOPO_NODE, host, port, true, &node, &reply, msg, msg_len, "ROLE")) < 0)
        goto fail_primary;
    char primary[96];
    const char *role = topo_read_role(reply, &node, primary, sizeof(primary), msg, msg_len);
    if (!role)
        return KVG_EPROTO;
    if (strcmp(role, "master") != 0) {
        /* A Sentinel that has not heard of a failover yet, or one half done: never publish a
         * replica as the primary; ask again shortly. */
        tp->retry_soon = true;
        snprintf(msg, msg_len,
                 "Sentinel %s names %s the primary of '%s', but it says it is a %s%s%s "
                 "(a failover under way?)",
                 named_by, node.name, r->url.master, strcmp(role, "slave") == 0 ? "replica" : role,
                 primary[0] ? " of " : "", primary);
        topo_close(r, TOPO_NODE);
        return KVG_EPROTO;
    }
    redis_topology *t = topo_alloc(KVG_REDIS_SENTINEL, 1, false);
    if (!t)
        return -ENOMEM;
    t->nodes[0] = node;
    t->nnodes = 1;
    *out = t;
    return 0;

fail_primary : {
    /* Say who named it: an address from a Sentinel is not one the operator wrote down. */
    char detail[256];
    snprintf(detail, sizeof(detail), "%s", msg);
    snprintf(msg, msg_len, "primary of '%s' (named by Sentinel %s): %s", r->url.master, named_by,
             detail);
    return rc;
}
}
