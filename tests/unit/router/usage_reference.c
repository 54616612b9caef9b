/* SPDX-License-Identifier: Apache-2.0 */
/* The test oracle for router/usage.c: the byte-at-a-time usage reader as it was before the
 * block scanner (commit bfe1ef2), kept verbatim under other names so that the unit test, the
 * fuzz target and bench/usage_bench.c can compare the product against it. Test-only: never
 * linked into kvgate. */
#include "usage_reference.h"

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
 */

enum { VAL_NUMBER = 0, VAL_STRING, VAL_ARRAY };

static const struct {
    const char *key;
    uint8_t kind;
    uint8_t field; /* VAL_NUMBER: the value it sets */
} keys[KVG_USAGE_SCAN_KEYS] = {
    [KVG_USAGE_PROMPT_TOKENS] = {"\"prompt_tokens\"", VAL_NUMBER, KVG_USAGE_PROMPT_TOKENS},
    [KVG_USAGE_CACHED_TOKENS] = {"\"cached_tokens\"", VAL_NUMBER, KVG_USAGE_CACHED_TOKENS},
    [KVG_USAGE_COMPLETION_TOKENS] = {"\"completion_tokens\"", VAL_NUMBER,
                                     KVG_USAGE_COMPLETION_TOKENS},
    [KVG_USAGE_FIELD_COUNT] = {"\"content\"", VAL_STRING, 0},
    [KVG_USAGE_FIELD_COUNT + 1] = {"\"text\"", VAL_STRING, 0},
    [KVG_USAGE_FIELD_COUNT + 2] = {"\"reasoning_content\"", VAL_STRING, 0},
    [KVG_USAGE_FIELD_COUNT + 3] = {"\"tool_calls\"", VAL_ARRAY, 0},
    [KVG_USAGE_FIELD_COUNT + 4] = {"\"input_tokens\"", VAL_NUMBER, KVG_USAGE_PROMPT_TOKENS},
    [KVG_USAGE_FIELD_COUNT + 5] = {"\"output_tokens\"", VAL_NUMBER, KVG_USAGE_COMPLETION_TOKENS},
    [KVG_USAGE_FIELD_COUNT + 6] = {"\"delta\"", VAL_STRING, 0},
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

void kvg_usage_ref_init(kvg_usage_scan *s)
{
    memset(s, 0, sizeof(*s));
    for (int f = 0; f < KVG_USAGE_FIELD_COUNT; f++)
        s->value[f] = -1;
    s->keyset = CHAT_KEYS;
}

void kvg_usage_ref_init_responses(kvg_usage_scan *s)
{
    kvg_usage_ref_init(s);
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

void kvg_usage_ref_feed(kvg_usage_scan *s, const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data, *end = p + len;
    while (p < end) {
        if (s->state == ST_KEY && !s->alive) {
            /* Idle: skip to the next quote or line end; nothing else can change a thing. (A
             * byte loop: the gaps between quotes are short, shorter than memchr's set-up.) */
            const unsigned char *q = p;
            while (q < end && *q != '"' && *q != '\n' && *q != '\r')
                q++;
            if (q > p) {
                s->line_started = true;
                s->after_cr = false;
                p = q;
                if (p == end)
                    return;
            }
        }
        unsigned char c = *p++;
        track_line(s, c);
        step(s, c);
    }
}
