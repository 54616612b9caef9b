/* SPDX-License-Identifier: Apache-2.0 */
/* Cluster checks of the topology thread: hash slots, and the slot map read with CLUSTER SLOTS
 * from any node still known, resolved to numeric addresses. */
#include "redis_topology_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

/* Known nodes asked in one check when the one kept is gone (each may cost a connect timeout). */
#define ASK_KNOWN_MAX 8

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

/* ---- CLUSTER SLOTS --------------------------------------------------------------------------- */

static bool is_int(const redisReply *r, long long lo, long long hi)
{
    return r->type == REDIS_REPLY_INTEGER && r->integer >= lo && r->integer <= hi;
}

/* The node a range's networking information names, added to t when new, into *idx
 * (REDIS_NO_NODE for "?"); endpoints[i] is the endpoint t->nodes[i] was named by, so that a name
 * is resolved once per reply. 0, or KVG_EPROTO / -EHOSTUNREACH with msg. */
static int node_of(const redisReply *info, const redis_node *asked, redis_topology *t,
                   char (*endpoints)[KVG_REDIS_HOST_MAX], size_t max, long *idx, char *msg,
                   size_t msg_len)
{
    if (info->type != REDIS_REPLY_ARRAY || info->elements < 2 ||
        (info->element[0]->type != REDIS_REPLY_STRING &&
         info->element[0]->type != REDIS_REPLY_NIL) ||
        !is_int(info->element[1], 1, 65535)) {
        snprintf(msg, msg_len, "CLUSTER SLOTS: a node is not [endpoint, port, ...]");
        return KVG_EPROTO;
    }
    const redisReply *ep = info->element[0];
    const char *endpoint = ep->type == REDIS_REPLY_STRING ? ep->str : "";
    uint16_t port = (uint16_t)info->element[1]->integer;
    /* Found by fuzz_redis_reply: the endpoint was read as a C string, so "10.0.0.1\0junk" was
     * 10.0.0.1 (and "?\0x" the unknown node); and any byte went on to getaddrinfo and into
     * messages. The string is now read whole and must look like an address or a name. */
    if (ep->type == REDIS_REPLY_STRING && ep->len && !(ep->len == 1 && ep->str[0] == '?') &&
        !redis_host_valid(ep->str, ep->len)) {
        snprintf(msg, msg_len, "CLUSTER SLOTS: an endpoint is not an address or a host name");
        return KVG_EPROTO;
    }
    if (strcmp(endpoint, "?") == 0) {
        *idx = REDIS_NO_NODE; /* announced hostnames on, but no hostname set */
        return 0;
    }
    if (strlen(endpoint) >= KVG_REDIS_HOST_MAX) {
        snprintf(msg, msg_len, "CLUSTER SLOTS: an endpoint is longer than %d bytes",
                 KVG_REDIS_HOST_MAX - 1);
        return KVG_EPROTO;
    }
    for (size_t i = 0; i < t->nnodes; i++) {
        if (t->nodes[i].port == port && strcmp(endpoints[i], endpoint) == 0) {
            *idx = (long)i;
            return 0;
        }
    }
    /* NIL: the node's address is unknown to the cluster (behind a balancer); "": it does not know
     * its own. Either way, the host the question went to, on the port given. */
    redis_node node;
    if (!endpoint[0]) {
        node = *asked;
        node.port = port;
        topo_name(node.host, port, node.name, sizeof(node.name));
    } else {
        size_t n;
        char why[200];
        if (topo_resolve(endpoint, port, &node, 1, &n, why, sizeof(why)) < 0) {
            snprintf(msg, msg_len, "CLUSTER SLOTS: %s", why);
            return -EHOSTUNREACH;
        }
    }
    /* Two endpoints (a name and its address) may be one node. */
    for (size_t i = 0; i < t->nnodes; i++) {
        if (strcmp(t->nodes[i].name, node.name) == 0) {
            *idx = (long)i;
            return 0;
        }
    }
    if (t->nnodes == max) {
        snprintf(msg, msg_len, "CLUSTER SLOTS: more than %zu primaries", max);
        return KVG_EPROTO;
    }
    t->nodes[t->nnodes] = node;
    memcpy(endpoints[t->nnodes], endpoint, strlen(endpoint) + 1);
    *idx = (long)t->nnodes++;
    return 0;
}

int redis_cluster_parse_slots(const redisReply *reply, const redis_node *asked,
                              redis_topology **out, size_t *unassigned, char *msg, size_t msg_len)
{
    if (reply->type != REDIS_REPLY_ARRAY) {
        topo_reply_error(reply, "CLUSTER SLOTS", msg, msg_len);
        return KVG_EPROTO;
    }
    size_t max = KVG_MIN(reply->elements, (size_t)TOPO_CLUSTER_NODES_MAX);
    redis_topology *t = topo_alloc(KVG_REDIS_CLUSTER, max, true);
    char(*endpoints)[KVG_REDIS_HOST_MAX] = calloc(max ? max : 1, KVG_REDIS_HOST_MAX);
    int rc = -ENOMEM;
    if (!t || !endpoints) {
        snprintf(msg, msg_len, "CLUSTER SLOTS: out of memory");
        goto fail;
    }
    rc = KVG_EPROTO;
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *range = reply->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
            !is_int(range->element[0], 0, REDIS_SLOTS - 1) ||
            !is_int(range->element[1], range->element[0]->integer, REDIS_SLOTS - 1)) {
            snprintf(msg, msg_len, "CLUSTER SLOTS: entry %zu is not [first, last, primary, ...]",
                     i);
            goto fail;
        }
        long node;
        if ((rc = node_of(range->element[2], asked, t, endpoints, max, &node, msg, msg_len)) < 0)
            goto fail;
        rc = KVG_EPROTO;
        for (long long s = range->element[0]->integer; s <= range->element[1]->integer; s++) {
            if (t->slots[s] != REDIS_NO_NODE) {
                snprintf(msg, msg_len, "CLUSTER SLOTS: slot %lld is in two ranges", s);
                goto fail;
            }
            /* "?" leaves it unassigned: a node nobody can reach is no owner. */
            if (node != REDIS_NO_NODE)
                t->slots[s] = (uint16_t)node;
        }
    }
    size_t none = 0;
    for (size_t s = 0; s < REDIS_SLOTS; s++)
        none += t->slots[s] == REDIS_NO_NODE;
    free(endpoints);
    *unassigned = none;
    *out = t;
    return 0;
fail:
    free(endpoints);
    if (t)
        redis_topology_free(&t->snap);
    return rc;
}

/* ---- the check ----------------------------------------------------------------------------------
 */

/* CLUSTER SLOTS on TOPO_NODE (connected to asked). 1: *out; 0: try another node (msg says why);
 * a negative code: give up this check. */
static int ask(kvg_redis *r, const redis_node *asked, redis_topology **out, char *msg,
               size_t msg_len)
{
    redisReply *reply = topo_command(r, TOPO_NODE, msg, msg_len, "CLUSTER SLOTS");
    if (!reply)
        return 0;
    if (reply->type == REDIS_REPLY_ERROR && strstr(reply->str, "cluster support disabled")) {
        /* The node was restarted without cluster mode: check it as a standalone server. */
        snprintf(msg, msg_len, "%s: cluster support disabled now", asked->name);
        freeReplyObject(reply);
        r->topo->mode = KVG_REDIS_STANDALONE;
        return KVG_ECONFIG;
    }
    size_t unassigned = 0;
    char why[200];
    redis_topology *t;
    int rc = redis_cluster_parse_slots(reply, asked, &t, &unassigned, why, sizeof(why));
    freeReplyObject(reply);
    if (rc == 0 && t->nnodes == 0) {
        snprintf(why, sizeof(why), "no slot is served (the cluster is not created yet?)");
        redis_topology_free(&t->snap);
        rc = -ENOENT;
    }
    if (rc < 0) {
        snprintf(msg, msg_len, "%s: %.170s", asked->name, why);
        topo_close(r, TOPO_NODE); /* ask another node */
        return rc == -ENOMEM ? rc : 0;
    }
    if (unassigned)
        snprintf(t->error, sizeof(t->error),
                 "cluster: %zu of %d slots have no primary (asked %s): their keys fail", unassigned,
                 REDIS_SLOTS, asked->name);
    *out = t;
    return 1;
}

int topo_check_cluster(kvg_redis *r, redis_topology **out, char *msg, size_t msg_len)
{
    struct redis_topo *tp = r->topo;
    if (r->url.db) {
        snprintf(msg, msg_len, "a cluster has database 0 alone: drop /%u from the URL", r->url.db);
        return KVG_ECONFIG;
    }
    char one[256] = "";
    int rc;
    /* The node asked last, while its connection lasts. */
    if (tp->conn[TOPO_NODE]) {
        redis_node asked = tp->conn_node[TOPO_NODE];
        if ((rc = ask(r, &asked, out, one, sizeof(one))) != 0)
            goto done;
    }
    /* Then the primaries of the last map, not only the URL's node, which may be gone for good. */
    redis_topology *cur = redis_topology_acquire(r);
    size_t known = cur->mode == KVG_REDIS_CLUSTER ? cur->nnodes : 0;
    rc = 0;
    for (size_t k = 0; k < KVG_MIN(known, (size_t)ASK_KNOWN_MAX) && rc == 0; k++) {
        redis_node node = cur->nodes[(tp->cluster_cursor + k) % known];
        if ((rc = topo_connect(r, TOPO_NODE, &node, true, one, sizeof(one))) == 0)
            rc = ask(r, &node, out, one, sizeof(one));
        else if (rc != -ECANCELED)
            rc = 0;
    }
    if (known)
        tp->cluster_cursor = (tp->cluster_cursor + 1) % known;
    kvg_snapshot_unref(&cur->snap);
    if (rc != 0)
        goto done;
    /* Last, the URL's host (every address it has). */
    const kvg_redis_seed *seed = &r->url.seeds[0];
    redis_node node;
    topo_close(r, TOPO_NODE);
    if ((rc = topo_connect_host(r, TOPO_NODE, seed->host, seed->port, true, &node, one,
                                sizeof(one))) == 0)
        rc = ask(r, &node, out, one, sizeof(one));
done:
    if (rc == 1)
        return 0;
    snprintf(msg, msg_len, "cluster: no node answered CLUSTER SLOTS (last: %s)",
             one[0] ? one : "none known");
    if (rc == KVG_ECONFIG)
        snprintf(msg, msg_len, "%s", one);
    return rc < 0 ? rc : -EIO;
}
