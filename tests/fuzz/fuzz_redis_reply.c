/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the readers of Redis replies, on any reply tree. The input is RESP, as a server
 * would send it, read by hiredis's own reader (redisReader) into redisReply trees; each reply
 * goes to every reader of router/: the prefix map's lookup (redis_map_parse_lookup), CLUSTER
 * SLOTS (redis_cluster_parse_slots), SENTINEL get-master-addr-by-name
 * (redis_sentinel_parse_addr), +switch-master (redis_sentinel_is_switch) and ROLE (topo_role).
 * Each must refuse what is malformed without writing its outputs, and what it accepts must keep
 * the invariants its callers rely on.
 *
 * Host names in CLUSTER SLOTS are resolved by topo_resolve, which would ask DNS: the target links
 * with -Wl,--wrap=topo_resolve and resolves names to made-up addresses (or fails them), numeric
 * addresses as the real one does. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "redis_topology_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int __real_topo_resolve(const char *host, uint16_t port, redis_node *out, size_t max, size_t *n,
                        char *msg, size_t msg_len);
int __wrap_topo_resolve(const char *host, uint16_t port, redis_node *out, size_t max, size_t *n,
                        char *msg, size_t msg_len);

static void check(bool ok)
{
    if (!ok)
        abort();
}

static bool numeric(const char *host)
{
    unsigned char a[16];
    return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

int __wrap_topo_resolve(const char *host, uint16_t port, redis_node *out, size_t max, size_t *n,
                        char *msg, size_t msg_len)
{
    if (numeric(host))
        return __real_topo_resolve(host, port, out, max, n, msg, msg_len);
    /* A name: one made-up address from its hash, or (one name in four) no address at all. */
    uint32_t h = 2166136261u;
    for (const char *p = host; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    if (h % 4 == 0 || max == 0) {
        snprintf(msg, msg_len, "%.200s: Name or service not known", host);
        return -EHOSTUNREACH;
    }
    snprintf(out[0].host, sizeof(out[0].host), "198.18.%u.%u", (h >> 8) & 1, h & 3);
    out[0].port = port;
    snprintf(out[0].name, sizeof(out[0].name), "%s:%u", out[0].host, port);
    *n = 1;
    return 0;
}

static bool plain_string(const redisReply *r)
{
    return r->type == REDIS_REPLY_STRING && strlen(r->str) == r->len;
}

static void lookup(const redisReply *reply)
{
    size_t n = reply->type == REDIS_REPLY_ARRAY ? reply->elements : 3;
    uint32_t matched[64];
    if (n > 64)
        n = 64;
    memset(matched, 0xa5, sizeof(matched));
    int rc = redis_map_parse_lookup(reply, n, matched);
    if (rc != 0) {
        check(rc == KVG_EPROTO);
        for (size_t i = 0; i < 64; i++)
            check(matched[i] == 0xa5a5a5a5u);
    } else {
        check(reply->type == REDIS_REPLY_ARRAY && reply->elements == n);
        for (size_t i = 0; i < n; i++)
            check(reply->element[i]->type == REDIS_REPLY_INTEGER &&
                  (long long)matched[i] == reply->element[i]->integer);
    }
    /* One worker more or fewer than the reply has is the wrong shape. */
    if (reply->type == REDIS_REPLY_ARRAY)
        check(redis_map_parse_lookup(reply, reply->elements + 1, matched) == KVG_EPROTO);
}

static void cluster_slots(const redisReply *reply, const redis_node *asked)
{
    redis_topology *t = NULL;
    size_t unassigned = 12345;
    char msg[256] = "";
    int rc = redis_cluster_parse_slots(reply, asked, &t, &unassigned, msg, sizeof(msg));
    if (rc != 0) {
        check(rc == KVG_EPROTO || rc == -EHOSTUNREACH || rc == -ENOMEM);
        check(t == NULL && unassigned == 12345 && msg[0]);
        return;
    }
    check(reply->type == REDIS_REPLY_ARRAY);
    check(t && t->mode == KVG_REDIS_CLUSTER && t->slots);
    check(t->nnodes <= reply->elements && t->nnodes <= TOPO_CLUSTER_NODES_MAX);
    /* Every range names its primary by a string without a NUL in it: a server's "10.0.0.1\0x"
     * is malformed, not 10.0.0.1. */
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *ep = reply->element[i]->element[2]->element[0];
        check(ep->type == REDIS_REPLY_NIL || plain_string(ep));
        for (size_t c = 0; ep->type != REDIS_REPLY_NIL && c < ep->len; c++)
            check(ep->str[c] > ' ' && ep->str[c] < 0x7f);
    }
    size_t none = 0, owned[TOPO_CLUSTER_NODES_MAX] = {0};
    for (size_t s = 0; s < REDIS_SLOTS; s++) {
        if (t->slots[s] == REDIS_NO_NODE) {
            none++;
            continue;
        }
        check(t->slots[s] < t->nnodes);
        owned[t->slots[s]]++;
    }
    check(none == unassigned);
    for (size_t i = 0; i < t->nnodes; i++) {
        const redis_node *node = &t->nodes[i];
        check(owned[i] > 0 && node->port != 0 && numeric(node->host));
        char name[sizeof(node->name)];
        snprintf(name, sizeof(name), strchr(node->host, ':') ? "[%s]:%u" : "%s:%u", node->host,
                 node->port);
        check(strcmp(name, node->name) == 0);
        for (size_t j = 0; j < i; j++)
            check(strcmp(t->nodes[j].name, node->name) != 0);
    }
    redis_topology_free(&t->snap);
}

static void sentinel_addr(const redisReply *reply)
{
    char host[KVG_REDIS_HOST_MAX];
    memset(host, 'x', sizeof(host));
    uint16_t port = 7;
    char msg[256] = "";
    int rc = redis_sentinel_parse_addr(reply, "127.0.0.1:26379", "mymaster", host, sizeof(host),
                                       &port, msg, sizeof(msg));
    if (rc != 0) {
        check(rc == -ENOENT || rc == KVG_EPROTO);
        check(host[0] == 'x' && port == 7 && msg[0]);
        return;
    }
    check(reply->type == REDIS_REPLY_ARRAY && reply->elements == 2);
    const redisReply *h = reply->element[0], *p = reply->element[1];
    /* The address whole (no NUL cutting it short), the port exactly a decimal number. */
    check(plain_string(h) && h->len > 0 && strcmp(host, h->str) == 0);
    for (size_t i = 0; i < h->len; i++)
        check(h->str[i] > ' ' && h->str[i] < 0x7f);
    check(plain_string(p) && p->len > 0 && p->len <= 5);
    unsigned long want = 0;
    for (size_t i = 0; i < p->len; i++) {
        check(p->str[i] >= '0' && p->str[i] <= '9');
        want = want * 10 + (unsigned long)(p->str[i] - '0');
    }
    check(port != 0 && port == want);
}

static void switch_master(const redisReply *reply)
{
    static const char master[] = "mymaster";
    if (!redis_sentinel_is_switch(reply, master))
        return;
    check(reply->type == REDIS_REPLY_ARRAY && reply->elements == 3);
    const char *text = reply->element[2]->str;
    check(strncmp(text, master, strlen(master)) == 0);
    check(text[strlen(master)] == ' ' || text[strlen(master)] == '\0');
}

static void role(const redisReply *reply)
{
    char primary[96];
    memset(primary, 'x', sizeof(primary));
    const char *r = topo_role(reply, primary, sizeof(primary));
    check(memchr(primary, '\0', sizeof(primary)) != NULL);
    if (!r)
        return;
    check(strcmp(r, "master") == 0 || strcmp(r, "slave") == 0 || strcmp(r, "sentinel") == 0);
    check(strcmp(r, "slave") == 0 || primary[0] == '\0');
}

/* hiredis 0.14 allocates a multi-bulk's element array when it reads the count: "*999999999"
 * alone would take gigabytes. Real replies are bounded by what the server holds; inputs
 * announcing more than this many elements are skipped. */
#define ELEMENTS_MAX 65536

static bool counts_bounded(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        if (data[i] != '*')
            continue;
        unsigned long long n = 0;
        for (size_t j = i + 1; j < size && data[j] >= '0' && data[j] <= '9'; j++)
            if ((n = n * 10 + (data[j] - '0')) > ELEMENTS_MAX)
                return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!counts_bounded(data, size))
        return 0;
    redisReader *reader = redisReaderCreate();
    if (!reader)
        return 0;
    /* A server answering over IPv6, or over IPv4, asked: "" and NIL endpoints mean its host. */
    static const redis_node asked4 = {"10.0.0.1", 6379, "10.0.0.1:6379"};
    static const redis_node asked6 = {"fd00::1", 6379, "[fd00::1]:6379"};
    const redis_node *asked = size % 2 ? &asked6 : &asked4;
    if (redisReaderFeed(reader, (const char *)data, size) == REDIS_OK) {
        for (;;) {
            void *got = NULL;
            if (redisReaderGetReply(reader, &got) != REDIS_OK || !got)
                break;
            const redisReply *reply = got;
            lookup(reply);
            cluster_slots(reply, asked);
            sentinel_addr(reply);
            switch_master(reply);
            role(reply);
            freeReplyObject(got);
        }
    }
    redisReaderFree(reader);
    return 0;
}
