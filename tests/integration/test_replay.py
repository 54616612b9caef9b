# SPDX-License-Identifier: Apache-2.0
"""kvgate-replay against a small reference written here: the ceiling (every block seen before
is a hit), the pooled LRU (one LRU of workers x capacity blocks) and Belady's MIN on the same
capacity of the tool's JSON report equal this file's (pooled_lru <= min <= ceiling), exactly, on a slice of the Mooncake conversation trace and on generated
traces; a trace whose requests share a prefix gives the hit counts worked out by hand for
prefix-aware and round-robin routing; round robin spreads requests evenly; bad lines name
their line number (stop, or skip with --on-error skip)."""
import collections
import json
import pathlib
import random
import subprocess

import pytest

from conftest import binary

BLOCK = 512
# The public Mooncake traces beside the checkout (../shared, as the project is laid out); tests
# that need one say so and skip where it is not there.
ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACES = next((d for d in (ROOT.parent / "shared" / "traces" / "mooncake",
                           pathlib.Path("/work/shared/traces/mooncake")) if d.is_dir()),
              ROOT.parent / "shared" / "traces" / "mooncake")
CONVERSATION = TRACES / "conversation_trace.jsonl"


def replay(*args, timeout=120):
    return subprocess.run([str(binary("kvgate-replay")), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def replay_json(*args):
    res = replay(*args, "--format", "json")
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return json.loads(res.stdout)


def rows(report):
    return {r["name"]: r for r in report["rows"]}


# ---- the reference ----------------------------------------------------------------------------

def load(path):
    reqs = [json.loads(line) for line in open(path) if line.strip()]
    return sorted(reqs, key=lambda r: r["timestamp"])  # stable, as the tool's sort


def blocks(req):
    """(block identity, tokens) of each hash id: the identity is the whole id prefix."""
    ids = req["hash_ids"]
    n_in = req["input_length"]
    return [(tuple(ids[:i + 1]), max(0, min(BLOCK, n_in - i * BLOCK))) for i in range(len(ids))]


def ceiling(reqs):
    seen = set()
    hit_blocks = hit_tokens = 0
    for r in reqs:
        bs = blocks(r)
        for key, tokens in bs:
            if key not in seen:
                break
            hit_blocks += 1
            hit_tokens += tokens
        seen.update(k for k, _ in bs)
    return hit_blocks, hit_tokens, len(seen)


def pooled_lru(reqs, capacity):
    """One LRU; a request's blocks are all used at once (none of them evicted for another of
    them), then released with its first block the most recent."""
    lru = collections.OrderedDict()  # oldest first
    hit_blocks = hit_tokens = 0
    for r in reqs:
        bs = blocks(r)
        for key, tokens in bs:
            if key not in lru:
                break
            hit_blocks += 1
            hit_tokens += tokens
        used = []
        for key, _ in bs:
            if key in lru:
                del lru[key]
            elif len(lru) + len(used) >= capacity:
                if not lru:
                    continue  # everything is in use: computed, not kept
                lru.popitem(last=False)
            used.append(key)
        for key in reversed(used):
            lru[key] = True
    return hit_blocks, hit_tokens


def belady_min(reqs, capacity):
    """The pooled LRU's accesses (each request's blocks in order) and hits (leading blocks
    cached when the request arrives); a miss on a full cache evicts the cached block whose next
    access is farthest, unless the accessed block's own is as far or farther: then it is not
    kept. A plain scan of the cache per eviction, for small inputs."""
    seq = [key for r in reqs for key, _ in blocks(r)]
    after = {}
    nxt = [0] * len(seq)
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = after.get(seq[i], float("inf"))
        after[seq[i]] = i
    cache = {}  # key: its next access
    hit_blocks = hit_tokens = 0
    i = 0
    for r in reqs:
        bs = blocks(r)
        for key, tokens in bs:
            if key not in cache:
                break
            hit_blocks += 1
            hit_tokens += tokens
        for key, _ in bs:
            if key not in cache and len(cache) >= capacity:
                victim = max(cache, key=cache.get, default=None)
                if victim is None or cache[victim] <= nxt[i]:
                    i += 1
                    continue
                del cache[victim]
            cache[key] = nxt[i]
            i += 1
    return hit_blocks, hit_tokens


def check_references(path, *args, check_min=True):
    report = replay_json("--trace", path, "--policies", "round_robin", *args)
    reqs = load(path)
    got = rows(report)
    assert report["requests"] == len(reqs)
    assert report["blocks"] == sum(len(r["hash_ids"]) for r in reqs)
    assert report["tokens"] == sum(r["input_length"] for r in reqs)
    hb, ht, distinct = ceiling(reqs)
    assert report["distinct_blocks"] == distinct
    assert (got["ceiling"]["hit_blocks"], got["ceiling"]["hit_tokens"]) == (hb, ht)
    pooled = report["capacity"] * report["workers"]
    assert got["pooled_lru"]["capacity"] == pooled
    assert (got["pooled_lru"]["hit_blocks"], got["pooled_lru"]["hit_tokens"]) == \
        pooled_lru(reqs, pooled)
    got_min = got["min"]
    assert got_min["capacity"] == pooled and got_min["kind"] == "reference"
    assert got["pooled_lru"]["hit_blocks"] <= got_min["hit_blocks"] <= hb
    assert got["pooled_lru"]["hit_tokens"] <= got_min["hit_tokens"] <= ht
    if check_min:
        assert (got_min["hit_blocks"], got_min["hit_tokens"]) == belady_min(reqs, pooled)
    return report


# ---- tests ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def conversation_slice(tmp_path_factory):
    if not CONVERSATION.is_file():
        pytest.skip(f"{CONVERSATION} not found")
    path = tmp_path_factory.mktemp("replay") / "conversation_2000.jsonl"
    with open(CONVERSATION) as src, open(path, "w") as dst:
        for _, line in zip(range(2000), src):
            dst.write(line)
    return path


# The MIN reference scans the cache per eviction: exact only where the pooled cache is small
# (the larger ones still check pooled_lru <= min <= ceiling).
@pytest.mark.parametrize("args,check_min", [
    (["--capacity", "1"], True),
    (["--capacity", "40"], True),
    (["--capacity", "300", "--workers", "3"], False),
    (["--capacity-fraction", "0.1"], False),
])
def test_references_on_conversation_slice(conversation_slice, args, check_min):
    check_references(conversation_slice, *args, check_min=check_min)


def generated_trace(path, seed, n=400):
    """Requests that reuse random prefixes of earlier ones (a tree of conversations), with short
    last blocks, repeated timestamps and arrivals out of file order."""
    rnd = random.Random(seed)
    next_id = 0
    earlier = []
    with open(path, "w") as f:
        for i in range(n):
            ids = []
            if earlier and rnd.random() < 0.7:
                base = rnd.choice(earlier)
                ids = base[:rnd.randint(1, len(base))]
            for _ in range(rnd.randint(0 if ids else 1, 6)):
                ids.append(next_id)
                next_id += 1
            earlier.append(ids)
            input_length = (len(ids) - 1) * BLOCK + rnd.randint(1, BLOCK)
            ts = rnd.randint(0, 50) * 100
            f.write(json.dumps({"timestamp": ts, "input_length": input_length,
                                "output_length": rnd.randint(1, 50), "hash_ids": ids}) + "\n")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("capacity", [2, 7, 25])
def test_references_on_generated_traces(tmp_path, seed, capacity):
    path = tmp_path / "gen.jsonl"
    generated_trace(path, seed)
    check_references(path, "--capacity", capacity, "--workers", 4)


def shared_prefix_trace(path, n=16):
    """n requests one second apart, each [1, 2, 3, 4] then an id of its own, five full blocks."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"timestamp": i * 1000, "input_length": 5 * BLOCK,
                                "output_length": 1, "hash_ids": [1, 2, 3, 4, 100 + i]}) + "\n")


def test_shared_prefix_by_hand(tmp_path):
    path = tmp_path / "shared.jsonl"
    n, workers = 16, 4
    shared_prefix_trace(path, n)
    report = replay_json("--trace", path, "--workers", workers, "--capacity", 100,
                         "--policies", "cost,prefix_only,round_robin")
    got = rows(report)
    blocks_total = n * 5
    # Every request finishes long before the next arrives. Prefix-aware routing sends all to
    # the worker that holds [1..4]: only the first request misses them.
    for name in ("cost", "prefix_only", "ceiling", "pooled_lru", "min"):
        assert got[name]["blocks"] == blocks_total
        assert got[name]["hit_blocks"] == (n - 1) * 4, name
        assert got[name]["hit_tokens"] == (n - 1) * 4 * BLOCK, name
        assert got[name]["block_hit_rate"] == pytest.approx((n - 1) * 4 / blocks_total)
    # Round robin: each worker's first request misses the prefix, the others hit it.
    assert got["round_robin"]["hit_blocks"] == (n - workers) * 4
    assert got["round_robin"]["requests_per_worker"] == [n // workers] * workers
    # The index knows exactly what the engines hold here: predicted equals simulated.
    for name in ("cost", "prefix_only", "round_robin"):
        assert got[name]["predicted_blocks"] == got[name]["hit_blocks"], name


def test_service_model_by_hand(tmp_path):
    """Three 1000-token prompts at once, nothing shared, one output token: prefill is 100 ms
    each and runs one at a time per worker. TTFT, queueing (arrival to the prefill's start) and
    busy time (prefill) follow by hand for one worker and for two under round robin."""
    path = tmp_path / "three.jsonl"
    with open(path, "w") as f:
        for i in range(3):
            f.write(json.dumps({"timestamp": 0, "input_length": 1000, "output_length": 1,
                                "hash_ids": [10 * i + 1, 10 * i + 2]}) + "\n")
    flags = ("--trace", path, "--capacity", 100, "--prefill-us", 100, "--decode-us", 0,
             "--policies", "round_robin")
    one = rows(replay_json(*flags, "--workers", 1))["round_robin"]
    assert one["ttft_p50_ms"] == 200 and one["ttft_p99_ms"] == 300
    assert one["ttft_mean_ms"] == pytest.approx(200)
    assert one["queue_mean_ms"] == pytest.approx(100) and one["queue_p99_ms"] == 200
    assert one["busy_seconds_per_worker"] == [0.3] and one["busy_imbalance"] == 1
    two = rows(replay_json(*flags, "--workers", 2))["round_robin"]
    assert sorted(two["requests_per_worker"]) == [1, 2]
    assert two["ttft_mean_ms"] == pytest.approx(400 / 3) and two["ttft_p99_ms"] == 200
    assert two["queue_mean_ms"] == pytest.approx(100 / 3) and two["queue_p99_ms"] == 100
    assert sorted(two["busy_seconds_per_worker"]) == [0.1, 0.2]
    assert two["busy_imbalance"] == pytest.approx(0.2 / 0.15)
    # The references have none of it.
    pooled = rows(replay_json(*flags, "--workers", 2))["pooled_lru"]
    assert "queue_mean_ms" not in pooled and "busy_imbalance" not in pooled


def test_round_robin_spreads_evenly(conversation_slice):
    report = replay_json("--trace", conversation_slice, "--policies", "round_robin",
                         "--workers", 8, "--capacity", 100)
    assert rows(report)["round_robin"]["requests_per_worker"] == [250] * 8


BAD = [
    '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
    '{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]}',
    '{"timestamp": 2, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]',
    '{"timestamp": 3, "input_length": 600, "output_length": 5, "hash_ids": [1, 4]}',
    '{"timestamp": 4, "input_length": 600, "output_length": 5}',
    '{"timestamp": 5, "input_length": -1, "output_length": 5, "hash_ids": [1]}',
    '{"timestamp": 6, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
]


def test_bad_line_stops_with_its_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD) + "\n")
    res = replay("--trace", path)
    assert res.returncode == 1
    assert f"{path}:3: json:" in res.stderr
    assert res.stdout == ""


def test_bad_lines_skipped_with_their_numbers(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD) + "\n")
    res = replay("--trace", path, "--on-error", "skip", "--format", "json", "--capacity", 10)
    assert res.returncode == 0, res.stderr
    assert f"{path}:3: skipped: json:" in res.stderr
    assert f"{path}:5: skipped: hash_ids: missing" in res.stderr
    assert f"{path}:6: skipped: input_length: expected a non-negative integer" in res.stderr
    report = json.loads(res.stdout)
    assert report["requests"] == 4 and report["skipped"] == 3
    # [1,2] [1,3] [1,4] [1,2]: the ceiling hits 1 + 1 + 2 blocks of 8.
    assert rows(report)["ceiling"]["hit_blocks"] == 4


def test_timestamp_past_the_clock_under_time_scale(tmp_path):
    # 1e15 ms x 1e6 is past any 64-bit microsecond count: a line error, not a wrapped arrival.
    path = tmp_path / "far.jsonl"
    path.write_text('{"timestamp": 1e15, "input_length": 512, "output_length": 1, "hash_ids": [1]}\n')
    res = replay("--trace", path, "--time-scale", "1000000")
    assert res.returncode == 1
    assert f"{path}:1: timestamp: too large with this --time-scale" in res.stderr
    assert replay("--trace", path, "--format", "json").returncode == 0


def test_usage_errors():
    assert replay().returncode == 2
    assert replay("--trace", "x", "--policies", "nope").returncode == 2
    assert replay("--trace", "x", "--on-error", "maybe").returncode == 2
    res = replay("--trace", "/nonexistent/trace.jsonl")
    assert res.returncode == 1 and "/nonexistent/trace.jsonl" in res.stderr
