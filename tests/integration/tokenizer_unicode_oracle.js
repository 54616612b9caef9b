// SPDX-License-Identifier: Apache-2.0
// The Rust tokenizers library (0.22, through @anush008/tokenizers) as the oracle of
// test_tokenizer_unicode.py: reads one JSON request a line on stdin, writes one JSON answer a line.
//   {"op":"split","pattern":REGEX,"behavior":"Removed"|"Isolated","texts":[...]}
//       -> [[[start,end],...] per text]  (code point offsets of the pieces the Split keeps)
//   {"op":"pieces","pattern":REGEX,"texts":[...]} -> [[piece,...] per text] (Split, Isolated)
//   {"op":"nfc","texts":[...]} -> [normalized,...]
//   {"op":"encode","file":PATH,"texts":[...]} -> [[id,...] per text]  (no special tokens)
'use strict';
const tk = require('@anush008/tokenizers');
const readline = require('readline');

// A tokenizer with nothing but a Split pre-tokenizer: the library compiles the pattern with its
// own Oniguruma (SysRegex), exactly as it does for a tokenizer.json's Split.
const splitters = new Map();
function splitter(pattern, behavior) {
    const key = behavior + '\u0000' + pattern;
    let p = splitters.get(key);
    if (!p) {
        const json = {
            version: '1.0', truncation: null, padding: null, added_tokens: [],
            normalizer: null,
            pre_tokenizer: {type: 'Split', pattern: {Regex: pattern}, behavior, invert: false},
            post_processor: null, decoder: null,
            model: {type: 'WordLevel', vocab: {'[UNK]': 0}, unk_token: '[UNK]'},
        };
        p = tk.Tokenizer.fromString(JSON.stringify(json)).getPreTokenizer();
        splitters.set(key, p);
    }
    return p;
}
const nfc = tk.nfcNormalizer();
const files = new Map();

async function answer(req) {
    switch (req.op) {
    case 'split': {
        const p = splitter(req.pattern, req.behavior);
        return req.texts.map((t) => p.preTokenizeString(t).map((x) => x[1]));
    }
    case 'pieces': {
        const p = splitter(req.pattern, 'Isolated');
        return req.texts.map((t) => p.preTokenizeString(t).map((x) => x[0]));
    }
    case 'nfc':
        return req.texts.map((t) => nfc.normalizeString(t));
    case 'encode': {
        let t = files.get(req.file);
        if (!t) {
            t = tk.Tokenizer.fromFile(req.file);
            files.set(req.file, t);
        }
        const out = [];
        for (const s of req.texts)
            out.push((await t.encode(s, null, {addSpecialTokens: false})).getIds());
        return out;
    }
    default:
        throw new Error('unknown op ' + req.op);
    }
}

(async () => {
    const rl = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
    for await (const line of rl) {
        if (line.length === 0)
            continue;
        process.stdout.write(JSON.stringify(await answer(JSON.parse(line))) + '\n');
    }
})().catch((e) => {
    process.stderr.write(String(e.stack || e) + '\n');
    process.exit(1);
});
