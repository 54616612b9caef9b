/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the topology thread's files and their tests: redis_topology.c (the thread, the
 * standalone checks, connections and name resolution), redis_sentinel.c and redis_cluster.c. */
#ifndef KVG_ROUTER_REDIS_TOPOLOGY_INT_H
#define KVG_ROUTER_REDIS_TOPOLOGY_INT_H

#include "redis_int.h"

struct redisContext;
struct redisReply;

/* The connections the thread keeps from one check to the next. */
typedef enum topo_conn {
    TOPO_NODE = 0, /* the server checks ask: standalone, the Sentinels' primary, a cluster node */
    TOPO_SENTINEL, /* the Sentinel that answered last */
    TOPO_SUB,      /* a Sentinel's +switch-master channel (subscribed: no other commands) */
    TOPO_CONN_COUNT,
} topo_conn;

/* The thread's own state. Only the thread touches it, except fds (under r->lock) and wake_fd. */
struct redis_topo {
    struct redisContext *conn[TOPO_CONN_COUNT];
    redis_node conn_node[TOPO_CONN_COUNT]; /* where each one goes */
    /* Under r->lock: conn[i]'s socket, or -1. kvg_redis_free shuts them down so that a call
     * blocked on a stalled server returns at once instead of at its timeout. */
    int fds[TOPO_CONN_COUNT];
    int wake_fd; /* eventfd: kvg_redis_refresh_topology and kvg_redis_free wake the poll */
    kvg_redis_mode
        mode; /* what checks do: the URL's, or CLUSTER once a node said cluster_enabled */
    uint8_t sentinel_order[KVG_REDIS_SEEDS_MAX]; /* seeds' indices, the last to answer first */
    bool check_now;    /* +switch-master arrived, or the subscription went: check without delay */
    bool retry_soon;   /* the check found a state that should settle soon (a failover under way) */
    unsigned failures; /* consecutive failed checks: the retry backs off */
    size_t cluster_cursor; /* the known node asked first when TOPO_NODE is gone (round robin) */
};

/* Most addresses one name resolves to that are tried. */
#define TOPO_ADDRS_MAX 8
/* Most primaries of a cluster (Redis recommends at most about 1000 nodes). */
#define TOPO_CLUSTER_NODES_MAX 2048

/* ---- redis_topology.c: helpers of every mode ---- */

/** "host:port", "[host]:port" for an IPv6 address: how a node is named in messages, logs and
 *  metrics (redis_node.name). */
void topo_name(const char *host, long long port, char *out, size_t len);
/** host (a name or an address) resolved into out (at most max addresses, in getaddrinfo's
 *  order of preference, duplicates removed). Blocks for names: the topology thread only.
 *  0 and *n >= 1, or -EHOSTUNREACH with msg. */
int topo_resolve(const char *host, uint16_t port, redis_node *out, size_t max, size_t *n, char *msg,
                 size_t msg_len);
/** Connect slot to node (closing what it held): connect timeout, the handshake with the URL's
 *  credentials when auth (never for Sentinels), then the command timeout. 0, or a negative code
 *  with msg ("127.0.0.1:6379: Connection refused"); -ECANCELED once kvg_redis_free began. */
int topo_connect(kvg_redis *r, topo_conn slot, const redis_node *node, bool auth, char *msg,
                 size_t msg_len);
/** Keep slot's connection when it goes to one of host's addresses, else connect to each address
 *  in turn until one answers. *node is where it goes. 0 or a negative code with msg. */
int topo_connect_host(kvg_redis *r, topo_conn slot, const char *host, uint16_t port, bool auth,
                      redis_node *node, char *msg, size_t msg_len);
/** Close slot's connection, if any. */
void topo_close(kvg_redis *r, topo_conn slot);
/** A command on slot's connection. The reply (caller frees), or NULL after an I/O error, with
 *  the connection closed and msg set. An error reply is a reply. */
struct redisReply *topo_command(kvg_redis *r, topo_conn slot, char *msg, size_t msg_len,
                                const char *fmt, ...);
/** topo_connect_host, then a command on slot's connection: a kept connection that turns out
 *  dead (the server restarted) is made once more before the command fails. 0 and *out (the
 *  reply, which may be an error reply; the caller frees it), or a negative code with msg:
 *  topo_connect_host's, or -EIO when the command got no answer (the connection closed). */
int topo_ask(kvg_redis *r, topo_conn slot, const char *host, uint16_t port, bool auth,
             redis_node *node, struct redisReply **out, char *msg, size_t msg_len, const char *fmt,
             ...);
/** A new topology of mode, room for nnodes (nnodes set to 0) and, when slots, a slot map with
 *  every slot unassigned; one allocation, freed by redis_topology_free. NULL when out of memory. */
redis_topology *topo_alloc(kvg_redis_mode mode, size_t nnodes, bool slots);
/** The role a ROLE reply names: "master", "slave" (with the primary's address in primary when it
 *  is given), "sentinel"; NULL for a reply of another shape. */
const char *topo_role(const struct redisReply *reply, char *primary, size_t primary_len);
/** topo_role of a ROLE reply from node, which it frees; for a reply of another shape NULL,
 *  with msg "<node>: ROLE: ...". */
const char *topo_read_role(struct redisReply *reply, const redis_node *node, char *primary,
                           size_t primary_len, char *msg, size_t msg_len);
/** msg = "what: <the error reply>" or "what: unexpected reply". */
void topo_reply_error(const struct redisReply *reply, const char *what, char *msg, size_t msg_len);

/* ---- redis_sentinel.c ---- */

/** Ask the Sentinels (the last to answer first) for the primary, subscribe to +switch-master on
 *  one of them, and check that the named server says it is the primary. 0 and *out, or a
 *  negative code with msg (retry_soon set for a stale answer during a failover). */
int topo_check_sentinel(kvg_redis *r, redis_topology **out, char *msg, size_t msg_len);
/** Read what the subscription has (it polled readable): +switch-master for our master sets
 *  check_now; so does losing the subscription. */
void topo_sentinel_read(kvg_redis *r);
/** The primary's address in a SENTINEL get-master-addr-by-name reply (an array of two strings:
 *  address, port), host copied (host_len bytes with the NUL). who names the Sentinel and master
 *  the name asked about, for msg. 0, or -ENOENT (NIL: the Sentinel does not know master) /
 *  KVG_EPROTO (an error reply, another shape, an address that is empty, overlong or holds bytes
 *  no address or name has, a port that is not 1..65535 in decimal digits) with msg. host and port
 * are written on success only. Peer input: any reply tree is safe (tests/fuzz/fuzz_redis_reply.c).
 */
int redis_sentinel_parse_addr(const struct redisReply *reply, const char *who, const char *master,
                              char *host, size_t host_len, uint16_t *port, char *msg,
                              size_t msg_len);
/** Whether a message on the subscription is a +switch-master for master (["message", channel,
 *  "<master> <old ip> <old port> <new ip> <new port>"]); false for any other reply tree. */
bool redis_sentinel_is_switch(const struct redisReply *m, const char *master);

/* ---- redis_cluster.c ---- */

/** Read the slot map with CLUSTER SLOTS from TOPO_NODE, or else from a known primary, or else
 *  the URL's host. 0 and *out, or a negative code with msg. A map with slots no primary serves
 *  is published with its error set (and returns 0). */
int topo_check_cluster(kvg_redis *r, redis_topology **out, char *msg, size_t msg_len);
/** The topology a CLUSTER SLOTS reply describes: each range's primary (its first node) into
 *  nodes, once, and into slots. An endpoint that is NIL or "" is asked's host (the server does
 *  not know its own address), "?" an unknown node (its slots stay unassigned), a name is
 *  resolved here (blocks). 0 and *out with *unassigned the slots that no primary serves, or
 *  KVG_EPROTO (a malformed reply) / -EHOSTUNREACH / -ENOMEM with msg. */
int redis_cluster_parse_slots(const struct redisReply *reply, const redis_node *asked,
                              redis_topology **out, size_t *unassigned, char *msg, size_t msg_len);

#endif
