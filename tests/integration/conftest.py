# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the integration tests: find the build, start real kvgate processes on
loopback with port 0, read the bound port back, and stop them cleanly (SIGTERM, exit 0).

Run with the Debian interpreter, which has pytest, httpx and h2:
    /usr/bin/python3 -m pytest tests/integration
KVGATE_BUILD_DIR selects the build directory (default: build, relative to the repository).

Extending: `start_process` starts any binary that understands `--listen HOST:PORT` and
`--port-file PATH`; `process_factory` wraps it with teardown. `simworker` is the example.
"""
import os
import pathlib
import signal
import subprocess
import time

import pytest

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
