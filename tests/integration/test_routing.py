# SPDX-License-Identifier: Apache-2.0
"""Prefix-aware routing end to end, with kvgate-simworker as the ground truth: requests that
share an opening go to the worker that holds it and the worker reports the hit; cold prefixes
are placed by rendezvous (two gateways agree without talking); equivalent bodies route alike;
tenants' predictions stay apart; the load bound spreads a hot prefix; the index forgets what a
worker's capacity evicted and what a removed worker held; route/explain shows every term;
predictions are compared with the engines' reports in /metrics."""

import json
import random
import threading
from collections import Counter

import httpx
import pytest

from gwhelpers import CHAT, COMPL, assert_openai_error, http, wait_for

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def text(seed, nbytes):
    rng = random.Random(seed)
    out = [f"Document {seed}."]
    size = len(out[0])
    while size < nbytes:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def chat(model, system, user, **extra):
    return {"model": model, "max_tokens": 1,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}], **extra}


def send(gw, body, path=CHAT, key=None):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = http.post(gw.url + path, json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-kvgate-worker"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def explain(gw, request, tenant=None, path=None):
    body = {"request": request}
    if tenant is not None:
        body["tenant"] = tenant
    if path is not None:
        body["path"] = path
    r = gw.admin.post("/admin/v1/route/explain", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def matched_by_worker(ex):
    return {c["worker"]: c["matched_blocks"] for c in ex["candidates"]}


def workers(simworker, n, **flags):
    flags.setdefault("time_scale", 0)
    return [simworker(**flags) for _ in range(n)]


def test_follow_ups_go_to_the_worker_that_holds_the_prefix(simworker, kvgate):
    ws = workers(simworker, 4, kv_blocks=4096)
    gw = kvgate(*ws)
    model = ws[0].model
    homes = {}
    for doc in range(6):
        system = text(doc, 2000)
        first, cached = send(gw, chat(model, system, "first question"))
        assert cached == 0
        homes[doc] = first
        for q in range(3):
            w, cached = send(gw, chat(model, system, f"follow-up {q}"))
            assert w == first, f"document {doc}: follow-up went to {w}, prefix is on {first}"
            assert cached > 0
    # Cold prefixes are spread by rendezvous, not piled on one worker.
    assert len(set(homes.values())) >= 2, homes
    m = gw.scrape()
    assert gw.metric("kvgate_route_decisions_total", m, policy="cost", reason="hit") >= 18
    assert gw.metric("kvgate_route_decisions_total", m, policy="cost", reason="cold") >= 6
    assert gw.metric("kvgate_prefix_predictions_total", m, outcome="hit_predicted") >= 18
    assert gw.metric("kvgate_prefix_cached_tokens_total", m) > 0
    assert gw.metric("kvgate_prefix_predicted_tokens_total", m) > 0
    assert gw.metric("kvgate_prefix_prompt_tokens_total", m) >= gw.metric(
        "kvgate_prefix_cached_tokens_total", m)
    assert gw.metric("kvgate_index_entries", m) > 0
    assert gw.metric("kvgate_route_decision_seconds_count", m, stage="total") >= 24
    assert gw.metric("kvgate_policy_info", m, policy="cost") == 1


def test_streaming_usage_is_read_from_the_final_chunk(simworker, kvgate):
    ws = workers(simworker, 2, kv_blocks=4096)
    gw = kvgate(*ws)
    system = text(50, 1500)
    send(gw, chat(ws[0].model, system, "q0"))
    body = chat(ws[0].model, system, "q1", stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", gw.url + CHAT, json=body, timeout=10) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: {")]
    usage = json.loads(events[-1][6:])["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    m = gw.scrape()
    # Both requests reported; the streamed one's cached tokens are in the total.
    assert gw.metric("kvgate_prefix_cached_tokens_total", m) == cached
    assert gw.metric("kvgate_prefix_unreported_total", m) == 0


def test_two_gateways_place_cold_prefixes_alike(simworker, kvgate):
    ws = workers(simworker, 4, kv_blocks=4096)
    a, b = kvgate(*ws), kvgate(*ws)
    agree = 0
    for doc in range(100, 112):
        body = chat(ws[0].model, text(doc, 1200), "q")
        ea, eb = explain(a, body), explain(b, body)
        assert ea["reason"] == eb["reason"] == "cold"
        agree += ea["chosen"] == eb["chosen"]
    assert agree == 12


def test_equivalent_bodies_route_alike(simworker, kvgate):
    ws = workers(simworker, 3, kv_blocks=4096)
    gw = kvgate(*ws)
    system = text(7, 1500) + " naïve café \u2603 \"quoted\"\n\ttab"
    body = chat(ws[0].model, system, "q")
    home, _ = send(gw, body)
    # The same request spelled with escapes everywhere, indented, keys reordered.
    variant = json.dumps({"max_tokens": 1, "messages": body["messages"], "model": body["model"]},
                         ensure_ascii=True, indent=3)
    r = http.post(gw.url + CHAT, content=variant, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.headers["x-kvgate-worker"] == home
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    e1 = explain(gw, body)
    e2 = explain(gw, json.loads(variant))
    assert e1["prefix"] == e2["prefix"] and matched_by_worker(e1) == matched_by_worker(e2)
    assert matched_by_worker(e1)[home] == e1["prefix"]["blocks"] > 0


def test_completions_prompts_route_by_prefix(simworker, kvgate):
    ws = workers(simworker, 3, kv_blocks=4096)
    gw = kvgate(*ws)
    model = ws[0].model
    prompt = text(9, 2000)
    home, _ = send(gw, {"model": model, "prompt": prompt + " one", "max_tokens": 1}, COMPL)
    w, cached = send(gw, {"model": model, "prompt": prompt + " two", "max_tokens": 1}, COMPL)
    assert w == home and cached > 0
    # Token ids: their own unit, blocks of block_tokens.
    ids = list(range(1000, 1100))
    home, _ = send(gw, {"model": model, "prompt": ids, "max_tokens": 1}, COMPL)
    w, cached = send(gw, {"model": model, "prompt": ids + [5, 6], "max_tokens": 1}, COMPL)
    assert w == home and cached > 0
    ex = explain(gw, {"model": model, "prompt": ids}, path=COMPL)
    assert ex["prefix"]["unit"] == "tokens" and ex["prefix"]["blocks"] == 100 // 16


def test_isolated_tenants_predict_nothing_from_each_other(simworker, kvgate):
    ws = workers(simworker, 3, kv_blocks=4096)
    gw = kvgate(*ws, auth="keys")
    for tid, body in (("a", {"sharing": "isolated"}), ("b", {"sharing": "isolated"}),
                      ("g1", {"sharing": "global"}), ("g2", {"sharing": "global"})):
        assert gw.admin.put(f"/admin/v1/tenants/{tid}", json=body).status_code in (200, 201)
    keys = {t: gw.admin.post(f"/admin/v1/tenants/{t}/keys").json()["key"]
            for t in ("a", "b", "g1", "g2")}
    body = chat(ws[0].model, text(11, 2000), "q")
    home_a, _ = send(gw, body, key=keys["a"])
    ea, eb = explain(gw, body, tenant="a"), explain(gw, body, tenant="b")
    assert matched_by_worker(ea)[home_a] > 0
    assert set(matched_by_worker(eb).values()) == {0}
    assert ea["scope"] != eb["scope"]
    home_g, _ = send(gw, body, key=keys["g1"])
    eg = explain(gw, body, tenant="g2")
    assert matched_by_worker(eg)[home_g] > 0 and eg["reason"] == "hit"
    # The tenant's own series.
    m = gw.scrape()
    assert gw.metric("kvgate_tenant_prompt_tokens_total", m, tenant="a") > 0
    assert gw.metric("kvgate_tenant_predicted_tokens_total", m, tenant="a") == 0


def test_load_bound_spreads_a_hot_prefix(simworker, kvgate):
    ws = workers(simworker, 4, kv_blocks=8192, time_scale=1, decode_us_per_token=20000)
    gw = kvgate(*ws)
    # The bound under test, whatever the defaults: B = ceil((1 + 1) x 17 / 4) = 9, the relative
    # bound alone (the slack, tests/unit/policy test_cost_slack, would let a holder run 4 above
    # the least loaded).
    assert gw.admin.put("/admin/v1/policy",
                        json={"load_factor": 1, "load_slack": 0}).status_code == 200
    system = text(21, 2000)
    send(gw, chat(ws[0].model, system, "warm"))
    got = Counter()
    lock = threading.Lock()
    start = threading.Barrier(16)

    # The bound is on requests in flight, so all 16 must overlap: each decodes 100 tokens at
    # 20 ms (2 s), far longer than starting 16 threads takes on a slow, shared CI machine (with
    # 8 tokens, 160 ms, a CI run once saw early answers finish first and free room: 9 on one).
    def one(i):
        start.wait()
        w, _ = send(gw, chat(ws[0].model, system, f"q{i}", max_tokens=100))
        with lock:
            got[w] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(got.values()) == 16
    # All 16 at once: none may take more than the bound allows (9, one of them the warm-up's
    # holder's own), so the hot prefix spreads.
    assert len(got) >= 3 and max(got.values()) <= 8, got


def test_index_forgets_evicted_and_removed_workers(simworker, kvgate):
    w1, w2 = workers(simworker, 2, kv_blocks=64)
    gw = kvgate()
    for w in (w1, w2):
        r = gw.admin.put(f"/admin/v1/workers/{w.name}",
                         json={"url": f"http://127.0.0.1:{w.port}", "kv_blocks": 64})
        assert r.status_code in (200, 201), r.text
    # Only w1 takes traffic for now.
    assert gw.admin.post(f"/admin/v1/workers/{w2.name}/drain").status_code == 200
    first = chat(w1.model, text(31, 1800), "q")
    send(gw, first)
    blocks = explain(gw, first)["prefix"]["blocks"]
    assert matched_by_worker(explain(gw, first))[w1.name] == blocks
    for doc in range(32, 36):  # 4 x ~28 blocks through a 64-block capacity
        send(gw, chat(w1.model, text(doc, 1800), "q"))
    assert matched_by_worker(explain(gw, first))[w1.name] < blocks
    m = gw.scrape()
    assert gw.metric("kvgate_index_evictions_total", m) > 0
    assert gw.metric("kvgate_index_worker_entries", m, worker=w1.name) <= 64
    # Removing the worker drops what it held (the next decision syncs the index).
    assert gw.admin.delete(f"/admin/v1/workers/{w1.name}").status_code in (200, 204)
    assert gw.admin.put(f"/admin/v1/workers/{w2.name}",
                        json={"url": f"http://127.0.0.1:{w2.port}", "kv_blocks": 64}).status_code in (200, 201)
    send(gw, chat(w1.model, "short", "q"))
    m = gw.scrape()
    assert gw.metric("kvgate_index_worker_entries", m, worker=w1.name) == 0
    assert gw.metric("kvgate_index_entries", m) == gw.metric("kvgate_index_worker_entries", m)


def test_explain_contract(simworker, kvgate):
    ws = workers(simworker, 2, kv_blocks=4096)
    gw = kvgate(*ws)
    body = chat(ws[0].model, text(41, 1000), "q")
    ex = explain(gw, body)
    assert ex["policy"] == "cost" and ex["api"] == "chat" and ex["tenant"] is None
    assert ex["scope"] == "global" and ex["model"] == ws[0].model
    assert ex["prefix"]["unit"] == "bytes" and ex["prefix"]["block_size"] == 64
    assert ex["prefix"]["blocks"] == ex["prefix"]["length"] // 64
    assert ex["hash_backend"] == "cpu" and ex["serving"] == 2 and ex["ejected"] == 0
    assert ex["chosen"] == ex["candidates"][0]["worker"]
    for c in ex["candidates"]:
        assert set(c) == {"worker", "matched_blocks", "inflight", "pending_blocks", "waiting",
                          "kv_usage", "prefill_cost", "queue_cost", "pending_cost", "total_cost",
                          "over_bound", "rendezvous"}
        assert c["waiting"] == 0 and c["kv_usage"] == 0  # scraping is off by default
        assert c["pending_blocks"] == 0 and c["pending_cost"] == 0  # nothing in flight
        assert c["total_cost"] == pytest.approx(c["prefill_cost"] + c["queue_cost"], abs=1e-3)
    assert set(ex["timing_us"]) == {"parse", "hash", "lookup", "choose", "total"}
    # A /v1/responses body (guessed from "input", or named) explains as the chat body it is
    # equivalent to: the same prefix stream, so the same blocks.
    resp = {"model": ws[0].model, "instructions": text(41, 1000), "input": "q"}
    for er in (explain(gw, resp), explain(gw, resp, path="/v1/responses")):
        assert er["api"] == "responses" and er["prefix"] == ex["prefix"], er
    # Explaining is not routing: nothing was counted or recorded.
    m = gw.scrape()
    assert gw.metric("kvgate_route_decision_seconds_count", m, stage="total") == 0
    assert gw.metric("kvgate_index_entries", m) == 0
    # Bad input: 400 naming the field; unknown tenant 404; no token 401; GET 405.
    for bad, field in (({}, "request"), ({"request": body, "x": 1}, "x"),
                       ({"request": {"model": "m", "messages": "hi"}}, "request.messages"),
                       ({"request": body, "path": "/v1/embeddings"}, "path"),
                       ({"request": body, "tenant": 5}, "tenant")):
        r = gw.admin.post("/admin/v1/route/explain", json=bad)
        assert r.status_code == 400, r.text
        assert field in r.json()["error"]["message"]
    r = gw.admin.post("/admin/v1/route/explain", json={"request": body, "tenant": "nobody"})
    assert r.status_code == 404
    r = http.post(gw.admin_url + "/admin/v1/route/explain", json={"request": body})
    assert r.status_code == 401
    assert gw.admin.get("/admin/v1/route/explain").status_code == 405


def test_bad_prompt_shapes_are_400_naming_the_field(simworker, kvgate):
    ws = workers(simworker, 1)
    gw = kvgate(*ws)
    model = ws[0].model
    cases = [
        (CHAT, {"model": model, "messages": "hello"}, "messages"),
        (CHAT, {"model": model, "messages": []}, "messages"),
        (CHAT, {"model": model, "messages": [{"role": 1, "content": "x"}]}, "messages[0].role"),
        (CHAT, {"model": model, "messages": [{"role": "user", "content": 5}]},
         "messages[0].content"),
        (CHAT, {"model": model, "messages": [{"role": "user", "content": "x"}], "tools": {}},
         "tools"),
        (COMPL, {"model": model, "prompt": {"text": "x"}}, "prompt"),
        (COMPL, {"model": model, "prompt": [1, "a"]}, "prompt"),
        (COMPL, {"model": model, "prompt": [-1]}, "prompt"),
    ]
    for path, body, field in cases:
        r = http.post(gw.url + path, json=body)
        assert r.status_code == 400, (body, r.text)
        assert_openai_error(r.content, 400)
        assert r.json()["error"]["message"].startswith(field), (field, r.text)
    # None of them reached the worker.
    assert gw.metric("kvgate_worker_requests_total") == 0


def test_policy_can_be_switched_at_run_time(simworker, kvgate):
    ws = workers(simworker, 3, kv_blocks=4096)
    gw = kvgate(*ws)
    pol = gw.admin.get("/admin/v1/policy").json()
    assert pol["policy"] == "cost" and pol["block_bytes"] == 64
    r = gw.admin.put("/admin/v1/policy", json={"policy": "round_robin"})
    assert r.status_code == 200 and r.json()["block_bytes"] == 64
    system = text(61, 1500)
    seen = [send(gw, chat(ws[0].model, system, f"q{i}"))[0] for i in range(6)]
    assert len(set(seen)) == 3  # round robin ignores the prefix
    m = gw.scrape()
    assert gw.metric("kvgate_route_decisions_total", m, policy="round_robin") == 6
    assert gw.metric("kvgate_policy_info", m, policy="round_robin") == 1
    assert gw.admin.put("/admin/v1/policy", json={"policy": "prefix_only"}).status_code == 200
    a = send(gw, chat(ws[0].model, system, "x"))[0]
    b = send(gw, chat(ws[0].model, system, "y"))[0]
    assert a == b


def test_matched_blocks_count_the_worker_that_answered(simworker, kvgate):
    """kvgate_route_blocks_total{kind="matched"} adds, per answered request, the blocks the
    answering worker was predicted to hold: what route/explain showed for it just before."""
    ws = workers(simworker, 2, kv_blocks=4096)
    gw = kvgate(*ws)
    model = ws[0].model
    system = text(7, 3000)
    send(gw, chat(model, system, "first"))
    m0 = gw.scrape()
    assert gw.metric("kvgate_route_blocks_total", m0, kind="matched") == 0
    want = 0
    for q in range(3):
        body = chat(model, system, f"follow-up {q}")
        ex = explain(gw, body)
        top = ex["candidates"][0]
        assert top["matched_blocks"] > 0
        w, _ = send(gw, body)
        assert w == top["worker"]
        want += top["matched_blocks"]
    # The engine refuses this one (vLLM: max_tokens must be at least 1): predicted, not counted.
    bad = chat(model, system, "follow-up 0", max_tokens=-5)
    assert explain(gw, bad)["candidates"][0]["matched_blocks"] > 0
    r = http.post(gw.url + CHAT, json=bad)
    assert r.status_code == 400, r.text
    m = gw.scrape()
    assert gw.metric("kvgate_route_blocks_total", m, kind="matched") == want
    assert gw.metric("kvgate_route_blocks_total", m, kind="hashed") > want


def test_pending_prefill_steers_cold_requests_and_clears_at_the_first_token(simworker, kvgate):
    """A streamed request's missing blocks count as the worker's pending prefill from the moment
    it is sent until its first token (the simworker, like vLLM, sends the head first); a cold
    request meanwhile goes to the other worker whatever the rendezvous says; an error answer
    and a finished request leave nothing pending."""
    ws = workers(simworker, 2, kv_blocks=4096, time_scale=1, prefill_us_per_token=2000)
    gw = kvgate(*ws)
    # Turnover off: without the pending term a cold request would go by rendezvous alone.
    assert gw.admin.put("/admin/v1/policy", json={"turnover_cost_per_block": 0}).status_code == 200
    model = ws[0].model
    long_body = chat(model, text(900, 8000), "go", stream=True)
    blocks = explain(gw, long_body)["prefix"]["blocks"]
    seen = {}

    def stream():
        with httpx.Client(timeout=30) as c, c.stream("POST", gw.url + CHAT, json=long_body) as r:
            assert r.status_code == 200
            seen["worker"] = r.headers["x-kvgate-worker"]
            seen["head"] = True
            for _ in r.iter_raw():
                pass

    t = threading.Thread(target=stream)
    t.start()
    assert wait_for(lambda: seen.get("head"), 10)
    busy = seen["worker"]
    idle = next(w.name for w in ws if w.name != busy)
    # The head is out, the first token is not (about 2000 tokens x 2 ms of prefill).
    assert gw.metric("kvgate_worker_pending_blocks", worker=busy) == blocks
    assert gw.metric("kvgate_worker_pending_blocks", worker=idle) == 0
    # Cold requests whose rendezvous owner is the busy worker go to the idle one, and explain
    # shows why.
    moved = 0
    for seed in range(40):
        cold = chat(model, text(1000 + seed, 600), "q")
        ex = explain(gw, cold)
        by = {c["worker"]: c for c in ex["candidates"]}
        assert by[busy]["pending_blocks"] == blocks
        assert by[busy]["pending_cost"] == pytest.approx(200 * blocks)
        assert by[idle]["pending_cost"] == 0
        assert ex["chosen"] == idle and ex["reason"] == "cold"
        owner = max(ex["candidates"], key=lambda c: c["rendezvous"])["worker"]
        moved += owner == busy
    assert moved > 0  # some of them would have gone to the busy worker by rendezvous
    t.join(30)
    assert not t.is_alive() and seen["worker"] == busy
    assert wait_for(lambda: gw.metric("kvgate_worker_pending_blocks", worker=busy) == 0, 5)


def test_pending_prefill_is_released_by_error_answers(simworker, kvgate):
    bad = simworker(time_scale=0, error_rate=1.0)
    gw = kvgate(bad)
    body = chat(bad.model, text(901, 3000), "q")
    for _ in range(3):
        r = http.post(gw.url + CHAT, json=body)
        assert r.status_code == 500
    assert gw.metric("kvgate_worker_pending_blocks", worker=bad.name) == 0
    assert gw.metric("kvgate_worker_inflight", worker=bad.name) == 0
