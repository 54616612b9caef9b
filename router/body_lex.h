/* SPDX-License-Identifier: Apache-2.0 */
/* The body scanner's JSON lexer, the part that must inline into its callers: scanner state, the
 * string scanner with its SSE2/SWAR block paths, escapes, literals. Private to router/body*.c. */
#ifndef KVG_BODY_LEX_H
#define KVG_BODY_LEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "router.h"

/*
 * Why a header of static inline functions: scan_string_to is inlined into three copies (a
 * value's scan, a key's scan, a scan that decodes into the stream), and its per-block loop must
 * inline first_special and the escape helpers into each; body.c and body_canon.c both hold
 * such callers, and a call per block would cost more than the block's compare. What runs once
 * per value, once per long run or only on an error is out of line in body_lex.c; the error
 * paths are declared cold here so that their callers keep them out of the hot layout. The one
 * exception, walk_value, is here to be inlined twice: as the plain validator (body_lex.c) and
 * as the canonical JSON writer (body_canon.c), each without the other's cost.
 */

#define BODY_MAX_DEPTH 64

/* The first type error; reported only if the whole body is valid JSON, so that a client gets
 * the parse error for a body that is both broken and mistyped. */
typedef struct type_fault {
    int rc; /* 0: none yet */
    size_t offset;
    char message[sizeof(((kvg_json_error *)0)->message)];
} type_fault;

typedef struct scanner {
    const unsigned char *start;
    const unsigned char *end;
    kvg_json_error *err;
    type_fault *fault; /* where type errors wait for the end of the body */
} scanner;

/* In body_lex.c. */
/** The parse error of a string whose contents [s, stop) hold a bad escape, as json.c finds it. */
__attribute__((cold)) int kvg_body_check_escapes(const scanner *sc, const unsigned char *s,
                                                 const unsigned char *stop);
/** Record the key with raw contents [ks, ke), which holds a control character, as the body's
 *  type error (sc->fault, the first one wins). */
__attribute__((cold)) void kvg_body_bad_key(const scanner *sc, const unsigned char *ks,
                                            const unsigned char *ke);
/** Scan one value at *pp (whitespace first) at nesting depth `depth` (the body is 1), leaving
 *  *pp just past it. 0 or a parse error (KVG_EPARSE, KVG_ELIMIT). */
int kvg_body_scan_value(const scanner *sc, const unsigned char **pp, unsigned depth);
/** Scan the number at *pp (on its first byte), leaving *pp past it. 0 or KVG_EPARSE. */
int kvg_body_scan_number(const scanner *sc, const unsigned char **pp);
/** Code point cp as one character of a string in canonical JSON, to o (at most 6 bytes).
 *  Returns the length written. */
size_t kvg_body_put_json_char(unsigned char *o, unsigned long cp);

/* Bytes that end a plain run inside a string: '"', '\\', controls and non-ASCII. */
static const unsigned char string_special[256] = {
    [0x00 ... 0x1f] = 1,
    ['"'] = 1,
    ['\\'] = 1,
    [0x80 ... 0xff] = 1,
};

/* The same inside a key, plus DEL: the one control character that may stand raw in a string
 * and is ASCII (the C1 controls are non-ASCII, special already). See bad_key. */
static const unsigned char key_special[256] = {
    [0x00 ... 0x1f] = 1, ['"'] = 1, ['\\'] = 1, [0x7f] = 1, [0x80 ... 0xff] = 1,
};

static inline long hex_digit(unsigned char c)
{
    if ((unsigned)(c - '0') < 10u)
        return c - '0';
    c |= 0x20;
    if ((unsigned)(c - 'a') < 6u)
        return c - 'a' + 10;
    return -1;
}

/* A copy in each file rather than one extern function: the compiler then knows that it returns
 * rc, and the hot paths that end in `return fail(...)` stay tail calls without a stack frame. */
__attribute__((cold, noinline, unused)) static int fail(const scanner *sc, int rc,
                                                        const unsigned char *at, const char *msg)
{
    if (sc->err) {
        sc->err->offset = (size_t)(at - sc->start);
        snprintf(sc->err->message, sizeof(sc->err->message), "%s", msg);
    }
    return rc;
}

static inline const unsigned char *skip_ws(const unsigned char *p, const unsigned char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* Four hex digits at p (readable), or -1. */
static inline long hex4(const unsigned char *p)
{
    long a = hex_digit(p[0]), b = hex_digit(p[1]), c = hex_digit(p[2]), d = hex_digit(p[3]);
    if ((a | b | c | d) < 0)
        return -1;
    return a << 12 | b << 8 | c << 4 | d;
}

/* The byte that each escape standing for one character (after the backslash) decodes to; 0 for
 * the others. */
static const unsigned char simple_escape[256] = {
    ['"'] = '"',  ['\\'] = '\\', ['/'] = '/',  ['b'] = '\b',
    ['f'] = '\f', ['n'] = '\n',  ['r'] = '\r', ['t'] = '\t',
};

/* Length of the valid escape at p (p[0] == '\\', p + 1 < end), or 0 when it is not one. */
static inline size_t valid_escape(const unsigned char *p, const unsigned char *end)
{
    if (simple_escape[p[1]])
        return 2;
    if (p[1] != 'u' || end - p < 6)
        return 0;
    long cp = hex4(p + 2);
    if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
        return 0;
    if (cp < 0xD800 || cp > 0xDBFF)
        return 6;
    if (end - p < 12 || p[6] != '\\' || p[7] != 'u')
        return 0;
    long lo = hex4(p + 8);
    return lo >= 0xDC00 && lo <= 0xDFFF ? 12 : 0;
}

/* The code point of the valid escape at p, n bytes long (valid_escape's length). */
static inline unsigned long escape_cp(const unsigned char *p, size_t n)
{
    if (n == 2)
        return simple_escape[p[1]];
    unsigned long cp = (unsigned long)hex4(p + 2);
    if (n == 12)
        cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned long)hex4(p + 8) - 0xDC00);
    return cp;
}

/* first_special(p, o, key): offset of the first byte of the 16 (SSE2) or 8 at p that is special
 * in a string (with key, in a key), or the block size when none is; with o, the whole block is
 * copied there as well. */
/* KVG_BODY_NO_SIMD builds the portable path on x86 too, so that its tests run here. */
#if defined(__SSE2__) && !defined(KVG_BODY_NO_SIMD)
#include <immintrin.h>
#define STRING_BLOCK 16
/* 0xff in the special bytes of v. Flipping bit 1 sends '"' (0x22) to 0x20 and the controls
 * onto themselves, so one signed compare finds them, '"' and the bytes >= 0x80 (negative), and
 * a second finds '\\'. */
static inline __m128i special16(__m128i v)
{
    return _mm_or_si128(_mm_cmplt_epi8(_mm_xor_si128(v, _mm_set1_epi8(2)), _mm_set1_epi8(0x21)),
                        _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')));
}

static inline unsigned first_special(const unsigned char *p, unsigned char *o, bool key)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (o)
        _mm_storeu_si128((__m128i *)(void *)o, v);
    __m128i sp = special16(v);
    if (key)
        sp = _mm_or_si128(sp, _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f)));
    unsigned mask = (unsigned)_mm_movemask_epi8(sp);
    return mask ? (unsigned)__builtin_ctz(mask) : STRING_BLOCK;
}

/* Long plain runs (documents, histories) are left to plain_run, called once per run: it tests
 * 64 bytes per branch, with AVX2 where the CPU has it (chosen on first use). A plain_fn returns
 * the length of the plain run at p, or n rounded down to 64 when the run goes on into the last
 * n % 64 bytes; with o, it copies the 64-byte blocks it read there (up to 64 bytes more). */
#define STRING_WIDE 64
typedef size_t plain_fn(const unsigned char *p, size_t n, unsigned char *o);

/* The two plain_fn, in body_lex.c: called through a pointer, so nothing is lost out of line. */
size_t kvg_body_plain_sse2(const unsigned char *p, size_t n, unsigned char *o);
size_t kvg_body_plain_avx2(const unsigned char *p, size_t n, unsigned char *o);

static inline size_t plain_run(const unsigned char *p, size_t n, unsigned char *o)
{
    static plain_fn *impl; /* chosen on first use (per file): every thread chooses the same */
    plain_fn *f = __atomic_load_n(&impl, __ATOMIC_RELAXED);
    if (!f) {
        f = __builtin_cpu_supports("avx2") ? kvg_body_plain_avx2 : kvg_body_plain_sse2;
        __atomic_store_n(&impl, f, __ATOMIC_RELAXED);
    }
    return f(p, n, o);
}
#else
#define STRING_BLOCK 8
/* SWAR: a mask with the high bit set in (at least) the first byte of v that is special in a
 * string; bytes after a special one may be flagged spuriously (borrows only run upwards). */
static inline uint64_t special_mask(uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t q = v ^ (ones * '"');
    uint64_t b = v ^ (ones * '\\');
    uint64_t lt = (v - ones * 0x20) & ~v;
    uint64_t lq = (q - ones) & ~q;
    uint64_t lb = (b - ones) & ~b;
    return (lt | lq | lb | v) & highs;
}

/* The same for DEL, which only keys look for. */
static inline uint64_t del_mask(uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t d = v ^ (ones * 0x7f);
    return (d - ones) & ~d & highs;
}

static inline unsigned first_special(const unsigned char *p, unsigned char *o, bool key)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    if (o)
        memcpy(o, &v, sizeof(v));
    /* Each mask is exact up to its first flag, so their union is exact up to its first. */
    uint64_t m = special_mask(v) | (key ? del_mask(v) : 0);
    if (!m)
        return STRING_BLOCK;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return (unsigned)__builtin_ctzll(m) / 8;
#else
    const unsigned char *special = key ? key_special : string_special;
    unsigned i = 0;
    while (!special[p[i]])
        i++;
    return i;
#endif
}
#endif

/* Whether cp is a control character (Unicode Cc). */
static inline bool is_control(unsigned long cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

/* Scan the string literal whose opening quote is at *pp: on success *pp is past the closing
 * quote and *escaped tells whether the contents hold any escape. The fast path looks at a block
 * of bytes at a time and leaves them alone unless one is special. A bad escape does not stop
 * the scan: json.c finds the end of a string (checking controls and UTF-8, skipping the byte
 * after each backslash) before it decodes escapes, and its errors come in that order.
 *
 * With op, the contents are also decoded (as decode_string does) to *op, which is left past
 * them: the bytes are stored while they are in registers, instead of found again and copied in
 * a second pass. Decoding never grows, so the writes (blocks may run up to 64 bytes past the
 * decoded ones) stay within as many bytes from *op as the body has after the opening quote.
 *
 * With ctl (a key; never with op), *ctl tells whether the contents hold a control character,
 * raw or escaped (see bad_key): the blocks look for DEL as well, and escapes and non-ASCII
 * runs, which take the slow path anyway, are checked there, so a plain key pays one more
 * compare per block. Inlined into three copies, so that a value's scan pays nothing for it
 * and the scan alone nothing for op. */
static inline __attribute__((always_inline)) int scan_string_to(const scanner *sc,
                                                                const unsigned char **pp,
                                                                bool *escaped, unsigned char **op,
                                                                bool *ctl)
{
    const unsigned char *p = *pp + 1;
    const unsigned char *end = sc->end;
    const unsigned char *special = ctl ? key_special : string_special;
    unsigned char *o = op ? *op : NULL;
    bool esc = false, bad_escape = false, control = false;
    for (;;) {
        while (end - p >= STRING_BLOCK) {
            unsigned i = first_special(p, o, ctl != NULL);
            p += i;
            if (o)
                o += i;
            if (i < STRING_BLOCK)
                goto special;
#ifdef STRING_WIDE
            if (ctl) /* plain_run does not look for DEL; keys are short */
                continue;
            size_t n = plain_run(p, (size_t)(end - p), o);
            p += n;
            if (o)
                o += n;
#endif
        }
        for (; p < end && !special[*p]; p++)
            if (o)
                *o++ = *p;
        if (p == end)
            return fail(sc, KVG_EPARSE, p, "unterminated string");
    special:;
        unsigned char c = *p;
        if (c == '"')
            break;
        if (c == '\\') {
            if (end - p < 2)
                return fail(sc, KVG_EPARSE, p, "unterminated string");
            size_t n = valid_escape(p, end);
            if (!n) {
                bad_escape = true;
                n = 2;
            } else if (o) {
                o += kvg_utf8_put(o, escape_cp(p, n));
            } else if (ctl) {
                control |= is_control(escape_cp(p, n));
            }
            p += n;
            esc = true;
        } else if (c >= 0x80) {
            /* Runs of non-ASCII text (CJK, emoji) stay in this loop. */
            const unsigned char *run = p;
            do {
                size_t n = kvg_utf8_multi_len(p, (size_t)(end - p));
                if (!n)
                    return fail(sc, KVG_EPARSE, p, "invalid UTF-8 in string");
                /* U+0080-U+009F, the C1 controls, are 0xC2 0x80-0x9F */
                if (ctl)
                    control |= *p == 0xc2 && p[1] < 0xa0;
                p += n;
            } while (p < end && *p >= 0x80);
            if (o) {
                kvg_copy(o, run, (size_t)(p - run));
                o += p - run;
            }
        } else if (ctl && c == 0x7f) {
            control = true;
            p++;
        } else {
            return fail(sc, KVG_EPARSE, p, "control character in string");
        }
    }
    if (bad_escape) {
        int rc = kvg_body_check_escapes(sc, *pp + 1, p);
        /* check_escapes and valid_escape agree; should they not, still never accept. */
        return rc < 0 ? rc : fail(sc, KVG_EPARSE, p, "invalid escape in string");
    }
    *pp = p + 1;
    *escaped = esc;
    if (op)
        *op = o;
    if (ctl)
        *ctl = control;
    return 0;
}

static inline int scan_string(const scanner *sc, const unsigned char **pp, bool *escaped)
{
    return scan_string_to(sc, pp, escaped, NULL, NULL);
}

/* Scan an object key whose opening quote is at *pp, as scan_string; one that holds a control
 * character becomes the body's type error (bad_key). */
static inline int scan_key(const scanner *sc, const unsigned char **pp, bool *escaped)
{
    const unsigned char *k = *pp;
    bool ctl = false;
    int rc = scan_string_to(sc, pp, escaped, NULL, &ctl);
    if (rc == 0 && __builtin_expect(ctl, 0))
        kvg_body_bad_key(sc, k + 1, *pp - 1);
    return rc;
}

/* The contents [s, e) of a string that scan_string accepted, into o (room for e - s bytes:
 * neither form grows): plain runs copied, each escape written as UTF-8 (decoded) or, with
 * as_json, in canonical JSON (put_json_char). Returns the length written. */
static inline size_t transcode_string(const unsigned char *s, const unsigned char *e,
                                      unsigned char *o, bool as_json)
{
    size_t n = 0;
    while (s < e) {
        const unsigned char *bs = memchr(s, '\\', (size_t)(e - s));
        size_t run = (size_t)((bs ? bs : e) - s);
        kvg_copy(o + n, s, run);
        n += run;
        if (!bs)
            break;
        size_t len = valid_escape(bs, e);
        unsigned long cp = escape_cp(bs, len);
        n += as_json ? kvg_body_put_json_char(o + n, cp) : kvg_utf8_put(o + n, (uint32_t)cp);
        s = bs + len;
    }
    return n;
}

/* Decode the contents [s, e) of an accepted string into o. Returns the decoded length. */
static inline size_t decode_string(const unsigned char *s, const unsigned char *e, unsigned char *o)
{
    return transcode_string(s, e, o, false);
}

static inline int scan_word(const scanner *sc, const unsigned char **pp, const char *w, size_t n)
{
    if ((size_t)(sc->end - *pp) < n || memcmp(*pp, w, n) != 0)
        return fail(sc, KVG_EPARSE, *pp, "invalid literal");
    *pp += n;
    return 0;
}

/* The tokens of a value as walk_value meets them, for a caller that writes the value out again
 * (body_canon.c's canonical JSON): `bytes` gets every token but strings as its source bytes
 * (punctuation, numbers, literals; whitespace is dropped), `string` the contents [s, e) of every
 * key and string value, as scan_string accepted them. */
typedef void walk_bytes_fn(void *out, const unsigned char *s, size_t n);
typedef void walk_string_fn(void *out, const unsigned char *s, const unsigned char *e,
                            bool escaped);

/* Scan one value at *pp (whitespace first) that sits at nesting depth `depth` (the body itself
 * is 1), leaving *pp just past it. Iterative, with one bit per open container. The one JSON
 * walk of the scanner: kvg_body_scan_value is it with out NULL, the canonical JSON of
 * body_canon.c with out and its two hooks. Inlined into both, so that the constant NULL takes
 * every hook call out of the validator and the canonical writer's hooks inline. */
static inline __attribute__((always_inline)) int walk_value(const scanner *sc,
                                                            const unsigned char **pp,
                                                            unsigned depth, walk_bytes_fn *bytes,
                                                            walk_string_fn *string, void *out)
{
    const unsigned char *p = *pp, *end = sc->end, *s;
    uint64_t objects = 0; /* bit i: the container opened at level i is an object */
    unsigned level = 0;   /* containers opened here and still open */
    bool escaped;
    int rc;

value:
    if (depth + level > BODY_MAX_DEPTH)
        return fail(sc, KVG_ELIMIT, p, "nesting too deep");
    p = skip_ws(p, end);
    if (p == end)
        return fail(sc, KVG_EPARSE, p, "unexpected end of input");
    s = p;
    switch (*p) {
    case '{':
        if (out)
            bytes(out, p, 1);
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}') {
            if (out)
                bytes(out, p, 1);
            p++;
            goto after;
        }
        objects |= 1ull << level;
        level++;
        goto key;
    case '[':
        if (out)
            bytes(out, p, 1);
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']') {
            if (out)
                bytes(out, p, 1);
            p++;
            goto after;
        }
        objects &= ~(1ull << level);
        level++;
        goto value;
    case '"':
        rc = scan_string(sc, &p, &escaped);
        if (rc < 0)
            return rc;
        if (out)
            string(out, s + 1, p - 1, escaped);
        goto after;
    case 't':
        rc = scan_word(sc, &p, "true", 4);
        break;
    case 'f':
        rc = scan_word(sc, &p, "false", 5);
        break;
    case 'n':
        rc = scan_word(sc, &p, "null", 4);
        break;
    default:
        if (*p == '-' || (*p >= '0' && *p <= '9'))
            rc = kvg_body_scan_number(sc, &p);
        else
            rc = fail(sc, KVG_EPARSE, p, "unexpected character");
        break;
    }
    if (rc < 0)
        return rc;
    if (out)
        bytes(out, s, (size_t)(p - s));
    goto after;

key: /* p is on the first byte after '{' or ',' and its whitespace */
    if (p == end || *p != '"')
        return fail(sc, KVG_EPARSE, p, "expected string key in object");
    s = p;
    rc = scan_key(sc, &p, &escaped);
    if (rc < 0)
        return rc;
    if (out)
        string(out, s + 1, p - 1, escaped);
    p = skip_ws(p, end);
    if (p == end || *p != ':')
        return fail(sc, KVG_EPARSE, p, "expected ':' after object key");
    if (out)
        bytes(out, p, 1);
    p++;
    goto value;

after: /* a value ended at p */
    while (level > 0) {
        bool obj = (objects >> (level - 1)) & 1;
        p = skip_ws(p, end);
        if (p == end)
            return fail(sc, KVG_EPARSE, p, obj ? "unterminated object" : "unterminated array");
        if (*p == ',') {
            if (out)
                bytes(out, p, 1);
            p++;
            if (!obj)
                goto value;
            p = skip_ws(p, end);
            goto key;
        }
        if (*p != (obj ? '}' : ']'))
            return fail(sc, KVG_EPARSE, p,
                        obj ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
        if (out)
            bytes(out, p, 1);
        p++;
        level--;
    }
    *pp = p;
    return 0;
}

#endif
