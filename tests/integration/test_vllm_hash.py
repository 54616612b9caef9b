# SPDX-License-Identifier: Apache-2.0
"""vLLM's block hash against vLLM's own functions.

vLLM v1 names a prefix-cache block with hash_fn((parent, tuple(block_tokens), extra_keys)),
hash_fn being sha256_cbor or xxhash_cbor: cbor2.dumps(obj, canonical=True), then hashlib's
SHA-256 or xxhash's xxh3_128_digest. The reference below restates vLLM's code
(vllm/v1/core/kv_cache_utils.py: init_none_hash, hash_block_tokens,
generate_block_hash_extra_keys, maybe_convert_block_hash; vllm/utils/hashing.py) on the very
libraries it calls: cbor2 (Debian's python3-cbor2), hashlib and xxhash (python3-xxhash). Two C
implementations must print the same bytes: the gateway's (gpu_hash/vllm_hash.c, through
tests/unit/gpu_hash/vllm_hash_driver) and the simulated worker's own
(tools/simworker/vllm_hash.c, through tests/unit/simworker/sim_vllm_hash_driver), on thousands
of random cases: token ids of every CBOR integer width, block sizes 1-64 and a few large ones
(array heads of every width), long chains, seeds, LoRA names and salts of every text-length
width, ASCII and not, both algorithms.
"""
import hashlib
import json
import random
import subprocess

import pytest
from conftest import REPO_ROOT, binary

cbor2 = pytest.importorskip("cbor2", reason="python3-cbor2 is not installed")
xxhash = pytest.importorskip("xxhash", reason="python3-xxhash is not installed")

DRIVERS = ["tests/unit/gpu_hash/vllm_hash_driver", "tests/unit/simworker/sim_vllm_hash_driver"]
EVENT_JSON = REPO_ROOT / "tests" / "data" / "vllm" / "kv_event_base.json"


# ---- vLLM's functions, restated ----------------------------------------------------------------

def sha256_cbor(obj) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash_cbor(obj) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


HASH_FNS = {"sha256_cbor": sha256_cbor, "xxhash_cbor": xxhash_cbor}


def none_hash(fn, seed: str) -> bytes:
    """init_none_hash with PYTHONHASHSEED set: hash_fn(hash_seed), the string itself."""
    return fn(seed)


def extra_keys(lora, salt, start_token_idx):
    """generate_block_hash_extra_keys without multimodal inputs or prompt embeddings:
    lora_extra_keys + cache_salt_keys, a tuple, or None when empty."""
    lora_keys = [lora] if lora is not None else []
    salt_keys = [salt] if (start_token_idx == 0 and salt) else []
    keys = lora_keys + salt_keys
    return tuple(keys) if keys else None


def block_hashes(fn, seed, tokens, block_size, lora, salt):
    """request_block_hasher: full blocks only, each chained on its parent's bytes."""
    parent = none_hash(fn, seed)
    out = []
    start = 0
    while start + block_size <= len(tokens):
        h = fn((parent, tuple(tokens[start:start + block_size]),
                extra_keys(lora, salt, start)))
        out.append(h)
        parent = h
        start += block_size
    return out


def to_u64(h: bytes) -> int:
    """maybe_convert_block_hash with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (the default)."""
    return int.from_bytes(h, byteorder="big") & ((1 << 64) - 1)


# ---- the drivers -------------------------------------------------------------------------------

def arg(s):
    return "-" if s is None else "x" + s.encode().hex()


def case_line(c) -> str:
    algo, block, seed, lora, salt, tokens = c
    return " ".join([algo, str(block), arg(seed), arg(lora), arg(salt), str(len(tokens))] +
                    [str(t) for t in tokens]) + "\n"


def expected_line(c) -> str:
    algo, block, seed, lora, salt, tokens = c
    fn = HASH_FNS[algo]
    hs = block_hashes(fn, seed, tokens, block, lora, salt)
    return " ".join([none_hash(fn, seed).hex()] + [f"{h.hex()},{to_u64(h)}" for h in hs])


def run_driver(path, cases):
    out = subprocess.run([str(binary(path))], input="".join(case_line(c) for c in cases).encode(),
                         capture_output=True, check=True).stdout.decode().splitlines()
    assert len(out) == len(cases), "one line per case"
    return out


def check(cases):
    want = [expected_line(c) for c in cases]
    for path in DRIVERS:
        got = run_driver(path, cases)
        for c, g, w in zip(cases, got, want):
            assert g == w, (path, c[:5], len(c[5]))


# ---- random cases ------------------------------------------------------------------------------

# Every CBOR integer head: inline (0-23), one byte, two bytes, four bytes, and their edges.
TOKEN_CLASSES = [(0, 23), (24, 255), (256, 65535), (65536, 2**32 - 1)]
TOKEN_EDGES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1]
# Text lengths around every head width: inline (< 24), one byte (< 256), two bytes (< 65536).
TEXT_LENGTHS = [0, 1, 23, 24, 43, 255, 256, 1000, 65535, 65536]
ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_",  # base64url salts
    "aé漢🙂\u0000\u00ff\u0800\uffff\U0010ffff /",                       # 1 to 4 UTF-8 bytes
]


def rand_tokens(rng, n):
    mode = rng.random()
    if mode < 0.1:
        return [rng.choice(TOKEN_EDGES) for _ in range(n)]
    if mode < 0.3:
        lo, hi = rng.choice(TOKEN_CLASSES)
        return [rng.randint(lo, hi) for _ in range(n)]
    if mode < 0.5:  # a vocabulary's range, as real prompts have
        return [rng.randrange(0, 152_000) for _ in range(n)]
    return [rng.randint(*rng.choice(TOKEN_CLASSES)) for _ in range(n)]


def rand_text(rng, lengths=TEXT_LENGTHS, big=True):
    n = rng.choice(lengths if big else [x for x in lengths if x < 1000])
    alphabet = rng.choice(ALPHABETS)
    # n characters: the head counts UTF-8 bytes, which multi-byte characters spread further.
    return "".join(rng.choice(alphabet) for _ in range(n))


def rand_seed(rng):
    r = rng.random()
    if r < 0.4:
        return str(rng.choice([0, 1, 42, 1234, 2**32 - 1, rng.randrange(0, 2**32)]))
    if r < 0.5:
        return rng.choice(["", "random"])
    return rand_text(rng, big=rng.random() < 0.05)


def rand_case(rng, algo=None):
    algo = algo or rng.choice(list(HASH_FNS))
    block = rng.randint(1, 64)
    nblocks = rng.choice([0, 1, 2, 3, 5, 8, 25, rng.randint(0, 40)])
    ntok = block * nblocks + rng.choice([0, 0, 1, block - 1 if block > 1 else 0])
    lora = None if rng.random() < 0.5 else rand_text(rng, big=rng.random() < 0.05)
    salt = None if rng.random() < 0.4 else rand_text(rng, big=rng.random() < 0.05)
    return (algo, block, rand_seed(rng), lora, salt, rand_tokens(rng, ntok))


def test_real_engine_through_drivers():
    """The real engine's record: both drivers print its 25 event hashes, and so does the
    reference (so the reference is vLLM's function, not only the C code's twin)."""
    ev = json.loads(EVENT_JSON.read_text())
    case = ("sha256_cbor", ev["block_size"], ev["hash_seed"], ev["lora_name"], None,
            ev["token_ids"])
    line = expected_line(case)
    assert [int(p.split(",")[1]) for p in line.split()[1:]] == ev["block_hashes"]
    check([case])


@pytest.mark.parametrize("algo", list(HASH_FNS))
def test_random_cases(algo):
    rng = random.Random(16 if algo == "sha256_cbor" else 17)
    check([rand_case(rng, algo) for _ in range(2500)])


def test_large_blocks_and_long_chains():
    """Array heads of two and four bytes (blocks of 256+ and 65536+ tokens), a chain of 2,048
    blocks (a 32 K-token prompt), and texts long enough for the encoders to stream in slices."""
    rng = random.Random(18)
    cases = []
    for algo in HASH_FNS:
        cases.append((algo, 256, "42", None, None, rand_tokens(rng, 256 * 3 + 7)))
        cases.append((algo, 1000, "0", "adapter", "s" * 300, rand_tokens(rng, 4000)))
        cases.append((algo, 65535, "1", None, "salt", rand_tokens(rng, 65535)))
        cases.append((algo, 65536, "1", "ü" * 70000, "é" * 40000, rand_tokens(rng, 65536 + 3)))
        cases.append((algo, 70001, "7", None, None, rand_tokens(rng, 140002)))
        cases.append((algo, 16, "42", None, "x" * 43, rand_tokens(rng, 32768)))
        cases.append((algo, 1, "9", "l", "s", rand_tokens(rng, 3000)))
        cases.append((algo, 16, "🙂" * 20000, None, None, rand_tokens(rng, 64)))
    check(cases)


def test_extra_key_forms():
    """None versus the empty string: an empty LoRA name is a key (the adapter is set), an empty
    salt is none (vLLM tests the salt's truth); seeds "" and "0" differ."""
    toks = list(range(100, 164))
    base = ("sha256_cbor", 16, "42", None, None, toks)
    cases = [base, base[:3] + ("", None, toks), base[:3] + (None, "", toks),
             base[:3] + ("", "", toks), ("sha256_cbor", 16, "", None, None, toks),
             ("sha256_cbor", 16, "0", None, None, toks)]
    lines = [expected_line(c) for c in cases]
    assert lines[0] != lines[1] and lines[0] == lines[2] and lines[1] == lines[3]
    assert lines[4] != lines[5]
    check(cases)


def test_docs_example():
    """docs/hashing.md spells out the CBOR of a tiny block and its hashes: they must be what
    vLLM's functions give."""
    doc = (REPO_ROOT / "docs" / "hashing.md").read_text()
    parent = none_hash(sha256_cbor, "42")
    obj = (parent, (1, 23, 24, 300, 70000), ("lora-a", "salt"))
    enc = cbor2.dumps(obj, canonical=True)
    assert " ".join(f"{b:02x}" for b in cbor2.dumps("42", canonical=True)) in doc
    assert parent.hex() in doc
    tail = enc[35:]  # after the array head and the 34-byte parent
    assert " ".join(f"{b:02x}" for b in tail) in doc
    h = sha256_cbor(obj)
    assert h.hex() in doc
    assert str(to_u64(h)) in doc
    xparent = none_hash(xxhash_cbor, "42")
    assert xparent.hex() in doc
    xh = xxhash_cbor((xparent, (1, 23, 24, 300, 70000), ("lora-a", "salt")))
    assert xh.hex() in doc
    assert str(to_u64(xh)) in doc
    check([("sha256_cbor", 5, "42", "lora-a", "salt", [1, 23, 24, 300, 70000]),
           ("xxhash_cbor", 5, "42", "lora-a", "salt", [1, 23, 24, 300, 70000])])
