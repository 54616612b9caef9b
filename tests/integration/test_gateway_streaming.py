# SPDX-License-Identifier: Apache-2.0
"""Streaming through kvgate: SSE events reach the client as the worker produces them (HTTP/1.1
and HTTP/2), many concurrent streams share one h2 connection, a worker dying mid-stream breaks
only its own streams, a slow client holds the worker back instead of filling the gateway's
memory, and a client that leaves cancels the worker's work."""
import hashlib
import json
import os
import signal
import threading
import time

import h2.settings
import httpx
import pytest

from gwhelpers import (CHAT, COMPL, H2Client, RawHTTP, request_bytes, sim_metric, sse_data,
                       wait_for, worker_cfg)


def stream_body(model="sim-model", max_tokens=8, chat=True):
    if chat:
        return {"model": model, "messages": [{"role": "user", "content": "tell me"}],
                "max_tokens": max_tokens, "stream": True}
    return {"model": model, "prompt": "tell me", "max_tokens": max_tokens, "stream": True}


def event_times(chunks):
    """[(t, bytes)] -> [(t, event text)]: the time each SSE event was complete."""
    buf, out = "", []
    for t, piece in chunks:
        buf += piece.decode()
        while "\n\n" in buf:
            ev, _, buf = buf.partition("\n\n")
            out.append((t, ev))
    assert buf == "", buf
    return out


def check_chat_stream(data, tokens):
    """data: the payloads of the SSE events (sse_data). A complete vLLM-style chat stream of
    `tokens` tokens."""
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(chunks) == tokens + 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# ---- incremental delivery -------------------------------------------------------------------------


def test_sse_incremental_http1(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=40000, time_scale=1)
    gw = kvgate(sw)
    c = RawHTTP(gw.port)
    try:
        t0 = time.monotonic()
        c.send(request_bytes("POST", CHAT, stream_body(max_tokens=8)))
        assert c.read_head() == 200
        assert c.headers["content-type"].startswith("text/event-stream")
        assert c.headers["transfer-encoding"] == "chunked"
        assert c.headers["x-kvgate-worker"] == sw.name
        events = event_times(list(c.chunks()))
        assert c.complete
    finally:
        c.close()
    assert all(e.startswith("data: ") for _, e in events)
    check_chat_stream([e[len("data: "):] for _, e in events], 8)
    # 7 decode steps of 40 ms lie between the first token and the last: the first events
    # reached us long before the stream ended, not all at once at the end.
    first_token, last_token = events[1][0], events[-2][0]
    assert last_token - first_token > 0.2, [round(t - t0, 3) for t, _ in events]
    assert events[0][0] - t0 < 0.15
    gaps = [b[0] - a[0] for a, b in zip(events[1:-2], events[2:-1])]
    assert sum(g > 0.02 for g in gaps) >= 5, gaps


def test_sse_incremental_http2(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=40000, time_scale=1)
    gw = kvgate(sw)
    h = H2Client(gw.port)
    try:
        t0 = time.monotonic()
        s = h.request("POST", COMPL, stream_body(max_tokens=8, chat=False))
        h.wait([s])
    finally:
        h.close()
    assert s.status == 200 and s.ended and s.reset is None
    assert s.headers["content-type"].startswith("text/event-stream")
    events = event_times(s.chunks)
    data = [e[len("data: "):] for _, e in events]
    assert data[-1] == "[DONE]"
    texts = [json.loads(d)["choices"][0]["text"] for d in data[:-1]]
    assert "".join(texts).startswith(" the of and to")
    assert len(texts) == 8
    assert events[-2][0] - events[0][0] > 0.2, [round(t - t0, 3) for t, _ in events]


def test_sse_httpx_http2_iter(simworker, kvgate):
    """An SDK-like client: httpx with h2, reading lines as they come."""
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=30000, time_scale=1)
    gw = kvgate(sw)
    seen = []
    with httpx.Client(http1=False, http2=True, timeout=10, verify=False) as client:
        with client.stream("POST", gw.url + CHAT, json=stream_body(max_tokens=6)) as r:
            assert r.status_code == 200 and r.http_version == "HTTP/2"
            text = ""
            for piece in r.iter_text():
                text += piece
                seen.append(time.monotonic())
    check_chat_stream(sse_data(text), 6)
    assert seen[-1] - seen[0] > 0.1


# ---- many streams on one connection ---------------------------------------------------------------


def test_200_concurrent_streams_on_one_h2_connection(simworker, kvgate):
    # Each request lasts about 0.75 s on its worker, so all 200 overlap once sent.
    a = simworker(prefill_us_per_token=0, decode_us_per_token=250000, time_scale=1)
    b = simworker(prefill_us_per_token=0, decode_us_per_token=250000, time_scale=1)
    gw = kvgate(a, b)
    n = 200
    h = H2Client(gw.port, timeout=30)
    try:
        assert h.pump(2)  # the server's SETTINGS
        assert h.remote_settings.get(3, 0) >= n  # MAX_CONCURRENT_STREAMS
        streams = []
        for i in range(n):
            body = stream_body(max_tokens=4, chat=(i % 2 == 0))
            if i % 4 == 3:
                body["stream"] = False
            streams.append(h.request("POST", CHAT if i % 2 == 0 else COMPL, body,
                                     {"x-request-id": f"req-{i}"}))
        peak = [0]

        def together():
            peak[0] = max(peak[0], gw.metric("kvgate_worker_inflight"))
            return peak[0] >= n * 0.9
        together = wait_for(together, 3)
        h.wait(streams, timeout=30)
    finally:
        h.close()
    assert together, f"at most {peak[0]} of the 200 requests were in flight together"
    for i, s in enumerate(streams):
        assert s.status == 200 and s.ended and s.reset is None, (i, s.headers, bytes(s.data))
        assert s.headers["x-request-id"] == f"req-{i}"
        text = s.data.decode()
        if i % 4 == 3:
            assert json.loads(text)["usage"]["completion_tokens"] == 4
        else:
            events = sse_data(text)
            assert events[-1] == "[DONE]" and len(events) == (6 if i % 2 == 0 else 5), events
    workers = {s.headers["x-kvgate-worker"] for s in streams}
    assert workers == {a.name, b.name}  # least loaded: both took a share
    samples = gw.scrape()
    assert gw.metric("kvgate_connections_total", samples, protocol="http2") == 1
    assert gw.metric("kvgate_worker_requests_total", samples, code="200") == n
    assert gw.metric("kvgate_worker_inflight", samples) == 0


# ---- a worker dies mid-stream ---------------------------------------------------------------------


def test_worker_killed_mid_stream(simworker, kvgate):
    doomed = simworker(model="a", prefill_us_per_token=0, decode_us_per_token=20000,
                       time_scale=1)
    healthy = simworker(model="b", prefill_us_per_token=0, decode_us_per_token=20000,
                        time_scale=1)
    gw = kvgate(config={"workers": [worker_cfg(doomed, models=["a"]),
                                    worker_cfg(healthy, models=["b"])]})
    h = H2Client(gw.port, timeout=20)
    h1_doomed = RawHTTP(gw.port)
    h1_healthy = [RawHTTP(gw.port) for _ in range(3)]
    try:
        victim = h.request("POST", CHAT, stream_body("a", max_tokens=1000))
        others = [h.request("POST", CHAT, stream_body("b", max_tokens=40)) for _ in range(5)]
        h1_doomed.send(request_bytes("POST", CHAT, stream_body("a", max_tokens=1000)))
        for c in h1_healthy:
            c.send(request_bytes("POST", CHAT, stream_body("b", max_tokens=40)))
        assert h1_doomed.read_head() == 200
        doomed_chunks = h1_doomed.chunks()
        first = next(doomed_chunks)[1]
        assert first.startswith(b"data: ")
        assert wait_for(lambda: h.pump(0.2) and len(victim.data) > 0 and
                        all(len(s.data) > 0 for s in others), 5)
        doomed.expect_exit = -signal.SIGKILL
        doomed.proc.kill()
        doomed.proc.wait()
        h.wait([victim] + others, timeout=15)
        # HTTP/2: the victim's stream is reset (never a clean END_STREAM), the rest complete.
        assert victim.reset is not None and not victim.ended
        assert b"[DONE]" not in victim.data
        for s in others:
            assert s.status == 200 and s.ended, bytes(s.data)
            check_chat_stream(sse_data(s.data.decode()), 40)
        # HTTP/1.1: the chunked body stops without its terminating chunk.
        rest = b"".join(p for _, p in doomed_chunks)
        assert not h1_doomed.complete
        assert b"[DONE]" not in first + rest
        for c in h1_healthy:
            assert c.read_head() == 200
            check_chat_stream(sse_data(c.body().decode()), 40)
            assert c.complete
        # The h2 connection survived the reset: more requests on it work.
        again = h.request("POST", CHAT, stream_body("b", max_tokens=2))
        h.wait([again])
        assert again.status == 200 and again.ended
        # Model "a" has nobody left: an error in the OpenAI shape, not a hang.
        lost = h.request("POST", CHAT, stream_body("a", max_tokens=2))
        h.wait([lost])
        assert lost.status in (502, 503)
        code = json.loads(lost.data)["error"]["code"]
        assert code == {502: "upstream_error", 503: "service_unavailable"}[lost.status]
    finally:
        h.close()
        h1_doomed.close()
        for c in h1_healthy:
            c.close()
    samples = gw.scrape()
    assert gw.metric("kvgate_worker_requests_total", samples, worker=healthy.name,
                     code="200") == 9
    assert gw.metric("kvgate_worker_inflight", samples) == 0


def test_worker_cutting_a_stream_is_a_clean_error(simworker, kvgate):
    """The simulated engine's own crash mode (FIN without the last chunk) gives the same
    clean error as a killed worker."""
    sw = simworker(time_scale=0, close_mid_stream_rate=1.0)
    gw = kvgate(sw)
    h = H2Client(gw.port)
    try:
        s = h.request("POST", CHAT, stream_body(max_tokens=50))
        h.wait([s])
        assert s.status == 200 and s.reset is not None and not s.ended
        assert s.data.startswith(b"data: ") and b"[DONE]" not in s.data
    finally:
        h.close()
    # HTTP/1.1: the head and the events already produced arrive, then the body breaks off
    # (no terminating chunk). Several times, since the worker's bytes and its close usually
    # reach the gateway together.
    for _ in range(10):
        c = RawHTTP(gw.port)
        try:
            c.send(request_bytes("POST", CHAT, stream_body(max_tokens=50)))
            assert c.read_head() == 200
            body = c.body()
            assert body.startswith(b"data: ")
            assert not c.complete and b"[DONE]" not in body
        finally:
            c.close()


# ---- backpressure ---------------------------------------------------------------------------------

BLOCK = 1 << 20
HUGE = 200 * BLOCK
PATTERN = os.urandom(BLOCK - 8)


def block(i):
    return i.to_bytes(8, "big") + PATTERN


def huge_stream_handler(state):
    """A worker answering with HUGE bytes of a counted pattern, as fast as the gateway takes
    them; state['sent'] follows its progress."""
    def handler(req, sock):
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                     b"content-length: %d\r\n\r\n" % HUGE)
        for i in range(HUGE // BLOCK):
            sock.sendall(block(i))
            state["sent"] += BLOCK
        return False
    return handler


def expected_digest():
    h = hashlib.sha256()
    for i in range(HUGE // BLOCK):
        h.update(block(i))
    return h.hexdigest()


def watch_pause(gw, state, rss0):
    """While the client reads nothing: the worker is held back and the gateway's memory stays
    bounded. Returns (bytes the worker got out, peak RSS growth in kB)."""
    assert wait_for(lambda: state["sent"] > 0, 5)
    time.sleep(1.0)  # let every buffer on the way fill up
    sent = state["sent"]
    peak = 0
    for _ in range(10):
        peak = max(peak, gw.rss_kb() - rss0)
        time.sleep(0.05)
    assert state["sent"] - sent <= 8 * BLOCK, "the worker kept streaming into a paused client"
    return state["sent"], peak


@pytest.mark.parametrize("proto", ["h1", "h2"])
def test_slow_client_backpressure(kvgate, fake_upstream, proto):
    state = {"sent": 0}
    up = fake_upstream(huge_stream_handler(state), name="huge")
    gw = kvgate(up)
    want = {}
    digest = threading.Thread(target=lambda: want.setdefault("d", expected_digest()))
    digest.start()
    rss0 = gw.rss_kb()
    got = hashlib.sha256()
    total = 0
    if proto == "h1":
        c = RawHTTP(gw.port, timeout=30)
        try:
            c.send(request_bytes("POST", COMPL, {"prompt": "x"}))
            assert c.read_head() == 200
            assert int(c.headers["content-length"]) == HUGE
            first = c.file.read(BLOCK)
            got.update(first)
            total += len(first)
            sent, growth = watch_pause(gw, state, rss0)
            while total < HUGE:
                piece = c.file.read1(1 << 20)
                assert piece, f"connection closed after {total} bytes"
                got.update(piece)
                total += len(piece)
        finally:
            c.close()
    else:
        h = H2Client(gw.port, timeout=30)
        try:
            s = h.request("POST", COMPL, {"prompt": "x"})
            while len(s.data) < BLOCK:
                assert h.pump(5)
            sent, growth = watch_pause(gw, state, rss0)
            got.update(s.data)
            total += len(s.data)
            s.data.clear()
            while not s.done:
                assert h.pump(5)
                got.update(s.data)
                total += len(s.data)
                s.data.clear()
                s.chunks.clear()  # keep the client's own memory flat
            assert s.ended and s.status == 200
        finally:
            h.close()
    digest.join()
    print(f"backpressure {proto}: worker sent {sent >> 20} MiB, RSS +{growth >> 10} MiB")
    assert sent < 64 * BLOCK, f"{sent >> 20} MiB left the worker while the client was paused"
    assert growth < 64 * 1024, f"gateway RSS grew by {growth >> 10} MiB for a paused client"
    assert total == HUGE
    assert got.hexdigest() == want["d"]


def test_h2_flow_control_backpressure(kvgate, fake_upstream):
    """A client that reads its socket but grants no window: h2 flow control, not TCP, holds
    the response back, and the worker with it."""
    state = {"sent": 0}
    up = fake_upstream(huge_stream_handler(state), name="huge")
    gw = kvgate(up)
    rss0 = gw.rss_kb()
    h = H2Client(gw.port, timeout=30,
                 settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    try:
        s = h.request("POST", COMPL, {"prompt": "x"})
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert h.pump(0.1)
        assert s.status == 200 and len(s.data) == 0  # headers, but no window for data
        sent = state["sent"]
        growth = gw.rss_kb() - rss0
        # Open the windows: everything arrives.
        h.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
        h.conn.increment_flow_control_window(1 << 30)
        h.flush()
        total = 0
        while not s.done:
            assert h.pump(5)
            total += len(s.data)
            s.data.clear()
            s.chunks.clear()
        assert s.ended
    finally:
        h.close()
    assert sent < 64 * BLOCK, f"{sent >> 20} MiB left the worker with a zero window"
    assert growth < 64 * 1024, f"gateway RSS grew by {growth >> 10} MiB"
    assert total == HUGE


# ---- cancellation ---------------------------------------------------------------------------------


def test_client_disconnect_cancels_upstream(simworker, kvgate):
    sw = simworker(prefill_us_per_token=0, decode_us_per_token=10000, time_scale=1)
    gw = kvgate(sw)
    running = lambda: sim_metric(sw, "vllm:num_requests_running")  # noqa: E731
    # HTTP/1.1 stream: read one event, hang up.
    c = RawHTTP(gw.port)
    c.send(request_bytes("POST", CHAT, stream_body(max_tokens=3000)))
    assert c.read_head() == 200
    next(c.chunks())
    assert running() == 1
    c.close()
    assert wait_for(lambda: running() == 0, 3), "the worker kept generating for nobody"
    # HTTP/2: RST_STREAM one stream; its sibling on the connection goes on.
    h = H2Client(gw.port)
    try:
        gone = h.request("POST", CHAT, stream_body(max_tokens=3000))
        kept = h.request("POST", CHAT, stream_body(max_tokens=30))
        assert wait_for(lambda: h.pump(0.1) and gone.data and kept.data, 5)
        h.reset(gone)
        h.wait([kept])
        assert kept.ended and kept.status == 200
        check_chat_stream(sse_data(kept.data.decode()), 30)
        assert wait_for(lambda: running() == 0, 3)
        # Closing the whole h2 connection cancels what is on it.
        for _ in range(2):
            h.request("POST", COMPL, stream_body(max_tokens=3000, chat=False))
        assert wait_for(lambda: h.pump(0.1) and running() == 2, 5)
    finally:
        h.close()
    assert wait_for(lambda: running() == 0, 3)
    # Non-streaming, hung up before any response byte (the request is still generating).
    c = RawHTTP(gw.port)
    c.send(request_bytes("POST", COMPL, {"prompt": "x", "max_tokens": 3000}))
    assert wait_for(lambda: running() == 1, 3)
    c.close()
    assert wait_for(lambda: running() == 0, 3)
    assert sim_metric(sw, "vllm:request_success_total", finished_reason="abort") == 5
    assert wait_for(lambda: gw.metric("kvgate_worker_inflight") == 0, 3)
    assert gw.metric("kvgate_http_requests_total", **{"class": "0xx"}) >= 1
    # The access log says 499 for each of the five, as nginx does, with what had been sent:
    # 200 for the two streams that had sent events, nothing for the non-streamed one (the two
    # on the closed connection either); the one that finished says 200.
    logged = [e for e in gw.access_entries() if e["path"] in (CHAT, COMPL)]
    gone = [e for e in logged if e["status"] == 499]
    assert len(gone) == 5, logged
    sent = sorted(e["status_sent"] for e in gone)
    assert sent[0] == 0 and sent[-2:] == [200, 200] and set(sent) <= {0, 200}, sent
    assert all(e["tries"] == 1 and e["model"] == sw.model for e in gone if e["status_sent"]), gone
    assert [e["status"] for e in logged if e["status"] != 499] == [200]
