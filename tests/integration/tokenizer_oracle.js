// SPDX-License-Identifier: Apache-2.0
// Token ids from a reference tokenizer, for test_tokenizer_oracle.py and bench/tokenize.
//
//   node tokenizer_oracle.js rust|js TOKENIZER_JSON < cases > ids
//   node tokenizer_oracle.js bench-rust TOKENIZER_JSON FILE REPEAT
//
// "rust" is the Rust tokenizers library (0.22) through @anush008/tokenizers, the reference;
// "js" is @huggingface/tokenizers, a second opinion. Cases on stdin: records of a little-endian
// u32 byte length and that many bytes of UTF-8. For each case, stdout gets the ids without and
// then with special tokens added, each as a u32 count and that many u32 ids (a count of
// 0xffffffff: the library threw).
"use strict";
const fs = require("fs");
const path = require("path");

function loadRust(file) {
  const { Tokenizer } = require("@anush008/tokenizers");
  const tok = Tokenizer.fromFile(file);
  return async (text, special) => (await tok.encode(text, null, { addSpecialTokens: special })).getIds();
}

async function loadJs(file) {
  const mod = require("@huggingface/tokenizers");
  const json = JSON.parse(fs.readFileSync(file, "utf8"));
  const cfgPath = path.join(path.dirname(file), "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const tok = new mod.Tokenizer(json, cfg);
  return async (text, special) => tok.encode(text, { add_special_tokens: special }).ids;
}

function readCases(buf) {
  const cases = [];
  const dec = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
  for (let off = 0; off < buf.length;) {
    const n = buf.readUInt32LE(off);
    cases.push(dec.decode(buf.subarray(off + 4, off + 4 + n)));
    off += 4 + n;
  }
  return cases;
}

async function main() {
  const [mode, file, ...rest] = process.argv.slice(2);
  if (mode === "bench-rust") {
    // One core: the caller sets RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false.
    const enc = loadRust(file);
    const text = fs.readFileSync(rest[0], "utf8");
    const repeat = Number(rest[1] || 5);
    let ids = await enc(text, false); // warm-up
    const times = [];
    for (let i = 0; i < repeat; i++) {
      const t0 = process.hrtime.bigint();
      ids = await enc(text, false);
      times.push(Number(process.hrtime.bigint() - t0) / 1e9);
    }
    // The binding's own cost, on a one-character text.
    const o0 = process.hrtime.bigint();
    for (let i = 0; i < 1000; i++) await enc("a", false);
    const overhead = Number(process.hrtime.bigint() - o0) / 1e9 / 1000;
    times.sort((a, b) => a - b);
    process.stdout.write(JSON.stringify({ best_s: times[0], median_s: times[times.length >> 1],
      tokens: ids.length, bytes: Buffer.byteLength(text), overhead_s: overhead }) + "\n");
    return;
  }
  const enc = mode === "rust" ? loadRust(file) : await loadJs(file);
  const cases = readCases(fs.readFileSync(0));
  const parts = [];
  for (const text of cases) {
    for (const special of [false, true]) {
      let ids;
      try {
        ids = await enc(text, special);
      } catch (e) {
        ids = null;
      }
      const b = Buffer.alloc(4 + 4 * (ids ? ids.length : 0));
      b.writeUInt32LE(ids ? ids.length : 0xffffffff, 0);
      if (ids) ids.forEach((id, i) => b.writeUInt32LE(id, 4 + 4 * i));
      parts.push(b);
    }
  }
  process.stdout.write(Buffer.concat(parts));
}

main().catch((e) => { console.error(e); process.exit(1); });
