# SPDX-License-Identifier: Apache-2.0
"""bench/acceptance --quick runs end to end: every run completes without a failed request and
reports sane figures. Only structural facts are asserted, never the routing goals (those are
the bench's PASS/FAIL lines, and depend on the routing work)."""
import json
import subprocess
import sys

from conftest import REPO_ROOT, build_dir, binary


def test_acceptance_quick():
    for exe in ("kvgate", "kvgate-simworker", "kvgate-loadgen"):
        binary(exe)  # fails with a hint when the build is missing
    res = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "acceptance"), "--quick",
                          "--json", "--build", str(build_dir())],
                         capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert res.returncode == 0, \
        f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    out = json.loads(res.stdout)
    assert out["failure"] is None
    runs = {r["label"]: r for r in out["runs"]}
    for label in ("default", "round_robin", "least_loaded", "ideal"):
        assert label in runs and "skipped" not in runs[label], (label, runs.get(label))
    requests = out["params"]["requests"]
    for r in out["runs"]:
        if "skipped" in r:
            assert r["label"] == "prefix_only"  # the only run that may be skipped
            continue
        assert r["requests"] == requests and r["ok"] == requests, r
        assert r["failed"] == 0 and r["errors"] == {}, r
        assert 0.0 <= r["hit_rate"] <= 1.0 and 0.0 <= r["loadgen_hit_rate"] <= 1.0, r
        # The workers' counters and the responses' usage describe the same requests.
        assert r["prefix_cache_queries"] == r["loadgen_prompt_tokens"], r
        assert r["prefix_cache_hits"] == r["loadgen_cached_tokens"], r
        assert sum(w["requests"] for w in r["per_worker"]) == requests, r
        assert len(r["per_worker"]) == (1 if r["label"] == "ideal" else 4), r
        assert r["max_mean_load"] >= 1.0, r
        assert r["ttft_mean_ms"] is not None and r["ttft_mean_ms"] > 0, r
    # One cache holding the whole fleet's blocks beats four caches fed in turn.
    assert runs["ideal"]["hit_rate"] > runs["round_robin"]["hit_rate"], out
    for g in out["goals"]:
        assert isinstance(g["pass"], bool) and g["goal"], g


def test_acceptance_compare_replicas():
    """--gateways 2 --compare: three runs (1 gateway, 2 replicas with their own index, 2 on one
    Redis), each driven through every replica, each hit rate read from the workers."""
    for exe in ("kvgate", "kvgate-simworker", "kvgate-loadgen"):
        binary(exe)
    res = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "acceptance"), "--quick",
                          "--requests", "200", "--gateways", "2", "--compare", "--json",
                          "--build", str(build_dir())],
                         capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert res.returncode == 0, \
        f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    out = json.loads(res.stdout)
    assert out["failure"] is None
    assert out["params"]["gateways"] == 2 and out["params"]["compare"] is True
    assert [r["label"] for r in out["runs"]] == ["1-gateway", "2-embedded", "2-redis"]
    runs = {r["label"]: r for r in out["runs"]}
    for r in out["runs"]:
        assert r["ok"] == 200 and r["failed"] == 0, r
        assert r["prefix_cache_queries"] == r["loadgen_prompt_tokens"], r
        assert r["prefix_cache_hits"] == r["loadgen_cached_tokens"], r
        assert r["throughput_rps"] > 0, r
    assert "per_gateway" not in runs["1-gateway"]
    for label, index in (("2-embedded", "embedded"), ("2-redis", "redis")):
        r = runs[label]
        assert r["gateways"] == 2 and r["index"] == index, r
        # the load went through both replicas, a connection pair each
        assert [g["name"] for g in r["per_gateway"]] == ["kvgate", "kvgate2"], r
        assert all(g["requests"] > 0 and g["connections"] == 8 for g in r["per_gateway"]), r
        assert sum(g["requests"] for g in r["per_gateway"]) == 200, r
    # only the Redis run asked Redis, and Redis answered
    assert not runs["2-embedded"]["redis_lookups"], runs["2-embedded"]
    assert runs["2-redis"]["redis_lookups"].get("ok", 0) > 0, runs["2-redis"]
    goals = {g["goal"]: g for g in out["goals"]}
    assert any(k.startswith("2-redis hit rate within 3%") for k in goals), goals
    assert all(isinstance(g["pass"], bool) for g in goals.values())
