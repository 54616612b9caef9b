/* SPDX-License-Identifier: Apache-2.0 */
/* Test driver of the Redis topology thread, for tests/integration/test_redis_topology.py: runs a
 * kvg_redis on a URL, prints each topology it publishes as a JSON line, and answers commands
 * read from stdin, one per line, with a JSON line each:
 *
 *   connect [KEY]  kvg_redis_connect_blocking (slot of KEY, any primary without), then, with a
 *                  KEY, SET KEY on that connection: {"event":"connect","rc":0,"addr":"h:p",
 *                  "set":"OK" or the error reply} or {"event":"connect","rc":-111,"error":...}
 *   refresh        kvg_redis_refresh_topology: {"event":"refresh"}
 *   wait MS        kvg_redis_wait_topology: {"event":"wait","rc":0,"error":""}
 *   mode           kvg_redis_mode_of: {"event":"mode","mode":"cluster"}
 *   healthy        kvg_redis_healthy: {"event":"healthy","ok":false,"why":...}
 *   slot HEX       redis_key_slot of the key HEX spells: {"event":"slot","slot":12182}
 *   free           kvg_redis_free, timed: {"event":"free","ms":12}, then exits (so does EOF)
 *
 * Topologies: {"event":"topology","generation":N,"mode":...,"nodes":["h:p",...],"error":...,
 * "slots":[[first,last,node index],...]} (slots for a cluster only; unassigned ranges left out).
 *
 *   redis_topology_driver URL [--interval MS] [--connect-timeout MS] [--command-timeout MS]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "redis_int.h"

static void emit(kvg_buf *b)
{
    kvg_buf_putc(b, '\n');
    fwrite(b->data, 1, b->len, stdout);
    fflush(stdout);
    kvg_buf_reset(b);
}

static void put_str(kvg_buf *b, const char *key, const char *value)
{
    kvg_buf_printf(b, ",\"%s\":", key);
    kvg_buf_json_string(b, value, strlen(value));
}

static void print_topology(const redis_topology *t, kvg_buf *b)
{
    kvg_buf_printf(b, "{\"event\":\"topology\",\"generation\":%llu",
                   (unsigned long long)kvg_snapshot_generation(&t->snap));
    put_str(b, "mode", kvg_redis_mode_str(t->mode));
    kvg_buf_puts(b, ",\"nodes\":[");
    for (size_t i = 0; i < t->nnodes; i++) {
        if (i)
            kvg_buf_putc(b, ',');
        kvg_buf_json_string(b, t->nodes[i].name, strlen(t->nodes[i].name));
    }
    kvg_buf_putc(b, ']');
    put_str(b, "error", t->error);
    if (t->slots) {
        kvg_buf_puts(b, ",\"slots\":[");
        bool first = true;
        for (size_t s = 0; s < REDIS_SLOTS;) {
            size_t e = s;
            while (e + 1 < REDIS_SLOTS && t->slots[e + 1] == t->slots[s])
                e++;
            if (t->slots[s] != REDIS_NO_NODE) {
                kvg_buf_printf(b, "%s[%zu,%zu,%u]", first ? "" : ",", s, e, t->slots[s]);
                first = false;
            }
            s = e + 1;
        }
        kvg_buf_putc(b, ']');
    }
    kvg_buf_putc(b, '}');
    emit(b);
}

/* The peer of a connection, as the topology names nodes. */
static void peer_name(int fd, char *out, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[64] = "?";
    unsigned port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
            port = ntohs(a->sin6_port);
        } else {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
            port = ntohs(a->sin_port);
        }
    }
    snprintf(out, len, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
}

static void do_connect(kvg_redis *r, const char *key, uint32_t timeout_ms, kvg_buf *b)
{
    char msg[512] = "";
    redisContext *c = NULL;
    int rc =
        kvg_redis_connect_blocking(r, key, key ? strlen(key) : 0, timeout_ms, &c, msg, sizeof(msg));
    kvg_buf_printf(b, "{\"event\":\"connect\",\"rc\":%d", rc);
    if (key)
        put_str(b, "key", key);
    if (rc < 0) {
        put_str(b, "error", msg);
    } else {
        char addr[96];
        peer_name(c->fd, addr, sizeof(addr));
        put_str(b, "addr", addr);
        if (key) {
            redisReply *reply = redisCommand(c, "SET %s driver", key);
            if (!reply)
                put_str(b, "set", c->errstr);
            else if (reply->type == REDIS_REPLY_STATUS || reply->type == REDIS_REPLY_ERROR)
                put_str(b, "set", reply->str);
            else
                put_str(b, "set", "unexpected reply");
            if (reply)
                freeReplyObject(reply);
        }
        redisFree(c);
    }
    kvg_buf_putc(b, '}');
    emit(b);
}

/* One command line; false to exit. */
static bool command(kvg_redis **rp, char *line, uint32_t timeout_ms, kvg_buf *b)
{
    kvg_redis *r = *rp;
    char *arg = strchr(line, ' ');
    if (arg)
        *arg++ = '\0';
    if (strcmp(line, "connect") == 0) {
        do_connect(r, arg && *arg ? arg : NULL, timeout_ms, b);
    } else if (strcmp(line, "refresh") == 0) {
        kvg_redis_refresh_topology(r);
        kvg_buf_puts(b, "{\"event\":\"refresh\"}");
        emit(b);
    } else if (strcmp(line, "wait") == 0) {
        char msg[512] = "";
        int rc = kvg_redis_wait_topology(r, arg ? (uint32_t)atoi(arg) : 1000, msg, sizeof(msg));
        kvg_buf_printf(b, "{\"event\":\"wait\",\"rc\":%d", rc);
        put_str(b, "error", msg);
        kvg_buf_putc(b, '}');
        emit(b);
    } else if (strcmp(line, "mode") == 0) {
        kvg_buf_puts(b, "{\"event\":\"mode\"");
        put_str(b, "mode", kvg_redis_mode_str(kvg_redis_mode_of(r)));
        kvg_buf_putc(b, '}');
        emit(b);
    } else if (strcmp(line, "healthy") == 0) {
        char why[512];
        bool ok = kvg_redis_healthy(r, why, sizeof(why));
        kvg_buf_printf(b, "{\"event\":\"healthy\",\"ok\":%s", ok ? "true" : "false");
        put_str(b, "why", why);
        kvg_buf_putc(b, '}');
        emit(b);
    } else if (strcmp(line, "slot") == 0) {
        char key[1024];
        size_t n = 0;
        for (const char *h = arg ? arg : ""; h[0] && h[1] && n < sizeof(key); h += 2)
            key[n++] = (char)(kvg_hex_digit(h[0]) << 4 | kvg_hex_digit(h[1]));
        kvg_buf_printf(b, "{\"event\":\"slot\",\"slot\":%u}", redis_key_slot(key, n));
        emit(b);
    } else if (strcmp(line, "free") == 0) {
        uint64_t t0 = kvg_now_ns();
        kvg_redis_free(r);
        *rp = NULL;
        kvg_buf_printf(b, "{\"event\":\"free\",\"ms\":%llu}",
                       (unsigned long long)((kvg_now_ns() - t0) / 1000000));
        emit(b);
        return false;
    } else if (line[0]) {
        kvg_buf_puts(b, "{\"event\":\"unknown\"");
        put_str(b, "command", line);
        kvg_buf_putc(b, '}');
        emit(b);
    }
    return true;
}

int main(int argc, char **argv)
{
    kvg_redis_config cfg = {0};
    uint32_t connect_ms = 2000;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--interval") == 0)
            cfg.topology_interval_ms = (uint32_t)atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--connect-timeout") == 0)
            connect_ms = cfg.connect_timeout_ms = (uint32_t)atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--command-timeout") == 0)
            cfg.command_timeout_ms = (uint32_t)atoi(argv[++i]);
        else if (!cfg.url && argv[i][0] != '-')
            cfg.url = argv[i];
        else {
            fprintf(stderr,
                    "usage: %s URL [--interval MS] [--connect-timeout MS] "
                    "[--command-timeout MS]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!cfg.url) {
        fprintf(stderr, "%s: a URL is needed\n", argv[0]);
        return 2;
    }
    kvg_log_set_level(KVG_LOG_DEBUG);
    kvg_redis *r;
    char msg[512];
    int rc = kvg_redis_new(&cfg, &r, msg, sizeof(msg));
    if (rc < 0) {
        fprintf(stderr, "kvg_redis_new: %s (%s)\n", msg, kvg_strerror(rc));
        return 1;
    }
    kvg_buf b;
    kvg_buf_init(&b);
    uint64_t shown = 0;
    char in[4096];
    size_t have = 0;
    bool running = true;
    while (running) {
        redis_topology *t = redis_topology_acquire(r);
        if (kvg_snapshot_generation(&t->snap) != shown) {
            shown = kvg_snapshot_generation(&t->snap);
            print_topology(t, &b);
        }
        kvg_snapshot_unref(&t->snap);
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        if (poll(&pfd, 1, 5) <= 0)
            continue;
        ssize_t n = read(STDIN_FILENO, in + have, sizeof(in) - 1 - have);
        if (n <= 0)
            break;
        have += (size_t)n;
        char *nl;
        while (running && (nl = memchr(in, '\n', have))) {
            *nl = '\0';
            running = command(&r, in, connect_ms, &b);
            have -= (size_t)(nl + 1 - in);
            memmove(in, nl + 1, have);
        }
        if (have == sizeof(in) - 1)
            have = 0; /* a line too long for a command */
    }
    kvg_redis_free(r);
    kvg_buf_done(&b);
    return 0;
}
