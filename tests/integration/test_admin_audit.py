# SPDX-License-Identifier: Apache-2.0
"""The audit log of a running gateway: each change through the admin API is one JSON line that
names the admin token which acted (by an id derived from it, never the token) and holds the
resource before and after the change, never key material."""

import hashlib
import json

import httpx

TOKEN_A = "audit-token-alpha-0123456789abcdef"
TOKEN_B = "audit-token-bravo-0123456789abcdef"


def token_id(token):
    return hashlib.sha256(token.encode()).hexdigest()[:8]


def audit_lines(gw):
    return [json.loads(line) for line in
            (gw.state_dir / "audit.log").read_text().splitlines()]


def test_audit_names_token_and_keeps_before_and_after(simworker, kvgate):
    sw = simworker(time_scale=0)
    gw = kvgate(auth="keys", token=None,
                config={"admin": {"tokens": [TOKEN_A, TOKEN_B]}})
    url = gw.admin_url

    def call(method, path, token, body=None):
        r = httpx.request(method, url + path, json=body, timeout=10,
                          headers={"authorization": f"Bearer {token}"})
        return r

    assert call("PUT", "/admin/v1/workers/w1", TOKEN_A,
                {"url": sw.url, "models": [sw.model], "kv_blocks": 64}).status_code == 201
    assert call("PUT", "/admin/v1/workers/w1", TOKEN_B,
                {"url": sw.url, "models": [sw.model], "kv_blocks": 128}).status_code == 200
    assert call("PUT", "/admin/v1/tenants/acme", TOKEN_A,
                {"sharing": "isolated", "models": [sw.model]}).status_code == 201
    r = call("POST", "/admin/v1/tenants/acme/keys", TOKEN_B)
    assert r.status_code == 201
    key, kid = r.json()["key"], r.json()["id"]
    assert call("DELETE", f"/admin/v1/tenants/acme/keys/{kid}", TOKEN_A).status_code == 204
    assert call("PUT", "/admin/v1/policy", TOKEN_A, {"policy": "round_robin"}).status_code == 200
    assert call("PUT", "/admin/v1/tenants/acme", TOKEN_B,
                {"sharing": "nobody"}).status_code == 400
    assert call("DELETE", "/admin/v1/tenants/acme", TOKEN_B).status_code == 204
    assert call("DELETE", "/admin/v1/workers/w1", TOKEN_A).status_code == 204
    assert call("GET", "/admin/v1/tenants", TOKEN_A).status_code == 200  # a read: no line
    assert call("PUT", "/admin/v1/policy", "not-a-token", {}).status_code == 401  # no line

    text = (gw.state_dir / "audit.log").read_text()
    for secret in (TOKEN_A, TOKEN_B, key, key[len("kvg-"):]):
        assert secret not in text
    lines = audit_lines(gw)
    got = [(a["action"], a["target"], a["status"], a["token"]) for a in lines]
    a, b = token_id(TOKEN_A), token_id(TOKEN_B)
    assert got == [
        ("worker.put", "w1", 201, a),
        ("worker.put", "w1", 200, b),
        ("tenant.put", "acme", 201, a),
        ("key.create", f"acme/{kid}", 201, b),
        ("key.delete", f"acme/{kid}", 204, a),
        ("policy.put", "policy", 200, a),
        ("tenant.put", "acme", 400, b),
        ("tenant.delete", "acme", 204, b),
        ("worker.delete", "w1", 204, a),
    ]
    for line in lines:
        assert list(line)[:7] == ["time", "remote", "token", "action", "target", "status",
                                  "detail"]
    w_new, w_again, t_new, k_new, k_del, pol, t_bad, t_del, w_del = lines
    # Workers: created from nothing, then replaced.
    assert w_new["before"] is None and w_new["after"]["kv_blocks"] == 64
    assert w_again["before"]["kv_blocks"] == 64 and w_again["after"]["kv_blocks"] == 128
    # Tenants and keys: the tenant with its key ids, never a key.
    assert t_new["before"] is None and t_new["after"]["sharing"] == "isolated"
    assert k_new["before"]["keys"] == [] and [k["id"] for k in k_new["after"]["keys"]] == [kid]
    assert [k["id"] for k in k_del["before"]["keys"]] == [kid] and k_del["after"]["keys"] == []
    # A refused change: before and after alike.
    assert t_bad["before"] == t_bad["after"] and t_bad["after"]["sharing"] == "isolated"
    assert t_del["before"]["id"] == "acme" and t_del["after"] is None
    assert w_del["before"]["name"] == "w1" and w_del["after"] is None
    # The policy: the whole settings object on both sides.
    assert pol["before"]["policy"] == "cost" and pol["after"]["policy"] == "round_robin"
    assert set(pol["before"]) == set(pol["after"])
    # The error log has the same lines, without before and after.
    audited = [json.loads(line.split("admin: audit ", 1)[1]) for line in gw.log().splitlines()
               if "admin: audit " in line]
    assert [(x["action"], x["token"]) for x in audited] == [(g[0], g[3]) for g in got]
    assert all("before" not in x and "after" not in x for x in audited)
