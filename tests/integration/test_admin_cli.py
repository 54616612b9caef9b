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
    assert rc == 1 and "id" in (out + err)
    # The token from the state directory, as the gateway generated it.
    state = gw.state_dir
    (state / "admin-token").write_text(gw.token + "\n")
    p = subprocess.run([str(binary("kvgate")), "admin", "--url", gw.admin_url, "--state",
                        str(state), "tenants", "list"], capture_output=True, timeout=20,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
