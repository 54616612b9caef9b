/* SPDX-License-Identifier: Apache-2.0 */
/* Reads the engine's usage report (prompt and cached tokens) out of a response as it streams
 * past, without buffering it: the final usage chunk of an SSE stream, or the body's usage. */
#include "router.h"

#include <string.h>

/*
 * The response is not parsed as JSON: the gateway passes it through untouched and only wants two
 * numbers. A small state machine looks for the keys "prompt_tokens" and "cached_tokens" (with
 * their quotes, so "prompt_tokens_details" does not match) followed by optional whitespace, a
 * colon, optional whitespace and digits, across chunk boundaries. The last occurrence wins: with
 * vLLM's continuous usage stats every chunk carries usage, and the final one is the total.
 * A value that is not an integer (null, as when prefix caching is off) leaves the field as it
 * was. The keys contain no quote except at their ends, so a mismatch can only restart a match
 * at a quote: no backtracking is needed.
 */

static const char *const keys[KVG_USAGE_FIELD_COUNT] = {
    [KVG_USAGE_PROMPT_TOKENS] = "\"prompt_tokens\"",
    [KVG_USAGE_CACHED_TOKENS] = "\"cached_tokens\"",
};

enum {
    ST_KEY = 0, /* matching keys; matched[] says how far each got */
    ST_COLON,   /* after a whole key: whitespace, then ':' */
    ST_VALUE,   /* after the colon: whitespace, then the first digit */
    ST_DIGITS,  /* in the number */
};

void kvg_usage_scan_init(kvg_usage_scan *s)
{
    memset(s, 0, sizeof(*s));
    for (int f = 0; f < KVG_USAGE_FIELD_COUNT; f++)
        s->value[f] = -1;
}

static bool is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

void kvg_usage_scan_feed(kvg_usage_scan *s, const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data, *end = p + len;
    while (p < end) {
        unsigned char c = *p;
        switch (s->state) {
        case ST_KEY: {
            if (s->matched[0] == 0 && s->matched[1] == 0) {
                /* Idle: skip to the next quote at memchr speed. */
                const unsigned char *q = memchr(p, '"', (size_t)(end - p));
                if (!q)
                    return;
                p = q;
                c = '"';
            }
            for (int f = 0; f < KVG_USAGE_FIELD_COUNT; f++) {
                const char *k = keys[f];
                uint8_t m = s->matched[f];
                if ((unsigned char)k[m] == c)
                    m++;
                else
                    m = c == '"';
                s->matched[f] = m;
                if (k[m] == '\0') {
                    s->field = (uint8_t)f;
                    s->state = ST_COLON;
                    s->matched[0] = s->matched[1] = 0;
                    break;
                }
            }
            p++;
            break;
        }
        case ST_COLON:
            if (c == ':')
                s->state = ST_VALUE;
            else if (!is_ws(c))
                s->state = ST_KEY; /* a string value "prompt_tokens", not a key */
            if (s->state != ST_KEY)
                p++;
            break;
        case ST_VALUE:
            if (c >= '0' && c <= '9') {
                s->state = ST_DIGITS;
                s->acc = 0;
                s->ndigits = 0;
            } else {
                if (!is_ws(c))
                    s->state = ST_KEY;
                else
                    p++;
            }
            break;
        case ST_DIGITS:
            if (c >= '0' && c <= '9' && s->ndigits < 18) {
                s->acc = s->acc * 10 + (c - '0');
                s->ndigits++;
                p++;
            } else {
                /* 18 digits are far more tokens than any context; longer is not a count. */
                /* Only a number that ends like a JSON integer: 1e3 or 1.5 is not a count. */
                if (c == ',' || c == '}' || c == ']' || is_ws(c))
                    s->value[s->field] = (int64_t)s->acc;
                s->state = ST_KEY;
                if (c >= '0' && c <= '9')
                    p++;
            }
            break;
        }
    }
}
