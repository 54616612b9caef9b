/* SPDX-License-Identifier: Apache-2.0 */
/* The request-body rewriter: one validating pass over an OpenAI request body, without a tree,
 * that drops every client cache_salt, injects the scope salt and finds what routing needs. */
#include "router.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

/*
 * How it works. The body is scanned once, left to right, with the grammar and error offsets of
 * common/json.c's parser (the same acceptance, which the unit tests and the fuzz target check).
 * Only the top-level object is looked at closely: its keys are decoded (they are short) so that
 * an escaped spelling ("\u0063ache_salt") is recognised like a plain one, and the values of the
 * members routing needs are inspected. Keys at every level are checked for control characters
 * while they are scanned (scan_key, bad_key). Everything below the top level is validated by an
 * iterative scanner that keeps one bit per open container (depth <= 64 fits a uint64_t).
 *
 * The output is the input minus the removed members, so it is produced as memcpy's of the runs
 * between them: `flush` is the input position up to which the output is settled. A body
 * without a cache_salt costs one memcpy at the end, plus the salt.
 *
 * Removing a member must take exactly one comma with it. A member preceded by a kept member
 * takes the separator before it (from the end of the kept value up to its own end); a member
 * with no kept member before it takes the separator after it (skipped when the next key
 * starts). Whatever the placement and however many there are, the result is valid JSON. The
 * salt goes after the last kept member, or where the first removed one was: rewriting an
 * output again gives the same bytes.
 *
 * kvg_body_scan extends this pass: for a completions or chat body the values of prompt,
 * messages and tools get scanners of their own in scan_member() that validate, check types and
 * emit the canonical prefix stream (docs/canonical.md) as they go, without a tree: a string that
 * goes into the stream as it stands (a message's content, a prompt) is decoded into it by the
 * string scanner in the same pass (scan_put_string); one that waits for a later member (a text
 * part's text) is copied in bulk afterwards, decoded only if it holds escapes.
 */

#define BODY_MAX_DEPTH 64
/* The longest top-level key we look for ("cache_salt", "messages"). */
#define KEY_MAX 10
/* A \uXXXX escape is the longest spelling of one decoded byte: raw keys longer than this
 * cannot decode to a key we look for. */
#define KEY_RAW_MAX (6 * KEY_MAX)

typedef enum member_kind {
    MEMBER_OTHER = 0,
    MEMBER_CACHE_SALT,
    MEMBER_MODEL,
    MEMBER_STREAM,
    MEMBER_PROMPT,
    MEMBER_MESSAGES,
    MEMBER_INPUT,
    MEMBER_TOOLS,
    MEMBER_KIND_COUNT,
} member_kind;

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

/* The canonical prefix stream being built. Its capacity is fixed when the first member that
 * feeds it is met, from the bytes left in the body (see stream_capacity), so writes never
 * reallocate; `overflow` is sticky and turns into an error, should the bound ever be wrong. */
typedef struct canon {
    unsigned char *buf;
    size_t len, cap;
    unsigned char *scratch; /* cap bytes, allocated on first use: reordering pieces */
    uint32_t *tokens;
    size_t ntokens, tcap;
    bool is_tokens;
    bool overflow;
} canon;

/* State of the rewrite of the top-level object. */
typedef struct rewrite {
    scanner sc;
    kvg_arena *arena;
    kvg_body_plan *plan;
    bool plan_failed;              /* a piece could not be added (arena) */
    const unsigned char *flush;    /* input before this is settled in the plan */
    const unsigned char *kept_end; /* end of the last kept member's value; NULL: none yet */
    bool skip_separator;           /* the separator after a removed first member must go */
    unsigned seen[MEMBER_KIND_COUNT];
    type_fault fault;
    kvg_body_info info;
    kvg_body_api api;
    canon canon;
} rewrite;

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

__attribute__((cold, noinline)) static int fail(const scanner *sc, int rc, const unsigned char *at,
                                                const char *msg)
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

/* Length of the well-formed UTF-8 sequence at p (lead byte >= 0x80), 0 if ill-formed: the
 * same rules as kvg_utf8_seq_len, inlined for the string scanner. */
static inline size_t utf8_len(const unsigned char *p, size_t avail)
{
    unsigned char c = p[0];
    unsigned lo = 0x80, hi = 0xBF;
    size_t n;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F; /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < n || p[1] < lo || p[1] > hi)
        return 0;
    if (n > 2 && (p[2] & 0xC0) != 0x80)
        return 0;
    if (n > 3 && (p[3] & 0xC0) != 0x80)
        return 0;
    return n;
}

/* Four hex digits at p (readable), or -1. */
static inline long hex4(const unsigned char *p)
{
    long a = hex_digit(p[0]), b = hex_digit(p[1]), c = hex_digit(p[2]), d = hex_digit(p[3]);
    if ((a | b | c | d) < 0)
        return -1;
    return a << 12 | b << 8 | c << 4 | d;
}

/* Find the bad escape in the string contents [s, stop) as common/json.c's decoder does (same
 * order, same offsets); the first pass checked control characters and UTF-8 elsewhere and
 * skipped the byte after each backslash. Only called when the first pass saw a bad escape. */
__attribute__((cold, noinline)) static int check_escapes(const scanner *sc, const unsigned char *s,
                                                         const unsigned char *stop)
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

static size_t plain_sse2(const unsigned char *p, size_t n, unsigned char *o)
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

__attribute__((target("avx2"))) static size_t plain_avx2(const unsigned char *p, size_t n,
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

static size_t plain_run(const unsigned char *p, size_t n, unsigned char *o)
{
    static plain_fn *impl; /* chosen on first use: every thread chooses the same */
    plain_fn *f = __atomic_load_n(&impl, __ATOMIC_RELAXED);
    if (!f) {
        f = __builtin_cpu_supports("avx2") ? plain_avx2 : plain_sse2;
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
                size_t n = utf8_len(p, (size_t)(end - p));
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
        int rc = check_escapes(sc, *pp + 1, p);
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

static void bad_key(const scanner *sc, const unsigned char *ks, const unsigned char *ke);

/* Scan an object key whose opening quote is at *pp, as scan_string; one that holds a control
 * character becomes the body's type error (bad_key). */
static inline int scan_key(const scanner *sc, const unsigned char **pp, bool *escaped)
{
    const unsigned char *k = *pp;
    bool ctl = false;
    int rc = scan_string_to(sc, pp, escaped, NULL, &ctl);
    if (rc == 0 && __builtin_expect(ctl, 0))
        bad_key(sc, k + 1, *pp - 1);
    return rc;
}

static size_t put_json_char(unsigned char *o, unsigned long cp);

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
        n += as_json ? put_json_char(o + n, cp) : kvg_utf8_put(o + n, (uint32_t)cp);
        s = bs + len;
    }
    return n;
}

/* Decode the contents [s, e) of an accepted string into o. Returns the decoded length. */
static size_t decode_string(const unsigned char *s, const unsigned char *e, unsigned char *o)
{
    return transcode_string(s, e, o, false);
}

static int scan_number(const scanner *sc, const unsigned char **pp)
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

static inline int scan_word(const scanner *sc, const unsigned char **pp, const char *w, size_t n)
{
    if ((size_t)(sc->end - *pp) < n || memcmp(*pp, w, n) != 0)
        return fail(sc, KVG_EPARSE, *pp, "invalid literal");
    *pp += n;
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
            len = *s < 0x80 ? 1 : utf8_len(s, (size_t)(e - s));
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
__attribute__((cold, noinline)) static void bad_key(const scanner *sc, const unsigned char *ks,
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

/* Scan one value at *pp (whitespace first) that sits at nesting depth `depth` (the body itself
 * is 1), leaving *pp just past it. Iterative, with one bit per open container. */
static int scan_value(const scanner *sc, const unsigned char **pp, unsigned depth)
{
    const unsigned char *p = *pp, *end = sc->end;
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
    switch (*p) {
    case '{':
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}') {
            p++;
            goto after;
        }
        objects |= 1ull << level;
        level++;
        goto key;
    case '[':
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']') {
            p++;
            goto after;
        }
        objects &= ~(1ull << level);
        level++;
        goto value;
    case '"':
        rc = scan_string(sc, &p, &escaped);
        break;
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
            rc = scan_number(sc, &p);
        else
            rc = fail(sc, KVG_EPARSE, p, "unexpected character");
        break;
    }
    if (rc < 0)
        return rc;
    goto after;

key: /* p is on the first byte after '{' or ',' and its whitespace */
    if (p == end || *p != '"')
        return fail(sc, KVG_EPARSE, p, "expected string key in object");
    rc = scan_key(sc, &p, &escaped);
    if (rc < 0)
        return rc;
    p = skip_ws(p, end);
    if (p == end || *p != ':')
        return fail(sc, KVG_EPARSE, p, "expected ':' after object key");
    p++;
    goto value;

after: /* a value ended at p */
    while (level > 0) {
        bool obj = (objects >> (level - 1)) & 1;
        p = skip_ws(p, end);
        if (p == end)
            return fail(sc, KVG_EPARSE, p, obj ? "unterminated object" : "unterminated array");
        if (*p == ',') {
            p++;
            if (!obj)
                goto value;
            p = skip_ws(p, end);
            goto key;
        }
        if (*p != (obj ? '}' : ']'))
            return fail(sc, KVG_EPARSE, p,
                        obj ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
        p++;
        level--;
    }
    *pp = p;
    return 0;
}

/* ---- the top-level object ------------------------------------------------------------------- */

static member_kind classify(const unsigned char *k, size_t len)
{
#define IS(lit) (len == sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)
    switch (len) {
    case 5:
        return IS("model")   ? MEMBER_MODEL
               : IS("input") ? MEMBER_INPUT
               : IS("tools") ? MEMBER_TOOLS
                             : MEMBER_OTHER;
    case 6:
        return IS("stream") ? MEMBER_STREAM : IS("prompt") ? MEMBER_PROMPT : MEMBER_OTHER;
    case 8:
        return IS("messages") ? MEMBER_MESSAGES : MEMBER_OTHER;
    case 10:
        return IS("cache_salt") ? MEMBER_CACHE_SALT : MEMBER_OTHER;
    default:
        return MEMBER_OTHER;
    }
#undef IS
}

/* Which member a top-level key names; [s, e) are the raw contents of an accepted string. */
static member_kind classify_key(const unsigned char *s, const unsigned char *e, bool escaped)
{
    size_t len = (size_t)(e - s);
    if (!escaped)
        return classify(s, len);
    if (len > KEY_RAW_MAX)
        return MEMBER_OTHER;
    unsigned char buf[KEY_RAW_MAX];
    return classify(buf, decode_string(s, e, buf));
}

static const char *value_type(unsigned char c)
{
    switch (c) {
    case '{':
        return "an object";
    case '[':
        return "an array";
    case '"':
        return "a string";
    case 't':
    case 'f':
        return "a boolean";
    case 'n':
        return "null";
    default:
        return "a number";
    }
}

static void type_error(rewrite *rw, const unsigned char *at, const char *fmt, ...) KVG_PRINTF(3, 4);

static void type_error(rewrite *rw, const unsigned char *at, const char *fmt, ...)
{
    type_fault *f = &rw->fault;
    if (f->rc)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->message, sizeof(f->message), fmt, ap);
    va_end(ap);
    f->rc = KVG_ETYPE;
    f->offset = (size_t)(at - rw->sc.start);
}

/* The top-level "model": a string (decoded into the arena) or null. */
static int scan_model(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    if (rw->seen[MEMBER_MODEL] > 1)
        type_error(rw, v, "model: appears more than once");
    if (*v != '"') {
        int rc = scan_value(&rw->sc, pp, 2);
        if (rc == 0 && *v != 'n')
            type_error(rw, v, "model: must be a string or null, not %s", value_type(*v));
        rw->info.model = NULL;
        rw->info.model_len = 0;
        return rc;
    }
    bool escaped;
    int rc = scan_string(&rw->sc, pp, &escaped);
    if (rc < 0)
        return rc;
    const unsigned char *s = v + 1, *e = *pp - 1;
    size_t raw = (size_t)(e - s);
    char *m = kvg_arena_alloc(rw->arena, raw + 1);
    if (!m)
        return fail(&rw->sc, -ENOMEM, v, "out of memory");
    size_t n = raw;
    if (escaped) {
        n = decode_string(s, e, (unsigned char *)m);
        /* A NUL would end the name for every C string consumer (model allowlists, routing)
         * while the engine reads the whole of it. */
        if (memchr(m, '\0', n))
            type_error(rw, v, "model: must not contain NUL characters");
    } else {
        memcpy(m, s, raw);
    }
    m[n] = '\0';
    rw->info.model = m;
    rw->info.model_len = n;
    return 0;
}

/* The top-level "stream": true, false or null. */
static int scan_stream(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    if (rw->seen[MEMBER_STREAM] > 1)
        type_error(rw, v, "stream: appears more than once");
    int rc = scan_value(&rw->sc, pp, 2);
    if (rc < 0)
        return rc;
    if (*v != 't' && *v != 'f' && *v != 'n')
        type_error(rw, v, "stream: must be a boolean or null, not %s", value_type(*v));
    rw->info.stream = *v == 't';
    return 0;
}

/* ---- the canonical prefix stream (docs/canonical.md) ---------------------------------------- */

/* Separators of the stream: ASCII's record, unit, group and file separators. */
#define SEP_RECORD 0x1e /* opens a message or the tools section */
#define SEP_UNIT 0x1f   /* between the fields of one */
#define SEP_GROUP 0x1d  /* closes it */
#define SEP_FILE 0x1c   /* around a media reference */

/* Depths (the body is 1) of the values the typed scanners walk themselves; scan_value takes
 * over below them with the right depth, so the 64-level limit and its offsets are unchanged. */
#define DEPTH_MEMBER 2  /* prompt, messages, tools */
#define DEPTH_ITEM 3    /* prompt[i], messages[i] */
#define DEPTH_FIELD 4   /* prompt[i][j], messages[i].content */
#define DEPTH_PART 5    /* messages[i].content[j] */
#define DEPTH_PART_V 6  /* messages[i].content[j].image_url */
#define DEPTH_MEDIA_V 7 /* messages[i].content[j].image_url.url */

/* The longest nested key we look for ("tool_call_id"), and its longest escaped spelling. */
#define NESTED_KEY_MAX 12
#define NESTED_KEY_RAW_MAX (6 * NESTED_KEY_MAX)

/* Bytes of stream the rest of a body, rem bytes, can produce. Decoding, minimal re-escaping and
 * dropping whitespace never grow a string or a value, and each separator replaces at least as
 * many bytes of JSON syntax (a message `{"role":""}` is 11 bytes, its frame 3), except a media
 * part: at least 37 bytes of JSON (`{"type":"file","file":{"file_id":""}}`) that become at most
 * 2 bytes more than that (`\x1cvideo_url:<32 hex>\x1c` is 44 bytes for a 43-byte part). rem/8
 * covers that, 64 the tools frame (whose key may lie before the counted bytes). As this holds
 * piece by piece, it holds at every point of the body: the stream written so far leaves room
 * for as many bytes as the body has left (which scan_put_string relies on). */
static size_t stream_capacity(size_t rem)
{
    return rem + rem / 8 + 64;
}

static int canon_reserve(rewrite *rw, const unsigned char *v)
{
    canon *c = &rw->canon;
    if (c->buf)
        return 0;
    size_t cap = stream_capacity((size_t)(rw->sc.end - v));
    c->buf = kvg_arena_alloc(rw->arena, cap);
    if (!c->buf)
        return fail(&rw->sc, -ENOMEM, v, "out of memory");
    c->cap = cap;
    return 0;
}

static inline bool room(canon *c, size_t n)
{
    if (n <= c->cap - c->len)
        return true;
    c->overflow = true;
    return false;
}

static inline void put(canon *c, const void *d, size_t n)
{
    if (room(c, n)) {
        kvg_copy(c->buf + c->len, d, n);
        c->len += n;
    }
}

static inline void put1(canon *c, unsigned char b)
{
    if (room(c, 1))
        c->buf[c->len++] = b;
}

#define PUT_LIT(c, lit) put((c), (lit), sizeof(lit) - 1)

/* The decoded contents [s, e) of an accepted string. Plain runs are one memcpy. */
static inline void put_string(canon *c, const unsigned char *s, const unsigned char *e,
                              bool escaped)
{
    size_t raw = (size_t)(e - s);
    if (!room(c, raw))
        return;
    if (escaped) {
        c->len += decode_string(s, e, c->buf + c->len);
    } else {
        kvg_copy(c->buf + c->len, s, raw);
        c->len += raw;
    }
}

/* Scan the string at *pp (on its quote) and append its decoded contents, as put_string would,
 * in the same pass. The writes stay within the rest of the body's length, which the stream has
 * room for at every point of the body (see stream_capacity). */
static int scan_put_string(rewrite *rw, const unsigned char **pp)
{
    canon *c = &rw->canon;
    bool escaped;
    if (!room(c, (size_t)(rw->sc.end - *pp)))
        return scan_string(&rw->sc, pp, &escaped);
    unsigned char *o = c->buf + c->len;
    int rc = scan_string_to(&rw->sc, pp, &escaped, &o, NULL);
    if (rc == 0)
        c->len = (size_t)(o - c->buf);
    return rc;
}

/* One character of a string in canonical JSON: '"' and '\\' escaped, the controls with a short
 * escape in that form, the other controls as \\u00xx (lowercase hex), everything else as UTF-8.
 * The rule of Python's json.dumps(..., ensure_ascii=False). */
static size_t put_json_char(unsigned char *o, unsigned long cp)
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

/* Re-encode the contents [s, e) of an accepted string that holds escapes, minimally (see
 * put_json_char). Never longer than the input: every character that needs an escape came from
 * an escape at least as long. */
static size_t reencode_string(const unsigned char *s, const unsigned char *e, unsigned char *o)
{
    return transcode_string(s, e, o, true);
}

/* An accepted string [s, e) (contents) as canonical JSON, quotes included. */
static void put_json_string(canon *c, const unsigned char *s, const unsigned char *e, bool escaped)
{
    size_t raw = (size_t)(e - s);
    if (!room(c, raw + 2))
        return;
    unsigned char *o = c->buf + c->len;
    *o++ = '"';
    if (escaped) {
        o += reencode_string(s, e, o);
    } else {
        /* Without escapes a string holds no '"', '\\' or control: it is minimal already. */
        kvg_copy(o, s, raw);
        o += raw;
    }
    *o++ = '"';
    c->len = (size_t)(o - c->buf);
}

/* Scan one value at *pp (whitespace first) at nesting depth `depth`, like scan_value, and
 * append it to the stream as canonical JSON: no insignificant whitespace, member order and
 * duplicates kept, strings re-encoded minimally, numbers and literals as their source text. */
static int canon_json(rewrite *rw, const unsigned char **pp, unsigned depth)
{
    const scanner *sc = &rw->sc;
    canon *c = &rw->canon;
    const unsigned char *p = *pp, *end = sc->end, *s;
    uint64_t objects = 0;
    unsigned level = 0;
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
        put1(c, '{');
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}') {
            put1(c, '}');
            p++;
            goto after;
        }
        objects |= 1ull << level;
        level++;
        goto key;
    case '[':
        put1(c, '[');
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']') {
            put1(c, ']');
            p++;
            goto after;
        }
        objects &= ~(1ull << level);
        level++;
        goto value;
    case '"':
        rc = scan_string(sc, &p, &escaped);
        if (rc == 0)
            put_json_string(c, s + 1, p - 1, escaped);
        if (rc < 0)
            return rc;
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
            rc = scan_number(sc, &p);
        else
            rc = fail(sc, KVG_EPARSE, p, "unexpected character");
        break;
    }
    if (rc < 0)
        return rc;
    put(c, s, (size_t)(p - s));
    goto after;

key: /* p is on the first byte after '{' or ',' and its whitespace */
    if (p == end || *p != '"')
        return fail(sc, KVG_EPARSE, p, "expected string key in object");
    s = p;
    rc = scan_key(sc, &p, &escaped);
    if (rc < 0)
        return rc;
    put_json_string(c, s + 1, p - 1, escaped);
    p = skip_ws(p, end);
    if (p == end || *p != ':')
        return fail(sc, KVG_EPARSE, p, "expected ':' after object key");
    put1(c, ':');
    p++;
    goto value;

after: /* a value ended at p */
    while (level > 0) {
        bool obj = (objects >> (level - 1)) & 1;
        p = skip_ws(p, end);
        if (p == end)
            return fail(sc, KVG_EPARSE, p, obj ? "unterminated object" : "unterminated array");
        if (*p == ',') {
            put1(c, ',');
            p++;
            if (!obj)
                goto value;
            p = skip_ws(p, end);
            goto key;
        }
        if (*p != (obj ? '}' : ']'))
            return fail(sc, KVG_EPARSE, p,
                        obj ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
        put1(c, (unsigned char)*p);
        p++;
        level--;
    }
    *pp = p;
    return 0;
}

/* Index of the key [s, e) (contents of an accepted string, decoded when escaped) in names, or
 * -1. The keys looked for are short, so a long raw key cannot be one of them. */
static int key_index(const unsigned char *s, const unsigned char *e, bool escaped,
                     const char *const *names, int n)
{
    unsigned char buf[NESTED_KEY_RAW_MAX];
    const unsigned char *k = s;
    size_t len = (size_t)(e - s);
    if (escaped) {
        if (len > sizeof(buf))
            return -1;
        len = decode_string(s, e, buf);
        k = buf;
    }
    if (len > NESTED_KEY_MAX)
        return -1;
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && memcmp(names[i], k, len) == 0)
            return i;
    return -1;
}

/* The object walk shared by the typed scanners, with the grammar and offsets of scan_value.
 * obj_first: *pp on '{'; returns 1 with *pp on the first key, 0 if the object is empty (*pp
 * past it). obj_key: scans the key at *pp and the ':' after it, and leaves *pp on the value
 * (whitespace skipped, end checked). obj_next: after a value, 1 with *pp on the next key, 0
 * with *pp past the '}'. Negative returns are parse errors. */
static int obj_first(const scanner *sc, const unsigned char **pp)
{
    const unsigned char *p = skip_ws(*pp + 1, sc->end);
    if (p < sc->end && *p == '}') {
        *pp = p + 1;
        return 0;
    }
    *pp = p;
    return 1;
}

static int obj_key(const scanner *sc, const unsigned char **pp, const unsigned char **ks,
                   const unsigned char **ke, bool *escaped)
{
    const unsigned char *p = *pp, *end = sc->end;
    if (p == end || *p != '"')
        return fail(sc, KVG_EPARSE, p, "expected string key in object");
    *ks = p + 1;
    int rc = scan_key(sc, &p, escaped);
    if (rc < 0)
        return rc;
    *ke = p - 1;
    p = skip_ws(p, end);
    if (p == end || *p != ':')
        return fail(sc, KVG_EPARSE, p, "expected ':' after object key");
    p = skip_ws(p + 1, end);
    if (p == end)
        return fail(sc, KVG_EPARSE, p, "unexpected end of input");
    *pp = p;
    return 0;
}

static int obj_next(const scanner *sc, const unsigned char **pp)
{
    const unsigned char *p = skip_ws(*pp, sc->end);
    if (p == sc->end)
        return fail(sc, KVG_EPARSE, p, "unterminated object");
    if (*p == ',') {
        *pp = skip_ws(p + 1, sc->end);
        return 1;
    }
    if (*p != '}')
        return fail(sc, KVG_EPARSE, p, "expected ',' or '}' in object");
    *pp = p + 1;
    return 0;
}

/* The same for arrays: arr_first leaves *pp on the first element (whitespace skipped, end
 * checked) and returns 1, or 0 past an empty array; arr_next after an element. */
static int arr_first(const scanner *sc, const unsigned char **pp)
{
    const unsigned char *p = skip_ws(*pp + 1, sc->end);
    if (p < sc->end && *p == ']') {
        *pp = p + 1;
        return 0;
    }
    if (p == sc->end)
        return fail(sc, KVG_EPARSE, p, "unexpected end of input");
    *pp = p;
    return 1;
}

static int arr_next(const scanner *sc, const unsigned char **pp)
{
    const unsigned char *p = skip_ws(*pp, sc->end);
    if (p == sc->end)
        return fail(sc, KVG_EPARSE, p, "unterminated array");
    if (*p == ',') {
        p = skip_ws(p + 1, sc->end);
        if (p == sc->end)
            return fail(sc, KVG_EPARSE, p, "unexpected end of input");
        *pp = p;
        return 1;
    }
    if (*p != ']')
        return fail(sc, KVG_EPARSE, p, "expected ',' or ']' in array");
    *pp = p + 1;
    return 0;
}

/* ---- completions: "prompt" ---- */

static int tokens_reserve(rewrite *rw, const unsigned char *v)
{
    canon *c = &rw->canon;
    if (c->tokens)
        return 0;
    /* A token id takes a digit and a separator: the rest of the body holds fewer than
     * rem / 2 + 1 of them. */
    size_t cap = (size_t)(rw->sc.end - v) / 2 + 1;
    c->tokens = kvg_arena_alloc(rw->arena, cap * sizeof(uint32_t));
    if (!c->tokens)
        return fail(&rw->sc, -ENOMEM, v, "out of memory");
    c->tcap = cap;
    return 0;
}

#define TOKEN_ID "a token id (an integer from 0 to 4294967295)"

/* "prompt[i]" or, with idx2 (not SIZE_MAX), "prompt[i][j]", into buf. */
static const char *token_path(char *buf, size_t len, size_t idx, size_t idx2)
{
    if (idx2 == SIZE_MAX)
        snprintf(buf, len, "prompt[%zu]", idx);
    else
        snprintf(buf, len, "prompt[%zu][%zu]", idx, idx2);
    return buf;
}

/* One element of a token-id list at *pp (on its first byte), appended to the stream when
 * store. idx2 is SIZE_MAX for prompt[i], the inner index for prompt[i][j]. */
static int scan_token(rewrite *rw, const unsigned char **pp, unsigned depth, bool store, size_t idx,
                      size_t idx2)
{
    const unsigned char *v = *pp;
    char path[48]; /* written only for an error: a prompt may hold 100k ids */
    if (*v != '-' && (*v < '0' || *v > '9')) {
        int rc = scan_value(&rw->sc, pp, depth);
        if (rc == 0)
            type_error(rw, v, "%s: must be " TOKEN_ID ", not %s",
                       token_path(path, sizeof(path), idx, idx2), value_type(*v));
        return rc;
    }
    int rc = scan_number(&rw->sc, pp);
    if (rc < 0)
        return rc;
    const unsigned char *q = v + (*v == '-');
    uint64_t id = 0;
    for (; q < *pp; q++) {
        if (*q < '0' || *q > '9' || id > UINT32_MAX) {
            id = UINT64_MAX; /* a fraction, an exponent or too many digits */
            break;
        }
        id = id * 10 + (uint64_t)(*q - '0');
    }
    if (id > UINT32_MAX || (*v == '-' && id != 0)) {
        type_error(rw, v, "%s: must be " TOKEN_ID, token_path(path, sizeof(path), idx, idx2));
        return 0;
    }
    canon *c = &rw->canon;
    if (store) {
        if (c->ntokens < c->tcap)
            c->tokens[c->ntokens++] = (uint32_t)id;
        else
            c->overflow = true;
    }
    return 0;
}

/* prompt[idx] of a list of token-id lists: itself a non-empty list of token ids. */
static int scan_token_list(rewrite *rw, const unsigned char **pp, bool store, size_t idx)
{
    const unsigned char *v = *pp, *p = v;
    int rc;
    if (*v != '[') {
        rc = scan_value(&rw->sc, pp, DEPTH_ITEM);
        if (rc == 0)
            type_error(rw, v, "prompt[%zu]: must be an array of token ids, not %s", idx,
                       value_type(*v));
        return rc;
    }
    rc = arr_first(&rw->sc, &p);
    if (rc == 0)
        type_error(rw, v, "prompt[%zu]: must not be empty", idx);
    for (size_t j = 0; rc > 0; j++) {
        rc = scan_token(rw, &p, DEPTH_FIELD, store, idx, j);
        if (rc < 0)
            return rc;
        rc = arr_next(&rw->sc, &p);
    }
    if (rc < 0)
        return rc;
    *pp = p;
    return 0;
}

/* The array form of "prompt": its first element says which one (strings, token ids, lists of
 * token ids) and only that element feeds the stream; the others are checked. */
static int scan_prompt_array(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp, *p = v;
    canon *c = &rw->canon;
    int rc = arr_first(&rw->sc, &p);
    if (rc <= 0) {
        if (rc == 0)
            type_error(rw, v, "prompt: must not be empty");
        *pp = p;
        return rc;
    }
    unsigned char kind = *p;
    bool tokens = kind == '-' || (kind >= '0' && kind <= '9');
    if (tokens || kind == '[') {
        rc = tokens_reserve(rw, v);
        c->is_tokens = true;
    } else {
        rc = canon_reserve(rw, v);
    }
    for (size_t i = 0; rc == 0; i++) {
        const unsigned char *e = p;
        if (tokens) {
            rc = scan_token(rw, &p, DEPTH_ITEM, true, i, SIZE_MAX);
        } else if (kind == '[') {
            rc = scan_token_list(rw, &p, i == 0, i);
        } else if (kind == '"' && *e == '"' && i == 0) {
            rc = scan_put_string(rw, &p);
        } else if (kind == '"' && *e == '"') {
            bool escaped;
            rc = scan_string(&rw->sc, &p, &escaped);
        } else {
            rc = scan_value(&rw->sc, &p, DEPTH_ITEM);
            if (rc == 0 && kind == '"')
                type_error(rw, e, "prompt[%zu]: must be a string, not %s", i, value_type(*e));
            else if (rc == 0)
                type_error(rw, e,
                           "prompt[0]: must be a string, a token id or an array of token ids, "
                           "not %s",
                           value_type(*e));
        }
        if (rc < 0)
            return rc;
        rc = arr_next(&rw->sc, &p);
        rc = rc > 0 ? 0 : rc < 0 ? rc : 1;
    }
    if (rc < 0)
        return rc;
    *pp = p;
    return 0;
}

static int scan_prompt(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    int rc;
    if (rw->seen[MEMBER_PROMPT] > 1) {
        type_error(rw, v, "prompt: appears more than once");
        return scan_value(&rw->sc, pp, DEPTH_MEMBER);
    }
    if (*v == '[')
        return scan_prompt_array(rw, pp);
    if (*v != '"') {
        rc = scan_value(&rw->sc, pp, DEPTH_MEMBER);
        if (rc == 0 && *v != 'n') /* null: no prompt, like an absent one */
            type_error(rw, v, "prompt: must be a string or an array, not %s", value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc == 0)
        rc = scan_put_string(rw, pp);
    return rc;
}

/* ---- chat: "messages" and "tools" ---- */

/* The parts of a message in stream order; a message's members may come in any order. */
typedef enum piece {
    PIECE_ROLE = 0,
    PIECE_NAME,
    PIECE_CONTENT,
    PIECE_TOOL_CALLS,
    PIECE_TOOL_CALL_ID,
    PIECE_COUNT,
} piece;

static const char *const piece_key[PIECE_COUNT] = {"role", "name", "content", "tool_calls",
                                                   "tool_call_id"};

/* Members of a content part; the types of part are the members after "type" and "text". */
enum {
    PART_TYPE = 0,
    PART_TEXT,
    PART_IMAGE_URL,
    PART_INPUT_AUDIO,
    PART_FILE,
    PART_VIDEO_URL,
    PART_KEY_COUNT
};

static const char *const part_key[PART_KEY_COUNT] = {"type",        "text", "image_url",
                                                     "input_audio", "file", "video_url"};
/* The tag of a media part in the stream. */
static const char *const part_tag[PART_KEY_COUNT] = {NULL,          NULL,   "image",
                                                     "input_audio", "file", "video_url"};

/* Members of a media object that name the media. */
enum { REF_URL = 0, REF_DATA, REF_FILE_ID, REF_FILE_DATA, REF_COUNT };
static const char *const ref_key[REF_COUNT] = {"url", "data", "file_id", "file_data"};

static int scratch_reserve(rewrite *rw)
{
    canon *c = &rw->canon;
    if (!c->scratch) {
        c->scratch = kvg_arena_alloc(rw->arena, c->cap);
        if (!c->scratch)
            return fail(&rw->sc, -ENOMEM, rw->sc.start, "out of memory");
    }
    return 0;
}

/* A string value recorded for later: contents [s, e). */
typedef struct span {
    const unsigned char *v; /* the value's first byte; NULL: member absent */
    const unsigned char *s, *e;
    bool is_string, escaped;
} span;

/* Scan the value at *pp (on its first byte) into sp: strings are scanned (and recorded),
 * anything else validated. */
static int scan_span(rewrite *rw, const unsigned char **pp, unsigned depth, span *sp)
{
    sp->v = *pp;
    if (**pp != '"')
        return scan_value(&rw->sc, pp, depth);
    sp->is_string = true;
    sp->s = *pp + 1;
    int rc = scan_string(&rw->sc, pp, &sp->escaped);
    sp->e = *pp - 1;
    return rc;
}

/* The media object of a part (already validated: parse errors cannot happen here) at v:
 * its reference string hashed into the stream as \x1c<tag>:<32 hex>\x1c. */
static int emit_media(rewrite *rw, const unsigned char *v, int type, size_t i, size_t j)
{
    const scanner *sc = &rw->sc;
    const char *tk = part_key[type];
    if (*v != '{') {
        type_error(rw, v, "messages[%zu].content[%zu].%s: must be an object, not %s", i, j, tk,
                   value_type(*v));
        return 0;
    }
    span refs[REF_COUNT] = {{0}};
    const unsigned char *p = v;
    int rc = obj_first(sc, &p);
    while (rc > 0) {
        const unsigned char *ks, *ke;
        bool escaped;
        rc = obj_key(sc, &p, &ks, &ke, &escaped);
        if (rc < 0)
            return rc;
        int k = key_index(ks, ke, escaped, ref_key, REF_COUNT);
        bool wanted = type == PART_FILE          ? (k == REF_FILE_ID || k == REF_FILE_DATA)
                      : type == PART_INPUT_AUDIO ? k == REF_DATA
                                                 : k == REF_URL;
        if (!wanted) {
            rc = scan_value(sc, &p, DEPTH_MEDIA_V);
        } else if (refs[k].v) {
            type_error(rw, p, "messages[%zu].content[%zu].%s.%s: appears more than once", i, j, tk,
                       ref_key[k]);
            rc = scan_value(sc, &p, DEPTH_MEDIA_V);
        } else {
            rc = scan_span(rw, &p, DEPTH_MEDIA_V, &refs[k]);
            if (rc == 0 && !refs[k].is_string)
                type_error(rw, refs[k].v,
                           "messages[%zu].content[%zu].%s.%s: must be a string, not %s", i, j, tk,
                           ref_key[k], value_type(*refs[k].v));
        }
        if (rc < 0)
            return rc;
        rc = obj_next(sc, &p);
    }
    if (rc < 0)
        return rc;
    const span *ref = type == PART_FILE
                          ? (refs[REF_FILE_ID].v ? &refs[REF_FILE_ID] : &refs[REF_FILE_DATA])
                      : type == PART_INPUT_AUDIO ? &refs[REF_DATA]
                                                 : &refs[REF_URL];
    if (!ref->v) {
        if (type == PART_FILE)
            type_error(rw, v, "messages[%zu].content[%zu].file: needs file_id or file_data", i, j);
        else
            type_error(rw, v, "messages[%zu].content[%zu].%s.%s: missing", i, j, tk,
                       type == PART_INPUT_AUDIO ? "data" : "url");
        return 0;
    }
    if (!ref->is_string)
        return 0;
    const unsigned char *s = ref->s;
    size_t n = (size_t)(ref->e - ref->s);
    if (ref->escaped) {
        unsigned char *d = kvg_arena_alloc(rw->arena, n ? n : 1);
        if (!d)
            return fail(sc, -ENOMEM, v, "out of memory");
        n = decode_string(ref->s, ref->e, d);
        s = d;
    }
    XXH128_hash_t digest = XXH3_128bits(s, n);
    unsigned char frame[64];
    size_t tl = strlen(part_tag[type]), f = 0;
    frame[f++] = SEP_FILE;
    memcpy(frame + f, part_tag[type], tl);
    f += tl;
    frame[f++] = ':';
    /* XXH128's canonical form: high half then low, each big-endian, in lowercase hex. */
    kvg_fmt_hex64((char *)frame + f, digest.high64);
    kvg_fmt_hex64((char *)frame + f + 16, digest.low64);
    f += 32;
    frame[f++] = SEP_FILE;
    put(&rw->canon, frame, f);
    return 0;
}

/* messages[i].content[j], at *pp (on its first byte). Its members may come in any order, so
 * they are recorded and the part is emitted once its type is known. */
static int scan_part(rewrite *rw, const unsigned char **pp, size_t i, size_t j, bool *prev_text)
{
    const scanner *sc = &rw->sc;
    const unsigned char *o = *pp, *p = o;
    int rc;
    if (*o != '{') {
        rc = scan_value(sc, pp, DEPTH_PART);
        if (rc == 0)
            type_error(rw, o, "messages[%zu].content[%zu]: must be an object, not %s", i, j,
                       value_type(*o));
        return rc;
    }
    span mem[PART_KEY_COUNT] = {{0}};
    rc = obj_first(sc, &p);
    while (rc > 0) {
        const unsigned char *ks, *ke;
        bool escaped;
        rc = obj_key(sc, &p, &ks, &ke, &escaped);
        if (rc < 0)
            return rc;
        int k = key_index(ks, ke, escaped, part_key, PART_KEY_COUNT);
        if (k < 0) {
            rc = scan_value(sc, &p, DEPTH_PART_V);
        } else if (mem[k].v) {
            type_error(rw, p, "messages[%zu].content[%zu].%s: appears more than once", i, j,
                       part_key[k]);
            rc = scan_value(sc, &p, DEPTH_PART_V);
        } else {
            rc = scan_span(rw, &p, DEPTH_PART_V, &mem[k]);
        }
        if (rc < 0)
            return rc;
        rc = obj_next(sc, &p);
    }
    if (rc < 0)
        return rc;
    *pp = p;

    const span *t = &mem[PART_TYPE];
    int type = -1;
    if (!t->v) {
        type_error(rw, o, "messages[%zu].content[%zu].type: missing", i, j);
    } else if (!t->is_string) {
        type_error(rw, t->v, "messages[%zu].content[%zu].type: must be a string, not %s", i, j,
                   value_type(*t->v));
    } else {
        type = key_index(t->s, t->e, t->escaped, part_key, PART_KEY_COUNT);
        if (type <= PART_TYPE)
            type_error(rw, t->v, "messages[%zu].content[%zu].type: unknown part type", i, j);
    }
    if (type <= PART_TYPE)
        return 0;
    const span *m = &mem[type];
    if (!m->v) {
        type_error(rw, o, "messages[%zu].content[%zu].%s: missing", i, j, part_key[type]);
        return 0;
    }
    if (type != PART_TEXT) {
        *prev_text = false;
        return emit_media(rw, m->v, type, i, j);
    }
    if (!m->is_string) {
        type_error(rw, m->v, "messages[%zu].content[%zu].text: must be a string, not %s", i, j,
                   value_type(*m->v));
        return 0;
    }
    /* Consecutive text parts are joined with a newline, as vLLM does. */
    if (*prev_text)
        put1(&rw->canon, '\n');
    put_string(&rw->canon, m->s, m->e, m->escaped);
    *prev_text = true;
    return 0;
}

/* The piece of messages[i] for member `kind`, at *pp (on its first byte), appended. */
static int scan_piece(rewrite *rw, piece kind, const unsigned char **pp, size_t i)
{
    const scanner *sc = &rw->sc;
    canon *c = &rw->canon;
    const unsigned char *v = *pp;
    int rc;
    switch (kind) {
    case PIECE_ROLE:
    case PIECE_NAME:
    case PIECE_TOOL_CALL_ID:
        if (*v == '"') {
            if (kind == PIECE_ROLE)
                put1(c, SEP_RECORD);
            else if (kind == PIECE_NAME)
                PUT_LIT(c, "name=");
            else
                PUT_LIT(c, "\x1ftool_call_id=");
            rc = scan_put_string(rw, pp);
            if (rc < 0)
                return rc;
            if (kind != PIECE_TOOL_CALL_ID)
                put1(c, SEP_UNIT);
            return 0;
        }
        rc = scan_value(sc, pp, DEPTH_FIELD);
        if (rc == 0 && kind == PIECE_ROLE)
            type_error(rw, v, "messages[%zu].role: must be a string, not %s", i, value_type(*v));
        else if (rc == 0 && *v != 'n')
            type_error(rw, v, "messages[%zu].%s: must be a string or null, not %s", i,
                       piece_key[kind], value_type(*v));
        return rc;
    case PIECE_TOOL_CALLS:
        if (*v == '[') {
            PUT_LIT(c, "\x1ftool_calls=");
            return canon_json(rw, pp, DEPTH_FIELD);
        }
        rc = scan_value(sc, pp, DEPTH_FIELD);
        if (rc == 0 && *v != 'n')
            type_error(rw, v, "messages[%zu].tool_calls: must be an array or null, not %s", i,
                       value_type(*v));
        return rc;
    case PIECE_CONTENT:
        if (*v == '"')
            return scan_put_string(rw, pp);
        if (*v == '[') {
            const unsigned char *p = v;
            bool prev_text = false;
            rc = arr_first(sc, &p);
            for (size_t j = 0; rc > 0; j++) {
                rc = scan_part(rw, &p, i, j, &prev_text);
                if (rc < 0)
                    return rc;
                rc = arr_next(sc, &p);
            }
            *pp = p;
            return rc;
        }
        rc = scan_value(sc, pp, DEPTH_FIELD);
        if (rc == 0 && *v != 'n')
            type_error(rw, v, "messages[%zu].content: must be a string, an array or null, not %s",
                       i, value_type(*v));
        return rc;
    default:
        return scan_value(sc, pp, DEPTH_FIELD);
    }
}

/* messages[i] at *pp (on its first byte): \x1e role \x1f [name=N \x1f] content
 * [\x1ftool_calls=J] [\x1ftool_call_id=I] \x1d. Pieces are appended in body order, each with
 * its own separators, and put in stream order afterwards if the body had them otherwise. */
static int scan_message(rewrite *rw, const unsigned char **pp, size_t i)
{
    const scanner *sc = &rw->sc;
    canon *c = &rw->canon;
    const unsigned char *m = *pp, *p = m;
    int rc;
    if (*m != '{') {
        rc = scan_value(sc, pp, DEPTH_ITEM);
        if (rc == 0)
            type_error(rw, m, "messages[%zu]: must be an object, not %s", i, value_type(*m));
        return rc;
    }
    size_t mark = c->len, off[PIECE_COUNT] = {0}, len[PIECE_COUNT] = {0};
    bool seen[PIECE_COUNT] = {0}, sorted = true;
    int last = -1;
    rc = obj_first(sc, &p);
    while (rc > 0) {
        const unsigned char *ks, *ke;
        bool escaped;
        rc = obj_key(sc, &p, &ks, &ke, &escaped);
        if (rc < 0)
            return rc;
        int k = key_index(ks, ke, escaped, piece_key, PIECE_COUNT);
        if (k < 0) {
            rc = scan_value(sc, &p, DEPTH_FIELD);
        } else if (seen[k]) {
            type_error(rw, p, "messages[%zu].%s: appears more than once", i, piece_key[k]);
            rc = scan_value(sc, &p, DEPTH_FIELD);
        } else {
            seen[k] = true;
            off[k] = c->len;
            rc = scan_piece(rw, (piece)k, &p, i);
            len[k] = c->len - off[k];
            sorted = sorted && k > last;
            last = k;
        }
        if (rc < 0)
            return rc;
        rc = obj_next(sc, &p);
    }
    if (rc < 0)
        return rc;
    *pp = p;
    if (!seen[PIECE_ROLE])
        type_error(rw, m, "messages[%zu].role: missing", i);
    if (!sorted && !c->overflow) {
        rc = scratch_reserve(rw);
        if (rc < 0)
            return rc;
        size_t n = c->len - mark;
        kvg_copy(c->scratch, c->buf + mark, n);
        c->len = mark;
        for (int k = 0; k < PIECE_COUNT; k++)
            if (seen[k])
                put(c, c->scratch + (off[k] - mark), len[k]);
    }
    put1(c, SEP_GROUP);
    return 0;
}

static int scan_messages(rewrite *rw, const unsigned char **pp)
{
    const scanner *sc = &rw->sc;
    const unsigned char *v = *pp, *p = v;
    int rc;
    if (rw->seen[MEMBER_MESSAGES] > 1) {
        type_error(rw, v, "messages: appears more than once");
        return scan_value(sc, pp, DEPTH_MEMBER);
    }
    if (*v != '[') {
        rc = scan_value(sc, pp, DEPTH_MEMBER);
        if (rc == 0)
            type_error(rw, v, "messages: must be an array, not %s", value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc < 0)
        return rc;
    rc = arr_first(sc, &p);
    if (rc == 0)
        type_error(rw, v, "messages: must not be empty");
    for (size_t i = 0; rc > 0; i++) {
        rc = scan_message(rw, &p, i);
        if (rc < 0)
            return rc;
        rc = arr_next(sc, &p);
    }
    *pp = p;
    return rc;
}

/* "tools": \x1etools\x1f <canonical JSON> \x1d, before every message whatever the member
 * order, as chat templates put tools in the system block. */
static int scan_tools(rewrite *rw, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    canon *c = &rw->canon;
    int rc;
    if (rw->seen[MEMBER_TOOLS] > 1) {
        type_error(rw, v, "tools: appears more than once");
        return scan_value(&rw->sc, pp, DEPTH_MEMBER);
    }
    if (*v != '[') {
        rc = scan_value(&rw->sc, pp, DEPTH_MEMBER);
        if (rc == 0 && *v != 'n')
            type_error(rw, v, "tools: must be an array or null, not %s", value_type(*v));
        return rc;
    }
    rc = canon_reserve(rw, v);
    if (rc < 0)
        return rc;
    size_t t0 = c->len;
    PUT_LIT(c, "\x1etools\x1f");
    rc = canon_json(rw, pp, DEPTH_MEMBER);
    if (rc < 0)
        return rc;
    put1(c, SEP_GROUP);
    if (t0 > 0 && !c->overflow) {
        /* Messages came first in the body: move the section in front of them. */
        rc = scratch_reserve(rw);
        if (rc < 0)
            return rc;
        size_t n = c->len - t0;
        kvg_copy(c->scratch, c->buf + t0, n);
        memmove(c->buf + n, c->buf, t0);
        kvg_copy(c->buf, c->scratch, n);
    }
    return 0;
}

/* Scan the value of a top-level member of the given kind at *pp (on its first byte). */
static int scan_member(rewrite *rw, member_kind kind, const unsigned char **pp)
{
    const unsigned char *v = *pp;
    int rc;
    switch (kind) {
    case MEMBER_MODEL:
        return scan_model(rw, pp);
    case MEMBER_STREAM:
        return scan_stream(rw, pp);
    case MEMBER_PROMPT:
    case MEMBER_MESSAGES:
    case MEMBER_INPUT:
    case MEMBER_TOOLS:
        if (rw->api == KVG_BODY_API_COMPLETIONS && kind == MEMBER_PROMPT)
            rc = scan_prompt(rw, pp);
        else if (rw->api == KVG_BODY_API_CHAT && kind == MEMBER_MESSAGES)
            rc = scan_messages(rw, pp);
        else if (rw->api == KVG_BODY_API_CHAT && kind == MEMBER_TOOLS)
            rc = scan_tools(rw, pp);
        else
            rc = scan_value(&rw->sc, pp, 2);
        if (rc == 0)
            rw->info.prompt_bytes += (uint64_t)(*pp - v);
        return rc;
    default:
        return scan_value(&rw->sc, pp, 2);
    }
}

/* Add a piece to the output plan: a run of the body, or bytes that live as long as the arena. */
static void add_piece(rewrite *rw, const void *data, size_t len)
{
    kvg_body_plan *pl = rw->plan;
    if (!len)
        return;
    if (pl->npieces == pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 8;
        kvg_body_piece *ps = kvg_arena_alloc(rw->arena, cap * sizeof(*ps));
        if (!ps) {
            rw->plan_failed = true;
            return;
        }
        if (pl->npieces)
            memcpy(ps, pl->pieces, pl->npieces * sizeof(*ps));
        pl->pieces = ps;
        pl->cap = cap;
    }
    pl->pieces[pl->npieces++] = (kvg_body_piece){(const char *)data, len};
    pl->len += len;
}

static inline void emit(rewrite *rw, const unsigned char *from, const unsigned char *to)
{
    if (to > from)
        add_piece(rw, from, (size_t)(to - from));
}

/* Drop the member [key, value_end) (see the comment at the top for which comma goes). */
static void drop_member(rewrite *rw, const unsigned char *key, const unsigned char *value_end)
{
    if (rw->kept_end) {
        if (rw->flush < rw->kept_end)
            emit(rw, rw->flush, rw->kept_end);
    } else {
        emit(rw, rw->flush, key);
        rw->skip_separator = true;
    }
    rw->flush = value_end;
    rw->info.cache_salts_removed++;
}

static void add_salt(rewrite *rw, const unsigned char *close, const char *salt)
{
    if (rw->kept_end) {
        if (rw->flush <= rw->kept_end) {
            emit(rw, rw->flush, rw->kept_end);
            rw->flush = rw->kept_end;
        }
        add_piece(rw, ",\"cache_salt\":", 14);
    } else {
        /* In the place of the first removed member, if any, so that rewriting an output
         * gives the same bytes again. */
        if (!rw->info.cache_salts_removed) {
            emit(rw, rw->flush, close);
            rw->flush = close;
        }
        add_piece(rw, "\"cache_salt\":", 13);
    }
    /* The salt as a JSON string, in the arena (43 base64url characters: never escaped, but
     * any salt would be). */
    kvg_buf quoted;
    kvg_buf_init(&quoted);
    kvg_buf_json_string(&quoted, salt, strlen(salt));
    char *copy = quoted.failed ? NULL : kvg_arena_strndup(rw->arena, quoted.data, quoted.len);
    if (copy) {
        add_piece(rw, copy, quoted.len);
    } else {
        rw->plan_failed = true;
    }
    kvg_buf_done(&quoted);
}

/* The body's top-level object, from its '{' at *pp to just past its '}'. */
static int rewrite_object(rewrite *rw, const unsigned char **pp, const char *salt)
{
    const scanner *sc = &rw->sc;
    const unsigned char *p = *pp + 1, *end = sc->end;
    int rc;
    p = skip_ws(p, end);
    if (p < end && *p == '}')
        goto close;
    for (;;) {
        p = skip_ws(p, end);
        if (p == end || *p != '"')
            return fail(sc, KVG_EPARSE, p, "expected string key in object");
        const unsigned char *key = p;
        bool escaped;
        rc = scan_key(sc, &p, &escaped);
        if (rc < 0)
            return rc;
        member_kind kind = classify_key(key + 1, p - 1, escaped);
        if (rw->skip_separator) {
            rw->flush = key;
            rw->skip_separator = false;
        }
        p = skip_ws(p, end);
        if (p == end || *p != ':')
            return fail(sc, KVG_EPARSE, p, "expected ':' after object key");
        p++;
        const unsigned char *v = skip_ws(p, end);
        if (v == end)
            return fail(sc, KVG_EPARSE, v, "unexpected end of input");
        rw->seen[kind]++;
        rc = scan_member(rw, kind, &v);
        if (rc < 0)
            return rc;
        p = v;
        if (kind == MEMBER_CACHE_SALT)
            drop_member(rw, key, p);
        else
            rw->kept_end = p;
        p = skip_ws(p, end);
        if (p == end)
            return fail(sc, KVG_EPARSE, p, "unterminated object");
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '}')
            break;
        return fail(sc, KVG_EPARSE, p, "expected ',' or '}' in object");
    }
close:
    if (salt)
        add_salt(rw, p, salt);
    *pp = p + 1;
    return 0;
}

const char *kvg_body_api_str(kvg_body_api api)
{
    switch (api) {
    case KVG_BODY_API_OTHER:
        return "other";
    case KVG_BODY_API_COMPLETIONS:
        return "completions";
    case KVG_BODY_API_CHAT:
        return "chat";
    default:
        return "unknown";
    }
}

int kvg_body_rewrite(const char *body, size_t len, const char *salt, kvg_arena *arena, kvg_buf *out,
                     kvg_body_info *info, kvg_json_error *err)
{
    return kvg_body_scan(body, len, KVG_BODY_API_OTHER, salt, arena, out, info, err);
}

int kvg_body_plan_write(const kvg_body_plan *plan, kvg_buf *out)
{
    if (plan->len > SIZE_MAX / 2 || kvg_buf_reserve(out, plan->len) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < plan->npieces; i++)
        kvg_buf_append(out, plan->pieces[i].data, plan->pieces[i].len);
    return out->failed ? -ENOMEM : 0;
}

int kvg_body_scan(const char *body, size_t len, kvg_body_api api, const char *salt,
                  kvg_arena *arena, kvg_buf *out, kvg_body_info *info, kvg_json_error *err)
{
    kvg_body_plan plan;
    int rc = kvg_body_scan_plan(body, len, api, salt, arena, &plan, info, err);
    if (rc < 0)
        return rc;
    if (kvg_body_plan_write(&plan, out) < 0) {
        if (err) {
            err->offset = 0;
            snprintf(err->message, sizeof(err->message), "out of memory");
        }
        return -ENOMEM;
    }
    return 0;
}

int kvg_body_scan_plan(const char *body, size_t len, kvg_body_api api, const char *salt,
                       kvg_arena *arena, kvg_body_plan *plan, kvg_body_info *info,
                       kvg_json_error *err)
{
    *plan = (kvg_body_plan){0};
    if ((unsigned)api >= KVG_BODY_API_COUNT)
        return -EINVAL;
    if (!body) {
        if (len)
            return -EINVAL;
        body = "";
    }
    rewrite rw = {
        .sc = {(const unsigned char *)body, (const unsigned char *)body + len, err, &rw.fault},
        .arena = arena,
        .plan = plan,
        .flush = (const unsigned char *)body,
        .api = api,
    };
    const scanner *sc = &rw.sc;
    const unsigned char *p = skip_ws(sc->start, sc->end);
    int rc;

    if (p == sc->end)
        return fail(sc, KVG_EPARSE, p, "unexpected end of input");
    const unsigned char *value = p;
    if (*p == '{')
        rc = rewrite_object(&rw, &p, salt);
    else
        rc = scan_value(sc, &p, 1);
    if (rc < 0)
        return rc;
    p = skip_ws(p, sc->end);
    if (p != sc->end)
        return fail(sc, KVG_EPARSE, p, "trailing characters after JSON value");
    if (*value != '{')
        return fail(sc, KVG_ETYPE, value, "body: must be a JSON object");
    if (rw.fault.rc)
        return fail(sc, rw.fault.rc, sc->start + rw.fault.offset, rw.fault.message);
    emit(&rw, rw.flush, sc->end);
    if (rw.plan_failed)
        return fail(sc, -ENOMEM, sc->start, "out of memory");
    if (rw.canon.overflow) /* stream_capacity is a proven bound: never, but never write past */
        return fail(sc, KVG_ELIMIT, sc->start, "canonical stream over its bound");
    if (rw.canon.is_tokens) {
        rw.info.prefix.is_tokens = true;
        rw.info.prefix.tokens = rw.canon.tokens;
        rw.info.prefix.ntokens = rw.canon.ntokens;
    } else {
        rw.info.prefix.text = rw.canon.buf;
        rw.info.prefix.text_len = rw.canon.len;
    }
    if (info)
        *info = rw.info;
    return 0;
}
