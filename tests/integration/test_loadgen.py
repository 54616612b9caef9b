# SPDX-License-Identifier: Apache-2.0
"""kvgate-loadgen against real simulated workers: `--url` given several times spreads the
connections round robin over the URLs and each connection keeps its URL (what a plain L4
balancer in front of gateway replicas does); the per-URL counts of the report are the requests
each server answered; bad combinations are usage errors (exit 2)."""
import json
import subprocess

from conftest import binary


def loadgen(*args, timeout=120):
    return subprocess.run([str(binary("kvgate-loadgen")), *args], capture_output=True,
                          text=True, timeout=timeout)


def url_args(*workers):
    out = []
    for w in workers:
        out += ["--url", f"http://127.0.0.1:{w.port}"]
    return out


def run_json(*args):
    res = loadgen(*args, "--format", "json")
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return json.loads(res.stdout)


def served(out):
    """Requests each worker answered, by the x-simworker-name of the responses."""
    return {w["name"]: w["requests"] for w in out["workers"]}


def test_connections_round_robin_over_urls(simworker):
    workers = [simworker(time_scale=0, name=f"u{i}") for i in range(3)]
    out = run_json(*url_args(*workers), "--requests", "90", "--concurrency", "7",
                   "--workload", "shared-prefix")
    assert out["ok"] == 90 and out["failed"] == 0, out
    assert out["url"] == f"http://127.0.0.1:{workers[0].port}"
    urls = out["urls"]
    assert [u["url"] for u in urls] == [f"http://127.0.0.1:{w.port}" for w in workers]
    # 7 connections over 3 URLs: 3, 2, 2
    assert [u["connections"] for u in urls] == [3, 2, 2], urls
    # what the loadgen counted per URL is what each worker answered: the URL's connections
    # went to that worker and nowhere else
    by_name = served(out)
    for u, w in zip(urls, workers):
        assert u["requests"] == by_name.get(w.name, 0) > 0, (urls, by_name)
        assert u["ok"] == u["requests"]
    assert sum(u["requests"] for u in urls) == 90


def test_each_connection_keeps_its_url(simworker):
    """A slow server behind one URL gets only what its own connection sends (closed loop): the
    fast one's connection goes on sending. Per-request round robin would give both about half."""
    fast = simworker(time_scale=0, name="fast")
    slow = simworker(time_scale=1, name="slow", prefill_us_per_token=0,
                     decode_us_per_token=40000)  # 4 tokens: ~160 ms a request
    out = run_json(*url_args(fast, slow), "--requests", "60", "--concurrency", "2",
                   "--max-tokens", "4")
    assert out["ok"] == 60, out
    by_name = served(out)
    assert [u["requests"] for u in out["urls"]] == [by_name.get("fast", 0),
                                                   by_name.get("slow", 0)]
    assert by_name.get("slow", 0) >= 1
    assert by_name["fast"] >= 5 * by_name["slow"], by_name


def test_one_url_reports_as_before(simworker):
    w = simworker(time_scale=0)
    url = f"http://127.0.0.1:{w.port}"
    out = run_json("--url", url, "--requests", "10", "--concurrency", "4")
    assert out["url"] == url and out["ok"] == 10
    assert out["urls"] == [{"url": url, "connections": 4, "requests": 10, "ok": 10}]
    text = loadgen("--url", url, "--requests", "10", "--concurrency", "4")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"kvgate-loadgen ") and f": {url}  model" in text.stdout
    assert "more URLs" not in text.stdout and "connections" not in text.stdout


def test_several_urls_text_report(simworker):
    a, b = simworker(time_scale=0), simworker(time_scale=0)
    res = loadgen(*url_args(a, b), "--requests", "20", "--concurrency", "4")
    assert res.returncode == 0, res.stderr
    assert f"http://127.0.0.1:{a.port} and 1 more URLs" in res.stdout
    rows = [line.split() for line in res.stdout.splitlines()
            if line.strip().startswith("http://127.0.0.1:")]
    assert [r[0] for r in rows] == [f"http://127.0.0.1:{a.port}", f"http://127.0.0.1:{b.port}"]
    assert [int(r[1]) for r in rows] == [2, 2]  # connections
    assert sum(int(r[2]) for r in rows) == 20  # requests


def test_url_usage_errors():
    ok = "http://127.0.0.1:9"
    res = loadgen("--url", ok, "--url", ok, "--url", ok, "--concurrency", "2")
    assert res.returncode == 2 and "every URL needs a connection" in res.stderr, res.stderr
    res = loadgen("--url", ok, "--url", "https://127.0.0.1:9", "--concurrency", "2")
    assert res.returncode == 2 and "--url https://127.0.0.1:9" in res.stderr, res.stderr
    res = loadgen(*(["--url", ok] * 65), "--concurrency", "100")
    assert res.returncode == 2 and "more than 64" in res.stderr, res.stderr
