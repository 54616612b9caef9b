/* SPDX-License-Identifier: Apache-2.0 */
/* The simulated worker's KV-event publisher on a real event loop and real ZeroMQ sockets: the
 * idle heartbeats (empty batches, as vLLM's publisher with a snapshot endpoint sends them) and
 * the pause that loses the live stream but keeps the replay buffer. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <zmq.h>

#include "simworker.h"

#define MAX_GOT 256

typedef struct got {
    int64_t seq[MAX_GOT];
    bool empty[MAX_GOT]; /* the payload is vLLM's empty batch: [ts, [], 0] */
    size_t n;
} got;

typedef struct rig {
    struct event_base *base;
    sim_config cfg;
    sim_kvev_pub *pub;
    void *ctx, *sub;
} rig;

static void run_ms(rig *r, int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    event_base_loopexit(r->base, &tv);
    event_base_dispatch(r->base);
}

static int64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return (int64_t)v;
}

/* msgspec's encoding of KVEventBatch(ts, [], data_parallel_rank=0) with array_like: fixarray 3,
 * float64 (0xcb + 8 bytes), fixarray 0, positive fixint 0. */
static bool is_empty_batch(const unsigned char *p, size_t len)
{
    return len == 12 && p[0] == 0x93 && p[1] == 0xcb && p[10] == 0x90 && p[11] == 0x00;
}

/* Every message waiting on sock: [topic or "", seq, payload] (replay: ["", seq, payload]). */
static void drain(void *sock, got *g)
{
    for (;;) {
        zmq_msg_t parts[3];
        int n = 0;
        bool more = true;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, sock, n ? 0 : ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                assert_int_equal(n, 0);
                return;
            }
            more = zmq_msg_more(&m);
            assert_true(n < 3);
            parts[n++] = m;
        }
        assert_int_equal(n, 3);
        assert_int_equal(zmq_msg_size(&parts[1]), 8);
        assert_true(g->n < MAX_GOT);
        g->seq[g->n] = be64(zmq_msg_data(&parts[1]));
        g->empty[g->n] = is_empty_batch(zmq_msg_data(&parts[2]), zmq_msg_size(&parts[2]));
        g->n++;
        for (int i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
    }
}

static void rig_up(rig *r, uint32_t heartbeat_ms)
{
    memset(r, 0, sizeof(*r));
    sim_config_defaults(&r->cfg);
    r->cfg.kv_events_endpoint = "tcp://127.0.0.1:0";
    r->cfg.kv_events_replay_endpoint = "tcp://127.0.0.1:0";
    r->cfg.kv_events_heartbeat_ms = heartbeat_ms;
    r->base = event_base_new();
    assert_non_null(r->base);
    assert_int_equal(sim_kvev_pub_new(r->base, &r->cfg, &r->pub), 0);
    r->ctx = zmq_ctx_new();
    r->sub = zmq_socket(r->ctx, ZMQ_SUB);
    int zero = 0;
    zmq_setsockopt(r->sub, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_setsockopt(r->sub, ZMQ_SUBSCRIBE, "", 0), 0);
    assert_int_equal(zmq_connect(r->sub, sim_kvev_pub_endpoint(r->pub, false)), 0);
}

static void rig_down(rig *r)
{
    zmq_close(r->sub);
    zmq_ctx_term(r->ctx);
    sim_kvev_pub_free(r->pub);
    event_base_free(r->base);
}

static void test_idle_heartbeats(void **state)
{
    (void)state;
    rig r;
    rig_up(&r, 50);
    got g = {0};
    run_ms(&r, 150); /* the subscription reaches the PUB socket */
    drain(r.sub, &g);
    g.n = 0;
    run_ms(&r, 400);
    drain(r.sub, &g);
    /* 400 ms at one per 50 ms: 8, give or take a turn of a loaded machine; never more than 9. */
    assert_true(g.n >= 4);
    assert_true(g.n <= 9);
    for (size_t i = 0; i < g.n; i++) {
        assert_true(g.empty[i]);
        if (i)
            assert_int_equal(g.seq[i], g.seq[i - 1] + 1); /* numbered like any batch */
    }
    rig_down(&r);
}

static void test_no_heartbeats_by_default(void **state)
{
    (void)state;
    sim_config cfg;
    sim_config_defaults(&cfg);
    assert_int_equal(cfg.kv_events_heartbeat_ms, 0); /* released vLLM: nothing when idle */
    rig r;
    rig_up(&r, 0);
    got g = {0};
    run_ms(&r, 400);
    drain(r.sub, &g);
    assert_int_equal(g.n, 0);
    rig_down(&r);
}

static void test_pause_loses_live_keeps_replay(void **state)
{
    (void)state;
    rig r;
    rig_up(&r, 30);
    got g = {0};
    run_ms(&r, 250);
    drain(r.sub, &g);
    assert_true(g.n >= 2);
    int64_t last = g.seq[g.n - 1];

    uint64_t next = 0;
    assert_false(sim_kvev_pub_paused(r.pub, &next));
    sim_kvev_pub_pause(r.pub, true);
    assert_true(sim_kvev_pub_paused(r.pub, &next));
    assert_int_equal((int64_t)next, last + 1);
    g.n = 0;
    run_ms(&r, 250);
    drain(r.sub, &g);
    assert_int_equal(g.n, 0); /* nothing live while paused */
    uint64_t after = 0;
    sim_kvev_pub_paused(r.pub, &after);
    assert_true(after >= next + 3); /* but heartbeats were made and numbered */

    sim_kvev_pub_pause(r.pub, false);
    assert_false(sim_kvev_pub_paused(r.pub, NULL));
    run_ms(&r, 150);
    drain(r.sub, &g);
    assert_true(g.n >= 1);
    assert_true(g.seq[0] >= (int64_t)after); /* a gap: what was made meanwhile never came */

    /* The replay socket has them: ask from the first one missed. */
    void *dealer = zmq_socket(r.ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_connect(dealer, sim_kvev_pub_endpoint(r.pub, true)), 0);
    unsigned char start[8];
    for (int i = 0; i < 8; i++)
        start[i] = (unsigned char)((uint64_t)(last + 1) >> (56 - 8 * i));
    assert_int_equal(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(dealer, start, 8, 0), 8);
    got rep = {0};
    run_ms(&r, 200);
    drain(dealer, &rep);
    assert_true(rep.n >= 2);
    assert_int_equal(rep.seq[rep.n - 1], -1); /* the end marker */
    for (int64_t s = last + 1; s < (int64_t)after; s++) {
        bool found = false;
        for (size_t i = 0; i + 1 < rep.n; i++)
            found |= rep.seq[i] == s && rep.empty[i];
        assert_true(found);
    }
    zmq_close(dealer);
    rig_down(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_heartbeats),
        cmocka_unit_test(test_no_heartbeats_by_default),
        cmocka_unit_test(test_pause_loses_live_keeps_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
