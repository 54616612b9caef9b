# SPDX-License-Identifier: Apache-2.0
"""KV events with replicated gateways on Redis (issue 17): every replica subscribes to every
engine's events and applies them to its own embedded index, which answers for the workers whose
events flow even when the prefix map lives in Redis (docs/kv-events.md, "Replicated gateways").
Redis holds no event writes: N replicas do not multiply them, and a replica's death hands
nothing on."""
import httpx
from test_kv_events import gateway, prompt, wait_matched
from test_simworker_events import start as events_worker
from test_token_exact import explain


def test_replicas_route_on_events_with_redis(simworker, kvgate, redis_server, tmp_path):
    """Two gateways sharing Redis: prompts the engine stored (sent to it directly, never
    through a gateway) are routed to it by both replicas, from the engine's events, though the
    shared map in Redis never heard of them (three other workers, cold: chance would send each
    there one time in four); the engine reports them cached. After the engine's cache is reset
    both replicas forget them, whatever their own earlier records put in the shared map."""
    from gwhelpers import salt_of
    ev = events_worker(simworker, tmp_path, model="m")
    plains = [simworker(time_scale=0, model="m") for _ in range(3)]
    redis = {"url": redis_server.url, "lookup_timeout_ms": 500}
    a = gateway(kvgate, [ev] + plains, tmp_path, redis=redis)
    b = gateway(kvgate, [ev] + plains, tmp_path, redis=redis)
    bodies = {a: [prompt(i) for i in range(1, 5)], b: [prompt(i) for i in range(5, 9)]}
    with httpx.Client(timeout=10) as c:
        for body in bodies[a] + bodies[b]:
            r = c.post(ev.url + "/v1/completions", json=dict(body, cache_salt=salt_of("global")))
            assert r.status_code == 200, r.text
    blocks = {}
    for gw in (a, b):
        for i, body in enumerate(bodies[a] + bodies[b]):
            blocks[i] = explain(gw, body)["prefix"]["blocks"]
            n, got = wait_matched(gw, body, ev.name, blocks[i])  # the replica's own index
            assert n == blocks[i] > 10, got
    for gw in (a, b):
        with httpx.Client(base_url=gw.url, timeout=10) as c:
            for body in bodies[gw]:
                r = c.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                assert r.headers["x-simworker-name"] == ev.name
                i = (bodies[a] + bodies[b]).index(body)
                cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                assert cached == blocks[i] * 16
        m = gw.scrape()
        # Decided on the shared map's answer, not on a fallback for a slow Redis.
        assert gw.metric("kvgate_redis_lookups_total", m, outcome="ok") >= 4
    # The engine's cache reset: both replicas forget every prompt on it, though the shared map
    # still holds their own records of the requests above.
    with httpx.Client(timeout=10) as c:
        assert c.post(ev.url + "/reset_prefix_cache").status_code == 200
    for gw in (a, b):
        for body in bodies[a] + bodies[b]:
            n, got = wait_matched(gw, body, ev.name, 0)
            assert n == 0, got
    # And the request path predicts nothing for them: the map in Redis says the engine holds
    # them (the replicas' records of the requests above), the events say it does not. (One
    # replica only: its requests now record where they went, which the other would then
    # rightly predict.)
    before = a.metric("kvgate_prefix_predicted_tokens_total")
    with httpx.Client(base_url=a.url, timeout=10) as c:
        for body in bodies[a] + bodies[b]:
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
    assert a.metric("kvgate_prefix_predicted_tokens_total") == before
