/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the Redis client (redis_url.c, redis_topology.c, redis_client.c, redis_map.c) and
 * its tests: the topology snapshot, hash slots, the scripts and their arguments. */
#ifndef KVG_ROUTER_REDIS_INT_H
#define KVG_ROUTER_REDIS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "prom.h"
#include "router.h"
#include "snapshot.h"

struct redisReply;

#define REDIS_SLOTS 16384
#define REDIS_NO_NODE UINT16_MAX

/* A primary as the topology thread resolved it: a numeric address, never a name, so that
 * event loops connect without a DNS lookup. */
typedef struct redis_node {
    char host[64]; /* numeric IPv4 or IPv6 (no brackets) */
    uint16_t port;
    char name[80]; /* "host:port" ("[v6]:port"), for logs and metrics */
} redis_node;

/* What the topology thread found, published as an immutable snapshot. nnodes 0: nothing
 * reached yet (error says why). STANDALONE and SENTINEL have one node, the primary; CLUSTER
 * has every primary and the owner of each slot. */
typedef struct redis_topology {
    kvg_snapshot snap; /* first */
    kvg_redis_mode mode;
    size_t nnodes;
    redis_node *nodes;
    uint16_t *slots; /* CLUSTER: REDIS_SLOTS node indices (REDIS_NO_NODE: unassigned) */
    char error[256]; /* the last discovery error, "" when the last check succeeded */
} redis_topology;
_Static_assert(offsetof(redis_topology, snap) == 0, "a topology is its snapshot header");

/** The hash slot of a key: CRC16 (XMODEM) of the key, or of the part between the first '{'
 *  and the next '}' when that part is not empty (Redis Cluster's hash tags), mod 16384. */
uint16_t redis_key_slot(const char *key, size_t len);

/* Connection states of the clients' connections, for kvgate_redis_connections{state}. */
typedef enum redis_conn_state {
    REDIS_CONN_CONNECTING = 0, /* TCP connect or handshake (AUTH, SELECT, PING) under way */
    REDIS_CONN_READY,          /* carrying commands */
    REDIS_CONN_BACKOFF,        /* failed; waiting to try again */
    REDIS_CONN_STATE_COUNT,
} redis_conn_state;

const char *redis_conn_state_str(redis_conn_state s);

/* Why a command was not sent or not answered, for kvgate_redis_commands_dropped_total. */
typedef enum redis_drop_reason {
    REDIS_DROP_NOT_CONNECTED = 0, /* no ready connection to the slot's primary */
    REDIS_DROP_BUSY,              /* max_inflight commands already in flight */
    REDIS_DROP_CONNECTION_LOST,   /* the connection went with the command in flight */
    REDIS_DROP_REASON_COUNT,
} redis_drop_reason;

/* Outcomes of the prefix map's operations, for kvgate_redis_{lookups,records}_total. */
typedef enum redis_map_outcome {
    REDIS_MAP_OK = 0,
    REDIS_MAP_TIMEOUT,     /* lookups: the decision stopped waiting (counted by the caller) */
    REDIS_MAP_UNAVAILABLE, /* no ready connection */
    REDIS_MAP_BUSY,        /* max_inflight */
    REDIS_MAP_LOST,        /* the connection went (or was dropped) before the answer */
    REDIS_MAP_ERROR,       /* an error reply or a malformed one */
    REDIS_MAP_OUTCOME_COUNT,
} redis_map_outcome;

const char *redis_map_outcome_str(redis_map_outcome o);

struct kvg_redis {
    kvg_redis_config cfg; /* url and prefix point at the copies below */
    kvg_redis_url url;
    char url_redacted[512];
    char *url_copy;
    char *prefix;
    kvg_snapshot_slot topology; /* redis_topology */

    /* The topology thread (redis_topology.c). lock guards what follows it up to the metrics. */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    pthread_cond_t cond;       /* the thread waits on it; so do kvg_redis_wait_topology callers */
    bool stop;                 /* kvg_redis_free */
    bool refresh;              /* kvg_redis_refresh_topology asked for a check */
    bool reached;              /* a check has succeeded once */
    char last_error[256];      /* of the last check; "" when it succeeded */
    kvg_redis_mode found_mode; /* as the last successful check found it */
    struct redis_topo *topo;   /* the thread's own state (redis_topology_int.h) */

    /* Metrics, written by every client (atomics). */
    _Atomic int64_t conns[REDIS_CONN_STATE_COUNT];
    _Atomic uint64_t reconnects;
    _Atomic uint64_t redirects[2]; /* MOVED, ASK */
    _Atomic uint64_t topology_changes;
    _Atomic uint64_t dropped[REDIS_DROP_REASON_COUNT];
    _Atomic uint64_t lookups[REDIS_MAP_OUTCOME_COUNT];
    _Atomic uint64_t records[REDIS_MAP_OUTCOME_COUNT];
    kvg_prom_hist lookup_rtt; /* redis_rtt_buckets */
    kvg_prom_hist record_rtt;
};

/* Round-trip buckets (ns): a lookup on loopback takes tens of microseconds, across a rack a
 * few hundred; the top ones catch a stalled server. */
extern const kvg_prom_buckets redis_rtt_buckets;

/* ---- redis_url.c ---- */
/** Whether [s, s + len) can be a host a server names (Sentinel, CLUSTER SLOTS): not empty, and
 *  only what addresses and host names hold ([A-Za-z0-9._:-]), so no NUL that would cut it short
 *  and no control byte or space that would reach getaddrinfo and the logs. */
bool redis_host_valid(const char *s, size_t len);

/* ---- redis_topology.c ---- */
/** Start the topology thread (kvg_redis_new). 0 or -errno. */
int redis_topology_start(kvg_redis *r);
/** Stop and join it (kvg_redis_free): returns at once even while the thread waits on a
 *  stalled server (its sockets are shut down), or within the connect timeout while it connects. */
void redis_topology_stop(kvg_redis *r);
/** Wake the thread to look at r->stop and r->refresh now. Any thread. */
void redis_topology_wake(kvg_redis *r);
/** A topology's free function (one allocation: nodes and slots follow the struct). */
void redis_topology_free(kvg_snapshot *snap);
/** The current topology, referenced (kvg_snapshot_unref when done). Never NULL. */
redis_topology *redis_topology_acquire(kvg_redis *r);

/** Connect to host:port (numeric or a name: this blocks) with timeout_ms for the connect and
 *  every command, then AUTH with the URL's credentials and, when db is not 0, SELECT it.
 *  0 and *out, or a negative code with msg ("10.0.0.5:6379: Connection refused"). */
int redis_connect_handshake(const kvg_redis_url *url, const char *host, uint16_t port, uint32_t db,
                            uint32_t timeout_ms, struct redisContext **out, char *msg,
                            size_t msg_len);

/* ---- redis_client.c ---- */
/** Stop waiting for a lookup whose caller's deadline passed: kvg_redis_op_cancel, counted as
 *  a timeout in kvgate_redis_lookups_total. */
void redis_lookup_timed_out(kvg_redis_op *op);

/* ---- the scripts of the prefix map (redis_map.c) ---- */

/* A Lua script sent with EVALSHA; the body goes with EVAL after a NOSCRIPT (a server that
 * restarted, a new primary). */
typedef struct redis_script {
    const char *name; /* for logs */
    const char *body;
    char sha[41]; /* SHA-1 of body, hex */
} redis_script;

/* Lookup: KEYS = one key per worker (redis_map_key), ARGV[1] = the chain (redis_map_pack_keys).
 * Returns an array of one integer per key: the worker's matched depth, found exactly as
 * kvg_index_match finds it (leading keys held, by doubling steps and bisection), without
 * refreshing recency. */
extern const redis_script redis_map_lookup_script;
/* Record: KEYS[1] = the worker's key, ARGV[1] = capacity (blocks, > 0), ARGV[2] = TTL in ms,
 * ARGV[3] = the chain. Every key becomes most recent, keys[0] the most recent of all, and the
 * least recent entries past capacity are evicted, exactly as kvg_index_record; the key's TTL
 * is set. Returns the number evicted. */
extern const redis_script redis_map_record_script;

/* Longest key redis_map_key writes (with its NUL). */
#define REDIS_MAP_KEY_MAX 192

/** The key of worker map_id's entries: "<prefix>:m:<map_id hex>" on a single primary (one
 *  LRU per worker, exactly the embedded index's model), "<prefix>:m:{<root hex>}:<map_id hex>"
 *  on a cluster (every key of a call in the root's slot; one LRU per worker and root). Returns
 *  the length written to out (out has REDIS_MAP_KEY_MAX bytes). */
size_t redis_map_key(char *out, const char *prefix, kvg_redis_mode mode, uint64_t root,
                     uint64_t map_id);
/** The chain as the scripts take it: nkeys 8-byte little-endian words, into out (8 x nkeys
 *  bytes). */
void redis_map_pack_keys(const uint64_t *keys, size_t nkeys, unsigned char *out);
/** Read a lookup's reply (an array of nworkers integers) into matched. 0 or KVG_EPROTO (an
 *  error reply, or the wrong shape). */
int redis_map_parse_lookup(const struct redisReply *reply, size_t nworkers, uint32_t *matched);

#endif
