/* SPDX-License-Identifier: Apache-2.0 */
/* KV-event throughput on one core: vLLM-format batches (msgpack, array_like, as vLLM's
 * publisher writes them) decoded by router/kv_events.c and by msgpack-c's unpacker
 * (msgpack_unpack_next into a zone, then a walk that takes the hashes out), and applied to the
 * embedded index; then the index's memory per block entry. Run by bench/events.
 *
 * The stream: W engines, each a KV cache of CAP blocks; every batch is one engine's scheduler
 * step: 1 to 4 BlockStored events of 1 to 32 new blocks (16 token ids each, ids below Qwen3's
 * vocabulary size, so most take 5 bytes as vLLM's do), and once the engine holds more than 90%
 * of its capacity, a BlockRemoved event of its oldest blocks as many as it stored. A "block
 * event" is one block hash stored or removed. */
#include <inttypes.h>
#include <malloc.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "router.h"

typedef struct wbuf {
    uint8_t *b;
    size_t n, cap;
} wbuf;

static void wput(wbuf *w, const void *s, size_t n)
{
    if (w->n + n > w->cap) {
        w->cap = (w->cap + n) * 2;
        w->b = realloc(w->b, w->cap);
        if (!w->b)
            abort();
    }
    memcpy(w->b + w->n, s, n);
    w->n += n;
}

static void wbe(wbuf *w, uint8_t tag, uint64_t v, unsigned bytes)
{
    uint8_t t[9] = {tag};
    for (unsigned i = 0; i < bytes; i++)
        t[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    wput(w, t, 1 + bytes);
}

/* Non-negative integers in msgpack's shortest form, as msgspec writes them. */
static void wuint(wbuf *w, uint64_t v)
{
    if (v < 128) {
        uint8_t c = (uint8_t)v;
        wput(w, &c, 1);
    } else if (v < 256) {
        wbe(w, 0xcc, v, 1);
    } else if (v < 65536) {
        wbe(w, 0xcd, v, 2);
    } else if (v < (UINT64_C(1) << 32)) {
        wbe(w, 0xce, v, 4);
    } else {
        wbe(w, 0xcf, v, 8);
    }
}

static void warr(wbuf *w, uint32_t n)
{
    if (n < 16) {
        uint8_t c = (uint8_t)(0x90 | n);
        wput(w, &c, 1);
    } else {
        wbe(w, 0xdc, n, 2);
    }
}

static void wstr(wbuf *w, const char *s)
{
    uint8_t c = (uint8_t)(0xa0 | strlen(s));
    wput(w, &c, 1);
    wput(w, s, strlen(s));
}

static uint64_t rng = 0x243f6a8885a308d3;

static uint64_t rnd(void)
{
    uint64_t z = (rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

#define W 8
#define CAP 262144u
#define BLOCK 16

typedef struct engine {
    uint64_t *held; /* ring of the blocks it holds, oldest first */
    size_t head, n;
} engine;

typedef struct stream {
    wbuf data;
    size_t *off; /* batch i is data.b[off[i], off[i + 1]) */
    uint8_t *worker;
    size_t nbatches, cap;
    uint64_t stored, removed, events;
} stream;

static void make_stream(stream *s, uint64_t target_blocks)
{
    engine eng[W];
    for (int i = 0; i < W; i++)
        eng[i] = (engine){.held = malloc(sizeof(uint64_t) * CAP)};
    uint64_t chain[32];
    while (s->stored < target_blocks) {
        int e = (int)(rnd() % W);
        engine *g = &eng[e];
        unsigned nst = 1 + (unsigned)(rnd() % 4);
        bool remove = g->n > CAP * 9 / 10;
        if (s->nbatches + 2 > s->cap) {
            s->cap = s->cap ? s->cap * 2 : 4096;
            s->off = realloc(s->off, sizeof(*s->off) * s->cap);
            s->worker = realloc(s->worker, s->cap);
        }
        s->off[s->nbatches] = s->data.n;
        s->worker[s->nbatches] = (uint8_t)e;
        warr(&s->data, 3);
        double ts = 1.7e9 + (double)s->nbatches * 0.01;
        uint64_t bits;
        memcpy(&bits, &ts, sizeof(bits));
        wbe(&s->data, 0xcb, bits, 8);
        warr(&s->data, nst + remove);
        unsigned total = 0;
        for (unsigned k = 0; k < nst; k++) {
            unsigned n = 1 + (unsigned)(rnd() % 32);
            for (unsigned i = 0; i < n; i++)
                chain[i] = rnd();
            warr(&s->data, 7);
            wstr(&s->data, "BlockStored");
            warr(&s->data, n);
            for (unsigned i = 0; i < n; i++)
                wuint(&s->data, chain[i]);
            wuint(&s->data, rnd()); /* parent */
            warr(&s->data, n * BLOCK);
            for (unsigned i = 0; i < n * BLOCK; i++)
                wuint(&s->data, rnd() % 151936);
            wuint(&s->data, BLOCK);
            wput(&s->data, "\xc0", 1); /* lora_id */
            wstr(&s->data, "GPU");
            for (unsigned i = 0; i < n; i++) {
                if (g->n == CAP) { /* the engine evicted it without saying: never here */
                    g->head = (g->head + 1) % CAP;
                    g->n--;
                }
                g->held[(g->head + g->n++) % CAP] = chain[i];
            }
            total += n;
            s->events++;
        }
        s->stored += total;
        if (remove) {
            unsigned n = KVG_MIN(total, (unsigned)g->n);
            warr(&s->data, 3);
            wstr(&s->data, "BlockRemoved");
            warr(&s->data, n);
            for (unsigned i = 0; i < n; i++) {
                wuint(&s->data, g->held[g->head]);
                g->head = (g->head + 1) % CAP;
                g->n--;
            }
            wstr(&s->data, "GPU");
            s->removed += n;
            s->events++;
        }
        wuint(&s->data, 0); /* data_parallel_rank */
        s->nbatches++;
    }
    s->off[s->nbatches] = s->data.n;
    for (int i = 0; i < W; i++)
        free(eng[i].held);
}

static double best_of(double a, double b)
{
    return a < b || b == 0 ? a : b;
}

/* The kvgate decoder over the whole stream; returns seconds, checksum of the hashes. */
static double run_decode(const stream *s, kvg_kv_decoder *d, uint64_t *sum)
{
    uint64_t t0 = kvg_now_ns(), x = 0;
    for (size_t i = 0; i < s->nbatches; i++) {
        kvg_kv_batch b;
        if (kvg_kv_decode(d, s->data.b + s->off[i], s->off[i + 1] - s->off[i], &b) != 0) {
            fprintf(stderr, "batch %zu: %s\n", i, kvg_kv_decoder_error(d));
            exit(1);
        }
        for (size_t e = 0; e < b.nevents; e++)
            x += b.events[e].nhashes ? b.events[e].hashes[0] : 0;
    }
    *sum = x;
    return (double)(kvg_now_ns() - t0) / 1e9;
}

/* msgpack-c: unpack each batch into a zone and take the same things out of the tree (with the
 * type checks a strict decoder makes). */
static double run_msgpack_c(const stream *s, uint64_t *sum)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    uint64_t t0 = kvg_now_ns(), x = 0;
    for (size_t i = 0; i < s->nbatches; i++) {
        size_t off = 0;
        if (msgpack_unpack_next(&u, (const char *)s->data.b + s->off[i], s->off[i + 1] - s->off[i],
                                &off) != MSGPACK_UNPACK_SUCCESS)
            abort();
        const msgpack_object *o = &u.data;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 2 ||
            o->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
            abort();
        const msgpack_object_array *evs = &o->via.array.ptr[1].via.array;
        for (uint32_t e = 0; e < evs->size; e++) {
            const msgpack_object *ev = &evs->ptr[e];
            if (ev->type != MSGPACK_OBJECT_ARRAY || ev->via.array.size < 2 ||
                ev->via.array.ptr[0].type != MSGPACK_OBJECT_STR ||
                ev->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
                abort();
            const msgpack_object_array *hs = &ev->via.array.ptr[1].via.array;
            for (uint32_t h = 0; h < hs->size; h++) {
                if (hs->ptr[h].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                    abort();
                if (h == 0)
                    x += hs->ptr[h].via.u64;
            }
            if (ev->via.array.size >= 4 && ev->via.array.ptr[3].type == MSGPACK_OBJECT_ARRAY) {
                const msgpack_object_array *tk = &ev->via.array.ptr[3].via.array;
                for (uint32_t t = 0; t < tk->size; t++)
                    if (tk->ptr[t].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                        abort();
            }
        }
    }
    msgpack_unpacked_destroy(&u);
    *sum = x;
    return (double)(kvg_now_ns() - t0) / 1e9;
}

static kvg_prefix_index *new_index(uint64_t max_entries, uint32_t cap)
{
    kvg_index_config cfg = {.max_entries = max_entries};
    kvg_prefix_index *idx;
    if (kvg_index_new(&cfg, &idx) != 0)
        abort();
    kvg_index_worker ws[W];
    for (int i = 0; i < W; i++)
        ws[i] = (kvg_index_worker){.id = (uint64_t)i + 1, .name = "w", .capacity = cap};
    if (kvg_index_set_workers(idx, ws, W) != 0)
        abort();
    return idx;
}

/* Decode and apply every batch to a fresh index: seconds in all, and in apply alone (timed
 * around each call). */
static double run_apply(const stream *s, kvg_kv_decoder *d, double *apply_s, uint64_t *entries)
{
    kvg_prefix_index *idx = new_index(0, CAP);
    uint64_t t0 = kvg_now_ns(), in_apply = 0;
    for (size_t i = 0; i < s->nbatches; i++) {
        kvg_kv_batch b;
        if (kvg_kv_decode(d, s->data.b + s->off[i], s->off[i + 1] - s->off[i], &b) != 0)
            abort();
        uint64_t a0 = kvg_now_ns();
        if (kvg_index_apply_events(idx, (uint64_t)s->worker[i] + 1, &b, NULL) != 0)
            abort();
        in_apply += kvg_now_ns() - a0;
    }
    double total = (double)(kvg_now_ns() - t0) / 1e9;
    kvg_index_stats st;
    kvg_index_stats_get(idx, &st);
    *entries = st.entries;
    kvg_index_free(idx);
    *apply_s = (double)in_apply / 1e9;
    return total;
}

static size_t heap_bytes(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

/* Bytes the index takes per entry once it holds n entries of one worker. */
static double bytes_per_entry(uint64_t n)
{
    static uint64_t keys[4096];
    size_t before = heap_bytes();
    kvg_prefix_index *idx = new_index(0, (uint32_t)KVG_MIN(n, UINT32_MAX));
    for (uint64_t done = 0; done < n;) {
        uint32_t k = (uint32_t)KVG_MIN((uint64_t)4096, n - done);
        for (uint32_t i = 0; i < k; i++)
            keys[i] = rnd();
        kvg_kv_event ev = {.kind = KVG_KV_BLOCK_STORED, .hashes = keys, .nhashes = k};
        kvg_kv_batch b = {.events = &ev, .nevents = 1};
        if (kvg_index_apply_events(idx, 1, &b, NULL) != 0)
            abort();
        done += k;
    }
    double per = (double)(heap_bytes() - before) / (double)n;
    kvg_index_free(idx);
    return per;
}

int main(int argc, char **argv)
{
    uint64_t blocks = argc > 1 ? strtoull(argv[1], NULL, 10) : 4000000;
    stream s = {0};
    make_stream(&s, blocks);
    uint64_t block_events = s.stored + s.removed;
    printf("stream: %zu batches, %" PRIu64 " events, %" PRIu64 " blocks stored, %" PRIu64
           " removed, %.1f MB of msgpack (%.1f bytes per block event)\n",
           s.nbatches, s.events, s.stored, s.removed, (double)s.data.n / 1e6,
           (double)s.data.n / (double)block_events);
    printf("engines: %d, %u blocks each; index: defaults\n", W, CAP);

    kvg_kv_decoder *d;
    if (kvg_kv_decoder_new(NULL, &d) != 0)
        abort();
    double dec = 0, mp = 0, all = 0, app = 0;
    uint64_t sum1 = 0, sum2 = 0, entries = 0;
    for (int r = 0; r < 3; r++) {
        dec = best_of(run_decode(&s, d, &sum1), dec);
        mp = best_of(run_msgpack_c(&s, &sum2), mp);
    }
    if (sum1 != sum2) {
        fprintf(stderr, "the decoders disagree\n");
        return 1;
    }
    for (int r = 0; r < 3; r++) {
        double a;
        double t = run_apply(&s, d, &a, &entries);
        if (all == 0 || t < all)
            all = t, app = a;
    }
    printf("decode (router/kv_events.c):     %7.2f M block events/s  %6.0f MB/s  %.1f ns/block "
           "event\n",
           block_events / dec / 1e6, (double)s.data.n / dec / 1e6, dec * 1e9 / block_events);
    printf("decode (msgpack-c unpack_next):  %7.2f M block events/s  %6.0f MB/s  %.1f ns/block "
           "event  (kvgate x%.1f)\n",
           block_events / mp / 1e6, (double)s.data.n / mp / 1e6, mp * 1e9 / block_events, mp / dec);
    printf("apply (kvg_index_apply_events):  %7.2f M block events/s  %.1f ns/block event  "
           "(index at the end: %" PRIu64 " entries)\n",
           block_events / app / 1e6, app * 1e9 / block_events, entries);
    printf("decode + apply, one core:        %7.2f M block events/s  (target: 1)\n",
           block_events / all / 1e6);
    for (uint64_t n = UINT64_C(1) << 20; n <= UINT64_C(1) << 22; n <<= 1) {
        printf("index memory: %.1f bytes per entry at %" PRIu64 " entries; %.1f at %" PRIu64 "\n",
               bytes_per_entry(n), n, bytes_per_entry(n * 3 / 4), n * 3 / 4);
    }
    kvg_kv_decoder_free(d);
    free(s.data.b);
    free(s.off);
    free(s.worker);
    return 0;
}
