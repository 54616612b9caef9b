# SPDX-License-Identifier: Apache-2.0
"""Keeping failing workers out (issue 14): passive outlier detection ejects a worker after a
streak of 5xx answers for a time that grows with repeated ejections, never the last worker of a
model; a 502/503/504 answered before anything reached the client is retried on another worker,
under a retry budget; the gateway's own 503s count against no worker. Times are short
(milliseconds) and every wait is bounded; nothing here asserts a latency."""
import concurrent.futures
import time

import httpx

from gwhelpers import COMPL, assert_openai_error, http, wait_for, worker_cfg

BODY = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
# Health checks that never get in the way (the first round still runs at start).
QUIET_HEALTH = {"interval_ms": 600000, "fall": 100, "rise": 1}
ERROR_BODY = b'{"error":{"message":"busy","type":"server_error","param":null,"code":null}}'


def post(gw, body=BODY, **kw):
    return http.post(gw.url + COMPL, json=body, timeout=10, **kw)


def round_robin(gw):
    r = gw.admin.put("/admin/v1/policy", json={"policy": "round_robin"})
    assert r.status_code == 200, r.text


def outlier_state(gw, name):
    r = gw.admin.get(f"/admin/v1/workers/{name}")
    assert r.status_code == 200, r.text
    return r.json()["outlier"]


def answer_503(req, sock):
    sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(ERROR_BODY), ERROR_BODY))
    return True


def config(workers, outlier=None, **upstream):
    up = dict(upstream)
    if outlier is not None:
        up["outlier"] = outlier
    return {"health": QUIET_HEALTH, "upstream": up, "workers": workers}


def test_failing_worker_is_ejected_returns_and_is_ejected_longer(simworker, kvgate):
    bad = simworker(time_scale=0, error_rate=1.0, name="bad")
    a, b = simworker(time_scale=0), simworker(time_scale=0)
    gw = kvgate(config=config([worker_cfg(bad), worker_cfg(a), worker_cfg(b)],
                              outlier={"consecutive_5xx": 3, "base_ejection_ms": 3000,
                                       "max_ejection_ms": 60000}))
    round_robin(gw)
    codes = []
    while len(codes) < 30 and codes.count(500) < 3:
        codes.append(post(gw).status_code)
    assert codes.count(500) == 3, codes  # the 500s are the worker's, passed on (not retried)
    st = outlier_state(gw, "bad")
    assert st["ejected"] is True and st["ejections"] == 1 and st["multiplier"] == 1, st
    assert st["ejected_until"] and 0 < st["remaining_ms"] <= 3000, st
    assert st["consecutive_5xx"] == 0, st
    samples = gw.scrape()
    assert gw.metric("kvgate_worker_ejections_total", samples, worker="bad") == 1
    assert gw.metric("kvgate_worker_ejected", samples, worker="bad") == 1
    assert gw.metric("kvgate_worker_ejected", samples, worker=a.name) == 0
    # Route explain leaves it out and says so.
    ex = gw.admin.post("/admin/v1/route/explain", json={"request": BODY}).json()
    assert ex["serving"] == 3 and ex["ejected"] == 1, ex
    assert {c["worker"] for c in ex["candidates"]} == {a.name, b.name}, ex
    # Out of routing while ejected: every request succeeds on the two others.
    for _ in range(12):
        r = post(gw)
        assert r.status_code == 200, r.text
        assert r.headers["x-kvgate-worker"] in (a.name, b.name)
    assert outlier_state(gw, "bad")["ejected"] is True
    # Back when the time is up: it gets traffic again, fails again, and is out twice as long.
    assert wait_for(lambda: outlier_state(gw, "bad")["ejected"] is False, timeout=10)
    assert gw.metric("kvgate_worker_ejected", worker="bad") == 0
    codes = []
    while len(codes) < 30 and codes.count(500) < 3:
        codes.append(post(gw).status_code)
    assert codes.count(500) == 3, codes
    st = outlier_state(gw, "bad")
    assert st["ejected"] is True and st["ejections"] == 2 and st["multiplier"] == 2, st
    assert 3000 < st["remaining_ms"] <= 6000, st
    assert gw.metric("kvgate_worker_ejections_total", worker="bad") == 2
    assert "worker bad ejected for 6000 ms" in gw.log()


def test_max_ejection_percent_keeps_the_last_worker(simworker, kvgate):
    bad1 = simworker(time_scale=0, error_rate=1.0, name="bad1")
    bad2 = simworker(time_scale=0, error_rate=1.0, name="bad2")
    gw = kvgate(config=config([worker_cfg(bad1), worker_cfg(bad2)],
                              outlier={"consecutive_5xx": 2, "base_ejection_ms": 60000,
                                       "max_ejection_percent": 100}))
    round_robin(gw)
    for _ in range(12):
        r = post(gw)
        # Always the worker's own 500: never "no healthy worker" from the gateway.
        assert r.status_code == 500, r.text
        assert_openai_error(r.content, 500, "InternalServerError")
    ejected = [n for n in ("bad1", "bad2") if outlier_state(gw, n)["ejected"]]
    assert len(ejected) == 1, ejected  # one of two may go, the last one stays
    samples = gw.scrape()
    assert gw.metric("kvgate_worker_ejections_total", samples) == 1
    # A model served by a single worker never loses it.
    solo = simworker(time_scale=0, error_rate=1.0, name="solo")
    gw2 = kvgate(config=config([worker_cfg(solo)], outlier={"consecutive_5xx": 1}))
    for _ in range(4):
        assert post(gw2).status_code == 500
    assert outlier_state(gw2, "solo")["ejections"] == 0


def test_503_from_a_worker_is_retried_on_another(simworker, kvgate, fake_upstream):
    busy = fake_upstream(answer_503, name="busy")
    sw = simworker(time_scale=0)
    # Detection off: the busy worker stays in and keeps being tried first half the time.
    gw = kvgate(config=config([worker_cfg(busy), worker_cfg(sw)],
                              outlier={"consecutive_5xx": 0, "consecutive_gateway_failure": 0}))
    round_robin(gw)
    for i in range(8):
        r = post(gw, headers={"x-request-id": f"r{i}"})
        assert r.status_code == 200, r.text
        assert r.headers["x-kvgate-worker"] == sw.name
    assert busy.requests  # it was asked, and its answer held back
    samples = gw.scrape()
    retries = gw.metric("kvgate_worker_retries_total", samples, worker="busy")
    assert retries == len(busy.requests) >= 3, (retries, len(busy.requests))
    assert gw.metric("kvgate_worker_requests_total", samples, worker=sw.name, code="200") == 8
    logged = [e for e in gw.access_entries() if e["path"] == COMPL]
    assert sum(e["retries"] for e in logged) == retries
    assert all(e["status"] == 200 and e["worker"] == sw.name for e in logged)
    assert all(e["retries"] in (0, 1) for e in logged)


def test_503_is_passed_on_when_not_in_retry_on(simworker, kvgate, fake_upstream):
    busy = fake_upstream(answer_503, name="busy")
    gw = kvgate(config=config([worker_cfg(busy)], retry_on=["connect-failure", "reset"]))
    r = post(gw)
    assert r.status_code == 503
    assert r.headers["x-kvgate-worker"] == "busy"
    assert r.content == ERROR_BODY
    assert gw.metric("kvgate_worker_retries_total") == 0


def test_failure_after_the_head_was_streamed_is_not_retried(simworker, kvgate, fake_upstream):
    def head_then_close(req, sock):
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n8\r\ndata: {}\r\n")
        time.sleep(0.05)
        return False  # close mid-stream

    def answer_200(req, sock):
        body = b'{"object":"text_completion","choices":[]}'
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        return True

    dying = fake_upstream(head_then_close, name="dying")
    spare = fake_upstream(answer_200, name="spare")
    gw = kvgate(config=config([worker_cfg(dying), worker_cfg(spare)],
                              outlier={"consecutive_5xx": 0, "consecutive_gateway_failure": 0}))
    round_robin(gw)
    broken = 0
    for _ in range(6):
        before = len(spare.requests)
        try:
            r = post(gw)
        except httpx.HTTPError:
            broken += 1
            assert len(spare.requests) == before  # not retried: the head had gone out
            continue
        assert r.status_code == 200 and r.headers["x-kvgate-worker"] == "spare"
    assert broken >= 2, broken
    assert gw.metric("kvgate_worker_retries_total", worker="dying") == 0


def test_retry_budget_refuses_when_spent(simworker, kvgate, fake_upstream):
    busy = fake_upstream(answer_503, name="busy")
    sw = simworker(time_scale=0)
    gw = kvgate(config=config([worker_cfg(busy), worker_cfg(sw)], retry_budget_percent=0,
                              retry_budget_min_concurrency=0,
                              outlier={"consecutive_5xx": 0, "consecutive_gateway_failure": 0}))
    round_robin(gw)
    codes = [post(gw).status_code for _ in range(8)]
    assert sorted(set(codes)) == [200, 503], codes  # the busy worker's 503s reach the client
    samples = gw.scrape()
    assert gw.metric("kvgate_upstream_retry_budget_exceeded_total", samples) == codes.count(503)
    assert gw.metric("kvgate_worker_retries_total", samples) == 0
    assert gw.metric("kvgate_upstream_retries_active", samples) == 0


def test_retry_budget_bounds_concurrent_retries(simworker, kvgate, fake_upstream):
    # One retry at a time (min concurrency 1, no share): while a retried request is slow on the
    # good worker, other requests that meet the busy one are refused their retry.
    busy = fake_upstream(answer_503, name="busy")
    slow = simworker(time_scale=0, slow_headers_ms=3000)
    gw = kvgate(config=config([worker_cfg(busy), worker_cfg(slow)], retry_budget_percent=0,
                              retry_budget_min_concurrency=1,
                              outlier={"consecutive_5xx": 0, "consecutive_gateway_failure": 0}))
    round_robin(gw)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = [f.result().status_code for f in [pool.submit(post, gw) for _ in range(8)]]
    samples = gw.scrape()
    refused = gw.metric("kvgate_upstream_retry_budget_exceeded_total", samples)
    retried = gw.metric("kvgate_worker_retries_total", samples, worker="busy")
    assert refused >= 1 and retried >= 1, (codes, refused, retried)
    assert codes.count(503) == refused, codes
    assert gw.metric("kvgate_upstream_retries_active", samples) == 0


def test_gateway_own_503_counts_against_no_worker(simworker, kvgate):
    a = simworker(time_scale=0, slow_headers_ms=3000)
    b = simworker(time_scale=0, slow_headers_ms=3000)
    gw = kvgate(config=config([worker_cfg(a, max_inflight=1), worker_cfg(b, max_inflight=1)],
                              outlier={"consecutive_5xx": 1, "consecutive_gateway_failure": 1}))
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        rs = [f.result() for f in [pool.submit(post, gw) for _ in range(6)]]
    codes = sorted(r.status_code for r in rs)
    assert codes.count(200) == 2 and codes.count(503) == 4, codes
    for r in rs:
        if r.status_code == 503:
            assert_openai_error(r.content, 503, "overloaded")
    for w in (a, b):
        st = outlier_state(gw, w.name)
        assert st["ejections"] == 0 and st["consecutive_gateway_failures"] == 0, st
    assert gw.metric("kvgate_worker_ejections_total") == 0


def test_settings_are_checked(tmp_path):
    import json
    import subprocess

    from conftest import binary, child_env

    def check(upstream):
        f = tmp_path / "cfg.json"
        f.write_text(json.dumps({"upstream": upstream}))
        p = subprocess.run([str(binary("kvgate")), "--check-config", "-c", str(f)],
                           capture_output=True, timeout=20, env=child_env({}),
                           stdin=subprocess.DEVNULL)
        return p.returncode, p.stderr.decode()

    assert check({"retry_on": [], "retry_budget_percent": 0,
                  "outlier": {"consecutive_5xx": 0, "max_ejection_percent": 100}})[0] == 0
    rc, err = check({"retry_on": ["503", "5xx"]})
    assert rc != 0 and 'upstream.retry_on[1]: must be one of "connect-failure"' in err, err
    rc, err = check({"retry_on": "503"})
    assert rc != 0 and "upstream.retry_on: must be an array of strings, not string" in err, err
    rc, err = check({"outlier": {"base_ejection_ms": 5000, "max_ejection_ms": 1000}})
    assert rc != 0 and "upstream.outlier.max_ejection_ms: must be at least base_ejection_ms" in err
    rc, err = check({"outlier": {"max_ejection_percent": 101}})
    assert rc != 0 and "upstream.outlier.max_ejection_percent: must be an integer in 0..100" in err
    rc, err = check({"outlier": {"interval_ms": 10}})
    assert rc != 0 and "upstream.outlier.interval_ms: unknown field" in err, err


def test_unreachable_worker_is_ejected_by_gateway_failures(simworker, kvgate):
    from gwhelpers import dead_port

    a, b = simworker(time_scale=0), simworker(time_scale=0)
    dead = {"name": "dead", "url": f"http://127.0.0.1:{dead_port()}"}
    gw = kvgate(config=config([dead, worker_cfg(a), worker_cfg(b)],
                              outlier={"consecutive_5xx": 0, "consecutive_gateway_failure": 2,
                                       "base_ejection_ms": 60000}))
    round_robin(gw)
    for _ in range(9):
        r = post(gw)
        assert r.status_code == 200, r.text  # connect failures are retried transparently
    st = outlier_state(gw, "dead")
    assert st["ejected"] is True and st["ejections"] == 1, st
    samples = gw.scrape()
    # Two connect failures, each retried; then the worker was out of the ranking.
    assert gw.metric("kvgate_worker_retries_total", samples, worker="dead") == 2
    logged = [e for e in gw.access_entries() if e["path"] == COMPL]
    assert sum(e["retries"] for e in logged) == 2
