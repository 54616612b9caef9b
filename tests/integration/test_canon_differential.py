# SPDX-License-Identifier: Apache-2.0
"""Differential test of the canonical prefix stream (router/body.c, kvg_body_scan) against the
Python reference of docs/canonical.md (canon_reference.py).

A seeded generator makes chat, completions and responses bodies - random messages, content
parts, tools, tool calls, Responses API input items (messages, function calls and outputs, other
items), prompts as strings, string arrays, token ids and token-id lists, non-ASCII text,
escapes and whitespace in every spelling, member orders shuffled - valid and mistyped, and
feeds them to tests/unit/router/body_driver --api. For every body both sides must agree on
accept/reject, and on an accepted body produce the same bytes (or token ids). Each accepted
body is also fed again re-spelled (other escapes, other whitespace): the stream must not change.
test_responses_stream_equals_chat_stream checks that a conversation written for /v1/responses
and the same one written for /v1/chat/completions give the same stream.

Run with /usr/bin/python3 -m pytest tests/integration/test_canon_differential.py.
KVGATE_CANON_SEED and KVGATE_CANON_COUNT change the seed and the number of bodies.
"""
import json
import os
import random
import subprocess

import pytest
from canon_reference import Pairs, canonical_stream
from conftest import binary

SEED = int(os.environ.get("KVGATE_CANON_SEED", "20240612"))
COUNT = int(os.environ.get("KVGATE_CANON_COUNT", "3000"))

TEXTS = ["hello", "", " ", "\n", "\t", "a\"b", "back\\slash", "/", "é", "日本語", "😀", "\x00",
         "\x01", "\x1f", "\x1e", "\x7f", "\u2028", "cache_salt", "{\"k\":[1]}", "role", "\b\f\r"]
ROLES = ["system", "user", "assistant", "tool", "developer", "rôle"]
KEYS_NOISE = ["reasoning_content", "refusal", "x", "extra", "weight"]
# Keys with a control character (refused at every level); spell_string writes DEL and the C1
# controls raw or escaped at random, so the twins below check that the spelling does not count.
CONTROL_KEYS = ["cache_salt\x00x", "\x00", "a\x1f", "\n", "\x7f", "b\x85", "\x80\x9f"]


def rkey(r, keys):
    return r.choice(CONTROL_KEYS) if r.random() < 0.02 else r.choice(keys)


def rtext(r):
    return "".join(r.choice(TEXTS) for _ in range(r.randint(0, 5)))


def spell_string(r, s):
    """s as a JSON string literal, each character spelled at random among its valid forms."""
    out = ['"']
    for ch in s:
        cp = ord(ch)
        forms = []
        if ch == '"':
            forms = ['\\"']
        elif ch == "\\":
            forms = ["\\\\"]
        elif cp < 0x20:
            forms = [{8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}.get(cp, "\\u%04x" % cp)]
        else:
            forms = [ch]
            if ch == "/":
                forms.append("\\/")
        if cp >= 0x10000:
            hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
            forms.append("\\u%04x\\u%04X" % (hi, lo))
        else:
            forms.append("\\u%04x" % cp)
            forms.append("\\u%04X" % cp)
        out.append(r.choice(forms) if r.random() < 0.3 else forms[0])
    out.append('"')
    return "".join(out)


def ws(r):
    return r.choice(["", "", "", " ", "\n  ", "\t", "\r\n"])


def spell(r, v):
    """v (Pairs, lists, str, ("int"|"float", text), literals) as JSON text, spelled at random."""
    if isinstance(v, Pairs):
        items = [ws(r) + spell_string(r, k) + ws(r) + ":" + ws(r) + spell(r, x) + ws(r)
                 for k, x in v]
        return "{" + ",".join(items) + "}" if items else "{" + ws(r) + "}"
    if isinstance(v, list):
        items = [ws(r) + spell(r, x) + ws(r) for x in v]
        return "[" + ",".join(items) + "]" if items else "[" + ws(r) + "]"
    if isinstance(v, str):
        return spell_string(r, v)
    if isinstance(v, tuple):
        return v[1]
    return {True: "true", False: "false", None: "null"}[v]


def num(s):
    return ("float" if any(c in s for c in ".eE") else "int", s)


def rjson(r, depth=0):
    k = r.random()
    if depth < 3 and k < 0.2:
        return [rjson(r, depth + 1) for _ in range(r.randint(0, 3))]
    if depth < 3 and k < 0.4:
        return Pairs((rkey(r, ["type", "name", "a", "é", "function", "id"]), rjson(r, depth + 1))
                     for _ in range(r.randint(0, 3)))
    if k < 0.7:
        return rtext(r)
    if k < 0.9:
        return num(r.choice(["0", "-1", "1.50e3", "2E-2", "123456789012345678901", "-0.0"]))
    return r.choice([True, False, None])


def rpart(r):
    kind = r.choice(["text", "text", "text", "image_url", "input_audio", "file", "video_url"])
    if kind == "text":
        m = [("type", "text"), ("text", rtext(r))]
    elif kind in ("image_url", "video_url"):
        inner = [("url", r.choice(["http://x/a.png", "data:image/png;base64,AAAA", rtext(r)]))]
        if r.random() < 0.3:
            inner.append(("detail", "high"))
        m = [("type", kind), (kind, Pairs(inner))]
    elif kind == "input_audio":
        m = [("type", kind), (kind, Pairs([("data", rtext(r)), ("format", "wav")]))]
    else:
        inner = [(r.choice(["file_id", "file_data"]), rtext(r))]
        if r.random() < 0.3:
            inner.append(("filename", "a.pdf"))
        if r.random() < 0.2:
            inner.append(("file_data" if inner[0][0] == "file_id" else "file_id", rtext(r)))
        m = [("type", kind), (kind, Pairs(inner))]
    r.shuffle(m)
    return Pairs(m)


def rmessage(r):
    m = [("role", r.choice(ROLES))]
    roll = r.random()
    if roll < 0.5:
        m.append(("content", rtext(r)))
    elif roll < 0.8:
        m.append(("content", [rpart(r) for _ in range(r.randint(0, 4))]))
    elif roll < 0.9:
        m.append(("content", None))
    if r.random() < 0.2:
        m.append(("name", r.choice([rtext(r), None])))
    if r.random() < 0.2:
        m.append(("tool_calls", r.choice([None, [rjson(r) for _ in range(r.randint(0, 2))]])))
    if r.random() < 0.15:
        m.append(("tool_call_id", r.choice(["call_1", rtext(r), None])))
    if r.random() < 0.2:
        m.append((rkey(r, KEYS_NOISE), rjson(r)))
    if r.random() < 0.7:
        r.shuffle(m)
    return Pairs(m)


def rrespart(r):
    kind = r.choice(["input_text", "input_text", "output_text", "refusal", "input_image",
                     "input_file", "input_audio"])
    if kind in ("input_text", "output_text"):
        m = [("type", kind), ("text", rtext(r))]
    elif kind == "refusal":
        m = [("type", kind), ("refusal", rtext(r))]
    elif kind == "input_image":
        m = [("type", kind)]
        for k in r.sample(["image_url", "file_id"], r.randint(1, 2)):
            m.append((k, r.choice(["http://x/a.png", rtext(r), None])))
        if r.random() < 0.3:
            m.append(("detail", "auto"))
    elif kind == "input_file":
        m = [("type", kind)]
        for k in r.sample(["file_id", "file_data", "file_url"], r.randint(1, 3)):
            m.append((k, r.choice([rtext(r), None])))
        if r.random() < 0.3:
            m.append(("filename", "a.pdf"))
    else:
        m = [("type", kind), (kind, Pairs([("data", rtext(r)), ("format", "wav")]))]
    r.shuffle(m)
    return Pairs(m)


def rcontent(r, parts):
    roll = r.random()
    if roll < 0.5:
        return rtext(r)
    if roll < 0.85:
        return [parts(r) for _ in range(r.randint(0, 4))]
    return None


def ritem(r):
    roll = r.random()
    if roll < 0.5:
        m = [("role", r.choice(ROLES))]
        if r.random() < 0.9:
            m.append(("content", rcontent(r, rrespart)))
        if r.random() < 0.5:
            m.append(("type", "message"))
        if r.random() < 0.2:
            m.append(("id", "msg_1"))
    elif roll < 0.7:
        m = [("type", "function_call"), ("call_id", r.choice(["call_1", rtext(r)])),
             ("name", r.choice(["get", rtext(r)])),
             ("arguments", r.choice(["{}", '{"a":1}', rtext(r)]))]
        if r.random() < 0.3:
            m.append(("id", "fc_1"))
        if r.random() < 0.2:
            m.append(("status", "completed"))
    elif roll < 0.9:
        m = [("type", "function_call_output"), ("call_id", r.choice(["call_1", rtext(r)]))]
        if r.random() < 0.9:
            m.append(("output", rcontent(r, rrespart)))
    else:
        m = [("type", r.choice(["reasoning", "item_reference", "web_search_call"])),
             ("id", r.choice(["rs_1", rtext(r)]))]
        if r.random() < 0.5:
            m.append(("summary", [rjson(r) for _ in range(r.randint(0, 2))]))
    if r.random() < 0.15:
        m.append((rkey(r, KEYS_NOISE), rjson(r)))
    if r.random() < 0.7:
        r.shuffle(m)
    return Pairs(m)


def rprompt(r):
    roll = r.random()
    if roll < 0.35:
        return rtext(r)
    if roll < 0.55:
        return [rtext(r) for _ in range(r.randint(1, 4))]
    if roll < 0.75:
        return [num(str(r.choice([0, 1, 42, 4294967295, r.randrange(1 << 32)])))
                for _ in range(r.randint(1, 8))]
    if roll < 0.9:
        return [[num(str(r.randrange(1 << 17))) for _ in range(r.randint(1, 5))]
                for _ in range(r.randint(1, 3))]
    return None


# Type errors (and a few oddities that are fine), planted into valid bodies.
WRONG = [1, ("int", "1"), ("float", "1.5"), ("int", "-1"), ("int", "4294967296"), True, None, "s",
         [], Pairs(), Pairs([("type", "text")]), [("int", "1"), "x"], [[]], ["a", ("int", "2")],
         Pairs([("type", "bogus")]), Pairs([("role", "user"), ("role", "user")]),
         Pairs([("type", "text"), ("text", "a"), ("text", "b")]),
         Pairs([("type", "image_url"), ("image_url", "http://x")]),
         Pairs([("type", "file"), ("file", Pairs([("filename", "a")]))]),
         Pairs([("type", "image_url"), ("image_url", Pairs([("url", 1)]))])]


def plant(r, v):
    """v with one value somewhere replaced by a (probably) wrong one."""
    if isinstance(v, Pairs) and v and r.random() < 0.75:
        i = r.randrange(len(v))
        k, x = v[i]
        v = Pairs(v)
        v[i] = (k, plant(r, x))
        return v
    if isinstance(v, list) and not isinstance(v, Pairs) and v and r.random() < 0.75:
        i = r.randrange(len(v))
        v = list(v)
        v[i] = plant(r, v[i])
        return v
    w = r.choice(WRONG)
    return w() if callable(w) else w


def rbody(r, api):
    top = []
    if r.random() < 0.5:
        top.append(("model", "m"))
    if api == "chat":
        if r.random() < 0.95:
            top.append(("messages", [rmessage(r) for _ in range(r.randint(1, 5))]))
        if r.random() < 0.35:
            top.append(("tools", r.choice([None, [rjson(r) for _ in range(r.randint(0, 3))]])))
        if r.random() < 0.1:
            top.append(("prompt", rjson(r)))
    elif api == "responses":
        roll = r.random()
        if roll < 0.3:
            top.append(("input", rtext(r)))
        elif roll < 0.95:
            top.append(("input", [ritem(r) for _ in range(r.randint(1, 5))]))
        if r.random() < 0.4:
            top.append(("instructions", r.choice([rtext(r), None])))
        if r.random() < 0.35:
            top.append(("tools", r.choice([None, [rjson(r) for _ in range(r.randint(0, 3))]])))
        if r.random() < 0.1:
            top.append(("messages", rjson(r)))
        if r.random() < 0.1:
            top.append(("previous_response_id", "resp_1"))
    else:
        if r.random() < 0.95:
            top.append(("prompt", rprompt(r)))
        if r.random() < 0.1:
            top.append(("messages", rjson(r)))
    if r.random() < 0.2:
        top.append(("cache_salt", "x"))
    if r.random() < 0.2:
        top.append(("max_tokens", ("int", "16")))
    r.shuffle(top)
    top = Pairs(top)
    if r.random() < 0.3 and top:
        i = r.randrange(len(top))
        top[i] = (top[i][0], plant(r, top[i][1]))
    if r.random() < 0.03 and top:  # a repeated top-level member
        top = Pairs(list(top) + [r.choice(list(top))])
    return top


def run_driver(bodies, api):
    args = [str(binary("tests/unit/router/body_driver")), "--batch", "--api", api]
    stdin = b"".join(b"%d\n" % len(b) + b for b in bodies)
    p = subprocess.run(args, input=stdin, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    # Not splitlines(): it also splits at U+2028 and the like, which JSON strings may hold raw.
    lines = p.stdout.decode("utf-8").split("\n")[:-1]
    assert len(lines) == len(bodies)
    return [json.loads(line) for line in lines]


def as_hex(stream):
    is_tokens, data = stream
    return is_tokens, ("".join("%08x" % t for t in data) if is_tokens else data.hex())


FIXED = {
    "chat": [b'{"messages":[{"role":"user","content":"hi"}]}', b'{}', b'{"messages":[]}',
             b'{"messages":null}', b'{"messages":{}}', b'{"messages":[1]}', b'{"tools":[]}',
             b'{"tools":{}}', b'{"tools":null,"messages":[{"role":"a"}]}',
             b'{"messages":[{"role":"a"}],"messages":[{"role":"a"}]}',
             b'{"messages":[{"\\u0072ole":"a","c\\u006fntent":"x"}]}',
             b'{"messages":[{"role":"a","content":[{"type":"text"}]}]}',
             b'{"messages":[{"role":"a","content":[{"type":"te\\u0078t","text":"1"}]}]}',
             b'{"messages":[{"role":"a","cache_salt\\u0000x":"b"}]}',
             b'{"messages":[{"role":"a"}],"cache_salt\\u0000x":"b"}',
             b'{"tools":[{"function":{"parameters":{"\x7f":1}}}],"messages":[{"role":"a"}]}',
             b'{"messages":[{"role":"a","content":[{"type":"text","text":"x","\xc2\x85":1}]}]}',
             b'{"messages":[{"r\\u006fle":"a","\\u00a0":1,"\xc2\xa0":2}]}'],
    "responses": [b'{"input":"hi"}', b'{}', b'{"input":[]}', b'{"input":null}', b'{"input":{}}',
                  b'{"input":[1]}', b'{"input":[{}]}', b'{"input":"a","input":"a"}',
                  b'{"instructions":1}', b'{"instructions":null,"input":"x"}',
                  b'{"input":"x","instructions":"s","tools":[]}',
                  b'{"input":[{"type":"function_call","call_id":"c","name":"n"}]}',
                  b'{"input":[{"type":"function_call_output","call_id":"c"}]}',
                  b'{"input":[{"type":"function_call_output","output":"o"}]}',
                  b'{"input":[{"type":1,"role":"user"}]}',
                  b'{"input":[{"type":"message","type":"message","role":"user"}]}',
                  b'{"input":[{"role":"user","content":[{"type":"text","text":"a"}]}]}',
                  b'{"input":[{"role":"user","content":[{"type":"input_image"}]}]}',
                  b'{"input":[{"role":"user","content":[{"type":"input_image","image_url":1}]}]}',
                  b'{"input":[{"role":"user","content":[{"type":"input_file","file_url":"u"}]}]}',
                  b'{"input":[{"type":"f\\u0075nction_call","call_id":"c","name":"n",'
                  b'"arguments":"{}"}]}',
                  b'{"input":[{"type":"reasoning","summary":[{"\\u0001":1}]}]}'],
    "completions": [b'{"prompt":"x"}', b'{"prompt":[]}', b'{"prompt":[[]]}', b'{"prompt":[1,[2]]}',
                    b'{"prompt":[[1],2]}', b'{"prompt":[-0]}', b'{"prompt":[1e0]}',
                    b'{"prompt":[4294967295]}', b'{"prompt":[4294967296]}', b'{"prompt":null}',
                    b'{"prompt":"a","prompt":"a"}', b'{"prompt":[' + b"9" * 5000 + b']}',
                    b'{"prompt":{}}', b'{"prompt":[null]}', b'{"prompt":"x","\\u0000":1}',
                    b'{"prompt":[{"\\u009f":1}]}'],
}


@pytest.mark.parametrize("api", ["chat", "completions", "responses"])
def test_stream_agrees_with_reference(api):
    r = random.Random(SEED + {"completions": 0, "chat": 1, "responses": 2}[api])
    bodies, respelled = list(FIXED[api]), []
    for _ in range(COUNT):
        top = rbody(r, api)
        bodies.append(spell(r, top).encode())
        respelled.append(len(bodies) - 1)
        bodies.append((ws(r) + spell(r, top) + ws(r)).encode())
    verdicts = run_driver(bodies, api)
    counts, failures = {}, []
    for body, got in zip(bodies, verdicts):
        want, stream = canonical_stream(body, api)
        counts[want] = counts.get(want, 0) + 1
        rc = got["rc"]
        if want != rc and not (want == "invalid" and rc in ("EPARSE", "ELIMIT")):
            failures.append(f"reference says {want}, scanner {rc} ({got.get('message')}): "
                            f"{body[:400]!r}")
            continue
        if want == "ok":
            tokens, hexed = as_hex(stream)
            if got["tokens"] != tokens or got["prefix"] != hexed:
                failures.append(f"stream differs: {body[:400]!r}\n  want {hexed[:300]}\n"
                                f"  got  {got['prefix'][:300]}")
    # Re-spelled twins give the same verdict and the same stream.
    for i in respelled:
        a, b = verdicts[i], verdicts[i + 1]
        if a["rc"] != b["rc"] or a.get("prefix") != b.get("prefix"):
            failures.append(f"spelling changed the stream: {bodies[i][:200]!r} vs "
                            f"{bodies[i + 1][:200]!r}")
    assert not failures, f"{len(failures)} disagreements, first ones:\n" + "\n".join(failures[:8])
    assert counts.get("ok", 0) > COUNT // 2, counts
    assert counts.get("ETYPE", 0) > COUNT // 20, counts


def rconversation(r):
    """The same conversation as a /v1/responses body and a /v1/chat/completions body, in the
    shapes vLLM maps onto each other (docs/canonical.md, RESPONSES)."""
    resp, chat = [], []
    if r.random() < 0.3:
        tools = [rjson(r) for _ in range(r.randint(0, 2))]
        resp.append(("tools", tools))
        chat.append(("tools", tools))
    msgs, items = [], []
    if r.random() < 0.5:
        text = rtext(r)
        resp.append(("instructions", text))
        msgs.append(Pairs([("role", "system"), ("content", text)]))
    if r.random() < 0.2:
        text = rtext(r)
        resp.append(("input", text))
        msgs.append(Pairs([("role", "user"), ("content", text)]))
    else:
        for _ in range(r.randint(1, 5)):
            roll = r.random()
            if roll < 0.5:
                role = r.choice(ROLES)
                if r.random() < 0.5:
                    text = rtext(r)
                    items.append(Pairs([("role", role), ("content", text)]))
                    msgs.append(Pairs([("role", role), ("content", text)]))
                    continue
                rparts, cparts = [], []
                for _ in range(r.randint(0, 3)):
                    if r.random() < 0.7:
                        text = rtext(r)
                        rparts.append(Pairs([("type", r.choice(["input_text", "output_text"])),
                                             ("text", text)]))
                        cparts.append(Pairs([("type", "text"), ("text", text)]))
                    else:
                        url = r.choice(["http://x/a.png", rtext(r)])
                        rparts.append(Pairs([("type", "input_image"), ("image_url", url)]))
                        cparts.append(Pairs([("type", "image_url"),
                                             ("image_url", Pairs([("url", url)]))]))
                items.append(Pairs([("type", "message"), ("role", role), ("content", rparts)]))
                msgs.append(Pairs([("role", role), ("content", cparts)]))
            elif roll < 0.75:
                cid, name, args = r.choice(["call_1", rtext(r)]), rtext(r), r.choice(["{}", rtext(r)])
                items.append(Pairs([("type", "function_call"), ("arguments", args), ("name", name),
                                    ("call_id", cid), ("id", "fc_1")]))
                call = Pairs([("id", cid), ("type", "function"),
                              ("function", Pairs([("name", name), ("arguments", args)]))])
                msgs.append(Pairs([("role", "assistant"), ("content", None), ("tool_calls", [call])]))
            else:
                cid, out = r.choice(["call_1", rtext(r)]), rtext(r)
                items.append(Pairs([("output", out), ("call_id", cid),
                                    ("type", "function_call_output")]))
                msgs.append(Pairs([("role", "tool"), ("content", out), ("tool_call_id", cid)]))
        resp.append(("input", items))
    chat.append(("messages", msgs))
    r.shuffle(resp)
    r.shuffle(chat)
    return Pairs(resp), Pairs(chat)


def test_responses_stream_equals_chat_stream():
    """A conversation moving between /v1/responses and /v1/chat/completions keeps its stream,
    so its cache affinity."""
    r = random.Random(SEED + 3)
    pairs = [rconversation(r) for _ in range(COUNT // 3)]
    got_r = run_driver([spell(r, a).encode() for a, _ in pairs], "responses")
    got_c = run_driver([spell(r, b).encode() for _, b in pairs], "chat")
    failures, ok = [], 0
    for (a, b), x, y in zip(pairs, got_r, got_c):
        ok += x["rc"] == "ok"
        # Both may refuse alike: a tool's key with a control character (rjson plants some).
        if x["rc"] != y["rc"] or x.get("prefix") != y.get("prefix"):
            failures.append(f"{x.get('message')} {y.get('message')}\n  {spell(r, a)[:300]}\n"
                            f"  {spell(r, b)[:300]}")
    assert not failures, f"{len(failures)} differ, first ones:\n" + "\n".join(failures[:5])
    assert ok > len(pairs) * 9 // 10, ok
