/* SPDX-License-Identifier: Apache-2.0 */
/* The body scanner's JSON lexer, out of line: the validator of the values nobody looks into, the
 * wide plain-run loops, numbers, and the error paths (bad escapes, keys with controls). */
#include "body_lex.h"

#include <stdio.h>
#include <string.h>

/* Find the bad escape in the string contents [s, stop) as common/json.c's decoder does (same
 * order, same offsets); the first pass checked control characters and UTF-8 elsewhere and
 * skipped the byte after each backslash. Only called when the first pass saw a bad escape. */
__attribute__((cold, noinline)) int
kvg_body_check_escapes(const scanner *sc, const unsigned char *s, const unsigned char *stop)
{
    const unsigned char *p = s, *end = sc->end, *bs;
    while ((bs = memchr(p, '\\', (size_t)(stop - p))) != NULL) {
        switch (bs[1]) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
            p = bs + 2;
            continue;
        case 'u':
            break;
        default:
            return fail(sc, KVG_EPARSE, bs + 1, "invalid escape in string");
        }
        p = bs + 2;
        if (end - p < 4)
            return fail(sc, KVG_EPARSE, p, "truncated \\u escape");
        long cp = hex4(p);
        if (cp < 0)
            return fail(sc, KVG_EPARSE, p, "bad hex digit in \\u escape");
        p += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return fail(sc, KVG_EPARSE, p, "unpaired surrogate in \\u escape");
        if (cp < 0xD800 || cp > 0xDBFF)
            continue;
        /* A high surrogate must be followed by an escaped low one, inside the string. */
        if (stop - p < 6 || p[0] != '\\' || p[1] != 'u')
            return fail(sc, KVG_EPARSE, p, "unpaired surrogate in \\u escape");
        p += 2;
        long lo = hex4(p);
        if (lo < 0)
            return fail(sc, KVG_EPARSE, p, "bad hex digit in \\u escape");
        p += 4;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return fail(sc, KVG_EPARSE, p, "unpaired surrogate in \\u escape");
    }
    return 0;
}

/* The wide loops behind plain_run (body_lex.h): 64 bytes per branch. */
#ifdef STRING_WIDE
size_t kvg_body_plain_sse2(const unsigned char *p, size_t n, unsigned char *o)
{
    for (size_t i = 0; n - i >= STRING_WIDE; i += STRING_WIDE) {
        __m128i v[4], any = _mm_setzero_si128();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm_loadu_si128((const __m128i *)(const void *)(p + i + 16 * k));
            if (o)
                _mm_storeu_si128((__m128i *)(void *)(o + i + 16 * k), v[k]);
            any = _mm_or_si128(any, special16(v[k]));
        }
        if (!_mm_movemask_epi8(any))
            continue;
        uint64_t mask = 0;
        for (int k = 0; k < 4; k++)
            mask |= (uint64_t)(unsigned)_mm_movemask_epi8(special16(v[k])) << (16 * k);
        return i + (size_t)__builtin_ctzll(mask);
    }
    return n - n % STRING_WIDE;
}

/* special16 on 32 bytes. */
__attribute__((target("avx2"))) static inline __m256i special32(__m256i v)
{
    return _mm256_or_si256(
        _mm256_cmpgt_epi8(_mm256_set1_epi8(0x21), _mm256_xor_si256(v, _mm256_set1_epi8(2))),
        _mm256_cmpeq_epi8(v, _mm256_set1_epi8('\\')));
}

__attribute__((target("avx2"))) size_t kvg_body_plain_avx2(const unsigned char *p, size_t n,
                                                           unsigned char *o)
{
    for (size_t i = 0; n - i >= STRING_WIDE; i += STRING_WIDE) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(p + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 32));
        if (o) {
            _mm256_storeu_si256((__m256i *)(void *)(o + i), a);
            _mm256_storeu_si256((__m256i *)(void *)(o + i + 32), b);
        }
        uint64_t mask = (uint32_t)_mm256_movemask_epi8(special32(a)) |
                        (uint64_t)(uint32_t)_mm256_movemask_epi8(special32(b)) << 32;
        if (mask)
            return i + (size_t)__builtin_ctzll(mask);
    }
    return n - n % STRING_WIDE;
}

#endif

/* One character of a string in canonical JSON: '"' and '\\' escaped, the controls with a short
 * escape in that form, the other controls as \\u00xx (lowercase hex), everything else as UTF-8.
 * The rule of Python's json.dumps(..., ensure_ascii=False). */
size_t kvg_body_put_json_char(unsigned char *o, unsigned long cp)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char e = 0;
    switch (cp) {
    case '"':
        e = '"';
        break;
    case '\\':
        e = '\\';
        break;
    case '\b':
        e = 'b';
        break;
    case '\f':
        e = 'f';
        break;
    case '\n':
        e = 'n';
        break;
    case '\r':
        e = 'r';
        break;
    case '\t':
        e = 't';
        break;
    default:
        if (cp >= 0x20)
            return kvg_utf8_put(o, cp);
        memcpy(o, "\\u00", 4);
        o[4] = (unsigned char)hex[cp >> 4];
        o[5] = (unsigned char)hex[cp & 15];
        return 6;
    }
    o[0] = '\\';
    o[1] = e;
    return 2;
}

int kvg_body_scan_number(const scanner *sc, const unsigned char **pp)
{
    const unsigned char *p = *pp, *end = sc->end;
    if (*p == '-')
        p++;
    if (p == end)
        return fail(sc, KVG_EPARSE, p, "truncated number");
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    } else {
        return fail(sc, KVG_EPARSE, p, "invalid number");
    }
    if (p < end && *p == '.') {
        p++;
        if (p == end || *p < '0' || *p > '9')
            return fail(sc, KVG_EPARSE, p, "digit expected after decimal point");
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p == end || *p < '0' || *p > '9')
            return fail(sc, KVG_EPARSE, p, "digit expected in exponent");
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    *pp = p;
    return 0;
}

/* ---- control characters in keys ------------------------------------------------------------- */

/*
 * A key holding a control character (Unicode Cc: U+0000-U+001F, U+007F, U+0080-U+009F) is a
 * type error, at every level of the body. Engines do not read such a key alike: Python's json
 * keeps "cache_salt\u0000x" as a key of its own, while C or C++ code that ends keys at a NUL
 * reads cache_salt, and if it keeps the first of two duplicates, the client's value would be
 * the salt. Nothing legitimate needs one. The rule is on the key's characters, however they are
 * spelled: raw bytes below 0x20 are not JSON at all, but DEL and the C1 controls may stand in a
 * string unescaped, and a verdict that hung on the spelling would differ between two bodies
 * that every parser reads alike.
 */

#define KEY_SHOWN 28  /* bytes of a bad key's spelling in its message, with "..." and the NUL */
#define PATH_SHOWN 32 /* bytes of the path to it, the same way */

/* The code point of the well-formed UTF-8 sequence at p, n bytes long. */
static unsigned long utf8_cp(const unsigned char *p, size_t n)
{
    static const unsigned char lead_bits[5] = {0, 0x7f, 0x1f, 0x0f, 0x07};
    unsigned long cp = p[0] & lead_bits[n];
    for (size_t i = 1; i < n; i++)
        cp = cp << 6 | (p[i] & 0x3f);
    return cp;
}

/* The spelling [s, e) (raw contents of an accepted string) into o, cap bytes with the NUL, as
 * printable ASCII that a log or a terminal cannot misread: escapes as the client wrote them,
 * other characters outside ' '..'~' as \uXXXX. Whole units only; "..." ends a spelling that
 * does not fit. Returns the length. */
static size_t show_spelling(char *o, size_t cap, const unsigned char *s, const unsigned char *e)
{
    size_t n = 0, keep = 0; /* keep: the last length that leaves room for "..." */
    for (size_t len; s < e; s += len) {
        char unit[13];
        size_t u;
        if (*s == '\\') {
            u = len = valid_escape(s, e);
            memcpy(unit, s, len);
        } else if (*s >= 0x20 && *s < 0x7f) {
            u = len = 1;
            unit[0] = (char)*s;
        } else {
            len = kvg_utf8_seq_len(s, (size_t)(e - s));
            unsigned long cp = utf8_cp(s, len);
            if (cp >= 0x10000)
                u = (size_t)snprintf(unit, sizeof(unit), "\\u%04lx\\u%04lx",
                                     0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + (cp & 0x3ff));
            else
                u = (size_t)snprintf(unit, sizeof(unit), "\\u%04lx", cp);
        }
        if (n + u >= cap) {
            memcpy(o + keep, "...", 4);
            return keep + 3;
        }
        memcpy(o + n, unit, u);
        n += u;
        if (n + 3 < cap)
            keep = n;
    }
    o[n] = '\0';
    return n;
}

/* Where a walk back to a key stands in one open container. */
typedef struct path_step {
    const unsigned char *ks, *ke; /* an object's current key (raw contents) */
    size_t index;                 /* an array's current index */
    bool obj;
} path_step;

/* The path (messages[2].content[0]) of the object whose key opens at key, into o (cap bytes),
 * or "body" for the top level: the body is walked again up to the key, which the scan found
 * valid. Only for an error, once per body. */
static void key_path(const scanner *sc, const unsigned char *key, char *o, size_t cap)
{
    path_step st[BODY_MAX_DEPTH];
    unsigned level = 0;
    bool want_key = false;
    const scanner quiet = {sc->start, sc->end, NULL, NULL};
    const unsigned char *p = sc->start, *s;
    while ((p = skip_ws(p, key)) < key) {
        bool esc;
        s = p++;
        switch (*s) {
        case '{':
        case '[':
            if (level == BODY_MAX_DEPTH) /* the scan allows no deeper body */
                return (void)snprintf(o, cap, "body");
            st[level++] = (path_step){.obj = *s == '{'};
            want_key = *s == '{';
            break;
        case '}':
        case ']':
            level -= level > 0;
            break;
        case ',':
            want_key = level > 0 && st[level - 1].obj;
            if (level > 0 && !st[level - 1].obj)
                st[level - 1].index++;
            break;
        case '"':
            p = s;
            if (scan_string(&quiet, &p, &esc) < 0)
                return (void)snprintf(o, cap, "body");
            if (want_key) {
                st[level - 1].ks = s + 1;
                st[level - 1].ke = p - 1;
                want_key = false;
            }
            break;
        default: /* ':' and the bytes of numbers and literals */
            break;
        }
    }
    char path[256];
    size_t n = 0;
    for (unsigned i = 0; i + 1 < level && n + KEY_SHOWN + 2 < sizeof(path); i++) {
        if (st[i].obj) {
            if (i > 0)
                path[n++] = '.';
            n += show_spelling(path + n, KEY_SHOWN, st[i].ks, st[i].ke);
        } else {
            n += (size_t)snprintf(path + n, sizeof(path) - n, "[%zu]", st[i].index);
        }
    }
    if (n == 0)
        snprintf(o, cap, "body");
    else if (n < cap)
        snprintf(o, cap, "%.*s", (int)n, path);
    else
        snprintf(o, cap, "%.*s...", (int)(cap - 4), path);
}

/* Record the key with raw contents [ks, ke), which holds a control character, as a type error
 * (the first one in the body wins), naming it and the object that holds it. */
__attribute__((cold, noinline)) void kvg_body_bad_key(const scanner *sc, const unsigned char *ks,
                                                      const unsigned char *ke)
{
    type_fault *f = sc->fault;
    if (!f || f->rc)
        return;
    char path[PATH_SHOWN + 1], shown[KEY_SHOWN];
    key_path(sc, ks - 1, path, sizeof(path));
    show_spelling(shown, sizeof(shown), ks, ke);
    snprintf(f->message, sizeof(f->message), "%s: key \"%s\" holds a control character", path,
             shown);
    f->rc = KVG_ETYPE;
    f->offset = (size_t)(ks - 1 - sc->start);
}

/* The values nobody looks into: walk_value (body_lex.h) writing nothing. */
int kvg_body_scan_value(const scanner *sc, const unsigned char **pp, unsigned depth)
{
    return walk_value(sc, pp, depth, NULL, NULL, NULL);
}
