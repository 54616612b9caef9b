# SPDX-License-Identifier: Apache-2.0
"""bench/acceptance --exact --events (issue 17) runs end to end: the events run subscribes to
every worker, events flow and are applied, dropped batches come back through the replay socket,
and --restart-worker kills and restarts a worker mid-load and sees the index forget it. Only
structural facts are asserted, never the acceptance targets (those are the bench's PASS/FAIL
lines, and depend on the index's and the consumer's work)."""
import json
import subprocess
import sys

from conftest import REPO_ROOT, build_dir, binary


def acceptance(*flags):
    for exe in ("kvgate", "kvgate-simworker", "kvgate-loadgen"):
        binary(exe)  # fails with a hint when the build is missing
    res = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "acceptance"), "--json",
                          "--build", str(build_dir()), *flags],
                         capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert res.returncode == 0, \
        f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    out = json.loads(res.stdout)
    assert out["failure"] is None, out["failure"]
    return out


def test_acceptance_events_with_drops():
    out = acceptance("--quick", "--exact", "--events", "--event-drop-rate", "0.05",
                     "--policies", "default")
    assert [r["label"] for r in out["runs"]] == ["default", "token_exact", "token_exact_events"]
    runs = {r["label"]: r for r in out["runs"]}
    requests = out["params"]["requests"]
    for r in out["runs"]:
        assert r["ok"] == requests and r["failed"] == 0, r
        assert r["prefix_cache_queries"] == r["loadgen_prompt_tokens"], r
        assert 0.0 < r["predicted_hit_rate"] <= 1.0 and 0.0 < r["hit_rate"] <= 1.0, r
    for label in ("default", "token_exact"):  # no events there: nothing subscribed
        assert "kv_events" not in runs[label], runs[label]
    e = runs["token_exact_events"]
    assert e["kv_events_subscriptions"] == 4 and e["event_drop_rate"] == 0.05, e
    ev = e["kv_events"]
    # Events were applied (the workers' stores and LRU evictions), none refused.
    assert ev["batches"] > 0 and ev["stored"] > 0 and ev["removed"] > 0, ev
    assert ev["invalid"] == 0, ev
    # 5% of ~1000 batches dropped: gaps seen, every one answered by the replay socket.
    assert ev["gaps"] > 0 and ev["replayed"] >= ev["gaps"] and ev["lost"] == 0, ev
    goals = {g["goal"]: g for g in out["goals"]}
    assert any("predicted within 1 point" in k for k in goals), goals
    assert any("replay fills the gaps" in k and g["pass"] for k, g in goals.items()), goals


def test_acceptance_restart_worker():
    concurrency = 16
    out = acceptance("--requests", "1600", "--concurrency", str(concurrency), "--exact",
                     "--events", "--restart-worker", "--policies", "default")
    assert [r["label"] for r in out["runs"]] == ["default", "token_exact", "token_exact_events"]
    for r in out["runs"]:
        rs = r["restart"]
        assert rs["worker"] in ("w1", "w2", "w3", "w4"), rs
        # The probe was running on it at the kill: its blocks were predicted there.
        assert 0 < rs["matched_before"] <= rs["probe_blocks"], rs
        assert rs["down_s"] > 0 and rs["out_of_rotation_after_kill_s"] is not None, rs
        # Only the requests in flight on the killed worker may fail, and the rest finish.
        assert r["failed"] <= concurrency and r["ok"] + r["failed"] == r["requests"], r
        assert set(r["errors"]) <= {"connection", "incomplete"}, r["errors"]
        # Its first process's counters are kept: every prompt token is counted once.
        assert abs(r["prefix_cache_queries"] - r["loadgen_prompt_tokens"]) \
            <= 0.01 * r["loadgen_prompt_tokens"], r
    e = {r["label"]: r for r in out["runs"]}["token_exact_events"]
    rs = e["restart"]
    # The consumer saw the publisher come back, and the index forgot the worker.
    assert e["kv_events"]["restarts"] >= 1, e["kv_events"]
    assert rs["counted_after_kill_s"] is not None and rs["cleared_after_kill_s"] is not None, rs
    assert rs["cleared_after_kill_s"] >= 0, rs
