/* SPDX-License-Identifier: Apache-2.0 */
/* The pre-tokenizer split of Qwen2/3 and Llama 3: their Split regex, hand-compiled. */
#include <string.h>

#include "unicode.h"
#include "unicode_tables.h"

/* The two patterns exactly as tokenizer.json spells them (after JSON unescaping). */
static const char *const patterns[KVG_PRETOK_COUNT] = {
    [KVG_PRETOK_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [KVG_PRETOK_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                          "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

const char *kvg_pretok_kind_str(kvg_pretok_kind kind)
{
    switch (kind) {
    case KVG_PRETOK_QWEN2:
        return "qwen2";
    case KVG_PRETOK_LLAMA3:
        return "llama3";
    default:
        return "?";
    }
}

int kvg_pretok_kind_of(const char *pattern, size_t len)
{
    for (int k = 0; k < KVG_PRETOK_COUNT; k++)
        if (strlen(patterns[k]) == len && memcmp(patterns[k], pattern, len) == 0)
            return k;
    return -1;
}

/* The class bits (KVG_UC_L/N/S, 0 for the rest) of the code point at s[i]; its length in *n.
 * The text is valid UTF-8 (the caller's contract), so the decoder checks nothing. Code points
 * below 256 sit in the tables' first block, so ASCII needs one load. */
static inline unsigned cls_at(const unsigned char *s, size_t i, size_t *n)
{
    unsigned b = s[i];
    if (b < 0x80) {
        *n = 1;
        return kvg_uc_class_stage2[b];
    }
    uint32_t cp = kvg_uc_decode(s + i, n);
    return kvg_uc_class(cp);
}

/* The end of the run of code points from i whose class has a bit of `any` (want != 0) or none
 * of `any` (want == 0). */
static inline size_t run_end(const unsigned char *s, size_t len, size_t i, unsigned any, bool want)
{
    while (i < len) {
        size_t n;
        unsigned c;
        if (s[i] < 0x80) { /* the fast path: most text is ASCII */
            c = kvg_uc_class_stage2[s[i]];
            n = 1;
        } else {
            c = cls_at(s, i, &n);
        }
        if (((c & any) != 0) != want)
            break;
        i += n;
    }
    return i;
}

/* (?i:...) of the contractions: the letters each pattern letter matches under Oniguruma's case
 * folding. Besides ASCII, only U+017F LATIN SMALL LETTER LONG S folds to one of them ('s');
 * test_tokenizer_unicode.py checks that against the library over every code point. */
static size_t fold_letter(const unsigned char *s, size_t len, size_t i, char *out)
{
    if (i >= len)
        return 0;
    unsigned b = s[i];
    if (b < 0x80) {
        *out = (char)(b | 0x20);
        return ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') ? 1 : 0;
    }
    if (b == 0xc5 && i + 1 < len && s[i + 1] == 0xbf) { /* U+017F */
        *out = 's';
        return 2;
    }
    return 0;
}

/* Alternative 1, (?i:'s|'t|'re|'ve|'m|'ll|'d): the match's length at s[i] == '\'', or 0. */
static size_t contraction(const unsigned char *s, size_t len, size_t i)
{
    char a, b;
    size_t na = fold_letter(s, len, i + 1, &a);
    if (na == 0)
        return 0;
    switch (a) {
    case 's':
    case 't':
    case 'm':
    case 'd':
        return 1 + na;
    case 'r':
    case 'v': {
        size_t nb = fold_letter(s, len, i + 1 + na, &b);
        return nb && b == 'e' ? 1 + na + nb : 0;
    }
    case 'l': {
        size_t nb = fold_letter(s, len, i + 1 + na, &b);
        return nb && b == 'l' ? 1 + na + nb : 0;
    }
    default:
        return 0;
    }
}

/* Every position starts a match (a letter, a digit, white space or anything else each begin
 * one alternative), so find_iter's pieces are the matches, one after the other, and the piece
 * at pos is the first alternative that matches there, with Oniguruma's greedy backtracking. */
size_t kvg_pretok_next(kvg_pretok_kind kind, const char *text, size_t len, size_t pos)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t n0;
    unsigned c0 = cls_at(s, pos, &n0);
    unsigned b0 = s[pos];

    if (b0 == '\'') {
        size_t n = contraction(s, len, pos);
        if (n)
            return n;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c0 & KVG_UC_L)
        return run_end(s, len, pos + n0, KVG_UC_L, true) - pos;
    if (!(c0 & KVG_UC_N) && b0 != '\r' && b0 != '\n' && pos + n0 < len) {
        size_t n1;
        if (cls_at(s, pos + n0, &n1) & KVG_UC_L)
            return run_end(s, len, pos + n0 + n1, KVG_UC_L, true) - pos;
    }
    /* \p{N} or \p{N}{1,3} */
    if (c0 & KVG_UC_N) {
        size_t end = pos + n0;
        if (kind == KVG_PRETOK_LLAMA3) {
            for (int k = 1; k < 3 && end < len; k++) {
                size_t n;
                if (!(cls_at(s, end, &n) & KVG_UC_N))
                    break;
                end += n;
            }
        }
        return end - pos;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t start = pos;
    if (b0 == ' ' && pos + 1 < len) {
        size_t n1;
        if (cls_at(s, pos + 1, &n1) == 0)
            start = pos + 1;
    }
    if (start != pos || c0 == 0) {
        size_t end = run_end(s, len, start, KVG_UC_L | KVG_UC_N | KVG_UC_S, false);
        while (end < len && (s[end] == '\r' || s[end] == '\n'))
            end++;
        return end - pos;
    }
    /* Here c0 is \s. \s*[\r\n]+: \s* backs off to the run's last \r or \n, which [\r\n]+ takes
     * (nothing after it in the run is \r or \n). */
    size_t end = pos, last_nl = 0, last_start = pos;
    while (end < len) {
        size_t n;
        if (!(cls_at(s, end, &n) & KVG_UC_S))
            break;
        if (s[end] == '\r' || s[end] == '\n')
            last_nl = end + 1;
        last_start = end;
        end += n;
    }
    if (last_nl)
        return last_nl - pos;
    /* \s+(?!\S): the whole run at the end of the text, else all but its last code point (which
     * leaves white space after it); \s+ when the run is one code point. */
    if (end < len && last_start > pos)
        return last_start - pos;
    return end - pos;
}
