# SPDX-License-Identifier: Apache-2.0
"""What an operator and an orchestrator rely on (issue 14): SIGHUP reloads the TLS certificate
for new connections and keeps the running one when the new files are bad; the tls.* settings
(minimum version, ciphers) are enforced and checked; the certificate's expiry is a metric;
--check-config runs start-up's checks (TLS files, the secret, the state directory); SIGTERM
first answers /readyz with 503 while still serving (shutdown_ready_delay_ms), then drains;
readiness without workers is a setting; the front listener can answer probe paths."""
import json
import os
import signal
import socket
import ssl
import subprocess
import time

import httpx
import pytest
from conftest import binary, child_env, read_port_file
from gwhelpers import COMPL, http, wait_for


def make_cert(d, name, cn, days=2):
    """A self-signed EC certificate for 127.0.0.1 with subject CN=cn, valid for days."""
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", str(days), "-subj",
                    f"/CN={cn}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def not_after(cert):
    """The certificate's expiry as Unix time (openssl's own reading)."""
    out = subprocess.run(["openssl", "x509", "-noout", "-enddate", "-in", str(cert)],
                         check=True, capture_output=True, text=True).stdout
    return ssl.cert_time_to_seconds(out.strip().partition("=")[2])


def der(cert):
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def client_ctx(version=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    if version:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def tls_connect(port, version=None):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return client_ctx(version).wrap_socket(s)


def served_cert(port):
    """The DER certificate a new TLS connection to port is given."""
    with tls_connect(port) as t:
        return t.getpeercert(binary_form=True)


def tls_get(t, path="/v1/models"):
    """One HTTP/1.1 keep-alive request on an open TLS socket: the status."""
    t.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = t.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int([ln.split(b":")[1] for ln in head.split(b"\r\n")
                  if ln.lower().startswith(b"content-length:")][0])
    while len(rest) < length:
        rest += t.recv(65536)
    return int(head.split()[1])


def replace(src, dst):
    """Put src's content at dst the way certificate tools do: write aside, rename over."""
    tmp = dst.with_suffix(".new")
    tmp.write_bytes(src.read_bytes())
    os.replace(tmp, dst)


def run_kvgate(*args, env=None, cwd=None):
    p = subprocess.run([str(binary("kvgate")), *args], capture_output=True, timeout=20,
                       env=child_env(env), stdin=subprocess.DEVNULL, cwd=cwd)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


# ---- TLS: reload, settings, expiry ---------------------------------------------------------------


def test_sighup_reloads_certificate_and_keeps_it_on_bad_files(simworker, kvgate, tmp_path):
    first = make_cert(tmp_path, "first", "kvgate-first", days=2)
    second = make_cert(tmp_path, "second", "kvgate-second", days=30)
    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    replace(first[0], live_cert)
    replace(first[1], live_key)
    gw = kvgate(simworker(time_scale=0), tls=(live_cert, live_key))
    assert served_cert(gw.port) == der(first[0])
    assert "subject /CN=kvgate-first" in gw.log()
    expiry = "kvgate_tls_certificate_expiry_timestamp_seconds"
    assert gw.metric(expiry, listener="front") == not_after(first[0])

    # A connection open across the reload keeps its session (and its certificate).
    old = tls_connect(gw.port)
    assert tls_get(old) == 200
    replace(second[0], live_cert)
    replace(second[1], live_key)
    gw.reload()
    assert wait_for(lambda: "subject /CN=kvgate-second" in gw.log(), 5), gw.log()[-2000:]
    assert served_cert(gw.port) == der(second[0])
    assert gw.metric(expiry, listener="front") == not_after(second[0])
    assert tls_get(old) == 200
    assert old.getpeercert(binary_form=True) == der(first[0])
    old.close()

    # A bad replacement (garbage certificate; then a key of another certificate) is refused:
    # the log says why and new connections still get the second certificate.
    live_cert.write_text("not a certificate\n")
    gw.reload()
    assert wait_for(lambda: "TLS reload failed" in gw.log(), 5)
    assert "cannot load certificate" in gw.log()
    assert served_cert(gw.port) == der(second[0])
    replace(second[0], live_cert)
    replace(first[1], live_key)
    n = gw.log().count("TLS reload failed")
    gw.reload()
    assert wait_for(lambda: gw.log().count("TLS reload failed") == n + 1, 5)
    assert "cannot load private key" in gw.log() and "key values mismatch" in gw.log()
    assert served_cert(gw.port) == der(second[0])
    assert gw.metric(expiry, listener="front") == not_after(second[0])
    assert gw.alive()


def test_reloads_racing_handshakes(simworker, kvgate, tmp_path):
    """SIGHUPs that swap the certificate while other threads handshake and send requests: every
    handshake completes with one of the two certificates and every request is answered (the
    context swap is safe across the gateway's threads; run under ASan in CI)."""
    import threading
    a = make_cert(tmp_path, "a", "kvgate-a")
    b = make_cert(tmp_path, "b", "kvgate-b")
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    replace(a[0], cert)
    replace(a[1], key)
    gw = kvgate(simworker(time_scale=0), tls=(cert, key), threads=2)
    allowed = {der(a[0]), der(b[0])}
    seen, errors, stop = set(), [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                with tls_connect(gw.port) as t:
                    seen.add(t.getpeercert(binary_form=True))
                    assert tls_get(t) == 200
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(20):
        src = b if i % 2 == 0 else a
        replace(src[0], cert)
        replace(src[1], key)
        gw.reload()  # one at a time: signals sent while one is handled coalesce
        assert wait_for(lambda: gw.log().count("configuration reloaded") == i + 1, 5)
    stop.set()
    for t in threads:
        t.join(10)
    assert not errors, errors[:3]
    assert seen and seen <= allowed
    assert gw.log().count("TLS certificate") == 21
    assert "TLS reload failed" not in gw.log()


def test_admin_listener_certificate_reloads_too(tmp_path):
    """A TLS admin listener (config only: the kvgate fixture sets --admin-listen) reloads like a
    front one, and its expiry has its own label."""
    first = make_cert(tmp_path, "adm1", "kvgate-admin-1", days=3)
    second = make_cert(tmp_path, "adm2", "kvgate-admin-2", days=9)
    cert, key = tmp_path / "admin.pem", tmp_path / "admin.key"
    replace(first[0], cert)
    replace(first[1], key)
    cfg = tmp_path / "admin-tls.json"
    cfg.write_text(json.dumps({
        "listen": ["127.0.0.1:0"], "state_dir": str(tmp_path / "state"), "access_log": "off",
        "admin": {"listen": [{"address": "127.0.0.1:0", "tls_cert": str(cert),
                              "tls_key": str(key), "cleartext": False}]}}))
    ports, log = tmp_path / "admin-tls.ports", tmp_path / "admin-tls.log"
    token = "ops-admin-token-0123456789abcdef"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary("kvgate")), "-c", str(cfg), "--port-file", str(ports)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=child_env({"KVGATE_ADMIN_TOKEN": token,
                                               "KVGATE_SECRET": "s" * 40}))
    try:
        assert wait_for(lambda: read_port_file(ports), 10), log.read_text()
        admin = read_port_file(ports)["admin"][0]
        assert served_cert(admin) == der(first[0])

        def expiry():
            r = http.get(f"https://127.0.0.1:{admin}/metrics",
                         headers={"authorization": f"Bearer {token}"})
            line = [ln for ln in r.text.splitlines()
                    if ln.startswith("kvgate_tls_certificate_expiry_timestamp_seconds{")]
            assert len(line) == 1 and 'listener="admin"' in line[0], line
            return float(line[0].rpartition(" ")[2])

        assert expiry() == not_after(first[0])
        replace(second[0], cert)
        replace(second[1], key)
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "subject /CN=kvgate-admin-2" in log.read_text(), 5)
        assert served_cert(admin) == der(second[0])
        assert expiry() == not_after(second[0])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text()


def test_min_version_13_refuses_tls12(simworker, kvgate, tls_cert):
    gw = kvgate(simworker(time_scale=0), tls=tls_cert, config={"tls": {"min_version": "1.3"}})
    with pytest.raises(ssl.SSLError):
        tls_connect(gw.port, ssl.TLSVersion.TLSv1_2).close()
    with tls_connect(gw.port, ssl.TLSVersion.TLSv1_3) as t:
        assert t.version() == "TLSv1.3"
        assert tls_get(t) == 200
    # The default floor is 1.2, with the configured TLS 1.2 ciphers only.
    gw2 = kvgate(simworker(time_scale=0), tls=tls_cert, name="kvgate-ciphers",
                 config={"tls": {"ciphers": "ECDHE+CHACHA20"}})
    with tls_connect(gw2.port, ssl.TLSVersion.TLSv1_2) as t:
        assert t.version() == "TLSv1.2" and "CHACHA20" in t.cipher()[0]


def test_tls_settings_are_checked(tmp_path, tls_cert):
    base = {"listen": [{"address": "127.0.0.1:0", "tls_cert": str(tls_cert[0]),
                        "tls_key": str(tls_cert[1])}],
            "admin": {"listen": ["127.0.0.1:0"]}, "state_dir": str(tmp_path / "state")}
    bad = {
        "version": ({"min_version": "1.1"}, "tls.min_version: must be 1.2 or 1.3"),
        "ciphers": ({"ciphers": "NO-SUCH-CIPHER"}, "tls.ciphers: \"NO-SUCH-CIPHER\" matches no"),
        "suite": ({"ciphersuites": "TLS_AES_256_GCM_SHA384:TLS_NOPE"},
                  "tls.ciphersuites: unknown TLS 1.3 suite \"TLS_NOPE\""),
    }
    for name, (tls, needle) in bad.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({**base, "tls": tls}))
        rc, out, err = run_kvgate("--check-config", "-c", str(f))
        assert rc != 0 and needle in err, (name, err)
    f = tmp_path / "good.json"
    f.write_text(json.dumps({**base, "tls": {"min_version": "1.3",
                                             "ciphersuites": "TLS_AES_128_GCM_SHA256"}}))
    rc, out, err = run_kvgate("--check-config", "-c", str(f))
    assert rc == 0 and "1 TLS certificates" in out, err


def test_reload_with_bad_tls_settings_keeps_the_running_context(simworker, kvgate, tls_cert):
    gw = kvgate(simworker(time_scale=0), tls=tls_cert, config={})
    gw.write_config({"tls": {"ciphersuites": "TLS_NOPE"}})
    gw.reload()
    assert wait_for(lambda: "TLS reload failed" in gw.log(), 5)
    assert "TLS_NOPE" in gw.log()
    with tls_connect(gw.port, ssl.TLSVersion.TLSv1_3) as t:
        assert tls_get(t) == 200


# ---- --check-config runs start-up's checks -----------------------------------------------------


def test_check_config_runs_the_start_up_checks(tmp_path, tls_cert):
    state = tmp_path / "state"
    env = {"KVGATE_SECRET": "s" * 32}

    def check(cfg, env=env):
        f = tmp_path / "c.json"
        f.write_text(json.dumps({"state_dir": str(state), **cfg}))
        return run_kvgate("--check-config", "-c", str(f), env=env, cwd=tmp_path)

    tls = {"address": "127.0.0.1:0", "tls_cert": str(tls_cert[0]), "tls_key": str(tls_cert[1])}
    rc, out, err = check({"listen": [tls]})
    assert rc == 0 and "configuration ok" in out, err
    assert not state.exists(), "--check-config must create nothing"
    cases = {
        "missing certificate": ({"listen": [{**tls, "tls_cert": str(tmp_path / "no.pem")}]},
                                env, "cannot load certificate " + str(tmp_path / "no.pem")),
        "missing key": ({"listen": [{**tls, "tls_key": str(tmp_path / "no.key")}]},
                        env, "cannot load private key"),
        "admin certificate": ({"admin": {"listen": [{**tls, "tls_cert": "/nonexistent.pem"}]}},
                              env, "admin listener 127.0.0.1:0: cannot load certificate"),
        "short KVGATE_SECRET": ({}, {"KVGATE_SECRET": "short-secret"},
                                "the server secret from KVGATE_SECRET is 12 characters: it "
                                "must be at least 32"),
        "short secret in the file": ({"secret": "x" * 31}, {"KVGATE_SECRET": ""},
                                     "secret: must be at least 32 characters"),
        "state directory is a file": ({"state_dir": str(tls_cert[0])}, env,
                                      "is not a directory"),
        "admin token with a space": ({}, {**env, "KVGATE_ADMIN_TOKEN": "has a space"},
                                     "KVGATE_ADMIN_TOKEN: must not contain spaces"),
        "access log folder missing": ({"access_log": str(tmp_path / "nodir" / "access.log")},
                                      env, f"access log {tmp_path}/nodir/access.log: cannot "
                                      f"create it in {tmp_path}/nodir"),
    }
    for name, (cfg, e, needle) in cases.items():
        rc, out, err = check(cfg, e)
        assert rc != 0, (name, out)
        assert needle in err, (name, err)
    # A secret file in the state directory that start-up would refuse.
    state.mkdir()
    (state / "secret").write_text("0123456789abcdef0123\n")
    rc, out, err = check({}, {"KVGATE_SECRET": ""})
    assert rc != 0 and "state directory's secret file is 20 characters" in err, err
    # ... and the gateway itself refuses it with the same words.
    rc, out, err = run_kvgate("-c", str(tmp_path / "c.json"), "--listen", "127.0.0.1:0",
                              "--admin-listen", "127.0.0.1:0", env={"KVGATE_SECRET": ""},
                              cwd=tmp_path)
    assert rc != 0 and "state directory's secret file is 20 characters" in out + err
    (state / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    rc, out, err = check({}, {"KVGATE_SECRET": ""})
    assert rc == 0, err


# ---- shutdown: ready delay, readiness, front probe paths ---------------------------------------


def test_sigterm_ready_delay_keeps_serving_then_drains(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(sw, config={"shutdown_ready_delay_ms": 1500, "probes": {"front_readyz": "/rz"}})
    assert wait_for(lambda: http.get(gw.admin_url + "/readyz").status_code == 200, 5)
    t0 = time.monotonic()
    gw.signal(signal.SIGTERM)
    assert wait_for(lambda: http.get(gw.admin_url + "/readyz").status_code == 503, 1)
    assert http.get(gw.url + "/rz").status_code == 503
    # Still serving: new connections are accepted and requests answered.
    n = 0
    while time.monotonic() - t0 < 1.0:
        r = http.post(gw.url + COMPL, json={"prompt": "x", "max_tokens": 1}, timeout=5)
        assert r.status_code == 200
        n += 1
    assert n > 0 and gw.alive()
    assert http.get(gw.admin_url + "/healthz").status_code == 200  # alive all along
    gw.close_admin()
    assert gw.proc.wait(10) == 0
    took = time.monotonic() - t0
    assert 1.4 < took < 6, took
    log = gw.log()
    assert "SIGTERM: not ready; still serving for 1500 ms" in log
    assert "SIGTERM: draining" in log


def test_second_signal_during_ready_delay_stops_at_once(simworker, kvgate):
    gw = kvgate(simworker(time_scale=0), config={"shutdown_ready_delay_ms": 60000})
    gw.signal(signal.SIGTERM)
    assert wait_for(lambda: "not ready; still serving" in gw.log(), 5)
    t0 = time.monotonic()
    gw.signal(signal.SIGTERM)
    gw.close_admin()
    assert gw.proc.wait(5) == 0
    assert time.monotonic() - t0 < 3
    assert "stopping now" in gw.log()


def test_healthz_stays_up_while_idle(kvgate):
    """/healthz checks that every front thread's loop turns (pinged each second, failing after
    10 s without an answer): an idle gateway must stay live past that."""
    gw = kvgate(threads=3)
    assert http.get(gw.admin_url + "/healthz").json() == {"status": "ok"}
    time.sleep(11.5)
    r = http.get(gw.admin_url + "/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text


def test_readiness_without_workers_is_a_setting(kvgate):
    gw = kvgate()  # no worker
    r = http.get(gw.admin_url + "/readyz")
    assert r.status_code == 503 and r.json()["reason"] == "no workers registered"
    gw2 = kvgate(name="kvgate-lenient", config={"probes": {"ready_requires_worker": False}})
    r = http.get(gw2.admin_url + "/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready", r.text


def test_front_probe_paths(simworker, kvgate):
    # Off by default: the front knows no such path.
    gw = kvgate(auth="keys")
    assert http.get(gw.url + "/healthz").status_code == 404
    gw2 = kvgate(name="kvgate-probes", auth="keys",
                 config={"probes": {"front_healthz": "/healthz", "front_readyz": "/lb/ready"}})
    # No API key needed; the admin module's answers.
    r = http.get(gw2.url + "/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert r.headers["cache-control"] == "no-store"
    r = http.get(gw2.url + "/lb/ready?x=1")
    assert r.status_code == 503 and r.json()["reason"] == "no workers registered"
    with httpx.Client(http2=True, http1=False) as h2:  # HTTP/2 with prior knowledge
        r = h2.get(gw2.url + "/healthz")
        assert r.http_version == "HTTP/2" and r.json() == {"status": "ok"}
    r = http._call("HEAD", gw2.url + "/healthz")
    assert r.status_code == 200 and r.content == b""
    assert http.post(gw2.url + "/healthz", json={}).status_code == 405
    # Other paths still go through the proxy (and its authentication).
    assert http.get(gw2.url + "/v1/models").status_code == 401
    assert http.get(gw2.url + "/readyz").status_code == 404
    bad = {"probes": {"front_healthz": "healthz"}}
    rc, _, err = run_kvgate("--check-config", "-c", write(gw2, "bad-probe", bad))
    assert rc != 0 and "probes.front_healthz: must be an absolute path" in err, err
    same = {"probes": {"front_healthz": "/h", "front_readyz": "/h"}}
    rc, _, err = run_kvgate("--check-config", "-c", write(gw2, "same-probe", same))
    assert rc != 0 and "front_readyz: must differ from front_healthz" in err, err


def write(gw, name, cfg):
    path = gw.log_path.parent / f"{name}.json"
    path.write_text(json.dumps({"state_dir": str(gw.log_path.parent / "check-state"), **cfg}))
    return str(path)
