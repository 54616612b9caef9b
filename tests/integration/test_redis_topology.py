# SPDX-License-Identifier: Apache-2.0
"""The Redis topology thread (router/redis_topology.c, redis_sentinel.c, redis_cluster.c) against
real servers: tests/unit/router/redis_topology_driver runs a kvg_redis on a URL, prints every
topology it publishes and answers kvg_redis_connect_blocking requests. Standalone (a replica's
URL refused), Sentinel (the primary found, a failover followed through +switch-master), Cluster
(the slot map, a migrated slot, a seed that is gone), unreachable servers, and kvg_redis_free
while a server is stopped. redisprocs.py starts the servers."""
import json
import pathlib
import queue
import random
import shutil
import subprocess
import threading
import time

import pytest

from conftest import binary, child_env
from redisprocs import HOST, free_port, wait_until

# The driver's checks in the tests that must not see a periodic check: a change they expect
# then comes from +switch-master or kvg_redis_refresh_topology, not from the clock.
NEVER_MS = 600000


class TopologyDriver:
    """A running redis_topology_driver: .events (JSON lines, in order), .log() (its stderr)."""

    def __init__(self, url, workdir, name, interval_ms=200, connect_timeout_ms=1000,
                 command_timeout_ms=1000):
        self.log_path = workdir / f"{name}.log"
        self.argv = [str(binary("tests/unit/router/redis_topology_driver")), url,
                     "--interval", str(interval_ms), "--connect-timeout",
                     str(connect_timeout_ms), "--command-timeout", str(command_timeout_ms)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, env=child_env(), text=True, bufsize=1)
        self.events = []
        self._new = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._new:
                self.events.append(json.loads(line))
                self._new.notify_all()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def fail(self, what):
        raise AssertionError(f"{what}\nevents: {json.dumps(self.events[-8:], indent=1)}\n"
                             f"driver log:\n{self.log()[-4000:]}\n{self.stacks()}")

    def stacks(self) -> str:
        """Where each thread of a driver that is still running waits: the system call it is in
        (/proc), and the threads' backtraces when gdb is installed. For hangs seen only in CI."""
        if self.proc.poll() is not None:
            return f"driver exited with {self.proc.returncode}"
        out = []
        for task in sorted(pathlib.Path(f"/proc/{self.proc.pid}/task").glob("*")):
            def read(name):
                try:
                    return (task / name).read_text(errors="replace").strip()
                except OSError as e:
                    return f"({e.strerror})"
            out.append(f"thread {task.name} {read('comm')}: wchan {read('wchan')}, "
                       f"syscall {read('syscall')}\n{read('stack')}")
        if shutil.which("gdb"):
            r = subprocess.run(["gdb", "-batch", "-p", str(self.proc.pid), "-ex",
                                "thread apply all bt"], capture_output=True, text=True,
                               timeout=60)
            out.append(r.stdout[-6000:])
        return "driver threads:\n" + "\n".join(out)

    def wait_event(self, pred, timeout, what, since=0):
        """The first event from index since on that satisfies pred."""
        deadline = time.monotonic() + timeout
        with self._new:
            while True:
                for e in self.events[since:]:
                    if pred(e):
                        return e
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    break
                self._new.wait(left)
        self.fail(f"no event {what} within {timeout}s")

    def topology(self, pred=lambda t: True, timeout=10, what="", since=0):
        """The first topology (from index since) for which pred holds."""
        return self.wait_event(lambda e: e["event"] == "topology" and pred(e), timeout,
                               f"topology {what}", since)

    def latest(self):
        with self._new:
            return [e for e in self.events if e["event"] == "topology"][-1]

    def request(self, line, timeout=15):
        """Send a command line; its answer (the next event named by its first word)."""
        kind = line.split()[0]
        with self._new:
            since = len(self.events)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.wait_event(lambda e: e["event"] == kind, timeout, f"answering {line!r}", since)

    def connect(self, key=None, timeout=15):
        return self.request("connect" + (f" {key}" if key else ""), timeout)

    def close(self, timeout=15):
        """kvg_redis_free (timed), then the driver must exit 0 (sanitizer reports fail). Returns
        the milliseconds kvg_redis_free took."""
        if self.proc.poll() is not None:
            return None
        ms = self.request("free", timeout)["ms"]
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = "a hang"
        if code != 0:
            self.fail(f"driver exited with {code}")
        return ms


@pytest.fixture
def topology_driver(tmp_path):
    """topology_driver(url, **timeouts) -> TopologyDriver; each one is freed at teardown and must
    exit 0."""
    started = []

    def start(url, **kw):
        d = TopologyDriver(url, tmp_path, f"driver{len(started) + 1}", **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()


def ok_with(nodes):
    """A topology predicate: exactly these nodes, and no error."""
    return lambda t: t["nodes"] == nodes and t["error"] == ""


def owner_in(topology, slot):
    """The node ("host:port") a driver's cluster topology gives slot, or None."""
    for first, last, node in topology["slots"]:
        if first <= slot <= last:
            return topology["nodes"][node]
    return None


# ---- standalone --------------------------------------------------------------------------------


def test_standalone_primary(redis_server, topology_driver):
    d = topology_driver(f"redis://{redis_server.addr}")
    assert d.request("wait 5000") == {"event": "wait", "rc": 0, "error": ""}
    t = d.topology(ok_with([redis_server.addr]), what="with the server")
    assert t["mode"] == "standalone" and "slots" not in t
    assert d.request("mode")["mode"] == "standalone"
    assert d.request("healthy")["ok"] is True
    c = d.connect("some-key")
    assert c["rc"] == 0 and c["addr"] == redis_server.addr and c["set"] == "OK", c
    assert redis_server.client().get("some-key") == "driver"

    # Killed: the error says so and the node stays (clients keep trying it); back: cleared.
    redis_server.kill()
    since = len(d.events)
    t = d.topology(lambda t: "Connection refused" in t["error"], since=since, what="refused")
    assert t["nodes"] == [redis_server.addr]
    assert d.request("healthy")["ok"] is False
    c = d.connect("some-key", timeout=5)
    assert c["rc"] < 0 and "Connection refused" in c["error"], c
    since = len(d.events)
    redis_server.restart()
    d.topology(ok_with([redis_server.addr]), since=since, what="recovered")


def test_standalone_credentials_and_db(redis_procs, topology_driver):
    srv = redis_procs.server("auth", conf=["requirepass s3cret/pw"])
    # The password percent-encoded in the URL; a db other than 0.
    d = topology_driver(f"redis://:s3cret%2Fpw@{srv.addr}/3")
    d.topology(ok_with([srv.addr]))
    c = d.connect("k3")
    assert c["rc"] == 0 and c["set"] == "OK", c
    r = srv.client(password="s3cret/pw", db=3)
    assert r.get("k3") == "driver"
    assert srv.client(password="s3cret/pw", db=0).get("k3") is None

    bad = topology_driver(f"redis://:wrong@{srv.addr}")
    w = bad.request("wait 3000")
    assert w["rc"] < 0 and "AUTH" in w["error"], w
    assert bad.latest()["nodes"] == []
    assert "wrong" not in bad.log() and "wrong" not in json.dumps(bad.events)


def test_replica_url_refused(redis_procs, topology_driver):
    primary = redis_procs.server("primary")
    replica = redis_procs.server("replica", conf=[f"replicaof {HOST} {primary.port}"])
    d = topology_driver(f"redis://{replica.addr}")
    w = d.request("wait 3000")
    assert w["rc"] < 0, w
    assert f"{replica.addr} is a replica: writes would fail with READONLY" in w["error"], w
    assert primary.addr in w["error"], w  # it names the primary to use instead
    # The driver prints topologies from a thread of its own: the refusal's may follow the
    # answer to "wait".
    t = d.topology(lambda t: "is a replica" in t["error"], what="naming the refusal")
    assert t["nodes"] == [], t
    c = d.connect(timeout=2)
    assert c["rc"] < 0, c


def test_sentinel_url_to_plain_redis_url_refused(redis_sentinel, topology_driver):
    s = redis_sentinel.sentinels[0]
    d = topology_driver(f"redis://{s.addr}")
    w = d.request("wait 3000")
    assert w["rc"] < 0 and f"{s.addr} is a Sentinel: use redis-sentinel://" in w["error"], w


# ---- Sentinel ------------------------------------------------------------------------------------


def test_sentinel_failover_followed(redis_sentinel, topology_driver):
    old = redis_sentinel.primary
    # No periodic checks: only +switch-master can tell the driver about the failover.
    d = topology_driver(redis_sentinel.url, interval_ms=NEVER_MS)
    t = d.topology(ok_with([old.addr]), what="with the primary")
    assert t["mode"] == "sentinel"
    c = d.connect("before")
    assert c["rc"] == 0 and c["addr"] == old.addr and c["set"] == "OK", c
    since = len(d.events)

    new = redis_sentinel.failover()
    d.topology(ok_with([new.addr]), since=since, timeout=10, what="with the promoted replica")
    assert "+switch-master" in d.log()
    c = d.connect("after")
    assert c["rc"] == 0 and c["addr"] == new.addr and c["set"] == "OK", c
    assert new.client().get("before") == "driver"  # it was the replica of the old one


def test_sentinel_order_and_errors(redis_sentinel, topology_driver):
    # The first Sentinel in the URL is down: the next one answers.
    redis_sentinel.sentinels[0].kill()
    d = topology_driver(redis_sentinel.url)
    d.topology(ok_with([redis_sentinel.primary.addr]))

    # A master name no Sentinel knows.
    url = redis_sentinel.url.rsplit("/", 1)[0] + "/nosuchmaster"
    u = topology_driver(url)
    w = u.request("wait 3000")
    assert w["rc"] < 0, w
    assert "no Sentinel named the primary of 'nosuchmaster'" in w["error"], w
    assert "does not know master 'nosuchmaster'" in w["error"], w
    assert "Connection refused" in w["error"], w  # the dead one is named too


def test_sentinel_stale_answer_not_published(redis_procs, topology_driver):
    """A Sentinel that names a replica (as one may during a failover) is not believed: the
    topology keeps its error until the named server says it is the primary."""
    primary = redis_procs.server("p")
    replica = redis_procs.server("r", conf=[f"replicaof {HOST} {primary.port}"])
    # One Sentinel watching the *replica's* address as the master: the answer is stale.
    from redisprocs import RedisProcess
    s = redis_procs.start(RedisProcess("stale-s", redis_procs.workdir, [
        f"sentinel monitor mymaster {HOST} {replica.port} 1",
        "sentinel down-after-milliseconds mymaster 600000"], sentinel=True))
    d = topology_driver(f"redis-sentinel://{s.addr}/mymaster")
    w = d.request("wait 2000")
    assert w["rc"] < 0, w
    assert f"names {replica.addr} the primary of 'mymaster', but it says it is a replica" \
        in w["error"], w
    assert d.latest()["nodes"] == []
    # Promoted by hand: the next check (soon: a stale answer is asked again quickly) has it.
    replica.client().execute_command("REPLICAOF", "NO", "ONE")
    d.topology(ok_with([replica.addr]), timeout=10)


# ---- Cluster -------------------------------------------------------------------------------------


def test_cluster_slot_map(redis_cluster, topology_driver):
    d = topology_driver(redis_cluster.url)
    want = redis_cluster.slot_map()
    t = d.topology(lambda t: t["mode"] == "cluster" and t["error"] == "", what="cluster")
    assert sorted(t["nodes"]) == sorted(nd.addr for nd in redis_cluster.nodes)
    got = sorted((first, last, t["nodes"][i]) for first, last, i in t["slots"])
    assert got == want
    assert d.request("mode")["mode"] == "cluster"
    assert d.request("healthy")["ok"] is True
    # connect_blocking lands on each key's owner, which takes the write.
    for key in ("a", "b", "c", "{user1000}.following", "kvg:m:{00ff}:1"):
        owner = redis_cluster.owner(redis_cluster.keyslot(key))
        c = d.connect(key)
        assert c["rc"] == 0 and c["addr"] == owner.addr and c["set"] == "OK", c


def test_key_slot_matches_server(redis_cluster, topology_driver):
    d = topology_driver(redis_cluster.url)
    rng = random.Random(11)
    keys = [b"", b"foo", b"{user1000}.following", b"foo{}{bar}", b"foo{{bar}}zap", b"{",
            b"}{", b"a{b}", b"\x00{\xff}"]
    for _ in range(200):
        k = bytes(rng.choice(b"ab{}\x00\xff:xyz") for _ in range(rng.randrange(0, 12)))
        keys.append(k)
    server = redis_cluster.nodes[0].client(decode_responses=False)
    for k in keys:
        want = server.execute_command("CLUSTER", "KEYSLOT", k)
        got = d.request(f"slot {k.hex()}")["slot"]
        assert got == want, k


def test_cluster_slot_migration_followed(redis_cluster, topology_driver):
    key = "migrating-key"
    slot = redis_cluster.keyslot(key)
    src = redis_cluster.owner(slot)
    dst = next(nd for nd in redis_cluster.nodes if nd is not src)
    src.client().set(key, "before")
    # Refreshes only: the new owner must come from kvg_redis_refresh_topology.
    d = topology_driver(redis_cluster.url, interval_ms=NEVER_MS)
    t = d.topology(lambda t: t["error"] == "" and owner_in(t, slot) == src.addr)
    c = d.connect(key)
    assert c["addr"] == src.addr and c["set"] == "OK", c

    redis_cluster.migrate_slot(slot, dst)
    since = len(d.events)
    c = d.connect(key)
    assert c["addr"] == src.addr and c["set"].startswith("MOVED"), c  # a client would refresh
    d.request("refresh")
    d.topology(lambda t: owner_in(t, slot) == dst.addr, since=since, what=f"slot {slot} moved")
    c = d.connect(key)
    assert c["rc"] == 0 and c["addr"] == dst.addr and c["set"] == "OK", c


def test_cluster_map_read_from_other_nodes(redis_cluster, topology_driver):
    """The URL's node gone for good: the map is read from the other primaries it named."""
    seed, a, b = redis_cluster.nodes
    d = topology_driver(redis_cluster.url, interval_ms=NEVER_MS)
    d.topology(lambda t: t["error"] == "" and len(t["nodes"]) == 3)
    seed.kill()
    key = "moves-while-seed-is-gone"
    slot = redis_cluster.keyslot(key)
    src = redis_cluster.owner(slot)
    if src is seed:  # pick a key the living nodes serve
        key, slot = next((k, s) for k, s in ((f"k{i}", redis_cluster.keyslot(f"k{i}"))
                                              for i in range(1000))
                         if redis_cluster.owner(s) is not seed)
        src = redis_cluster.owner(slot)
    dst = a if src is b else b
    redis_cluster.migrate_slot(slot, dst)
    since = len(d.events)
    d.request("refresh")
    t = d.topology(lambda t: owner_in(t, slot) == dst.addr, since=since, what="the new owner")
    assert seed.addr in t["nodes"]  # still an owner of its slots as far as the cluster knows
    c = d.connect(key)
    assert c["rc"] == 0 and c["addr"] == dst.addr and c["set"] == "OK", c


# ---- failures ------------------------------------------------------------------------------------


def test_unreachable(topology_driver):
    port = free_port()
    d = topology_driver(f"redis://{HOST}:{port}")
    w = d.request("wait 1000")
    assert w["rc"] == -110 and f"{HOST}:{port}: Connection refused" in w["error"], w
    h = d.request("healthy")
    assert h["ok"] is False and "no primary known" in h["why"], h
    c = d.connect(timeout=5)
    assert c["rc"] < 0, c

    s = topology_driver(f"redis-sentinel://{HOST}:{port},{HOST}:{free_port()}/mymaster")
    w = s.request("wait 1000")
    assert w["rc"] < 0 and "no Sentinel named the primary of 'mymaster'" in w["error"], w
    assert w["error"].count("Connection refused") == 2, w

    n = topology_driver("redis://no-such-host.invalid:6379")
    w = n.request("wait 3000")
    assert w["rc"] < 0 and "no-such-host.invalid: " in w["error"], w


def test_free_returns_while_server_stopped(redis_server, topology_driver):
    # Timeouts far longer than the bound asserted: free must not wait for them.
    d = topology_driver(f"redis://{redis_server.addr}", interval_ms=100,
                        connect_timeout_ms=20000, command_timeout_ms=20000)
    d.topology(ok_with([redis_server.addr]))
    redis_server.pause()
    # The thread's next check (100 ms) blocks on the stopped server; nothing outside the
    # thread can see that moment, so give it the time.
    time.sleep(0.5)
    ms = d.close(timeout=30)
    assert ms < 3000, f"kvg_redis_free took {ms} ms"
