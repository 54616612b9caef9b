# SPDX-License-Identifier: Apache-2.0
"""The KV-event decoder (router/kv_events.c) against Python's msgpack (python3-msgpack).

Payloads are built here: the real engine's BlockStored of tests/data/vllm/kv_event_base.json
encoded as vLLM's msgspec encodes a KVEventBatch (array_like with the tag first and
omit_defaults; and the map form of later vLLM), and thousands of random batches written with
every msgpack integer, string, binary, array and map width, hashes >= 2^63, negative ones and
byte-string ones, nil parents, unknown trailing fields; then the same batches truncated, with a
byte changed, with a field of the wrong type. Python's msgpack decodes each payload, the rules
of docs/kv-events.md are applied to what it decoded (reference() below), and the verdict and
every decoded field must equal what build/tests/unit/router/kv_events_driver prints.
"""
import json
import math
import os
import pathlib
import random
import struct
import subprocess

import msgpack
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("KVGATE_BUILD_DIR", ROOT / "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
DRIVER = BUILD / "tests/unit/router/kv_events_driver"
FIXTURE = ROOT / "tests/data/vllm/kv_event_base.json"

MASK = (1 << 64) - 1
MAX_DEPTH = 32


def run_driver(payloads):
    data = b"".join(struct.pack(">I", len(p)) + p for p in payloads)
    out = subprocess.run([str(DRIVER)], input=data, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    lines = out.stdout.decode().splitlines()
    assert len(lines) == len(payloads)
    return [json.loads(line) for line in lines]


# ---- the reference: Python's msgpack, then the rules of docs/kv-events.md ------------------


class Refused(Exception):
    pass


class Pairs(list):
    """A msgpack map as its list of (key, value) pairs, in order, duplicates kept."""


def is_int(v):
    return type(v) is int


def hash_of(v):
    if is_int(v):
        return v & MASK
    if type(v) is bytes and len(v) > 0:
        return int.from_bytes(v, "big") & MASK
    raise Refused("hash")


def skip(v, depth):
    if isinstance(v, (list, Pairs)):
        if depth >= MAX_DEPTH:
            raise Refused("depth")
        items = [x for kv in v for x in kv] if isinstance(v, Pairs) else v
        for x in items:
            skip(x, depth + 1)


def hashes(v):
    if type(v) is not list:
        raise Refused("hashes")
    return [hash_of(h) for h in v]


def opt_int(v):
    if v is None:
        return None
    if not is_int(v) or not -(1 << 63) <= v < (1 << 63):
        raise Refused("int")
    return v


def medium(v):
    if v is None:
        return "absent"
    if type(v) is not str:
        raise Refused("medium")
    return {"GPU": "GPU", "CPU": "CPU"}.get(v, "other")


def tokens(v):
    if type(v) is not list or not all(is_int(t) for t in v):
        raise Refused("tokens")
    return len(v)


def block_size(v):
    if not is_int(v) or not 0 <= v <= 0xFFFFFFFF:
        raise Refused("block_size")
    return v


STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"]
REMOVED = ["block_hashes", "medium"]
KINDS = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": []}


def apply_field(ev, name, v):
    if name == "block_hashes":
        ev["hashes"] = hashes(v)
    elif name == "parent_block_hash":
        ev["parent"] = None if v is None else hash_of(v)
    elif name == "token_ids":
        ev["ntokens"] = tokens(v)
    elif name == "block_size":
        ev["block_size"] = block_size(v)
    elif name == "lora_id":
        ev["lora_id"] = opt_int(v)
    elif name == "medium":
        ev["medium"] = medium(v)


def event(v):
    if type(v) is list:
        if not v or type(v[0]) is not str or v[0] not in KINDS:
            raise Refused("tag")
        fields = KINDS[v[0]]
        required = len(fields) - 1 if fields else 0
        if len(v) - 1 < required:
            raise Refused("missing")
        ev = {"kind": v[0], "medium": "absent", "hashes": []}
        for i, x in enumerate(v[1:]):
            if i < len(fields):
                apply_field(ev, fields[i], x)
            else:
                skip(x, 3)
    elif isinstance(v, Pairs):
        if not v or v[0][0] != "type" or type(v[0][1]) is not str or v[0][1] not in KINDS:
            raise Refused("type")
        kind = v[0][1]
        fields = KINDS[kind]
        ev = {"kind": kind, "medium": "absent", "hashes": []}
        seen = set()
        for k, x in v[1:]:
            if type(k) is not str:
                raise Refused("key")
            if k in fields:
                if k in seen:
                    raise Refused("duplicate")
                seen.add(k)
                apply_field(ev, k, x)
            else:
                skip(x, 3)
        if set(fields) - {"medium"} - seen:
            raise Refused("missing")
    else:
        raise Refused("event")
    if ev["kind"] == "BlockStored":
        ev = {
            "kind": ev["kind"],
            "medium": ev["medium"],
            "hashes": ev["hashes"],
            "parent": ev["parent"],
            "ntokens": ev["ntokens"],
            "block_size": ev["block_size"],
            "lora_id": ev["lora_id"],
        }
    return ev


def ts_bits(v):
    if type(v) is float:
        return struct.unpack("<Q", struct.pack("<d", v))[0]
    if is_int(v):
        return struct.unpack("<Q", struct.pack("<d", float(v)))[0]
    raise Refused("ts")


def events(v):
    if type(v) is not list:
        raise Refused("events")
    return [event(e) for e in v]


def reference(payload):
    """What the decoder must make of payload: a dict like the driver's line, or None."""
    try:
        v = msgpack.unpackb(payload, raw=False, strict_map_key=False, object_pairs_hook=Pairs)
    except Exception:
        return None
    try:
        out = {"rc": "ok", "dp_rank": None}
        if type(v) is list:
            if len(v) < 2:
                raise Refused("batch")
            out["ts_bits"] = ts_bits(v[0])
            out["events"] = events(v[1])
            if len(v) >= 3:
                out["dp_rank"] = opt_int(v[2])
            for x in v[3:]:
                skip(x, 1)
        elif isinstance(v, Pairs):
            seen = set()
            for k, x in v:
                if type(k) is not str:
                    raise Refused("key")
                if k in ("ts", "events", "data_parallel_rank"):
                    if k in seen:
                        raise Refused("duplicate")
                    seen.add(k)
                if k == "ts":
                    out["ts_bits"] = ts_bits(x)
                elif k == "events":
                    out["events"] = events(x)
                elif k == "data_parallel_rank":
                    out["dp_rank"] = opt_int(x)
                else:
                    skip(x, 1)
            if "ts" not in seen or "events" not in seen:
                raise Refused("missing")
        else:
            raise Refused("batch")
    except Refused:
        return None
    out["nhashes"] = sum(len(e["hashes"]) for e in out["events"])
    return out


def same_ts(a, b):
    if a == b:
        return True
    fa, fb = (struct.unpack("<d", struct.pack("<Q", x))[0] for x in (a, b))
    return math.isnan(fa) and math.isnan(fb)


def check(payloads, got):
    """Compare every verdict; returns (accepted, refused)."""
    acc = ref = 0
    for i, (p, g) in enumerate(zip(payloads, got)):
        want = reference(p)
        ctx = f"payload {i}: {p[:80].hex()}... -> {g}"
        if want is None:
            assert g["rc"] in ("EPARSE", "ELIMIT"), ctx
            assert g["error"], ctx
            ref += 1
            continue
        assert g["rc"] == "ok", f"{ctx} (expected {str(want)[:300]})"
        assert same_ts(g.pop("ts_bits"), want.pop("ts_bits")), ctx
        assert g == want, ctx
        acc += 1
    return acc, ref


# ---- an encoder with a choice of widths -----------------------------------------------------


class Ext:
    def __init__(self, code, data):
        self.code, self.data = code, data


class F32(float):
    """A float written as msgpack float 32."""


def enc_int(v, rnd):
    c = []
    if 0 <= v <= 0x7F:
        c.append(bytes([v]))
    if -32 <= v < 0:
        c.append(struct.pack(">b", v))
    for tag, lo, hi, fmt in (
        (0xCC, 0, 1 << 8, ">B"),
        (0xCD, 0, 1 << 16, ">H"),
        (0xCE, 0, 1 << 32, ">I"),
        (0xCF, 0, 1 << 64, ">Q"),
        (0xD0, -(1 << 7), 1 << 7, ">b"),
        (0xD1, -(1 << 15), 1 << 15, ">h"),
        (0xD2, -(1 << 31), 1 << 31, ">i"),
        (0xD3, -(1 << 63), 1 << 63, ">q"),
    ):
        if lo <= v < hi:
            c.append(bytes([tag]) + struct.pack(fmt, v))
    return rnd.choice(c) if rnd else msgpack.packb(v)


def enc_len(n, rnd, fix_tag, fix_max, wide_tags, allow_fix=True):
    c = []
    if allow_fix and n <= fix_max and fix_tag is not None:
        c.append(bytes([fix_tag | n]))
    for tag, fmt, hi in wide_tags:
        if tag is not None and n < hi:
            c.append(bytes([tag]) + struct.pack(fmt, n))
    return rnd.choice(c) if rnd else c[0]


def pack(v, rnd=None):
    """msgpack bytes of v; with rnd, a random valid width for every length and integer."""
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if is_int(v):
        return enc_int(v, rnd)
    if isinstance(v, F32):
        return b"\xca" + struct.pack(">f", v)
    if type(v) is float:
        return b"\xcb" + struct.pack(">d", v)
    if type(v) is str:
        b = v.encode()
        return enc_len(len(b), rnd, 0xA0, 31, [(0xD9, ">B", 1 << 8), (0xDA, ">H", 1 << 16), (0xDB, ">I", 1 << 32)]) + b
    if type(v) is bytes:
        return enc_len(len(v), rnd, None, 0, [(0xC4, ">B", 1 << 8), (0xC5, ">H", 1 << 16), (0xC6, ">I", 1 << 32)]) + v
    if isinstance(v, Pairs):
        return enc_len(len(v), rnd, 0x80, 15, [(0xDE, ">H", 1 << 16), (0xDF, ">I", 1 << 32)]) + b"".join(
            pack(k, rnd) + pack(x, rnd) for k, x in v
        )
    if type(v) is list:
        return enc_len(len(v), rnd, 0x90, 15, [(0xDC, ">H", 1 << 16), (0xDD, ">I", 1 << 32)]) + b"".join(
            pack(x, rnd) for x in v
        )
    if isinstance(v, Ext):
        n = len(v.data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        c = [bytes([0xC7, n]) if n < 256 else None, b"\xc8" + struct.pack(">H", n) if n < 65536 else None]
        if n in fixed:
            c.append(bytes([fixed[n]]))
        hdr = (rnd or random.Random(0)).choice([x for x in c if x is not None])
        return hdr + struct.pack(">b", v.code) + v.data
    raise TypeError(type(v))


# ---- random batches -------------------------------------------------------------------------


def rand_hash(r):
    k = r.random()
    if k < 0.45:
        return r.randrange(1 << 63, 1 << 64)
    if k < 0.7:
        return r.randrange(0, 1 << 63)
    if k < 0.8:
        return r.choice([0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, MASK])
    if k < 0.9:
        return -r.randrange(1, 1 << 63)  # Python's hash() in vLLM before 0.9
    return bytes(r.randrange(256) for _ in range(r.choice([1, 4, 8, 9, 16, 32])))


def rand_junk(r, depth=0):
    k = r.randrange(10 if depth < 3 else 7)
    if k == 0:
        return None
    if k == 1:
        return r.choice([True, False])
    if k == 2:
        return r.randrange(-(1 << 63), 1 << 64)
    if k == 3:
        return r.choice([r.random() * 1e6, F32(r.random()), float("inf")])
    if k == 4:
        return "".join(r.choice("abc\u00e9\u4e2d\U0001f600") for _ in range(r.randrange(40)))
    if k == 5:
        return bytes(r.randrange(256) for _ in range(r.randrange(20)))
    if k == 6:
        return Ext(r.randrange(0, 128), bytes(r.randrange(256) for _ in range(r.choice([1, 2, 4, 8, 16, 3, 300]))))
    if k in (7, 8):
        return [rand_junk(r, depth + 1) for _ in range(r.randrange(4))]
    return Pairs((rand_junk(r, depth + 1) if r.random() < 0.2 else f"k{i}", rand_junk(r, depth + 1)) for i in range(r.randrange(4)))


def rand_medium(r):
    return r.choice(["GPU", "GPU", "CPU", None, "disk", "LocalDisk"])


def rand_event(r, as_map):
    kind = r.choices(["BlockStored", "BlockRemoved", "AllBlocksCleared"], [6, 3, 1])[0]
    if kind == "BlockStored":
        n = r.choice([0, 1, 1, 2, 3, 8, 25, 64, 300])
        bs = r.choice([16, 16, 32, 1, 0, 65536, (1 << 32) - 1])
        f = [
            ("block_hashes", [rand_hash(r) for _ in range(n)]),
            ("parent_block_hash", None if r.random() < 0.4 else rand_hash(r)),
            ("token_ids", [r.randrange(0, 1 << r.choice([7, 8, 16, 17, 31, 32])) for _ in range(min(n * min(bs, 16), 2000))]),
            ("block_size", bs),
            ("lora_id", None if r.random() < 0.6 else r.randrange(-(1 << 63), 1 << 63)),
        ]
        opt = [
            ("medium", rand_medium(r)),
            ("lora_name", None if r.random() < 0.5 else "adapter-" + str(r.randrange(9))),
            ("extra_keys", [None if r.random() < 0.5 else ["salt", r.randrange(99)] for _ in range(n)]),
            ("group_idx", r.randrange(4)),
            ("kv_cache_spec_kind", "full_attention"),
            ("kv_cache_spec_sliding_window", r.randrange(4096)),
        ]
    elif kind == "BlockRemoved":
        f = [("block_hashes", [rand_hash(r) for _ in range(r.choice([0, 1, 2, 5, 40]))])]
        opt = [("medium", rand_medium(r)), ("group_idx", r.randrange(4))]
    else:
        f, opt = [], []
    if as_map:
        fields = f + [x for x in opt if r.random() < 0.6]
        if r.random() < 0.3:
            fields.append((f"future_{r.randrange(9)}", rand_junk(r)))
        r.shuffle(fields)
        return Pairs([("type", kind)] + fields)
    # array_like with omit_defaults: trailing fields may be left off
    keep = r.randrange(len(opt) + 1)
    fields = [x for _, x in f] + [x for _, x in opt[:keep]]
    if keep == len(opt) and r.random() < 0.3:  # fields of a vLLM newer than this test
        fields += [rand_junk(r) for _ in range(r.randrange(1, 3))]
    return [kind] + fields


def rand_batch(r):
    as_map = r.random() < 0.3
    # vLLM has written all three: array batch of array events, array batch of map events, map
    # batch of map events.
    evs = [rand_event(r, r.random() < (0.9 if as_map else 0.3)) for _ in range(r.choice([0, 1, 1, 2, 3, 10, 40]))]
    ts = r.choice([r.uniform(1.6e9, 1.8e9), F32(r.uniform(0, 1e6)), r.randrange(0, 1 << 40), -1.5])
    rank = r.choice([None, 0, 1, 7, -3])
    if as_map:
        fields = [("ts", ts), ("events", evs)]
        if rank is not None or r.random() < 0.3:
            fields.append(("data_parallel_rank", rank))
        if r.random() < 0.2:
            fields.append(("hostname", rand_junk(r)))
        r.shuffle(fields)
        return Pairs(fields)
    b = [ts, evs]
    if rank is not None or r.random() < 0.2:
        b.append(rank)
        if r.random() < 0.1:
            b += [rand_junk(r) for _ in range(r.randrange(1, 3))]
    return b


WRONG = [None, True, -1, 1 << 63, 1.5, "x", b"\x01", [], Pairs(), [1, "a"], ["GPU"], Ext(5, b"\x00")]


def wrong_type(r, v):
    """v with one element somewhere replaced by a value of another type."""
    if isinstance(v, Pairs):
        if not v:
            return r.choice(WRONG)
        i = r.randrange(len(v))
        out = Pairs(v)
        k, x = out[i]
        out[i] = (k, wrong_type(r, x)) if r.random() < 0.7 else (r.choice(WRONG), x)
        return out
    if type(v) is list and v and r.random() < 0.8:
        i = r.randrange(len(v))
        return v[:i] + [wrong_type(r, v[i])] + v[i + 1 :]
    return r.choice(WRONG)


def mutate(r, batch, payload):
    k = r.randrange(6)
    if k == 0 and len(payload) > 1:
        return payload[: r.randrange(1, len(payload))]
    if k == 1:
        p = bytearray(payload)
        for _ in range(r.randrange(1, 3)):
            p[r.randrange(len(p))] = r.randrange(256)
        return bytes(p)
    if k == 2:
        return payload + bytes([r.randrange(256)])
    if k == 3:
        p = bytearray(payload)
        p[r.randrange(len(p))] = r.choice([0xC1, 0xC0, 0xDD, 0xDF, 0xDB, 0xC6, 0xCF, 0xD3, 0xFF, 0x9F])
        return bytes(p)
    return pack(wrong_type(r, batch), r)


# ---- the tests ------------------------------------------------------------------------------


def fixture_events():
    d = json.loads(FIXTURE.read_text())
    assert d["event_type"] == "BlockStored"
    return d


def test_real_engine_event():
    d = fixture_events()
    ts = 1733130000.25
    # vLLM with array_like (0.9 .. 0.10): [tag, block_hashes, parent, token_ids, block_size,
    # lora_id, medium] and then lora_name in later ones; the batch's rank set by the publisher.
    stored = ["BlockStored", d["block_hashes"], d["parent_block_hash"], d["token_ids"], d["block_size"], None, d["medium"]]
    payloads = [
        msgpack.packb([ts, [stored]]),
        msgpack.packb([ts, [stored], 0]),
        msgpack.packb([ts, [stored + [d["lora_name"]]], 0]),
        # vLLM with array_like on the batch only: events are maps, the tag first under "type",
        # defaults left out.
        msgpack.packb(
            [
                ts,
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": d["block_hashes"],
                        "parent_block_hash": d["parent_block_hash"],
                        "token_ids": d["token_ids"],
                        "block_size": d["block_size"],
                        "lora_id": None,
                        "medium": d["medium"],
                        "lora_name": d["lora_name"],
                    }
                ],
                0,
            ]
        ),
        # vLLM without array_like: the batch a map too.
        msgpack.packb(
            {
                "ts": ts,
                "events": [
                    {
                        "type": "BlockStored",
                        "block_hashes": d["block_hashes"],
                        "parent_block_hash": d["parent_block_hash"],
                        "token_ids": d["token_ids"],
                        "block_size": d["block_size"],
                        "lora_id": None,
                        "medium": d["medium"],
                        "lora_name": d["lora_name"],
                    }
                ],
                "data_parallel_rank": 0,
            }
        ),
    ]
    got = run_driver(payloads)
    for i, g in enumerate(got):
        assert g["rc"] == "ok", g
        assert struct.unpack("<d", struct.pack("<Q", g["ts_bits"]))[0] == ts
        assert g["dp_rank"] == (None if i == 0 else 0)
        (ev,) = g["events"]
        assert ev["kind"] == "BlockStored"
        assert ev["hashes"] == d["block_hashes"]
        assert len(ev["hashes"]) == 25
        assert any(h >= 1 << 63 for h in ev["hashes"])
        assert ev["parent"] is None
        assert ev["ntokens"] == len(d["token_ids"]) == 400
        assert ev["block_size"] == 16
        assert ev["medium"] == "GPU"
        assert ev["lora_id"] is None
    check(payloads, run_driver(payloads))


def test_removed_and_cleared():
    d = fixture_events()
    hs = d["block_hashes"]
    payloads = [
        msgpack.packb([1.0, [["BlockRemoved", hs[:5], "GPU"], ["AllBlocksCleared"], ["BlockRemoved", hs[5:7]]]]),
        msgpack.packb({"ts": 2.0, "events": [{"type": "BlockRemoved", "block_hashes": hs, "medium": "CPU"}, {"type": "AllBlocksCleared"}]}),
    ]
    got = run_driver(payloads)
    assert [e["kind"] for e in got[0]["events"]] == ["BlockRemoved", "AllBlocksCleared", "BlockRemoved"]
    assert got[0]["events"][0]["hashes"] == hs[:5]
    assert got[0]["events"][2]["medium"] == "absent"
    assert got[1]["events"][0]["medium"] == "CPU"
    assert got[1]["events"][0]["hashes"] == hs
    check(payloads, got)


@pytest.mark.parametrize("seed", range(4))
def test_random_batches(seed):
    r = random.Random(1000 + seed)
    batches = [rand_batch(r) for _ in range(800)]
    payloads = []
    for b in batches:
        payloads.append(msgpack.packb(b, use_bin_type=True) if not _has_special(b) else pack(b))
        payloads.append(pack(b, r))
    acc, ref = check(payloads, run_driver(payloads))
    # Random widths and junk stay valid: nearly everything decodes (a few refusals come from
    # nesting past the depth bound).
    assert acc > 0.95 * len(payloads), (acc, ref)


@pytest.mark.parametrize("seed", range(4))
def test_malformed_batches(seed):
    r = random.Random(2000 + seed)
    payloads = []
    for _ in range(1000):
        b = rand_batch(r)
        payloads.append(mutate(r, b, pack(b, r)))
    acc, ref = check(payloads, run_driver(payloads))
    assert ref > 0.5 * len(payloads), (acc, ref)


def _has_special(v):
    if isinstance(v, (F32, Ext, Pairs)):
        return True
    if type(v) is list:
        return any(_has_special(x) for x in v)
    return False


def test_error_messages():
    ok = ["BlockStored", [1, 2, 3], None, [1] * 48, 16, None, "GPU"]
    bad_hash = list(ok)
    bad_hash[1] = [1, 2, 3, 4, 5, 6, 7, "x"]
    cases = [
        ([0.5, [ok, ok, ok, bad_hash]], "events[3][1][7]: not an integer or bytes"),
        ([0.5, [ok, ["BlockStored", [1], None, [1, 2, "t"], 16, None]]], "events[1][3][2]: not an integer"),
        ([0.5, [["BlockGone", [1]]]], "events[0][0]: unknown event type"),
        ([0.5, [["BlockStored", [1], None]]], "events[0]: missing fields"),
        (["x", []], "ts: not a number"),
        ([0.5, [ok], "r"], "data_parallel_rank: not an integer"),
        (Pairs([("ts", 0.5), ("events", [Pairs([("type", "BlockRemoved"), ("medium", 5), ("block_hashes", [])])])]), "events[0].medium: not a string"),
        (Pairs([("ts", 0.5), ("events", [Pairs([("type", "BlockRemoved")])])]), "events[0].block_hashes: missing"),
        (Pairs([("events", [])]), "ts missing"),
    ]
    got = run_driver([pack(c) for c, _ in cases])
    for (c, msg), g in zip(cases, got):
        assert g["rc"] == "EPARSE", (c, g)
        assert g["error"] == msg
    deep = [0.5, [], None]
    nest = 0
    for _ in range(40):
        nest = [nest]
    deep.append(nest)
    (g,) = run_driver([pack(deep)])
    assert g["rc"] == "ELIMIT"
    assert reference(pack(deep)) is None
