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
import select
import socket
import time

import h2.errors

from gwhelpers import (COMPL, H2Client, H2Stream, RawHTTP, assert_openai_error, http,
                       request_bytes, wait_for)

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
        for path in ("/healthz", "/metrics", "/readyz"):  # fresh connections of the operator
            r = http.get(gw.admin_url + path, headers={"authorization": f"Bearer {gw.token}"})
            assert r.status_code == 200, (path, r.status_code)
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


# ---- memory: request bodies and responses ---------------------------------------------------------


def start_upload(port, length, sent, headers=None):
    """An HTTP/1.1 upload that declares `length` bytes and sends `sent` of them (an unfinished
    JSON prompt), then waits."""
    c = RawHTTP(port, timeout=10)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for k, v in (headers or {}).items():
        head += b"%s: %s\r\n" % (k.encode(), v.encode())
    prefix = b'{"model": "sim-model", "max_tokens": 1, "prompt": "'
    c.send(head + b"Content-Length: %d\r\n\r\n" % length + (prefix + b"x" * length)[:sent])
    return c


def early_statuses(conns, wait=1.0):
    """For each connection, the status of an answer that came within `wait` seconds (all
    waited for together), or None."""
    time.sleep(wait)
    ready = set(select.select([c.sock for c in conns], [], [], 0)[0])
    out = []
    for c in conns:
        if c.sock in ready:
            c.sock.settimeout(5)
            out.append(c.read_head())
        else:
            out.append(None)
    return out


def answered_early(c, timeout=0.5):
    """The status of an answer that came before the upload finished, or None (without
    reading: a timed-out read would leave the connection's file unusable)."""
    if not select.select([c.sock], [], [], timeout)[0]:
        return None
    c.sock.settimeout(5)
    return c.read_head()


def test_body_budget_refuses_new_bodies_instead_of_growing(simworker, kvgate):
    """Sixteen uploads that send most of a body and stall pinned about 600 MiB. With the body
    budget (scaled down here: 1 MiB, bodies of 100 KiB, each counted twice for the rewritten
    copy) the bodies that would pass it get 503 with Retry-After before a byte is read, the
    held bytes stay within the budget, and once the stalled uploads end the budget is free
    again."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"body_bytes": 256 * 1024, "body_budget_mib": 1,
                                       "read_timeout_ms": 10000, "body_min_rate": 0}})
    size = 100 * 1024
    uploads = [start_upload(gw.port, size, size - 1024) for _ in range(16)]
    try:
        early = early_statuses(uploads)
        refused = [c for c, st in zip(uploads, early) if st == 503]
        assert len(refused) == 16 - 5, early  # 5 x 2 x 100 KiB fit in 1 MiB
        for c in refused:
            assert c.headers["retry-after"] == "1"
            assert "budget" in assert_openai_error(c.body(), 503, "overloaded")["message"]
        held = gw.metric("kvgate_buffer_bytes", kind="request_body")
        assert 5 * 2 * size <= held <= 1 << 20, held
        assert gw.metric("kvgate_buffer_budget_bytes", kind="request_body") == 1 << 20
        assert gw.metric("kvgate_buffer_refusals_total", scope="gateway") == 11
        # One more upload takes exactly what is left (each counts 2 x length + 128)...
        rest = int((1 << 20) - held - 128) // 2
        uploads.append(start_upload(gw.port, rest, rest - 1024))
        assert early_statuses(uploads[-1:]) == [None]
        assert gw.metric("kvgate_buffer_bytes", kind="request_body") == 1 << 20
        # ... and the operator's requests with bodies are not held to the exhausted budget.
        r = gw.admin.put("/admin/v1/policy", json={"policy": "cost"})
        assert r.status_code == 200, r.text
    finally:
        for c in uploads:
            c.close()
    # The stalled ones are gone (closed by us; or the read timeout): the budget is free.
    assert wait_for(lambda: gw.metric("kvgate_buffer_bytes", kind="request_body") == 0, 5)
    r = http.post(gw.url + COMPL, json={"model": "sim-model", "prompt": "x" * size,
                                        "max_tokens": 1}, timeout=10)
    assert r.status_code == 200, r.text


def test_body_budget_counts_bodies_of_unknown_length_as_they_arrive(simworker, kvgate):
    """HTTP/2 uploads without content-length are counted as their DATA arrives: the one that
    would pass the budget gets 503 while the others go on, and a completed body's rewritten
    copy is counted before it is routed (so it completes once there is room for the copy)."""
    sw = simworker(time_scale=0, kv_blocks=16384, max_model_len=200000)  # 100k-token prompts
    gw = kvgate(sw, config={"limits": {"body_bytes": 512 * 1024, "body_budget_mib": 1,
                                       "body_min_rate": 0}})
    part = b'{"model": "sim-model", "max_tokens": 1, "prompt": "' + b"x" * (400 * 1024)

    def upload():  # one connection each: a connection's own bound is two bodies
        h = H2Client(gw.port)
        for _ in range(20):  # the gateway's windows: 1 MiB per stream, 16 MiB per connection
            if h.conn.outbound_flow_control_window >= 1 << 20:
                break
            h.pump(0.2)
        sid = h.conn.get_next_available_stream_id()
        h.conn.send_headers(sid, [(":method", "POST"), (":path", COMPL), (":scheme", "http"),
                                  (":authority", "t")])
        h.streams[sid] = H2Stream(sid)
        h._send_body(sid, part, False)
        h.flush()
        return h, h.streams[sid]

    clients = []
    try:
        for i in range(3):
            clients.append(upload())
            if i < 2:
                assert wait_for(lambda: gw.metric("kvgate_buffer_bytes", kind="request_body")
                                >= (i + 1) * len(part), 3)
        h3, third = clients[2]
        h3.wait([third], timeout=5)
        assert third.status == 503, third.status
        assert "budget" in assert_openai_error(bytes(third.data), 503, "overloaded")["message"]
        (h1, first), (h2c, second) = clients[:2]
        assert not first.done and not second.done
        # The first body's copy does not fit while the second holds its bytes...
        h1._send_body(first.id, b'"}', True)
        h1.flush()
        h1.wait([first])
        assert first.status == 503
        # ... and fits once the second is cancelled.
        h2c.reset(second)
        assert wait_for(lambda: gw.metric("kvgate_buffer_bytes", kind="request_body") == 0, 3)
        h4, fourth = upload()
        clients.append((h4, fourth))
        h4._send_body(fourth.id, b'"}', True)
        h4.flush()
        h4.wait([fourth])
        assert fourth.status == 200
    finally:
        for h, _ in clients:
            h.close()
    assert wait_for(lambda: gw.metric("kvgate_buffer_bytes", kind="request_body") == 0, 3)
    assert gw.metric("kvgate_buffer_refusals_total", scope="gateway") == 2


def test_one_tenant_cannot_take_the_whole_body_budget(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, auth="keys", config={"limits": {"body_bytes": 256 * 1024,
                                                    "body_budget_mib": 1,
                                                    "tenant_body_share": 50,
                                                    "body_min_rate": 0}})
    keys = {}
    for tenant in ("greedy", "other"):
        assert gw.admin.put(f"/admin/v1/tenants/{tenant}", json={"sharing": "isolated"}
                            ).status_code in (200, 201)
        keys[tenant] = gw.admin.post(f"/admin/v1/tenants/{tenant}/keys").json()["key"]
    size = 100 * 1024
    auth = {"Authorization": f"Bearer {keys['greedy']}"}
    uploads = []
    try:
        # One at a time, each counted before the next starts: the gateway's two threads would
        # otherwise take the three heads in either order.
        for i in range(3):
            uploads.append(start_upload(gw.port, size, size - 1024, auth))
            if i < 2:
                assert wait_for(lambda: gw.metric("kvgate_tenant_buffered_bytes",
                                                  tenant="greedy") >= (i + 1) * 2 * size, 3)
        early = early_statuses(uploads)
        assert early == [None, None, 429], early  # 2 x 2 x 100 KiB fit in half of 1 MiB
        assert uploads[2].headers["retry-after"] == "1"
        assert_openai_error(uploads[2].body(), 429, "rate_limit_error")
        assert gw.metric("kvgate_tenant_rate_limited_total", tenant="greedy",
                         reason="buffer") == 1
        held = gw.metric("kvgate_tenant_buffered_bytes", tenant="greedy")
        assert 2 * 2 * size <= held <= 2 * 2 * size + 1024, held
        # Another tenant still has room.
        r = http.post(gw.url + COMPL, json={"model": "sim-model", "prompt": "x" * size,
                                            "max_tokens": 1},
                      headers={"Authorization": f"Bearer {keys['other']}"}, timeout=10)
        assert r.status_code == 200, r.text
        assert gw.metric("kvgate_buffer_refusals_total", scope="tenant") == 1
    finally:
        for c in uploads:
            c.close()
    assert wait_for(lambda: gw.metric("kvgate_tenant_buffered_bytes", tenant="greedy") == 0, 5)


def test_minimum_upload_rate(simworker, kvgate):
    """A byte before each read timeout used to keep a body open forever; the minimum rate,
    measured over each window of read_timeout_ms, ends it with 408."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"read_timeout_ms": 1000, "body_min_rate": 1024}})
    c = start_upload(gw.port, 100000, 60)
    try:
        status = None
        deadline = time.monotonic() + 6
        while status is None and time.monotonic() < deadline:
            try:
                c.sock.sendall(b"x" * 10)  # 20 bytes/s, a gap of 0.5 s: under the read timeout
            except OSError:
                pass
            status = answered_early(c, 0.5)
        assert status == 408, status
        assert "too slowly" in assert_openai_error(c.body(), 408)["message"]
    finally:
        c.close()
    # A fast upload of the same size is fine.
    r = http.post(gw.url + COMPL, json={"model": "sim-model", "prompt": "x" * 100000,
                                        "max_tokens": 1}, timeout=10)
    assert r.status_code == 200


def test_response_budget_bounds_what_slow_readers_pin(kvgate, fake_upstream):
    """Sixteen streams whose client reads nothing: without a bound each queues 256 KiB and
    more; past limits.response_budget_mib every response keeps only the low-water mark."""
    w = EndlessWorker(fake_upstream)
    gw = kvgate(config={"limits": {"response_budget_mib": 1}}, args=["--worker", f"w={w.up.url}"])
    h = H2Client(gw.port, timeout=10, auto_ack=False)
    try:
        streams = [h.request("POST", COMPL, {"model": "m", "prompt": "endless"})
                   for _ in range(16)]
        samples = []
        for _ in range(50):  # until the queued bytes have stopped growing for a while
            h.pump(0.2)
            samples.append(gw.metric("kvgate_buffer_bytes", kind="response"))
            if len(samples) >= 4 and samples[-1] == samples[-4] and samples[-1] >= 1 << 20:
                break
        queued = samples[-1]
        # Measured (2026-12-01): 1.9 MiB with the budget at 1 MiB, 3.9 MiB without.
        assert (1 << 20) <= queued <= 2.5 * (1 << 20), samples
        assert not any(s.done for s in streams)
    finally:
        h.close()
    assert wait_for(lambda: gw.metric("kvgate_buffer_bytes", kind="response") == 0, 5)


def test_a_last_response_never_read_does_not_hold_the_connection(kvgate, fake_upstream):
    """Connection: close and a 3 MiB answer the client never reads. Whether the gateway still
    waits on the worker when the client stops (the response's send timeout ends it) or the
    kernel took enough that the exchange ended with bytes still queued (the connection's linger
    ends it: kvg_conn_linger) depends on how far the kernel grew its buffers, and varies from
    run to run on loopback; either way the connection, its descriptor and the queued bytes go
    after limits.send_timeout_ms without progress."""
    size = 3 << 20

    def handler(req, sock):
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n" % size + b"x" * size)
        return True

    up = fake_upstream(handler, name="big")
    gw = kvgate(up, config={"limits": {"send_timeout_ms": 1000}})
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", gw.port))
    try:
        s.sendall(request_bytes("POST", COMPL, {"model": "m", "prompt": "big"},
                                {"Connection": "close"}))
        assert wait_for(lambda: gw.metric("kvgate_connections_open") == 1, 2)
        assert wait_for(lambda: gw.metric("kvgate_connections_open") == 0, 6)
        assert gw.metric("kvgate_send_timeouts_total") == 1
        assert gw.metric("kvgate_worker_inflight") == 0
    finally:
        s.close()
