/* SPDX-License-Identifier: Apache-2.0 */
/* The routing decision's cost against a memcpy of the same body, in one process: scan and
 * canonicalise the body (validation, the prefix stream, the plan of its rewrite), hash the block
 * keys, look them up for every worker, rank the workers. Next to them, the copy of the
 * rewritten body the forwarding makes once the worker is chosen. Run by bench/route; prints one
 * line per (body size, worker count). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "policy.h"
#include "router.h"

static const char *const words[] = {"the",   "router",  "sends", "each",  "request", "to",
                                    "a",     "worker",  "that",  "holds", "its",     "prefix",
                                    "cache", "blocks,", "and",   "keeps", "load",    "even."};

/* A chat body whose system message is about size bytes of words, with a couple of escapes. */
static char *make_body(size_t size, unsigned seed, size_t *len)
{
    kvg_buf b;
    kvg_buf_init(&b);
    kvg_buf_puts(&b,
                 "{\"model\":\"bench-model\",\"messages\":[{\"role\":\"system\",\"content\":\"");
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    size_t start = b.len;
    while (b.len - start < size) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        kvg_buf_puts(&b, words[s % KVG_ARRAY_LEN(words)]);
        kvg_buf_puts(&b, (s >> 20) % 97 == 0 ? "\\n" : " ");
    }
    kvg_buf_puts(&b, "\"},{\"role\":\"user\",\"content\":\"What does the router do?\"}],"
                     "\"max_tokens\":16,\"stream\":true}");
    return kvg_buf_steal(&b, len);
}

/* Token-exact mode (--tokenizer): every decision keys the body by the engine's block hashes. */
static kvg_model *exact_model;

static void set_exact(kvg_route_request *rq, const char *body, size_t len)
{
    rq->model = exact_model;
    rq->model_input = KVG_MODEL_INPUT_CHAT;
    rq->raw_body = body;
    rq->raw_len = len;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Median over rounds of the mean per-iteration time of a batch. */
#define SHARED_BLOCKS 40
#define ROUNDS 15

typedef struct bench_ctx {
    kvg_router *rt;
    kvg_worker_set *set;
    kvg_policy_config pc;
    const char *body;
    size_t len;
    kvg_arena arena;
    kvg_buf out;
    kvg_body_plan plan;      /* the rewritten body of the last decision */
    kvg_route_decision last; /* the last decision */
    char *copy;              /* the memcpy's destination: as aligned as the body, modulo 64 */
    char *copy_base;         /* its allocation */
    uint64_t sink;
    bool timed;                             /* a pass with the stage clock on */
    uint64_t stages[KVG_ROUTE_STAGE_COUNT]; /* summed over the timed pass */
} bench_ctx;

static void decide_once(bench_ctx *c, uint64_t rotation)
{
    kvg_body_info info;
    kvg_json_error err;
    kvg_arena_reset(&c->arena);
    kvg_buf_reset(&c->out);
    uint64_t t0 = c->timed ? kvg_now_ns() : 0;
    if (kvg_body_scan_plan(c->body, c->len, KVG_BODY_API_CHAT,
                           "0123456789012345678901234567890123456789abc", &c->arena, &c->plan,
                           &info, &err) < 0) {
        fprintf(stderr, "route_bench: body rejected: %s\n", err.message);
        exit(1);
    }
    kvg_route_request rq = {.body = &info,
                            .salt = "0123456789012345678901234567890123456789abc",
                            .policy = &c->pc,
                            .rotation = rotation,
                            .rank_limit = 16, /* as the front does (gateway/proxy.c) */
                            .clock_ns = c->timed ? kvg_now_ns : NULL};
    set_exact(&rq, c->body, c->len);
    uint64_t parse = c->timed ? kvg_now_ns() - t0 : 0;
    kvg_route_decision d;
    if (kvg_router_decide(c->rt, c->set, &rq, &c->arena, &d) < 0) {
        fprintf(stderr, "route_bench: out of memory\n");
        exit(1);
    }
    if (c->timed) {
        d.stage_ns[KVG_ROUTE_STAGE_PARSE] = parse;
        for (int s = 0; s < KVG_ROUTE_STAGE_COUNT; s++)
            c->stages[s] += d.stage_ns[s];
    }
    c->sink += d.ncands ? d.cands[0].matched : 0;
    c->last = d;
}

/* The median over ROUNDS batches of the mean time of one step, a statement run iters times with
 * i its index. A macro, not a callback: the memcpy baseline must not pay for an indirect call. */
#define MEDIAN_NS(out, iters, step)                                                                \
    do {                                                                                           \
        uint64_t t_[ROUNDS];                                                                       \
        for (int r_ = 0; r_ < ROUNDS; r_++) {                                                      \
            uint64_t t0_ = kvg_now_ns();                                                           \
            for (unsigned i = 0; i < (iters); i++) {                                               \
                step;                                                                              \
            }                                                                                      \
            t_[r_] = (kvg_now_ns() - t0_) / (iters);                                               \
        }                                                                                          \
        qsort(t_, ROUNDS, sizeof(t_[0]), cmp_u64);                                                 \
        (out) = t_[ROUNDS / 2];                                                                    \
    } while (0)

static uint64_t time_decide(bench_ctx *c, unsigned iters)
{
    uint64_t t;
    MEDIAN_NS(t, iters, decide_once(c, i));
    return t;
}

/* The copy the forwarding makes after the decision: the rewritten body from its plan. */
static uint64_t time_write(bench_ctx *c, unsigned iters)
{
    uint64_t t;
    MEDIAN_NS(t, iters, {
        kvg_buf_reset(&c->out);
        if (kvg_body_plan_write(&c->plan, &c->out) < 0)
            exit(1);
        c->sink += (unsigned char)c->out.data[i % c->out.len];
    });
    return t;
}

/* Recording the last decision's keys on a worker that answered it, as the front does at its
 * 200 head; here the worker already holds them (a repeated prompt). */
static uint64_t time_record(bench_ctx *c, kvg_worker *w, unsigned iters)
{
    uint64_t t;
    MEDIAN_NS(t, iters, {
        if (kvg_router_record(c->rt, NULL, w, &c->last, 0) < 0)
            exit(1);
    });
    return t;
}

static uint64_t time_memcpy(bench_ctx *c, unsigned iters)
{
    uint64_t t;
    MEDIAN_NS(t, iters, {
        memcpy(c->copy, c->body, c->len);
        __asm__ volatile("" : : "r"(c->copy) : "memory"); /* keep every copy */
        c->sink += (unsigned char)c->copy[i % c->len];
    });
    return t ? t : 1;
}

/* One decision outside the timed loops: recorded on w when w is not NULL (to warm the index),
 * copied to out when out is not NULL. */
static int decide_and_record(bench_ctx *c, const char *body, size_t len, kvg_worker *w,
                             kvg_route_decision *out)
{
    static const char salt[] = "0123456789012345678901234567890123456789abc";
    kvg_body_info info;
    kvg_arena_reset(&c->arena);
    kvg_buf_reset(&c->out);
    kvg_route_request rq = {.body = &info, .salt = salt, .policy = &c->pc, .rank_limit = 16};
    set_exact(&rq, body, len);
    kvg_route_decision d;
    if (kvg_body_scan(body, len, KVG_BODY_API_CHAT, salt, &c->arena, &c->out, &info, NULL) < 0 ||
        kvg_router_decide(c->rt, c->set, &rq, &c->arena, &d) < 0)
        return -1;
    if (w)
        kvg_router_record(c->rt, NULL, w, &d, 0);
    if (out)
        *out = d;
    return 0;
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {1024, 32 * 1024, 512 * 1024};
    static const size_t counts[] = {8, 64, 512};
    bool json = false;
    kvg_model_def mdef = {.name = "bench-model", .hash_seed = "0", .block_size = 16};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc)
            mdef.tokenizer = argv[++i];
        else if (strcmp(argv[i], "--tokenizer-config") == 0 && i + 1 < argc)
            mdef.tokenizer_config = argv[++i];
        else if (strcmp(argv[i], "--token-cache-mib") == 0 && i + 1 < argc)
            mdef.token_cache_mib = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: route_bench [--json] [--tokenizer F --tokenizer-config F "
                            "[--token-cache-mib N]]\n");
            return 2;
        }
    }
    if (mdef.tokenizer) {
        char msg[512];
        if (kvg_model_load(&mdef, &exact_model, msg, sizeof(msg)) < 0) {
            fprintf(stderr, "route_bench: %s\n", msg);
            return 1;
        }
        if (!kvg_model_has_template(exact_model)) {
            fprintf(stderr, "route_bench: the model has no chat template\n");
            return 1;
        }
    }
    if (!json)
        printf("keys: %s%s\n",
               exact_model ? "token-exact (the engine's block hashes)"
                           : "bytes (canonical prefix stream)",
               !exact_model ? ""
               : mdef.token_cache_mib
                   ? ", pieces cache on (the body seen before: its pieces cached)"
                   : ", pieces cache off (every piece tokenized)");
    if (!json)
        printf("%-8s %-8s %-8s %12s %12s %8s %8s %8s   %7s %7s %7s %7s   %10s %10s\n", "body",
               "workers", "holders", "decision_us", "memcpy_us", "ratio", "blocks", "matched",
               "parse", "hash", "lookup", "choose", "forward_us", "record_us");
    else
        printf("[");
    bool first = true;
    /* Then 32 KB again with a shared opening: every worker also holds the body's first
     * SHARED_BLOCKS blocks (a system prompt the load bound has spread over the fleet). */
    for (size_t si = 0; si < KVG_ARRAY_LEN(sizes) + 1; si++) {
        bool shared = si == KVG_ARRAY_LEN(sizes);
        size_t size = shared ? 32 * 1024 : sizes[si];
        for (size_t ci = 0; ci < KVG_ARRAY_LEN(counts); ci++) {
            bench_ctx c = {0};
            kvg_policy_config_init(&c.pc);
            kvg_registry *reg;
            if (kvg_registry_new(NULL, &reg) < 0 || kvg_router_new(NULL, &c.rt) < 0)
                return 1;
            for (size_t w = 0; w < counts[ci]; w++) {
                char name[32], url[64];
                snprintf(name, sizeof(name), "w%04zu", w);
                snprintf(url, sizeof(url), "http://127.0.0.1:%zu", 10000 + w);
                kvg_worker_def def = {.name = name, .url = url, .kv_blocks = 1u << 20};
                if (kvg_registry_put(reg, &def, KVG_WORKER_SOURCE_ADMIN, NULL, 0) < 0)
                    return 1;
            }
            c.set = kvg_registry_acquire(reg);
            kvg_arena_init(&c.arena, 0);
            kvg_buf_init(&c.out);
            /* The index as in steady state: every worker holds other requests' prefixes, and
             * one holds this body's whole prefix (the lookup walks the full chain). */
            for (size_t w = 0; w < counts[ci]; w++) {
                size_t olen;
                char *other = make_body(size, 1000 + (unsigned)w, &olen);
                if (decide_and_record(&c, other, olen, kvg_worker_set_at(c.set, w), NULL) < 0)
                    return 1;
                free(other);
            }
            c.body = make_body(size, 7, &c.len);
            /* glibc copies these sizes with REP MOVSB, which AMD EPYC runs 20x slower when the
             * destination sits 1-31 bytes past the source modulo 64 (bench/copy): the baseline
             * gets the fast case, so that the ratio is never flattered. */
            c.copy_base = aligned_alloc(64, (c.len + 127) / 64 * 64);
            if (!c.copy_base)
                return 1;
            c.copy = c.copy_base + ((uintptr_t)c.body & 63);
            kvg_route_decision whole;
            if (decide_and_record(&c, c.body, c.len, kvg_worker_set_at(c.set, counts[ci] / 2),
                                  &whole) < 0)
                return 1;
            if (shared) {
                whole.nkeys = KVG_MIN(whole.nkeys, (uint32_t)SHARED_BLOCKS);
                for (size_t w = 0; w < counts[ci]; w++)
                    if (w != counts[ci] / 2)
                        kvg_router_record(c.rt, NULL, kvg_worker_set_at(c.set, w), &whole, 0);
            }
            /* Batches of about 20 ms. */
            unsigned iters = (unsigned)KVG_MAX(
                (size_t)3,
                (size_t)(20e6 / ((exact_model ? 20.0 : 0.25) * size + 2000.0 * counts[ci] / 8)));
            decide_once(&c, 0);
            uint64_t dec = time_decide(&c, iters);
            uint64_t cpy = time_memcpy(&c, iters * 50);
            uint64_t fwd = time_write(&c, iters * 10);
            uint64_t rec = time_record(&c, kvg_worker_set_at(c.set, counts[ci] / 2), iters);
            /* Where the time goes: one more pass with the stage clock on. */
            c.timed = true;
            for (unsigned i = 0; i < iters; i++)
                decide_once(&c, i);
            c.timed = false;
            double st[KVG_ROUTE_STAGE_COUNT];
            for (int s = 0; s < KVG_ROUTE_STAGE_COUNT; s++)
                st[s] = (double)c.stages[s] / iters / 1000.0;
            kvg_route_decision d;
            if (decide_and_record(&c, c.body, c.len, NULL, &d) < 0)
                return 1;
            if (json) {
                printf(
                    "%s{\"body_bytes\":%zu,\"workers\":%zu,\"holders\":%zu,\"decision_ns\":%" PRIu64
                    ",\"memcpy_ns\":%" PRIu64 ",\"ratio\":%.2f,\"blocks\":%u,\"matched\":%u,"
                    "\"stages_us\":{\"parse\":%.2f,\"hash\":%.2f,\"lookup\":%.2f,"
                    "\"choose\":%.2f},\"forward_ns\":%" PRIu64 ",\"record_ns\":%" PRIu64 "}",
                    first ? "" : ",", c.len, counts[ci], shared ? counts[ci] : (size_t)1, dec, cpy,
                    (double)dec / (double)cpy, d.nkeys, d.ncands ? d.cands[0].matched : 0, st[0],
                    st[1], st[2], st[3], fwd, rec);
            } else {
                printf("%-8zu %-8zu %-8zu %12.2f %12.2f %8.1f %8u %8u   %7.2f %7.2f %7.2f %7.2f   "
                       "%10.2f %10.2f\n",
                       c.len, counts[ci], shared ? counts[ci] : (size_t)1, dec / 1000.0,
                       cpy / 1000.0, (double)dec / (double)cpy, d.nkeys,
                       d.ncands ? d.cands[0].matched : 0, st[0], st[1], st[2], st[3], fwd / 1000.0,
                       rec / 1000.0);
            }
            fflush(stdout);
            first = false;
            free(c.copy_base);
            free((void *)c.body);
            kvg_buf_done(&c.out);
            kvg_arena_done(&c.arena);
            kvg_worker_set_unref(c.set);
            kvg_router_free(c.rt);
            kvg_registry_free(reg);
        }
    }
    if (json)
        printf("]\n");
    kvg_model_free(exact_model);
    return 0;
}
