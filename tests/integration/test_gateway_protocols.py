# SPDX-License-Identifier: Apache-2.0
"""kvgate's front speaks every protocol a client brings on one port: HTTP/1.1 (keep-alive,
chunked bodies, 100-continue), HTTP/2 with prior knowledge, TLS with ALPN h2 and http/1.1.
Real clients: curl, nghttp, httpx; real workers: kvgate-simworker. Also the response contract
(x-kvgate-worker, x-request-id, hop-by-hop headers, /v1/models, OpenAI-style errors)."""
import hashlib
import json
import os
import re
import socket
import ssl
import subprocess

import httpx
import pytest

from conftest import binary
from gwhelpers import (forwarded, CHAT, COMPL, H2Client, RawHTTP, assert_openai_error, H2Stream, http, http1,
                       json_response, request_bytes, worker_cfg)

BODY = {"model": "sim-model", "prompt": "hello there", "max_tokens": 2}


def curl(*args, timeout=20):
    p = subprocess.run(["curl", "-sS", "--max-time", "15", *args], capture_output=True,
                       timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def completion_ok(text, tokens=2):
    obj = json.loads(text)
    assert obj["object"] == "text_completion", obj
    assert obj["usage"]["completion_tokens"] == tokens
    return obj


# ---- HTTP/1.1 -------------------------------------------------------------------------------------


def test_curl_keepalive_reuses_one_connection(simworker, kvgate, tmp_path):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    before = gw.metric("kvgate_connections_total", protocol="http1")
    url = gw.url + COMPL
    outs = [str(tmp_path / f"out{i}") for i in range(3)]
    rc, out, err = curl("-w", "%{http_code} %{num_connects}\n", "-H",
                        "content-type: application/json", "-d", json.dumps(BODY),
                        "-o", outs[0], "-o", outs[1], "-o", outs[2], url, url, url)
    assert rc == 0, err
    assert out.split("\n")[:3] == ["200 1", "200 0", "200 0"], out  # one connect, two reuses
    for o in outs:
        completion_ok(open(o).read())
    # The admin client is kept alive too, so only curl's connection shows.
    assert gw.metric("kvgate_connections_total", protocol="http1") - before == 1
    assert gw.metric("kvgate_worker_requests_total", worker=sw.name, code="200") == 3


def test_chunked_request_body(simworker, kvgate, tmp_path):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    long_text = "the quick brown fox jumps over the lazy dog " * 1500  # ~66 kB
    body = json.dumps({"model": sw.model, "messages": [{"role": "user", "content": long_text}],
                       "max_tokens": 1})
    f = tmp_path / "body.json"
    f.write_text(body)
    direct = http.post(sw.url + CHAT, content=body).json()["usage"]["prompt_tokens"]
    rc, out, err = curl("-H", "Transfer-Encoding: chunked", "-H",
                        "content-type: application/json", "--data-binary", f"@{f}",
                        "-w", "\n%{http_code}", gw.url + CHAT)
    assert rc == 0, err
    text, _, code = out.rpartition("\n")
    assert code == "200", out[-500:]
    # The worker saw the whole body: same prompt token count as a direct request.
    assert json.loads(text)["usage"]["prompt_tokens"] == direct
    # By hand: many small chunks in separate writes, with a chunk extension and a trailer.
    c = RawHTTP(gw.port)
    try:
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
               b"Content-Type: application/json\r\n\r\n")
        raw = json.dumps(BODY).encode()
        for i in range(0, len(raw), 7):
            piece = raw[i:i + 7]
            c.send(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        c.send(b"0\r\nx-trailer: 1\r\n\r\n")
        status, headers, data = c.response()
        assert status == 200, data
        completion_ok(data)
        # Still keep-alive after a chunked request.
        c.send(request_bytes("POST", COMPL, BODY))
        assert c.response()[0] == 200
    finally:
        c.close()


def test_expect_100_continue(simworker, kvgate, tmp_path):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    f = tmp_path / "b.json"
    f.write_text(json.dumps(BODY))
    rc, out, err = curl("-v", "-H", "Expect: 100-continue", "-H",
                        "content-type: application/json", "--data-binary", f"@{f}",
                        gw.url + COMPL)
    assert rc == 0, err
    assert "< HTTP/1.1 100 Continue" in err, err
    assert "< HTTP/1.1 200 OK" in err
    completion_ok(out)
    # By hand: the 100 comes before we send a byte of the body.
    c = RawHTTP(gw.port, timeout=5)
    try:
        raw = json.dumps(BODY).encode()
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
               b"Content-Length: %d\r\n\r\n" % len(raw))
        assert c.file.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert c.file.readline() == b"\r\n"
        c.send(raw)
        status, _, data = c.response()
        assert status == 200
        completion_ok(data)
    finally:
        c.close()


def test_http10_and_pipelining(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    stream = {"prompt": "x", "max_tokens": 3, "stream": True}
    # Pipelined requests in one write (a stream first): the answers, in order.
    c = RawHTTP(gw.port)
    try:
        c.send(request_bytes("POST", COMPL, stream, {"x-request-id": "first"}) +
               request_bytes("POST", CHAT, {"messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 1}, {"x-request-id": "second"}) +
               request_bytes("POST", COMPL, BODY, {"x-request-id": "third"}))
        answers = [c.response() for _ in range(3)]
        assert [(s, h["x-request-id"]) for s, h, _ in answers] == [
            (200, "first"), (200, "second"), (200, "third")]
        assert answers[0][2].endswith(b"data: [DONE]\n\n")
        assert json.loads(answers[1][2])["object"] == "chat.completion"
        completion_ok(answers[2][2])
    finally:
        c.close()
    # HTTP/1.0 streaming: no chunked encoding there, the body ends with the connection.
    c = RawHTTP(gw.port)
    try:
        raw = json.dumps(stream).encode()
        c.send(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw))
        status, headers, data = c.response()
        assert status == 200 and "transfer-encoding" not in headers
        assert headers["connection"] == "close"
        assert data.endswith(b"data: [DONE]\n\n")
    finally:
        c.close()
    # HTTP/1.0 without keep-alive: answered, then closed.
    c = RawHTTP(gw.port)
    try:
        raw = json.dumps(BODY).encode()
        c.send(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw))
        status, headers, data = c.response()
        assert status == 200 and c.complete
        completion_ok(data)
        assert c.closed_by_peer()
    finally:
        c.close()


# ---- HTTP/2 ---------------------------------------------------------------------------------------


def test_curl_http2_prior_knowledge(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    before = gw.metric("kvgate_connections_total", protocol="http2")
    url = gw.url + COMPL
    rc, out, err = curl("--http2-prior-knowledge", "-D", "-", "-w", "\n%{http_version}",
                        "-d", json.dumps(BODY), url)
    assert rc == 0, err
    head, _, rest = out.partition("\r\n\r\n")
    assert head.startswith("HTTP/2 200"), head
    assert re.search(rf"^x-kvgate-worker: {sw.name}\r?$", head, re.M), head
    body, _, version = rest.rpartition("\n")
    assert version == "2"
    completion_ok(body)
    assert gw.metric("kvgate_connections_total", protocol="http2") - before == 1


def test_h2c_upgrade_is_declined_but_served(simworker, kvgate):
    """curl --http2 on cleartext asks for an Upgrade to h2c; the gateway answers over HTTP/1.1
    (RFC 9110 7.8 lets a server ignore Upgrade) rather than failing."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    rc, out, err = curl("--http2", "-w", "\n%{http_code} %{http_version}", "-d",
                        json.dumps(BODY), gw.url + COMPL)
    assert rc == 0, err
    body, _, tail = out.rpartition("\n")
    assert tail == "200 1.1"
    completion_ok(body)


def test_httpx_http2_prior_knowledge(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    with httpx.Client(http1=False, http2=True, timeout=10, verify=False) as client:
        for _ in range(3):
            r = client.post(gw.url + COMPL, json=BODY)
            assert r.http_version == "HTTP/2"
            assert r.status_code == 200
            assert r.headers["x-kvgate-worker"] == sw.name
            completion_ok(r.text)
        r = client.get(gw.url + "/v1/models")
        assert r.status_code == 200 and r.json()["object"] == "list"
    assert gw.metric("kvgate_connections_total", protocol="http2") == 1


# ---- TLS ------------------------------------------------------------------------------------------


def test_tls_alpn_h2_h1_and_cleartext_on_one_port(simworker, kvgate, tls_cert, tmp_path):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, tls=tls_cert)
    f = tmp_path / "b.json"
    f.write_text(json.dumps(BODY))
    # nghttp: TLS, ALPN h2.
    p = subprocess.run(["nghttp", "-v", "-d", str(f), "-H", "content-type: application/json",
                        gw.https_url + COMPL], capture_output=True, timeout=20)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out + p.stderr.decode()
    assert "The negotiated protocol: h2" in out
    assert re.search(r"recv \(stream_id=\d+\) :status: 200", out), out
    assert re.search(rf"recv \(stream_id=\d+\) x-kvgate-worker: {sw.name}", out), out
    completion_ok(out[out.index('{"id"'):out.rindex("}") + 1])
    # curl over TLS with HTTP/1.1 (ALPN http/1.1), and with HTTP/2.
    for flag, version in (("--http1.1", "1.1"), ("--http2", "2")):
        rc, body, err = curl("-k", flag, "-w", "\n%{http_version} %{ssl_verify_result}",
                             "-d", json.dumps(BODY), gw.https_url + COMPL)
        assert rc == 0, err
        text, _, tail = body.rpartition("\n")
        assert tail.split()[0] == version, tail
        completion_ok(text)
    # The certificate is the one given (verification against it succeeds).
    rc, body, err = curl("--cacert", str(tls_cert[0]), "-w", "\n%{http_code}",
                         gw.https_url.replace("127.0.0.1", "localhost") + "/v1/models",
                         "--resolve", f"localhost:{gw.port}:127.0.0.1")
    assert rc == 0 and body.endswith("\n200"), err
    # Cleartext HTTP/1.1 and HTTP/2 on the same port.
    rc, body, err = curl("-w", "\n%{http_version}", "-d", json.dumps(BODY), gw.url + COMPL)
    assert rc == 0 and body.endswith("\n1.1"), err
    rc, body, err = curl("--http2-prior-knowledge", "-w", "\n%{http_version}",
                         "-d", json.dumps(BODY), gw.url + COMPL)
    assert rc == 0 and body.endswith("\n2"), err
    # httpx with h2 over TLS.
    with httpx.Client(http2=True, verify=False, timeout=10) as client:
        r = client.post(gw.https_url + COMPL, json=BODY)
        assert r.http_version == "HTTP/2" and r.status_code == 200
        completion_ok(r.text)
    entries = [e for e in gw.access_entries() if e["path"] == COMPL]
    assert sorted((e["proto"], e["tls"]) for e in entries) == [
        ("HTTP/1.1", False), ("HTTP/1.1", True), ("HTTP/2", False), ("HTTP/2", True),
        ("HTTP/2", True), ("HTTP/2", True)]
    assert all(e["status"] == 200 for e in entries)


def test_tls_only_listener_and_bad_handshakes(simworker, kvgate, tls_cert):
    sw = simworker(time_scale=0)
    cert, key = tls_cert
    gw = kvgate(sw, listen=[], config={"listen": [
        {"address": "127.0.0.1:0", "tls_cert": str(cert), "tls_key": str(key),
         "cleartext": False}]})
    # Cleartext is refused on a TLS-only port: closed without an answer.
    c = RawHTTP(gw.port, timeout=5)
    try:
        c.send(request_bytes("GET", "/v1/models"))
        assert c.read_head() is None
    finally:
        c.close()
    # A TLS record header followed by garbage: the handshake fails, the gateway lives on.
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    s.sendall(b"\x16\x03\x01\x00\x10" + b"\xff" * 64)
    s.settimeout(5)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    s.close()
    # A client offering only an ALPN protocol the gateway does not speak is refused.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["spdy/3"])
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(request_bytes("GET", "/v1/models"))
                tls.recv(100)
    assert gw.metric("kvgate_tls_handshake_failures_total") >= 2
    with httpx.Client(http2=True, verify=False, timeout=10) as client:
        r = client.post(gw.https_url + COMPL, json=BODY)
        assert r.status_code == 200 and r.http_version == "HTTP/2"


# ---- response contract ----------------------------------------------------------------------------


def test_worker_header_and_request_id(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    r = http.post(gw.url + COMPL, json=BODY, headers={"x-request-id": "client-id-42"})
    assert r.status_code == 200
    assert r.headers["x-kvgate-worker"] == sw.name
    assert r.headers["x-request-id"] == "client-id-42"
    assert r.headers["x-simworker-name"] == sw.name  # the worker's own headers pass through
    ids = set()
    for _ in range(3):
        r = http.post(gw.url + COMPL, json=BODY)
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), r.headers
        ids.add(r.headers["x-request-id"])
    assert len(ids) == 3
    # The same over HTTP/2, and on errors the gateway generates itself.
    h = H2Client(gw.port)
    try:
        a = h.request("POST", COMPL, BODY, {"x-request-id": "h2-id"})
        b = h.request("GET", "/nowhere", headers={"x-request-id": "h2-404"})
        h.wait([a, b])
        assert a.status == 200 and a.headers["x-request-id"] == "h2-id"
        assert a.headers["x-kvgate-worker"] == sw.name
        assert b.status == 404 and b.headers["x-request-id"] == "h2-404"
    finally:
        h.close()
    logged = {e["request_id"]: e for e in gw.access_entries()}
    assert logged["client-id-42"]["worker"] == sw.name
    assert logged["h2-id"]["proto"] == "HTTP/2"
    assert logged["h2-404"]["status"] == 404


def test_worker_header_can_be_switched_off(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"worker_header": False})
    r = http.post(gw.url + COMPL, json=BODY)
    assert r.status_code == 200
    assert "x-kvgate-worker" not in r.headers
    assert "x-request-id" in r.headers


def test_hop_by_hop_headers_dropped_both_ways(kvgate, fake_upstream):
    def handler(req, sock):
        body = json.dumps({"ok": True}).encode()
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Connection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\n"
                     b"X-Hop: secret\r\nProxy-Connection: keep-alive\r\nTrailer: x-t\r\n"
                     b"Upgrade: h2c\r\nX-Kvgate-Worker: spoofed\r\nX-Request-Id: spoofed\r\n"
                     b"X-End-To-End: kept\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        return True

    up = fake_upstream(handler, name="fake")
    gw = kvgate(up)
    c = RawHTTP(gw.port)
    try:
        c.send(request_bytes("POST", COMPL, BODY, {
            "Connection": "keep-alive, X-Client-Hop", "Keep-Alive": "timeout=9",
            "X-Client-Hop": "1", "TE": "trailers", "Proxy-Connection": "x",
            "X-Request-Id": "rid-1", "X-Forwarded-For": "10.1.1.1", "Authorization": "Bearer k",
            "X-Custom": "yes"}))
        status, headers, data = c.response()
    finally:
        c.close()
    assert status == 200 and json.loads(data) == {"ok": True}
    names = [k.lower() for k, _ in c.raw_headers]
    for hop in ("keep-alive", "x-hop", "proxy-connection", "trailer", "upgrade"):
        assert hop not in names, c.raw_headers
    assert headers.get("connection", "keep-alive") != "keep-alive, X-Hop"
    assert headers["x-end-to-end"] == "kept"
    assert names.count("x-kvgate-worker") == 1 and headers["x-kvgate-worker"] == "fake"
    assert names.count("x-request-id") == 1 and headers["x-request-id"] == "rid-1"
    # What the worker received.
    (req,) = up.requests
    got = req["headers"]
    for hop in ("keep-alive", "x-client-hop", "te", "proxy-connection", "authorization"):
        assert hop not in got, got
    assert got["x-custom"] == "yes"
    assert got["x-request-id"] == "rid-1"
    assert got["x-forwarded-for"] == "10.1.1.1, 127.0.0.1"
    assert got["x-forwarded-proto"] == "http"
    sent = forwarded(json.dumps(BODY).encode())
    assert int(got["content-length"]) == len(req["body"]) == len(sent)
    assert req["body"] == sent


def test_models_is_the_union_of_workers_models(simworker, kvgate):
    a = simworker(time_scale=0, model=["alpha", "beta"])
    b = simworker(time_scale=0, model=["beta", "gamma"])
    gw = kvgate(config={"workers": [worker_cfg(a, models=["alpha", "beta"]),
                                    worker_cfg(b, models=["beta", "gamma"])]})
    r = http.get(gw.url + "/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert sorted(m["id"] for m in body["data"]) == ["alpha", "beta", "gamma"]
    assert all(m["object"] == "model" for m in body["data"])
    h = H2Client(gw.port)
    try:
        (s,) = h.wait([h.request("GET", "/v1/models")])
        assert s.status == 200
        assert sorted(m["id"] for m in json.loads(s.data)["data"]) == ["alpha", "beta", "gamma"]
    finally:
        h.close()
    # Routing follows the models: each model only reaches a worker that serves it.
    for model, allowed in (("alpha", {a.name}), ("gamma", {b.name}), ("beta", {a.name, b.name})):
        for _ in range(2):
            r = http.post(gw.url + COMPL, json={"model": model, "prompt": "x", "max_tokens": 1})
            assert r.status_code == 200, r.text
            assert r.headers["x-kvgate-worker"] in allowed
            assert r.json()["model"] == model


ERROR_CASES = [
    # method, path, body, status, type, code (docs/api.md)
    ("GET", "/v2/unknown", None, 404, "not_found_error", "unknown_url"),
    ("GET", "/", None, 404, "not_found_error", "unknown_url"),
    ("GET", COMPL, None, 405, "invalid_request_error", "method_not_allowed"),
    ("DELETE", CHAT, None, 405, "invalid_request_error", "method_not_allowed"),
    ("POST", "/v1/models", b"{}", 405, "invalid_request_error", "method_not_allowed"),
    ("POST", COMPL, b"{not json", 400, "invalid_request_error", "invalid_request"),
    ("POST", COMPL, b"[1, 2]", 400, "invalid_request_error", "invalid_request"),
    ("POST", COMPL, b'{"model": 7, "prompt": "x"}', 400, "invalid_request_error", "invalid_request"),
    ("POST", COMPL, b"", 400, "invalid_request_error", "invalid_request"),
    ("POST", COMPL, b'{"model": "no-such-model", "prompt": "x"}', 404, "not_found_error",
     "model_not_found"),
]


@pytest.mark.parametrize("proto", ["h1", "h2"])
def test_openai_errors(simworker, kvgate, proto):
    sw = simworker(time_scale=0)
    gw = kvgate(config={"workers": [worker_cfg(sw, models=[sw.model])]})
    results = []
    if proto == "h1":
        for method, path, body, _, _, _ in ERROR_CASES:
            results.append(http1(gw.port, method, path, body))
    else:
        h = H2Client(gw.port)
        try:
            streams = [h.request(m, p, b) for m, p, b, _, _, _ in ERROR_CASES]
            h.wait(streams)
            results = [(s.status, s.headers, bytes(s.data)) for s in streams]
        finally:
            h.close()
    for (method, path, _, status, type_, code), (got, headers, data) in zip(ERROR_CASES, results):
        assert got == status, (method, path, data)
        assert headers["content-type"] == "application/json"
        assert re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])  # errors carry one too
        err = assert_openai_error(data, status, type_, code=code)
        if status == 404 and path == COMPL:
            assert err["message"] == "The model `no-such-model` does not exist."
    # None of these reached the worker.
    assert gw.metric("kvgate_worker_requests_total", worker=sw.name) == 0


def test_model_by_id_with_a_slash(simworker, kvgate):
    """GET /v1/models/{id} in open mode: a model name with a slash, sent as it is or as %2F."""
    sw = simworker(time_scale=0)
    gw = kvgate(config={"workers": [worker_cfg(sw, models=["org/m-2", sw.model])]})
    for path in ("/v1/models/org/m-2", "/v1/models/org%2Fm-2", "/v1/models/org%2fm-2"):
        r = http.get(gw.url + path)
        assert r.status_code == 200, path
        assert r.json()["id"] == "org/m-2"
    assert http.get(gw.url + f"/v1/models/{sw.model}?x=1").json()["id"] == sw.model
    for path in ("/v1/models/org", "/v1/models/org/m-2/", "/v1/models/org%2"):
        r = http.get(gw.url + path)
        assert r.status_code == 404, path
        assert_openai_error(r.content, 404, code="model_not_found")


def test_worker_errors_pass_through(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)  # --worker: serves any model, so the worker judges the model itself
    r = http.post(gw.url + COMPL, json={"model": "other", "prompt": "x"})
    assert r.status_code == 404
    assert r.headers["x-kvgate-worker"] == sw.name
    assert_openai_error(r.content, 404, "NotFoundError")
    r = http.post(gw.url + COMPL, json={"model": sw.model, "prompt": "x", "max_tokens": 0})
    assert r.status_code == 400
    assert assert_openai_error(r.content, 400)["param"] == "max_tokens"
    assert gw.metric("kvgate_worker_requests_total", worker=sw.name, code="400") == 1
    assert gw.metric("kvgate_worker_requests_total", worker=sw.name, code="404") == 1


def test_early_answer_discards_body_and_keeps_the_connection(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    c = RawHTTP(gw.port)
    try:
        big = b"x" * (3 << 20)
        c.send(b"POST /v1/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(big))
        status, headers, _ = c.response()  # answered before the body was sent
        assert status == 404 and headers.get("connection") != "close"
        c.send(big)  # the gateway reads and drops it, then serves the next request
        c.send(request_bytes("POST", COMPL, BODY))
        status, _, body = c.response()
        assert status == 200
        completion_ok(body)
        # Connection: close is honoured.
        c.send(request_bytes("POST", COMPL, BODY, {"Connection": "close"}))
        status, headers, _ = c.response()
        assert status == 200 and headers["connection"] == "close"
        assert c.closed_by_peer()
    finally:
        c.close()


def test_large_bodies_reach_the_worker_intact(kvgate, fake_upstream):
    def echo(req, sock):
        json_response(sock, {"len": len(req["body"]),
                             "sha": hashlib.sha256(req["body"]).hexdigest()})
        return True

    up = fake_upstream(echo, name="echo")
    gw = kvgate(up)
    body = json.dumps({"prompt": os.urandom(5 << 19).hex()}).encode()  # 5 MiB
    sent = forwarded(body)  # the same bytes plus the injected cache_salt
    want = {"len": len(sent), "sha": hashlib.sha256(sent).hexdigest()}
    r = http.post(gw.url + COMPL, content=body)
    assert r.status_code == 200 and r.json() == want
    # HTTP/2 past the initial windows: the gateway must keep opening them as it reads.
    h = H2Client(gw.port, timeout=20)
    try:
        h.pump(1)
        sid = h.conn.get_next_available_stream_id()
        h.conn.send_headers(sid, [(":method", "POST"), (":path", COMPL), (":scheme", "http"),
                                  (":authority", "t")])
        s = h.streams[sid] = H2Stream(sid)
        off = 0
        while off < len(body):
            n = min(h.conn.local_flow_control_window(sid), h.conn.max_outbound_frame_size,
                    len(body) - off)
            if n == 0:
                assert h.pump(5), "the connection closed"
                continue
            h.conn.send_data(sid, body[off:off + n], end_stream=off + n == len(body))
            off += n
            h.flush()
        h.wait([s], timeout=20)
        assert s.status == 200 and json.loads(s.data) == want
    finally:
        h.close()


def test_all_three_endpoints_are_proxied(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    r = http.post(gw.url + "/v1/embeddings", json={"model": sw.model, "input": ["a b", "c"],
                                                   "dimensions": 8})
    assert r.status_code == 200 and r.headers["x-kvgate-worker"] == sw.name
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1] and len(data[0]["embedding"]) == 8
    r = http.post(gw.url + CHAT, json={"model": sw.model, "max_tokens": 2,
                                       "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    r = http.post(gw.url + COMPL, json=BODY)
    assert r.status_code == 200
    completion_ok(r.text)
    assert gw.metric("kvgate_worker_requests_total", worker=sw.name, code="200") == 3


def test_absolute_form_request_target(simworker, kvgate):
    """RFC 9112 3.2.2: servers accept http://host/path targets (what clients of a proxy send);
    other schemes and malformed URIs get 400."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    c = RawHTTP(gw.port)
    try:
        body = {"model": sw.model, "prompt": "absolute", "max_tokens": 2}
        c.send(request_bytes("POST", f"http://example.invalid:8080{COMPL}", body))
        status, headers, data = c.response()
        assert status == 200, data
        assert json.loads(data)["choices"][0]["finish_reason"] == "length"
        # Same connection: a query-only absolute URI is the root path (no such route: 404).
        c.send(request_bytes("GET", "http://example.invalid?x=1"))
        status, _, data = c.response()
        assert status == 404, data
        assert b"no route for GET /\"" in data  # the query is not part of the route
        c.send(request_bytes("GET", "ftp://example.invalid/v1/models"))
        status, _, data = c.response()
        assert status == 400, data
    finally:
        c.close()


def recording_handler(seen, status=200):
    def handle(req, sock):
        seen.append(req)
        body = b'{"ok":true}'
        sock.sendall(f"HTTP/1.1 {status} OK\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(body)}\r\n\r\n".encode() + body)
        return True
    return handle


def test_passthrough_paths(kvgate, fake_upstream):
    """vLLM's other POST paths go to a worker serving the body's model with the tenant's salt
    (no client salt), multipart bodies as they came by load, unknown paths get unknown_url, and
    the configured list replaces the built-in one."""
    seen_a, seen_b = [], []
    a = fake_upstream(recording_handler(seen_a), name="a")
    b = fake_upstream(recording_handler(seen_b), name="b")
    gw = kvgate(config={"workers": [worker_cfg(a, models=["ma"]), worker_cfg(b, models=["mb"])]})
    for path in ("/tokenize", "/v1/rerank", "/v1/score", "/detokenize"):
        r = http.post(gw.url + path, json={"model": "mb", "prompt": "x", "cache_salt": "mine"})
        assert r.status_code == 200, (path, r.text)
        assert r.headers["x-kvgate-worker"] == "b"
        got = seen_b[-1]
        assert got["path"] == path
        sent = json.loads(got["body"])
        assert sent["model"] == "mb" and sent["cache_salt"] != "mine"
    assert not seen_a
    # A model nobody serves: 404 model_not_found, as for completions.
    r = http.post(gw.url + "/tokenize", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    assert_openai_error(r.content, 404, code="model_not_found")
    # Multipart (audio): the bytes as they came, whichever worker.
    form = (b"--XyZ\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nma\r\n"
            b"--XyZ\r\ncontent-disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            b"content-type: audio/wav\r\n\r\nRIFF\x00\x01\x02\r\n--XyZ--\r\n")
    r = http.post(gw.url + "/v1/audio/transcriptions", content=form,
                  headers={"content-type": "multipart/form-data; boundary=XyZ"})
    assert r.status_code == 200, r.text
    # Placed by load and the loop's rotation: either worker, so it is found by its path.
    sent = [g for g in seen_a + seen_b if g["path"] == "/v1/audio/transcriptions"]
    assert len(sent) == 1, (seen_a, seen_b)
    got = sent[0]
    assert got["body"] == form
    assert got["headers"]["content-type"] == "multipart/form-data; boundary=XyZ"
    r = http.post(gw.url + "/v1/unknown", json={"model": "ma"})
    assert r.status_code == 404
    assert_openai_error(r.content, 404, code="unknown_url")
    # The configured list replaces the built-in one; paths the gateway routes itself are refused.
    gw2 = kvgate(config={"workers": [worker_cfg(a, models=["ma"])],
                         "passthrough_paths": ["/custom/embed"]})
    assert http.post(gw2.url + "/custom/embed", json={"model": "ma"}).status_code == 200
    assert seen_a[-1]["path"] == "/custom/embed"
    assert http.post(gw2.url + "/tokenize", json={"model": "ma"}).status_code == 404


@pytest.mark.parametrize("path, needle", [
    ("/v1/models", "routed by the gateway already"),
    ("/v1/chat/completions", "routed by the gateway already"),
    ("tokenize", "starting with /"),
    ("/x?y=1", "without query"),
    ("/v1/models/m", "not under /v1/models/"),
    ("/v1/responses", "routed by the gateway already"),
    ("/v1/responses/x/cancel", "or /v1/responses/"),
])
def test_passthrough_paths_refused(tmp_path, path, needle):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"passthrough_paths": [path]}))
    res = subprocess.run([str(binary("kvgate")), "--check-config", "-c", str(f)],
                         capture_output=True, text=True, timeout=20)
    assert res.returncode != 0 and "passthrough_paths[0]" in res.stderr and needle in res.stderr
