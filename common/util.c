/* SPDX-License-Identifier: Apache-2.0 */
/* Small parsing and security helpers shared by all modules. */
#include "common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int kvg_parse_hostport(const char *s, char *host, size_t host_len, uint16_t *port)
{
    const char *colon;
    const char *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return KVG_EPARSE;
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return KVG_EPARSE;
        hlen = (size_t)(colon - s);
        if (memchr(s, ':', hlen))
            return KVG_EPARSE; /* bare IPv6 needs brackets */
    }
    if (hlen == 0 || hlen >= host_len)
        return KVG_EPARSE;
    uint64_t p;
    if (kvg_parse_u64(colon + 1, strlen(colon + 1), &p) < 0 || p > 65535)
        return KVG_EPARSE;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)p;
    return 0;
}

int kvg_parse_u64(const char *s, size_t len, uint64_t *out)
{
    if (len == 0 || len > 20)
        return KVG_EPARSE;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return KVG_EPARSE;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return KVG_EPARSE;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

bool kvg_consttime_eq(const void *a, const void *b, size_t len)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char acc = 0;
    for (size_t i = 0; i < len; i++)
        acc |= x[i] ^ y[i];
    return acc == 0;
}

int kvg_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

bool kvg_strncaseeq_slow(const char *a, const char *b, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z')
            x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (char)(y - 'A' + 'a');
        if (x != y)
            return false;
    }
    return true;
}

int kvg_hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool kvg_models_admit(const char *const *list, size_t n, const char *model)
{
    if (!model || n == 0)
        return true;
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], model) == 0)
            return true;
    return false;
}

/* RFC 9110 5.6.2 tchar, each mapped to its lowercase form; 0 for every other byte. Header names
 * are checked (and lowercased) on every request and every response, byte by byte: a table
 * makes that one load and one test per byte. */
const unsigned char kvg_tchar_lower[256] = {
    ['!'] = '!', ['#'] = '#', ['$'] = '$', ['%'] = '%', ['&'] = '&', ['\''] = '\'', ['*'] = '*',
    ['+'] = '+', ['-'] = '-', ['.'] = '.', ['^'] = '^', ['_'] = '_', ['`'] = '`',   ['|'] = '|',
    ['~'] = '~', ['0'] = '0', ['1'] = '1', ['2'] = '2', ['3'] = '3', ['4'] = '4',   ['5'] = '5',
    ['6'] = '6', ['7'] = '7', ['8'] = '8', ['9'] = '9', ['A'] = 'a', ['B'] = 'b',   ['C'] = 'c',
    ['D'] = 'd', ['E'] = 'e', ['F'] = 'f', ['G'] = 'g', ['H'] = 'h', ['I'] = 'i',   ['J'] = 'j',
    ['K'] = 'k', ['L'] = 'l', ['M'] = 'm', ['N'] = 'n', ['O'] = 'o', ['P'] = 'p',   ['Q'] = 'q',
    ['R'] = 'r', ['S'] = 's', ['T'] = 't', ['U'] = 'u', ['V'] = 'v', ['W'] = 'w',   ['X'] = 'x',
    ['Y'] = 'y', ['Z'] = 'z', ['a'] = 'a', ['b'] = 'b', ['c'] = 'c', ['d'] = 'd',   ['e'] = 'e',
    ['f'] = 'f', ['g'] = 'g', ['h'] = 'h', ['i'] = 'i', ['j'] = 'j', ['k'] = 'k',   ['l'] = 'l',
    ['m'] = 'm', ['n'] = 'n', ['o'] = 'o', ['p'] = 'p', ['q'] = 'q', ['r'] = 'r',   ['s'] = 's',
    ['t'] = 't', ['u'] = 'u', ['v'] = 'v', ['w'] = 'w', ['x'] = 'x', ['y'] = 'y',   ['z'] = 'z',
};

bool kvg_http_token_valid(const char *s, size_t len)
{
    if (len == 0)
        return false;
    unsigned char ok = 1;
    for (size_t i = 0; i < len; i++)
        ok &= kvg_tchar_lower[(unsigned char)s[i]] != 0;
    return ok;
}

bool kvg_http_token_lower(char *s, size_t len)
{
    unsigned char all = len != 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = kvg_tchar_lower[(unsigned char)s[i]];
        all &= c != 0;
        s[i] = (char)c;
    }
    return all;
}

size_t kvg_fmt_u64(char *buf, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

void kvg_fmt_hex64(char *buf, uint64_t v)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) {
        buf[i] = hex[v & 15];
        v >>= 4;
    }
}

void kvg_hex_encode(const uint8_t *in, size_t len, char *out)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = hex[in[i] >> 4];
        out[2 * i + 1] = hex[in[i] & 15];
    }
}

size_t kvg_base64url(const uint8_t *in, size_t len, char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = abc[v >> 6 & 63];
        out[o++] = abc[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = abc[v >> 18 & 63];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = abc[v >> 6 & 63];
    }
    out[o] = '\0';
    return o;
}
