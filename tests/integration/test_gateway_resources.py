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
