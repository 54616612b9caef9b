# SPDX-License-Identifier: Apache-2.0
"""deploy/: the systemd unit passes `systemd-analyze verify`, and every flag, port, path,
environment variable and probe that the unit, the Dockerfile and the Kubernetes manifests name
exists in kvgate: flags in `kvgate --help`, config files through `kvgate --check-config`,
probes answered by a started gateway, package names against the libraries build/kvgate links.
No image is built and no cluster is run here (deploy/README.md)."""
import json
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest
from conftest import REPO_ROOT, binary, child_env
from gwhelpers import http, wait_for

import miniyaml

try:
    import yaml
except ImportError:  # the minimal reader then stands alone
    yaml = None

DEPLOY = REPO_ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "kvgate.service"
UNIT_CONFIG = DEPLOY / "systemd" / "kvgate.json"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
MANIFESTS = DEPLOY / "kubernetes" / "kvgate.yaml"


def help_text():
    p = subprocess.run([str(binary("kvgate")), "--help"], capture_output=True, text=True,
                       timeout=10, env=child_env())
    assert p.returncode == 0
    return p.stdout


def known_flags():
    text = help_text()
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", text))


def check_argv(argv, where):
    """Every option in argv is one kvgate --help lists; returns {flag: value}."""
    flags = known_flags()
    out = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        assert a.startswith("-"), f"{where}: stray argument {a!r}"
        assert a in flags, f"{where}: {a} is not a kvgate flag"
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out[a] = argv[i + 1]
            i += 2
        else:
            out[a] = True
            i += 1
    return out


def check_config(config: dict, tmp_path, env=None):
    """kvgate --check-config on config (state directory moved into tmp_path): (rc, stderr)."""
    cfg = dict(config)
    cfg["state_dir"] = str(tmp_path / "check-state")
    f = tmp_path / "deploy-check.json"
    f.write_text(json.dumps(cfg))
    p = subprocess.run([str(binary("kvgate")), "--check-config", "-c", str(f)],
                       capture_output=True, text=True, timeout=20,
                       env=child_env({"KVGATE_SECRET": "", "KVGATE_ADMIN_TOKEN": "", **(env or {})}))
    return p.returncode, p.stdout + p.stderr


def listen_ports(config):
    def port(addr):
        return int((addr if isinstance(addr, str) else addr["address"]).rpartition(":")[2])
    return ([port(a) for a in config.get("listen", ["0.0.0.0:8080"])],
            [port(a) for a in config.get("admin", {}).get("listen", ["127.0.0.1:9090"])])


# ---- systemd -----------------------------------------------------------------------------------


def unit_directives(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


def test_systemd_unit_verifies(tmp_path):
    tool = shutil.which("systemd-analyze")
    if not tool:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    # verify checks that ExecStart's binary exists: point it at the build's.
    unit = tmp_path / "kvgate.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/kvgate", str(binary("kvgate"))))
    p = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    mine = [ln for ln in (p.stdout + p.stderr).splitlines() if "kvgate" in ln]
    assert p.returncode == 0 and not mine, p.stdout + p.stderr


def test_systemd_unit_names_what_kvgate_has(tmp_path):
    d = unit_directives(UNIT.read_text())
    for key, want in {"NoNewPrivileges": "yes", "ProtectSystem": "strict",
                      "ProtectHome": "yes", "PrivateTmp": "yes", "DynamicUser": "yes",
                      "StateDirectory": "kvgate", "KillSignal": "SIGTERM"}.items():
        assert d.get(key) == [want], (key, d.get(key))
    assert int(d["LimitNOFILE"][0]) >= 65536
    state = "/var/lib/" + d["StateDirectory"][0]
    config = json.loads(UNIT_CONFIG.read_text())
    for key in ("ExecStart", "ExecStartPre"):
        argv = shlex.split(d[key][0])
        assert argv[0] == "/usr/local/bin/kvgate", argv  # where meson install puts it
        flags = check_argv(argv[1:], key)
        assert flags["--state"] == state
        assert flags["-c"] == "/etc/kvgate/" + UNIT_CONFIG.name
        assert (key == "ExecStartPre") == ("--check-config" in flags)
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    # Stop waits for the ready delay and the drain before it kills.
    delay = config.get("shutdown_ready_delay_ms", 0) + config.get("shutdown_timeout_ms", 30000)
    assert int(d["TimeoutStopSec"][0]) * 1000 > delay
    rc, out = check_config(config, tmp_path, env={"KVGATE_SECRET": "s" * 32})
    assert rc == 0, out
    assert "KVGATE_ADMIN_TOKEN" in help_text() and "KVGATE_SECRET" in help_text()


# ---- Dockerfile --------------------------------------------------------------------------------


def dockerfile_instructions():
    """[(INSTRUCTION, arguments)] with continuation lines joined and comments dropped."""
    out, cur = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip().startswith("#") and not cur:
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip():
            ins, _, args = cur.strip().partition(" ")
            out.append((ins.upper(), args.strip()))
        cur = ""
    return out


def apt_packages(run_args):
    m = re.search(r"apt-get install -y --no-install-recommends (.*?)(?:&&|$)", run_args)
    return set(m.group(1).split()) if m else set()


def test_dockerfile_builds_from_debian_12_packages_kvgate_uses(tmp_path):
    ins = dockerfile_instructions()
    froms = [a for i, a in ins if i == "FROM"]
    assert len(froms) >= 2, "multi-stage"
    assert all(f.split()[0] in ("debian:12", "debian:12-slim") for f in froms), froms
    stages = [[]]
    for i, a in ins:
        if i == "FROM":
            stages.append([])
        stages[-1].append((i, a))
    build, runtime = stages[1], stages[-1]
    assert any(i == "COPY" and a.startswith("--from=build") for i, a in runtime)
    build_pkgs = set().union(*(apt_packages(a) for i, a in build if i == "RUN"))
    runtime_pkgs = set().union(*(apt_packages(a) for i, a in runtime if i == "RUN"))
    # The build stage has every -dev package the project's own scripts install for the build
    # (cmocka only builds the unit tests, which the image leaves out; clang's runtime only the
    # fuzz targets).
    lib_sh = (REPO_ROOT / "scripts" / "lib.sh").read_text()
    project = set(re.findall(r"\b(lib[a-z0-9.-]+-dev)\b", lib_sh))
    project -= {"libcmocka-dev", "libclang-rt-14-dev"}
    assert project <= build_pkgs, project - build_pkgs
    # The meson options the image sets exist.
    options = (REPO_ROOT / "meson_options.txt").read_text()
    for opt in re.findall(r"-D(\w+)=", " ".join(a for i, a in build if i == "RUN")):
        assert f"option('{opt}'" in options, opt
    # Every package named is a Debian package this machine's apt knows (Debian 12 here), when
    # apt has its lists.
    if shutil.which("apt-cache") and subprocess.run(
            ["apt-cache", "show", "libc6"], capture_output=True).returncode == 0:
        pkgs = sorted(build_pkgs | runtime_pkgs)
        p = subprocess.run(["apt-cache", "show", "--no-all-versions", *pkgs],
                           capture_output=True, text=True)
        known = set(re.findall(r"^Package: (\S+)$", p.stdout, re.M))
        assert set(pkgs) <= known, set(pkgs) - known
    # The runtime stage installs the package of every library build/kvgate links (dpkg -S).
    if not shutil.which("ldd") or not shutil.which("dpkg"):
        pytest.skip("ldd or dpkg missing: cannot map kvgate's libraries to packages")
    ldd = subprocess.run(["ldd", str(binary("kvgate"))], capture_output=True, text=True).stdout
    needed = set()
    for path in re.findall(r"=> (/\S+)", ldd):
        real = str(pathlib.Path(path).resolve())
        p = subprocess.run(["dpkg", "-S", real], capture_output=True, text=True)
        if p.returncode != 0:
            p = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if p.returncode == 0:
            needed.add(p.stdout.split(":")[0])
    needed -= {"libc6", "libgcc-s1"}  # in debian:12-slim already
    # A sanitizer build (scripts/test --sanitize) links its runtimes, the image's does not.
    sanitizers = {"libasan8", "libubsan1", "liblsan0", "libtsan2", "libstdc++6"}
    if needed & sanitizers - {"libstdc++6"}:
        needed -= sanitizers
    # A library another listed package depends on comes with it (libzmq5 brings libsodium23,
    # libpgm, libnorm1, Kerberos): apt installs it, so it need not be named.
    missing = needed - runtime_pkgs
    if missing and shutil.which("apt-cache"):
        p = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends",
                            "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
                            "--no-enhances", *sorted(runtime_pkgs)],
                           capture_output=True, text=True)
        brought = set(re.findall(r"^\s+(?:Pre)?Depends: <?([^\s>:]+)", p.stdout, re.M))
        missing -= brought
    assert needed and not missing, missing
    # Ports, entry point and command.
    exposed = {int(p) for i, a in runtime if i == "EXPOSE" for p in a.split()}
    config = miniyaml.load_all(MANIFESTS.read_text())[0]["data"]["kvgate.json"]
    front, admin = listen_ports(json.loads(config))
    assert exposed == set(front + admin), exposed
    entry = [json.loads(a) for i, a in runtime if i == "ENTRYPOINT"][0]
    cmd = [json.loads(a) for i, a in runtime if i == "CMD"][0]
    assert entry == ["/usr/local/bin/kvgate"]
    assert any(i == "RUN" and "install -D -m 0755 /build/kvgate /out/usr/local/bin/kvgate" in a
               for i, a in build)
    flags = check_argv(cmd, "CMD")
    assert flags["--state"] == "/var/lib/kvgate"
    assert ("STOPSIGNAL", "SIGTERM") in runtime
    assert (DOCKERFILE.parent / "Dockerfile.dockerignore").exists()


# ---- Kubernetes --------------------------------------------------------------------------------


def manifests():
    text = MANIFESTS.read_text()
    docs = miniyaml.load_all(text)
    if yaml is not None:
        assert docs == list(yaml.safe_load_all(text)), "miniyaml and PyYAML disagree"
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_kubernetes_manifests_name_what_kvgate_has(simworker, kvgate, tmp_path):
    docs = manifests()
    kinds = {k for k, _ in docs}
    assert {"ConfigMap", "Secret", "Deployment", "Service", "ServiceMonitor",
            "PodDisruptionBudget"} <= kinds, kinds
    cm = docs[("ConfigMap", "kvgate-config")]
    secret = docs[("Secret", "kvgate-secrets")]
    dep = docs[("Deployment", "kvgate")]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    c = pod["spec"]["containers"][0]

    # The command line, the config file it names and the volumes it lives in.
    flags = check_argv(c["args"], "args")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config_dir, config_name = flags["-c"].rsplit("/", 1)
    assert mounts["config"] == config_dir
    assert volumes["config"]["configMap"]["name"] == "kvgate-config"
    assert config_name in cm["data"]
    assert mounts["state"] == flags["--state"]
    config = json.loads(cm["data"][config_name])

    # Environment: names kvgate reads, from keys the Secret has; the values it accepts.
    env = {}
    for e in c["env"]:
        assert e["name"] in help_text(), e["name"]
        ref = e["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "kvgate-secrets" and ref["key"] in secret["stringData"]
        env[e["name"]] = secret["stringData"][ref["key"]]
    assert set(env) == {"KVGATE_ADMIN_TOKEN", "KVGATE_SECRET"}
    assert len(env["KVGATE_SECRET"]) >= 32 and len(env["KVGATE_ADMIN_TOKEN"]) >= 16
    rc, out = check_config(config, tmp_path, env=env)
    assert rc == 0, out

    # Ports: the container's are the config's listeners, on every interface.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    front, admin = listen_ports(config)
    assert ports == {"http": front[0], "admin": admin[0]}
    assert config["listen"][0].startswith("0.0.0.0:") and config["admin"]["listen"][0].startswith("0.0.0.0:")

    # Services and the ServiceMonitor point at those ports; selectors match the pods.
    services = {n: d for (k, n), d in docs.items() if k == "Service"}
    for name, svc in services.items():
        assert svc["spec"]["selector"].items() <= labels.items(), name
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, (name, p)
    sm = docs[("ServiceMonitor", "kvgate")]
    chosen = [s for s in services.values()
              if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert len(chosen) == 1
    ep = sm["spec"]["endpoints"][0]
    assert ep["port"] in {p["name"] for p in chosen[0]["spec"]["ports"]}
    assert [p["targetPort"] for p in chosen[0]["spec"]["ports"] if p["name"] == ep["port"]] == ["admin"]
    assert ep["path"] == "/metrics"
    assert ep["bearerTokenSecret"]["key"] == "admin-token"
    pdb = docs[("PodDisruptionBudget", "kvgate")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]

    # Shutdown timing: preStop, then SIGTERM's ready delay and the drain, inside the grace
    # period; readiness notices the delay before it ends.
    pre = pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[0] == "sleep"
    sleep_s = int(pre[1])
    delay_ms = config.get("shutdown_ready_delay_ms", 0)
    drain_ms = config.get("shutdown_timeout_ms", 30000)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace * 1000 >= sleep_s * 1000 + delay_ms + drain_ms, grace
    rp = c["readinessProbe"]
    assert rp["periodSeconds"] * rp["failureThreshold"] * 1000 <= delay_ms

    # The probes on a started gateway with this config: the listeners on loopback port 0, the
    # workers a simulated one, no Redis (the check above parsed its URL).
    sw = simworker(time_scale=0)
    run_cfg = {k: v for k, v in config.items() if k not in ("listen", "admin", "redis", "workers")}
    run_cfg["workers"] = [{"name": "w1", "url": sw.url}]
    gw = kvgate(config=run_cfg, env={"KVGATE_SECRET": env["KVGATE_SECRET"]})
    base = {"admin": gw.admin_url, "http": gw.url}
    for kind in ("livenessProbe", "readinessProbe"):
        g = c[kind]["httpGet"]
        url = base[g["port"]] + g["path"]
        assert wait_for(lambda: http.get(url).status_code == 200, 10), (kind, url)
        assert http.get(url).json()["status"] in ("ok", "ready")
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    r = http.get(gw.admin_url + ep["path"], headers={"authorization": f"Bearer {gw.token}"})
    assert r.status_code == 200 and "kvgate_" in r.text


def test_miniyaml_reads_what_pyyaml_reads():
    text = """# c
a: 1
b: {x: "y", z: [1, 2]}
c:
  - name: n
    v: 'q'
  - plain
d: |
  line one
  line two
e: true
---
f: null
"""
    want = [{"a": 1, "b": {"x": "y", "z": [1, 2]}, "c": [{"name": "n", "v": "q"}, "plain"],
             "d": "line one\nline two\n", "e": True}, {"f": None}]
    assert miniyaml.load_all(text) == want
    if yaml is not None:
        assert list(yaml.safe_load_all(text)) == want
    with pytest.raises(ValueError):
        miniyaml.load_all("a: &anchor 1\n")
