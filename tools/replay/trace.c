/* SPDX-License-Identifier: Apache-2.0 */
/* The trace reader: bounded JSON lines, the format detected, Mooncake lines parsed here (hash ids
 * turned into chain keys), kvgate lines by trace_kvgate.c. */
#include "replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common.h"
#include "trace_int.h"

uint64_t replay_chain_key(uint64_t prev, uint64_t id)
{
    uint64_t in[2] = {prev, id};
    return XXH3_64bits(in, sizeof(in));
}

const char *trace_get_uint(const kvg_json *obj, const char *key, uint64_t max, uint64_t *out)
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

int trace_line_open(const char *line, size_t len, kvg_arena *arena, double scale,
                    const kvg_json **root, uint64_t *arrival_us, line_error *le)
{
    kvg_json *obj;
    kvg_json_error err = {0};
    int rc = kvg_json_parse(line, len, arena, NULL, &obj, &err);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0) {
        snprintf(le->buf, sizeof(le->buf), "%s", err.message);
        le->field = "json";
        le->why = le->buf;
        return KVG_EPARSE;
    }
    if (obj->type != KVG_JSON_OBJECT) {
        *le = (line_error){.field = "line", .why = "expected a JSON object"};
        return KVG_EPARSE;
    }
    const kvg_json *ts = kvg_json_get(obj, "timestamp");
    if (!ts || ts->type != KVG_JSON_NUMBER || !(ts->u.num.value >= 0) || ts->u.num.value > 1e15) {
        *le = (line_error){.field = "timestamp",
                           .why = ts ? "expected a non-negative number" : "missing"};
        return KVG_EPARSE;
    }
    /* ms x scale in us; a product past 2^62 us (146,000 years) would not convert */
    double us = ts->u.num.value * scale * 1000.0 + 0.5;
    if (!(us < 0x1p62)) {
        *le = (line_error){.field = "timestamp", .why = "too large with this --time-scale"};
        return KVG_EPARSE;
    }
    *root = obj;
    *arrival_us = (uint64_t)us;
    return 0;
}

/* One Mooncake line into r (keys appended to b's pool). 0, or KVG_EPARSE with le filled, or
 * -ENOMEM. */
static int parse_mooncake(const char *line, size_t len, kvg_arena *arena, double scale,
                          trace_builder *b, replay_request *r, line_error *le)
{
    const kvg_json *root;
    uint64_t arrival_us;
    int rc = trace_line_open(line, len, arena, scale, &root, &arrival_us, le);
    if (rc < 0)
        return rc;
    uint64_t in, outl;
    const char *why;
    if ((why = trace_get_uint(root, "input_length", UINT32_MAX, &in))) {
        *le = (line_error){"input_length", why, {0}};
        return KVG_EPARSE;
    }
    if ((why = trace_get_uint(root, "output_length", UINT32_MAX, &outl))) {
        *le = (line_error){"output_length", why, {0}};
        return KVG_EPARSE;
    }
    const kvg_json *ids = kvg_json_get(root, "hash_ids");
    if (!ids || ids->type != KVG_JSON_ARRAY) {
        *le = (line_error){"hash_ids", ids ? "expected an array" : "missing", {0}};
        return KVG_EPARSE;
    }
    size_t n = ids->u.arr.count;
    if (n > UINT32_MAX / 2) {
        *le = (line_error){"hash_ids", "too many", {0}};
        return KVG_EPARSE;
    }
    uint64_t *keys;
    if (trace_pool_reserve(b, n, &keys) < 0)
        return -ENOMEM;
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        const kvg_json *v = ids->u.arr.items[i];
        if (v->type != KVG_JSON_NUMBER || !v->u.num.is_int || v->u.num.ival < 0) {
            *le = (line_error){"hash_ids", "expected an array of non-negative integers", {0}};
            return KVG_EPARSE;
        }
        prev = replay_chain_key(prev, (uint64_t)v->u.num.ival);
        keys[i] = prev;
    }
    *r = (replay_request){
        .arrival_us = arrival_us,
        .input_tokens = (uint32_t)in,
        .output_tokens = (uint32_t)outl,
        .block_tokens = REPLAY_BLOCK_TOKENS,
    };
    trace_pool_commit(b, r, n);
    return 0;
}

int trace_pool_reserve(trace_builder *b, size_t n, uint64_t **at)
{
    if (b->npool + n > b->poolcap) {
        size_t nc = b->poolcap ? b->poolcap : 4096;
        while (nc < b->npool + n)
            nc *= 2;
        uint64_t *p = realloc(b->t.keypool, nc * sizeof(*p));
        if (!p)
            return -ENOMEM;
        b->t.keypool = p;
        b->poolcap = nc;
    }
    *at = b->t.keypool + b->npool;
    return 0;
}

void trace_pool_commit(trace_builder *b, replay_request *r, size_t n)
{
    r->nblocks = (uint32_t)n;
    r->keys = (uint64_t *)(uintptr_t)b->npool; /* an offset until the pool stops moving */
    b->npool += n;
}

const char *replay_format_str(replay_format f)
{
    static const char *const names[] = {"auto", "mooncake", "kvgate"};
    return (unsigned)f < REPLAY_FORMAT_COUNT ? names[f] : "?";
}

/* A bounded line reader: lines of at most REPLAY_LINE_MAX bytes, NUL bytes kept (the JSON
 * parser refuses them), read in large chunks. */
typedef struct line_reader {
    FILE *f;
    char *buf;
    size_t cap, start, end; /* unread bytes: buf[start, end) */
    bool eof;
} line_reader;

#define READ_CHUNK ((size_t)1 << 16)

/* Fill the buffer behind end, moving the unread bytes to its front and growing it up to the
 * line limit first. 0 (maybe nothing read: eof set), -ENOMEM, -EIO. */
static int fill(line_reader *lr)
{
    if (lr->start) {
        memmove(lr->buf, lr->buf + lr->start, lr->end - lr->start);
        lr->end -= lr->start;
        lr->start = 0;
    }
    if (lr->cap - lr->end < READ_CHUNK) {
        size_t nc = lr->cap ? lr->cap * 2 : 4 * READ_CHUNK;
        if (nc < lr->end + READ_CHUNK)
            nc = lr->end + READ_CHUNK;
        char *p = realloc(lr->buf, nc);
        if (!p)
            return -ENOMEM;
        lr->buf = p;
        lr->cap = nc;
    }
    size_t got = fread(lr->buf + lr->end, 1, lr->cap - lr->end, lr->f);
    lr->end += got;
    if (got == 0) {
        if (ferror(lr->f))
            return -EIO;
        lr->eof = true;
    }
    return 0;
}

/* The next line, its line feed included when it has one, in *line (valid until the next call):
 * 1; 0 at the end of the file; KVG_ELIMIT for a line longer than REPLAY_LINE_MAX (skipped up to
 * its line feed); -ENOMEM, -EIO. */
static int next_line(line_reader *lr, const char **line, size_t *len)
{
    size_t scanned = lr->start;
    bool too_long = false;
    for (;;) {
        /* (an empty buffer may not be allocated yet: memchr takes no NULL, even for 0 bytes) */
        char *nl = lr->end > scanned ? memchr(lr->buf + scanned, '\n', lr->end - scanned) : NULL;
        if (nl || (lr->eof && lr->end > lr->start)) {
            size_t stop = nl ? (size_t)(nl - lr->buf) + 1 : lr->end;
            *line = lr->buf + lr->start;
            *len = stop - lr->start;
            lr->start = stop;
            return too_long ? KVG_ELIMIT : 1;
        }
        if (lr->eof)
            return too_long ? KVG_ELIMIT : 0;
        if (lr->end - lr->start >= REPLAY_LINE_MAX) {
            /* Too long: drop what there is and look for its end. */
            too_long = true;
            lr->start = lr->end;
        }
        scanned = lr->end - lr->start;
        int rc = fill(lr);
        if (rc < 0)
            return rc;
        scanned += lr->start; /* fill moved the bytes to the front: start is 0 */
    }
}

/* Arrival order, equal times in the file's order: a merge sort (qsort is not stable). 0, -ENOMEM.
 */
static int sort_by_arrival(replay_request *a, size_t n)
{
    replay_request *tmp = malloc((n ? n : 1) * sizeof(*tmp));
    if (!tmp)
        return -ENOMEM;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = KVG_MIN(lo + width, n), hi = KVG_MIN(lo + 2 * width, n);
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = a[j].arrival_us < a[i].arrival_us ? a[j++] : a[i++];
            while (i < mid)
                tmp[k++] = a[i++];
            while (j < hi)
                tmp[k++] = a[j++];
        }
        memcpy(a, tmp, n * sizeof(*a));
    }
    free(tmp);
    return 0;
}

static bool blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return false;
    return true;
}

/* The format a first line says: hash_ids makes it Mooncake. A line that is no JSON object is
 * left to the Mooncake parser, which says what is wrong with it. */
static replay_format detect(const char *line, size_t len, kvg_arena *arena)
{
    kvg_json *root;
    if (kvg_json_parse(line, len, arena, NULL, &root, NULL) < 0 || root->type != KVG_JSON_OBJECT)
        return REPLAY_FORMAT_MOONCAKE;
    return kvg_json_get(root, "hash_ids") ? REPLAY_FORMAT_MOONCAKE : REPLAY_FORMAT_KVGATE;
}

static int add_request(trace_builder *b, size_t *cap)
{
    if (b->t.n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 1024;
    replay_request *p = realloc(b->t.reqs, nc * sizeof(*p));
    if (!p)
        return -ENOMEM;
    b->t.reqs = p;
    *cap = nc;
    return 0;
}

int replay_trace_read(const char *path, const replay_read_options *opt, replay_trace *out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int rc = -errno;
        fprintf(stderr, "kvgate-replay: %s: %s\n", path, strerror(errno));
        return rc;
    }
    trace_builder b = {.t = {.format = opt->format}};
    line_reader lr = {.f = f};
    kvgate_reader *kr = NULL;
    size_t cap = 0;
    unsigned long lineno = 0;
    kvg_arena arena;
    kvg_arena_init(&arena, 0);
    int rc = 0;
    /* Tenant 0 is "no tenant" in every format. */
    b.t.tenants = calloc(1, sizeof(*b.t.tenants));
    if (b.t.tenants)
        b.t.tenants[0] = strdup("");
    if (!b.t.tenants || !b.t.tenants[0])
        rc = -ENOMEM;
    b.t.ntenants = 1;
    b.tenantcap = 1;
    const char *line;
    size_t len;
    while (rc == 0 && (rc = next_line(&lr, &line, &len)) != 0) {
        lineno++;
        line_error le = {0};
        if (rc == KVG_ELIMIT) {
            snprintf(le.buf, sizeof(le.buf), "longer than %zu bytes", REPLAY_LINE_MAX);
            le.field = "line";
            le.why = le.buf;
        } else if (rc < 0) {
            break;
        } else if (blank(line, len)) {
            rc = 0;
            continue;
        } else {
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
                len--;
            kvg_arena_reset(&arena);
            if (b.t.format == REPLAY_FORMAT_AUTO)
                b.t.format = detect(line, len, &arena);
            if (b.t.format == REPLAY_FORMAT_KVGATE && !kr && (rc = kvgate_reader_new(opt, &kr)) < 0)
                break;
            if ((rc = add_request(&b, &cap)) < 0)
                break;
            kvg_arena_reset(&arena);
            replay_request *r = &b.t.reqs[b.t.n];
            rc = b.t.format == REPLAY_FORMAT_KVGATE
                     ? kvgate_parse_line(kr, line, len, &arena, opt->time_scale, &b, r, &le)
                     : parse_mooncake(line, len, &arena, opt->time_scale, &b, r, &le);
            if (rc == 0) {
                b.t.blocks += r->nblocks;
                b.t.tokens += r->input_tokens;
                b.t.n++;
                continue;
            }
            if (rc != KVG_EPARSE)
                break;
        }
        /* A bad line. */
        fprintf(stderr, "kvgate-replay: %s:%lu: %s%s%s%s\n", path, lineno,
                opt->skip ? "skipped: " : "", le.field ? le.field : "", le.field ? ": " : "",
                le.why);
        if (!opt->skip) {
            rc = KVG_EPARSE;
            break;
        }
        b.t.skipped++;
        rc = 0;
    }
    if (rc == -EIO)
        fprintf(stderr, "kvgate-replay: %s: read error\n", path);
    free(lr.buf);
    kvgate_reader_free(kr);
    kvg_arena_done(&arena);
    fclose(f);
    if (rc < 0) {
        if (rc == -ENOMEM)
            fprintf(stderr, "kvgate-replay: %s: out of memory\n", path);
        replay_trace_done(&b.t);
        return rc;
    }
    if (b.t.format == REPLAY_FORMAT_AUTO)
        b.t.format = REPLAY_FORMAT_MOONCAKE; /* no line at all */
    if (sort_by_arrival(b.t.reqs, b.t.n) < 0) {
        fprintf(stderr, "kvgate-replay: %s: out of memory\n", path);
        replay_trace_done(&b.t);
        return -ENOMEM;
    }
    for (size_t i = 0; i < b.t.n; i++)
        b.t.reqs[i].keys = b.t.keypool ? b.t.keypool + (uintptr_t)b.t.reqs[i].keys : NULL;
    *out = b.t;
    return 0;
}

void replay_trace_done(replay_trace *t)
{
    for (size_t i = 0; t->tenants && i < t->ntenants; i++)
        free(t->tenants[i]);
    free(t->tenants);
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
