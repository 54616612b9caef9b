# SPDX-License-Identifier: Apache-2.0
"""The framing of what reaches a worker is the gateway's own (issue 9, request smuggling): a
header name that is not an RFC 9110 token is a 400 on the front and a 502 from a worker, the
head sent to a worker carries exactly one Content-Length (the gateway's, for the rewritten
body) and no Transfer-Encoding, the x-kvgate- namespace never passes from a client to a worker,
and a chunk larger than the body limit is refused when its size line arrives. Raw bytes on
sockets, since library clients refuse to send these heads."""
import json
import socket

import h2.config
import h2.connection
import h2.events
import pytest

from gwhelpers import (COMPL, H2Client, RawHTTP, assert_openai_error, forwarded, json_response,
                       request_bytes)

BODY = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()


def echo_worker(fake_upstream):
    """A worker that answers {"ok": true} and keeps what it received (raw head and body)."""
    def handler(req, sock):
        json_response(sock, {"ok": True})
        return True
    return fake_upstream(handler, name="fake")


def head_lines(req):
    """The header lines of a request the fake worker received, as (name, value), exactly as
    sent (no case folding, no stripping of the name)."""
    lines = req["raw_head"].decode("latin-1").split("\r\n")[1:]
    return [tuple(ln.split(":", 1)) for ln in lines]


def serve_valid_request(gw):
    """A valid request on a new connection is answered 200."""
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(request_bytes("POST", COMPL, BODY))
        assert c.response()[0] == 200
    finally:
        c.close()


def assert_framing_is_the_gateways(req, body=BODY):
    """One content-length, the gateway's, equal to the bytes that follow; no transfer-encoding;
    every name a token (no whitespace anywhere in it)."""
    names = [n for n, _ in head_lines(req)]
    assert all(n and n == n.strip() and " " not in n and "\t" not in n for n in names), names
    lengths = [v for n, v in head_lines(req) if n.lower() == "content-length"]
    assert lengths == [" %d" % len(req["body"])], head_lines(req)
    assert not any(n.lower() == "transfer-encoding" for n in names), names
    assert req["body"] == forwarded(body)


@pytest.mark.parametrize("line", [
    b"Content-Length : %d" % len(BODY),          # the reported smuggling: CL read, name kept
    b"Content-Length\t: %d" % len(BODY),
    b"Transfer-Encoding : chunked",
    b"X Bad: v",                                  # any name with whitespace inside
    b"X-Caf\xc3\xa9: v",                          # non-ASCII
    b"X-A\x7f: v",
    b"X-A(b): v",                                 # a separator, not a tchar
    b": no-name",
], ids=["cl-space", "cl-tab", "te-space", "space-inside", "non-ascii", "del", "paren",
        "empty-name"])
def test_invalid_header_name_is_400_and_nothing_is_forwarded(kvgate, fake_upstream, line):
    up = echo_worker(fake_upstream)
    gw = kvgate(up)
    c = RawHTTP(gw.port, timeout=5)
    try:
        framing = b"" if line.startswith((b"Content-Length", b"Transfer-Encoding")) else \
            b"Content-Length: %d\r\n" % len(BODY)
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY) if b"chunked" in line else BODY
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + framing + line + b"\r\n\r\n"
               + body)
        status, headers, data = c.response()
        assert status == 400, (status, data)
        assert "header" in assert_openai_error(data, 400)["message"]
        assert headers.get("connection") == "close"
        assert c.closed_by_peer()
    finally:
        c.close()
    assert up.requests == []
    assert gw.metric("kvgate_protocol_errors_total") == 1
    # The same connection-level framing with valid names is served, once, with our framing.
    serve_valid_request(gw)
    (req,) = up.requests
    assert_framing_is_the_gateways(req)


def test_control_character_in_header_value_is_400(kvgate, fake_upstream):
    up = echo_worker(fake_upstream)
    gw = kvgate(up)
    for value in (b"a\x01b", b"a\x0bb", b"a\x1bb", b"a\x1fb", b"a\x7fb", b"a\rb"):
        c = RawHTTP(gw.port, timeout=5)
        try:
            c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: " + value +
                   b"\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
            status, _, data = c.response()
            assert status == 400, (value, status, data)
            assert_openai_error(data, 400)
        finally:
            c.close()
    assert up.requests == []


def test_chunked_client_body_reaches_the_worker_with_one_length(kvgate, fake_upstream):
    """A chunked upload (and a client Content-Length on HTTP/2) never reaches the worker as
    such: the gateway frames the rewritten body itself."""
    up = echo_worker(fake_upstream)
    gw = kvgate(up)
    c = RawHTTP(gw.port, timeout=5)
    try:
        half = len(BODY) // 2
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, BODY[:half], len(BODY) - half,
                                                        BODY[half:]))
        assert c.response()[0] == 200
    finally:
        c.close()
    h = H2Client(gw.port)
    try:
        (s,) = h.wait([h.request("POST", COMPL, BODY)])
        assert s.status == 200
    finally:
        h.close()
    assert len(up.requests) == 2
    for req in up.requests:
        assert_framing_is_the_gateways(req)


def raw_h2_request(port, headers, body):
    """Send one HTTP/2 request whose headers python-h2 would refuse to send (validation off);
    returns the events for the stream, until it ends or is reset."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False,
        validate_inbound_headers=False))
    conn.initiate_connection()
    conn.send_headers(1, headers)
    conn.send_data(1, body, end_stream=True)
    sock.sendall(conn.data_to_send())
    got = []
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            for ev in conn.receive_data(data):
                got.append(ev)
            sock.sendall(conn.data_to_send())
            if any(isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset,
                                  h2.events.ConnectionTerminated)) for e in got):
                break
    finally:
        sock.close()
    return got


@pytest.mark.parametrize("name", [b"content-length ", b"x bad", b"X-Upper"],
                         ids=["cl-space", "space-inside", "uppercase"])
def test_invalid_h2_header_name_never_reaches_the_worker(kvgate, fake_upstream, name):
    up = echo_worker(fake_upstream)
    gw = kvgate(up)
    events = raw_h2_request(gw.port, [(b":method", b"POST"), (b":path", COMPL.encode()),
                                      (b":scheme", b"http"), (b":authority", b"x"),
                                      (name, b"%d" % len(BODY))], BODY)
    responses = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    refused = [e for e in events if isinstance(e, (h2.events.StreamReset,
                                                   h2.events.ConnectionTerminated))]
    # nghttp2 (RFC 9113 8.2.1) treats the stream as malformed: reset, or a 400.
    assert refused or dict(responses[0].headers)[b":status"] == b"400", events
    assert up.requests == []


def test_gateway_namespace_is_not_forwarded(kvgate, fake_upstream):
    """x-kvgate-* belongs to the gateway: stripped from requests, as from responses."""
    def handler(req, sock):
        json_response(sock, {"ok": True}, extra=b"X-Kvgate-Tenant: spoofed\r\n")
        return True

    up = fake_upstream(handler, name="fake")
    gw = kvgate(up)
    spoof = {"X-Kvgate-Worker": "evil", "x-kvgate-tenant": "root", "X-KVGATE-SALT": "s",
             "X-Kvgatex": "kept"}
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(request_bytes("POST", COMPL, BODY, spoof))
        status, headers, _ = c.response()
        assert status == 200
        assert "x-kvgate-tenant" not in headers
        assert headers["x-kvgate-worker"] == "fake"
    finally:
        c.close()
    h = H2Client(gw.port)
    try:
        (s,) = h.wait([h.request("POST", COMPL, BODY, {k.lower(): v for k, v in spoof.items()})])
        assert s.status == 200
    finally:
        h.close()
    assert len(up.requests) == 2
    for req in up.requests:
        names = [n.lower() for n, _ in head_lines(req)]
        assert not [n for n in names if n.startswith("x-kvgate-")], names
        assert "x-kvgatex" in names


@pytest.mark.parametrize("line", [
    b"Content-Length : 2",
    b"X Bad: v",
    b"Transfer-Encoding : chunked",
    b"X-Ctl: a\x1bb",
], ids=["cl-space", "space-inside", "te-space", "control-in-value"])
def test_invalid_header_name_from_a_worker_is_502(kvgate, fake_upstream, line):
    def handler(req, sock):
        # The bad line replaces the framing header it spells (the lenient parser would frame
        # the body by it), or comes next to a valid one.
        framing = b"" if line.startswith((b"Content-Length", b"Transfer-Encoding")) else \
            b"Content-Length: 2\r\n"
        body = b"2\r\n{}\r\n0\r\n\r\n" if b"chunked" in line else b"{}"
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + framing
                     + line + b"\r\n\r\n" + body)
        return False

    up = fake_upstream(handler, name="fake")
    gw = kvgate(up)
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(request_bytes("POST", COMPL, BODY))
        status, _, data = c.response()
        assert status == 502, (status, data)
        assert_openai_error(data, 502)
    finally:
        c.close()
    assert "malformed response" in gw.log()


def test_chunk_larger_than_the_body_limit_is_413_at_once(kvgate, fake_upstream):
    """A chunk size line of 2^63 (or just past the limit) is answered when it arrives, not
    after the read timeout (30 s by default: the socket's 5 s timeout would fail first)."""
    up = echo_worker(fake_upstream)
    gw = kvgate(up, config={"limits": {"body_bytes": 2048}})
    for size in (b"8000000000000000", b"801", b"400\r\n" + b"x" * 1024 + b"\r\n401"):
        c = RawHTTP(gw.port, timeout=5)
        try:
            c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + size + b"\r\nab")
            status, headers, data = c.response()
            assert status == 413, (size, status)
            assert "too large" in assert_openai_error(data, 413)["message"]
            assert headers.get("connection") == "close"
        finally:
            c.close()
    # A chunk that fits is read as usual.
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))
        assert c.response()[0] == 200
    finally:
        c.close()
    assert len(up.requests) == 1


@pytest.mark.parametrize("head,status,code", [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n", 400, "invalid_request"),
    (b"POST /v1/completions HTTP/1.2\r\nHost: x\r\n", 505, "http_version_not_supported"),
    (b"POST /v1/completions HTTP/2.0\r\nHost: x\r\n", 505, "http_version_not_supported"),
    (b"POST  /v1/completions HTTP/1.1\r\nHost: x\r\n", 400, "invalid_request"),
], ids=["obs-fold", "http-1.2", "http-2.0-as-text", "two-spaces"])
def test_heads_the_front_parser_refuses(kvgate, fake_upstream, head, status, code):
    """What kvgate's own HTTP/1.1 parser refuses where lenient http-parser read something
    (h1_parse.c lists the differences): answered with the right status and code, the
    connection closed, nothing forwarded, and a valid request on a new connection served."""
    up = echo_worker(fake_upstream)
    gw = kvgate(up)
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(head + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
        got, headers, data = c.response()
        assert got == status, (got, data)
        assert assert_openai_error(data, status)["code"] == code
        assert headers.get("connection") == "close"
        assert c.closed_by_peer()
    finally:
        c.close()
    assert up.requests == []
    serve_valid_request(gw)
    assert len(up.requests) == 1
