# SPDX-License-Identifier: Apache-2.0
"""A request's token-exact block keys (model/keys.c, through tests/unit/model/model_driver)
against oracles that share no code with it: the prompt rendered by Python's Jinja2 (set up as
transformers does), token ids from the Rust tokenizers library (npm @anush008/tokenizers), and
vLLM's block hash restated on cbor2 + hashlib/xxhash (test_vllm_hash.py). Also the real
engine's 25 hashes of its prompt, from tokenizer file to event form."""
import json
import random
import subprocess

import pytest
from conftest import REPO_ROOT, binary
from test_template_oracle import jinja2_env
from test_tokenizer_oracle import FAMILIES, PACKAGES, oracle_ids, tokenizer_file
from test_vllm_hash import EVENT_JSON, HASH_FNS, block_hashes, to_u64

import npm_oracle

CASES = 300


def model_files(family):
    tok = tokenizer_file(family)
    return tok, tok.parent / "tokenizer_config.json"


def run_driver(args, bodies):
    stdin = "".join(json.dumps(b, ensure_ascii=False) + "\n" for b in bodies).encode()
    r = subprocess.run([str(binary("tests/unit/model/model_driver")), *map(str, args)],
                       input=stdin, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(out) == len(bodies)
    return out


def expected(ids, algo, seed, block, salt):
    hs = block_hashes(HASH_FNS[algo], seed, ids, block, None, salt)
    return [str(to_u64(h)) for h in hs], [h.hex() for h in hs[:2]]


def check(got, ids, algo, seed, block, salt, what):
    assert "error" not in got, (what, got)
    keys, first = expected(ids, algo, seed, block, salt)
    assert got["ntokens"] == len(ids), what
    assert got["keys"] == keys, what
    assert got["first"] == first, what


def test_real_engine_prompt():
    """vLLM (Qwen3-0.6B, seed 42, block 16) published these 25 hashes for this prompt: the
    tokenizer file and the hash chain together must give them all."""
    ev = json.loads(EVENT_JSON.read_text())
    tok, _ = model_files("qwen3")
    (got,) = run_driver(["--tokenizer", tok, "--seed", ev["hash_seed"], "--block",
                         ev["block_size"]], [{"model": "m", "prompt": ev["prompt"]}])
    assert [int(k) for k in got["keys"]] == ev["block_hashes"]
    assert got["ntokens"] >= len(ev["token_ids"])


WORDS = ["the", "Hello", "world", "naïve café", "日本語", "  ", "\n", "123456", "don't",
         "<|im_start|>", "<|begin_of_text|>", "🙂", "tokens", "\t", "x" * 40]


def text(rng, n):
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", ", ", ".\n"]) for _ in range(n))


@pytest.mark.parametrize("family", ["qwen3", "llama3_1"])
@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash_cbor"])
def test_completions(family, algo):
    """String prompts through the tokenizer with its post-processor (Llama 3.1 puts
    <|begin_of_text|> first, Qwen nothing), or without it when the body says
    add_special_tokens: false; token-id prompts as given; with and without a salt."""
    rng = random.Random(f"{family}-{algo}")
    tok, _ = model_files(family)
    prompts = [text(rng, rng.randrange(1, 120)) for _ in range(CASES)]
    oracle = oracle_ids(tok, prompts)
    for salt in (None, "c2FsdC1vZi10aGUtc2NvcGU"):
        bodies = []
        for i, p in enumerate(prompts):
            b = {"model": "m", "prompt": p}
            if i % 5 == 1:
                b["add_special_tokens"] = False
            if i % 7 == 2:
                b = {"model": "m", "prompt": oracle[i][1]}  # ids
            if i % 11 == 3:
                b["prompt"] = [b["prompt"]]  # a batch of one
            bodies.append(b)
        args = ["--tokenizer", tok, "--seed", "s" + algo, "--algo", algo, "--block", 16]
        if salt:
            args += ["--salt", salt]
        for i, (b, got) in enumerate(zip(bodies, run_driver(args, bodies))):
            p = b["prompt"][0] if isinstance(b["prompt"], list) and b["prompt"] and \
                isinstance(b["prompt"][0], (str, list)) else b["prompt"]
            if isinstance(p, list):
                ids = p
            else:
                ids = oracle[i][0] if b.get("add_special_tokens") is False else oracle[i][1]
            check(got, ids, algo, "s" + algo, 16, salt, (family, i, b))


def chat_context(body, cfg):
    """What vLLM hands the template for a body of plain string messages: the messages as
    given, add_generation_prompt (default true), the chat_template_kwargs spread, and the
    tokenizer's special tokens."""
    ctx = {"messages": body["messages"], "tools": None, "documents": None,
           "add_generation_prompt": body.get("add_generation_prompt", True)}
    ctx.update(body.get("chat_template_kwargs", {}))
    for k in ("bos_token", "eos_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            ctx[k] = v
    return ctx


@pytest.mark.parametrize("family", ["qwen3", "llama3_1"])
def test_chat(family):
    """Chat bodies: rendered with the model's own template (Jinja2), tokenized without special
    tokens added (the template holds them), hashed with the scope salt as cache_salt; block
    sizes other than 16 too."""
    rng = random.Random(f"chat-{family}")
    tok, cfg_path = model_files(family)
    cfg = json.loads(cfg_path.read_text())
    tpl = jinja2_env().from_string(cfg["chat_template"])
    bodies, prompts = [], []
    for i in range(CASES):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": text(rng, rng.randrange(1, 20))})
        for t in range(rng.randrange(1, 6)):
            msgs.append({"role": "user", "content": text(rng, rng.randrange(1, 40))})
            if t % 2 == 0 or rng.random() < 0.5:
                msgs.append({"role": "assistant", "content": text(rng, rng.randrange(1, 40))})
        if msgs[-1]["role"] == "assistant" and rng.random() < 0.7:
            msgs.append({"role": "user", "content": text(rng, 5)})
        body = {"model": "m", "messages": msgs}
        if rng.random() < 0.3:
            body["add_generation_prompt"] = rng.random() < 0.5
        if family == "qwen3" and rng.random() < 0.5:
            body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
        bodies.append(body)
        prompts.append(tpl.render(**chat_context(body, cfg)))
    oracle = oracle_ids(tok, prompts)
    salt = "dGhlLXNjb3BlLXNhbHQ"
    for block, cache in ((16, 0), (7, 0), (16, 1)):
        # With the pieces cache (1 MiB: evictions) every body twice: the second from the cache.
        args = ["--tokenizer", tok, "--tokenizer-config", cfg_path, "--seed", "42", "--block",
                block, "--salt", salt, "--chat", "--token-cache-mib", cache]
        for i, got in enumerate(run_driver(args, bodies * (2 if cache else 1))):
            check(got, oracle[i % len(bodies)][0], "sha256_cbor", "42", block, salt,
                  (family, block, cache, i))


def test_not_covered_and_bounded(tmp_path):
    """What token-exact mode does not cover is an error the gateway routes in byte mode on: a
    batch of prompts, truncate_prompt_tokens, media parts, a template that raises; a template
    that would run away is stopped by limits scaled to the body. max_blocks bounds the keys."""
    tok, cfg_path = model_files("qwen3")
    looping = tmp_path / "loop.jinja"
    looping.write_text("{% for i in range(100000000) %}{{ messages[0].content }}{% endfor %}")
    raising = tmp_path / "raise.jinja"
    raising.write_text("{{ raise_exception('no system messages') }}")
    base = ["--tokenizer", tok, "--seed", "42"]
    got = run_driver(base, [
        {"model": "m", "prompt": ["a", "b"]},
        {"model": "m", "prompt": "hello", "truncate_prompt_tokens": 3},
        {"model": "m", "prompt": 7},
        {"model": "m"},
    ])
    assert [("error" in g) for g in got] == [True] * 4, got
    assert "batch" in got[0]["error"] and "truncate_prompt_tokens" in got[1]["error"]
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi " * 100}]}
    media = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
    (g,) = run_driver(base + ["--chat-template", looping, "--chat"], [chat])
    assert "error" in g and "limit" in g["error"].lower(), g
    (g,) = run_driver(base + ["--chat-template", raising, "--chat"], [chat])
    assert "no system messages" in g["error"], g
    (g,) = run_driver(base + ["--tokenizer-config", cfg_path, "--chat"], [media])
    assert "error" in g, g
    (g,) = run_driver(base, [chat])  # completions input: no prompt
    assert "error" in g
    (g,) = run_driver(base + ["--chat"], [chat])  # no template at all
    assert "chat template" in g["error"], g
    (g,) = run_driver(base + ["--tokenizer-config", cfg_path, "--chat", "--max-blocks", 2],
                      [chat])
    assert len(g["keys"]) == 2 and g["ntokens"] > 32, g
