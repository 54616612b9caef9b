// SPDX-License-Identifier: Apache-2.0
// The oracle of test_template_oracle.py: @huggingface/jinja renders a template file for each
// JSON context line on stdin; one JSON line out per context, {"ok": text} or {"error": message}.
// strftime_now sees the fixed clock the C driver uses (26 Jul 2024, UTC).
"use strict";
const fs = require("fs");
const readline = require("readline");
const Module = require("module");
const path = require("path");

// @huggingface/jinja 0.5.11's str.strip/lstrip/rstrip ignore their argument (s.strip("\n")
// strips every kind of whitespace), where Python strips exactly the characters given; Qwen3's
// template relies on that (content.lstrip('\n')). The oracle is loaded with those three methods
// replaced by Python's definition, and with nothing else changed: each replacement must apply
// exactly once, or the script stops.
function loadJinja() {
  const file = require.resolve("@huggingface/jinja");
  let code = fs.readFileSync(file, "utf8");
  for (const [js, left, right] of [["trim", true, true], ["trimStart", true, false],
                                   ["trimEnd", false, true]]) {
    const from = `new FunctionValue(() => {\n          return new StringValue(this.value.${js}());`;
    const to = `new FunctionValue((args) => {\n          return new StringValue(__pyStrip(this.value, args, ${left}, ${right}));`;
    const parts = code.split(from);
    if (parts.length !== 2) throw new Error(`oracle patch: ${js} found ${parts.length - 1} times`);
    code = parts.join(to);
  }
  code = `const __PY_SPACE = new Set([9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 0x85, 0xa0, 0x1680,
      0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
      0x2028, 0x2029, 0x202f, 0x205f, 0x3000]);
    function __pyStrip(s, args, left, right) {
      const a = args && args.length ? args[0] : undefined;
      const chars = a && a.type === "StringValue" ? new Set(Array.from(a.value, (c) => c.codePointAt(0))) : null;
      const drop = (c) => (chars ? chars.has(c.codePointAt(0)) : __PY_SPACE.has(c.codePointAt(0)));
      const cps = Array.from(s);
      let b = 0, e = cps.length;
      if (left) while (b < e && drop(cps[b])) b++;
      if (right) while (e > b && drop(cps[e - 1])) e--;
      return cps.slice(b, e).join("");
    }\n` + code;
  const m = new Module(file, module);
  m.filename = file;
  m.paths = Module._nodeModulePaths(path.dirname(file));
  m._compile(code, file);
  return m.exports;
}
const { Template } = loadJinja();

const src = fs.readFileSync(process.argv[2], "utf8");
const nowS = Number(process.argv[3] || 1722000000);
const tpl = new Template(src);
// Its strftime_now formats `new Date()` in local time: pin the zone and the clock.
process.env.TZ = "UTC";
const RealDate = Date;
global.Date = class extends RealDate {
  constructor(...a) {
    if (a.length === 0) super(nowS * 1000);
    else super(...a);
  }
};

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
const out = [];
rl.on("line", (line) => {
  if (!line) return;
  const ctx = JSON.parse(line);
  let res;
  try {
    res = { ok: tpl.render(ctx) };
  } catch (e) {
    res = { error: String(e && e.message ? e.message : e) };
  }
  out.push(JSON.stringify(res));
});
rl.on("close", () => { process.stdout.write(out.join("\n") + (out.length ? "\n" : "")); });
