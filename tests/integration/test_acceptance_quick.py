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
