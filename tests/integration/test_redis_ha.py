# SPDX-License-Identifier: Apache-2.0
"""Replicated gateways on a highly available Redis (docs/redis.md, "Connecting: URLs,
Sentinel, Cluster"), under load: a Sentinel failover (the primary killed) and a Cluster slot
migrated while requests flow (MOVED and ASK) cost no client request, and the gateways go on
using the shared prefix map afterwards: lookups answered by the new primary or the slot's new
owner, and a prefix learned on one gateway routes the next turn on the other.

Real redis-server processes (redisprocs.py), real gateways and simulated workers; the load is
test_redis_routing.Load's, spread over both gateways (and, on the Cluster, over many tenants,
whose scopes root their chains in different hash slots)."""

import re

import pytest

from gwhelpers import http, wait_for
from test_redis_routing import Load, learned_on_one_routes_on_other, replicas, send
from redisprocs import wait_until
from test_routing import chat, text

# Generous: the assertions below want lookups answered, on a loaded 2-core machine; a late
# answer would only make a decision fall back (no failure), but would hide what is tested.
LOOKUP_TIMEOUT_MS = 250
GATEWAY_THREADS = 2  # the kvgate fixture's default: one Redis connection per thread per primary


class Spread(Load):
    """Load's threads, each request through the gateways in turn and, with keys, from the
    tenants in turn (each with its own API key). hot: tenant indices that get every other
    request while it is set (the tenants of a slot being migrated)."""

    def __init__(self, gws, model, keys=(None,), threads=4):
        super().__init__(gws[0], model, threads)
        self.gws, self.keys = gws, list(keys)
        self.hot = None

    def request(self, i, n):
        _, body, _ = super().request(i, n)
        hot = self.hot
        t = hot[(n // 2) % len(hot)] if hot and n % 2 == 0 else (i * 5 + n) % len(self.keys)
        key = self.keys[t]
        gw = self.gws[(i + n) % len(self.gws)]
        return gw.url + "/v1/chat/completions", body, (
            {"authorization": f"Bearer {key}"} if key else {})

    def grow(self, n, timeout=30, what="requests"):
        """Wait until n more requests have completed."""
        start = self.count()
        assert wait_for(lambda: self.count() >= start + n, timeout), \
            f"{what}: fewer than {n} requests in {timeout}s ({self.count() - start})"


def ok_lookups(gw, m=None):
    return gw.metric("kvgate_redis_lookups_total", m, outcome="ok")


def fell_back(gw, m=None):
    return sum(gw.metric("kvgate_redis_lookups_total", m, outcome=o)
               for o in ("unavailable", "busy", "lost", "timeout", "error"))


def evalsha_calls(node):
    return node.client().info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def wait_ready(gw, primaries, timeout=20):
    want = GATEWAY_THREADS * primaries
    assert wait_for(lambda: gw.metric("kvgate_redis_connections", state="ready") == want,
                    timeout), f"{gw.name}: not {want} ready Redis connections: " \
        f"{gw.metric('kvgate_redis_connections', state='ready')}"


# ---- Sentinel -------------------------------------------------------------------------------------


def demote(s, timeout=30):
    """A failover with the primary alive (SENTINEL FAILOVER, as for maintenance): the replica is
    promoted and the old primary made its replica, with its clients disconnected. Swaps
    s.primary and s.replica like SentinelSet.failover; returns the new primary."""
    old, new = s.primary, s.replica
    s.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", s.master_name)
    wait_until(lambda: all(a == new.addr for a in s.named_primaries())
               and new.role() == "master" and old.role() == "slave", timeout,
               f"the Sentinels to promote {new.addr} and demote {old.addr}")
    s.primary, s.replica = new, old
    return new


@pytest.mark.parametrize("how", ["killed", "demoted"])
def test_sentinel_failover_during_load_fails_nothing_and_gateways_follow_the_new_primary(
        simworker, kvgate, redis_sentinel, how):
    s = redis_sentinel
    ws = [simworker(time_scale=0, kv_blocks=4096) for _ in range(4)]
    gws = replicas(kvgate, s, ws, redis={"lookup_timeout_ms": LOOKUP_TIMEOUT_MS})
    for gw in gws:
        wait_ready(gw, 1)
    old = s.primary
    assert evalsha_calls(s.replica) == 0  # scripts replicate as their effects, not as calls
    with Spread(gws, ws[0].model) as load:
        for gw in gws:
            assert wait_for(lambda: ok_lookups(gw) >= 20, 20), f"{gw.name}: no lookups answered"
        changes = {gw.name: gw.metric("kvgate_redis_topology_changes_total") for gw in gws}
        # SIGKILL, or SENTINEL FAILOVER; returns once every Sentinel names the replica
        new = s.failover() if how == "killed" else demote(s)
        failed_over = {gw.name: ok_lookups(gw) for gw in gws}
        for gw in gws:
            wait_ready(gw, 1, timeout=30)
            assert wait_for(lambda: ok_lookups(gw) >= failed_over[gw.name] + 20, 30), \
                f"{gw.name}: lookups not answered after the failover"
        # Answered by the promoted replica: the gateways send their scripts there now.
        assert wait_for(lambda: evalsha_calls(new) > 0, 10)
        load.grow(50)
    assert load.failures() == [], load.failures()[:5]
    assert old.alive() == (how == "demoted")
    for gw in gws:
        m = gw.scrape()
        # The failover did reach the gateway (lookups refused or lost while there was no
        # primary), and the topology changed to the new primary.
        if how == "killed":
            assert fell_back(gw, m) > 0, f"{gw.name}: the failover went unnoticed?"
        assert gw.metric("kvgate_redis_topology_changes_total", m) > changes[gw.name]
        assert gw.metric("kvgate_redis_lookups_total", m, outcome="error") == 0
        assert gw.metric("kvgate_redis_records_total", m, outcome="error") == 0
        assert wait_for(lambda: "degraded" not in http.get(gw.admin_url + "/readyz").json(),
                        15), http.get(gw.admin_url + "/readyz").text
    # What one gateway learns from now on reaches the other through the new primary.
    learned_on_one_routes_on_other(gws[0], gws[1], ws, 800)
    learned_on_one_routes_on_other(gws[1], gws[0], ws, 801)
    assert evalsha_calls(new) > 0


# ---- Cluster --------------------------------------------------------------------------------------

TENANTS = 24
MAP_KEY = re.compile(r"^kvg:m:\{([0-9a-f]{16})\}:[0-9a-f]{16}$")


def map_tags(node):
    """The hash tags (chain roots) of the prefix map's keys on one cluster node."""
    tags = set()
    for k in node.client().keys("kvg:m:*"):
        m = MAP_KEY.match(k)
        assert m, f"unexpected map key {k!r} on {node.addr}"
        tags.add(m.group(1))
    return tags


def all_tags(cluster):
    return {t: nd for nd in cluster.nodes for t in map_tags(nd)}


def test_cluster_tenants_spread_over_slots_and_migrations_during_load_fail_nothing(
        simworker, kvgate, redis_cluster):
    c = redis_cluster
    ws = [simworker(time_scale=0, kv_blocks=4096) for _ in range(4)]
    # No periodic topology checks: after a migration only the MOVED replies can tell the
    # gateways, so MOVED is certainly exercised (and must be followed).
    a, b = gws = replicas(kvgate, c, ws, auth="keys", redis={
        "lookup_timeout_ms": LOOKUP_TIMEOUT_MS, "topology_interval_ms": 600000,
        "sync_interval_ms": 300})
    for gw in gws:
        wait_ready(gw, 3)
    tenants = [f"t{i:02d}" for i in range(TENANTS)]
    keys = []
    for t in tenants:
        assert a.admin.put(f"/admin/v1/tenants/{t}", json={"sharing": "isolated"}) \
            .status_code in (200, 201)
        keys.append(a.admin.post(f"/admin/v1/tenants/{t}/keys").json()["key"])
    # Shared state: gateway b takes every tenant's key (through Redis on the cluster too).
    assert wait_for(lambda: len(b.admin.get("/admin/v1/tenants").json()["tenants"]) == TENANTS,
                    10)

    # One request per tenant, alternating gateways: each tenant's scope roots its chains, and
    # the root is the map keys' hash tag, so the tenants' entries spread over slots.
    slot_of = {}  # tenant index -> (tag, node)
    for i, key in enumerate(keys):
        before = all_tags(c)
        send(gws[i % 2], chat(ws[0].model, text(1000 + i, 1200), "hello"), key)
        assert wait_for(lambda: len(all_tags(c)) > len(before), 5), f"{tenants[i]}: no record"
        (tag,) = set(all_tags(c)) - set(before)
        slot_of[i] = (tag, all_tags(c)[tag])
    holders = {nd.addr for _, nd in slot_of.values()}
    assert holders == {nd.addr for nd in c.nodes}, f"map keys only on {holders}"
    for tag, nd in slot_of.values():
        assert c.owner(c.keyslot(f"{{{tag}}}")) is nd

    # The shared map across the two gateways, in two tenants' slots.
    learned_on_one_routes_on_other(a, b, ws, 820, tenant=tenants[0], key=keys[0])
    learned_on_one_routes_on_other(b, a, ws, 821, tenant=tenants[1], key=keys[1])
    for gw in gws:
        assert ok_lookups(gw) > 0

    # Two slots that hold map entries migrated during load, from two different primaries, with
    # requests between every step (keys moved one at a time: ASK while the slot is half
    # moved, MOVED once it is assigned).
    first = 0
    second = next(i for i, (_, nd) in slot_of.items() if nd is not slot_of[first][1])
    moves = []
    for i in (first, second):
        tag, src = slot_of[i]
        dst = next(nd for nd in c.nodes if nd is not src and
                   all(nd is not d for _, _, d in moves))
        moves.append((i, c.keyslot(f"{{{tag}}}"), dst))
    with Spread(gws, ws[0].model, keys=keys) as load:
        load.grow(40)
        before = {gw.name: ok_lookups(gw) for gw in gws}
        for i, slot, dst in moves:
            assert c.node_id(c.owner(slot)) != c.node_id(dst)
            load.hot = [i]
            for step in c.migrate_slot_steps(slot, to=dst, batch=1):
                load.grow(16, what=f"slot {slot} after {step!r}")
            load.hot = None
        load.grow(40)
        for gw in gws:
            assert wait_for(lambda: ok_lookups(gw) > before[gw.name] + 20, 20)
    assert load.failures() == [], load.failures()[:5]
    for i, slot, dst in moves:
        assert c.owner(slot) is dst
        assert slot_of[i][0] in map_tags(dst)
    totals = {}
    for gw in gws:
        m = gw.scrape()
        for kind in ("moved", "ask"):
            totals[kind] = totals.get(kind, 0) + gw.metric("kvgate_redis_redirects_total", m,
                                                            kind=kind)
        # Redirections followed, not answered with an error (which would fall back).
        assert gw.metric("kvgate_redis_lookups_total", m, outcome="error") == 0, gw.name
        assert gw.metric("kvgate_redis_records_total", m, outcome="error") == 0, gw.name
        assert gw.metric("kvgate_redis_records_total", m, outcome="ok") > 0
    assert totals["moved"] > 0 and totals["ask"] > 0, totals
    # The moved slots serve the shared map on both gateways.
    for i, _, _ in moves:
        learned_on_one_routes_on_other(a, b, ws, 830 + i, tenant=tenants[i], key=keys[i])
