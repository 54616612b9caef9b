/* SPDX-License-Identifier: Apache-2.0 */
/* The request-body rewriter: one validating pass over an OpenAI request body, without a tree,
 * that drops every client cache_salt, injects the scope salt and finds what routing needs. */
#include "router.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/*
 * How it works. The body is scanned once, left to right, with the grammar and error offsets of
 * common/json.c's parser (the same acceptance, which the unit tests and the fuzz target check).
 * Only the top-level object is looked at closely: its keys are decoded (they are short) so that
 * an escaped spelling ("\u0063ache_salt") is recognised like a plain one, and the values of the
 * members routing needs are inspected. Everything below the top level is validated by an
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
 * Issue 4 extends this pass: the values of prompt, messages, input and tools get scanners of
 * their own in scan_member() that emit the canonical prefix stream while they validate.
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

typedef struct scanner {
    const unsigned char *start;
    const unsigned char *end;
    kvg_json_error *err;
} scanner;

/* State of the rewrite of the top-level object. */
typedef struct rewrite {
    scanner sc;
    kvg_arena *arena;
    kvg_buf *out;
    const unsigned char *flush;    /* input before this is settled in out */
    const unsigned char *kept_end; /* end of the last kept member's value; NULL: none yet */
    bool skip_separator;           /* the separator after a removed first member must go */
    unsigned seen[MEMBER_KIND_COUNT];
    /* The first type error; reported only if the whole body is valid JSON, so that a client
     * gets the parse error for a body that is both broken and mistyped. */
    int type_rc;
    size_t type_offset;
    char type_message[sizeof(((kvg_json_error *)0)->message)];
    kvg_body_info info;
} rewrite;

/* Bytes that end a plain run inside a string: '"', '\\', controls and non-ASCII. */
static const unsigned char string_special[256] = {
    [0x00 ... 0x1f] = 1,
    ['"'] = 1,
    ['\\'] = 1,
    [0x80 ... 0xff] = 1,
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

/* Escapes that stand for one character after the backslash. */
static const unsigned char simple_escape[256] = {
    ['"'] = 1, ['\\'] = 1, ['/'] = 1, ['b'] = 1, ['f'] = 1, ['n'] = 1, ['r'] = 1, ['t'] = 1,
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

/* Offset of the first byte of the 16 (SSE2) or 8 at p that is special in a string, or the
 * block size when none is. */
/* KVG_BODY_NO_SIMD builds the portable path on x86 too, so that its tests run here. */
#if defined(__SSE2__) && !defined(KVG_BODY_NO_SIMD)
#include <emmintrin.h>
#define STRING_BLOCK 16
static inline unsigned first_special(const unsigned char *p)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    /* Signed compare: bytes >= 0x80 are negative, so one compare finds them and controls. */
    __m128i m = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
        _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
    unsigned mask = (unsigned)_mm_movemask_epi8(m);
    return mask ? (unsigned)__builtin_ctz(mask) : STRING_BLOCK;
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

static inline unsigned first_special(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    uint64_t m = special_mask(v);
    if (!m)
        return STRING_BLOCK;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return (unsigned)__builtin_ctzll(m) / 8;
#else
    unsigned i = 0;
    while (!string_special[p[i]])
        i++;
    return i;
#endif
}
#endif

/* Scan the string literal whose opening quote is at *pp: on success *pp is past the closing
 * quote and *escaped tells whether the contents hold any escape. The fast path looks at a block
 * of bytes at a time and leaves them alone unless one is special. A bad escape does not stop
 * the scan: json.c finds the end of a string (checking controls and UTF-8, skipping the byte
 * after each backslash) before it decodes escapes, and its errors come in that order. */
static inline int scan_string(const scanner *sc, const unsigned char **pp, bool *escaped)
{
    const unsigned char *p = *pp + 1;
    const unsigned char *end = sc->end;
    bool esc = false, bad_escape = false;
    for (;;) {
        while (end - p >= STRING_BLOCK) {
            unsigned i = first_special(p);
            p += i;
            if (i < STRING_BLOCK)
                goto special;
        }
        while (p < end && !string_special[*p])
            p++;
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
            }
            p += n;
            esc = true;
        } else if (c >= 0x80) {
            /* Runs of non-ASCII text (CJK, emoji) stay in this loop. */
            do {
                size_t n = utf8_len(p, (size_t)(end - p));
                if (!n)
                    return fail(sc, KVG_EPARSE, p, "invalid UTF-8 in string");
                p += n;
            } while (p < end && *p >= 0x80);
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
    return 0;
}

static size_t put_utf8(unsigned char *o, unsigned long cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode the contents [s, e) of a string that scan_string accepted into o (room for e - s
 * bytes: decoding never grows). Returns the decoded length. */
static size_t decode_string(const unsigned char *s, const unsigned char *e, unsigned char *o)
{
    size_t n = 0;
    while (s < e) {
        const unsigned char *bs = memchr(s, '\\', (size_t)(e - s));
        size_t run = (size_t)((bs ? bs : e) - s);
        memcpy(o + n, s, run);
        n += run;
        if (!bs)
            break;
        s = bs + 2;
        switch (bs[1]) {
        case 'b':
            o[n++] = '\b';
            break;
        case 'f':
            o[n++] = '\f';
            break;
        case 'n':
            o[n++] = '\n';
            break;
        case 'r':
            o[n++] = '\r';
            break;
        case 't':
            o[n++] = '\t';
            break;
        case 'u': {
            unsigned long cp = (unsigned long)hex4(bs + 2);
            s = bs + 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned long)hex4(bs + 8) - 0xDC00);
                s = bs + 12;
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default: /* '"', '\\', '/' stand for themselves */
            o[n++] = bs[1];
            break;
        }
    }
    return n;
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
    rc = scan_string(sc, &p, &escaped);
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
    if (rw->type_rc)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rw->type_message, sizeof(rw->type_message), fmt, ap);
    va_end(ap);
    rw->type_rc = KVG_ETYPE;
    rw->type_offset = (size_t)(at - rw->sc.start);
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
        rc = scan_value(&rw->sc, pp, 2);
        if (rc == 0)
            rw->info.prompt_bytes += (uint64_t)(*pp - v);
        return rc;
    default:
        return scan_value(&rw->sc, pp, 2);
    }
}

static inline void emit(rewrite *rw, const unsigned char *from, const unsigned char *to)
{
    if (to > from)
        kvg_buf_append(rw->out, from, (size_t)(to - from));
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
        kvg_buf_append(rw->out, ",\"cache_salt\":", 14);
    } else {
        /* In the place of the first removed member, if any, so that rewriting an output
         * gives the same bytes again. */
        if (!rw->info.cache_salts_removed) {
            emit(rw, rw->flush, close);
            rw->flush = close;
        }
        kvg_buf_append(rw->out, "\"cache_salt\":", 13);
    }
    kvg_buf_json_string(rw->out, salt, strlen(salt));
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
        rc = scan_string(sc, &p, &escaped);
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

int kvg_body_rewrite(const char *body, size_t len, const char *salt, kvg_arena *arena, kvg_buf *out,
                     kvg_body_info *info, kvg_json_error *err)
{
    if (!body) {
        if (len)
            return -EINVAL;
        body = "";
    }
    rewrite rw = {
        .sc = {(const unsigned char *)body, (const unsigned char *)body + len, err},
        .arena = arena,
        .out = out,
        .flush = (const unsigned char *)body,
    };
    const scanner *sc = &rw.sc;
    const unsigned char *p = skip_ws(sc->start, sc->end);
    int rc;
    /* Room for the body and the salt up front: the copies below never reallocate. */
    size_t salt_room = salt ? 6 * strlen(salt) + 16 : 0;
    if (len > SIZE_MAX / 2 - salt_room || kvg_buf_reserve(out, len + salt_room) < 0)
        return fail(sc, -ENOMEM, sc->start, "out of memory");

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
    if (rw.type_rc)
        return fail(sc, rw.type_rc, sc->start + rw.type_offset, rw.type_message);
    emit(&rw, rw.flush, sc->end);
    if (out->failed)
        return fail(sc, -ENOMEM, sc->start, "out of memory");
    if (info)
        *info = rw.info;
    return 0;
}
