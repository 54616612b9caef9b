/* SPDX-License-Identifier: Apache-2.0 */
/* KV-cache events in vLLM's wire format: the msgpack batch encoder and the ZeroMQ publisher
 * (PUB socket, ROUTER replay socket, replay buffer, idle heartbeats, injected drops, delays and
 * pauses). */
#include "simworker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/event_struct.h>
#include <msgpack.h>
#include <zmq.h>

/* ---- encoder -------------------------------------------------------------------------------- */

/* vLLM encodes its msgspec structs (vllm/distributed/kv_events.py) with array_like=True,
 * omit_defaults=True and, for events, tag=True: each event is an array whose first element is
 * the class name, then every field in declaration order. msgspec ignores omit_defaults for
 * array_like structs (msgspec issue #720), so fields at their default are written too. Since
 * vLLM PR #42892 (2026-06) the events (not the batch) drop array_like: a map whose first key is
 * "type" (the tag), then the fields in declaration order, where omit_defaults does leave out
 * the ones holding their default. msgpack-c, like msgspec, writes every
 * integer, string and array header in its smallest form and every float as a float64, so the bytes
 * match msgspec's. */

struct sim_kvev_enc {
    kvg_buf events; /* the encoded events, back to back */
    uint32_t n;
    bool map; /* SIM_KVEV_FORMAT_MAP */
    msgpack_packer pk;
};

static int buf_write(void *data, const char *buf, size_t len)
{
    kvg_buf *b = data;
    kvg_buf_append(b, buf, len);
    return b->failed ? -1 : 0;
}

const char *sim_kvev_format_str(sim_kvev_format f)
{
    static const char *const names[SIM_KVEV_FORMAT_COUNT] = {"array", "map"};
    return f < SIM_KVEV_FORMAT_COUNT ? names[f] : "?";
}

int sim_kvev_format_parse(const char *s, sim_kvev_format *out)
{
    for (int f = 0; f < SIM_KVEV_FORMAT_COUNT; f++)
        if (strcmp(s, sim_kvev_format_str((sim_kvev_format)f)) == 0) {
            *out = (sim_kvev_format)f;
            return 0;
        }
    return -EINVAL;
}

int sim_kvev_enc_new(sim_kvev_format format, sim_kvev_enc **out)
{
    sim_kvev_enc *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->map = format == SIM_KVEV_FORMAT_MAP;
    kvg_buf_init(&e->events);
    msgpack_packer_init(&e->pk, &e->events, buf_write);
    *out = e;
    return 0;
}

void sim_kvev_enc_free(sim_kvev_enc *e)
{
    if (!e)
        return;
    kvg_buf_done(&e->events);
    free(e);
}

uint32_t sim_kvev_enc_count(const sim_kvev_enc *e)
{
    return e->n;
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* An event of n entries, the tag included: an array, or a map whose "type" key is the tag. */
static void begin(sim_kvev_enc *e, uint32_t n, const char *tag)
{
    if (e->map) {
        msgpack_pack_map(&e->pk, n);
        pack_cstr(&e->pk, "type");
    } else {
        msgpack_pack_array(&e->pk, n);
    }
    pack_cstr(&e->pk, tag);
}

/* A field's name, in the map format only. */
static void key(sim_kvev_enc *e, const char *name)
{
    if (e->map)
        pack_cstr(&e->pk, name);
}

static int event_done(sim_kvev_enc *e)
{
    if (e->events.failed)
        return -ENOMEM;
    e->n++;
    return 0;
}

int sim_kvev_enc_stored(sim_kvev_enc *e, const uint64_t *hashes, size_t n, const uint64_t *parent,
                        const uint32_t *tokens, size_t n_tokens, uint32_t block_size)
{
    msgpack_packer *pk = &e->pk;
    /* "BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
     * lora_name; extra_keys, group_idx and the cache-spec fields keep their None default (in
     * the array form still written, in the map form left out). */
    begin(e, e->map ? 8 : 12, "BlockStored");
    key(e, "block_hashes");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, hashes[i]);
    key(e, "parent_block_hash");
    if (parent)
        msgpack_pack_uint64(pk, *parent);
    else
        msgpack_pack_nil(pk);
    key(e, "token_ids");
    msgpack_pack_array(pk, n_tokens);
    for (size_t i = 0; i < n_tokens; i++)
        msgpack_pack_uint32(pk, tokens[i]);
    key(e, "block_size");
    msgpack_pack_uint32(pk, block_size);
    key(e, "lora_id");
    msgpack_pack_nil(pk);
    key(e, "medium");
    pack_cstr(pk, SIM_KVEV_MEDIUM);
    key(e, "lora_name");
    msgpack_pack_nil(pk);
    if (!e->map) /* extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window */
        for (int i = 0; i < 4; i++)
            msgpack_pack_nil(pk);
    return event_done(e);
}

int sim_kvev_enc_removed(sim_kvev_enc *e, const uint64_t *hashes, size_t n)
{
    msgpack_packer *pk = &e->pk;
    begin(e, e->map ? 3 : 4, "BlockRemoved"); /* block_hashes, medium, group_idx */
    key(e, "block_hashes");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, hashes[i]);
    key(e, "medium");
    pack_cstr(pk, SIM_KVEV_MEDIUM);
    if (!e->map)
        msgpack_pack_nil(pk); /* group_idx */
    return event_done(e);
}

int sim_kvev_enc_cleared(sim_kvev_enc *e)
{
    begin(e, 1, "AllBlocksCleared");
    return event_done(e);
}

int sim_kvev_enc_finish(sim_kvev_enc *e, double ts, int64_t dp_rank, kvg_buf *out)
{
    int rc = 0;
    if (e->events.failed) {
        rc = -ENOMEM;
        goto done;
    }
    /* [ts, events, data_parallel_rank]: vLLM's publisher sets the rank (0 without data
     * parallelism) before encoding, so it is never the None default and always present. */
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, ts);
    msgpack_pack_array(&pk, e->n);
    if (e->events.len) /* an idle heartbeat has none (and no buffer yet) */
        kvg_buf_append(out, e->events.data, e->events.len);
    msgpack_pack_int64(&pk, dp_rank);
    if (out->failed)
        rc = -ENOMEM;
done:
    kvg_buf_reset(&e->events);
    e->events.failed = false;
    e->n = 0;
    return rc;
}

/* ---- publisher ------------------------------------------------------------------------------ */

#define RAND_DROP 0x6b766576u  /* sim_rand stream of the drop decisions */
#define REPLAY_MAX_REQUESTS 64 /* per wake-up, so one chatty client cannot starve the loop */

typedef struct entry {
    uint64_t seq;
    char *payload;
    size_t len;
    uint64_t due_ns;
    bool published; /* sent on PUB, or dropped there; only these are replayed */
} entry;

struct sim_kvev_pub {
    struct event_base *base;
    const sim_config *cfg;
    void *ctx;
    void *pub;
    void *replay;
    struct event pub_ev;
    struct event replay_ev;
    struct event flush_ev; /* end of the current loop turn: the engine step's batch */
    struct event delay_ev;
    struct event idle_ev; /* cfg->kv_events_heartbeat_ms: an empty batch when idle */
    uint64_t last_batch_ns;
    bool paused; /* sim_kvev_pub_pause: nothing goes out on PUB */
    uint64_t paused_batches;
    bool flush_pending;
    sim_kvev_enc *enc;
    entry *ring; /* replay buffer: the last cfg->kv_events_buffer batches */
    uint32_t cap, head, count;
    uint32_t unpublished; /* the oldest `unpublished` of the newest entries wait for their time */
    uint64_t next_seq;
    uint64_t dropped; /* for debugging; batches not sent on PUB */
    char endpoint[256];
    char replay_endpoint[256];
};

static void be64(uint64_t v, uint8_t out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (56 - 8 * i));
}

static entry *ring_at(sim_kvev_pub *p, uint32_t i)
{
    return &p->ring[(p->head + i) % p->cap];
}

/* libzmq attaches a new subscriber's pipe, and reads its subscriptions, only when the
 * application calls into the socket, and a send does so only every so often (it throttles
 * command processing). ZMQ_FD wakes us when commands wait and reading ZMQ_EVENTS processes
 * them, so the subscriber list is current when a batch goes out. */
static void process_commands(void *sock)
{
    int events = 0;
    size_t sz = sizeof(events);
    zmq_getsockopt(sock, ZMQ_EVENTS, &events, &sz);
}

static void send_pub(sim_kvev_pub *p, entry *en)
{
    en->published = true;
    const sim_config *cfg = p->cfg;
    if (p->paused) { /* lost on the way, as to a dead network; still replayable */
        p->paused_batches++;
        return;
    }
    if (cfg->kv_events_drop_rate > 0 &&
        sim_rand_unit(cfg->seed, RAND_DROP, en->seq) < cfg->kv_events_drop_rate) {
        p->dropped++;
        kvg_log_debug("simworker: kv events: batch %llu dropped", (unsigned long long)en->seq);
        return;
    }
    uint8_t seq[8];
    be64(en->seq, seq);
    const char *topic = cfg->kv_events_topic ? cfg->kv_events_topic : "";
    process_commands(p->pub);
    /* ZMQ_DONTWAIT: a PUB socket never blocks; past its high-water mark a slow subscriber
     * loses messages, which it sees as a sequence gap, as with vLLM. */
    if (zmq_send(p->pub, topic, strlen(topic), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, en->payload, en->len, ZMQ_DONTWAIT) < 0)
        kvg_log_debug("simworker: kv events: send failed: %s", zmq_strerror(zmq_errno()));
}

/* Send every batch whose time has come, oldest first; re-arm for the next one. */
static void pump(sim_kvev_pub *p)
{
    uint64_t now = kvg_now_ns();
    while (p->unpublished) {
        entry *en = ring_at(p, p->count - p->unpublished);
        if (en->due_ns > now) {
            uint64_t wait_us = (en->due_ns - now) / 1000u + 1; /* never early */
            struct timeval tv = {.tv_sec = (time_t)(wait_us / 1000000u),
                                 .tv_usec = (suseconds_t)(wait_us % 1000000u)};
            event_add(&p->delay_ev, &tv);
            return;
        }
        send_pub(p, en);
        p->unpublished--;
    }
}

static void on_delay(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    pump(arg);
}

/* The current batch (possibly empty: a heartbeat) numbered, buffered and sent when due. */
static void make_batch(sim_kvev_pub *p)
{
    p->last_batch_ns = kvg_now_ns();
    kvg_buf b;
    kvg_buf_init(&b);
    int rc = sim_kvev_enc_finish(p->enc, (double)kvg_wall_ns() / 1e9, 0, &b);
    if (rc < 0) {
        /* A lost batch must still be a gap the subscriber can see: burn its number. */
        kvg_log_error("simworker: kv events: batch %llu lost: %s", (unsigned long long)p->next_seq,
                      kvg_strerror(rc));
        p->next_seq++;
        kvg_buf_done(&b);
        return;
    }
    if (p->count == p->cap) {
        entry *old = ring_at(p, 0);
        if (!old->published) { /* a delay longer than the buffer: send it now */
            send_pub(p, old);
            p->unpublished--;
        }
        free(old->payload);
        p->head = (p->head + 1) % p->cap;
        p->count--;
    }
    entry *en = ring_at(p, p->count);
    en->seq = p->next_seq++;
    en->payload = kvg_buf_steal(&b, &en->len);
    en->due_ns = kvg_now_ns() + (uint64_t)p->cfg->kv_events_delay_ms * 1000000u;
    en->published = false;
    p->count++;
    p->unpublished++;
    kvg_buf_done(&b);
    pump(p);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    sim_kvev_pub *p = arg;
    (void)fd;
    (void)what;
    p->flush_pending = false;
    if (sim_kvev_enc_count(p->enc) != 0)
        make_batch(p);
}

static void arm_idle(sim_kvev_pub *p, uint64_t wait_ns)
{
    uint64_t us = wait_ns / 1000u + 1;
    struct timeval tv = {.tv_sec = (time_t)(us / 1000000u),
                         .tv_usec = (suseconds_t)(us % 1000000u)};
    event_add(&p->idle_ev, &tv);
}

/* vLLM's publisher with a snapshot endpoint (vllm/distributed/kv_events.py, ZmqEventPublisher
 * at vMaroon/vllm 08ee3e54) sends an empty KVEventBatch when a second passed without a batch:
 * numbered and buffered for replay like any other. Without one, and in released vLLM, an idle
 * engine sends nothing (heartbeat 0). */
static void on_idle(evutil_socket_t fd, short what, void *arg)
{
    sim_kvev_pub *p = arg;
    (void)fd;
    (void)what;
    uint64_t every = (uint64_t)p->cfg->kv_events_heartbeat_ms * 1000000u;
    uint64_t since = kvg_now_ns() - p->last_batch_ns;
    if (since < every) {
        arm_idle(p, every - since);
        return;
    }
    if (!p->flush_pending && sim_kvev_enc_count(p->enc) == 0)
        make_batch(p);
    arm_idle(p, every);
}

void sim_kvev_pub_pause(sim_kvev_pub *p, bool paused)
{
    if (p->paused != paused)
        kvg_log_info("simworker: kv events %s (next batch %llu)", paused ? "paused" : "resumed",
                     (unsigned long long)p->next_seq);
    p->paused = paused;
}

bool sim_kvev_pub_paused(const sim_kvev_pub *p, uint64_t *next_seq)
{
    if (next_seq)
        *next_seq = p->next_seq;
    return p->paused;
}

static void schedule_flush(sim_kvev_pub *p)
{
    if (!p->flush_pending) {
        p->flush_pending = true;
        event_active(&p->flush_ev, EV_TIMEOUT, 1);
    }
}

static void note(sim_kvev_pub *p, int rc)
{
    if (rc < 0)
        kvg_log_error("simworker: kv events: cannot encode an event: %s", kvg_strerror(rc));
    schedule_flush(p);
}

void sim_kvev_pub_stored(sim_kvev_pub *p, const uint64_t *hashes, size_t n, const uint64_t *parent,
                         const uint32_t *tokens, size_t n_tokens, uint32_t block_size)
{
    note(p, sim_kvev_enc_stored(p->enc, hashes, n, parent, tokens, n_tokens, block_size));
}

void sim_kvev_pub_removed(sim_kvev_pub *p, uint64_t hash)
{
    note(p, sim_kvev_enc_removed(p->enc, &hash, 1));
}

void sim_kvev_pub_cleared(sim_kvev_pub *p)
{
    note(p, sim_kvev_enc_cleared(p->enc));
}

/* ---- replay --------------------------------------------------------------------------------- */

/* A request is [identity, "", start seq (8 bytes, big-endian)] (REQ or DEALER with the empty
 * delimiter); the answer is every buffered batch from that number on as [identity, "", seq,
 * payload], then [identity, "", -1, ""], as vLLM's _service_replay. */
static void serve_request(sim_kvev_pub *p, zmq_msg_t *parts, int n)
{
    if (n != 3 || zmq_msg_size(&parts[1]) != 0 || zmq_msg_size(&parts[2]) != 8) {
        kvg_log_debug("simworker: kv events: invalid replay request (%d parts)", n);
        return;
    }
    const uint8_t *s = zmq_msg_data(&parts[2]);
    uint64_t start = 0;
    for (int i = 0; i < 8; i++)
        start = start << 8 | s[i];
    const void *id = zmq_msg_data(&parts[0]);
    size_t id_len = zmq_msg_size(&parts[0]);
    uint8_t seq[8];
    for (uint32_t i = 0; i < p->count; i++) {
        entry *en = ring_at(p, i);
        if (!en->published || en->seq < start)
            continue;
        be64(en->seq, seq);
        zmq_send(p->replay, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->replay, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(p->replay, en->payload, en->len, ZMQ_DONTWAIT);
    }
    be64(UINT64_MAX, seq); /* -1 as a signed 64-bit big-endian number */
    zmq_send(p->replay, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->replay, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(p->replay, "", 0, ZMQ_DONTWAIT);
}

/* ZMQ_FD is edge-triggered: after a wake-up, read until ZMQ_EVENTS says nothing is left
 * (sending on the socket can also consume the edge, so check again after each request). */
static void on_replay(evutil_socket_t fd, short what, void *arg)
{
    sim_kvev_pub *p = arg;
    (void)fd;
    (void)what;
    for (int req = 0; req < REPLAY_MAX_REQUESTS; req++) {
        int events = 0;
        size_t sz = sizeof(events);
        if (zmq_getsockopt(p->replay, ZMQ_EVENTS, &events, &sz) < 0 || !(events & ZMQ_POLLIN))
            return;
        zmq_msg_t parts[4];
        int n = 0;
        bool more = true;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, p->replay, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                break;
            }
            more = zmq_msg_more(&m);
            if (n < 4) {
                parts[n++] = m;
            } else {
                zmq_msg_close(&m);
                n = 5; /* too many parts: invalid, and only 4 to close */
            }
        }
        serve_request(p, parts, n);
        for (int i = 0; i < KVG_MIN(n, 4); i++)
            zmq_msg_close(&parts[i]);
    }
    /* More requests may be waiting, and no new edge will come for them: look again soon. */
    event_active(&p->replay_ev, EV_READ, 1);
}

static void on_pub(evutil_socket_t fd, short what, void *arg)
{
    sim_kvev_pub *p = arg;
    (void)fd;
    (void)what;
    process_commands(p->pub);
}

/* ---- life cycle ----------------------------------------------------------------------------- */

/* tcp://HOST:0 asks for any port; ZeroMQ spells that tcp://HOST:*. */
static int bind_endpoint(void *sock, const char *endpoint, char *last, size_t last_len)
{
    char ep[256];
    size_t n = strlen(endpoint);
    if (n >= sizeof(ep) - 1)
        return -ENAMETOOLONG;
    memcpy(ep, endpoint, n + 1);
    if (strncmp(ep, "tcp://", 6) == 0 && n >= 2 && strcmp(ep + n - 2, ":0") == 0)
        ep[n - 1] = '*';
    if (zmq_bind(sock, ep) < 0)
        return -zmq_errno();
    size_t sz = last_len;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &sz) < 0)
        return -zmq_errno();
    return 0;
}

static int write_endpoints(const char *path, const sim_kvev_pub *p)
{
    char tmp[4096];
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return -ENAMETOOLONG;
    FILE *f = fopen(tmp, "we");
    if (!f)
        return -errno;
    fprintf(f, "%s\n", p->endpoint);
    if (p->replay)
        fprintf(f, "%s\n", p->replay_endpoint);
    if (fclose(f) != 0 || rename(tmp, path) < 0) {
        int rc = -errno;
        unlink(tmp);
        return rc;
    }
    return 0;
}

int sim_kvev_pub_new(struct event_base *base, const sim_config *cfg, sim_kvev_pub **out)
{
    if (!cfg->kv_events_endpoint || cfg->kv_events_buffer == 0)
        return -EINVAL;
    int rc = -ENOMEM;
    sim_kvev_pub *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->base = base;
    p->cfg = cfg;
    p->cap = cfg->kv_events_buffer;
    p->ring = calloc(p->cap, sizeof(*p->ring));
    if (!p->ring)
        goto fail_p;
    rc = sim_kvev_enc_new((sim_kvev_format)cfg->kv_events_format, &p->enc);
    if (rc < 0)
        goto fail_ring;
    p->ctx = zmq_ctx_new();
    if (!p->ctx) {
        rc = -zmq_errno();
        goto fail_enc;
    }
    p->pub = zmq_socket(p->ctx, ZMQ_PUB);
    if (!p->pub) {
        rc = -zmq_errno();
        goto fail_ctx;
    }
    int linger = 0, hwm = 100000; /* vLLM's hwm */
    zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    rc = bind_endpoint(p->pub, cfg->kv_events_endpoint, p->endpoint, sizeof(p->endpoint));
    if (rc < 0) {
        kvg_log_error("simworker: cannot bind kv events endpoint %s: %s", cfg->kv_events_endpoint,
                      zmq_strerror(-rc));
        goto fail_pub;
    }
    int pfd;
    size_t pfd_sz = sizeof(pfd);
    if (zmq_getsockopt(p->pub, ZMQ_FD, &pfd, &pfd_sz) < 0) {
        rc = -zmq_errno();
        goto fail_pub;
    }
    event_assign(&p->pub_ev, base, pfd, EV_READ | EV_PERSIST, on_pub, p);
    event_add(&p->pub_ev, NULL);
    if (cfg->kv_events_replay_endpoint) {
        p->replay = zmq_socket(p->ctx, ZMQ_ROUTER);
        if (!p->replay) {
            rc = -zmq_errno();
            goto fail_pub;
        }
        /* A whole buffer answers one request: let it queue (a client that reads nothing
         * loses the rest past this mark, and sees no end marker). */
        int rhwm = (int)KVG_MIN((uint64_t)p->cap * 2 + 16, (uint64_t)INT32_MAX);
        zmq_setsockopt(p->replay, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_setsockopt(p->replay, ZMQ_SNDHWM, &rhwm, sizeof(rhwm));
        rc = bind_endpoint(p->replay, cfg->kv_events_replay_endpoint, p->replay_endpoint,
                           sizeof(p->replay_endpoint));
        if (rc < 0) {
            kvg_log_error("simworker: cannot bind kv events replay endpoint %s: %s",
                          cfg->kv_events_replay_endpoint, zmq_strerror(-rc));
            goto fail_replay;
        }
        int fd;
        size_t sz = sizeof(fd);
        if (zmq_getsockopt(p->replay, ZMQ_FD, &fd, &sz) < 0) {
            rc = -zmq_errno();
            goto fail_replay;
        }
        event_assign(&p->replay_ev, base, fd, EV_READ | EV_PERSIST, on_replay, p);
        event_add(&p->replay_ev, NULL);
    }
    event_assign(&p->flush_ev, base, -1, 0, on_flush, p);
    event_assign(&p->delay_ev, base, -1, 0, on_delay, p);
    event_assign(&p->idle_ev, base, -1, 0, on_idle, p);
    p->last_batch_ns = kvg_now_ns();
    if (cfg->kv_events_heartbeat_ms)
        arm_idle(p, (uint64_t)cfg->kv_events_heartbeat_ms * 1000000u);
    if (cfg->kv_events_port_file) {
        rc = write_endpoints(cfg->kv_events_port_file, p);
        if (rc < 0) {
            kvg_log_error("simworker: cannot write %s: %s", cfg->kv_events_port_file,
                          kvg_strerror(rc));
            goto fail_events;
        }
    }
    kvg_log_info("simworker: kv events on %s (replay %s, format %s, topic \"%s\", buffer %u, "
                 "drop %g, delay %u ms, heartbeat %u ms)",
                 p->endpoint, p->replay ? p->replay_endpoint : "off",
                 sim_kvev_format_str((sim_kvev_format)cfg->kv_events_format),
                 cfg->kv_events_topic ? cfg->kv_events_topic : "", p->cap, cfg->kv_events_drop_rate,
                 cfg->kv_events_delay_ms, cfg->kv_events_heartbeat_ms);
    *out = p;
    return 0;

fail_events:
    event_del(&p->idle_ev);
    if (p->replay)
        event_del(&p->replay_ev);
fail_replay:
    if (p->replay)
        zmq_close(p->replay);
fail_pub:
    if (event_initialized(&p->pub_ev))
        event_del(&p->pub_ev);
    zmq_close(p->pub);
fail_ctx:
    zmq_ctx_term(p->ctx);
fail_enc:
    sim_kvev_enc_free(p->enc);
fail_ring:
    free(p->ring);
fail_p:
    free(p);
    return rc;
}

const char *sim_kvev_pub_endpoint(const sim_kvev_pub *p, bool replay)
{
    return replay ? (p->replay ? p->replay_endpoint : NULL) : p->endpoint;
}

void sim_kvev_pub_free(sim_kvev_pub *p)
{
    if (!p)
        return;
    event_del(&p->flush_ev);
    event_del(&p->delay_ev);
    event_del(&p->idle_ev);
    event_del(&p->pub_ev);
    if (p->replay) {
        event_del(&p->replay_ev);
        zmq_close(p->replay);
    }
    zmq_close(p->pub);
    zmq_ctx_term(p->ctx);
    for (uint32_t i = 0; i < p->count; i++)
        free(ring_at(p, i)->payload);
    free(p->ring);
    sim_kvev_enc_free(p->enc);
    free(p);
}
