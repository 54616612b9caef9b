/* SPDX-License-Identifier: Apache-2.0 */
/* The prefix map in Redis: the scripts' latency and Redis CPU per call against a naive
 * pipelined read of every key in the same run (default), the memory per entry of each key layout
 * (--memory). Run by bench/redis, which starts the redis-server. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "common.h"
#include "redis_int.h"

static redisContext *rc;
static uint64_t rng_state = 42;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void die(const char *what, const redisReply *r)
{
    fprintf(stderr, "redis_bench: %s: %s\n", what,
            r && r->type == REDIS_REPLY_ERROR ? r->str : rc->errstr);
    exit(1);
}

static redisReply *get_reply(const char *what)
{
    void *r = NULL;
    if (redisGetReply(rc, &r) != REDIS_OK || !r)
        die(what, NULL);
    if (((redisReply *)r)->type == REDIS_REPLY_ERROR)
        die(what, r);
    return r;
}

static redisReply *command(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    if (!r || r->type == REDIS_REPLY_ERROR)
        die(fmt, r);
    return r;
}

/* A field of an INFO section ("used_memory", "cmdstat_evalsha" ... "usec"), as a number. */
static double info_field(const char *section, const char *field, const char *sub)
{
    redisReply *r = command("INFO %s", section);
    double v = 0;
    char pat[128];
    snprintf(pat, sizeof(pat), "\n%s:", field);
    const char *p = strstr(r->str, pat);
    if (p) {
        p += strlen(pat);
        if (sub) {
            char s[64];
            snprintf(s, sizeof(s), "%s=", sub);
            const char *q = strstr(p, s);
            const char *eol = strchr(p, '\r');
            p = q && (!eol || q < eol) ? q + strlen(s) : NULL;
        }
        if (p)
            v = strtod(p, NULL);
    }
    freeReplyObject(r);
    return v;
}

static double redis_cpu_s(void)
{
    return info_field("cpu", "used_cpu_user", NULL) + info_field("cpu", "used_cpu_sys", NULL);
}

/* ---- the scripts, sent as the gateway sends them ----------------------------------------------
 */

typedef struct args {
    const char **v;
    size_t *len;
    size_t n, cap;
} args;

static void args_push(args *a, const void *p, size_t len)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 16;
        a->v = realloc(a->v, a->cap * sizeof(*a->v));
        a->len = realloc(a->len, a->cap * sizeof(*a->len));
        if (!a->v || !a->len)
            abort();
    }
    a->v[a->n] = p;
    a->len[a->n++] = len;
}

static void args_send(args *a)
{
    if (redisAppendCommandArgv(rc, (int)a->n, a->v, a->len) != REDIS_OK)
        die("append", NULL);
    a->n = 0;
}

/* Keys of the workers (standalone layout) and a buffer for a packed chain. */
#define WORKERS_MAX 64
static char (*names)[REDIS_MAP_KEY_MAX];
static unsigned char *packbuf;
static args av;

static void append_lookup(size_t nw, const uint64_t *chain, size_t n)
{
    static char numkeys[16];
    snprintf(numkeys, sizeof(numkeys), "%zu", nw);
    redis_map_pack_keys(chain, n, packbuf);
    args_push(&av, "EVALSHA", 7);
    args_push(&av, redis_map_lookup_script.sha, 40);
    args_push(&av, numkeys, strlen(numkeys));
    for (size_t w = 0; w < nw; w++)
        args_push(&av, names[w], strlen(names[w]));
    args_push(&av, packbuf, 8 * n);
    args_send(&av);
}

static void append_record(const char *key, uint32_t cap, const uint64_t *chain, size_t n)
{
    static char capbuf[16];
    snprintf(capbuf, sizeof(capbuf), "%" PRIu32, cap);
    redis_map_pack_keys(chain, n, packbuf);
    const char *ttl = "86400000";
    args_push(&av, "EVALSHA", 7);
    args_push(&av, redis_map_record_script.sha, 40);
    args_push(&av, "1", 1);
    args_push(&av, key, strlen(key));
    args_push(&av, capbuf, strlen(capbuf));
    args_push(&av, ttl, strlen(ttl));
    args_push(&av, packbuf, 8 * n);
    args_send(&av);
}

static void load_scripts(void)
{
    freeReplyObject(command("SCRIPT LOAD %s", redis_map_lookup_script.body));
    freeReplyObject(command("SCRIPT LOAD %s", redis_map_record_script.body));
}

/* Records pipelined in batches, replies dropped. */
#define PIPE 32
static size_t pending;

static void drain(size_t keep)
{
    while (pending > keep) {
        freeReplyObject(get_reply("pipelined record"));
        pending--;
    }
}

static void record_async(const char *key, uint32_t cap, const uint64_t *chain, size_t n)
{
    append_record(key, cap, chain, n);
    pending++;
    drain(PIPE);
}

/* ---- latency -----------------------------------------------------------------------------------
 */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct timing {
    double p50_us, p99_us;
    double cpu_us; /* Redis process CPU (user + sys) per call */
    double cmd_us; /* INFO commandstats time per call */
    size_t calls;
} timing;

static timing summarize(uint64_t *ns, size_t n, double cpu_s, double cmd_usec)
{
    qsort(ns, n, sizeof(*ns), cmp_u64);
    timing t = {
        .p50_us = ns[n / 2] / 1e3,
        .p99_us = ns[KVG_MIN(n - 1, (size_t)ceil(0.99 * (double)n) - 1)] / 1e3,
        .cpu_us = cpu_s * 1e6 / (double)n,
        .cmd_us = cmd_usec / (double)n,
        .calls = n,
    };
    return t;
}

/* Background: each worker holds BG_CHAINS other chains of BG_LEN keys besides its part of the
 * chain under test, so that its set is of a realistic size. */
#define BG_CHAINS 16
#define BG_LEN 256

typedef struct cell {
    size_t blocks, workers;
    timing lookup, naive, record, naive_record;
} cell;

static void lookup_cell(cell *c, size_t iters)
{
    size_t L = c->blocks, W = c->workers;
    uint32_t cap = BG_CHAINS * BG_LEN + (uint32_t)L;
    freeReplyObject(command("FLUSHALL"));
    uint64_t *chain = malloc(L * sizeof(*chain));
    uint32_t *depth = calloc(W, sizeof(*depth));
    uint64_t *bg = malloc(BG_LEN * sizeof(*bg));
    for (size_t i = 0; i < L; i++)
        chain[i] = rnd();
    /* What each worker holds of the chain: worker 0 all of it, one in four none (not even the
     * first key: one probe), the others a prefix of random depth. Recorded tail first, like
     * conversations that grew turn by turn. */
    for (size_t w = 0; w < W; w++) {
        redis_map_key(names[w], "bench", KVG_REDIS_STANDALONE, 0, 0x1000 + w);
        depth[w] = w == 0 ? (uint32_t)L : w % 4 == 3 ? 0 : 1 + (uint32_t)(rnd() % L);
        for (size_t b = 0; b < BG_CHAINS; b++) {
            for (size_t i = 0; i < BG_LEN; i++)
                bg[i] = rnd();
            record_async(names[w], cap, bg, BG_LEN);
        }
        if (depth[w])
            record_async(names[w], cap, chain, depth[w]);
    }
    drain(0);

    uint64_t *ns = malloc(iters * sizeof(*ns));
    /* The script: one round trip, one call. */
    freeReplyObject(command("CONFIG RESETSTAT"));
    double cpu0 = redis_cpu_s();
    for (size_t it = 0; it < iters; it++) {
        uint64_t t0 = kvg_now_ns();
        append_lookup(W, chain, L);
        redisReply *r = get_reply("lookup");
        ns[it] = kvg_now_ns() - t0;
        uint32_t m[WORKERS_MAX];
        if (redis_map_parse_lookup(r, W, m) != 0)
            die("lookup reply", r);
        for (size_t w = 0; w < W; w++)
            if (m[w] != depth[w]) {
                fprintf(stderr, "redis_bench: worker %zu matched %u, holds %u\n", w, m[w],
                        depth[w]);
                exit(1);
            }
        freeReplyObject(r);
    }
    double cpu1 = redis_cpu_s();
    c->lookup =
        summarize(ns, iters, cpu1 - cpu0, info_field("commandstats", "cmdstat_evalsha", "usec"));

    /* Naive: ZSCORE of every key for every worker, all pipelined in one round trip; the depth
     * is the leading run of answers. */
    size_t niters = KVG_MAX((size_t)5, KVG_MIN(iters, (size_t)(400000 / (W * L))));
    unsigned char *members = malloc(8 * L);
    redis_map_pack_keys(chain, L, members);
    freeReplyObject(command("CONFIG RESETSTAT"));
    cpu0 = redis_cpu_s();
    for (size_t it = 0; it < niters; it++) {
        uint64_t t0 = kvg_now_ns();
        for (size_t w = 0; w < W; w++)
            for (size_t i = 0; i < L; i++) {
                args_push(&av, "ZSCORE", 6);
                args_push(&av, names[w], strlen(names[w]));
                args_push(&av, members + 8 * i, 8);
                args_send(&av);
            }
        for (size_t w = 0; w < W; w++) {
            uint32_t d = 0;
            bool run = true;
            for (size_t i = 0; i < L; i++) {
                redisReply *r = get_reply("zscore");
                run = run && r->type == REDIS_REPLY_STRING;
                d += run;
                freeReplyObject(r);
            }
            if (d != depth[w]) {
                fprintf(stderr, "redis_bench: naive: worker %zu matched %u, holds %u\n", w, d,
                        depth[w]);
                exit(1);
            }
        }
        ns[it] = kvg_now_ns() - t0;
    }
    cpu1 = redis_cpu_s();
    c->naive =
        summarize(ns, niters, cpu1 - cpu0, info_field("commandstats", "cmdstat_zscore", "usec"));

    /* Record: a conversation's next turn on a full worker: the chain's first half (held) and a
     * new second half, so every call evicts L/2 entries. Naive: one ZADD of the chain with
     * client-made scores and a trim by rank, pipelined (no exact LRU order, no eviction count). */
    uint64_t *turn = malloc(L * sizeof(*turn));
    memcpy(turn, chain, L * sizeof(*turn));
    for (int naive = 0; naive < 2; naive++) {
        freeReplyObject(command("CONFIG RESETSTAT"));
        cpu0 = redis_cpu_s();
        for (size_t it = 0; it < iters; it++) {
            for (size_t i = L / 2; i < L; i++)
                turn[i] = rnd();
            const char *key = names[it % W];
            uint64_t t0 = kvg_now_ns();
            if (!naive) {
                append_record(key, cap, turn, L);
                freeReplyObject(get_reply("record"));
            } else {
                static uint64_t clock = UINT64_C(1) << 40;
                char(*sc)[24] = malloc(L * sizeof(*sc));
                redis_map_pack_keys(turn, L, packbuf);
                args_push(&av, "ZADD", 4);
                args_push(&av, key, strlen(key));
                for (size_t i = L; i-- > 0;) {
                    snprintf(sc[i], sizeof(sc[i]), "%" PRIu64, ++clock);
                    args_push(&av, sc[i], strlen(sc[i]));
                    args_push(&av, packbuf + 8 * i, 8);
                }
                args_send(&av);
                free(sc);
                char trim[24];
                snprintf(trim, sizeof(trim), "%" PRId64, -(int64_t)cap - 1);
                if (redisAppendCommand(rc, "ZREMRANGEBYRANK %s 0 %s", key, trim) != REDIS_OK ||
                    redisAppendCommand(rc, "PEXPIRE %s 86400000", key) != REDIS_OK)
                    die("append", NULL);
                for (int k = 0; k < 3; k++)
                    freeReplyObject(get_reply("naive record"));
            }
            ns[it] = kvg_now_ns() - t0;
        }
        cpu1 = redis_cpu_s();
        double cmd = naive ? info_field("commandstats", "cmdstat_zadd", "usec") +
                                 info_field("commandstats", "cmdstat_zremrangebyrank", "usec") +
                                 info_field("commandstats", "cmdstat_pexpire", "usec")
                           : info_field("commandstats", "cmdstat_evalsha", "usec");
        timing t = summarize(ns, iters, cpu1 - cpu0, cmd);
        if (naive)
            c->naive_record = t;
        else
            c->record = t;
    }
    free(turn);
    free(members);
    free(ns);
    free(bg);
    free(depth);
    free(chain);
}

static void run_latency(bool quick)
{
    static const size_t blocks[] = {16, 256, 2048};
    static const size_t workers[] = {8, WORKERS_MAX};
    cell cells[6];
    size_t nc = 0;
    for (size_t b = 0; b < KVG_ARRAY_LEN(blocks); b++)
        for (size_t w = 0; w < KVG_ARRAY_LEN(workers); w++) {
            cell *c = &cells[nc++];
            *c = (cell){.blocks = blocks[b], .workers = workers[w]};
            size_t iters = quick ? 50 : blocks[b] >= 2048 ? 400 : 2000;
            fprintf(stderr, "redis_bench: %zu blocks, %zu workers\n", c->blocks, c->workers);
            lookup_cell(c, iters);
        }
    printf("lookup: one EVALSHA (doubling + bisection per worker) vs naive pipelined ZSCORE of "
           "every key for every worker (µs; cpu = Redis user+sys per call, cmd = commandstats)\n");
    printf("%-7s %-8s %9s %9s %9s %9s   %9s %9s %9s %9s   %7s %7s\n", "blocks", "workers", "p50",
           "p99", "cpu", "cmd", "naive_p50", "naive_p99", "naive_cpu", "naive_cmd", "p50_x",
           "cpu_x");
    for (size_t i = 0; i < nc; i++) {
        cell *c = &cells[i];
        printf("%-7zu %-8zu %9.1f %9.1f %9.1f %9.1f   %9.1f %9.1f %9.1f %9.1f   %7.1f %7.1f\n",
               c->blocks, c->workers, c->lookup.p50_us, c->lookup.p99_us, c->lookup.cpu_us,
               c->lookup.cmd_us, c->naive.p50_us, c->naive.p99_us, c->naive.cpu_us, c->naive.cmd_us,
               c->naive.p50_us / c->lookup.p50_us, c->naive.cpu_us / c->lookup.cpu_us);
    }
    printf("\nrecord: one EVALSHA (exact LRU, eviction count) on a full worker, half the chain "
           "new, vs naive pipelined ZADD + ZREMRANGEBYRANK + PEXPIRE (µs)\n");
    printf("%-7s %-8s %9s %9s %9s %9s   %9s %9s %9s %9s   %7s %7s\n", "blocks", "workers", "p50",
           "p99", "cpu", "cmd", "naive_p50", "naive_p99", "naive_cpu", "naive_cmd", "p50_x",
           "cpu_x");
    for (size_t i = 0; i < nc; i++) {
        cell *c = &cells[i];
        printf("%-7zu %-8zu %9.1f %9.1f %9.1f %9.1f   %9.1f %9.1f %9.1f %9.1f   %7.2f %7.2f\n",
               c->blocks, c->workers, c->record.p50_us, c->record.p99_us, c->record.cpu_us,
               c->record.cmd_us, c->naive_record.p50_us, c->naive_record.p99_us,
               c->naive_record.cpu_us, c->naive_record.cmd_us,
               c->naive_record.p50_us / c->record.p50_us,
               c->naive_record.cpu_us / c->record.cpu_us);
    }
}

/* ---- memory ------------------------------------------------------------------------------------
 */

/* Sum of MEMORY USAGE (all elements counted: SAMPLES 0) over every key, by SCAN. */
static double memory_usage_sum(size_t *nkeys)
{
    char cursor[32] = "0";
    double sum = 0;
    *nkeys = 0;
    do {
        redisReply *r = command("SCAN %s COUNT 1000", cursor);
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        redisReply *ks = r->element[1];
        for (size_t i = 0; i < ks->elements; i++)
            if (redisAppendCommand(rc, "MEMORY USAGE %b SAMPLES 0", ks->element[i]->str,
                                   ks->element[i]->len) != REDIS_OK)
                die("append", NULL);
        for (size_t i = 0; i < ks->elements; i++) {
            redisReply *u = get_reply("memory usage");
            sum += (double)u->integer;
            freeReplyObject(u);
        }
        *nkeys += ks->elements;
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return sum;
}

static void memory_case(bool cluster, uint64_t entries, size_t set_size, size_t workers)
{
    freeReplyObject(command("FLUSHALL SYNC"));
    double before = info_field("memory", "used_memory", NULL);
    size_t sets = (size_t)(entries / set_size);
    size_t chunk = KVG_MIN(set_size, (size_t)2048);
    uint64_t *chain = malloc(chunk * sizeof(*chain));
    uint64_t t0 = kvg_now_ns();
    char key[REDIS_MAP_KEY_MAX] = "";
    for (size_t s = 0; s < sets; s++) {
        /* Single primary: workers big sets; cluster: a set per (worker, root). */
        if (!cluster)
            redis_map_key(key, "kvg", KVG_REDIS_STANDALONE, 0, 0x1000 + s);
        else
            redis_map_key(key, "kvg", KVG_REDIS_CLUSTER, rnd(), 0x1000 + s % workers);
        for (size_t done = 0; done < set_size; done += chunk) {
            size_t n = KVG_MIN(chunk, set_size - done);
            for (size_t i = 0; i < n; i++)
                chain[i] = rnd();
            record_async(key, (uint32_t)set_size, chain, n);
        }
    }
    drain(0);
    double fill_s = (kvg_now_ns() - t0) / 1e9;
    double after = info_field("memory", "used_memory", NULL);
    size_t nkeys;
    double usage = memory_usage_sum(&nkeys);
    /* The encoding of the last set filled (all sets of a case are of one size). */
    redisReply *enc = command("OBJECT ENCODING %s", key);
    double n = (double)sets * (double)set_size;
    printf("%-14s %10.0f %8zu %9zu %-9s %12.1f %12.1f %10.1f %8.1f\n",
           cluster ? "cluster" : "single-primary", n, nkeys, set_size, enc->str,
           (after - before) / n, usage / n, (after - before) / 1048576.0, fill_s);
    fflush(stdout);
    freeReplyObject(enc);
    free(chain);
    freeReplyObject(command("FLUSHALL SYNC"));
}

static void run_memory(bool quick)
{
    printf("memory per entry (bytes): used_memory delta / entries and the sum of MEMORY USAGE "
           "(SAMPLES 0) / entries; the embedded index: 28\n");
    printf("%-14s %10s %8s %9s %-9s %12s %12s %10s %8s\n", "layout", "entries", "keys", "per_set",
           "encoding", "used_memory", "memory_usage", "delta_MiB", "fill_s");
    uint64_t sizes[] = {1000000, 10000000};
    for (size_t i = 0; i < (quick ? 1 : 2); i++) {
        uint64_t e = quick ? 100000 : sizes[i];
        memory_case(false, e, (size_t)(e / 16), 16);
        memory_case(true, e, 1000, 16);
        memory_case(true, e, 100, 16);
    }
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    int port = 0;
    bool memory = false, quick = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--host") == 0 && i + 1 < argc)
            host = argv[++i];
        else if (strcmp(argv[i], "--port") == 0 && i + 1 < argc)
            port = atoi(argv[++i]);
        else if (strcmp(argv[i], "--memory") == 0)
            memory = true;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else {
            fprintf(stderr, "usage: redis_bench --port PORT [--host HOST] [--memory] [--quick]\n");
            return 2;
        }
    }
    if (port <= 0) {
        fprintf(stderr, "redis_bench: --port is required\n");
        return 2;
    }
    struct timeval tv = {.tv_sec = 120};
    rc = redisConnectWithTimeout(host, port, tv);
    if (!rc || rc->err) {
        fprintf(stderr, "redis_bench: %s:%d: %s\n", host, port, rc ? rc->errstr : "no memory");
        return 1;
    }
    redisSetTimeout(rc, tv);
    names = calloc(WORKERS_MAX, sizeof(*names));
    packbuf = malloc(8 * 4096);
    load_scripts();
    if (memory)
        run_memory(quick);
    else
        run_latency(quick);
    redisFree(rc);
    free(names);
    free(packbuf);
    free(av.v);
    free(av.len);
    return 0;
}
