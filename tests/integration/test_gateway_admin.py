# SPDX-License-Identifier: Apache-2.0
"""The admin listener of a running kvgate: bearer auth (401), probes, the workers API changing
routing without a restart (PUT, GET, DELETE, drain), /metrics in Prometheus text with the
gateway's series, tokens from the environment, the config and the state directory; and the
access log, one JSON line per request."""
import json
import re
import stat
import time


from gwhelpers import (CHAT, COMPL, H2Client, assert_openai_error, http, sse_data, wait_for,
                       worker_cfg)

BODY = {"prompt": "hi", "max_tokens": 1}


def post(gw, body=BODY, path=COMPL, **kw):
    return http.post(gw.url + path, json=body, timeout=10, **kw)


def routed(gw, n=8):
    out = []
    for _ in range(n):
        r = post(gw)
        assert r.status_code == 200, r.text
        out.append(r.headers["x-kvgate-worker"])
    return out


# ---- authentication -------------------------------------------------------------------------------


def test_admin_auth(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    url = gw.admin_url
    cases = [
        ({}, "missing Authorization header", 'Bearer realm="kvgate-admin"'),
        ({"authorization": "Basic dXNlcjpwYXNz"}, "scheme must be Bearer",
         'Bearer realm="kvgate-admin"'),
        ({"authorization": "Bearer"}, "missing bearer token", 'Bearer realm="kvgate-admin"'),
        ({"authorization": "Bearer wrong-token-123"}, "invalid admin token",
         'Bearer realm="kvgate-admin", error="invalid_token"'),
    ]
    for path in ("/metrics", "/admin/v1/workers", "/no/such/path"):
        for headers, message, challenge in cases:
            r = http.get(url + path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.headers["www-authenticate"] == challenge
            err = assert_openai_error(r.content, 401, "authentication_error", admin=True)
            assert message in err["message"]
    # Probes need no token.
    r = http.get(url + "/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = http.get(url + "/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    # The scheme is case-insensitive and blanks around the token are ignored.
    r = http.get(url + "/admin/v1/workers", headers={"authorization": f"bearer   {gw.token}"})
    assert r.status_code == 200
    r = http.get(url + "/no/such/path", headers={"authorization": f"Bearer {gw.token}"})
    assert r.status_code == 404
    assert_openai_error(r.content, 404, "not_found_error", admin=True)
    # Failures are logged, the presented tokens never.
    log = gw.log()
    assert "wrong-token-123" not in log and gw.token not in log
    assert "invalid admin token" in log


def test_generated_token_in_state_dir(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, token=None, name="gen")
    path = gw.state_dir / "admin-token"
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    ok = http.get(gw.admin_url + "/admin/v1/workers", headers={"authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    assert gw.stop() == 0
    # A restart on the same state directory keeps it.
    again = kvgate(sw, token=None, name="gen")
    assert (again.state_dir / "admin-token").read_text().strip() == token
    r = http.get(again.admin_url + "/metrics", headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200


def test_config_tokens_rotate_on_reload(simworker, kvgate):
    sw = simworker(time_scale=0)
    old, new = "old-token-0123456789", "new-token-9876543210"
    gw = kvgate(token=None, config={"admin": {"tokens": [old]}, "workers": [worker_cfg(sw)]})

    def code(token):
        return http.get(gw.admin_url + "/admin/v1/workers",
                         headers={"authorization": f"Bearer {token}"}).status_code

    assert (code(old), code(new)) == (200, 401)
    gw.write_config({"admin": {"tokens": [old, new]}, "workers": [worker_cfg(sw)]})
    gw.reload()
    assert wait_for(lambda: code(new) == 200, 5)
    assert code(old) == 200  # both during the rotation
    gw.write_config({"admin": {"tokens": [new]}, "workers": [worker_cfg(sw)]})
    gw.reload()
    assert wait_for(lambda: code(old) == 401, 5)
    assert code(new) == 200


# ---- workers API ----------------------------------------------------------------------------------


def test_workers_api_changes_routing_without_restart(simworker, kvgate):
    a, b = simworker(time_scale=0), simworker(time_scale=0)
    gw = kvgate(config={"workers": [worker_cfg(a)]})
    admin = gw.admin
    assert set(routed(gw)) == {a.name}
    # PUT: a new worker takes traffic at once.
    r = admin.put(f"/admin/v1/workers/{b.name}", json={"url": b.url, "kv_blocks": 128})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created == {"name": b.name, "url": b.url, "models": [], "kv_blocks": 128,
                       "max_inflight": 1024, "cache_salt": True, "kv_events_stale_ms": 5000,
                       "source": "admin", "health": "up", "draining": False, "inflight": 0,
                       "outlier": {"ejected": False, "ejected_until": None, "remaining_ms": 0,
                                   "consecutive_5xx": 0, "consecutive_gateway_failures": 0,
                                   "ejections": 0, "multiplier": 0},
                       "kv_events_status": {"state": "off", "index_source": "model"}}
    assert set(routed(gw)) == {a.name, b.name}
    listed = admin.get("/admin/v1/workers").json()["workers"]
    assert [(w["name"], w["source"]) for w in listed] == sorted(
        [(a.name, "config"), (b.name, "admin")])
    assert admin.get(f"/admin/v1/workers/{b.name}").json()["kv_blocks"] == 128
    # Drain: no new requests for it.
    r = admin.post(f"/admin/v1/workers/{a.name}/drain")
    assert r.status_code == 200 and r.json()["draining"] is True
    before = gw.metric("kvgate_worker_requests_total", worker=a.name)
    assert set(routed(gw, 10)) == {b.name}
    assert gw.metric("kvgate_worker_requests_total", worker=a.name) == before
    assert gw.metric("kvgate_worker_draining", worker=a.name) == 1
    # The same definition again puts a drained worker back in service.
    r = admin.post(f"/admin/v1/workers/{b.name}/drain")
    assert r.status_code == 200
    r = post(gw)
    assert r.status_code == 503  # both drained
    assert_openai_error(r.content, 503)
    assert http.get(gw.admin_url + "/readyz").status_code == 503
    r = admin.put(f"/admin/v1/workers/{b.name}", json={"url": b.url, "kv_blocks": 128})
    assert r.status_code == 200 and r.json()["draining"] is False
    assert set(routed(gw)) == {b.name}
    # DELETE: gone from routing and from the list.
    r = admin.delete(f"/admin/v1/workers/{b.name}")
    assert r.status_code == 204 and r.content == b""
    assert admin.get(f"/admin/v1/workers/{b.name}").status_code == 404
    assert admin.delete(f"/admin/v1/workers/{b.name}").status_code == 404
    r = post(gw)
    assert r.status_code == 503
    # An admin definition of a config worker's name hides it (and undrains that name).
    r = admin.put(f"/admin/v1/workers/{a.name}", json={"url": a.url})
    assert r.status_code in (200, 201) and r.json()["source"] == "admin"
    assert set(routed(gw)) == {a.name}
    # Validation errors name the field.
    r = admin.put("/admin/v1/workers/x", json={"url": "http://127.0.0.1"})
    assert r.status_code == 400
    assert assert_openai_error(r.content, 400, admin=True)["message"].startswith("url:")
    r = admin.put("/admin/v1/workers/x", json={"url": b.url, "kv_block": 1})
    assert r.status_code == 400 and "kv_block" in r.json()["error"]["message"]
    r = admin.get("/admin/v1/workers/x/drain")
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_admin_worker_models_route_by_model(simworker, kvgate):
    a = simworker(time_scale=0, model=["m1"])
    b = simworker(time_scale=0, model=["m2"])
    gw = kvgate()
    assert gw.admin.put(f"/admin/v1/workers/{a.name}",
                        json={"url": a.url, "models": ["m1"]}).status_code == 201
    assert gw.admin.put(f"/admin/v1/workers/{b.name}",
                        json={"url": b.url, "models": ["m2"]}).status_code == 201
    assert sorted(m["id"] for m in http.get(gw.url + "/v1/models").json()["data"]) == \
        ["m1", "m2"]
    for model, name in (("m1", a.name), ("m2", b.name)):
        for _ in range(3):
            r = post(gw, {"model": model, **BODY})
            assert r.status_code == 200 and r.headers["x-kvgate-worker"] == name
    assert post(gw, {"model": "m3", **BODY}).status_code == 404
    # Admin workers survive a reload (this gateway runs without a config file: SIGHUP only
    # reopens the access log and re-reads the flags).
    gw.reload()
    time.sleep(0.3)
    assert len(gw.admin.get("/admin/v1/workers").json()["workers"]) == 2


def test_drain_lets_in_flight_requests_finish(simworker, kvgate):
    a = simworker(model="slow", prefill_us_per_token=0, decode_us_per_token=30000,
                  time_scale=1)
    b = simworker(model="fast", time_scale=0)
    gw = kvgate(config={"workers": [worker_cfg(a, models=["slow"]),
                                    worker_cfg(b, models=["fast"])]})
    h = H2Client(gw.port)
    try:
        s = h.request("POST", CHAT, {"model": "slow", "messages": [{"role": "user",
                                                                      "content": "x"}],
                                     "max_tokens": 30, "stream": True})
        assert wait_for(lambda: h.pump(0.1) and s.data, 3)
        w = gw.admin.post(f"/admin/v1/workers/{a.name}/drain").json()
        assert w["draining"] is True and w["inflight"] == 1
        assert post(gw, {"model": "slow", **BODY}).status_code == 503
        h.wait([s])
        assert s.status == 200 and s.headers["x-kvgate-worker"] == a.name
        assert s.ended and sse_data(s.data.decode())[-1] == "[DONE]"
    finally:
        h.close()
    assert wait_for(lambda: gw.admin.get(f"/admin/v1/workers/{a.name}").json()["inflight"]
                    == 0, 3)
    # Once it is idle it can be deleted; the others keep serving.
    assert gw.admin.delete(f"/admin/v1/workers/{a.name}").status_code == 204
    assert post(gw, {"model": "fast", **BODY}).status_code == 200
    assert post(gw, {"model": "slow", **BODY}).status_code == 404


# ---- metrics --------------------------------------------------------------------------------------


def test_metrics(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    r = gw.admin.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    before = gw.scrape()
    for _ in range(3):
        assert post(gw).status_code == 200
    assert http.get(gw.url + "/nope").status_code == 404
    r = post(gw, {"model": "unknown-model", **BODY})  # the worker answers 404 itself
    assert r.status_code == 404
    text = gw.admin.get("/metrics").text
    after = gw.scrape()

    def delta(name, **labels):
        return gw.metric(name, after, **labels) - gw.metric(name, before, **labels)

    # Every family announced with HELP and TYPE.
    for family, kind in (("kvgate_worker_up", "gauge"), ("kvgate_worker_draining", "gauge"),
                         ("kvgate_worker_inflight", "gauge"),
                         ("kvgate_worker_max_inflight", "gauge"),
                         ("kvgate_worker_requests_total", "counter"),
                         ("kvgate_worker_request_duration_seconds", "histogram"),
                         ("kvgate_worker_ttfb_seconds", "histogram"),
                         ("kvgate_worker_retries_total", "counter"),
                         ("kvgate_http_requests_total", "counter"),
                         ("kvgate_connections_total", "counter"),
                         ("kvgate_connections_open", "gauge")):
        assert f"# TYPE {family} {kind}\n" in text, family
        assert f"# HELP {family} " in text, family
    assert gw.metric("kvgate_worker_up", after, worker=sw.name) == 1
    assert gw.metric("kvgate_worker_inflight", after, worker=sw.name) == 0
    assert delta("kvgate_worker_requests_total", worker=sw.name, code="200") == 3
    assert delta("kvgate_worker_requests_total", worker=sw.name, code="404") == 1
    assert delta("kvgate_worker_request_duration_seconds_count", worker=sw.name) == 4
    assert delta("kvgate_worker_ttfb_seconds_count", worker=sw.name) == 4
    # Front counters: 3 + 1 proxied successes, plus the admin scrapes in between.
    assert delta("kvgate_http_requests_total", **{"class": "4xx"}) == 2
    assert 3 <= delta("kvgate_http_requests_total", **{"class": "2xx"}) <= 5
    # Histograms are cumulative and end at +Inf = _count.
    buckets = [(float(m.group(1)), after[k]) for k in after
               if (m := re.fullmatch(r'kvgate_worker_request_duration_seconds_bucket\{worker="'
                                     + sw.name + r'",le="([^"]+)"\}', k))]
    values = [v for _, v in sorted(buckets)]
    assert values == sorted(values) and len(values) >= 10
    assert values[-1] == gw.metric("kvgate_worker_request_duration_seconds_count", after,
                                   worker=sw.name)


# ---- access log -----------------------------------------------------------------------------------


def test_access_log_one_json_line_per_request(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    sent = {}
    body = json.dumps(BODY).encode()
    r = http.post(gw.url + COMPL, content=body, headers={"x-request-id": "log-ok",
                                                          "content-type": "application/json"})
    sent["log-ok"] = (200, len(body), len(r.content), "HTTP/1.1")
    r = http.get(gw.url + "/missing", headers={"x-request-id": "log-404"})
    sent["log-404"] = (404, 0, len(r.content), "HTTP/1.1")
    r = http.post(gw.url + COMPL, content=b"{bad", headers={"x-request-id": "log-400"})
    sent["log-400"] = (400, 4, len(r.content), "HTTP/1.1")
    h = H2Client(gw.port)
    try:
        stream = {"prompt": "x", "max_tokens": 3, "stream": True}
        (s,) = h.wait([h.request("POST", COMPL, stream, {"x-request-id": "log-h2"})])
        sent["log-h2"] = (200, len(json.dumps(stream)), len(s.data), "HTTP/2")
    finally:
        h.close()
    for i in range(5):
        assert post(gw, headers={"x-request-id": f"log-many-{i}"}).status_code == 200

    def entries():
        return [e for e in gw.access_entries() if e["request_id"].startswith("log-")]
    assert wait_for(lambda: len(entries()) == 9, 3), entries()
    by_id = {}
    for e in entries():
        assert e["request_id"] not in by_id, "two lines for one request"
        by_id[e["request_id"]] = e
    fields = {"time", "request_id", "remote", "proto", "tls", "method", "path", "status",
              "tenant", "worker", "retries", "bytes_in", "bytes_out", "duration_ms", "ttfb_ms",
              "error"}
    for rid, (status, bytes_in, bytes_out, proto) in sent.items():
        e = by_id[rid]
        assert set(e) >= fields, e
        assert e["status"] == status and e["proto"] == proto, e
        assert e["bytes_in"] == bytes_in and e["bytes_out"] == bytes_out, e
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["time"]), e
        assert e["remote"].startswith("127.0.0.1:")
        assert e["tls"] is False and e["tenant"] is None
        assert 0 <= e["ttfb_ms"] <= e["duration_ms"] < 5000
    assert by_id["log-ok"]["worker"] == sw.name and by_id["log-ok"]["error"] is None
    assert by_id["log-ok"]["method"] == "POST" and by_id["log-ok"]["path"] == COMPL
    assert by_id["log-404"]["worker"] is None and by_id["log-404"]["error"] == "not_found_error"
    assert by_id["log-400"]["error"] == "invalid_request_error"
    assert by_id["log-h2"]["worker"] == sw.name


def test_access_log_off_and_stdout(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, access_log=False)
    assert post(gw).status_code == 200
    assert not list(gw.log_path.parent.glob(f"{gw.name}-access.log"))
    out = kvgate(sw, access_log=False, args=["--access-log", "-"], name="stdout")
    assert post(out, headers={"x-request-id": "to-stdout"}).status_code == 200
    assert wait_for(lambda: '"request_id":"to-stdout"' in out.log(), 3)
    line = next(ln for ln in out.log().splitlines() if "to-stdout" in ln)
    assert json.loads(line)["status"] == 200


def test_redefine_and_delete_with_streams_in_flight(simworker, kvgate):
    a = simworker(prefill_us_per_token=0, decode_us_per_token=20000, time_scale=1)
    b = simworker(time_scale=0)
    gw = kvgate()
    assert gw.admin.put(f"/admin/v1/workers/{a.name}", json={"url": a.url}).status_code == 201
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 30, "stream": True}
    h = H2Client(gw.port)
    try:
        first = h.request("POST", CHAT, body)
        assert wait_for(lambda: h.pump(0.1) and first.data, 3)
        # A changed definition makes a fresh worker; the old one finishes its request.
        r = gw.admin.put(f"/admin/v1/workers/{a.name}", json={"url": a.url, "kv_blocks": 7})
        assert r.status_code == 200 and r.json()["inflight"] == 0
        second = h.request("POST", CHAT, body)
        assert wait_for(lambda: h.pump(0.1) and second.data, 3)
        # Deleting it lets the in-flight ones finish too.
        assert gw.admin.delete(f"/admin/v1/workers/{a.name}").status_code == 204
        assert gw.admin.put(f"/admin/v1/workers/{b.name}", json={"url": b.url}).status_code \
            == 201
        third = h.request("POST", COMPL, BODY)
        h.wait([first, second, third])
        for s in (first, second):
            assert s.ended and s.reset is None
            assert sse_data(s.data.decode())[-1] == "[DONE]"
        assert third.status == 200 and third.headers["x-kvgate-worker"] == b.name
    finally:
        h.close()
    assert [w["name"] for w in gw.admin.get("/admin/v1/workers").json()["workers"]] == [b.name]
