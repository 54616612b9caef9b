# SPDX-License-Identifier: Apache-2.0
"""One schema per resource (issue 10): the same value given through every entry point that can
take it - the config file (kvgate --check-config -c), a flag (--worker, --threads ...), the admin
API on a running gateway, a state file restored at start, and kvgate admin - gets the same
verdict, and a bad one the same message: "field: problem", after whatever the entry point puts
in front ("FILE: workers[0].", "--worker w1 (k=v): ", "state file ...: workers: worker "w1": ",
"kvgate admin: 400: "). Every entry point words a problem the same way (docs/configuration.md,
"Fields and messages")."""

import json
import signal
import subprocess
import time

import pytest

from conftest import ADMIN_TOKEN, TEST_SECRET, binary, child_env, read_port_file

W = "w1"
URL = "http://127.0.0.1:1"


def run(*args, timeout=20):
    p = subprocess.run([str(binary("kvgate")), *args], capture_output=True, timeout=timeout,
                       env=child_env({"KVGATE_ADMIN_TOKEN": ADMIN_TOKEN}),
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def core(msg, field):
    """The message from the field on ("kv_blocks: must be ..."), first line; None if absent."""
    msg = msg.strip().splitlines()[0] if msg.strip() else ""
    at = msg.rfind(field + ": ")
    return msg[at:] if at >= 0 else None


# ---- entry points -----------------------------------------------------------------------------


def via_config(tmp_path, config):
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps(config))
    rc, _, err = run("--check-config", "-c", str(f))
    return rc == 0, err


def via_flags(*flags):
    rc, _, err = run("--check-config", *flags)
    return rc == 0, err


def via_state(tmp_path, state):
    """Start a gateway on a state file; (started, error log). A started one is stopped."""
    d = tmp_path / "state"
    d.mkdir(exist_ok=True)
    (d / "state.json").write_text(json.dumps({"version": 1, **state}))
    ports, log = tmp_path / "state.ports", tmp_path / "state.log"
    ports.unlink(missing_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary("kvgate")), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--port-file", str(ports), "--state", str(d), "--threads", "1", "--auth", "open",
             "--access-log", "off"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
            env=child_env({"KVGATE_ADMIN_TOKEN": ADMIN_TOKEN, "KVGATE_SECRET": TEST_SECRET}))
    deadline = time.monotonic() + 20
    while proc.poll() is None and not read_port_file(ports) and time.monotonic() < deadline:
        time.sleep(0.01)
    started = proc.poll() is None
    if started:
        proc.send_signal(signal.SIGTERM)
    proc.wait(20)
    text = log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if "cannot restore the state file" in line]
    return started, errors[0] if errors else text


def via_admin(gw, path, body):
    r = gw.admin.put(path, json=body)
    ok = r.status_code in (200, 201)
    return ok, "" if ok else r.json()["error"]["message"]


def via_cli(gw, *args):
    argv = [str(binary("kvgate")), "admin", "--url", gw.admin_url, "--token", gw.token, *args]
    p = subprocess.run(argv, capture_output=True, timeout=20)
    return p.returncode == 0, p.stderr.decode().removeprefix("kvgate admin: ").removeprefix(
        "400: ")


@pytest.fixture
def gw(kvgate):
    return kvgate(auth="keys")


def agree(results, field, want):
    """results: {entry point: (accepted, message)}. want None: all accept; else every message's
    core is want."""
    for where, (ok, msg) in results.items():
        if want is None:
            assert ok, (where, msg)
        else:
            assert not ok, (where, "accepted")
            assert core(msg, field) == want, (where, msg)


# ---- workers ----------------------------------------------------------------------------------

# (field, JSON value, key=value text or None where the form cannot say it, message or None)
WORKER_CASES = [
    ("kv_blocks", 4096, "4096", None),
    ("kv_blocks", 0, "0", None),
    ("max_inflight", 0, "0", None),  # the gateway default, everywhere (the flag took 1..1e6)
    ("max_inflight", 4294967295, "4294967295", None),
    ("kv_blocks", -1, "-1", "kv_blocks: must be an integer in 0..4294967295"),
    ("kv_blocks", 1.5, "1.5", "kv_blocks: must be an integer in 0..4294967295"),
    ("kv_blocks", 4294967296, "4294967296", "kv_blocks: must be an integer in 0..4294967295"),
    ("kv_blocks", "many", "many", "kv_blocks: must be an integer in 0..4294967295, not string"),
    ("max_inflight", -5, "-5", "max_inflight: must be an integer in 0..4294967295"),
    ("models", ["a", "a"], ["a", "a"], "models[1]: duplicate of models[0]"),
    ("models", [""], [""], "models[0]: must not be empty"),
    ("models", [f"m{i}" for i in range(65)], [f"m{i}" for i in range(65)],
     "models: more than 64 models"),
    ("cache_salt", False, "off", None),
    ("cache_salt", "maybe", "maybe", "cache_salt: must be true or false, not string"),
    ("url", "https://127.0.0.1:1", "https://127.0.0.1:1",
     "url: https is not supported; workers are reached over cleartext HTTP (http://host:port)"),
    ("url", "http://127.0.0.1", "http://127.0.0.1",
     "url: missing port (expected http://host:port)"),
    ("kv_events", "tcp://10.0.0.11:5557", "tcp://10.0.0.11:5557", None),
    ("kv_events_replay", "ipc:///run/vllm/replay", "ipc:///run/vllm/replay", None),
    ("kv_events", "http://10.0.0.11:5557", "http://10.0.0.11:5557",
     "kv_events: must be a ZeroMQ endpoint: tcp://host:port or ipc://path"),
    ("kv_events_replay", "tcp://", "tcp://",
     "kv_events_replay: must be a ZeroMQ endpoint: tcp://host:port or ipc://path"),
]


def worker_flag(field, text):
    if field == "url":
        return f"{W}={text}"
    if field == "models":
        return ",".join([f"{W}={URL}"] + [f"model={m}" for m in text])
    return f"{W}={URL},{field}={text}"


def cli_worker_args(field, text):
    url = text if field == "url" else URL
    args = ["workers", "put", W, url]
    if field == "models":
        for m in text:
            args += ["--model", m]
    elif field == "cache_salt":
        return None if text not in ("on", "off") else args + [
            "--cache-salt" if text == "on" else "--no-cache-salt"]
    elif field != "url":
        args += [f"--{field.replace('_', '-')}", text]
    return args


@pytest.mark.parametrize("field,value,text,want", WORKER_CASES,
                         ids=[f"{c[0]}={str(c[1])[:20]}" for c in WORKER_CASES])
def test_worker_field_everywhere(tmp_path, gw, field, value, text, want):
    obj = {"url": URL, field: value}
    results = {
        "config": via_config(tmp_path, {"workers": [{"name": W, **obj}]}),
        "flag": via_flags("--worker", worker_flag(field, text)),
        "admin": via_admin(gw, f"/admin/v1/workers/{W}", obj),
        "state": via_state(tmp_path, {"workers": [{"name": W, **obj}]}),
    }
    args = cli_worker_args(field, text)
    if args:
        results["cli"] = via_cli(gw, *args)
    agree(results, field if field != "models" or not want else want.split(":")[0], want)
    if want is None:  # the same definition wherever it went in
        w = gw.admin.get(f"/admin/v1/workers/{W}").json()
        shown = w[field]
        if field == "max_inflight" and value == 0:
            value = 1024  # shown as the effective limit
        assert shown == value, w


def test_worker_unknown_field_everywhere(tmp_path, gw):
    results = {
        "config": via_config(tmp_path, {"workers": [{"name": W, "url": URL, "gpu": 1}]}),
        "flag": via_flags("--worker", f"{W}={URL},gpu=1"),
        "state": via_state(tmp_path, {"workers": [{"name": W, "url": URL, "gpu": 1}]}),
        "admin": via_admin(gw, f"/admin/v1/workers/{W}", {"url": URL, "gpu": 1}),
    }
    agree(results, "gpu", "gpu: unknown field")


def test_worker_unknown_field_outside_the_admin_api(tmp_path):
    results = {
        "config": via_config(tmp_path, {"workers": [{"name": W, "url": URL, "gpu": 1}]}),
        "flag": via_flags("--worker", f"{W}={URL},gpu=1"),
        "state": via_state(tmp_path, {"workers": [{"name": W, "url": URL, "gpu": 1}]}),
    }
    agree(results, "gpu", "gpu: unknown field")


def test_worker_without_url_everywhere(tmp_path, gw):
    results = {
        "config": via_config(tmp_path, {"workers": [{"name": W}]}),
        "state": via_state(tmp_path, {"workers": [{"name": W}]}),
        "admin": via_admin(gw, f"/admin/v1/workers/{W}", {}),
    }
    agree(results, "url", "url: required")


# ---- models -----------------------------------------------------------------------------------

M = "org/m"  # a model's name may hold a slash: percent-encoded in the admin path
MODEL_PATH = "/admin/v1/models/org%2Fm"
# The smallest tokenizer.json the model loader takes.
TOKENIZER_JSON = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
    "post_processor": None, "decoder": None,
    "model": {"type": "BPE", "dropout": None, "unk_token": None,
              "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
              "byte_fallback": False, "vocab": {"a": 0, "b": 1}, "merges": []},
}

# (field, JSON value, kvgate admin option text or None where it cannot say it, message or None)
MODEL_CASES = [
    ("block_size", 32, "32", None),
    ("block_size", 4096, "4096", None),
    ("hash_algo", "xxhash_cbor", "xxhash_cbor", None),
    ("hash_seed", "12345", "12345", None),
    ("token_cache_mib", 0, "0", None),
    ("token_cache_mib", 65537, "65537", "token_cache_mib: must be an integer in 0..65536"),
    ("block_size", 0, "0", "block_size: must be an integer in 1..4096"),
    ("block_size", 4097, "4097", "block_size: must be an integer in 1..4096"),
    ("block_size", 1.5, "1.5", "block_size: must be an integer in 1..4096"),
    ("block_size", -1, "-1", "block_size: must be an integer in 1..4096"),
    ("hash_algo", "sha256", "sha256",
     "hash_algo: must be sha256_cbor or xxhash_cbor, not \"sha256\" (vLLM's sha256 and xxhash "
     "hash Python pickle bytes, which nothing outside the engine can reproduce: start the "
     "engine with --prefix-caching-hash-algo sha256_cbor)"),
    ("tokenizer_config", "rel/tokenizer_config.json", "rel/tokenizer_config.json",
     "tokenizer_config: must be an absolute path"),
    ("chat_template", "t.jinja", "t.jinja", "chat_template: must be an absolute path"),
    ("hash_seed", 0, None, "hash_seed: must be a string, not number"),
    ("tokenizer", "tokenizer.json", "tokenizer.json", "tokenizer: must be an absolute path"),
]


@pytest.fixture
def tokenizer_file(tmp_path):
    f = tmp_path / "tokenizer.json"
    f.write_text(json.dumps(TOKENIZER_JSON))
    return str(f)


@pytest.mark.parametrize("field,value,text,want", MODEL_CASES,
                         ids=[f"{c[0]}={str(c[1])[:20]}" for c in MODEL_CASES])
def test_model_field_everywhere(tmp_path, gw, tokenizer_file, field, value, text, want):
    obj = {"tokenizer": tokenizer_file, "hash_seed": "0", field: value}
    results = {
        "config": via_config(tmp_path, {"models": [{"name": M, **obj}]}),
        "admin": via_admin(gw, MODEL_PATH, obj),
        "state": via_state(tmp_path, {"models": [{"name": M, **obj}]}),
    }
    if text is not None:
        tok = text if field == "tokenizer" else tokenizer_file
        args = ["models", "put", M, tok]
        if field != "hash_seed":
            args += ["--hash-seed", "0"]
        if field != "tokenizer":
            args += [f"--{field.replace('_', '-')}", text]
        results["cli"] = via_cli(gw, *args)
    agree(results, field, want)
    if want is None:  # the same definition wherever it went in
        m = gw.admin.get(MODEL_PATH).json()
        assert m[field] == value, m


def test_model_unknown_and_missing_fields_everywhere(tmp_path, gw, tokenizer_file):
    base = {"tokenizer": tokenizer_file, "hash_seed": "0"}
    results = {
        "config": via_config(tmp_path, {"models": [{"name": M, **base, "gpu": 1}]}),
        "state": via_state(tmp_path, {"models": [{"name": M, **base, "gpu": 1}]}),
        "admin": via_admin(gw, MODEL_PATH, {**base, "gpu": 1}),
    }
    agree(results, "gpu", "gpu: unknown field")
    results = {
        "config": via_config(tmp_path, {"models": [{"name": M, "tokenizer": tokenizer_file}]}),
        "state": via_state(tmp_path, {"models": [{"name": M, "tokenizer": tokenizer_file}]}),
        "admin": via_admin(gw, MODEL_PATH, {"tokenizer": tokenizer_file}),
        "cli": via_cli(gw, "models", "put", M, tokenizer_file),
    }
    agree(results, "hash_seed", "hash_seed: required")
    results = {
        "config": via_config(tmp_path, {"models": [{"name": M, "hash_seed": "0"}]}),
        "state": via_state(tmp_path, {"models": [{"name": M, "hash_seed": "0"}]}),
        "admin": via_admin(gw, MODEL_PATH, {"hash_seed": "0"}),
    }
    agree(results, "tokenizer", "tokenizer: required")


# ---- tenants ----------------------------------------------------------------------------------

T = "acme"

# (JSON members, kvgate admin options, field, message or None)
TENANT_CASES = [
    ({"rate": {"rps": 0.5, "burst": 10}, "max_inflight": 8}, ["--rps", "0.5", "--burst", "10",
                                                             "--max-inflight", "8"], "", None),
    ({"sharing": "group", "group": "g1"}, ["--sharing", "group:g1"], "", None),
    ({"sharing": "group", "group": "g1"}, ["--sharing", "group", "--group", "g1"], "", None),
    ({"rate": {"burst": 0.5}}, ["--burst", "0.5"], "rate.burst",
     "rate.burst: must be 0 (the default) or at least 1"),
    ({"sharing": "group", "group": "a b"}, ["--sharing", "group:a b"], "group",
     "group: invalid character 0x20 (allowed: A-Z a-z 0-9 . _ -)"),
    ({"models": ["m", "m"]}, ["--model", "m", "--model", "m"], "models[1]",
     "models[1]: duplicate of models[0]"),
    ({"sharing": "group"}, ["--sharing", "group"], "group",
     "group: required when sharing is \"group\""),
    ({"rate": {"rps": -1}}, ["--rps", "-1"], "rate.rps", "rate.rps: must be a number in 0..1e15"),
    ({"rate": {"prompt_bytes_per_s": 2e15}}, ["--prompt-bytes-per-s", "2e15"],
     "rate.prompt_bytes_per_s", "rate.prompt_bytes_per_s: must be a number in 0..1e15"),
    ({"max_inflight": 1.5}, ["--max-inflight", "1.5"], "max_inflight",
     "max_inflight: must be an integer in 0..4294967295"),
    ({"sharing": "shared"}, ["--sharing", "shared"], "sharing",
     "sharing: must be isolated, group or global"),
]


@pytest.mark.parametrize("members,options,field,want", TENANT_CASES)
def test_tenant_field_everywhere(tmp_path, gw, members, options, field, want):
    results = {
        "admin": via_admin(gw, f"/admin/v1/tenants/{T}", members),
        "state": via_state(tmp_path, {"tenants": [{"id": T, "sharing": "isolated", **members}]}),
        "cli": via_cli(gw, "tenants", "put", T, *options),
    }
    agree(results, field, want)
    if want is None:
        t = gw.admin.get(f"/admin/v1/tenants/{T}").json()
        for k, v in members.items():
            assert t[k] == v if not isinstance(v, dict) else all(
                t[k][m] == x for m, x in v.items()), t


# ---- policy -----------------------------------------------------------------------------------

# (field, JSON value, option text, message or None)
POLICY_CASES = [
    ("load_factor", 0.25, "0.25", None),
    ("block_bytes", 128, "128", None),
    ("block_bytes", 15, "15", "block_bytes: must be an integer in 16..65536"),
    ("block_bytes", 1.5, "1.5", "block_bytes: must be an integer in 16..65536"),
    ("load_factor", -1, "-1", "load_factor: must be a number in 0..100"),
    ("load_factor", 101, "101", "load_factor: must be a number in 0..100"),
    ("kv_usage_cost", "high", "high", "kv_usage_cost: must be a number in 0..1e12, not string"),
    ("policy", "fastest", "fastest", "policy: unknown policy \"fastest\" (one of least_loaded, "
     "round_robin, random, cost, prefix_only)"),
]


@pytest.mark.parametrize("field,value,text,want", POLICY_CASES)
def test_policy_field_everywhere(tmp_path, gw, field, value, text, want):
    cli_args = ["policy", "set", text] if field == "policy" else [
        "policy", "set", f"--{field.replace('_', '-')}", text]
    results = {
        "admin": via_admin(gw, "/admin/v1/policy", {field: value}),
        "state": via_state(tmp_path, {"policy": {field: value}}),
        "cli": via_cli(gw, *cli_args),
    }
    agree(results, field, want)
    if want is None:
        assert gw.admin.get("/admin/v1/policy").json()[field] == value


# ---- the config file's own sections and their flags -------------------------------------------


@pytest.mark.parametrize("field,flag,value,want", [
    ("threads", "--threads", 3, None),
    ("log_level", "--log-level", "debug", None),
    ("auth", "--auth", "open", None),
    ("log_level", "--log-level", "loud", "must be error, warn, info or debug"),
    ("auth", "--auth", "none", "must be keys or open"),
    ("threads", "--threads", "lots", "must be an integer in 0..1024, not string"),
    ("state_dir", "--state", "", "must be a non-empty string"),
    ("threads", "--threads", 5000, "must be an integer in 0..1024"),
])
def test_config_field_and_flag(tmp_path, field, flag, value, want):
    """A setting of the file and its flag: the same verdict and problem, each named its way
    (the file by the key, the flag by itself)."""
    results = {"config": via_config(tmp_path, {field: value}), "flag": via_flags(flag, str(value))}
    for where, (ok, msg) in results.items():
        if want is None:
            assert ok, (where, msg)
        else:
            name = field if where == "config" else flag
            assert not ok and core(msg, name) == f"{name}: {want}", (where, msg)
