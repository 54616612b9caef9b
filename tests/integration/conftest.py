# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the integration tests: find the build, start real kvgate processes on
loopback with port 0, read the bound port back, and stop them cleanly (SIGTERM, exit 0).

Run with the Debian interpreter, which has pytest, httpx and h2:
    /usr/bin/python3 -m pytest tests/integration
KVGATE_BUILD_DIR selects the build directory (default: build, relative to the repository).

Extending: `start_process` starts any binary that understands `--listen HOST:PORT` and
`--port-file PATH`; `process_factory` wraps it with teardown. `simworker` is the example.
`kvgate` starts the gateway (its port file has front= and admin= lines), `tls_cert` makes a
self-signed certificate, `fake_upstream` runs a scripted worker (gwhelpers.FakeUpstream) for
behaviour the simulated worker cannot produce. Clients and fakes live in gwhelpers.py.
Redis servers, Sentinel sets and clusters (`redis_procs`, `redis_server`, `redis_sentinel`,
`redis_cluster`) live in redisprocs.py.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from redisprocs import redis_cluster, redis_procs, redis_sentinel, redis_server  # noqa: F401

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("KVGATE_START_TIMEOUT", "10"))
STOP_TIMEOUT_S = float(os.environ.get("KVGATE_STOP_TIMEOUT", "10"))


def build_dir() -> pathlib.Path:
    """The Meson build directory: $KVGATE_BUILD_DIR, relative paths from the repository root."""
    d = pathlib.Path(os.environ.get("KVGATE_BUILD_DIR", "build"))
    return d if d.is_absolute() else REPO_ROOT / d


def binary(name: str) -> pathlib.Path:
    """Path of a built binary; fails the test with a hint when it is missing."""
    path = build_dir() / name
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(f"{path} not found: build it (meson compile -C {build_dir()}) "
                    f"or point KVGATE_BUILD_DIR at a build directory")
    return path


def flags_to_argv(flags: dict) -> list:
    """{'kv_blocks': 8, 'model': ['a', 'b']} -> ['--kv-blocks', '8', '--model', 'a', '--model', 'b'].
    A value of True gives a bare flag; None or False leaves the flag out."""
    argv = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v is None or v is False:
                continue
            argv.append(flag)
            if v is not True:
                argv.append(str(v))
    return argv


class Process:
    """A server started by start_process: .proc, .port, .url, .name, .log_path."""

    def __init__(self, name, argv, proc, port, log_path):
        self.name = name
        self.argv = argv
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait, and return the exit status (SIGKILL after the timeout: returns -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def child_env(extra=None) -> dict:
    """The environment for servers under test: sanitizer reports become failing exits (ASan
    already aborts; UBSan only prints unless told otherwise)."""
    env = dict(os.environ)
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.update(extra or {})
    return env


def start_process(exe, args, workdir: pathlib.Path, name: str,
                  timeout: float = START_TIMEOUT_S, env=None) -> Process:
    """Start exe with --listen 127.0.0.1:0 --port-file <workdir>/<name>.port plus args, wait
    for the port file (written atomically by the server after binding), return a Process.
    stderr and stdout go to <workdir>/<name>.log, quoted in failures. env adds variables."""
    port_file = workdir / f"{name}.port"
    log_path = workdir / f"{name}.log"
    port_file.unlink(missing_ok=True)
    argv = [str(exe), "--listen", "127.0.0.1:0", "--port-file", str(port_file), *args]
    log = open(log_path, "wb")
    try:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=workdir, env=child_env(env))
    finally:
        log.close()
    deadline = time.monotonic() + timeout
    while True:
        if port_file.exists():
            text = port_file.read_text()
            if text.endswith("\n"):
                return Process(name, argv, proc, int(text), log_path)
        if proc.poll() is not None:
            pytest.fail(f"{name} exited with {proc.returncode} before listening: {argv}\n"
                        f"{log_path.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"{name} did not write {port_file} within {timeout}s\n"
                        f"{log_path.read_text(errors='replace')}")
        time.sleep(0.01)


@pytest.fixture
def process_factory(tmp_path):
    """start(exe, args, name, env=None) -> Process; at teardown every process still running
    gets SIGTERM and must exit 0 (so crashes, hangs on shutdown and sanitizer reports fail the
    test)."""
    started = []

    def start(exe, args, name, env=None):
        p = start_process(exe, args, tmp_path, name, env=env)
        started.append(p)
        return p

    yield start
    problems = []
    for p in started:
        crashed = not p.alive()
        code = p.stop()
        expected = getattr(p, "expect_exit", 0)  # a test that kills on purpose may set this
        if code != expected:
            problems.append(f"{p.name} exited with {code}{' before teardown' if crashed else ''}"
                            f"\n--- {p.log_path} ---\n{p.log()[-4000:]}")
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture
def simworker(process_factory):
    """simworker(**flags) starts build/kvgate-simworker on 127.0.0.1:0 and returns a Process
    with .port, .url, .proc, .name and .model (the first served name). Flags use Python names:
    simworker(kv_blocks=8, time_scale=0, model=["m", "alias"]). Each gets a unique --name
    unless one is given. env={...} adds environment variables."""
    exe = binary("kvgate-simworker")
    count = [0]

    def start(env=None, **flags):
        count[0] += 1
        flags.setdefault("name", f"sim{count[0]}")
        p = process_factory(exe, flags_to_argv(flags), flags["name"], env=env)
        models = flags.get("model", "sim-model")
        p.model = models[0] if isinstance(models, (list, tuple)) else models
        return p

    return start


# ---- kvgate (the gateway) -------------------------------------------------------------------------

ADMIN_TOKEN = "integration-admin-token-0123456789"
TEST_SECRET = "integration-secret-0123456789abcdef0123456789"


class Gateway:
    """A kvgate started by the kvgate fixture.

    .proc, .port, .url (front, cleartext), .admin_port, .admin_url, .token (admin bearer),
    .access_log (path, or None when off), .log_path (stderr+stdout), .config_path (or None),
    .state_dir, .argv, .name. .expect_exit (default 0) is the status teardown requires.
    """

    def __init__(self, name, argv, proc, ports, log_path, access_log, config_path, state_dir,
                 token):
        self.name = name
        self.argv = argv
        self.proc = proc
        self.port = ports["front"][0]
        self.front_ports = ports["front"]
        self.admin_port = ports["admin"][0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.https_url = f"https://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.log_path = log_path
        self.access_log = access_log
        self.config_path = config_path
        self.state_dir = state_dir
        self.token = token
        self.expect_exit = 0
        self._admin = None

    # -- process --
    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait, return the exit status (SIGKILL after the timeout: -9)."""
        self.close_admin()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def rss_kb(self) -> int:
        """Resident set size of the gateway process (VmRSS, kB)."""
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    # -- config file --
    def write_config(self, config: dict):
        """Rewrite the config file (the gateway must have been started with one); SIGHUP
        applies it (see reload)."""
        assert self.config_path, "started without a config file"
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config, indent=2))
        tmp.rename(self.config_path)

    def reload(self):
        self.proc.send_signal(signal.SIGHUP)

    # -- admin API --
    @property
    def admin(self):
        """An httpx.Client on the admin listener with the bearer token; keep-alive, so that
        scraping /metrics does not itself open front-counted connections repeatedly."""
        import httpx
        if self._admin is None:
            self._admin = httpx.Client(base_url=self.admin_url, timeout=10, verify=False,
                                       headers={"authorization": f"Bearer {self.token}"})
        return self._admin

    def close_admin(self):
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def scrape(self) -> dict:
        """/metrics as {'name{labels}': value}."""
        r = self.admin.get("/metrics")
        assert r.status_code == 200, r.text
        out = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name, samples=None, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels` (a fresh scrape unless
        samples are given)."""
        samples = self.scrape() if samples is None else samples
        total = 0.0
        for key, value in samples.items():
            n, _, rest = key.partition("{")
            if n != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            if all(have.get(k) == str(v) for k, v in labels.items()):
                total += value
        return total

    def access_entries(self) -> list:
        """The access log's lines, parsed (front and admin requests alike)."""
        if not self.access_log or not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line]


def read_port_file(path: pathlib.Path):
    """kvgate's port file -> {'front': [port, ...], 'admin': [port, ...]}, or None while it is
    not complete (it is written by rename, so a present file is whole)."""
    if not path.exists():
        return None
    ports = {"front": [], "admin": []}
    for line in path.read_text().splitlines():
        kind, _, addr = line.partition("=")
        ports.setdefault(kind, []).append(int(addr.rpartition(":")[2]))
    return ports if ports["front"] and ports["admin"] else None


def worker_url(w) -> str:
    """A simworker Process, a fake upstream (anything with .url) or a URL string."""
    return w if isinstance(w, str) else w.url


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory):
    """(cert.pem, key.pem): a self-signed certificate for 127.0.0.1/localhost, made once."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """When a test fails, its report shows the tail of each gateway's log (stderr and stdout,
    with any sanitizer report) and of each Redis process's next to the assertion."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("call", "setup"):
        for gw in getattr(item, "kvgate_started", []):
            report.sections.append((f"{gw.name} log ({gw.log_path})", gw.log()[-6000:]))
        procs = getattr(item, "redis_procs", None)
        for p in procs.processes if procs else []:
            report.sections.append((f"{p.name} log ({p.log_path})", p.log()[-3000:]))


@pytest.fixture
def kvgate(tmp_path, request):
    """kvgate(*workers, config=None, ...) starts build/kvgate on 127.0.0.1:0 (front and admin)
    and returns a Gateway once its --port-file is written.

    workers: simworker Processes, fake upstreams or URLs, passed as --worker NAME=URL (NAME is
    the Process's .name, else w1, w2, ...); leave them out to take the workers from `config`.
    config: a dict written to <tmp>/<name>.json and passed with -c (Gateway.write_config and
    .reload edit it later). threads: --threads (default 2). tls: (cert, key) for --tls-cert
    and --tls-key. listen: front addresses (default ['127.0.0.1:0']; [] leaves them to the
    config). access_log: True (a file in tmp, default), False ('off'). args: more flags.
    env: extra environment. wrap: a command that execs the gateway (e.g. ["prlimit",
    "--nofile=256:4096", "--"]): the process keeps its pid. At teardown each gateway still running gets SIGTERM and must exit
    with .expect_exit (0), so hangs, crashes and sanitizer reports fail the test; its log is
    shown on failure."""
    exe = binary("kvgate")
    started = []
    request.node.kvgate_started = started

    def start(*workers, config=None, threads=2, tls=None, listen=None, access_log=True,
              args=(), env=None, log_level="info", token=ADMIN_TOKEN, name=None,
              timeout=START_TIMEOUT_S, auth="open", wrap=()):
        name = name or f"kvgate{len(started) + 1}"
        port_file = tmp_path / f"{name}.ports"
        log_path = tmp_path / f"{name}.log"
        state_dir = tmp_path / f"{name}-state"
        access_path = tmp_path / f"{name}-access.log" if access_log else None
        port_file.unlink(missing_ok=True)
        argv = [*wrap, str(exe), "--port-file", str(port_file), "--admin-listen", "127.0.0.1:0",
                "--state", str(state_dir), "--log-level", log_level,
                "--access-log", str(access_path) if access_path else "off"]
        for addr in (["127.0.0.1:0"] if listen is None else listen):
            argv += ["--listen", addr]
        if threads is not None:
            argv += ["--threads", str(threads)]
        if auth is not None:  # most tests are about HTTP, not tenancy: open unless asked
            argv += ["--auth", auth]
        if tls:
            argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        for i, w in enumerate(workers):
            wname = getattr(w, "name", None) if not isinstance(w, str) else None
            argv += ["--worker", f"{wname or f'w{i + 1}'}={worker_url(w)}"]
        config_path = None
        if config is not None:
            config_path = tmp_path / f"{name}.json"
            config_path.write_text(json.dumps(config, indent=2))
            argv += ["-c", str(config_path)]
        argv += list(args)
        environment = {"KVGATE_ADMIN_TOKEN": token} if token else {}
        environment["KVGATE_SECRET"] = TEST_SECRET  # so tests can compute the salts
        environment.update(env or {})
        log = open(log_path, "wb")
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=tmp_path,
                                    env=child_env(environment))
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while True:
            ports = read_port_file(port_file)
            if ports:
                break
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode} before listening: {argv}\n"
                            f"{log_path.read_text(errors='replace')}")
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"{name} did not write {port_file} within {timeout}s\n"
                            f"{log_path.read_text(errors='replace')}")
            time.sleep(0.01)
        gw = Gateway(name, argv, proc, ports, log_path, access_path, config_path, state_dir,
                     token)
        started.append(gw)
        return gw

    yield start
    problems = []
    for gw in started:
        crashed = not gw.alive()
        code = gw.stop()
        if code != gw.expect_exit:
            problems.append(f"{gw.name} exited with {code}{' before teardown' if crashed else ''}"
                            f" (expected {gw.expect_exit})\n--- {gw.log_path} ---\n"
                            f"{gw.log()[-6000:]}")
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture
def fake_upstream():
    """fake_upstream(handler, name=..., health=True) -> gwhelpers.FakeUpstream, closed at
    teardown. For behaviour kvgate-simworker cannot produce; prefer the simworker."""
    from gwhelpers import FakeUpstream
    made = []

    def make(handler, **kw):
        f = FakeUpstream(handler, **kw)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()
