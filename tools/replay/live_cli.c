/* SPDX-License-Identifier: Apache-2.0 */
/* Live mode's flags (and the trace slice, which offline mode shares), kept out of main.c. */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CONNECTIONS 4
#define DEFAULT_H1_MAX 256
#define DEFAULT_TIMEOUT_MS 600000
#define MAX_KEYS 100000

const char replay_live_usage[] =
    "\n"
    "Slice (both modes):\n"
    "  --first N                  start at the N-th request in arrival order (default 0); the\n"
    "                             slice's arrivals count from its first request\n"
    "  --requests N               take N requests (default: all)\n"
    "\n"
    "Live mode (docs/replay.md, \"Live mode\"): send the trace through a running gateway at its\n"
    "arrival times and add a row \"live\" measured from the workers' reported cached tokens:\n"
    "  --live URL                 http://HOST:PORT[/PATH] of the gateway\n"
    "  --http 2|1.1|mixed         protocol (default 2; mixed: even requests h2, odd HTTP/1.1)\n"
    "  --connections N            HTTP/2 connections, streams round robin (default 4)\n"
    "  --h1-connections N         HTTP/1.1 connections at most (default 256)\n"
    "  --tenants N                tenant = chain key of block --tenant-block mod N (default 1)\n"
    "  --tenant-block K           which block picks the tenant (default 0, the first: keeps\n"
    "                             requests that share anything in one tenant)\n"
    "  --api-key KEY              a key (repeatable); tenant t sends key t mod the keys\n"
    "  --api-keys FILE            keys, one a line\n"
    "  --model NAME               model field (default sim-model)\n"
    "  --max-tokens N             cap of the trace's output_length (default: none)\n"
    "  --timeout-ms N             per request (default 600000)\n"
    "  --quiet                    no progress lines on stderr\n";

void replay_live_options_init(replay_live_options *o)
{
    memset(o, 0, sizeof(*o));
    o->cfg.http = REPLAY_LIVE_H2;
    o->cfg.connections = DEFAULT_CONNECTIONS;
    o->cfg.h1_max = DEFAULT_H1_MAX;
    o->cfg.tenants = 1;
    o->cfg.model = "sim-model";
    o->cfg.timeout_ms = DEFAULT_TIMEOUT_MS;
}

void replay_live_options_done(replay_live_options *o)
{
    for (size_t i = 0; i < o->nkeys; i++)
        free(o->keys[i]);
    free(o->keys);
    o->keys = NULL;
    o->nkeys = 0;
}

static int parse_count(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < min || v > max)
        return KVG_ECONFIG;
    *out = v;
    return 0;
}

/* A key goes into a header: printable ASCII without spaces. */
static int add_key(replay_live_options *o, const char *k, size_t len)
{
    if (len == 0 || len > 1024)
        return KVG_ECONFIG;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] >= 0x7f)
            return KVG_ECONFIG;
    if (o->nkeys == MAX_KEYS)
        return KVG_ECONFIG;
    char **v = realloc(o->keys, (o->nkeys + 1) * sizeof(*v));
    if (!v)
        return -ENOMEM;
    o->keys = v;
    if (!(v[o->nkeys] = strndup(k, len)))
        return -ENOMEM;
    o->nkeys++;
    o->cfg.keys = (const char *const *)o->keys;
    o->cfg.nkeys = o->nkeys;
    return 0;
}

static int read_keys(replay_live_options *o, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvgate-replay: --api-keys %s: %s\n", path, strerror(errno));
        return KVG_ECONFIG;
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            len--;
        if (len == 0)
            continue;
        rc = add_key(o, line, (size_t)len);
        if (rc == KVG_ECONFIG)
            fprintf(stderr, "kvgate-replay: --api-keys %s:%zu: not a key (printable, no spaces)\n",
                    path, lineno);
    }
    free(line);
    fclose(f);
    if (rc == 0 && !o->nkeys) {
        fprintf(stderr, "kvgate-replay: --api-keys %s: no keys\n", path);
        rc = KVG_ECONFIG;
    }
    return rc;
}

int replay_live_option(replay_live_options *o, int opt, const char *arg)
{
    static const char *const names[] = {
        "live",     "http",  "connections", "h1-connections", "tenants", "tenant-block", "api-key",
        "api-keys", "model", "max-tokens",  "timeout-ms",     "first",   "requests",     "quiet",
    };
    replay_live_config *c = &o->cfg;
    uint64_t v = 0;
    int rc = 0;
    switch (opt - REPLAY_LIVE_OPT_BASE) {
    case 0:
        c->url = arg;
        break;
    case 1:
        rc = replay_live_http_parse(arg, &c->http);
        break;
    case 2:
        rc = parse_count(arg, 1, 1024, &v);
        c->connections = (uint32_t)v;
        break;
    case 3:
        rc = parse_count(arg, 1, 65536, &v);
        c->h1_max = (uint32_t)v;
        break;
    case 4:
        rc = parse_count(arg, 1, 1u << 20, &v);
        c->tenants = (uint32_t)v;
        break;
    case 5:
        rc = parse_count(arg, 0, UINT32_MAX, &v);
        c->tenant_block = (uint32_t)v;
        break;
    case 6:
        rc = add_key(o, arg, strlen(arg));
        break;
    case 7:
        rc = read_keys(o, arg);
        if (rc == KVG_ECONFIG)
            return rc; /* said */
        break;
    case 8:
        /* The name goes into JSON as it is: a plain token. */
        rc = arg[0] && strlen(arg) < 256 &&
                     strspn(arg, "abcdefghijklmnopqrstuvwxyz"
                                 "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/:@+") == strlen(arg)
                 ? 0
                 : KVG_ECONFIG;
        c->model = arg;
        break;
    case 9:
        rc = parse_count(arg, 1, 1u << 24, &v);
        c->max_tokens = (uint32_t)v;
        break;
    case 10:
        rc = parse_count(arg, 1, 86400000, &v);
        c->timeout_ms = (uint32_t)v;
        break;
    case 11:
        rc = parse_count(arg, 0, SIZE_MAX / 2, &v);
        o->first = (size_t)v;
        break;
    case 12:
        rc = parse_count(arg, 1, SIZE_MAX / 2, &v);
        o->count = (size_t)v;
        break;
    case 13:
        c->quiet = true;
        break;
    default:
        return KVG_ECONFIG;
    }
    if (rc == KVG_ECONFIG) {
        size_t i = (size_t)(opt - REPLAY_LIVE_OPT_BASE);
        fprintf(stderr, "kvgate-replay: bad value for --%s: \"%s\"\n",
                i < KVG_ARRAY_LEN(names) ? names[i] : "?", arg ? arg : "");
    } else if (rc < 0) {
        fprintf(stderr, "kvgate-replay: %s\n", kvg_strerror(rc));
    }
    return rc;
}
