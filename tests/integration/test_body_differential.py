# SPDX-License-Identifier: Apache-2.0
"""Differential test of the request-body rewriter (router/body.c) against Python's json module.

A seeded generator makes a few thousand request bodies, valid and invalid (deep nesting, odd
escapes, surrogates, big numbers, duplicate keys, BOMs, control characters, invalid UTF-8),
and feeds them to tests/unit/router/body_driver, which prints one verdict per body. For every
body the rewriter must accept exactly what Python accepts under the rules kvgate enforces, and
for every accepted body json.loads(output) must be the input minus its top-level cache_salt
members plus the injected salt.

Python's json is not strict RFC 8259 out of the box; the reference closes these gaps (see
docs/isolation.md, "Request bodies"):
- it accepts NaN, Infinity and -Infinity: parse_constant rejects them;
- it accepts lone UTF-16 surrogates in \\u escapes ("\\ud800"): a decoded string holding one
  counts as invalid;
- json.loads(bytes) guesses UTF-16/32 and skips a UTF-8 BOM: bodies are decoded as strict UTF-8
  first, and json.loads(str) rejects a BOM;
- int() refuses literals of more than 4300 digits (CPython 3.11): numbers are kept as text;
- its depth limit is the interpreter's recursion limit: kvgate's is 64 (the body is depth 1);
- kvgate also rejects, as type errors, a top level that is not an object, a "model" that is
  not a string without NUL characters or null, a "stream" that is not a boolean or null, a
  repeated "model" or "stream" member, and an object key at any level that holds a control
  character (Unicode Cc: U+0000-U+001F, U+007F-U+009F), however it is spelled.

Run with the Debian interpreter: /usr/bin/python3 -m pytest tests/integration/test_body_differential.py
KVGATE_BUILD_DIR selects the build (default: build). KVGATE_DIFF_SEED and KVGATE_DIFF_COUNT
change the seed and the number of generated bodies.
"""
import json
import os
import random
import re
import subprocess

import pytest
from conftest import binary

SALT = "Zm9vYmFyLXNjb3BlLXNhbHQtMDEyMzQ1Njc4OWFiY2Rl"[:43]
SEED = int(os.environ.get("KVGATE_DIFF_SEED", "20240611"))
COUNT = int(os.environ.get("KVGATE_DIFF_COUNT", "5000"))
MAX_DEPTH = 64
PROMPT_KEYS = ("prompt", "messages", "input", "tools")


# ---- the reference ----------------------------------------------------------------------------

class Pairs(list):
    """A JSON object as the list of its (key, value) pairs: order and duplicates kept."""


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def _loads_pairs(text):
    return json.loads(text, object_pairs_hook=Pairs, parse_constant=_reject_constant,
                      parse_int=lambda s: ("int", s), parse_float=lambda s: ("float", s))


def _loads_dict(text):
    return json.loads(text, parse_constant=_reject_constant,
                      parse_int=lambda s: ("int", s), parse_float=lambda s: ("float", s))


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # Unicode Cc


def _walk(v, depth=1):
    """(deepest nesting level of any value, whether a string holds a lone surrogate, whether an
    object key holds a control character)."""
    deepest, lone, control_key = depth, False, False
    stack = [(v, depth)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                lone = True
        elif isinstance(x, Pairs):
            for k, val in x:
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    lone = True
                control_key = control_key or CONTROL.search(k) is not None
                stack.append((val, d + 1))
        elif isinstance(x, list):
            stack.extend((item, d + 1) for item in x)
    return deepest, lone, control_key


def reference(body: bytes):
    """What kvgate must say about body: ('invalid', None), ('ELIMIT', None), ('ETYPE', None)
    or ('ok', pairs)."""
    try:
        text = body.decode("utf-8")  # strict: no overlongs, no encoded surrogates
        v = _loads_pairs(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "invalid", None
    deepest, lone, control_key = _walk(v)
    if lone:
        return "invalid", None
    if deepest > MAX_DEPTH:
        return "ELIMIT", None
    if not isinstance(v, Pairs) or control_key:
        return "ETYPE", None
    models = [val for k, val in v if k == "model"]
    streams = [val for k, val in v if k == "stream"]
    if len(models) > 1 or len(streams) > 1:
        return "ETYPE", None
    if models and not (models[0] is None or (isinstance(models[0], str) and "\0" not in models[0])):
        return "ETYPE", None
    if streams and not (streams[0] is None or isinstance(streams[0], bool)):
        return "ETYPE", None
    return "ok", v


# ---- the generator ----------------------------------------------------------------------------

KEY_SPELLINGS = {
    "cache_salt": ['"cache_salt"', '"\\u0063ache_salt"', '"cache\\u005fsalt"',
                   '"\\u0063\\u0061\\u0063\\u0068\\u0065\\u005f\\u0073\\u0061\\u006C\\u0074"',
                   '"cach\\u0065_salt"'],
    "model": ['"model"', '"\\u006dodel"', '"mod\\u0065l"'],
    "stream": ['"stream"', '"str\\u0065am"'],
    "prompt": ['"prompt"', '"pr\\u006fmpt"'],
    "messages": ['"messages"'],
    "input": ['"input"'],
    "tools": ['"tools"'],
}
OTHER_KEYS = ['"max_tokens"', '"temperature"', '"Cache_salt"', '"cache_salt "', '"cache-salt"',
              '"cache\\/salt"', '""', '"\\u00e9t\\u00e9"', '"日本"', '"\\ud83d\\ude00"', '"user"',
              '"a"', '"\\u007e\\u00a0"', '"\u00a0"']
# Keys holding a control character, escaped or raw (DEL and C1 may stand raw in a string).
CONTROL_KEYS = ['"cache_salt\\u0000"', '"cache_salt\\u0000x"', '"a\\u001f"', '"\\n"',
                '"\\u007F"', '"a\x7f"', '"\\u0080"', '"\\u009f"', '"x\u0085"',
                '"\\ud83d\\ude00\\t"']


def other_key(r):
    return r.choice(CONTROL_KEYS) if r.random() < 0.03 else r.choice(OTHER_KEYS)


STRING_PIECES = ["hello", " ", "\\n", "\\t", "\\\"", "\\\\", "\\/", "\\b\\f\\r", "\\u0041",
                 "\\u00e9", "\\u65e5", "\\ud83d\\ude00", "\\uDBFF\\uDFFF", "\\u0000", "é",
                 "日本語", "😀", "\u007f", "cache_salt", "}", "]", ",", ":", "{\\\"cache_salt\\\":1}"]
NUMBERS = ["0", "-0", "1", "-1", "42", "3.14", "-2.5e-3", "1E10", "1e+2", "0.0", "-0.0e0",
           "123456789012345678901234567890", "1" * 5000, "1e400", "-1e-400", "9007199254740993"]
# Escapes Python decodes and kvgate rejects: lone or reversed surrogates.
LONE_SURROGATES = ["\\ud800", "\\udc00", "\\uDBFF\\u0041", "\\udc00\\ud800", "\\ud83d\\n"]
WS = ["", "", "", " ", "\n", "\t", "\r\n", "  "]


def gen_string(r):
    pieces = [r.choice(LONE_SURROGATES if r.random() < 0.004 else STRING_PIECES)
              for _ in range(r.randint(0, 6))]
    return '"' + "".join(pieces) + '"'


def gen_value(r, depth, budget):
    """A random valid JSON value whose nesting level is depth."""
    kind = r.random()
    if depth >= MAX_DEPTH or budget[0] <= 0:
        kind = 0.9
    budget[0] -= 1
    ws = lambda: r.choice(WS)  # noqa: E731
    if kind < 0.18:
        items = [ws() + gen_value(r, depth + 1, budget) + ws() for _ in range(r.randint(0, 4))]
        return "[" + ",".join(items) + "]" if items else "[" + ws() + "]"
    if kind < 0.36:
        members = []
        for _ in range(r.randint(0, 4)):
            key = (other_key(r) if r.random() < 0.75
                   else r.choice(['"cache_salt"', '"model"', '"prompt"', '"stream"']))
            members.append(ws() + key + ws() + ":" + ws() + gen_value(r, depth + 1, budget) + ws())
        return "{" + ",".join(members) + "}" if members else "{" + ws() + "}"
    if kind < 0.65:
        return gen_string(r)
    if kind < 0.85:
        return r.choice(NUMBERS)
    return r.choice(["true", "false", "null"])


def nested(r, levels):
    """A value nested exactly `levels` containers deep (arrays and objects mixed)."""
    opens, closes = [], []
    for _ in range(levels):
        if r.random() < 0.5:
            opens.append("[")
            closes.append("]")
        else:
            opens.append('{"k":')
            closes.append("}")
    inner = r.choice(["", "1", '"x"']) if levels else "1"
    if opens and opens[-1] != "[" and inner == "":
        inner = "null"
    return "".join(opens) + inner + "".join(reversed(closes))


def gen_member(r):
    """(raw member text, decoded key, raw value) of a top-level member."""
    roll = r.random()
    if roll < 0.45:
        name = r.choice(list(KEY_SPELLINGS))
        key = r.choice(KEY_SPELLINGS[name])
    else:
        name, key = None, other_key(r)
    if name == "model" and r.random() < 0.8:
        value = r.choice([gen_string(r), '"llama-3.1-8b"', "null", '"m\\u0000x"', "1", "[]"])
    elif name == "stream" and r.random() < 0.8:
        value = r.choice(["true", "false", "null", '"true"', "0"])
    elif name == "messages" and r.random() < 0.7:
        value = ('[{"role":"system","content":' + gen_string(r) + '},{"role":"user","content":'
                 + gen_string(r) + "}]")
    elif r.random() < 0.05:
        value = nested(r, r.choice([61, 62, 63, 64, 65, 70]))
    else:
        value = gen_value(r, 2, [r.randint(1, 25)])
    ws = lambda: r.choice(WS)  # noqa: E731
    return ws() + key + ws() + ":" + ws() + value + ws(), name, value


def gen_valid(r):
    """A body built from members (valid unless a member's value is too deep or mistyped) and
    the prompt bytes it must report."""
    members = [gen_member(r) for _ in range(r.randint(0, 8))]
    if r.random() < 0.3:  # duplicates of a salt, wherever they land
        for _ in range(r.randint(1, 3)):
            members.insert(r.randint(0, len(members)),
                           (r.choice(WS) + r.choice(KEY_SPELLINGS["cache_salt"]) + ":"
                            + gen_value(r, 2, [3]), "cache_salt", None))
    text = r.choice(WS) + "{" + ",".join(m[0] for m in members) + (r.choice(WS) if not members
                                                                    else "") + "}" + r.choice(WS)
    prompt_bytes = sum(len(m[2].encode()) for m in members if m[1] in PROMPT_KEYS)
    return text.encode(), prompt_bytes


BAD_BYTES = [b"\xff", b"\xfe", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
             b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xbf", b"\xe2\x82",
             b"\xf0\x9f\x98", b"\xc3", b"\x00", b"\x01", b"\x1f", b"\x7f", b"\t", b"\n"]
BAD_TOKENS = [b"NaN", b"Infinity", b"-Infinity", b"\\ud800", b"\\udc00", b"\\ud800\\u0041",
              b"\\uDBFF", b"\\x41", b"\\'", b"\\u12", b"\\u12G4", b"\\", b'"', b",", b",,", b":",
              b"{", b"}", b"[", b"]", b"01", b"1.", b".5", b"+1", b"1e", b"-", b"tru", b"nul",
              b"True", b"'a'", b"\xef\xbb\xbf", b"/*c*/", b"\x0b", b"\x0c", b"\xc2\xa0"]


def mutate(r, body):
    b = bytearray(body)
    for _ in range(r.randint(1, 3)):
        op = r.random()
        at = r.randint(0, len(b))
        if op < 0.25 and b:
            at = min(at, len(b) - 1)
            b[at] = r.randrange(256)
        elif op < 0.45 and b:
            del b[min(at, len(b) - 1)]
        elif op < 0.7:
            b[at:at] = r.choice(BAD_BYTES)
        elif op < 0.9:
            b[at:at] = r.choice(BAD_TOKENS)
        else:
            del b[at:]
    return bytes(b)


def fixed_cases():
    deep_ok = b'{"a":' + b"[" * 63 + b"]" * 63 + b"}"
    deep_bad = b'{"a":' + b"[" * 64 + b"]" * 64 + b"}"
    very_deep = b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"
    return [
        b"", b" ", b"{}", b"[]", b'""', b"null", b"0", b"{}{}", b"{} ", b"\xef\xbb\xbf{}",
        b'{"a":NaN}', b'{"a":Infinity}', b'{"a":-Infinity}', b'{"a":"\\ud800"}',
        b'{"a":"\\udc00\\ud800"}', b'{"a":"\\ud800\\udc00"}', b'{"\\ud800":1}',
        b'{"a":"\xed\xa0\x80"}', b'{"a":"\xc0\x80"}', b'{"a":"\x00"}', b'{"a":"\x7f"}',
        b'{"a":' + b"1" * 5000 + b"}", b'{"a":1e999}', deep_ok, deep_bad, very_deep,
        b'{"model":"a","model":"a"}', b'{"model":"a\\u0000"}', b'{"stream":1}',
        b'{"cache_salt":1,"cache_salt":2}', b'{"\\u0063ache_salt":{"cache_salt":[]}}',
        b'{"a":1,}', b'{"a" : 1 , }', b"{'a':1}", b'{"a":"\t"}', b'{"a":\x0c1}',
        b'{"a":1}\x00', b'\x00{"a":1}', b'{"a":"\\u00"}', b'{"a":"\\u00e9\\"}',
        b'{"model":"m","cache_salt\\u0000x":"attacker"}', b'{"a":[{"b\\u007f":1}]}',
        b'{"a\x7f":1}', b'{"\xc2\x85":1}', b'{"\xc2\xa0":1,"\\u00a0":2,"\\u007e":3}',
        b'{"\\u0063ache_salt":"x","a":"\\u0000\x7f\xc2\x85"}', b'{"a\\u0000":1,}',
    ]


def corpus():
    r = random.Random(SEED)
    cases = [(b, None) for b in fixed_cases()]
    while len(cases) < COUNT:
        body, prompt_bytes = gen_valid(r)
        if r.random() < 0.45:
            cases.append((mutate(r, body), None))
        else:
            cases.append((body, prompt_bytes))
    return cases


# ---- the test ---------------------------------------------------------------------------------

def run_driver(bodies, salt):
    args = [str(binary("tests/unit/router/body_driver")), "--batch"]
    if salt is not None:
        args += ["--salt", salt]
    stdin = b"".join(b"%d\n" % len(b) + b for b in bodies)
    p = subprocess.run(args, input=stdin, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    # Not splitlines(): it also splits at U+0085 and U+2028, which JSON strings may hold raw.
    lines = p.stdout.decode("utf-8").split("\n")[:-1]
    assert len(lines) == len(bodies)
    return [json.loads(line) for line in lines]


def is_subsequence(small: bytes, big: bytes) -> bool:
    it = iter(big)
    return all(c in it for c in small)


def expected_pairs(pairs, salt):
    kept = Pairs(p for p in pairs if p[0] != "cache_salt")
    if salt is not None:
        kept.append(("cache_salt", salt))
    return kept


def salt_member(body: bytes, pairs, salt):
    if salt is None:
        return b""
    text = b'"cache_salt":' + json.dumps(salt).encode()
    return text if not any(k != "cache_salt" for k, _ in pairs) else b"," + text


@pytest.mark.parametrize("salt", [SALT, None], ids=["salt", "no-salt"])
def test_rewriter_agrees_with_python_json(salt):
    cases = corpus()
    verdicts = run_driver([b for b, _ in cases], salt)
    counts = {}
    failures = []
    for (body, prompt_bytes), got in zip(cases, verdicts):
        want, pairs = reference(body)
        counts[want] = counts.get(want, 0) + 1
        rc = got["rc"]
        ok = {"invalid": rc in ("EPARSE", "ELIMIT"), "ELIMIT": rc == "ELIMIT",
              "ETYPE": rc == "ETYPE", "ok": rc == "ok"}[want]
        if not ok:
            failures.append(f"python says {want}, rewriter {rc} ({got.get('message')} at "
                            f"{got.get('offset')}): {body[:300]!r}")
            continue
        if want != "ok":
            continue
        out = got["output"].encode("utf-8")
        # The meaning: input minus top-level cache_salt members plus the salt, in order, with
        # duplicates of other keys kept; and the same under Python's last-wins dict semantics.
        out_pairs = _loads_pairs(out.decode("utf-8"))
        if out_pairs != expected_pairs(pairs, salt):
            failures.append(f"output differs: {body[:300]!r} -> {out[:300]!r}")
            continue
        want_dict = {k: v for k, v in _loads_dict(body.decode("utf-8")).items()
                     if k != "cache_salt"}
        if salt is not None:
            want_dict["cache_salt"] = salt
        assert _loads_dict(out.decode("utf-8")) == want_dict
        # Byte for byte: nothing is rewritten, only members removed and the salt added.
        removed = sum(1 for k, _ in pairs if k == "cache_salt")
        member = salt_member(body, pairs, salt)
        stripped = out.replace(member, b"", 1) if member else out
        if removed == 0 and stripped != body:
            failures.append(f"bytes changed: {body[:300]!r} -> {out[:300]!r}")
        elif removed and not is_subsequence(stripped, body):
            failures.append(f"bytes not kept in order: {body[:300]!r} -> {out[:300]!r}")
        assert got["removed"] == removed, body
        model = [v for k, v in pairs if k == "model"]
        assert got["model"] == (model[0] if model else None), body
        stream = [v for k, v in pairs if k == "stream"]
        assert got["stream"] == (bool(stream) and stream[0] is True), body
        if prompt_bytes is not None:
            assert got["prompt_bytes"] == prompt_bytes, body
    assert not failures, f"{len(failures)} disagreements, first ones:\n" + "\n".join(failures[:10])
    # The corpus must exercise every verdict in earnest.
    assert counts.get("ok", 0) > COUNT // 4, counts
    assert counts.get("invalid", 0) > COUNT // 5, counts
    assert counts.get("ETYPE", 0) > 20 and counts.get("ELIMIT", 0) > 5, counts
