# SPDX-License-Identifier: Apache-2.0
"""The series every exporter has (kvgate_build_info, process_*) and the metrics-only bearer
token: it reads GET /metrics and nothing else, and the admin token keeps reading /metrics."""
import os
import re
import subprocess
import time

from gwhelpers import http

METRICS_TOKEN = "prometheus-only-token-0123456789"


def scrape_with(gw, token, method="GET", path="/metrics"):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return http._call(method, gw.admin_url + path, headers=headers)


def parse(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_build_info_and_process_series(kvgate):
    gw = kvgate()
    r = scrape_with(gw, gw.token)
    assert r.status_code == 200
    assert "# TYPE kvgate_build_info gauge" in r.text
    info = [l for l in r.text.splitlines() if l.startswith("kvgate_build_info{")]
    assert len(info) == 1 and info[0].endswith(" 1"), info
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info[0]))
    version = subprocess.run([str(gw.argv[0]), "--version"], capture_output=True,
                             text=True).stdout
    assert labels["version"] in version
    assert set(labels) >= {"version", "commit", "compiler", "libevent", "nghttp2", "openssl"}
    assert labels["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{7,40}", labels["commit"])

    s = parse(r.text)
    for name, kind in [("process_cpu_seconds_total", "counter"),
                       ("process_resident_memory_bytes", "gauge"),
                       ("process_virtual_memory_bytes", "gauge"),
                       ("process_open_fds", "gauge"), ("process_max_fds", "gauge"),
                       ("process_start_time_seconds", "gauge")]:
        assert f"# TYPE {name} {kind}" in r.text, name
        assert name in s, name
    pid = gw.proc.pid
    assert 1 << 20 < s["process_resident_memory_bytes"] < 4 << 30
    assert s["process_virtual_memory_bytes"] >= s["process_resident_memory_bytes"]
    assert abs(s["process_resident_memory_bytes"] / 1024 - gw.rss_kb()) < 64 * 1024
    assert 0 <= s["process_cpu_seconds_total"] < 600
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    assert abs(s["process_open_fds"] - fds) <= 8, (s["process_open_fds"], fds)
    assert 0 < s["process_open_fds"] <= s["process_max_fds"]
    soft = int(open(f"/proc/{pid}/limits").read().split("Max open files")[1].split()[0])
    assert s["process_max_fds"] == soft
    assert time.time() - 120 < s["process_start_time_seconds"] <= time.time() + 1
    # CPU time only grows.
    time.sleep(0.05)
    assert parse(scrape_with(gw, gw.token).text)["process_cpu_seconds_total"] >= \
        s["process_cpu_seconds_total"]


def check_metrics_token(gw, token):
    r = scrape_with(gw, token)
    assert r.status_code == 200, r.text
    assert "kvgate_worker_up" in r.text or "kvgate_build_info" in r.text
    assert scrape_with(gw, token, path="/metrics?x=1").status_code == 200
    # Nothing else: 403 names why; the probes answer anyone anyway.
    for method, path in [("GET", "/admin/v1/workers"), ("GET", "/admin/v1/tenants"),
                         ("PUT", "/admin/v1/workers/x"), ("POST", "/metrics"),
                         ("GET", "/nope")]:
        r = scrape_with(gw, token, method, path)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        assert "metrics" in r.json()["error"]["message"]
    assert scrape_with(gw, token, path="/healthz").status_code == 200
    # A wrong token is a 401, the admin token still reads /metrics and the rest.
    assert scrape_with(gw, token + "x").status_code == 401
    assert scrape_with(gw, None).status_code == 401
    assert scrape_with(gw, gw.token).status_code == 200
    assert scrape_with(gw, gw.token, path="/admin/v1/workers").status_code == 200


def test_metrics_token_from_environment(kvgate):
    gw = kvgate(env={"KVGATE_METRICS_TOKEN": METRICS_TOKEN})
    check_metrics_token(gw, METRICS_TOKEN)
    assert METRICS_TOKEN not in gw.log()


def test_metrics_token_from_config_and_reload(kvgate):
    gw = kvgate(config={"admin": {"metrics_tokens": [METRICS_TOKEN]}})
    check_metrics_token(gw, METRICS_TOKEN)
    other = "another-prometheus-token-98765"
    gw.write_config({"admin": {"metrics_tokens": [other]}})
    gw.reload()
    deadline = time.monotonic() + 5
    while scrape_with(gw, other).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    check_metrics_token(gw, other)
    assert scrape_with(gw, METRICS_TOKEN).status_code == 401
    # No metrics token at all: only the admin token reads /metrics.
    gw.write_config({})
    gw.reload()
    deadline = time.monotonic() + 5
    while scrape_with(gw, other).status_code != 401 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scrape_with(gw, other).status_code == 401
    assert scrape_with(gw, gw.token).status_code == 200
