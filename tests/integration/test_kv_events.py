# SPDX-License-Identifier: Apache-2.0
"""The engines' KV events feed the gateway's index (issue 17, the consumer's first slice):
workers in token-exact mode publish vLLM-format events (kvgate-simworker, docs/simworker.md),
the gateway subscribes to the worker's kv_events endpoint, and what the engine says it stored,
removed and cleared is what the index holds - even for requests the gateway never routed."""
import time

import httpx
from test_simworker_events import SEED
from test_simworker_events import start as events_worker
from test_token_exact import explain, models_config


def gateway(kvgate, workers, tmp_path, worker_extra=None, **extra):
    cfg = models_config()
    cfg["models"][0]["hash_seed"] = SEED
    cfg["workers"] = []
    for w in workers:
        d = dict({"name": w.name, "url": w.url, "models": ["m"]}, **(worker_extra or {}))
        if getattr(w, "events_ep", None):
            d["kv_events"] = w.events_ep
            if w.replay_ep:
                d["kv_events_replay"] = w.replay_ep
        cfg["workers"].append(d)
    cfg.update(extra)
    return kvgate(config=cfg)


def matched_on(gw, body, worker):
    got = explain(gw, body)
    assert got["mode"] == "token_exact", got
    return {c["worker"]: c["matched_blocks"] for c in got["candidates"]}.get(worker, 0), got


def wait_matched(gw, body, worker, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        n, got = matched_on(gw, body, worker)
        if n == want or time.monotonic() > deadline:
            return n, got
        time.sleep(0.05)


def prompt(i, words=120):
    return {"model": "m", "prompt": f"Document {i}: " + " ".join(f"w{i}x{k}" for k in
                                                                 range(words)), "max_tokens": 1}


def test_events_feed_the_index(simworker, kvgate, tmp_path):
    """A prompt sent to a worker directly (not through the gateway) is known to the gateway by
    the worker's BlockStored events: explain predicts exactly the blocks the worker then reports
    cached; a reset of the worker's cache (AllBlocksCleared) empties it again."""
    ev = events_worker(simworker, tmp_path, model="m")
    plain = simworker(time_scale=0, model="m")
    gw = gateway(kvgate, [ev, plain], tmp_path)
    body = prompt(1)
    n, got = matched_on(gw, body, ev.name)
    assert n == 0
    blocks = got["prefix"]["blocks"]
    assert blocks > 10
    # The gateway is not told: the engine is. The salt is the gateway's global scope's, as the
    # gateway would inject it (explain keys with it).
    from gwhelpers import salt_of
    with httpx.Client(timeout=10) as c:
        r = c.post(ev.url + "/v1/completions", json=dict(body, cache_salt=salt_of("global")))
        assert r.status_code == 200, r.text
    n, got = wait_matched(gw, body, ev.name, blocks)
    assert n == blocks, got
    assert got["chosen"] == ev.name
    # The gateway routes it there and the engine reports it cached.
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-simworker-name"] == ev.name
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * 16
    m = gw.scrape()
    assert gw.metric("kvgate_kv_events_subscriptions", m) == 1
    assert gw.metric("kvgate_kv_events_total", m, outcome="stored") >= blocks
    assert gw.metric("kvgate_kv_events_total", m, outcome="invalid") == 0
    # The engine's cache cleared: the gateway forgets it (its own record of the request too).
    with httpx.Client(timeout=10) as c:
        assert c.post(ev.url + "/reset_prefix_cache").status_code == 200
    n, got = wait_matched(gw, body, ev.name, 0)
    assert n == 0, got
    assert gw.metric("kvgate_kv_events_total", outcome="cleared") >= 1


def test_gaps_are_replayed(simworker, kvgate, tmp_path):
    """Half the batches dropped on the way: the gateway sees the gaps, asks the worker's replay
    socket, and ends up knowing every prompt the worker stored (once a later batch shows the
    gap)."""
    ev = events_worker(simworker, tmp_path, model="m", kv_events_drop_rate=0.5, seed=3)
    gw = gateway(kvgate, [ev], tmp_path)
    from gwhelpers import salt_of
    bodies = [prompt(i, 60) for i in range(12)]
    with httpx.Client(timeout=10) as c:
        for b in bodies:
            r = c.post(ev.url + "/v1/completions", json=dict(b, cache_salt=salt_of("global")))
            assert r.status_code == 200, r.text
            time.sleep(0.02)  # batches one by one
        # A dropped last batch shows as a gap only when a later one comes (vLLM with a snapshot
        # endpoint sends an empty batch each idle second for that; the simulated worker only with
        # --kv-events-heartbeat-ms, not given here): one more.
        for i in range(100, 103):
            c.post(ev.url + "/v1/completions", json=prompt(i, 20))
    for i, b in enumerate(bodies):
        blocks = explain(gw, b)["prefix"]["blocks"]
        n, got = wait_matched(gw, b, ev.name, blocks)
        m = gw.scrape()
        assert n == blocks, (i, {k: v for k, v in m.items() if "kv_events" in k})
    m = gw.scrape()
    assert gw.metric("kvgate_kv_events_total", m, outcome="gaps") >= 1
    assert gw.metric("kvgate_kv_events_total", m, outcome="replayed") >= 1
    assert gw.metric("kvgate_kv_events_total", m, outcome="lost") == 0
    # The live copies of batches a replay applied (read after its end) are duplicates, never an
    # engine restart that would clear the worker's entries.
    assert gw.metric("kvgate_kv_events_total", m, outcome="restarts") == 0


def test_an_engine_restart_clears_its_entries(simworker, kvgate, tmp_path):
    """The worker restarted (same addresses): its sequence starts at 0 again, which the
    gateway reads as a new, empty cache - what the old engine held is forgotten, what the new
    one stores is learned."""
    from gwhelpers import salt_of
    from test_simworker_events import free_port
    port, evp, rep = free_port(), free_port(), free_port()
    flags = dict(model="m", name="eng", listen=f"127.0.0.1:{port}",
                 endpoint=f"tcp://127.0.0.1:{evp}",
                 kv_events_replay_endpoint=f"tcp://127.0.0.1:{rep}")
    ev = events_worker(simworker, tmp_path, **flags)
    gw = gateway(kvgate, [ev], tmp_path)
    a, b = prompt(1), prompt(2)
    with httpx.Client(timeout=10) as c:
        assert c.post(ev.url + "/v1/completions",
                      json=dict(a, cache_salt=salt_of("global"))).status_code == 200
        blocks_a = explain(gw, a)["prefix"]["blocks"]
        assert wait_matched(gw, a, ev.name, blocks_a)[0] == blocks_a
        assert ev.stop() == 0
        ev2 = events_worker(simworker, tmp_path, **flags)
        assert ev2.url == ev.url
        # The publisher's connection coming back tells the gateway (its first batches may be
        # sent before the subscription reaches it, so the numbers alone could not).
        deadline = time.monotonic() + 5
        while gw.metric("kvgate_kv_events_total", outcome="restarts") < 1:
            assert time.monotonic() < deadline, "no restart seen"
            time.sleep(0.05)
        assert matched_on(gw, a, ev.name)[0] == 0
        assert c.post(ev2.url + "/v1/completions",
                      json=dict(b, cache_salt=salt_of("global"))).status_code == 200
    blocks_b = explain(gw, b)["prefix"]["blocks"]
    assert wait_matched(gw, b, ev.name, blocks_b)[0] == blocks_b
    assert matched_on(gw, a, ev.name)[0] == 0


def test_replayed_batches_seen_live_are_not_restarts(simworker, kvgate, tmp_path):
    """Batches published while a replay is under way come back twice: in the replay's answer and
    live on the SUB socket, which the consumer may read after the replay's end. The live copy is
    a duplicate (counted and skipped); taken for an engine restart it would clear the worker's
    entries for nothing."""
    import concurrent.futures
    from gwhelpers import salt_of
    ev = events_worker(simworker, tmp_path, model="m", kv_events_drop_rate=0.3, seed=5)
    gw = gateway(kvgate, [ev], tmp_path)

    def send(i):
        with httpx.Client(timeout=10) as c:
            r = c.post(ev.url + "/v1/completions",
                       json=dict(prompt(i, 30), cache_salt=salt_of("global")))
            assert r.status_code == 200, r.text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(400)))
    time.sleep(1.5)  # the last replays end
    m = gw.scrape()
    assert gw.metric("kvgate_kv_events_total", m, outcome="gaps") >= 5
    assert gw.metric("kvgate_kv_events_total", m, outcome="restarts") == 0
    assert gw.metric("kvgate_kv_events_total", m, outcome="lost") == 0


def test_a_publisher_gone_clears_its_entries_at_once(simworker, kvgate, tmp_path):
    """The engine's process died: its publisher's connection drops and the gateway forgets
    what it held then, not when (or if) a restarted engine's publisher connects again - a
    restarted worker's health check can pass before libzmq's next reconnect."""
    from gwhelpers import salt_of
    ev = events_worker(simworker, tmp_path, model="m", name="eng")
    gw = gateway(kvgate, [ev], tmp_path)
    a = prompt(3)
    with httpx.Client(timeout=10) as c:
        assert c.post(ev.url + "/v1/completions",
                      json=dict(a, cache_salt=salt_of("global"))).status_code == 200
    blocks = explain(gw, a)["prefix"]["blocks"]
    assert blocks > 0
    assert wait_matched(gw, a, ev.name, blocks)[0] == blocks
    assert gw.metric("kvgate_index_worker_entries", worker=ev.name) >= blocks
    assert ev.stop() == 0
    # Never restarted: without the clear at the disconnect the entries would stay (turned into
    # model entries once the worker is stale) and keep drawing its prefixes to it. Read from
    # the index itself: explain leaves out a worker its health checks have marked down.
    deadline = time.monotonic() + 2.0
    while gw.metric("kvgate_index_worker_entries", worker=ev.name) > 0:
        assert time.monotonic() < deadline, "the dead publisher's entries are still indexed"
        time.sleep(0.05)
    # Nor does it take new guesses for it while its publisher is gone: a request routed there
    # (its health checks have not caught up yet) leaves no speculative entries, which a restarted
    # engine's health check could otherwise find still standing.
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        r = c.post("/v1/completions", json=prompt(4))
    assert r.status_code >= 500, r.text
    assert gw.metric("kvgate_route_decisions_total", reason="cold") >= 1
    for _ in range(6):
        assert gw.metric("kvgate_index_worker_entries", worker=ev.name) == 0
        time.sleep(0.05)


def test_the_attempted_worker_gets_the_speculative_entries(simworker, kvgate, tmp_path):
    """Speculative entries go to the worker an attempt is made to, not to the decision's best
    candidate: with the holder full (max_inflight 1), the same prompt goes to the other
    worker, and the index holds its blocks there at once, while that engine still has the
    request queued (no BlockStored yet: its one running slot is busy for two seconds) and
    long before its answer (non-streamed: the record at the 200 comes at the end)."""
    import threading
    slow = dict(time_scale=1, max_running=1)  # decode 5 ms a token
    ws = [events_worker(simworker, tmp_path, model="m", name=n, **slow) for n in ("a", "b")]
    gw = gateway(kvgate, ws, tmp_path, worker_extra={"max_inflight": 1})
    body = prompt(7)
    blocks = explain(gw, body)["prefix"]["blocks"]
    assert blocks > 10
    answers = {}

    def send(key, url, b):
        with httpx.Client(base_url=url, timeout=30) as c:
            r = c.post("/v1/completions", json=b)
            answers[key] = (r.status_code, r.headers.get("x-simworker-name"))

    def start(key, url, b):
        t = threading.Thread(target=send, args=(key, url, b))
        t.start()
        return t

    def inflight():
        got = gw.admin.get("/admin/v1/workers").json()["workers"]
        return {w["name"]: w["inflight"] for w in got}

    def wait(cond, what):
        deadline = time.monotonic() + 5
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.01)
    # Each engine's one running slot taken for ~2 s by a request of its own, sent to it directly
    # (400 tokens to decode); its prompt's BlockStored puts the worker's index source at events.
    threads = [start(w.name, w.url, dict(prompt(100 + i, words=10), max_tokens=400))
               for i, w in enumerate(ws)]
    wait(lambda: all(w["kv_events_status"]["index_source"] == "events"
                     for w in gw.admin.get("/admin/v1/workers").json()["workers"]),
         "the workers' events do not flow")
    threads.append(start("first", gw.url, body))
    wait(lambda: 1 in inflight().values(), "the first request is not in flight")
    holder = next(n for n, v in inflight().items() if v == 1)
    other = next(w.name for w in ws if w.name != holder)
    assert gw.metric("kvgate_index_worker_entries", worker=holder) >= blocks
    threads.append(start("second", gw.url, body))
    wait(lambda: inflight()[other] == 1, "the second request did not go to the other worker")
    n = gw.metric("kvgate_index_worker_entries", worker=other)
    assert not answers, f"too slow to tell a guess from a store: {answers}"
    assert n >= blocks, f"{other} holds {n} entries while its engine has the request queued"
    for t in threads:
        t.join()
    assert answers["first"] == (200, holder) and answers["second"] == (200, other), answers


class ScriptedPublisher:
    """A publisher whose every batch the test sends by hand: vLLM's PUB socket ([topic, seq,
    payload]) and replay ROUTER ([identity, "", seq] in; [identity, "", seq, payload] per batch
    and the end marker [identity, "", -1, ""] out)."""

    def __init__(self):
        import zmq
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.XPUB)  # a PUB that shows the subscriptions it gets
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:0")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:0")
        self.events_ep = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.replay_ep = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.batches = {}

    @staticmethod
    def stored(hashes):
        from test_simworker_events import packb
        ev = ["BlockStored", hashes, None, [1] * (16 * len(hashes)), 16, None, "GPU", None,
              None, None, None, None]
        return packb([time.time(), [ev], 0])

    def wait_subscriber(self, timeout=5.0):
        """Until a subscription (b"\\x01" + topic) reaches the PUB socket: what is sent before
        it is dropped."""
        if not self.pub.poll(int(timeout * 1000)):
            raise AssertionError("no subscriber")
        assert self.pub.recv()[:1] == b"\x01"

    def publish(self, seq, hashes, live=True):
        self.batches[seq] = self.stored(hashes)
        if live:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big", signed=True),
                                     self.batches[seq]])

    def answer_replay(self, timeout=5.0):
        """Wait for one replay request; answer it from the batches kept. Returns its start."""
        if not self.router.poll(int(timeout * 1000)):
            raise AssertionError("no replay request")
        ident, empty, start = self.router.recv_multipart()
        start = int.from_bytes(start, "big", signed=True)
        for seq in sorted(s for s in self.batches if s >= start):
            self.router.send_multipart([ident, b"", seq.to_bytes(8, "big", signed=True),
                                        self.batches[seq]])
        self.router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])
        return start

    def close(self):
        self.pub.close()
        self.router.close()


def test_a_live_copy_of_a_replayed_batch_is_a_duplicate(simworker, kvgate, tmp_path):
    """Deterministically, the race bench/acceptance's drop runs showed: a batch the replay has
    already applied arrives live afterwards (published while the replay was being answered,
    read from the SUB socket after the replay's end). It is counted as a duplicate and skipped;
    taken for an engine restart (a number not above the last) it would clear the worker."""
    pub = ScriptedPublisher()
    try:
        sw = simworker(time_scale=0, model="m")
        sw.name, sw.events_ep, sw.replay_ep = "eng", pub.events_ep, pub.replay_ep
        gw = gateway(kvgate, [sw], tmp_path)

        def entries():
            return gw.metric("kvgate_index_worker_entries", worker="eng")

        def wait_entries(n):
            deadline = time.monotonic() + 5
            while entries() != n:
                assert time.monotonic() < deadline, f"entries {entries()}, {n} expected"
                time.sleep(0.02)
        pub.wait_subscriber()
        pub.publish(0, [1000, 1001])
        wait_entries(2)
        pub.publish(1, [1100], live=False)  # lost on the way: a gap
        pub.publish(2, [1200])  # the consumer sees 2 after 0 and asks the replay from 1
        pub.publish(3, [1300], live=False)  # made while the replay is under way
        assert pub.answer_replay() == 1  # answered with 1, 2, 3 and the end marker
        wait_entries(5)
        pub.pub.send_multipart([b"", (3).to_bytes(8, "big", signed=True), pub.batches[3]])
        pub.publish(4, [1400])  # and the stream goes on
        wait_entries(6)
        m = gw.scrape()
        assert gw.metric("kvgate_kv_events_total", m, outcome="gaps") == 1
        assert gw.metric("kvgate_kv_events_total", m, outcome="replayed") == 3
        assert gw.metric("kvgate_kv_events_total", m, outcome="duplicates") >= 1
        assert gw.metric("kvgate_kv_events_total", m, outcome="restarts") == 0
        assert gw.metric("kvgate_kv_events_total", m, outcome="lost") == 0
    finally:
        pub.close()
