# SPDX-License-Identifier: Apache-2.0
"""kvgate's process lifecycle: SIGTERM drains (in-flight streams finish, new connections are
refused, exit 0) up to a deadline; SIGHUP reloads workers from the config file and reopens the
access log; --check-config, --help, --version and start-up failures."""
import json
import signal
import socket
import subprocess
import time

import h2.errors
import httpx
from conftest import binary, child_env
from gwhelpers import (CHAT, COMPL, H2Client, RawHTTP, http, request_bytes, sim_metric, sse_data,
                       wait_for, worker_cfg)


def stream_body(max_tokens, chat=True):
    if chat:
        return {"messages": [{"role": "user", "content": "go"}], "max_tokens": max_tokens,
                "stream": True}
    return {"prompt": "go", "max_tokens": max_tokens, "stream": True}


def refused(port):
    """Nothing accepts on port. (A connect that races with the listeners closing may be reset,
    or its SYN dropped so that it times out: the kernel discards what was queued on a closed
    SO_REUSEPORT socket.)"""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except (ConnectionRefusedError, ConnectionResetError, TimeoutError):
        return True


def run_kvgate(*args, env=None, timeout=20):
    p = subprocess.run([str(binary("kvgate")), *args], capture_output=True, timeout=timeout,
                       env=child_env(env), stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


# ---- shutdown -------------------------------------------------------------------------------------


def test_sigterm_drains_in_flight_streams(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=30000, time_scale=1)
    gw = kvgate(sw)
    idle = RawHTTP(gw.port)
    idle.send(request_bytes("POST", COMPL, {"prompt": "x", "max_tokens": 1}))
    assert idle.response()[0] == 200
    c = RawHTTP(gw.port)
    c.send(request_bytes("POST", CHAT, stream_body(40)))
    h = H2Client(gw.port)
    s = h.request("POST", COMPL, stream_body(40, chat=False))
    try:
        assert c.read_head() == 200
        chunks = c.chunks()
        first = next(chunks)[1]
        assert wait_for(lambda: h.pump(0.1) and s.data, 3)
        t0 = time.monotonic()
        gw.signal(signal.SIGTERM)
        # New connections are refused once the drain began; idle ones are closed.
        assert wait_for(lambda: refused(gw.port), 2), "still accepting after SIGTERM"
        assert idle.closed_by_peer(2)
        r = http.get(gw.admin_url + "/readyz")
        assert r.status_code == 503, r.text
        assert gw.metric("kvgate_shutting_down") == 1
        # The h2 client is told (GOAWAY, no error) and its stream still completes.
        h.wait([s], timeout=10)
        assert s.ended and s.status == 200
        assert sse_data(s.data.decode())[-1] == "[DONE]"
        assert h.goaway is not None and h.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        # The HTTP/1.1 stream completes too, then its connection closes.
        rest = b"".join(p for _, p in chunks)
        assert c.complete
        events = sse_data((first + rest).decode())
        assert events[-1] == "[DONE]" and len(events) == 42
        assert c.headers.get("connection") != "keep-alive"
        assert c.closed_by_peer(2)
    finally:
        c.close()
        idle.close()
        h.close()
    gw.close_admin()
    assert gw.proc.wait(10) == 0
    took = time.monotonic() - t0
    assert 0.5 < took < 5, took  # it waited for the streams (about 1.2 s), then left
    log = gw.log()
    assert "SIGTERM: draining" in log and "stopped" in log


def test_shutdown_deadline_cuts_long_streams(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=50000, time_scale=1)
    gw = kvgate(sw, config={"shutdown_timeout_ms": 400})
    c = RawHTTP(gw.port)
    h = H2Client(gw.port)
    try:
        c.send(request_bytes("POST", CHAT, stream_body(2000)))
        s = h.request("POST", CHAT, stream_body(2000))
        assert c.read_head() == 200
        assert wait_for(lambda: h.pump(0.1) and s.data, 3)
        t0 = time.monotonic()
        gw.signal(signal.SIGTERM)
        body = c.body()
        assert not c.complete and b"[DONE]" not in body
        while h.pump(3):
            pass
        assert not s.ended
    finally:
        c.close()
        h.close()
    gw.close_admin()
    assert gw.proc.wait(10) == 0
    took = time.monotonic() - t0
    assert 0.3 < took < 3, took
    assert "shutdown deadline reached" in gw.log()
    # The worker's sequences were cancelled, not left running.
    assert wait_for(lambda: sim_metric(sw, "vllm:num_requests_running") == 0, 3)


def test_second_signal_stops_at_once(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=50000, time_scale=1)
    gw = kvgate(sw)  # the default deadline is 30 s
    c = RawHTTP(gw.port)
    try:
        c.send(request_bytes("POST", CHAT, stream_body(2000)))
        assert c.read_head() == 200
        next(c.chunks())
        gw.signal(signal.SIGINT)
        time.sleep(0.2)
        assert gw.alive()  # draining
        t0 = time.monotonic()
        gw.signal(signal.SIGTERM)
        gw.close_admin()
        assert gw.proc.wait(5) == 0
        assert time.monotonic() - t0 < 2
        assert c.closed_by_peer(2)
    finally:
        c.close()
    assert "stopping now" in gw.log()


def test_sigterm_when_idle_exits_at_once(kvgate, simworker):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    assert http.post(gw.url + COMPL, json={"prompt": "x", "max_tokens": 1}).status_code == 200
    # An idle h2 connection stays open meanwhile.
    with httpx.Client(http2=True, http1=False, verify=False) as client:
        assert client.get(gw.url + "/v1/models").status_code == 200
        t0 = time.monotonic()
        gw.close_admin()
        gw.signal(signal.SIGTERM)
        assert gw.proc.wait(5) == 0
        assert time.monotonic() - t0 < 2


# ---- reload ---------------------------------------------------------------------------------------


def test_sighup_reload_adds_and_removes_workers(simworker, kvgate):
    a, b = simworker(time_scale=0), simworker(time_scale=0)
    config = {"workers": [worker_cfg(a)]}
    gw = kvgate(config=config)

    def routed(n=6):
        return {http.post(gw.url + COMPL, json={"prompt": "x", "max_tokens": 1},
                           timeout=5).headers["x-kvgate-worker"] for _ in range(n)}

    def names():
        return [w["name"] for w in gw.admin.get("/admin/v1/workers").json()["workers"]]

    assert routed() == {a.name}
    gw.write_config({"workers": [worker_cfg(a), worker_cfg(b)]})
    gw.reload()
    assert wait_for(lambda: names() == sorted([a.name, b.name]), 5)
    assert routed() == {a.name, b.name}  # the new worker takes traffic
    assert gw.metric("kvgate_worker_requests_total", worker=b.name) > 0
    # A bad file changes nothing.
    gw.config_path.write_text('{"workers": [], "no_such_key": 1}')
    gw.reload()
    assert wait_for(lambda: "reload failed" in gw.log(), 5)
    assert "no_such_key" in gw.log()
    assert names() == sorted([a.name, b.name])
    # Removing a worker from the file removes it from routing; in-flight ones are unaffected.
    gw.write_config({"workers": [worker_cfg(b)]})
    gw.reload()
    assert wait_for(lambda: names() == [b.name], 5)
    assert routed() == {b.name}
    assert gw.alive()


def test_sighup_reopens_access_log(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    assert http.post(gw.url + COMPL, json={"prompt": "x", "max_tokens": 1}).status_code == 200
    assert wait_for(lambda: gw.access_log.exists() and gw.access_log.read_text(), 2)
    rotated = gw.access_log.with_suffix(".1")
    gw.access_log.rename(rotated)
    gw.reload()
    assert wait_for(lambda: gw.access_log.exists(), 3)
    r = http.post(gw.url + COMPL, json={"prompt": "y", "max_tokens": 1},
                   headers={"x-request-id": "after-rotation"})
    assert r.status_code == 200
    assert wait_for(lambda: "after-rotation" in gw.access_log.read_text(), 2)
    assert "after-rotation" not in rotated.read_text()


# ---- command line ---------------------------------------------------------------------------------


def test_check_config(tmp_path, simworker):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({
        "listen": ["127.0.0.1:0"], "admin": {"listen": ["127.0.0.1:0"]},
        "limits": {"header_bytes": 8192, "body_bytes": 1048576},
        "upstream": {"retries": 1},
        "workers": [{"name": "w1", "url": "http://127.0.0.1:8001", "models": ["m"]},
                    {"name": "w2", "url": "http://[::1]:8002"}]}))
    rc, out, err = run_kvgate("--check-config", "-c", str(good))
    assert rc == 0, err
    assert "configuration ok" in out and "2 workers" in out
    bad = {
        "unknown-key": ({"listen": ["127.0.0.1:0"], "limitz": {}}, "limitz"),
        "wrong-type": ({"threads": "many"}, "threads"),
        "out-of-range": ({"limits": {"header_bytes": 10}}, "header_bytes"),
        "bad-url": ({"workers": [{"name": "w", "url": "https://x:1"}]}, "w"),
        "duplicate-worker": ({"workers": [{"name": "w", "url": "http://a:1"},
                                          {"name": "w", "url": "http://b:1"}]}, "twice"),
        "bad-listen": ({"listen": ["nowhere"]}, "nowhere"),
        "tls-half": ({"listen": [{"address": "127.0.0.1:0", "tls_cert": "c.pem"}]}, "tls"),
    }
    for name, (cfg, needle) in bad.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(cfg))
        rc, out, err = run_kvgate("--check-config", "-c", str(f))
        assert rc != 0, name
        assert needle in err, (name, err)
    f = tmp_path / "not.json"
    f.write_text("{ this is not json")
    rc, _, err = run_kvgate("--check-config", "-c", str(f))
    assert rc != 0 and err
    rc, _, err = run_kvgate("--check-config", "-c", str(tmp_path / "missing.json"))
    assert rc != 0 and "missing.json" in err
    # Flags are checked too.
    rc, _, err = run_kvgate("--check-config", "--threads", "lots")
    assert rc != 0 and "--threads" in err
    rc, _, err = run_kvgate("--check-config", "--worker", "nourl")
    assert rc != 0 and "NAME=URL" in err


def test_help_version_and_bad_flags():
    rc, out, err = run_kvgate("--help")
    assert rc == 0
    for flag in ("--listen", "--tls-cert", "--admin-listen", "--worker", "--check-config",
                 "--port-file", "--access-log", "--threads", "--version", "KVGATE_ADMIN_TOKEN"):
        assert flag in out, flag
    rc, out, err = run_kvgate("--version")
    assert rc == 0 and out.startswith("kvgate ") and "nghttp2" in out
    rc, out, err = run_kvgate("--no-such-flag")
    assert rc != 0 and "--no-such-flag" in err
    rc, out, err = run_kvgate("stray-argument")
    assert rc != 0 and "stray-argument" in err


def test_start_fails_cleanly_on_a_busy_port(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        rc, out, err = run_kvgate("--listen", f"127.0.0.1:{port}", "--admin-listen",
                                  "127.0.0.1:0", "--state", str(tmp_path / "st"),
                                  "--threads", "2", env={"KVGATE_ADMIN_TOKEN": "x" * 20})
    finally:
        busy.close()
    # A clean error and a non-zero exit; under ASan any leak on this path fails here too.
    assert rc == 1, (rc, err)
    assert "cannot listen" in out + err
    assert "Sanitizer" not in err


def test_several_listeners_and_port_file(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, listen=["127.0.0.1:0", "127.0.0.1:0"])
    assert len(gw.front_ports) == 2 and gw.front_ports[0] != gw.front_ports[1]
    for port in gw.front_ports:
        r = http.post(f"http://127.0.0.1:{port}{COMPL}", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 200
    # The admin API is not on the front listeners, nor the front API on the admin one.
    r = http.get(gw.url + "/metrics", headers={"authorization": f"Bearer {gw.token}"})
    assert r.status_code == 404
    r = gw.admin.post(COMPL, json={"prompt": "x"})
    assert r.status_code == 404


def test_shutdown_with_everything_pending(simworker, kvgate, fake_upstream, tls_cert):
    """SIGTERM while requests wait in every state (connecting to a worker that never accepts,
    waiting for slow headers, streaming into a paused client), while clients are halfway
    through a head, a body, a TLS hello, an h2 preface, and an admin request: the deadline
    closes them all and the process exits 0 (under ASan: without leaks)."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    fillers = []
    for _ in range(3):  # fill the accept queue: further connects hang
        f = socket.socket()
        f.setblocking(False)
        try:
            f.connect(hole.getsockname())
        except BlockingIOError:
            pass
        fillers.append(f)

    def endless(req, sock):
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (1 << 30))
        try:
            while True:
                sock.sendall(b"x" * 65536)
        except OSError:
            return False

    slow = simworker(time_scale=0, slow_headers_ms=5000, model="slow")
    up = fake_upstream(endless, name="endless")
    gw = kvgate(tls=tls_cert, config={
        "shutdown_timeout_ms": 500,
        "health": {"interval_ms": 100, "timeout_ms": 5000, "fall": 100},
        "workers": [{"name": "hole", "url": "http://127.0.0.1:%d" % hole.getsockname()[1],
                     "models": ["hole"]},
                    {"name": "slow", "url": slow.url, "models": ["slow"]},
                    {"name": "endless", "url": up.url, "models": ["endless"]}]})
    conns = []
    h = H2Client(gw.port)
    try:
        for model in ("hole", "slow", "endless"):
            c = RawHTTP(gw.port)
            c.send(request_bytes("POST", COMPL, {"model": model, "prompt": "x"}))
            conns.append(c)
            h.request("POST", COMPL, {"model": model, "prompt": "x"})
        for port, data in (
                (gw.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"),
                (gw.port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{"),
                (gw.port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
                (gw.port, b"PRI * HTTP/2.0\r\n"),
                (gw.admin_port, b"GET /metrics HTTP/1.1\r\n")):
            c = RawHTTP(port)
            c.send(data)
            conns.append(c)
        assert gw.admin.get("/healthz").status_code == 200  # and an idle admin connection
        assert wait_for(lambda: gw.metric("kvgate_worker_inflight") == 6, 3)
        t0 = time.monotonic()
        gw.signal(signal.SIGTERM)
        assert gw.proc.wait(10) == 0
        assert time.monotonic() - t0 < 3
    finally:
        gw.close_admin()
        h.close()
        for c in conns:
            c.close()
        for f in fillers:
            f.close()
        hole.close()
    assert "shutdown deadline reached" in gw.log()


def test_log_levels(kvgate):
    gone = {"health": {"interval_ms": 100, "timeout_ms": 100, "fall": 2, "rise": 1},
            "workers": [{"name": "gone", "url": "http://127.0.0.1:1"}]}
    quiet = kvgate(log_level="warn", name="quiet", config=gone)
    loud = kvgate(log_level="debug", name="loud", config=gone)
    for gw in (quiet, loud):
        assert wait_for(lambda: "[warn] worker gone is down" in gw.log(), 5)
    assert "[info]" not in quiet.log() and "[debug]" not in quiet.log()
    assert "[info]" in loud.log()
    assert "[debug] health check of gone failed" in loud.log()
