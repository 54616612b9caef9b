# SPDX-License-Identifier: Apache-2.0
"""Every resource a peer controls has a limit with a clear answer: slow request heads and
bodies (408, slowloris), idle connections, header bytes (431), body bytes (413), malformed
HTTP/1.1 (400), garbage where the HTTP/2 preface should be, HTTP/2 streams per connection. And
while one client misbehaves, the others are served."""
import json
import socket
import threading
import time

import h2.errors
import h2.exceptions
import h2.settings
import httpx
import pytest

from gwhelpers import (COMPL, H2Client, H2Stream, RawHTTP, assert_openai_error, http, request_bytes,
                       wait_for)

BODY = {"model": "sim-model", "prompt": "hi", "max_tokens": 1}
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def served(gw):
    """A well-behaved client still gets answers."""
    r = http.post(gw.url + COMPL, json=BODY, timeout=5)
    assert r.status_code == 200, r.text
    return True


class Background:
    """Keeps a well-behaved client busy in a thread while a test misbehaves."""

    def __init__(self, gw):
        self.gw = gw
        self.codes = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        with httpx.Client(timeout=5, verify=False) as c:
            while not self.stop.is_set():
                self.codes.append(c.post(self.gw.url + COMPL, json=BODY).status_code)
                time.sleep(0.02)

    def join(self):
        wait_for(lambda: self.codes, 5)
        self.stop.set()
        self.thread.join()
        return self.codes


# ---- timeouts -------------------------------------------------------------------------------------


def test_slowloris_head_gets_408_and_others_are_served(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"header_timeout_ms": 400}})
    bg = Background(gw)
    slow = []
    try:
        # Several slow clients trickling a request head, one byte every 50 ms: the deadline
        # covers the whole head, so trickling does not extend it.
        for _ in range(4):
            c = RawHTTP(gw.port, timeout=5)
            c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            slow.append(c)
        t0 = time.monotonic()
        closed_at = {}
        while len(closed_at) < len(slow) and time.monotonic() - t0 < 5:
            for i, c in enumerate(slow):
                if i in closed_at:
                    continue
                try:
                    c.sock.sendall(b"X")
                except OSError:
                    closed_at[i] = time.monotonic() - t0
            time.sleep(0.05)
            for i, c in enumerate(slow):
                c.sock.setblocking(False)
                try:
                    data = c.sock.recv(65536, socket.MSG_PEEK)
                    if data == b"" or b"\r\n\r\n" in data:
                        closed_at.setdefault(i, time.monotonic() - t0)
                except BlockingIOError:
                    pass
                except OSError:
                    closed_at.setdefault(i, time.monotonic() - t0)
                finally:
                    c.sock.setblocking(True)
        assert len(closed_at) == len(slow), "a slowloris connection was never cut"
        assert all(0.3 < t < 2.0 for t in closed_at.values()), closed_at
        for c in slow:
            c.sock.settimeout(5)
            status, _, body = c.response()
            if status is not None:  # the 408 may be lost to a reset when we kept writing
                assert status == 408
                assert_openai_error(body, 408)
    finally:
        for c in slow:
            c.close()
        codes = bg.join()
    assert codes and set(codes) == {200}, codes
    assert gw.metric("kvgate_timeouts_total") >= 4


def test_silent_connections_and_slow_bodies_time_out(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"header_timeout_ms": 300, "read_timeout_ms": 300,
                                       "idle_timeout_ms": 500}})
    # Connected, never a byte: closed after the header timeout, without an answer.
    silent = RawHTTP(gw.port, timeout=5)
    # Half an HTTP/2 preface, then nothing.
    half = RawHTTP(gw.port, timeout=5)
    half.send(PREFACE[:10])
    # A complete head, then part of the body, then nothing: 408.
    stalled = RawHTTP(gw.port, timeout=5)
    stalled.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    # A keep-alive connection after one answered request: closed when idle.
    idle = RawHTTP(gw.port, timeout=5)
    idle.send(request_bytes("POST", COMPL, BODY))
    assert idle.response()[0] == 200
    # An h2 connection with nothing open: GOAWAY and close after the idle timeout.
    h = H2Client(gw.port, timeout=5)
    s = h.request("GET", "/v1/models")
    h.wait([s])
    t0 = time.monotonic()
    try:
        assert served(gw)
        assert silent.closed_by_peer(3)
        assert half.closed_by_peer(3)
        status, _, body = stalled.response()
        assert status == 408
        assert "timed out" in assert_openai_error(body, 408)["message"]
        assert stalled.closed_by_peer(3)
        assert idle.closed_by_peer(3)
        while h.pump(3):
            pass
        assert h.goaway is not None and h.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert time.monotonic() - t0 < 3
    finally:
        for c in (silent, half, stalled, idle):
            c.close()
        h.close()
    assert served(gw)


# ---- sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", [
    {"X-Big": "a" * 8000},
    {f"X-H{i}": "v" * 40 for i in range(150)},
    "long-url",
], ids=["one-big-header", "many-headers", "long-url"])
def test_oversized_header_431(simworker, kvgate, head):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"header_bytes": 4096}})
    c = RawHTTP(gw.port)
    try:
        if head == "long-url":
            c.send(b"GET /v1/models?" + b"q" * 6000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        else:
            c.send(request_bytes("POST", COMPL, BODY, head))
        status, headers, body = c.response()
        assert status == 431
        assert_openai_error(body, 431)
        assert headers.get("connection") == "close"
        assert c.closed_by_peer()
    finally:
        c.close()
    # Just under the limit is fine.
    c = RawHTTP(gw.port)
    try:
        c.send(request_bytes("POST", COMPL, BODY, {"X-Fits": "a" * 3000}))
        assert c.response()[0] == 200
    finally:
        c.close()
    assert gw.metric("kvgate_worker_requests_total") == 1  # the 431 never reached a worker


def test_oversized_header_431_default_limit(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    c = RawHTTP(gw.port)
    try:
        c.send(request_bytes("POST", COMPL, BODY, {"X-Big": "a" * 70000}))
        assert c.response()[0] == 431
    finally:
        c.close()
    assert served(gw)


def test_oversized_body_413(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"body_bytes": 2048}})
    big = json.dumps({"model": "sim-model", "prompt": "x" * 4000})
    # Content-Length over the limit: 413 before a byte of the body is sent.
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
               % len(big))
        status, headers, body = c.response()
        assert status == 413
        assert "too large" in assert_openai_error(body, 413)["message"]
    finally:
        c.close()
    # The same with Expect: 100-continue: 413 and no 100.
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               b"Content-Length: %d\r\n\r\n" % len(big))
        line = c.file.readline()
        assert line.startswith(b"HTTP/1.1 413 "), line
    finally:
        c.close()
    # Chunked: the count crosses the limit while the body arrives.
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        raw = big.encode()
        try:
            for i in range(0, len(raw), 500):
                c.send(b"%x\r\n%s\r\n" % (len(raw[i:i + 500]), raw[i:i + 500]))
            c.send(b"0\r\n\r\n")
        except OSError:
            pass  # the gateway may close before we finish
        status, _, body = c.response()
        assert status == 413
        assert_openai_error(body, 413)
    finally:
        c.close()
    # Under the limit is fine, through curl as well.
    r = http.post(gw.url + COMPL, json={"model": "sim-model", "prompt": "x" * 1000,
                                        "max_tokens": 1})
    assert r.status_code == 200
    # HTTP/2: declared too large, and undeclared but too large.
    h = H2Client(gw.port)
    try:
        declared = h.request("POST", COMPL, big)
        h.wait([declared])
        assert declared.status == 413
        assert_openai_error(bytes(declared.data), 413)
        sid = h.conn.get_next_available_stream_id()
        h.conn.send_headers(sid, [(":method", "POST"), (":path", COMPL), (":scheme", "http"),
                                  (":authority", "t")])
        from gwhelpers import H2Stream
        undeclared = h.streams[sid] = H2Stream(sid)
        h._send_body(sid, big.encode(), True)
        h.flush()
        h.wait([undeclared])
        assert undeclared.status == 413
        ok = h.request("POST", COMPL, BODY)
        h.wait([ok])
        assert ok.status == 200  # the connection is still good
    finally:
        h.close()
    assert gw.metric("kvgate_worker_requests_total") == 2


def test_h2_body_bytes_per_connection_are_bounded(simworker, kvgate):
    """One HTTP/2 connection may not pin more than two maximal bodies in unfinished uploads:
    the stream that would cross the line gets 503 with Retry-After, the others go on."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"body_bytes": 100 * 1024}})
    prefix = '{"model": "sim-model", "max_tokens": 1, "prompt": "'
    part = (prefix + "x" * (70 * 1024)).encode()  # an unfinished JSON body, 70 KiB so far
    h = H2Client(gw.port)
    try:
        # Wait for the gateway's SETTINGS and WINDOW_UPDATE: 1 MiB per stream, 16 MiB in all.
        for _ in range(20):
            if h.conn.outbound_flow_control_window >= 1 << 20 and \
                    h.remote_settings.get(h2.settings.SettingCodes.INITIAL_WINDOW_SIZE):
                break
            h.pump(0.2)
        def upload(end):  # no content-length: the body's end is END_STREAM
            sid = h.conn.get_next_available_stream_id()
            h.conn.send_headers(sid, [(":method", "POST"), (":path", COMPL), (":scheme", "http"),
                                      (":authority", "t")])
            h.streams[sid] = H2Stream(sid)
            h._send_body(sid, part + (b'"}' if end else b""), end)
            h.flush()
            return h.streams[sid]

        streams = [upload(False) for _ in range(3)]
        h.wait([streams[2]], timeout=5)
        # 70 + 70 KiB fit under 2 x 100 KiB; the third upload would make 210 KiB.
        assert streams[2].status == 503, streams[2].status
        assert streams[2].headers.get("retry-after") == "1"
        assert "in flight on this connection" in assert_openai_error(
            bytes(streams[2].data), 503)["message"]
        assert not streams[0].done and not streams[1].done
        for s in streams[:2]:
            h._send_body(s.id, b'"}', True)
        h.flush()
        h.wait(streams[:2])
        assert [s.status for s in streams[:2]] == [200, 200]
        # Finished streams give their bytes back: a new upload of the same size fits again.
        again = upload(True)
        h.wait([again])
        assert again.status == 200
    finally:
        h.close()


# ---- malformed HTTP/1.1 ---------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET /v1/models HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nBad Header Line\r\n\r\n",
    b"GET v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"\x00\x01\x02\x03\xff\xfe\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nExpect: something-else\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /v1/mo\x00dels HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: a\x00b\r\n\r\n",
], ids=["garbage", "extra-token", "no-colon", "relative-target", "two-lengths", "bad-length",
        "bad-chunk", "binary", "bad-expect", "te-and-length", "nul-in-target", "nul-in-header"])
def test_malformed_http1_gets_400_and_close(simworker, kvgate, raw):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(raw)
        status, headers, body = c.response()
        assert status in (400, 417), (status, body)
        assert_openai_error(body, status)
        assert c.closed_by_peer()
    finally:
        c.close()
    assert served(gw)
    assert gw.metric("kvgate_protocol_errors_total") >= 1
    assert gw.metric("kvgate_worker_requests_total", code="200") == 1


# ---- garbage where HTTP/2 is expected -------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    PREFACE + b"\xde\xad\xbe\xef" * 64,                       # preface, then no SETTINGS frame
    PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x05\x01\x05\x00\x00\x00\x01"
    + b"\xff" * 5,                                            # HEADERS with a broken block
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + b"\x00" * 32,        # almost the preface
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[:18] + b"\xff" * 40,   # a preface cut short by garbage
], ids=["no-settings", "bad-hpack", "almost-preface", "cut-preface"])
def test_garbage_on_h2_preface(simworker, kvgate, raw):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    bg = Background(gw)
    try:
        c = RawHTTP(gw.port, timeout=5)
        try:
            c.send(raw)
            assert c.closed_by_peer(3), "the connection stayed open after garbage"
        finally:
            c.close()
        # Against a valid h2 client on another connection at the same time.
        h = H2Client(gw.port)
        try:
            (s,) = h.wait([h.request("POST", COMPL, BODY)])
            assert s.status == 200
        finally:
            h.close()
    finally:
        codes = bg.join()
    assert codes and set(codes) == {200}
    assert gw.alive()


def test_h2_oversized_headers(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"limits": {"header_bytes": 4096}})
    h = H2Client(gw.port)
    try:
        h.pump(1)
        assert h.remote_settings.get(6) == 4096  # SETTINGS_MAX_HEADER_LIST_SIZE
        big = h.request("POST", COMPL, BODY, {"x-big": "a" * 8000})
        many = h.request("POST", COMPL, BODY, {f"x-h{i}": "v" * 40 for i in range(100)})
        h.wait([big, many])
        for s in (big, many):
            # Either a 431 in the OpenAI shape or the stream reset: never served, never a crash.
            if s.status is not None:
                assert s.status == 431
                assert_openai_error(bytes(s.data), 431)
            else:
                assert s.reset is not None
        ok = h.request("POST", COMPL, BODY)
        h.wait([ok])
        assert ok.status == 200
    finally:
        h.close()
    assert gw.metric("kvgate_worker_requests_total") == 1


def test_h2_streams_per_connection(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=100000, time_scale=1)
    gw = kvgate(sw, config={"limits": {"streams_per_conn": 4}})
    h = H2Client(gw.port)
    try:
        h.pump(1)
        assert h.remote_settings.get(3) == 4  # SETTINGS_MAX_CONCURRENT_STREAMS
        # A client that honours the limit: 4 at once, all served.
        streams = [h.request("POST", COMPL, {"prompt": "x", "max_tokens": 3}) for _ in range(4)]
        with pytest.raises(h2.exceptions.TooManyStreamsError):
            h.request("POST", COMPL, BODY)
        h.wait(streams)
        assert all(s.status == 200 and s.ended for s in streams)
    finally:
        h.close()
    # A client that ignores it (python-h2 would refuse: pretend the limit is 100).
    h = H2Client(gw.port)
    try:
        h.pump(1)
        h.conn.remote_settings._settings[3].appendleft(100)
        streams = [h.request("POST", COMPL, {"prompt": "x", "max_tokens": 3}) for _ in range(6)]
        try:
            h.wait(streams, timeout=10)
        except TimeoutError:
            pass
        refused = [s for s in streams if s.reset is not None and s.status is None]
        if h.goaway is None:
            # Refused streams (RFC 9113 5.1.2), the others served.
            assert len(refused) == 2 and all(s.status == 200 for s in streams
                                             if s not in refused)
        else:
            # nghttp2 makes it a connection error once the SETTINGS are acknowledged.
            assert h.goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
            assert h.closed
    finally:
        h.close()
    # Nothing leaked: the streams cut with the connection are cancelled upstream too.
    assert wait_for(lambda: gw.metric("kvgate_worker_inflight") == 0, 3)
    assert served(gw)
