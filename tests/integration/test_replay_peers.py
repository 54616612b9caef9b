# SPDX-License-Identifier: Apache-2.0
"""kvgate-replay's peer policies (docs/policies.md) on small traces whose answers follow from
each policy's published rule: on an idle fleet every prefix-aware peer sends a repeated prompt
back to its worker; SGLang treats a request matching 30% or less of its text as new and sends it
to the smallest tree, where Dynamo's cost keeps it on the worker holding its first block;
consistent hashing places by the first block alone; and every row of the full report on the
Mooncake conversation trace is a sane replay (when the trace is beside the checkout)."""
import json

import pytest

from test_replay import CONVERSATION, replay, replay_json, rows

PEERS = ["sglang", "dynamo", "llmd", "aibrix", "chwbl"]


def write(tmp_path, reqs):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return path


def req(t_ms, ids, out=1):
    return {"timestamp": t_ms, "input_length": 512 * len(ids), "output_length": out,
            "hash_ids": ids}


def idle_flags():
    # 4 workers with room for everything; requests 10 s apart finish long before the next.
    return ["--workers", 4, "--capacity", 4096, "--prefill-us", 100, "--decode-us", 1000]


def test_idle_fleet_repeats_hit_on_every_prefix_aware_peer(tmp_path):
    # 12 distinct 6-block prompts, then each again: the repeats are 72 blocks, all hits for a
    # policy that sends a prompt back to the worker that computed it.
    first = [req(10_000 * i, [1000 * i + b for b in range(6)]) for i in range(12)]
    again = [req(10_000 * (12 + i), r["hash_ids"]) for i, r in enumerate(first)]
    report = replay_json("--trace", write(tmp_path, first + again), *idle_flags(),
                         "--policies", ",".join(PEERS + ["round_robin"]))
    got = rows(report)
    assert got["ceiling"]["hit_blocks"] == 72
    for name in PEERS:
        assert got[name]["hit_blocks"] == 72, name
    # 12 prompts dealt round robin over 4 workers come back to the same worker only because
    # 12 is a multiple of 4: a shift of one shows round robin does not keep affinity.
    shifted = first + [req(10_000 * 12, [999_999])] + [
        req(10_000 * (13 + i), r["hash_ids"]) for i, r in enumerate(first)]
    got = rows(replay_json("--trace", write(tmp_path, shifted), *idle_flags(),
                           "--policies", "round_robin,chwbl,dynamo"))
    assert got["round_robin"]["hit_blocks"] == 0
    assert got["chwbl"]["hit_blocks"] == got["dynamo"]["hit_blocks"] == 72


def test_sglang_threshold_against_dynamo_overlap(tmp_path):
    # A: 10 blocks. B shares A's first block only (10% of its text, under SGLang's 0.3):
    # SGLang sends B to the smallest tree (a worker that has seen nothing), so B hits nothing;
    # Dynamo's cost is lowest where the one block is cached, so B hits 1 block there.
    a = req(0, list(range(10)))
    b = req(10_000, [0] + [100 + i for i in range(9)])
    got = rows(replay_json("--trace", write(tmp_path, [a, b]), *idle_flags(),
                           "--policies", "sglang,dynamo"))
    assert got["sglang"]["hit_blocks"] == 0
    assert got["dynamo"]["hit_blocks"] == 1
    # Sharing 4 of 10 blocks (40% > 30%): SGLang follows the match too.
    c = req(10_000, [0, 1, 2, 3] + [200 + i for i in range(6)])
    got = rows(replay_json("--trace", write(tmp_path, [a, c]), *idle_flags(),
                           "--policies", "sglang,dynamo"))
    assert got["sglang"]["hit_blocks"] == 4
    assert got["dynamo"]["hit_blocks"] == 4


def test_chwbl_places_by_first_block_only(tmp_path):
    # Two prompts with the same first block and nothing else in common go to the same worker on
    # an idle fleet: the second hits its first block under chwbl, whatever its other blocks.
    reqs = [req(10_000 * i, [7, 50 + 10 * i, 51 + 10 * i]) for i in range(8)]
    got = rows(replay_json("--trace", write(tmp_path, reqs), *idle_flags(),
                           "--policies", "chwbl"))
    assert got["chwbl"]["hit_blocks"] == 7
    assert sorted(got["chwbl"]["requests_per_worker"]) == [0, 0, 0, 8]


def test_unknown_policy_is_refused(tmp_path):
    res = replay("--trace", write(tmp_path, [req(0, [1])]), "--policies", "sglang,envoy")
    assert res.returncode == 2
    assert 'unknown or repeated policy "envoy"' in res.stderr


@pytest.mark.skipif(not CONVERSATION.exists(), reason="the Mooncake traces are not beside the checkout")
def test_every_peer_replays_the_conversation_trace():
    report = replay_json("--trace", CONVERSATION, "--policies", ",".join(["cost"] + PEERS))
    got = rows(report)
    for name in ["cost"] + PEERS:
        r = got[name]
        assert r["requests"] == 12031 and sum(r["requests_per_worker"]) == 12031, name
        assert 0 < r["block_hit_rate"] <= got["ceiling"]["block_hit_rate"], name
        assert r["ttft_p99_ms"] >= r["ttft_p50_ms"] > 0, name
    # The prefix-aware peers beat plain consistent hashing on the first block (the trace's
    # conversations all open with the same block, so it cannot tell them apart).
    for name in ["sglang", "dynamo", "llmd", "aibrix"]:
        assert got[name]["block_hit_rate"] > got["chwbl"]["block_hit_rate"], name
