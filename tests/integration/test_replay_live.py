# SPDX-License-Identifier: Apache-2.0
"""kvgate-replay --live: trace requests sent through a real kvgate to kvgate-simworker processes.

- The pseudo-text (recorded by a scripted HTTP/1.1 server standing in for the gateway) has
  5 bytes per token, equal id prefixes give equal text and the first differing id gives
  different text, and the simworker's /tokenize counts exactly input_length tokens and cuts
  the prompt at every 512-token block boundary (the prompt's tokens are its blocks' tokens).
- A generated trace with sequential arrivals through kvgate (cost policy, one Mooncake block
  per gateway block key) to 1 or 3 simworkers (--block-tokens 512) over HTTP/2, HTTP/1.1 and
  mixed: every request succeeds and the realised cached tokens equal what the trace's shared
  prefixes imply, computed here (leading blocks seen before, full blocks only, at most
  (prompt - 1) // 512 of them: the simworker's last-token rule).
- API keys: tenants by first block, each request authenticated.
- Failures are counted and exit 1: workers answering 500, a dead gateway, a bad URL.
- A slice of the Mooncake conversation trace (skipped when absent) succeeds through 4 workers and
  lands within 5 points of the offline prediction.
"""
import json
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from test_replay import CONVERSATION, replay

BLOCK = 512
TOKEN_BYTES = 5
MODEL = "sim-model"
def write_trace(path, reqs):
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return path


def gen_trace(seed=1, n=24, gap_ms=60):
    """Conversations that grow turn by turn (shared prefixes of several depths), a few unrelated
    prompts, short last blocks and exact multiples of 512, one arrival every gap_ms."""
    rnd = random.Random(seed)
    next_id = [0]

    def ids(k):
        out = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return out

    convs = [ids(rnd.randint(1, 3)) for _ in range(4)]
    reqs = []
    for i in range(n):
        c = rnd.randrange(len(convs) + 1)
        if c == len(convs):
            hids = ids(rnd.randint(1, 4))  # unrelated
        else:
            hids = convs[c] = convs[c] + ids(rnd.randint(0, 2))
        exact = rnd.random() < 0.3
        tail = 0 if exact else rnd.randint(1, BLOCK - 1)
        length = (len(hids) - (0 if exact else 1)) * BLOCK + tail
        if not exact and tail == 0:
            length = len(hids) * BLOCK
        reqs.append({"timestamp": i * gap_ms, "input_length": length,
                     "output_length": rnd.randint(1, 4), "hash_ids": hids})
    return reqs


def expected_cached(reqs):
    """Tokens the simworker reports cached with sequential arrivals and caches large enough:
    the leading blocks seen before, full blocks only, at most (prompt - 1) // 512 blocks."""
    seen = set()
    total = 0
    for r in reqs:
        ids = r["hash_ids"]
        full = r["input_length"] // BLOCK
        k = 0
        while k < len(ids) and tuple(ids[:k + 1]) in seen:
            k += 1
        total += BLOCK * min(k, full, (r["input_length"] - 1) // BLOCK)
        for i in range(full):  # only full blocks are cached
            seen.add(tuple(ids[:i + 1]))
    return total


# ---- the pseudo-text -----------------------------------------------------------------------------

class Recorder(BaseHTTPRequestHandler):
    """Stands in for the gateway: records each body and answers a minimal completions stream
    whose usage reports len(prompt) / 5 prompt tokens."""
    protocol_version = "HTTP/1.1"
    bodies = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append((self.path, body))
        usage = {"prompt_tokens": len(body["prompt"]) // TOKEN_BYTES, "completion_tokens": 1,
                 "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}
        events = [{"choices": [{"index": 0, "text": " the", "finish_reason": "length"}]},
                  {"choices": [], "usage": usage}]
        out = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        data = out.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-kvgate-worker", "recorder")
        self.end_headers()
        self.wfile.write(data)


def tokenize(worker, text):
    r = httpx.post(f"http://127.0.0.1:{worker.port}/tokenize",
                   json={"model": MODEL, "prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_pseudo_text_tokenizes_at_block_boundaries(tmp_path, simworker):
    reqs = gen_trace(seed=7, n=16, gap_ms=5)
    trace = write_trace(tmp_path / "t.jsonl", reqs)
    Recorder.bodies = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        res = replay("--trace", trace, "--policies", "cost", "--live",
                     f"http://127.0.0.1:{srv.server_address[1]}/v1", "--http", "1.1",
                     "--max-tokens", "3", "--quiet", "--format", "json")
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.returncode == 0, res.stderr
    assert len(Recorder.bodies) == len(reqs)
    w = simworker(time_scale=0, block_tokens=BLOCK, kv_blocks=4096, max_model_len=BLOCK * 64)
    # The requests leave in arrival order (one every 5 ms), but match them by content anyway.
    prompts = {}
    for path, body in Recorder.bodies:
        assert path == "/v1/completions"
        assert body["model"] == MODEL and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert 1 <= body["max_tokens"] <= 3
        prompts.setdefault(len(body["prompt"]), []).append(body["prompt"])
    by_req = []
    for r in reqs:
        cands = prompts[r["input_length"] * TOKEN_BYTES]
        by_req.append(cands)
    # Equal id prefixes give equal block text, and the first differing id different text.
    texts = [c[0] for c in by_req if len(c) == 1]
    reqs_unique = [r for r, c in zip(reqs, by_req) if len(c) == 1]
    for a, ta in zip(reqs_unique, texts):
        for b, tb in zip(reqs_unique, texts):
            for i in range(min(len(a["hash_ids"]), len(b["hash_ids"]))):
                n = min(a["input_length"], b["input_length"], (i + 1) * BLOCK) - i * BLOCK
                if n <= 0:
                    break
                sa = ta[i * BLOCK * TOKEN_BYTES:(i * BLOCK + n) * TOKEN_BYTES]
                sb = tb[i * BLOCK * TOKEN_BYTES:(i * BLOCK + n) * TOKEN_BYTES]
                if a["hash_ids"][:i + 1] == b["hash_ids"][:i + 1]:
                    assert sa == sb
                else:
                    assert sa != sb
                    break
    # The simworker counts input_length tokens and cuts at every block boundary.
    for r, t in zip(reqs_unique, texts):
        whole = tokenize(w, t)
        assert whole["count"] == r["input_length"]
        parts = []
        for i in range(0, len(t), BLOCK * TOKEN_BYTES):
            part = tokenize(w, t[i:i + BLOCK * TOKEN_BYTES])
            assert part["count"] == min(BLOCK, r["input_length"] - i // TOKEN_BYTES)
            parts += part["tokens"]
        assert whole["tokens"] == parts


# ---- through kvgate -------------------------------------------------------------------------------

def start_fleet(simworker, kvgate, n, auth="open", **wflags):
    flags = dict(time_scale=0, block_tokens=BLOCK, kv_blocks=4096, max_model_len=BLOCK * 64)
    flags.update(wflags)
    ws = [simworker(**flags) for _ in range(n)]
    gw = kvgate(*ws, auth=auth)
    r = gw.admin.put("/admin/v1/policy", json={"policy": "cost",
                                               "block_bytes": BLOCK * TOKEN_BYTES})
    assert r.status_code == 200, r.text
    return ws, gw


def live(gw, trace, *args, workers=1, timeout=120):
    return replay("--trace", trace, "--workers", workers, "--capacity", 4096, "--policies", "cost",
                  "--live", gw.url, "--quiet", "--format", "json", *args, timeout=timeout)


def live_row(res):
    rep = json.loads(res.stdout)
    return {r["name"]: r for r in rep["rows"]}["live"], rep


@pytest.mark.parametrize("http,nworkers", [("2", 1), ("1.1", 3), ("mixed", 3), ("2", 3)])
def test_sequential_hits_are_exactly_the_shared_prefixes(tmp_path, simworker, kvgate, http,
                                                         nworkers):
    reqs = gen_trace(seed=3, n=24, gap_ms=60)
    trace = write_trace(tmp_path / "t.jsonl", reqs)
    ws, gw = start_fleet(simworker, kvgate, nworkers)
    res = live(gw, trace, "--http", http, "--connections", 2, workers=nworkers)
    assert res.returncode == 0, res.stderr
    row, rep = live_row(res)
    assert rep["live_errors"]["first"] == ""
    assert row["requests"] == len(reqs)
    assert row["tokens"] == sum(r["input_length"] for r in reqs)
    want = expected_cached(reqs)
    assert want > 0
    assert row["hit_tokens"] == want
    assert row["hit_blocks"] == want // BLOCK
    assert sum(row["requests_per_worker"]) == len(reqs)
    assert len(row["requests_per_worker"]) <= nworkers
    # The workers agree: their own prefix-cache counters.
    hits = 0.0
    for w in ws:
        text = httpx.get(f"http://127.0.0.1:{w.port}/metrics").text
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rpartition(" ")[2])
    assert hits == want


def test_tenants_send_their_keys(tmp_path, simworker, kvgate):
    reqs = gen_trace(seed=5, n=16, gap_ms=40)
    trace = write_trace(tmp_path / "t.jsonl", reqs)
    ws, gw = start_fleet(simworker, kvgate, 2, auth="keys")
    keys = []
    for t in range(3):
        assert gw.admin.put(f"/admin/v1/tenants/t{t}", json={"sharing": "isolated"}).status_code \
            in (200, 201)
        r = gw.admin.post(f"/admin/v1/tenants/t{t}/keys")
        assert r.status_code == 201, r.text
        keys.append(r.json()["key"])
    keyfile = tmp_path / "keys"
    keyfile.write_text("\n".join(keys) + "\n")
    res = live(gw, trace, "--tenants", 3, "--api-keys", keyfile, "--http", "mixed", workers=2)
    assert res.returncode == 0, res.stderr
    row, _ = live_row(res)
    # Tenants by first block keep every shared prefix within one tenant: no hit is lost.
    assert row["hit_tokens"] == expected_cached(reqs)
    # Without a key the gateway refuses every request: counted as status errors, exit 1.
    res = live(gw, trace, "--http", "2", workers=2)
    assert res.returncode == 1
    row, rep = live_row(res)
    assert rep["live_errors"]["status"] == len(reqs)
    assert "401" in rep["live_errors"]["first"]


def test_worker_errors_are_counted_and_fail_the_run(tmp_path, simworker, kvgate):
    trace = write_trace(tmp_path / "t.jsonl", gen_trace(seed=2, n=8, gap_ms=10))
    ws, gw = start_fleet(simworker, kvgate, 1, error_rate=1)
    res = live(gw, trace, "--http", "1.1")
    assert res.returncode == 1
    _, rep = live_row(res)
    assert rep["live_errors"]["status"] == 8
    assert "HTTP 500" in rep["live_errors"]["first"]
    assert "some requests failed" in res.stderr


def test_dead_gateway_and_bad_url(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", gen_trace(n=4))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = replay("--trace", trace, "--live", f"http://127.0.0.1:{port}")
    assert res.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in res.stderr
    for url in ("ftp://127.0.0.1:1", "http://", "not a url"):
        res = replay("--trace", trace, "--live", url)
        assert res.returncode == 1
        assert "expected http://HOST[:PORT][/PATH]" in res.stderr, res.stderr
    res = replay("--trace", trace, "--live", "http://127.0.0.1:1", "--http", "3")
    assert res.returncode == 2 and "--http" in res.stderr


@pytest.mark.skipif(not CONVERSATION.exists(), reason=f"no trace at {CONVERSATION}")
def test_conversation_slice_through_four_workers(tmp_path, simworker, kvgate):
    n, scale, cap = 300, 0.02, 1500
    ws, gw = start_fleet(simworker, kvgate, 4, kv_blocks=cap, max_model_len=BLOCK * cap,
                         prefill_us_per_token=10, decode_us_per_token=10000, max_running=32,
                         time_scale=scale)
    res = replay("--trace", CONVERSATION, "--requests", n, "--workers", 4, "--capacity", cap,
                 "--policies", "cost", "--max-running", 32, "--prefill-us", 10 * scale,
                 "--decode-us", 10000 * scale, "--time-scale", scale, "--live", gw.url,
                 "--http", "mixed", "--quiet", "--format", "json", timeout=300)
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    rows = {r["name"]: r for r in rep["rows"]}
    live_r, cost = rows["live"], rows["cost"]
    assert live_r["requests"] == n and sum(live_r["requests_per_worker"]) == n
    assert live_r["hit_tokens"] <= rows["ceiling"]["hit_tokens"]
    assert abs(live_r["token_hit_rate"] - cost["token_hit_rate"]) < 0.05
