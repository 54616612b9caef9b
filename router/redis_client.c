/* SPDX-License-Identifier: Apache-2.0 */
/* A client of the prefix map on one event loop: a connection per primary (hiredis async through
 * its libevent adapter), their handshake, backoff and watchdog, the bound on commands in flight,
 * Cluster redirections, NOSCRIPT recovery, and the map's lookups and records. */
#include "redis_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/event_struct.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#define BACKOFF_MIN_MS 50u
/* Redirections one command follows (MOVED then ASK is the longest useful chain). */
#define REDIRECTS_MAX 2
/* Lookups up to this many workers build their arguments on the stack. */
#define STACK_WORKERS 64
/* How often an idle client looks for a new topology (see tick_cb). */
#define TICK_MS 200

typedef enum op_kind {
    OP_LOOKUP = 0,
    OP_RECORD,
    OP_LOOKUP_PART, /* one worker's key of a lookup split after TRYAGAIN (lookup_split) */
    OP_HANDSHAKE,   /* AUTH, SELECT, SCRIPT LOAD, PING of a new connection */
    OP_IGNORED,     /* a reply nobody reads: ASKING, a SCRIPT LOAD after NOSCRIPT */
    OP_KIND_COUNT,
} op_kind;

/* Which handshake step a reply answers. */
typedef enum hs_step {
    HS_AUTH = 0,
    HS_SELECT,
    HS_LOAD_LOOKUP,
    HS_LOAD_RECORD,
    HS_PING, /* last: its answer makes the connection ready */
} hs_step;

typedef struct redis_conn redis_conn;

/* A command in flight. Owned by the client: freed when its reply (or the connection's end)
 * arrives, whether or not the requester cancelled it meanwhile. */
struct kvg_redis_op {
    kvg_link link;    /* in conn->pending, oldest first (replies come in order) */
    redis_conn *conn; /* where it was sent last (NULL: a split lookup, see parts) */
    kvg_redis_client *client;
    op_kind kind;
    bool cancelled;
    bool script_reloaded; /* NOSCRIPT recovered once already */
    uint8_t redirects;
    hs_step step;
    uint64_t sent_ns;
    /* The command as sent (EVALSHA ...), kept for a redirection or a NOSCRIPT retry. */
    char *cmd;
    size_t cmd_len;
    const redis_script *script;
    kvg_map_lookup_cb *cb;
    void *ud;
    uint32_t nworkers;
    /* A lookup split into one part per worker (lookup_split): the parts' answers, how many are
     * still out, the first failure among them. A part: its lookup and its worker's place. */
    uint32_t *parts;
    uint32_t parts_left;
    int parts_status;
    kvg_redis_op *parent;
    uint32_t index;
};

struct redis_conn {
    kvg_redis_client *client;
    redis_node node;
    redisAsyncContext *ac; /* NULL while in backoff */
    redis_conn_state state;
    bool counted;       /* state is counted in kvg_redis.conns */
    bool was_ready;     /* has been ready once: the next ready one is a reconnect */
    unsigned attempt;   /* consecutive failures, for the backoff */
    int drop_status;    /* what commands in flight get when the connection is dropped */
    struct event timer; /* connect timeout, backoff, watchdog */
    kvg_link pending;   /* ops sent, oldest first */
    size_t npending;
    char last_error[160];
};

struct kvg_redis_client {
    kvg_redis *r;
    struct event_base *base;
    kvg_snapshot_cache topo;    /* redis_topology */
    redis_topology *conns_topo; /* the topology conns were made for (referenced) */
    redis_conn **conns;         /* one per node of conns_topo */
    size_t nconns;
    struct event reconcile; /* takes a new topology outside any hiredis callback */
    struct event tick;      /* takes it on a loop without commands too */
    bool reconcile_pending;
    bool freeing;
    uint64_t rng;
    char ttl[20]; /* redis.entry_ttl_ms in decimal, as every record sends it */
    size_t ttl_len;
};

static void conn_connect(redis_conn *c);
static void conn_drop(redis_conn *c, int status, bool in_callback);
static void op_reply(redisAsyncContext *ac, void *reply, void *privdata);
static bool lookup_split(kvg_redis_op *op);

/* ---- states and counters --------------------------------------------------------------------- */

static void uncount(redis_conn *c)
{
    if (c->counted)
        atomic_fetch_sub_explicit(&c->client->r->conns[c->state], 1, memory_order_relaxed);
    c->counted = false;
}

static void set_state(redis_conn *c, redis_conn_state s)
{
    uncount(c);
    c->state = s;
    c->counted = true;
    atomic_fetch_add_explicit(&c->client->r->conns[s], 1, memory_order_relaxed);
}

/* (Re)arm c's timer to fire ns from now. */
static void arm(redis_conn *c, uint64_t ns)
{
    struct timeval tv = {.tv_sec = (time_t)(ns / 1000000000u),
                         .tv_usec = (long)(ns % 1000000000u / 1000)};
    evtimer_add(&c->timer, &tv);
}

static uint64_t next_rand(kvg_redis_client *cl)
{
    uint64_t x = cl->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return cl->rng = x;
}

/* ---- ops ----------------------------------------------------------------------------------- */

/* Put op at the end of c's commands in flight (replies come in order). The watchdog looks at
 * a ready connection's oldest command; a connecting one's timer is its connect timeout. */
static void track(redis_conn *c, kvg_redis_op *op)
{
    op->conn = c;
    kvg_list_insert(c->pending.prev, &op->link);
    /* op is the oldest now: the watchdog is due when it would be late. (A timer of 0 here cost
     * every command sent on an idle connection an extra wakeup, only to arm this.) */
    if (c->npending++ == 0 && c->state == REDIS_CONN_READY)
        arm(c, (uint64_t)c->client->r->cfg.command_timeout_ms * 1000000u);
}

/* Send a command of the client's own on c: a handshake step, ASKING, a SCRIPT LOAD. Tracked as
 * any other, since replies come in order. 0, -ENOMEM or -ENOTCONN. */
static int send_own(redis_conn *c, op_kind kind, hs_step step, int argc, const char **argv,
                    const size_t *lens)
{
    kvg_redis_op *op = calloc(1, sizeof(*op));
    if (!op)
        return -ENOMEM;
    op->kind = kind;
    op->step = step;
    op->sent_ns = kvg_now_ns();
    if (redisAsyncCommandArgv(c->ac, op_reply, op, argc, argv, lens) != REDIS_OK) {
        free(op);
        return -ENOTCONN;
    }
    track(c, op);
    return 0;
}

static int load_script(redis_conn *c, op_kind kind, hs_step step, const redis_script *script)
{
    return send_own(c, kind, step, 3, (const char *[]){"SCRIPT", "LOAD", script->body},
                    (const size_t[]){6, 4, strlen(script->body)});
}

static void op_free(kvg_redis_op *op)
{
    free(op->parts);
    free(op->cmd);
    free(op);
}

static void op_finish(kvg_redis_op *op, int status, const redisReply *reply);

/* A part of a split lookup has its answer (status 0 and m) or failed: the lookup ends with the
 * last part, failed if any part did (a fallback, as an unsplit lookup's failure). */
static void part_done(kvg_redis_op *part, int status, uint32_t m)
{
    kvg_redis_op *op = part->parent;
    if (status == 0)
        op->parts[part->index] = m;
    else if (op->parts_status == 0)
        op->parts_status = status;
    if (--op->parts_left)
        return;
    op_finish(op, op->parts_status, NULL);
    op_free(op);
}

static redis_map_outcome outcome_of(int status)
{
    switch (status) {
    case 0:
        return REDIS_MAP_OK;
    case -ETIMEDOUT:
    case -ECONNRESET:
        return REDIS_MAP_LOST;
    case -ENOTCONN: /* not sent (a refusal, a part of a split lookup) */
        return REDIS_MAP_UNAVAILABLE;
    case -EBUSY:
        return REDIS_MAP_BUSY;
    default:
        return REDIS_MAP_ERROR;
    }
}

/* A command that was not sent, or not answered, for kvgate_redis_commands_dropped_total. */
static void count_drop(kvg_redis_client *cl, int rc)
{
    redis_drop_reason d = rc == -EBUSY ? REDIS_DROP_BUSY : REDIS_DROP_NOT_CONNECTED;
    atomic_fetch_add_explicit(&cl->r->dropped[d], 1, memory_order_relaxed);
}

/* What an error reply said, for the debug log. */
static void log_error_reply(const kvg_redis_op *op, const char *what, const redisReply *reply)
{
    if (reply && reply->type == REDIS_REPLY_ERROR)
        kvg_log_debug("redis %s: %s: %.*s", op->conn->node.name, what,
                      (int)KVG_MIN(reply->len, 200), reply->str);
}

/* Map a finished lookup or record to its outcome counter and its caller. While the client is
 * being freed nobody is called: a part only frees its lookup with the last part. */
static void op_finish(kvg_redis_op *op, int status, const redisReply *reply)
{
    if (op->client->freeing) {
        if (op->kind == OP_LOOKUP_PART)
            part_done(op, -ECONNRESET, 0);
        return;
    }
    kvg_redis *r = op->client->r;
    if (op->kind == OP_LOOKUP_PART) {
        uint32_t m = 0;
        if (status == 0 && (status = redis_map_parse_lookup(reply, 1, &m)) < 0)
            log_error_reply(op, "lookup part", reply);
        part_done(op, status, m);
        return;
    }
    uint64_t rtt = kvg_now_ns() - op->sent_ns;
    if (op->kind == OP_RECORD) {
        if (status == 0 && (!reply || reply->type != REDIS_REPLY_INTEGER)) {
            status = KVG_EPROTO;
            log_error_reply(op, "record", reply);
        }
        redis_map_outcome out = outcome_of(status);
        if (out == REDIS_MAP_OK)
            kvg_prom_hist_observe(&r->record_rtt, &redis_rtt_buckets, rtt);
        atomic_fetch_add_explicit(&r->records[out], 1, memory_order_relaxed);
        return;
    }
    /* A lookup. */
    uint32_t stack[STACK_WORKERS];
    uint32_t *matched = NULL;
    if (status == 0 && op->parts) {
        matched = op->parts; /* a split lookup: its parts answered */
    } else if (status == 0) {
        matched = op->nworkers <= STACK_WORKERS ? stack : malloc(op->nworkers * sizeof(*matched));
        if (!matched)
            status = -ENOMEM;
        else if ((status = redis_map_parse_lookup(reply, op->nworkers, matched)) < 0)
            log_error_reply(op, "lookup", reply);
    }
    redis_map_outcome out = outcome_of(status);
    if (out == REDIS_MAP_OK)
        kvg_prom_hist_observe(&r->lookup_rtt, &redis_rtt_buckets, rtt);
    /* A cancelled lookup was counted as a timeout by the caller who gave up on it. */
    if (!op->cancelled) {
        atomic_fetch_add_explicit(&r->lookups[out], 1, memory_order_relaxed);
        op->cb(op->ud, status, status == 0 ? matched : NULL, op->nworkers);
    }
    if (matched && matched != stack && matched != op->parts)
        free(matched);
}

/* Whether c can take a command now: ready, and under the bound on commands in flight. 0,
 * -ENOTCONN or -EBUSY. */
static int conn_check(const redis_conn *c)
{
    if (!c || c->state != REDIS_CONN_READY || !c->ac)
        return -ENOTCONN;
    return c->npending >= c->client->r->cfg.max_inflight ? -EBUSY : 0;
}

/* Send op's command on c (ready), ASKING first after an ASK. 0, -ENOMEM or -ENOTCONN. */
static int op_send(redis_conn *c, kvg_redis_op *op, bool asking)
{
    if (asking) {
        int rc = send_own(c, OP_IGNORED, 0, 1, (const char *[]){"ASKING"}, (const size_t[]){6});
        if (rc < 0)
            return rc;
    }
    if (redisAsyncFormattedCommand(c->ac, op_reply, op, op->cmd, op->cmd_len) != REDIS_OK)
        return -ENOTCONN;
    track(c, op);
    return 0;
}

/* ---- the watchdog, connect timeout and backoff share the connection's timer ---------------- */

static void conn_timer(evutil_socket_t fd, short what, void *arg)
{
    redis_conn *c = arg;
    kvg_redis_client *cl = c->client;
    switch (c->state) {
    case REDIS_CONN_BACKOFF:
        conn_connect(c);
        return;
    case REDIS_CONN_CONNECTING:
        snprintf(c->last_error, sizeof(c->last_error), "no handshake within %u ms",
                 cl->r->cfg.connect_timeout_ms);
        conn_drop(c, -ETIMEDOUT, false);
        return;
    case REDIS_CONN_READY:
    default: {
        if (kvg_list_empty(&c->pending))
            return;
        kvg_redis_op *oldest = KVG_CONTAINER_OF(c->pending.next, kvg_redis_op, link);
        uint64_t age = kvg_now_ns() - oldest->sent_ns;
        uint64_t limit = (uint64_t)cl->r->cfg.command_timeout_ms * 1000000u;
        if (age >= limit) {
            snprintf(c->last_error, sizeof(c->last_error), "a command unanswered for %u ms",
                     cl->r->cfg.command_timeout_ms);
            conn_drop(c, -ETIMEDOUT, false);
            return;
        }
        arm(c, limit - age);
        return;
    }
    }
}

/* The connection is gone (ac freed or being freed): wait, then try again. */
static void conn_lost(redis_conn *c)
{
    kvg_redis_client *cl = c->client;
    c->ac = NULL;
    if (cl->freeing)
        return;
    evtimer_del(&c->timer);
    set_state(c, REDIS_CONN_BACKOFF);
    uint64_t max = cl->r->cfg.reconnect_max_ms;
    uint64_t ms = BACKOFF_MIN_MS;
    for (unsigned i = 0; i < c->attempt && ms < max; i++)
        ms *= 2;
    ms = KVG_MIN(ms, max);
    /* Jitter: every thread of every replica must not knock at once after a restart. */
    ms = ms / 2 + next_rand(cl) % (ms / 2 + 1);
    if (c->attempt < 32)
        c->attempt++;
    if (c->attempt == 1 || c->attempt % 16 == 0)
        kvg_log_warn("redis %s: connection lost (%s); trying again in %llu ms", c->node.name,
                     c->last_error[0] ? c->last_error : "closed", (unsigned long long)ms);
    arm(c, ms * 1000000u);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    redis_conn *c = ac->data;
    if (!c || c->ac != ac)
        return; /* dropped already: conn_drop saw to it */
    if (!c->last_error[0])
        snprintf(c->last_error, sizeof(c->last_error), "%s",
                 ac->errstr[0] ? ac->errstr : "closed by the server");
    conn_lost(c);
}

/* Close c's connection: its commands in flight get status. in_callback: called from one of
 * hiredis's reply callbacks, where hiredis defers the free to after the callback (and then
 * calls on_disconnect, since the connection was established). */
static void conn_drop(redis_conn *c, int status, bool in_callback)
{
    redisAsyncContext *ac = c->ac;
    if (!ac)
        return;
    c->drop_status = status;
    if (in_callback) {
        redisAsyncFree(ac);
        return;
    }
    c->ac = NULL; /* on_disconnect, if it comes, knows it is handled */
    ac->data = c; /* the op callbacks still run, with NULL replies */
    redisAsyncFree(ac);
    conn_lost(c);
}

/* ---- the handshake --------------------------------------------------------------------------- */

static void on_connect(const redisAsyncContext *ac, int status)
{
    redis_conn *c = ac->data;
    if (!c || c->ac != ac)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees ac when this returns, without on_disconnect. */
        snprintf(c->last_error, sizeof(c->last_error), "%s", ac->errstr);
        conn_lost(c);
        return;
    }
    kvg_redis *r = c->client->r;
    const kvg_redis_url *u = &r->url;
    int rc = 0;
    if (u->password[0]) {
        const char *argv[3] = {"AUTH"}; /* AUTH [user] password */
        size_t lens[3] = {4};
        int argc = 1;
        if (u->user[0]) {
            argv[argc] = u->user;
            lens[argc++] = strlen(u->user);
        }
        argv[argc] = u->password;
        lens[argc++] = strlen(u->password);
        rc = send_own(c, OP_HANDSHAKE, HS_AUTH, argc, argv, lens);
    }
    redis_topology *t = c->client->conns_topo;
    if (rc == 0 && u->db && t->mode != KVG_REDIS_CLUSTER) {
        char db[16];
        int n = snprintf(db, sizeof(db), "%u", u->db);
        rc = send_own(c, OP_HANDSHAKE, HS_SELECT, 2, (const char *[]){"SELECT", db},
                      (const size_t[]){6, (size_t)n});
    }
    if (rc == 0)
        rc = load_script(c, OP_HANDSHAKE, HS_LOAD_LOOKUP, &redis_map_lookup_script);
    if (rc == 0)
        rc = load_script(c, OP_HANDSHAKE, HS_LOAD_RECORD, &redis_map_record_script);
    if (rc == 0)
        rc = send_own(c, OP_HANDSHAKE, HS_PING, 1, (const char *[]){"PING"}, (const size_t[]){4});
    if (rc < 0) {
        snprintf(c->last_error, sizeof(c->last_error), "handshake: %s", kvg_strerror(rc));
        /* Not inside a reply callback: hiredis is in its write handler. Defer to the timer. */
        arm(c, 0);
    }
}

static void hs_reply(kvg_redis_op *op, const redisReply *reply)
{
    redis_conn *c = op->conn;
    kvg_redis_client *cl = c->client;
    if (!reply)
        return; /* the connection went: on_disconnect or conn_drop handles it */
    bool ok = reply->type != REDIS_REPLY_ERROR;
    if (ok && (op->step == HS_LOAD_LOOKUP || op->step == HS_LOAD_RECORD)) {
        /* EVALSHA names a script by the SHA-1 embed_lua.py computed: the server's must be it. */
        const redis_script *s =
            op->step == HS_LOAD_RECORD ? &redis_map_record_script : &redis_map_lookup_script;
        ok = reply->type == REDIS_REPLY_STRING && reply->len == 40 &&
             memcmp(reply->str, s->sha, 40) == 0;
    }
    if (!ok) {
        static const char *const names[] = {"AUTH", "SELECT", "SCRIPT LOAD", "SCRIPT LOAD", "PING"};
        if (reply->type == REDIS_REPLY_ERROR)
            snprintf(c->last_error, sizeof(c->last_error), "%s: %.*s", names[op->step],
                     (int)KVG_MIN(reply->len, 120), reply->str);
        else
            snprintf(c->last_error, sizeof(c->last_error), "%s: unexpected reply", names[op->step]);
        conn_drop(c, -ECONNRESET, true);
        return;
    }
    if (op->step != HS_PING)
        return;
    evtimer_del(&c->timer);
    if (c->was_ready || c->attempt)
        atomic_fetch_add_explicit(&cl->r->reconnects, 1, memory_order_relaxed);
    if (c->attempt)
        kvg_log_info("redis %s: connected again", c->node.name);
    c->attempt = 0;
    c->was_ready = true;
    c->last_error[0] = '\0';
    set_state(c, REDIS_CONN_READY);
    if (c->npending)
        arm(c, 0);
}

static void conn_connect(redis_conn *c)
{
    kvg_redis_client *cl = c->client;
    set_state(c, REDIS_CONN_CONNECTING);
    c->drop_status = -ECONNRESET;
    redisAsyncContext *ac = redisAsyncConnect(c->node.host, c->node.port);
    if (!ac || ac->err || redisLibeventAttach(ac, cl->base) != REDIS_OK) {
        snprintf(c->last_error, sizeof(c->last_error), "%s",
                 ac && ac->err ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        conn_lost(c);
        return;
    }
    ac->data = c;
    c->ac = ac;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    arm(c, (uint64_t)cl->r->cfg.connect_timeout_ms * 1000000u);
}

static redis_conn *conn_new(kvg_redis_client *cl, const redis_node *node)
{
    redis_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->client = cl;
    c->node = *node;
    kvg_list_init(&c->pending);
    evtimer_assign(&c->timer, cl->base, conn_timer, c);
    conn_connect(c);
    return c;
}

static void conn_free(redis_conn *c)
{
    if (!c)
        return;
    if (c->ac) {
        redisAsyncContext *ac = c->ac;
        c->ac = NULL;
        redisAsyncFree(ac); /* pending callbacks run now, with NULL replies */
    }
    evtimer_del(&c->timer);
    uncount(c);
    free(c);
}

/* ---- replies ------------------------------------------------------------------------------- */

/* Redirections, as kvg_redis.redirects counts them. */
enum { REDIRECT_MOVED = 0, REDIRECT_ASK, REDIRECT_COUNT };
_Static_assert(REDIRECT_COUNT == KVG_ARRAY_LEN(((kvg_redis *)0)->redirects), "redirects[]");

/* "MOVED 3999 127.0.0.1:6381" or "ASK 3999 ...": which, or -1 for another error. */
static int redirect_kind(const redisReply *reply)
{
    if (reply->len > 6 && memcmp(reply->str, "MOVED ", 6) == 0)
        return REDIRECT_MOVED;
    if (reply->len > 4 && memcmp(reply->str, "ASK ", 4) == 0)
        return REDIRECT_ASK;
    return -1;
}

/* The connection of this client to the address a redirection names, if any. */
static redis_conn *redirect_target(kvg_redis_client *cl, const redisReply *reply)
{
    /* "<word> <slot> <host>:<port>": the address follows the second space. The host is the
     * part before the last ':' (Redis writes IPv6 addresses without brackets). */
    const char *end = reply->str + reply->len;
    const char *addr = memchr(reply->str, ' ', reply->len);
    if (addr)
        addr = memchr(addr + 1, ' ', (size_t)(end - addr - 1));
    if (!addr)
        return NULL;
    addr++;
    const char *colon = NULL;
    for (const char *p = addr; p < end; p++)
        if (*p == ':')
            colon = p;
    uint64_t port;
    if (!colon || kvg_parse_u64(colon + 1, (size_t)(end - colon - 1), &port) < 0)
        return NULL;
    size_t hlen = (size_t)(colon - addr);
    for (size_t i = 0; i < cl->nconns; i++) {
        redis_conn *c = cl->conns[i];
        if (c->node.port == port && strlen(c->node.host) == hlen &&
            memcmp(c->node.host, addr, hlen) == 0)
            return c;
    }
    return NULL;
}

/* An error reply that another try may answer: a server that lost its scripts, a redirection, a
 * lookup during a slot's migration. true: op went on (sent again, or split), its reply is not
 * the end of it. */
static bool op_retry(kvg_redis_op *op, redis_conn *c, const redisReply *reply)
{
    kvg_redis_client *cl = c->client;
    /* A server that lost its scripts (a restart, a new primary, SCRIPT FLUSH): load it and send
     * the command again behind it, once. */
    if (reply->len >= 8 && memcmp(reply->str, "NOSCRIPT", 8) == 0 && !op->script_reloaded &&
        c->state == REDIS_CONN_READY) {
        op->script_reloaded = true;
        if (load_script(c, OP_IGNORED, 0, op->script) == 0 && op_send(c, op, false) == 0)
            return true;
    }
    int redirect = redirect_kind(reply);
    if (redirect >= 0) {
        atomic_fetch_add_explicit(&cl->r->redirects[redirect], 1, memory_order_relaxed);
        if (redirect == REDIRECT_MOVED)
            kvg_redis_refresh_topology(cl->r);
        /* The target's bound on commands in flight holds for redirected commands too. */
        redis_conn *to = op->redirects < REDIRECTS_MAX ? redirect_target(cl, reply) : NULL;
        if (to && conn_check(to) == 0) {
            op->redirects++;
            if (op_send(to, op, redirect == REDIRECT_ASK) == 0)
                return true;
        }
    }
    return op->kind == OP_LOOKUP && op->nworkers > 1 && !op->cancelled && reply->len >= 8 &&
           memcmp(reply->str, "TRYAGAIN", 8) == 0 && lookup_split(op);
}

static void op_reply(redisAsyncContext *ac, void *reply_ptr, void *privdata)
{
    kvg_redis_op *op = privdata;
    redis_conn *c = op->conn;
    redisReply *reply = reply_ptr;
    kvg_list_unlink(&op->link);
    c->npending--;
    if (op->kind == OP_HANDSHAKE)
        hs_reply(op, reply);
    if (op->kind == OP_HANDSHAKE || op->kind == OP_IGNORED) {
        op_free(op);
        return;
    }
    if (!reply) /* the connection went (or the client is being freed) */
        atomic_fetch_add_explicit(&c->client->r->dropped[REDIS_DROP_CONNECTION_LOST], 1,
                                  memory_order_relaxed);
    else if (reply->type == REDIS_REPLY_ERROR && !c->client->freeing && op_retry(op, c, reply))
        return;
    op_finish(op, reply ? 0 : c->drop_status, reply);
    op_free(op);
}

/* ---- topology ------------------------------------------------------------------------------ */

/* Make the connections match the current topology: keep those whose node stays, connect to
 * new nodes, close those whose node left. Runs from its own event, never inside a hiredis
 * callback, since closing a connection frees hiredis state. */
static void reconcile(kvg_redis_client *cl)
{
    redis_topology *t = (redis_topology *)(void *)kvg_snapshot_cache_get(&cl->topo);
    if (t == cl->conns_topo)
        return;
    size_t n = t->nnodes;
    redis_conn **next = calloc(n ? n : 1, sizeof(*next));
    bool *kept = calloc(cl->nconns ? cl->nconns : 1, sizeof(*kept));
    if (!next || !kept)
        goto fail; /* retried at the next command */
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < cl->nconns && !next[i]; j++) {
            if (!kept[j] && strcmp(cl->conns[j]->node.name, t->nodes[i].name) == 0) {
                next[i] = cl->conns[j];
                kept[j] = true;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (next[i])
            continue;
        if (!(next[i] = conn_new(cl, &t->nodes[i]))) {
            for (size_t k = 0; k < i; k++) { /* undo: close only the new ones */
                bool old = false;
                for (size_t j = 0; j < cl->nconns && !old; j++)
                    old = cl->conns[j] == next[k];
                if (!old)
                    conn_free(next[k]);
            }
            goto fail;
        }
    }
    for (size_t j = 0; j < cl->nconns; j++)
        if (!kept[j])
            conn_free(cl->conns[j]); /* a node that is no longer a primary */
    free(cl->conns);
    free(kept);
    cl->conns = next;
    cl->nconns = n;
    if (cl->conns_topo)
        kvg_snapshot_unref(&cl->conns_topo->snap);
    cl->conns_topo = (redis_topology *)(void *)kvg_snapshot_ref(&t->snap);
    return;
fail:
    free(next);
    free(kept);
}

static void reconcile_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_redis_client *cl = arg;
    cl->reconcile_pending = false;
    kvg_snapshot_cache_refresh(&cl->topo);
    reconcile(cl);
}

/* A new topology used to be noticed only by the next command (conn_for): a loop that carried
 * none kept its connection to a primary that had been demoted (a Sentinel failover with the old
 * primary alive), counted ready, reconnected to it when the Sentinel closed it, and its first
 * command after the change went there (stale reads on a replica). Now every loop looks; when
 * nothing changed, the refresh is a load and a compare and reconcile returns at once. */
static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    kvg_redis_client *cl = arg;
    if (!cl->reconcile_pending)
        reconcile_cb(fd, what, cl);
}

/* The connection for slot key (ready or not); NULL when the topology has none. Notices a new
 * topology and has it applied from the loop (not here: a caller may be inside a callback). */
static redis_conn *conn_for(kvg_redis_client *cl, const char *key, size_t key_len)
{
    if (kvg_snapshot_slot_generation(&cl->r->topology) != cl->topo.generation &&
        !cl->reconcile_pending) {
        cl->reconcile_pending = true;
        event_active(&cl->reconcile, EV_TIMEOUT, 0);
    }
    redis_topology *t = cl->conns_topo;
    if (!t || cl->nconns == 0)
        return NULL;
    /* Until the reconcile runs, answer by the newest topology: the key's primary there, if this
     * client is connected to it already, else none (the command falls back) rather than the
     * connection to a server that is no longer the primary (a demoted one answers lookups
     * from stale data and refuses records). */
    kvg_snapshot_cache_refresh(&cl->topo);
    redis_topology *nt = (redis_topology *)(void *)kvg_snapshot_cache_get(&cl->topo);
    if (!nt || nt->nnodes == 0)
        return NULL;
    size_t i = 0;
    if (nt->mode == KVG_REDIS_CLUSTER) {
        uint16_t n = nt->slots ? nt->slots[redis_key_slot(key, key_len)] : REDIS_NO_NODE;
        if (n == REDIS_NO_NODE || n >= nt->nnodes)
            return NULL;
        i = n;
    }
    if (nt == t)
        return i < cl->nconns ? cl->conns[i] : NULL;
    for (size_t j = 0; j < cl->nconns; j++)
        if (strcmp(cl->conns[j]->node.name, nt->nodes[i].name) == 0)
            return cl->conns[j];
    return NULL;
}

int kvg_redis_client_new(kvg_redis *r, struct event_base *base, kvg_redis_client **out)
{
    kvg_redis_client *cl = calloc(1, sizeof(*cl));
    if (!cl)
        return -ENOMEM;
    cl->r = r;
    cl->base = base;
    cl->rng = (uint64_t)(uintptr_t)cl ^ kvg_now_ns();
    cl->ttl_len = kvg_fmt_u64(cl->ttl, r->cfg.entry_ttl_ms);
    if (!cl->rng)
        cl->rng = 1;
    event_assign(&cl->reconcile, base, -1, 0, reconcile_cb, cl);
    event_assign(&cl->tick, base, -1, EV_PERSIST, tick_cb, cl);
    struct timeval tick = {.tv_sec = 0, .tv_usec = TICK_MS * 1000};
    event_add(&cl->tick, &tick);
    kvg_snapshot_cache_init(&cl->topo, &r->topology);
    kvg_snapshot_cache_refresh(&cl->topo);
    reconcile(cl);
    *out = cl;
    return 0;
}

void kvg_redis_client_free(kvg_redis_client *cl)
{
    if (!cl)
        return;
    cl->freeing = true;
    event_del(&cl->reconcile);
    event_del(&cl->tick);
    for (size_t i = 0; i < cl->nconns; i++)
        conn_free(cl->conns[i]);
    free(cl->conns);
    if (cl->conns_topo)
        kvg_snapshot_unref(&cl->conns_topo->snap);
    kvg_snapshot_cache_done(&cl->topo);
    free(cl);
}

/* ---- the prefix map's operations ---------------------------------------------------------------
 */

/* Count a command that was not sent. */
static int refuse(kvg_redis_client *cl, int rc, _Atomic uint64_t *outcomes)
{
    count_drop(cl, rc);
    atomic_fetch_add_explicit(&outcomes[outcome_of(rc)], 1, memory_order_relaxed);
    return rc;
}

/* Format EVALSHA sha numkeys keys... args... into a new op (argv[0..2] are written here). */
static kvg_redis_op *op_new(kvg_redis_client *cl, op_kind kind, const redis_script *script,
                            size_t nkeys, int argc, const char **argv, size_t *lens)
{
    kvg_redis_op *op = calloc(1, sizeof(*op));
    if (!op)
        return NULL;
    char numkeys[20];
    argv[0] = "EVALSHA";
    lens[0] = 7;
    argv[1] = script->sha;
    lens[1] = 40;
    argv[2] = numkeys;
    lens[2] = kvg_fmt_u64(numkeys, nkeys);
    char *cmd;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0) {
        free(op);
        return NULL;
    }
    op->cmd = cmd;
    op->cmd_len = (size_t)len;
    op->client = cl;
    op->kind = kind;
    op->script = script;
    return op;
}

/* Send op on c: ready, under the bound. 0, or -ENOTCONN / -EBUSY (op freed). */
static int submit(redis_conn *c, kvg_redis_op *op)
{
    int rc = conn_check(c);
    if (rc == 0) {
        op->sent_ns = kvg_now_ns();
        rc = op_send(c, op, false);
    }
    if (rc < 0)
        op_free(op);
    return rc;
}

int kvg_map_lookup(kvg_redis_client *cl, uint64_t root, const uint64_t *keys, size_t nkeys,
                   const uint64_t *map_ids, size_t nworkers, kvg_map_lookup_cb *cb, void *ud,
                   kvg_redis_op **out)
{
    if (nworkers == 0 || nworkers > INT32_MAX / 2 || nkeys > SIZE_MAX / 8)
        return -EINVAL;
    redis_topology *t = cl->conns_topo;
    kvg_redis_mode mode = t ? t->mode : KVG_REDIS_STANDALONE;
    /* Arguments: EVALSHA sha numkeys key... chain. */
    size_t argc = nworkers + 4;
    const char *stack_argv[STACK_WORKERS + 4];
    size_t stack_lens[STACK_WORKERS + 4];
    char stack_names[STACK_WORKERS][REDIS_MAP_KEY_MAX];
    const char **argv = stack_argv;
    size_t *lens = stack_lens;
    char(*names)[REDIS_MAP_KEY_MAX] = stack_names;
    unsigned char *chain = NULL;
    kvg_redis_op *op = NULL;
    redis_conn *c = NULL;
    int rc = -ENOMEM;
    if (nworkers > STACK_WORKERS) {
        argv = malloc(argc * sizeof(*argv));
        lens = malloc(argc * sizeof(*lens));
        names = malloc(nworkers * sizeof(*names));
        if (!argv || !lens || !names)
            goto done;
    }
    for (size_t i = 0; i < nworkers; i++) {
        lens[3 + i] = redis_map_key(names[i], cl->r->prefix, mode, root, map_ids[i]);
        argv[3 + i] = names[i];
    }
    /* Every key of the call is in one slot: the first names the node. A lookup that cannot be
     * sent is refused before the chain is packed and the command formatted. */
    c = conn_for(cl, names[0], lens[3]);
    if ((rc = conn_check(c)) < 0)
        goto done;
    rc = -ENOMEM;
    if (!(chain = malloc(nkeys ? nkeys * 8 : 1)))
        goto done;
    redis_map_pack_keys(keys, nkeys, chain);
    argv[argc - 1] = (const char *)chain;
    lens[argc - 1] = nkeys * 8;
    op = op_new(cl, OP_LOOKUP, &redis_map_lookup_script, nworkers, (int)argc, argv, lens);
done:
    if (nworkers > STACK_WORKERS) {
        free(argv);
        free(lens);
        free(names);
    }
    free(chain);
    if (!op)
        return refuse(cl, rc, cl->r->lookups);
    op->cb = cb;
    op->ud = ud;
    op->nworkers = (uint32_t)nworkers;
    if ((rc = submit(c, op)) < 0)
        return refuse(cl, rc, cl->r->lookups);
    *out = op;
    return 0;
}

/* The keys and the chain of a lookup's command as redisFormatCommandArgv wrote it ("*argc", then
 * "$len" and the bytes of each argument: EVALSHA sha numkeys key... chain), pointing into cmd.
 * 0, or -EINVAL when it is not a lookup of n keys. */
static int lookup_args(const char *cmd, size_t len, size_t n, const char **keys, size_t *key_lens,
                       const char **chain, size_t *chain_len)
{
    const char *end = cmd + len;
    char *next;
    if (len < 4 || cmd[0] != '*' || strtoul(cmd + 1, &next, 10) != n + 4)
        return -EINVAL;
    const char *p = next + 2;
    for (size_t i = 0; i < n + 4; i++) {
        if (p >= end || *p != '$')
            return -EINVAL;
        unsigned long alen = strtoul(p + 1, &next, 10);
        const char *arg = next + 2;
        if (arg > end || alen + 2 > (size_t)(end - arg))
            return -EINVAL;
        if (i >= 3 && i < 3 + n) {
            keys[i - 3] = arg;
            key_lens[i - 3] = alen;
        } else if (i == 3 + n) {
            *chain = arg;
            *chain_len = alen;
        }
        p = arg + alen + 2;
    }
    return 0;
}

/* A lookup was answered TRYAGAIN: its slot is being migrated, and Redis serves a command of
 * several keys during a migration only on a node that holds all of them. A lookup names every
 * candidate's key, some of which do not exist (workers that never held the chain), so it got
 * TRYAGAIN (after ASK) for as long as the migration lasted and every decision of the slot's
 * tenants fell back. Instead it is sent again as one lookup per key: the source serves a key it
 * still has, or redirects it (ASK) to the target, which serves a single key whether it exists
 * or not. The lookup ends with its last part (part_done). true: the parts own op now (it may
 * have ended already, when none could be sent); false: nothing was done. */
static bool lookup_split(kvg_redis_op *op)
{
    kvg_redis_client *cl = op->client;
    size_t n = op->nworkers;
    const char **keys = malloc(n * sizeof(*keys));
    size_t *key_lens = malloc(n * sizeof(*key_lens));
    const char *chain = NULL;
    size_t chain_len = 0;
    op->parts = calloc(n, sizeof(*op->parts));
    if (!keys || !key_lens || !op->parts ||
        lookup_args(op->cmd, op->cmd_len, n, keys, key_lens, &chain, &chain_len) < 0) {
        free(keys);
        free(key_lens);
        free(op->parts);
        op->parts = NULL;
        return false;
    }
    op->conn = NULL; /* its parts go where their keys are */
    op->parts_status = 0;
    op->parts_left = (uint32_t)n + 1; /* one more until every part is sent */
    for (size_t i = 0; i < n; i++) {
        const char *argv[5] = {NULL, NULL, NULL, keys[i], chain};
        size_t lens[5] = {0, 0, 0, key_lens[i], chain_len};
        kvg_redis_op *part = op_new(cl, OP_LOOKUP_PART, &redis_map_lookup_script, 1, 5, argv, lens);
        int rc = -ENOMEM;
        if (part) {
            part->parent = op;
            part->index = (uint32_t)i;
            part->nworkers = 1;
            rc = submit(conn_for(cl, keys[i], key_lens[i]), part); /* frees part on failure */
        }
        if (rc < 0) {
            count_drop(cl, rc);
            if (op->parts_status == 0)
                op->parts_status = rc;
            op->parts_left--;
        }
    }
    free(keys);
    free(key_lens);
    if (--op->parts_left == 0) { /* nothing was sent */
        op_finish(op, op->parts_status, NULL);
        op_free(op);
    }
    return true;
}

void kvg_redis_op_cancel(kvg_redis_op *op)
{
    if (op)
        op->cancelled = true;
}

void redis_lookup_timed_out(kvg_redis_op *op)
{
    if (!op || op->cancelled)
        return;
    op->cancelled = true;
    atomic_fetch_add_explicit(&op->client->r->lookups[REDIS_MAP_TIMEOUT], 1, memory_order_relaxed);
}

int kvg_map_record(kvg_redis_client *cl, uint64_t root, uint64_t map_id, uint32_t capacity,
                   const uint64_t *keys, size_t nkeys)
{
    if (nkeys == 0)
        return 0;
    if (capacity == 0 || nkeys > SIZE_MAX / 8)
        return -EINVAL;
    redis_topology *t = cl->conns_topo;
    kvg_redis_mode mode = t ? t->mode : KVG_REDIS_STANDALONE;
    char name[REDIS_MAP_KEY_MAX];
    size_t name_len = redis_map_key(name, cl->r->prefix, mode, root, map_id);
    /* A record that cannot be sent is refused before its command is built. */
    redis_conn *c = conn_for(cl, name, name_len);
    int rc = conn_check(c);
    if (rc < 0)
        return refuse(cl, rc, cl->r->records);
    unsigned char *chain = malloc(nkeys * 8);
    if (!chain)
        return refuse(cl, -ENOMEM, cl->r->records);
    redis_map_pack_keys(keys, nkeys, chain);
    char cap[20];
    const char *argv[7] = {NULL, NULL, NULL, name, cap, cl->ttl, (const char *)chain};
    size_t lens[7] = {0, 0, 0, name_len, kvg_fmt_u64(cap, capacity), cl->ttl_len, nkeys * 8};
    kvg_redis_op *op = op_new(cl, OP_RECORD, &redis_map_record_script, 1, 7, argv, lens);
    free(chain);
    if (!op)
        return refuse(cl, -ENOMEM, cl->r->records);
    rc = submit(c, op);
    return rc < 0 ? refuse(cl, rc, cl->r->records) : 0;
}
