# SPDX-License-Identifier: Apache-2.0
"""The gateway attacked as a reviewer attacks nginx or HAProxy, over real loopback sockets:
TLS handshake slowloris and floods, renegotiation, ALPN confusion, HTTP/2 header blocks that
never end, the admin listener while the front is under attack, and SIGHUP reloads racing admin
writes and live traffic. Raw bytes (or `openssl s_client`) stand in for clients where a library
would refuse to send the attack. Each test asserts what the gateway does (cut, counted, refused,
still serving), never a timing tighter than a generous bound. The sections follow the list of
issue 9; its item 6, the timing of API-key lookups, is a benchmark (bench/auth), not a test."""
import concurrent.futures
import queue
import socket
import ssl
import subprocess
import threading
import time

import hpack
import httpx
import pytest

from conftest import ADMIN_TOKEN
from gwhelpers import COMPL, H2Client, RawHTTP, assert_openai_error, http, wait_for

BODY = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H1_GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


# ---- helpers --------------------------------------------------------------------------------------


def h2_frame(ftype, flags, sid, payload=b""):
    """One HTTP/2 frame, raw."""
    head = len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + sid.to_bytes(4, "big")
    return head + payload


def tls_context(alpn=None, version=None):
    """A client context that accepts the test's self-signed certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    if version:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


class Handshake:
    """A client-side TLS handshake driven by hand over a socket (ssl.MemoryBIO), so a test can
    stop at any step: after part of the ClientHello, after all of it, before the Finished."""

    def __init__(self, port, alpn=("h2", "http/1.1")):
        # The ClientHello is made before the connection: building the first context in a
        # process can take longer than a test's header timeout on a loaded machine, and a
        # connection that waited for it would be cut as silent rather than mid-handshake.
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = tls_context(list(alpn)).wrap_bio(self.incoming, self.outgoing)
        self.done = self._step()
        self.hello = self.outgoing.read()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.started = time.monotonic()

    def _step(self):
        try:
            self.tls.do_handshake()
            return True
        except ssl.SSLWantReadError:
            return False

    def server_flight(self):
        """Send the ClientHello, read the server's answer up to the point where the client
        would send its Finished; returns the client's last flight (not sent)."""
        self.sock.sendall(self.hello)
        while not self.done:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed during the handshake")
            self.incoming.write(data)
            self.done = self._step()
        return self.outgoing.read()

    def send(self, data):
        self.tls.write(data)
        self.sock.sendall(self.outgoing.read())

    def recv_plain(self, timeout):
        """Decrypted bytes until the server closes or the timeout passes."""
        self.sock.settimeout(timeout)
        out = b""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                self.incoming.write(data)
                try:
                    while True:
                        piece = self.tls.read(65536)
                        if not piece:
                            return out
                        out += piece
                except ssl.SSLZeroReturnError:
                    return out
                except ssl.SSLWantReadError:
                    pass
        except (socket.timeout, ConnectionResetError):
            pass
        return out

    def close(self):
        self.sock.close()


def close_times(socks, timeout):
    """Seconds from each socket's start until the server closed it (EOF or reset), reading and
    dropping whatever it sends; None for the ones still open after the timeout.
    socks: [(socket, start time)]."""
    open_ = {s: t for s, t in socks}
    closed = {}
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        for s in list(open_):
            s.setblocking(False)
            try:
                while True:
                    data = s.recv(65536)
                    if not data:
                        closed[s] = time.monotonic() - open_.pop(s)
                        break
            except BlockingIOError:
                pass
            except OSError:
                closed[s] = time.monotonic() - open_.pop(s)
        time.sleep(0.02)
    return [closed.get(s) for s, _ in socks]


def admin_get(gw, path, timeout=5):
    """One admin request on a fresh connection (keep-alive would hide an accept problem)."""
    return http.get(gw.admin_url + path, timeout=timeout,
                    headers={"authorization": f"Bearer {gw.token}"})


class Background:
    """A well-behaved client (front, over TLS when asked) and the operator (admin /healthz and
    /metrics on fresh connections) in threads while a test attacks; every answer is kept."""

    def __init__(self, gw, tls=False, admin=True):
        self.gw = gw
        self.url = (gw.https_url if tls else gw.url) + COMPL
        self.front, self.admin = [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run_front)]
        if admin:
            self.threads.append(threading.Thread(target=self.run_admin))
        for t in self.threads:
            t.start()

    def run_front(self):
        with httpx.Client(timeout=5, verify=False) as c:
            while not self.stop.is_set():
                try:
                    self.front.append(c.post(self.url, json=BODY).status_code)
                except httpx.HTTPError as e:
                    self.front.append(type(e).__name__)
                time.sleep(0.02)

    def run_admin(self):
        while not self.stop.is_set():
            for path in ("/healthz", "/metrics"):
                try:
                    self.admin.append(admin_get(self.gw, path, timeout=3).status_code)
                except httpx.HTTPError as e:
                    self.admin.append(type(e).__name__)
            time.sleep(0.05)

    def join(self):
        wait_for(lambda: self.front and (self.admin or len(self.threads) == 1), 5)
        self.stop.set()
        for t in self.threads:
            t.join()
        return self.front, self.admin


def deltas(gw, before, *names):
    after = gw.scrape()
    return {n: gw.metric(n, after) - gw.metric(n, before) for n in names}


# ---- 1. TLS handshake slowloris -------------------------------------------------------------------


def test_tls_handshake_slowloris_is_cut_and_counted(simworker, kvgate, tls_cert):
    """Connections that send nothing, half a ClientHello, or a whole one and then stall before
    their Finished are all cut at limits.header_timeout_ms, counted as timeouts, and the ones
    that had started TLS also as failed handshakes; a TLS client is served meanwhile."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert, config={"limits": {"header_timeout_ms": 600}})
    before = gw.scrape()
    bg = Background(gw, tls=True)
    slow = []
    try:
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
            slow.append(("silent", s, time.monotonic()))
        for _ in range(8):
            hs = Handshake(gw.port)
            hs.sock.sendall(hs.hello[:len(hs.hello) // 2])
            slow.append(("partial", hs.sock, hs.started))
        for _ in range(8):
            hs = Handshake(gw.port)
            hs.server_flight()  # the client's Finished is never sent
            slow.append(("stalled", hs.sock, hs.started))
        lifetimes = close_times([(s, t) for _, s, t in slow], timeout=10)
    finally:
        for _, s, _ in slow:
            s.close()
        front, admin = bg.join()
    by_kind = {}
    for (kind, _, _), t in zip(slow, lifetimes):
        by_kind.setdefault(kind, []).append(t)
    print("lifetimes (s):", {k: [round(t, 2) if t else t for t in v] for k, v in by_kind.items()})
    assert all(t is not None for t in lifetimes), by_kind
    assert all(0.4 < t < 5 for t in lifetimes), by_kind
    got = deltas(gw, before, "kvgate_timeouts_total", "kvgate_tls_handshake_failures_total")
    # Every one is a timeout; the 16 that had begun TLS are also handshakes that failed (the
    # counter an operator watches for TLS trouble must see a handshake slowloris).
    assert got == {"kvgate_timeouts_total": 24, "kvgate_tls_handshake_failures_total": 16}, got
    assert front and set(front) == {200}, front
    assert admin and set(admin) == {200}, admin


def test_tls_handshake_and_request_head_share_one_deadline(simworker, kvgate, tls_cert):
    """A client that spends most of header_timeout_ms on its handshake, then waits, then
    trickles a request head does not get a fresh deadline at each step: the 408 comes at
    about one header timeout after the connect (it came at up to three before)."""
    sw = simworker(time_scale=0)
    timeout_s = 1.5
    gw = kvgate(sw, tls=tls_cert, config={"limits": {"header_timeout_ms": int(timeout_s * 1000)}})
    hs = Handshake(gw.port, alpn=["http/1.1"])
    finished = hs.server_flight()
    time.sleep(timeout_s * 0.45)
    hs.sock.sendall(finished)
    time.sleep(timeout_s * 0.45)
    hs.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    answer = b""
    try:
        while time.monotonic() - hs.started < 3 * timeout_s + 2:
            hs.send(b"a")
            answer += hs.recv_plain(0.1)
            if answer:
                break
    except OSError:
        pass
    elapsed = time.monotonic() - hs.started
    answer += hs.recv_plain(2)
    hs.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert elapsed < 1.5 * timeout_s, elapsed  # one deadline (~1.0x), not three (~2.9x)


# ---- 2. TLS handshake flood -----------------------------------------------------------------------


def test_tls_handshake_flood_keeps_clients_and_admin_served(simworker, kvgate, tls_cert):
    """Hundreds of handshakes at once from 16 threads: a third complete and make a request,
    a third leave after the server's flight, a sixth after half a ClientHello, a sixth connect
    and close. A TLS client and the admin listener are served throughout, each abandoned
    handshake is counted once, and no connection is left behind. (RSS is printed, not
    asserted: ASan's quarantine would dominate it. TLS 1.3 sessions are cached server-side:
    about 2 KB a handshake up to a plateau near +14 MB.)"""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert, log_level="warn")
    before = gw.scrape()
    rss_before = gw.rss_kb()
    bg = Background(gw, tls=True)
    kinds = ["complete", "abandon_flight", "complete", "abandon_flight", "abandon_hello",
             "connect_close"] * 60

    def one(kind):
        if kind == "connect_close":
            socket.create_connection(("127.0.0.1", gw.port), timeout=10).close()
            return kind, True
        hs = Handshake(gw.port, alpn=["h2", "http/1.1"] if kind == "complete" else ["http/1.1"])
        try:
            if kind == "abandon_hello":
                hs.sock.sendall(hs.hello[:len(hs.hello) // 2])
                return kind, True
            finished = hs.server_flight()
            if kind == "abandon_flight":
                return kind, True
            hs.sock.sendall(finished)
            if hs.tls.selected_alpn_protocol() == "h2":
                h = H2Client(sock=_TLSSock(hs), timeout=10)
                s = h.request("GET", "/v1/models")
                h.wait([s])
                return kind, s.status == 200
            hs.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return kind, hs.recv_plain(10).startswith(b"HTTP/1.1 200 ")
        finally:
            hs.close()

    try:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, kinds))
        took = time.monotonic() - t0
    finally:
        front, admin = bg.join()
    print(f"{len(kinds)} handshakes in {took:.1f} s; front {len(front)} answers, admin "
          f"{len(admin)}; RSS {rss_before} -> {gw.rss_kb()} kB")
    assert all(ok for _, ok in results), [r for r in results if not r[1]][:5]
    abandoned = sum(k in ("abandon_flight", "abandon_hello") for k in kinds)
    assert wait_for(lambda: gw.metric("kvgate_tls_handshake_failures_total") -
                    gw.metric("kvgate_tls_handshake_failures_total", before) >= abandoned, 5)
    got = deltas(gw, before, "kvgate_tls_handshake_failures_total", "kvgate_timeouts_total")
    assert got == {"kvgate_tls_handshake_failures_total": abandoned,
                   "kvgate_timeouts_total": 0}, got
    # Nothing left open but the scrape's own admin connection.
    assert wait_for(lambda: gw.metric("kvgate_connections_open") <= 1, 5)
    assert front and set(front) == {200}, front
    assert admin and set(admin) == {200}, admin


class _TLSSock:
    """The socket interface H2Client uses, over a hand-driven Handshake."""

    def __init__(self, hs):
        self.hs = hs

    def settimeout(self, t):
        self.hs.sock.settimeout(t)

    def sendall(self, data):
        self.hs.send(data)

    def recv(self, n):
        while True:
            try:
                return self.hs.tls.read(n)
            except ssl.SSLWantReadError:
                data = self.hs.sock.recv(65536)
                if not data:
                    return b""
                self.hs.incoming.write(data)
            except ssl.SSLZeroReturnError:
                return b""

    def close(self):
        self.hs.close()


# ---- 3. renegotiation and key update --------------------------------------------------------------


class SClient:
    """openssl s_client driven through its stdin commands (R: renegotiate, K/k: TLS 1.3 key
    update); its output is collected by a thread."""

    def __init__(self, port, *args):
        self.proc = subprocess.Popen(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost",
             *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines = queue.Queue()
        self.text = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.decode(errors="replace"))
        self.lines.put(None)

    def wait_for(self, needle, timeout=10):
        """Collect output until needle appears (True) or the process ends or time runs out."""
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if line is None:
                self.lines.put(None)
                return needle in self.text
            self.text += line
        return True

    def write(self, data):
        # One write per command: s_client takes a command only at the start of what one read
        # returns, so commands and data must not share a read.
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        time.sleep(0.3)

    def finish(self, timeout=10):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.wait_for("\0", 2)  # drain the rest of the output
        return rc

    def wait_count(self, needle, n, timeout=10):
        """Collect output until needle has appeared n times; True if it did."""
        deadline = time.monotonic() + timeout
        while self.text.count(needle) < n and time.monotonic() < deadline:
            if not self.wait_for("\0", 0.2) and self.proc.poll() is not None and \
                    self.lines.empty():
                break
        return self.text.count(needle) >= n


def test_tls12_client_renegotiation_is_refused(simworker, kvgate, tls_cert):
    """A TLS 1.2 client asking to renegotiate gets the no_renegotiation alert and no second
    handshake; the gateway keeps serving everyone else. (gateway/tls.c sets
    SSL_OP_NO_RENEGOTIATION; OpenSSL 3 also refuses client renegotiation without it, unless
    SSL_OP_ALLOW_CLIENT_RENEGOTIATION is set, with which this test fails.)"""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert)
    c = SClient(gw.port, "-tls1_2")
    assert c.wait_for("Verify return code"), c.text  # printed once the handshake is done
    c.write(b"R\n")
    c.wait_for("no renegotiation", 5)
    # If the session went on (renegotiated or not), this request would be answered.
    try:
        c.write(H1_GET)
    except BrokenPipeError:
        pass
    rc = c.finish()
    assert "RENEGOTIATING" in c.text, c.text[-2000:]
    assert "no renegotiation" in c.text, c.text[-2000:]
    assert "HTTP/1.1 200" not in c.text, c.text[-2000:]
    assert rc != 0
    r = http.post(gw.https_url + COMPL, json=BODY)
    assert r.status_code == 200
    assert gw.alive()


def test_tls13_key_update_is_served(simworker, kvgate, tls_cert):
    """TLS 1.3 key updates, with and without asking the server to update its own keys, keep the
    connection serving requests."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert)
    c = SClient(gw.port, "-tls1_3")
    assert c.wait_for("Verify return code"), c.text  # printed once the handshake is done
    for n, cmd in enumerate((b"K\n", b"k\n"), 1):
        c.write(cmd)
        assert c.wait_count("KEYUPDATE", n), c.text[-2000:]
        c.write(H1_GET)
        assert c.wait_count("HTTP/1.1 200 OK", n), c.text[-2000:]
    c.write(b"Q\n")
    assert c.finish() == 0, c.text[-2000:]


# ---- 4. ALPN confusion ----------------------------------------------------------------------------


def h2_frames(data):
    """Split bytes into (type, flags, stream id, payload) HTTP/2 frames; asserts the framing."""
    frames = []
    while data:
        assert len(data) >= 9, data
        n = int.from_bytes(data[:3], "big")
        assert len(data) >= 9 + n, data
        frames.append((data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF,
                       data[9:9 + n]))
        data = data[9 + n:]
    return frames


def tls_exchange(port, alpn, payload, timeout=5):
    """Handshake with the given ALPN offer, send payload, read until the server closes:
    (selected protocol, decrypted bytes, seconds until closed or None if never)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.monotonic()
    with tls_context(alpn).wrap_socket(raw) as s:
        s.sendall(payload)
        got = b""
        closed = None
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    closed = time.monotonic() - t0
                    break
                got += data
        except (ConnectionResetError, ssl.SSLError):
            closed = time.monotonic() - t0
        except socket.timeout:
            pass
        return s.selected_alpn_protocol(), got, closed


@pytest.mark.parametrize("case", ["h2_then_http1", "http1_then_h2", "no_alpn_then_h2",
                                  "unknown_alpn_only"])
def test_alpn_confusion(simworker, kvgate, tls_cert, case):
    """What ALPN chose is the protocol spoken: the other protocol's bytes end the connection
    with that protocol's error (GOAWAY-less close for a bad preface, 400 for HTTP/1.1), an
    unknown protocol fails the handshake; never a hang, never a request served."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert, config={"limits": {"header_timeout_ms": 3000}})
    before = gw.scrape()
    if case == "unknown_alpn_only":
        with pytest.raises(ssl.SSLError, match="NO_APPLICATION_PROTOCOL|no application protocol"):
            tls_exchange(gw.port, ["spdy/3"], H1_GET)
        got = deltas(gw, before, "kvgate_tls_handshake_failures_total")
        assert got == {"kvgate_tls_handshake_failures_total": 1}, got
    elif case == "h2_then_http1":
        proto, data, closed = tls_exchange(gw.port, ["h2"], H1_GET)
        assert proto == "h2"
        assert closed is not None and closed < 3, closed  # at once, not at a timeout
        assert b"HTTP/1.1" not in data
        frames = h2_frames(data)  # only HTTP/2 frames: our SETTINGS, maybe a GOAWAY
        assert frames and frames[0][0] == 0x4, frames
        assert deltas(gw, before, "kvgate_protocol_errors_total") == {
            "kvgate_protocol_errors_total": 1}
    else:
        alpn = ["http/1.1"] if case == "http1_then_h2" else None
        proto, data, closed = tls_exchange(gw.port, alpn, PREFACE + h2_frame(0x4, 0, 0))
        assert proto == alpn[0] if alpn else proto is None
        assert closed is not None and closed < 3, closed
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), data[:200]
        assert b"connection: close" in head.lower()
        assert_openai_error(body, 400)
    # The worker never saw a request, and the gateway serves the right protocol after.
    assert gw.metric("kvgate_worker_requests_total") == 0
    with httpx.Client(http2=True, verify=False, timeout=10) as client:
        r = client.post(gw.https_url + COMPL, json=BODY)
        assert r.status_code == 200 and r.http_version == "HTTP/2"


# ---- 4b. HTTP/2 header blocks that never end ------------------------------------------------------


@pytest.mark.parametrize("when", ["first_stream", "after_a_request", "over_tls"])
def test_h2_unfinished_header_block_is_cut(simworker, kvgate, tls_cert, when):
    """HEADERS without END_HEADERS and no CONTINUATION after it: the client holds the whole
    connection (nothing else may be sent until the block ends), so the gateway cuts it at the
    header timeout (it was held forever: no timer ran while a header block was open)."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert, config={"limits": {"header_timeout_ms": 500}})
    before = gw.scrape()
    enc = hpack.Encoder()
    block = enc.encode([(":method", "GET"), (":path", "/v1/models"), (":scheme", "http"),
                        (":authority", "x")])
    if when == "over_tls":
        sock = tls_context(["h2"]).wrap_socket(
            socket.create_connection(("127.0.0.1", gw.port), timeout=10))
    else:
        sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    t0 = time.monotonic()
    sid = 1
    sock.sendall(PREFACE + h2_frame(0x4, 0, 0))
    if when == "after_a_request":
        sock.sendall(h2_frame(0x1, 0x5, 1, block))  # a whole request: END_STREAM|END_HEADERS
        got = b""
        while b"\x00\x01\x00\x00\x00\x01" not in got:  # DATA with END_STREAM on stream 1
            got += sock.recv(65536)
        sid = 3
        t0 = time.monotonic()
    sock.sendall(h2_frame(0x1, 0x1, sid, block[:3]))  # END_STREAM, no END_HEADERS
    closed = None
    sock.settimeout(0.2)
    while time.monotonic() - t0 < 6:
        try:
            if not sock.recv(65536):
                closed = time.monotonic() - t0
                break
        except socket.timeout:
            continue
        except (ConnectionResetError, ssl.SSLError):
            closed = time.monotonic() - t0
            break
    sock.close()
    assert closed is not None, "a connection with an open header block was never cut"
    assert 0.3 < closed < 4, closed
    assert deltas(gw, before, "kvgate_timeouts_total") == {"kvgate_timeouts_total": 1}
    assert http.post(gw.url + COMPL, json=BODY).status_code == 200


# ---- 5. the admin listener while the front (or the admin) is attacked -----------------------------


def test_admin_reachable_while_front_is_flooded_and_slowlorised(simworker, kvgate, tls_cert):
    """With 600 front connections held open (silent, trickling a head, half a ClientHello) the
    operator still reaches /healthz and /metrics on fresh connections, and a client is served."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert, log_level="warn",
                config={"limits": {"header_timeout_ms": 20000}})
    hello = Handshake(gw.port).hello
    held = []
    bg = None
    try:
        for i in range(600):
            s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
            if i % 3 == 1:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            elif i % 3 == 2:
                s.sendall(hello[:100])
            held.append(s)
        assert wait_for(lambda: gw.metric("kvgate_connections_open") >= 600, 10)
        bg = Background(gw, tls=True)
        t0 = time.monotonic()
        while len(bg.admin) < 6 and time.monotonic() - t0 < 8:
            for s in held[1::3]:
                s.sendall(b"X")  # trickle the heads
            time.sleep(0.1)
    finally:
        front, admin = bg.join() if bg else ([], [])
        for s in held:
            s.close()
    assert len(admin) >= 4 and set(admin) == {200}, admin
    assert front and set(front) == {200}, front


def test_admin_slowloris_is_cut_and_admin_stays_reachable(simworker, kvgate):
    """The admin listener's own slow clients get 408 at the header timeout, like the front's,
    while the operator's requests on fresh connections are answered."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"header_timeout_ms": 800}})
    slow = []
    try:
        for _ in range(50):
            c = RawHTTP(gw.admin_port, timeout=10)
            c.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(c)
        t0 = time.monotonic()
        codes = []
        while time.monotonic() - t0 < 0.6:
            codes.append(admin_get(gw, "/healthz").status_code)
            for c in slow:
                c.sock.sendall(b"X")
            time.sleep(0.05)
        statuses = [c.read_head() for c in slow]
        took = time.monotonic() - t0
    finally:
        for c in slow:
            c.close()
    assert codes and set(codes) == {200}, codes
    assert statuses == [408] * len(slow), statuses
    assert took < 5, took
    assert admin_get(gw, "/healthz").status_code == 200


def test_admin_refuses_a_strangers_body_unread(simworker, kvgate):
    """A request with a body and no valid token gets its 401 as soon as the head is in, as the
    front's bad API keys do: the admin listener no longer reads up to 1 MiB for each stranger
    first (200 such connections held 245 MB). The token holder's body is read as before."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    conns = []
    try:
        for i in range(40):
            c = RawHTTP(gw.admin_port, timeout=5)
            auth = b"Authorization: Bearer wrong-token\r\n" if i % 2 else b""
            c.send(b"PUT /admin/v1/workers/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n" +
                   auth + b"\r\n" + b"{" * 4096)  # a body that never ends
            conns.append(c)
        statuses = [c.read_head() for c in conns]
        assert statuses == [401] * len(conns), statuses
        assert all("bearer" in c.headers.get("www-authenticate", "").lower() for c in conns)
    finally:
        for c in conns:
            c.close()
    assert gw.admin.put("/admin/v1/workers/x", json={"url": sw.url}).status_code == 201
    assert gw.admin.get("/admin/v1/workers/x").json()["url"] == sw.url


# ---- 7. SIGHUP reloads racing admin writes and traffic --------------------------------------------


MODEL = "sim-model"
SANE = {200, 401, 404, 503}  # served, key revoked, no worker for the model, no worker up


def test_sighup_reloads_race_admin_writes_and_traffic(simworker, kvgate):
    """For a few seconds: SIGHUP in a loop with the config file rewritten between reloads
    (workers added, removed, changed), admin PUT/DELETE of workers and tenants and key
    creation and deletion, and HTTP/1.1 and HTTP/2 traffic with a steady key, revoked keys and
    keys in flux. Every answer is a documented status, a key whose DELETE was answered is
    refused from then on, the steady key is never refused, the final worker list is what the
    last config and the admin writes imply, and a restart on the state file restores it."""
    sws = [simworker(time_scale=0, name=f"sim{i}") for i in range(3)]
    urls = [s.url for s in sws]

    def config_for(i):
        # Worker names and definitions move each round: some stay, some go, some change url,
        # models or capacity; "shadow" is also defined by the admin thread now and then.
        names = [f"c{(i + k) % 6}" for k in range(1 + i % 4)]
        workers = [{"name": n, "url": urls[(i + k) % 3], "models": [] if (i + k) % 2 else [MODEL],
                    "kv_blocks": 1024 * (1 + (i + k) % 3)} for k, n in enumerate(names)]
        if i % 3 == 0:
            workers.append({"name": "shadow", "url": urls[0]})
        return {"workers": workers, "auth": "keys", "log_level": "warn"}

    gw = kvgate(config=config_for(0), auth=None, access_log=False, log_level="warn")
    admin = httpx.Client(base_url=gw.admin_url, timeout=10,
                         headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert admin.put("/admin/v1/tenants/steady", json={}).status_code == 201
    steady = admin.post("/admin/v1/tenants/steady/keys").json()["key"]
    stop = threading.Event()
    lock = threading.Lock()
    live_keys = []       # (tenant, key id, key): created, not deleted
    revoked = []         # keys whose DELETE (or whose tenant's DELETE) was answered
    bad = []             # (what, status, detail) that break the contract
    counts = {"h1": 0, "h2": 0, "reloads": 0, "admin": 0}
    admin_workers = {}   # name -> definition the admin thread left (None: deleted)
    seen = {}            # (protocol, key kind, status) -> answers

    def reloader():
        i = 0
        while not stop.is_set():
            i += 1
            if i % 10 == 0:  # a bad file: the reload must change nothing
                bad_cfg = config_for(i)
                bad_cfg["workers"][0]["url"] = "http://no-port"
                gw.write_config(bad_cfg)
            else:
                gw.write_config(config_for(i))
            gw.reload()
            counts["reloads"] += 1
            time.sleep(0.01)

    def admin_writer():
        i = 0
        while not stop.is_set():
            i += 1
            t = f"t{i % 4}"
            name = ["a0", "a1", "shadow", "c1"][i % 4]
            if i % 5 == 0:
                r = admin.delete(f"/admin/v1/workers/{name}")
                ok = r.status_code in (204, 404)
                if r.status_code == 204 and name in admin_workers:
                    admin_workers[name] = None
                elif r.status_code == 404 and admin_workers.get(name):
                    ok = False  # an admin worker the thread defined has gone missing
            else:
                d = {"url": urls[i % 3], "models": [MODEL] if i % 2 else [], "kv_blocks": i % 7}
                r = admin.put(f"/admin/v1/workers/{name}", json=d)
                ok = r.status_code in (200, 201)
                admin_workers[name] = d
            if not ok:
                bad.append(("worker", r.status_code, r.text))
            if i % 6 == 0:  # drained until its next PUT: no new requests
                r = admin.post("/admin/v1/workers/a1/drain")
                if r.status_code not in (200, 404) or \
                        (r.status_code == 404 and admin_workers.get("a1")):
                    bad.append(("drain", r.status_code, r.text))
            r = admin.put(f"/admin/v1/tenants/{t}", json={"sharing": "global"} if i % 2 else {})
            if r.status_code not in (200, 201):
                bad.append(("tenant put", r.status_code, r.text))
            r = admin.post(f"/admin/v1/tenants/{t}/keys")
            if r.status_code == 201:
                with lock:
                    live_keys.append((t, r.json()["id"], r.json()["key"]))
            else:
                bad.append(("key create", r.status_code, r.text))
            with lock:
                victim = live_keys.pop(0) if len(live_keys) > 3 else None
            if victim and i % 7 == 0:  # the whole tenant goes, with its keys
                with lock:
                    gone = [k for k in live_keys if k[0] == victim[0]] + [victim]
                    live_keys[:] = [k for k in live_keys if k[0] != victim[0]]
                r = admin.delete(f"/admin/v1/tenants/{victim[0]}")
                if r.status_code != 204:
                    bad.append(("tenant delete", r.status_code, r.text))
                with lock:
                    revoked.extend(k[2] for k in gone)
            elif victim:
                r = admin.delete(f"/admin/v1/tenants/{victim[0]}/keys/{victim[1]}")
                if r.status_code != 204:
                    bad.append(("key delete", r.status_code, r.text))
                with lock:
                    revoked.append(victim[2])
            counts["admin"] += 1

    def pick(n):
        """(key, what it must get): steady (never 401), revoked (only 401), or in flux."""
        with lock:
            if n % 3 == 0 or not live_keys:
                return steady, "steady"
            if n % 3 == 1 and revoked:
                return revoked[n % len(revoked)], "revoked"
            return live_keys[n % len(live_keys)][2], "live"

    def check(status, kind, proto):
        with lock:
            seen[(proto, kind, status)] = seen.get((proto, kind, status), 0) + 1
        if status not in SANE or (kind == "steady" and status == 401) or \
                (kind == "revoked" and status != 401):
            bad.append((proto, status, kind))

    def h1_traffic():
        n = 0
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                n += 1
                key, kind = pick(n)
                model = MODEL if n % 5 else "unserved"  # 404 unless a worker serves any model
                r = c.post(gw.url + COMPL, json={**BODY, "model": model},
                           headers={"authorization": f"Bearer {key}"})
                check(r.status_code, kind, "h1")
                counts["h1"] += 1

    def h2_traffic():
        n = 0
        h = H2Client(gw.port, timeout=10)
        try:
            while not stop.is_set():
                batch = []
                for _ in range(4):
                    n += 1
                    key, kind = pick(n)
                    batch.append((h.request("POST", COMPL, {**BODY, "model": MODEL},
                                            headers={"authorization": f"Bearer {key}"}), kind))
                h.wait([s for s, _ in batch])
                for s, kind in batch:
                    check(s.status if s.ended else f"reset {s.reset}", kind, "h2")
                    counts["h2"] += 1
        finally:
            h.close()

    threads = [threading.Thread(target=f) for f in (reloader, admin_writer, h1_traffic,
                                                    h2_traffic, h1_traffic)]
    for t in threads:
        t.start()
    try:
        time.sleep(4)
    finally:
        stop.set()
        for t in threads:
            t.join()
    print("race:", counts, "answers:", sorted(seen.items()), "bad:", bad[:10])
    assert gw.alive()
    assert counts["reloads"] > 20 and counts["admin"] > 20 and counts["h1"] > 20 and \
        counts["h2"] > 20, counts
    assert not bad, bad[:20]
    for proto in ("h1", "h2"):  # the race was run with requests that got through, and refusals
        assert seen.get((proto, "steady", 200)) and seen.get((proto, "revoked", 401)), seen

    # The final state: one more reload of a known file, then the list must be exactly what it
    # and the admin definitions imply (an admin worker hides a config worker of its name).
    final = config_for(1000)
    gw.write_config(final)
    gw.reload()

    def expected():
        out = {w["name"]: ("config", w["url"], sorted(w.get("models", [])))
               for w in final["workers"]}
        for name, d in admin_workers.items():
            # A DELETE drops an admin worker (a config one of the name comes back) or a config
            # worker until the next reload: either way the final reload decides.
            if d is not None:
                out[name] = ("admin", d["url"], sorted(d["models"]))
        return out

    def listed():
        return {w["name"]: (w["source"], w["url"], sorted(w["models"]))
                for w in admin.get("/admin/v1/workers").json()["workers"]}

    assert wait_for(lambda: listed() == expected(), 5), (listed(), expected())
    tenants = sorted(t["id"] for t in admin.get("/admin/v1/tenants").json()["tenants"])
    admin.close()
    assert gw.stop() == 0

    # A restart on the same state directory and config file restores the same state.
    again = kvgate(config=final, auth=None, access_log=False,
                   args=["--state", str(gw.state_dir)], name="again")
    with httpx.Client(base_url=again.admin_url, timeout=10,
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as a2:
        assert {w["name"]: (w["source"], w["url"], sorted(w["models"]))
                for w in a2.get("/admin/v1/workers").json()["workers"]} == expected()
        assert sorted(t["id"] for t in a2.get("/admin/v1/tenants").json()["tenants"]) == tenants
    r = http.post(again.url + COMPL, json={**BODY, "model": MODEL},
                  headers={"authorization": f"Bearer {steady}"})
    assert r.status_code == 200, r.text  # the final config's c4 serves the model
    for key in revoked[-5:]:
        r = http.post(again.url + COMPL, json={**BODY, "model": MODEL},
                      headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 401, r.text
