# SPDX-License-Identifier: Apache-2.0
"""Block keys against a second implementation.

docs/hashing.md specifies the block-key function so that another implementation (a Redis-side
script, a GPU kernel, an engine-side exporter) can produce the same keys. This test is that
second implementation: Python's xxhash package (Debian's python3-xxhash, not the C library's
code path the gateway inlines) computes the root, the per-block hashes and the links from the
spec's text, with the 128-bit product in Python integers, and tests/unit/gpu_hash/hash_driver
must print the same keys, for the document's vectors and for random inputs (bytes and token
ids, empty and long salts, multi-byte UTF-8, block sizes from 1 to a few KB, the 64-byte
constant-length path as text and as 16 tokens).
"""
import random
import struct
import subprocess

import pytest
from conftest import REPO_ROOT, binary

xxhash = pytest.importorskip("xxhash", reason="python3-xxhash is not installed")

ROOT_TAG = b"kvgate-block-v2\x00"
LINK_PRIME = 0x9E3779B185EBCA87  # XXH_PRIME64_1
MASK64 = (1 << 64) - 1


def le32(v: int) -> bytes:
    return struct.pack("<I", v)


def link(a: int) -> int:
    """lo64(a * P) XOR hi64(a * P) of the full 128-bit product."""
    p = a * LINK_PRIME
    return (p & MASK64) ^ (p >> 64)


def spec_keys(unit: str, block: int, salt: bytes, model: bytes, adapter: bytes, data):
    """The function exactly as docs/hashing.md states it."""
    pre = (ROOT_TAG + le32(0 if unit == "bytes" else 1) + le32(block) +
           le32(len(salt)) + salt + le32(len(model)) + model + le32(len(adapter)) + adapter)
    root = xxhash.xxh3_64_intdigest(pre)
    if unit == "tokens":
        raw = b"".join(le32(t) for t in data)
        width = 4 * block
    else:
        raw = data
        width = block
    # d[i] for every block first (any order would do), then the chain of links.
    d = [xxhash.xxh3_64_intdigest(raw[i * width:(i + 1) * width], seed=root)
         for i in range(len(raw) // width)]
    keys, h = [], root
    for di in d:
        h = link(h ^ di)
        keys.append(h)
    return root, keys


def driver_keys(unit, block, salt, model, adapter, data):
    stdin = data if unit == "bytes" else " ".join(map(str, data)).encode()
    out = subprocess.run([str(binary("tests/unit/gpu_hash/hash_driver")), unit, str(block),
                          salt.decode(), model.decode(), adapter.decode()],
                         input=stdin, capture_output=True, check=True).stdout.decode().split()
    assert out[0] == "root"
    return int(out[1], 16), [int(k, 16) for k in out[2:]]


DOC_VECTORS = [
    ("bytes", 4, b"", b"", b"", b"abcdefghij"),
    ("tokens", 16, b"tenant-a-salt", b"sim-model", b"", list(range(40))),
    ("bytes", 64, b"kvgate-test-salt", b"demo-model", b"lora-1",
     b"The quick brown fox jumps over the lazy dog. " * 4),
]


@pytest.mark.parametrize("vector", DOC_VECTORS, ids=["plain", "tokens", "salted"])
def test_doc_vectors(vector):
    want = spec_keys(*vector)
    assert driver_keys(*vector) == want
    assert want[1], "every vector has at least one full block"


def test_docs_list_the_vectors():
    """docs/hashing.md prints these exact keys: a change of the function must change the doc."""
    doc = (REPO_ROOT / "docs" / "hashing.md").read_text()
    for vector in DOC_VECTORS:
        root, keys = spec_keys(*vector)
        assert f"{root:016x}" in doc
        for k in keys:
            assert f"{k:016x}" in doc


def test_random_inputs():
    rng = random.Random(4)
    for _ in range(60):
        unit = rng.choice(["bytes", "tokens"])
        block = rng.choice([1, 2, 7, 16, 64, 100, 256, 1024, 4096])
        salt = "".join(rng.choice("abcXYZ-_0189") for _ in range(rng.choice([0, 1, 43, 200])))
        model = rng.choice(["", "m", "meta-llama/Llama-3.1-8B-Instruct", "Ünïcode-模型"])
        adapter = rng.choice(["", "lora-a"])
        if unit == "bytes":
            words = ["the", "KV", "cache", "é", "漢字", "\n", " ", "{\"a\":1}", "🙂"]
            data = "".join(rng.choice(words) for _ in range(rng.randrange(0, 3000))).encode()
        else:
            data = [rng.randrange(0, 2**32) for _ in range(rng.randrange(0, 700))]
        args = (unit, block, salt.encode(), model.encode(), adapter.encode(), data)
        assert driver_keys(*args) == spec_keys(*args), args[:5]
