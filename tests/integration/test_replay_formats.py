# SPDX-License-Identifier: Apache-2.0
"""kvgate-replay's kvgate trace format, reports and charts (docs/replay.md).

The kvgate format's block keys are computed again here from the documents alone - the canonical
stream by canon_reference.py, the scope salt as HMAC-SHA256 of the replay's fixed secret, the
keys by test_hashing.py's implementation of docs/hashing.md - and the tool's ceiling and pooled
LRU must equal this file's on them, exactly. Two tenants that send the same prompt share nothing
unless their scope says so; bodies that mean the same request replay alike; bad lines name
their line. --format csv says what the JSON says; --sweep is replay_run at every point; --svg
is well-formed XML with one polyline per row and panel; the progress line is there on a
terminal only."""
import base64
import collections
import csv
import hashlib
import hmac
import io
import json
import os
import pty
import subprocess
import xml.etree.ElementTree as ET

import pytest

from canon_reference import canonical_stream
from conftest import binary
from test_hashing import spec_keys
from test_replay import CONVERSATION, replay, replay_json, rows

SECRET = b"kvgate-replay: a fixed secret that keeps scopes apart"
BLOCK_BYTES, BLOCK_TOKENS, BYTES_PER_TOKEN = 64, 16, 4
SVG = "{http://www.w3.org/2000/svg}"


def write_lines(path, objs):
    with open(path, "w") as f:
        for o in objs:
            f.write((o if isinstance(o, str) else json.dumps(o)) + "\n")


# ---- the reference: keys from the documents, then the ceiling and the pooled LRU ---------------

def scope_of(line, shared=False):
    tenant = line.get("tenant")
    sharing = line.get("sharing", "isolated")
    if shared or tenant is None or sharing == "global":
        return "global"
    return f"group:{line['group']}" if sharing == "group" else f"tenant:{tenant}"


def salt_of(scope):
    mac = hmac.new(SECRET, scope.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=")


def blocks_of(line, shared=False):
    """[(key, tokens)] of a kvgate-format line, and its prompt tokens."""
    api = "chat" if "messages" in line else "completions"
    verdict, (is_tokens, stream) = canonical_stream(json.dumps(line).encode(), api)
    assert verdict == "ok"
    model = line.get("model", "").encode()
    salt = salt_of(scope_of(line, shared))
    if is_tokens:
        _, keys = spec_keys("tokens", BLOCK_TOKENS, salt, model, b"", stream)
        return [(k, BLOCK_TOKENS) for k in keys], len(stream)
    _, keys = spec_keys("bytes", BLOCK_BYTES, salt, model, b"", stream)
    per = BLOCK_BYTES // BYTES_PER_TOKEN
    return [(k, per) for k in keys], -(-len(stream) // BYTES_PER_TOKEN)


def reference(lines, capacity, shared=False):
    reqs = sorted(lines, key=lambda r: r["timestamp"])
    seen, lru = set(), collections.OrderedDict()
    ceil_b = ceil_t = lru_b = lru_t = nblocks = tokens = 0
    for r in reqs:
        bs, ntok = blocks_of(r, shared)
        nblocks += len(bs)
        tokens += ntok
        for key, t in bs:
            if key not in seen:
                break
            ceil_b, ceil_t = ceil_b + 1, ceil_t + t
        seen.update(k for k, _ in bs)
        for key, t in bs:
            if key not in lru:
                break
            lru_b, lru_t = lru_b + 1, lru_t + t
        used = []
        for key, _ in bs:
            if key in lru:
                del lru[key]
            elif len(lru) + len(used) >= capacity:
                if not lru:
                    continue
                lru.popitem(last=False)
            used.append(key)
        for key in reversed(used):
            lru[key] = True
    return dict(blocks=nblocks, tokens=tokens, distinct=len(seen), ceiling=(ceil_b, ceil_t),
                pooled_lru=(lru_b, lru_t))


SYSTEM = "You are a careful assistant who answers in plain words. " * 3
DOCS = ["The quarterly report shows revenue grew in every region but one. " * 4,
        "Install the package, then run the migration before restarting. " * 5,
        "A haiku about caches: blocks remembered, prefixes shared, the cold start fades. " * 2]


def mixed_trace(n=60):
    """Tenants in isolated, group and global scopes and none; text prompts, chats sharing a
    system prompt, token-id prompts; requests that extend earlier ones; timestamps out of
    order."""
    tenants = [("acme", {}), ("beta", {}), ("gx", {"sharing": "group", "group": "g"}),
               ("gy", {"sharing": "group", "group": "g"}), ("pub", {"sharing": "global"}),
               (None, {})]
    lines = []
    for i in range(n):
        tenant, extra = tenants[i % len(tenants)]
        doc = DOCS[(i // 3) % len(DOCS)]
        line = {"timestamp": (i * 37) % 23 * 100, "model": "m", "output_length": 1 + i % 7}
        if tenant:
            line["tenant"] = tenant
        line.update(extra)
        kind = i % 3
        if kind == 0:
            line["prompt"] = doc + f" question {i % 4}"
        elif kind == 1:
            line["messages"] = [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": doc[: 40 + 30 * (i % 5)]}]
        else:
            line["prompt"] = list(range(i % 4, i % 4 + 16 * (1 + i % 6) + i % 5))
        lines.append(line)
    return lines


@pytest.mark.parametrize("capacity,shared", [(1, False), (6, False), (40, False), (1000, False),
                                             (6, True)])
def test_keys_and_references_match_the_documents(tmp_path, capacity, shared):
    lines = mixed_trace()
    path = tmp_path / "mixed.jsonl"
    write_lines(path, lines)
    args = ["--shared-scope"] if shared else []
    report = replay_json("--trace", path, "--capacity", capacity, "--workers", 2, *args)
    ref = reference(lines, 2 * capacity, shared)
    got = rows(report)
    assert report["requests"] == len(lines)
    assert (report["blocks"], report["tokens"]) == (ref["blocks"], ref["tokens"])
    assert report["distinct_blocks"] == ref["distinct"]
    assert (got["ceiling"]["hit_blocks"], got["ceiling"]["hit_tokens"]) == ref["ceiling"]
    assert (got["pooled_lru"]["hit_blocks"], got["pooled_lru"]["hit_tokens"]) == \
        ref["pooled_lru"]
    # The trace is not trivial: something is shared, something is not.
    assert 0 < ref["ceiling"][0] < ref["blocks"]


PROMPT = "Summarise the following contract clause by clause, plainly. " * 8  # 480 bytes


def two_tenants(path, **extra):
    """acme, then beta, send the same prompt: 7 full 64-byte blocks each (480 bytes)."""
    write_lines(path, [
        {"timestamp": 0, "tenant": "acme", "model": "m", "prompt": PROMPT, "output_length": 2,
         **extra},
        {"timestamp": 1000, "tenant": "beta", "model": "m", "prompt": PROMPT,
         "output_length": 2, **extra},
    ])


def test_isolated_tenants_share_nothing(tmp_path):
    path = tmp_path / "two.jsonl"
    two_tenants(path)
    report = replay_json("--trace", path, "--workers", 1, "--capacity", 100)
    assert report["blocks"] == 14 and report["distinct_blocks"] == 14
    assert report["tokens"] == 2 * 120  # 480 bytes / 4
    for name, row in rows(report).items():
        assert row["hit_blocks"] == 0, name


@pytest.mark.parametrize("how", ["flag", "global", "group"])
def test_shared_scopes_share(tmp_path, how):
    path = tmp_path / "two.jsonl"
    extra = {"flag": {}, "global": {"sharing": "global"},
             "group": {"sharing": "group", "group": "partners"}}[how]
    two_tenants(path, **extra)
    args = ["--shared-scope"] if how == "flag" else []
    report = replay_json("--trace", path, "--workers", 1, "--capacity", 100, *args)
    assert report["distinct_blocks"] == 7
    for name, row in rows(report).items():
        # beta's request finds acme's 7 blocks of 16 tokens (one worker: every policy hits).
        assert (row["hit_blocks"], row["hit_tokens"]) == (7, 7 * 16), name


def test_tenant_without_sharing_is_its_own_scope_and_no_tenant_is_global(tmp_path):
    path = tmp_path / "t.jsonl"
    write_lines(path, [
        {"timestamp": 0, "model": "m", "prompt": PROMPT, "output_length": 1},
        {"timestamp": 1, "tenant": "pub", "sharing": "global", "model": "m", "prompt": PROMPT,
         "output_length": 1},
        {"timestamp": 2, "tenant": "acme", "model": "m", "prompt": PROMPT, "output_length": 1},
        {"timestamp": 3, "tenant": "acme", "model": "other", "prompt": PROMPT,
         "output_length": 1},
    ])
    got = rows(replay_json("--trace", path, "--workers", 1, "--capacity", 100))
    # pub finds the tenant-less request's blocks (both global); acme and another model find none.
    assert got["ceiling"]["hit_blocks"] == 7
    assert got["ceiling"]["blocks"] == 28


def same_request_spellings(i):
    """Bodies that mean the same request (docs/canonical.md): escapes, member order, content as
    a string or as one text part, whitespace."""
    text = f"Please review change {i}: " + "the cache keeps every block it can. " * 6
    a = {"timestamp": i * 500, "tenant": "acme", "model": "m", "output_length": 3,
         "messages": [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": text}]}
    b = ('{"output_length":3,  "messages": [{"content": ' + json.dumps(SYSTEM, ensure_ascii=True)
         + ', "role": "\\u0073ystem"}, {"role": "user", "content": [{"type": "text", "text": '
         + json.dumps(text).replace("e", "\\u0065") + '}]}], "model": "m", "tenant": "acme",'
         + f' "timestamp": {i * 500}' + '}')
    return a, b


def test_equal_canonical_streams_replay_alike(tmp_path):
    plain, spelled = [], []
    for i in range(12):
        a, b = same_request_spellings(i % 4)
        a["timestamp"] = b_ts = i * 500
        plain.append(a)
        spelled.append(b.replace(f'"timestamp": {(i % 4) * 500}', f'"timestamp": {b_ts}'))
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_lines(pa, plain)
    write_lines(pb, spelled)
    ra = replay_json("--trace", pa, "--workers", 3, "--capacity", 20)
    rb = replay_json("--trace", pb, "--workers", 3, "--capacity", 20)
    strip = lambda rep: [{k: v for k, v in r.items() if k != "seconds"} for r in rep["rows"]]
    assert strip(ra) == strip(rb)
    assert rows(ra)["ceiling"]["hit_blocks"] > 0
    # And the keys really are the documents' (the streams are equal, so are the keys).
    ref = reference(plain, 60)
    assert rows(ra)["ceiling"]["hit_blocks"] == ref["ceiling"][0]


BAD = [
    '{"timestamp": 0, "tenant": "acme", "prompt": "hello there, this is fine", "output_length": 1}',
    '{"timestamp": 1, "tenant": "acme", "prompt": "x", "messages": [], "output_length": 1}',
    '{"timestamp": 2, "tenant": "acme", "output_length": 1}',
    '{"timestamp": 3, "tenant": "acme", "messages": [{"role": "user", "content": 5}], '
    '"output_length": 1}',
    '{"timestamp": 4, "tenant": "a/b", "prompt": "x", "output_length": 1}',
    '{"timestamp": 5, "tenant": "acme", "sharing": "global", "prompt": "x", "output_length": 1}',
    '{"timestamp": 6, "tenant": "beta", "sharing": "group", "prompt": "x", "output_length": 1}',
    '{"timestamp": 7, "tenant": "beta", "prompt": "x", "output_length": -1}',
    '{"timestamp": 8, "tenant": "beta", "prompt": "x", "output_length": 1',
    '{"timestamp": 9, "sharing": "global", "prompt": "x", "output_length": 1}',
    '{"timestamp": 10, "tenant": "beta", "prompt": "fine as well", "output_length": 1}',
]


def test_bad_kvgate_lines_name_their_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(BAD) + "\n")
    res = replay("--trace", path, "--on-error", "skip", "--format", "json", "--capacity", 10)
    assert res.returncode == 0, res.stderr
    err = res.stderr
    assert f"{path}:2: skipped: messages: only one of \"prompt\" and \"messages\"" in err
    assert f"{path}:3: skipped: prompt: missing (or \"messages\")" in err
    assert f"{path}:4: skipped: messages[0].content:" in err
    assert f"{path}:5: skipped: tenant:" in err
    assert (f"{path}:6: skipped: sharing: tenant \"acme\" was in scope \"tenant:acme\" on an "
            "earlier line") in err
    assert f"{path}:7: skipped: group: missing" in err
    assert f"{path}:8: skipped: output_length: expected a non-negative integer" in err
    assert f"{path}:9: skipped: json:" in err
    assert f"{path}:10: skipped: sharing: needs a tenant" in err
    assert err.count("skipped:") == 9
    report = json.loads(res.stdout)
    assert report["requests"] == 2 and report["skipped"] == 9
    # Without skip the first bad line stops the replay.
    res = replay("--trace", path)
    assert res.returncode == 1 and res.stdout == ""
    assert f"{path}:2: messages:" in res.stderr and ":3:" not in res.stderr


def test_format_is_detected_or_forced(tmp_path):
    kv = tmp_path / "kv.jsonl"
    two_tenants(kv)
    mc = tmp_path / "mc.jsonl"
    write_lines(mc, [{"timestamp": 0, "input_length": 600, "output_length": 1,
                      "hash_ids": [1, 2]}])
    assert replay_json("--trace", kv, "--capacity", 5)["blocks"] == 14
    assert replay_json("--trace", mc, "--capacity", 5)["blocks"] == 2
    res = replay("--trace", kv, "--trace-format", "mooncake")
    assert res.returncode == 1 and f"{kv}:1: input_length: missing" in res.stderr
    res = replay("--trace", mc, "--trace-format", "kvgate")
    assert res.returncode == 1 and f"{mc}:1: prompt: missing" in res.stderr
    assert replay("--trace", mc, "--trace-format", "yaml").returncode == 2


def test_overlong_line_is_a_bad_line(tmp_path):
    path = tmp_path / "long.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    with open(path, "w") as f:
        f.write(good)
        f.write('{"timestamp": 1, "x": "' + "y" * (64 << 20) + '"}\n')
        f.write(good)
    res = replay("--trace", path, "--on-error", "skip", "--format", "json", "--capacity", 10)
    assert res.returncode == 0, res.stderr
    assert f"{path}:2: skipped: line: longer than {64 << 20} bytes" in res.stderr
    report = json.loads(res.stdout)
    assert report["requests"] == 2 and report["skipped"] == 1
    assert rows(report)["ceiling"]["hit_blocks"] == 2  # the line after it was read whole
    res = replay("--trace", path)
    assert res.returncode == 1 and f"{path}:2: line: longer than" in res.stderr


# ---- reports: CSV, sweeps, the chart, the progress line ---------------------------------------

def small_mooncake(path, n=300):
    with open(path, "w") as f:
        for i in range(n):
            ids = [i % 7, 100 + i % 13] + [1000 + i] * (i % 3)
            f.write(json.dumps({"timestamp": i * 40, "input_length": len(ids) * 512 - 100,
                                "output_length": 1 + i % 9, "hash_ids": ids}) + "\n")


def test_csv_says_what_json_says(tmp_path):
    path = tmp_path / "t.jsonl"
    small_mooncake(path)
    js = replay_json("--trace", path, "--workers", 3, "--capacity", 4)
    res = replay("--trace", path, "--workers", 3, "--capacity", 4, "--format", "csv")
    assert res.returncode == 0, res.stderr
    table = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["name"] for r in table] == [r["name"] for r in js["rows"]]
    for c, j in zip(table, js["rows"]):
        assert int(c["workers"]) == 3
        for k in ("capacity", "requests", "blocks", "hit_blocks", "tokens", "hit_tokens"):
            assert int(c[k]) == j[k], k
        assert float(c["block_hit_rate"]) == j["block_hit_rate"]
        assert c["kind"] == j["kind"]
        if j["kind"] == "policy":
            assert int(c["predicted_blocks"]) == j["predicted_blocks"]
            assert float(c["ttft_p99_ms"]) == j["ttft_p99_ms"]
            assert float(c["imbalance"]) == j["imbalance"]
        else:
            assert c["ttft_p99_ms"] == "" and c["imbalance"] == ""


def test_sweep_is_replay_run_at_every_point(tmp_path):
    path = tmp_path / "t.jsonl"
    small_mooncake(path)
    fractions, workers = [0.05, 0.3], [2, 5]
    sweep = replay_json("--trace", path, "--sweep", "--fractions", "0.05,0.3",
                        "--worker-counts", "2,5", "--policies", "cost,round_robin")
    nrows = 2 + 3
    assert len(sweep["rows"]) == len(fractions) * len(workers) * nrows
    distinct = sweep["distinct_blocks"]
    for w in workers:
        for fr in fractions:
            pts = [r for r in sweep["rows"] if r["workers"] == w and r["fraction"] == fr]
            assert [r["name"] for r in pts] == ["cost", "round_robin", "ceiling", "pooled_lru",
                                                "min"]
            assert {r["capacity"] for r in pts} == {max(1, int(fr * distinct / w))}
            one = rows(replay_json("--trace", path, "--workers", w, "--capacity-fraction", fr,
                                   "--policies", "cost,round_robin"))
            for r in pts:
                assert (r["hit_blocks"], r["hit_tokens"]) == \
                    (one[r["name"]]["hit_blocks"], one[r["name"]]["hit_tokens"]), (w, fr)
                if r["kind"] == "policy":
                    assert r["ttft_p99_ms"] == one[r["name"]]["ttft_p99_ms"]
                    assert r["imbalance"] == one[r["name"]]["imbalance"]
                else:
                    assert r["ttft_p99_ms"] is None
    res = replay("--trace", path, "--sweep", "--fractions", "0.05,0.3", "--worker-counts", "2,5",
                 "--policies", "cost", "--format", "csv")
    assert len(list(csv.DictReader(io.StringIO(res.stdout)))) == 4 * 4
    assert replay("--trace", path, "--sweep", "--fractions", "0.1,0.1").returncode == 2
    assert replay("--trace", path, "--sweep", "--worker-counts", "2.5").returncode == 2


@pytest.mark.parametrize("args,panels", [
    (["--sweep", "--worker-counts", "2,4,8"], [2, 4, 8]),
    (["--workers", "3"], [3]),
])
def test_svg_is_well_formed_with_a_polyline_per_row(tmp_path, args, panels):
    path = tmp_path / "t&<trace>.jsonl"
    small_mooncake(path)
    svg = tmp_path / "chart.svg"
    fractions = [0.02, 0.1, 0.5]
    res = replay("--trace", path, "--svg", svg, "--fractions", ",".join(map(str, fractions)),
                 "--policies", "cost,round_robin,random", "--format", "json", *args)
    assert res.returncode == 0, res.stderr
    sweep = json.loads(res.stdout)
    root = ET.parse(svg).getroot()
    assert root.tag == SVG + "svg"
    assert str(path) in root.find(SVG + "title").text
    groups = [g for g in root.iter(SVG + "g") if g.get("class") == "panel"]
    assert [int(g.get("data-workers")) for g in groups] == panels
    names = ["cost", "round_robin", "random", "ceiling", "pooled_lru", "min"]
    assert len(root.findall(f".//{SVG}polyline")) == len(panels) * len(names)
    for g in groups:
        lines = g.findall(SVG + "polyline")
        assert [p.get("data-row") for p in lines] == names
        ys = {}
        for p in lines:
            pts = [tuple(map(float, xy.split(","))) for xy in p.get("points").split()]
            assert len(pts) == len(fractions)
            assert [x for x, _ in pts] == sorted(x for x, _ in pts)
            ys[p.get("data-row")] = [y for _, y in pts]
        # The ceiling does not depend on capacity: a flat line, above (smaller y) the rest.
        assert len(set(ys["ceiling"])) == 1
        assert all(min(v) >= ys["ceiling"][0] for v in ys.values())
        # The pooled LRU and MIN rise with capacity (y falls); MIN is never below the LRU.
        assert ys["pooled_lru"] == sorted(ys["pooled_lru"], reverse=True)
        assert all(m <= l for m, l in zip(ys["min"], ys["pooled_lru"]))
    assert {r["workers"] for r in sweep["rows"]} == set(panels)
    legend = [g for g in root.iter(SVG + "g") if g.get("class") == "legend"]
    assert len(legend) == 1 and len(legend[0].findall(SVG + "text")) == len(names)


def test_progress_line_on_a_terminal_only(tmp_path):
    path = tmp_path / "t.jsonl"
    small_mooncake(path)
    args = ["--sweep", "--fractions", "0.1,0.2", "--worker-counts", "2,3", "--policies", "cost"]
    res = replay("--trace", path, *args)
    assert res.returncode == 0 and res.stderr == ""
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([str(binary("kvgate-replay")), "--trace", str(path), *args],
                              stdout=subprocess.PIPE, stderr=slave, timeout=120)
        os.close(slave)
        slave = None
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0
    text = out.decode()
    assert "\rkvgate-replay: 1/4 points" in text and "4/4 points" in text
    assert text.endswith("\r\x1b[K")
    assert proc.stdout == res.stdout.encode()


def test_whole_conversation_trace_reads(tmp_path):
    """The whole conversation trace still reads and replays (the line reader's chunks and
    line limit on real data), with the numbers docs/performance.md records."""
    if not CONVERSATION.is_file():
        pytest.skip(f"{CONVERSATION} not found")
    report = replay_json("--trace", CONVERSATION, "--policies", "round_robin")
    assert report["requests"] == 12031 and report["distinct_blocks"] == 182790
