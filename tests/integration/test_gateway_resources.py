# SPDX-License-Identifier: Apache-2.0
"""Resources a client can exhaust without a key, and the limits that keep them (issue 9):
descriptors (the accept back-off, the front connection limit that refuses politely, the admin
listener that stays reachable), slow readers that would hold worker slots (the send timeout),
and memory held by request bodies and responses (the budgets, the minimum upload rate, each
tenant's share). Real sockets throughout; raw bytes where a library client would not misbehave
as needed."""
import json
import pathlib
import resource
import socket
import threading
import time

import h2.errors
import pytest

from gwhelpers import (COMPL, H2Client, RawHTTP, assert_openai_error, http, request_bytes,
                       wait_for)

BODY = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}


def cpu_seconds(pid):
    """User + system CPU time of a process so far (from /proc/PID/stat)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def soft_nofile(pid):
    for line in pathlib.Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no descriptor limit")


def peer_closed(sock):
    """True when the other end closed (or reset) the connection; never blocks."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def reads_to_close(sock, timeout=5.0):
    """Read whatever is left until the other end's close (True) or the timeout (False)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 20):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def served(gw):
    r = http.post(gw.url + COMPL, json=BODY, timeout=5)
    assert r.status_code == 200, r.text
    return True


def connect_many(port, n):
    """n TCP connections; the kernel completes them from the backlog even when the gateway
    does not accept. Returns those that connected."""
    out = []
    for _ in range(n):
        try:
            out.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    return out


# ---- descriptors --------------------------------------------------------------------------------


def test_soft_descriptor_limit_is_raised_to_the_hard_one(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, wrap=["prlimit", "--nofile=256:4096", "--"])
    assert soft_nofile(gw.proc.pid) == 4096
    assert "descriptor limit raised from 256 to 4096" in gw.log()
    assert served(gw)


def test_descriptor_exhaustion_pauses_accepts_instead_of_spinning(simworker, kvgate):
    """At the descriptor limit the listening socket stays readable and every accept fails:
    without a back-off the thread spins at 100% writing a log line per failure. With it, the
    gateway sleeps, logs once per episode, counts the failures, and serves again as soon as
    descriptors free up, without having marked the worker down meanwhile."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, threads=1)
    assert served(gw)
    gw.scrape()  # the admin client's keep-alive connection is open before the limit drops
    resource.prlimit(gw.proc.pid, resource.RLIMIT_NOFILE, (64, 64))
    conns = connect_many(gw.port, 120)
    try:
        before = cpu_seconds(gw.proc.pid)
        time.sleep(2.0)
        spent = cpu_seconds(gw.proc.pid) - before
        assert spent < 0.5, f"the gateway spent {spent:.2f} s of CPU in 2 s at the fd limit"
        assert gw.log().count("cannot accept") <= 6, gw.log()[-2000:]
        assert gw.metric("kvgate_accept_errors_total", reason="descriptors") >= 1
    finally:
        for c in conns:
            c.close()
    # Health checks that could not open a socket said nothing about the worker.
    assert wait_for(lambda: http.post(gw.url + COMPL, json=BODY, timeout=5).status_code == 200,
                    5)
    assert gw.metric("kvgate_worker_up") == 1
    assert "accepts again" in gw.log()


def test_connection_limit_refuses_politely_and_admin_stays_reachable(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"max_connections": 4}})
    assert gw.metric("kvgate_connections_limit") == 4
    held = [RawHTTP(gw.port, timeout=5) for _ in range(4)]
    try:
        held[0].send(request_bytes("POST", COMPL, BODY))
        assert held[0].response()[0] == 200  # the four are being served
        assert wait_for(lambda: gw.metric("kvgate_connections_open") == 4, 3)
        # HTTP/1.1 over the limit: a 503 it can read, with Retry-After, then close.
        c = RawHTTP(gw.port, timeout=5)
        try:
            c.send(request_bytes("POST", COMPL, BODY))
            status, headers, body = c.response()
            assert status == 503
            assert headers["retry-after"] == "1"
            assert "connection limit" in assert_openai_error(body, 503, "overloaded")["message"]
            assert c.closed_by_peer()
        finally:
            c.close()
        # HTTP/2 over the limit: GOAWAY(NO_ERROR) naming no stream, so a retry is safe.
        h = H2Client(gw.port, timeout=5)
        try:
            while h.pump(2):
                pass
            assert h.goaway is not None
            assert h.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
            assert h.goaway.last_stream_id == 0
        finally:
            h.close()
        # The operator still gets in.
        assert http.get(gw.admin_url + "/healthz").status_code == 200
        assert gw.metric("kvgate_connections_refused_total", listener="front") == 2
    finally:
        for c in held:
            c.close()
    # Room again.
    assert wait_for(lambda: gw.metric("kvgate_connections_open") == 0, 3)
    assert served(gw)


def test_front_flood_under_a_low_descriptor_limit(simworker, kvgate):
    """With the descriptor limit at 256 the front takes what the reserve leaves (64); a flood
    of 300 connections is refused past that, and the admin listener and a client with a
    connection of its own are served throughout."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, wrap=["prlimit", "--nofile=256:256", "--"])
    limit = gw.metric("kvgate_connections_limit")
    assert 16 <= limit <= 128, limit
    keeper = RawHTTP(gw.port, timeout=5)  # connected before the flood
    conns = connect_many(gw.port, 300)
    try:
        wait_for(lambda: gw.metric("kvgate_connections_refused_total", listener="front") >=
                 len(conns) - limit - 1, 5)
        assert gw.metric("kvgate_connections_open") <= limit
        assert http.get(gw.admin_url + "/healthz").status_code == 200
        keeper.send(request_bytes("POST", COMPL, BODY))
        assert keeper.response()[0] == 200
        assert gw.metric("kvgate_accept_errors_total", reason="descriptors") == 0
    finally:
        keeper.close()
        for c in conns:
            c.close()
    assert wait_for(lambda: gw.metric("kvgate_connections_open") == 0, 5)
    assert served(gw)


def test_admin_listener_makes_room_by_closing_its_oldest_idle_connection(simworker, kvgate):
    """Slowloris on the admin listener: its connections still sending a head are the first
    to go when the operator connects."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"admin": {"max_connections": 4}})
    gw.close_admin()
    slow = []
    try:
        for _ in range(3):
            # Fill the listener with slow heads (again), then the operator's request gets in.
            while sum(not peer_closed(c.sock) for c in slow) < 4:
                c = RawHTTP(gw.admin_port, timeout=5)
                c.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                slow.append(c)
            r = http.get(gw.admin_url + "/healthz")
            assert r.status_code == 200
        time.sleep(0.2)
        assert sum(peer_closed(c.sock) for c in slow) >= 3
        assert gw.metric("kvgate_admin_connections_evicted_total") >= 3
    finally:
        for c in slow:
            c.close()


# ---- slow readers -------------------------------------------------------------------------------


class EndlessWorker:
    """A worker that streams an endless SSE body for prompts that ask for it (until the
    gateway closes the connection, which it records as a cancellation) and answers anything
    else with a small JSON body."""

    def __init__(self, fake_upstream):
        self.cancelled = []
        self.up = fake_upstream(self.handle, name="endless")

    def handle(self, req, sock):
        if b"endless" not in req["body"]:
            body = json.dumps({"ok": True}).encode()
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            return True
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        event = b"data: " + b"x" * 16000 + b"\n\n"
        chunk = b"%x\r\n%s\r\n" % (len(event), event)
        try:
            while True:
                sock.sendall(chunk)
        except OSError:
            self.cancelled.append(time.monotonic())
        return False


def stalled_h1_client(port, prompt="endless"):
    """A client with a tiny receive buffer that sends one request and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(request_bytes("POST", COMPL, {"model": "m", "prompt": prompt}))
    return s


def test_slow_reader_loses_its_worker_slot_at_the_send_timeout(kvgate, fake_upstream):
    """Clients that stop reading their streams held every worker slot forever (a paused
    upstream has no read timeout). With limits.send_timeout_ms the response that moves no byte
    toward its client is aborted, the worker's request cancelled and the slot freed; the access
    log and a metric say why."""
    w = EndlessWorker(fake_upstream)
    gw = kvgate(config={"limits": {"send_timeout_ms": 1000}},
                args=["--worker", f"endless={w.up.url},max_inflight=2"])
    stalled = [stalled_h1_client(gw.port) for _ in range(2)]
    try:
        assert wait_for(lambda: len(w.cancelled) == 2, 15), \
            f"{len(w.cancelled)} of 2 stalled streams cancelled"
        # The slots are free: a new request is served, not refused with 503.
        r = http.post(gw.url + COMPL, json={"model": "m", "prompt": "short"}, timeout=5)
        assert r.status_code == 200, r.text
        assert all(reads_to_close(s) for s in stalled)  # HTTP/1.1: the connection goes
    finally:
        for s in stalled:
            s.close()
    assert gw.metric("kvgate_send_timeouts_total") == 2
    assert gw.metric("kvgate_worker_requests_total", code="499") == 2
    assert wait_for(lambda: gw.metric("kvgate_worker_inflight") == 0, 3)
    timed_out = [e for e in gw.access_entries() if e["error"] == "send_timeout"]
    assert len(timed_out) == 2 and all(e["status"] == 200 for e in timed_out), timed_out


def test_h2_stream_with_a_shut_window_is_reset_and_the_connection_lives(kvgate, fake_upstream):
    """An HTTP/2 client that never opens a stream's flow-control window: that stream is reset
    (CANCEL) at the send timeout and its worker request cancelled; the connection, whose socket
    is fine, goes on serving."""
    w = EndlessWorker(fake_upstream)
    gw = kvgate(config={"limits": {"send_timeout_ms": 1000}},
                args=["--worker", f"endless={w.up.url},max_inflight=1"])
    h = H2Client(gw.port, timeout=10, auto_ack=False)
    try:
        stuck = h.request("POST", COMPL, {"model": "m", "prompt": "endless"})
        h.wait([stuck], timeout=15)
        assert stuck.reset == h2.errors.ErrorCodes.CANCEL, stuck.reset
        assert wait_for(lambda: len(w.cancelled) == 1, 5)
        # The reset stream's DATA used up the connection's window too: give that back.
        h.conn.increment_flow_control_window(1 << 20)
        h.auto_ack = True
        ok = h.request("POST", COMPL, {"model": "m", "prompt": "short"})
        h.wait([ok])
        assert ok.status == 200
    finally:
        h.close()
    assert gw.metric("kvgate_send_timeouts_total") == 1
