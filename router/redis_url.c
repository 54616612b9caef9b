/* SPDX-License-Identifier: Apache-2.0 */
/* Redis URLs: redis:// for one server (or a cluster node), redis-sentinel:// for a primary that
 * Sentinels name; parsed once at start-up, written back (redacted) for logs. */
#include "redis_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define PORT_REDIS 6379
#define PORT_SENTINEL 26379
#define DB_MAX 65535
#define LABEL_MAX 63 /* RFC 1035: the longest label of a domain name */

static const char *const mode_names[KVG_REDIS_MODE_COUNT] = {
    [KVG_REDIS_STANDALONE] = "standalone",
    [KVG_REDIS_SENTINEL] = "sentinel",
    [KVG_REDIS_CLUSTER] = "cluster",
};

const char *kvg_redis_mode_str(kvg_redis_mode m)
{
    return (unsigned)m < KVG_REDIS_MODE_COUNT ? mode_names[m] : "?";
}

static int bad(char *msg, size_t msg_len, const char *fmt, ...) KVG_PRINTF(3, 4);
static int bad(char *msg, size_t msg_len, const char *fmt, ...)
{
    if (msg && msg_len) {
        int n = snprintf(msg, msg_len, "redis URL: ");
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < msg_len)
            vsnprintf(msg + n, msg_len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return KVG_EPARSE;
}

/* Percent-decode [s, s + len) into out (cap bytes with the NUL). NUL bytes are refused: they
 * would cut the credential short without a word. 0, or -1 for a bad escape or no room. */
static int decode(const char *s, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= len)
                return -1;
            int hi = kvg_hex_digit(s[i + 1]), lo = kvg_hex_digit(s[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return -1;
            c = (char)(hi << 4 | lo);
            i += 2;
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = c;
    }
    out[o] = '\0';
    return 0;
}

static bool host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
}

bool redis_host_valid(const char *s, size_t len)
{
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!host_char(s[i]) && s[i] != ':')
            return false;
    return true;
}

/* A host name (or IPv4 address) of host_char bytes in [s, end): dot-separated labels, none
 * empty, none longer than 63 bytes, none starting or ending with '-', one trailing dot allowed
 * (an absolute name). Without this, "redis://..:6379" or "redis://-:6379" got through and
 * failed only at connect time, with a resolver message that does not point at the URL. NULL,
 * or what is wrong. */
static const char *name_problem(const char *s, const char *end)
{
    if (end - s == 1 && *s == '.')
        return "the host '.' is not a name";
    const char *label = s;
    for (const char *p = s;; p++) {
        if (p == end || *p == '.') {
            size_t n = (size_t)(p - label);
            if (n == 0 && !(p == end && label > s))
                return "empty label in the host name (\"..\", or a leading '.')";
            if (n > LABEL_MAX)
                return "a label of the host name is longer than 63 bytes";
            if (n && (label[0] == '-' || p[-1] == '-'))
                return "a label of the host name starts or ends with '-'";
            if (p == end)
                return NULL;
            label = p + 1;
        }
    }
}

/* One host[:port] in [s, end): a name, an IPv4 address or a bracketed IPv6 address. */
static int parse_seed(const char *s, const char *end, uint16_t default_port, kvg_redis_seed *out,
                      char *msg, size_t msg_len)
{
    const char *host = s, *host_end;
    const char *p;
    if (s < end && *s == '[') {
        host = s + 1;
        host_end = memchr(host, ']', (size_t)(end - host));
        if (!host_end || host_end == host)
            return bad(msg, msg_len, "unterminated or empty IPv6 address");
        /* inet_pton rather than a character check: "[1]", "[:]" or "[1.2.3.4]" passed that
         * one, and the last came out of kvg_redis_url_format without brackets. Zone ids
         * ("%25eth0") are not supported: a link-local Redis is no deployment we know of. */
        char addr[INET6_ADDRSTRLEN];
        struct in6_addr a6;
        size_t alen = (size_t)(host_end - host);
        if (alen >= sizeof(addr))
            return bad(msg, msg_len, "bad IPv6 address");
        memcpy(addr, host, alen);
        addr[alen] = '\0';
        if (inet_pton(AF_INET6, addr, &a6) != 1)
            return bad(msg, msg_len, "bad IPv6 address '%s'", addr);
        p = host_end + 1;
    } else {
        p = s;
        while (p < end && host_char(*p))
            p++;
        host_end = p;
        if (host_end == host)
            return bad(msg, msg_len, "missing host");
        if ((size_t)(host_end - host) < sizeof(out->host)) {
            const char *why = name_problem(host, host_end);
            if (why)
                return bad(msg, msg_len, "%s", why);
        }
    }
    if ((size_t)(host_end - host) >= sizeof(out->host))
        return bad(msg, msg_len, "host is longer than %zu bytes", sizeof(out->host) - 1);
    uint32_t port = default_port;
    if (p < end) {
        if (*p != ':')
            return bad(msg, msg_len, "bad character '%c' after the host", *p);
        p++;
        if (p == end)
            return bad(msg, msg_len, "missing port after ':'");
        port = 0;
        for (; p < end; p++) {
            if (*p < '0' || *p > '9')
                return bad(msg, msg_len, "port is not a number");
            port = port * 10 + (uint32_t)(*p - '0');
            if (port > 65535)
                return bad(msg, msg_len, "port must be 1..65535");
        }
        if (port == 0)
            return bad(msg, msg_len, "port must be 1..65535");
    }
    memcpy(out->host, host, (size_t)(host_end - host));
    out->host[host_end - host] = '\0';
    out->port = (uint16_t)port;
    return 0;
}

int kvg_redis_url_parse(const char *url, kvg_redis_url *out, char *msg, size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (!url || !out)
        return bad(msg, msg_len, "missing");
    kvg_redis_url u;
    memset(&u, 0, sizeof(u));
    const char *p;
    uint16_t default_port;
    /* Schemes are case-insensitive (RFC 3986, 3.1): REDIS:// is the same URL. */
    if (strncasecmp(url, "redis://", 8) == 0) {
        u.mode = KVG_REDIS_STANDALONE;
        p = url + 8;
        default_port = PORT_REDIS;
    } else if (strncasecmp(url, "redis-sentinel://", 17) == 0) {
        u.mode = KVG_REDIS_SENTINEL;
        p = url + 17;
        default_port = PORT_SENTINEL;
    } else if (strncasecmp(url, "rediss://", 9) == 0) {
        return bad(msg, msg_len,
                   "rediss:// (TLS) is not supported: Debian 12's hiredis 0.14 "
                   "has no TLS");
    } else {
        return bad(msg, msg_len, "must start with redis:// or redis-sentinel://");
    }
    for (const char *q = p; *q; q++)
        if ((unsigned char)*q <= 0x20 || (unsigned char)*q >= 0x7f)
            return bad(msg, msg_len,
                       "control characters, spaces and non-ASCII bytes must be "
                       "percent-encoded");
    /* The authority ends at the first '/'; credentials at its last '@'. */
    const char *auth_end = strchr(p, '/');
    if (!auth_end)
        auth_end = p + strlen(p);
    const char *at = NULL;
    for (const char *q = p; q < auth_end; q++)
        if (*q == '@')
            at = q;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon) {
            /* redis://secret@host is how many clients spell a password alone. */
            if (decode(p, (size_t)(at - p), u.password, sizeof(u.password)) < 0)
                return bad(msg, msg_len,
                           "bad password (a bad %%-escape, %%00, or longer than %zu bytes)",
                           sizeof(u.password) - 1);
        } else if (decode(p, (size_t)(colon - p), u.user, sizeof(u.user)) < 0) {
            return bad(msg, msg_len, "bad user (a bad %%-escape, %%00, or longer than %zu bytes)",
                       sizeof(u.user) - 1);
        } else if (decode(colon + 1, (size_t)(at - colon - 1), u.password, sizeof(u.password)) <
                   0) {
            return bad(msg, msg_len,
                       "bad password (a bad %%-escape, %%00, or longer than %zu bytes)",
                       sizeof(u.password) - 1);
        }
        if (u.user[0] && !u.password[0])
            return bad(msg, msg_len, "a user needs a password");
        p = at + 1;
    }
    /* Hosts: one, or (Sentinel) a comma-separated list. */
    while (p < auth_end) {
        const char *comma = memchr(p, ',', (size_t)(auth_end - p));
        const char *seed_end = comma ? comma : auth_end;
        /* Checked here, not after the loop: redis:// with 17 hosts said "more than 16 hosts",
         * as if 16 were allowed. */
        if (u.mode == KVG_REDIS_STANDALONE && u.nseeds == 1)
            return bad(msg, msg_len,
                       "redis:// takes one host (a Sentinel list is "
                       "redis-sentinel://h1,h2/master)");
        if (u.nseeds == KVG_REDIS_SEEDS_MAX)
            return bad(msg, msg_len, "more than %d Sentinels", KVG_REDIS_SEEDS_MAX);
        int rc = parse_seed(p, seed_end, default_port, &u.seeds[u.nseeds], msg, msg_len);
        if (rc < 0)
            return rc;
        u.nseeds++;
        p = comma ? comma + 1 : auth_end;
        if (comma && p == auth_end)
            return bad(msg, msg_len, "missing host after ','");
    }
    if (u.nseeds == 0)
        return bad(msg, msg_len, "missing host");
    /* The path: /db for redis://, /master-name for redis-sentinel://. */
    const char *path = *auth_end == '/' ? auth_end + 1 : NULL;
    if (u.mode == KVG_REDIS_SENTINEL) {
        if (!path || !*path)
            return bad(msg, msg_len,
                       "redis-sentinel:// needs the master's name: "
                       "redis-sentinel://host:26379/mymaster");
        size_t n = strlen(path);
        for (size_t i = 0; i < n; i++)
            if (!host_char(path[i]))
                return bad(msg, msg_len, "bad character '%c' in the master's name", path[i]);
        if (n >= sizeof(u.master))
            return bad(msg, msg_len, "master name longer than %zu bytes", sizeof(u.master) - 1);
        memcpy(u.master, path, n + 1);
    } else if (path && *path) {
        uint32_t db = 0;
        for (const char *q = path; *q; q++) {
            if (*q < '0' || *q > '9')
                return bad(msg, msg_len, "the path must be a database number (/0../%d)", DB_MAX);
            db = db * 10 + (uint32_t)(*q - '0');
            if (db > DB_MAX)
                return bad(msg, msg_len, "database must be 0..%d", DB_MAX);
        }
        u.db = db;
    }
    *out = u;
    return 0;
}

/* A credential as the URL has it: what decode() reads back, percent-encoded past host_char. */
static void put_encoded(kvg_buf *b, const char *s)
{
    for (; *s; s++) {
        if (host_char(*s))
            kvg_buf_putc(b, *s);
        else
            kvg_buf_printf(b, "%%%02X", (unsigned char)*s);
    }
}

void kvg_redis_url_format(const kvg_redis_url *u, bool redact, char *out, size_t len)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b, u->mode == KVG_REDIS_SENTINEL ? "redis-sentinel://" : "redis://");
    if (u->password[0]) {
        put_encoded(&b, u->user);
        kvg_buf_putc(&b, ':');
        if (redact)
            kvg_buf_puts(&b, "***");
        else
            put_encoded(&b, u->password);
        kvg_buf_putc(&b, '@');
    }
    for (size_t i = 0; i < u->nseeds; i++) {
        if (i)
            kvg_buf_putc(&b, ',');
        if (strchr(u->seeds[i].host, ':'))
            kvg_buf_printf(&b, "[%s]:%u", u->seeds[i].host, u->seeds[i].port);
        else
            kvg_buf_printf(&b, "%s:%u", u->seeds[i].host, u->seeds[i].port);
    }
    if (u->mode == KVG_REDIS_SENTINEL)
        kvg_buf_printf(&b, "/%s", u->master);
    else if (u->db)
        kvg_buf_printf(&b, "/%u", u->db);
    if (len) {
        size_t n = b.failed ? 0 : KVG_MIN(b.len, len - 1);
        if (n)
            memcpy(out, b.data, n);
        out[n] = '\0';
    }
    kvg_buf_done(&b);
}
