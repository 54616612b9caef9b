# SPDX-License-Identifier: Apache-2.0
"""Token-exact routing through the gateway: a model defined with its tokenizer files is routed
on the engine's own block hashes. Checked against Python oracles (Jinja2 as transformers sets it
up, the Rust tokenizers library, vLLM's hash restated on cbor2/hashlib) and against the
simulated worker in token-exact mode, whose block hashes are its own implementation."""
import json

import httpx
import pytest
from gwhelpers import salt_of
from test_model_keys import chat_context, model_files
from test_template_oracle import jinja2_env
from test_tokenizer_oracle import oracle_ids
from test_vllm_hash import HASH_FNS, block_hashes, to_u64

SEED = "1234"


def models_config(family="qwen3", **extra):
    tok, cfg = model_files(family)
    return {"models": [dict({"name": "m", "tokenizer": str(tok), "tokenizer_config": str(cfg),
                             "hash_seed": SEED}, **extra)]}


def explain(gw, request, path=None):
    body = {"request": request}
    if path:
        body["path"] = path
    r = gw.admin.post("/admin/v1/route/explain", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def conversation(n_turns, words=40, start=0):
    msgs = [{"role": "system", "content": "You are a careful assistant. " * 4}]
    for t in range(start, start + n_turns):
        msgs.append({"role": "user", "content": f"Question {t}: " + "tell me more " * words})
        msgs.append({"role": "assistant", "content": f"Answer {t}: " + "here is more " * words})
    msgs.append({"role": "user", "content": "and then?"})
    return msgs


def oracle_hashes(family, body, salt, block=16):
    tok, cfg_path = model_files(family)
    cfg = json.loads(cfg_path.read_text())
    if "messages" in body:
        text = jinja2_env().from_string(cfg["chat_template"]).render(**chat_context(body, cfg))
        ids = oracle_ids(tok, [text])[0][0]
    else:
        ids = oracle_ids(tok, [body["prompt"]])[0][1]
    return ids, block_hashes(HASH_FNS["sha256_cbor"], SEED, ids, block, None, salt)


@pytest.mark.parametrize("family", ["qwen3", "llama3_1"])
def test_explain_gives_the_engine_hashes(simworker, kvgate, family):
    """Explain of a chat and of a completion: mode token_exact, the token count, the first blocks'
    digests and event forms exactly the oracle's, with the scope's salt as cache_salt."""
    sw = simworker(time_scale=0, model="m")
    gw = kvgate(sw, config=models_config(family))
    for body in ({"model": "m", "messages": conversation(3)},
                 {"model": "m", "prompt": "Once upon a time " * 50}):
        got = explain(gw, body)
        ids, hashes = oracle_hashes(family, body, salt_of("global"))
        assert got["mode"] == "token_exact", got
        assert got["prefix"]["unit"] == "tokens"
        assert got["prefix"]["length"] == len(ids)
        assert got["prefix"]["blocks"] == len(hashes)
        want = [{"digest": h.hex(), "event": to_u64(h)} for h in hashes[:2]]
        assert got["first_block_hashes"] == want


def test_prefill_price_follows_the_engine_block(simworker, kvgate):
    """The policy's per-block prices are for 16 tokens (block_tokens): a cold candidate's
    prefill cost is the same per token whatever the engine's block size (explain's terms), so
    a model with 64-token blocks is not priced at a quarter of one with 16."""
    sw = simworker(time_scale=0, model="m")
    prompt = {"model": "m", "prompt": "Once upon a time " * 100}
    per_token = {}
    for block in (16, 64, 1):
        gw = kvgate(sw, config=models_config(block_size=block))
        got = explain(gw, prompt)
        assert got["mode"] == "token_exact" and got["prefix"]["block_size"] == block, got
        blocks = got["prefix"]["blocks"]
        assert blocks == got["prefix"]["length"] // block
        cost = got["candidates"][0]["prefill_cost"]
        assert cost == pytest.approx(200 * blocks * block / 16), got  # prefill_cost_per_block 200
        per_token[block] = cost / (blocks * block)
        gw.stop()
    assert per_token[16] == pytest.approx(per_token[64]) == pytest.approx(per_token[1])


def test_fallback_and_byte_mode(simworker, kvgate):
    """A request token-exact mode does not cover goes in byte mode with the reason (explain, and
    counted); a model without a definition is in byte mode."""
    sw = simworker(time_scale=0, model=["m", "other"])
    gw = kvgate(sw, config=models_config())
    got = explain(gw, {"model": "m", "prompt": ["a batch " * 40, "of two"]})
    assert got["mode"] == "token_exact_fallback" and "batch" in got["token_exact_error"], got
    assert got["prefix"]["unit"] == "bytes"
    got = explain(gw, {"model": "other", "prompt": "x " * 200})
    assert got["mode"] == "bytes" and "first_block_hashes" not in got
    before = gw.scrape()
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        r = c.post("/v1/completions", json={"model": "m", "prompt": ["a " * 40, "b"],
                                             "max_tokens": 1})
        assert r.status_code == 200, r.text
        r = c.post("/v1/completions", json={"model": "m", "prompt": "a " * 40, "max_tokens": 1})
        assert r.status_code == 200, r.text
    after = gw.scrape()
    for mode, n in (("token_exact_fallback", 1), ("token_exact", 1)):
        assert gw.metric("kvgate_route_key_mode_total", after, mode=mode) - \
            gw.metric("kvgate_route_key_mode_total", before, mode=mode) == n


def exact_worker(simworker, family="qwen3", **flags):
    tok, cfg = model_files(family)
    return simworker(time_scale=0, model="m", tokenizer=str(tok), tokenizer_config=str(cfg),
                     hash_seed=SEED, **flags)


def test_gateway_and_engine_agree(simworker, kvgate):
    """With workers in token-exact mode (their own hash code): the hashes the worker names for a
    forwarded request are the ones explain gives; a repeated conversation goes back to its
    worker, which reports as cached exactly the blocks the gateway predicted; its next turn hits
    the blocks both turns share. Bodies above hash.exact_offload_bytes take the offload pool,
    with the same result."""
    ws = [exact_worker(simworker) for _ in range(3)]
    gw = kvgate(*ws, config=dict(models_config(), hash={"exact_offload_bytes": 20000}))
    small = {"model": "m", "messages": conversation(2), "max_tokens": 2}
    large = {"model": "m", "messages": conversation(12, words=200), "max_tokens": 2}
    assert len(json.dumps(small)) < 20000 < len(json.dumps(large))
    before = gw.scrape()
    with httpx.Client(base_url=gw.url, timeout=30) as c:
        for body in (small, large):
            want = explain(gw, body)
            r1 = c.post("/v1/chat/completions", json=body)
            assert r1.status_code == 200, r1.text
            names = r1.headers["x-simworker-block-hashes"].split(",")
            assert [int(h, 16) for h in names[:2]] == \
                [h["event"] for h in want["first_block_hashes"]]
            r2 = c.post("/v1/chat/completions", json=body)
            assert r2.headers["x-simworker-name"] == r1.headers["x-simworker-name"]
            usage = r2.json()["usage"]
            assert usage["prompt_tokens"] == want["prefix"]["length"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == want["prefix"]["blocks"] * 16
            nxt = dict(body, messages=body["messages"] + [
                {"role": "assistant", "content": "fine"}, {"role": "user", "content": "more?"}])
            r3 = c.post("/v1/chat/completions", json=nxt)
            assert r3.headers["x-simworker-name"] == r1.headers["x-simworker-name"]
            shared = 0
            a = r1.headers["x-simworker-block-hashes"].split(",")
            b = r3.headers["x-simworker-block-hashes"].split(",")
            while shared < min(len(a), len(b)) and a[shared] == b[shared]:
                shared += 1
            assert shared > 0
            assert r3.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= \
                min(shared, 256) * 16
    after = gw.scrape()
    ran = gw.metric("kvgate_token_exact_offload_total", after, outcome="run") - \
        gw.metric("kvgate_token_exact_offload_total", before, outcome="run")
    assert ran == 3  # the large conversation's three requests, not the small one's
    assert gw.metric("kvgate_route_key_mode_total", after, mode="token_exact") - \
        gw.metric("kvgate_route_key_mode_total", before, mode="token_exact") == 6


def test_replicas_share_token_exact_keys_on_redis(simworker, kvgate, redis_server):
    """Two gateways on one Redis, workers in token-exact mode: a conversation learned through
    one replica routes its next turn on the other by the engine's hashes in the shared map."""
    from test_redis_routing import learned_on_one_routes_on_other
    from test_routing import chat, text
    ws = [exact_worker(simworker, kv_blocks=4096) for _ in range(4)]
    cfg = dict(models_config(), redis={"url": redis_server.url, "lookup_timeout_ms": 20})
    a, b = kvgate(*ws, config=cfg), kvgate(*ws, config=cfg)
    assert explain(b, chat("m", text(1, 200), "q"))["mode"] == "token_exact"
    learned_on_one_routes_on_other(a, b, ws, 701)
    for gw in (a, b):
        m = gw.scrape()
        assert gw.metric("kvgate_redis_lookups_total", m, outcome="ok") >= 1
        assert gw.metric("kvgate_route_key_mode_total", m, mode="token_exact") >= 1
