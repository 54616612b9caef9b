/* SPDX-License-Identifier: Apache-2.0 */
/* Small parsing and security helpers shared by all modules. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

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
    /* Eight bytes at a time (a 32-byte digest: 4 steps, not 32 through volatile bytes, which
     * cost ~260 instructions per authenticated request); the empty asm keeps the compiler from
     * turning the accumulation into an early exit. */
    const unsigned char *x = a, *y = b;
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t u, v;
        memcpy(&u, x + i, 8);
        memcpy(&v, y + i, 8);
        acc |= u ^ v;
        __asm__ volatile("" : "+r"(acc));
    }
    for (; i < len; i++) {
        acc |= (uint64_t)(x[i] ^ y[i]);
        __asm__ volatile("" : "+r"(acc));
    }
    return acc == 0;
}

void kvg_copy_lower(char *dst, const char *src, size_t n)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, src + i, 8);
        /* Per byte, on its low seven bits (no carry crosses bytes): the high bit of ge_a says
         * >= 'A', of gt_z > 'Z'; a byte with its own high bit set is not ASCII. */
        uint64_t low7 = x & ~high;
        uint64_t ge_a = low7 + ones * (0x80 - 'A');
        uint64_t gt_z = low7 + ones * (0x7f - 'Z');
        uint64_t upper = ge_a & ~gt_z & ~x & high;
        x |= upper >> 2; /* 0x80 >> 2 = 0x20, 'A' - 'a' */
        memcpy(dst + i, &x, 8);
    }
    for (; i < n; i++) {
        char c = src[i];
        dst[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
    }
}

int kvg_read_file(const char *path, size_t max, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is then refused below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    char *buf = NULL;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = -EISDIR;
        goto out;
    }
    if ((uint64_t)st.st_size > max) {
        rc = KVG_ELIMIT;
        goto out;
    }
    /* The size at open is a hint: a file that grows is read to max + 1 and refused. */
    size_t cap = (size_t)st.st_size + 1, got = 0;
    buf = malloc(cap + 1);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    for (;;) {
        if (got == cap) {
            if (got > max) {
                rc = KVG_ELIMIT;
                goto out;
            }
            size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *n = realloc(buf, ncap + 1);
            if (!n) {
                rc = -ENOMEM;
                goto out;
            }
            buf = n;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got > max) {
        rc = KVG_ELIMIT;
        goto out;
    }
    buf[got] = '\0';
    *data = buf;
    *len = got;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
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

/* Two digits per table load: a request formats its id (32 hex digits) and two or three decimal
 * numbers, and digit by digit that was ~450 instructions a request (callgrind, 2026-12-02). */
#define DEC_ROW(d) d "0" d "1" d "2" d "3" d "4" d "5" d "6" d "7" d "8" d "9"
static const char dec_pairs[] = DEC_ROW("0") DEC_ROW("1") DEC_ROW("2") DEC_ROW("3") DEC_ROW("4")
    DEC_ROW("5") DEC_ROW("6") DEC_ROW("7") DEC_ROW("8") DEC_ROW("9");
#define HEX_ROW(h)                                                                                 \
    h "0" h "1" h "2" h "3" h "4" h "5" h "6" h "7" h "8" h "9" h "a" h "b" h "c" h "d" h "e" h "f"
static const char hex_pairs[] = HEX_ROW("0") HEX_ROW("1") HEX_ROW("2") HEX_ROW("3") HEX_ROW("4")
    HEX_ROW("5") HEX_ROW("6") HEX_ROW("7") HEX_ROW("8") HEX_ROW("9") HEX_ROW("a") HEX_ROW("b")
        HEX_ROW("c") HEX_ROW("d") HEX_ROW("e") HEX_ROW("f");

size_t kvg_fmt_u64(char *buf, uint64_t v)
{
    char tmp[20];
    size_t i = sizeof(tmp);
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        i -= 2;
        memcpy(tmp + i, dec_pairs + 2 * r, 2);
    }
    if (v >= 10) {
        i -= 2;
        memcpy(tmp + i, dec_pairs + 2 * v, 2);
    } else {
        tmp[--i] = (char)('0' + v);
    }
    memcpy(buf, tmp + i, sizeof(tmp) - i);
    return sizeof(tmp) - i;
}

void kvg_fmt_hex64(char *buf, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        memcpy(buf + 2 * i, hex_pairs + 2 * (v & 0xff), 2);
        v >>= 8;
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
