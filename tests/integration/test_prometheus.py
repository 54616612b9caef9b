# SPDX-License-Identifier: Apache-2.0
"""deploy/prometheus against a real Prometheus: Debian's /usr/bin/prometheus scrapes a real
kvgate's admin listener (bearer token from a credentials_file, as deploy/prometheus/prometheus.yml
does, with the metrics-only token) and a simworker as a vLLM worker, loads deploy/prometheus/kvgate.rules.yml, and the test
reads the result back through Prometheus' HTTP API: the targets are up, the series arrive with
the values the gateway exports, every recording and alerting rule loads and evaluates with
health ok, every query of deploy/grafana/kvgate-dashboard.json evaluates, and a scrape job
without the token is refused with 401."""

import json
import os
import pathlib
import re
import socket
import subprocess
import time

import httpx
import pytest

from gwhelpers import COMPL, http

METRICS_TOKEN = "prometheus-metrics-token-0123456789"

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMETHEUS = pathlib.Path("/usr/bin/prometheus")
RULES = REPO_ROOT / "deploy" / "prometheus" / "kvgate.rules.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "kvgate-dashboard.json"
TIMEOUT_S = 20.0

pytestmark = pytest.mark.skipif(
    not os.access(PROMETHEUS, os.X_OK),
    reason=f"{PROMETHEUS} not installed (Debian package prometheus; scripts/lib.sh installs it)")

# Series the gateway exports today: asserted unconditionally.
# Series being added (routing decision, prefix index, prefix accounting, policy): each is checked
# only when the gateway's own /metrics page carries it, so this test tightens by itself as they
# land (nothing to edit here then). Histograms are checked through their _count series.
UPCOMING = [
    "kvgate_route_decision_seconds",
    "kvgate_route_blocks_total",
    "kvgate_route_decisions_total",
    "kvgate_index_entries",
    "kvgate_index_capacity_entries",
    "kvgate_index_evictions_total",
    "kvgate_index_inserts_total",
    "kvgate_index_worker_entries",
    "kvgate_prefix_predicted_tokens_total",
    "kvgate_prefix_cached_tokens_total",
    "kvgate_prefix_prompt_tokens_total",
    "kvgate_tenant_cached_tokens_total",
    "kvgate_tenant_prompt_tokens_total",
    "kvgate_tenant_predicted_tokens_total",
    "kvgate_policy_info",
]
# Alerts that must stay quiet while the gateway and its one worker are healthy.
HEALTHY_QUIET = {"KvgateGatewayDown", "KvgateWorkerDown", "KvgateNoWorkerAvailable",
                 "KvgateTenantErrorRatioHigh", "KvgateWorkerErrorRatioHigh",
                 "KvgateConnectionsRefused", "KvgateAcceptErrors", "KvgateBufferBudgetRefusals",
                 "KvgateTimeToFirstTokenHigh"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rule_names(path: pathlib.Path) -> set:
    return set(re.findall(r"^\s*- (?:record|alert): (\S+)\s*$", path.read_text(), re.M))


class Prometheus:
    def __init__(self, tmp_path, config: str):
        self.dir = tmp_path / "prometheus"
        self.dir.mkdir()
        (self.dir / "prometheus.yml").write_text(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.dir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={self.dir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir)
        self.client = httpx.Client(base_url=self.url, timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, path, **params):
        r = self.client.get(path, params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr) -> list:
        return self.api("/api/v1/query", query=expr)["result"]

    def value(self, expr):
        """The single value of expr (float), or None while it has no result."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def wait(self, what, cond, timeout=TIMEOUT_S):
        """Poll cond() until truthy; fail with `what`, the last value and Prometheus' log."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log()}"
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what} (last: {v!r})\n{self.log()}")
            time.sleep(0.2)

    def targets(self) -> dict:
        return {t["labels"]["job"]: t for t in self.api("/api/v1/targets")["activeTargets"]}

    def stop(self):
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def prometheus(tmp_path):
    started = []

    def start(config):
        p = Prometheus(tmp_path, config)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def test_prometheus_scrapes_kvgate_and_loads_rules(simworker, kvgate, prometheus, tmp_path):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, auth="keys", env={"KVGATE_METRICS_TOKEN": METRICS_TOKEN})
    assert gw.admin.put("/admin/v1/tenants/acme", json={}).status_code in (200, 201)
    r = gw.admin.post("/admin/v1/tenants/acme/keys")
    assert r.status_code == 201, r.text
    key = r.json()["key"]

    def traffic(n):
        prompt = "You are a helpful assistant. " * 8 + "Summarise the report."
        for i in range(n):
            r = http.post(gw.url + COMPL, headers={"authorization": f"Bearer {key}"},
                          json={"model": sw.model, "prompt": prompt + str(i % 2), "max_tokens": 2})
            assert r.status_code == 200, r.text
        # One stream, for the inter-token latency (3 output events: 2 gaps).
        r = http.post(gw.url + COMPL, headers={"authorization": f"Bearer {key}"},
                      json={"model": sw.model, "prompt": prompt, "max_tokens": 3, "stream": True,
                            "stream_options": {"include_usage": True}})
        assert r.status_code == 200, r.text
        r = http.post(gw.url + COMPL, headers={"authorization": "Bearer kvg-" + "A" * 43},
                      json={"model": sw.model, "prompt": "x"})
        assert r.status_code == 401

    traffic(4)

    token_file = tmp_path / "kvgate-admin-token"
    token_file.write_text(METRICS_TOKEN + "\n")
    token_file.chmod(0o600)
    admin = f"127.0.0.1:{gw.admin_port}"
    # The deploy/prometheus/prometheus.yml jobs, pointed at this test's processes, every second.
    prom = prometheus(f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: kvgate
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ["{admin}"]
  - job_name: kvgate-noauth
    static_configs:
      - targets: ["{admin}"]
  - job_name: vllm
    static_configs:
      - targets: ["127.0.0.1:{sw.port}"]
        labels: {{worker: {sw.name}}}
""")
    prom.wait("prometheus ready", lambda: _ready(prom))

    # Targets: kvgate and the worker up without scrape errors (a malformed exposition would show
    # here), the job without the token down with the admin listener's 401.
    def targets_settled():
        t = prom.targets()
        return t if (t.get("kvgate", {}).get("health") == "up"
                     and t.get("vllm", {}).get("health") == "up"
                     and t.get("kvgate-noauth", {}).get("health") == "down") else None

    t = prom.wait("targets kvgate/vllm up, kvgate-noauth down", targets_settled)
    assert t["kvgate"]["lastError"] == "", t["kvgate"]
    assert t["vllm"]["lastError"] == "", t["vllm"]
    assert "401" in t["kvgate-noauth"]["lastError"], t["kvgate-noauth"]
    assert prom.value('up{job="kvgate-noauth"}') == 0

    # More traffic now that the counters have a first sample, so rates see it.
    traffic(4)
    w = f'worker="{sw.name}"'
    expected = gw.metric("kvgate_worker_requests_total", worker=sw.name, code="200")
    assert expected == 10
    prom.wait("kvgate_worker_requests_total to reach the gateway's count",
              lambda: prom.value(f'sum(kvgate_worker_requests_total{{job="kvgate",{w},code="200"}})')
              == expected)
    assert prom.value(f'kvgate_worker_up{{{w}}}') == 1
    assert prom.value(f'kvgate_worker_draining{{{w}}}') == 0
    assert prom.value(f'kvgate_worker_ttfb_seconds_count{{{w}}}') == expected
    assert prom.value(f'kvgate_worker_request_duration_seconds_bucket{{{w},le="+Inf"}}') == expected
    assert prom.value('kvgate_tenant_requests_total{tenant="acme",code="200"}') == 10
    # What users feel: a TTFT for every answer, 2 gaps per stream, 2 or 3 tokens each.
    assert prom.value(f'kvgate_worker_ttft_seconds_count{{{w}}}') == expected
    assert prom.value('kvgate_tenant_ttft_seconds_count{tenant="acme"}') == expected
    assert prom.value(f'kvgate_worker_itl_seconds_count{{{w}}}') == 4
    assert prom.value('kvgate_tenant_output_tokens_total{tenant="acme"}') == 8 * 2 + 2 * 3
    assert prom.value('kvgate_build_info{job="kvgate"}') == 1
    assert prom.value('process_resident_memory_bytes{job="kvgate"}') > 0
    assert prom.value('process_open_fds{job="kvgate"}') > 0
    assert prom.value('kvgate_auth_failures_total{reason="unknown"}') == 2
    assert prom.value("kvgate_tenants") == 1
    assert prom.value(f'sum(vllm:prefix_cache_queries_total{{{w}}})') > 0

    # Series still being added elsewhere: asserted once the gateway exports them.
    page = gw.admin.get("/metrics").text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M))
    for name in UPCOMING:
        if name not in types:
            continue
        series = name + "_count" if types[name] == "histogram" else name
        assert prom.query(f'{series}{{job="kvgate"}}'), f"{series} is on /metrics, not in Prometheus"

    # Rules: every rule of the file loaded, evaluated, health ok (a rule that fails to evaluate,
    # e.g. many-to-many matching, has health err and lastError set).
    want = rule_names(RULES)
    assert len(want) >= 30

    def rules_evaluated():
        groups = prom.api("/api/v1/rules")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        if set(rules) != want:
            return None
        bad = {n: (r["health"], r.get("lastError")) for n, r in rules.items() if r["health"] != "ok"}
        return rules if not bad else None

    rules = prom.wait(f"the {len(want)} rules of {RULES.name} to evaluate with health ok",
                      rules_evaluated)
    assert {r["type"] for r in rules.values()} == {"recording", "alerting"}
    for name, r in rules.items():
        if r["type"] == "alerting":
            assert r["labels"].get("severity") in ("critical", "warning", "info"), name
            assert r["annotations"].get("summary") and r["annotations"].get("description"), name
            assert r["duration"] > 0, f"{name} has no for:"

    # Recording rules produce series from today's metrics.
    prom.wait("tenant:kvgate_tenant_requests:rate5m > 0 for acme",
              lambda: (prom.value('tenant:kvgate_tenant_requests:rate5m{tenant="acme"}') or 0) > 0)
    assert prom.value('tenant:kvgate_tenant_errors:ratio_rate5m{tenant="acme"}') == 0
    assert prom.value(f'worker:kvgate_worker_errors:ratio_rate5m{{{w}}}') == 0
    prom.wait("kvgate:ttft_seconds:p95_rate5m", lambda: prom.query("kvgate:ttft_seconds:p95_rate5m"))
    prom.wait("tenant:kvgate_tenant_output_tokens:rate5m > 0 for acme",
              lambda: (prom.value('tenant:kvgate_tenant_output_tokens:rate5m{tenant="acme"}')
                       or 0) > 0)
    prom.wait("worker:kvgate_worker_itl_seconds:mean_rate5m",
              lambda: prom.query(f'worker:kvgate_worker_itl_seconds:mean_rate5m{{{w}}}'))
    prom.wait("worker:kvgate_worker_inflight:avg5m",
              lambda: prom.query(f'worker:kvgate_worker_inflight:avg5m{{{w}}}'))
    # (a rate needs two scrapes of the worker, which may not have happened yet)
    prom.wait("worker:vllm_prefix_cache_hit_ratio:rate5m",
              lambda: prom.query(f'worker:vllm_prefix_cache_hit_ratio:rate5m{{{w}}}'))

    # Every query of the Grafana dashboard parses and evaluates (variables filled in as
    # Grafana would with "All").
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    for expr in exprs:
        q = (expr.replace("$__rate_interval", "1m").replace("$worker", ".*")
             .replace("$tenant", ".*"))
        assert "$" not in q, expr
        r = prom.client.get("/api/v1/query", params={"query": q})
        assert r.status_code == 200 and r.json()["status"] == "success", (expr, r.text)

    # Healthy fleet: the availability and error alerts are not even pending.
    active = {a["labels"]["alertname"]: a["state"] for a in prom.api("/api/v1/alerts")["alerts"]}
    assert not HEALTHY_QUIET & set(active), active


def _ready(prom) -> bool:
    try:
        return prom.client.get("/-/ready").status_code == 200
    except httpx.TransportError:
        return False
