# SPDX-License-Identifier: Apache-2.0
"""kvgate-simworker's KV-cache events, read as vLLM's subscribers read them.

The subscriber is pyzmq + python3-msgpack, independent of the worker's C code. What is checked:
- the wire layout of vLLM's ZmqEventPublisher: (topic, 8-byte big-endian sequence number,
  msgpack payload) on PUB; the payload a KVEventBatch [ts, events, data_parallel_rank] and each
  event a tagged array (msgspec array_like + tag + omit_defaults, vllm/distributed/kv_events.py);
- BlockStored hashes against an independent restatement of vLLM's block hash (test_vllm_hash)
  and the worker's own x-simworker-block-hashes; token ids against /tokenize; parent chaining;
- an index built only from the events predicts every cached_tokens the worker then reports,
  through evictions (small --kv-blocks);
- both event forms: positional arrays (--kv-events-format array, vLLM before PR #42892) and
  named-field maps (map, vLLM since), read by name;
- contiguous sequence numbers from 0; drops (--kv-events-drop-rate) recovered by the replay
  ROUTER socket; /reset_prefix_cache -> AllBlocksCleared (409 while a request holds blocks); a
  restarted worker starts at 0 again; the topic frame and --kv-events-delay-ms;
- the fixtures tests/data/vllm/kv_event_batch_*.msgpack: built from kv_event_base.json (a real
  engine's event) by packb below; the worker's payloads re-encode to the same bytes with it.

packb packs exactly as msgspec's msgpack encoder does (msgspec is not on Debian, so this rests
on its source, msgspec/_core.c mpack_encode_*): integers in their smallest form (positive
fixint, uint8/16/32/64 for non-negative values), every Python float as float64 (0xcb), None as
nil, str as fixstr/str8/str16/str32, lists and array_like structs as fixarray/array16/array32
(an array_like struct with every field, defaults included: msgspec ignores omit_defaults there,
msgspec issue #720), other structs as maps in field order without the fields at their default.
python3-msgpack's Packer(use_bin_type=True, use_single_float=False) makes the same choices
(checked byte by byte against hand-written encodings in test_packer_matches_msgspec_rules).
Regenerate the fixture with KVGATE_REGEN_FIXTURES=1.
"""
import json
import os
import random
import socket
import struct
import time

import httpx
import msgpack
import pytest
import zmq

from conftest import REPO_ROOT, binary
from test_tokenizer_oracle import tokenizer_file
from test_vllm_hash import HASH_FNS, block_hashes, to_u64

SEED = "42"
BS = 16
DATA = REPO_ROOT / "tests" / "data" / "vllm"
FIXTURE_TS = 1764676800.25  # the batch timestamp written into the fixtures
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def packb(obj) -> bytes:
    return msgpack.Packer(use_bin_type=True, use_single_float=False, autoreset=True).pack(obj)


# ---- the fixture ---------------------------------------------------------------------------------

def base_event():
    d = json.loads((DATA / "kv_event_base.json").read_text())
    # BlockStored as vLLM declares it: block_hashes, parent_block_hash, token_ids, block_size,
    # lora_id, medium, lora_name, then extra_keys, group_idx, kv_cache_spec_kind and
    # kv_cache_spec_sliding_window, which default to None. msgspec writes every field of an
    # array_like struct, omit_defaults or not (msgspec issue #720). The recorded event gives
    # neither lora_id nor the later fields; None is written.
    return ["BlockStored", d["block_hashes"], d["parent_block_hash"], d["token_ids"],
            d["block_size"], None, d["medium"], d["lora_name"], None, None, None, None]


# Field names in declaration order (vllm/distributed/kv_events.py), for the map form that
# vLLM writes since PR #42892 (2026-06): msgspec's tag=True puts {"type": class name} first, then
# the fields in order; omit_defaults drops the ones holding their default (all None here).
FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}
# The fields after those, all None here: present in the array form, left out of the map form.
LATER = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}


def as_map(ev):
    return {"type": ev[0], **dict(zip(FIELDS[ev[0]], ev[1:]))}


def as_array(ev):
    """An event of either form as [tag, the FIELDS...] (the map's fields by name; the array's
    later fields checked to be None and cut off)."""
    if isinstance(ev, dict):
        assert list(ev)[0] == "type" and list(ev)[1:] == FIELDS[ev["type"]], ev
        return [ev["type"], *(ev[f] for f in FIELDS[ev["type"]])]
    n = 1 + len(FIELDS[ev[0]])
    assert len(ev) == n + LATER[ev[0]] and all(x is None for x in ev[n:]), ev
    return ev[:n]


def fixture_batches():
    ev = base_event()
    mixed = [ev, ["BlockRemoved", ev[1][-2:], "GPU", None], ["AllBlocksCleared"]]
    return {
        "kv_event_batch_base.msgpack": [FIXTURE_TS, [ev], 0],
        "kv_event_batch_mixed.msgpack": [FIXTURE_TS, mixed, 0],
        "kv_event_batch_base_map.msgpack": [FIXTURE_TS, [as_map(ev)], 0],
        "kv_event_batch_mixed_map.msgpack": [FIXTURE_TS, [as_map(e) for e in mixed], 0],
    }


def test_fixture_is_the_packing_of_the_real_event():
    for name, batch in fixture_batches().items():
        data = packb(batch)
        if os.environ.get("KVGATE_REGEN_FIXTURES") == "1":
            (DATA / name).write_bytes(data)
        assert (DATA / name).read_bytes() == data, name
        # And it reads back as vLLM's layout.
        ts, events, rank = msgpack.unpackb(data, raw=False)
        assert ts == FIXTURE_TS and rank == 0 and as_array(events[0])[0] == "BlockStored"


def test_packer_matches_msgspec_rules():
    # Hand-written encodings of the forms msgspec chooses (msgspec/_core.c).
    assert packb(5) == b"\x05"
    assert packb(200) == b"\xcc\xc8"
    assert packb(70000) == b"\xce\x00\x01\x11\x70"
    assert packb(2**64 - 1) == b"\xcf" + b"\xff" * 8
    assert packb(2**40) == b"\xcf" + (2**40).to_bytes(8, "big")
    assert packb(0.5) == b"\xcb" + struct.pack(">d", 0.5)
    assert packb(None) == b"\xc0"
    assert packb("GPU") == b"\xa3GPU"
    assert packb("x" * 40) == b"\xd9\x28" + b"x" * 40
    assert packb(list(range(3))) == b"\x93\x00\x01\x02"
    assert packb({"type": "X"}) == b"\x81\xa4type\xa1X"  # dicts keep insertion order
    assert packb([0] * 16) == b"\xdc\x00\x10" + b"\x00" * 16


# ---- helpers ---------------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(simworker, tmp_path, replay=True, endpoint="tcp://127.0.0.1:0", **flags):
    flags.setdefault("time_scale", 0)
    if replay:
        flags.setdefault("kv_events_replay_endpoint", "tcp://127.0.0.1:0")
    pf = tmp_path / f"events-{random.getrandbits(32):08x}"
    sw = simworker(tokenizer=tokenizer_file("qwen3"), hash_seed=SEED, block_tokens=BS,
                   kv_events_endpoint=endpoint,
                   kv_events_port_file=pf, **flags)
    lines = pf.read_text().split()
    sw.events_ep = lines[0]
    sw.replay_ep = lines[1] if len(lines) > 1 else None
    return sw


class Sub:
    """A SUB socket collecting (topic, seq, payload, received at)."""

    def __init__(self, endpoint, topic=b""):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.got = []
        self.idle(0.4)  # PUB drops what it sends before the subscription reaches it

    def idle(self, seconds):
        """Wait while calling into the socket: libzmq attaches a reconnected pipe, and sends the
        subscription on it, only when the application calls into the SUB socket."""
        end = time.time() + seconds
        while time.time() < end:
            if self.sock.poll(20):
                break

    def drain(self, idle=0.3, first=3.0):
        """Read until nothing came for `idle` seconds (waiting up to `first` for the first)."""
        n0 = len(self.got)
        deadline = first
        while self.sock.poll(int(deadline * 1000)):
            frames = self.sock.recv_multipart()
            assert len(frames) == 3, frames
            topic, seq, payload = frames
            assert len(seq) == 8
            self.got.append((topic, int.from_bytes(seq, "big"), payload, time.time()))
            deadline = idle
        return self.got[n0:]

    def close(self):
        self.sock.close()


def decode(payload, fmt="array"):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, raw_events, rank = batch
    assert isinstance(ts, float) and rank == 0
    assert all(isinstance(ev, dict if fmt == "map" else list) for ev in raw_events), raw_events
    events = [as_array(ev) for ev in raw_events]
    for ev in events:
        assert ev[0] in ("BlockStored", "BlockRemoved", "AllBlocksCleared"), ev
        if ev[0] == "BlockStored":
            assert len(ev) == 8
            _, hashes, parent, tokens, bs, lora_id, medium, lora_name = ev
            assert bs == BS and lora_id is None and medium == "GPU" and lora_name is None
            assert parent is None or isinstance(parent, int)
            assert len(tokens) == len(hashes) * BS
        elif ev[0] == "BlockRemoved":
            assert len(ev) == 3 and ev[2] == "GPU"
        else:
            assert ev == ["AllBlocksCleared"]
    # The worker's bytes are exactly what msgspec would write for this content.
    assert packb(batch) == payload
    return ts, events


def events_of(msgs, fmt="array"):
    return [ev for _, _, payload, _ in msgs for ev in decode(payload, fmt)[1]]


def complete(sw, prompt, max_tokens=1, salt=None):
    body = {"model": sw.model, "prompt": prompt, "max_tokens": max_tokens}
    if salt:
        body["cache_salt"] = salt
    r = httpx.post(sw.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    v = r.headers.get("x-simworker-block-hashes")
    return r.json(), [int(x, 16) for x in v.split(",")] if v else []


def tokenize(sw, prompt):
    r = httpx.post(sw.url + "/tokenize", json={"model": sw.model, "prompt": prompt}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega").split()


def text(rng, n_words):
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(n_words))


# ---- tests -----------------------------------------------------------------------------------------

def test_stored_events_carry_vllms_hashes_tokens_and_parents(simworker, tmp_path):
    sw = start(simworker, tmp_path)
    sub = Sub(sw.events_ep)
    rng = random.Random(1)
    first = text(rng, 60)
    body, header = complete(sw, first)
    msgs = sub.drain()
    ids = tokenize(sw, first)
    oracle = [to_u64(h) for h in block_hashes(HASH_FNS["sha256_cbor"], SEED, ids, BS, None, None)]
    assert len(oracle) == len(ids) // BS >= 3
    stored = [ev for ev in events_of(msgs) if ev[0] == "BlockStored"]
    assert len(stored) == 1  # one request, one engine step making its prompt's blocks full
    _, hashes, parent, tokens, *_ = stored[0]
    assert hashes == header == oracle
    assert parent is None
    assert tokens == ids[:len(hashes) * BS]
    # The next turn extends the prompt: its new blocks chain to the last shared one.
    second = first + " " + text(rng, 40)
    body2, header2 = complete(sw, second)
    ids2 = tokenize(sw, second)
    oracle2 = [to_u64(h) for h in block_hashes(HASH_FNS["sha256_cbor"], SEED, ids2, BS, None, None)]
    shared = 0
    while shared < len(oracle) and oracle2[shared] == oracle[shared]:
        shared += 1
    assert body2["usage"]["prompt_tokens_details"]["cached_tokens"] == shared * BS
    stored2 = [ev for ev in events_of(sub.drain()) if ev[0] == "BlockStored"]
    assert len(stored2) == 1
    _, hashes2, parent2, tokens2, *_ = stored2[0]
    assert hashes2 == oracle2[shared:] == header2[shared:]
    assert parent2 == oracle2[shared - 1]
    assert tokens2 == ids2[shared * BS:len(oracle2) * BS]
    # Sequence numbers: 0, 1, ... with no gap, on an empty topic.
    assert [m[1] for m in sub.got] == list(range(len(sub.got)))
    assert all(m[0] == b"" for m in sub.got)
    sub.close()


@pytest.mark.parametrize("fmt", ["array", "map"])
def test_an_index_built_from_events_predicts_every_hit(simworker, tmp_path, fmt):
    # 24 blocks of 16 tokens: a handful of prompts evict each other.
    sw = start(simworker, tmp_path, kv_blocks=24, max_model_len=256, kv_events_format=fmt)
    sub = Sub(sw.events_ep)
    rng = random.Random(7)
    stems = [text(rng, 30) for _ in range(4)]
    held = set()
    checked = removed = 0
    for i in range(40):
        prompt = rng.choice(stems) + " " + text(rng, rng.randrange(0, 40))
        ids = tokenize(sw, prompt)
        if len(ids) + 4 > 256:
            continue
        keys = [to_u64(h) for h in block_hashes(HASH_FNS["sha256_cbor"], SEED, ids, BS, None, None)]
        predicted = 0
        max_hit = (len(ids) - 1) // BS
        while predicted < min(max_hit, len(keys)) and keys[predicted] in held:
            predicted += 1
        body, header = complete(sw, prompt, max_tokens=rng.choice([1, 4, 20]))
        assert header == keys
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == predicted * BS, i
        checked += 1
        for ev in events_of(sub.drain(idle=0.15), fmt):
            if ev[0] == "BlockStored":
                held.update(ev[1])
            elif ev[0] == "BlockRemoved":
                assert set(ev[1]) <= held  # only what was stored is removed
                held.difference_update(ev[1])
                removed += len(ev[1])
    assert checked >= 30 and removed > 0
    assert len(held) <= 24
    assert [m[1] for m in sub.got] == list(range(len(sub.got)))
    sub.close()


def replay(endpoint, start_seq):
    """vLLM's replay protocol from a DEALER: [b"", start] -> [b"", seq, payload]... [b"", -1, b""]."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send_multipart([b"", start_seq.to_bytes(8, "big")])
    out = []
    while True:
        assert s.poll(5000), "no replay answer"
        frames = s.recv_multipart()
        assert len(frames) == 3 and frames[0] == b"", frames
        if frames[1] == END_SEQ:
            assert frames[2] == b""
            break
        out.append((int.from_bytes(frames[1], "big"), frames[2]))
    s.close()
    return out


def test_dropped_batches_come_back_from_the_replay_socket(simworker, tmp_path):
    sw = start(simworker, tmp_path, kv_events_drop_rate=0.4, seed=3, kv_blocks=64)
    sub = Sub(sw.events_ep)
    rng = random.Random(3)
    for _ in range(15):
        complete(sw, text(rng, 50), max_tokens=rng.choice([1, 30]))
    sub.drain()
    seen = {seq: payload for _, seq, payload, _ in sub.got}
    last = max(seen)
    missing = [s for s in range(last + 1) if s not in seen]
    assert missing, "a 0.4 drop rate over this many batches left no gap"
    got = dict(replay(sw.replay_ep, missing[0]))
    assert sorted(got) == list(range(missing[0], max(got) + 1)) and max(got) >= last
    for seq, payload in got.items():
        decode(payload)
        if seq in seen:
            assert seen[seq] == payload  # replay sends the very bytes PUB sent
    # Everything from 0 again; a start past the end gets only the end marker.
    assert [s for s, _ in replay(sw.replay_ep, 0)] == list(range(max(got) + 1))
    assert replay(sw.replay_ep, max(got) + 1) == []
    sub.close()


def test_malformed_replay_requests_are_ignored(simworker, tmp_path):
    sw = start(simworker, tmp_path)
    complete(sw, text(random.Random(8), 50))
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(sw.replay_ep)
    for bad in ([b"", b"\x00" * 7], [b"x", b"\x00" * 8], [b"", b"\x00" * 8, b"more"],
                [b"", b"\x00" * 9], [b"", b"", b"", b"", b"\x00" * 8]):
        s.send_multipart(bad)
    assert not s.poll(500)  # no answer to any of them
    s.close()
    assert [seq for seq, _ in replay(sw.replay_ep, 0)] == [0]  # and the socket still serves


def test_replay_buffer_keeps_the_last_n_batches(simworker, tmp_path):
    sw = start(simworker, tmp_path, kv_events_buffer=3)
    rng = random.Random(5)
    for _ in range(6):
        complete(sw, text(rng, 50))
        time.sleep(0.05)  # one batch each
    got = replay(sw.replay_ep, 0)
    seqs = [s for s, _ in got]
    assert len(seqs) == 3 and seqs == list(range(seqs[0], seqs[0] + 3)) and seqs[0] >= 3


def test_reset_prefix_cache_emits_all_blocks_cleared(simworker, tmp_path):
    sw = start(simworker, tmp_path)
    sub = Sub(sw.events_ep)
    prompt = text(random.Random(9), 60)
    complete(sw, prompt)
    body, _ = complete(sw, prompt)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    r = httpx.post(sw.url + "/reset_prefix_cache", timeout=10)
    assert r.status_code == 200
    evs = events_of(sub.drain())
    assert evs[-1] == ["AllBlocksCleared"]
    assert not any(ev[0] == "BlockRemoved" for ev in evs)  # a reset is not a set of evictions
    body, _ = complete(sw, prompt)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    sub.close()


def test_reset_is_refused_while_a_request_holds_blocks(simworker, tmp_path):
    import threading
    sw = start(simworker, tmp_path, time_scale=1, decode_us_per_token=100000)
    sub = Sub(sw.events_ep)
    done = []
    t = threading.Thread(target=lambda: done.append(complete(sw, text(random.Random(4), 60),
                                                             max_tokens=12)))
    t.start()
    time.sleep(0.4)  # prefill is done, decode runs for another ~0.8 s
    r = httpx.post(sw.url + "/reset_prefix_cache", timeout=10)
    assert r.status_code == 409 and r.json()["error"]["code"] == 409
    t.join()
    assert done
    assert httpx.post(sw.url + "/reset_prefix_cache", timeout=10).status_code == 200
    evs = events_of(sub.drain())
    assert [ev[0] for ev in evs].count("AllBlocksCleared") == 1 and evs[-1] == ["AllBlocksCleared"]
    sub.close()


def test_a_restarted_worker_numbers_from_zero(simworker, tmp_path):
    ep, rep = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    sw = start(simworker, tmp_path, endpoint=ep, replay=False)
    sub = Sub(ep)
    rng = random.Random(11)
    for _ in range(3):
        complete(sw, text(rng, 40))
    first = [m[1] for m in sub.drain()]
    assert first == list(range(len(first))) and len(first) >= 3
    assert sw.stop() == 0
    sw2 = start(simworker, tmp_path, endpoint=ep, replay=False,
                kv_events_replay_endpoint=rep)
    sub.idle(1.0)  # the SUB socket reconnects and subscribes again by itself
    for _ in range(3):
        complete(sw2, text(rng, 40))
    again = [m[1] for m in sub.drain()]
    # vLLM sends no start message: the numbers going back to 0 is the signal.
    assert again == list(range(len(again))) and len(again) >= 3
    assert [s for s, _ in replay(rep, 0)] == list(range(again[-1] + 1))
    sub.close()


def test_topic_frame_and_delay(simworker, tmp_path):
    sw = start(simworker, tmp_path, kv_events_topic="kv@sim", kv_events_delay_ms=400)
    sub = Sub(sw.events_ep, topic=b"kv@")
    complete(sw, text(random.Random(13), 50))
    msgs = sub.drain(first=5.0)
    assert msgs and all(m[0] == b"kv@sim" for m in msgs)
    for _, _, payload, at in msgs:
        ts, _ = decode(payload)
        assert at - ts >= 0.3  # made at ts, sent 400 ms later
    sub.close()


@pytest.mark.parametrize("args", [
    ["--kv-events-endpoint", "tcp://127.0.0.1:0"],
    ["--kv-events-drop-rate", "0.1"],
])
def test_event_flags_need_token_exact_mode(args):
    import subprocess
    r = subprocess.run([str(binary("kvgate-simworker")), *args], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "needs --tokenizer" in r.stderr, r.stderr


def test_event_flags_need_an_endpoint(tmp_path):
    import subprocess
    r = subprocess.run([str(binary("kvgate-simworker")), "--tokenizer", str(tokenizer_file("qwen3")),
                        "--hash-seed", SEED, "--kv-events-drop-rate", "0.1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs --kv-events-endpoint" in r.stderr, r.stderr
