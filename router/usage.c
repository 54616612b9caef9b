/* SPDX-License-Identifier: Apache-2.0 */
/* Reads the engine's usage report (prompt, cached and completion tokens) out of a response as it
 * streams past, without buffering it, and counts the SSE events that carry output (for time to
 * first token and inter-token latency). */
#include "router.h"

#include <string.h>

/*
 * The response is not parsed as JSON: the gateway passes it through untouched and only wants a
 * few numbers and whether each event carries output. A small state machine looks for keys (with
 * their quotes, so "prompt_tokens_details" does not match "prompt_tokens") followed by optional
 * whitespace, a colon, optional whitespace and a value, across chunk boundaries.
 *
 * Numeric keys take digits. The last occurrence wins: with vLLM's continuous usage stats every
 * chunk carries usage, and the final one is the total. A value that is not an integer (null, as
 * when prefix caching is off) leaves the field as it was.
 *
 * Output keys ("content", "text", "reasoning_content": a string; "tool_calls": an array) mark
 * the current event as carrying output when their value is non-empty: a role-only first chunk
 * has "content":"" (or null), the last chunk of a stream "content":"" with its finish_reason.
 * Logprobs' "content" is an array and does not count (its event has a delta of its own).
 *
 * Events: SSE ends an event at a blank line, and lines end at LF, CRLF or CR. JSON strings hold
 * no raw CR or LF, so line ends are tracked on every byte regardless of the key state.
 *
 * The keys contain no quote except at their ends, so a mismatch can only restart a match at a
 * quote: no backtracking is needed, and every key still in the race has matched as many bytes
 * as the others (since the last quote): one count and a set of keys, narrowed byte by byte
 * (most keys drop out at their second byte), instead of a count per key. Inside a JSON string every
 * quote is escaped, so a key's closing quote can only be matched outside strings: text that
 * mentions "content": cannot count.
 *
 * Speed. That machine, run on every byte, cost about 33 instructions a byte (callgrind, the
 * simworker's 396-byte chat answer): the largest function of the gateway. Nearly all of it was
 * spent where nothing can happen, so the machine now runs only where something can:
 *  - Idle (no key in the race, no value pending), only a quote (a race starts) or a CR or LF (a
 *    line ends) changes anything; every other byte only says "the line has started". The idle
 *    scan takes 16 bytes at a time (SSE2; a table elsewhere) and builds the mask of the CRs, LFs
 *    and the quotes followed by the first letter of a key of the set (1 quote in 6 in vLLM's
 *    answers and streams), then visits its bits: the bytes between them are never looked at one
 *    by one. The chunk's last bytes are one more block, ending at its end.
 *  - At such a quote, a table per byte for the next three bytes leaves the keys that begin there
 *    (usually none: "chatcmpl-", "created" and "choices" start with 'c' too), and each is
 *    compared whole (two loads). A race that loses changes nothing: the bytes it consumed are a
 *    key's letters (no quote, CR or LF), and the byte it dies on, if a quote, starts a race of
 *    its own, and if a line end, is a bit of the mask.
 *  - After a key, the forms vLLM writes (:123 and its end, :"", :"x, :[], :[x) are read in
 *    place, as the machine would read them; anything else goes to the byte machine (unchanged)
 *    at the key's colon. It also runs the race where a chunk ends within a key, so a key split
 *    across chunks is matched as before, and from the start of a chunk until it is idle again.
 * The results are the byte machine's for every input and every split: the unit test and
 * fuzz_usage compare the state with the old reader's, kept as tests/unit/router/usage_reference.c.
 * Now (callgrind, bench/usage_bench, gcc 12 -O2): 4.4 instructions a byte on that answer, 4.2 on
 * its stream fed an event a chunk, 2 on a 64 KB answer (the old reader: 32.9, 28.1, 6.7).
 */

enum { VAL_NUMBER = 0, VAL_STRING, VAL_ARRAY };

/* A key's text is padded with zeros to 32 bytes, so that the idle scan compares it whole with two
 * 16-byte loads. first_letter, second_letter, third_letter and set_letters below hold each key's
 * bytes 1 to 3 by hand: change them with a key (test_usage's comparison with the old reader fails
 * when they disagree). */
#define K(text) .key = text, .len = sizeof(text) - 1

static const struct {
    char key[32];
    uint8_t len;
    uint8_t kind;
    uint8_t field; /* VAL_NUMBER: the value it sets */
} keys[KVG_USAGE_SCAN_KEYS] = {
    [KVG_USAGE_PROMPT_TOKENS] = {K("\"prompt_tokens\""), VAL_NUMBER, KVG_USAGE_PROMPT_TOKENS},
    [KVG_USAGE_CACHED_TOKENS] = {K("\"cached_tokens\""), VAL_NUMBER, KVG_USAGE_CACHED_TOKENS},
    [KVG_USAGE_COMPLETION_TOKENS] = {K("\"completion_tokens\""), VAL_NUMBER,
                                     KVG_USAGE_COMPLETION_TOKENS},
    [KVG_USAGE_FIELD_COUNT] = {K("\"content\""), VAL_STRING, 0},
    [KVG_USAGE_FIELD_COUNT + 1] = {K("\"text\""), VAL_STRING, 0},
    [KVG_USAGE_FIELD_COUNT + 2] = {K("\"reasoning_content\""), VAL_STRING, 0},
    [KVG_USAGE_FIELD_COUNT + 3] = {K("\"tool_calls\""), VAL_ARRAY, 0},
    [KVG_USAGE_FIELD_COUNT + 4] = {K("\"input_tokens\""), VAL_NUMBER, KVG_USAGE_PROMPT_TOKENS},
    [KVG_USAGE_FIELD_COUNT + 5] = {K("\"output_tokens\""), VAL_NUMBER, KVG_USAGE_COMPLETION_TOKENS},
    [KVG_USAGE_FIELD_COUNT + 6] = {K("\"delta\""), VAL_STRING, 0},
};

#define KEY(i) ((uint16_t)(1u << (i)))
/* Chat and completions: the first seven. */
#define CHAT_KEYS ((uint16_t)(KEY(KVG_USAGE_FIELD_COUNT + 4) - 1))
/* The Responses API: its own numbers, cached_tokens (the same key under input_tokens_details),
 * and delta. */
#define RESPONSES_KEYS                                                                             \
    ((uint16_t)(KEY(KVG_USAGE_CACHED_TOKENS) | KEY(KVG_USAGE_FIELD_COUNT + 4) |                    \
                KEY(KVG_USAGE_FIELD_COUNT + 5) | KEY(KVG_USAGE_FIELD_COUNT + 6)))

enum {
    ST_KEY = 0,    /* matching keys: alive and matched say which and how far */
    ST_COLON,      /* after a whole key: whitespace, then ':' */
    ST_VALUE,      /* after the colon: whitespace, then the first byte of the value */
    ST_DIGITS,     /* in the number */
    ST_FIRST_CHAR, /* after an output key's opening '"' or '[': is the value empty? */
};

void kvg_usage_scan_init(kvg_usage_scan *s)
{
    memset(s, 0, sizeof(*s));
    for (int f = 0; f < KVG_USAGE_FIELD_COUNT; f++)
        s->value[f] = -1;
    s->keyset = CHAT_KEYS;
}

void kvg_usage_scan_init_responses(kvg_usage_scan *s)
{
    kvg_usage_scan_init(s);
    s->keyset = RESPONSES_KEYS;
}

static bool is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

_Static_assert(KVG_USAGE_SCAN_KEYS <= 16, "alive is a 16-bit set");

static void match_keys(kvg_usage_scan *s, unsigned char c)
{
    uint16_t alive = 0;
    for (uint16_t left = s->alive; left; left &= (uint16_t)(left - 1)) {
        int f = __builtin_ctz(left);
        const char *k = keys[f].key;
        if ((unsigned char)k[s->matched] != c)
            continue;
        if (k[s->matched + 1] == '\0') { /* its closing quote */
            s->field = (uint8_t)f;
            s->state = ST_COLON;
            s->alive = 0;
            s->matched = 0;
            return;
        }
        alive |= (uint16_t)(1u << f);
    }
    if (alive) {
        s->alive = alive;
        s->matched++;
    } else if (c == '"') { /* every key starts with a quote */
        s->alive = s->keyset;
        s->matched = 1;
    } else {
        s->alive = 0;
        s->matched = 0;
    }
}

/* One byte through the key/value machine. A state that ends on a byte it does not own hands
 * the byte back to ST_KEY (the loop) instead of consuming it. */
static void step(kvg_usage_scan *s, unsigned char c)
{
    for (;;) {
        switch (s->state) {
        case ST_KEY:
            match_keys(s, c);
            return;
        case ST_COLON:
            if (c == ':')
                s->state = ST_VALUE;
            else if (!is_ws(c)) {
                s->state = ST_KEY; /* a string value "prompt_tokens", not a key */
                continue;
            }
            return;
        case ST_VALUE:
            if (is_ws(c))
                return;
            switch (keys[s->field].kind) {
            case VAL_NUMBER:
                if (c >= '0' && c <= '9') {
                    s->state = ST_DIGITS;
                    s->acc = (uint64_t)(c - '0');
                    s->ndigits = 1;
                    return;
                }
                break;
            case VAL_STRING:
                if (c == '"') {
                    s->state = ST_FIRST_CHAR;
                    return;
                }
                break;
            default:
                if (c == '[') {
                    s->state = ST_FIRST_CHAR;
                    return;
                }
                break;
            }
            s->state = ST_KEY; /* null, a number for a string key, ...: no value of ours */
            continue;
        case ST_DIGITS:
            /* 18 digits are far more tokens than any context; longer is not a count. */
            if (c >= '0' && c <= '9' && s->ndigits < 18) {
                s->acc = s->acc * 10 + (c - '0');
                s->ndigits++;
                return;
            }
            /* Only a number that ends like a JSON integer: 1e3 or 1.5 is not a count. */
            if (c == ',' || c == '}' || c == ']' || is_ws(c))
                s->value[keys[s->field].field] = (int64_t)s->acc;
            s->state = ST_KEY;
            if (c >= '0' && c <= '9')
                return; /* the 19th digit: skip the rest of the number */
            continue;
        case ST_FIRST_CHAR:
            if (keys[s->field].kind == VAL_ARRAY && is_ws(c))
                return;
            s->state = ST_KEY;
            if (c == (keys[s->field].kind == VAL_ARRAY ? ']' : '"'))
                return; /* empty: "" or [] */
            s->event_output = true;
            continue; /* the value's first byte may be a quote: let ST_KEY see it */
        default:
            s->state = ST_KEY;
            continue;
        }
    }
}

/* Line ends and blank lines (the end of an SSE event). */
static void track_line(kvg_usage_scan *s, unsigned char c)
{
    if (c != '\n' && c != '\r') {
        s->line_started = true;
        s->after_cr = false;
        return;
    }
    if (c == '\n' && s->after_cr) {
        s->after_cr = false; /* CRLF: the CR ended the line */
        return;
    }
    s->after_cr = c == '\r';
    if (!s->line_started) {
        if (s->event_output)
            s->output_events++;
        s->event_output = false;
    }
    s->line_started = false;
}

/* ---- the idle scan -------------------------------------------------------------------------- */

/* Keys by their second, third and fourth bytes (the three after the quote): one table each, so
 * that a quote not followed by the start of a key costs a load or three, and a key is compared
 * whole only when its first four bytes are there ("chatcmpl-", "created" and "choices" are not
 * compared with the three keys that start with 'c'). */
#define P KEY(KVG_USAGE_PROMPT_TOKENS)
#define CA KEY(KVG_USAGE_CACHED_TOKENS)
#define CO KEY(KVG_USAGE_COMPLETION_TOKENS)
#define CN KEY(KVG_USAGE_FIELD_COUNT)
#define TE KEY(KVG_USAGE_FIELD_COUNT + 1)
#define RE KEY(KVG_USAGE_FIELD_COUNT + 2)
#define TO KEY(KVG_USAGE_FIELD_COUNT + 3)
#define IN KEY(KVG_USAGE_FIELD_COUNT + 4)
#define OU KEY(KVG_USAGE_FIELD_COUNT + 5)
#define DE KEY(KVG_USAGE_FIELD_COUNT + 6)
static const uint16_t first_letter[256] = {
    ['p'] = P,  ['c'] = CA | CO | CN, ['t'] = TE | TO, ['r'] = RE,
    ['i'] = IN, ['o'] = OU,           ['d'] = DE,
};
static const uint16_t second_letter[256] = {
    ['r'] = P, ['a'] = CA, ['o'] = CO | CN | TO, ['e'] = TE | RE | DE, ['n'] = IN, ['u'] = OU,
};
static const uint16_t third_letter[256] = {
    ['o'] = P | TO, ['c'] = CA, ['m'] = CO, ['n'] = CN, ['x'] = TE,
    ['a'] = RE,     ['p'] = IN, ['t'] = OU, ['l'] = DE,
};
#undef P
#undef CA
#undef CO
#undef CN
#undef TE
#undef RE
#undef TO
#undef IN
#undef OU
#undef DE

/* The same letters by key set (first_letter's, four each), for the block scan's filter: a quote
 * that a key's letter does not follow is not looked at. */
static const char set_letters[2][4] = {{'p', 'c', 't', 'r'}, {'c', 'i', 'o', 'd'}};

/* The idle scan's bytes: those that can change the state. */
static const bool special[256] = {['"'] = true, ['\n'] = true, ['\r'] = true};

/* The key f whole at q, n bytes readable there: 1 yes, 0 no, -1 the bytes there are the start of
 * it (the chunk ends within the key). */
static int key_at_end(const unsigned char *q, size_t n, int f)
{
    if (n >= keys[f].len)
        return memcmp(q, keys[f].key, keys[f].len) == 0;
    return memcmp(q, keys[f].key, n) == 0 ? -1 : 0;
}

/* KVG_USAGE_NO_SIMD builds the portable path on x86 too, so that its tests run here. */
#if defined(__SSE2__) && !defined(KVG_USAGE_NO_SIMD)
#include <immintrin.h>

/* Bytes a block needs: 16, and the one after (a quote's next byte). */
#define BLOCK_NEEDS 17

/* The letters of set_letters[], one per vector. */
typedef struct letters {
    __m128i l[4];
} letters;

static inline void letters_init(letters *lv, const char *c)
{
    for (int i = 0; i < 4; i++)
        lv->l[i] = _mm_set1_epi8(c[i]);
}

/* Bit i set: p[i] is a CR or LF, or a quote followed by one of the letters (16 bytes at p, and
 * p[16]). About 1 quote in 6 passes the filter in vLLM's answers and streams. */
static inline uint32_t block_mask(const unsigned char *p, const letters *lv)
{
    const __m128i *l = lv->l;
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i w = _mm_loadu_si128((const __m128i *)(const void *)(p + 1));
    __m128i lines = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')),
                                 _mm_cmpeq_epi8(v, _mm_set1_epi8('\r')));
    __m128i next = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(w, l[0]), _mm_cmpeq_epi8(w, l[1])),
                                _mm_or_si128(_mm_cmpeq_epi8(w, l[2]), _mm_cmpeq_epi8(w, l[3])));
    __m128i quotes = _mm_and_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), next);
    return (uint32_t)_mm_movemask_epi8(_mm_or_si128(lines, quotes));
}

/* The key f whole at q (KEY_WINDOW bytes readable): two loads and compares against the padded
 * key. */
#define KEY_WINDOW 32
static inline bool key_at(const unsigned char *q, int f)
{
    uint32_t need = (uint32_t)((1ull << keys[f].len) - 1);
    __m128i a0 = _mm_loadu_si128((const __m128i *)(const void *)q);
    __m128i a1 = _mm_loadu_si128((const __m128i *)(const void *)(q + 16));
    __m128i k0 = _mm_loadu_si128((const __m128i *)(const void *)keys[f].key);
    __m128i k1 = _mm_loadu_si128((const __m128i *)(const void *)(keys[f].key + 16));
    uint32_t eq = (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(a0, k0)) |
                  (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(a1, k1)) << 16;
    return (eq & need) == need;
}
#else
#define BLOCK_NEEDS 16
/* No filter here: every quote is a bit, and the tables after it do the filter's work. */
typedef struct letters {
    char unused;
} letters;

static inline void letters_init(letters *lv, const char *c)
{
    (void)lv;
    (void)c;
}

static inline uint32_t block_mask(const unsigned char *p, const letters *lv)
{
    (void)lv;
    uint32_t m = 0;
    for (int i = 0; i < 16; i++)
        m |= (uint32_t)special[p[i]] << i;
    return m;
}
#define KEY_WINDOW 19 /* the longest key */
static inline bool key_at(const unsigned char *q, int f)
{
    return memcmp(q, keys[f].key, keys[f].len) == 0;
}
#endif
_Static_assert(sizeof("\"completion_tokens\"") - 1 <= KEY_WINDOW, "the window holds any key");

/* After key f, whole in the chunk from r, the forms vLLM writes: "key":123 with its end, "key":"",
 * "key":"x, "key":[], "key":[x. Read as the byte machine would read them; returns where the idle
 * scan goes on (the byte that ended the value, unread: the machine hands it back too), or NULL
 * for anything else (whitespace, null, a long number, the chunk's end), which the byte machine
 * then reads from r. Saves the machine's switch on the 3 to 8 bytes after most keys. */
static const unsigned char *value_fast(kvg_usage_scan *s, int f, const unsigned char *r,
                                       const unsigned char *end)
{
    if (end - r < 3 || r[0] != ':')
        return NULL;
    const unsigned char *v = r + 1;
    switch (keys[f].kind) {
    case VAL_NUMBER: {
        uint64_t acc = 0;
        int ndigits = 0;
        for (; v < end && *v >= '0' && *v <= '9'; v++) {
            if (ndigits == 18)
                return NULL; /* the 19th digit */
            acc = acc * 10 + (uint64_t)(*v - '0');
            ndigits++;
        }
        if (!ndigits || v == end || !(*v == ',' || *v == '}' || *v == ']' || is_ws(*v)))
            return NULL;
        s->value[keys[f].field] = (int64_t)acc;
        return v;
    }
    case VAL_STRING:
        if (v[0] != '"')
            return NULL;
        if (v[1] == '"')
            return v + 2;
        s->event_output = true;
        return v + 1;
    default:
        if (v[0] != '[' || is_ws(v[1]))
            return NULL;
        if (v[1] == ']')
            return v + 2;
        s->event_output = true;
        return v + 1; /* a quote there starts a race, as in the machine */
    }
}

/* From p (idle, every byte before p through track_line) to the end or to where the byte machine
 * must take over: returns that place, with the line state brought up to it. The chunk starts at
 * start: its last block may reach back before p. */
static const unsigned char *scan_idle(kvg_usage_scan *s, const unsigned char *start,
                                      const unsigned char *p, const unsigned char *end)
{
    const unsigned char *line = p; /* bytes from here on not yet through the line state */
    letters lv;
    letters_init(&lv, set_letters[s->keyset == RESPONSES_KEYS]);
    while (p < end) {
        const unsigned char *base = p;
        uint32_t m;
        if (end - p >= BLOCK_NEEDS) {
            m = block_mask(p, &lv);
            p += 16;
        } else if (end - start >= BLOCK_NEEDS) {
            /* The last bytes: the block that ends at the chunk's end, less what is already
             * scanned, and the last byte (no next byte to filter a quote with). */
            base = end - BLOCK_NEEDS;
            m = block_mask(base, &lv) & (~0u << (p - base));
            m |= (uint32_t)special[end[-1]] << (BLOCK_NEEDS - 1);
            p = end;
        } else {
            m = 0;
            for (int i = 0; i < end - p; i++)
                m |= (uint32_t)special[p[i]] << i;
            p = end;
        }
        for (; m; m &= m - 1) {
            const unsigned char *q = base + __builtin_ctz(m);
            if (*q != '"') {
                if (q > line) {
                    s->line_started = true;
                    s->after_cr = false;
                }
                track_line(s, *q);
                line = q + 1;
                continue;
            }
            /* A race that dies changes nothing: the bytes it took are a key's letters, and the
             * byte it dies on is a bit of m if a line end; if a quote, it starts a race of its
             * own (a bit of m if a key's letter follows it; if none does, that one dies at
             * once). */
            uint16_t cand = q + 1 < end ? first_letter[q[1]] & s->keyset : s->keyset;
            if (!cand)
                continue;
            bool partial = false, window = end - q >= KEY_WINDOW;
            if (window)
                cand &= second_letter[q[2]] & third_letter[q[3]];
            for (; cand; cand &= cand - 1) {
                int f = __builtin_ctz(cand);
                int hit = window ? key_at(q, f) : key_at_end(q, (size_t)(end - q), f);
                if (hit == 0)
                    continue;
                /* The quote and the key's bytes are no line end. */
                s->line_started = true;
                s->after_cr = false;
                if (hit < 0) {
                    partial = true; /* the chunk ends in this key, or in another */
                    continue;
                }
                const unsigned char *v = value_fast(s, f, q + keys[f].len, end);
                if (!v) {
                    s->field = (uint8_t)f;
                    s->state = ST_COLON;
                    return q + keys[f].len;
                }
                /* On from the value's end: a new block there. */
                p = line = v;
                goto next_block;
            }
            if (partial)
                return q; /* the byte machine runs the race into the next chunk */
        }
    next_block:;
    }
    if (end > line) {
        s->line_started = true;
        s->after_cr = false;
    }
    return end;
}

void kvg_usage_scan_feed(kvg_usage_scan *s, const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data, *end = p + len;
    while (p < end) {
        if (s->state == ST_KEY && !s->alive) {
            p = scan_idle(s, (const unsigned char *)data, p, end);
            if (p == end)
                return;
        }
        /* The byte machine until idle again: a key, its colon and value, a race at a chunk's
         * end. */
        do {
            unsigned char c = *p++;
            track_line(s, c);
            step(s, c);
        } while (p < end && !(s->state == ST_KEY && !s->alive));
    }
}
