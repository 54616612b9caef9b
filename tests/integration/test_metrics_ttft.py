# SPDX-License-Identifier: Apache-2.0
"""What users feel, measured by a real gateway in front of a real simworker: time to first
token at the first SSE event with output (not at the response head, which the worker sends
before prefill), inter-token latency between output events, and output tokens from usage, per
worker and per tenant (with the tenants' label cap), and in the access log.

Timings here are lower bounds only: the simworker sleeps for prefill and decode, so a first
token cannot come earlier than its prefill, whatever the load of the machine."""
import time

import pytest

from gwhelpers import CHAT, COMPL, http, wait_for

PREFILL_US = 400      # per prompt token
DECODE_US = 20000     # per output token
PROMPT = " ".join(f"w{i}" for i in range(300))  # about 300 tokens: >= 100 ms of prefill


def add_tenant(gw, tid):
    r = gw.admin.put(f"/admin/v1/tenants/{tid}", json={"sharing": "isolated"})
    assert r.status_code in (200, 201), r.text
    r = gw.admin.post(f"/admin/v1/tenants/{tid}/keys")
    assert r.status_code == 201, r.text
    return r.json()["key"]


def slow_worker(simworker):
    return simworker(prefill_us_per_token=PREFILL_US, decode_us_per_token=DECODE_US,
                     time_scale=1)


def body(model, chat, stream, max_tokens=5):
    b = {"model": model, "max_tokens": max_tokens}
    if chat:
        b["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        b["prompt"] = PROMPT
    if stream:
        b["stream"] = True
        b["stream_options"] = {"include_usage": True}
    return b


def entry(gw, path, n):
    """The n-th (1-based) access-log entry for path, once written."""
    def find():
        es = [e for e in gw.access_entries() if e["path"] == path]
        return es[n - 1] if len(es) >= n else None
    e = wait_for(find)
    assert e, gw.access_entries()
    return e


def bucket(gw, samples, family, le, **labels):
    return gw.metric(family + "_bucket", samples, le=le, **labels)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_streamed_ttft_is_first_output_not_head(simworker, kvgate, chat):
    sw = slow_worker(simworker)
    gw = kvgate(sw, auth="keys")
    key = add_tenant(gw, "acme")
    path = CHAT if chat else COMPL
    r = http.post(gw.url + path, json=body(sw.model, chat, True),
                  headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    e = entry(gw, path, 1)
    # The head left the worker before prefill; the first token after it.
    assert e["ttft_ms"] - e["ttfb_ms"] >= 0.8 * 300 * PREFILL_US / 1000, e
    assert e["ttft_ms"] <= e["duration_ms"]
    assert e["output_events"] == 5, e
    assert e["output_tokens"] == 5, e
    assert e["itl_ms"] >= 0.8 * DECODE_US / 1000, e

    s = gw.scrape()
    w = {"worker": sw.name}
    assert gw.metric("kvgate_worker_ttft_seconds_count", s, **w) == 1
    assert gw.metric("kvgate_worker_ttfb_seconds_count", s, **w) == 1
    # ttfb: the head, fast; ttft: after >= 96 ms of prefill.
    assert bucket(gw, s, "kvgate_worker_ttft_seconds", "0.05", **w) == 0
    assert bucket(gw, s, "kvgate_worker_ttft_seconds", "+Inf", **w) == 1
    assert gw.metric("kvgate_worker_ttft_seconds_sum", s, **w) >= 0.096
    # Five output events: four gaps of one decode step each (or more).
    assert gw.metric("kvgate_worker_itl_seconds_count", s, **w) == 4
    assert gw.metric("kvgate_worker_itl_seconds_sum", s, **w) >= 4 * 0.8 * DECODE_US / 1e6
    assert bucket(gw, s, "kvgate_worker_itl_seconds", "0.01", **w) == 0
    assert gw.metric("kvgate_worker_output_tokens_total", s, **w) == 5
    t = {"tenant": "acme"}
    assert gw.metric("kvgate_tenant_ttft_seconds_count", s, **t) == 1
    assert bucket(gw, s, "kvgate_tenant_ttft_seconds", "0.05", **t) == 0
    assert gw.metric("kvgate_tenant_itl_seconds_count", s, **t) == 4
    assert gw.metric("kvgate_tenant_output_tokens_total", s, **t) == 5


def test_json_answer_ttft_is_first_body_byte(simworker, kvgate):
    sw = slow_worker(simworker)
    gw = kvgate(sw, auth="keys")
    key = add_tenant(gw, "acme")
    r = http.post(gw.url + CHAT, json=body(sw.model, True, False, max_tokens=3),
                  headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    e = entry(gw, CHAT, 1)
    # The whole answer comes at once, after prefill and decode.
    assert e["ttft_ms"] >= 0.8 * (300 * PREFILL_US + 3 * DECODE_US) / 1000, e
    assert e["ttft_ms"] <= e["duration_ms"]
    assert e["output_events"] == 0 and e["itl_ms"] is None, e
    assert e["output_tokens"] == 3, e
    s = gw.scrape()
    assert gw.metric("kvgate_worker_ttft_seconds_count", s, worker=sw.name) == 1
    assert gw.metric("kvgate_worker_itl_seconds_count", s, worker=sw.name) == 0
    assert gw.metric("kvgate_tenant_output_tokens_total", s, tenant="acme") == 3


def test_no_ttft_for_errors_and_other_paths(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    assert http.post(gw.url + CHAT, json={"model": "nope", "messages": []}).status_code >= 400
    r = http.post(gw.url + "/v1/embeddings", json={"model": sw.model, "input": "hi"})
    assert r.status_code == 200, r.text
    e = entry(gw, "/v1/embeddings", 1)
    assert e["ttft_ms"] is None and e["output_tokens"] is None, e
    for e in gw.access_entries():
        assert e["ttft_ms"] is None, e
    assert gw.metric("kvgate_worker_ttft_seconds_count", worker=sw.name) == 0


def test_tenant_label_cap(simworker, kvgate):
    """Past tenant_metrics_max the histograms and token counts are summed under 'other'."""
    sw = simworker(time_scale=0)
    gw = kvgate(sw, auth="keys", config={"tenant_metrics_max": 1})
    keys = [add_tenant(gw, t) for t in ("first", "second", "third")]
    for k in keys:
        r = http.post(gw.url + COMPL, json=body(sw.model, False, True, max_tokens=2),
                      headers={"authorization": f"Bearer {k}"})
        assert r.status_code == 200, r.text
    wait_for(lambda: len(gw.access_entries()) >= 3 + 6)
    s = gw.scrape()
    assert gw.metric("kvgate_tenant_ttft_seconds_count", s, tenant="first") == 1
    assert gw.metric("kvgate_tenant_ttft_seconds_count", s, tenant="other") == 2
    assert gw.metric("kvgate_tenant_itl_seconds_count", s, tenant="other") == 2
    assert gw.metric("kvgate_tenant_output_tokens_total", s, tenant="other") == 4
    assert not [k for k in s if 'tenant="second"' in k or 'tenant="third"' in k]
    # Per worker, everything.
    assert gw.metric("kvgate_worker_output_tokens_total", s, worker=sw.name) == 6


def test_events_split_across_reads_and_no_content_type(kvgate, fake_upstream):
    """A worker that names no content type streams what was asked for; events split at odd
    bytes across reads still count once, a role-only chunk does not, a tool-call delta does."""
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    tool = (b'data: {"choices":[{"delta":{"content":null,"tool_calls":[{"index":0,"id":"t1",'
            b'"function":{"name":"f","arguments":""}}]}}]}\n\n')
    text = b'data: {"choices":[{"delta":{"content":"hi"}}]}\r\n\r\n'
    usage = (b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,'
             b'"prompt_tokens_details":null}}\n\ndata: [DONE]\n\n')

    def chunk(sock, data):
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def handler(req, sock):
        sock.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk(sock, role)
        time.sleep(0.1)
        chunk(sock, tool[:17])  # inside "choices"
        time.sleep(0.02)
        chunk(sock, tool[17:-1])  # all but the blank line's last LF
        time.sleep(0.05)
        chunk(sock, tool[-1:] + text[:31])  # the event ends here; "content" split
        time.sleep(0.02)
        chunk(sock, text[31:] + usage)
        sock.sendall(b"0\r\n\r\n")
        return True

    up = fake_upstream(handler, name="fake")
    gw = kvgate(up)
    r = http.post(gw.url + CHAT, json={"model": "m", "stream": True,
                                       "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text
    e = entry(gw, CHAT, 1)
    assert e["output_events"] == 2, e
    assert e["output_tokens"] == 2, e
    assert e["ttft_ms"] - e["ttfb_ms"] >= 0.8 * (100 + 20 + 50), e
    assert e["itl_ms"] >= 0.8 * 20, e
    s = gw.scrape()
    assert gw.metric("kvgate_worker_ttft_seconds_count", s, worker="fake") == 1
    assert gw.metric("kvgate_worker_itl_seconds_count", s, worker="fake") == 1
    assert gw.metric("kvgate_worker_output_tokens_total", s, worker="fake") == 2
