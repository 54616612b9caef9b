# SPDX-License-Identifier: Apache-2.0
"""kvgate admin, the operator CLI, against a running gateway: it drives tenants, keys, workers
and the policy, and its exit status says how the call went."""

import json
import os
import re
import subprocess

from conftest import binary
from gwhelpers import COMPL, http


def cli(gw, *args, token=None, env=None):
    argv = [str(binary("kvgate")), "admin", "--url", gw.admin_url,
            "--token", token or gw.token, *args]
    p = subprocess.run(argv, capture_output=True, timeout=20, env=env)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_cli_manages_tenants_keys_workers_and_policy(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(auth="keys")
    # Workers.
    rc, out, err = cli(gw, "workers", "put", "w1", sw.url, "--model", sw.model, "--kv-blocks",
                       "512")
    assert rc == 0, err
    assert json.loads(out)["kv_blocks"] == 512
    rc, out, _ = cli(gw, "workers", "list")
    assert rc == 0 and [w["name"] for w in json.loads(out)["workers"]] == ["w1"]
    # A tenant and a key that then works on the front.
    rc, out, err = cli(gw, "tenants", "put", "acme", "--sharing", "group:blue", "--model",
                       sw.model, "--rps", "100", "--max-inflight", "8")
    assert rc == 0, err
    t = json.loads(out)
    assert (t["sharing"], t["group"], t["max_inflight"]) == ("group", "blue", 8)
    rc, out, err = cli(gw, "keys", "create", "acme")
    assert rc == 0, err
    created = json.loads(out)
    key = created["key"]
    assert "not shown again" in err  # a reminder on stderr, the key alone on stdout
    r = http.post(gw.url + COMPL, json={"model": sw.model, "prompt": "x", "max_tokens": 1},
                  headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    rc, out, _ = cli(gw, "tenants", "list")
    assert rc == 0 and key not in out
    assert [k["id"] for k in json.loads(out)["tenants"][0]["keys"]] == [created["id"]]
    # The policy.
    rc, out, _ = cli(gw, "policy", "set", "round_robin")
    assert rc == 0 and json.loads(out)["policy"] == "round_robin"
    rc, out, _ = cli(gw, "policy", "get")
    assert json.loads(out)["policy"] == "round_robin"
    # Removing things.
    assert cli(gw, "keys", "delete", "acme", created["id"])[0] == 0
    r = http.post(gw.url + COMPL, json={"model": sw.model, "prompt": "x"},
                  headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 401
    assert cli(gw, "workers", "drain", "w1")[0] == 0
    assert cli(gw, "workers", "delete", "w1")[0] == 0
    assert cli(gw, "tenants", "delete", "acme")[0] == 0
    # Metrics and probes.
    rc, out, _ = cli(gw, "metrics")
    assert rc == 0 and "kvgate_tenants" in out
    assert cli(gw, "health")[0] == 0


def test_cli_exit_status(kvgate):
    gw = kvgate()
    rc, out, err = cli(gw, "tenants", "get", "nobody")
    assert rc == 1 and "404" in (out + err)
    rc, _, _ = cli(gw, "tenants", "list", token="wrong-token-0123456789")
    assert rc == 1
    rc, _, err = cli(gw, "tenants", "frobnicate")
    assert rc == 2 and err
    rc, out, err = cli(gw, "tenants", "put", "bad id!")
    assert rc == 2 and "id" in (out + err)
    # The token from the state directory, as the gateway generated it.
    state = gw.state_dir
    (state / "admin-token").write_text(gw.token + "\n")
    p = subprocess.run([str(binary("kvgate")), "admin", "--url", gw.admin_url, "--state",
                        str(state), "tenants", "list"], capture_output=True, timeout=20,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr


def test_cli_policy_settings_and_explain(simworker, kvgate, tmp_path):
    sw = simworker(time_scale=0)
    gw = kvgate(sw)
    # Settings without a name keep the policy; with a name both change; bad values are 2 or 1.
    rc, out, err = cli(gw, "policy", "set", "--load-factor", "0.75", "--queue-cost-per-request",
                       "250")
    assert rc == 0, err
    pol = json.loads(out)
    assert (pol["policy"], pol["load_factor"], pol["queue_cost_per_request"]) == ("cost", 0.75, 250)
    rc, out, err = cli(gw, "policy", "set", "prefix_only", "--cold-blocks", "2")
    assert rc == 0, err
    assert (json.loads(out)["policy"], json.loads(out)["cold_blocks"]) == ("prefix_only", 2)
    assert cli(gw, "policy", "set", "--load-factor", "-1")[0] == 2
    assert cli(gw, "policy", "set")[0] == 2
    rc, out, err = cli(gw, "policy", "set", "--block-bytes", "1.5")
    assert rc == 1 and "block_bytes" in (out + err)
    # explain: a request body from a file or stdin.
    body = {"model": sw.model, "messages": [{"role": "user", "content": "hello " * 40}]}
    f = tmp_path / "req.json"
    f.write_text(json.dumps(body))
    rc, out, err = cli(gw, "explain", str(f))
    assert rc == 0, err
    ex = json.loads(out)
    assert ex["chosen"] == sw.name and ex["api"] == "chat" and ex["prefix"]["blocks"] > 0
    argv = [str(binary("kvgate")), "admin", "--url", gw.admin_url, "--token", gw.token,
            "explain", "-", "--path", "/v1/completions"]
    p = subprocess.run(argv, input=json.dumps({"model": sw.model, "prompt": [1, 2, 3]}).encode(),
                       capture_output=True, timeout=20)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["prefix"]["unit"] == "tokens"
    rc, out, err = cli(gw, "explain", str(f), "--tenant", "nobody")
    assert rc == 1 and "404" in (out + err)
    f.write_text('{"model": 1')
    rc, out, err = cli(gw, "explain", str(f))
    assert rc == 1 and "400" in (out + err)


def test_cli_bad_id_named_as_typed(kvgate):
    """A name or id that cannot be one is refused before anything is sent, with the gateway's
    rule and message, naming the character typed rather than its percent-encoding."""
    gw = kvgate()
    cases = [
        (["tenants", "put", "bad/x"], 'tenants put "bad/x": id: invalid character \'/\''),
        (["tenants", "get", "a b"], 'tenants get "a b": id: invalid character 0x20'),
        (["workers", "delete", "w%41"], 'workers delete "w%41": name: invalid character \'%\''),
        (["keys", "create", ".."], 'keys create "..": id: "." and ".." are reserved'),
        (["keys", "delete", "acme", "K1"], "key id: invalid character 'K'"),
        (["tenants", "put", "x" * 200], "id: longer than"),
    ]
    for argv, message in cases:
        rc, out, err = cli(gw, *argv)
        assert rc == 2 and out == "", (argv, rc, out, err)
        assert message in err, (argv, err)
        assert "%2F" not in err and "%20" not in err
    # Good ids still reach the gateway, which answers for them.
    rc, out, err = cli(gw, "tenants", "get", "no-such.tenant_1")
    assert rc == 1 and "404" in err


def cli_tty(gw, *args):
    """Run kvgate admin with stdout on a pseudo-terminal, as a person at a shell would; returns
    the exit status and what the terminal showed (newlines as "\\n")."""
    master, slave = os.openpty()
    argv = [str(binary("kvgate")), "admin", "--url", gw.admin_url, "--token", gw.token, *args]
    try:
        p = subprocess.Popen(argv, stdout=slave, stderr=subprocess.PIPE)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    p.wait(timeout=20)
    p.stderr.close()
    return p.returncode, b"".join(chunks).decode().replace("\r\n", "\n")


def columns(text):
    """A table's lines split into cells at runs of two or more spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines()]


def test_cli_table_on_a_terminal_json_otherwise(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(auth="keys")
    assert cli(gw, "workers", "put", "w1", sw.url, "--model", sw.model, "--kv-blocks", "512")[0] == 0
    assert cli(gw, "workers", "put", "gpu-long-name", sw.url, "--model", "a", "--model", "b")[0] == 0
    assert cli(gw, "tenants", "put", "acme", "--sharing", "group:blue", "--rps", "100")[0] == 0
    assert cli(gw, "tenants", "put", "z", "--model", sw.model)[0] == 0
    rc, out, _ = cli(gw, "keys", "create", "acme")
    kid = json.loads(out)["id"]

    # Workers: a header, one aligned row per worker; every column starts at the header's column.
    rc, out = cli_tty(gw, "workers", "list")
    assert rc == 0, out
    lines = out.strip().splitlines()
    head = columns(out)[0]
    assert head[:4] == ["NAME", "URL", "MODELS", "KV_BLOCKS"] and "HEALTH" in head
    rows = {r[0]: dict(zip(head, r)) for r in columns(out)[1:]}
    assert rows["w1"]["URL"] == sw.url and rows["w1"]["KV_BLOCKS"] == "512"
    assert rows["gpu-long-name"]["MODELS"] == "a,b"
    starts = [lines[0].index(h) for h in ("URL", "MODELS", "KV_BLOCKS")]
    for line in lines[1:]:
        for s in starts:
            assert line[s - 2:s] == "  " and line[s] != " ", (line, s)
    assert not json_like(out)

    # Tenants: nested members flattened, a tenant's keys counted; a missing group is "-".
    rc, out = cli_tty(gw, "tenants", "list")
    assert rc == 0
    head = columns(out)[0]
    assert head[:3] == ["ID", "SHARING", "GROUP"] and "RATE.RPS" in head and "KEYS" in head
    rows = {r[0]: dict(zip(head, r)) for r in columns(out)[1:]}
    assert rows["acme"]["GROUP"] == "blue" and rows["acme"]["RATE.RPS"] == "100"
    assert rows["acme"]["KEYS"] == "1" and rows["z"]["GROUP"] == "-"

    # Keys of a tenant, and one object (the policy) as FIELD VALUE lines.
    rc, out = cli_tty(gw, "keys", "list", "acme")
    assert rc == 0 and columns(out)[0] == ["ID", "CREATED"] and columns(out)[1][0] == kid
    rc, out = cli_tty(gw, "policy", "get")
    assert rc == 0 and columns(out)[0] == ["FIELD", "VALUE"]
    assert ["policy", "cost"] in columns(out) and ["load_factor", "2"] in columns(out)
    rc, out = cli_tty(gw, "tenants", "get", "acme")
    assert ["keys", kid] in columns(out) and ["group", "blue"] in columns(out)

    # -o json on a terminal, -o table in a pipe; the default in a pipe is the JSON as sent.
    rc, out = cli_tty(gw, "-o", "json", "workers", "list")
    assert rc == 0 and {w["name"] for w in json.loads(out)["workers"]} == {"w1", "gpu-long-name"}
    rc, out = cli_tty(gw, "workers", "list", "--output=json")
    assert rc == 0 and json.loads(out)["workers"]
    rc, out, _ = cli(gw, "workers", "list")
    assert rc == 0 and len(json.loads(out)["workers"]) == 2
    rc, out, _ = cli(gw, "-o", "table", "workers", "list")
    assert rc == 0 and columns(out)[0][0] == "NAME"
    rc, out, _ = cli(gw, "keys", "list", "acme")
    assert rc == 0 and [k["id"] for k in json.loads(out)["keys"]] == [kid]
    rc, out, err = cli(gw, "-o", "yaml", "workers", "list")
    assert rc == 2 and "json or table" in err
    # Answers without a table (metrics, probes) come as they are on a terminal too.
    rc, out = cli_tty(gw, "health")
    assert rc == 0 and json.loads(out)
    # An empty list says so.
    assert cli(gw, "workers", "delete", "w1")[0] == 0
    assert cli(gw, "workers", "delete", "gpu-long-name")[0] == 0
    rc, out = cli_tty(gw, "workers", "list")
    assert rc == 0 and out.strip() == "no workers"


def json_like(text):
    try:
        json.loads(text)
        return True
    except ValueError:
        return False
