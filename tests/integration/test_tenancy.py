# SPDX-License-Identifier: Apache-2.0
"""Tenancy end to end: API keys, model permissions, rate and in-flight limits, cache isolation
(with the simulated worker as ground truth), what a worker receives as cache_salt, the state
file across restarts, admin changes under load, and the auditor's timing test."""

import base64
import hashlib
import json
import math
import random
import secrets
import threading
import time

import httpx
import pytest

from gwhelpers import (CHAT, COMPL, H2Client, RawHTTP, assert_openai_error, http, request_bytes,
                       salt_of, sim_metric, wait_for, worker_cfg)


def keys_gateway(kvgate, *workers, **kw):
    return kvgate(*workers, auth="keys", **kw)


def tenant(gw, tid, **body):
    r = gw.admin.put(f"/admin/v1/tenants/{tid}", json=body)
    assert r.status_code in (200, 201), r.text
    return r.json()


def new_key(gw, tid):
    r = gw.admin.post(f"/admin/v1/tenants/{tid}/keys")
    assert r.status_code == 201, r.text
    assert r.headers.get("cache-control") == "no-store"
    body = r.json()
    assert body["key"].startswith("kvg-") and len(body["key"]) == 47
    return body["id"], body["key"]


def call(gw, key, body, path=COMPL, stream=False):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return http.post(gw.url + path, json=body, headers=headers)


def completion(model, prompt, max_tokens=1, **extra):
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, **extra}


def cached(r):
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


# ---- keys ---------------------------------------------------------------------------------------


def test_keys_are_required_checked_and_never_logged(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = keys_gateway(kvgate, sw)
    body = completion(sw.model, "hello")
    # No tenant yet, no key, a malformed header, an unknown key: 401 in the OpenAI shape.
    r = call(gw, None, body)
    assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"
    assert_openai_error(r.content, 401, code="invalid_api_key")
    r = http.post(gw.url + COMPL, json=body, headers={"authorization": "Basic dXNlcjpwdw=="})
    assert r.status_code == 401
    tenant(gw, "acme")
    kid, key = new_key(gw, "acme")
    wrong = "kvg-" + "A" * 43
    assert call(gw, wrong, body).status_code == 401
    assert call(gw, key[:-1], body).status_code == 401
    # The right key works, with the scheme in any case and extra spaces.
    assert call(gw, key, body).status_code == 200
    r = http.post(gw.url + COMPL, json=body, headers={"authorization": f"bearer   {key}"})
    assert r.status_code == 200
    # HTTP/2 too.
    with httpx.Client(http2=True, http1=False) as c:
        r = c.post(gw.url + COMPL, json=body, headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200 and r.http_version == "HTTP/2"
    # Shown once: the admin API lists the key id, never the key.
    listed = gw.admin.get("/admin/v1/tenants/acme").json()
    assert [k["id"] for k in listed["keys"]] == [kid]
    assert key not in json.dumps(listed)
    # Rotation: a second key, then the first deleted.
    kid2, key2 = new_key(gw, "acme")
    assert gw.admin.delete(f"/admin/v1/tenants/acme/keys/{kid}").status_code == 204
    assert call(gw, key, body).status_code == 401
    assert call(gw, key2, body).status_code == 200
    # Deleting the tenant revokes its keys.
    assert gw.admin.delete("/admin/v1/tenants/acme").status_code == 204
    assert call(gw, key2, body).status_code == 401
    assert gw.metric("kvgate_auth_failures_total") >= 6
    # Keys appear nowhere: not in the logs, the access log, the metrics, the state file.
    text = gw.log() + gw.access_log.read_text() + gw.admin.get("/metrics").text
    text += (gw.state_dir / "state.json").read_text()
    for k in (key, key2):
        assert k not in text and k[4:] not in text
    assert any(e.get("tenant") == "acme" for e in gw.access_entries())


def test_models_and_limits(simworker, kvgate):
    sw = simworker(time_scale=0)
    slow = simworker(name="slow", model="slow-model", prefill_us_per_token=0,
                     decode_us_per_token=100000, time_scale=1)
    # Workers with their model lists, so that /v1/models and routing by model have something.
    gw = keys_gateway(kvgate, f"{sw.url},model={sw.model}", f"{slow.url},model=slow-model")
    tenant(gw, "narrow", models=[sw.model])
    _, narrow = new_key(gw, "narrow")
    assert call(gw, narrow, completion(sw.model, "x")).status_code == 200
    admitted_bytes = gw.metric("kvgate_tenant_prompt_bytes_total", tenant="narrow")
    assert admitted_bytes > 0
    r = call(gw, narrow, completion("slow-model", "x" * 5000))
    assert r.status_code == 403
    assert "not allowed" in assert_openai_error(r.content, 403, code="model_not_allowed")["message"]
    # Refused requests' prompts are not counted as the tenant's prompt bytes.
    assert gw.metric("kvgate_tenant_prompt_bytes_total", tenant="narrow") == admitted_bytes
    # /v1/models shows a tenant only what it may use.
    r = http.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {narrow}"})
    assert [m["id"] for m in r.json()["data"]] == [sw.model]
    assert http.get(gw.url + "/v1/models").status_code == 401
    # /v1/models/{id}: the model when a worker serves it and the tenant may use it; else 404
    # model_not_found, for a model it may not use as for one nobody serves.
    auth = {"authorization": f"Bearer {narrow}"}
    r = http.get(gw.url + f"/v1/models/{sw.model}", headers=auth)
    assert r.status_code == 200
    assert r.json() == {"id": sw.model, "object": "model", "created": 0, "owned_by": "kvgate"}
    for path in ("/v1/models/slow-model", "/v1/models/nope", "/v1/models/bad%zz", "/v1/models/a%00"):
        r = http.get(gw.url + path, headers=auth)
        assert r.status_code == 404, path
        assert_openai_error(r.content, 404, code="model_not_found")
    assert http.get(gw.url + f"/v1/models/{sw.model}").status_code == 401
    r = http.post(gw.url + f"/v1/models/{sw.model}", headers=auth, json={})
    assert r.status_code == 405
    assert_openai_error(r.content, 405, code="method_not_allowed")

    # Requests per second: a burst of 2, then 429 with Retry-After; every answer says what is
    # left, as OpenAI's x-ratelimit-*-requests headers do.
    tenant(gw, "slowpoke", rate={"rps": 0.5, "burst": 2})
    _, key = new_key(gw, "slowpoke")
    first = [call(gw, key, completion(sw.model, "x")) for _ in range(2)]
    r = call(gw, key, completion(sw.model, "x"))
    assert [a.status_code for a in first] == [200, 200] and r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    for a, left in zip(first + [r], (1, 0, 0)):
        assert a.headers["x-ratelimit-limit-requests"] == "2"
        assert a.headers["x-ratelimit-remaining-requests"] == str(left)
    # 2 tokens at 0.5/s: the bucket is full again in under 4 s, and empty now means over 2 s.
    reset = r.headers["x-ratelimit-reset-requests"]
    assert reset.endswith("s") and not reset.endswith("ms"), reset
    assert 2 < float(reset[:-1]) <= 4, reset
    # A tenant without a rate gets none of them.
    assert "x-ratelimit-limit-requests" not in call(gw, narrow, completion(sw.model, "x")).headers
    assert_openai_error(r.content, 429, code="rate_limit_exceeded")
    assert gw.metric("kvgate_tenant_rate_limited_total", tenant="slowpoke") == 1

    # In flight: one at a time; the second concurrent request gets 429 at once.
    tenant(gw, "single", max_inflight=1)
    _, key1 = new_key(gw, "single")
    first = {}
    t = threading.Thread(target=lambda: first.setdefault(
        "r", call(gw, key1, completion("slow-model", "x", max_tokens=10))))
    t.start()
    deadline = time.monotonic() + 5
    while gw.metric("kvgate_tenant_inflight", tenant="single") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = call(gw, key1, completion(sw.model, "x"))
    assert r.status_code == 429
    t.join()
    assert first["r"].status_code == 200
    assert call(gw, key1, completion(sw.model, "x")).status_code == 200  # the slot came back


# ---- isolation, with the simulated engine as ground truth ------------------------------------------


def test_isolation_groups_and_global(simworker, kvgate):
    """One worker, so that only the salt can keep tenants apart."""
    sw = simworker(time_scale=0, kv_blocks=8192)
    gw = keys_gateway(kvgate, sw)
    keys = {}
    for tid, sharing in [("a", {}), ("b", {}), ("g1", {"sharing": "group", "group": "team"}),
                         ("g2", {"sharing": "group", "group": "team"}),
                         ("p1", {"sharing": "global"}), ("p2", {"sharing": "global"})]:
        tenant(gw, tid, **sharing)
        keys[tid] = new_key(gw, tid)[1]
    prompt = "The quarterly report says revenue grew strongly in every region. " * 20
    assert cached(call(gw, keys["a"], completion(sw.model, prompt))) == 0
    assert cached(call(gw, keys["a"], completion(sw.model, prompt))) > 0  # A's own cache
    assert cached(call(gw, keys["b"], completion(sw.model, prompt))) == 0  # isolated from A
    assert cached(call(gw, keys["g1"], completion(sw.model, prompt))) == 0
    assert cached(call(gw, keys["g2"], completion(sw.model, prompt))) > 0  # same group
    assert cached(call(gw, keys["p1"], completion(sw.model, prompt))) == 0
    assert cached(call(gw, keys["p2"], completion(sw.model, prompt))) > 0  # both global
    # A client-chosen cache_salt cannot buy its way into another tenant's cache.
    for forged in [salt_of("tenant:a"), salt_of("group:team"), salt_of("global"), "", 7]:
        r = call(gw, keys["b"], completion(sw.model, prompt, cache_salt=forged))
        assert cached(r) > 0  # b's own cache from above, never a's
    other = "A completely different opening that nobody has sent before, repeated. " * 20
    r = call(gw, keys["b"], completion(sw.model, other, cache_salt=salt_of("tenant:a")))
    assert cached(r) == 0


def echo_handler(state):
    def handle(req, sock):
        state.setdefault("bodies", []).append(req["body"])
        body = b'{"id":"x","object":"text_completion","choices":[],"usage":{}}'
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        return True
    return handle


def top_level_salts(raw):
    """Every top-level cache_salt member of a JSON object, duplicates included."""
    found = []
    json.loads(raw, object_pairs_hook=lambda pairs: found.append(pairs) or dict(pairs))
    top = found[-1]  # the outermost object is built last
    return [v for k, v in top if k == "cache_salt"]


@pytest.mark.parametrize("variant", [
    b'{"model":"m","prompt":"x","cache_salt":"mine"}',
    b'{"cache_salt":"one","model":"m","prompt":"x","cache_salt":"two"}',
    b'{"model":"m","\\u0063ache_salt":"escaped","prompt":"x"}',
    b'{"model":"m","cache\\u005fsalt":"escaped too","prompt":"x"}',
    b'{"model":"m","prompt":"x","cache_salt":{"nested":"object"}}',
    b'{"model":"m","prompt":"x","cache_salt":12345}',
    b'{"model":"m","prompt":"x","cache_salt":null}',
    b'{"model":"m","prompt":"x","extra":{"cache_salt":"nested inside"}}',
    b'{"model":"m","prompt":"x"}',
])
def test_client_cache_salt_never_reaches_the_worker(kvgate, fake_upstream, variant):
    state = {}
    up = fake_upstream(echo_handler(state))
    gw = keys_gateway(kvgate, up)
    tenant(gw, "t1")
    _, key = new_key(gw, "t1")
    r = http.post(gw.url + COMPL, content=variant,
                  headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    assert r.status_code == 200, r.text
    sent = state["bodies"][-1]
    assert top_level_salts(sent) == [salt_of("tenant:t1")]
    # Everything else arrives as the client wrote it.
    original = json.loads(variant)
    original.pop("cache_salt", None)
    received = json.loads(sent)
    received.pop("cache_salt")
    assert received == original
    if b"nested inside" in variant:
        assert received["extra"] == {"cache_salt": "nested inside"}


# A key holding a control character: Python engines read "cache_salt\u0000x" as a key of its
# own, but C or C++ code that ends keys at the NUL reads cache_salt, and if it keeps the first
# duplicate the client chooses the salt. kvgate refuses such keys at every level (raw bytes of
# the body: the escapes are the client's spelling, not Python's).
CONTROL_KEY_BODIES = [
    (COMPL, b'{"model":"%s","cache_salt\\u0000x":"attacker","prompt":"x","max_tokens":1}',
     'body: key "cache_salt\\u0000x" holds a control character'),
    (CHAT, b'{"model":"%s","messages":[{"role":"user","content":"x","cache_salt\\u0000x":"a"}],'
     b'"max_tokens":1}', 'messages[0]: key "cache_salt\\u0000x" holds a control character'),
    (COMPL, b'{"model":"%s","prompt":"x","cache_salt\xc2\x85":"raw C1","max_tokens":1}',
     'body: key "cache_salt\\u0085" holds a control character'),
    ("/v1/embeddings", b'{"model":"%s","input":"x","cache_salt\\u0000x":"attacker"}',
     'body: key "cache_salt\\u0000x" holds a control character'),
]


@pytest.mark.parametrize("salt_switch", [True, False], ids=["cache_salt-on", "cache_salt-off"])
def test_control_character_keys_never_reach_the_worker(simworker, kvgate, salt_switch):
    sw = simworker(time_scale=0)
    gw = kvgate(config={"workers": [worker_cfg(sw, cache_salt=salt_switch)]})
    for path, body, message in CONTROL_KEY_BODIES:
        body = body.replace(b"%s", sw.model.encode())
        c = RawHTTP(gw.port)
        try:
            c.send(request_bytes("POST", path, body))
            status, _, payload = c.response()
            assert status == 400, payload
            assert assert_openai_error(payload, 400, "invalid_request_error")["message"] == message
            # The connection stays usable after the refusal.
            c.send(request_bytes("GET", "/v1/models"))
            assert c.response()[0] == 200
        finally:
            c.close()
        h = H2Client(gw.port)
        try:
            st = h.request("POST", path, body)
            h.wait([st])
            assert st.status == 400, bytes(st.data)
            err = assert_openai_error(bytes(st.data), 400, "invalid_request_error")
            assert err["message"] == message
        finally:
            h.close()
    # Nothing reached the worker: the one valid request after them is its first.
    assert sim_metric(sw, "vllm:request_success_total") == 0
    r = http.post(gw.url + COMPL, json=completion(sw.model, "x"))
    assert r.status_code == 200, r.text
    assert wait_for(lambda: sim_metric(sw, "vllm:request_success_total") == 1)


def test_worker_without_cache_salt_gets_none(kvgate, fake_upstream):
    state = {}
    up = fake_upstream(echo_handler(state))
    gw = keys_gateway(kvgate, config={"workers": [
        {"name": "old", "url": up.url, "cache_salt": False}]})
    tenant(gw, "t1")
    _, key = new_key(gw, "t1")
    r = http.post(gw.url + COMPL, content=b'{"model":"m","prompt":"x","cache_salt":"mine"}',
                  headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200
    assert top_level_salts(state["bodies"][-1]) == []
    assert gw.admin.get("/admin/v1/workers/old").json()["cache_salt"] is False


def test_open_mode(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, auth="open")
    assert http.post(gw.url + COMPL, json=completion(sw.model, "x")).status_code == 200
    assert http.get(gw.url + "/v1/models").status_code == 200


# ---- the auditor's test ----------------------------------------------------------------------------


def ks_2samp(a, b):
    """Two-sample Kolmogorov-Smirnov: (D, asymptotic p-value), as scipy computes for large
    samples (Kolmogorov distribution with Stephens' correction)."""
    a, b = sorted(a), sorted(b)
    n, m = len(a), len(b)
    i = j = 0
    d = 0.0
    while i < n and j < m:
        x = min(a[i], b[j])
        while i < n and a[i] <= x:
            i += 1
        while j < m and b[j] <= x:
            j += 1
        d = max(d, abs(i / n - j / m))
    en = math.sqrt(n * m / (n + m))
    lam = (en + 0.12 + 0.11 / en) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def ttft(gw, key, model, prompt):
    """Seconds from sending the request to the first streamed event, on a raw socket (one
    write for the whole request: no client-side delays mixed into the figure)."""
    body = completion(model, prompt, max_tokens=1, stream=True)
    c = RawHTTP(gw.port)
    try:
        data = request_bytes("POST", COMPL, body, headers={"Authorization": f"Bearer {key}"})
        t0 = time.monotonic()
        c.send(data)
        assert c.read_head() == 200
        for when, piece in c.chunks():
            if b"data:" in piece:
                return when - t0
    finally:
        c.close()
    raise AssertionError("no event")


@pytest.mark.parametrize("sharing,expect_leak", [("isolated", False), ("global", True)])
def test_auditor_timing_attack(simworker, kvgate, sharing, expect_leak):
    """As published audits of prompt caching ran it: for each trial the victim sends a fresh
    long prompt once; the attacker then times a probe that repeats the victim's opening and a
    fresh prompt of the same length. A two-sample KS test on the time to first token finds no
    difference across isolated tenants and a clear one across global tenants."""
    sw = simworker(time_scale=1, prefill_us_per_token=40, decode_us_per_token=0,
                   kv_blocks=65536)
    gw = keys_gateway(kvgate, sw)
    tenant(gw, "victim", sharing=sharing)
    tenant(gw, "attacker", sharing=sharing)
    victim = new_key(gw, "victim")[1]
    attacker = new_key(gw, "attacker")[1]
    rng = random.Random(1234)
    words = [secrets.token_hex(3) for _ in range(4096)]

    def fresh():  # ~1200 tokens of text nobody sent before
        return " ".join(rng.choice(words) for _ in range(600))

    probes, controls = [], []
    for _ in range(110):
        secret_prompt = fresh()
        assert call(gw, victim, completion(sw.model, secret_prompt)).status_code == 200
        probes.append(ttft(gw, attacker, sw.model, secret_prompt))
        controls.append(ttft(gw, attacker, sw.model, fresh()))
    d, p = ks_2samp(probes, controls)
    print(f"auditor {sharing}: D={d:.3f} p={p:.3g} probe median "
          f"{sorted(probes)[55] * 1e3:.1f} ms, control median {sorted(controls)[55] * 1e3:.1f} ms")
    if expect_leak:
        assert p < 1e-6, (d, p)
    else:
        assert p > 0.01, (d, p)


# ---- the state file -------------------------------------------------------------------------------


def test_state_survives_restart(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = keys_gateway(kvgate, name="persist")
    tenant(gw, "acme", sharing="group", group="blue", models=[sw.model],
           rate={"rps": 100, "burst": 200}, max_inflight=8)
    kid, key = new_key(gw, "acme")
    r = gw.admin.put(f"/admin/v1/workers/{sw.name}", json={"url": sw.url, "models": [sw.model]})
    assert r.status_code == 201, r.text
    r = gw.admin.put("/admin/v1/policy", json={"policy": "round_robin"})
    assert r.status_code == 200, r.text
    assert call(gw, key, completion(sw.model, "x")).status_code == 200
    assert gw.stop() == 0
    again = keys_gateway(kvgate, name="persist")  # same state directory
    assert call(again, key, completion(sw.model, "x")).status_code == 200
    t = again.admin.get("/admin/v1/tenants/acme").json()
    assert t["sharing"] == "group" and t["group"] == "blue" and t["max_inflight"] == 8
    assert [k["id"] for k in t["keys"]] == [kid]
    assert again.admin.get("/admin/v1/policy").json()["policy"] == "round_robin"
    assert again.admin.get(f"/admin/v1/workers/{sw.name}").json()["source"] == "admin"
    mode = (again.state_dir / "state.json").stat().st_mode & 0o777
    assert mode == 0o600
    audit = (again.state_dir / "audit.log").read_text().splitlines()
    actions = [json.loads(line)["action"] for line in audit]
    assert {"tenant.put", "key.create", "worker.put", "policy.put"} <= set(actions)
    assert key not in "\n".join(audit)


def test_ten_thousand_tenants_load(simworker, kvgate, tmp_path):
    sw = simworker(time_scale=0)
    state_dir = tmp_path / "big-state"
    state_dir.mkdir()
    tenants, probe_key = [], None
    for i in range(10000):
        key = "kvg-" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        if i == 7777:
            probe_key = key
        tenants.append({"id": f"t{i:05d}", "sharing": "isolated", "models": [],
                        "rate": {"rps": 0, "burst": 0, "prompt_bytes_per_s": 0,
                                 "prompt_bytes_burst": 0},
                        "max_inflight": 0,
                        "keys": [{"id": f"k{i:015d}"[:16],
                                  "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                  "created": "2026-11-30T00:00:00.000Z"}]})
    doc = {"version": 1, "tenants": tenants, "workers": [], "policy": {"policy": "least_loaded"}}
    (state_dir / "state.json").write_text(json.dumps(doc))
    t0 = time.monotonic()
    gw = keys_gateway(kvgate, sw, args=["--state", str(state_dir)], timeout=60)
    took = time.monotonic() - t0
    print(f"10k tenants: listening {took * 1e3:.0f} ms after start")
    assert len(gw.admin.get("/admin/v1/tenants").json()["tenants"]) == 10000
    assert call(gw, probe_key, completion(sw.model, "x")).status_code == 200
    assert gw.metric("kvgate_tenants") == 10000


def test_admin_changes_under_load(simworker, kvgate):
    """No request fails while tenants, keys and workers are being edited."""
    sw = simworker(time_scale=0)
    sw2 = simworker(name="w2", time_scale=0)
    gw = keys_gateway(kvgate, sw)
    tenant(gw, "steady")
    _, key = new_key(gw, "steady")
    stop = threading.Event()
    results = []

    def traffic():
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                r = c.post(gw.url + COMPL, json=completion(sw.model, "steady"),
                           headers={"authorization": f"Bearer {key}"})
                results.append(r.status_code)

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(60):
            tenant(gw, f"churn{i}", sharing="global")
            kid, _ = new_key(gw, f"churn{i}")
            tenant(gw, "steady", max_inflight=1000 + i)  # redefine the busy tenant itself
            if i % 2:
                gw.admin.delete(f"/admin/v1/tenants/churn{i}/keys/{kid}")
                gw.admin.delete(f"/admin/v1/tenants/churn{i - 1}")
            if i % 10 == 0:
                gw.admin.put("/admin/v1/workers/w2", json={"url": sw2.url})
                gw.admin.delete("/admin/v1/workers/w2")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(results) > 50
    assert set(results) == {200}, {c: results.count(c) for c in set(results)}
