/* SPDX-License-Identifier: Apache-2.0 */
/* Growable byte buffer with printf and JSON string escaping. */
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvg_buf_init(kvg_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->failed = false;
}

void kvg_buf_done(kvg_buf *b)
{
    free(b->data);
    kvg_buf_init(b);
}

void kvg_buf_reset(kvg_buf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data)
        b->data[0] = '\0';
}

int kvg_buf_reserve(kvg_buf *b, size_t n)
{
    if (b->failed)
        return -ENOMEM;
    if (n > SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return -ENOMEM;
    }
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return -ENOMEM;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void kvg_buf_append_grow(kvg_buf *b, const void *data, size_t len)
{
    if (kvg_buf_reserve(b, len) < 0)
        return;
    if (len)
        kvg_copy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void kvg_buf_vprintf(kvg_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    char small[256];
    int n = vsnprintf(small, sizeof(small), fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof(small)) {
        kvg_buf_append(b, small, (size_t)n);
        return;
    }
    if (kvg_buf_reserve(b, (size_t)n) < 0)
        return;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void kvg_buf_printf(kvg_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvg_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void kvg_buf_json_string(kvg_buf *b, const char *str, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    kvg_buf_reserve(b, len + 2);
    kvg_buf_putc(b, '"');
    size_t run = 0; /* start of the pending run of bytes that need no escaping */
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        const char *esc = NULL;
        char ubuf[7];
        size_t adv = 1;
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0x80) {
            adv = kvg_utf8_seq_len(s + i, len - i);
            if (adv) {
                i += adv;
                continue;
            }
            adv = 1;
            esc = "\xEF\xBF\xBD"; /* U+FFFD for a byte that is not UTF-8 */
        } else if (!(esc = kvg_json_short_escape(c))) {
            ubuf[0] = '\\';
            ubuf[1] = 'u';
            ubuf[2] = '0';
            ubuf[3] = '0';
            ubuf[4] = hex[c >> 4];
            ubuf[5] = hex[c & 15];
            ubuf[6] = '\0';
            esc = ubuf;
        }
        kvg_buf_append(b, s + run, i - run);
        kvg_buf_puts(b, esc);
        i += adv;
        run = i;
    }
    kvg_buf_append(b, s + run, len - run);
    kvg_buf_putc(b, '"');
}

const char *kvg_json_short_escape(unsigned char c)
{
    switch (c) {
    case '"':
        return "\\\"";
    case '\\':
        return "\\\\";
    case '\n':
        return "\\n";
    case '\r':
        return "\\r";
    case '\t':
        return "\\t";
    case '\b':
        return "\\b";
    case '\f':
        return "\\f";
    default:
        return NULL;
    }
}

char *kvg_buf_steal(kvg_buf *b, size_t *len)
{
    char *p = b->data;
    if (len)
        *len = b->len;
    kvg_buf_init(b);
    return p;
}
