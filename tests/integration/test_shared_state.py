# SPDX-License-Identifier: Apache-2.0
"""The state shared by gateway replicas through Redis (docs/redis.md#shared-state): tenants,
key digests, admin workers and the policy changed on one gateway are in force on the others
within a second; a new replica starts from Redis; concurrent edits from two replicas all
survive; a lost pub/sub message heals by the periodic check; a Redis restarted empty is seeded
again from the replicas' state; a replica with another server secret, or without a reachable
Redis, refuses to start.

Each test starts its own redis-server (no persistence) on a free loopback port."""
import hashlib
import hmac
import json
import os
import pathlib
import subprocess
import threading
import time

import pytest

from conftest import ADMIN_TOKEN, TEST_SECRET, binary, child_env
from gwhelpers import COMPL, http
from redisprocs import free_port

redis = pytest.importorskip("redis")

PROPAGATION_S = 1.0  # the bound: a change is in force on every replica within this
SYNC_INTERVAL_MS = 300
VERIFIER_LABEL = b"kvgate server secret verifier v1"
STATE_KEY = "kvg:{state}"


def gateway(kvgate, rs, *workers, sync_interval_ms=SYNC_INTERVAL_MS, **kw):
    """A gateway with API keys sharing its state through rs."""
    config = {"redis": {"url": rs.url, "sync_interval_ms": sync_interval_ms}}
    return kvgate(*workers, auth="keys", config=config, **kw)


def within(cond, bound=PROPAGATION_S, limit=10.0):
    """Poll cond until true (at most limit seconds) and return the time it took; the caller
    asserts it against the bound, so that a slow propagation shows its figure."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > limit:
            raise AssertionError(f"not in force after {limit}s")
        time.sleep(0.005)
    return time.monotonic() - start


def status(gw, method, path, **kw):
    return gw.admin.request(method, path, **kw).status_code


def completion(model):
    return {"model": model, "prompt": "hello", "max_tokens": 1}


def call(gw, key, model):
    return http.post(gw.url + COMPL, json=completion(model),
                     headers={"authorization": f"Bearer {key}"}).status_code


def verifier(secret: str) -> str:
    return hmac.new(secret.encode(), VERIFIER_LABEL, hashlib.sha256).hexdigest()


def test_each_change_is_in_force_on_the_other_replica_within_a_second(simworker, kvgate,
                                                                      redis_server):
    sw = simworker(time_scale=0)
    g1 = gateway(kvgate, redis_server, sw, name="g1")
    g2 = gateway(kvgate, redis_server, sw, name="g2")
    delays = {}

    r = g1.admin.put("/admin/v1/tenants/acme", json={"models": [sw.model], "max_inflight": 7})
    assert r.status_code == 201, r.text
    delays["tenant put"] = within(
        lambda: g2.admin.get("/admin/v1/tenants/acme").status_code == 200)
    assert g2.admin.get("/admin/v1/tenants/acme").json()["max_inflight"] == 7

    r = g1.admin.post("/admin/v1/tenants/acme/keys")
    assert r.status_code == 201, r.text
    kid, key = r.json()["id"], r.json()["key"]
    delays["key create"] = within(lambda: call(g2, key, sw.model) == 200)

    # the other way round: a change on g2 reaches g1
    r = g2.admin.put("/admin/v1/tenants/acme", json={"models": [sw.model], "max_inflight": 9})
    assert r.status_code == 200, r.text
    delays["tenant replace"] = within(
        lambda: g1.admin.get("/admin/v1/tenants/acme").json()["max_inflight"] == 9)
    assert call(g1, key, sw.model) == 200, "replacing a tenant keeps its keys on every replica"

    assert status(g2, "DELETE", f"/admin/v1/tenants/acme/keys/{kid}") == 204
    delays["key revoke"] = within(lambda: call(g1, key, sw.model) == 401)

    r = g1.admin.put("/admin/v1/workers/extra", json={"url": sw.url, "models": ["other-model"]})
    assert r.status_code == 201, r.text
    delays["worker put"] = within(lambda: status(g2, "GET", "/admin/v1/workers/extra") == 200)
    assert g2.admin.get("/admin/v1/workers/extra").json()["source"] == "admin"
    assert status(g2, "DELETE", "/admin/v1/workers/extra") == 204
    delays["worker delete"] = within(lambda: status(g1, "GET", "/admin/v1/workers/extra") == 404)

    r = g1.admin.put("/admin/v1/policy", json={"policy": "least_loaded", "load_factor": 0.75})
    assert r.status_code == 200, r.text
    delays["policy put"] = within(
        lambda: g2.admin.get("/admin/v1/policy").json()["policy"] == "least_loaded")
    assert g2.admin.get("/admin/v1/policy").json()["load_factor"] == 0.75

    assert status(g1, "DELETE", "/admin/v1/tenants/acme") == 204
    delays["tenant delete"] = within(lambda: status(g2, "GET", "/admin/v1/tenants/acme") == 404)

    print("propagation delays (s):", {k: round(v, 4) for k, v in delays.items()})
    slow = {k: v for k, v in delays.items() if v >= PROPAGATION_S}
    assert not slow, f"changes not in force within {PROPAGATION_S}s: {slow}"

    # both hold the same version, Redis holds it, and each has a local copy of the state
    v1, v2 = g1.metric("kvgate_state_version"), g2.metric("kvgate_state_version")
    assert v1 == v2 == int(redis_server.client().hget(STATE_KEY, "version"))
    assert g1.metric("kvgate_state_sync_total", outcome="applied") >= 3
    assert g1.metric("kvgate_state_commits_total", outcome="ok") >= 4
    local = json.loads((g2.state_dir / "state.json").read_text())
    assert local["policy"]["policy"] == "least_loaded"
    # a remote change is not an audit line of the replica that applied it
    audit = [json.loads(line) for line in (g2.state_dir / "audit.log").read_text().splitlines()]
    assert {a["action"] for a in audit} == {"tenant.put", "key.delete", "worker.delete"}
    assert "moved to version" in g2.log()


def test_a_new_replica_starts_from_redis(simworker, kvgate, redis_server):
    sw = simworker(time_scale=0)
    g1 = gateway(kvgate, redis_server, sw, name="g1")
    r = g1.admin.put("/admin/v1/tenants/acme", json={"models": [sw.model]})
    assert r.status_code == 201, r.text
    key = g1.admin.post("/admin/v1/tenants/acme/keys").json()["key"]
    assert g1.admin.put("/admin/v1/policy", json={"policy": "random"}).status_code == 200
    assert g1.admin.put("/admin/v1/workers/w9", json={"url": sw.url}).status_code == 201

    # a third gateway, with its own state directory holding an older, different state
    stale = gateway(kvgate, redis_server, name="g3", sync_interval_ms=1000)
    assert stale.stop() == 0
    state = stale.state_dir / "state.json"
    state.write_text(json.dumps({"version": 1, "tenants": [{"id": "old", "sharing": "isolated"}]}))
    g3 = gateway(kvgate, redis_server, sw, name="g3")
    assert call(g3, key, sw.model) == 200
    assert g3.admin.get("/admin/v1/policy").json()["policy"] == "random"
    assert status(g3, "GET", "/admin/v1/workers/w9") == 200
    assert status(g3, "GET", "/admin/v1/tenants/old") == 404, "Redis is the source, not the file"
    assert "acme" in state.read_text(), "the state file is the local copy of the shared state"


def test_concurrent_edits_from_two_replicas_all_survive(simworker, kvgate, redis_server):
    sw = simworker(time_scale=0)
    g1 = gateway(kvgate, redis_server, sw, name="g1")
    g2 = gateway(kvgate, redis_server, sw, name="g2")
    assert g1.admin.put("/admin/v1/tenants/shared", json={}).status_code == 201
    within(lambda: status(g2, "GET", "/admin/v1/tenants/shared") == 200)
    keys, tenants, errors = [], [], []
    lock = threading.Lock()

    def edit(gw, side):
        import httpx
        with httpx.Client(base_url=gw.admin_url, timeout=30,
                          headers={"authorization": f"Bearer {gw.token}"}) as c:
            # the tenant has room for 16 keys: 8 from each side, between tenant puts
            for i in range(20):
                r = c.put(f"/admin/v1/tenants/{side}-{i}", json={"max_inflight": i + 1})
                with lock:
                    (tenants if r.status_code == 201 else errors).append(
                        f"{side}-{i}" if r.status_code == 201 else r.text)
                if i % 5 < 2 and i < 20:
                    r = c.post("/admin/v1/tenants/shared/keys")
                    with lock:
                        (keys if r.status_code == 201 else errors).append(
                            r.json()["key"] if r.status_code == 201 else r.text)

    threads = [threading.Thread(target=edit, args=(g, side)) for g, side in ((g1, "a"), (g2, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(keys) == 16 and len(tenants) == 40

    def settled():
        return all(len(g.admin.get("/admin/v1/tenants/shared").json()["keys"]) == 16 and
                   len(g.admin.get("/admin/v1/tenants").json()["tenants"]) == 41
                   for g in (g1, g2))
    print("settled after", round(within(settled), 4), "s")
    for g in (g1, g2):
        for i in range(20):
            for side in "ab":
                t = g.admin.get(f"/admin/v1/tenants/{side}-{i}").json()
                assert t["max_inflight"] == i + 1
    # every key handed out was the one committed: each authenticates on both replicas
    for key in keys:
        assert call(g1, key, sw.model) != 401 and call(g2, key, sw.model) != 401
    conflicts = sum(g.metric("kvgate_state_commits_total", outcome="conflict") for g in (g1, g2))
    print("commit conflicts in the storm:", conflicts)
    doc = json.loads(redis_server.client().hget(STATE_KEY, "doc"))
    assert len(doc["tenants"]) == 41

    # A collision for certain: writes paused in Redis, both replicas read the same version,
    # make their change and wait with their compare-and-set; one wins, the other finds the
    # newer state, makes its change again on top of it, and both keys survive.
    assert g1.admin.put("/admin/v1/tenants/duel", json={}).status_code == 201
    within(lambda: status(g2, "GET", "/admin/v1/tenants/duel") == 200)
    redis_server.client().execute_command("CLIENT", "PAUSE", "400", "WRITE")
    duel = {}

    def create(g):
        duel[g.name] = g.admin.post("/admin/v1/tenants/duel/keys")
    threads = [threading.Thread(target=create, args=(g,)) for g in (g1, g2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 201 for r in duel.values()), {k: r.text for k, r in duel.items()}
    after = sum(g.metric("kvgate_state_commits_total", outcome="conflict") for g in (g1, g2))
    assert after == conflicts + 1
    within(lambda: all(len(g.admin.get("/admin/v1/tenants/duel").json()["keys"]) == 2
                       for g in (g1, g2)))
    for r in duel.values():
        assert call(g1, r.json()["key"], sw.model) != 401
        assert call(g2, r.json()["key"], sw.model) != 401
    assert "making the change again" in g1.log() + g2.log()


def test_a_lost_message_heals_by_the_periodic_check(kvgate, redis_server):
    g1 = gateway(kvgate, redis_server, name="g1")
    g2 = gateway(kvgate, redis_server, name="g2")
    assert g1.admin.put("/admin/v1/tenants/acme", json={}).status_code == 201
    within(lambda: status(g2, "GET", "/admin/v1/tenants/acme") == 200)

    # a change nobody announces: the document and its version changed in Redis without PUBLISH
    rc = redis_server.client()
    doc = json.loads(rc.hget(STATE_KEY, "doc"))
    doc["tenants"].append({"id": "quiet", "sharing": "global"})
    version = int(rc.hget(STATE_KEY, "version"))
    rc.hset(STATE_KEY, mapping={"doc": json.dumps(doc), "version": version + 1})
    bound = SYNC_INTERVAL_MS / 1000 + 0.5
    for g in (g1, g2):
        took = within(lambda: status(g, "GET", "/admin/v1/tenants/quiet") == 200)
        assert took < bound, f"{g.name} took {took:.3f}s (periodic check every {SYNC_INTERVAL_MS} ms)"
        assert g.metric("kvgate_state_version") == version + 1

    # the subscriptions killed: the replicas subscribe again and miss nothing
    killed = rc.client_kill_filter(_type="pubsub")
    assert killed >= 2
    assert g1.admin.put("/admin/v1/tenants/after-kill", json={}).status_code == 201
    took = within(lambda: status(g2, "GET", "/admin/v1/tenants/after-kill") == 200)
    assert took < PROPAGATION_S
    within(lambda: g2.metric("kvgate_state_subscribed") == 1, limit=5)
    assert "subscription" in g2.log()


def test_redis_restarted_empty_is_seeded_again(simworker, kvgate, redis_server):
    sw = simworker(time_scale=0)
    g1 = gateway(kvgate, redis_server, sw, name="g1")
    g2 = gateway(kvgate, redis_server, sw, name="g2")
    assert g1.admin.put("/admin/v1/tenants/acme", json={"models": [sw.model]}).status_code == 201
    key = g1.admin.post("/admin/v1/tenants/acme/keys").json()["key"]
    within(lambda: call(g2, key, sw.model) == 200)

    redis_server.restart()  # no persistence: it comes back empty
    rc = redis_server.client()
    within(lambda: rc.hget(STATE_KEY, "doc") is not None, limit=5)
    doc = json.loads(rc.hget(STATE_KEY, "doc"))
    assert [t["id"] for t in doc["tenants"]] == ["acme"]
    assert rc.hget(STATE_KEY, "verifier") == verifier(TEST_SECRET)
    for g in (g1, g2):  # nothing lost locally
        assert call(g, key, sw.model) == 200
    assert "stored this gateway's" in g1.log() + g2.log()

    # and changes flow again, both ways
    assert g2.admin.put("/admin/v1/tenants/later", json={}).status_code == 201
    assert within(lambda: status(g1, "GET", "/admin/v1/tenants/later") == 200) < PROPAGATION_S
    assert status(g1, "DELETE", "/admin/v1/tenants/later") == 204
    assert within(lambda: status(g2, "GET", "/admin/v1/tenants/later") == 404) < PROPAGATION_S


def run_to_exit(args, tmp_path, name, env, timeout=30):
    """Start kvgate and wait for it to exit: (exit status, log text, seconds it ran)."""
    log_path = tmp_path / f"{name}.log"
    argv = [str(binary("kvgate")), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            "--state", str(tmp_path / f"{name}-state"), "--auth", "keys", *args]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, cwd=tmp_path, timeout=timeout,
                              env=child_env({"KVGATE_ADMIN_TOKEN": ADMIN_TOKEN, **env}))
    return proc.returncode, log_path.read_text(errors="replace"), time.monotonic() - start


def test_a_replica_with_another_secret_refuses_to_start(kvgate, redis_server, tmp_path):
    g1 = gateway(kvgate, redis_server, name="g1")
    assert g1.admin.put("/admin/v1/tenants/acme", json={}).status_code == 201
    other = "another-secret-9876543210fedcba9876543210"
    code, log, _ = run_to_exit(["--redis", redis_server.url], tmp_path, "wrong",
                               {"KVGATE_SECRET": other})
    assert code != 0, log
    assert "server secret" in log and "same secret" in log and "refusing to start" in log, log
    for secret in (other, TEST_SECRET):
        assert secret not in log
        assert verifier(secret) not in log
    # it changed nothing, and the first replica goes on
    assert redis_server.client().hget(STATE_KEY, "verifier") == verifier(TEST_SECRET)
    assert status(g1, "GET", "/admin/v1/tenants/acme") == 200
    assert g1.admin.put("/admin/v1/tenants/beta", json={}).status_code == 201


def test_unreachable_redis_refuses_to_start_within_the_timeout(tmp_path):
    port = free_port()  # nothing listens there
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"redis": {"url": f"redis://127.0.0.1:{port}",
                                         "startup_timeout_ms": 1500}}))
    code, log, took = run_to_exit(["-c", str(cfg)], tmp_path, "nored",
                                  {"KVGATE_SECRET": TEST_SECRET})
    assert code != 0, log
    assert "cannot reach Redis within redis.startup_timeout_ms (1500 ms)" in log, log
    assert took < 1.5 + 3.0, f"took {took:.2f}s"
