/* SPDX-License-Identifier: Apache-2.0 */
/* The KV-event consumer: a ZeroMQ SUB socket per worker publisher (and a DEALER for its replay
 * socket), polled by one thread; each batch decoded (router/kv_events.c) and applied to the
 * embedded index in sequence order. A gap is asked of the replay socket; an engine restart (its
 * sequence starts again) or a gap nobody can fill clears what the index holds for the worker.
 * A worker whose events stop (silence, or its publisher's connection lost) is marked stale and
 * the index told to fall back to the model for it until a batch arrives in order again. */
#include "kv_events.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "prom.h"

#define POLL_MS 100
#define REPLAY_WAIT_NS 1000000000ull /* a replay that does not end in 1 s is given up */
#define QUEUE_MAX 4096               /* live batches kept while a replay runs */
#define FRAMES_MAX 6
/* A publisher unreachable this long (never connected, or disconnected and not back) is stale:
 * libzmq reconnects every 100 ms, so a restarted publisher process or a blip is back within it. */
#define DISCONNECT_GRACE_NS 1000000000ull

/* What happened, for kvgate_kv_events_total{outcome}. */
enum {
    EV_BATCHES = 0, /* batches applied */
    EV_REPLAYED,    /* of them, from a replay socket */
    EV_GAPS,        /* sequence gaps seen */
    EV_LOST,        /* gaps no replay filled: the worker's entries cleared */
    EV_RESTARTS,    /* sequence numbers that went back: an engine restart, entries cleared */
    EV_INVALID,     /* batches or messages refused (malformed, unknown event) */
    EV_STORED,      /* block keys recorded from BlockStored */
    EV_REMOVED,     /* entries dropped by BlockRemoved */
    EV_CLEARED,     /* AllBlocksCleared applied */
    EV_DUPLICATES,  /* live batches a replay had already applied, skipped */
    EV_COUNT,
};

static const char *const ev_names[EV_COUNT] = {
    "batches", "replayed", "gaps",    "lost",    "restarts",
    "invalid", "stored",   "removed", "cleared", "duplicates",
};

typedef struct queued {
    int64_t seq;
    void *data;
    size_t len;
} queued;

typedef struct sub {
    uint64_t worker_id;
    uint32_t stale_ms; /* the definition's kv_events_stale_ms; 0: silence is never stale */
    char name[KVG_WORKER_NAME_MAX + 1];
    char *endpoint, *replay;
    void *sock, *dealer;
    void *monitor;    /* the SUB socket's connection events (a PAIR on inproc) */
    bool was_up;      /* connected once: a later connect is the publisher coming back */
    int64_t last_seq; /* -1: nothing applied yet */
    /* The first sequence number the last replay asked for (-1: none): a live batch numbered
     * from there up to last_seq was applied from the replay already (the replay socket is read
     * before the SUB socket in a turn, so the live copies of replayed batches can come after
     * its end marker). Such a batch is a duplicate, not an engine restart. */
    int64_t replay_from;
    bool replaying;
    uint64_t replay_deadline_ns;
    queued *queue;
    size_t nqueue;
    /* Staleness (the consumer thread's; the atomics are read by kvg_kv_consumer_worker under the
     * consumer's lock, which keeps the sub alive). */
    bool connected;
    bool heartbeats;        /* an empty batch seen: the publisher speaks when idle, so silence
                               means its events stopped */
    uint64_t down_since_ns; /* when it was last seen unconnected (the subscription's start) */
    uint64_t next_sync_ns;  /* when check_stale next asks the index for the worker's source */
    _Atomic uint64_t last_batch_ns; /* a live batch received (applied or not); 0: none yet */
    _Atomic int64_t seq_view;       /* last_seq, for readers */
    _Atomic int state;              /* kvg_kv_state */
} sub;

struct kvg_kv_consumer {
    kvg_registry *reg;
    kvg_router *rt;
    void *zctx;
    pthread_t tid;
    _Atomic bool stop;
    /* The consumer thread changes the array (reconcile) under lock; readers take lock. */
    pthread_mutex_t lock;
    sub **subs;
    size_t nsubs;
    uint64_t seen_generation;
    kvg_kv_decoder *dec;
    _Atomic uint64_t counts[EV_COUNT];
    _Atomic uint64_t subscribed;
    _Atomic uint64_t transitions[KVG_KV_STATE_COUNT]; /* into each state */
};

static const char *const state_names[KVG_KV_STATE_COUNT] = {
    [KVG_KV_OFF] = "off",
    [KVG_KV_CONNECTING] = "connecting",
    [KVG_KV_EVENTS] = "events",
    [KVG_KV_STALE] = "stale",
};

const char *kvg_kv_state_name(kvg_kv_state st)
{
    return (unsigned)st < KVG_KV_STATE_COUNT ? state_names[st] : "?";
}

static void count(kvg_kv_consumer *c, int what, uint64_t n)
{
    atomic_fetch_add_explicit(&c->counts[what], n, memory_order_relaxed);
}

static void drop_queue(sub *s)
{
    for (size_t i = 0; i < s->nqueue; i++)
        free(s->queue[i].data);
    free(s->queue);
    s->queue = NULL;
    s->nqueue = 0;
}

static void sub_free(sub *s)
{
    if (!s)
        return;
    if (s->monitor)
        zmq_close(s->monitor);
    if (s->sock)
        zmq_close(s->sock);
    if (s->dealer)
        zmq_close(s->dealer);
    drop_queue(s);
    free(s->endpoint);
    free(s->replay);
    free(s);
}

/* The index learns a worker's entries from its events only while they flow; connecting, stale
 * or with its publisher gone (before the grace makes it stale: no speculative entries for a
 * process that died, which a restarted engine could find standing), it falls back to the model. Set
 * at each change, and asked again every second (set when it differs): a worker that leaves the
 * index and comes back starts at the model. */
static void sync_source(kvg_kv_consumer *c, sub *s)
{
    kvg_index_source want =
        s->connected && atomic_load_explicit(&s->state, memory_order_relaxed) == KVG_KV_EVENTS
            ? KVG_INDEX_SOURCE_EVENTS
            : KVG_INDEX_SOURCE_EVENTS_STALE;
    kvg_prefix_index *idx = kvg_router_index(c->rt);
    if (kvg_index_get_source(idx, s->worker_id) != want)
        kvg_index_set_source(idx, s->worker_id, want);
}

static void set_state(kvg_kv_consumer *c, sub *s, kvg_kv_state st, const char *why)
{
    kvg_kv_state was = (kvg_kv_state)atomic_load_explicit(&s->state, memory_order_relaxed);
    /* Called for every batch applied: the index is told at a change only (and re-asserted by
     * check_stale every second), not asked under its lock per batch. */
    if (was != st) {
        atomic_store_explicit(&s->state, st, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->transitions[st], 1, memory_order_relaxed);
        if (st == KVG_KV_STALE)
            kvg_log_warn("KV events of worker %s: stale (%s); routed by the model until they "
                         "flow again",
                         s->name, why);
        else
            kvg_log_info("KV events of worker %s: %s (%s)", s->name, kvg_kv_state_name(st), why);
        sync_source(c, s);
    }
}

static sub *sub_open(kvg_kv_consumer *c, kvg_worker *w)
{
    sub *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->worker_id = kvg_worker_id(w);
    s->stale_ms = kvg_worker_kv_events_stale_ms(w);
    s->down_since_ns = kvg_now_ns();
    atomic_init(&s->last_batch_ns, 0);
    atomic_init(&s->seq_view, -1);
    atomic_init(&s->state, KVG_KV_CONNECTING);
    snprintf(s->name, sizeof(s->name), "%s", kvg_worker_name(w));
    s->last_seq = s->replay_from = -1;
    s->endpoint = strdup(kvg_worker_kv_events(w));
    const char *replay = kvg_worker_kv_events_replay(w);
    s->replay = replay ? strdup(replay) : NULL;
    if (!s->endpoint || (replay && !s->replay))
        goto fail;
    int zero = 0;
    s->sock = zmq_socket(c->zctx, ZMQ_SUB);
    if (!s->sock || zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, "", 0) != 0)
        goto fail;
    /* A publisher that comes back may be a restarted engine whose first batches (sequence 0,
     * 1, ...) were sent before the subscription reached it: the numbers alone would not tell.
     * Its connection events do. The monitor is read before the SUB socket connects: libzmq
     * drops the events its monitor sends while no reader is attached, and a first CONNECTED
     * lost would leave a reachable publisher looking unreachable (stale). */
    char mon[64];
    static _Atomic unsigned monitors;
    snprintf(mon, sizeof(mon), "inproc://kvg-kv-events-%u", atomic_fetch_add(&monitors, 1));
    if (zmq_socket_monitor(s->sock, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0)
        goto fail;
    s->monitor = zmq_socket(c->zctx, ZMQ_PAIR);
    if (!s->monitor || zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_connect(s->monitor, mon) != 0 || zmq_connect(s->sock, s->endpoint) != 0)
        goto fail;
    if (s->replay) {
        s->dealer = zmq_socket(c->zctx, ZMQ_DEALER);
        if (!s->dealer || zmq_setsockopt(s->dealer, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
            zmq_connect(s->dealer, s->replay) != 0)
            goto fail;
    }
    kvg_log_info("KV events of worker %s: subscribed to %s%s%s", s->name, s->endpoint,
                 s->replay ? ", replay " : "", s->replay ? s->replay : "");
    sync_source(c, s); /* connecting: the model until the first batch */
    return s;
fail:
    kvg_log_error("KV events of worker %s: cannot subscribe to %s: %s", s->name,
                  s->endpoint ? s->endpoint : "?", zmq_strerror(zmq_errno()));
    sub_free(s);
    return NULL;
}

/* The subscriptions follow the workers: one per worker that names a publisher, made anew when
 * a worker's definition changes (its id changes with it). */
static void reconcile(kvg_kv_consumer *c)
{
    kvg_worker_set *set = kvg_registry_acquire(c->reg);
    kvg_router_sync_workers(c->rt, set);
    size_t n = kvg_worker_set_count(set);
    sub **next = calloc(n ? n : 1, sizeof(*next));
    if (!next) {
        kvg_worker_set_unref(set);
        return; /* the next generation check tries again */
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        kvg_worker *w = kvg_worker_set_at(set, i);
        if (!kvg_worker_kv_events(w))
            continue;
        uint64_t id = kvg_worker_id(w);
        bool kept = false;
        for (size_t k = 0; k < c->nsubs; k++) {
            if (c->subs[k] && c->subs[k]->worker_id == id) {
                next[m++] = c->subs[k];
                c->subs[k] = NULL; /* moved */
                kept = true;
                break;
            }
        }
        if (!kept && (next[m] = sub_open(c, w)) != NULL)
            m++;
    }
    pthread_mutex_lock(&c->lock);
    sub **old = c->subs;
    size_t nold = c->nsubs;
    c->subs = next;
    c->nsubs = m;
    pthread_mutex_unlock(&c->lock);
    for (size_t k = 0; k < nold; k++)
        sub_free(old[k]);
    free(old);
    atomic_store_explicit(&c->subscribed, m, memory_order_relaxed);
    c->seen_generation = kvg_worker_set_generation(set);
    kvg_worker_set_unref(set);
}

static int64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return (int64_t)v;
}

static void clear_worker(kvg_kv_consumer *c, sub *s)
{
    kvg_index_clear_worker(kvg_router_index(c->rt), s->worker_id);
}

static void apply(kvg_kv_consumer *c, sub *s, int64_t seq, const void *data, size_t len,
                  bool replayed)
{
    s->last_seq = seq;
    atomic_store_explicit(&s->seq_view, seq, memory_order_relaxed);
    kvg_kv_batch b;
    if (kvg_kv_decode(c->dec, data, len, &b) < 0) {
        count(c, EV_INVALID, 1);
        kvg_log_warn("KV events of worker %s: batch %lld refused: %s", s->name, (long long)seq,
                     kvg_kv_decoder_error(c->dec));
        return;
    }
    kvg_index_apply_stats st = {0};
    if (kvg_index_apply_events(kvg_router_index(c->rt), s->worker_id, &b, &st) < 0) {
        count(c, EV_INVALID, 1);
        return;
    }
    count(c, EV_BATCHES, 1);
    if (b.nevents == 0)
        s->heartbeats = true; /* vLLM publishes a batch with events only, or an idle one */
    set_state(c, s, KVG_KV_EVENTS, "batches in order");
    if (replayed)
        count(c, EV_REPLAYED, 1);
    count(c, EV_STORED, st.stored);
    count(c, EV_REMOVED, st.removed);
    count(c, EV_CLEARED, st.cleared);
}

/* Ask the replay socket for what follows the last batch applied, keeping (seq, data) - the
 * batch that showed the gap - aside. False when it could not be asked (nothing kept). */
static bool start_replay(sub *s, int64_t seq, const void *data, size_t len)
{
    unsigned char start[8];
    uint64_t v = (uint64_t)(s->last_seq + 1);
    for (int i = 7; i >= 0; i--, v >>= 8)
        start[i] = (unsigned char)v;
    queued *q = malloc(sizeof(*q));
    void *copy = malloc(len ? len : 1);
    if (!q || !copy || zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->dealer, start, sizeof(start), ZMQ_DONTWAIT) < 0) {
        free(q);
        free(copy);
        return false;
    }
    memcpy(copy, data, len);
    q[0] = (queued){seq, copy, len};
    s->replay_from = s->last_seq + 1;
    s->queue = q;
    s->nqueue = 1;
    s->replaying = true;
    s->replay_deadline_ns = kvg_now_ns() + REPLAY_WAIT_NS;
    return true;
}

/* The live batches kept during a replay, in order; one that does not follow is a gap no one
 * fills any more: the worker's entries go, and the stream is taken up from there. */
static void drain_queue(kvg_kv_consumer *c, sub *s)
{
    for (size_t i = 0; i < s->nqueue; i++) {
        queued *q = &s->queue[i];
        if (q->seq <= s->last_seq)
            continue;
        if (q->seq != s->last_seq + 1) {
            count(c, EV_LOST, 1);
            clear_worker(c, s);
        }
        apply(c, s, q->seq, q->data, q->len, false);
    }
    drop_queue(s);
}

static void end_replay(kvg_kv_consumer *c, sub *s)
{
    s->replaying = false;
    drain_queue(c, s);
}

/* A batch from the publisher. */
static void on_live(kvg_kv_consumer *c, sub *s, int64_t seq, const void *data, size_t len)
{
    atomic_store_explicit(&s->last_batch_ns, kvg_now_ns(), memory_order_relaxed);
    if (s->replaying) {
        if (s->nqueue == QUEUE_MAX) { /* the replay is too slow: give it up */
            end_replay(c, s);
        } else {
            queued *nq = realloc(s->queue, (s->nqueue + 1) * sizeof(*nq));
            void *copy = malloc(len ? len : 1);
            if (!nq || !copy) {
                free(copy);
                if (nq)
                    s->queue = nq;
                end_replay(c, s);
            } else {
                s->queue = nq;
                memcpy(copy, data, len);
                s->queue[s->nqueue++] = (queued){seq, copy, len};
                return;
            }
        }
    }
    if (s->replay_from >= 0 && seq >= s->replay_from && seq <= s->last_seq) {
        count(c, EV_DUPLICATES, 1);
        return;
    }
    if (s->last_seq >= 0 && seq <= s->last_seq) {
        /* Numbers start again: the engine restarted, and its cache with it. */
        count(c, EV_RESTARTS, 1);
        clear_worker(c, s);
        s->replay_from = -1;
    } else if (s->last_seq >= 0 && seq > s->last_seq + 1) {
        count(c, EV_GAPS, 1);
        if (s->dealer && start_replay(s, seq, data, len))
            return;
        count(c, EV_LOST, 1); /* no replay socket, or it could not be asked */
        clear_worker(c, s);
    }
    apply(c, s, seq, data, len, false);
}

/* A message of the replay socket: a buffered batch, or the end (sequence -1). */
static void on_replay(kvg_kv_consumer *c, sub *s, int64_t seq, const void *data, size_t len)
{
    if (!s->replaying)
        return; /* late: a replay given up */
    if (seq == -1) {
        end_replay(c, s);
        return;
    }
    if (seq <= s->last_seq)
        return;
    if (seq != s->last_seq + 1) { /* the publisher no longer has what was missed */
        count(c, EV_LOST, 1);
        clear_worker(c, s);
    }
    apply(c, s, seq, data, len, true);
}

static void read_all(kvg_kv_consumer *c, sub *s, void *sock, bool replay);

/* The SUB socket's connection events. A disconnect clears the worker's entries at once: the
 * engine's process may be gone with its cache, and a restarted engine can be back in rotation
 * (its health check passing) before libzmq's next reconnect tells us, so waiting for the
 * reconnect would route requests to blocks it no longer has (bench/acceptance --restart-worker
 * saw 4 such answers once). The publisher connected again after a disconnect is taken as an
 * engine restart: cleared again (what was recorded meanwhile was a guess about a dead
 * process) and its numbering starts afresh. A network blip costs the worker's entries too: the
 * index then knows less than the engine, never more. */
static void read_monitor(kvg_kv_consumer *c, sub *s)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, s->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t what = 0;
        if (zmq_msg_size(&ev) >= 2)
            memcpy(&what, zmq_msg_data(&ev), sizeof(what));
        bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) { /* the endpoint frame */
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, s->monitor, 0);
            zmq_msg_close(&addr);
        }
        if (what == ZMQ_EVENT_DISCONNECTED) {
            /* What the publisher sent before it went is still queued on the SUB socket: taken
             * first, so that the clear comes after it (not the dead process's last batches
             * after the clear). */
            read_all(c, s, s->sock, false);
            s->connected = false;
            s->down_since_ns = kvg_now_ns();
            clear_worker(c, s);
            sync_source(c, s);
            kvg_log_info("KV events of worker %s: publisher gone; its entries cleared", s->name);
            continue;
        }
        if (what != ZMQ_EVENT_CONNECTED)
            continue;
        s->connected = true;
        if (s->was_up) {
            count(c, EV_RESTARTS, 1);
            clear_worker(c, s);
            s->last_seq = s->replay_from = -1;
            atomic_store_explicit(&s->seq_view, -1, memory_order_relaxed);
            s->replaying = false;
            drop_queue(s);
            kvg_log_info("KV events of worker %s: publisher back; its entries cleared", s->name);
        }
        s->was_up = true;
        sync_source(c, s);
    }
}

/* Read every message waiting on sock (edge-triggered like its poll: drain it). Frames: the
 * payload last, the 8-byte sequence number before it (topic and, in newer vLLM, a publisher
 * identity ahead of them; a DEALER sees an empty delimiter first). */
static void read_all(kvg_kv_consumer *c, sub *s, void *sock, bool replay)
{
    for (;;) {
        zmq_msg_t frames[FRAMES_MAX];
        int n = 0;
        bool more = true, ok = true;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(&m);
                if (n == 0)
                    return; /* nothing waiting */
                ok = false;
                break;
            }
            more = zmq_msg_more(&m);
            if (n == FRAMES_MAX) {
                zmq_msg_close(&m);
                ok = false;
                continue;
            }
            frames[n++] = m;
        }
        if (ok && n >= 2 && zmq_msg_size(&frames[n - 2]) == 8) {
            int64_t seq = be64(zmq_msg_data(&frames[n - 2]));
            const void *data = zmq_msg_data(&frames[n - 1]);
            size_t len = zmq_msg_size(&frames[n - 1]);
            if (replay)
                on_replay(c, s, seq, data, len);
            else if (seq >= 0)
                on_live(c, s, seq, data, len);
            else
                count(c, EV_INVALID, 1);
        } else {
            count(c, EV_INVALID, 1);
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&frames[i]);
    }
}

/* The staleness rule, every turn: a publisher unreachable for longer than the grace, or one
 * known to speak when idle (heartbeats) silent for the worker's kv_events_stale_ms, is stale.
 * Back to events is apply's: a batch applied in order. */
static void check_stale(kvg_kv_consumer *c, sub *s, uint64_t now)
{
    if (atomic_load_explicit(&s->state, memory_order_relaxed) != KVG_KV_STALE) {
        uint64_t last = atomic_load_explicit(&s->last_batch_ns, memory_order_relaxed);
        char why[96];
        if (!s->connected && now - s->down_since_ns >= DISCONNECT_GRACE_NS) {
            set_state(c, s, KVG_KV_STALE,
                      s->was_up ? "publisher disconnected" : "publisher unreachable");
        } else if (s->stale_ms && s->heartbeats && last &&
                   now - last >= (uint64_t)s->stale_ms * 1000000u) {
            snprintf(why, sizeof(why), "no batch for %u ms", (unsigned)s->stale_ms);
            set_state(c, s, KVG_KV_STALE, why);
        }
    }
    /* Not every turn: under a stream of batches a turn is one batch, and this takes the
     * index's lock. */
    if (now >= s->next_sync_ns) {
        sync_source(c, s);
        s->next_sync_ns = now + 1000000000ull;
    }
}

static void *consumer_main(void *arg)
{
    kvg_kv_consumer *c = arg;
    zmq_pollitem_t *items = NULL;
    size_t cap = 0;
    while (!atomic_load_explicit(&c->stop, memory_order_relaxed)) {
        if (kvg_registry_generation(c->reg) != c->seen_generation)
            reconcile(c);
        size_t want = 3 * c->nsubs;
        if (want > cap) {
            zmq_pollitem_t *ni = realloc(items, want * sizeof(*ni));
            if (!ni) {
                zmq_poll(NULL, 0, POLL_MS);
                continue;
            }
            items = ni;
            cap = want;
        }
        size_t n = 0;
        for (size_t i = 0; i < c->nsubs; i++) {
            sub *s = c->subs[i];
            items[n++] = (zmq_pollitem_t){.socket = s->sock, .events = ZMQ_POLLIN};
            items[n++] = (zmq_pollitem_t){.socket = s->monitor, .events = ZMQ_POLLIN};
            if (s->dealer)
                items[n++] = (zmq_pollitem_t){.socket = s->dealer, .events = ZMQ_POLLIN};
        }
        if (zmq_poll(n ? items : NULL, (int)n, POLL_MS) < 0 && zmq_errno() != EINTR)
            break;
        /* Every socket is read whether poll flagged it or not: a SUB socket must be called
         * into for libzmq to re-subscribe after its publisher restarts. */
        uint64_t now = kvg_now_ns();
        for (size_t i = 0; i < c->nsubs; i++) {
            sub *s = c->subs[i];
            read_monitor(c, s);
            if (s->dealer)
                read_all(c, s, s->dealer, true);
            read_all(c, s, s->sock, false);
            if (s->replaying && now > s->replay_deadline_ns) {
                /* No end from the replay socket: what was missed is lost; the stream is taken
                 * up from the first batch kept meanwhile. */
                count(c, EV_LOST, 1);
                clear_worker(c, s);
                if (s->nqueue)
                    s->last_seq = s->queue[0].seq - 1;
                end_replay(c, s);
            }
            check_stale(c, s, kvg_now_ns());
        }
        /* The decisions' speculative entries whose TTL passed and no BlockStored confirmed. */
        kvg_index_expire(kvg_router_index(c->rt), 0);
    }
    free(items);
    return NULL;
}

int kvg_kv_consumer_start(kvg_registry *reg, kvg_router *rt, kvg_kv_consumer **out)
{
    *out = NULL;
    kvg_kv_consumer *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->reg = reg;
    c->rt = rt;
    pthread_mutex_init(&c->lock, NULL);
    int rc = kvg_kv_decoder_new(NULL, &c->dec);
    if (rc < 0) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return rc;
    }
    c->zctx = zmq_ctx_new();
    if (!c->zctx) {
        kvg_kv_decoder_free(c->dec);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return -ENOMEM;
    }
    rc = pthread_create(&c->tid, NULL, consumer_main, c);
    if (rc != 0) {
        zmq_ctx_term(c->zctx);
        kvg_kv_decoder_free(c->dec);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return -rc;
    }
    *out = c;
    return 0;
}

void kvg_kv_consumer_stop(kvg_kv_consumer *c)
{
    if (!c)
        return;
    atomic_store(&c->stop, true);
    pthread_join(c->tid, NULL);
    for (size_t i = 0; i < c->nsubs; i++)
        sub_free(c->subs[i]);
    free(c->subs);
    zmq_ctx_term(c->zctx);
    kvg_kv_decoder_free(c->dec);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void kvg_kv_consumer_write_metrics(kvg_buf *out, void *arg)
{
    kvg_kv_consumer *c = arg;
    kvg_prom_put_header(out, "kvgate_kv_events_total", KVG_PROM_COUNTER,
                        "The engines' KV-cache events (workers with kv_events): batches applied, "
                        "of them replayed, sequence gaps, gaps no replay filled (the worker's "
                        "index entries cleared), engine restarts (cleared), batches refused, "
                        "block keys stored, entries removed, caches cleared.");
    for (int i = 0; i < EV_COUNT; i++)
        kvg_prom_put_u64(out, "kvgate_kv_events_total", KVG_PROM_LABELS({"outcome", ev_names[i]}),
                         atomic_load_explicit(&c->counts[i], memory_order_relaxed));
    kvg_prom_put_scalar_u64(out, "kvgate_kv_events_subscriptions", KVG_PROM_GAUGE,
                            "Workers whose KV-event publisher this gateway subscribes to.",
                            atomic_load_explicit(&c->subscribed, memory_order_relaxed));
    kvg_prom_put_header(out, "kvgate_kv_events_transitions_total", KVG_PROM_COUNTER,
                        "Workers with kv_events entering a state: events (batches applied in "
                        "order; the index learns from them) or stale (silent or unreachable; the "
                        "index falls back to the model for the worker).");
    for (int st = KVG_KV_EVENTS; st <= KVG_KV_STALE; st++)
        kvg_prom_put_u64(out, "kvgate_kv_events_transitions_total",
                         KVG_PROM_LABELS({"to", state_names[st]}),
                         atomic_load_explicit(&c->transitions[st], memory_order_relaxed));
    kvg_prom_put_header(out, "kvgate_kv_events_worker_state", KVG_PROM_GAUGE,
                        "1 for the state each worker with kv_events is in (connecting: no batch "
                        "yet; events; stale), 0 for the others.");
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nsubs; i++) {
        const sub *s = c->subs[i];
        int cur = atomic_load_explicit(&s->state, memory_order_relaxed);
        for (int st = KVG_KV_CONNECTING; st <= KVG_KV_STALE; st++)
            kvg_prom_put_u64(out, "kvgate_kv_events_worker_state",
                             KVG_PROM_LABELS({"worker", s->name}, {"state", state_names[st]}),
                             cur == st);
    }
    pthread_mutex_unlock(&c->lock);
}

kvg_kv_state kvg_kv_consumer_worker(kvg_kv_consumer *c, uint64_t worker_id, kvg_kv_worker_view *out)
{
    *out = (kvg_kv_worker_view){.state = KVG_KV_OFF, .sequence = -1};
    if (!c)
        return KVG_KV_OFF;
    uint64_t now = kvg_now_ns();
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nsubs; i++) {
        const sub *s = c->subs[i];
        if (s->worker_id != worker_id)
            continue;
        out->state = (kvg_kv_state)atomic_load_explicit(&s->state, memory_order_relaxed);
        out->sequence = atomic_load_explicit(&s->seq_view, memory_order_relaxed);
        uint64_t last = atomic_load_explicit(&s->last_batch_ns, memory_order_relaxed);
        out->has_batch = last != 0;
        out->last_batch_age_ms = last && now > last ? (now - last) / 1000000u : 0;
        break;
    }
    pthread_mutex_unlock(&c->lock);
    return out->state;
}

void kvg_kv_consumer_write_worker(kvg_buf *out, const kvg_worker *w, void *arg)
{
    kvg_kv_consumer *c = arg;
    kvg_kv_worker_view v;
    kvg_kv_consumer_worker(c, kvg_worker_id(w), &v);
    /* Defined a moment ago: the consumer subscribes on its next turn (100 ms at most). */
    if (v.state == KVG_KV_OFF && kvg_worker_kv_events(w))
        v.state = KVG_KV_CONNECTING;
    kvg_kv_state st = v.state;
    kvg_index_source src = kvg_index_get_source(kvg_router_index(c->rt), kvg_worker_id(w));
    kvg_buf_printf(out, ",\"kv_events_status\":{\"state\":\"%s\",\"index_source\":\"%s\"",
                   kvg_kv_state_name(st), kvg_index_source_name(src));
    if (st != KVG_KV_OFF) {
        kvg_buf_puts(out, ",\"last_batch_age_ms\":");
        if (v.has_batch)
            kvg_buf_printf(out, "%llu", (unsigned long long)v.last_batch_age_ms);
        else
            kvg_buf_puts(out, "null");
        kvg_buf_printf(out, ",\"sequence\":%lld", (long long)v.sequence);
    }
    kvg_buf_putc(out, '}');
}
