# SPDX-License-Identifier: Apache-2.0
"""Replicated gateways sharing the prefix map in Redis (docs/redis.md): what one replica learns
routes the next turn on another; Redis killed, restarted or paused costs no request and no
wait past redis.lookup_timeout_ms; the gateway comes back to Redis by itself; /readyz and
/metrics say what is happening. Real redis-server processes, real simulated workers."""

import threading
import time

import pytest

from gwhelpers import CHAT, http, wait_for
from test_routing import chat, text

LOOKUP_TIMEOUT_MS = 20


def replicas(kvgate, server, workers, n=2, **kw):
    """n gateways on server's URL (anything with .url: a RedisProcess, SentinelSet or
    RedisCluster); redis={...} adds to their redis section, other keywords go to kvgate."""
    cfg = {"redis": {"url": server.url, "lookup_timeout_ms": LOOKUP_TIMEOUT_MS}}
    cfg["redis"].update(kw.pop("redis", {}))
    return [kvgate(*workers, config=cfg, **kw) for _ in range(n)]


def send(gw, body, key=None):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = http.post(gw.url + CHAT, json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-kvgate-worker"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def explain_choice(gw, body, tenant=None):
    req = {"request": body} if tenant is None else {"tenant": tenant, "request": body}
    r = gw.admin.post("/admin/v1/route/explain", json=req)
    assert r.status_code == 200, r.text
    return r.json()["chosen"], r.json()["reason"]


def worker_listing(gw, name):
    r = gw.admin.get("/admin/v1/workers")
    assert r.status_code == 200, r.text
    return next(w for w in r.json()["workers"] if w["name"] == name)


def learned_on_one_routes_on_other(learner, follower, ws, seed, tenant=None, key=None):
    """A conversation's first turn sent through learner goes somewhere the follower's own index
    would not send it (the cold worker is drained on learner meanwhile); its next turn, sent
    through follower, must go to the worker that holds the prefix: only the shared map can tell
    the follower. tenant/key: the tenant to explain for and its API key (auth=keys gateways)."""
    urls = {w.name: w.url for w in ws}
    system = text(seed, 2000)
    first = chat(ws[0].model, system, "first question")
    # Where the follower alone would send the conversation: the cold placement every
    # replica agrees on. Draining that worker on the learner sends the first turn
    # elsewhere, so only the shared map can tell the follower where the prefix is.
    cold, reason = explain_choice(follower, first, tenant)
    assert reason == "cold"
    assert learner.admin.post(f"/admin/v1/workers/{cold}/drain").status_code == 200
    holder, cached = send(learner, first, key)
    assert holder != cold and cached == 0
    assert learner.admin.put(f"/admin/v1/workers/{cold}",
                             json={"url": urls[cold]}).status_code in (200, 201)
    for gw in (learner, follower):
        assert wait_for(lambda: not worker_listing(gw, cold)["draining"], 3)
    # The follower's own index has never seen the prefix...
    nxt = chat(ws[0].model, system, "next turn")
    assert explain_choice(follower, nxt, tenant) == (cold, "cold")
    # ...but the shared map has: the next turn goes where its prefix is cached.
    worker, cached = send(follower, nxt, key)
    assert worker == holder, f"seed {seed}: the next turn went to {worker}, not {holder}"
    assert cached > 0


def test_a_prefix_learned_on_one_replica_routes_the_next_turn_on_another(
        simworker, kvgate, redis_server):
    redis = redis_server
    ws = [simworker(time_scale=0, kv_blocks=4096) for _ in range(4)]
    a, b = replicas(kvgate, redis, ws)
    for doc, (learner, follower) in enumerate([(a, b), (b, a)]):
        learned_on_one_routes_on_other(learner, follower, ws, 700 + doc)
    for gw in (a, b):
        m = gw.scrape()
        assert gw.metric("kvgate_redis_lookups_total", m, outcome="ok") >= 1
        assert gw.metric("kvgate_redis_records_total", m, outcome="ok") >= 1
        assert gw.metric("kvgate_redis_connections", m, state="ready") == 2  # one per thread


class Load:
    """Chat requests in a loop from a few threads (a handful of conversations, so that the
    map is used), each request's status and duration kept. A subclass changes what is sent
    by overriding request()."""

    def __init__(self, gw, model, threads=4):
        self.gw, self.model = gw, model
        self.results = []  # (status, seconds, monotonic start)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def request(self, i, n):
        """Thread i's n-th request: (url, body, headers)."""
        return (self.gw.url + CHAT,
                chat(self.model, text(900 + (i * 7 + n) % 12, 1500), f"turn {n}"), {})

    def _run(self, i):
        n = 0
        with http_client() as c:
            while not self.stop.is_set():
                url, body, headers = self.request(i, n)
                t0 = time.monotonic()
                try:
                    status = c.post(url, json=body, headers=headers).status_code
                except Exception as e:  # a failed request is what the test looks for
                    status = repr(e)
                with self.lock:
                    self.results.append((status, time.monotonic() - t0, t0))
                n += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def count(self):
        with self.lock:
            return len(self.results)

    def failures(self):
        with self.lock:
            return [r for r in self.results if r[0] != 200]


def http_client():
    import httpx
    return httpx.Client(timeout=10)


def test_redis_killed_during_load_fails_nothing_and_is_used_again_once_back(
        simworker, kvgate, redis_server):
    redis = redis_server
    ws = [simworker(time_scale=0, kv_blocks=4096) for _ in range(4)]
    (gw,) = replicas(kvgate, redis, ws, n=1)
    with Load(gw, ws[0].model) as load:
        assert wait_for(lambda: load.count() >= 50, 10)
        redis.kill()
        down_at = load.count()
        assert wait_for(lambda: load.count() >= down_at + 100, 15)
        # Degraded, not unready: decisions fall back to the embedded index.
        r = http.get(gw.admin_url + "/readyz")
        assert r.status_code == 200 and "redis degraded" in r.json()["degraded"][0], r.text
        assert gw.metric("kvgate_redis_connections", state="ready") == 0
        redis.restart()
        ok_before = gw.metric("kvgate_redis_lookups_total", outcome="ok")
        assert wait_for(lambda: gw.metric("kvgate_redis_connections", state="ready") == 2, 10)
        assert wait_for(lambda: gw.metric("kvgate_redis_lookups_total", outcome="ok")
                        > ok_before + 20, 10)
    assert load.failures() == []
    m = gw.scrape()
    fallbacks = sum(gw.metric("kvgate_redis_lookups_total", m, outcome=o)
                    for o in ("unavailable", "lost", "timeout"))
    assert fallbacks > 0
    assert gw.metric("kvgate_redis_reconnects_total", m) >= 1
    # The topology thread and the state sync see Redis again at their next check.
    assert wait_for(lambda: "degraded" not in http.get(gw.admin_url + "/readyz").json(), 10), \
        http.get(gw.admin_url + "/readyz").text


def test_a_paused_redis_delays_no_request_past_the_lookup_timeout(
        simworker, kvgate, redis_server):
    redis = redis_server
    ws = [simworker(time_scale=0, kv_blocks=4096) for _ in range(4)]
    (gw,) = replicas(kvgate, redis, ws, n=1)
    with Load(gw, ws[0].model) as load:
        assert wait_for(lambda: load.count() >= 100, 10)
        with load.lock:
            normal = sorted(d for _, d, _ in load.results)
        redis.pause()
        paused_at = time.monotonic()
        time.sleep(5)
        redis.resume()
        resumed_at = time.monotonic()
        ok_before = gw.metric("kvgate_redis_lookups_total", outcome="ok")
        assert wait_for(lambda: gw.metric("kvgate_redis_lookups_total", outcome="ok")
                        > ok_before + 20, 10)
    assert load.failures() == []
    during = [d for s, d, t0 in load.results if paused_at <= t0 <= resumed_at]
    assert len(during) > 50
    # Each request's own service time is what it takes with Redis answering (the slowest of
    # those, on this loaded machine); the pause may add the lookup timeout and no more.
    bound = normal[-1] + LOOKUP_TIMEOUT_MS / 1000 + 0.25
    assert max(during) < bound, (max(during), bound)
    m = gw.scrape()
    assert gw.metric("kvgate_redis_lookups_total", m, outcome="timeout") > 0
