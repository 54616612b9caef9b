/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for router/redis_url.c: what kvg_redis_url_parse accepts (defaults, credentials,
 * percent-encoding, IPv6, Sentinel lists), every refusal with its message, and that
 * kvg_redis_url_format writes a URL that parses back to the same thing, never showing the
 * password when redacting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fail_alloc.h"
#include "router.h"

/* Room for the longest URL kvg_redis_url_format can write: every credential byte escaped
 * (3 bytes each) and 16 Sentinels with the longest hosts. */
#define FORMAT_MAX 8192

static kvg_redis_url parse_ok(const char *url)
{
    kvg_redis_url u;
    char msg[256] = "unset";
    int rc = kvg_redis_url_parse(url, &u, msg, sizeof(msg));
    if (rc != 0)
        fail_msg("'%s' refused: %s", url, msg);
    assert_string_equal(msg, ""); /* success clears the message */
    return u;
}

/* url is refused with a message that starts "redis URL: " and contains want, and out is left
 * as it was. */
static void refuse(const char *url, const char *want)
{
    kvg_redis_url u, before;
    memset(&u, 0x5a, sizeof(u));
    memcpy(&before, &u, sizeof(u));
    char msg[256] = "";
    int rc = kvg_redis_url_parse(url, &u, msg, sizeof(msg));
    if (rc != KVG_EPARSE)
        fail_msg("'%s': expected KVG_EPARSE, got %d", url, rc);
    if (strncmp(msg, "redis URL: ", 11) != 0 || !strstr(msg, want))
        fail_msg("'%s': message '%s' does not say '%s'", url, msg, want);
    assert_memory_equal(&u, &before, sizeof(u));
}

static void assert_seed(const kvg_redis_url *u, size_t i, const char *host, uint16_t port)
{
    assert_true(i < u->nseeds);
    assert_string_equal(u->seeds[i].host, host);
    assert_int_equal(u->seeds[i].port, port);
}

/* Field by field: struct assignment need not copy padding, so memcmp could see noise. */
static void assert_same_url(const kvg_redis_url *a, const kvg_redis_url *b)
{
    assert_int_equal(a->mode, b->mode);
    assert_string_equal(a->user, b->user);
    assert_string_equal(a->password, b->password);
    assert_int_equal(a->nseeds, b->nseeds);
    for (size_t i = 0; i < a->nseeds; i++) {
        assert_string_equal(a->seeds[i].host, b->seeds[i].host);
        assert_int_equal(a->seeds[i].port, b->seeds[i].port);
    }
    assert_int_equal(a->db, b->db);
    assert_string_equal(a->master, b->master);
}

static char *repeat(char c, size_t n)
{
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* ---- accepted forms ------------------------------------------------------------------------ */

static void test_standalone_defaults(void **state)
{
    (void)state;
    kvg_redis_url u = parse_ok("redis://localhost");
    assert_int_equal(u.mode, KVG_REDIS_STANDALONE);
    assert_int_equal(u.nseeds, 1);
    assert_seed(&u, 0, "localhost", 6379);
    assert_int_equal(u.db, 0);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "");
    assert_string_equal(u.master, "");
    u = parse_ok("redis://10.0.0.5/");
    assert_seed(&u, 0, "10.0.0.5", 6379);
    assert_int_equal(u.db, 0);
    assert_string_equal(kvg_redis_mode_str(KVG_REDIS_STANDALONE), "standalone");
    assert_string_equal(kvg_redis_mode_str(KVG_REDIS_SENTINEL), "sentinel");
    assert_string_equal(kvg_redis_mode_str(KVG_REDIS_CLUSTER), "cluster");
    assert_string_equal(kvg_redis_mode_str(KVG_REDIS_MODE_COUNT), "?");
}

static void test_standalone_full(void **state)
{
    (void)state;
    kvg_redis_url u = parse_ok("redis://alice:s3cret@cache-1.example.com:6380/5");
    assert_int_equal(u.mode, KVG_REDIS_STANDALONE);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.password, "s3cret");
    assert_seed(&u, 0, "cache-1.example.com", 6380);
    assert_int_equal(u.db, 5);
    /* The password alone, as many clients spell it; or with an empty user. */
    u = parse_ok("redis://s3cret@h:1");
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "s3cret");
    assert_seed(&u, 0, "h", 1);
    u = parse_ok("redis://:s3cret@h");
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "s3cret");
    /* The credentials end at the authority's last '@', the user at the first ':'. */
    u = parse_ok("redis://u:p@ss:w@rd@h");
    assert_string_equal(u.user, "u");
    assert_string_equal(u.password, "p@ss:w@rd");
    /* An empty user and password is no AUTH at all. */
    u = parse_ok("redis://:@h");
    assert_string_equal(u.password, "");
    u = parse_ok("redis://@h");
    assert_string_equal(u.password, "");
    /* Ports and databases at their limits; leading zeros are the same number. */
    u = parse_ok("redis://h:65535/65535");
    assert_seed(&u, 0, "h", 65535);
    assert_int_equal(u.db, 65535);
    u = parse_ok("redis://h:00080/007");
    assert_seed(&u, 0, "h", 80);
    assert_int_equal(u.db, 7);
    /* Schemes are case-insensitive. */
    u = parse_ok("REDIS://h");
    assert_int_equal(u.mode, KVG_REDIS_STANDALONE);
    u = parse_ok("Redis-Sentinel://h/m");
    assert_int_equal(u.mode, KVG_REDIS_SENTINEL);
    /* An absolute name (trailing dot), underscores (container names). */
    u = parse_ok("redis://redis.svc.cluster.local.:6379");
    assert_seed(&u, 0, "redis.svc.cluster.local.", 6379);
    u = parse_ok("redis://my_redis_1");
    assert_seed(&u, 0, "my_redis_1", 6379);
}

static void test_percent_encoding(void **state)
{
    (void)state;
    kvg_redis_url u = parse_ok("redis://us%40er%3a:p%3Aw%2F%25d%20x@h");
    assert_string_equal(u.user, "us@er:");
    assert_string_equal(u.password, "p:w/%d x");
    /* Bytes above 0x7f may be escaped (UTF-8 passwords). */
    u = parse_ok("redis://:%C3%A9t%C3%A9@h");
    assert_string_equal(u.password, "\xc3\xa9t\xc3\xa9");
    /* Only credentials are decoded: a host or database with '%' is refused. */
    refuse("redis://h%41", "bad character '%' after the host");
    refuse("redis://h/%31", "database number");
}

static void test_ipv6(void **state)
{
    (void)state;
    kvg_redis_url u = parse_ok("redis://[::1]:7000/2");
    assert_seed(&u, 0, "::1", 7000);
    assert_int_equal(u.db, 2);
    u = parse_ok("redis://[2001:db8::a:1]");
    assert_seed(&u, 0, "2001:db8::a:1", 6379);
    u = parse_ok("redis://u:p@[::ffff:10.0.0.1]:6380");
    assert_seed(&u, 0, "::ffff:10.0.0.1", 6380);
    assert_string_equal(u.password, "p");
    u = parse_ok("redis-sentinel://[fe80::1],[::2]:26380/m");
    assert_seed(&u, 0, "fe80::1", 26379);
    assert_seed(&u, 1, "::2", 26380);
    refuse("redis://[::1", "unterminated or empty IPv6 address");
    refuse("redis://[]:6379", "unterminated or empty IPv6 address");
    refuse("redis://[1]", "bad IPv6 address '1'");
    refuse("redis://[:]", "bad IPv6 address");
    refuse("redis://[1.2.3.4]", "bad IPv6 address");
    refuse("redis://[::g]", "bad IPv6 address");
    refuse("redis://[1:2:3:4:5:6:7:8:9]", "bad IPv6 address");
    refuse("redis://[fe80::1%25eth0]", "bad IPv6 address"); /* zone ids are not supported */
    refuse("redis://[::1]x", "bad character 'x' after the host");
    refuse("redis://[::1]:", "missing port");
    refuse("redis://::1", "missing host");
    refuse("redis://fe80::1", "port is not a number");
}

static void test_sentinel(void **state)
{
    (void)state;
    kvg_redis_url u = parse_ok("redis-sentinel://s1,s2:26380,10.0.0.3/mymaster");
    assert_int_equal(u.mode, KVG_REDIS_SENTINEL);
    assert_int_equal(u.nseeds, 3);
    assert_seed(&u, 0, "s1", 26379);
    assert_seed(&u, 1, "s2", 26380);
    assert_seed(&u, 2, "10.0.0.3", 26379);
    assert_string_equal(u.master, "mymaster");
    assert_int_equal(u.db, 0);
    /* The credentials are the primary's. */
    u = parse_ok("redis-sentinel://bob:pw@s1/my-master_2.x");
    assert_string_equal(u.user, "bob");
    assert_string_equal(u.password, "pw");
    assert_string_equal(u.master, "my-master_2.x");

    /* 16 Sentinels, not 17. */
    char url[512] = "redis-sentinel://";
    for (int i = 0; i < KVG_REDIS_SEEDS_MAX; i++)
        snprintf(url + strlen(url), sizeof(url) - strlen(url), "%ss%d:%d", i ? "," : "", i,
                 1000 + i);
    char with_master[600];
    snprintf(with_master, sizeof(with_master), "%s/m", url);
    u = parse_ok(with_master);
    assert_int_equal(u.nseeds, KVG_REDIS_SEEDS_MAX);
    assert_seed(&u, KVG_REDIS_SEEDS_MAX - 1, "s15", 1015);
    snprintf(with_master, sizeof(with_master), "%s,s16/m", url);
    refuse(with_master, "more than 16 Sentinels");

    refuse("redis-sentinel://h", "needs the master's name");
    refuse("redis-sentinel://h:26379/", "needs the master's name");
    refuse("redis-sentinel:///m", "missing host");
    refuse("redis-sentinel://a,,b/m", "missing host");
    refuse("redis-sentinel://,a/m", "missing host");
    refuse("redis-sentinel://a,/m", "missing host after ','");
    refuse("redis-sentinel://a/m/x", "bad character '/' in the master's name");
    refuse("redis-sentinel://a/m?x=1", "bad character '?' in the master's name");
    refuse("redis-sentinel://a/m%41", "bad character '%' in the master's name");
    refuse("redis-sentinel://a:0/m", "port must be 1..65535");
}

/* Each field at its longest, then one byte over. */
static void test_lengths(void **state)
{
    (void)state;
    char url[2048];
    /* Host: 255 bytes in labels of 63. */
    char *l63 = repeat('a', 63);
    snprintf(url, sizeof(url), "redis://%s.%s.%s.%s:1", l63, l63, l63, l63);
    kvg_redis_url u = parse_ok(url);
    assert_int_equal(strlen(u.seeds[0].host), KVG_REDIS_HOST_MAX - 1);
    snprintf(url, sizeof(url), "redis://%s.%s.%s.%sa:1", l63, l63, l63, l63);
    refuse(url, "host is longer than 255 bytes");
    snprintf(url, sizeof(url), "redis://%sa.b", l63);
    refuse(url, "longer than 63 bytes");
    snprintf(url, sizeof(url), "redis://%s.b", l63);
    parse_ok(url);
    free(l63);

    char *s = repeat('u', sizeof(u.user) - 1);
    snprintf(url, sizeof(url), "redis://%s:p@h", s);
    u = parse_ok(url);
    assert_string_equal(u.user, s);
    snprintf(url, sizeof(url), "redis://%su:p@h", s);
    refuse(url, "bad user (a bad %-escape, %00, or longer than 127 bytes)");
    free(s);

    s = repeat('p', sizeof(u.password) - 1);
    snprintf(url, sizeof(url), "redis://u:%s@h", s);
    u = parse_ok(url);
    assert_string_equal(u.password, s);
    snprintf(url, sizeof(url), "redis://%s@h", s); /* the password alone */
    u = parse_ok(url);
    assert_string_equal(u.password, s);
    snprintf(url, sizeof(url), "redis://u:%sp@h", s);
    refuse(url, "bad password (a bad %-escape, %00, or longer than 255 bytes)");
    snprintf(url, sizeof(url), "redis://%sp@h", s);
    refuse(url, "longer than 255 bytes");
    free(s);
    /* The limit is on decoded bytes: 255 escapes fit. */
    size_t n = strlen("redis://:");
    memcpy(url, "redis://:", n);
    for (int i = 0; i < 255; i++, n += 3)
        memcpy(url + n, "%41", 3);
    memcpy(url + n, "@h", 3);
    u = parse_ok(url);
    assert_int_equal(strlen(u.password), 255);
    memcpy(url + n, "%41@h", 6);
    refuse(url, "bad password");

    s = repeat('m', sizeof(u.master) - 1);
    snprintf(url, sizeof(url), "redis-sentinel://h/%s", s);
    u = parse_ok(url);
    assert_string_equal(u.master, s);
    snprintf(url, sizeof(url), "redis-sentinel://h/%sm", s);
    refuse(url, "master name longer than 127 bytes");
    free(s);
}

/* ---- refusals ------------------------------------------------------------------------------ */

static void test_refuse_scheme(void **state)
{
    (void)state;
    refuse("", "must start with redis:// or redis-sentinel://");
    refuse("localhost:6379", "must start with");
    refuse("http://h", "must start with");
    refuse("redis:/h", "must start with");
    refuse("redis:", "must start with");
    refuse("unix:///run/redis.sock", "must start with");
    refuse("redis-cluster://h", "must start with");
    refuse(" redis://h", "must start with");
    refuse("rediss://h", "rediss:// (TLS) is not supported");
    refuse("REDISS://h", "(TLS) is not supported");
    /* NULL arguments. */
    kvg_redis_url u;
    char msg[64];
    assert_int_equal(kvg_redis_url_parse(NULL, &u, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "redis URL: missing");
    assert_int_equal(kvg_redis_url_parse("redis://h", NULL, msg, sizeof(msg)), KVG_EPARSE);
}

static void test_refuse_host_port(void **state)
{
    (void)state;
    refuse("redis://", "missing host");
    refuse("redis:///0", "missing host");
    refuse("redis://:6379", "missing host");
    refuse("redis://u:p@", "missing host");
    refuse("redis://u:p@:1", "missing host");
    refuse("redis://h:", "missing port after ':'");
    refuse("redis://h:/0", "missing port after ':'");
    refuse("redis://h:0", "port must be 1..65535");
    refuse("redis://h:00000", "port must be 1..65535");
    refuse("redis://h:65536", "port must be 1..65535");
    refuse("redis://h:99999999999999999999999", "port must be 1..65535");
    refuse("redis://h:63a9", "port is not a number");
    refuse("redis://h:-1", "port is not a number");
    refuse("redis://h:+1", "port is not a number");
    refuse("redis://h:6379:6380", "port is not a number");
    refuse("redis://h:6379x", "port is not a number");
    refuse("redis://a,b", "redis:// takes one host");
    refuse("redis://a:1,b:2/0", "redis:// takes one host");
    refuse("redis://a,", "missing host after ','");
    refuse("redis://h?db=1", "bad character '?' after the host");
    refuse("redis://h#x", "bad character '#' after the host");
    refuse("redis://h;x", "bad character ';' after the host");
    /* Names. */
    refuse("redis://.", "the host '.' is not a name");
    refuse("redis://..:1", "empty label");
    refuse("redis://a..b", "empty label");
    refuse("redis://.a", "empty label");
    refuse("redis://a.b..", "empty label");
    refuse("redis://-a", "starts or ends with '-'");
    refuse("redis://a-", "starts or ends with '-'");
    refuse("redis://a.-b.c", "starts or ends with '-'");
    refuse("redis://-", "starts or ends with '-'");
}

static void test_refuse_path(void **state)
{
    (void)state;
    refuse("redis://h/65536", "database must be 0..65535");
    refuse("redis://h/4294967296", "database must be 0..65535");
    refuse("redis://h/99999999999999999999999", "database must be 0..65535");
    refuse("redis://h/x", "the path must be a database number (/0../65535)");
    refuse("redis://h/-1", "database number");
    refuse("redis://h/1/2", "database number");
    refuse("redis://h/1/", "database number");
    refuse("redis://h//", "database number");
    refuse("redis://h/0?x", "database number");
    refuse("redis://h/0#frag", "database number");
    refuse("redis://h/mymaster", "database number");
}

static void test_refuse_credentials(void **state)
{
    (void)state;
    refuse("redis://u:@h", "a user needs a password");
    refuse("redis://u:%@h", "bad password");
    refuse("redis://u:p%4@h", "bad password");
    refuse("redis://u:p%zz@h", "bad password");
    refuse("redis://u:p%00x@h", "bad password (a bad %-escape, %00");
    refuse("redis://p%00@h", "bad password");
    refuse("redis://u%00:p@h", "bad user");
    refuse("redis://u%4:p@h", "bad user");
    refuse("redis://u%:p@h", "bad user");
    /* The authority ends at the first '/': a '/' in a password must be escaped. */
    refuse("redis://u:p/w@h", "port is not a number");
}

static void test_refuse_bytes(void **state)
{
    (void)state;
    refuse("redis://h ", "control characters, spaces and non-ASCII bytes must be percent-encoded");
    refuse("redis://h/0 x", "percent-encoded");
    refuse("redis://u:p w@h", "percent-encoded");
    refuse("redis://h\t", "percent-encoded");
    refuse("redis://h\r\n", "percent-encoded");
    refuse("redis://h\x7f", "percent-encoded");
    refuse("redis://h\xc3\xa9", "percent-encoded");
    refuse("redis://u:\x01@h", "percent-encoded");
    refuse("redis-sentinel://h/my master", "percent-encoded");
    /* The URL is a C string: a NUL ends it (argv and the config's strings cannot carry one),
     * so what follows it is never read... */
    static const char with_nul[] = "redis://h:6380/1\0/x y z";
    kvg_redis_url u = parse_ok(with_nul);
    assert_int_equal(u.db, 1);
    assert_seed(&u, 0, "h", 6380);
    /* ...and a NUL cannot be smuggled into a credential escaped either (%00 above). */
    static const char cut[] = "redis://u:p\0@h";
    refuse(cut, "port is not a number"); /* "redis://u:p": host u, port "p" */
}

/* Messages: NULL msg is fine, a short one is cut and terminated. */
static void test_messages(void **state)
{
    (void)state;
    kvg_redis_url u;
    assert_int_equal(kvg_redis_url_parse("redis://h:0", &u, NULL, 0), KVG_EPARSE);
    assert_int_equal(kvg_redis_url_parse("redis://h:0", &u, NULL, 100), KVG_EPARSE);
    char msg[8];
    memset(msg, 'x', sizeof(msg));
    assert_int_equal(kvg_redis_url_parse("redis://h:0", &u, msg, sizeof(msg)), KVG_EPARSE);
    assert_string_equal(msg, "redis U");
    char big[100];
    memset(big, 'x', sizeof(big));
    assert_int_equal(kvg_redis_url_parse("redis://h:0", &u, big, 13), KVG_EPARSE);
    assert_string_equal(big, "redis URL: p");
    assert_int_equal(big[13], 'x');
    /* A success clears a message left from before. */
    strcpy(big, "old");
    assert_int_equal(kvg_redis_url_parse("redis://h", &u, big, sizeof(big)), 0);
    assert_string_equal(big, "");
}

/* ---- format ---------------------------------------------------------------------------------- */

static const char *const round_trip_urls[] = {
    "redis://localhost",
    "redis://h:6380/15",
    "redis://h/65535",
    "redis://alice:s3cret@cache.example.com:1/3",
    "redis://s3cret@h",
    "redis://:s3cret@h",
    "redis://us%40er%3A:p%3aw%2F%25d%20x%C3%A9@h",
    "redis://u:p@ss:w@rd@h",
    "redis://~user:!$&'()*+;=@h", /* sub-delims raw in the input */
    "redis://[::1]:7000/2",
    "redis://u:p@[::ffff:10.0.0.1]",
    "REDIS://H.example.:1",
    "redis-sentinel://s1,s2:26380,[::1],10.0.0.3:1/mymaster",
    "redis-sentinel://bob:pw%2F@s1/my-master_2.x",
};

static void test_format_round_trip(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(round_trip_urls) / sizeof(round_trip_urls[0]); i++) {
        kvg_redis_url a = parse_ok(round_trip_urls[i]);
        char out[FORMAT_MAX];
        kvg_redis_url_format(&a, false, out, sizeof(out));
        kvg_redis_url b = parse_ok(out);
        assert_same_url(&a, &b);
        /* A formatted URL formats to itself. */
        char again[FORMAT_MAX];
        kvg_redis_url_format(&b, false, again, sizeof(again));
        assert_string_equal(out, again);
    }
    /* The form written: ports always, db only when not 0, brackets around IPv6, escapes in
     * upper case. */
    char out[FORMAT_MAX];
    kvg_redis_url u = parse_ok("redis://h");
    kvg_redis_url_format(&u, false, out, sizeof(out));
    assert_string_equal(out, "redis://h:6379");
    u = parse_ok("redis://us%40er:p%2fw@[::1]/0");
    kvg_redis_url_format(&u, false, out, sizeof(out));
    assert_string_equal(out, "redis://us%40er:p%2Fw@[::1]:6379");
    u = parse_ok("redis-sentinel://a,[::2]:5/m");
    kvg_redis_url_format(&u, false, out, sizeof(out));
    assert_string_equal(out, "redis-sentinel://a:26379,[::2]:5/m");
    u = parse_ok("redis://h/9");
    kvg_redis_url_format(&u, false, out, sizeof(out));
    assert_string_equal(out, "redis://h:6379/9");
}

/* Every field at its longest, every credential byte escaped: the URL fits FORMAT_MAX and
 * parses back. */
static void test_format_longest(void **state)
{
    (void)state;
    kvg_redis_url u;
    memset(&u, 0, sizeof(u));
    u.mode = KVG_REDIS_SENTINEL;
    memset(u.user, '%', sizeof(u.user) - 1);
    memset(u.password, '/', sizeof(u.password) - 1);
    for (size_t i = 0; i < KVG_REDIS_SEEDS_MAX; i++) {
        /* 255 bytes, labels of 63. */
        memset(u.seeds[i].host, 'a', KVG_REDIS_HOST_MAX - 1);
        for (size_t dot = 63; dot < KVG_REDIS_HOST_MAX - 1; dot += 64)
            u.seeds[i].host[dot] = '.';
        u.seeds[i].port = 65535;
    }
    u.nseeds = KVG_REDIS_SEEDS_MAX;
    memset(u.master, 'm', sizeof(u.master) - 1);
    char *out = malloc(FORMAT_MAX);
    assert_non_null(out);
    kvg_redis_url_format(&u, false, out, FORMAT_MAX);
    assert_true(strlen(out) < FORMAT_MAX - 1);
    kvg_redis_url back = parse_ok(out);
    assert_same_url(&u, &back);
    free(out);
}

/* The redacted form shows "***" where the password was, never the password itself. */
static void test_format_redacted(void **state)
{
    (void)state;
    static const struct {
        const char *url, *want;
    } cases[] = {
        {"redis://alice:s3cret@h:1/2", "redis://alice:***@h:1/2"},
        {"redis://s3cret@h", "redis://:***@h:6379"},
        {"redis://u:%2A%2A%2A@h", "redis://u:***@h:6379"},
        {"redis-sentinel://u:pw@s1,s2/m", "redis-sentinel://u:***@s1:26379,s2:26379/m"},
        {"redis://h", "redis://h:6379"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvg_redis_url u = parse_ok(cases[i].url);
        char out[FORMAT_MAX];
        kvg_redis_url_format(&u, true, out, sizeof(out));
        assert_string_equal(out, cases[i].want);
        if (u.password[0]) {
            /* Neither the password nor its escaped spelling (the part of the plain form
             * between the user's ':' and the '@'). */
            if (strcmp(u.password, "***") != 0)
                assert_null(strstr(out, u.password));
            char plain[FORMAT_MAX];
            kvg_redis_url_format(&u, false, plain, sizeof(plain));
            char *colon = strchr(strstr(plain, "://") + 3, ':');
            char *at = strchr(plain, '@');
            assert_true(colon && at && colon < at);
            *at = '\0';
            assert_null(strstr(out, colon + 1));
        } else {
            assert_null(strchr(out, '@'));
            assert_null(strstr(out, "***"));
        }
    }
    /* A password of punctuation (escaped): the redacted form is the user and the host. */
    kvg_redis_url u = parse_ok("redis://u:Zq%21%40%23%24%25%5E%26%2A%28%29_%2BZq@h");
    char out[FORMAT_MAX];
    kvg_redis_url_format(&u, true, out, sizeof(out));
    assert_string_equal(out, "redis://u:***@h:6379");
    assert_null(strstr(out, "Zq"));
}

/* len bounds what is written, always NUL-terminated; len 0 writes nothing. */
static void test_format_truncated(void **state)
{
    (void)state;
    kvg_redis_url u = parse_ok("redis://alice:s3cret@h:1/2");
    char out[16];
    memset(out, 'x', sizeof(out));
    kvg_redis_url_format(&u, false, out, 9);
    assert_string_equal(out, "redis://");
    assert_int_equal(out[9], 'x');
    kvg_redis_url_format(&u, false, out, 1);
    assert_string_equal(out, "");
    memset(out, 'x', sizeof(out));
    kvg_redis_url_format(&u, false, out, 0);
    assert_int_equal(out[0], 'x');
}

/* Out of memory while formatting: an empty string, never a partial URL. */
static void test_format_no_memory(void **state)
{
    (void)state;
    kvg_redis_url u = parse_ok("redis://alice:s3cret@h:1/2");
    char out[FORMAT_MAX];
    memset(out, 'x', sizeof(out));
    fail_alloc_nth(0);
    kvg_redis_url_format(&u, false, out, sizeof(out));
    assert_true(fail_alloc_off());
    assert_string_equal(out, "");
    /* The parser allocates nothing: it succeeds with every allocation failing. */
    fail_alloc_nth(0);
    parse_ok("redis-sentinel://u:p@a,b,c/m");
    assert_false(fail_alloc_off());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standalone_defaults),
        cmocka_unit_test(test_standalone_full),
        cmocka_unit_test(test_percent_encoding),
        cmocka_unit_test(test_ipv6),
        cmocka_unit_test(test_sentinel),
        cmocka_unit_test(test_lengths),
        cmocka_unit_test(test_refuse_scheme),
        cmocka_unit_test(test_refuse_host_port),
        cmocka_unit_test(test_refuse_path),
        cmocka_unit_test(test_refuse_credentials),
        cmocka_unit_test(test_refuse_bytes),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_format_round_trip),
        cmocka_unit_test(test_format_longest),
        cmocka_unit_test(test_format_redacted),
        cmocka_unit_test(test_format_truncated),
        cmocka_unit_test(test_format_no_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
