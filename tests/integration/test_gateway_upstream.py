# SPDX-License-Identifier: Apache-2.0
"""The upstream side of kvgate: retries on connect failures and early resets, bounded; 503 when
no worker can take a request, 504 when a worker does not answer in time, 503 + Retry-After at a
worker's in-flight limit; keep-alive pooling; health checks taking workers out and back."""
import hashlib
import json
import os
import socket
import struct
import time

import httpx

from gwhelpers import (forwarded, CHAT, COMPL, H2Client, RawHTTP, assert_openai_error, dead_port, http,
                       json_response,                        request_bytes, sim_metric, wait_for, worker_cfg)

BODY = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
# Health checks that never get in the way of a test (the first round still runs at start).
QUIET_HEALTH = {"interval_ms": 600000, "fall": 100, "rise": 1}


def post(gw, body=BODY, path=COMPL, **kw):
    return http.post(gw.url + path, json=body, timeout=10, **kw)


def dead_worker(name="dead"):
    return {"name": name, "url": f"http://127.0.0.1:{dead_port()}"}


# ---- retries --------------------------------------------------------------------------------------


def test_dead_worker_is_retried_transparently(simworker, kvgate):
    a, b = simworker(time_scale=0), simworker(time_scale=0)
    gw = kvgate(config={"health": QUIET_HEALTH,
                        "workers": [dead_worker(), worker_cfg(a), worker_cfg(b)]})
    seen = set()
    with httpx.Client(timeout=10, verify=False) as c:
        for i in range(12):
            r = c.post(gw.url + COMPL, json=BODY, headers={"x-request-id": f"r{i}"})
            assert r.status_code == 200, r.text
            seen.add(r.headers["x-kvgate-worker"])
    # HTTP/2 too, several at once.
    h = H2Client(gw.port)
    try:
        streams = h.wait([h.request("POST", COMPL, BODY) for _ in range(12)])
        assert all(s.status == 200 for s in streams)
        seen |= {s.headers["x-kvgate-worker"] for s in streams}
    finally:
        h.close()
    assert seen == {a.name, b.name}
    samples = gw.scrape()
    retries = gw.metric("kvgate_worker_retries_total", samples, worker="dead")
    assert retries >= 3, retries  # the dead one was tried first about a third of the time
    assert gw.metric("kvgate_worker_retries_total", samples, worker=a.name) == 0
    assert gw.metric("kvgate_worker_requests_total", samples, code="200") == 24
    logged = [e for e in gw.access_entries() if e["path"] == COMPL]
    assert sum(e["retries"] for e in logged) == retries
    assert all(e["status"] == 200 and e["worker"] in (a.name, b.name) for e in logged)
    assert all(e["tries"] == e["retries"] + 1 for e in logged), logged


def test_retries_are_bounded(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(config={"health": QUIET_HEALTH, "upstream": {"retries": 0},
                        "workers": [dead_worker(), worker_cfg(sw)]})
    codes = []
    for _ in range(10):
        r = post(gw)
        codes.append(r.status_code)
        if r.status_code != 200:
            assert r.status_code == 502
            assert_openai_error(r.content, 502, "upstream_error")
    assert set(codes) == {200, 502}, codes  # no retry: the dead worker's turns fail
    # With every worker dead, retries run out: 502.
    gw2 = kvgate(config={"health": QUIET_HEALTH, "upstream": {"retries": 5},
                         "workers": [dead_worker("d1"), dead_worker("d2"), dead_worker("d3")]})
    r = post(gw2)
    assert r.status_code == 502
    assert "no worker could be reached" in assert_openai_error(r.content, 502)["message"]
    # Two retries (d1 -> d2 -> d3); the third failure had no worker left to go to.
    assert gw2.metric("kvgate_worker_retries_total") == 2


def test_worker_resetting_before_any_byte_is_retried(simworker, kvgate, fake_upstream):
    def reset(req, sock):
        # RST instead of FIN: the hard way to drop a request.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    def close(req, sock):
        return False

    sw = simworker(time_scale=0)
    resetter = fake_upstream(reset, name="resetter")
    closer = fake_upstream(close, name="closer")
    gw = kvgate(config={"health": QUIET_HEALTH, "upstream": {"retries": 2},
                        "workers": [worker_cfg(resetter), worker_cfg(closer),
                                    worker_cfg(sw)]})
    for _ in range(9):
        r = post(gw)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvgate-worker"] == sw.name
    assert resetter.requests and closer.requests  # they were tried, and did get the request
    samples = gw.scrape()
    assert gw.metric("kvgate_worker_retries_total", samples, worker="resetter") >= 1
    assert gw.metric("kvgate_worker_retries_total", samples, worker="closer") >= 1


def test_worker_errors_are_not_retried(simworker, kvgate):
    bad = simworker(time_scale=0, error_rate=1.0)
    gw = kvgate(bad)
    r = post(gw)
    assert r.status_code == 500
    assert r.headers["x-kvgate-worker"] == bad.name
    assert_openai_error(r.content, 500, "InternalServerError")
    assert gw.metric("kvgate_worker_retries_total") == 0


def test_malformed_worker_response_is_502(kvgate, fake_upstream):
    def garbage(req, sock):
        sock.sendall(b"HELLO WORLD\r\n\r\n")
        return False

    up = fake_upstream(garbage, name="garbage")
    gw = kvgate(up)
    r = post(gw)
    assert r.status_code == 502
    assert_openai_error(r.content, 502, "upstream_error")
    assert gw.alive()


# ---- no worker, timeouts, limits ------------------------------------------------------------------


def test_no_healthy_worker_is_503(simworker, kvgate):
    gw = kvgate(config={"health": {"interval_ms": 100, "timeout_ms": 100, "fall": 1,
                                   "rise": 1},
                        "workers": [dead_worker()]})
    assert wait_for(lambda: gw.metric("kvgate_worker_up", worker="dead") == 0, 5)
    for h2c in (False, True):
        with httpx.Client(http1=not h2c, http2=h2c, timeout=5, verify=False) as c:
            r = c.post(gw.url + CHAT, json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503
        err = assert_openai_error(r.content, 503, "service_unavailable")
        assert "no healthy worker" in err["message"]
    r = http.get(gw.admin_url + "/readyz")
    assert r.status_code == 503 and r.json()["status"] == "not ready"
    # No worker at all.
    empty = kvgate()
    r = post(empty)
    assert r.status_code == 503
    assert "no worker is configured" in assert_openai_error(r.content, 503)["message"]
    assert http.get(empty.admin_url + "/readyz").json()["reason"] == "no workers registered"


def test_upstream_response_timeout_is_504(simworker, kvgate):
    sw = simworker(time_scale=0, slow_headers_ms=2000)
    gw = kvgate(config={"health": QUIET_HEALTH, "upstream": {"response_timeout_ms": 300},
                        "workers": [worker_cfg(sw)]})
    t0 = time.monotonic()
    r = post(gw, headers={"x-request-id": "slow-one"})
    took = time.monotonic() - t0
    assert r.status_code == 504
    assert r.headers["x-request-id"] == "slow-one"
    assert_openai_error(r.content, 504, "timeout")
    assert 0.25 < took < 1.5, took
    h = H2Client(gw.port)
    try:
        (s,) = h.wait([h.request("POST", COMPL, BODY)])
        assert s.status == 504
    finally:
        h.close()
    samples = gw.scrape()
    assert gw.metric("kvgate_worker_requests_total", samples, worker=sw.name, code="504") == 2
    assert gw.metric("kvgate_timeouts_total", samples) >= 2
    assert gw.metric("kvgate_worker_retries_total", samples) == 0  # a timeout is not retried


def test_upstream_read_timeout_mid_stream(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=1500000, time_scale=1)
    gw = kvgate(config={"health": QUIET_HEALTH, "upstream": {"read_timeout_ms": 300},
                        "workers": [worker_cfg(sw)]})
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 5, "stream": True}
    c = RawHTTP(gw.port)
    try:
        c.send(request_bytes("POST", COMPL, body))
        assert c.read_head() == 200
        data = c.body()
        assert not c.complete  # cut, not ended cleanly
        assert b"[DONE]" not in data
    finally:
        c.close()
    h = H2Client(gw.port)
    try:
        (s,) = h.wait([h.request("POST", COMPL, body)])
        assert s.status == 200 and s.reset is not None and not s.ended
    finally:
        h.close()
    # The worker was told: its sequences are cancelled.
    assert wait_for(lambda: sim_metric(sw, "vllm:num_requests_running") == 0, 5)
    assert sim_metric(sw, "vllm:request_success_total", finished_reason="abort") == 2


def test_max_inflight_per_worker_gives_503_retry_after(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=100000, time_scale=1)
    gw = kvgate(config={"health": QUIET_HEALTH,
                        "workers": [worker_cfg(sw, max_inflight=2)]})
    long = {"model": "sim-model", "prompt": "x", "max_tokens": 10, "stream": True}
    h = H2Client(gw.port)
    try:
        held = [h.request("POST", COMPL, long) for _ in range(2)]
        assert wait_for(lambda: h.pump(0.05) and all(s.status == 200 for s in held), 5)
        assert gw.metric("kvgate_worker_inflight", worker=sw.name) == 2
        r = post(gw)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        err = assert_openai_error(r.content, 503, "overloaded")
        assert "in-flight limit" in err["message"]
        extra = h.request("POST", COMPL, BODY)
        h.wait(held + [extra])
        assert extra.status == 503 and extra.headers["retry-after"] == "1"
        assert all(s.ended and s.data.endswith(b"data: [DONE]\n\n") for s in held)
    finally:
        h.close()
    # Room again once they finished.
    assert post(gw).status_code == 200
    samples = gw.scrape()
    assert gw.metric("kvgate_worker_max_inflight", samples, worker=sw.name) == 2
    assert gw.metric("kvgate_worker_inflight", samples, worker=sw.name) == 0


def test_default_max_inflight_from_upstream_config(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=100000, time_scale=1)
    gw = kvgate(config={"health": QUIET_HEALTH, "upstream": {"max_inflight": 1},
                        "workers": [worker_cfg(sw)]})
    assert gw.metric("kvgate_worker_max_inflight", worker=sw.name) == 1
    c = RawHTTP(gw.port)
    try:
        c.send(request_bytes("POST", COMPL, {"prompt": "x", "max_tokens": 5, "stream": True}))
        assert c.read_head() == 200
        r = post(gw)
        assert r.status_code == 503 and "retry-after" in r.headers
        c.body()
        assert c.complete
    finally:
        c.close()


# ---- pooling and health ---------------------------------------------------------------------------


def test_upstream_keepalive_pool(kvgate, fake_upstream):
    conns = set()

    def answer(req, sock):
        conns.add(sock.fileno())
        body = json.dumps({"n": len(up.requests)}).encode()
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n" % len(body) + body)
        return True

    up = fake_upstream(answer, name="pooled")
    gw = kvgate(up, threads=1, config={"health": QUIET_HEALTH})
    for i in range(10):
        r = post(gw)
        assert r.status_code == 200 and r.json() == {"n": i + 1}
    # Ten requests over one kept-alive connection.
    assert len(up.requests) == 10
    assert len(conns) == 1, conns


def test_stale_pooled_connection_is_retried(simworker, kvgate):
    sw = simworker(time_scale=0, keep_alive_timeout=1)
    gw = kvgate(sw, threads=1)
    assert post(gw).status_code == 200
    time.sleep(1.5)  # the worker closes the idle connection the gateway pooled
    for _ in range(3):
        r = post(gw)
        assert r.status_code == 200, r.text
    logged = [e for e in gw.access_entries() if e["path"] == COMPL]
    assert [e["status"] for e in logged] == [200] * 4
    assert all(e["retries"] == 0 for e in logged)  # a stale connection is not the worker's fault


def test_health_checks_take_workers_out_and_back(simworker, kvgate):
    a = simworker(time_scale=0)
    b = simworker(time_scale=0, name="flaky")
    port = b.port
    gw = kvgate(config={"health": {"interval_ms": 100, "timeout_ms": 200, "fall": 2, "rise": 2},
                        "workers": [worker_cfg(a), worker_cfg(b)]})
    assert {post(gw).headers["x-kvgate-worker"] for _ in range(6)} == {a.name, b.name}
    assert b.stop() == 0
    assert wait_for(lambda: gw.metric("kvgate_worker_up", worker="flaky") == 0, 5)
    assert {post(gw).headers["x-kvgate-worker"] for _ in range(6)} == {a.name}
    workers = {w["name"]: w for w in gw.admin.get("/admin/v1/workers").json()["workers"]}
    assert workers["flaky"]["health"] == "down"
    # Back on the same port: up again after `rise` good checks, and it gets traffic.
    revived = simworker(time_scale=0, name="flaky2", listen=f"127.0.0.1:{port}")
    assert revived.port == port
    assert wait_for(lambda: gw.metric("kvgate_worker_up", worker="flaky") == 1, 5)
    assert "flaky" in {post(gw).headers["x-kvgate-worker"] for _ in range(6)}


def test_health_check_reads_past_100_continue(kvgate, fake_upstream):
    """An interim 100 Continue is not the answer: the 503 after it takes the worker down."""
    def health(req, sock):
        if req["path"] == "/health":
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n"
                         b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            return True
        json_response(sock, {"ok": True})
        return True

    w = fake_upstream(health, name="interim", health=False)
    gw = kvgate(config={"health": {"interval_ms": 100, "timeout_ms": 500, "fall": 2, "rise": 2},
                        "workers": [worker_cfg(w)]})
    assert wait_for(lambda: gw.metric("kvgate_worker_up", worker="interim") == 0, 5)


def test_retry_resends_the_whole_body(kvgate, fake_upstream):
    def reset(req, sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    def echo(req, sock):
        json_response(sock, {"len": len(req["body"]),
                             "sha": hashlib.sha256(req["body"]).hexdigest()})
        return True

    resetter = fake_upstream(reset, name="resetter")
    echoer = fake_upstream(echo, name="echo")
    gw = kvgate(config={"health": QUIET_HEALTH,
                        "workers": [worker_cfg(resetter), worker_cfg(echoer)]})
    # Round robin, so that both workers are tried whatever the prefix index would prefer.
    assert gw.admin.put("/admin/v1/policy", json={"policy": "round_robin"}).status_code == 200
    body = json.dumps({"prompt": os.urandom(1 << 20).hex()}).encode()
    sent = forwarded(body)  # the same bytes plus the injected cache_salt
    want = {"len": len(sent), "sha": hashlib.sha256(sent).hexdigest()}
    for _ in range(4):
        r = http.post(gw.url + COMPL, content=body)
        assert r.status_code == 200 and r.json() == want, r.text
    assert resetter.requests, "the resetting worker was never tried"
    assert all(q["body"] == sent for q in resetter.requests)


def test_connect_timeout_moves_on(simworker, kvgate):
    # A listener whose accept queue is full: SYNs go unanswered, connects hang.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    port = hole.getsockname()[1]
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)
    sw = simworker(time_scale=0)
    try:
        gw = kvgate(config={"health": QUIET_HEALTH, "upstream": {"connect_timeout_ms": 200},
                            "workers": [{"name": "hole", "url": f"http://127.0.0.1:{port}"},
                                        worker_cfg(sw)]})
        for _ in range(4):
            t0 = time.monotonic()
            r = post(gw)
            assert r.status_code == 200 and r.headers["x-kvgate-worker"] == sw.name
            assert time.monotonic() - t0 < 2
        samples = gw.scrape()
        assert gw.metric("kvgate_worker_retries_total", samples, worker="hole") >= 1
        assert gw.metric("kvgate_timeouts_total", samples) >= 1
    finally:
        for s in fillers:
            s.close()
        hole.close()


def test_worker_early_413_passes_through(simworker, kvgate):
    sw = simworker(time_scale=0, max_body_bytes=2048)
    gw = kvgate(sw)
    for size in (10000, 4 << 20):
        r = http.post(gw.url + COMPL, content=json.dumps({"prompt": "x" * size}))
        assert r.status_code == 413, r.text[:200]
        assert r.headers["x-kvgate-worker"] == sw.name
    assert post(gw).status_code == 200


def test_pool_is_bounded_and_idle_connections_expire(kvgate, fake_upstream):
    def slow_answer(req, sock):
        time.sleep(0.3)  # long enough for all the requests to need their own connection
        json_response(sock, {"ok": True})
        return True

    up = fake_upstream(slow_answer, name="pooled")
    gw = kvgate(up, threads=1, config={
        "health": QUIET_HEALTH,
        "upstream": {"max_idle_per_worker": 2, "idle_timeout_ms": 1000}})
    assert wait_for(lambda: up.live == 0, 3)  # the start-up health check is done
    h = H2Client(gw.port)
    try:
        streams = h.wait([h.request("POST", COMPL, BODY) for _ in range(8)])
        assert all(s.status == 200 for s in streams)
    finally:
        h.close()
    assert len(up.requests) == 8
    # 8 connections were needed at once; 2 stay in the pool, the rest are closed.
    assert wait_for(lambda: up.live == 2, 3), up.live
    time.sleep(0.2)
    assert up.live == 2
    # Unused, the pooled ones go after the upstream idle timeout.
    assert wait_for(lambda: up.live == 0, 3), up.live
