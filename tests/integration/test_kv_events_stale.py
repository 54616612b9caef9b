# SPDX-License-Identifier: Apache-2.0
"""Staleness of the engines' KV events (issue 17): a worker whose events stop - silence from a
publisher that sends idle heartbeats, or its publisher unreachable - is marked stale and the
index falls back to the model for it; a batch in order makes it "events" again. Checked through
the workers API ("kv_events_status": state, the index's source, last batch age, sequence) and the
metrics (kvgate_kv_events_worker_state, kvgate_kv_events_transitions_total), against the
simulated worker's publisher paused, resumed, stopped and idle (docs/kv-events.md)."""
import time

import httpx
from test_kv_events import prompt
from test_simworker_events import SEED, free_port
from test_simworker_events import start as events_worker
from test_token_exact import models_config


def gateway(kvgate, workers, stale_ms=None):
    cfg = models_config()
    cfg["models"][0]["hash_seed"] = SEED
    cfg["workers"] = []
    for w in workers:
        d = {"name": w.name, "url": w.url, "models": ["m"]}
        ep = getattr(w, "events_ep", None)
        if ep:
            d["kv_events"] = ep
            if getattr(w, "replay_ep", None):
                d["kv_events_replay"] = w.replay_ep
            if stale_ms is not None:
                d["kv_events_stale_ms"] = stale_ms
        cfg["workers"].append(d)
    return kvgate(config=cfg)


def kv(gw, name):
    r = gw.admin.get(f"/admin/v1/workers/{name}")
    assert r.status_code == 200, r.text
    return r.json()["kv_events_status"]


def wait_state(gw, name, state, timeout):
    """Poll the workers API until the worker is in state; the last view either way."""
    deadline = time.monotonic() + timeout
    while True:
        got = kv(gw, name)
        if got["state"] == state or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def state_metric(gw, name, samples=None):
    samples = gw.scrape() if samples is None else samples
    on = [s for s in ("connecting", "events", "stale")
          if gw.metric("kvgate_kv_events_worker_state", samples, worker=name, state=s) == 1]
    return on


def transitions(gw, to, samples=None):
    return gw.metric("kvgate_kv_events_transitions_total", samples, to=to)


def test_paused_events_go_stale_and_resume(simworker, kvgate, tmp_path):
    """Heartbeats every 100 ms, stale after 600 ms: paused, the worker is stale no sooner than
    the interval and soon after it (API, metric, index source); resumed, the batches made
    meanwhile come back by replay and the worker is "events" again."""
    ev = events_worker(simworker, tmp_path, model="m", kv_events_heartbeat_ms=100)
    gw = gateway(kvgate, [ev], stale_ms=600)
    got = wait_state(gw, ev.name, "events", 5)
    assert got["state"] == "events", got
    assert got["index_source"] == "events", got
    assert got["last_batch_age_ms"] is not None and got["last_batch_age_ms"] < 600, got
    seq0 = got["sequence"]
    assert seq0 >= 0
    assert state_metric(gw, ev.name) == ["events"]
    assert transitions(gw, "stale") == 0
    # Events flow (heartbeats): the sequence moves on.
    time.sleep(0.5)
    assert kv(gw, ev.name)["sequence"] > seq0

    with httpx.Client(timeout=10) as c:
        r = c.post(ev.url + "/kv_events/pause")
        assert r.status_code == 200 and r.json()["paused"] is True, r.text
    paused_at = time.monotonic()
    # Not stale before the interval (100 ms of heartbeat in flight at most before the pause).
    time.sleep(0.35)
    assert kv(gw, ev.name)["state"] == "events"
    got = wait_state(gw, ev.name, "stale", 5)
    took = time.monotonic() - paused_at
    assert got["state"] == "stale", got
    assert 0.45 <= took <= 0.6 + 0.1 + 0.5, took  # interval, poll turn, API polling
    assert got["index_source"] == "events_stale", got
    assert got["last_batch_age_ms"] >= 600, got
    m = gw.scrape()
    assert state_metric(gw, ev.name, m) == ["stale"]
    assert transitions(gw, "stale", m) == 1
    stale_seq = got["sequence"]
    # Stays stale while paused (heartbeats are made and buffered, not sent).
    time.sleep(0.5)
    assert kv(gw, ev.name)["state"] == "stale"

    with httpx.Client(timeout=10) as c:
        r = c.post(ev.url + "/kv_events/resume")
        assert r.status_code == 200 and r.json()["paused"] is False, r.text
    got = wait_state(gw, ev.name, "events", 5)
    assert got["state"] == "events", got
    assert got["index_source"] == "events", got
    assert got["sequence"] > stale_seq
    m = gw.scrape()
    assert state_metric(gw, ev.name, m) == ["events"]
    assert transitions(gw, "stale", m) == 1
    assert transitions(gw, "events", m) == 2
    # The first batch after the pause showed a gap: the heartbeats made meanwhile were replayed.
    assert gw.metric("kvgate_kv_events_total", m, outcome="gaps") >= 1
    assert gw.metric("kvgate_kv_events_total", m, outcome="replayed") >= 1
    assert gw.metric("kvgate_kv_events_total", m, outcome="lost") == 0


def test_a_stopped_publisher_is_stale(simworker, kvgate, tmp_path):
    """An engine without heartbeats (released vLLM), events flowing, then the process gone: its
    publisher's connection is lost, and after the grace (1 s) the worker is stale, whatever the
    silence interval (here an hour)."""
    from gwhelpers import salt_of
    ev = events_worker(simworker, tmp_path, model="m")
    gw = gateway(kvgate, [ev], stale_ms=3600000)
    assert kv(gw, ev.name)["state"] == "connecting"
    deadline = time.monotonic() + 5
    with httpx.Client(timeout=10) as c:
        # A subscription reaches a PUB socket a moment after connecting: send until one lands.
        i = 0
        while kv(gw, ev.name)["state"] != "events":
            assert time.monotonic() < deadline, kv(gw, ev.name)
            r = c.post(ev.url + "/v1/completions",
                       json=dict(prompt(i, 20), cache_salt=salt_of("global")))
            assert r.status_code == 200
            i += 1
            time.sleep(0.1)
    assert kv(gw, ev.name)["index_source"] == "events"
    assert ev.stop() == 0
    stopped_at = time.monotonic()
    got = wait_state(gw, ev.name, "stale", 5)
    took = time.monotonic() - stopped_at
    assert got["state"] == "stale", got
    assert 0.9 <= took <= 2.5, took
    assert got["index_source"] == "events_stale", got
    m = gw.scrape()
    assert state_metric(gw, ev.name, m) == ["stale"]
    assert transitions(gw, "stale", m) == 1


def test_an_idle_engine_with_heartbeats_stays_events(simworker, kvgate, tmp_path):
    """No traffic at all for 3 s, heartbeats every 200 ms and a 1 s interval: never stale."""
    ev = events_worker(simworker, tmp_path, model="m", kv_events_heartbeat_ms=200)
    gw = gateway(kvgate, [ev], stale_ms=1000)
    got = wait_state(gw, ev.name, "events", 5)
    assert got["state"] == "events", got
    seq0 = got["sequence"]
    end = time.monotonic() + 3
    while time.monotonic() < end:
        got = kv(gw, ev.name)
        assert got["state"] == "events", got
        assert got["last_batch_age_ms"] < 1000, got
        time.sleep(0.1)
    assert got["sequence"] >= seq0 + 10  # 3 s of 200 ms heartbeats
    assert transitions(gw, "stale") == 0
    assert state_metric(gw, ev.name) == ["events"]


def test_an_idle_engine_without_heartbeats_is_not_stale(simworker, kvgate, tmp_path):
    """Released vLLM sends nothing when idle: a connected, silent publisher is never called
    stale for its silence (it stays "connecting" until its first batch, then "events"), even
    with a short interval."""
    from gwhelpers import salt_of
    ev = events_worker(simworker, tmp_path, model="m")
    gw = gateway(kvgate, [ev], stale_ms=300)
    time.sleep(1.5)
    got = kv(gw, ev.name)
    assert got["state"] == "connecting", got
    assert got["index_source"] == "events_stale", got  # the model until a batch
    assert got["last_batch_age_ms"] is None and got["sequence"] == -1, got
    assert state_metric(gw, ev.name) == ["connecting"]
    deadline = time.monotonic() + 5
    with httpx.Client(timeout=10) as c:
        i = 0
        while kv(gw, ev.name)["state"] != "events":
            assert time.monotonic() < deadline, kv(gw, ev.name)
            c.post(ev.url + "/v1/completions",
                   json=dict(prompt(i, 20), cache_salt=salt_of("global")))
            i += 1
            time.sleep(0.1)
    time.sleep(1.5)  # five intervals of silence
    got = kv(gw, ev.name)
    assert got["state"] == "events", got
    assert got["last_batch_age_ms"] >= 1000, got
    assert transitions(gw, "stale") == 0


def test_no_publisher_and_no_kv_events(simworker, kvgate, tmp_path):
    """A worker whose publisher is unreachable from the start is stale after the grace (routed
    by the model); a worker without kv_events is "off" and uses the model, with no state
    series."""
    plain = simworker(time_scale=0, model="m")
    dead = simworker(time_scale=0, model="m")
    dead.events_ep = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    dead.replay_ep = None
    gw = gateway(kvgate, [plain, dead])
    assert kv(gw, plain.name) == {"state": "off", "index_source": "model"}
    got = wait_state(gw, dead.name, "stale", 5)
    assert got["state"] == "stale", got
    assert got["index_source"] == "events_stale", got
    m = gw.scrape()
    assert state_metric(gw, dead.name, m) == ["stale"]
    assert state_metric(gw, plain.name, m) == []
    assert not any(k.startswith("kvgate_kv_events_worker_state") and plain.name in k for k in m)
    assert kv(gw, plain.name) == {"state": "off", "index_source": "model"}
    # The API's list carries the same line.
    r = gw.admin.get("/admin/v1/workers")
    ws = {w["name"]: w for w in r.json()["workers"]}
    assert ws[dead.name]["kv_events_status"]["state"] == "stale"
    assert ws[dead.name]["kv_events_stale_ms"] == 5000  # the default
    assert ws[plain.name]["kv_events_status"]["state"] == "off"
