/* SPDX-License-Identifier: Apache-2.0 */
/* The Mooncake trace reader: one JSON object a line, hash ids turned into chain keys. */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common.h"

uint64_t replay_chain_key(uint64_t prev, uint64_t id)
{
    uint64_t in[2] = {prev, id};
    return XXH3_64bits(in, sizeof(in));
}

/* A non-negative integer member that fits in max; NULL or a message. */
static const char *get_uint(const kvg_json *obj, const char *key, uint64_t max, uint64_t *out)
{
    const kvg_json *v = kvg_json_get(obj, key);
    if (!v)
        return "missing";
    if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0 ||
        (uint64_t)v->u.num.ival > max)
        return "expected a non-negative integer";
    *out = (uint64_t)v->u.num.ival;
    return NULL;
}

typedef struct line_parse {
    const char *field; /* what is wrong, for the message */
    const char *why;
} line_parse;

/* One line into r (keys appended to *pool). 0, or KVG_EPARSE with lp filled, or -ENOMEM. */
static int parse_line(const char *line, size_t len, kvg_arena *arena, double scale,
                      replay_request *r, uint64_t **pool, size_t *npool, size_t *cap,
                      line_parse *lp, kvg_json_error *err)
{
    kvg_json *root;
    int rc = kvg_json_parse(line, len, arena, NULL, &root, err);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0) {
        *lp = (line_parse){"json", err->message};
        return KVG_EPARSE;
    }
    if (root->type != KVG_JSON_OBJECT) {
        *lp = (line_parse){"line", "expected a JSON object"};
        return KVG_EPARSE;
    }
    uint64_t in, outl;
    const char *why;
    const kvg_json *ts = kvg_json_get(root, "timestamp");
    if (!ts || ts->type != KVG_JSON_NUMBER || !(ts->u.num.value >= 0) || ts->u.num.value > 1e15) {
        *lp = (line_parse){"timestamp", ts ? "expected a non-negative number" : "missing"};
        return KVG_EPARSE;
    }
    if ((why = get_uint(root, "input_length", UINT32_MAX, &in))) {
        *lp = (line_parse){"input_length", why};
        return KVG_EPARSE;
    }
    if ((why = get_uint(root, "output_length", UINT32_MAX, &outl))) {
        *lp = (line_parse){"output_length", why};
        return KVG_EPARSE;
    }
    const kvg_json *ids = kvg_json_get(root, "hash_ids");
    if (!ids || ids->type != KVG_JSON_ARRAY) {
        *lp = (line_parse){"hash_ids", ids ? "expected an array" : "missing"};
        return KVG_EPARSE;
    }
    size_t n = ids->u.arr.count;
    if (n > UINT32_MAX / 2) {
        *lp = (line_parse){"hash_ids", "too many"};
        return KVG_EPARSE;
    }
    if (*npool + n > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < *npool + n)
            nc *= 2;
        uint64_t *p = realloc(*pool, nc * sizeof(*p));
        if (!p)
            return -ENOMEM;
        *pool = p;
        *cap = nc;
    }
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        const kvg_json *v = ids->u.arr.items[i];
        if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0) {
            *lp = (line_parse){"hash_ids", "expected an array of non-negative integers"};
            return KVG_EPARSE;
        }
        prev = replay_chain_key(prev, (uint64_t)v->u.num.ival);
        (*pool)[*npool + i] = prev;
    }
    *r = (replay_request){
        .arrival_us = (uint64_t)(ts->u.num.value * scale * 1000.0 + 0.5),
        .input_tokens = (uint32_t)in,
        .output_tokens = (uint32_t)outl,
        .nblocks = (uint32_t)n,
        .keys = (uint64_t *)(uintptr_t)*npool, /* an offset until the pool stops moving */
    };
    *npool += n;
    return 0;
}

static int cmp_arrival(const void *a, const void *b)
{
    const replay_request *x = a, *y = b;
    if (x->arrival_us != y->arrival_us)
        return x->arrival_us < y->arrival_us ? -1 : 1;
    /* keys still holds the pool offset: it keeps the file's order for equal times */
    return (uintptr_t)x->keys < (uintptr_t)y->keys ? -1 : (uintptr_t)x->keys > (uintptr_t)y->keys;
}

static bool blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return false;
    return true;
}

int replay_trace_read(const char *path, double time_scale, bool skip, replay_trace *out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int rc = -errno;
        fprintf(stderr, "kvgate-replay: %s: %s\n", path, strerror(errno));
        return rc;
    }
    replay_trace t = {0};
    size_t cap = 0, npool = 0, poolcap = 0;
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    unsigned long lineno = 0;
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    int rc = 0;
    while ((len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        if (blank(line, (size_t)len))
            continue;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (t.n == cap) {
            size_t nc = cap ? cap * 2 : 1024;
            replay_request *p = realloc(t.reqs, nc * sizeof(*p));
            if (!p) {
                rc = -ENOMEM;
                break;
            }
            t.reqs = p;
            cap = nc;
        }
        line_parse lp;
        kvg_json_error err = {0};
        kvg_arena_reset(&arena);
        rc = parse_line(line, (size_t)len, &arena, time_scale, &t.reqs[t.n], &t.keypool, &npool,
                        &poolcap, &lp, &err);
        if (rc == KVG_EPARSE) {
            fprintf(stderr, "kvgate-replay: %s:%lu: %s%s: %s\n", path, lineno,
                    skip ? "skipped: " : "", lp.field, lp.why);
            if (skip) {
                t.skipped++;
                rc = 0;
                continue;
            }
            break;
        }
        if (rc < 0)
            break;
        t.blocks += t.reqs[t.n].nblocks;
        t.tokens += t.reqs[t.n].input_tokens;
        t.n++;
    }
    if (rc == 0 && ferror(f)) {
        rc = -EIO;
        fprintf(stderr, "kvgate-replay: %s: read error\n", path);
    }
    free(line);
    kvg_arena_done(&arena);
    fclose(f);
    if (rc < 0) {
        if (rc == -ENOMEM)
            fprintf(stderr, "kvgate-replay: %s: out of memory\n", path);
        replay_trace_done(&t);
        return rc;
    }
    qsort(t.reqs, t.n, sizeof(*t.reqs), cmp_arrival);
    for (size_t i = 0; i < t.n; i++)
        t.reqs[i].keys = t.keypool ? t.keypool + (uintptr_t)t.reqs[i].keys : NULL;
    *out = t;
    return 0;
}

void replay_trace_done(replay_trace *t)
{
    free(t->reqs);
    free(t->keypool);
    memset(t, 0, sizeof(*t));
}

int replay_trace_slice(replay_trace *t, size_t first, size_t count)
{
    if (first > t->n || (first == t->n && t->n > 0))
        return KVG_ECONFIG;
    size_t n = t->n - first;
    if (count && count < n)
        n = count;
    memmove(t->reqs, t->reqs + first, n * sizeof(*t->reqs));
    t->n = n;
    t->blocks = t->tokens = 0;
    uint64_t base = n ? t->reqs[0].arrival_us : 0;
    for (size_t i = 0; i < n; i++) {
        t->reqs[i].arrival_us -= base;
        t->blocks += t->reqs[i].nblocks;
        t->tokens += t->reqs[i].input_tokens;
    }
    return 0;
}
