# SPDX-License-Identifier: Apache-2.0
"""Real Redis topologies for the integration tests: a standalone server, a Sentinel set (a
primary, a replica, three Sentinels) and a three-primary Cluster, all on 127.0.0.1 with free
ports, persistence off, one directory per process under the test's tmp_path, and logs that
failing reports show.

Fixtures (conftest.py imports them):

    redis_procs      RedisProcs: makes any of the below; stops everything at teardown, also when
                     the test failed, after resuming paused processes
    redis_server     a started standalone RedisProcess
    redis_sentinel   a started SentinelSet (replication up, every Sentinel knows the others)
    redis_cluster    a started RedisCluster (cluster_state:ok on every node, one slot map)

    def test_x(redis_server):
        r = redis_server.client()            # redis.Redis (python3-redis), decode_responses
        redis_server.pause(); ...; redis_server.resume()   # SIGSTOP / SIGCONT
        redis_server.kill(); redis_server.restart()        # SIGKILL; same port, same config

    def test_y(redis_sentinel):
        url = redis_sentinel.url              # redis-sentinel://127.0.0.1:a,...:b,...:c/mymaster
        new = redis_sentinel.failover()       # kill the primary, wait until the Sentinels agree
                                              # on the promoted replica, which is returned

    def test_z(redis_cluster):
        slot = redis_cluster.keyslot("k")     # CLUSTER KEYSLOT
        old = redis_cluster.owner(slot)
        for step in redis_cluster.migrate_slot_steps(slot, to=other):
            ...                               # run load between the steps: MOVED and ASK happen
        redis_cluster.migrate_slot(slot, to=other)   # the same without pausing

Processes are redis-server from Debian's redis-server package; a Sentinel is
`redis-server <conf> --sentinel` (the same binary the redis-sentinel package links to). Ports
are chosen free (bind to port 0, then close); a start that loses the race for a port picks
another. Every process has a config file in its directory: a restart reads it again (Sentinels
rewrite theirs with what they learned, as in production).
"""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

import pytest
import redis

HOST = "127.0.0.1"
START_TIMEOUT_S = float(os.environ.get("KVGATE_REDIS_START_TIMEOUT", "20"))
MASTER_NAME = "mymaster"


def redis_binary(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} not found: install Debian's redis-server (scripts/test does)")
    return path


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_until(cond, timeout, what, step=0.02):
    """Poll cond() until it returns something true, which is returned; AssertionError naming
    `what` after timeout seconds. cond may raise redis errors while things settle: they count
    as false."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except (redis.RedisError, OSError) as e:
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(step)


class RedisProcess:
    """One redis-server process: a server, a cluster node or a Sentinel.

    .name, .port, .addr ("127.0.0.1:port"), .dir, .conf_path, .log_path, .proc, .sentinel,
    .password (from a requirepass line of its config, used by client()).
    """

    def __init__(self, name, workdir: pathlib.Path, conf_lines, sentinel=False):
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf_path = self.dir / ("sentinel.conf" if sentinel else "redis.conf")
        self.log_path = workdir / f"{name}.log"
        self.sentinel = sentinel
        self.conf_lines = list(conf_lines)
        self.port = None
        self.proc = None
        self.paused = False
        # client() authenticates with the config's password, if it has one.
        self.password = next((ln.split(None, 1)[1] for ln in self.conf_lines
                              if ln.startswith("requirepass ")), None)

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The gateway's redis.url for this server."""
        return f"redis://{self.addr}"

    def __repr__(self):
        return f"<{self.name} {self.addr}>"

    # -- life cycle --
    def _write_conf(self):
        lines = [f"port {self.port}", f"bind {HOST}", "protected-mode no", "daemonize no",
                 f"dir {self.dir}", 'logfile ""', "loglevel notice"]
        if not self.sentinel:
            lines += ['save ""', "appendonly no"]
        self.conf_path.write_text("\n".join(lines + self.conf_lines) + "\n")

    def start(self, timeout=START_TIMEOUT_S):
        """Start on a free port (kept for restarts) and wait until it answers PING."""
        first = self.port is None
        for attempt in range(5):
            if first:
                self.port = free_port()
                self._write_conf()
            argv = [redis_binary("redis-server"), str(self.conf_path)]
            if self.sentinel:
                argv.append("--sentinel")
            with open(self.log_path, "wb" if first else "ab") as log:
                self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=self.dir)
            self.paused = False
            deadline = time.monotonic() + timeout
            while True:
                if self.proc.poll() is not None:
                    break
                try:
                    if self.client(socket_timeout=1).ping():
                        return self
                except (redis.RedisError, OSError):
                    pass
                if time.monotonic() > deadline:
                    self.proc.kill()
                    self.proc.wait()
                    pytest.fail(f"{self.name} did not answer PING on {self.addr} within "
                                f"{timeout}s\n{self.log()[-3000:]}")
                time.sleep(0.02)
            if first and "Address already in use" in self.log():
                continue  # lost the race for the port: another one
            break
        pytest.fail(f"{self.name} exited with {self.proc.returncode} on start\n"
                    f"{self.log()[-3000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=10):
        """SIGTERM (SIGKILL after timeout), resuming it first if paused. Returns the status."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode

    def kill(self):
        """SIGKILL and reap: the way a crash or a lost machine looks to its clients."""
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self.paused = False

    def restart(self, timeout=START_TIMEOUT_S):
        """Start again on the same port with the same config file (stopping it first if it
        runs). A server comes back empty (no persistence); a cluster node keeps its identity
        and slots (nodes.conf); a Sentinel what it rewrote into its config."""
        if self.alive():
            self.stop()
        return self.start(timeout)

    def pause(self):
        """SIGSTOP: connections stay open, nothing is answered (a stalled server)."""
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    # -- talking to it --
    def client(self, socket_timeout=5, **kw) -> redis.Redis:
        """A python3-redis client (str replies)."""
        kw.setdefault("password", self.password)
        kw.setdefault("decode_responses", True)
        return redis.Redis(host=HOST, port=self.port, socket_timeout=socket_timeout,
                           socket_connect_timeout=socket_timeout, **kw)

    def role(self) -> str:
        """ROLE's first element: "master", "slave" or "sentinel"."""
        return self.client(socket_timeout=2).execute_command("ROLE")[0]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class SentinelSet:
    """A primary, a replica and three Sentinels watching them as MASTER_NAME, with quick
    failure detection (down-after 1 s, failover-timeout 5 s): killing the primary promotes the
    replica in a few seconds.

    .primary, .replica (swapped by failover()), .sentinels, .master_name, .url, .processes.
    """

    def __init__(self, procs: "RedisProcs", name="sentinel", quorum=2,
                 down_after_ms=1000, failover_timeout_ms=5000):
        self.procs = procs
        self.master_name = MASTER_NAME
        self.primary = procs.server(f"{name}-primary")
        self.replica = procs.server(f"{name}-replica",
                                    conf=[f"replicaof {HOST} {self.primary.port}"])
        wait_until(lambda: self.replica.client().info("replication").get("master_link_status")
                   == "up", START_TIMEOUT_S, "the replica's link to the primary")
        conf = [f"sentinel monitor {self.master_name} {HOST} {self.primary.port} {quorum}",
                f"sentinel down-after-milliseconds {self.master_name} {down_after_ms}",
                f"sentinel failover-timeout {self.master_name} {failover_timeout_ms}",
                f"sentinel parallel-syncs {self.master_name} 1"]
        self.sentinels = [procs.start(RedisProcess(f"{name}-s{i + 1}", procs.workdir, conf,
                                                   sentinel=True)) for i in range(3)]
        # A failover needs a quorum that knows the replica and each other (hello messages
        # every 2 s through the primary).
        for s in self.sentinels:
            wait_until(lambda s=s: self._knows_all(s), START_TIMEOUT_S,
                       f"{s.name} to know the replica and the other Sentinels")

    def _knows_all(self, s):
        m = s.client().sentinel_master(self.master_name)
        return m["num-slaves"] >= 1 and m["num-other-sentinels"] >= len(self.sentinels) - 1

    @property
    def url(self) -> str:
        """redis-sentinel://127.0.0.1:a,127.0.0.1:b,127.0.0.1:c/mymaster"""
        return (f"redis-sentinel://{','.join(s.addr for s in self.sentinels)}/"
                f"{self.master_name}")

    @property
    def processes(self):
        return [self.primary, self.replica, *self.sentinels]

    def named_primaries(self):
        """What each live Sentinel answers to get-master-addr-by-name ("host:port" or None)."""
        out = []
        for s in self.sentinels:
            if not s.alive() or s.paused:
                continue
            try:
                a = s.client(socket_timeout=1).sentinel_get_master_addr_by_name(self.master_name)
                out.append(f"{a[0]}:{a[1]}" if a else None)
            except (redis.RedisError, OSError):
                out.append(None)
        return out

    def failover(self, timeout=30):
        """Kill the primary (SIGKILL) and wait until every live Sentinel names the replica and
        the replica says it is a master. Swaps .primary and .replica (the old one stays dead:
        .replica.restart() brings it back, and the Sentinels make it a replica). Returns the
        new primary."""
        old, new = self.primary, self.replica
        old.kill()
        wait_until(lambda: all(a == new.addr for a in self.named_primaries())
                   and new.role() == "master", timeout,
                   f"the Sentinels to promote {new.addr} after {old.addr} was killed")
        self.primary, self.replica = new, old
        return new


class RedisCluster:
    """A Redis Cluster of n primaries (no replicas), created with redis-cli --cluster create.

    .nodes, .url (redis:// to the first node), .processes.
    """

    def __init__(self, procs: "RedisProcs", n=3, name="cluster", node_timeout_ms=2000):
        self.procs = procs
        self.nodes = []
        for i in range(n):
            node = RedisProcess(f"{name}-n{i + 1}", procs.workdir, [
                "cluster-enabled yes", "cluster-config-file nodes.conf",
                f"cluster-node-timeout {node_timeout_ms}", f"cluster-port {free_port()}"])
            self.nodes.append(procs.start(node))
        out = subprocess.run([redis_binary("redis-cli"), "--cluster", "create",
                              *[nd.addr for nd in self.nodes], "--cluster-yes"],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
        self.wait_consistent()

    @property
    def url(self) -> str:
        return f"redis://{self.nodes[0].addr}"

    @property
    def processes(self):
        return list(self.nodes)

    def node_id(self, node) -> str:
        return node.client().execute_command("CLUSTER", "MYID")

    def by_addr(self, addr):
        return next(nd for nd in self.nodes if nd.addr == addr)

    def slot_map(self, node=None):
        """CLUSTER SLOTS of node (default: the first live one) as [(first, last, "host:port")],
        sorted."""
        node = node or next(nd for nd in self.nodes if nd.alive() and not nd.paused)
        ranges = node.client().execute_command("CLUSTER", "SLOTS")
        return sorted((int(r[0]), int(r[1]), f"{r[2][0] or HOST}:{int(r[2][1])}")
                      for r in ranges)

    def wait_consistent(self, timeout=30):
        """Until every live node says cluster_state:ok and all give the same slot map."""
        live = [nd for nd in self.nodes if nd.alive() and not nd.paused]

        def settled():
            if any(nd.client().cluster("INFO")["cluster_state"] != "ok" for nd in live):
                return False
            maps = [self.slot_map(nd) for nd in live]
            return all(m == maps[0] for m in maps)
        wait_until(settled, timeout, "cluster_state:ok and one slot map on every node")

    def keyslot(self, key: str) -> int:
        node = next(nd for nd in self.nodes if nd.alive() and not nd.paused)
        return int(node.client().execute_command("CLUSTER", "KEYSLOT", key))

    def owner(self, slot: int) -> RedisProcess:
        """The node that serves slot, by the first live node's CLUSTER SLOTS."""
        for first, last, addr in self.slot_map():
            if first <= slot <= last:
                return self.by_addr(addr)
        raise AssertionError(f"slot {slot} has no owner")

    def migrate_slot_steps(self, slot: int, to, batch=100, migrate_timeout_ms=5000):
        """Move slot from its owner to node `to` as redis-cli --cluster reshard does, yielding
        after each step so that a test can run load in between: "importing" (to is IMPORTING),
        "migrating" (the owner is MIGRATING: from here keys of the slot that moved answer
        ASK), "moved N" after each MIGRATE of a batch of keys, "assigned" (SETSLOT NODE on the
        target, the source, then the others: from here the others answer MOVED), "done" (every
        node gives the same map)."""
        src = self.owner(slot)
        assert src is not to, f"slot {slot} is already on {to.addr}"
        src_id, dst_id = self.node_id(src), self.node_id(to)
        s, d = src.client(), to.client()
        d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        yield "importing"
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        yield "migrating"
        while True:
            keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            s.execute_command("MIGRATE", HOST, to.port, "", 0, migrate_timeout_ms,
                              "KEYS", *keys)
            yield f"moved {len(keys)}"
        for nd in [to, src] + [nd for nd in self.nodes if nd is not to and nd is not src]:
            if nd.alive() and not nd.paused:
                nd.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        yield "assigned"
        wait_until(lambda: self.owner(slot) is to and all(
            self.slot_map(nd) == self.slot_map() for nd in self.nodes
            if nd.alive() and not nd.paused), 30, f"every node to give slot {slot} to {to.addr}")
        yield "done"

    def migrate_slot(self, slot: int, to, batch=100):
        """migrate_slot_steps run through."""
        for _ in self.migrate_slot_steps(slot, to, batch):
            pass


class RedisProcs:
    """Every Redis process of one test: made here, stopped by cleanup() (the fixture's
    teardown), which resumes paused ones first. .processes lists them for failure reports."""

    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.processes = []

    def start(self, p: RedisProcess) -> RedisProcess:
        self.processes.append(p)
        return p.start()

    def server(self, name=None, conf=()) -> RedisProcess:
        """A standalone redis-server; conf: more config lines ("requirepass x")."""
        name = name or f"redis{len(self.processes) + 1}"
        return self.start(RedisProcess(name, self.workdir, conf))

    def sentinel_set(self, name="sentinel", **kw) -> SentinelSet:
        return SentinelSet(self, name=name, **kw)

    def cluster(self, n=3, name="cluster", **kw) -> RedisCluster:
        return RedisCluster(self, n=n, name=name, **kw)

    def cleanup(self):
        for p in self.processes:
            if p.proc is not None:
                if p.paused:
                    p.resume()
                p.stop(timeout=5)


@pytest.fixture
def redis_procs(tmp_path, request):
    """RedisProcs for this test; everything it started is stopped at teardown."""
    procs = RedisProcs(tmp_path / "redis")
    request.node.redis_procs = procs  # conftest's report hook shows their logs on failure
    yield procs
    procs.cleanup()


@pytest.fixture
def redis_server(redis_procs):
    """A standalone redis-server (RedisProcess), started."""
    return redis_procs.server("redis")


@pytest.fixture
def redis_sentinel(redis_procs):
    """A SentinelSet (primary, replica, three Sentinels), started and settled."""
    return redis_procs.sentinel_set()


@pytest.fixture
def redis_cluster(redis_procs):
    """A RedisCluster of three primaries, created and settled."""
    return redis_procs.cluster()
