# SPDX-License-Identifier: Apache-2.0
"""kvgate admin, the operator CLI, against a running gateway: it drives tenants, keys, workers
and the policy, and its exit status says how the call went."""

import json
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
