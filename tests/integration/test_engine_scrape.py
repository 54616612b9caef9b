# SPDX-License-Identifier: Apache-2.0
"""Scraping the engines' own load (gateway/scrape.c): vllm:num_requests_waiting and
vllm:kv_cache_usage_perc read from each worker's /metrics every scrape.interval_ms, shown as
kvgate_worker_engine_* gauges and in route explain, and priced by the cost policy
(waiting_cost_per_request x waiting). Off by default; bad pages count scrape errors and leave
routing alone."""
import threading
import time

import httpx

SCRAPE = {"scrape": {"interval_ms": 200, "timeout_ms": 1000}}
WAITING_COST = 5000.0  # waiting_cost_per_request, the default (docs/admin-api.md)
QUEUE_COST = 1000.0  # queue_cost_per_request, the default


def explain(gw, model):
    r = gw.admin.post("/admin/v1/route/explain",
                      json={"request": {"model": model, "prompt": "hello there"}})
    assert r.status_code == 200, r.text
    return {c["worker"]: c for c in r.json()["candidates"]}, r.json()


def wait_for(pred, timeout=10.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def flood(worker, n, max_tokens=20):
    """n requests straight to the worker (not through the gateway), in background threads."""
    def one():
        try:
            httpx.post(worker.url + "/v1/completions", timeout=60,
                       json={"model": worker.model, "prompt": "queue me", "max_tokens": max_tokens})
        except httpx.HTTPError:
            pass  # the worker may be stopped at teardown while these run
    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_waiting_requests_are_scraped_and_priced(simworker, kvgate):
    busy = simworker(max_running=1, time_scale=1, decode_us_per_token=200000)
    idle = simworker(time_scale=0)
    gw = kvgate(busy, idle, config=SCRAPE)
    # Both scraped once, with nothing waiting yet.
    assert wait_for(lambda: all(
        f'kvgate_worker_engine_waiting{{worker="{w.name}"}}' in gw.scrape()
        for w in (busy, idle)))
    flood(busy, 4)  # one runs (4 s of decode), three wait
    assert wait_for(lambda: gw.metric("kvgate_worker_engine_waiting", worker=busy.name) > 0)
    assert gw.metric("kvgate_worker_engine_waiting", worker=idle.name) == 0
    kv = gw.metric("kvgate_worker_engine_kv_usage", worker=busy.name)
    assert 0 < kv <= 1  # the running sequence holds blocks

    cands, ex = explain(gw, busy.model)
    b, i = cands[busy.name], cands[idle.name]
    assert b["waiting"] > 0
    assert 0 < b["kv_usage"] <= 1
    assert i["waiting"] == 0
    # queue_cost = queue_cost_per_request x inflight + waiting_cost_per_request x waiting
    # (+ kv_usage_cost x kv_usage, 0 by default)
    assert b["queue_cost"] >= WAITING_COST * b["waiting"]
    assert abs(b["queue_cost"] - (QUEUE_COST * b["inflight"] + WAITING_COST * b["waiting"])) < 0.01
    assert gw.metric("kvgate_worker_scrape_errors_total") == 0
    # (Which worker wins is the policy's business: cold prefixes go by rendezvous and prompts
    # without a full block by in-flight counts; the scraped queue prices prefix hits.)


def test_scraping_off_by_default(simworker, kvgate):
    busy = simworker(max_running=1, time_scale=1, decode_us_per_token=200000)
    gw = kvgate(busy)
    flood(busy, 3)
    # The engine has a queue, but the gateway does not look.
    assert wait_for(lambda: b"vllm:num_requests_waiting" in httpx.get(busy.url + "/metrics").content)
    assert wait_for(lambda: any(
        line.startswith("vllm:num_requests_waiting") and float(line.split()[-1]) > 0
        for line in httpx.get(busy.url + "/metrics").text.splitlines()))
    time.sleep(0.5)
    samples = gw.scrape()
    assert gw.metric("kvgate_worker_engine_waiting", samples) == 0
    assert not any(k.startswith("kvgate_worker_engine_") for k in samples)
    assert gw.metric("kvgate_worker_scrape_errors_total", samples, worker=busy.name) == 0
    cands, _ = explain(gw, busy.model)
    assert cands[busy.name]["waiting"] == 0
    assert cands[busy.name]["kv_usage"] == 0


COMPLETION = (b'{"id":"c1","object":"text_completion","model":"m","choices":[{"index":0,'
              b'"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":3,'
              b'"completion_tokens":1,"total_tokens":4}}')

PAGE = (b"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        b"# TYPE vllm:num_requests_waiting gauge\n"
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        b'vllm:num_requests_waiting{engine="1",model_name="m \\"x\\" {}"} 5.0\n'
        b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        b'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n')


def engine(metrics):
    """A fake engine: /metrics answered by metrics(sock), completions answered with a small
    JSON body."""
    def handler(req, sock):
        if req["path"] == "/metrics":
            metrics(sock)
            return False
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))
        return True
    return handler


def page_chunked(sock):
    half = len(PAGE) // 2
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (PAGE[:half], PAGE[half:]))
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n"
                 b"\r\n" + body + b"0\r\n\r\n")


def page_until_close(sock):
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n"
                 + PAGE)


def page_404(sock):
    sock.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nnot found")


def page_garbage(sock):
    body = b"\x00\xff{{{ vllm:num_requests_waiting{ 7\nvllm:kv_cache_usage_perc zero\n" * 50
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


def page_too_big(sock):
    line = b"vllm:num_requests_waiting 1\n"
    sock.sendall(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
    try:
        for _ in range((2 << 20) // (len(line) * 1000)):
            sock.sendall(line * 1000)
    except OSError:
        pass  # the gateway stops reading at 1 MiB and closes


def test_chunked_and_close_delimited_pages(fake_upstream, kvgate):
    a = fake_upstream(engine(page_chunked), name="chunked")
    b = fake_upstream(engine(page_until_close), name="closed")
    gw = kvgate(a, b, config=SCRAPE)
    for w in (a, b):
        assert wait_for(lambda: gw.metric("kvgate_worker_engine_waiting", worker=w.name) == 7)
        assert gw.metric("kvgate_worker_engine_kv_usage", worker=w.name) == 0.75
        assert gw.metric("kvgate_worker_scrape_errors_total", worker=w.name) == 0
    cands, _ = explain(gw, "m")
    assert cands["chunked"]["waiting"] == 7 and cands["closed"]["waiting"] == 7
    assert cands["chunked"]["kv_usage"] == 0.75


def test_bad_pages_count_errors_and_routing_goes_on(fake_upstream, kvgate):
    bad = {f.__name__: fake_upstream(engine(f), name=f.__name__.replace("_", "-"))
           for f in (page_404, page_garbage, page_too_big)}
    gw = kvgate(*bad.values(), config=SCRAPE, log_level="debug")
    for w in bad.values():
        assert wait_for(lambda: gw.metric("kvgate_worker_scrape_errors_total", worker=w.name) >= 2)
    samples = gw.scrape()
    assert not any(k.startswith("kvgate_worker_engine_") for k in samples)
    assert gw.metric("kvgate_worker_up", samples) == 3  # scraping is not health
    seen = set()
    for _ in range(12):
        r = httpx.post(gw.url + "/v1/completions", timeout=10,
                       json={"model": "m", "prompt": "still routed", "max_tokens": 1})
        assert r.status_code == 200, r.text
        seen.add(r.headers["x-kvgate-worker"])
    assert seen  # requests are answered; scraped load stays unknown (0) for every worker
    cands, _ = explain(gw, "m")
    assert all(c["waiting"] == 0 and c["kv_usage"] == 0 for c in cands.values())
    assert "scrape of page-404 failed" in gw.log()
    assert "metrics page over 1 MiB" in gw.log()
